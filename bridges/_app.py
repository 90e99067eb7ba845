"""What every CLI command shares: resolved options, config, and lazily started backends.

Nothing heavy is imported here at module level: ``memstrata --help`` and commands that fail on
their arguments never load numpy, the actor system or the embedding model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memstrata._workspaces import Workspaces
    from memstrata.config import Config

__all__ = ["CliState"]


@dataclass
class CliState:
    """Per-invocation state (``ctx.obj``). Tests may pass one in with an embedder to use."""

    data_dir: Path | None = None
    config_path: Path | None = None
    debug: bool = False
    embedder: Any = None
    _config: Config | None = field(default=None, repr=False)

    @property
    def config(self) -> Config:
        if self._config is None:
            from memstrata.config import Config

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

    @contextlib.contextmanager
    def workspaces(self, system: Any = None) -> Iterator[Workspaces]:
        """The file-index registry; with a running ``system``, its shared embedder is used."""
        from memstrata._workspaces import Workspaces

        embedder = self.embedder
        if embedder is None and system is not None:
            embedder = system.embedder
        registry = Workspaces(self.config.data_dir, config=self.config, embedder=embedder)
        try:
            yield registry
        finally:
            registry.close()
