"""The one exception hierarchy of memstrata (users import it as ``memstrata.errors``).

Backend errors (sqlite, fastembed, watchdog, pykka) are translated into these at the boundary
with ``raise ... from exc`` so callers never need to import a backend to catch a failure.
Invalid arguments raise subclasses of :class:`ValueError` whose message names the argument.

The tree::

    MemstrataError
      ActorCrashedError
        AgentDegradedError
      EmbeddingError
        EmbedderUnavailableError
        ModelFaultError
      InvalidInputError (also ValueError)
        ArchiveError
        ConfigError
        PathOutsideRootError
      RequestTimeoutError (also TimeoutError)
      RootMissingError
      StorageError
        DatabaseBusyError
        ReadOnlyError
        SchemaMismatchError
      SystemStoppedError
"""

from __future__ import annotations

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
    "RootMissingError",
    "SchemaMismatchError",
    "StorageError",
    "SystemStoppedError",
]


class MemstrataError(Exception):
    """Root of every error memstrata raises on purpose."""


class InvalidInputError(MemstrataError, ValueError):
    """An argument is malformed; the message names the argument and what was wrong."""


class ConfigError(InvalidInputError):
    """A configuration key is unknown or its value is invalid; the message names the key."""


class PathOutsideRootError(InvalidInputError):
    """A path leaves the workspace or codebase root (``..``, absolute path, symlink escape)."""


class ArchiveError(InvalidInputError):
    """An episodic archive file is unreadable, truncated or of an unknown format."""


class RootMissingError(MemstrataError):
    """A watched folder is gone (deleted, moved away or unmounted): nothing of it can be synced
    until a folder is back at its path, when watching resumes."""


class StorageError(MemstrataError):
    """SQLite failed: I/O error, full disk, corrupt file."""


class DatabaseBusyError(StorageError):
    """Another process held the database lock for longer than the configured bound."""


class ReadOnlyError(StorageError):
    """A database or the data directory cannot be written: reads are served, writes fail with this."""


class SchemaMismatchError(StorageError):
    """A database was written by an incompatible schema or a different kind of store."""


class EmbeddingError(MemstrataError):
    """The embedding model failed after its retries."""


class ModelFaultError(EmbeddingError):
    """The model answered too late or with unusable vectors (all zero, NaN, wrong shape).

    A fault of the model, never of the caller's input: the text is stored with its vector
    pending, and the vector is computed again once the model works.
    """


class EmbedderUnavailableError(EmbeddingError):
    """No embedding model could be loaded: memstrata runs keyword-only and says so in ``status()``."""


class ActorCrashedError(MemstrataError):
    """A memory actor failed while handling a request; its supervisor restarts it."""


class AgentDegradedError(ActorCrashedError):
    """An agent's actors crashed more often than the restart budget allows."""


class RequestTimeoutError(MemstrataError, TimeoutError):
    """A memory actor did not answer a request within its timeout.

    The request is dropped if the actor had not started it yet; one already running completes.
    """


class SystemStoppedError(MemstrataError):
    """The memory system was stopped; no further requests are accepted."""
