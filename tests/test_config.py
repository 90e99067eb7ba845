"""Configuration: file lookup, TOML < environment < arguments, per-agent overrides, clear errors."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import typing
from pathlib import Path

import pytest

from memstrata.config import (
    ActorsConfig,
    AgentConfig,
    BridgesConfig,
    ChunkingConfig,
    ClusterConfig,
    Config,
    EmbeddingConfig,
    EpisodicConfig,
    FilesConfig,
    SearchConfig,
    StorageConfig,
    SyncConfig,
)
from memstrata.errors import ConfigError, InvalidInputError


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No config file is found unless a test writes one: cwd and home are empty temp dirs."""
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    for name in [n for n in os.environ if n.startswith("MEMSTRATA_")]:
        monkeypatch.delenv(name)
    return tmp_path


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_documented_defaults(isolated: Path) -> None:
    config = Config.load(env={})
    assert (config.chunking.tokens, config.chunking.overlap) == (400, 80)
    assert config.files.watch_debounce_ms == 1500
    assert config.search.max_results == 6 and config.search.top_k == 10
    assert config.search.min_score == 0.35 and config.search.snippet_chars == 700
    assert config.search.rrf_k == 5 and config.search.keyword_weight == 1.5
    assert config.agent.retrieval_timeout_s == 5.0
    assert config.embedding.model == "default"
    assert "SOUL.md" in config.files.exclude and ".git" in config.files.pruned_dirs
    assert config.agents == {} and config.for_agent("anyone") == config.agent


def test_precedence_file_then_env_then_arguments(isolated: Path) -> None:
    path = _write(
        isolated / "cfg.toml",
        "[search]\ntop_k = 3\nrrf_k = 30\nsnippet_chars = 100\n[chunking]\ntokens = 200\n",
    )
    env = {"MEMSTRATA_SEARCH__TOP_K": "4", "MEMSTRATA_SEARCH__RRF_K": "40"}
    config = Config.load(path, env=env, search__top_k=5)
    assert config.search.top_k == 5  # argument beats environment and file
    assert config.search.rrf_k == 40  # environment beats file
    assert config.search.snippet_chars == 100  # file beats default
    assert config.chunking.tokens == 200 and config.chunking.overlap == 80  # untouched default
    assert Config.load(path, env=env, search__top_k=None).search.top_k == 4  # None means "not given"


