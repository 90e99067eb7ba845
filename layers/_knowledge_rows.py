"""New knowledge rows as one ``INSERT`` per batch: what every row of a batch shares (its scope,
no author, no tags, the time) written as SQL literals, the rest bound per row.

Binding a value costs ~0.25 us under the GIL, ~10 % of a bulk load's table insert at 12 values a
row; a batch of a bulk load usually binds 4.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ._knowledge_schema import TABLE, _Item

__all__ = ["RowPlan", "row_plan", "row_statement"]

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
    each (a literal when every row shares it: see :func:`_literal`, else a parameter) and the
    parameters of each row. Ids are given by SQLite (``AUTOINCREMENT``: the same next id as
    :meth:`KnowledgeWrites._next_id`, checked after the insert)."""

    columns: list[str]
    values: list[str]
    rows: list[tuple[Any, ...]]


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
    get = operator.attrgetter(*attrs)  # three names at least: it returns a tuple
    return RowPlan(columns, values, [get(item) for item in items])


def row_statement(plan: RowPlan, pending: list[int], now: float) -> tuple[str, list[tuple[Any, ...]]]:
    """The INSERT of ``plan``'s rows with their times (``now``) and ``vector_pending``."""
    values, rows = list(plan.values), plan.rows
    extra: tuple[Any, ...] = ()
    stamp = _exact_real(now)
    if stamp is None:
        extra = (now,)
        stamp = f"?{len(rows[0]) + 1}"
    flag = _literal(pending)
    if flag is None:
        flag = f"?{len(rows[0]) + len(extra) + 1}"
        rows = [(*row, *extra, p) for row, p in zip(rows, pending, strict=True)]
    elif extra:
        rows = [(*row, *extra) for row in rows]
    values += [stamp, stamp, flag]
    columns = ", ".join([*plan.columns, "created_at", "updated_at", "vector_pending"])
    return f"INSERT INTO {TABLE}({columns}) VALUES ({', '.join(values)})", rows
