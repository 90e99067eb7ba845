"""Where a conn string puts the LangGraph store's data: a SQLite file's name (``app.db``) names
the folder beside it whether the file exists yet or not, so the store and LangGraph's own SQLite
checkpointer share one name in either order of opening, and one string keeps naming one place."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("langgraph.store.base", reason="the langgraph extra is not installed")
pytest.importorskip("langgraph.checkpoint.sqlite", reason="langgraph-checkpoint-sqlite is not installed")

from langgraph.checkpoint.sqlite import SqliteSaver

from memstrata.errors import ConfigError
from memstrata.integrations._common import open_system
from memstrata.integrations.langgraph import MemstrataStore
from tests.fakes import FakeEmbedder


def _checkpoint(path: Path) -> None:
    """LangGraph's SQLite checkpointer on ``path``, set up (it creates the file)."""
    with SqliteSaver.from_conn_string(str(path)) as saver:
        saver.setup()


def _put_and_read(path: Path | str, key: str) -> list[str]:
    """Puts ``key`` through a store on ``path``; the keys the store then holds."""
    with MemstrataStore(path, embedder=FakeEmbedder()) as store:
        store.put(("app",), key, {"v": key})
        return sorted(item.key for item in store.search(("app",)))


@pytest.mark.parametrize("suffix", [".db", ".sqlite", ".sqlite3", ".DB"])
def test_the_store_first_leaves_the_file_to_the_checkpointer(tmp_path: Path, suffix: str) -> None:
    db = tmp_path / f"app{suffix}"
    assert _put_and_read(str(db), "before") == ["before"]
    assert not db.exists()  # never made a folder
    _checkpoint(db)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT count(*) FROM checkpoints").fetchone() == (0,)  # the saver's file
    assert _put_and_read(db, "after") == ["after", "before"]  # the same data dir, now the file exists
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [f"app{suffix}.memstrata"]


def test_the_checkpointer_first_gives_the_same_data_dir(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    _checkpoint(db)
    assert _put_and_read(db, "k") == ["k"]
    db.unlink()  # resetting the checkpoints leaves the store's data where it was
    assert _put_and_read(str(db), "j") == ["j", "k"]
    assert (tmp_path / "app.db.memstrata" / "items.sqlite").is_file()


def test_a_path_without_a_sqlite_suffix_is_the_folder_itself(tmp_path: Path) -> None:
    opened = open_system(tmp_path / "data", embedder=FakeEmbedder())
    assert opened.system.data_dir == (tmp_path / "data").resolve()
    opened.release()
    same = open_system(str(tmp_path / "app.db"), embedder=FakeEmbedder())
    also = open_system(tmp_path / "app.db.memstrata", embedder=FakeEmbedder())
    assert same.system is also.system  # one place, one shared system
    same.release()
    also.release()


def test_a_file_named_otherwise_keeps_its_folder_beside_it_once_gone(tmp_path: Path) -> None:
    """A temporary file's name, as LangGraph's own tests pass: the folder beside it, for good."""
    scratch = tmp_path / "tmpab12cd"
    scratch.write_bytes(b"")
    assert _put_and_read(scratch, "k") == ["k"]
    assert scratch.read_bytes() == b""  # the file is left alone
    scratch.unlink()
    assert _put_and_read(str(scratch), "j") == ["j", "k"]
    assert not scratch.exists()


def test_a_folder_or_a_file_where_the_form_says_otherwise_is_refused_by_name(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    old.mkdir()  # a data dir an earlier version made for "old.db"
    with pytest.raises(
        ConfigError,
        match=r"MemstrataStore target '.*old\.db' names a SQLite file but is a folder.*old\.db\.memstrata",
    ):
        open_system(str(old), embedder=FakeEmbedder(), what="MemstrataStore target")
    kept = open_system(f"{old}/", embedder=FakeEmbedder())  # a trailing slash: that folder itself
    assert kept.system.data_dir == old.resolve()
    kept.release()
    plain = tmp_path / "notes"
    plain.write_text("not a folder")
    with pytest.raises(
        ConfigError, match=r"MemstrataSession db_path '.*notes/' ends in a separator.*is a file"
    ):
        open_system(f"{plain}/", embedder=FakeEmbedder(), what="MemstrataSession db_path")
    assert plain.read_text() == "not a folder"