def test_file_lookup_order(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home_file = _write(isolated / "home" / ".config" / "memstrata" / "config.toml", "[search]\ntop_k = 1\n")
    assert Config.load(env={}).search.top_k == 1
    _write(isolated / "work" / "memstrata.toml", "[search]\ntop_k = 2\n")
    assert Config.load(env={}).search.top_k == 2  # the working directory's file wins over home
    via_env = _write(isolated / "elsewhere.toml", "[search]\ntop_k = 3\n")
    assert Config.load(env={"MEMSTRATA_CONFIG": str(via_env)}).search.top_k == 3
    assert Config.load(home_file, env={"MEMSTRATA_CONFIG": str(via_env)}).search.top_k == 1  # explicit path


def test_missing_explicit_file_is_an_error(isolated: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml does not exist"):
        Config.load(isolated / "nope.toml", env={})
    with pytest.raises(ConfigError, match=r"gone\.toml does not exist"):
        Config.load(env={"MEMSTRATA_CONFIG": str(isolated / "gone.toml")})
    (isolated / "folder.toml").mkdir()
    with pytest.raises(ConfigError, match=r"config file .*folder\.toml is a folder, not a file"):
        Config.load(isolated / "folder.toml", env={})


def test_a_config_given_through_a_pipe_is_read(isolated: Path) -> None:
    """``--config <(generate-config)`` and ``/dev/stdin`` name a pipe: it exists and is read."""
    read, write = os.pipe()
    os.write(write, b"[search]\ntop_k = 7\n")
    os.close(write)
    try:
        assert Config.load(f"/dev/fd/{read}", env={}).search.top_k == 7
    finally:
        os.close(read)


def test_a_rule_between_two_keys_names_the_file_and_the_variable(isolated: Path) -> None:
    """As every other config error does: where the values came from, file or environment."""
    path = _write(isolated / "c.toml", "[chunking]\ntokens = 10\noverlap = 10\n")
    with pytest.raises(
        ConfigError, match=rf"^{re.escape(str(path))}: config key 'chunking.overlap' must be below"
    ):
        Config.load(path, env={})
    path = _write(isolated / "t.toml", "[actors]\nembed_timeout_s = 40\n")
    with pytest.raises(
        ConfigError, match=rf"^{re.escape(str(path))}: actors.embed_timeout_s \(40 s\) must be below"
    ):
        Config.load(path, env={})
    with pytest.raises(ConfigError, match=r"\(from environment variable MEMSTRATA_CHUNKING__OVERLAP\)$"):
        Config.load(env={"MEMSTRATA_CHUNKING__OVERLAP": "500"})
    unrelated = {"MEMSTRATA_ACTORS__MAX_RESTARTS": "5", "MEMSTRATA_ACTORS__EMBED_TIMEOUT_S": "40"}
    with pytest.raises(ConfigError) as raised:
        Config.load(env=unrelated)
    assert str(raised.value).endswith("(from environment variable MEMSTRATA_ACTORS__EMBED_TIMEOUT_S)")
    assert "MAX_RESTARTS" not in str(raised.value)  # only the variables of the keys at fault


def test_a_data_dir_that_is_a_file_is_refused_wherever_it_was_set(isolated: Path) -> None:
    """Not only by the command line's --data-dir: a read-only command would report an empty,
    healthy store, and only a write would fail, with an OS error."""
    target = _write(isolated / "not-a-folder", "x")
    path = _write(isolated / "c.toml", f"data_dir = {str(target)!r}\n")
    message = rf"config key 'data_dir' is a file, not a folder: {re.escape(repr(str(target)))}"
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: {message}"):
        Config.load(path, env={})
    with pytest.raises(ConfigError, match=message):
        Config(data_dir=target)
    assert target.read_text(encoding="utf-8") == "x"


def test_a_section_or_codebase_from_the_environment_is_named_or_left_unset() -> None:
    """A variable set to a whole section names itself; an empty one is not set, as for every
    other key (``MEMSTRATA_CODEBASES__SHOP=`` does not refuse the start)."""
    with pytest.raises(
        ConfigError, match=r"search must be a table \(from environment variable MEMSTRATA_SEARCH\)$"
    ):
        Config.load(env={"MEMSTRATA_SEARCH": "5"})
    assert dict(Config.load(env={"MEMSTRATA_CODEBASES__SHOP": ""}).codebases) == {}
    assert dict(Config.load(env={"MEMSTRATA_CODEBASES__SHOP": "/src/shop"}).codebases) == {
        "shop": "/src/shop"
    }


def test_an_agent_section_no_agent_could_read_is_refused_by_name(isolated: Path) -> None:
    """``[agents."Bad Id"]`` was accepted and never applied: no agent can have that id."""
    for section in ('"Bad Id"', "shared", '"../up"'):
        path = _write(isolated / "a.toml", f"[agents.{section}]\nretrieval_top_k = 3\n")
        with pytest.raises(
            ConfigError, match=rf"^{re.escape(str(path))}: config section 'agents\.[^']+': agent id"
        ):
            Config.load(path, env={})
    good = _write(isolated / "b.toml", "[agents.a1]\nretrieval_top_k = 3\n")
    assert Config.load(good, env={}).for_agent("a1").retrieval_top_k == 3


def test_invalid_toml_names_the_file(isolated: Path) -> None:
    path = _write(isolated / "bad.toml", "[search\ntop_k = ")
    with pytest.raises(ConfigError, match=r"bad\.toml is not valid TOML"):
        Config.load(path, env={})


def test_environment_values_are_converted(isolated: Path) -> None:
    env = {
        "MEMSTRATA_DATA_DIR": "~/memdata",
        "MEMSTRATA_EMBEDDING__MODEL": "BAAI/bge-small-en-v1.5",
        "MEMSTRATA_EMBEDDING__DIM": "384",
        "MEMSTRATA_SEARCH__MIN_SCORE": "0.5",
        "MEMSTRATA_AGENT__INCLUDE_SHARED": "off",
        "MEMSTRATA_FILES__EXTRA_PATHS": "notes, docs/,,",
        "MEMSTRATA_FILES__SYNC_INTERVAL_S": "none",
        "MEMSTRATA_MODEL_DIR": "/not/a/config/key",  # read by the embedder, not by Config
    }
    config = Config.load(env=env)
    assert config.data_dir == Path.home() / "memdata"
    assert config.embedding.model == "BAAI/bge-small-en-v1.5" and config.embedding.dim == 384
    assert config.search.min_score == 0.5
    assert config.agent.include_shared is False
    assert config.files.extra_paths == ("notes", "docs/")
    assert config.files.sync_interval_s is None


def test_an_empty_environment_value_counts_as_not_set(isolated: Path) -> None:
    default = Config.load(env={})
    config = Config.load(env={"MEMSTRATA_DATA_DIR": "", "MEMSTRATA_SEARCH__TOP_K": ""})
    assert config.data_dir == default.data_dir != Path(".")
    assert config.search.top_k == default.search.top_k
    path = _write(isolated / "cfg.toml", 'data_dir = "/srv/mem"\n[search]\ntop_k = 3\n')
    config = Config.load(path, env={"MEMSTRATA_DATA_DIR": "", "MEMSTRATA_SEARCH__TOP_K": ""})
    assert (config.data_dir, config.search.top_k) == (Path("/srv/mem"), 3)  # the file's values
    unset = Config.load(env={"MEMSTRATA_FILES__SYNC_INTERVAL_S": "", "MEMSTRATA_FILES__EXTRA_PATHS": ""})
    assert unset.files.sync_interval_s is None and unset.files.extra_paths == ()


def test_an_empty_data_dir_given_explicitly_is_refused_where_it_came_from(isolated: Path) -> None:
    path = _write(isolated / "cfg.toml", 'data_dir = ""\n')
    with pytest.raises(ConfigError, match=r"cfg.toml: config key 'data_dir' must be a path, got ''$"):
        Config.load(path, env={})
    with pytest.raises(ConfigError, match=r"^configuration: config key 'data_dir' must be a path, got ''$"):
        Config.load(env={}, data_dir="")
    with pytest.raises(ConfigError, match=r"got ' ' \(from environment variable MEMSTRATA_DATA_DIR\)$"):
        Config.load(env={"MEMSTRATA_DATA_DIR": " "})
    with pytest.raises(ConfigError, match=r"^config key 'data_dir' must be a path, got ''$"):
        Config(data_dir="")  # type: ignore[arg-type]
    assert Config.load(env={}, data_dir=".").data_dir == Path(".")  # the working dir, said so


def test_unknown_keys_are_named(isolated: Path) -> None:
    path = _write(isolated / "cfg.toml", "[search]\ntopk = 3\n")
    with pytest.raises(ConfigError, match=r"cfg.toml: unknown config key 'search.topk'"):
        Config.load(path, env={})
    with pytest.raises(ConfigError, match=r"unknown config key 'colour'"):
        Config.load(_write(isolated / "c2.toml", 'colour = "blue"\n'), env={})
    with pytest.raises(ConfigError, match=r"unknown config key 'search.depthh'.*MEMSTRATA_SEARCH__DEPTHH"):
        Config.load(env={"MEMSTRATA_SEARCH__DEPTHH": "3"})
    with pytest.raises(ConfigError, match=r"unknown config key 'agents.ops.bogus'"):
        Config.load(env={}, agents={"ops": {"bogus": 1}})


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ('[search]\ntop_k = "ten"\n', "search.top_k"),
        ("[search]\ntop_k = -1\n", "search.top_k"),
        ("[search]\ntop_k = true\n", "search.top_k"),
        ("[search]\nmin_score = nan\n", "search.min_score"),
        ("[search]\nmin_score = inf\n", "search.min_score"),
        ('[agent]\ninclude_shared = "yes"\n', "agent.include_shared"),
        ("[embedding]\nmodel = 5\n", "embedding.model"),
        ("[files]\nexclude = [1, 2]\n", "files.exclude"),
        ("data_dir = 3\n", "data_dir"),
        ('[agents.ops]\nretrieval_timeout_s = "soon"\n', "agents.ops.retrieval_timeout_s"),
    ],
)
def test_bad_values_name_the_key(isolated: Path, toml: str, key: str) -> None:
    path = _write(isolated / "cfg.toml", toml)
    with pytest.raises(ConfigError, match=f"config key '{key}' (has invalid value|must be)"):
        Config.load(path, env={})


