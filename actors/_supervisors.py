"""Supervisors: they create children on first use, restart or degrade them, and stop them.

pykka has no supervision, so memstrata adds the little it needs. A supervisor is an actor whose
mailbox serialises the creation of its children (one child per key, however many callers ask at
once) and their shutdown. Its restart policy lives in the shared :class:`Supervision` object,
which a failing child consults synchronously from its own thread: that keeps the decision
deterministic and keeps the child's mailbox (nothing queued is lost), while the child reopens its
layer in its own thread, where its database connection must live.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import pykka

from memstrata.core.errors import SystemStoppedError

from ._agent import AgentActor
from ._base import MemoryActor, owner_of
from ._blackboard import BlackboardActor
from ._episodic_actor import EpisodicActor
from ._items_actor import ItemsActor
from ._knowledge_actor import KnowledgeStoreActor
from ._working_actor import WorkingMemoryActor
from ._workspace import CodebaseActor, WorkspaceActor

__all__ = [
    "AgentSupervisor",
    "BlackboardSupervisor",
    "FilesSupervisor",
    "KnowledgeSupervisor",
    "MemorySupervisor",
    "Supervisor",
]

log = logging.getLogger("memstrata.actors")


@dataclass(frozen=True, slots=True)
class Spawn:
    kind: str
    key: str


@dataclass(frozen=True, slots=True)
class StopChildren:
    timeout_s: float
    owner: str | None = None  # None: every child (and then refuse new ones)


@dataclass(frozen=True, slots=True)
class Children:
    pass


class Supervisor(pykka.ThreadingActor):
    """Creates, tracks and stops the children of some kinds."""

    use_daemon_thread = True
    child_kinds: ClassVar[dict[str, type[MemoryActor]]] = {}

    def __init__(self, runtime: Any) -> None:
        super().__init__()
        self.runtime = runtime
        self.children: dict[tuple[str, str], pykka.ActorRef[Any]] = {}
        self.closed = False

    def __str__(self) -> str:
        return type(self).__name__

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Spawn):
            return self._spawn(message.kind, message.key)
        if isinstance(message, StopChildren):
            return self._stop_children(message.timeout_s, message.owner)
        if isinstance(message, Children):
            return [(kind, key, ref) for (kind, key), ref in self.children.items() if ref.is_alive()]
        return None

    def _spawn(self, kind: str, key: str) -> pykka.ActorRef[Any]:
        ref = self.children.get((kind, key))
        if ref is not None and ref.is_alive():
            return ref
        if self.closed:
            raise SystemStoppedError("the memory system is stopping")
        cls = self.child_kinds[kind]
        ref = cls.start(self.runtime, key)
        self.children[(kind, key)] = ref
        return ref

    def _stop_children(self, timeout_s: float, owner: str | None) -> list[str]:
        """Stop children (each drains its mailbox first); returns those that did not stop in time."""
        if owner is None:
            self.closed = True
        chosen = {
            k: ref
            for k, ref in self.children.items()
            if owner is None or (ref.is_alive() and owner_of(*k) == owner)
        }
        deadline = time.monotonic() + timeout_s
        futures = {}
        for k, ref in chosen.items():
            with contextlib.suppress(pykka.ActorDeadError):
                futures[k] = ref.stop(block=False)
        late = []
        for k, future in futures.items():
            try:
                future.get(timeout=max(0.0, deadline - time.monotonic()))
            except pykka.Timeout:
                late.append(f"{k[0]}:{k[1]}")
            except Exception:
                log.exception("stopping %s:%s failed", *k)
        for k in chosen:
            self.children.pop(k, None)
        return late


class KnowledgeSupervisor(Supervisor):
    """Parent of every ``KnowledgeStoreActor`` (one per agent, plus ``shared``)."""

    child_kinds: ClassVar[dict[str, type[MemoryActor]]] = {"knowledge": KnowledgeStoreActor}


class MemorySupervisor(Supervisor):
    """Parent of every ``EpisodicActor`` and ``WorkingMemoryActor``, and of the ``ItemsActor``."""

    child_kinds: ClassVar[dict[str, type[MemoryActor]]] = {
        "episodic": EpisodicActor,
        "working": WorkingMemoryActor,
        "items": ItemsActor,
    }


class BlackboardSupervisor(Supervisor):
    """Parent of every ``BlackboardActor`` (one per session)."""

    child_kinds: ClassVar[dict[str, type[MemoryActor]]] = {"blackboard": BlackboardActor}


class AgentSupervisor(Supervisor):
    """Parent of every ``AgentActor`` (one per agent)."""

    child_kinds: ClassVar[dict[str, type[MemoryActor]]] = {"agent": AgentActor}


class FilesSupervisor(Supervisor):
    """Parent of every ``WorkspaceActor`` (one per agent with a workspace) and ``CodebaseActor``."""

    child_kinds: ClassVar[dict[str, type[MemoryActor]]] = {
        "workspace": WorkspaceActor,
        "codebase": CodebaseActor,
    }
