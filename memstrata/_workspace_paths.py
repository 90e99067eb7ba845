"""Which indexed root a path given to ``Workspaces.get`` is in, and where inside it.

A path is absolute (inside a root, maybe through a symlink to one, as ``index`` resolves it) or
relative (to whichever root holds it: more than one is ambiguous and refused). These helpers only
pick the root and the path in it; the root's layer still does every check when it reads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from memstrata.core.errors import InvalidInputError

if TYPE_CHECKING:
    from ._workspace_results import Workspace

__all__ = ["exists_under", "is_within", "refuse_ambiguous", "through_root_link"]


def refuse_ambiguous(path: str, holders: list[Workspace]) -> None:
    """A relative path found under more than one root names no file: refused rather than read
    from whichever root was registered first. One folder registered as two kinds is one root."""
    roots = list(dict.fromkeys(str(w.root) for w in holders))
    if len(roots) > 1:
        raise InvalidInputError(
            f"path {path!r} is in more than one indexed root ({', '.join(map(repr, roots))}): "
            "name its root (root; --root on the command line) or give its absolute path"
        )


def exists_under(root: Path, rel: str) -> bool:
    """Whether ``rel`` names something in ``root``, looked up through directory descriptors
    without following symlinks (only picks the root; the layer's ``get`` does the checks)."""
    from memstrata.layers._safe_fs import exists

    return exists(root, os.path.normpath(rel).replace(os.sep, "/"))


def through_root_link(path: str, roots: list[Workspace]) -> str:
    """``path`` with its shortest leading part that resolves to a root (as ``index`` resolves
    it) replaced by that root, else ``path`` itself. Only that part is resolved: a part that
    leads inside a root but not to it ends the search, and what follows the root is the layer's
    to check (a symlink in it that leaves the root is refused by ``get``)."""
    known = {w.root for w in roots}
    head, *rest = Path(path).parts
    prefix = Path(head)
    for n, part in enumerate(rest):
        prefix /= part
        try:
            resolved = prefix.resolve(strict=True)
        except (OSError, RuntimeError):
            return path
        if resolved in known:
            return str(resolved.joinpath(*rest[n + 1 :]))
        if any(is_within(str(resolved), root) for root in known):
            return path
    return path


def is_within(path: str, root: Path) -> bool:
    root_text = str(root)
    return path == root_text or path.startswith(root_text.rstrip(os.sep) + os.sep)
