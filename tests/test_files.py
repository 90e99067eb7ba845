"""MemoryFiles and Codebase: sources, incremental sync, lazy sync, search, safe reads."""

from __future__ import annotations

import dataclasses
import itertools
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstrata import Codebase, Config, MemoryFiles
from memstrata.config import ChunkingConfig, FilesConfig, SearchConfig
from memstrata.errors import (
    ConfigError,
    EmbedderUnavailableError,
    EmbeddingError,
    InvalidInputError,
    PathOutsideRootError,
    SchemaMismatchError,
)
from memstrata.layers import FileHit, SyncStats, _files, _index_db, _snippet
from memstrata.layers._paths import SourceRules
from tests.fakes import BreakableEmbedder, FakeEmbedder

HOUR_NS = 3600 * 10**9


def write(path: Path, text: str | bytes, *, age_s: float = 3600) -> Path:
    """Write a file and date it in the past (as in a tree nobody is editing right now)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    then = time.time_ns() - int(age_s * 1e9)
    os.utime(path, ns=(then, then))
    return path


def config(data_dir: Path, **files: object) -> Config:
    return Config(data_dir=data_dir, files=dataclasses.replace(FilesConfig(), **files))  # type: ignore[arg-type]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    write(
        ws / "MEMORY.md",
        "# Memory\n\nThe deploy key lives in the vault.\n\n## Preferences\n\n- tabs over spaces\n",
    )
    write(ws / "memory" / "2024-05-01.md", "# 2024-05-01\n\nFixed the parseHttpRequest bug in the gateway.\n")
    write(ws / "memory" / "projects" / "billing.md", "# Billing\n\nInvoices are generated nightly by cron.\n")
    write(ws / "SOUL.md", "I am the soul file and must never be indexed.\n")
    write(ws / "memory" / "AGENTS.md", "agents file, excluded by name\n")
    write(ws / "memory" / ".trash" / "old.md", "hidden directory content\n")
    write(ws / "notes" / "todo.md", "outside the memory sources unless configured\n")
    write(ws / "src" / "app.py", "print('not a memory file')\n")
    return ws


@pytest.fixture
def fake() -> FakeEmbedder:
    return FakeEmbedder()


@pytest.fixture
def mf(workspace: Path, data_dir: Path, fake: FakeEmbedder) -> Iterator[MemoryFiles]:
    index = MemoryFiles.open(workspace, embedder=fake, config=config(data_dir))
    yield index
    index.close()


def paths(hits: Sequence[FileHit]) -> list[str]:
    return [h.path for h in hits]


def commits_by_others(db_path: Path) -> Iterator[int]:
    """Counts commits made by other connections (``PRAGMA data_version``)."""
    conn = sqlite3.connect(db_path)
    try:
        while True:
            yield int(conn.execute("PRAGMA data_version").fetchone()[0])
    finally:
        conn.close()


# -- sources and sync --------------------------------------------------------------------------


def test_sync_indexes_exactly_the_memory_sources(mf: MemoryFiles):
    stats = mf.sync()
    assert isinstance(stats, SyncStats)
    assert stats.files_processed == 3 and stats.files_unchanged == 0 and stats.files_deleted == 0
    assert stats.chunks_indexed == 3 and stats.chunks_embedded == 3
    indexed = {r[0] for r in mf.store.db.query("SELECT path FROM files")}
    assert indexed == {"MEMORY.md", "memory/2024-05-01.md", "memory/projects/billing.md"}
    status = mf.status()
    assert status["files"] == 3 and status["chunks"] == 3 and status["mode"] == "hybrid"
    assert status["embedding"]["model"] == "fake-bow"


def test_lowercase_memory_md_and_extra_paths(workspace: Path, data_dir: Path, fake: FakeEmbedder):
    write(workspace / "memory.md", "lowercase memory file about rabbits\n")
    write(workspace / "notes" / "deep" / "ideas.md", "ideas about penguins\n")
    write(workspace / "notes" / "raw.txt", "not markdown inside an extra dir\n")
    write(workspace / "plans.txt", "an extra file can be any text: zebras\n")
    cfg = config(data_dir, extra_paths=("notes", "plans.txt"))
    with MemoryFiles.open(workspace, embedder=fake, config=cfg) as index:
        index.sync()
        indexed = {r[0] for r in index.store.db.query("SELECT path FROM files")}
        assert {"memory.md", "notes/todo.md", "notes/deep/ideas.md", "plans.txt"} <= indexed
        assert "notes/raw.txt" not in indexed and "SOUL.md" not in indexed
        assert paths(index.search("zebras", mode="keyword")) == ["plans.txt"]
        assert index.get("notes/deep/ideas.md") == "ideas about penguins"


def test_extra_paths_outside_the_workspace_are_refused(workspace: Path, data_dir: Path, tmp_path: Path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for bad in (str(outside), "../elsewhere", "notes/../../elsewhere"):
        with pytest.raises(PathOutsideRootError, match="extra_paths"):
            MemoryFiles.open(workspace, embedder=FakeEmbedder(), config=config(data_dir, extra_paths=(bad,)))


def test_unchanged_files_cost_no_embedding_and_no_writes(mf: MemoryFiles, fake: FakeEmbedder):
    mf.sync()
    embedded = fake.texts_embedded
    versions = commits_by_others(mf.db_path)
    before = next(versions)
    stats = mf.sync()
    assert next(versions) == before, "an unchanged sync committed something"
    assert stats.files_unchanged == 3 and stats.files_processed == 0 and stats.chunks_indexed == 0
    assert fake.texts_embedded == embedded


def test_changed_file_replaces_only_its_chunks(mf: MemoryFiles, workspace: Path, fake: FakeEmbedder):
    mf.sync()
    ids_before = dict(mf.store.db.query("SELECT path, group_concat(id) FROM chunks GROUP BY path"))
    embedded = fake.texts_embedded
    write(workspace / "memory" / "2024-05-01.md", "# 2024-05-01\n\nRotated the TLS certificates today.\n")
    stats = mf.sync()
    assert (stats.files_processed, stats.files_unchanged, stats.chunks_deleted, stats.chunks_indexed) == (
        1,
        2,
        1,
        1,
    )
    assert fake.texts_embedded == embedded + 1
    ids_after = dict(mf.store.db.query("SELECT path, group_concat(id) FROM chunks GROUP BY path"))
    assert ids_after["MEMORY.md"] == ids_before["MEMORY.md"]
    assert ids_after["memory/2024-05-01.md"] != ids_before["memory/2024-05-01.md"]
    assert paths(mf.search("TLS certificates")) == ["memory/2024-05-01.md"]
    assert mf.search("parseHttpRequest") == []


def test_deleted_files_are_pruned(mf: MemoryFiles, workspace: Path):
    mf.sync()
    (workspace / "memory" / "projects" / "billing.md").unlink()
    stats = mf.sync()
    assert stats.files_deleted == 1 and stats.chunks_deleted == 1
    assert mf.search("invoices cron nightly") == [] or "memory/projects/billing.md" not in paths(
        mf.search("invoices cron nightly")
    )
    assert mf.store.vectors is not None and mf.store.vectors.count() == 2
    assert mf.store.db.scalar("SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH 'invoices'") == 0


def test_moved_and_duplicated_text_is_not_embedded_again(
    mf: MemoryFiles, workspace: Path, fake: FakeEmbedder
):
    mf.sync()
    embedded = fake.texts_embedded
    (workspace / "memory" / "projects" / "billing.md").rename(workspace / "memory" / "billing-moved.md")
    write(workspace / "memory" / "copy.md", (workspace / "MEMORY.md").read_text())
    stats = mf.sync()
    assert stats.files_processed == 2 and stats.files_deleted == 1
    assert stats.chunks_embedded == 0 and fake.texts_embedded == embedded
    assert "memory/billing-moved.md" in paths(mf.search("invoices generated nightly"))


def test_touched_file_with_same_content_is_not_reembedded(
    mf: MemoryFiles, workspace: Path, fake: FakeEmbedder
):
    mf.sync()
    embedded = fake.texts_embedded
    target = workspace / "MEMORY.md"
    write(target, target.read_text(), age_s=60)
    stats = mf.sync()
    assert stats.files_unchanged == 3 and stats.files_processed == 0
    assert fake.texts_embedded == embedded


def test_a_rewrite_within_the_same_timestamp_tick_is_still_seen(mf: MemoryFiles, workspace: Path):
    target = workspace / "memory" / "status.md"
    target.write_text("status: todo\n")  # written just now: read "racily"
    mf.sync()
    st = target.stat()
    target.write_text("status: done\n")  # same size ...
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... and the same mtime, as in one tick
    stats = mf.sync()
    assert stats.files_processed == 1
    assert mf.get("memory/status.md") == "status: done"
    assert paths(mf.search("done", mode="keyword")) == ["memory/status.md"]


def test_progress_reports_each_file(mf: MemoryFiles):
    seen: list[tuple[int, int, str]] = []
    mf.sync(progress=lambda done, total, path: seen.append((done, total, path)))
    assert [s[0] for s in seen] == [0, 1, 2, 3] and all(s[1] == 3 for s in seen)
    assert seen[0][2] == ""  # the size of the work, before its first file
    assert {s[2] for s in seen[1:]} == {"MEMORY.md", "memory/2024-05-01.md", "memory/projects/billing.md"}
    seen.clear()
    mf.sync(progress=lambda done, total, path: seen.append((done, total, path)))
    assert seen == []  # nothing to read: no report at all
    with pytest.raises(InvalidInputError, match="progress"):
        mf.sync(progress="yes")  # type: ignore[arg-type]


def test_a_sync_told_to_stop_starts_no_further_file_and_the_next_one_finishes(mf: MemoryFiles):
    asked = itertools.count()
    stopped = mf.sync(should_stop=lambda: next(asked) > 0)  # stop once a file was started
    assert not stopped.complete and stopped.files_processed < 3
    rest = mf.sync()
    assert rest.complete and stopped.files_processed + rest.files_processed == 3
    with pytest.raises(InvalidInputError, match="should_stop"):
        mf.sync(should_stop=True)  # type: ignore[arg-type]


def test_chunker_version_change_purges_and_rebuilds(
    workspace: Path, data_dir: Path, fake: FakeEmbedder, monkeypatch: pytest.MonkeyPatch
):
    cfg = config(data_dir)
    with MemoryFiles.open(workspace, embedder=fake, config=cfg) as index:
        index.sync()
    embedded = fake.texts_embedded
    monkeypatch.setattr(_index_db, "CHUNKER_VERSION", _index_db.CHUNKER_VERSION + 1)
    with MemoryFiles.open(workspace, embedder=fake, config=cfg) as index:
        stats = index.sync()
        assert stats.chunks_purged == 3 and stats.files_processed == 3 and stats.chunks_deleted == 0
        assert stats.chunks_embedded == 0 and fake.texts_embedded == embedded  # same text: cache
        assert index.store.db.scalar("SELECT value FROM metadata WHERE key = 'chunker_version'") == str(
            _index_db.CHUNKER_VERSION
        )
        assert index.sync().files_unchanged == 3


def test_chunking_config_change_rebuilds(workspace: Path, data_dir: Path, fake: FakeEmbedder):
    long_text = "\n\n".join(f"Paragraph {i} about topic {i}. " + "filler words " * 30 for i in range(30))
    write(workspace / "memory" / "long.md", long_text)
    with MemoryFiles.open(workspace, embedder=fake, config=config(data_dir)) as index:
        index.sync()
        before = index.status()["chunks"]
    cfg = dataclasses.replace(config(data_dir), chunking=ChunkingConfig(tokens=100, overlap=20))
    with MemoryFiles.open(workspace, embedder=fake, config=cfg) as index:
        stats = index.sync()
        assert stats.files_processed == 4 and stats.chunks_purged == before
        assert index.status()["chunks"] > before
    with pytest.raises(
        ConfigError, match=r"'chunking.overlap' must be below chunking.tokens \(100\), got 100"
    ):
        ChunkingConfig(tokens=100, overlap=100)
    with pytest.raises(ConfigError, match=r"'chunking.tokens' must be an integer >= 8"):
        ChunkingConfig(tokens=7, overlap=0)


def test_model_change_rebuilds_vectors(workspace: Path, data_dir: Path):
    cfg = config(data_dir)
    with MemoryFiles.open(workspace, embedder=FakeEmbedder(dim=64), config=cfg) as index:
        index.sync()
    other = FakeEmbedder(dim=32, model_id="other-model")
    with MemoryFiles.open(workspace, embedder=other, config=cfg) as index:
        assert index.store.vectors is not None and index.store.vectors.count() == 0
        stats = index.sync()
        assert stats.chunks_purged == 3 and other.texts_embedded == 3
        assert index.store.vectors.count() == 3 and index.store.vectors.dim == 32
        assert index.search("deploy key vault")[0].path == "MEMORY.md"


def test_a_codebase_database_is_not_opened_as_memory_files(
    workspace: Path, data_dir: Path, fake: FakeEmbedder
):
    db = data_dir / "shared.sqlite"
    Codebase.open(workspace, db_path=db, embedder=fake, config=config(data_dir)).close()
    with pytest.raises(SchemaMismatchError, match="codebase"):
        MemoryFiles.open(workspace, db_path=db, embedder=fake, config=config(data_dir))


def test_default_database_lives_in_the_data_dir_per_workspace(
    tmp_path: Path, data_dir: Path, fake: FakeEmbedder
):
    one, two = tmp_path / "a" / "ws", tmp_path / "b" / "ws"
    write(one / "MEMORY.md", "one\n")
    write(two / "MEMORY.md", "two\n")
    with (
        MemoryFiles.open(one, embedder=fake, config=config(data_dir)) as a,
        MemoryFiles.open(two, embedder=fake, config=config(data_dir)) as b,
    ):
        assert a.db_path != b.db_path
        assert a.db_path.parent == b.db_path.parent == data_dir / "files"
        assert a.db_path.name.startswith("memory-ws-")
        a.sync()
        b.sync()
        assert a.get("MEMORY.md") == "one" and paths(b.search("two", mode="keyword")) == ["MEMORY.md"]
    assert sorted(p.name for p in one.iterdir()) == ["MEMORY.md"]


def test_keyword_only_when_no_model_can_be_loaded(
    workspace: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    def unavailable(*args: object, **kwargs: object) -> None:
        raise EmbedderUnavailableError("no model here")

    monkeypatch.setattr(_files, "load_embedder", unavailable)
    with MemoryFiles.open(workspace, config=config(data_dir)) as index:
        stats = index.sync()
        assert stats.files_processed == 3
        status = index.status()
        assert status["mode"] == "keyword-only"
        assert (
            "KEYWORD-ONLY" in status["embedding"]["reason"]
            and "no model here" in status["embedding"]["reason"]
        )
        hits = index.search("deploy vault")
        assert paths(hits) == ["MEMORY.md"] and hits[0].match_type == "keyword"
        with pytest.raises(EmbedderUnavailableError):
            index.search("deploy", mode="vector")


# -- lazy sync ---------------------------------------------------------------------------------


def test_search_sees_new_changed_and_deleted_files_without_sync(mf: MemoryFiles, workspace: Path):
    mf.sync()
    write(workspace / "memory" / "fresh.md", "The kubernetes cluster was upgraded.\n", age_s=0)
    assert paths(mf.search("kubernetes cluster")) == ["memory/fresh.md"]
    (workspace / "memory" / "fresh.md").unlink()
    assert mf.search("kubernetes cluster") == []
    write(workspace / "MEMORY.md", "# Memory\n\nThe deploy key moved to the HSM.\n", age_s=0)
    assert "HSM" in mf.search("deploy key HSM")[0].snippet


def test_lazy_sync_waits_a_bounded_time(workspace: Path, data_dir: Path):
    release = threading.Event()

    class SlowEmbedder(FakeEmbedder):
        """Each document batch takes as long as the test lets it (here: never released)."""

        def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
            release.wait(0.3)
            return super().embed_documents(texts)

    slow = SlowEmbedder()
    cfg = dataclasses.replace(
        config(data_dir), files=dataclasses.replace(FilesConfig(), lazy_sync_wait_s=0.1)
    )
    with MemoryFiles.open(workspace, embedder=slow, config=cfg) as index:
        index.search("anything")  # first search: bounded, indexes the newest file, leaves the rest
        last = index.status()["last_sync"]
        assert last["complete"] is False and last["files_processed"] == 1
        assert slow.calls == 2  # one document batch + the query
        release.set()
        stats = index.sync()
        assert stats.complete and stats.files_processed == 2


def test_lazy_check_is_cheap_when_nothing_changed(mf: MemoryFiles, fake: FakeEmbedder):
    mf.sync()
    versions = commits_by_others(mf.db_path)
    before = next(versions)
    for _ in range(3):
        mf.search("vault")
    assert next(versions) == before
    assert fake.texts_embedded == 3


# -- search ------------------------------------------------------------------------------------


def test_hits_carry_paths_line_ranges_scores_and_snippets(mf: MemoryFiles, workspace: Path):
    filler = "\n".join(f"Line {i} is about nothing in particular at all." for i in range(60))
    write(
        workspace / "memory" / "long.md", f"# Log\n\n{filler}\n\nThe zeppelin landed at noon.\n\n{filler}\n"
    )
    mf.sync()
    hit = mf.search("zeppelin landed", max_results=1)[0]
    assert hit.path == "memory/long.md" and hit.language == "markdown"
    assert hit.start_line <= 64 <= hit.end_line
    assert 0 < hit.score <= 1 and hit.match_type in ("keyword", "hybrid")
    assert len(hit.snippet) <= 700 and "zeppelin" in hit.snippet
    text = mf.get(hit.path, from_line=hit.start_line, lines=hit.end_line - hit.start_line + 1)
    assert "The zeppelin landed at noon." in text


def test_min_score_filters_the_semantic_side_only(mf: MemoryFiles):
    mf.sync()
    strict = mf.search("parseHttpRequest", min_score=0.99)
    assert paths(strict) == ["memory/2024-05-01.md"] and strict[0].match_type == "keyword"
    assert mf.search("gateway bug", min_score=-1.0, max_results=10, mode="vector")
    assert len(mf.search("the", max_results=2, min_score=-1.0)) <= 2


@pytest.mark.parametrize(
    "query",
    [
        'AND OR NOT "unbalanced',
        "col:value NEAR(a b) ^start *",
        "\x00\x00",
        "\ud800 lone surrogate",
        "x" * 100_000,
        "日本語のクエリ",
        "🙂🚀",
        "   ",
        "",
    ],
)
def test_hostile_queries_never_crash(mf: MemoryFiles, query: str):
    mf.sync()
    assert isinstance(mf.search(query), list)


def test_cjk_text_is_findable(mf: MemoryFiles, workspace: Path):
    write(workspace / "memory" / "jp.md", "# メモ\n\n東京で会議がありました。\n")
    mf.sync()
    assert "memory/jp.md" in paths(mf.search("会議", mode="keyword"))


def test_bad_search_arguments_name_the_argument(mf: MemoryFiles):
    for kwargs, name in (
        ({"max_results": 0}, "max_results"),
        ({"max_results": True}, "max_results"),
        ({"min_score": 2.0}, "min_score"),
        ({"min_score": "high"}, "min_score"),
        ({"mode": "fuzzy"}, "mode"),
    ):
        with pytest.raises(InvalidInputError, match=name):
            mf.search("x", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="query"):
        mf.search(None)  # type: ignore[arg-type]


def test_open_rejects_a_root_that_is_not_a_directory(tmp_path: Path, data_dir: Path):
    write(tmp_path / "file.md", "x")
    for bad in (tmp_path / "missing", tmp_path / "file.md"):
        with pytest.raises(InvalidInputError, match="not a directory"):
            MemoryFiles.open(bad, embedder=FakeEmbedder(), config=config(data_dir))


def test_closed_index_raises_a_clear_error(workspace: Path, data_dir: Path):
    index = MemoryFiles.open(workspace, embedder=FakeEmbedder(), config=config(data_dir))
    index.close()
    index.close()
    with pytest.raises(Exception, match="closed"):
        index.search("x")


def test_embedding_failure_surfaces_and_leaves_files_dirty(workspace: Path, data_dir: Path):
    emb = BreakableEmbedder(broken=True)
    with MemoryFiles.open(workspace, embedder=emb, config=config(data_dir)) as index:
        with pytest.raises(EmbeddingError, match="model crashed"):
            index.sync()
        assert index.status()["files"] == 0
        emb.broken = False
        assert index.sync().files_processed == 3


def test_search_answers_from_the_index_when_the_model_fails(workspace: Path, data_dir: Path):
    emb = BreakableEmbedder(queries=True)
    with MemoryFiles.open(workspace, embedder=emb, config=config(data_dir)) as index:
        index.sync()
        emb.broken = True
        write(workspace / "memory" / "new.md", "a note the broken model cannot embed\n", age_s=0)
        hits = index.search("deploy vault")  # lazy sync fails, the query cannot be embedded
        assert paths(hits) == ["MEMORY.md"] and hits[0].match_type == "keyword"
        assert "model crashed" in index.status()["lazy_sync_error"]
        with pytest.raises(EmbeddingError):
            index.search("deploy vault", mode="vector")
        emb.broken = False
        assert "memory/new.md" in paths(index.search("broken model cannot embed"))
        assert index.status()["lazy_sync_error"] is None


def test_a_vanished_root_never_empties_the_index(workspace: Path, data_dir: Path, fake: FakeEmbedder):
    with MemoryFiles.open(workspace, embedder=fake, config=config(data_dir)) as index:
        index.sync()
        workspace.rename(workspace.with_name("moved-away"))
        with pytest.raises(InvalidInputError, match="no longer a readable directory"):
            index.sync()
        assert index.status()["files"] == 3
        assert paths(index.search("deploy vault")) == ["MEMORY.md"]
        assert "no longer" in index.status()["lazy_sync_error"]


# -- get() and path safety ---------------------------------------------------------------------


def test_get_returns_line_ranges(mf: MemoryFiles, workspace: Path):
    write(workspace / "memory" / "lines.md", "".join(f"line {i}\r\n" for i in range(1, 101)))
    assert mf.get("memory/lines.md") == "\n".join(f"line {i}" for i in range(1, 51))
    assert mf.get("memory/lines.md", from_line=99, lines=10) == "line 99\nline 100"
    assert mf.get("./memory//lines.md", from_line=5, lines=1) == "line 5"
    assert mf.get("memory/lines.md", from_line=500) == ""
    for kwargs, name in (({"from_line": 0}, "from_line"), ({"lines": 0}, "lines"), ({"lines": "2"}, "lines")):
        with pytest.raises(InvalidInputError, match=name):
            mf.get("memory/lines.md", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "path",
    [
        "../outside.md",
        "memory/../../outside.md",
        "/etc/passwd",
        "~/MEMORY.md",
        # on POSIX these are names inside the root (tests/test_get_unusual_names.py)
        *(["memory\\..\\..\\x.md", "C:/x.md"] if os.name == "nt" else []),
    ],
)
def test_get_refuses_paths_leaving_the_root(mf: MemoryFiles, path: str):
    with pytest.raises(PathOutsideRootError):
        mf.get(path)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("SOUL.md", "not served"),
        ("memory/AGENTS.md", "not served"),
        ("memory/.trash/old.md", "not served"),
        ("notes/todo.md", "not served"),
        ("src/app.py", "not served"),
        ("memory/missing.md", "does not exist"),
        ("", "non-empty"),
        (".", "root itself"),
        ("memory/a\x00b.md", "non-empty"),
    ],
)
def test_get_refuses_files_the_index_may_not_hold(mf: MemoryFiles, path: str, message: str):
    with pytest.raises(InvalidInputError, match=message):
        mf.get(path)


def test_get_rejects_non_string_paths(mf: MemoryFiles):
    with pytest.raises(InvalidInputError, match="string"):
        mf.get(42)  # type: ignore[arg-type]


def test_symlinks_leaving_the_root_are_never_read(mf: MemoryFiles, workspace: Path, tmp_path: Path):
    secret = write(tmp_path / "secret.md", "TOP SECRET outside the workspace\n")
    (workspace / "memory" / "escape.md").symlink_to(secret)
    (workspace / "memory" / "zero.md").symlink_to("/dev/zero")
    (workspace / "memory" / "linked-dir").symlink_to(tmp_path, target_is_directory=True)
    stats = mf.sync()
    reasons = dict(stats.skipped)
    assert reasons["memory/escape.md"] == "symlink leads outside the root"
    assert reasons["memory/zero.md"] == "symlink leads outside the root"
    assert mf.search("TOP SECRET", mode="keyword") == []
    for path in ("memory/escape.md", "memory/zero.md", "memory/linked-dir/secret.md"):
        with pytest.raises(PathOutsideRootError, match="leaves the root"):
            mf.get(path)


def test_symlink_inside_the_root_is_served_and_loops_are_skipped(mf: MemoryFiles, workspace: Path):
    (workspace / "memory" / "alias.md").symlink_to(workspace / "MEMORY.md")
    (workspace / "memory" / "loop.md").symlink_to(workspace / "memory" / "loop.md")
    (workspace / "memory" / "a.md").symlink_to(workspace / "memory" / "b.md")
    (workspace / "memory" / "b.md").symlink_to(workspace / "memory" / "a.md")
    (workspace / "memory" / "cycle").symlink_to(workspace / "memory", target_is_directory=True)
    stats = mf.sync()
    reasons = dict(stats.skipped)
    assert reasons["memory/loop.md"] == "symlink loop" and reasons["memory/a.md"] == "symlink loop"
    assert "memory/cycle" in reasons
    assert mf.get("memory/alias.md", lines=1) == "# Memory"
    with pytest.raises(InvalidInputError):
        mf.get("memory/loop.md")
    with pytest.raises(InvalidInputError, match="symlinked directory"):
        mf.get("memory/cycle/2024-05-01.md")


def test_special_huge_binary_and_unreadable_files_are_skipped(
    workspace: Path, data_dir: Path, fake: FakeEmbedder
):
    os.mkfifo(workspace / "memory" / "pipe.md")
    write(workspace / "memory" / "huge.md", "x" * 5000)
    write(workspace / "memory" / "binary.md", b"text\x00\x01\x02binary")
    write(workspace / "memory" / "latin1.md", "caf\xe9 cr\xe8me".encode("latin-1"))
    locked = write(workspace / "memory" / "locked.md", "private notes\n")
    locked.chmod(0)
    try:
        cfg = config(data_dir, max_file_bytes=4096)
        with MemoryFiles.open(workspace, embedder=fake, config=cfg) as index:
            stats = index.sync()  # a FIFO must not block the sync
            reasons = dict(stats.skipped)
            assert reasons["memory/pipe.md"] == "not a regular file"
            assert reasons["memory/huge.md"] == "larger than 4096 bytes"
            assert reasons["memory/binary.md"].startswith("binary")
            if os.geteuid() != 0:  # root reads anything
                assert reasons["memory/locked.md"].startswith("not readable")
            assert stats.files_skipped == len(stats.skipped)
            # invalid UTF-8 is indexed with replacement characters
            assert index.get("memory/latin1.md") == "caf\ufffd cr\ufffdme"
            for path, message in (
                ("memory/pipe.md", "regular"),
                ("memory/huge.md", "larger"),
                ("memory/binary.md", "binary"),
            ):
                with pytest.raises(InvalidInputError, match=message):
                    index.get(path)
            again = index.sync()
            assert again.files_processed == 0 and dict(again.skipped)["memory/binary.md"].startswith("binary")
    finally:
        locked.chmod(0o644)


def test_a_file_the_chunker_fails_on_is_skipped_and_the_rest_indexed(
    mf: MemoryFiles, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunker's fault with one file (an unforeseen syntax tree) leaves that file out with
    its reason; the sync and the searches after it go on."""
    import memstrata.layers._index_db as index_db

    real = index_db.chunk_file

    def failing(path: str, *args: Any, **kwargs: Any) -> Any:
        if path == "memory/odd.md":
            raise IndexError("list index out of range")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(index_db, "chunk_file", failing)
    write(workspace / "memory" / "odd.md", "# Odd\n\nparseHttpRequest again\n")
    stats = mf.sync()
    assert (
        dict(stats.skipped)["memory/odd.md"] == "could not be chunked (IndexError: list index out of range)"
    )
    assert "memory/2024-05-01.md" in paths(mf.search("parseHttpRequest gateway"))
    assert mf.sync().files_processed == 0  # not tried again until the file changes


