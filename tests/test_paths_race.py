"""Reads stay inside the root while the tree changes under them.

The race: a thread swaps a parent directory with a symlink to an outside folder, atomically
(``renameat2(RENAME_EXCHANGE)``), while reads and syncs run. A reader that checks each parent
with ``lstat`` and then opens the path string can be sent outside between the two; reads that
open every component relative to its parent's descriptor with ``O_NOFOLLOW`` cannot. Both loops
are bounded by counts; the test also counts both outcomes (served from inside, refused because
the symlink was in place), so it cannot pass without exercising both states.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import errno
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memstrata import Codebase, Config, MemoryFiles
from memstrata._workspaces import Workspaces
from memstrata.config import FilesConfig
from memstrata.errors import InvalidInputError, MemstrataError, PathOutsideRootError
from memstrata.layers import _safe_fs as safe_fs
from memstrata.layers._paths import SkipFile, read_source, resolve_request, scan
from tests.fakes import FakeEmbedder

MARKER = "OUTSIDE-MARKER-5f1c9a7e"  # only ever written outside the root
INSIDE = "inside-note-text"
AT_FDCWD = -100
RENAME_EXCHANGE = 2
SWAPS = 400_000  # upper bound of the swapping thread's exchanges
READS = 8_000  # layer get() calls in the race (a path-string reader escaped ~1 in 1,200)
REGISTRY_READS = 1_500  # get_file / memory_get calls each (slower: they go through the registry)
SYNCS = 500  # syncs in the race (a path-string walk let ~1 in 40 index outside text)
RESULTS: list[tuple[str, Any]] = []  # (test, tally): what the races did, for a report


def _renameat2() -> Callable[[str, str], None]:
    """``exchange(a, b)`` with libc ``renameat2(RENAME_EXCHANGE)``, or skip the test."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        pytest.skip("libc has no renameat2 (needs glibc >= 2.28): the swap race cannot be staged")
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int

    def exchange(a: str, b: str) -> None:
        if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"renameat2(RENAME_EXCHANGE) failed: {os.strerror(code)}")

    return exchange


@dataclasses.dataclass
class Stage:
    root: Path  # the workspace; memory/sub is the directory that gets swapped
    outside: Path
    sub: str
    link: str
    exchange: Callable[[str, str], None]
    swapped: bool = False

    def swap(self) -> None:
        self.exchange(self.sub, self.link)
        self.swapped = not self.swapped

    def restore(self) -> None:
        if self.swapped:
            self.swap()


@pytest.fixture
def stage(tmp_path: Path) -> Iterator[Stage]:
    root = tmp_path / "ws"
    (root / "memory" / "sub").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Memory\n\nsomething to index\n", encoding="utf-8")
    (root / "memory" / "sub" / "note.md").write_text(f"# Note\n\n{INSIDE}\n", encoding="utf-8")
    (root / "sub.py").write_text(f"NOTE = '{INSIDE}'\n", encoding="utf-8")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "note.md").write_text(f"# Note\n\n{MARKER}\n", encoding="utf-8")
    (outside / "deep.py").write_text(f"SECRET = '{MARKER}'\n", encoding="utf-8")
    link = root / "memory" / "swap"
    link.symlink_to(outside, target_is_directory=True)
    exchange = _renameat2()
    try:
        exchange(str(root / "memory" / "sub"), str(link))
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            pytest.skip(f"this file system cannot exchange names atomically: {exc}")
        raise
    exchange(str(root / "memory" / "sub"), str(link))  # back to the start
    s = Stage(root, outside, str(root / "memory" / "sub"), str(link), exchange)
    yield s
    s.restore()


def _config(data_dir: Path) -> Config:
    files = dataclasses.replace(FilesConfig(), code_extensions=(".py", ".md"))
    return Config(data_dir=data_dir, files=files)


class Swapper:
    """A thread exchanging the directory and the symlink until told to stop (bounded)."""

    def __init__(self, stage: Stage) -> None:
        self.stage = stage
        self.stop = threading.Event()
        self.started = threading.Event()
        self.swaps = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.started.set()
        try:
            while self.swaps < SWAPS and not self.stop.is_set():
                self.stage.swap()
                self.swaps += 1
        except BaseException as exc:  # reported by the test
            self.error = exc

    def __enter__(self) -> Swapper:
        self.thread.start()
        self.started.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.stage.restore()

    @property
    def running(self) -> bool:
        return self.thread.is_alive()


