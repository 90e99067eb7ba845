"""Several boards saving to one snapshot file: a snapshot writes only its own board's changes.

Two processes (or two systems) on one data dir with ``actors.blackboard_snapshot`` each load the
session's file when the board is first used and save on stop. Whichever stops last must not drop
what the other published or deleted; a key both changed keeps the higher version.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from memstrata import Config, MemorySystem
from memstrata.config import ActorsConfig
from memstrata.layers import BlackboardState
from memstrata.storage import open_database
from tests._support import CLI_TIMEOUT, cli_env
from tests.fakes import FakeEmbedder

ORDERS = pytest.mark.parametrize("first", [0, 1], ids=["first-stops-first", "second-stops-first"])


@pytest.fixture
def board_file(tmp_path: Path) -> Path:
    """A session's snapshot file: shared, gone-by-0, gone-by-1 and kept at v1, was-deleted
    deleted at v2."""
    path = tmp_path / "board.sqlite"
    seed = BlackboardState()
    for key in ("shared", "gone-by-0", "gone-by-1", "kept"):
        seed.publish(key, f"seed {key}")
    seed.publish("was-deleted", 1)
    seed.delete("was-deleted")  # v2
    seed.snapshot(path)
    return path


def _loaded(path: Path) -> BlackboardState:
    board = BlackboardState()
    board.restore(path)
    return board


def _snapshot_both(boards: list[BlackboardState], first: int, path: Path) -> None:
    """Both boards save to ``path``, ``boards[first]`` first."""
    boards[first].snapshot(path)
    boards[1 - first].snapshot(path)


def _saved(path: Path) -> dict[str, tuple[object, int]]:
    board = _loaded(path)
    return {key: (record.value, record.version) for key in board.list() if (record := board.get(key))}


def _deleted_versions(path: Path) -> dict[str, int]:
    db = open_database(path, load_vec=False)
    try:
        return {str(k): int(v) for k, v in db.query("SELECT key, version FROM deleted")}
    finally:
        db.close()


@ORDERS
def test_two_boards_on_one_file_keep_each_others_publishes_and_deletes(board_file: Path, first: int) -> None:
    boards = [_loaded(board_file), _loaded(board_file)]  # both running, each loaded the file at its start
    for i, board in enumerate(boards):
        board.publish(f"from-{i}", i)
        assert board.delete(f"gone-by-{i}")[0] is not None  # v2
    boards[1].publish("was-deleted", "back")  # v3: continues the deleted key's count
    _snapshot_both(boards, first, board_file)
    assert _saved(board_file) == {
        "shared": ("seed shared", 1),
        "kept": ("seed kept", 1),
        "from-0": (0, 1),
        "from-1": (1, 1),
        "was-deleted": ("back", 3),
    }
    assert _deleted_versions(board_file) == {"gone-by-0": 2, "gone-by-1": 2}
    after = _loaded(board_file)  # a later start goes on with each deleted key's count
    assert after.publish("gone-by-0", "again")[0].version == 3
    assert after.publish("gone-by-1", "again")[0].version == 3


@ORDERS
def test_a_key_both_changed_keeps_the_higher_version(board_file: Path, first: int) -> None:
    boards = [_loaded(board_file), _loaded(board_file)]
    boards[0].publish("shared", "zero")  # v2
    boards[1].publish("shared", "one, once")  # v2
    boards[1].publish("shared", "one, twice")  # v3: more changes than board 0 made
    boards[0].publish("kept", "zero")  # v2
    boards[1].delete("kept")  # v2, and deleted
    boards[1].publish("kept", "one")  # v3
    boards[0].delete("gone-by-0")  # v2, deleted
    boards[1].publish("gone-by-0", "one")  # v2
    boards[1].delete("gone-by-0")  # v3, deleted
    boards[0].publish("gone-by-1", "zero, once")  # v2
    boards[0].publish("gone-by-1", "zero, twice")  # v3
    boards[1].delete("gone-by-1")  # v2: lower than board 0's publish
    _snapshot_both(boards, first, board_file)
    saved = _saved(board_file)
    assert saved["shared"] == ("one, twice", 3)
    assert saved["kept"] == ("one", 3)
    assert saved["gone-by-1"] == ("zero, twice", 3)
    assert "gone-by-0" not in saved and _deleted_versions(board_file)["gone-by-0"] == 3
    assert "gone-by-1" not in _deleted_versions(board_file) and "kept" not in _deleted_versions(board_file)


@ORDERS
def test_of_two_changes_with_the_same_version_the_one_saved_last_wins(board_file: Path, first: int) -> None:
    boards = [_loaded(board_file), _loaded(board_file)]
    boards[0].publish("shared", "zero")  # v2
    boards[1].publish("shared", "one")  # v2
    boards[0].delete("kept")  # v2, deleted
    boards[1].publish("kept", "one")  # v2
    _snapshot_both(boards, first, board_file)
    last = 1 - first
    saved = _saved(board_file)
    assert saved["shared"] == (["zero", "one"][last], 2)
    if last == 0:
        assert "kept" not in saved and _deleted_versions(board_file)["kept"] == 2
    else:
        assert saved["kept"] == ("one", 2) and "kept" not in _deleted_versions(board_file)


def test_a_snapshot_writes_only_what_changed_since_the_last_one(board_file: Path) -> None:
    mine, other = _loaded(board_file), _loaded(board_file)
    mine.publish("shared", "mine")  # v2
    assert mine.snapshot(board_file) == 4
    other.publish("shared", "other")  # v2 as well: it loaded the file before
    other.delete("kept")
    assert other.snapshot(board_file) == 3
    assert mine.snapshot(board_file) == 3  # nothing changed here since: the other's changes stay
    assert _saved(board_file)["shared"] == ("other", 2)
    assert "kept" not in _saved(board_file)


# -- whole systems on one data dir ----------------------------------------------------------------


def _config(data_dir: Path) -> Config:
    return Config(data_dir=data_dir, actors=dataclasses.replace(ActorsConfig(), blackboard_snapshot=True))


def _seed_system(data_dir: Path) -> None:
    with MemorySystem.start(_config(data_dir), embedder=FakeEmbedder()) as system:
        board = system.blackboard("s1")
        for key in ("gone-by-0", "gone-by-1", "kept"):
            board.publish(key, "seed", wait=True)


@ORDERS
def test_two_systems_on_one_data_dir_lose_nothing_whichever_stops_first(data_dir: Path, first: int) -> None:
    _seed_system(data_dir)
    with ExitStack() as stack:
        systems = [
            stack.enter_context(MemorySystem.start(_config(data_dir), embedder=FakeEmbedder()))
            for _ in range(2)
        ]
        for i, system in enumerate(systems):
            board = system.blackboard("s1")
            assert board.list() == ["gone-by-0", "gone-by-1", "kept"]  # loaded at the board's first use
            assert board.publish(f"from-{i}", i, wait=True) == 1
            assert board.delete(f"gone-by-{i}") is True
        assert systems[0].blackboard("s1").list() == ["from-0", "gone-by-1", "kept"]  # not the other's
        systems[first].stop()
        systems[1 - first].stop()
    with MemorySystem.start(_config(data_dir), embedder=FakeEmbedder()) as system:
        board = system.blackboard("s1")
        assert board.list() == ["from-0", "from-1", "kept"]
        assert board.publish("gone-by-1", "again", wait=True) == 3


_CHILD = textwrap.dedent(
    """
    import dataclasses, sys
    from memstrata import Config, MemorySystem
    from memstrata.config import ActorsConfig
    from tests.fakes import FakeEmbedder

    config = Config(
        data_dir=sys.argv[1], actors=dataclasses.replace(ActorsConfig(), blackboard_snapshot=True)
    )
    sys.stdin.readline()  # start when told
    with MemorySystem.start(config, embedder=FakeEmbedder()) as system:
        board = system.blackboard("s1")
        print("loaded", ",".join(board.list()), flush=True)
        print("published", board.publish("from-child", "c", wait=True), flush=True)
        print("deleted", board.delete("gone-by-child"), flush=True)
        sys.stdin.readline()  # stop when told
    print("stopped", flush=True)
    """
)


@pytest.fixture
def child(data_dir: Path, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A second process that starts a system on ``data_dir`` when told "start" on its stdin,
    publishes ``from-child`` and deletes ``gone-by-child``, and stops when told "stop"."""
    with (tmp_path / "child.err").open("w", encoding="utf-8") as errors:
        process = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(data_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env=cli_env(),
            cwd=Path(__file__).resolve().parent.parent,
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=CLI_TIMEOUT)


