"""Scope helpers shared by the layers: ancestors and subtree queries over normalised scopes.

Scopes are checked and normalised by :func:`memstrata.core.validation.check_scope`; the helpers
here assume a normalised scope (``/`` or ``/a/b``).
"""

from __future__ import annotations

__all__ = ["scope_ancestors", "scope_subtree_sql"]


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