@dataclasses.dataclass
class Tally:
    attempts: int = 0
    inside: int = 0
    refused: int = 0
    outside: int = 0
    errors: set[str] = dataclasses.field(default_factory=set)


def _race(read: Callable[[], str], swapper: Swapper, reads: int = READS) -> Tally:
    """Call ``read`` (which returns text or raises a memstrata error) while the swapper runs."""
    tally = Tally()
    while tally.attempts < reads and swapper.running:
        tally.attempts += 1
        try:
            text = read()
        except MemstrataError as exc:
            tally.refused += 1
            tally.errors.add(type(exc).__name__)
            assert MARKER not in str(exc)
            continue
        if MARKER in text:
            tally.outside += 1
        elif INSIDE in text:
            tally.inside += 1
        else:
            raise AssertionError(f"unexpected text: {text!r}")
    return tally


def _check(tally: Tally, swapper: Swapper, what: str) -> None:
    RESULTS.append((what, tally, swapper.swaps))
    assert swapper.error is None, swapper.error
    assert tally.outside == 0, tally
    # both states were hit: reads went through the real directory and met the symlink
    assert tally.inside > 0 and tally.refused > 0, (tally, swapper.swaps)


def test_get_never_reads_outside_while_a_parent_is_swapped(stage: Stage, data_dir: Path) -> None:
    with MemoryFiles.open(stage.root, embedder=FakeEmbedder(), config=_config(data_dir)) as mf:
        with Swapper(stage) as swapper:
            tally = _race(lambda: mf.get("memory/sub/note.md"), swapper)
        _check(tally, swapper, "get")
        assert tally.errors <= {"InvalidInputError", "PathOutsideRootError"}


def test_get_file_and_memory_get_never_read_outside(stage: Stage, data_dir: Path) -> None:
    from memstrata.bridges import tools

    def memory_get() -> str:
        out = tools.dispatch("memory_get", {"path": "memory/sub/note.md"}, None, workspaces=registry)
        if "error" in out:
            raise InvalidInputError(out["error"])
        return str(out["text"])

    with Workspaces(data_dir, config=_config(data_dir), embedder=FakeEmbedder()) as registry:
        registry.index(stage.root, kind="memory")
        readers = {"get_file": lambda: registry.get("memory/sub/note.md").text, "memory_get": memory_get}
        for what, read in readers.items():
            with Swapper(stage) as swapper:
                tally = _race(read, swapper, REGISTRY_READS)
            _check(tally, swapper, what)


def test_syncs_never_index_outside_text(stage: Stage, data_dir: Path) -> None:
    cfg = _config(data_dir)
    with (
        MemoryFiles.open(stage.root, embedder=FakeEmbedder(), config=cfg) as mf,
        Codebase.open(stage.root, embedder=FakeEmbedder(), config=cfg) as cb,
    ):
        # where the real directory was when a sync walked: at memory/sub or at memory/swap
        seen = {"memory/sub/note.md": 0, "memory/swap/note.md": 0}
        syncs = 0
        with Swapper(stage) as swapper:
            while syncs < SYNCS and swapper.running:
                index = (mf, cb)[syncs % 2]
                index.sync()
                syncs += 1
                for either in (mf, cb):
                    assert _marked_chunks(either) == 0, f"outside text indexed after sync {syncs}"
                indexed = {r[0] for r in index.store.db.query("SELECT path FROM files WHERE skipped IS NULL")}
                for path in seen:
                    seen[path] += path in indexed
        RESULTS.append(("sync", {"syncs": syncs, **seen}, swapper.swaps))
        assert swapper.error is None
        assert min(seen.values()) > 0, (seen, syncs, swapper.swaps)  # both states were walked
        for index in (mf, cb):
            index.sync()
            assert _marked_chunks(index) == 0
            assert index.search(MARKER, mode="keyword") == []
        assert mf.get("memory/sub/note.md").endswith(INSIDE)


