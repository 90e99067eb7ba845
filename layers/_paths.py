"""Which files an index holds, how the tree is walked, and how files are read safely.

One set of rules (:class:`SourceRules`) decides both what a sync indexes and what ``get()``
serves, so ``get()`` can never return a file the index could not hold. Nothing outside the
root is read: directories that are symlinks are never entered (no loops, no escapes), a file
symlink is followed only when its target is a regular file inside the root, and every read
opens the resolved path with ``O_NOFOLLOW | O_NONBLOCK`` and checks ``fstat`` (a FIFO or a
device never blocks or streams). Files over the size cap or with a NUL byte in their first
8 KB (binary) are skipped; invalid UTF-8 is decoded with U+FFFD replacement characters.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from memstrata.errors import InvalidInputError, PathOutsideRootError

from ._chunking import normalize_newlines

__all__ = [
    "MEMORY_FILE_NAMES",
    "Entry",
    "Scan",
    "SkipFile",
    "SourceRules",
    "decode",
    "inside",
    "read_source",
    "resolve_request",
    "scan",
]

Kind = Literal["memory", "codebase"]
MEMORY_FILE_NAMES = ("MEMORY.md", "memory.md")
MEMORY_DIR = "memory"
BINARY_PROBE = 8192
_PROSE_EXTENSIONS = (".md", ".markdown")
_OPEN_FLAGS = (
    os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
)
_DRIVE = re.compile(r"^[A-Za-z]:")


class SkipFile(Exception):
    """A file the rules allow but that cannot be indexed or served; ``reason`` says why."""

    def __init__(self, reason: str, *, sticky: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.sticky = sticky  # the same (size, mtime, mode) will give the same answer: remember it


@dataclass(frozen=True, slots=True)
class SourceRules:
    """Name rules of one index kind. ``allows`` and ``descend`` never touch the filesystem."""

    kind: Kind
    extensions: frozenset[str] = frozenset()
    pruned: frozenset[str] = frozenset()
    exclude: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()  # memory: normalised relative paths inside the root
    max_bytes: int = 2_000_000
    _excluded: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.exclude:  # one regex for every pattern: the walk tests each file against it
            pattern = "|".join(f"(?:{fnmatch.translate(p)})" for p in self.exclude)
            object.__setattr__(self, "_excluded", re.compile(pattern))

    def excluded(self, rel: str) -> bool:
        if self._excluded is None:
            return False
        name = rel.rsplit("/", 1)[-1]
        return self._excluded.match(name) is not None or self._excluded.match(rel) is not None

    def file_in_walk(self, rel: str, name: str) -> bool:
        """:meth:`allows` for a file in a directory the walk entered (its parents are allowed)."""
        if self.kind == "memory":
            return self.allows(rel)
        if name.startswith(".") or os.path.splitext(name)[1].lower() not in self.extensions:
            return False
        return not self.excluded(rel)

    def _dir_ok(self, part: str) -> bool:
        return not part.startswith(".") and (self.kind == "memory" or part not in self.pruned)

    def allows(self, rel: str) -> bool:
        """Whether a file at relative posix path ``rel`` is a source of this index."""
        parts = rel.split("/")
        if not rel or any(p in ("", ".", "..") for p in parts) or self.excluded(rel):
            return False
        if not all(self._dir_ok(p) for p in parts[:-1]) or parts[-1].startswith("."):
            return False
        if any(self.excluded("/".join(parts[:n])) for n in range(1, len(parts))):
            return False  # inside an excluded directory, which a walk never enters
        if self.kind == "codebase":
            return os.path.splitext(parts[-1])[1].lower() in self.extensions
        if rel in MEMORY_FILE_NAMES:
            return True
        is_prose = parts[-1].lower().endswith(_PROSE_EXTENSIONS)
        if parts[0] == MEMORY_DIR and len(parts) > 1 and is_prose:
            return True
        return any(rel == extra or (rel.startswith(extra + "/") and is_prose) for extra in self.extra)

    def descend(self, rel_dir: str) -> bool:
        """Whether a walk enters directory ``rel_dir`` ("" is the root)."""
        if not rel_dir:
            return True
        parts = rel_dir.split("/")
        if not all(self._dir_ok(p) for p in parts) or self.excluded(rel_dir):
            return False
        if self.kind == "codebase":
            return True
        if parts[0] == MEMORY_DIR:
            return True
        return any(
            rel_dir == extra or rel_dir.startswith(extra + "/") or extra.startswith(rel_dir + "/")
            for extra in self.extra
        )

    def describe(self) -> str:
        if self.kind == "codebase":
            return (
                f"files with extensions {', '.join(sorted(self.extensions))} outside hidden and pruned "
                "directories"
            )
        extra = "".join(f", {e}" for e in self.extra)
        return f"MEMORY.md, memory.md, memory/**/*.md{extra}"


@dataclass(frozen=True, slots=True)
class Entry:
    """A source file found by a walk: where it is and what ``stat`` said."""

    rel: str
    real: str  # resolved absolute path (differs from root/rel only for a symlinked file)
    size: int
    mtime_ns: int
    mode: int


@dataclass(slots=True)
class Scan:
    files: dict[str, Entry] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def inside(root: str, real: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def scan(root: Path, rules: SourceRules) -> Scan:
    """Walk ``root`` (already resolved) by ``rules``: a stat per candidate file, nothing read."""
    result = Scan()
    root_str = str(root)
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        directory = os.path.join(root_str, rel_dir) if rel_dir else root_str
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            if not rel_dir:  # never read an unmounted or deleted root as "every file was deleted"
                raise InvalidInputError(
                    f"root {root_str} is no longer a readable directory ({_why(exc)})"
                ) from exc
            result.skipped.append((rel_dir, f"directory not readable ({_why(exc)})"))
            continue
        subdirs = []
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                is_link = entry.is_symlink()
                is_dir = not is_link and entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir:
                if rules.descend(rel):
                    subdirs.append(rel)
                continue
            if not rules.file_in_walk(rel, entry.name):
                if is_link and rules.descend(rel) and os.path.isdir(entry.path):
                    result.skipped.append((rel, "symlinked directory, not followed"))
                continue
            _add_file(result, root_str, rel, entry, is_link, rules)
        stack.extend(reversed(subdirs))
    return result


def _add_file(
    result: Scan, root: str, rel: str, entry: os.DirEntry[str], is_link: bool, rules: SourceRules
) -> None:
    try:
        if is_link:
            real = os.path.realpath(entry.path)
            if not inside(root, real):
                result.skipped.append((rel, "symlink leads outside the root"))
                return
            st = os.stat(real)
        else:
            real = entry.path
            st = entry.stat(follow_symlinks=False)
    except OSError as exc:
        reason = "symlink loop" if exc.errno == errno.ELOOP else f"cannot stat ({_why(exc)})"
        result.skipped.append((rel, reason))
        return
    if not stat.S_ISREG(st.st_mode):
        result.skipped.append((rel, "not a regular file"))
        return
    if st.st_size > rules.max_bytes:
        result.skipped.append((rel, f"larger than {rules.max_bytes} bytes"))
        return
    result.files[rel] = Entry(rel, real, st.st_size, st.st_mtime_ns, st.st_mode)


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def read_source(real: str, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """The bytes of a regular file of at most ``max_bytes``; raises :class:`SkipFile`."""
    try:
        fd = os.open(real, _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SkipFile("symlink changed during the sync") from exc
        if exc.errno == errno.ENOENT:
            raise SkipFile("vanished during the sync") from exc
        raise SkipFile(f"not readable ({_why(exc)})", sticky=exc.errno == errno.EACCES) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SkipFile("not a regular file")
        if st.st_size > max_bytes:
            raise SkipFile(f"larger than {max_bytes} bytes")
        chunks = []
        remaining = max_bytes + 1
        while remaining > 0:
            block = os.read(fd, min(remaining, 1 << 20))
            if not block:
                break
            chunks.append(block)
            remaining -= len(block)
        data = b"".join(chunks)
    except OSError as exc:
        raise SkipFile(f"not readable ({_why(exc)})") from exc
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise SkipFile(f"larger than {max_bytes} bytes")
    if b"\x00" in data[:BINARY_PROBE]:
        raise SkipFile("binary (NUL byte in the first 8 KB)", sticky=True)
    return data, st


def decode(data: bytes) -> str:
    """UTF-8 (a BOM is dropped), invalid bytes replaced by U+FFFD, newlines normalised."""
    return normalize_newlines(data.decode("utf-8-sig", errors="replace"))


def normalise_relative(path: object, *, what: str = "path") -> str:
    """A safe relative posix path from user input, or a clear error naming the problem."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise InvalidInputError(f"{what} must be a string, got {type(path).__name__}")
    if not path.strip() or "\x00" in path:
        raise InvalidInputError(f"{what} must be a non-empty relative path, got {path!r}")
    if os.path.isabs(path) or path.startswith(("/", "\\", "~")) or _DRIVE.match(path):
        raise PathOutsideRootError(
            f"{what} {path!r} is absolute or home-relative; give a path relative to the root"
        )
    pieces = re.split(r"[/\\]", path)
    if ".." in pieces:
        raise PathOutsideRootError(f"{what} {path!r} contains '..'; paths must stay inside the root")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts:
        raise InvalidInputError(f"{what} {path!r} names the root itself, not a file")
    return "/".join(parts)


