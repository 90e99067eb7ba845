"""``memstrata status``: one report from the system, the storage driver and the file index.

The command runs no system: :func:`collect_offline` counts what each store holds with read-only
SQLite queries (``mode=ro``; ``immutable`` when no write-ahead log is beside the file, so no file
is created) and describes the configured model without loading it. A running system's own
report (model state, actors, restarts) is the ``status`` operation of ``memstrata serve``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import _convert

__all__ = ["collect", "collect_offline", "empty", "render", "warnings"]


def collect(system: Any, registry: Any, config: Any) -> dict[str, Any]:
    from memstrata import __version__
    from memstrata.storage import driver_info

    return {
        "version": __version__,
        "data_dir": str(config.data_dir),
        "storage": driver_info().as_dict(),
        "system": _convert.plain(system.status()),
        "stores": stored_counts(system),
        "workspaces": registry.status(),
    }


def collect_offline(config: Any, embedder: Any = None) -> dict[str, Any]:
    """The report of :func:`collect` with no system started and no model loaded: read-only
    counts per store, the registry's roots with their indexes' counts, the configured model."""
    from memstrata import __version__
    from memstrata._system_status import configured_embedding, offline_status
    from memstrata.storage import driver_info

    system = offline_status(config, embedder)
    data_dir = Path(config.data_dir)
    native = bool(system["driver"].get("native_vectors"))

    def mode_of(agent: str) -> tuple[str, str | None]:
        settings = config.of_agent(agent).embedding
        described = system["embedding"] if settings == config.embedding else configured_embedding(settings)
        if described["keyword_only"]:
            return "keyword-only", described["note"]
        return "hybrid", None

    return {
        "version": __version__,
        "data_dir": str(config.data_dir),
        "exists": True,  # as in the report of a data dir not made yet: a field always there
        "storage": driver_info().as_dict(),
        "system": system,
        "stores": offline_counts(data_dir, mode_of if embedder is None else None, native),
        "workspaces": offline_workspaces(data_dir),
    }


def _read_only(path: Path) -> Any:
    """A read-only connection that creates no file: ``immutable`` when no write-ahead log is
    beside the database (nobody has it open for writing), else ``mode=ro`` on the live log."""
    from memstrata.storage._driver import _MODULE

    uri = path.resolve().as_uri()
    wal = path.with_name(path.name + "-wal")
    if wal.exists():
        try:
            conn = _MODULE.connect(f"{uri}?mode=ro", uri=True)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except _MODULE.Error:  # a read-only folder without the shared-memory file: read the file
            pass
    return _MODULE.connect(f"{uri}?mode=ro&immutable=1", uri=True)


def _query(path: Path, sql: str) -> list[Any]:
    conn = _read_only(path)
    try:
        return list(conn.execute(sql).fetchall())
    finally:
        conn.close()


def offline_counts(data_dir: Path, mode_of: Any, native_vectors: bool) -> dict[str, dict[str, Any]]:
    """Entries per knowledge store and episodes per episodic store, read-only (see
    :func:`stored_counts` for the same through a running system); ``mode_of(agent)`` gives the
    search mode its model allows (``None``: hybrid)."""
    out: dict[str, dict[str, Any]] = {"knowledge": {}, "episodic": {}}
    for kind, table in (("knowledge", "knowledge"), ("episodic", "episodes")):
        folder = data_dir / kind
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.sqlite")):
            try:
                # the vector table is named after the entries' table
                (count, backend), *_ = _query(
                    path,
                    f"SELECT (SELECT count(*) FROM {table}), "
                    f"(SELECT value FROM metadata WHERE key = 'vector_backend:{table}')",
                )
                mode, reason = ("hybrid", None) if mode_of is None else mode_of(path.stem)
                if mode == "hybrid" and backend == "vec0" and not native_vectors:
                    mode, reason = "keyword-only", "sqlite-vec could not be loaded"
                out[kind][path.stem] = {"count": int(count), "mode": mode, "reason": reason}
            except Exception as exc:  # one unreadable store is reported, the others still counted
                out[kind][path.stem] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def offline_workspaces(data_dir: Path) -> list[dict[str, Any]]:
    """The registry's roots with their indexes' counts, read-only (no layer is opened)."""
    registry = data_dir / "workspaces.sqlite"
    if not registry.exists():
        return []
    import orjson

    out: list[dict[str, Any]] = []
    rows = _query(
        registry,
        "SELECT root, kind, db_path, added_at, last_sync_at, last_stats FROM roots "
        "ORDER BY kind = 'code', added_at, root",
    )
    for root, kind, db_path, added_at, last_sync_at, last_stats in rows:
        entry: dict[str, Any] = {
            "root": root,
            "kind": kind,
            "db_path": db_path,
            "added_at": added_at,
            "last_sync_at": last_sync_at,
            "last_stats": orjson.loads(last_stats) if last_stats else None,
            "missing": not Path(root).is_dir(),
        }
        if entry["missing"]:
            entry["warning"] = (
                f"{kind} root {root!r} is missing (deleted or not mounted): skipped "
                "(forget_root removes it from the index)"
            )
        try:
            (files, skipped, chunks, vectors), *_ = _query(
                Path(db_path),
                "SELECT (SELECT count(*) - count(skipped) FROM files), (SELECT count(skipped) FROM files), "
                "(SELECT count(*) FROM chunks), "
                "(SELECT count(*) FROM sqlite_master WHERE name = 'chunks_vec')",
            )
            entry["index"] = {
                "kind": kind,
                "root": root,
                "db_path": db_path,
                "mode": "hybrid" if vectors else "keyword-only",
                "files": int(files),
                "files_skipped": int(skipped),
                "chunks": int(chunks),
            }
        except Exception as exc:  # a broken index is reported, never hides the others
            entry["error"] = f"{type(exc).__name__}: {exc}"
        out.append(entry)
    return out


def empty(data_dir: Any) -> dict[str, Any]:
    """The report for a data dir that does not exist yet (nothing stored, nothing running)."""
    from memstrata import __version__
    from memstrata.storage import driver_info

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
