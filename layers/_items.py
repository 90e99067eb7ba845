"""Keyed items: JSON values addressed by (namespace path, key), with optional vectors per field.

The layer orchestrator stores need (LangGraph's ``BaseStore``, conversation histories, vector
memories): upsert by key, values kept apart from the text that is embedded, several vectors per
item (one per indexed field) ranked by the best field, namespace *prefix* search, equality and
range filters on the value evaluated by SQLite (exact: the filter narrows the candidates before
any ranking, so an item is never lost behind a global top-k), an ordered tail read, and time to
live with sweeping. Vectors arrive computed: the caller owns the embedding model.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from memstrata.core.errors import InvalidInputError
from memstrata.storage import Database, open_database

__all__ = ["SEP", "ItemRecord", "ItemRow", "ItemStore", "namespace_key"]

SEP = "\x1f"  # between namespace labels; a label may not contain it
_AFTER_SEP = chr(ord(SEP) + 1)
_FILTER_KEY = re.compile(r"[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*")
_OPS = {"$eq": "=", "$ne": "!=", "$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    id INTEGER PRIMARY KEY,
    ns TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    expires_at REAL,
    ttl_minutes REAL,
    UNIQUE (ns, key)
);
CREATE INDEX IF NOT EXISTS items_ns_seq ON items (ns, id, expires_at);
CREATE INDEX IF NOT EXISTS items_expiry ON items (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS item_vectors (
    item_id INTEGER NOT NULL REFERENCES items (id) ON DELETE CASCADE,
    field TEXT NOT NULL,
    vec BLOB NOT NULL,
    PRIMARY KEY (item_id, field)
);
"""


def namespace_key(namespace: Sequence[str]) -> str:
    """One namespace path as the stored text; refuses what would make prefixes ambiguous."""
    if isinstance(namespace, str) or not namespace:
        raise InvalidInputError(f"namespace must be a non-empty tuple of labels, got {namespace!r}")
    for label in namespace:
        if not isinstance(label, str) or not label:
            raise InvalidInputError(f"namespace labels must be non-empty strings, got {namespace!r}")
        if SEP in label:
            raise InvalidInputError(f"namespace label {label!r} contains the reserved character \\x1f")
    return SEP.join(namespace)


ItemRow = tuple[Sequence[str], str, dict[str, Any], Mapping[str, Sequence[float]] | None, float | None]
"""(namespace, key, value, vectors per field or None, ttl in minutes or None)"""


@dataclass(frozen=True, slots=True)
class ItemRecord:
    """One stored item; ``score`` is the best field's cosine similarity when a query ranked it."""

    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    created_at: float
    updated_at: float
    score: float | None = None
    expires_at: float | None = None


def _json_path(field: str) -> str:
    """A filter key (``"a.b"`` or ``"a-b"``) as a quoted SQLite JSON path."""
    if not isinstance(field, str) or not _FILTER_KEY.fullmatch(field):
        raise InvalidInputError(
            f"Invalid filter key {field!r}: use letters, digits, '_', '-' and '.' between nested keys"
        )
    parts = field.split(".")
    return "$" + "".join('."' + p.replace('"', '""') + '"' for p in parts)


def _compare(path: str, op: str, value: Any, params: list[Any]) -> str:
    """One comparison of the value at ``path``; lists and objects compare as canonical JSON."""
    if op not in _OPS:
        raise InvalidInputError(f"unknown filter operator {op!r}: use one of {', '.join(_OPS)}")
    sql_op = _OPS[op]
    if isinstance(value, dict | list):
        if op not in ("$eq", "$ne"):
            raise InvalidInputError(f"operator {op!r} does not apply to a list or object filter value")
        params.extend([path, orjson.dumps(value).decode()])
        return f"json_extract(i.value, ?) {'IS' if op == '$eq' else 'IS NOT'} json(?)"
    if value is None:
        params.append(path)
        return f"json_type(i.value, ?) {'=' if op == '$eq' else '!='} 'null'"
    if isinstance(value, bool):
        params.append(path)
        kind = "true" if value else "false"
        if op == "$eq":
            return f"json_type(i.value, ?) = '{kind}'"
        if op == "$ne":
            return f"coalesce(json_type(i.value, ?), '') != '{kind}'"
        raise InvalidInputError(f"operator {op!r} does not apply to a boolean filter value")
    if not isinstance(value, str | int | float):
        raise InvalidInputError(f"filter value {value!r} is not JSON")
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        value = float(value)  # beyond SQLite's integers: compared as a real
    params.extend([path, value])
    if op == "$ne":
        return "json_extract(i.value, ?) IS NOT ?"
    return f"json_extract(i.value, ?) {sql_op} ?"


