"""The tool dispatcher against a running system (fake embedder) and a real file index."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memstrata import Config, MemorySystem
from memstrata._workspaces import Workspaces
from memstrata.bridges import tools
from memstrata.core.constants import MAX_TAG_KEY_CHARS
from tests._support import write_tree
from tests.fakes import FakeEmbedder


@pytest.fixture
def env(system_and_files: tuple[MemorySystem, Workspaces]) -> tuple[MemorySystem, Workspaces]:
    return system_and_files


def call(env: tuple[MemorySystem, Workspaces], name: str, arguments: Any, agent_id: str = "a1") -> Any:
    system, registry = env
    return tools.dispatch(name, arguments, system, agent_id=agent_id, workspaces=registry)


def test_empty_index_says_so(env: Any) -> None:
    result = call(env, "memory_search", {"query": "anything at all"})
    assert result["hits"] == [] and result["complete"] is True
    assert "no memories indexed yet" in result["warnings"][0]
    assert "no memories indexed yet" in call(env, "memory_get", {"path": "MEMORY.md"})["error"]


def test_add_search_get_list_delete(env: Any) -> None:
    first = {
        "content": "Line one about ferrets\nLine two\nLine three",
        "scope": "/pets",
        "tags": ["kind=fact"],
    }
    added = call(env, "memory_add", first)
    assert added["saved"] is True and added["path"] == f"memory://{added['id']}"
    saved = call(
        env, "memory_save", '{"content": "The office plant needs water on Fridays", "source": "chat"}'
    )
    hits = call(env, "memory_search", {"query": "ferrets"})["hits"]
    assert hits[0]["path"] == added["path"] and hits[0]["startLine"] == 1 and hits[0]["endLine"] == 3
    assert call(env, "memory_get", {"path": added["path"], "from": 2, "lines": 1})["text"] == "Line two"
    listed = call(env, "memory_list", {})
    assert [m["id"] for m in listed] == [saved["id"], added["id"]]  # newest first
    assert listed[0]["tags"] == {"source": "chat"}
    assert [m["id"] for m in call(env, "memory_list", {"scope": "/pets"})] == [added["id"]]
    assert [m["id"] for m in call(env, "memory_list", {"tags": ["kind=fact"]})] == [added["id"]]
    assert [m["id"] for m in call(env, "memory_list", {"limit": 1, "offset": 1})] == [added["id"]]
    assert call(env, "memory_delete", {"id": str(added["id"])}) == {"id": added["id"], "deleted": True}
    assert "no saved memory" in call(env, "memory_delete", {"id": added["id"]})["error"]
    assert [m["id"] for m in call(env, "memory_list", {})] == [saved["id"]]
    assert call(env, "memory_delete", {"id": saved["path"]})["deleted"] is True


def test_memories_belong_to_their_agent(env: Any) -> None:
    mine = call(env, "memory_add", {"content": "private note of a1"}, agent_id="a1")
    assert call(env, "memory_list", {}, agent_id="a2") == []
    assert "no saved memory" in call(env, "memory_get", {"path": mine["path"]}, agent_id="a2")["error"]
    assert "no saved memory" in call(env, "memory_delete", {"id": mine["id"]}, agent_id="a2")["error"]


def test_memory_tools_do_not_touch_other_knowledge(env: Any) -> None:
    stored = call(env, "knowledge_store", {"content": "Never deploy on Friday", "category": "pitfall"})
    assert stored["store"] == "a1"
    assert "no saved memory" in call(env, "memory_delete", {"id": stored["id"]})["error"]
    assert "no saved memory" in call(env, "memory_get", {"path": f"memory://{stored['id']}"})["error"]
    hits = call(env, "knowledge_query", {"query": "deploy friday", "category": "pitfall", "top_k": 3})["hits"]
    assert hits[0]["id"] == stored["id"] and hits[0]["match_type"] in ("hybrid", "keyword", "semantic")
    assert hits[0]["store"] == "a1"


def test_any_well_formed_category_is_accepted(env: Any) -> None:
    stored = call(env, "knowledge_store", {"content": "Plan the schema first", "category": "planning-pitfall",
                                           "tags": ["area=db", "urgent"]})  # fmt: skip
    hits = call(env, "knowledge_query", {"query": "schema plan", "category": "planning-pitfall"})["hits"]
    assert hits[0]["id"] == stored["id"] and hits[0]["tags"] == {"area": "db", "urgent": ""}


def test_search_merges_files_and_saved_memories(env: Any, tmp_path: Path) -> None:
    _, registry = env
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Garden\n\nTomatoes need full sun.\n", encoding="utf-8")
    (root / "memory" / "2025-05-01.md").write_text("Planted basil next to the tomatoes.\n", encoding="utf-8")
    registry.index(root)
    call(env, "memory_add", {"content": "Tomatoes were late this year"})
    hits = call(env, "memory_search", {"query": "tomatoes", "maxResults": 10, "minScore": 0})["hits"]
    paths = {h["path"] for h in hits}
    assert str(root.resolve() / "MEMORY.md") in paths
    assert any(p.startswith("memory://") for p in paths)
    assert hits == sorted(hits, key=lambda h: -h["score"])
    assert len(call(env, "memory_search", {"query": "tomatoes", "maxResults": 1})["hits"]) == 1
    got = call(env, "memory_get", {"path": "memory/2025-05-01.md"})
    assert got["text"] == "Planted basil next to the tomatoes." and got["from"] == 1
    outside = call(env, "memory_get", {"path": "../../etc/passwd"})
    assert "error" in outside


def test_a_saved_memory_has_the_lines_memory_get_reads(env: Any) -> None:
    """Lines end at \\n, \\r\\n and \\r, as in memory files; a form feed or a line separator
    is text: the range a search gives reads the whole memory back."""
    content = "Deploy steps: build\x0cthen push\u2028then tag\r\nrelease\rdone\n"
    added = call(env, "memory_add", {"content": content})
    hit = call(env, "memory_search", {"query": "deploy steps"})["hits"][0]
    assert (hit["path"], hit["startLine"], hit["endLine"]) == (added["path"], 1, 3)
    got = call(env, "memory_get", {"path": added["path"], "from": 1, "lines": 3})
    assert (
        got["lines"] == 3 and got["text"] == "Deploy steps: build\x0cthen push\u2028then tag\nrelease\ndone"
    )


def test_a_scope_keeps_its_best_files_when_better_ones_lie_outside_it(env: Any, tmp_path: Path) -> None:
    _, registry = env
    notes = {f"memory/n{i}.md": "gateway retries gateway retries gateway\n" for i in range(8)}
    root = write_tree(tmp_path / "ws", {**notes, "memory/sub/target.md": "one gateway note\n"})
    registry.index(root)
    args = {"query": "gateway retries", "maxResults": 3, "minScore": 0}
    assert all("/memory/sub/" not in h["path"] for h in call(env, "memory_search", args)["hits"])
    scoped = call(env, "memory_search", {**args, "scope": "/memory/sub"})["hits"]
    assert [h["path"] for h in scoped] == [str(root.resolve() / "memory/sub/target.md")]


class _Synonyms(FakeEmbedder):
    """ "automobile" means "car": a match by meaning that shares no word."""

    def _vector(self, text: str) -> Any:
        return super()._vector(text.lower().replace("automobile", "car"))


def test_a_source_tree_gets_a_similarity_floor_only_when_one_is_given(data_dir: Path, tmp_path: Path) -> None:
    """As ``memstrata search`` and ``search_files``: code embeds with lower similarities than
    prose, so the default floor of memory files would drop its matches by meaning."""
    embedder = _Synonyms()
    root = write_tree(tmp_path / "src", {"garage.py": "def park(car):\n    return car\n"})
    query = {"query": "automobile storage lookup policy handler"}
    with (
        MemorySystem.start(Config(data_dir=data_dir), embedder=embedder) as system,
        Workspaces(data_dir, config=system.config, embedder=embedder) as registry,
    ):
        registry.index(root, kind="code")
        [hit] = call((system, registry), "memory_search", query)["hits"]
        assert hit["path"].endswith("garage.py") and hit["score"] > 0
        assert call((system, registry), "memory_search", {**query, "minScore": 0.9})["hits"] == []


def test_memory_get_counts_a_blank_line_and_refuses_a_lone_surrogate(env: Any, tmp_path: Path) -> None:
    _, registry = env
    root = tmp_path / "ws"
    root.mkdir()
    (root / "MEMORY.md").write_text("# Garden\n\n\nTomatoes need full sun.\n", encoding="utf-8")
    registry.index(root)
    blank = call(env, "memory_get", {"path": "MEMORY.md", "from": 2, "lines": 2})
    assert (blank["lines"], blank["text"]) == (2, "\n")
    past = call(env, "memory_get", {"path": "MEMORY.md", "from": 5, "lines": 2})
    assert (past["lines"], past["text"]) == (0, "")
    for path in ("MEMORY\ud800.md", f"{root}/\udfff/MEMORY.md"):
        error = call(env, "memory_get", {"path": path})["error"]
        assert error.startswith("memory_get: path must be valid UTF-8 text (no lone surrogates), got '")
        assert "codec" not in error and "\n" not in error


@pytest.mark.parametrize(
    "query",
    [
        '" OR 1=1 -- NEAR(a b) AND title:*',
        "nul\x00byte",
        "lone \udc80 surrogate",
        "长期记忆 🚀",
        "q" * 100_000,
        "\t\n\r ",
    ],
)
def test_hostile_queries_return_lists(env: Any, query: str) -> None:
    call(env, "memory_add", {"content": "something to find"})
    for name, args in (
        ("memory_search", {"query": query}),
        ("knowledge_query", {"query": query}),
    ):
        result = call(env, name, args)
        assert isinstance(result.get("hits"), list) or set(result) == {"error"}, result


def test_hostile_content_round_trips(env: Any) -> None:
    content = "quotes \" ' and NUL \x00 and 中文 and 🚀 " + "z" * 10_000
    added = call(env, "memory_add", {"content": content})
    assert call(env, "memory_get", {"path": added["path"], "lines": 10})["text"] == content
    too_big = call(env, "memory_add", {"content": "x" * 4_000_001})
    assert "too long" in too_big["error"]


def test_json_text_keeps_every_64_bit_integer_exactly(env: Any) -> None:
    value = f'{{"low": {-(2**63)}, "high": {2**63 - 1}, "digits": "{10**30}", "f": 1.0000000000000000000001}}'
    assert call(env, "item_put", {"namespace": ["n"], "key": "k", "value": value}) == {
        "namespace": ["n"],
        "key": "k",
    }
    stored = call(env, "item_get", {"namespace": ["n"], "key": "k"})["value"]
    assert stored == {"low": -(2**63), "high": 2**63 - 1, "digits": str(10**30), "f": 1.0}
    assert type(stored["low"]) is int and type(stored["high"]) is int
    refused = call(env, "working_set", {"key": "k", "value": str(2**63)})
    assert f"integer {2**63} is outside the 64-bit range" in refused["error"]
    assert call(env, "working_get", {"key": "k"})["found"] is False


def test_arguments_as_text_or_bytes_are_read_as_memstrata_serve_reads_them(env: Any) -> None:
    """What a model writes: escaped lone surrogates are read, as from a dict; bytes that are not
    UTF-8 are refused by place, never stored with replacement characters."""
    as_dict = call(env, "knowledge_store", {"content": "caf\udc80 au lait", "category": "note"})
    as_text = call(env, "knowledge_store", '{"content": "caf\\udc80 au lait", "category": "note"}')
    assert "error" not in as_dict and as_text == as_dict  # the same content: the same entry
    refused = call(env, "knowledge_store", b'{"content": "caf\xe9 au lait", "category": "note"}')
    assert refused == {"error": "knowledge_store: arguments are not valid JSON: invalid UTF-8 at byte 16"}
    assert len(env[0].agent("a1").list_knowledge()) == 1


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("[" * 70 + "]" * 70, "argument 'value': nested deeper than 64 levels"),
        ("[" * 1100 + "]" * 1100, "argument 'value': depth limit exceeded"),
    ],
)
def test_a_json_value_too_deep_is_refused_not_stored_as_its_text(env: Any, value: str, error: str) -> None:
    for name, arguments in (
        ("working_set", {"key": "k", "value": value}),
        ("blackboard_publish", {"session_id": "s1", "key": "k", "value": value}),
    ):
        result = call(env, name, arguments)
        assert error in result.get("error", ""), (name, result)
    assert call(env, "working_get", {"key": "k"})["found"] is False
    assert call(env, "working_set", {"key": "k", "value": "[1, 2"})["stored"] is True  # not JSON: the text
    assert call(env, "working_get", {"key": "k"})["value"] == "[1, 2"


def test_a_tag_key_beyond_its_limit_is_refused_by_name(env: Any) -> None:
    key = "k" * (MAX_TAG_KEY_CHARS + 1)
    result = call(env, "knowledge_store", {"content": "x", "category": "pattern", "tags": [f"{key}=v"]})
    assert set(result) == {"error"}
    assert "tags key 'kkkk" in result["error"] and f"1-{MAX_TAG_KEY_CHARS} characters" in result["error"]
    assert call(env, "knowledge_list", {}) == []
