"""Every registry operation from the command line (CliRunner, fake embedder): a happy path and a
bad input each, derived from the registry, so an operation added without a command (or without
a sample here) fails; plus the generated table in docs/bridges.md and progress when piped."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import orjson
import pytest
from click.testing import CliRunner, Result

from memstrata.bridges import doc_tables
from memstrata.bridges._app import CliState
from memstrata.bridges._cli_generated import command_path
from memstrata.bridges._cli_output import IndexProgress, heartbeat
from memstrata.bridges._operations import OPERATIONS, find
from memstrata.bridges.cli import cli, command_for, command_table
from tests._support import cli_fails, cli_ok
from tests.fakes import FakeEmbedder

A = ["-a", "a1"]
STORE = ["knowledge", "store", *A, "Deploys use blue-green slots", "-c", "pattern"]
REMEMBER = ["episodes", "remember", *A, "We deployed on friday", "--at", "2020-05-01T12:00:00Z"]
PUBLISH = ["board", "publish", "-s", "s1", "--key", "plan", "--value", '"ready"', "--publisher", "a1"]
SET = ["working", "set", *A, "--key", "k", "--value", '{"n": 1}', "--task-id", "t1"]
INDEX = ["index", "{ws}"]
ARCHIVE = ["episodes", "archive", *A, "--before", "2021-01-01T00:00:00Z", "--path", "{tmp}/a.sqlite"]


@dataclass
class Sample:
    """How to drive one operation: setup commands, the happy call, a check of its JSON, a bad call."""

    args: list[str]
    ok: Callable[[Any], bool]
    bad: list[str]
    needle: str
    code: int = 2
    setup: list[list[str]] = field(default_factory=list)


SAMPLES: dict[str, Sample] = {
    "store_knowledge": Sample(
        [*STORE[:-2], "-c", "pattern", "--tag", "env=prod"],
        lambda r: r["store"] == "a1" and r["id"] >= 1,
        [*STORE, "--tag", "=v"],
        "'--tag'",
    ),
    "query_knowledge": Sample(
        ["knowledge", "query", *A, "blue-green deploys"],
        lambda r: r["hits"][0]["content"] == "Deploys use blue-green slots" and r["complete"],
        ["knowledge", "query", *A, "x", "--top-k", "0"],
        "'--top-k'",
        setup=[STORE],
    ),
    "get_knowledge": Sample(
        ["knowledge", "get", *A, "--entry-id", "1"],
        lambda r: r["content"] == "Deploys use blue-green slots" and r["store"] == "a1",
        ["knowledge", "get", *A, "--entry-id", "one"],
        "'--entry-id'",
        setup=[STORE],
    ),
    "list_knowledge": Sample(
        ["knowledge", "list", *A, "--category", "pattern"],
        lambda r: [e["id"] for e in r] == [1],
        ["knowledge", "list", *A, "--limit", "-1"],
        "'--limit'",
        setup=[STORE],
    ),
    "update_knowledge": Sample(
        ["knowledge", "update", *A, "--entry-id", "1", "--content", "Deploys use canaries"],
        lambda r: r["content"] == "Deploys use canaries" and r["id"] == 1,
        ["knowledge", "update", *A, "--entry-id", "1", "--store", "someone-else"],
        "store must be",
        setup=[STORE],
    ),
    "delete_knowledge": Sample(
        ["knowledge", "delete", *A, "--entry-id", "1"],
        lambda r: r["deleted"] is True,
        ["knowledge", "delete", *A],
        "Missing option '--entry-id'",
        setup=[STORE],
    ),
    "remember": Sample(
        [*REMEMBER[:-2], "--title", "deploy", "--tag", "env=prod"],
        lambda r: r["id"] >= 1,
        [*REMEMBER[:-1], "yesterday"],
        "'--at'",
    ),
    "recall": Sample(
        ["episodes", "recall", *A, "friday deploy", "--since", "2019-01-01T00:00:00Z"],
        lambda r: r["hits"][0]["content"] == "We deployed on friday",
        ["episodes", "recall", *A, "x", "--since", "2019-01-01T00:00:00"],
        "time zone",
        setup=[REMEMBER],
    ),
    "list_episodes": Sample(
        ["episodes", "list", *A, "--no-newest-first", "--limit", "5"],
        lambda r: [e["content"] for e in r] == ["We deployed on friday"],
        ["episodes", "list", *A, "--offset", "-1"],
        "'--offset'",
        setup=[REMEMBER],
    ),
    "get_episode": Sample(
        ["episodes", "get", *A, "--episode-id", "1"],
        lambda r: r["content"] == "We deployed on friday",
        ["episodes", "get", *A, "--episode-id", "0"],
        "'--episode-id'",
        setup=[REMEMBER],
    ),
    "delete_episode": Sample(
        ["episodes", "delete", *A, "--episode-id", "1"],
        lambda r: r["deleted"] is True,
        ["episodes", "delete", "--episode-id", "1"],
        "Missing option '--agent'",
        setup=[REMEMBER],
    ),
    "archive_episodes": Sample(
        ARCHIVE,
        lambda r: r["archived"] == 1 and r["path"].endswith("a.sqlite"),
        [*ARCHIVE[:5], "soon"],
        "'--before'",
        setup=[REMEMBER],
    ),
    "restore_episodes": Sample(
        ["episodes", "restore", *A, "{tmp}/a.sqlite"],
        lambda r: r["restored"] == 1,
        ["episodes", "restore", *A],
        "Missing argument 'PATH'",
        setup=[REMEMBER, ARCHIVE],
    ),
    "promote_episode": Sample(
        ["episodes", "promote", *A, "--episode-id", "1", "-c", "outcome"],
        lambda r: r["content"] == "We deployed on friday" and r["category"] == "outcome",
        ["episodes", "promote", *A, "--episode-id", "1", "-c", "Bad Cat"],
        "category",
        setup=[REMEMBER],
    ),
    "begin_task": Sample(
        ["tasks", "begin", *A, "--task-id", "t1", "--description", "fix the deploy slots"],
        lambda r: "text" in r and "hits" in r,
        ["tasks", "begin", *A, "--task-id", "t1"],
        "Missing option '--description'",
        setup=[STORE],
    ),
    "complete_task": Sample(
        ["tasks", "complete", *A, "--task-id", "t1", "--summary", "Slots fixed by a restart"],
        lambda r: r["queued"] is True and r["task_id"] == "t1",
        ["tasks", "complete", *A, "--task-id", "t1", "--summary"],
        "'--summary' requires an argument",
    ),
    "fail_task": Sample(
        ["tasks", "fail", *A, "--task-id", "t2", "--reason", "The slot was locked"],
        lambda r: r["queued"] is True and r["task_id"] == "t2",
        ["tasks", "fail", *A, "--reason", "x"],
        "Missing option '--task-id'",
    ),
    "set_working": Sample(
        [*SET, "--ttl-s", "60"],
        lambda r: r == {"key": "k", "stored": True},
        [*SET[:-4], "--value", "not json"],
        "'--value'",
    ),
    # working memory lives in the running system: each CLI call is a system of its own, so the
    # key set by the setup call is gone (`memstrata serve` keeps it between calls)
    "get_working": Sample(
        ["working", "get", *A, "--key", "k", "--task-id", "t1"],
        lambda r: r == {"key": "k", "found": False, "value": None},
        ["working", "get", *A, "--key", "k", "--ttl-s", "1"],
        "No such option '--ttl-s'",
        setup=[SET],
    ),
    "clear_working": Sample(
        ["working", "clear", *A, "--task-id", "t1"],
        lambda r: r == {"removed": 0},
        ["working", "clear", *A, "--key", "k", "--ttl-s", "0"],
        "No such option",
        setup=[SET],
    ),
    "publish": Sample(
        PUBLISH,
        lambda r: r["key"] == "plan" and r["version"] >= 1,
        [*PUBLISH[:-4], "ready"],
        "'--value'",
    ),
    "get_signal": Sample(
        ["board", "get", "-s", "s1", "--key", "plan"],
        lambda r: r["found"] and r["value"] == "ready" and r["publisher"] == "a1",
        ["board", "get", "--key", "plan"],
        "Missing option '--session'",
        setup=[PUBLISH],
    ),
    "list_signals": Sample(
        ["board", "list", "-s", "s1", "--prefix", "pl"],
        lambda r: r == ["plan"],
        ["board", "list", "-s", "s1", "--prefix"],
        "'--prefix' requires an argument",
        setup=[PUBLISH],
    ),
    "delete_signal": Sample(
        ["board", "delete", "-s", "s1", "--key", "plan"],
        lambda r: r["deleted"] is True,
        ["board", "delete", "-s", "s1"],
        "Missing option '--key'",
        setup=[PUBLISH],
    ),
    "subscribe": Sample(
        ["board", "watch", "-s", "s1", "pl*", "--count", "1"],
        lambda r: r["key"] == "plan" and r["value"] == "ready" and r["session_id"] == "s1",
        ["board", "watch", "-s", "s1", "plan", "--count", "0"],
        "'--count'",
        setup=[PUBLISH],
    ),
    "index": Sample(
        INDEX,
        lambda r: r["kind"] == "memory" and r["stats"]["files_processed"] == 1,
        ["index", "{tmp}/no/such/folder"],
        "does not exist",
    ),
    "list_roots": Sample(
        ["roots", "list"],
        lambda r: [w["kind"] for w in r] == ["memory"],
        ["roots", "list", "extra"],
        "unexpected extra argument",
        setup=[INDEX],
    ),
    "forget_root": Sample(
        ["roots", "forget", "{ws}", "--kind", "memory"],
        lambda r: r["removed"] == 1,
        ["roots", "forget", "{ws}", "--kind", "notes"],
        "'--kind'",
        setup=[INDEX],
    ),
    "search_files": Sample(
        ["search", "standup time"],
        lambda r: "nine thirty" in r[0]["snippet"],
        ["search", "standup", "--top-k", "0"],
        "'--top-k'",
        setup=[INDEX],
    ),
    "get_file": Sample(
        ["get", "{ws}/MEMORY.md", "--from", "3", "--lines", "1"],
        lambda r: r["text"] == "The standup is at nine thirty.",
        ["get", "{ws}/MEMORY.md", "--from", "0"],
        "'--from'",
        setup=[INDEX],
    ),
    "status": Sample(
        ["status"], lambda r: "storage" in r and "system" in r, ["status", "--bogus"], "--bogus"
    ),
    "export": Sample(
        ["export", "{tmp}/e.jsonl"],
        lambda r: r["lines"] == 2,  # a header line and the entry
        ["export", "{tmp}/no/such/e.jsonl"],
        "does not exist",
        setup=[STORE],
    ),
    "import": Sample(
        ["import", "{tmp}/e.jsonl"],
        lambda r: r["knowledge"] == 1,
        ["import", "{tmp}/missing.jsonl"],
        "does not exist",
        setup=[STORE, ["export", "{tmp}/e.jsonl"], ["knowledge", "delete", *A, "--entry-id", "1"]],
    ),
}
SAMPLES["unsubscribe"] = SAMPLES["subscribe"]  # `board watch` subscribes and unsubscribes
NS = ["--namespace", "users", "--namespace", "u1"]
PUT_ITEM = [
    "items",
    "put",
    *NS,
    "--key",
    "k1",
    "--value",
    '{"text": "likes green tea", "n": 2}',
    "--index",
    "text",
]
SAMPLES.update(
    {
        "put_item": Sample(
            PUT_ITEM,
            lambda r: r == {"namespace": ["users", "u1"], "key": "k1"},
            [*PUT_ITEM[:-4], "--value", "[1]"],
            "'--value'",
        ),
        "get_item": Sample(
            ["items", "get", *NS, "--key", "k1"],
            lambda r: r["value"] == {"text": "likes green tea", "n": 2} and r["namespace"] == ["users", "u1"],
            ["items", "get", "--key", "k1"],
            "--namespace",
            setup=[PUT_ITEM],
        ),
        "search_items": Sample(
            [
                "items",
                "search",
                "--prefix",
                "users",
                "--query",
                "green tea",
                "--filter",
                '{"n": {"$gte": 2}}',
            ],
            lambda r: [i["key"] for i in r] == ["k1"] and r[0]["score"] is not None,
            ["items", "search", "--limit", "-1"],
            "'--limit'",
            setup=[PUT_ITEM],
        ),
        "delete_item": Sample(
            ["items", "delete", *NS, "--key", "k1"],
            lambda r: r["deleted"] is True,
            ["items", "delete", "--namespace", "", "--key", "k1"],
            "'--namespace'",
            setup=[PUT_ITEM],
        ),
        "list_namespaces": Sample(
            ["items", "list", "--prefix", "users"],
            lambda r: r == [["users", "u1"]],
            ["items", "list", "--max-depth", "0"],
            "'--max-depth'",
            setup=[PUT_ITEM],
        ),
    }
)


@pytest.fixture
def run(tmp_path: Path, fake_embedder: FakeEmbedder) -> Callable[..., Result]:
    data = tmp_path / "data"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "MEMORY.md").write_text("# Notes\n\nThe standup is at nine thirty.\n", encoding="utf-8")
    config = tmp_path / "memstrata.toml"  # blackboards outlive one command only when saved on stop
    config.write_text("[actors]\nblackboard_snapshot = true\n", encoding="utf-8")

    def invoke(*args: str, json: bool = True) -> Result:
        words = [a.replace("{tmp}", str(tmp_path)).replace("{ws}", str(workspace)) for a in args]
        return CliRunner().invoke(
            cli,
            ["--data-dir", str(data), "--config", str(config), *words, *(["--json"] if json else [])],
            obj=CliState(embedder=fake_embedder),
        )

    return invoke


def test_every_operation_has_a_command_and_a_sample() -> None:
    for op in OPERATIONS:
        command = command_for(op.name)
        assert command.name == command_path(op)[-1]
        assert op.name in SAMPLES, f"add a CLI sample for the new operation {op.name!r}"
        assert SAMPLES[op.name].args[: len(command_path(op))] == list(command_path(op)), op.name
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help, f"{op.name}: option {param.opts} has no help"
    assert set(SAMPLES) == {op.name for op in OPERATIONS}


@pytest.mark.parametrize("name", [op.name for op in OPERATIONS])
def test_every_operation_runs_and_refuses_bad_input(run: Callable[..., Result], name: str) -> None:
    sample = SAMPLES[name]
    for setup in sample.setup:
        cli_ok(run(*setup))
    result = cli_ok(run(*sample.args))
    out = result.stdout
    document = orjson.loads(out.splitlines()[0] if find(name).push else out)
    assert sample.ok(document), (name, document)
    if not find(name).destructive:
        assert cli_ok(run(*sample.args, json=False)).stdout.strip(), name  # the human form too
    cli_fails(run(*sample.bad, json=False), sample.code, sample.needle)


@pytest.mark.parametrize(
    "args",
    [
        ["knowledge", "get", *A, "--entry-id", "7"],
        ["episodes", "get", *A, "--episode-id", "7"],
    ],
)
def test_a_get_of_a_missing_id_exits_1_naming_it(run: Callable[..., Result], args: list[str]) -> None:
    cli_ok(run(*STORE))
    cli_ok(run(*REMEMBER))
    result = run(*args)
    cli_fails(result, 1, f"{args[-2][2:].replace('-', '_')} 7")
    assert orjson.loads(result.stdout) is None


def test_an_unset_key_answers_found_false_with_exit_0(run: Callable[..., Result]) -> None:
    unset = orjson.loads(cli_ok(run("board", "get", "-s", "s1", "--key", "nope")).stdout)
    assert unset["found"] is False and unset["value"] is None
    assert "found: false" in cli_ok(run("board", "get", "-s", "s1", "--key", "nope", json=False)).stdout


def test_reads_of_an_unknown_agent_create_nothing(run: Callable[..., Result], tmp_path: Path) -> None:
    assert orjson.loads(cli_ok(run("knowledge", "list", "-a", "nobody")).stdout) == []
    assert orjson.loads(cli_ok(run("episodes", "list", "-a", "nobody")).stdout) == []
    found = orjson.loads(cli_ok(run("knowledge", "query", "-a", "nobody", "x", "--include-shared")).stdout)
    assert found == {"hits": [], "complete": True, "degraded": None, "warnings": []}
    cli_fails(run("knowledge", "get", "-a", "nobody", "--entry-id", "1"), 1, "entry_id 1")
    assert cli_ok(run("roots", "list")).stdout.strip() == "[]"
    assert not (tmp_path / "data").exists()


def test_shared_store_round_trip(run: Callable[..., Result]) -> None:
    stored = orjson.loads(cli_ok(run("knowledge", "store", *A, "Team rule: review twice", "--shared")).stdout)
    assert stored["store"] == "shared"
    listed = orjson.loads(cli_ok(run("knowledge", "list", *A, "--store", "shared")).stdout)
    assert [e["store"] for e in listed] == ["shared"]
    text = cli_ok(run("knowledge", "list", *A, "--store", "shared", json=False)).stdout
    assert "shared" in text and "Team rule: review twice" in text


def test_tags_given_as_an_empty_object_clear_an_entrys_tags(run: Callable[..., Result]) -> None:
    """The operation's ``{}`` clears the tags; the command line writes it ``--tag '{}'``."""
    cli_ok(run(*STORE, "--tag", "module=payment", "--tag", "urgent"))
    kept = orjson.loads(cli_ok(run("knowledge", "update", *A, "--entry-id", "1", "--scope", "/pay")).stdout)
    assert kept["tags"] == {"module": "payment", "urgent": ""}
    cleared = orjson.loads(cli_ok(run("knowledge", "update", *A, "--entry-id", "1", "--tag", "{}")).stdout)
    assert cleared["tags"] == {} and cleared["scope"] == "/pay"
    cli_fails(run("knowledge", "update", *A, "--entry-id", "1", "--tag", ""), 2, "'--tag'")