def test_read_only_workspace_is_indexed_without_writing_into_it(
    workspace: Path, data_dir: Path, fake: FakeEmbedder
):
    def snapshot() -> dict[str, tuple[int, int]]:
        return {
            str(p.relative_to(workspace)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in workspace.rglob("*")
        }

    before = snapshot()
    modes = {p: p.stat().st_mode for p in [workspace, *workspace.rglob("*")] if p.is_dir()}
    for p in modes:
        p.chmod(stat.S_IMODE(modes[p]) & ~0o222)
    try:
        with MemoryFiles.open(workspace, embedder=fake, config=config(data_dir)) as index:
            assert index.sync().files_processed == 3
            assert paths(index.search("deploy key vault"))[0] == "MEMORY.md"
            index.watch()
            index.stop_watching()
    finally:
        for p, mode in modes.items():
            p.chmod(mode)
    assert snapshot() == before


_PARTS = [
    "src",
    ".git",
    "node_modules",
    "memory",
    "notes",
    "build",
    "a.py",
    "b.md",
    ".hidden.py",
    "SOUL.md",
    "x.txt",
]


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(_PARTS), min_size=1, max_size=4))
def test_walk_rules_and_get_rules_agree(parts: list[str]):
    """What a walk indexes (descend into each parent, then the file test) is exactly what
    ``allows`` (used by ``get()``) serves."""
    rel = "/".join(parts)
    for rules in (
        SourceRules(
            kind="codebase",
            extensions=frozenset({".py", ".md"}),
            pruned=frozenset({"build"}),
            exclude=("SOUL.md",),
        ),
        SourceRules(kind="memory", exclude=("SOUL.md", "notes/*.txt"), extra=("notes", "src/a.py")),
    ):
        parents = ["/".join(parts[:n]) for n in range(1, len(parts))]
        walk = all(rules.descend(p) for p in parents) and rules.file_in_walk(rel, parts[-1])
        assert walk == rules.allows(rel), (rules.kind, rel)


