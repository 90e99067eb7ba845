"""What ``memstrata query`` does before its answer, and only then: the command line builds the
commands generated from the registry only when asked for one of them; OpenBLAS loads with one
thread in a query process (and the setting does not outlive it); a keyword query loads no model;
the query's vector is asked for before the keywords are ranked, computed once the model is
loaded and shared by the searches; merging the shared store's hits imports no actor; a store's
vector index loads ahead of its search without changing a hit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from memstrata.bridges import cli as cli_module
from memstrata.bridges._cli_query import _Loading
from memstrata.core.errors import ModelFaultError
from tests._support import CLI_TIMEOUT, cli_env, late_model_loading
from tests.fakes import FakeEmbedder

_BUILT_LAZILY = ("memstrata.bridges._cli_generated", "memstrata.bridges._operations")


def _python(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        env=env or cli_env(),
    )


def _last_json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the generated groups ---------------------------------------------------------------------


def test_the_lazy_nouns_are_the_generated_groups() -> None:
    from memstrata.bridges._cli_generated import GROUPS

    assert sorted(cli_module._GENERATED) == sorted(GROUPS)


def test_importing_the_command_line_builds_no_generated_command() -> None:
    probe = _python(
        "import json, sys\n"
        "import memstrata.bridges.cli as c\n"
        f"before = [m for m in {_BUILT_LAZILY!r} if m in sys.modules]\n"
        "configured = 'memstrata.core.config' in sys.modules\n"
        "ctx = c.cli.make_context('memstrata', ['status'], resilient_parsing=True)\n"
        "names = c.cli.list_commands(ctx)\n"
        "print(json.dumps({'before': before, 'configured': configured, 'names': names, "
        "'after': 'memstrata.bridges._cli_generated' in sys.modules}))"
    )
    found = _last_json(probe)
    assert found["before"] == []
    assert found["configured"] is False  # `memstrata --help` reads no configuration (~40 ms)
    assert found["after"] is True
    assert set(cli_module._GENERATED) <= set(found["names"]) and found["names"] == sorted(found["names"])
    assert {"query", "status", "serve"} <= set(found["names"])


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["knowledge", "--help"], 0, "Long-term knowledge of an agent"),
        (["tasks", "--help"], 0, "The task lifecycle"),
        (["--help"], 0, "working"),
        (["knowledg"], 2, "No such command 'knowledg'. Did you mean 'knowledge'?"),
        (["nosuch"], 2, "No such command 'nosuch'."),
    ],
)
def test_a_generated_group_or_a_wrong_name_in_a_new_process(args: list[str], code: int, needle: str) -> None:
    done = _python("from memstrata.bridges.cli import main\nmain()", *args)
    assert done.returncode == code, done.stderr
    assert needle in (done.stdout if code == 0 else done.stderr)
    if code:
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("memstrata: error: ")


def test_command_for_finds_generated_commands() -> None:
    assert cli_module.command_for("list_knowledge").name == "list"
    table = cli_module.command_table()
    assert "| `memstrata knowledge list` | `list_knowledge` |" in table


def test_help_lists_every_command_in_process() -> None:
    result = CliRunner().invoke(cli_module.cli, ["--help"])
    assert result.exit_code == 0, result.output
    for name in (*cli_module._GENERATED, "query", "status", "serve", "mcp"):
        assert f"\n  {name} " in result.output, name


# -- OpenBLAS in a query process ------------------------------------------------------------------

_BLAS = r"""
import json, os, sys
from pathlib import Path
from memstrata.bridges.cli import cli
from memstrata.bridges._app import CliState
data = Path(sys.argv[1])
state = CliState(data_dir=data)
cli.main(["query", "cache stamps", "-a", "dev", "--json"], obj=state, standalone_mode=False)
from threadpoolctl import threadpool_info
blas = [i["num_threads"] for i in threadpool_info() if i.get("internal_api") == "openblas"]
print(json.dumps({"answered": state.answered_in_process, "blas": blas,
                  "env": os.environ.get("OPENBLAS_NUM_THREADS")}))