def _filter_sql(filter: Mapping[str, Any] | None, params: list[Any]) -> list[str]:
    clauses: list[str] = []
    for field, cond in (filter or {}).items():
        path = _json_path(field)
        if isinstance(cond, dict) and cond and all(isinstance(k, str) and k.startswith("$") for k in cond):
            for op, value in cond.items():
                clauses.append(_compare(path, op, value, params))
        else:
            clauses.append(_compare(path, "$eq", cond, params))
    return clauses


class ItemStore:
    """Items in one SQLite file (or ``:memory:``). Thread-safe: one lock serialises the connection.

    ``clock`` returns seconds (``time.time`` by default); expiry compares against it.
    """

    def __init__(self, path: Path | str | Database, *, clock: Callable[[], float] = time.time) -> None:
        self._db = path if isinstance(path, Database) else open_database(path, load_vec=False)
        self._own_db = not isinstance(path, Database)
        self._clock = clock
        self._lock = threading.RLock()
        self._writes = 0  # own writes; other connections' show in PRAGMA data_version
        self._mirror: tuple[tuple[int, int], npt.NDArray[np.int64], npt.NDArray[np.float32]] | None = None
        with self._lock, self._db.transaction():
            self._db.executescript(_SCHEMA)

    @property
    def path(self) -> Path:
        return self._db.path

    def close(self) -> None:
        with self._lock:
            if self._own_db:
                self._db.close()

    # writes -------------------------------------------------------------------------------

    def put_many(
        self,
        rows: Iterable[
            tuple[Sequence[str], str, dict[str, Any], Mapping[str, Sequence[float]] | None, float | None]
        ],
    ) -> None:
        """Upsert ``(namespace, key, value, vectors, ttl_minutes)`` rows in one transaction.

        ``vectors`` ``None`` keeps no vector (stored, not searchable by meaning); a mapping
        replaces the item's vectors by one per field. ``ttl_minutes`` ``None``: never expires.
        """
        now = self._clock()
        prepared = []
        for namespace, key, value, vectors, ttl in rows:
            ns = namespace_key(namespace)
            if not isinstance(key, str):
                raise InvalidInputError(f"item key must be a string, got {key!r}")
            if not isinstance(value, dict):
                raise InvalidInputError(f"item value must be a dict, got {type(value).__name__}")
            if ttl is not None and (not isinstance(ttl, int | float) or ttl <= 0 or not math.isfinite(ttl)):
                raise InvalidInputError(f"ttl must be a positive number of minutes, got {ttl!r}")
            try:
                text = orjson.dumps(value).decode()
            except TypeError as exc:
                raise InvalidInputError(f"item value for key {key!r} is not JSON: {exc}") from exc
            blobs = None
            if vectors is not None:
                blobs = [(f, np.asarray(v, dtype=np.float32).tobytes()) for f, v in vectors.items()]
            prepared.append((ns, key, text, blobs, ttl))
        with self._lock, self._db.transaction():
            self._writes += 1
            for ns, key, text, blobs, ttl in prepared:
                expires = now + ttl * 60.0 if ttl is not None else None
                row = self._db.execute(
                    "INSERT INTO items (ns, key, value, created_at, updated_at, expires_at, ttl_minutes)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (ns, key)"
                    " DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at,"
                    " expires_at = excluded.expires_at,"
                    " ttl_minutes = excluded.ttl_minutes RETURNING id",
                    (ns, key, text, now, now, expires, ttl),
                ).fetchone()
                item_id = row[0]
                self._db.execute("DELETE FROM item_vectors WHERE item_id = ?", (item_id,))
                if blobs:
                    self._db.executemany(
                        "INSERT INTO item_vectors (item_id, field, vec) VALUES (?, ?, ?)",
                        [(item_id, f, b) for f, b in blobs],
                    )

    def delete_many(self, keys: Iterable[tuple[Sequence[str], str]]) -> int:
        """Really delete items (vectors go with them); returns how many existed."""
        pairs = [(namespace_key(ns), key) for ns, key in keys]
        with self._lock, self._db.transaction():
            self._writes += 1
            gone = 0
            for ns, key in pairs:
                gone += self._db.execute("DELETE FROM items WHERE ns = ? AND key = ?", (ns, key)).rowcount
            return gone

    def delete_namespace(self, namespace: Sequence[str]) -> int:
        """Delete every item of exactly this namespace."""
        ns = namespace_key(namespace)
        with self._lock, self._db.transaction():
            self._writes += 1
            return int(self._db.execute("DELETE FROM items WHERE ns = ?", (ns,)).rowcount)

    def pop_last(self, namespace: Sequence[str]) -> ItemRecord | None:
        """Remove and return the most recently inserted live item of a namespace."""
        ns = namespace_key(namespace)
        with self._lock, self._db.transaction():
            self._writes += 1
            row = self._db.execute(
                "SELECT id, ns, key, value, created_at, updated_at, expires_at FROM items i"
                " WHERE ns = ? AND (expires_at IS NULL OR expires_at > ?) ORDER BY id DESC LIMIT 1",
                (ns, self._clock()),
            ).fetchone()
            if row is None:
                return None
            self._db.execute("DELETE FROM items WHERE id = ?", (row[0],))
            return _record(row)

    def sweep(self, prefix: Sequence[str] = ()) -> int:
        """Delete expired items (only under the namespace ``prefix`` when given); returns how many."""
        sql = "DELETE FROM items WHERE expires_at IS NOT NULL AND expires_at <= ?"
        extra: list[Any] = []
        if prefix:
            ns = namespace_key(prefix)
            sql += " AND ns >= ? AND ns < ? AND (ns = ? OR substr(ns, ?, 1) = ?)"
            extra = [ns, ns + _AFTER_SEP, ns, len(ns) + 1, SEP]
        with self._lock, self._db.transaction():
            self._writes += 1
            return int(self._db.execute(sql, (self._clock(), *extra)).rowcount)

    # reads --------------------------------------------------------------------------------

    def get(self, namespace: Sequence[str], key: str, *, refresh_ttl: bool = False) -> ItemRecord | None:
        ns = namespace_key(namespace)
        with self._lock:
            now = self._clock()
            row = self._db.execute(
                "SELECT id, ns, key, value, created_at, updated_at, expires_at FROM items i"
                " WHERE ns = ? AND key = ? AND (expires_at IS NULL OR expires_at > ?)",
                (ns, key, now),
            ).fetchone()
            if row is not None and refresh_ttl:
                self._refresh([row[0]], now)
            return None if row is None else _record(row)

    def tail(self, namespace: Sequence[str], limit: int | None = None) -> list[ItemRecord]:
        """The last ``limit`` live items of a namespace in insertion order (all when ``None``);
        an index walk from the end, never a replay of the whole namespace."""
        ns = namespace_key(namespace)
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise InvalidInputError(f"limit must be a non-negative integer, got {limit!r}")
        with self._lock:
            rows = self._db.query(
                "SELECT id, ns, key, value, created_at, updated_at, expires_at FROM items i"
                " WHERE ns = ? AND (expires_at IS NULL OR expires_at > ?) ORDER BY id DESC LIMIT ?",
                (ns, self._clock(), -1 if limit is None else limit),
            )
        return [_record(r) for r in reversed(rows)]

    def search(
        self,
        prefix: Sequence[str],
        *,
        query_vector: Sequence[float] | None = None,
        filter: Mapping[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        refresh_ttl: bool = False,
    ) -> list[ItemRecord]:
        """Items under a namespace prefix (the namespace itself and its descendants).

        With ``query_vector``: ranked by cosine similarity of the best-matching field vector, over
        every item the prefix and filter admit (exact); items without vectors follow, unscored.
        Without: most recently updated first.
        """
        if not isinstance(limit, int) or limit < 0:
            raise InvalidInputError(f"limit must be a non-negative integer, got {limit!r}")
        if not isinstance(offset, int) or offset < 0:
            raise InvalidInputError(f"offset must be a non-negative integer, got {offset!r}")
        params: list[Any] = []
        where = ["(i.expires_at IS NULL OR i.expires_at > ?)"]
        if prefix:
            ns = namespace_key(prefix)
            # one index range holds ns and its descendants; the check on the character after ns
            # drops the siblings in that range (a label going on with a control character)
            where.append("i.ns >= ? AND i.ns < ? AND (i.ns = ? OR substr(i.ns, ?, 1) = ?)")
            params_ns: list[Any] = [ns, ns + _AFTER_SEP, ns, len(ns) + 1, SEP]
        else:
            params_ns = []
        with self._lock:
            now = self._clock()
            params = [now, *params_ns]
            where.extend(_filter_sql(filter, params))
            sql_where = " AND ".join(where)
            cols = "i.id, i.ns, i.key, i.value, i.created_at, i.updated_at, i.expires_at"
            if query_vector is None:
                rows = self._db.query(
                    f"SELECT {cols} FROM items i WHERE {sql_where} ORDER BY i.updated_at DESC, i.id DESC"
                    " LIMIT ? OFFSET ?",
                    (*params, limit, offset),
                )
                records = [_record(r) for r in rows]
            else:
                records = self._ranked(cols, sql_where, params, query_vector, limit, offset)
            if refresh_ttl and records:
                self._refresh_records(records, now)
        return records

    def _ranked(
        self,
        cols: str,
        sql_where: str,
        params: list[Any],
        query_vector: Sequence[float],
        limit: int,
        offset: int,
    ) -> list[ItemRecord]:
        q = np.asarray(query_vector, dtype=np.float32).ravel()
        qn = float(np.linalg.norm(q))
        need = offset + limit
        if need == 0:
            return []
        scored: list[tuple[int, float | None]] = []
        found = self._admitted_vectors(sql_where, params, q.size)
        if found is not None:
            ids, unit = found  # unit rows, sorted by item id
            sims = unit @ (q / qn) if qn > 0 else np.zeros(len(ids), dtype=np.float32)
            starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
            uniq, best = ids[starts], np.maximum.reduceat(sims, starts)  # each item's best field
            if need < len(best):
                keep = np.argpartition(-best, need - 1)[:need]
                uniq, best = uniq[keep], best[keep]
            ranked = np.lexsort((uniq, -best))  # best score first, then older item
            scored = [(int(uniq[j]), float(best[j])) for j in ranked]
        order = scored
        if len(scored) < need:  # items stored without vectors follow, unscored
            plain = self._db.query(
                f"SELECT i.id FROM items i WHERE {sql_where} AND NOT EXISTS"
                " (SELECT 1 FROM item_vectors v WHERE v.item_id = i.id)"
                " ORDER BY i.updated_at DESC, i.id DESC LIMIT ?",
                (*params, need - len(scored)),
            )
            order = [*scored, *((r[0], None) for r in plain)]
        page = order[offset : offset + limit]
        if not page:
            return []
        marks = ",".join("?" * len(page))
        rows = {
            r[0]: r
            for r in self._db.query(
                f"SELECT {cols} FROM items i WHERE i.id IN ({marks})", [p[0] for p in page]
            )
        }
        return [_record(rows[i], score) for i, score in page if i in rows]

    def _admitted_vectors(
        self, sql_where: str, params: list[Any], dim: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]] | None:
        """(item id per vector, vectors) of the items the prefix and filter admit, or None.

        The vectors are mirrored in memory (rebuilt when this or another connection wrote), and
        the admitted ids come from SQL in one row, so a search scans no BLOB and does one product.
        """
        version = (self._db.data_version(), self._writes)
        if self._mirror is None or self._mirror[0] != version:
            rows = self._db.query("SELECT item_id, vec FROM item_vectors ORDER BY item_id")
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            raw = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32)
            width = raw.size // len(rows) if rows else dim
            if rows and raw.size != len(rows) * width:
                raise InvalidInputError("stored vectors have different dimensions: re-create the index")
            mat = raw.reshape(len(rows), width)
            norms = np.linalg.norm(mat, axis=1, keepdims=True)
            unit = np.divide(mat, norms, out=np.zeros_like(mat), where=norms > 0)
            self._mirror = (version, ids, unit)
        _, all_ids, all_vecs = self._mirror
        if len(all_ids) == 0:
            return None
        if all_vecs.shape[1] != dim:
            raise InvalidInputError(
                f"query vector has {dim} dimensions but the stored vectors have {all_vecs.shape[1]}"
            )
        listed = self._db.scalar(f"SELECT group_concat(i.id) FROM items i WHERE {sql_where}", params)
        if not listed:
            return None
        admitted = np.array(listed.split(","), dtype=np.int64)
        mask = np.isin(all_ids, admitted, assume_unique=False)
        if not mask.any():
            return None
        return all_ids[mask], all_vecs[mask]

    def list_namespaces(
        self,
        *,
        prefix: Sequence[str] | None = None,
        suffix: Sequence[str] | None = None,
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
        wildcard: str | None = "*",
    ) -> list[tuple[str, ...]]:
        """Distinct namespaces, sorted, found by walking the namespace index (never the items).

        Each step asks the index for the next namespace (one ``min`` over a range); once a
        namespace cut to ``max_depth`` is listed, the rest of its subtree is jumped over.
        ``prefix``/``suffix`` labels equal to ``wildcard`` match any label; ``max_depth`` cuts
        longer namespaces to that depth (then deduplicated).
        """
        if max_depth is not None and (not isinstance(max_depth, int) or max_depth < 1):
            raise InvalidInputError(f"max_depth must be a positive integer, got {max_depth!r}")
        fixed: list[str] = []
        for label in prefix or ():
            if label == wildcard:
                break
            fixed.append(label)
        base = namespace_key(fixed) if fixed else None
        exact = base is not None and len(fixed) == len(prefix or ())
        if base is None:
            low, upper = "", None
        else:
            low, upper = (base if exact else base + SEP), base + _AFTER_SEP

        def matches(ns: tuple[str, ...], pattern: Sequence[str], at_end: bool) -> bool:
            if len(pattern) > len(ns):
                return False
            part = ns[len(ns) - len(pattern) :] if at_end else ns[: len(pattern)]
            return all(p in (wildcard, n) for p, n in zip(pattern, part, strict=True))

        out: set[tuple[str, ...]] = set()
        with self._lock:
            now = self._clock()
            found = self._next_namespace(low, True, upper)
            while found is not None:
                name = tuple(found.split(SEP))
                cut = name[:max_depth] if max_depth is not None else name
                in_tree = base is None or found == base or found.startswith(base + SEP)
                if (
                    in_tree
                    and cut not in out
                    and (not prefix or matches(name, prefix, False))
                    and (not suffix or matches(name, suffix, True))
                    and self._db.scalar(
                        "SELECT 1 FROM items WHERE ns = ? AND (expires_at IS NULL OR expires_at > ?) LIMIT 1",
                        (found, now),
                    )
                ):
                    out.add(cut)
                if cut in out and len(name) > len(cut):  # deeper names of this subtree add nothing
                    found = self._next_namespace(SEP.join(cut) + _AFTER_SEP, True, upper)
                else:
                    found = self._next_namespace(found, False, upper)
        return sorted(out)[offset : offset + limit]

    def _next_namespace(self, low: str, inclusive: bool, upper: str | None) -> str | None:
        """The smallest stored namespace after ``low`` (and before ``upper``): one index seek."""
        sql = f"SELECT min(ns) FROM items WHERE ns {'>=' if inclusive else '>'} ?"
        params: list[Any] = [low]
        if upper is not None:
            sql += " AND ns < ?"
            params.append(upper)
        found = self._db.scalar(sql, params)
        return None if found is None else str(found)

    def count(self, namespace: Sequence[str] | None = None) -> int:
        with self._lock:
            if namespace is None:
                return int(self._db.scalar("SELECT count(*) FROM items"))
            return int(
                self._db.scalar("SELECT count(*) FROM items WHERE ns = ?", (namespace_key(namespace),))
            )

    def _refresh(self, ids: list[int], now: float) -> None:
        with self._db.transaction():
            self._db.executemany(
                "UPDATE items SET expires_at = ? + ttl_minutes * 60.0"
                " WHERE id = ? AND ttl_minutes IS NOT NULL",
                [(now, i) for i in ids],
            )

    def _refresh_records(self, records: list[ItemRecord], now: float) -> None:
        with self._db.transaction():
            self._db.executemany(
                "UPDATE items SET expires_at = ? + ttl_minutes * 60.0"
                " WHERE ns = ? AND key = ? AND ttl_minutes IS NOT NULL",
                [(now, SEP.join(r.namespace), r.key) for r in records],
            )


def _record(row: Any, score: float | None = None) -> ItemRecord:
    return ItemRecord(
        namespace=tuple(row[1].split(SEP)),
        key=row[2],
        value=orjson.loads(row[3]),
        created_at=row[4],
        updated_at=row[5],
        score=score,
        expires_at=row[6],
    )
