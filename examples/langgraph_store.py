"""A LangGraph graph whose nodes write to and read from memstrata's store (no network).

Run: ``python examples/langgraph_store.py [data-dir]`` (a temporary one without it).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore

from memstrata.integrations.langgraph import MemstrataStore
from memstrata.testing import HashEmbedder

_EMBEDDER = HashEmbedder(dim=64)  # deterministic, offline; a real graph would pass its model


def embed(texts: Sequence[str]) -> list[list[float]]:
    return [[float(x) for x in _EMBEDDER.embed_query(t)] for t in texts]


class State(TypedDict):
    user: str
    note: str
    recalled: list[str]


def remember(state: State, *, store: BaseStore) -> dict[str, object]:
    """Writes the user's note under their namespace."""
    namespace = ("notes", state["user"])
    key = f"n{len(store.search(namespace, limit=1000))}"
    store.put(namespace, key, {"text": state["note"]})
    return {}


def recall(state: State, *, store: BaseStore) -> dict[str, object]:
    """Reads back the notes closest to the current one."""
    hits = store.search(("notes", state["user"]), query=state["note"], limit=2)
    return {"recalled": [h.value["text"] for h in hits]}


def build(store: BaseStore) -> object:
    graph = StateGraph(State)
    graph.add_node("remember", remember)
    graph.add_node("recall", recall)
    graph.add_edge(START, "remember")
    graph.add_edge("remember", "recall")
    graph.add_edge("recall", END)
    return graph.compile(store=store)


def main(path: str = ":memory:") -> list[str]:
    with MemstrataStore.from_conn_string(
        path, index={"dims": 64, "embed": embed, "fields": ["text"]}
    ) as store:
        app = build(store)
        for note in ["water the tomatoes on friday", "renew the car insurance", "tomatoes need more sun"]:
            result = app.invoke({"user": "ada", "note": note, "recalled": []})  # type: ignore[attr-defined]
        recalled: list[str] = result["recalled"]
        print("recalled:", recalled)
        return recalled


if __name__ == "__main__":
    main(*sys.argv[1:2])