"""


@pytest.fixture(scope="module")
def default_model_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir whose agent ``dev`` has a knowledge store made with the default model."""
    from memstrata.layers import KnowledgeStore
    from memstrata.storage import load_embedder

    data = tmp_path_factory.mktemp("blas") / "data"
    with KnowledgeStore.open(KnowledgeStore.path_for(data, "dev"), load_embedder(None)) as store:
        store.add_many([{"content": f"cache stamps note {i}", "category": "pattern"} for i in range(5)])
    return data


@pytest.mark.model
def test_a_query_process_loads_openblas_with_one_thread(default_model_store: Path) -> None:
    env = cli_env()
    for name in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"):
        env.pop(name, None)
    found = _last_json(_python(_BLAS, str(default_model_store), env=env))
    assert found["answered"] is True
    assert found["env"] is None  # gone again: nothing started later inherits it
    if found["blas"]:  # numpy built on OpenBLAS
        assert found["blas"] == [1]


@pytest.mark.model
def test_a_query_process_keeps_the_blas_threads_it_is_given(default_model_store: Path) -> None:
    env = {**cli_env(), "OPENBLAS_NUM_THREADS": "2"}
    env.pop("GOTO_NUM_THREADS", None)
    env.pop("OMP_NUM_THREADS", None)
    found = _last_json(_python(_BLAS, str(default_model_store), env=env))
    assert found["answered"] is True and found["env"] == "2"
    if found["blas"]:  # OpenBLAS runs at most a thread per core
        assert found["blas"] == [min(2, os.cpu_count() or 1)]


_KEYWORDS = r"""
import contextlib, io, json, sys
from pathlib import Path
from memstrata.bridges.cli import cli
from memstrata.bridges._app import CliState
state = CliState(data_dir=Path(sys.argv[1]))
out = io.StringIO()
with contextlib.redirect_stdout(out):
    args = ["query", sys.argv[2], "-a", "dev", "--mode", "keyword", "--json"]
    cli.main(args, obj=state, standalone_mode=False)
print(json.dumps({"answered": state.answered_in_process, "hits": json.loads(out.getvalue()),
                  "loaded": [m for m in ("onnxruntime", "tokenizers") if m in sys.modules]}))
"""


@pytest.mark.model
def test_a_keyword_query_loads_no_model_and_finds_what_the_store_finds(default_model_store: Path) -> None:
    from memstrata.layers import KnowledgeStore
    from memstrata.storage import load_embedder

    found = _last_json(_python(_KEYWORDS, str(default_model_store), "stamps note 3"))
    assert found["answered"] is True
    assert found["loaded"] == []
    path = KnowledgeStore.path_for(default_model_store, "dev")
    with KnowledgeStore.open(path, load_embedder(None)) as store:
        expected = [(h.entry.id, h.score) for h in store.search("stamps note 3", mode="keyword")]
    assert [(h["id"], h["score"]) for h in found["hits"]] == expected
    assert len(expected) == 5


# -- the query's vector -----------------------------------------------------------------------


class _Counting(FakeEmbedder):
    """Counts the query embeddings; the first ``fail`` of them raise."""

    def __init__(self, fail: int = 0) -> None:
        super().__init__()
        self.queries: list[str] = []
        self.fail = fail

    def embed_query(self, text: str) -> Any:
        self.queries.append(text)
        if len(self.queries) <= self.fail:
            raise OSError(f"model fault {len(self.queries)}")
        return super().embed_query(text)


def test_asking_for_a_vector_does_not_wait_for_the_load() -> None:
    release = threading.Event()
    model = _Counting()

    def load() -> FakeEmbedder:
        release.wait()  # the load ends only once the test lets it
        return model

    loading = _Loading("fake-bow", 64, load, limit=30.0)
    asked = threading.Thread(target=loading.prefetch_query, args=("cache stamps",))
    asked.start()
    asked.join(CLI_TIMEOUT)
    returned_while_loading = not asked.is_alive() and not loading.ready
    release.set()
    assert returned_while_loading
    vector = loading.embed_query("cache stamps")
    assert np.array_equal(vector, FakeEmbedder().embed_query("cache stamps"))
    assert model.queries == ["cache stamps"]