# -- codebase ----------------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    write(
        root / "src" / "http.py",
        "def parse_http_request(raw):\n    '''Split headers.'''\n    return raw.split()\n",
    )
    write(
        root / "src" / "lib.rs",
        "pub fn checksum(data: &[u8]) -> u32 {\n    data.iter().map(|b| *b as u32).sum()\n}\n",
    )
    write(
        root / "web" / "app.ts",
        "export function renderInvoice(total: number): string {\n  return `${total}`;\n}\n",
    )
    write(root / "README.md", "# Repo\n\nComputes checksums and parses HTTP.\n")
    write(root / "config.yaml", "retries: 3\n")
    write(root / "node_modules" / "dep" / "index.js", "function checksum() {}\n")
    write(root / ".git" / "config.toml", "hidden = true\n")
    write(root / ".github" / "ci.yml", "on: push\n")
    write(root / "build" / "gen.py", "GENERATED = 1\n")
    write(root / "src" / "__pycache__" / "http.py", "cached = 1\n")
    write(root / "src" / "image.png", b"\x89PNG\r\n\x1a\n\x00\x00")
    write(root / "src" / "data.json", b'{"a": 1}\x00\x00\x00')
    write(root / "src" / ".env.py", "SECRET = 1\n")
    write(root / "docs.txt", "not a configured extension\n")
    return root