def test_bad_environment_values_name_the_variable(isolated: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"'search.top_k' must be an integer .*'lots'.*MEMSTRATA_SEARCH__TOP_K"
    ):
        Config.load(env={"MEMSTRATA_SEARCH__TOP_K": "lots"})
    with pytest.raises(ConfigError, match=r"agent\.include_shared"):
        Config.load(env={"MEMSTRATA_AGENT__INCLUDE_SHARED": "maybe"})


def test_a_section_must_be_a_table(isolated: Path) -> None:
    with pytest.raises(ConfigError, match="search must be a table"):
        Config.load(_write(isolated / "c.toml", "search = 5\n"), env={})
    with pytest.raises(ConfigError, match="'agents' must be a table"):
        Config.from_mapping({"agents": 5})


def test_per_agent_overrides(isolated: Path) -> None:
    path = _write(
        isolated / "cfg.toml",
        "[agent]\nretrieval_timeout_s = 4.0\nretrieval_top_k = 7\n"
        "[agents.architect]\nretrieval_timeout_s = 2.0\n"
        "[agents.reviewer]\ninclude_shared = false\n",
    )
    env = {"MEMSTRATA_AGENTS__REVIEWER__RETRIEVAL_TOP_K": "9"}
    config = Config.load(path, env=env)
    architect = config.for_agent("architect")
    assert architect.retrieval_timeout_s == 2.0 and architect.retrieval_top_k == 7  # inherits [agent]
    reviewer = config.for_agent("reviewer")
    assert reviewer.include_shared is False and reviewer.retrieval_top_k == 9
    assert reviewer.retrieval_timeout_s == 4.0
    assert config.for_agent("someone-else") == config.agent
    assert isinstance(architect, AgentConfig)