def _marked_chunks(index: MemoryFiles | Codebase) -> int:
    rows = index.store.db.query("SELECT count(*) FROM chunks WHERE instr(text, ?) > 0", (MARKER,))
    return int(rows[0][0])


def test_a_swap_between_check_and_read_fails_the_read(stage: Stage) -> None:
    """The check-then-use window, made deterministic: check, swap, then read."""
    rules = MemoryFiles._rules(stage.root, Config())
    _, target = resolve_request(stage.root, "memory/sub/note.md", rules)
    stage.swap()
    with pytest.raises(SkipFile, match="symlink in path at 'memory/sub'"):
        read_source(stage.root, target, 1000)
    with pytest.raises(PathOutsideRootError, match="leaves the root"):
        resolve_request(stage.root, "memory/sub/note.md", rules)
    stage.swap()
    assert read_source(stage.root, target, 1000)[0].decode().endswith(f"{INSIDE}\n")


def test_a_directory_swapped_after_listing_is_not_entered(stage: Stage) -> None:
    """The walk lists a real directory, then finds a symlink when it opens it: not followed."""
    rules = MemoryFiles._rules(stage.root, Config())
    calls: list[str] = []

    class SwappingRules:
        kind = rules.kind
        max_bytes = rules.max_bytes

        def descend(self, rel: str) -> bool:
            if rel == "memory/sub" and not calls:
                calls.append(rel)
                stage.swap()  # listed as a directory; a symlink by the time it is opened
            return rules.descend(rel)

        def file_in_walk(self, rel: str, name: str) -> bool:
            return rules.file_in_walk(rel, name)

    found = scan(stage.root, SwappingRules())  # type: ignore[arg-type]
    assert calls == ["memory/sub"]
    assert "memory/sub/note.md" not in found.files
    assert ("memory/sub", "symlinked directory, not followed") in found.skipped
    assert all(not rel.startswith("memory/sub/") for rel in found.files)


# -- the primitives --------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "dir" / "deeper").mkdir(parents=True)
    (root / "dir" / "file.txt").write_text("inside\n", encoding="utf-8")
    (root / "dir" / "deeper" / "leaf.txt").write_text("leaf\n", encoding="utf-8")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "file.txt").write_text(f"{MARKER}\n", encoding="utf-8")
    (root / "to-secret").symlink_to(secret, target_is_directory=True)
    (root / "to-dir").symlink_to("dir", target_is_directory=True)
    (root / "dir" / "secret-file").symlink_to(secret / "file.txt")
    (root / "dir" / "alias.txt").symlink_to("../dir/deeper/leaf.txt")
    (root / "dir" / "absolute.txt").symlink_to(root / "dir" / "file.txt")
    (root / "dir" / "climb.txt").symlink_to("../../secret/file.txt")
    (root / "dir" / "loop").symlink_to("loop")
    os.mkfifo(root / "dir" / "pipe")
    return root


@pytest.fixture
def root_fd(tree: Path) -> Iterator[int]:
    fd = safe_fs.open_root(tree)
    yield fd
    os.close(fd)


@pytest.mark.parametrize(
    ("rel", "error", "message"),
    [
        ("../x", PathOutsideRootError, "'..'"),
        ("dir/../../x", PathOutsideRootError, "'..'"),
        ("/etc/passwd", PathOutsideRootError, "absolute"),
        ("dir/a\x00b", InvalidInputError, "NUL"),
        ("", InvalidInputError, "non-empty"),
        ("dir//file.txt", InvalidInputError, "empty or '.' component"),
        ("dir/./file.txt", InvalidInputError, "empty or '.' component"),
    ],
)
def test_hostile_parts_are_refused_before_any_system_call(
    rel: str, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        safe_fs.split_parts(rel)


def test_open_file_reads_a_regular_file_component_by_component(root_fd: int) -> None:
    fd, st = safe_fs.open_file(root_fd, ["dir", "deeper", "leaf.txt"])
    try:
        assert st.st_size == 5 and safe_fs.read_limited(fd, 100) == b"leaf\n"
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("parts", "problem", "where"),
    [
        (["to-secret", "file.txt"], "symlink", "to-secret"),  # symlinked parent leaving the root
        (["to-dir", "file.txt"], "symlink", "to-dir"),  # symlinked parent inside: not followed either
        (["dir", "secret-file"], "symlink", "dir/secret-file"),  # symlinked file
        (["dir", "alias.txt"], "symlink", "dir/alias.txt"),
        (["dir", "missing.txt"], "missing", "dir/missing.txt"),
        (["dir", "file.txt", "x"], "not_dir", "dir/file.txt"),
    ],
)
def test_open_file_never_follows_a_symlink(root_fd: int, parts: list[str], problem: str, where: str) -> None:
    with pytest.raises(safe_fs.Refused) as caught:
        fd, _ = safe_fs.open_file(root_fd, parts)
        os.close(fd)
    assert (caught.value.problem, caught.value.where) == (problem, where)