def test_codebase_indexes_sources_and_prunes(tree: Path, data_dir: Path, fake: FakeEmbedder):
    with Codebase.open(tree, embedder=fake, config=config(data_dir)) as cb:
        stats = cb.sync()
        indexed = {r[0] for r in cb.store.db.query("SELECT path FROM files WHERE skipped IS NULL")}
        assert indexed == {"src/http.py", "src/lib.rs", "web/app.ts", "README.md", "config.yaml"}
        assert dict(stats.skipped)["src/data.json"].startswith("binary")
        languages = dict(cb.store.db.query("SELECT path, language FROM files WHERE skipped IS NULL"))
        assert languages["src/lib.rs"] == "rust" and languages["web/app.ts"] == "typescript"
        hits = cb.search("checksum")
        # the README ("Computes checksums") and lib.rs both match; lib.rs is the only vector match
        assert {"src/lib.rs", "README.md"} == set(paths(hits)[:2])
        assert next(h for h in hits if h.path == "src/lib.rs").language == "rust"
        assert "node_modules/dep/index.js" not in paths(hits)
        # identifier words: "http" and "request" find parse_http_request / renderInvoice parts
        assert cb.search("invoice", mode="keyword")[0].path == "web/app.ts"
        with pytest.raises(InvalidInputError, match="not served"):
            cb.get("node_modules/dep/index.js")
        with pytest.raises(InvalidInputError, match="not served"):
            cb.get(".git/config.toml")
        assert cb.get("src/http.py", from_line=3) == "    return raw.split()"


