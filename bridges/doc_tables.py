"""Regenerate the tables in docs/ that are derived from the registry of operations.

``python -m memstrata.bridges.doc_tables`` rewrites them in place; ``--check`` exits 1 when a
table differs from what the registry says (the test suite runs the same check), so the docs
cannot drift from the code. A generated table sits between ``<!-- NAME:begin -->`` and
``<!-- NAME:end -->`` comments.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ._methods import method_table
from .cli import command_table
from .tools import tools_markdown

__all__ = ["TABLES", "check", "render", "write"]

TABLES: dict[str, tuple[str, Callable[[], str]]] = {
    "server-methods": ("docs/bridges.md", method_table),
    "llm-tools": ("docs/bridges.md", tools_markdown),
    "cli-commands": ("docs/bridges.md", command_table),
}
"""Table name -> (file, relative to the project root; generator)."""


def render(text: str, name: str, table: str) -> str:
    """``text`` with the block called ``name`` replaced by ``table``."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    start = text.find(begin)
    stop = text.find(end, start + 1)
    if start < 0 or stop < 0:
        raise ValueError(f"no '{begin}' ... '{end}' block found")
    return text[: start + len(begin)] + "\n" + table + text[stop:]


def _project_root() -> Path:
    return Path(__file__).resolve().parent.parent


def check(root: Path | None = None) -> list[str]:
    """The tables that differ from the registry, as ``file: table`` lines (empty when in step)."""
    base = root or _project_root()
    stale = []
    for name, (relative, generate) in TABLES.items():
        text = (base / relative).read_text(encoding="utf-8")
        if render(text, name, generate()) != text:
            stale.append(f"{relative}: {name}")
    return stale


def write(root: Path | None = None) -> list[str]:
    """Rewrite every stale table; returns what changed."""
    base = root or _project_root()
    changed = []
    for name, (relative, generate) in TABLES.items():
        path = base / relative
        text = path.read_text(encoding="utf-8")
        new = render(text, name, generate())
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(f"{relative}: {name}")
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--check"]:
        stale = check()
        for line in stale:
            print(f"stale table: {line} (run: python -m memstrata.bridges.doc_tables)", file=sys.stderr)
        return 1 if stale else 0
    if args:
        print("usage: python -m memstrata.bridges.doc_tables [--check]", file=sys.stderr)
        return 2
    for line in write():
        print(f"rewrote {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
