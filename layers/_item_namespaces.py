"""Listing the namespaces of an item store by walking the namespace index, never the items.

Apart from the store: LangGraph's ``list_namespaces`` semantics (prefix and suffix patterns with
wildcards, a depth cut) over a sorted walk that jumps over listed subtrees.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memstrata.core.errors import InvalidInputError

from ._item_records import _AFTER_SEP, SEP, ItemStoreState, namespace_key

__all__ = ["NamespaceListing"]


class NamespaceListing(ItemStoreState):
    """The namespace listing of :class:`~._items.ItemStore` (one of its bases)."""

    def list_namespaces(
        self,
        *,
        prefix: Sequence[str] | None = None,
        suffix: Sequence[str] | None = None,
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
        wildcard: str | None = "*",
    ) -> list[tuple[str, ...]]:
        """Distinct namespaces, sorted, found by walking the namespace index (never the items).

        Each step asks the index for the next namespace (one ``min`` over a range); once a
        namespace cut to ``max_depth`` is listed, the rest of its subtree is jumped over.
        ``prefix``/``suffix`` labels equal to ``wildcard`` match any label; ``max_depth`` cuts
        longer namespaces to that depth (then deduplicated).
        """
        if max_depth is not None and (not isinstance(max_depth, int) or max_depth < 1):
            raise InvalidInputError(f"max_depth must be a positive integer, got {max_depth!r}")
        fixed: list[str] = []
        for label in prefix or ():
            if label == wildcard:
                break
            fixed.append(label)
        base = namespace_key(fixed) if fixed else None
        exact = base is not None and len(fixed) == len(prefix or ())
        if base is None:
            low, upper = "", None
        else:
            low, upper = (base if exact else base + SEP), base + _AFTER_SEP

        def matches(ns: tuple[str, ...], pattern: Sequence[str], at_end: bool) -> bool:
            if len(pattern) > len(ns):
                return False
            part = ns[len(ns) - len(pattern) :] if at_end else ns[: len(pattern)]
            return all(p in (wildcard, n) for p, n in zip(pattern, part, strict=True))

        out: set[tuple[str, ...]] = set()
        with self._lock:
            now = self._clock()
            found = self._next_namespace(low, True, upper)
            while found is not None:
                name = tuple(found.split(SEP))
                cut = name[:max_depth] if max_depth is not None else name
                in_tree = base is None or found == base or found.startswith(base + SEP)
                if (
                    in_tree
                    and cut not in out
                    and (not prefix or matches(name, prefix, False))
                    and (not suffix or matches(name, suffix, True))
                    and self._db.scalar(
                        "SELECT 1 FROM items WHERE ns = ? AND (expires_at IS NULL OR expires_at > ?) LIMIT 1",
                        (found, now),
                    )
                ):
                    out.add(cut)
                if cut in out and len(name) > len(cut):  # deeper names of this subtree add nothing
                    found = self._next_namespace(SEP.join(cut) + _AFTER_SEP, True, upper)
                else:
                    found = self._next_namespace(found, False, upper)
        return sorted(out)[offset : offset + limit]

    def _next_namespace(self, low: str, inclusive: bool, upper: str | None) -> str | None:
        """The smallest stored namespace after ``low`` (and before ``upper``): one index seek."""
        sql = f"SELECT min(ns) FROM items WHERE ns {'>=' if inclusive else '>'} ?"
        params: list[Any] = [low]
        if upper is not None:
            sql += " AND ns < ?"
            params.append(upper)
        found = self._db.scalar(sql, params)
        return None if found is None else str(found)