def test_index_prints_progress_lines_and_a_summary_when_piped(run: Callable[..., Result]) -> None:
    result = cli_ok(run("index", "{ws}", "--progress-every", "1"))
    lines = result.stderr.splitlines()
    assert lines[0] == "memstrata: indexing: 0/1 files", lines  # how much there is, before the work
    assert lines[1].startswith("memstrata: indexing: 1/1 files"), lines
    assert lines[-1].startswith("memstrata: indexed ") and "1 files indexed" in lines[-1], lines
    assert orjson.loads(result.stdout)["kind"] == "memory"


def test_file_names_are_printed_with_their_control_characters_escaped(
    run: Callable[..., Result], tmp_path: Path
) -> None:
    """An escape sequence in a file name must not reach the terminal (it could recolour it or move
    its cursor), nor be dropped (the path printed would not exist): it is shown as ``\\x1b``."""
    (tmp_path / "ws" / "memory").mkdir()
    (tmp_path / "ws" / "memory" / "red\x1b[31mX\x1b[0m.md").write_text("the escaped note\n", encoding="utf-8")
    indexed = cli_ok(run("index", "{ws}", "--progress-every", "1", json=False))
    found = cli_ok(run("search", "escaped note", json=False))
    for output in (indexed.stderr, found.stdout):
        assert "\x1b" not in output
    shown_name = "red\\x1b[31mX\\x1b[0m.md"
    assert shown_name in indexed.stderr and shown_name in found.stdout


