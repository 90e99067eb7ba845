"""Configuration: dataclasses loaded from TOML, then the environment, then explicit arguments.

Lookup order for the file: ``--config``/``path``, ``./memstrata.toml``,
``~/.config/memstrata/config.toml``. Unknown keys and bad values raise :class:`ConfigError`
naming the key. ``[agents.<id>]`` tables override agent settings per agent; their ``embedding``
sub-table gives that agent's stores, workspace and queries a model of their own, and their
``sync`` and ``files`` sub-tables override those sections for that agent's workspace.
``[codebases]`` names shared source trees (``name = "path"``) every agent may search. Users
import these names from :mod:`memstrata.config`.

The dataclasses are frozen without slots: a process holds a few of them, and building slotted
classes cost ~8 ms of every command's start (``memstrata --help`` imports this module).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from memstrata.core.constants import APPROXIMATE_FROM, MAX_TOP_K, MIN_LINE_BYTES, SYNCHRONOUS_MODES
from memstrata.core.errors import ConfigError, InvalidInputError
from memstrata.core.validation import check_agent_id, check_min_score, check_path, check_top_k, show

from ._cluster_rules import check_pins, check_placement, check_ray_address, check_ray_name
from ._config_values import (
    MAX_SPAN_S,
    MAX_WAIT_S,
    UNSET,
    EnvValue,
    at_least,
    check_fields,
    checked,
    convert,
    env_source,
    find_file,
    in_range,
    number,
    one_of,
    seconds,
    set_dotted,
    unless_empty,
)

__all__ = [
    "WORKSPACE_ACCESS",
    "ActorsConfig",
    "AgentConfig",
    "BridgesConfig",
    "ChunkingConfig",
    "ClusterConfig",
    "Config",
    "EmbeddingConfig",
    "EpisodicConfig",
    "FilesConfig",
    "SearchConfig",
    "StorageConfig",
    "SyncConfig",
    "default_data_dir",
]


def default_data_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("memstrata"))


@dataclass(frozen=True)
class EmbeddingConfig:
    model: str = "default"  # "default" = the packaged offline model; a fastembed name or a directory
    dim: int | None = checked(None, at_least(1), unset=True)  # required for a model directory
    threads: int | None = checked(None, at_least(1), unset=True)
    batch_size: int = checked(64, at_least(1))
    # how long the shared embedding service waits to fill a batch
    max_batch_wait_ms: float = checked(2.0, number(0.0, MAX_WAIT_S * 1000))

    def __post_init__(self) -> None:
        check_fields(self, "embedding.")


@dataclass(frozen=True)
class SearchConfig:
    # hits of a search: what the messages and the file search accept (1 to MAX_TOP_K)
    max_results: int = checked(6, check_top_k)  # file search
    top_k: int = checked(10, check_top_k)  # knowledge and episodic search
    min_score: float = checked(0.35, check_min_score)  # cosine floor for the semantic side of file search
    snippet_chars: int = checked(700, at_least(0))
    # fusion of the vector and keyword rankings (weighted RRF, see memstrata.storage.fuse);
    # rrf_k = 60 with equal weights is textbook RRF
    rrf_k: int = checked(5, at_least(0))
    vector_weight: float = checked(1.0, number())
    keyword_weight: float = checked(1.5, number())
    depth: int = checked(50, at_least(0))  # candidates per list before fusion (at least top_k)
    # live vectors from which a store's vector search scans only the inverted lists nearest the
    # query (measured recall: docs/storage.md); None: always exact
    approximate_from: int | None = checked(APPROXIMATE_FROM, at_least(1), unset=True)

    def __post_init__(self) -> None:
        check_fields(self, "search.")


@dataclass(frozen=True)
class ChunkingConfig:
    tokens: int = checked(400, at_least(8))  # a chunk's budget; fewer than 8 would cut every line
    overlap: int = checked(80, at_least(0))  # tokens repeated from the chunk before: below tokens

    def __post_init__(self) -> None:
        check_fields(self, "chunking.")
        if self.overlap >= self.tokens:
            raise ConfigError(
                f"config key 'chunking.overlap' must be below chunking.tokens ({self.tokens}), "
                f"got {self.overlap}"
            )


@dataclass(frozen=True)
class FilesConfig:
    extra_paths: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ("IDENTITY.md", "SOUL.md", "USER.md", "AGENTS.md", "TOOLS.md")
    code_extensions: tuple[str, ...] = (
        ".py", ".pyi", ".rs", ".ts", ".tsx", ".mts", ".cts", ".js", ".jsx", ".mjs", ".cjs", ".cs", ".go",
        ".java", ".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".hxx", ".gd", ".md", ".markdown",
        ".toml", ".json", ".yaml", ".yml",
    )  # fmt: skip
    pruned_dirs: tuple[str, ...] = (
        ".git", "node_modules", "__pycache__", "bin", "obj", "target", "dist", "build", ".venv", "venv",
    )  # fmt: skip
    max_file_bytes: int = checked(2_000_000, at_least(1))
    watch_debounce_ms: int = checked(1500, in_range(0, int(MAX_WAIT_S * 1000)))
    sync_interval_s: float | None = checked(None, seconds(), unset=True)
    lazy_sync_wait_s: float = checked(2.0, number(0.0, MAX_WAIT_S))

    def __post_init__(self) -> None:
        check_fields(self, "files.")


@dataclass(frozen=True)
class SyncConfig:
    """When workspaces and codebases are synced with their files (``files.sync_interval_s`` adds
    an interval, ``files.watch_debounce_ms`` debounces the watcher)."""

    on_session_start: bool = True  # when the system starts (codebases) or an agent is first used
    watch: bool = True  # a watchdog watcher syncs changes in the background
    lazy: bool = True  # a search first syncs what changed, waiting at most files.lazy_sync_wait_s


WORKSPACE_ACCESS = ("rw", "ro", "none")


@dataclass(frozen=True)
class EpisodicConfig:
    recency_half_life_s: float | None = checked(None, seconds(MAX_SPAN_S), unset=True)
    retention_max_count: int | None = checked(None, at_least(0), unset=True)
    retention_max_age_s: float | None = checked(None, seconds(MAX_SPAN_S), unset=True)
    archive_dir: str | None = None

    def __post_init__(self) -> None:
        check_fields(self, "episodic.")


@dataclass(frozen=True)
class AgentConfig:
    retrieval_timeout_s: float = checked(5.0, seconds())
    retrieval_top_k: int = checked(5, check_top_k)
    include_shared: bool = True
    clear_working_memory_on_task_end: bool = True
    recent_episodes_in_prompt: int = checked(3, in_range(0, MAX_TOP_K))
    # cosine floor for semantic hits in prompts (keyword hits stay)
    retrieval_min_score: float | None = checked(0.3, check_min_score, unset=True)
    # the agent's memory workspace (MEMORY.md, memory/*.md): indexed, searched before tasks;
    # "rw" also appends task outcomes to memory/YYYY-MM-DD.md, "ro" never writes, "none" ignores it
    workspace: str | None = None
    workspace_access: str = checked("rw", one_of(WORKSPACE_ACCESS))
    codebases: tuple[str, ...] | None = None  # the [codebases] this agent searches (unset: all)
    files_in_prompt: int = checked(3, in_range(0, MAX_TOP_K))  # memory-file chunks in a task's prompt
    code_in_prompt: int = checked(3, in_range(0, MAX_TOP_K))  # code chunks in a task's prompt

    def __post_init__(self) -> None:
        check_fields(self, "agent.")


@dataclass(frozen=True)
class ActorsConfig:
    # restarts of one actor within restart_window_s before its agent is degraded
    max_restarts: int = checked(3, at_least(0))
    restart_window_s: float = checked(60.0, seconds(math.inf))
    ask_timeout_s: float = checked(30.0, seconds())  # default bound on a request to an actor
    stop_timeout_s: float = checked(30.0, seconds())  # how long stop() waits for mailboxes to drain
    # bound on a store's wait for the shared embedding service; below ask_timeout_s so a write is
    # stored (vector pending) and answered before its caller gives up. A model call running
    # longer makes the model "stuck": later requests fail at once until it returns. A request of
    # more than embedding.batch_size texts (a file sync) gets this per batch_size texts
    embed_timeout_s: float = checked(10.0, seconds())
    # bound on embedding a search's query; a search that reaches it ranks by keywords and says so.
    # Pre-task retrieval uses at most half of agent.retrieval_timeout_s for it
    query_embed_timeout_s: float = checked(2.0, seconds())
    # retries of a failed write-back before it waits for the next start
    writeback_retries: int = checked(5, at_least(0))
    blackboard_snapshot: bool = False  # save to blackboard/{session}.sqlite on stop, load on start
    # queued writes (write-backs, stores) an actor takes from its mailbox into one transaction;
    # 0 or 1: one transaction per message
    max_group_commit: int = checked(256, at_least(0))
    # how long a write-back step may wait, after it was sent, while other agents' pre-task
    # retrievals are in flight (their searches then have the GIL to themselves); 0: never
    writeback_yield_s: float = checked(0.1, number(0.0, MAX_WAIT_S))

    def __post_init__(self) -> None:
        check_fields(self, "actors.")
        for name in ("embed_timeout_s", "query_embed_timeout_s"):
            value = getattr(self, name)
            if value >= self.ask_timeout_s:
                raise ConfigError(
                    f"actors.{name} ({value:g} s) must be below actors.ask_timeout_s "
                    f"({self.ask_timeout_s:g} s): the inner timeout has to fire first, so the caller "
                    "gets a stored write or a keyword-ranked result rather than a timeout"
                )


@dataclass(frozen=True)
class StorageConfig:
    # how long a write waits for another process's lock before DatabaseBusyError; below
    # actors.ask_timeout_s so a caller gets the clear busy error rather than a timeout
    lock_timeout_s: float = checked(20.0, seconds())
    # "normal": a commit survives the process being killed; "full": it also survives power loss
    synchronous: str = checked("normal", one_of(SYNCHRONOUS_MODES))

    def __post_init__(self) -> None:
        check_fields(self, "storage.")


@dataclass(frozen=True)
class BridgesConfig:
    agent_id: str = "default"  # the agent LLM tools and MCP use when a call names none
    workers: int = checked(4, at_least(1))  # `memstrata serve` thread pool
    # longest request line `memstrata serve` accepts (no fewer than MIN_LINE_BYTES)
    max_line_bytes: int = checked(16 * 1024 * 1024, at_least(MIN_LINE_BYTES))

    def __post_init__(self) -> None:
        check_fields(self, "bridges.")


@dataclass(frozen=True)
class ClusterConfig:
    """Where the actors run: this process (``local``, pykka) or a Ray cluster (``ray``, the
    ``memstrata[ray]`` extra); see docs/scale-out.md."""

    engine: str = checked("local", one_of(("local", "ray")))
    # "auto" (a cluster `ray start` runs on this machine, or this process's Ray connection),
    # "ray://host:port" (Ray Client), "host:port" (the head's GCS) or "local" (a private one-node Ray)
    address: str = checked("auto", check_ray_address)
    # every named actor of memstrata lives in this Ray namespace
    namespace: str = checked("memstrata", check_ray_name)
    # "spread" (over the nodes), "resource:NAME" (nodes that declare the custom resource NAME) or
    # "label:KEY=VALUE" (nodes with that label)
    placement: str = checked("spread", check_placement)
    # per-agent placement, "agent_id=resource:NAME" or "agent_id=label:KEY=VALUE" (per-node data dirs)
    pins: tuple[str, ...] = checked((), check_pins)
    # "agent": one Ray actor per agent hosting its knowledge, episodic, working and task actors;
    # "layer": one Ray actor per layer per agent
    group: str = checked("agent", one_of(("agent", "layer")))

    def __post_init__(self) -> None:
        check_fields(self, "cluster.")
        if isinstance(self.pins, list):  # a list, as TOML gives it: kept as the tuple it is typed
            object.__setattr__(self, "pins", tuple(self.pins))

    def placement_of(self, agent_id: str) -> str:
        """The placement of ``agent_id``'s actors: its pin, else ``placement``."""
        for pin in self.pins:
            agent, _, where = pin.partition("=")
            if agent == agent_id:
                return where
        return self.placement


