"""`memstrata status` imports no numerical or model library, and `memstrata.storage` imports its
parts on first use (each public name still resolves to the object its submodule defines)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import memstrata.storage as storage
from memstrata.layers import KnowledgeStore
from tests.fakes import FakeEmbedder

HEAVY = ("numpy", "onnxruntime", "fastembed", "tokenizers", "sqlite_vec")

_STATUS = """
import json, sys
from memstrata.bridges._console import main  # the console script's entry
data_dir = sys.argv[1]
sys.argv = ["memstrata", "--data-dir", data_dir, "status", "--json"]
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
heavy = [m for m in {heavy!r} if m in sys.modules]
print(json.dumps({{"code": code, "heavy": heavy}}), file=sys.stderr)
"""
# nor what a command given its data dir and no tags does not use: the default data dir's lookup
# and the tools' definitions (10-15 ms each of every command's start)
UNUSED = ("platformdirs", "memstrata.bridges._tool_defs")


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


def test_status_imports_no_numerical_or_model_library(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with KnowledgeStore.open(data / "knowledge" / "alice.sqlite", FakeEmbedder()) as store:
        store.add_many([{"content": f"entry number {i}", "category": "pattern"} for i in range(5)])
    done = _run(_STATUS.format(heavy=HEAVY + UNUSED), str(data))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["stores"]["knowledge"]["alice"]["count"] == 5
    assert report["storage"]["native_vectors"] in (True, False)
    probe = json.loads(done.stderr.strip().splitlines()[-1])
    assert probe == {"code": 0, "heavy": []}


def test_importing_storage_defers_its_parts() -> None:
    done = _run(
        "import sys, memstrata.storage as s\n"
        f"before = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "from memstrata.storage import driver_info, DEFAULT_MODEL_ID\n"
        "info = driver_info()\n"
        f"after = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "s.VectorIndex\n"
        "print(before, after, 'numpy' in sys.modules, DEFAULT_MODEL_ID)"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "[]", "True", storage.DEFAULT_MODEL_ID]


def test_every_public_name_resolves_to_its_definition() -> None:
    import importlib

    for name in storage.__all__:
        value = getattr(storage, name)
        home = importlib.import_module(storage._HOME[name], "memstrata.storage")
        assert value is getattr(home, name), name
    assert set(storage.__all__) <= set(dir(storage))
    assert set(storage._HOME) == set(storage.__all__)


_LAZY_PACKAGES = ["memstrata", "memstrata.actors", "memstrata.layers", "memstrata.storage"]


@pytest.mark.parametrize("package", _LAZY_PACKAGES)
def test_dir_lists_the_lazy_names_before_any_is_imported(package: str) -> None:
    code = (
        f"import sys, importlib; p = importlib.import_module({package!r}); before = set(sys.modules); "
        "listed = set(p.__all__) <= set(dir(p)); print(listed, set(sys.modules) == before)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


def test_an_unknown_name_is_a_clear_attribute_error() -> None:
    with pytest.raises(AttributeError, match=r"'memstrata\.storage' has no attribute 'NoSuchThing'"):
        storage.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(ImportError):
        from memstrata.storage import NoSuchThing  # type: ignore[attr-defined]  # noqa: F401


_SEARCHES = """
import sys
from memstrata.layers import KnowledgeStore
from tests.fakes import FakeEmbedder
with KnowledgeStore.open(sys.argv[1], FakeEmbedder()) as store:
    for mode in ("hybrid", "keyword", "vector"):
        store.search("entry number payment retries", mode=mode)
        store.search("entry number payment retries", mode=mode, category="pattern")
print("numpy.ma" in sys.modules, "numpy" in sys.modules)
"""


@pytest.mark.parametrize("complete", [True, False], ids=["every-posting", "words-read"])
def test_searches_do_not_import_numpy_ma(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, complete: bool
) -> None:
    """A plain ``numpy.unique`` imports ``numpy.ma`` (~20 ms) in a fresh process's first search;
    the engine's paths use :func:`memstrata.storage._distinct.distinct` instead. The store was
    searched before, so the fresh process also checks and maps the index files left at close:
    the BM25 file of every posting (a bulk load's) or of the words read."""
    from memstrata.storage import _bm25_file, _index_files

    monkeypatch.setattr(_index_files, "MIN_ROWS", 100)  # files for 300 entries too
    monkeypatch.setattr(_bm25_file, "_BULK_SHARE", 0.5 if complete else 2.0)
    path = tmp_path / "k.sqlite"
    with KnowledgeStore.open(path, FakeEmbedder()) as store:
        store.add_many(
            [
                {"content": f"entry number {i} about payment retries", "category": "pattern"}
                for i in range(300)
            ]
        )
        # postings of ~25 words in the file: enough for numpy's sorting membership test
        store.search("entry number about payment retries " + " ".join(str(i) for i in range(20)))
    bm25 = _index_files.read_index(path.with_name(path.name + ".index") / "bm25-knowledge_fts")
    assert bm25 is not None and bool(bm25.meta.get("complete")) is complete
    done = subprocess.run(
        [sys.executable, "-c", _SEARCHES, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