def test_progress_lines_every_n_files_or_after_a_pause() -> None:
    now = [0.0]
    out = io.StringIO()
    progress = IndexProgress(out, every=10, seconds=2.0, clock=lambda: now[0])
    for done in range(1, 26):
        if done == 14:
            now[0] = 2.5  # a slow file: the next call reports though 14 is not a multiple of 10
        progress(done, 25, f"f{done}.md")
    assert [line.split()[2] for line in out.getvalue().splitlines()] == ["10/25", "14/25", "20/25", "25/25"]


def test_a_count_reported_again_passes_only_after_a_pause() -> None:
    """While one file is embedded the sync repeats the last count: a line per pause, not per call."""
    now = [0.0]
    out = io.StringIO()
    progress = IndexProgress(out, every=10, seconds=2.0, clock=lambda: now[0])
    progress(0, 25, "")
    for at in (0.5, 1.0, 2.1, 2.2, 4.3):
        now[0] = at
        progress(0, 25, "big.py")
    progress(10, 25, "f10.md")
    progress(10, 25, "big2.py")
    lines = out.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["0/25", "0/25", "0/25", "10/25"]
    assert lines[1].endswith("big.py") and lines[3].endswith("f10.md")


def test_cli_table_in_docs_is_generated_from_the_registry() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "bridges.md").read_text(encoding="utf-8")
    assert doc_tables.render(text, "cli-commands", command_table()) == text, (
        "docs/bridges.md's CLI table is stale: run `python -m memstrata.bridges.doc_tables`"
    )
    for op in OPERATIONS:
        assert f"`memstrata {' '.join(command_path(op))}` | `{op.name}`" in command_table()


