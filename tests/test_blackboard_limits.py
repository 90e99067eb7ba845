"""What the blackboard accepts: values up to ``max_content_bytes`` (the working-memory rule),
list prefixes written as subscriptions write them (``"agent:*"``), and JSON data only (no
object that orjson would quietly write as another type), through every door."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import io
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from memstrata import Config, MemorySystem
from memstrata._workspaces import Workspaces
from memstrata.bridges._app import CliState
from memstrata.bridges._methods import build_methods
from memstrata.bridges._server import JsonLinesServer
from memstrata.bridges.cli import cli
from memstrata.core.validation import check_json_value
from memstrata.errors import InvalidInputError
from memstrata.layers import BlackboardState, WorkingMemory
from memstrata.messages import ListSignals, PublishSignal
from tests._support import cli_fails, cli_ok
from tests.fakes import FakeEmbedder


@pytest.fixture
def system(data_dir: Path) -> Iterator[MemorySystem]:
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as running:
        yield running


# -- size ---------------------------------------------------------------------------------------


def test_a_value_over_the_limit_is_refused_with_the_working_memory_message() -> None:
    board = BlackboardState(max_value_bytes=10)
    assert board.publish("k", "x" * 8)[0].version == 1  # '"xxxxxxxx"': 10 bytes of JSON
    with pytest.raises(InvalidInputError) as refused:
        board.publish("k", "x" * 9)
    with pytest.raises(InvalidInputError) as working:
        WorkingMemory(max_value_bytes=10).set("k", "x" * 9)
    assert str(refused.value) == "blackboard value for 'k' is 11 bytes, more than the limit of 10"
    assert str(refused.value) == str(working.value).replace("working memory", "blackboard")
    record = board.get("k")
    assert record is not None and (record.value, record.version) == ("x" * 8, 1)  # nothing changed


def test_the_limit_counts_utf8_bytes_and_no_limit_means_none() -> None:
    with pytest.raises(InvalidInputError, match="is 8 bytes"):
        BlackboardState(max_value_bytes=7).publish("k", "ééé")  # 3 characters, 6 bytes + quotes
    assert BlackboardState().publish("k", "x" * 100_000)[0].version == 1


# -- list prefixes ------------------------------------------------------------------------------


def test_list_reads_a_trailing_star_as_subscribe_does() -> None:
    board = BlackboardState()
    for key in ("agent:a1", "agent:a2", "other"):
        board.publish(key, 1)
    _, under = board.subscribe("agent:*")
    assert [r.key for r in under] == board.list("agent:*") == board.list("agent:") == ["agent:a1", "agent:a2"]
    assert board.list("*") == board.list("") == board.list() == ["agent:a1", "agent:a2", "other"]
    assert board.list("agent:a1") == ["agent:a1"]  # a bare prefix, as before


@pytest.mark.parametrize("prefix", ["a*b", "**", "agent:**", "*a"])
def test_a_star_elsewhere_in_a_list_prefix_is_refused_in_one_line(prefix: str) -> None:
    with pytest.raises(InvalidInputError, match=r"only at the end") as refused:
        BlackboardState().list(prefix)
    assert "\n" not in str(refused.value) and "blackboard prefix" in str(refused.value)
    with pytest.raises(InvalidInputError, match=r"^ListSignals.prefix may contain '\*' only at the end"):
        ListSignals(prefix, "s1")  # refused in the caller's thread


def test_every_door_lists_keys_under_a_star_prefix(system: MemorySystem, data_dir: Path) -> None:
    board = system.blackboard("s1")
    board.publish("agent:a1", "idle", wait=True)
    board.publish("other", 1, wait=True)
    assert board.list("agent:*") == ["agent:a1"]
    assert board.list("*") == ["agent:a1", "other"]
    with pytest.raises(InvalidInputError, match=r"only at the end"):
        board.list("a*b")

    requests = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "list_signals",
            "params": {"session_id": "s1", "prefix": "agent:*"},
        },
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "list_signals",
            "params": {"session_id": "s1", "prefix": "a*b"},
        },
    ]
    out = io.BytesIO()
    with Workspaces.open(data_dir, embedder=FakeEmbedder()) as workspaces:
        server = JsonLinesServer(build_methods(system, workspaces), workers=1)
        server.serve(io.BytesIO(b"".join(orjson.dumps(r) + b"\n" for r in requests)), out)
    answers = {m["id"]: m for m in map(orjson.loads, out.getvalue().splitlines())}
    assert answers[1]["result"] == ["agent:a1"]
    assert "only at the end" in answers[2]["error"]["message"]


def test_the_cli_lists_keys_under_a_star_prefix(tmp_path: Path) -> None:
    config = tmp_path / "memstrata.toml"  # the board outlives one command only when saved on stop
    config.write_text("[actors]\nblackboard_snapshot = true\n", encoding="utf-8")

    def run(*args: str) -> Any:
        common = ["--data-dir", str(tmp_path / "data"), "--config", str(config)]
        return CliRunner().invoke(cli, [*common, *args], obj=CliState(embedder=FakeEmbedder()))

    cli_ok(run("board", "publish", "-s", "s1", "--key", "agent:a1", "--value", "1"))
    cli_ok(run("board", "publish", "-s", "s1", "--key", "other", "--value", "2"))
    listed = cli_ok(run("board", "list", "-s", "s1", "--prefix", "agent:*", "--json"))
    assert orjson.loads(listed.stdout) == ["agent:a1"]
    cli_fails(run("board", "list", "-s", "s1", "--prefix", "a*b"), 2, "only at the end")


# -- JSON data only -----------------------------------------------------------------------------


@dataclasses.dataclass
class Plan:
    step: int


class Color(enum.Enum):
    RED = "red"


class Field(enum.StrEnum):
    NAME = "name"


class Level(enum.IntEnum):
    HIGH = 3


@pytest.mark.parametrize(
    ("value", "kind", "where"),
    [
        (dt.datetime(2025, 1, 1, tzinfo=dt.UTC), "datetime", "value"),
        ({"on": dt.date(2025, 1, 1)}, "date", r"value\['on'\]"),
        ([1, {"id": uuid.UUID(int=1)}], "UUID", r"value\[1\]\['id'\]"),
        ({"plan": Plan(3)}, "Plan", r"value\['plan'\]"),
        ((Color.RED,), "Color", r"value\[0\]"),
        ({"a": [1, {2, 3}]}, "set", r"value\['a'\]\[1\]"),  # refused before, now as the others
    ],
)
def test_objects_orjson_would_convert_are_refused_naming_the_type_and_the_place(
    value: Any, kind: str, where: str
) -> None:
    with pytest.raises(InvalidInputError) as refused:
        check_json_value(value, "v")
    message = str(refused.value)
    assert "\n" not in message
    assert re.fullmatch(
        rf"v must be JSON-serialisable data: found a {kind} at {where} \(not JSON serializable\)", message
    )


def test_text_and_number_subclasses_stay_accepted() -> None:
    value = {Field.NAME: [Field.NAME, Level.HIGH, True]}
    assert check_json_value(value, "v") == b'{"name":["name",3,true]}'


@pytest.mark.parametrize(
    "value", [dt.datetime(2025, 1, 1, tzinfo=dt.UTC), uuid.UUID(int=1), Plan(3), Color.RED]
)
def test_publish_and_set_working_refuse_them_in_the_callers_thread(system: MemorySystem, value: Any) -> None:
    with pytest.raises(InvalidInputError, match=r"not JSON serializable"):
        system.blackboard("s1").publish("k", value)
    with pytest.raises(InvalidInputError, match=r"not JSON serializable"):
        PublishSignal("k", {"x": value})
    with pytest.raises(InvalidInputError, match=r"not JSON serializable"):
        system.agent("a1").set_working("k", value)
    assert system.blackboard("s1").get("k") is None
    assert system.agent("a1").get_working("k") is None


def test_a_published_value_over_max_content_bytes_is_refused_by_the_system(data_dir: Path) -> None:
    config = Config(data_dir=data_dir, max_content_bytes=100)
    with MemorySystem.start(config, embedder=FakeEmbedder()) as system:
        board = system.blackboard("s1")
        assert board.publish("k", "x" * 98, wait=True) == 1  # 100 bytes of JSON
        with pytest.raises(
            InvalidInputError, match=r"^blackboard value for 'k' is 101 bytes, more than the limit of 100$"
        ):
            board.publish("k", "x" * 99, wait=True)
        with pytest.raises(InvalidInputError, match="more than the limit of 100"):
            system.agent("a1").set_working("k", "x" * 99)
        assert board.get("k") == "x" * 98  # the refused value changed nothing


def test_a_value_that_holds_itself_is_refused_at_once() -> None:
    """orjson stops at its nesting limit; the walk that looks for where a value went wrong would
    never end on a cycle, so the refusal names the limit instead."""
    looped: list[object] = []
    looped.append(looped)
    mapping: dict[str, object] = {}
    mapping["self"] = mapping
    for value in (looped, mapping):
        with pytest.raises(InvalidInputError, match=r"^v must be JSON data nested at most 254 levels deep"):
            check_json_value(value, "v")
    deep: list[object] = []
    for _ in range(253):
        deep = [deep]
    assert check_json_value(deep, "v").startswith(b"[[")  # the deepest orjson writes
