"""Listing, reading and deleting an agent's knowledge entries for the memory tools.

The facade's ``Agent`` stores and searches knowledge; the tools also need ``list``, ``get`` and
``delete``. When the agent handle offers them (``list_knowledge``, ``get_knowledge``,
``delete_knowledge``) they are used. Otherwise the agent's store is opened through the public
layer API (:meth:`KnowledgeStore.open` on :meth:`KnowledgeStore.path_for`) with the system's
shared embedder, as a second connection beside the actor's (SQLite WAL; the store follows
writes made by other connections). That connection is used under a lock and closed at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["delete_entry", "get_entry", "list_entries"]

T = TypeVar("T")

_LOCK = threading.Lock()
_OPEN: weakref.WeakKeyDictionary[Any, dict[str, tuple[Any, threading.Lock]]] = weakref.WeakKeyDictionary()
_ALL: list[Any] = []


@contextmanager
def _store(system: Any, agent_id: str) -> Iterator[Any]:
    from memstrata.layers import KnowledgeStore

    if system.stopped:
        from memstrata.errors import SystemStoppedError

        raise SystemStoppedError("the memory system is stopped")
    system.agent(agent_id)  # validates the id the same way every other call does
    with _LOCK:
        stores = _OPEN.setdefault(system, {})
        pair = stores.get(agent_id)
        if pair is None:
            path = KnowledgeStore.path_for(system.data_dir, agent_id)
            store = KnowledgeStore.open(path, system.embedder, config=system.config)
            pair = stores[agent_id] = (store, threading.Lock())
            _ALL.append(store)
    store, lock = pair
    with lock:
        yield store


def _via(system: Any, agent_id: str, method: str, direct: Callable[[Any], T], *args: Any, **kwargs: Any) -> T:
    handle = system.agent(agent_id)
    facade = getattr(handle, method, None)
    if callable(facade):
        return facade(*args, **kwargs)  # type: ignore[no-any-return]
    with _store(system, agent_id) as store:
        return direct(store)


def list_entries(system: Any, agent_id: str, **options: Any) -> list[Any]:
    return list(_via(system, agent_id, "list_knowledge", lambda s: s.list(**options), **options))


def get_entry(system: Any, agent_id: str, entry_id: int) -> Any:
    return _via(system, agent_id, "get_knowledge", lambda s: s.get(entry_id), entry_id)


def delete_entry(system: Any, agent_id: str, entry_id: int) -> bool:
    return bool(_via(system, agent_id, "delete_knowledge", lambda s: s.delete(entry_id), entry_id))


@atexit.register
def _close_all() -> None:
    with _LOCK:
        for store in _ALL:
            with contextlib.suppress(Exception):
                store.close()
        _ALL.clear()