def test_one_text_is_embedded_once_and_each_caller_gets_its_own_array() -> None:
    model = _Counting()
    loading = _Loading("fake-bow", 64, lambda: model, limit=30.0)
    loading.prefetch_query("cache stamps")
    loading.prefetch_query("cache stamps")
    first = loading.embed_query("cache stamps")
    second = loading.embed_query("cache stamps")
    assert model.queries == ["cache stamps"]
    assert np.array_equal(first, second) and first is not second
    first[:] = 0  # a caller that changes its array changes no one else's
    assert np.array_equal(loading.embed_query("cache stamps"), second)
    other = loading.embed_query("other text")
    assert model.queries == ["cache stamps", "other text"] and not np.array_equal(other, second)


def test_a_failed_embedding_is_computed_again_when_asked_again() -> None:
    model = _Counting(fail=1)
    loading = _Loading("fake-bow", 64, lambda: model, limit=30.0)
    loading.prefetch_query("cache stamps")
    with pytest.raises(OSError, match="model fault 1"):
        loading.embed_query("cache stamps")
    assert loading.embed_query("cache stamps").shape == (64,)
    assert model.queries == ["cache stamps", "cache stamps"]


def test_a_late_vector_asked_for_early_is_still_bounded() -> None:
    with late_model_loading() as loading:
        loading.prefetch_query("late")
        with pytest.raises(ModelFaultError, match=r"no query vector within 0\.05 s"):
            loading.embed_query("late")
    assert loading.embed_query("late").shape == (64,)


def test_a_model_that_cannot_load_fails_the_vector_not_the_request() -> None:
    def load() -> FakeEmbedder:
        raise OSError("no model")

    loading = _Loading("fake-bow", 64, load, limit=1.0)
    loading.prefetch_query("cache stamps")  # asked for before the load failed: no error here
    assert loading.failed and "no model" in str(loading.error)
    with pytest.raises(RuntimeError, match="could not be loaded: no model"):
        loading.embed_query("cache stamps")


def test_the_model_thread_imports_before_it_loads_and_says_when_it_has() -> None:
    steps: list[str] = []
    release = threading.Event()

    def imports() -> None:
        steps.append("imports")

    def load() -> FakeEmbedder:
        release.wait()  # the load ends only once the test has seen the imports end
        steps.append("load")
        return FakeEmbedder()

    loading = _Loading("fake-bow", 64, load, limit=30.0, imports=imports)
    assert loading.imported.wait(CLI_TIMEOUT)
    seen = list(steps)
    release.set()
    assert seen == ["imports"] and not loading.failed
    assert steps == ["imports", "load"]


def test_imports_that_fail_still_release_the_caller_and_fail_the_load() -> None:
    loaded: list[str] = []

    def imports() -> None:
        raise ImportError("no onnxruntime")

    def load() -> FakeEmbedder:
        loaded.append("load")
        return FakeEmbedder()

    loading = _Loading("fake-bow", 64, load, limit=1.0, imports=imports)
    assert loading.imported.wait(CLI_TIMEOUT)
    assert loading.failed and "no onnxruntime" in str(loading.error) and loaded == []


def test_waiting_for_imports_that_hang_is_bounded_as_a_vector_is() -> None:
    release = threading.Event()

    def imports() -> None:
        release.wait()  # hangs until the test lets it end

    loading = _Loading("fake-bow", 64, FakeEmbedder, limit=0.05, imports=imports)
    loading.wait_imported()  # returns once the bound has passed: the imports never end before it
    imported_then = loading.imported.is_set()
    release.set()
    assert not imported_then
    assert loading.imported.wait(CLI_TIMEOUT) and not loading.failed


# -- the actors package -----------------------------------------------------------------------


def test_merging_hits_imports_no_actor() -> None:
    """``memstrata query`` with a shared store merges the hits as the agent actor does, without
    importing the actor tree."""
    probe = _python(
        "import json, sys\n"
        "from memstrata.layers import merge_hits\n"
        "import memstrata.actors\n"
        "loaded = [m for m in ('memstrata.actors._agent', 'memstrata.actors._runtime', 'pykka') "
        "if m in sys.modules]\n"
        "print(json.dumps(loaded))"
    )
    assert _last_json(probe) == []