def test_names_that_are_not_utf8_are_skipped_naming_them_and_the_rest_is_indexed(
    tree: Path, data_dir: Path, fake: FakeEmbedder
):
    """A Latin-1 name (Python sees a lone surrogate) is skipped like a binary file, shown with its
    bad bytes escaped; it must not fail the sync of the whole tree."""
    write(tree / os.fsdecode(b"caf\xe9.py"), "def cafe_latin_one(): pass\n")
    write(tree / os.fsdecode(b"lib\xff") / "inner.py", "def inside_latin_dir(): pass\n")
    (tree / "src" / os.fsdecode(b"link\xe9")).symlink_to(tree / "web", target_is_directory=True)
    with Codebase.open(tree, embedder=fake, config=config(data_dir)) as cb:
        for stats in (cb.sync(), cb.sync()):  # reported by every sync, as an oversized file is
            reasons = dict(stats.skipped)
            assert reasons["caf\\xe9.py"] == "file name is not valid UTF-8"
            assert reasons["lib\\xff"] == "directory name is not valid UTF-8, not entered"
            assert reasons["src/link\\xe9"] == "symlinked directory, not followed"
            assert orjson.loads(orjson.dumps(stats.as_dict()))["files_skipped"] == len(stats.skipped)
        indexed = {r[0] for r in cb.store.db.query("SELECT path FROM files WHERE skipped IS NULL")}
        assert indexed == {"src/http.py", "src/lib.rs", "web/app.ts", "README.md", "config.yaml"}
        assert paths(cb.search("parse http request"))[0] == "src/http.py"
        assert cb.search("cafe_latin_one inside_latin_dir", mode="keyword") == []
        with pytest.raises(InvalidInputError, match=r"^path 'caf\\xe9\.py' is not served: its name is not"):
            cb.get(os.fsdecode(b"caf\xe9.py"))
        assert orjson.loads(orjson.dumps(cb.status()))["last_sync"]["skipped"]


