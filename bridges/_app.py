"""What every CLI command shares: resolved options, config, and lazily started backends.

Nothing heavy is imported here at module level: ``memstrata --help`` and commands that fail on
their arguments never load numpy, the actor system or the embedding model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

if TYPE_CHECKING:
    from memstrata._workspaces import Workspaces
    from memstrata.core.config import Config

__all__ = ["CliState", "NoWorkspaces"]

_NOTHING_INDEXED = "no memories indexed yet (run: memstrata index PATH)"


class NoWorkspaces:
    """The registry of a data dir where nothing was ever indexed, without creating one."""

    def roots(self) -> list[Any]:
        return []

    def find(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []

    def status(self) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> NoReturn:
            from memstrata.core.errors import MemstrataError

            raise MemstrataError(_NOTHING_INDEXED)

        return refuse


@dataclass
class CliState:
    """Per-invocation state (``ctx.obj``). Tests may pass one in with an embedder to use."""

    data_dir: Path | None = None
    config_path: Path | None = None
    debug: bool = False
    embedder: Any = None
    # set by a command that has written its answer and left nothing open (no system started, its
    # stores closed): the console script then ends the process without the interpreter's teardown
    answered_in_process: bool = False
    _config: Config | None = field(default=None, repr=False)

    @property
    def config(self) -> Config:
        if self._config is None:
            from memstrata.core.config import Config

            overrides: dict[str, Any] = {}
            if self.data_dir is not None:
                overrides["data_dir"] = self.data_dir
            self._config = Config.load(self.config_path, **overrides)
        return self._config

    @contextlib.contextmanager
    def system(self) -> Iterator[Any]:
        """A running MemorySystem, stopped (write-backs flushed) on the way out."""
        from memstrata import MemorySystem

        with MemorySystem.start(self.config, embedder=self.embedder) as system:
            yield system

    def store_exists(self, kind: str, agent_id: str, *, shared: bool = False) -> bool:
        """Whether ``agent_id`` has a ``kind`` store (``knowledge``, ``episodic``) on disk yet.

        Read commands answer "nothing found" for an agent without one instead of starting the
        system, which would create the store (and cannot, in a read-only data dir).
        """
        from memstrata.core.validation import check_agent_id

        agent = check_agent_id(agent_id, "agent_id", allow_shared=shared)
        return (self.config.data_dir / kind / f"{agent}.sqlite").exists()

    def has_workspaces(self) -> bool:
        """Whether any folder was ever indexed (the registry exists); reads never create it."""
        return (self.config.data_dir / "workspaces.sqlite").exists()

    @contextlib.contextmanager
    def workspaces(self, system: Any = None, *, create: bool = True) -> Iterator[Workspaces]:
        """The file-index registry; with a running ``system``, its shared embedder is used.

        Without a registry on disk, and with ``create`` false or a data dir that cannot be
        written, an empty stand-in is yielded: nothing was indexed, and nothing is created.
        """
        from memstrata._workspaces import Workspaces
        from memstrata.storage._connection import writable

        if not self.has_workspaces() and (
            not create or not writable(self.config.data_dir / "workspaces.sqlite")
        ):
            yield cast("Workspaces", NoWorkspaces())
            return
        embedder = self.embedder
        if embedder is None and system is not None:
            embedder = system.embedder
        registry = Workspaces(self.config.data_dir, config=self.config, embedder=embedder)
        try:
            yield registry
        finally:
            registry.close()
