"""The one exception hierarchy of memstrata, for users: defined in :mod:`memstrata.core.errors`."""

from memstrata.core.errors import (
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
    ReadOnlyError,
    RequestTimeoutError,
    SchemaMismatchError,
    StorageError,
    SystemStoppedError,
)

__all__ = [
    "ActorCrashedError",
    "AgentDegradedError",
    "ArchiveError",
    "ConfigError",
    "DatabaseBusyError",
    "EmbedderUnavailableError",
    "EmbeddingError",
    "InvalidInputError",
    "MemstrataError",
    "ModelFaultError",
    "PathOutsideRootError",
    "ReadOnlyError",
    "RequestTimeoutError",
    "SchemaMismatchError",
    "StorageError",
    "SystemStoppedError",
]
