"""A LangGraph store without an ``embed`` of its own uses the system's model: its vectors are that
model's, so after the system's model changes they are computed again (as AutoGen's are), never
ranked against another model's query, and never left at another length."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

pytest.importorskip("langgraph.store.base", reason="the langgraph extra is not installed")

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


def _write(data: Path, model: FakeEmbedder, index: dict[str, object]) -> None:
    with (
        MemorySystem.start(Config(data_dir=data), model) as system,
        MemstrataStore(system, index=index) as store,
    ):
        for key, text in DOCS.items():
            store.put(("docs",), key, {"text": text, "meta": {"title": text}})


def _top_hits(system: MemorySystem, index: dict[str, object]) -> list[tuple[str, float]]:
    with MemstrataStore(system, index=index) as store:
        found = [store.search(("docs",), query=text, limit=1)[0] for text in DOCS.values()]
        store.put(("docs",), "d4", {"text": "violet meadow", "meta": {"title": "violet meadow"}})
        found.append(store.search(("docs",), query="violet meadow", limit=1)[0])
    return [(hit.key, round(hit.score or 0.0, 4)) for hit in found]


@pytest.mark.parametrize("fields", [["text"], ["meta.title"]])
def test_another_model_of_the_same_length_ranks_by_its_own_vectors(tmp_path: Path, fields: list[str]) -> None:
    index = {"fields": fields}
    _write(tmp_path / "d", FakeEmbedder(64, model_id="fake-a"), index)
    model = RolledEmbedder(64, model_id="fake-rolled")
    with MemorySystem.start(Config(data_dir=tmp_path / "d"), model) as system:
        assert _top_hits(system, index) == [("d0", 1.0), ("d1", 1.0), ("d2", 1.0), ("d3", 1.0), ("d4", 1.0)]
    assert model.texts_embedded == len(DOCS) + 1  # the four computed again, and the new one


def test_another_model_of_another_length_takes_over_the_store(tmp_path: Path) -> None:
    index = {"fields": ["text"]}
    _write(tmp_path / "d", FakeEmbedder(64, model_id="fake-a"), index)
    with MemorySystem.start(Config(data_dir=tmp_path / "d"), FakeEmbedder(32, model_id="fake-b")) as system:
        assert _top_hits(system, index) == [("d0", 1.0), ("d1", 1.0), ("d2", 1.0), ("d3", 1.0), ("d4", 1.0)]
        assert system.items.search(("docs",), query="bread", limit=1)[0].key == "d1"  # one length held


def test_paths_the_item_store_cannot_read_again_need_the_index_own_embed(tmp_path: Path) -> None:
    with MemorySystem.start(Config(data_dir=tmp_path / "d"), FakeEmbedder(64)) as system:
        for path in ("tags[*]", "body.parts[0]", "{a,b}", "notes.*"):
            with pytest.raises(
                InvalidInputError, match=rf"index field {re.escape(repr(path))} needs .*\"embed\""
            ):
                MemstrataStore(system, index={"fields": ["text", path]})
        with MemstrataStore(system, index={"fields": ["text"]}) as store:
            with pytest.raises(InvalidInputError, match=r"index field 'tags\[0\]' .*\"embed\""):
                store.put(("docs",), "k", {"tags": ["a"]}, index=["tags[0]"])
            assert store.get(("docs",), "k") is None
        with pytest.raises(InvalidInputError, match=r"index dims 32 .* 'fake-bow' gives 64"):
            MemstrataStore(system, index={"dims": 32, "fields": ["text"]})
