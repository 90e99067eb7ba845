"""Helpers shared by the layers: ancestors and subtree queries over normalised scopes, and the
next id of a table whose rows keep an import's ids.

Scopes are checked and normalised by :func:`memstrata.core.validation.check_scope`; the helpers
here assume a normalised scope (``/`` or ``/a/b``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memstrata.core.validation import check_row_id

if TYPE_CHECKING:
    from memstrata.storage import Database

__all__ = ["next_id_at_least", "scope_ancestors", "scope_subtree_sql"]


def scope_ancestors(scope: str) -> list[str]:
    """``"/src/auth"`` -> ``["/", "/src", "/src/auth"]`` (whole segments only)."""
    parts = [p for p in scope.split("/") if p]
    return ["/"] + ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def scope_subtree_sql(column: str, scope: str) -> tuple[str, tuple[str, ...]]:
    """SQL matching ``scope`` and its descendants, as index-friendly ranges (no LIKE escaping).

    ``'/src/auth'`` matches ``/src/auth`` and ``/src/auth/...`` but not ``/src/authz``;
    ``'0'`` is the character after ``'/'``, so the range holds exactly the ``/src/auth/`` prefix.
    """
    if scope == "/":
        return "1", ()
    return (
        f"({column} = ? OR ({column} >= ? AND {column} < ?))",
        (scope, scope + "/", scope + "0"),
    )


def next_id_at_least(db: Database, table: str, row_id: int) -> None:
    """The next new row of ``table`` (``AUTOINCREMENT``) takes at least ``row_id``: an import
    keeps the ids of an export, gaps included; ids already given out are never given again."""
    wanted = check_row_id(row_id) - 1
    with db.transaction():
        db.execute(
            "INSERT INTO sqlite_sequence (name, seq) SELECT ?, 0"
            " WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = ?)",
            (table, table),
        )
        db.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?", (wanted, table))
