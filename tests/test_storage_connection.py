"""Connections: driver, pragmas, error translation, transactions and concurrent writers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from memstrata.errors import DatabaseBusyError, InvalidInputError, StorageError
from memstrata.storage import Database, disable_vec_for_tests, driver_info, open_database


def test_pragmas(tmp_path: Path) -> None:
    db = open_database(tmp_path / "p.sqlite")
    assert db.pragmas() == {"journal_mode": "wal", "synchronous": 1, "busy_timeout": 5000, "foreign_keys": 1}
    db.close()
    custom = open_database(tmp_path / "p.sqlite", busy_timeout_ms=1234)
    assert custom.pragmas()["busy_timeout"] == 1234
    custom.close()


def test_foreign_keys_are_enforced(tmp_path: Path) -> None:
    db = open_database(tmp_path / "p.sqlite")
    db.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
    db.execute("CREATE TABLE child (id INTEGER PRIMARY KEY, parent INTEGER REFERENCES parent(id))")
    with pytest.raises(StorageError, match="FOREIGN KEY"):
        db.execute("INSERT INTO child(parent) VALUES (42)")
    db.close()


def test_driver_reports_sqlite_vec() -> None:
    info = driver_info()
    assert info.driver in ("sqlite3", "sqlean")
    assert info.native_vectors and info.vec_version and info.vec_version.startswith("v")
    assert info.as_dict()["native_vectors"] is True


def test_driver_reports_why_vectors_are_missing(tmp_path: Path) -> None:
    disable_vec_for_tests(True)
    try:
        db = open_database(tmp_path / "p.sqlite")
    finally:
        disable_vec_for_tests(False)
    info = db.driver_info()
    assert not info.native_vectors and info.reason == "sqlite-vec disabled"
    db.close()


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"this is not a database at all, just some text " * 100)
    with pytest.raises(StorageError, match=f"cannot open database {path}.*not a database"):
        open_database(path)


def test_a_directory_is_not_a_database(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match=str(tmp_path)):
        open_database(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(StorageError, match=f"cannot open database {blocker}/db.sqlite"):
        open_database(blocker / "db.sqlite")


def test_read_only_and_awkward_paths(tmp_path: Path) -> None:
    path = tmp_path / "odd dir #1?" / "d b%20.sqlite"
    db = open_database(path)
    db.execute("CREATE TABLE t (x)")
    db.execute("INSERT INTO t VALUES (1)")
    db.close()
    ro = open_database(path, read_only=True)
    assert ro.scalar("SELECT x FROM t") == 1
    with pytest.raises(StorageError, match="readonly"):
        ro.execute("INSERT INTO t VALUES (2)")
    ro.close()


def test_lone_surrogate_parameter_is_invalid_input(tmp_path: Path) -> None:
    with open_database(tmp_path / "p.sqlite") as db:
        db.execute("CREATE TABLE t (x TEXT)")
        with pytest.raises(InvalidInputError, match="lone surrogate"):
            db.execute("INSERT INTO t VALUES (?)", ("bad \udc80",))
        with pytest.raises(InvalidInputError, match="lone surrogate"):
            db.executemany("INSERT INTO t VALUES (?)", [("ok",), ("\ud800",)])
        db.execute("INSERT INTO t VALUES (?)", ("nul \x00 and 🎉 survive",))
        assert db.scalar("SELECT x FROM t WHERE x LIKE ?", ("nul%",)) == "nul \x00 and 🎉 survive"


@pytest.fixture
def table_t(tmp_path: Path) -> Iterator[Database]:
    """A database with one table ``t (x)``, closed after the test."""
    with open_database(tmp_path / "p.sqlite") as db:
        db.execute("CREATE TABLE t (x)")
        yield db


def test_transaction_commits_and_rolls_back(table_t: Database) -> None:
    db = table_t
    hooks: list[str] = []
    with db.transaction():
        db.on_rollback(lambda: hooks.append("committed block"))  # a commit drops the hook
        db.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(ValueError), db.transaction():
        db.execute("INSERT INTO t VALUES (2)")
        db.on_rollback(lambda: hooks.append("rolled back"))
        raise ValueError("abort")
    assert [r[0] for r in db.query("SELECT x FROM t")] == [1]
    assert hooks == ["rolled back"]
    assert not db.in_transaction


def test_nested_transaction_is_a_savepoint(table_t: Database) -> None:
    db = table_t
    hooks: list[str] = []
    with db.transaction():
        db.execute("INSERT INTO t VALUES (1)")
        db.on_rollback(lambda: hooks.append("outer"))
        with pytest.raises(KeyError), db.transaction():
            db.execute("INSERT INTO t VALUES (2)")
            raise KeyError("inner")
        with db.transaction():
            db.execute("INSERT INTO t VALUES (3)")
    assert [r[0] for r in db.query("SELECT x FROM t ORDER BY x")] == [1, 3]
    assert hooks == ["outer"]  # hooks run on the inner rollback too (they are idempotent)
    with pytest.raises(KeyError), db.transaction():
        with db.transaction():
            db.execute("INSERT INTO t VALUES (4)")
        raise KeyError("outer")
    assert [r[0] for r in db.query("SELECT x FROM t ORDER BY x")] == [1, 3]


def test_executescript_inside_a_transaction_does_not_commit_early(tmp_path: Path) -> None:
    db = open_database(tmp_path / "p.sqlite")
    db.executescript("CREATE TABLE t (x); INSERT INTO t VALUES (1);")  # outside: plain script
    with pytest.raises(RuntimeError), db.transaction():
        db.executescript("INSERT INTO t VALUES (2); CREATE TABLE u (y);")
        raise RuntimeError("abort")
    assert db.scalar("SELECT count(*) FROM t") == 1
    assert db.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'u'") == 0
    db.close()


def _writer(
    path: Path, worker: int, rows: int, start: threading.Barrier, errors: list[BaseException]
) -> None:
    try:
        db = open_database(path)
        start.wait()
        for i in range(rows):
            if i % 2:
                with db.transaction():
                    db.execute("INSERT INTO t(worker, n) VALUES (?, ?)", (worker, i))
                    db.execute("UPDATE counter SET value = value + 1")
            else:  # autocommit writes contend too
                db.execute("INSERT INTO t(worker, n) VALUES (?, ?)", (worker, i))
                db.execute("UPDATE counter SET value = value + 1")
        db.close()
    except BaseException as exc:
        errors.append(exc)


def test_concurrent_writers_never_see_database_is_locked(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    with open_database(path) as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, worker INTEGER, n INTEGER)")
        db.execute("CREATE TABLE counter (value INTEGER)")
        db.execute("INSERT INTO counter VALUES (0)")
    workers, rows = 4, 150
    start = threading.Barrier(workers)
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_writer, args=(path, w, rows, start, errors)) for w in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with open_database(path) as db:
        assert db.scalar("SELECT count(*) FROM t") == workers * rows
        assert db.scalar("SELECT value FROM counter") == workers * rows


@pytest.mark.parametrize("in_transaction", [True, False], ids=["transaction", "autocommit"])
def test_busy_writer_retries_until_the_lock_is_released(
    tmp_path: Path, backoff_signal: threading.Event, in_transaction: bool
) -> None:
    """A writer, in a transaction or a single statement outside one, is retried beyond
    busy_timeout, not failed after it."""
    path = tmp_path / "b.sqlite"
    holder = open_database(path)
    holder.execute("CREATE TABLE t (x)")
    errors: list[BaseException] = []

    def write() -> None:
        try:
            with open_database(path, busy_timeout_ms=10, lock_bound_s=30) as db:
                if in_transaction:
                    with db.transaction():
                        db.execute("INSERT INTO t VALUES (2)")
                else:
                    db.execute("INSERT INTO t VALUES (2)")
        except BaseException as exc:
            errors.append(exc)

    with holder.transaction():
        holder.execute("INSERT INTO t VALUES (1)")
        thread = threading.Thread(target=write)
        thread.start()
        kind = "second" if in_transaction else "autocommit"
        assert backoff_signal.wait(timeout=30), f"the {kind} writer never backed off"
    thread.join()
    assert errors == []
    assert sorted(r[0] for r in holder.query("SELECT x FROM t")) == [1, 2]
    holder.close()


def test_lock_held_beyond_the_bound_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite"
    holder = open_database(path)
    holder.execute("CREATE TABLE t (x)")
    other = open_database(path, busy_timeout_ms=10, lock_bound_s=0.1)
    with holder.transaction():
        holder.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(DatabaseBusyError, match=f"database {path} stayed locked"), other.transaction():
            pass
    with other.transaction():  # and works once the lock is gone
        other.execute("INSERT INTO t VALUES (2)")
    assert other.scalar("SELECT count(*) FROM t") == 2
    holder.close()
    other.close()


def test_database_is_a_context_manager(tmp_path: Path) -> None:
    with open_database(tmp_path / "p.sqlite") as db:
        assert isinstance(db, Database)
        db.execute("CREATE TABLE t (x)")
    with pytest.raises(StorageError):
        db.execute("SELECT 1")


def test_a_block_that_raises_closes_the_database_and_the_error_goes_on(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError), open_database(tmp_path / "p.sqlite") as db:
        db.execute("CREATE TABLE t (x)")
        _ = 1 / 0
    with pytest.raises(StorageError):
        db.execute("SELECT 1")


def _wal_database(path: Path) -> None:
    with open_database(path) as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT)")
        db.execute("INSERT INTO t(x) VALUES ('kept')")


def test_read_only_flag_serves_reads_and_refuses_writes_in_one_line(tmp_path: Path) -> None:
    from memstrata.errors import ReadOnlyError

    path = tmp_path / "ro.sqlite"
    _wal_database(path)
    with open_database(path, read_only=True) as db:
        assert db.read_only
        assert db.scalar("SELECT x FROM t") == "kept"
        with pytest.raises(ReadOnlyError, match="read-only") as caught:
            db.execute("INSERT INTO t(x) VALUES ('new')")
        assert "\n" not in str(caught.value) and str(path) in str(caught.value)
        with pytest.raises(ReadOnlyError), db.transaction():
            db.execute("UPDATE t SET x = 'changed'")
    with open_database(path) as db:
        assert db.query("SELECT x FROM t") == [("kept",)]
    with pytest.raises(ReadOnlyError, match="does not exist"):
        open_database(tmp_path / "missing.sqlite", read_only=True)
    assert not (tmp_path / "missing.sqlite").exists()


def test_read_only_database_is_not_migrated_and_not_repaired(tmp_path: Path) -> None:
    from memstrata.errors import ReadOnlyError
    from memstrata.storage import apply_migrations, check_consistency

    path = tmp_path / "m.sqlite"
    with open_database(path) as db:
        apply_migrations(db, "demo", ["CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT)"])
        db.execute("INSERT INTO t(x) VALUES ('a')")
        db.execute("CREATE VIRTUAL TABLE t_fts USING fts5(x, content='t', content_rowid='id')")
    with open_database(path, read_only=True) as db:
        assert apply_migrations(db, "demo", ["CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT)"]) == 1
        with pytest.raises(ReadOnlyError, match="open it once with write access"):
            apply_migrations(db, "demo", ["CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT)", "SELECT 1"])
        report = check_consistency(db, table="t", fts={"t_fts": None})  # the row was never indexed
        assert report.problems and "not rebuilt (read-only)" in report.problems[0]
        assert report.fts_rebuilt == []


def test_unwritable_place_opens_read_only_by_itself(tmp_path: Path) -> None:
    """A read-only bind mount (root can write a chmod-ed folder, so chmod cannot show this)."""
    import subprocess

    from memstrata.errors import ReadOnlyError

    source, view = tmp_path / "src", tmp_path / "view"
    source.mkdir()
    view.mkdir()
    _wal_database(source / "a.sqlite")
    if subprocess.run(["mount", "--bind", str(source), str(view)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], capture_output=True).returncode:
            pytest.skip("cannot remount read-only here")
        with open_database(view / "a.sqlite") as db:  # no flag: detected
            assert db.read_only
            assert db.scalar("SELECT x FROM t") == "kept"
            with pytest.raises(ReadOnlyError, match="read-only"):
                db.execute("INSERT INTO t(x) VALUES ('new')")
        with pytest.raises(ReadOnlyError, match="folder is read-only"):
            open_database(view / "sub" / "new.sqlite")
    finally:
        subprocess.run(["umount", str(view)], capture_output=True, check=False)
    assert sorted(p.name for p in source.iterdir()) == ["a.sqlite"]
