"""New knowledge rows as one ``INSERT`` per batch: what every row of a batch shares (its scope,
no author, no tags, the time) written as SQL literals, the rest given per row.

Run row by row (``executemany``), every row is a statement of its own: its values bound under
the GIL (~0.25 us each), the cursors of the table and of each of its indexes opened and closed
again, about half of a bulk load's table insert. So the rows are written by one ``INSERT ...
SELECT`` instead, which runs without the GIL: the texts that differ per row as one JSON array of
arrays (made ahead, with the plan), read in order by ``json_each``, and the content hashes as one
blob cut by ``substr``. Rows that JSON may not carry exactly (a NUL character, which SQLite's
JSON functions have not always kept, or text that reads like its escape; text that is not valid
Unicode) are bound row by row as before.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from ._knowledge_schema import TABLE, _Item

__all__ = ["RowPlan", "row_insert", "row_plan", "row_statement"]

HASH_BYTES: Final = 32  # a content hash (SHA-256), as ``text_hash`` makes it

# The columns of a new row (SQLite numbers it) with the _Item attribute each comes from; those
# marked True differ from row to row (always bound), the others are often one value for a batch.
_ROW_COLUMNS: Final = (
    ("content", "content", True),
    ("category", "category", False),
    ("scope", "scope", False),
    ("author", "author", False),
    ("content_hash", "hash", True),
    ("tag_text", "tag_text", False),
    ("ident", "ident", True),
    ("cjk", "cjk", False),
)


def _literal(values: Sequence[Any]) -> str | None:
    """The SQL literal of the value all of ``values`` share, when there is one and it can be
    written safely: NULL, an integer, or printable ASCII without a quote; else ``None``."""
    first = values[0]
    if values.count(first) != len(values):
        return None
    if first is None:
        return "NULL"
    if type(first) is int:
        return str(first)
    if type(first) is str and first.isascii() and first.isprintable() and "'" not in first:
        return f"'{first}'"
    return None


def _exact_real(value: float) -> str | None:
    """An SQL expression of exactly ``value`` (a power-of-two division, exact in IEEE
    arithmetic), or ``None`` when it has none that short."""
    numerator, denominator = float(value).as_integer_ratio()
    if denominator > 1 << 62 or abs(numerator) >= 1 << 53:
        return None
    return f"(CAST({numerator} AS REAL) / {denominator})"


@dataclass(slots=True)
class RowPlan:
    """How a run of new rows is inserted, from the items alone: the columns, the value of
    each (a literal when every row shares it: see :func:`_literal`, else the row's own, the
    ``?N`` of the N-th of ``attrs``) and the rows. Ids are given by SQLite (``AUTOINCREMENT``:
    the same next id as :meth:`KnowledgeWrites._next_id`, checked after the insert).

    ``texts`` and ``hashes``: the rows' own values for :func:`row_insert` (the text values of
    each row as a JSON array, in ``attrs`` order without the hash; the hashes one after the
    other), or ``None`` when they must be bound row by row."""

    columns: list[str]
    values: list[str]
    attrs: list[str]
    items: Sequence[_Item]
    texts: bytes | None
    hashes: bytes | None


def row_plan(items: Sequence[_Item]) -> RowPlan:
    """Binding costs ~0.25 us per value under the GIL (~10 % of a bulk load's table insert),
    so what a whole batch shares (the scope, no author, no tags...) is written as a literal."""
    columns, values, attrs = [], [], []
    for column, attr, varies in _ROW_COLUMNS:
        literal = None if varies else _literal([getattr(item, attr) for item in items])
        columns.append(column)
        if literal is None:
            attrs.append(attr)
            values.append(f"?{len(attrs)}")
        else:
            values.append(literal)
    get = operator.attrgetter(*[a for a in attrs if a != "hash"])  # two names at least: a tuple
    try:
        texts: bytes | None = orjson.dumps([get(item) for item in items])
    except orjson.JSONEncodeError:  # not valid Unicode: bound row by row, which reports it
        texts = None
    hashes = None
    if texts is not None and b"\\u0000" not in texts and all(len(i.hash) == HASH_BYTES for i in items):
        hashes = b"".join([item.hash for item in items])
    else:
        texts = None
    return RowPlan(columns, values, attrs, items, texts, hashes)


def row_statement(plan: RowPlan, pending: list[int], now: float) -> tuple[str, list[tuple[Any, ...]]]:
    """The INSERT of ``plan``'s rows with their times (``now``) and ``vector_pending``, one
    statement a row (for ``executemany``)."""
    get = operator.attrgetter(*plan.attrs)  # three names at least: it returns a tuple
    rows = [get(item) for item in plan.items]
    values = list(plan.values)
    extra: tuple[Any, ...] = ()
    stamp = _exact_real(now)
    if stamp is None:
        extra = (now,)
        stamp = f"?{len(plan.attrs) + 1}"
    flag = _literal(pending)
    if flag is None:
        flag = f"?{len(plan.attrs) + len(extra) + 1}"
        rows = [(*row, *extra, p) for row, p in zip(rows, pending, strict=True)]
    elif extra:
        rows = [(*row, *extra) for row in rows]
    values += [stamp, stamp, flag]
    columns = ", ".join([*plan.columns, "created_at", "updated_at", "vector_pending"])
    return f"INSERT INTO {TABLE}({columns}) VALUES ({', '.join(values)})", rows


def row_insert(plan: RowPlan, pending: list[int], now: float) -> tuple[str, list[Any]] | None:
    """The one ``INSERT ... SELECT`` of ``plan``'s rows (see the module doc), or ``None`` when
    they are to be bound row by row (:func:`row_statement`): their texts cannot go as JSON, or
    their ``vector_pending`` differ. SQLite numbers the rows in the order they are read, which
    ``ORDER BY j.rowid`` makes the array's (``json_each`` yields them so: recent SQLite adds no
    sort for it)."""
    flag = _literal(pending)
    if plan.texts is None or flag is None:
        return None
    params: list[Any] = [plan.texts, plan.hashes]
    stamp = _exact_real(now)
    if stamp is None:
        params.append(now)
        stamp = "?3"
    texts = [attr for attr in plan.attrs if attr != "hash"]
    own = {
        f"?{n}": f"substr(?2, j.key * {HASH_BYTES} + 1, {HASH_BYTES})"
        if attr == "hash"
        else f"json_extract(j.value, '$[{texts.index(attr)}]')"
        for n, attr in enumerate(plan.attrs, 1)
    }
    values = [own.get(value, value) for value in plan.values] + [stamp, stamp, flag]
    columns = ", ".join([*plan.columns, "created_at", "updated_at", "vector_pending"])
    return (
        f"INSERT INTO {TABLE}({columns}) SELECT {', '.join(values)} FROM json_each(?1) AS j ORDER BY j.rowid",
        params,
    )