def _line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.wait(timeout=CLI_TIMEOUT)
        pytest.fail(f"the child process ended early with {process.returncode}; see child.err")
    return line.strip()


def _tell(process: subprocess.Popen[str], word: str) -> None:
    assert process.stdin is not None
    process.stdin.write(word + "\n")
    process.stdin.flush()


@pytest.mark.parametrize("child_stops_first", [True, False], ids=["child-stops-first", "child-stops-last"])
def test_two_processes_on_one_data_dir_lose_nothing(
    data_dir: Path, child: subprocess.Popen[str], child_stops_first: bool
) -> None:
    with MemorySystem.start(_config(data_dir), embedder=FakeEmbedder()) as system:
        board = system.blackboard("s1")
        for key in ("gone-by-child", "gone-by-parent", "kept"):
            board.publish(key, "seed", wait=True)
    with MemorySystem.start(_config(data_dir), embedder=FakeEmbedder()) as system:
        board = system.blackboard("s1")
        assert board.list() == ["gone-by-child", "gone-by-parent", "kept"]
        _tell(child, "start")
        assert _line(child) == "loaded gone-by-child,gone-by-parent,kept"  # the seed, no more
        assert board.publish("from-parent", "p", wait=True) == 1
        assert board.delete("gone-by-parent") is True
        assert _line(child) == "published 1"
        assert _line(child) == "deleted True"
        if child_stops_first:
            _tell(child, "stop")
            assert _line(child) == "stopped"
    if not child_stops_first:
        _tell(child, "stop")
        assert _line(child) == "stopped"
    assert child.wait(timeout=CLI_TIMEOUT) == 0
    with MemorySystem.start(_config(data_dir), embedder=FakeEmbedder()) as system:
        board = system.blackboard("s1")
        assert board.list() == ["from-child", "from-parent", "kept"]
        assert board.publish("gone-by-child", "again", wait=True) == 3
        assert board.publish("gone-by-parent", "again", wait=True) == 3
