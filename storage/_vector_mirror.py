"""The in-memory mirror of a vector table: one float32 matrix, metadata codes and integer
columns, rows grouped by the most used filter column and by inverted list (searching it:
:mod:`._mirror_search`).

This module saves and maps back a mirror and wires the search to it; the rows are
:mod:`._mirror_matrix` and their order (groups, inverted lists) :mod:`._mirror_layout`."""

from __future__ import annotations

import mmap
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from ._file_rows import FileRows
from ._int8_rows import Int8Rows
from ._ivf import Partition
from ._mirror_hits import ScoredRows, VectorHit
from ._mirror_layout import MirrorLayout
from ._mirror_rows import RowIndex
from ._mirror_search import Ranges
from ._sign_codes import SignCodes, sign_codes

__all__ = ["PROBE_LISTS", "STATE_VERSION", "Mirror", "Ranges", "RowIndex", "ScoredRows", "VectorHit"]

PROBE_LISTS = 112  # lists' worth of rows a k=10 search scans (measured: recall@10 >= 0.99)
STATE_VERSION = 2  # of :meth:`Mirror.state` and the row order, for saved mirrors (1: group-major
# blocks, read as a different layout: a saved mirror of another version is rebuilt, never read)


def _privately_mapped(array: npt.NDArray[Any]) -> bool:
    """True for a writeable array over a memory map (``read_index``'s copy-on-write maps)."""
    base: Any = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return bool(array.flags.writeable) and isinstance(base, mmap.mmap)


def _check_index(mirror: Mirror, keys: npt.NDArray[np.int64], values: npt.NDArray[np.int64]) -> None:
    """A row index read from a file, checked whole (sorted distinct rowids, each at a position
    that holds it) at its first use; rebuilt from the rowids when it fails."""
    size = mirror.size
    if not (
        (len(values) == 0 or (int(values.min()) >= 0 and int(values.max()) < size))
        and not (np.diff(keys) <= 0).any()
        and np.array_equal(mirror.rowids[values], keys)
    ):
        mirror.index.rebuild(mirror.rowids[:size], mirror.alive[:size])


def _holds(mirror: Mirror, rowids: npt.NDArray[np.int64], positions: npt.NDArray[np.int64]) -> bool:
    """Whether the mirror's rows at ``positions`` are live and hold ``rowids``."""
    size = mirror.size
    if len(positions) and (int(positions.min()) < 0 or int(positions.max()) >= size):
        return False
    return bool(np.all(mirror.alive[positions])) and bool(np.array_equal(mirror.rowids[positions], rowids))


def _probes(size: int) -> npt.NDArray[np.int64]:
    """A few rows spread over the mirror, first and last included, to check saved codes on."""
    return np.linspace(0, size - 1, num=min(16, size), dtype=np.int64)


def _signs_fit(mirror: Mirror, signs: npt.NDArray[np.uint64]) -> bool:
    """Saved sign codes that agree with the matrix on a few rows spread over it (else the
    mirror codes its rows again at first use)."""
    probes = _probes(mirror.size)
    words = signs.shape[0]
    return bool(np.array_equal(signs[:, probes].T, sign_codes(mirror.matrix[probes], words)))


def _saved_int8(mirror: Mirror, arrays: Mapping[str, npt.NDArray[Any]]) -> Int8Rows | None:
    """The saved int8 rows when they are whole and agree with the matrix on a few rows (else
    the mirror codes its rows again at first use)."""
    codes, scale = arrays.get("int8"), arrays.get("int8_scale")
    size, dim = mirror.size, mirror.dim
    if (
        codes is None
        or scale is None
        or codes.dtype != np.int8
        or codes.ndim != 2
        or codes.shape[1] != dim
        or len(codes) < size
        or scale.dtype != np.float32
        or scale.shape != (dim,)
        or not bool(np.all(scale > 0))
    ):
        return None
    rows = Int8Rows(dim, codes if _privately_mapped(codes) else codes.copy(), np.array(scale), size)
    return rows if size == 0 or rows.fits(mirror.matrix, _probes(size)) else None


