"""Opening, listing and reading under a root so that nothing outside it is ever read.

A path string given to the kernel is resolved when it is opened, so a check made before (an
``lstat`` of each parent) proves nothing once a parent directory can be swapped for a symlink in
between. Here every path under a root is resolved one component at a time from descriptors: the
root is opened as a directory, each directory with ``O_DIRECTORY | O_NOFOLLOW`` relative to its
parent's descriptor, the file with ``O_NOFOLLOW | O_NONBLOCK`` relative to its directory's, and
``fstat`` of the very descriptor that is read decides whether it is a regular file. A symlink in
any position makes the open fail (``ELOOP`` / ``ENOTDIR``) instead of being followed, so there is
no gap between a check and its use. Directory walks list directory descriptors, never paths.

Symlinks are only ever followed by :func:`resolve_links`, which reads a link's text and walks it
the same way, one component at a time, refusing to climb above the root; what it returns is
then opened with ``O_NOFOLLOW`` everywhere, so a link changed in between fails to open.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from memstrata.core.errors import InvalidInputError, PathOutsideRootError

__all__ = [
    "DIR_FLAGS",
    "FILE_FLAGS",
    "MAX_LINK_HOPS",
    "Refused",
    "Resolved",
    "exists",
    "open_dir",
    "open_file",
    "open_root",
    "read_limited",
    "resolve_links",
    "split_parts",
    "walk",
]

DIR_FLAGS: int = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS: int = (
    os.O_RDONLY
    | os.O_NOFOLLOW
    | os.O_NONBLOCK  # a FIFO opens at once instead of waiting for a writer
    | os.O_NOCTTY
    | os.O_CLOEXEC
)
MAX_LINK_HOPS = 40  # as the kernel's limit: more means a loop
_LINK_ERRNOS = frozenset({errno.ELOOP, errno.ENOTDIR, errno.EMLINK})  # what O_NOFOLLOW answers

Problem = Literal["missing", "symlink", "not_dir", "outside", "loop", "unreadable"]


class Refused(Exception):
    """Why a walk stopped, and where (the relative path of the component it stopped at).

    Internal: callers turn it into :class:`SkipFile` or a :mod:`memstrata.errors` error whose
    message suits them; it is never raised out of the layers.
    """

    def __init__(self, problem: Problem, where: str, exc: OSError | None = None) -> None:
        super().__init__(f"{problem} at {where!r}")
        self.problem: Problem = problem
        self.where = where
        self.strerror = (exc.strerror or type(exc).__name__) if exc is not None else ""
        self.errno = exc.errno if exc is not None else None


@dataclass(frozen=True, slots=True)
class Resolved:
    """Where a path leads once its symlinks are followed inside the root, and what is there."""

    parts: tuple[str, ...]  # () is the root itself
    st: os.stat_result  # lstat of the final component (never a symlink)
    links: int  # symlinks followed on the way


def split_parts(rel: str, *, what: str = "path") -> list[str]:
    """The components of a relative posix path, refused before any system call when any is
    ``..``, empty or ``.``, or when the path is absolute or holds a NUL character."""
    if not isinstance(rel, str):
        raise InvalidInputError(f"{what} must be a string, got {type(rel).__name__}")
    if "\x00" in rel:
        raise InvalidInputError(f"{what} {rel!r} contains a NUL character")
    if not rel:
        raise InvalidInputError(f"{what} must be a non-empty relative path")
    if rel.startswith("/"):
        raise PathOutsideRootError(f"{what} {rel!r} is absolute; give a path relative to the root")
    parts = rel.split("/")
    if ".." in parts:
        raise PathOutsideRootError(f"{what} {rel!r} contains '..'; paths must stay inside the root")
    if any(p in ("", ".") for p in parts):
        raise InvalidInputError(f"{what} {rel!r} has an empty or '.' component")
    return parts


def open_root(root: str | os.PathLike[str]) -> int:
    """A descriptor of the root directory (raises :class:`OSError`). The root itself is trusted
    as given (it was resolved when the index was opened); everything under it is not."""
    return os.open(root, DIR_FLAGS)


def _refusal(dir_fd: int, name: str, where: str, exc: OSError) -> Refused:
    """What a failed ``O_NOFOLLOW`` open of ``name`` means (an ``lstat``, which reads nothing)."""
    if exc.errno in _LINK_ERRNOS:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as again:
            return Refused("missing", where, again)
        if stat.S_ISLNK(st.st_mode):
            return Refused("symlink", where, exc)
        if exc.errno == errno.ENOTDIR:
            return Refused("not_dir", where, exc)
        return Refused("unreadable", where, exc)
    if exc.errno in (errno.ENOENT, errno.ENAMETOOLONG):
        return Refused("missing", where, exc)
    return Refused("unreadable", where, exc)


def open_dir(base_fd: int, parts: Sequence[str], *, prefix: str = "") -> int:
    """A new descriptor of directory ``parts`` under ``base_fd`` (``()`` duplicates it), each
    component opened with ``O_DIRECTORY | O_NOFOLLOW``; raises :class:`Refused`."""
    current = os.dup(base_fd)
    try:
        for n, name in enumerate(parts):
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=current)
            except OSError as exc:
                raise _refusal(current, name, _join(prefix, parts[: n + 1]), exc) from exc
            os.close(current)
            current = child
    except BaseException:
        os.close(current)
        raise
    return current


def open_file(root_fd: int, parts: Sequence[str]) -> tuple[int, os.stat_result]:
    """An open descriptor of file ``parts`` under ``root_fd`` and its ``fstat`` (any type: the
    caller checks ``S_ISREG``). No component is followed if it is a symlink."""
    dir_fd = open_dir(root_fd, parts[:-1])
    try:
        try:
            fd = os.open(parts[-1], FILE_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            raise _refusal(dir_fd, parts[-1], _join("", parts), exc) from exc
    finally:
        os.close(dir_fd)
    try:
        return fd, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


def read_limited(fd: int, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``fd`` (one more than allowed shows the file grew)."""
    chunks = []
    remaining = limit + 1
    while remaining > 0:
        block = os.read(fd, min(remaining, 1 << 20))
        if not block:
            break
        chunks.append(block)
        remaining -= len(block)
    return b"".join(chunks)