def _check_data_dir(value: object) -> None:
    """``data_dir`` as every door needs it: a path (the one path check), not blank (``Path("")`` is
    the working folder), usable by the file system, and not a file (said by every door, not only
    by the one that writes first)."""
    if isinstance(value, str) and not value.strip():
        raise ConfigError(f"config key 'data_dir' must be a path, got {value!r}")
    try:
        check_path(value, "config key 'data_dir'")
        is_file = Path(value).expanduser().is_file()  # type: ignore[arg-type]
    except InvalidInputError as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:  # a name too long for the file system, ...
        raise ConfigError(
            f"config key 'data_dir' cannot be used: {exc.strerror} ({show(str(value))})"
        ) from None
    if is_file:
        raise ConfigError(f"config key 'data_dir' is a file, not a folder: {str(value)!r}")


@dataclass(frozen=True)
class Config:
    data_dir: Path = field(default_factory=default_data_dir)
    max_content_bytes: int = checked(4_000_000, at_least(1))
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    chunking: ChunkingConfig = field(default_factory=ChunkingConfig)
    files: FilesConfig = field(default_factory=FilesConfig)
    episodic: EpisodicConfig = field(default_factory=EpisodicConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    actors: ActorsConfig = field(default_factory=ActorsConfig)
    bridges: BridgesConfig = field(default_factory=BridgesConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    agents: Mapping[str, AgentConfig] = field(default_factory=dict)
    codebases: Mapping[str, str] = field(default_factory=dict)  # name -> source tree
    # per-agent overrides of whole sections: {agent_id: {"embedding": EmbeddingConfig, ...}}
    agent_sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_sections(self)
        _check_data_dir(self.data_dir)
        check_fields(self, "")
        lock, ask = self.storage.lock_timeout_s, self.actors.ask_timeout_s
        if lock >= ask:
            raise ConfigError(
                f"storage.lock_timeout_s ({lock:g} s) must be below actors.ask_timeout_s ({ask:g} s): "
                "the inner timeout has to fire first, so the caller gets DatabaseBusyError rather "
                "than a timeout"
            )

    def for_agent(self, agent_id: str) -> AgentConfig:
        return self.agents.get(agent_id, self.agent)

    def of_agent(self, agent_id: str) -> Config:
        """This config as one agent sees it: its ``[agents.<id>]`` settings as ``agent`` and its
        ``embedding``, ``sync`` and ``files`` overrides in place of those sections."""
        sections = dict(self.agent_sections.get(agent_id, {}))
        return replace(self, agent=self.for_agent(agent_id), **sections)

    @classmethod
    def load(
        cls,
        path: str | Path | None = None,
        *,
        env: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> Config:
        """File, then environment (``MEMSTRATA_*``), then ``overrides`` (dotted keys allowed as ``a__b``)."""
        env = os.environ if env is None else env
        data: dict[str, Any] = {}
        source = find_file(path, env)
        if source is not None:
            try:
                data = tomllib.loads(source.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"cannot read config file {source}: {exc}") from exc
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"config file {source} is not valid TOML: {exc}") from exc
        for key, value in env.items():
            if key.startswith("MEMSTRATA_") and key not in _NOT_CONFIG_ENV:
                set_dotted(data, key[len("MEMSTRATA_") :].lower().replace("__", "."), value, from_env=True)
        for key, value in overrides.items():
            if value is not None:
                set_dotted(data, key.replace("__", "."), value, from_env=False)
        where = str(source) if source else "configuration"
        return cls.from_mapping(data, where=where)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, where: str = "configuration") -> Config:
        agents_raw = data.get("agents", {})
        codebases_raw = data.get("codebases", {})
        base = {k: v for k, v in data.items() if k not in ("agents", "codebases")}
        config: Config = _build(cls, base, "", where)
        if not isinstance(agents_raw, Mapping):
            raise ConfigError(f"{where}: 'agents' must be a table of agent ids")
        agents: dict[str, AgentConfig] = {}
        sections: dict[str, dict[str, Any]] = {}
        for agent_id, values in agents_raw.items():
            prefix = f"agents.{agent_id}."
            try:  # a section no agent could ever read is a mistake, not a setting
                check_agent_id(agent_id, "agent id")
            except InvalidInputError as exc:
                raise ConfigError(f"{where}: config section 'agents.{agent_id}': {exc}") from None
            if not isinstance(values, Mapping):
                raise ConfigError(f"{where}: {prefix.rstrip('.')} must be a table")
            own = {k: v for k, v in values.items() if k not in _AGENT_SECTIONS}
            agents[str(agent_id)] = _build(AgentConfig, own, prefix, where, base=config.agent)
            for name, section in _AGENT_SECTIONS.items():
                if name in values:
                    built = _build(
                        section, values[name], f"{prefix}{name}.", where, base=getattr(config, name)
                    )
                    sections.setdefault(str(agent_id), {})[name] = built
        if not isinstance(codebases_raw, Mapping):
            raise ConfigError(f"{where}: 'codebases' must be a table of name = \"path\"")
        codebases: dict[str, str] = {}
        for name, path in codebases_raw.items():
            if isinstance(path, EnvValue) and path == "":
                continue  # MEMSTRATA_CODEBASES__X= is not set, as every empty variable
            if not isinstance(path, str) or not path.strip():
                raise ConfigError(
                    f"{where}: config key 'codebases.{name}' must be a path string, got {path!r}"
                    f"{env_source(path, f'codebases.{name}')}"
                )
            codebases[str(name)] = str(path)
        return replace(config, agents=agents, codebases=codebases, agent_sections=sections)


_AGENT_SECTIONS: dict[str, type] = {"embedding": EmbeddingConfig, "sync": SyncConfig, "files": FilesConfig}
_SECTIONS: dict[str, type] = {
    "embedding": EmbeddingConfig,
    "search": SearchConfig,
    "chunking": ChunkingConfig,
    "files": FilesConfig,
    "episodic": EpisodicConfig,
    "agent": AgentConfig,
    "actors": ActorsConfig,
    "bridges": BridgesConfig,
    "storage": StorageConfig,
    "sync": SyncConfig,
    "cluster": ClusterConfig,
}


def _check_sections(config: Config) -> None:
    """Each section is its dataclass: a dict given to ``Config(...)`` would otherwise fail later,
    far from its cause, as an AttributeError."""
    if not isinstance(config.agents, Mapping):
        raise ConfigError(
            f"config section 'agents' must be a mapping of agent id to AgentConfig, got {show(config.agents)}"
        )
    sections = {name: getattr(config, name) for name in _SECTIONS}
    sections.update((f"agents.{agent_id}", settings) for agent_id, settings in config.agents.items())
    for name, section in sections.items():
        expected = _SECTIONS.get(name, AgentConfig)
        if not isinstance(section, expected):
            raise ConfigError(
                f"config section {name!r} must be of type {expected.__name__}, got "
                f"{type(section).__name__} (Config.from_mapping reads a mapping shaped like the TOML file)"
            )


_NOT_CONFIG_ENV = {"MEMSTRATA_MODEL_DIR", "MEMSTRATA_CONFIG", "MEMSTRATA_DEBUG"}


def _build(cls: Any, data: Any, prefix: str, where: str, base: Any = None) -> Any:
    if not isinstance(data, Mapping):
        name = prefix.rstrip(".") or "config"
        raise ConfigError(f"{where}: {name} must be a table{env_source(data, name)}")
    hints = typing.get_type_hints(cls)
    skip = ("agents", "codebases", "agent_sections") if cls is Config else ()
    known = {f.name: f for f in fields(cls) if f.name not in skip}
    values: dict[str, Any] = {}
    for key, raw in data.items():
        if key not in known:
            raise ConfigError(f"{where}: unknown config key {prefix + key!r}{env_source(raw, prefix + key)}")
        hint = hints[key]
        raw = unless_empty(raw, hint)  # MEMSTRATA_DATA_DIR= is not the working directory
        if raw is UNSET:
            continue
        if dataclasses.is_dataclass(hint):
            values[key] = _build(hint, raw, f"{prefix}{key}.", where, base=getattr(base, key, None))
        else:
            values[key] = convert(raw, hint, prefix + key, where, known[key].metadata)
    try:  # built from the values when no base: a default (the data dir's lookup) given is not made
        return cls(**values) if base is None else replace(base, **values)
    except ConfigError as exc:  # a rule between two keys: name the file and their variables
        named = [(key, raw) for key, raw in data.items() if prefix + key in str(exc)]
        given = "".join(env_source(raw, prefix + key) for key, raw in named)
        raise ConfigError(f"{where}: {exc}{given}") from None
