"""The layers' own doors take their paths through the one path check (``check_path``): a path
the file system could not take, or memstrata could not store as text, is refused by name, as an
``InvalidInputError`` or a ``StorageError``, never a bare ``ValueError``, ``OSError`` or codec
error from deeper down. And the config's data folder the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memstrata import Codebase, Config, EpisodicMemory, KnowledgeStore, MemoryFiles
from memstrata.errors import ConfigError, InvalidInputError, StorageError
from tests.fakes import FakeEmbedder

_REFUSED = [
    ("a\x00b", InvalidInputError, "must not contain NUL characters"),
    ("x" * 5000, InvalidInputError, "is 5000 characters, over the limit of 4096"),
    ("\ud800", InvalidInputError, r"must be valid UTF-8 text \(no lone surrogates\)"),
]


def _open(kind: str, path: Any, tmp_path: Path) -> Any:
    config = Config(data_dir=tmp_path / "data")
    if kind == "knowledge":
        return KnowledgeStore.open(path, FakeEmbedder(), config=config)
    if kind == "episodes":
        return EpisodicMemory.open(path, FakeEmbedder(), config=config)
    layer = MemoryFiles if kind == "files" else Codebase
    return layer.open(path, embedder=FakeEmbedder(), config=config)


@pytest.mark.parametrize("kind", ["knowledge", "episodes", "files", "code"])
@pytest.mark.parametrize(("path", "error", "words"), _REFUSED)
def test_a_path_no_file_system_or_text_column_takes_is_refused_by_name(
    kind: str, path: str, error: type[Exception], words: str, tmp_path: Path
) -> None:
    name = "root" if kind in ("files", "code") else "path"
    with pytest.raises(error, match=rf"^{name} {words}"):
        _open(kind, path, tmp_path)


@pytest.mark.parametrize("kind", ["knowledge", "episodes", "files", "code"])
def test_a_name_too_long_for_the_file_system_is_refused_with_its_reason(kind: str, tmp_path: Path) -> None:
    """Under the length limit of a whole path, but one name of 300 characters (most file
    systems take 255)."""
    path = tmp_path / ("y" * 300)
    expected = InvalidInputError if kind in ("files", "code") else StorageError
    with pytest.raises(expected, match=r"(cannot be used|cannot open database).*File name too long"):
        _open(kind, str(path), tmp_path)


@pytest.mark.parametrize(
    ("data_dir", "words"),
    [
        (1, "must be a path given as a string, got int"),
        ("a\x00b", "must not contain NUL characters"),
        ("x" * 5000, "is 5000 characters, over the limit of 4096"),
        ("\ud800", "must be valid UTF-8 text"),
        ("/tmp/" + "y" * 300, r"cannot be used: File name too long \('/tmp/yyy"),
        ("", "must be a path, got ''"),
    ],
)
def test_the_data_folder_of_a_config_is_checked_as_every_path_is(data_dir: Any, words: str) -> None:
    with pytest.raises(ConfigError, match=rf"^config key 'data_dir' {words}"):
        Config(data_dir=data_dir)


def test_the_registry_of_indexed_folders_checks_what_it_is_given(tmp_path: Path) -> None:
    """``Workspaces`` (behind ``memstrata index``, the server's file methods and the tools)
    refused nothing: a number as its folder was a ``TypeError``, a list as its config an
    ``AttributeError`` at its first use."""
    from memstrata._workspaces import Workspaces

    with pytest.raises(InvalidInputError, match=r"^data_dir must be a path given as a string, got int"):
        Workspaces(1)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"^data_dir must not contain NUL characters"):
        Workspaces("a\x00b")
    with pytest.raises(InvalidInputError, match=r"^config must be a Config or None, got list"):
        Workspaces(tmp_path, config=[])  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"^embedder must implement the Embedder protocol"):
        Workspaces(tmp_path, embedder="fake")  # type: ignore[arg-type]
    assert not (tmp_path / "workspaces.sqlite").exists()  # refused before anything was made
    with Workspaces(tmp_path, embedder=FakeEmbedder()) as registry:
        assert registry.roots() == []
