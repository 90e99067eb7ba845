"""The command line, in-process (CliRunner) with the fake embedder: every command and error path."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

from memstrata.bridges._app import CliState
from memstrata.bridges.cli import cli
from tests._support import cli_fails, cli_ok
from tests.fakes import FakeEmbedder


@pytest.fixture
def run(data_dir: Path, fake_embedder: FakeEmbedder) -> Any:
    runner = CliRunner()

    def invoke(*args: str, input: str | bytes | None = None, data: bool = True) -> Result:
        prefix = ["--data-dir", str(data_dir)] if data else []
        return runner.invoke(cli, [*prefix, *args], obj=CliState(embedder=fake_embedder), input=input)

    return invoke


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text(
        "# Notes\n\nThe staging database password rotates every Monday.\n\n"
        "## Deploy\n\nDeploys go through the blue green pipeline.\n",
        encoding="utf-8",
    )
    (root / "memory" / "2025-01-02.md").write_text(
        "# 2025-01-02\n\nMet Ana about the payment refactor.\n", encoding="utf-8"
    )
    return root


def _json(result: Result) -> Any:
    return orjson.loads(cli_ok(result).stdout)


# -- store / query -------------------------------------------------------------------------------


def test_store_then_query(run: Any) -> None:
    args = ["--agent", "architect", "-c", "pitfall", "--tag", "module=payment", "--tag", "legacy", "--json"]
    stored = _json(run("store", "Avoid the Strategy pattern in payment", *args))
    assert set(stored) == {"id", "agent", "category"}
    assert stored["agent"] == "architect" and stored["category"] == "pitfall"
    hits = _json(run("query", "payment strategy", "--agent", "architect", "--json"))
    assert hits[0]["id"] == stored["id"]
    assert hits[0]["tags"] == {"module": "payment", "legacy": ""}
    assert {"score", "match_type", "category", "content"} <= set(hits[0])
    text = cli_ok(run("query", "payment strategy", "--agent", "architect")).stdout
    assert "pitfall" in text and "Avoid the Strategy pattern" in text


def test_store_text_output_and_stdin(run: Any) -> None:
    out = cli_ok(
        run("store", "-", "--agent", "a1", "--category", "pattern", input="Use retries for flaky IO\n")
    )
    assert out.stdout.startswith("stored ")
    hits = _json(run("query", "flaky", "--agent", "a1", "--category", "pattern", "--json"))
    assert hits[0]["content"] == "Use retries for flaky IO\n"


def test_query_filters_and_modes(run: Any) -> None:
    cli_ok(run("store", "alpha note on caching", "--agent", "a1", "-c", "pattern", "--tag", "team=web"))
    cli_ok(run("store", "beta note on caching", "--agent", "a1", "-c", "pitfall", "--scope", "/svc/api"))
    only_web = _json(run("query", "caching", "--agent", "a1", "--tag", "team=web", "--json"))
    assert [h["content"] for h in only_web] == ["alpha note on caching"]
    pitfalls = _json(run("query", "caching", "--agent", "a1", "-c", "pitfall", "--mode", "keyword", "--json"))
    assert [h["content"] for h in pitfalls] == ["beta note on caching"]
    top1 = _json(run("query", "caching", "--agent", "a1", "--top-k", "1", "--json"))
    assert len(top1) == 1
    nothing = cli_ok(run("query", "nothing matches zzz", "--agent", "nobody", "--mode", "keyword"))
    assert nothing.stdout.startswith("no matching knowledge")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["store", "x", "--category", "pattern"], "Missing option '--agent'"),
        (["store", "x", "--agent", "a1"], "Missing option '--category'"),
        (["store", "--agent", "a1", "-c", "pattern"], "Missing argument 'CONTENT'"),
        (["query", "x", "--agent", "a1", "--mode", "fuzzy"], "'--mode'"),
        (["query", "x", "--agent", "a1", "--top-k", "0"], "'--top-k'"),
        (["query", "x", "--agent", "a1", "--min-score", "2"], "'--min-score'"),
        (["store", "x", "--agent", "a1", "-c", "pattern", "--tag", "=v"], "empty key"),
        (
            ["store", "x", "--agent", "a1", "-c", "pattern", "--tag", "a=1", "--tag", "a=2"],
            "tag 'a' is given twice with different values ('1' and '2')",  # as the tools say
        ),
        (["nosuchcommand"], "No such command 'nosuchcommand'"),
        (["store", "x", "--agent", "a1", "-c", "pattern", "--bogus"], "No such option '--bogus'"),
        (["recall", "x", "--agent", "a1", "--since", "2024-05-01T12:00:00"], "time zone"),
        (["recall", "x", "--agent", "a1", "--until", "yesterday"], "ISO 8601"),
        (["index", "/no/such/folder"], "does not exist"),
        (["get", "x.md", "--from", "0"], "'--from'"),
        (["search", "x", "--min-score", "nan"], "'nan' is not a number in the range 0<=x<=1."),
        (
            ["query", "x", "--agent", "a1", "--min-score", "nan"],
            "'nan' is not a number in the range 0<=x<=1.",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(run: Any, args: list[str], needle: str) -> None:
    cli_fails(run(*args), 2, needle)


@pytest.mark.parametrize("blank", ["", "  "])
def test_an_empty_data_dir_is_refused_not_read_as_the_current_folder(
    run: Any, blank: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    cli_fails(
        run("--data-dir", blank, "store", "x", "--agent", "a1", "-c", "pattern", data=False), 2, "--data-dir"
    )
    assert list(here.iterdir()) == []  # no store was made in the current folder


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["store", "x", "--agent", "a1", "-c", "Bad Cat"], "'Bad Cat'"),
        (["store", "x", "--agent", "../etc", "-c", "pattern"], "'../etc'"),
        (["store", "x", "--agent", "shared", "-c", "pattern"], "reserved"),
        (["store", "   ", "--agent", "a1", "-c", "pattern"], "content"),
        (["query", "x", "--agent", "a b"], "agent_id"),
        (["remember", "x", "--agent", ""], "agent_id"),
        (["search", "payment", "--root", ""], "Invalid value for '--root': must not be empty"),
        (["get", "x.md", "--root", ""], "Invalid value for '--root': must not be empty"),
        (["export", ""], "Invalid value for 'PATH': must not be empty"),
    ],
)
def test_invalid_values_exit_2_with_one_line(run: Any, args: list[str], needle: str) -> None:
    cli_fails(run(*args), 2, needle)


def test_the_docs_error_example_is_what_the_command_prints(run: Any) -> None:
    """docs/bridges.md shows one error line of the command line as it is printed."""
    docs = (Path(__file__).resolve().parent.parent / "docs" / "bridges.md").read_text(encoding="utf-8")
    command, shown, code = docs.split("$ memstrata store x --agent a1 --category", 1)[1].splitlines()[:3]
    assert command == ' "Bad Cat"; echo $?' and code == "2"
    cli_fails(run("store", "x", "--agent", "a1", "--category", "Bad Cat"), 2, shown)


@pytest.mark.parametrize(
    "content",
    [
        "nul \x00 inside",
        "lone \ud800 surrogate",
        '" OR 1=1; -- NEAR( AND * "quotes',
        "x" * 100_000,
        "中文内容 and emoji 🚀🔥",
        "\x1b[31mcontrol\x07 chars\r\n",
    ],
)
def test_hostile_content_is_stored_or_refused_in_one_line(run: Any, content: str) -> None:
    result = run("store", content, "--agent", "a1", "-c", "pattern", "--json")
    if result.exit_code == 0:
        ident = orjson.loads(result.stdout)["id"]
        query = run("query", content[:200], "--agent", "a1", "--json")
        assert query.exit_code == 0, query.stderr
        assert ident in [h["id"] for h in orjson.loads(query.stdout)]
    else:
        cli_fails(result, 2, "")


# -- episodes ------------------------------------------------------------------------------------


def test_remember_and_recall(run: Any) -> None:
    remembered = _json(run("remember", "Deployed build 42 to staging", "--agent", "ops", "--title", "deploy",
                           "--task-run", "run-7", "--tag", "env=staging", "--json"))  # fmt: skip
    assert set(remembered) == {"id", "agent"}
    cli_ok(run("remember", "Rolled back build 41", "--agent", "ops"))
    hits = _json(run("recall", "deployed staging", "--agent", "ops", "--task-run", "run-7", "--json"))
    assert [h["id"] for h in hits] == [remembered["id"]]
    assert hits[0]["title"] == "deploy"
    since = _json(run("recall", "build", "--agent", "ops", "--since", "2000-01-01T00:00:00Z", "--json"))
    assert len(since) == 2
    none = _json(run("recall", "build", "--agent", "ops", "--until", "2000-01-01T00:00:00+00:00", "--json"))
    assert none == []
    text = cli_ok(run("recall", "rolled back", "--agent", "ops")).stdout
    assert "Rolled back build 41" in text


# -- files ---------------------------------------------------------------------------------------


def test_index_search_get(run: Any, workspace: Path) -> None:
    indexed = _json(run("index", str(workspace), "--json"))
    assert indexed["root"] == str(workspace.resolve()) and indexed["kind"] == "memory"
    assert indexed["stats"]["files_processed"] == 2
    again = cli_ok(run("index", str(workspace))).stdout
    assert "0 files indexed, 2 unchanged" in again
    hits = _json(run("search", "database password rotation", "--json"))
    assert hits[0]["path"] == "MEMORY.md"
    assert set(hits[0]) >= {"path", "start_line", "end_line", "score", "snippet", "root"}
    text = cli_ok(run("search", "payment refactor")).stdout
    assert "2025-01-02.md" in text
    got = _json(run("get", str(workspace / "MEMORY.md"), "--from", "3", "--lines", "1", "--json"))
    assert got["text"] == "The staging database password rotates every Monday."
    assert got["from_line"] == 3 and got["lines"] == 1
    assert cli_ok(run("get", "memory/2025-01-02.md", "--lines", "1")).stdout == "# 2025-01-02\n"


def test_get_relative_to_the_current_folder(
    run: Any, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli_ok(run("index", str(workspace)))
    monkeypatch.chdir(workspace / "memory")
    assert cli_ok(run("get", "2025-01-02.md", "--lines", "1")).stdout == "# 2025-01-02\n"
    elsewhere = workspace.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "MEMORY.md").write_text("not indexed\n", encoding="utf-8")
    monkeypatch.chdir(elsewhere)  # a local file no root holds: the roots' MEMORY.md is read
    assert cli_ok(run("get", "MEMORY.md", "--lines", "1")).stdout == "# Notes\n"


def test_get_refuses_paths_outside_the_roots(
    run: Any, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli_ok(run("index", str(workspace)))
    secret = tmp_path / "secret.md"
    secret.write_text("top secret", encoding="utf-8")
    cli_fails(run("get", "../secret.md", "--root", str(workspace)), 2, "..")
    cli_fails(run("get", str(secret)), 2, "not inside an indexed root")
    (workspace / "memory" / "link.md").symlink_to(secret)
    cli_fails(run("get", "memory/link.md"), 2, "symlink that leaves the root")
    cli_fails(run("get", "memory/missing.md"), 2, "missing.md")
    monkeypatch.chdir(workspace.parent)  # the same link relative to the current folder: the same reason
    cli_fails(run("get", f"{workspace.name}/memory/link.md"), 2, "symlink that leaves the root")


def test_get_json_counts_the_lines_it_returns_a_blank_one_too(run: Any, workspace: Path) -> None:
    cli_ok(run("index", str(workspace)))
    blank = _json(run("get", "MEMORY.md", "--from", "2", "--lines", "1", "--json"))
    assert (blank["lines"], blank["text"]) == (1, "")
    ending = _json(run("get", "MEMORY.md", "--from", "6", "--lines", "9", "--json"))
    assert (ending["lines"], ending["text"]) == (2, "\nDeploys go through the blue green pipeline.")
    past = _json(run("get", "MEMORY.md", "--from", "8", "--lines", "1", "--json"))
    assert (past["lines"], past["text"]) == (0, "")


def test_search_language_filters_memory_roots_too_and_an_unknown_one_is_refused(
    run: Any, workspace: Path, tmp_path: Path
) -> None:
    code = tmp_path / "src"
    code.mkdir()
    (code / "deploy.py").write_text('def deploy():\n    """blue green pipeline deploys"""\n')
    cli_ok(run("index", str(workspace)))
    cli_ok(run("index", str(code)))
    query = ["search", "blue green pipeline deploys", "--top-k", "10", "--min-score", "0", "--json"]
    assert {h["kind"] for h in _json(run(*query))} == {"memory", "code"}
    assert {(h["kind"], h["language"]) for h in _json(run(*query, "--language", "py"))} == {
        ("code", "python")
    }
    markdown = _json(run(*query, "--language", "Markdown"))
    assert markdown and {(h["kind"], h["language"]) for h in markdown} == {("memory", "markdown")}
    cli_fails(
        run(*query, "--language", "cobol"), 2, "language 'cobol' is not a known language: use one of c, "
    )


def test_search_warnings_are_prefixed_as_documented(run: Any, workspace: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    (other / "memory").mkdir(parents=True)
    cli_ok(run("index", str(workspace)))
    cli_ok(run("index", str(other)))
    (other / "memory").rmdir()
    other.rmdir()
    result = cli_ok(run("search", "staging database password", "--json"))
    assert result.stderr.splitlines() == [
        f"memstrata: warning: memory root {str(other.resolve())!r} is missing (deleted or not mounted): "
        "skipped (forget_root removes it from the index)"
    ]


def test_get_a_relative_path_that_two_roots_hold_is_refused_naming_them(
    run: Any, workspace: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "MEMORY.md").write_text("# Other notes\n", encoding="utf-8")
    cli_ok(run("index", str(workspace)))
    cli_ok(run("index", str(other)))
    refused = run("get", "MEMORY.md")
    cli_fails(refused, 2, "path 'MEMORY.md' is in more than one indexed root (")
    assert f"'{workspace.resolve()}', '{other.resolve()}'" in refused.stderr
    assert "--root" in refused.stderr
    assert cli_ok(run("get", "MEMORY.md", "--root", str(other))).stdout == "# Other notes\n"
    assert cli_ok(run("get", str(other / "MEMORY.md"))).stdout == "# Other notes\n"
    assert cli_ok(run("get", "memory/2025-01-02.md", "--lines", "1")).stdout == "# 2025-01-02\n"


def test_search_and_get_before_anything_is_indexed(run: Any) -> None:
    cli_fails(run("search", "anything"), 1, "no memories indexed yet")
    cli_fails(run("get", "MEMORY.md"), 1, "no memories indexed yet")


def test_code_index_and_root_filter(run: Any, workspace: Path, tmp_path: Path) -> None:
    code = tmp_path / "src"
    code.mkdir()
    (code / "http.py").write_text(
        "def parse_http_request(raw):\n"
        "    '''Split the request line from the headers.'''\n"
        "    return raw.split('\\r\\n')\n",
        encoding="utf-8",
    )
    assert _json(run("index", str(code), "--kind", "auto", "--json"))["kind"] == "code"
    cli_ok(run("index", str(workspace)))
    both = _json(run("search", "request headers", "--top-k", "10", "--min-score", "0", "--json"))
    assert {h["kind"] for h in both} == {"code", "memory"}
    only_code = _json(run("search", "request headers", "--root", str(code), "--json"))
    assert only_code and {h["root"] for h in only_code} == {str(code.resolve())}
    cli_fails(run("search", "x", "--root", str(tmp_path)), 2, "is not indexed")


def test_index_skips_a_file_name_that_is_not_utf8_and_indexes_the_rest(run: Any, tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "hooks.py").write_text('def retry_webhook():\n    "retry webhooks three times"\n')
    (code / os.fsdecode(b"caf\xe9.py")).write_text("x = 1\n")
    indexed = _json(run("index", str(code), "--json"))
    assert indexed["stats"]["files_processed"] == 1
    assert indexed["stats"]["skipped"] == [["caf\\xe9.py", "file name is not valid UTF-8"]]
    assert [h["path"] for h in _json(run("search", "retry webhooks", "--json"))] == ["hooks.py"]
    (listed,) = _json(run("roots", "list", "--json"))
    assert listed["last_stats"]["skipped"] == indexed["stats"]["skipped"]
    refused = run("get", str(code / os.fsdecode(b"caf\xe9.py")))  # its name escaped, as in the report
    cli_fails(refused, 2, "must be valid UTF-8 text (no lone surrogates), got '")
    assert "/caf\\xe9.py'" in refused.stderr


def test_index_refuses_the_data_dir_and_the_filesystem_root(run: Any, data_dir: Path) -> None:
    cli_ok(run("store", "a fact", "--agent", "a1", "-c", "pattern"))
    (data_dir / "inside").mkdir()
    for path in (data_dir, data_dir / "inside"):
        cli_fails(
            run("index", str(path), "--kind", "code"), 2, f"'{path}' is memstrata's data dir or inside it"
        )
    cli_fails(run("index", "/", "--kind", "memory"), 2, "'/' is the filesystem root")
    assert _json(run("roots", "list", "--json")) == []


def test_get_through_the_symlink_a_root_was_indexed_by(run: Any, workspace: Path, tmp_path: Path) -> None:
    link = tmp_path / "wslink"
    link.symlink_to(workspace, target_is_directory=True)
    assert _json(run("index", str(link), "--json"))["root"] == str(workspace.resolve())
    got = _json(run("get", str(link / "memory" / "2025-01-02.md"), "--lines", "1", "--json"))
    assert got["path"] == "memory/2025-01-02.md" and got["text"] == "# 2025-01-02"
    other = tmp_path / "other"
    (other / "memory").mkdir(parents=True)
    (other / "memory" / "x.md").write_text("another root\n")
    cli_ok(run("index", str(other)))
    (workspace / "memory" / "away").symlink_to(other / "memory", target_is_directory=True)
    secret = tmp_path / "secret.md"
    secret.write_text("top secret")
    (workspace / "memory" / "leak.md").symlink_to(secret)
    # only the root part is resolved: inside it, symlinks are refused as before
    cli_fails(run("get", str(link / "memory" / "away" / "x.md")), 2, "symlink that leaves the root")
    cli_fails(run("get", str(link / "memory" / "leak.md")), 2, "leaves the root")
    into = tmp_path / "into"
    into.symlink_to(workspace / "memory", target_is_directory=True)
    (workspace / "memory" / "to-other").symlink_to(other, target_is_directory=True)
    for path in (into / "to-other" / "memory" / "x.md", tmp_path / "nowhere" / "MEMORY.md"):
        cli_fails(run("get", str(path)), 2, "not inside an indexed root")


# -- status --------------------------------------------------------------------------------------


def test_status(run: Any, workspace: Path) -> None:
    cli_ok(run("store", "a fact", "--agent", "a1", "-c", "pattern"))
    cli_ok(run("remember", "an episode", "--agent", "a1"))
    cli_ok(run("index", str(workspace)))
    report = _json(run("status", "--json"))
    assert report["storage"]["driver"]
    assert report["system"]["embedding"]["model"] == "fake-bow"
    assert report["system"]["embedding"]["dim"] == 64
    assert report["stores"]["knowledge"]["a1"]["count"] == 1
    assert report["stores"]["episodic"]["a1"]["count"] == 1
    (ws,) = report["workspaces"]
    assert ws["kind"] == "memory" and ws["index"]["files"] == 2 and ws["last_sync_at"]
    text = cli_ok(run("status")).stdout
    assert "model: fake-bow, dimension 64" in text
    assert "knowledge stores: a1: 1" in text
    assert "degraded agents: none" in text
    assert f"indexed memory root {workspace.resolve()}: 2 files" in text
    assert "system:" in cli_ok(run("status", "--verbose")).stdout


# -- runtime errors, config, debug ---------------------------------------------------------------


def test_corrupt_database_is_a_runtime_error_in_one_line(run: Any, data_dir: Path) -> None:
    (data_dir / "workspaces.sqlite").write_bytes(b"this is not a database" * 100)
    cli_fails(run("search", "x"), 1, "workspaces.sqlite")
    debug = run("--debug", "search", "x")
    assert debug.exit_code == 1
    assert "Traceback" in debug.stderr
    assert debug.stderr.rstrip().splitlines()[-1].startswith("memstrata: error: ")


def test_bad_config_file_is_a_usage_error(run: Any, tmp_path: Path) -> None:
    config = tmp_path / "memstrata.toml"
    config.write_text("[search]\nmax_resultz = 3\n", encoding="utf-8")
    cli_fails(run("--config", str(config), "status"), 2, "max_resultz")
    config.write_text("not = [valid toml", encoding="utf-8")
    cli_fails(run("--config", str(config), "status"), 2, "not valid TOML")


def test_data_dir_from_the_environment(tmp_path: Path, fake_embedder: FakeEmbedder) -> None:
    target = tmp_path / "from-env"
    result = CliRunner().invoke(
        cli,
        ["store", "x", "--agent", "a1", "-c", "pattern"],
        obj=CliState(embedder=fake_embedder),
        env={"MEMSTRATA_DATA_DIR": str(target)},
    )
    cli_ok(result)
    assert (target / "knowledge" / "a1.sqlite").is_file()


def test_help_and_version(run: Any) -> None:
    assert "Commands:" in cli_ok(run(data=False)).stdout
    assert "index" in cli_ok(run("--help", data=False)).stdout
    assert "0.1.0" in cli_ok(run("--version", data=False)).stdout


# -- serve and mcp in-process (the subprocess tests live in test_serve.py / test_mcp.py) -----------


def test_serve_answers_stdin_lines(run: Any) -> None:
    lines = [
        {"id": 1, "method": "store_knowledge", "params": {"agent_id": "a1", "content": "cli serve fact"}},
        {"id": 2, "method": "nope"},
    ]
    payload = b"".join(orjson.dumps(line) + b"\n" for line in lines) + b"{broken\n"
    result = cli_ok(run("serve", input=payload))
    responses = [orjson.loads(line) for line in result.stdout.splitlines()]
    by_id = {r["id"]: r for r in responses}
    assert by_id[1]["result"]["id"] >= 1
    assert by_id[2]["error"]["code"] == -32601
    assert by_id[None]["error"]["code"] == -32700


def test_mcp_without_the_sdk_names_the_extra(run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "mcp" or m.startswith("mcp.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mcp", None)
    cli_fails(run("mcp"), 1, "pip install 'memstrata[mcp]'")


def test_mcp_refuses_a_bad_agent_id_before_it_starts(
    run: Any, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mcp")
    for agent in ("Bad Agent", ""):
        result = run("mcp", "--agent", agent, input=b"")
        cli_fails(result, 2, "--agent must be a")
        assert result.stderr.rstrip().endswith(f"got {agent!r}") and result.stdout == ""
    monkeypatch.setenv("MEMSTRATA_BRIDGES__AGENT_ID", "x y")
    cli_fails(run("mcp", input=b""), 2, "config key 'bridges.agent_id' must be a")
    assert not (data_dir / "knowledge").exists()  # refused before the memory system started


def test_demo_runs_and_reports(run: Any, data_dir: Path) -> None:
    result = cli_ok(run("demo"))
    assert "memstrata demo" in result.stdout
    assert (data_dir / "demo").is_dir()


def test_a_json_null_value_is_a_value(run: Any) -> None:
    stored = _json(run("working", "set", "-a", "a1", "--key", "k", "--value", "null", "--json"))
    assert stored == {"key": "k", "stored": True}
    assert (
        _json(run("board", "publish", "-s", "s1", "--key", "k", "--value", "null", "--json"))["version"] == 1
    )


def test_tags_are_read_as_the_tools_read_them(run: Any) -> None:
    cli_ok(run("store", "x", "--agent", "a1", "-c", "pattern", "--tag", " env =prod"))
    (entry,) = _json(run("knowledge", "list", "-a", "a1", "--json"))
    assert entry["tags"] == {" env ": "prod"}  # as the tools store " env =prod": no key is rewritten


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            [
                "episodes",
                "list",
                "-a",
                "new",
                "--since",
                "2025-01-03T00:00:00Z",
                "--until",
                "2025-01-02T00:00:00Z",
            ],
            "is after until",
        ),
        (["knowledge", "list", "-a", "new", "--scope", "/a/../b"], "must not contain '..' segments"),
        (["knowledge", "query", "-a", "new", "x", "--tag", "k" * 200], "at most 128"),
        (["query", "x", "--agent", "new", "--scope", "/a/../b"], "must not contain '..' segments"),
        (["query", "x", "--agent", "new", "--category", "Bad Cat"], "category is not valid"),
    ],
)
def test_a_read_of_an_agent_without_a_store_refuses_what_a_store_would(
    run: Any, args: list[str], needle: str
) -> None:
    """Nothing to read answers "nothing found" without starting the system; bad input is still
    refused (exit 2), as once the agent has data and at every other door."""
    cli_fails(run(*args, "--json"), 2, needle)