def exists(root: str | os.PathLike[str], rel: str) -> bool:
    """Whether ``rel`` names something under ``root`` (an ``lstat`` through descriptors)."""
    try:
        parts = split_parts(rel)
        root_fd = open_root(root)
    except (InvalidInputError, OSError):
        return False
    try:
        dir_fd = open_dir(root_fd, parts[:-1])
        try:
            os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
        finally:
            os.close(dir_fd)
    except (Refused, OSError):
        return False
    finally:
        os.close(root_fd)
    return True


def resolve_links(root_fd: int, root: str, parts: Sequence[str]) -> Resolved:
    """Follow every symlink on ``parts`` as the kernel would, but never above the root.

    Link texts are read with ``readlink`` relative to the directory holding the link; ``..`` pops
    a directory this walk entered (above the root is ``outside``); an absolute target counts only
    when it names a place under ``root`` (the root's resolved path). Nothing is read but link
    texts and ``lstat`` results, so a link that changes meanwhile cannot lead a read outside.
    """
    todo = list(reversed(parts))
    stack: list[tuple[str, int]] = []  # directories entered: (name, descriptor)
    hops = 0
    last: str | None = None
    last_st: os.stat_result | None = None
    try:
        while todo:
            name = todo.pop()
            where = _join("", [n for n, _ in stack] + [name])
            if name in ("", "."):
                continue
            if name == "..":
                if not stack:
                    raise Refused("outside", where)
                os.close(stack.pop()[1])
                last = last_st = None
                continue
            here = stack[-1][1] if stack else root_fd
            try:
                st = os.stat(name, dir_fd=here, follow_symlinks=False)
            except OSError as exc:
                raise _refusal(here, name, where, exc) from exc
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > MAX_LINK_HOPS:
                    raise Refused("loop", where)
                try:
                    target = os.readlink(name, dir_fd=here)
                except OSError as exc:
                    raise _refusal(here, name, where, exc) from exc
                if target.startswith("/"):
                    inner = _under(root, target)
                    if inner is None:
                        raise Refused("outside", where)
                    while stack:
                        os.close(stack.pop()[1])
                    target = inner
                todo.extend(reversed(target.split("/")))
                last = last_st = None
                continue
            if not any(p not in ("", ".") for p in todo):
                last, last_st = name, st  # the final component: not opened, the caller does
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise Refused("not_dir", where)
            try:
                fd = os.open(name, DIR_FLAGS, dir_fd=here)
            except OSError as exc:
                raise _refusal(here, name, where, exc) from exc
            stack.append((name, fd))
        names = tuple(n for n, _ in stack)
        if last is None or last_st is None:  # ends at a directory entered (or the root)
            st = os.fstat(stack[-1][1] if stack else root_fd)
            return Resolved(names, st, hops)
        return Resolved((*names, last), last_st, hops)
    finally:
        for _, fd in stack:
            os.close(fd)


