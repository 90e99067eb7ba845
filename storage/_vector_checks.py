"""Checks of vectors and metadata rows before a VectorIndex writes them: validation apart from storage."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from memstrata.core.errors import InvalidInputError

from ._array_types import FloatArray

__all__ = ["check_metas", "check_vectors", "meta_value", "precomputed_vectors"]

_PLAIN: dict[str, type] = {"text": str, "integer": int, "float": float}


def _float32(vectors: Any, what: str) -> FloatArray:
    """``vectors`` as float32 (not copied when they are), refusing what the cast would change
    silently: complex numbers (their imaginary part dropped) and ``None`` (read as NaN)."""
    try:
        given = np.asarray(vectors)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{what} must be an array of numbers: {exc}") from exc
    if given.dtype.kind == "c":
        raise InvalidInputError(f"{what} must be real numbers, got complex ones ({given.dtype})")
    if given.dtype.kind == "O" and (empty := np.equal(given, np.array(None, dtype=object))).any():
        # named by its row, as a row of NaN is (a single vector has none)
        row = f"[{int(np.argmax(empty.reshape(len(empty), -1).any(axis=1)))}]" if empty.ndim > 1 else ""
        raise InvalidInputError(f"{what}{row} holds None where a number belongs")
    try:
        return given.astype(np.float32, copy=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{what} must be an array of numbers: {exc}") from exc


def check_vectors(vectors: FloatArray, dim: int, what: str = "vectors") -> FloatArray:
    """``vectors`` as a contiguous float32 matrix of ``dim`` columns: finite, with no zero row."""
    array = _float32(vectors, what)
    if array.ndim == 1:
        array = array.reshape(1, -1)
    if array.ndim != 2 or array.shape[1] != dim:
        raise InvalidInputError(f"{what} must have shape (n, {dim}), got {array.shape}")
    # one pass for both checks: a row's float32 sum of squares is finite only when the row is
    # (when it is not, the row may still be, its squares overflowing: asked exactly then), and
    # is zero exactly when the row's float32 norm is
    squares = np.einsum("ij,ij->i", array, array)
    if not np.isfinite(squares).all() and not np.isfinite(array).all():
        raise InvalidInputError(f"{what} contain NaN or infinity")
    if not squares.all():
        raise InvalidInputError(f"{what} contain a zero vector, which has no cosine similarity")
    return np.ascontiguousarray(array)


def meta_value(kind: str, table: str, column: str, value: Any, index: int) -> Any:
    """One metadata value checked (and normalised) against its column's vec0 type."""
    plain = type(value)
    if plain is _PLAIN.get(kind) and (plain is not float or math.isfinite(value)):
        return value  # the common case, without the slower numbers ABC checks
    ok = False
    if kind == "text":
        ok = isinstance(value, str)
    elif kind == "integer":
        ok = isinstance(value, numbers.Integral)
        value = int(value) if ok else value
    elif kind == "float":
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
        value = float(value) if ok else value
    elif kind == "boolean":
        ok = isinstance(value, bool | np.bool_)
        ok = ok or (isinstance(value, numbers.Integral) and int(value) in (0, 1))
        value = int(value) if ok else value
    if not ok:
        raise InvalidInputError(
            f"metas[{index}][{column!r}] must be a {kind} value for vector table {table}, got {value!r}"
        )
    return value


def check_metas(
    types: Mapping[str, str], table: str, metas: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Each row of metadata checked: exactly the columns of ``types`` (column -> vec0 type).
    Rows given the same mapping get the same checked dict (read only)."""
    checked = []
    # a mapping given for many rows (a bulk write shares one per category) is checked once; the
    # rows share its checked copy, and it is held here so that its id names it throughout
    done: dict[int, tuple[Mapping[str, Any], dict[str, Any]]] = {}
    for index, meta in enumerate(metas):
        known = done.get(id(meta))
        if known is not None:
            checked.append(known[1])
            continue
        unknown = set(meta) - set(types)
        if unknown:
            raise InvalidInputError(f"metas[{index}] has unknown column(s) {sorted(unknown)}")
        row = {}
        for column in types:
            if column not in meta:
                raise InvalidInputError(f"metas[{index}] lacks metadata column {column!r}")
            row[column] = meta_value(types[column], table, column, meta[column], index)
        done[id(meta)] = (meta, row)
        checked.append(row)
    return checked


def precomputed_vectors(vectors: Any, n: int, dim: int | None) -> tuple[FloatArray, npt.NDArray[np.float64]]:
    """Vectors computed apart for ``n`` rows, checked: the rows as float32 (not copied when
    they already are) and their lengths, to normalise a batch at a time.

    One row per item; ``dim``, when known, is the store's dimension. A bad row is named by its
    index (``vectors[17] holds NaN or infinity``).
    """
    array = _float32(vectors, "vectors")
    want = f"({n}, {dim})" if dim is not None else f"({n}, dim)"
    if array.ndim != 2 or len(array) != n or (dim is not None and array.shape[1] != dim):
        raise InvalidInputError(
            f"vectors must have shape {want}: one row per item, of the store's dimension; got {array.shape}"
        )
    # the squared lengths are infinite or NaN exactly when a row holds NaN or infinity (or
    # overflows float32 when squared, which no model's vector does): one pass, no n x dim temporary
    squares = np.einsum("ij,ij->i", array, array, dtype=np.float64)
    finite = np.isfinite(squares)
    if not finite.all():
        raise InvalidInputError(f"vectors[{int(np.argmin(finite))}] holds NaN or infinity")
    if n and not squares.all():
        raise InvalidInputError(
            f"vectors[{int(np.argmin(squares != 0))}] is all zeros, which has no cosine similarity"
        )
    return array, np.sqrt(squares)  # float64: a huge (finite) row still normalises