def test_a_memory_note_whose_name_is_not_utf8_is_skipped(mf: MemoryFiles, workspace: Path):
    write(workspace / "memory" / os.fsdecode(b"n\xff.md"), "deploy on tuesdays\n")
    stats = mf.sync()
    assert dict(stats.skipped) == {"memory/n\\xff.md": "file name is not valid UTF-8"}
    assert stats.files_processed == 3
    assert paths(mf.search("deploy key vault"))[0] == "MEMORY.md"


def test_a_root_whose_path_is_not_utf8_is_refused_naming_it(tmp_path: Path, data_dir: Path):
    root = tmp_path / os.fsdecode(b"caf\xe9")
    write(root / "a.py", "x = 1\n")
    with pytest.raises(
        InvalidInputError, match=r"^root must be valid UTF-8 text \(no lone surrogates\), got '.*/caf\\xe9'"
    ):
        Codebase.open(root, embedder=FakeEmbedder(), config=config(data_dir))


def test_codebase_language_filter(tree: Path, data_dir: Path, fake: FakeEmbedder):
    with Codebase.open(tree, embedder=fake, config=config(data_dir)) as cb:
        cb.sync()
        for language in ("python", "py", ".py", "Python"):
            hits = cb.search("checksum parse http request", language=language)
            assert hits and {h.language for h in hits} == {"python"}
        assert cb.search("checksum", language="kotlin") == []  # a language no file here has
        with pytest.raises(InvalidInputError, match="language"):
            cb.search("x", language="")
        with pytest.raises(InvalidInputError, match="top_k"):
            cb.search("x", top_k=0)