def _under(root: str, target: str) -> str | None:
    """``target`` relative to ``root`` when it names a place under it, else ``None``."""
    base = root.rstrip("/")
    if target == base:
        return "."
    if target.startswith(base + "/"):
        return target[len(base) + 1 :] or "."
    return None


def walk(
    root_fd: int,
    descend: Callable[[str], bool],
    on_error: Callable[[str, Refused], None],
) -> Iterator[tuple[str, int, list[os.DirEntry[str]]]]:
    """Depth first, by name: ``(rel_dir, dir_fd, entries)`` for the root and every directory
    ``descend(rel)`` allows, ``entries`` sorted, directories left out (they are walked).

    Each directory is opened relative to its parent's descriptor with ``O_NOFOLLOW``, so a
    symlink (or one swapped in after the listing) is never entered; it goes to ``on_error``.
    ``dir_fd`` stays open while the consumer handles the entries: ``entry.stat()`` works
    relative to it. A root that cannot be listed raises :class:`OSError`. At most one
    descriptor per level of depth is open.
    """
    entries, subdirs = _list(root_fd, "", descend)
    yield "", root_fd, entries
    frames: list[tuple[int, str, Iterator[str]]] = [(root_fd, "", iter(subdirs))]
    try:
        while frames:
            fd, rel_dir, pending = frames[-1]
            name = next(pending, None)
            if name is None:
                frames.pop()
                if fd != root_fd:
                    os.close(fd)
                continue
            rel = f"{rel_dir}/{name}" if rel_dir else name
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                on_error(rel, _refusal(fd, name, rel, exc))
                continue
            try:
                entries, subdirs = _list(child, rel, descend)
            except OSError as exc:
                os.close(child)
                on_error(rel, Refused("unreadable", rel, exc))
                continue
            frames.append((child, rel, iter(subdirs)))
            yield rel, child, entries
    finally:
        for fd, _, _ in frames:
            if fd != root_fd:
                os.close(fd)


def _list(fd: int, rel_dir: str, descend: Callable[[str], bool]) -> tuple[list[os.DirEntry[str]], list[str]]:
    with os.scandir(fd) as it:
        listed = sorted(it, key=lambda e: e.name)
    entries, subdirs = [], []
    for entry in listed:
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            continue
        if is_dir:
            if descend(f"{rel_dir}/{entry.name}" if rel_dir else entry.name):
                subdirs.append(entry.name)
        else:
            entries.append(entry)
    return entries, subdirs


def _join(prefix: str, parts: Sequence[str]) -> str:
    tail = "/".join(parts)
    return f"{prefix}/{tail}" if prefix and tail else prefix or tail