def test_the_knowledge_layer_imports_no_model_code() -> None:
    """A store opened with its embedder (the query command's, computed in its helper process)
    needs no model code: the default model's runner, its graph rewriting and fastembed's wrapper
    are imported only when a store loads its model itself."""
    probe = _python(
        "import json, sys\n"
        "from memstrata.layers import KnowledgeStore, merge_hits\n"
        "loaded = [m for m in ('memstrata.storage._fastembed', 'memstrata.storage._default_model', "
        "'memstrata.storage._quantize') if m in sys.modules]\n"
        "print(json.dumps(loaded))"
    )
    assert _last_json(probe) == []


def test_every_actor_name_resolves_to_its_definition() -> None:
    import importlib

    import memstrata.actors as actors

    assert set(actors._LAZY) == set(actors.__all__)
    for name in actors.__all__:
        home = importlib.import_module(actors._LAZY[name], "memstrata.actors")
        assert getattr(actors, name) is getattr(home, name), name
    with pytest.raises(AttributeError, match=r"'memstrata\.actors' has no attribute 'NoSuchActor'"):
        actors.NoSuchActor  # type: ignore[attr-defined]  # noqa: B018


# -- loading the vector index before the search -------------------------------------------------


def _filled(path: Path, embedder: Any) -> None:
    from memstrata.layers import KnowledgeStore

    with KnowledgeStore.open(path, embedder) as store:
        store.add_many(
            [
                {"content": f"cache stamps note {i} about {w}", "category": "pattern"}
                for i, w in enumerate("abcdefgh")
            ]
        )


def test_loading_the_vector_index_ahead_changes_no_hit(tmp_path: Path) -> None:
    from memstrata.layers import KnowledgeStore

    path = tmp_path / "k.sqlite"
    embedder = FakeEmbedder()
    _filled(path, embedder)
    with KnowledgeStore.open(path, embedder) as plain:
        expected = [(h.entry.id, h.score, h.match_type) for h in plain.search("cache note about c")]
    with KnowledgeStore.open(path, embedder) as store:
        assert store.status()["vectors"]["mirror_loaded"] is False
        store.load_vector_index()
        assert store.status()["vectors"]["mirror_loaded"] is True
        assert [(h.entry.id, h.score, h.match_type) for h in store.search("cache note about c")] == expected
    assert expected


def test_loading_the_vector_index_of_a_keyword_only_store_does_nothing(tmp_path: Path) -> None:
    from memstrata.config import Config, EmbeddingConfig
    from memstrata.layers import KnowledgeStore

    path = tmp_path / "k.sqlite"
    _filled(path, FakeEmbedder())
    no_model = Config(data_dir=tmp_path, embedding=EmbeddingConfig(model=str(tmp_path / "no-model"), dim=64))
    with KnowledgeStore.open(path, None, config=no_model) as store:
        assert store.status()["mode"] == "keyword-only"
        store.load_vector_index()
        assert store.status()["vectors"]["mirror_loaded"] is False
        assert {h.match_type for h in store.search("cache note")} == {"keyword"}


def test_a_store_with_vectors_still_to_compute_is_left_to_the_system(tmp_path: Path) -> None:
    """Entries written while no model could be loaded wait for their vectors; the system
    computes them when it opens the store, so only it answers as ``Agent.query_knowledge`` does
    (the process's own search would rank them by keywords alone, or miss them)."""
    from memstrata import Config
    from memstrata.bridges._cli_query import query_knowledge
    from memstrata.layers import KnowledgeStore

    embedder = FakeEmbedder()
    config = Config(data_dir=tmp_path)
    path = KnowledgeStore.path_for(tmp_path, "arch")
    with KnowledgeStore.open(path, embedder, defer_vectors=True) as store:
        store.add("Retry card authorisation with exponential backoff", category="pattern")
        assert store.pending_vectors() == 1
    assert query_knowledge(config, embedder, "arch", "card retries", {}) is None
    with KnowledgeStore.open(path, embedder) as store:  # opened as the system opens it: computed
        assert store.pending_vectors() == 0
    hits = query_knowledge(config, embedder, "arch", "card retries", {})
    assert hits is not None and [h.entry.content for h in hits] == [
        "Retry card authorisation with exponential backoff"
    ]
