"""New rows of a vector table written by one ``INSERT ... SELECT`` instead of one statement a row.

Run row by row, ``executemany`` binds every value under the GIL and executes a whole statement
per row (its cursors opened and closed each time): about a quarter of a bulk load's vector
writes beside vec0's own work. Here the whole write is one statement that runs without the GIL:
the rowids are a JSON array read in order by ``json_each``, the vectors one blob cut per row by
``substr`` (byte offsets into a blob: nothing else is copied), and each metadata column is either
one bound value shared by every row or, with a few distinct values, a one-byte code per row (a
blob) that picks its value among them, each bound once as given. Columns of many distinct
values (or of mixed types) are left to the per-row statement (``None``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._array_types import FloatArray

__all__ = ["insert_statement"]

MAX_CODED = 64  # distinct values of a metadata column written by code at most


def insert_statement(
    table: str,
    columns: Sequence[str],
    ids: Sequence[int],
    array: FloatArray,
    meta_rows: Sequence[Mapping[str, Any]],
) -> tuple[str, list[Any]] | None:
    """The one statement that inserts ``ids`` with the rows of ``array`` (float32) and
    ``meta_rows`` (checked: one type per column), or ``None`` when a column is not suited."""
    row_bytes = array.shape[1] * array.itemsize
    params: list[Any] = [np.ascontiguousarray(array).data, json.dumps([int(i) for i in ids])]
    values = ["j.value", f"substr(?1, j.key * {row_bytes} + 1, {row_bytes})"]
    for column in columns:
        given = [meta[column] for meta in meta_rows]
        kinds = {type(value) for value in given}
        if kinds == {float}:  # -0.0 equals 0.0: told apart by sign (NaN is refused earlier)
            keys: list[Any] = [(value, math.copysign(1.0, value)) for value in given]
        elif kinds == {int} or kinds == {str}:
            keys = given
        else:
            return None
        distinct = dict(zip(keys, given, strict=True))  # equal keys: the same value, of one type
        if len(distinct) == 1:
            params.append(given[0])
            values.append(f"?{len(params)}")
            continue
        if len(distinct) > MAX_CODED:
            return None
        code = {key: n for n, key in enumerate(distinct)}
        params.append(bytes(map(code.__getitem__, keys)))
        codes = len(params)
        cases = []
        for n, value in enumerate(distinct.values()):
            params.append(value)
            cases.append(f"WHEN X'{n:02X}' THEN ?{len(params)}")
        values.append(f"CASE substr(?{codes}, j.key + 1, 1) {' '.join(cases)} END")
    names = "".join(f", {column}" for column in columns)
    sql = (  # in the given order, as row by row (json_each yields its rows by rowid)
        f"INSERT INTO {table}(rowid, embedding{names}) SELECT {', '.join(values)} "
        "FROM json_each(?2) AS j ORDER BY j.rowid"
    )
    return sql, params
