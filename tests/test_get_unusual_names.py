"""`get` serves every file a search returns, names like ``~notes.py``, ``C:drive.py`` or
``x\\..\\y.py`` included (ordinary names on POSIX), and still refuses what leaves the root."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from memstrata import Codebase, Config, MemorySystem
from memstrata._workspaces import Workspaces
from memstrata.bridges._app import CliState
from memstrata.bridges._methods import build_methods
from memstrata.bridges._server import JsonLinesServer
from memstrata.bridges.cli import cli
from memstrata.errors import PathOutsideRootError
from memstrata.layers import _paths
from tests.fakes import FakeEmbedder

pytestmark = pytest.mark.skipif(os.name == "nt", reason="these names hold characters Windows forbids")

# file name -> the word only that file holds
NAMES = {"~notes.py": "tildebackup", "C:drive.py": "drivelike", "x\\..\\y.py": "backslashdots"}


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # `~/...` expands to a known place
    folder = tmp_path / "src"
    folder.mkdir()
    for name, word in NAMES.items():
        (folder / name).write_text(f"def {word}():\n    return 1\n", encoding="utf-8")
    (tmp_path / "outside.py").write_text("secret = 1\n", encoding="utf-8")
    return folder


@pytest.fixture
def registry(root: Path, data_dir: Path) -> Iterator[Workspaces]:
    with Workspaces(data_dir, config=Config(data_dir=data_dir), embedder=FakeEmbedder()) as workspaces:
        workspaces.index(root, kind="code")
        yield workspaces


def test_the_layer_serves_every_name_its_search_returns(root: Path, data_dir: Path) -> None:
    with Codebase.open(root, config=Config(data_dir=data_dir), embedder=FakeEmbedder()) as index:
        index.sync()
        for name, word in NAMES.items():
            assert [hit.path for hit in index.search(word, mode="keyword")] == [name]
            assert index.get(name, lines=1) == f"def {word}():"


def test_the_registry_serves_them_relative_to_their_root_and_absolute(
    registry: Workspaces, root: Path
) -> None:
    for name, word in NAMES.items():
        (hit,) = [h for h in registry.search(word, min_score=0) if h.path == name]
        assert registry.get(hit.path, root=root, lines=1).text == f"def {word}():"
        assert registry.get(hit.path, lines=1).text == f"def {word}():"
        assert registry.get(str(root / hit.path), lines=1).text == f"def {word}():"


def test_the_command_line_serves_them(registry: Workspaces, root: Path, data_dir: Path) -> None:
    runner = CliRunner()
    for name, word in NAMES.items():
        for args in (["get", name, "--root", str(root)], ["get", str(root / name)]):
            done = runner.invoke(
                cli,
                ["--data-dir", str(data_dir), *args, "--lines", "1"],
                obj=CliState(embedder=FakeEmbedder()),
            )
            assert (done.exit_code, done.stdout) == (0, f"def {word}():\n"), done.stderr


def test_json_rpc_get_file_serves_them(registry: Workspaces, root: Path, data_dir: Path) -> None:
    requests = b"".join(
        json.dumps(
            {"jsonrpc": "2.0", "id": n, "method": "get_file", "params": {"path": name, "lines": 1}}
        ).encode()
        + b"\n"
        for n, name in enumerate(NAMES)
    )
    out = io.BytesIO()
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        JsonLinesServer(build_methods(system, registry), workers=1).serve(io.BytesIO(requests), out)
    answers = {m["id"]: m for m in map(orjson.loads, out.getvalue().splitlines())}
    for n, word in enumerate(NAMES.values()):
        assert "result" in answers[n], answers[n]
        assert answers[n]["result"]["text"] == f"def {word}():"


@pytest.mark.parametrize(
    "path",
    ["~/outside.py", "~", "../outside.py", "a/../../outside.py", "..", "/etc/passwd", "x/../../outside.py"],
)
def test_paths_that_leave_the_root_are_still_refused(root: Path, data_dir: Path, path: str) -> None:
    with (
        Codebase.open(root, config=Config(data_dir=data_dir), embedder=FakeEmbedder()) as index,
        pytest.raises(PathOutsideRootError),
    ):
        index.get(path)


def test_a_name_that_names_a_home_folder_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """``~user/...`` is refused when ``os.path.expanduser`` would expand it, and only then."""
    homes = {"~alice/notes.py": "/home/alice/notes.py"}
    monkeypatch.setattr(_paths.os.path, "expanduser", lambda path: homes.get(path, path))
    with pytest.raises(PathOutsideRootError, match="home-relative"):
        _paths.normalise_relative("~alice/notes.py")
    assert _paths.normalise_relative("~bob/notes.py") == "~bob/notes.py"


@pytest.mark.parametrize("path", ["C:drive.py", "c:/x.py", "\\x.py", "x\\..\\y.py", "..\\y.py"])
def test_on_windows_drives_and_backslashes_still_leave_the_root(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    assert _paths.normalise_relative(path).endswith(".py")  # an ordinary name here
    monkeypatch.setattr(_paths, "_WINDOWS", True)
    with pytest.raises(PathOutsideRootError):
        _paths.normalise_relative(path)


def test_an_extra_memory_path_starting_with_a_tilde_is_a_name_in_the_root(tmp_path: Path) -> None:
    assert _paths.normalise_extra(tmp_path, ["~drafts.md", "notes/~old.md"]) == (
        "~drafts.md",
        "notes/~old.md",
    )