def test_a_fifo_opens_without_blocking_and_is_not_read(tree: Path, root_fd: int) -> None:
    fd, st = safe_fs.open_file(root_fd, ["dir", "pipe"])  # O_NONBLOCK: returns at once
    os.close(fd)
    assert stat.S_ISFIFO(st.st_mode)
    with pytest.raises(SkipFile, match="not a regular file"):
        read_source(tree, "dir/pipe", 1000)


@pytest.mark.parametrize(
    ("rel", "reason"),
    [
        ("to-secret/file.txt", "symlink in path at 'to-secret'"),
        ("dir/secret-file", "symlink in path at 'dir/secret-file'"),
        ("../secret/file.txt", "not readable"),
        ("/etc/passwd", "not readable"),
        ("dir/a\x00b", "not readable"),
    ],
)
def test_read_source_refuses_what_would_leave_the_root(tree: Path, rel: str, reason: str) -> None:
    with pytest.raises(SkipFile, match=reason) as caught:
        read_source(tree, rel, 1000)
    assert MARKER not in caught.value.reason


@pytest.mark.parametrize(
    ("rel", "expected"),
    [
        ("dir/alias.txt", ("dir", "deeper", "leaf.txt")),
        ("dir/absolute.txt", ("dir", "file.txt")),
        ("to-dir/deeper/leaf.txt", ("dir", "deeper", "leaf.txt")),
        ("to-dir", ("dir",)),
    ],
)
def test_links_are_followed_inside_the_root_only(
    tree: Path, root_fd: int, rel: str, expected: tuple[str, ...]
) -> None:
    assert safe_fs.resolve_links(root_fd, str(tree), rel.split("/")).parts == expected


@pytest.mark.parametrize(
    ("rel", "problem"),
    [
        ("dir/secret-file", "outside"),
        ("dir/climb.txt", "outside"),
        ("to-secret/file.txt", "outside"),
        ("dir/loop", "loop"),
    ],
)
def test_links_leaving_the_root_or_looping_are_refused(
    tree: Path, root_fd: int, rel: str, problem: str
) -> None:
    with pytest.raises(safe_fs.Refused) as caught:
        safe_fs.resolve_links(root_fd, str(tree), rel.split("/"))
    assert caught.value.problem == problem


def test_walk_lists_descriptors_and_never_enters_symlinks(root_fd: int) -> None:
    seen: dict[str, list[str]] = {}
    problems: list[tuple[str, Any]] = []
    for rel_dir, dir_fd, entries in safe_fs.walk(
        root_fd, lambda rel: True, lambda r, e: problems.append((r, e))
    ):
        seen[rel_dir] = [e.name for e in entries]
        for entry in entries:  # fstatat relative to the listed descriptor
            assert (
                entry.stat(follow_symlinks=False).st_ino
                == os.stat(entry.name, dir_fd=dir_fd, follow_symlinks=False).st_ino
            )
    assert list(seen) == ["", "dir", "dir/deeper"]
    assert seen[""] == ["to-dir", "to-secret"]  # listed as entries, never walked into
    assert problems == []


def test_exists_looks_through_descriptors(tree: Path) -> None:
    assert safe_fs.exists(tree, "dir/file.txt")
    assert safe_fs.exists(tree, "to-secret")  # the link itself
    assert not safe_fs.exists(tree, "to-secret/file.txt")
    assert not safe_fs.exists(tree, "../secret/file.txt")
