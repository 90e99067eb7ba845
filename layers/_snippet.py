"""Snippets of search hits: the part of a chunk around the densest cluster of query terms."""

from __future__ import annotations

import re

from memstrata.storage import keyword_terms

__all__ = ["make_snippet"]


def make_snippet(text: str, query: str, limit: int) -> str:
    """At most ``limit`` characters of ``text``, centred on the densest cluster of query terms."""
    if limit <= 0:
        return ""
    if len(text) <= limit:
        return text
    hits: list[tuple[int, int, str]] = []
    for term in keyword_terms(query)[:16]:
        for n, m in enumerate(re.finditer(re.escape(term), text, re.IGNORECASE)):
            if n >= 64:
                break
            hits.append((m.start(), m.end(), term))
    hits.sort()
    inner = max(1, limit - 2)  # room for the two ellipses
    if hits:
        best, best_key = (hits[0][0], hits[0][1]), (-1, 0)
        for i, (start, end, _) in enumerate(hits):
            terms = set()
            last_end = end
            for _, e2, t2 in hits[i:]:
                if e2 - start > inner * 0.8:
                    break
                terms.add(t2)
                last_end = e2
            key = (len(terms), -start)
            if key > best_key:
                best, best_key = (start, last_end), key
        centre = (best[0] + best[1]) // 2
    else:
        centre = inner // 2
    start = max(0, min(centre - inner // 2, len(text) - inner))
    end = min(len(text), start + inner)
    if start > 0:
        space = text.find(" ", start, min(end, start + 40))
        if space != -1:
            start = space + 1
    if end < len(text):
        space = text.rfind(" ", max(start, end - 40), end)
        if space > start:
            end = space
    body = text[start:end].strip()
    return ("…" if start > 0 else "") + body + ("…" if end < len(text) else "")