def test_config_errors_are_value_errors(isolated: Path) -> None:
    with pytest.raises(ValueError):
        Config.load(env={"MEMSTRATA_SEARCH__TOP_K": "x"})
    assert issubclass(ConfigError, InvalidInputError)


def test_docs_document_every_config_key_with_its_default() -> None:
    import dataclasses
    import re

    docs = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    text = docs.read_text(encoding="utf-8")
    section = text.split("<!-- section: config -->")[1].split("<!-- /section: config -->")[0]
    rows: dict[str, str] = {}  # "search.top_k" -> the row's default cell
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        table = re.match(r"`\[(\w+)\] ", cells[0])
        keys = re.findall(r"(\w+)`", cells[0])
        defaults = [d.strip().strip("`") for d in cells[1].split(",")]
        for i, key in enumerate(keys):
            rows[f"{table.group(1)}.{key}" if table else key] = defaults[min(i, len(defaults) - 1)]
    config = Config()
    for top in dataclasses.fields(Config):
        if top.name in ("agents", "agent_sections"):
            continue
        value = getattr(config, top.name)
        if not dataclasses.is_dataclass(value):
            assert top.name in rows, f"docs/configuration.md table lacks {top.name}"
            continue
        for key in dataclasses.fields(value):
            dotted = f"{top.name}.{key.name}"
            assert dotted in rows, f"docs/configuration.md table lacks [{top.name}] {key.name}"
            default = getattr(value, key.name)
            if isinstance(default, bool):
                assert rows[dotted] == str(default).lower(), dotted
            elif isinstance(default, int | float | str):
                assert rows[dotted].strip('"') == str(default), dotted
            elif default is None:
                assert rows[dotted] == "unset", dotted


def test_approximate_search_threshold(isolated: Path) -> None:
    assert Config().search.approximate_from == 100_000
    assert Config.load(env={"MEMSTRATA_SEARCH__APPROXIMATE_FROM": "none"}).search.approximate_from is None
    assert Config.load(env={"MEMSTRATA_SEARCH__APPROXIMATE_FROM": "5000"}).search.approximate_from == 5000
    path = _write(isolated / "cfg.toml", "[search]\napproximate_from = 0\n")
    with pytest.raises(ConfigError, match=r"'search\.approximate_from' must be an integer >= 1, got 0"):
        Config.load(path, env={})


# every numeric key, with a value of the type it takes that is out of the range its users accept
_OUT_OF_RANGE = [
    ("max_content_bytes", "0"),
    ("embedding.dim", "0"),
    ("embedding.threads", "0"),
    ("embedding.batch_size", "0"),
    ("embedding.max_batch_wait_ms", "1e13"),
    ("search.max_results", "0"),
    ("search.max_results", "1001"),
    ("search.top_k", "0"),
    ("search.top_k", "5000"),
    ("search.min_score", "1.5"),
    ("search.approximate_from", "0"),
    ("files.max_file_bytes", "0"),
    ("files.watch_debounce_ms", "10000000000000"),
    ("files.sync_interval_s", "0"),
    ("files.lazy_sync_wait_s", "1e10"),
    ("episodic.recency_half_life_s", "0"),
    ("episodic.retention_max_age_s", "1e20"),
    ("agent.retrieval_timeout_s", "0"),
    ("agent.retrieval_top_k", "0"),
    ("agent.recent_episodes_in_prompt", "1001"),
    ("agent.retrieval_min_score", "-2"),
    ("agent.files_in_prompt", "1001"),
    ("agent.code_in_prompt", "1001"),
    ("actors.restart_window_s", "0"),
    ("actors.ask_timeout_s", "1e12"),
    ("actors.stop_timeout_s", "0"),
    ("actors.embed_timeout_s", "0"),
    ("actors.query_embed_timeout_s", "0"),
    ("bridges.workers", "0"),
    ("bridges.max_line_bytes", "63"),
]