def test_codebase_top_k_and_snippet_limit(tmp_path: Path, data_dir: Path, fake: FakeEmbedder):
    root = tmp_path / "big"
    for n in range(15):
        body = "\n".join(
            f"    total_{i} = compute_total({i})  # accumulate the running total" for i in range(60)
        )
        write(root / f"mod{n}.py", f"def function_{n}():\n{body}\n")
    with Codebase.open(root, embedder=fake, config=config(data_dir)) as cb:
        cb.sync()
        hits = cb.search("compute total", top_k=12)
        assert len(hits) == 12
        assert all(len(h.snippet) <= 700 for h in hits)
        assert all(1 <= h.start_line <= h.end_line <= 61 for h in hits)


def test_snippet_is_centred_on_the_best_match():
    text = "alpha " * 300 + "the needle and the haystack " + "omega " * 300
    snippet = _snippet.make_snippet(text, "needle haystack", 200)
    assert len(snippet) <= 200 and "needle and the haystack" in snippet
    assert snippet.startswith("…") and snippet.endswith("…")
    assert _snippet.make_snippet("short text", "x", 700) == "short text"
    assert len(_snippet.make_snippet("y" * 5000, "no match", 700)) <= 700


def test_concurrent_owner_and_second_index_on_one_database(workspace: Path, data_dir: Path):
    """Two connections to one file (as the watcher's worker has) see each other's commits."""
    cfg = config(data_dir)
    with (
        MemoryFiles.open(workspace, embedder=FakeEmbedder(), config=cfg) as a,
        MemoryFiles.open(workspace, embedder=FakeEmbedder(), config=cfg) as b,
    ):
        a.sync()
        assert b.status()["files"] == 3
        write(workspace / "memory" / "late.md", "a late note about llamas\n")
        b.sync()
        assert paths(a.search("llamas", mode="keyword")) == ["memory/late.md"]