def test_board_watch_connect_names_a_bad_address(run: Callable[..., Result], tmp_path: Path) -> None:
    cli_fails(run("board", "watch", "-s", "s1", "k", "--connect", "nonsense", json=False), 2, "'--connect'")
    missing = f"unix:{tmp_path}/none.sock"
    cli_fails(run("board", "watch", "-s", "s1", "k", "--connect", missing, json=False), 1, "cannot connect")


def test_long_work_prints_still_working_lines_until_it_ends() -> None:
    wrote = threading.Event()

    class Stream(io.StringIO):
        def write(self, text: str) -> int:
            wrote.set()
            return super().write(text)

    stream = Stream()
    with heartbeat("export", stream, seconds=0.01):
        assert wrote.wait(30)  # the work outlasts a beat: a line says it goes on
    lines = stream.getvalue().splitlines()
    assert lines and all(line.startswith("memstrata: export: still working (") for line in lines)
    assert not [t for t in threading.enumerate() if t.name == "memstrata-heartbeat"]  # it ended too


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"n": 123456789012345678901234567890}',
            "integer 123456789012345678901234567890 at 'n' is outside the 64-bit range "
            "(-2**63 to 2**63 - 1): line 1 column 7 (char 6)",
        ),
        ('{"n": NaN}', "NaN is not a JSON number (numbers must be finite): line 1 column 7 (char 6)"),
        ("text", "must be JSON (a string needs its quotes: '\"text\"'), got 'text'"),
        ("[" * 70 + "]" * 70, "nested deeper than 64 levels"),
        ("[" * 1100 + "]" * 1100, "depth limit exceeded: line 1 column 1026 (char 1025)"),
    ],
)
def test_a_json_option_names_what_json_cannot_carry(text: str, message: str) -> None:
    from memstrata.bridges import _cli_shared as sh

    with pytest.raises(click.BadParameter) as raised:
        sh.json_text(text, "--value")
    assert raised.value.format_message() == f"Invalid value for '--value': {message}"
    assert sh.json_text(f"[{2**63 - 1}, {-(2**63)}]", "--value") == [2**63 - 1, -(2**63)]
    assert sh.json_text('"a\\ud800"', "--value") == "a\ud800"  # JSON: the value's own rules judge it


def test_an_integer_beyond_64_bits_is_refused_at_the_command_line_and_nothing_is_stored(
    run: Callable[..., Result],
) -> None:
    big = [*PUT_ITEM[:-4], "--value", '{"n": 123456789012345678901234567890}']
    cli_fails(run(*big), 2, "integer 123456789012345678901234567890 at 'n' is outside the 64-bit range")
    cli_fails(run("items", "get", *NS, "--key", "k1"), 1, "k1")
    cli_ok(run(*PUT_ITEM[:-4], "--value", f'{{"n": {2**63 - 1}}}'))
    assert orjson.loads(cli_ok(run("items", "get", *NS, "--key", "k1")).stdout)["value"] == {"n": 2**63 - 1}
