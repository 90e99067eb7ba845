"""The item actor reads an item's ``index`` paths as LangGraph does (``[0]``, ``[*]``, ``*``,
``{a,b}``), names the vectors of a path of several texts ``"<path>.<n>"``, and finds every
vector's text again from its name (to compute it again with another model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from memstrata import Config, MemorySystem
from memstrata.actors._item_paths import named_texts, path_texts, texts_of_names
from tests.fakes import FakeEmbedder

VALUE: dict[str, Any] = {
    "title": "solar roofs",
    "tags": ["red", "green", 3, True, None, {"k": "v", "a": [1, 2.5]}, [1, "x"]],
    "body": {"parts": ["panels", {"p": "q"}], "n": 2.5, "flag": False, "none": None},
    "notes": {"x": "first", "y": {"z": "deep"}, "w": ["l1", "l2"]},
    "a": "alpha",
    "b": {"c": "gamma", "d": ["é", 1], "0": "zero"},
    "ünï": "cödé",
    "empty": [],
    "none": {},
    "list_of_keyed": [{"0": "x"}, "y"],
}

GRAMMAR_PATHS = [
    "tags[*]",
    "tags[0]",
    "tags[-1]",
    "tags[-9]",
    "tags[99]",
    "tags[x]",
    "tags[ 1 ]",
    "tags[*].k",
    "tags[5].a[1]",
    "tags[*][*]",
    "body.parts[0]",
    "body.parts[*]",
    "body.parts[1].p",
    "{a,b}",
    "{a, b.c, missing, body.none, body.flag}",
    "{a,b}.c",
    "{tags}",
    "{notes.y.z,b.d}",
    "notes.*",
    "notes.*.z",
    "notes.*[*]",
    "*",
    "*.c",
    "b.*",
    "b.d[*]",
    "title[0]",
    "a.*",
    "a..b",
    "b..c",
    ".a",
    "empty[*]",
    "none.*",
    "[0]",
    "list_of_keyed[*].0",
]


def _langgraph_texts(value: dict[str, Any], path: str) -> list[str]:
    embed = pytest.importorskip("langgraph.store.base.embed", reason="the langgraph extra is not installed")
    texts: list[str] = embed.get_text_at_path(value, path)
    return texts


@pytest.mark.parametrize("path", GRAMMAR_PATHS)
def test_a_path_of_langgraph_grammar_reads_the_texts_langgraph_reads(path: str) -> None:
    assert path_texts(VALUE, path) == _langgraph_texts(VALUE, path)


@pytest.mark.parametrize("path", ["title", "b.c", "ünï", "b.0", "notes.y.z", "tags"])
def test_keys_joined_by_dots_read_the_text_they_read_before(path: str) -> None:
    """Text as LangGraph reads it; a value that is not text as compact JSON, as stored before."""
    expected = _langgraph_texts(VALUE, path)
    if path == "tags":
        expected = ['["red","green",3,true,null,{"k":"v","a":[1,2.5]},[1,"x"]]']
    assert path_texts(VALUE, path) == expected
    assert path_texts(VALUE, "body.n") == ["2.5"] and path_texts(VALUE, "missing.key") == []
    assert path_texts(VALUE, "$")[0].startswith('{"title":"solar roofs","tags":')


def test_a_path_of_several_texts_names_one_vector_per_text() -> None:
    named = named_texts(VALUE, ["title", "tags[*].k", "notes.*", "tags[99]", "{a,b.c}", "body.parts[0]"])
    assert named == {
        "title": "solar roofs",
        "tags[*].k": "v",
        "notes.*.0": "first",
        "notes.*.1": '{"z": "deep"}',
        "notes.*.2": '["l1", "l2"]',
        "{a,b.c}.0": "alpha",
        "{a,b.c}.1": "gamma",
        "body.parts[0]": "panels",
    }


@pytest.mark.parametrize(
    "paths",
    [
        ["title", "b.0", "b.c"],
        ["tags[*]", "title"],
        ["notes.*", "{a,b}", "*"],
        ["list_of_keyed[*]"],  # names list_of_keyed[*].0 and .1; the first is also a path of one text
        ["list_of_keyed[*].0"],  # that path alone: one text, its own name
        ["tags[-1]", "body.parts[*]", "b..c", "$"],
    ],
)
def test_every_vector_name_finds_its_text_again(paths: list[str]) -> None:
    named = named_texts(VALUE, paths)
    assert texts_of_names(VALUE, list(named)) == named
    assert texts_of_names({}, list(named)) == ({"$": "{}"} if "$" in named else {})  # texts gone


def _exported_items(system: MemorySystem, path: Path) -> dict[str, dict[str, Any]]:
    system.export(path)
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return {r["key"]: r for r in records if r["kind"] == "item"}


def test_an_import_computes_again_each_text_of_a_path_of_several(tmp_path: Path) -> None:
    """An item's vectors travel by name; another model computes each from its own text."""
    index = ["tags[*]", "{a,b}", "title"]
    with MemorySystem.start(Config(data_dir=tmp_path / "a"), embedder=FakeEmbedder(dim=64)) as system:
        system.items.put(
            ("docs",), "roof", {"tags": ["solar", "wine cellar"], "a": "x", "b": "y"}, index=index
        )
        system.items.put(("docs",), "barn", {"tags": ["hay"], "title": "red barn", "a": "stone"}, index=index)
        system.export(tmp_path / "out.jsonl")
    with MemorySystem.start(
        Config(data_dir=tmp_path / "b"), embedder=FakeEmbedder(dim=32, model_id="m2")
    ) as other:
        assert other.import_(tmp_path / "out.jsonl")["item"] == 2
        for query, key in (("wine cellar", "roof"), ("y", "roof"), ("stone", "barn"), ("hay", "barn")):
            hits = other.items.search(("docs",), query=query, limit=1)
            assert [h.key for h in hits] == [key] and hits[0].score == pytest.approx(1.0)
        items = _exported_items(other, tmp_path / "again.jsonl")
    assert {k: sorted(r["vectors"]) for k, r in items.items()} == {
        "barn": ["tags[*]", "title", "{a,b}"],
        "roof": ["tags[*].0", "tags[*].1", "{a,b}.0", "{a,b}.1"],
    }
    assert {r["vectors_model"] for r in items.values()} == {"m2"}