def test_values_out_of_range_name_the_key_and_the_variable(isolated: Path) -> None:
    for key, value in _OUT_OF_RANGE:
        variable = "MEMSTRATA_" + key.upper().replace(".", "__")
        with pytest.raises(ConfigError) as caught:
            Config.load(env={variable: value})
        message = str(caught.value)
        assert f"config key '{key}' must be" in message and variable in message, message
        assert "\n" not in message


@pytest.mark.parametrize(
    ("key", "text", "value"),
    [
        ("search.top_k", "1000", 1000),
        ("search.max_results", "1", 1),
        ("search.min_score", "-1", -1.0),
        ("agent.files_in_prompt", "0", 0),
        ("agent.recent_episodes_in_prompt", "1000", 1000),
        ("bridges.max_line_bytes", "64", 64),
        ("actors.max_group_commit", "0", 0),
        ("chunking.tokens", "8", 8),
        ("episodic.retention_max_age_s", "86399999913600", 86_399_999_913_600.0),
    ],
)
def test_the_ends_of_each_range_are_accepted(isolated: Path, key: str, text: str, value: float) -> None:
    section, name = key.split(".")
    overlap = {"MEMSTRATA_CHUNKING__OVERLAP": "0"} if key == "chunking.tokens" else {}
    config = Config.load(env={f"MEMSTRATA_{section.upper()}__{name.upper()}": text, **overlap})
    assert getattr(getattr(config, section), name) == value


def test_out_of_range_values_from_a_file_or_arguments_name_the_key(isolated: Path) -> None:
    path = _write(isolated / "cfg.toml", "[search]\ntop_k = 0\n[agents.ops]\nretrieval_top_k = 1001\n")
    with pytest.raises(
        ConfigError, match=r"cfg\.toml: config key 'search\.top_k' must be an integer from 1 to 1000, got 0$"
    ):
        Config.load(path, env={})
    with pytest.raises(ConfigError, match=r"config key 'agents\.ops\.retrieval_top_k' must be"):
        Config.load(path, env={}, search__top_k=3)
    with pytest.raises(ConfigError, match=r"config key 'bridges\.workers' must be an integer >= 1, got 0"):
        Config.load(env={}, bridges__workers=0)
    for make, key in (
        (lambda: SearchConfig(top_k=0), "search.top_k"),
        (lambda: SearchConfig(min_score=None), "search.min_score"),
        (lambda: BridgesConfig(workers=0), "bridges.workers"),
        (lambda: AgentConfig(retrieval_top_k=1001), "agent.retrieval_top_k"),
        (lambda: ActorsConfig(ask_timeout_s=math.nan), "actors.ask_timeout_s"),
        (lambda: Config(max_content_bytes=0), "max_content_bytes"),
    ):
        with pytest.raises(ConfigError, match=f"config key '{re.escape(key)}' must be"):
            make()


_BAD_WORDS = [
    ("storage.synchronous", "off", "one of 'normal', 'full'"),
    ("agent.workspace_access", "write", "one of 'rw', 'ro', 'none'"),
    ("cluster.engine", "spark", "one of 'local', 'ray'"),
    ("cluster.group", "node", "one of 'agent', 'layer'"),
    ("cluster.address", "nowhere", "'auto', 'local', 'ray://host:port' or 'host:port'"),
    ("cluster.namespace", "a b", "1-64 letters"),
    ("cluster.placement", "resource:", "'spread', 'resource:NAME' or 'label:KEY=VALUE'"),
    ("cluster.pins", "a=resource:n,b=spread", "items must read 'agent_id=resource:NAME'"),
    ("cluster.placement", "resource:CPU", "'CPU', one of Ray's own resources"),
    ("cluster.pins", "a=resource:n,b=resource:GPU", "'GPU', one of Ray's own resources"),
]


