"""A LangGraph store without an ``embed`` of its own uses the system's model: its vectors are that
model's, so after the system's model changes they are computed again (as AutoGen's are), never
ranked against another model's query, and never left at another length."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

pytest.importorskip("langgraph.store.base", reason="the langgraph extra is not installed")

from langgraph.store.base import SearchItem
from langgraph.store.memory import InMemoryStore

from memstrata import MemorySystem
from memstrata.config import Config
from memstrata.errors import InvalidInputError
from memstrata.integrations.langgraph import MemstrataStore
from tests.fakes import FakeEmbedder

DOCS = {
    "d0": "solar roof panels on the barn",
    "d1": "sourdough bread recipe",
    "d2": "river stone garden path",
    "d3": "spare key under the pot",
}


class RolledEmbedder(FakeEmbedder):
    """Another model of the same length: every word lands one dimension further along, so its
    vectors and the first model's share no meaning."""

    def _vector(self, text: str) -> npt.NDArray[np.float32]:
        return np.roll(super()._vector(text), 1)


def _value(key: str, text: str) -> dict[str, object]:
    """An item whose text sits at every kind of path LangGraph reads, beside texts of its own."""
    return {
        "text": text,
        "meta": {"title": text},
        "tags": [f"tag {key}", text],
        "body": {"parts": [text, f"part {key}"]},
        "a": f"a {key}",
        "b": text,
        "notes": {"x": f"note {key}", "y": text},
    }


def _ranks(store: MemstrataStore) -> list[tuple[str, float]]:
    """Each document's best hit when searched by its own text."""
    found = [store.search(("docs",), query=text, limit=1)[0] for text in DOCS.values()]
    return [(hit.key, round(hit.score or 0.0, 4)) for hit in found]


def _write(data: Path, model: FakeEmbedder, index: dict[str, object]) -> None:
    with (
        MemorySystem.start(Config(data_dir=data), model) as system,
        MemstrataStore(system, index=index) as store,
    ):
        for key, text in DOCS.items():
            store.put(("docs",), key, _value(key, text))
        assert _ranks(store) == [("d0", 1.0), ("d1", 1.0), ("d2", 1.0), ("d3", 1.0)]


def _top_hits(system: MemorySystem, index: dict[str, object]) -> list[tuple[str, float]]:
    with MemstrataStore(system, index=index) as store:
        found = _ranks(store)
        store.put(("docs",), "d4", _value("d4", "violet meadow"))
        hit = store.search(("docs",), query="violet meadow", limit=1)[0]
    return [*found, (hit.key, round(hit.score or 0.0, 4))]


@pytest.mark.parametrize(
    ("fields", "texts_per_item"),
    [
        (["text"], 1),
        (["meta.title"], 1),
        (["tags[*]"], 2),
        (["body.parts[0]"], 1),
        (["{a,b}"], 2),
        (["notes.*"], 2),
        (["tags[*]", "body.parts[0]", "{a,b}", "notes.*"], 7),
    ],
)
def test_another_model_of_the_same_length_ranks_by_its_own_vectors(
    tmp_path: Path, fields: list[str], texts_per_item: int
) -> None:
    index = {"fields": fields}
    _write(tmp_path / "d", FakeEmbedder(64, model_id="fake-a"), index)
    model = RolledEmbedder(64, model_id="fake-rolled")
    with MemorySystem.start(Config(data_dir=tmp_path / "d"), model) as system:
        assert _top_hits(system, index) == [("d0", 1.0), ("d1", 1.0), ("d2", 1.0), ("d3", 1.0), ("d4", 1.0)]
    assert model.texts_embedded == (len(DOCS) + 1) * texts_per_item  # the four again, the new one


def test_another_model_of_another_length_takes_over_the_store(tmp_path: Path) -> None:
    index = {"fields": ["text"]}
    _write(tmp_path / "d", FakeEmbedder(64, model_id="fake-a"), index)
    with MemorySystem.start(Config(data_dir=tmp_path / "d"), FakeEmbedder(32, model_id="fake-b")) as system:
        assert _top_hits(system, index) == [("d0", 1.0), ("d1", 1.0), ("d2", 1.0), ("d3", 1.0), ("d4", 1.0)]
        assert system.items.search(("docs",), query="bread", limit=1)[0].key == "d1"  # one length held


def _parts(key: str, text: str) -> dict[str, object]:
    """An item whose paths hold parts of its text, no two the same (``InMemoryStore`` fails on a
    text repeated in one put: it embeds it once but files it under each of its paths)."""
    words = text.split()
    return {
        "text": f"text {key}",
        "tags": [words[0], f"tag {key}"],
        "body": {"parts": [" ".join(words[1:]), f"part {key}"]},
        "a": f"a {key}",
        "b": words[-1],
        "notes": {"x": f"note {key}", "y": " ".join(words[:2])},
    }


def _scored(hits: list[SearchItem]) -> list[tuple[str, float]]:
    """Hits best first, ties by key (the stores order ties each their own way)."""
    return sorted(((h.key, round(h.score or 0.0, 4)) for h in hits), key=lambda hit: (-hit[1], hit[0]))


def test_paths_of_langgraph_grammar_rank_as_in_langgraph_own_store(tmp_path: Path) -> None:
    """Without an ``embed``, ``fields`` and a put's ``index`` take every path LangGraph takes,
    and the system's model ranks the items as ``InMemoryStore`` does with that model."""
    model = FakeEmbedder(64)
    paths = ["tags[*]", "body.parts[0]", "{a,b}", "notes.*"]
    reference = InMemoryStore(
        index={"dims": 64, "embed": lambda texts: model.embed_documents(texts).tolist(), "fields": paths}
    )
    with (
        MemorySystem.start(Config(data_dir=tmp_path / "d"), model) as system,
        MemstrataStore(system, index={"fields": paths}) as store,
    ):
        for key, text in DOCS.items():
            for target in (store, reference):
                target.put(("docs",), key, _parts(key, text))
                target.put(("picked",), key, {"tags": [text, f"tag {key}"]}, index=["tags[0]"])
        for query in (*DOCS.values(), "bread garden", "stone roof key", "tag d2"):
            for prefix in (("docs",), ("picked",)):
                ours, theirs = (_scored(s.search(prefix, query=query)) for s in (store, reference))
                assert ours == theirs, (query, prefix)
        assert [h.key for h in store.search(("picked",), query=DOCS["d2"], limit=1)] == ["d2"]


def test_index_dims_must_be_the_system_model_length(tmp_path: Path) -> None:
    with (
        MemorySystem.start(Config(data_dir=tmp_path / "d"), FakeEmbedder(64)) as system,
        pytest.raises(InvalidInputError, match=r"index dims 32 .* 'fake-bow' gives 64"),
    ):
        MemstrataStore(system, index={"dims": 32, "fields": ["text"]})
