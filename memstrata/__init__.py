"""memstrata: layered memory for multi-agent orchestrators.

Public names are imported lazily so that ``import memstrata`` stays cheap (the CLI and the
JSON-lines server start fast) and the embedding model loads only when first needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .core.lazy import lazy_attributes
from .errors import (
    ActorCrashedError,
    AgentDegradedError,
    ArchiveError,
    ConfigError,
    DatabaseBusyError,
    EmbedderUnavailableError,
    EmbeddingError,
    InvalidInputError,
    MemstrataError,
    ModelFaultError,
    PathOutsideRootError,
    RequestTimeoutError,
    SchemaMismatchError,
    StorageError,
    SystemStoppedError,
)

if TYPE_CHECKING:
    from memstrata.config import Config
    from memstrata.layers import (
        Codebase,
        Episode,
        EpisodeHit,
        EpisodicMemory,
        FileHit,
        KnowledgeEntry,
        KnowledgeHit,
        KnowledgeStore,
        MemoryFiles,
        SyncStats,
    )
    from memstrata.storage import Embedder, FastEmbedEmbedder, default_embedder

    from ._agent_handle import Agent
    from ._async import AsyncAgent, AsyncBlackboard, AsyncMemorySystem, AsyncSubscription
    from ._board_handle import Blackboard, Subscription
    from ._system import MemorySystem

__version__ = "0.1.0"

_LAZY = {
    "Config": "memstrata.config",
    "KnowledgeStore": "memstrata.layers",
    "KnowledgeEntry": "memstrata.layers",
    "KnowledgeHit": "memstrata.layers",
    "EpisodicMemory": "memstrata.layers",
    "Episode": "memstrata.layers",
    "EpisodeHit": "memstrata.layers",
    "MemoryFiles": "memstrata.layers",
    "Codebase": "memstrata.layers",
    "FileHit": "memstrata.layers",
    "SyncStats": "memstrata.layers",
    "Embedder": "memstrata.storage",
    "FastEmbedEmbedder": "memstrata.storage",
    "default_embedder": "memstrata.storage",
    "MemorySystem": "memstrata._system",
    "AsyncMemorySystem": "memstrata._async",
    "AsyncAgent": "memstrata._async",
    "AsyncBlackboard": "memstrata._async",
    "AsyncSubscription": "memstrata._async",
    "Agent": "memstrata._agent_handle",
    "Blackboard": "memstrata._board_handle",
    "Subscription": "memstrata._board_handle",
}

lazy_attributes(__name__, _LAZY)

__all__ = [
    "ActorCrashedError",
    "Agent",
    "AgentDegradedError",
    "ArchiveError",
    "AsyncAgent",
    "AsyncBlackboard",
    "AsyncMemorySystem",
    "AsyncSubscription",
    "Blackboard",
    "Codebase",
    "Config",
    "ConfigError",
    "DatabaseBusyError",
    "Embedder",
    "EmbedderUnavailableError",
    "EmbeddingError",
    "Episode",
    "EpisodeHit",
    "EpisodicMemory",
    "FastEmbedEmbedder",
    "FileHit",
    "InvalidInputError",
    "KnowledgeEntry",
    "KnowledgeHit",
    "KnowledgeStore",
    "MemoryFiles",
    "MemorySystem",
    "MemstrataError",
    "ModelFaultError",
    "PathOutsideRootError",
    "RequestTimeoutError",
    "SchemaMismatchError",
    "StorageError",
    "Subscription",
    "SyncStats",
    "SystemStoppedError",
    "default_embedder",
]
