"""``memstrata status``: one report from the system, the storage driver and the file index."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from . import _convert

__all__ = ["collect", "empty", "render", "warnings"]


def collect(system: Any, registry: Any, config: Any) -> dict[str, Any]:
    from memstrata.storage import driver_info

    from memstrata import __version__

    return {
        "version": __version__,
        "data_dir": str(config.data_dir),
        "storage": driver_info().as_dict(),
        "system": _convert.plain(system.status()),
        "stores": stored_counts(system),
        "workspaces": registry.status(),
    }


def empty(data_dir: Any) -> dict[str, Any]:
    """The report for a data dir that does not exist yet (nothing stored, nothing running)."""
    from memstrata.storage import driver_info

    from memstrata import __version__

    return {
        "version": __version__,
        "data_dir": str(data_dir),
        "exists": False,
        "storage": driver_info().as_dict(),
        "system": {},
        "stores": {"knowledge": {}, "episodic": {}},
        "workspaces": [],
    }


def stored_counts(system: Any) -> dict[str, dict[str, Any]]:
    """Entries per knowledge store and episodes per episodic store found in the data dir.

    ``system.status()`` describes the actors running in this process; a fresh ``memstrata
    status`` runs none, so the stores on disk are opened (through the layer API, with the
    system's embedder) and counted.
    """
    from memstrata.layers import EpisodicMemory, KnowledgeStore

    out: dict[str, dict[str, Any]] = {"knowledge": {}, "episodic": {}}
    openers: dict[str, Any] = {"knowledge": KnowledgeStore.open, "episodic": EpisodicMemory.open}
    for kind, opener in openers.items():
        folder = system.data_dir / kind
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.sqlite")):
            try:
                # the agent's own model: opened with another, its vectors would be rebuilt
                store = opener(path, system.embedder_for(path.stem), config=system.config.of_agent(path.stem))
                try:
                    info = store.status()
                    out[kind][path.stem] = {
                        "count": store.count(),
                        "mode": info.get("mode"),
                        "reason": info.get("reason"),
                    }
                finally:
                    store.close()
            except Exception as exc:  # one unreadable store is reported, the others still counted
                out[kind][path.stem] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def _keyword_only(data: Any) -> Iterator[str]:
    """The reasons of every store that reports ``mode: keyword-only`` (or ``keyword_only: true``)."""
    if isinstance(data, dict):
        if data.get("mode") == "keyword-only" or data.get("keyword_only") is True:
            yield str(data.get("reason") or data.get("note") or "no embedding model could be loaded")
        for value in data.values():
            yield from _keyword_only(value)
    elif isinstance(data, list):
        for item in data:
            yield from _keyword_only(item)


def warnings(report: dict[str, Any]) -> list[str]:
    """Conditions a person must not miss: keyword-only search, no native vectors, degraded agents."""
    out: list[str] = []
    reasons = sorted(set(_keyword_only({"system": report.get("system"), "files": report.get("workspaces")})))
    if reasons:
        out.append(f"KEYWORD-ONLY MODE: semantic search is off ({'; '.join(reasons)})")
    storage = report.get("storage") or {}
    if not storage.get("native_vectors", True):
        reason = storage.get("reason")
        out.append(f"sqlite-vec is not loaded ({reason}); vector search uses the numpy fallback")
    degraded = (report.get("system") or {}).get("degraded") or {}
    if degraded:
        out.append(f"degraded agents: {', '.join(sorted(map(str, degraded)))}")
    model = _model_state(report)
    if model.get("state") == "stuck":
        out.append(
            f"MODEL STUCK: {model.get('reason')}; writes wait for their vectors, searches use keywords"
        )
    elif model.get("state") == "faulty":
        out.append(f"MODEL FAULTY since {model.get('since')}: {model.get('last_error')}; vectors are retried")
    return out


def _model_state(report: dict[str, Any]) -> dict[str, Any]:
    """The embedding model's state in ``system.status()``: ok / stuck / faulty (see BatchingEmbedder)."""
    embedding = (report.get("system") or {}).get("embedding") or {}
    state = embedding.get("state") if isinstance(embedding, dict) else None
    return state if isinstance(state, dict) else {}


def _scalar(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _lines(value: Any, indent: int) -> Iterator[str]:
    pad = "  " * indent
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                yield f"{pad}{key}:"
                yield from _lines(item, indent + 1)
            else:
                yield f"{pad}{key}: {_scalar(item) if not isinstance(item, dict | list) else '-'}"
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                head, *rest = list(_lines(item, indent + 1)) or [f"{pad}  -"]
                yield f"{pad}- {head.strip()}"
                yield from rest
            else:
                yield f"{pad}- {_scalar(item)}"
    else:
        yield f"{pad}{_scalar(value)}"


def render(report: dict[str, Any]) -> list[str]:
    """The report as indented ``key: value`` lines, warnings first so they cannot be missed."""
    out = [f"WARNING: {w}" for w in warnings(report)]
    storage = report.get("storage") or {}
    vectors = (
        f"native (sqlite-vec {storage.get('vec_version')})"
        if storage.get("native_vectors")
        else f"numpy fallback ({storage.get('reason')})"
    )
    out.append(f"memstrata {report.get('version')}  data dir {report.get('data_dir')}")
    out.append(
        f"driver: {storage.get('driver')} (SQLite {storage.get('sqlite_version')}), vectors: {vectors}"
    )
    stores = report.get("stores") or {}
    for kind in ("knowledge", "episodic"):
        counts = stores.get(kind) or {}
        shown = ", ".join(
            f"{name}: {v['count']}" if "count" in v else f"{name}: {v.get('error')}"
            for name, v in counts.items()
        )
        out.append(f"{kind} stores: {shown or 'none'}")
    system = report.get("system") or {}
    embedding = system.get("embedding") or {}
    model = "none (keyword-only)" if embedding.get("keyword_only") else embedding.get("model")
    state = _model_state(report).get("state")
    out.append(f"model: {model}, dimension {embedding.get('dim') or '-'}" + (f", {state}" if state else ""))
    degraded = system.get("degraded") or {}
    out.append(f"degraded agents: {', '.join(sorted(degraded)) if degraded else 'none'}")
    workspaces = report.get("workspaces") or []
    if not workspaces:
        out.append("indexed roots: none (memstrata index PATH)")
    for ws in workspaces:
        index = ws.get("index") or {}
        last = ws.get("last_sync_at") or "never"
        detail = ws.get("error") or (
            f"{index.get('files', '?')} files, {index.get('chunks', '?')} chunks, {index.get('mode', '?')}"
        )
        out.append(f"indexed {ws.get('kind')} root {ws.get('root')}: {detail}; last sync {last}")
    if report.get("verbose"):
        out.extend(_lines({"system": system, "workspaces": workspaces}, 0))
    return out