# -- real model --------------------------------------------------------------------------------


@pytest.mark.model
def test_real_model_finds_paraphrases(workspace: Path, data_dir: Path, real_embedder: object):
    write(workspace / "memory" / "pets.md", "# Pets\n\nOur office dog is a golden retriever named Biscuit.\n")
    write(workspace / "memory" / "infra.md", "# Infra\n\nThe database backups run every night at 2am.\n")
    cfg = Config(data_dir=data_dir, search=SearchConfig())
    with MemoryFiles.open(workspace, embedder=real_embedder, config=cfg) as index:  # type: ignore[arg-type]
        stats = index.sync()
        assert stats.files_processed == 5
        assert index.status()["chunker"].startswith("v4/400/80/tokens:")
        hits = index.search("which puppy lives at work", mode="vector")
        assert (
            hits[0].path == "memory/pets.md" and hits[0].similarity is not None and hits[0].similarity > 0.35
        )
        hits = index.search("what time do the db dumps happen")  # no word in common; cosine ~0.59
        assert hits[0].path == "memory/infra.md" and hits[0].match_type == "semantic"


def test_missing_vectors_are_found_on_open_and_restored_by_the_next_sync(tmp_path: Path) -> None:
    """A chunk that lost its vector (e.g. written by a process without sqlite-vec) is repaired."""
    workspace = tmp_path / "ws"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "MEMORY.md").write_text("# Deploys\n\nThe canary deploy runs before the full rollout.\n")
    db_path = tmp_path / "files.sqlite"
    embedder = FakeEmbedder()
    with MemoryFiles.open(workspace, db_path=db_path, embedder=embedder) as mf:
        mf.sync()
        store = mf._store
        assert store is not None and store.vectors is not None
        lost = store.vectors.rowids()
        assert lost
        store.vectors.delete_many(lost)
    with MemoryFiles.open(workspace, db_path=db_path, embedder=embedder) as mf:
        report = mf.status()["consistency"]
        assert report["missing_vectors"] == len(lost)
        mf.sync()
        store = mf._store
        assert store is not None and store.vectors is not None
        assert store.vectors.count() == len(lost)
        hits = mf.search("canary rollout", min_score=0.0)
        assert hits and hits[0].path == "MEMORY.md"
