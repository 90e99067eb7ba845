"""The folders memstrata accepts and the places it will not write: one spelling per folder, no
index of the filesystem root or of the data dir, no export or archive among the data dir's own
files, no root whose path UTF-8 cannot hold. The config, the registry of indexed roots, the
episodic actor and export apply these rules."""

from __future__ import annotations

import os
from pathlib import Path

from memstrata.core.errors import InvalidInputError
from memstrata.core.validation import has_lone_surrogate, show_path

__all__ = ["check_root_text", "existing_dir", "refused_output", "refused_tree"]


def check_root_text(root: Path) -> None:
    """Refuse a root whose path is not valid UTF-8: every database keeps it as text."""
    if has_lone_surrogate(str(root)):
        raise InvalidInputError(
            f"root '{show_path(str(root))}' is not valid UTF-8: it cannot be indexed (rename the folder)"
        )


def existing_dir(text: str, name: str) -> Path:
    """The directory ``text`` names, absolute with symlinks resolved, so that one folder has one
    spelling wherever it is registered; ``name`` leads the error (``path``, ``config key 'x':``)."""
    try:
        root = Path(text).expanduser().resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise InvalidInputError(f"{name} {text!r} does not exist or cannot be read ({exc})") from exc
    if not root.is_dir():
        raise InvalidInputError(f"{name} {text!r} is not a directory")
    return root


def refused_tree(root: Path, data_dir: str | os.PathLike[str]) -> str | None:
    """Why resolved ``root`` may not be indexed, as a phrase following its path, or ``None``.

    The filesystem root would walk the whole machine; memstrata's data dir (or a folder in it)
    would index its own databases and exports. The config's workspaces and codebases and
    ``memstrata index`` apply this one rule."""
    if root == Path(root.anchor):
        return "is the filesystem root"
    data = Path(data_dir).expanduser().resolve()
    if root == data or data in root.parents:
        return "is memstrata's data dir or inside it"
    return None


def refused_output(
    path: str | os.PathLike[str], data_dir: str | os.PathLike[str], *, managed: Path | None = None
) -> str | None:
    """Why a file memstrata writes on request (an export, an archive) may not go to ``path``, as a
    phrase following it, or ``None``.

    The data dir holds memstrata's own databases and index files: a file written there could
    replace one (an export renamed over ``items.sqlite``) or take the name of a store not yet
    made (an archive called ``knowledge``). Only the folder memstrata manages for such files
    (``managed``: the episodic archives) may be written inside it. Symlinks are followed, as the
    write would follow them."""
    target = Path(os.path.realpath(Path(path).expanduser()))
    data = Path(os.path.realpath(Path(data_dir).expanduser()))
    if target != data and data not in target.parents:
        return None
    if managed is not None and Path(os.path.realpath(managed)) in target.parents:
        return None
    where = "" if managed is None else f" (other than {show_path(str(managed))})"
    return f"is inside memstrata's data dir {show_path(str(data))}{where}, where its own databases live"