class Mirror(MirrorLayout):
    """The live vectors (unit length, unless ``unit=False``) as one float32 matrix, plus their
    metadata codes and integer columns.

    Rows are appended; a replaced or deleted row is marked dead and dropped by :meth:`compact`.
    The rows before ``sorted_end`` are kept in blocks ordered by (list, group): ``list`` is the
    inverted list under a :class:`Partition` (one list without) and ``group`` the metadata column
    most filters use (the first one by default). ``blocks[b]:blocks[b + 1]`` holds block
    ``b = list * groups + group_code``, so an unfiltered search scans one slice per list it
    probes, and a filter on the group its block of each of those lists (without a partition: one
    slice) instead of gathering scattered rows. Later rows form the tail, scanned with a mask.
    A group column with more than ``GROUP_MAX`` values is not grouped (its filters are masks,
    as any other column's).

    Every per-row array is listed by :meth:`arrays` and rebuilt by :meth:`from_arrays` (with the
    small JSON-able :meth:`state`), so a mirror can be saved and mapped back as it is.
    """

    # -- saving and mapping back ---------------------------------------------------------------

    def arrays(self) -> dict[str, npt.NDArray[Any]]:
        """Every array of the mirror, trimmed to its rows (views, not copies): per row
        ``matrix``, ``rowids``, ``alive``, ``lists`` and ``code:<column>``; ``blocks`` (the
        sorted blocks' starts); ``index_keys``/``index_values`` (rowid -> position, sorted by
        rowid); under a partition ``centroids``; when :attr:`sieved` ``signs`` (the sign codes,
        word-major) and ``int8``/``int8_scale`` (the int8 rows and their scale; all three
        optional: a mirror read without them codes its rows at first use). With
        :meth:`state`, all that :meth:`from_arrays` needs. Names and dtypes are stable
        (``STATE_VERSION``)."""
        n = self.size
        self.index.settle()
        if self.index.recent or len(self.index.keys) != self.live:
            self.index.rebuild(self.rowids[:n], self.alive[:n])
        out: dict[str, npt.NDArray[Any]] = {
            "matrix": self.matrix[:n],
            "rowids": self.rowids[:n],
            "alive": self.alive[:n],
            "lists": self.lists[:n],
            "blocks": self.blocks,
            "index_keys": self.index.keys,
            "index_values": self.index.values,
        }
        for c in self.columns:
            out[f"code:{c}"] = self.codes[c][:n]
        for c in self.ranges:
            out[f"int:{c}"] = self.ints[c][:n]
        if self.partition is not None:
            out["centroids"] = self.partition.centroids
        signs = self.sign_codes()
        if signs is not None:
            out["signs"] = signs.saved()
        int8 = self._coarse(False)
        if int8 is not None and int8.scale is not None:
            out["int8"], out["int8_scale"] = int8.saved(), int8.scale
        return out

    def state(self) -> dict[str, Any]:
        """The mirror's small, JSON-able state: shape, counts and the metadata values by code."""
        part = self.partition
        return {
            "version": STATE_VERSION,
            "dim": self.dim,
            "columns": list(self.columns),
            "ranges": list(self.ranges),
            "unit": self.unit,
            "group": self.group,
            "groups": self.groups,
            "size": self.size,
            "dead": self.dead,
            "sorted_end": self.sorted_end,
            "vocab": {c: list(self.vocab[c]) for c in self.columns},  # values in code order
            "trained_rows": None if part is None else part.trained_rows,
            "sieving": self.sieving,
        }

    @classmethod
    def from_arrays(
        cls, arrays: Mapping[str, npt.NDArray[Any]], state: Mapping[str, Any], file: FileRows | None = None
    ) -> Mirror:
        """The mirror saved by :meth:`arrays` and :meth:`state`; ``file`` reads the rows of
        ``matrix`` from the file it is mapped from (:attr:`file`).

        ``matrix`` is used as it is (a memory-mapped one stays mapped; it may hold spare rows
        beyond ``size``, room to grow; it must be writeable, e.g. ``np.load(mmap_mode="c")``, or
        it is copied). The small per-row arrays are copied with room to the matrix's rows. The
        row index is taken when given and consistent, else rebuilt. Raises ``ValueError`` when
        the arrays do not fit together (a damaged or foreign save): never a wrong mirror."""
        try:
            if state.get("version") != STATE_VERSION:
                raise ValueError(f"mirror state version {state.get('version')!r}, expected {STATE_VERSION}")
            dim, columns, size = int(state["dim"]), [str(c) for c in state["columns"]], int(state["size"])
            group = state["group"]
            ranges = [str(c) for c in state.get("ranges", [])]
            mirror = cls(
                dim,
                columns,
                group=False if group is None else str(group),
                ranges=ranges,
                unit=bool(state.get("unit", True)),
            )
            vocab_lists = {c: list(state["vocab"][c]) for c in columns}
            groups, sorted_end, dead = int(state["groups"]), int(state["sorted_end"]), int(state["dead"])
            trained = state.get("trained_rows")
            sieving = bool(state.get("sieving", False))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"mirror state is incomplete: {exc!r}") from exc

        def array(name: str, dtype: Any, shape: tuple[int, ...] | None = None) -> npt.NDArray[Any]:
            if name not in arrays:
                raise ValueError(f"mirror array {name!r} is missing")
            found = arrays[name]
            if found.dtype != np.dtype(dtype) or (shape is not None and found.shape != shape):
                raise ValueError(
                    f"mirror array {name!r} is {found.dtype}{found.shape}, not {np.dtype(dtype)}{shape}"
                )
            return found

        matrix = array("matrix", np.float32)
        if matrix.ndim != 2 or matrix.shape[1] != dim or len(matrix) < size:
            raise ValueError(f"mirror array 'matrix' has shape {matrix.shape}, not ({size}+, {dim})")

        def rows(name: str, dtype: Any) -> npt.NDArray[Any]:
            """A per-row array: a copy-on-write map as it is (the first append makes room,
            :meth:`_grow`), anything else copied (the caller's arrays stay its own)."""
            found = array(name, dtype, (size,))
            return found if _privately_mapped(found) else found.copy()

        mirror.matrix = matrix if matrix.flags.writeable else matrix.copy()
        mirror.rowids = rows("rowids", np.int64)
        mirror.alive = rows("alive", np.bool_)
        mirror.lists = rows("lists", np.int32)
        for c in columns:
            mirror.codes[c] = rows(f"code:{c}", np.int32)
            mirror.vocab[c] = {v: i for i, v in enumerate(vocab_lists[c])}
            if len(mirror.vocab[c]) != len(vocab_lists[c]):
                raise ValueError(f"mirror vocabulary of {c!r} repeats a value")
            codes = mirror.codes[c][:size]
            if size and (int(codes.min()) < 0 or int(codes.max()) >= len(vocab_lists[c])):
                raise ValueError(f"mirror codes of {c!r} out of range")
        for c in ranges:
            mirror.ints[c] = rows(f"int:{c}", np.int64)
        mirror.size, mirror.dead = size, dead
        if dead != size - int(np.count_nonzero(mirror.alive[:size])):
            raise ValueError("mirror state: dead rows do not match the alive array")
        lists = 1
        if trained is not None:
            centroids = array("centroids", np.float32)
            if centroids.ndim != 2 or centroids.shape[1] != dim or len(centroids) == 0:
                raise ValueError(f"mirror array 'centroids' has shape {centroids.shape}")
            lists = len(centroids)
            mirror.partition = Partition(np.array(centroids), np.zeros(2, dtype=np.int64), int(trained))
            labels = mirror.lists[:sorted_end]
            if sorted_end and (int(labels.min()) < 0 or int(labels.max()) >= lists):
                raise ValueError("mirror lists out of range")
        if groups < 1 or (groups > 1 and (group is None or groups > len(vocab_lists[str(group)]))):
            raise ValueError(f"mirror state: {groups} groups for group column {group!r}")
        blocks = np.array(array("blocks", np.int64, (groups * lists + 1,)))
        if blocks[0] != 0 or blocks[-1] != sorted_end or sorted_end > size or (np.diff(blocks) < 0).any():
            raise ValueError("mirror array 'blocks' does not describe the sorted rows")
        mirror.blocks, mirror.groups, mirror.sorted_end = blocks, groups, sorted_end
        mirror._sync_partition_starts()
        keys, values = arrays.get("index_keys"), arrays.get("index_values")
        live = size - dead
        if (
            keys is not None
            and values is not None
            and keys.dtype == np.int64
            and values.dtype == np.int64
            and len(keys) == len(values) == live
        ):
            if not _privately_mapped(keys) or not _privately_mapped(values):
                keys, values = keys.copy(), values.copy()
            mirror.index.set(
                keys,
                values,
                check=lambda: _check_index(mirror, keys, values),
                confirm=lambda rowids, positions: _holds(mirror, rowids, positions),
            )
        else:
            mirror.index.rebuild(mirror.rowids[:size], mirror.alive[:size])
        mirror.sieving = sieving
        signs = arrays.get("signs")
        if (
            mirror.sieved
            and signs is not None
            and signs.dtype == np.uint64
            and signs.shape == ((dim + 63) // 64, size)
            and _signs_fit(mirror, signs)
        ):
            mirror._signs = SignCodes(dim, signs if _privately_mapped(signs) else signs.copy())
        if mirror.sieved:
            mirror._int8 = _saved_int8(mirror, arrays)
        if file is not None and _privately_mapped(mirror.matrix) and file.rows >= size and file.width == dim:
            mirror.file, mirror.file_rows = file, size
        return mirror

    @property
    def codes_missing(self) -> bool:
        """True when a sieved mirror has no sign codes or int8 rows yet (made at first use)."""
        return self.sieved and (self._signs is None or self._int8 is None)

    # -- search (:class:`._mirror_search.MirrorSearch`) ---------------------------------------

    def _lookup(self, rowids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return self.index.lookup(rowids)

    def _probe_rows(self, part: Partition, k: int) -> float:
        """About PROBE_LISTS lists' worth of rows (lists hold ~sqrt(n) rows: ~11% of 1M rows,
        ~22% of 100k-200k); more for a larger k."""
        return float(PROBE_LISTS * part.end / part.lists * max(1.0, (k / 10) ** 0.25))

    def describe(self) -> dict[str, Any] | None:
        """How the mirror searches approximately: sign codes, inverted lists, or ``None`` (exact)."""
        if self.sieved:
            tail = self.size - self.sorted_end
            return {"sign_codes": True, "grouped_rows": self.sorted_end, "tail_rows": tail}
        part = self.partition
        if part is None:
            return None
        return {
            "sign_codes": False,
            "lists": part.lists,
            "probe_lists": PROBE_LISTS,
            "partitioned_rows": self.sorted_end,
            "tail_rows": self.size - self.sorted_end,
            "trained_rows": part.trained_rows,
            "groups": self.groups,
            "builds": self.partitions_built,
            "restored": self.partitions_restored,
            "last_build_seconds": round(self.partition_seconds, 3),
        }
