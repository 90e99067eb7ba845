"""MemorySystem.status() assembly and warnings: a read-only report, apart from the lifecycle.

:func:`offline_status` is the same report for a process that runs no system (``memstrata
status``): the configured model is described, not loaded, and nothing runs, so the fields that
only a running system knows (model state, actors, restarts) are empty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memstrata.storage import driver_info

if TYPE_CHECKING:
    from memstrata.actors import Runtime
    from memstrata.core.config import Config, EmbeddingConfig
    from memstrata.storage import Embedder

__all__ = [
    "STATUS_TIMEOUT_S",
    "configured_embedding",
    "host_model_warnings",
    "offline_status",
    "system_status",
]

STATUS_TIMEOUT_S = 2.0  # how long each actor has to report, unless the caller says otherwise


def system_status(runtime: Runtime, timeout: float) -> dict[str, Any]:
    """What runs and what is stored: drivers, vectors, model, per-agent counts, degradation."""
    from memstrata.actors import BatchingEmbedder
    from memstrata.messages import SHARED

    info = driver_info()
    embedder = runtime.embedder
    embedding: dict[str, Any] = {
        "model": None if embedder is None else embedder.model_id,
        "dim": None if embedder is None else embedder.dim,
        "keyword_only": embedder is None,
        "note": runtime.embedder_note,
    }
    model_state: dict[str, Any] = {}
    if isinstance(embedder, BatchingEmbedder):
        embedding.update(embedder.stats().as_dict())
        model_state = embedder.model_status()
        embedding["state"] = model_state  # ok / stuck since ... on a call of N texts / faulty
    # the services of agents whose [agents.<id>.embedding] names another setting (made on
    # first use): which agents, which model, and how it is doing
    embedding["per_agent"] = [
        _service_status(agents, service, note) for agents, service, note in runtime.embedding_services()[1:]
    ]
    agents: dict[str, dict[str, Any]] = {}
    boards: dict[str, dict[str, Any]] = {}
    codebases: dict[str, dict[str, Any]] = {}
    shared: dict[str, Any] = {}
    items: dict[str, Any] = {}
    degraded = runtime.supervision.degraded()
    if not runtime.stopped:
        for (kind, key), state in runtime.actor_status(timeout).items():
            if kind == "blackboard":
                boards[key] = state
                continue
            if kind == "codebase":
                codebases[key] = state
                continue
            if kind == "items":  # the system's item store, not an agent's
                items = state
                continue
            if key == SHARED:
                shared = state
                continue
            agents.setdefault(key, {})[kind] = state
    for agent_id, kinds in agents.items():
        kinds["degraded"] = degraded.get(agent_id)
    warnings = _warnings(info.native_vectors, info.reason, runtime.embedder_note, agents, shared, degraded)
    for name, state in sorted(codebases.items()):
        if state.get("last_sync_error"):
            warnings.append(f"codebase {name}: {state['last_sync_error']}")
    for service in embedding["per_agent"]:
        who = ", ".join(service["agents"])
        state = service.get("state", {})
        if service["keyword_only"]:
            warnings.append(f"agents {who}: {service['note']}")
        elif state.get("state") == "stuck":
            warnings.append(f"agents {who}: {state['reason']}: vectors pending, searches by keywords")
        elif state.get("state") == "faulty":
            warnings.append(f"agents {who}: {_model_warning(state)}")
    model_warning = _model_warning(model_state)
    if model_warning is not None:
        warnings.insert(0, model_warning)
    return {
        "data_dir": str(runtime.data_dir),
        "stopped": runtime.stopped or not runtime.accepting,
        "driver": info.as_dict(),
        "vectors": "native (sqlite-vec)" if info.native_vectors else f"fallback (numpy): {info.reason}",
        "embedding": embedding,
        "agents": agents,
        "shared_knowledge": shared,
        "blackboards": boards,
        "items": items,
        "codebases": codebases,
        "degraded": degraded,
        "restarts": runtime.supervision.restarts(),
        "shared_query_errors": runtime.shared_query_errors,
        "blackboard_subscriber_errors": sum(int(b.get("subscriber_errors", 0)) for b in boards.values()),
        "in_flight": runtime.activity.in_flight,
        "warnings": warnings,
    }


def _model_warning(state: Mapping[str, Any]) -> str | None:
    """The first warning of ``status()`` when the model is stuck or faulty, else ``None``."""
    if state.get("state") == "stuck":
        return f"{state['reason']}: writes are stored with vectors pending, searches rank by keywords"
    if state.get("state") == "faulty":
        return (
            f"model {state['model']!r} is faulty since {state['since']} "
            f"(last error: {state['last_error']}): vectors are retried"
        )
    return None


def host_model_warnings(cluster: Mapping[str, Any]) -> list[str]:
    """On the Ray engine each host reaches its node's model: the local engine's model warning
    for each model and state the hosts report (dated by the earliest of them), naming the hosts."""
    found: dict[tuple[str, str], list[tuple[str, Mapping[str, Any]]]] = {}
    for name, host in cluster.get("hosts", {}).items():
        state = host.get("model") or {}
        if state.get("state") in ("stuck", "faulty"):
            found.setdefault((str(state["model"]), str(state["state"])), []).append((name, state))
    warnings = []
    for hosts in found.values():
        earliest = min((state for _, state in hosts), key=lambda state: str(state["since"]))
        warnings.append(f"{_model_warning(earliest)} (hosts {', '.join(sorted(name for name, _ in hosts))})")
    return sorted(warnings)


def offline_status(config: Config, embedder: Embedder | None = None) -> dict[str, Any]:
    """:func:`system_status`'s report without a running system: same keys, the model as
    configured (``embedder``, when given, is described instead), nothing running or degraded."""
    info = driver_info()
    embedding = configured_embedding(config.embedding, embedder)
    note = embedding["note"] if embedding["keyword_only"] else None
    return {
        "data_dir": str(config.data_dir),
        "stopped": True,
        "running": False,
        "driver": info.as_dict(),
        "vectors": "native (sqlite-vec)" if info.native_vectors else f"fallback (numpy): {info.reason}",
        "embedding": embedding,
        "agents": {},
        "shared_knowledge": {},
        "blackboards": {},
        "items": {},
        "codebases": {},
        "degraded": {},
        "restarts": {},
        "shared_query_errors": 0,
        "blackboard_subscriber_errors": 0,
        "in_flight": 0,
        "warnings": _warnings(info.native_vectors, info.reason, note, {}, {}, {}),
    }


def configured_embedding(settings: EmbeddingConfig, embedder: Embedder | None = None) -> dict[str, Any]:
    """The embedding model a system would load, told without loading it: its id and dimension,
    and ``keyword_only`` (with the reason in ``note``) when it plainly cannot be loaded (a
    directory that is not there, a name nothing knows). Whether a loadable model works, and how
    it is doing, only a running system can say."""
    from memstrata.storage._model_id import DEFAULT_DIM, DEFAULT_MODEL_ID

    out: dict[str, Any] = {"model": None, "dim": None, "keyword_only": False, "note": None, "loaded": False}
    if embedder is not None:
        return {**out, "model": embedder.model_id, "dim": embedder.dim, "per_agent": []}
    model = settings.model
    if model in (None, "", "default", DEFAULT_MODEL_ID):
        out.update(model=DEFAULT_MODEL_ID, dim=DEFAULT_DIM)
    elif Path(model).expanduser().is_dir():
        name = f"local:{Path(model).expanduser().resolve().name}"
        out.update(model=name, dim=settings.dim)
        if settings.dim is None:
            out.update(
                keyword_only=True,
                note=_unloadable(f"model directory {model}: pass its embedding dimension (dim)"),
            )
    else:
        known = _fastembed_models()
        if model in known:
            out.update(model=model, dim=settings.dim or known[model])
        else:
            out.update(
                model=model,
                dim=settings.dim,
                keyword_only=True,
                note=_unloadable(f"{model!r} is neither a model directory nor a model fastembed knows"),
            )
    out["per_agent"] = []
    return out


def _unloadable(reason: str) -> str:
    return f"keyword-only: no embedding model could be loaded ({reason})"


def _fastembed_models() -> dict[str, int]:
    """Model names fastembed can load, with their dimensions (imported only for such a name)."""
    try:
        from fastembed import TextEmbedding

        return {str(d["model"]): int(d["dim"]) for d in TextEmbedding.list_supported_models()}
    except Exception:
        return {}


def _service_status(agents: Sequence[str], service: Embedder | None, note: str | None) -> dict[str, Any]:
    """One per-agent embedding service in :meth:`MemorySystem.status`."""
    from memstrata.actors import BatchingEmbedder

    state: dict[str, Any] = {
        "agents": list(agents),
        "model": None if service is None else service.model_id,
        "dim": None if service is None else service.dim,
        "keyword_only": service is None,
        "note": note,
    }
    if isinstance(service, BatchingEmbedder):
        state.update(service.stats().as_dict())
        state["state"] = service.model_status()
    return state


def _warnings(
    native_vectors: bool,
    vec_reason: str | None,
    embedder_note: str | None,
    agents: Mapping[str, Mapping[str, Any]],
    shared: Mapping[str, Any],
    degraded: Mapping[str, str],
) -> list[str]:
    """What is degraded right now, one line each: nothing here means nothing is."""
    out: list[str] = []
    if not native_vectors:
        out.append(f"sqlite-vec is not loaded ({vec_reason}): new vector tables use the exact numpy scan")
    if embedder_note:
        out.append(embedder_note)
    owners: list[tuple[str, Mapping[str, Any]]] = list(agents.items())
    if shared:
        owners.append(("shared", {"knowledge": shared}))
    for owner, kinds in owners:
        for kind, state in kinds.items():
            if not isinstance(state, Mapping):
                continue
            where = f"{owner} {kind}"
            if "error" in state:
                out.append(f"{where}: no status ({state['error']})")
            store = state.get("store")
            if isinstance(store, Mapping):
                if store.get("mode") == "keyword-only":
                    reason = store.get("reason") or store.get("keyword_only_reason")
                    out.append(f"{where}: keyword-only ({reason})")
                if store.get("pending_vectors"):
                    out.append(
                        f"{where}: {store['pending_vectors']} item(s) wait for their vectors and are "
                        f"found by keywords until then (last embedder error: {store.get('last_error')})"
                    )
                check = store.get("consistency")
                if isinstance(check, Mapping) and check.get("problems"):
                    out.append(f"{where}: repaired on open: {'; '.join(map(str, check['problems']))}")
                for archive in store.get("archives") or ():  # its episodes leave searches and exports
                    if isinstance(archive, Mapping) and archive.get("problem"):
                        out.append(f"{where}: archive {archive.get('path')}: {archive['problem']}")
            for problem in ("last_sync_error", "last_note_error"):  # workspaces
                if state.get(problem):
                    out.append(f"{where}: {state[problem]}")
            if state.get("storage_errors"):
                out.append(
                    f"{where}: {state['storage_errors']} request(s) failed in the database, "
                    f"last: {state.get('last_storage_error')}"
                )
            waiting = int(state.get("outbox_pending") or 0) - int(state.get("writebacks_in_flight") or 0)
            if waiting > 0:
                out.append(f"{where}: {waiting} acknowledged write-back(s) wait in the outbox for a retry")
            if state.get("outbox_dead"):
                out.append(
                    f"{where}: {state['outbox_dead']} write-back(s) were refused and are kept in the outbox"
                )
    for owner, reason in sorted(degraded.items()):
        out.append(f"{owner} is degraded: {reason}")
    return out