def resolve_request(root: Path, path: object, rules: SourceRules) -> tuple[str, str]:
    """``(rel, real)`` of a file ``get()`` may serve, or :class:`PathOutsideRootError` /
    :class:`InvalidInputError` with the reason."""
    rel = normalise_relative(path)
    root_str = str(root)
    parts = rel.split("/")
    current = root_str
    for part in parts[:-1]:
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except OSError as exc:
            raise InvalidInputError(f"path {rel!r} does not exist") from exc
        if stat.S_ISLNK(st.st_mode):
            if not inside(root_str, os.path.realpath(current)):
                raise PathOutsideRootError(f"path {rel!r} goes through a symlink that leaves the root")
            raise InvalidInputError(
                f"path {rel!r} goes through a symlinked directory, which is never indexed"
            )
        if not stat.S_ISDIR(st.st_mode):
            raise InvalidInputError(f"path {rel!r} does not exist")
    full = os.path.join(root_str, *parts)
    try:
        st = os.lstat(full)
    except OSError as exc:
        raise InvalidInputError(f"path {rel!r} does not exist") from exc
    real = full
    if stat.S_ISLNK(st.st_mode):
        real = os.path.realpath(full)
        if not inside(root_str, real):
            raise PathOutsideRootError(f"path {rel!r} is a symlink that leaves the root")
    if not rules.allows(rel):
        raise InvalidInputError(f"path {rel!r} is not served: only {rules.describe()} are")
    try:
        st = os.stat(real)
    except OSError as exc:
        raise InvalidInputError(f"path {rel!r} cannot be read ({_why(exc)})") from exc
    if not stat.S_ISREG(st.st_mode):
        raise InvalidInputError(f"path {rel!r} is not a regular file")
    return rel, real


def normalise_extra(root: Path, paths: Iterable[str]) -> tuple[str, ...]:
    """Configured extra memory paths as relative posix paths; each must stay inside the root."""
    out = []
    for raw in paths:
        candidate = Path(raw).expanduser()
        if candidate.is_absolute():
            resolved = Path(os.path.realpath(candidate))
            if not inside(str(root), str(resolved)):
                raise PathOutsideRootError(f"files.extra_paths entry {raw!r} is outside the workspace {root}")
            rel = resolved.relative_to(root).as_posix()
            if rel in ("", "."):
                raise InvalidInputError(f"files.extra_paths entry {raw!r} is the workspace itself")
        else:
            rel = normalise_relative(raw, what="files.extra_paths entry")
        if rel not in out:
            out.append(rel)
    return tuple(out)
