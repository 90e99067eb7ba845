"""Retrieval corpora built from documentation installed with Python and its packages.

Nobody on this project wrote this text, and it is on every machine that can run the benchmarks,
so quality figures are reproducible offline. A docstring whose first paragraph is a summary and
whose remaining paragraphs explain it gives one (query, relevant document) pair: the query is the
summary, the document is the rest of the docstring. Every other body of the corpus is a distractor.
This mirrors how agents use the knowledge store: a short description of a task looks for a longer
note written in different words.

Sources are read with :mod:`ast` (nothing is imported, so no module runs). A corpus is
deterministic for a given Python and set of installed package versions.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import random
import re
import sysconfig
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DOC_CHARS",
    "THIRD_PARTY_PACKAGES",
    "Corpus",
    "cut_at_word",
    "packages_corpus",
    "sample_corpus",
    "stdlib_corpus",
    "unique_pairs",
]

# Packages memstrata installs (with its dev and mcp extras); those missing are skipped.
THIRD_PARTY_PACKAGES = (
    "numpy", "click", "hypothesis", "huggingface_hub", "fastembed", "watchdog", "pykka", "platformdirs",
    "jsonschema", "pydantic", "httpx", "anyio", "mcp", "_pytest", "pygments", "tqdm", "attr", "requests",
    "urllib3", "starlette",
)  # fmt: skip

_SKIP_DIRS = {"test", "tests", "testing", "idlelib", "lib2to3", "tkinter", "turtledemo", "ensurepip"}
_SIGNATURE = re.compile(r"^[\w.]+\(")
DOC_CHARS = 500  # bodies are cut (at a word) to bound the cost of embedding the corpus


@dataclass(frozen=True)
class Corpus:
    """Documents and queries; ``relevant[i]`` is the index in ``docs`` that answers ``queries[i]``."""

    name: str
    docs: list[str]
    queries: list[str]
    relevant: list[int]


def _docstrings(root: Path) -> Iterator[str]:
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts[:-1]
        if any(p in _SKIP_DIRS or p.startswith(("config-", "test_", "site-packages")) for p in parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module):
                doc = ast.get_docstring(node)
                if doc:
                    yield doc


def cut_at_word(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, at a word boundary."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0]


def _pairs(roots: list[Path]) -> list[tuple[str, str]]:
    """(summary, body) pairs whose summary and body are both unique in the corpus."""
    return list(_pairs_of(tuple(roots)))


@functools.lru_cache(maxsize=8)
def _pairs_of(roots: tuple[Path, ...]) -> tuple[tuple[str, str], ...]:
    """Parsed once per process: `make bench` runs every module in one process, and four of them
    read the same docstrings (~4 CPU s a reading)."""
    pairs: list[tuple[str, str]] = []
    for root in roots:
        for doc in _docstrings(root):
            paragraphs = [p.strip() for p in re.split(r"\n\s*\n", inspect.cleandoc(doc)) if p.strip()]
            if len(paragraphs) < 2:
                continue
            summary = " ".join(paragraphs[0].split())
            body = " ".join(" ".join(paragraphs[1:]).split())
            if not 5 <= len(summary.split()) <= 40 or len(body.split()) < 12 or _SIGNATURE.match(summary):
                continue
            pairs.append((summary, cut_at_word(body, DOC_CHARS)))
    return tuple(unique_pairs(pairs))


def unique_pairs(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (query, body) pairs whose query (ignoring case) and body occur once: one answer each."""
    queries = Counter(q.lower() for q, _ in pairs)
    bodies = Counter(b for _, b in pairs)
    return [(q, b) for q, b in pairs if queries[q.lower()] == 1 and bodies[b] == 1]


def sample_corpus(name: str, pairs: list[tuple[str, str]], n_docs: int, n_queries: int, seed: int) -> Corpus:
    """A seeded shuffle, cut: a smaller corpus is a prefix of a larger one (embeddings are shared)."""
    order = list(pairs)
    random.Random(seed).shuffle(order)
    chosen = order[:n_docs]
    n_queries = min(n_queries, len(chosen))
    # store order is shuffled again so that answers are not the first rows (no tie-break bias)
    position = list(range(len(chosen)))
    random.Random(seed + 1).shuffle(position)
    docs = [""] * len(chosen)
    for i, (_, body) in enumerate(chosen):
        docs[position[i]] = body
    return Corpus(
        name=name,
        docs=docs,
        queries=[s for s, _ in chosen[:n_queries]],
        relevant=position[:n_queries],
    )


def stdlib_corpus(n_docs: int, n_queries: int, seed: int = 7) -> Corpus:
    """Docstrings of the Python standard library (pure-Python modules)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sample_corpus("stdlib", _pairs([root]), n_docs, n_queries, seed)


def packages_corpus(n_docs: int, n_queries: int, seed: int = 11) -> Corpus:
    """Docstrings of the third-party packages installed with memstrata."""
    roots: list[Path] = []
    for name in THIRD_PARTY_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots.extend(Path(p) for p in spec.submodule_search_locations)
    return sample_corpus("packages", _pairs(roots), n_docs, n_queries, seed)
