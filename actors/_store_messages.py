"""The store actors' internal messages (write-backs, bounded searches, export, vector upkeep) and
the records of their vector requests: what the agent actor, the runtime and the stores exchange
besides the public messages."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memstrata.storage import FloatArray

from ._base import Envelope
from .messages import StoreKnowledge, StoreMemory

__all__ = [
    "BoundedSearch",
    "CatchUp",
    "EpisodesImported",
    "ExportRecords",
    "ImportRecords",
    "Searched",
    "VectorsReady",
    "WriteBackEpisode",
    "WriteBackKnowledge",
]


@dataclass(frozen=True, slots=True)
class WriteBackEpisode:
    """Internal: the episode of a write-back.

    It is embedded by its content alone, the text its knowledge entry is embedded by, so the
    embedding service computes one vector for both (see :class:`EpisodicActor`). ``once``:
    record it unless the same episode of the same task run already exists (a replay after a
    crash, so a write-back committed just before the crash is not recorded twice).
    """

    message: StoreMemory
    once: bool = False


@dataclass(frozen=True, slots=True)
class WriteBackKnowledge:
    """Internal: the knowledge entry of a write-back (its text passed the content rule before its
    outbox acknowledged it). Like :class:`WriteBackEpisode`, it may wait for the store's vectors
    in flight to be written in their transaction (see :class:`_PersistentActor`)."""

    message: StoreKnowledge


@dataclass(frozen=True, slots=True)
class BoundedSearch:
    """Internal: a ``QueryKnowledge`` or ``SearchMemory`` whose query embedding must answer within
    ``embed_s`` seconds (``None``: ``actors.query_embed_timeout_s``); answered with :class:`Searched`."""

    message: Any
    embed_s: float | None = None


@dataclass(frozen=True, slots=True)
class Searched:
    """Internal: a search's result and, when it ranked by keywords only because the model was
    late or faulty, why (``"keyword-only: model ... did not answer within 2 s"``)."""

    result: Any
    degraded: str | None = None


@dataclass(frozen=True, slots=True)
class ExportRecords:
    """Internal: every record the actor's store holds, as plain JSON-ready dicts (see
    ``memstrata export``), answered as a list. ``into``: the file the export will replace
    (symlinks resolved); an episodic store refuses when it is one of its archives."""

    into: str | None = None


@dataclass(frozen=True, slots=True)
class ImportRecords:
    """Internal: restore records made by :class:`ExportRecords` (of this actor's kind) with
    their times and ids; answered with how many were added (an episodic store: with
    :class:`EpisodesImported`)."""

    records: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class EpisodesImported:
    """Internal: how many episodes an import added, and the id here of each exported id that
    names another episode now (renumbered, or present under another id), so the ``episode_id``
    tags of knowledge promoted from them can follow."""

    added: int
    ids: dict[int, int]


@dataclass(frozen=True, slots=True)
class CatchUp:
    """Internal: compute pending vectors now (posted by a timer, with backoff, while some wait)."""


@dataclass(frozen=True, slots=True)
class VectorsReady:
    """Internal: the embedding service answered (or failed) the vector request ``token``."""

    token: int


@dataclass(frozen=True, slots=True)
class _AskVectors:
    """Internal: ask for the pending vectors once the messages queued before this one are handled
    (writes arriving together share one request, one model batch and one vector transaction)."""


@dataclass(frozen=True, slots=True)
class _FlushHeld:
    """Internal: write the held write-backs whose vectors are answered, or (``bound``: their
    wait is up) all of them."""

    bound: bool = False


@dataclass(slots=True)
class _Held:
    """Write-backs waiting for their vectors: rows ``offset`` on of ``future``'s answer, once
    asked for."""

    envelopes: list[Envelope]
    future: Future[FloatArray] | None = field(default=None, repr=False)
    offset: int = 0

    def answered(self) -> bool:
        return self.future is not None and self.future.done()


@dataclass(slots=True)
class _Answered:
    """Answered vector requests taken together: their rows, and the last failure among them."""

    ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    rows: list[FloatArray] = field(default_factory=list)
    failed: BaseException | None = None
    requests: int = 0

    def vectors(self) -> FloatArray:
        return self.rows[0] if len(self.rows) == 1 else np.concatenate(self.rows)


@dataclass(slots=True)
class _VectorRequest:
    """Pending rows whose vectors the embedding service computes now."""

    ids: list[int]
    texts: list[str]
    future: Future[FloatArray] = field(repr=False)