@pytest.mark.parametrize(("key", "text", "rule"), _BAD_WORDS, ids=[k for k, _, _ in _BAD_WORDS])
def test_string_keys_name_the_key_and_the_variable_wherever_the_value_comes_from(
    isolated: Path, key: str, text: str, rule: str
) -> None:
    """A string key's rule checks it as a number's range does: from the environment (the error
    names the variable), from a file and from arguments."""
    variable = "MEMSTRATA_" + key.upper().replace(".", "__")
    with pytest.raises(ConfigError) as caught:
        Config.load(env={variable: text})
    message = str(caught.value)
    assert message.startswith(f"configuration: config key '{key}' ") and rule in message, message
    assert message.endswith(f"(from environment variable {variable})") and "\n" not in message, message
    section, name = key.split(".")
    value: object = tuple(text.split(",")) if name == "pins" else text
    path = _write(isolated / "cfg.toml", f"[{section}]\n{name} = {json.dumps(value)}\n")
    with pytest.raises(
        ConfigError, match=rf"/cfg\.toml: config key '{re.escape(key)}' .*{re.escape(rule)}.*[^)]$"
    ):
        Config.load(path, env={})
    with pytest.raises(
        ConfigError, match=rf"^configuration: config key '{re.escape(key)}' .*{re.escape(rule)}"
    ):
        Config.load(env={}, **{f"{section}__{name}": value})


def test_cluster_pins_are_a_list_from_arguments_a_file_or_the_environment(isolated: Path) -> None:
    """Pins given as a list (as TOML gives them) place their agents; a lone string is refused
    naming the key, never taken and then ignored; Ray's own resources are no placement."""
    pins = ["billing=resource:node_a", "search=label:zone=b"]
    made = ClusterConfig(pins=pins)  # type: ignore[arg-type]
    assert made.pins == tuple(pins)
    assert made.placement_of("billing") == "resource:node_a"
    assert made.placement_of("search") == "label:zone=b"
    assert made.placement_of("other") == "spread"
    assert ClusterConfig(pins=tuple(pins)) == made
    path = _write(isolated / "cfg.toml", f"[cluster]\npins = {json.dumps(pins)}\n")
    assert Config.load(path, env={}).cluster.placement_of("billing") == "resource:node_a"
    assert Config.load(env={}, cluster__pins=pins).cluster.pins == tuple(pins)
    for make in (
        lambda: ClusterConfig(pins="billing=resource:node_a"),  # type: ignore[arg-type]
        lambda: Config.load(env={}, cluster__pins="billing=resource:node_a"),
        lambda: Config.load(
            _write(isolated / "one.toml", '[cluster]\npins = "billing=resource:x"\n'), env={}
        ),
    ):
        with pytest.raises(ConfigError, match=r"config key 'cluster\.pins' ") as caught:
            make()
        assert "\n" not in str(caught.value)
    for resource in ("CPU", "GPU", "memory"):
        with pytest.raises(
            ConfigError, match=rf"'cluster\.placement' cannot place on '{resource}'"
        ) as caught:
            ClusterConfig(placement=f"resource:{resource}")
        assert "\n" not in str(caught.value) and "resource:NAME" in str(caught.value)
        with pytest.raises(ConfigError, match=rf"'cluster\.pins' cannot place on '{resource}'"):
            ClusterConfig(pins=(f"a=resource:{resource}",))


def test_every_numeric_key_declares_its_range() -> None:
    sections = (Config, EmbeddingConfig, SearchConfig, ChunkingConfig, FilesConfig, SyncConfig)
    sections += (EpisodicConfig, AgentConfig, ActorsConfig, StorageConfig, BridgesConfig, ClusterConfig)
    for section in sections:
        hints = typing.get_type_hints(section)
        for item in dataclasses.fields(section):
            if {int, float} & {hints[item.name], *typing.get_args(hints[item.name])}:
                assert "rule" in item.metadata, f"{section.__name__}.{item.name} has no range"


def test_a_section_that_is_not_its_dataclass_is_a_config_error(isolated: Path) -> None:
    with pytest.raises(ConfigError, match=r"config section 'actors' must be of type ActorsConfig, got dict"):
        Config(actors={"blackboard_snapshot": True})  # type: ignore[arg-type]
    with pytest.raises(
        ConfigError, match=r"config section 'agents\.ops' must be of type AgentConfig, got dict"
    ):
        Config(agents={"ops": {"retrieval_top_k": 3}})  # type: ignore[dict-item]
    # the mapping form goes through from_mapping, checked as TOML is
    assert Config.from_mapping({"actors": {"blackboard_snapshot": True}}).actors.blackboard_snapshot is True
