"""Configuration, for users: defined in :mod:`memstrata.core.config`."""

from memstrata.core.config import (
    WORKSPACE_ACCESS,
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
    default_data_dir,
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
