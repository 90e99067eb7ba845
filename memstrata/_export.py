"""Export and import of a whole system's memory as sorted JSON lines.

Format (version 1): UTF-8, one JSON object per line, keys sorted, each with a ``kind``:

- ``{"kind": "export", "format": "memstrata-export", "version": 1}`` (always the first line);
- ``knowledge``: ``owner`` (agent id or ``shared``), ``id``, ``content``, ``category``, ``scope``,
  ``tags``, ``author``, ``created_at`` and ``updated_at`` (UNIX seconds from the system's clock);
- ``episode``: ``agent``, ``id``, ``uuid``, ``at`` (ISO 8601), ``episode_kind``, ``title``,
  ``task_run_id``, ``tags``, ``content``, ``archive`` (the archive file's name, ``null`` if live);
- ``working``: ``agent``, ``key``, ``value``, ``expires_in_s`` (``null``: never expires), and
  ``task_id`` for a key of a task's space (absent for the agent-wide space);
- ``signal``: ``session``, ``key``, ``value``, ``publisher``, ``version``, ``updated_at``;
- ``item``: ``namespace`` (list of labels), ``key``, ``value``, ``created_at``, ``updated_at``,
  ``expires_at`` (UNIX seconds, ``null``: never), ``ttl_minutes`` and ``vectors`` (field name to
  vector, ``null`` when the item has none; kept because a caller's own model may have made them).

Lines are sorted by kind, then owner, then id (or key), so two runs that stored the same memory
export the same bytes: nothing depends on the process, the machine or wall time when the system
runs on an injected clock with a seed. Use it to diff simulation runs, for backups and to move
memory between machines; :func:`import_records` restores it into a running system.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from memstrata.core.constants import MAX_EXACT_JSON_INT
from memstrata.core.errors import InvalidInputError, StorageError
from memstrata.core.json_text import loads_or_refuse
from memstrata.core.validation import (
    check_agent_id,
    check_content,
    check_int,
    check_path,
    check_task_id,
    check_timestamp,
)
from memstrata.layers._roots import refused_output
from memstrata.messages import (
    SHARED,
    ListSignals,
    Message,
    PublishSignal,
    PutItem,
    QuerySignal,
    SetWorkingMemory,
    StoreKnowledge,
    StoreMemory,
)

if TYPE_CHECKING:
    from memstrata.actors import Runtime

__all__ = [
    "FORMAT",
    "VERSION",
    "check_record",
    "export_records",
    "export_target",
    "import_records",
    "read_export",
    "write_export",
]

FORMAT = "memstrata-export"
VERSION = 1
_KIND_ORDER = {"export": 0, "knowledge": 1, "episode": 2, "working": 3, "signal": 4, "item": 5}
_OWNER_KEY = {"knowledge": "owner", "episode": "agent", "working": "agent", "signal": "session"}


def _sort_key(record: dict[str, Any]) -> tuple[Any, ...]:
    kind = str(record["kind"])
    owner = str(record.get(_OWNER_KEY.get(kind, ""), ""))
    if kind == "episode":
        return (_KIND_ORDER[kind], owner, record.get("archive") or "", int(record["id"]), record["uuid"])
    if kind == "knowledge":
        return (_KIND_ORDER[kind], owner, int(record["id"]))
    if kind == "item":
        return (_KIND_ORDER[kind], "\x1f".join(map(str, record["namespace"])), str(record["key"]))
    return (_KIND_ORDER.get(kind, 9), owner, str(record.get("key", "")))


def _owners(runtime: Runtime, kind: str, running: list[tuple[str, str]]) -> set[str]:
    """Agents (or ``shared``) with a store of this kind on disk or running."""
    owners = {key for k, key in running if k == kind}
    folder = runtime.data_dir / kind
    if folder.is_dir():
        owners |= {p.stem for p in folder.glob("*.sqlite")}
    valid = set()
    for owner in owners:
        try:
            check_agent_id(owner, allow_shared=True)
        except InvalidInputError:
            continue  # a stray file in the folder is not an agent's store
        valid.add(owner)
    return valid


def export_records(runtime: Runtime, *, timeout: float, into: Path | None = None) -> list[dict[str, Any]]:
    """Every record of every store, sorted (waits until the system is idle first). ``into``: the
    file the export will replace, refused by an episodic store whose archive it is."""
    from memstrata.actors._items_actor import ITEMS_FILE, ITEMS_KEY
    from memstrata.actors._store_messages import ExportRecords

    runtime.check_open()
    runtime.wait_idle(timeout)
    running = runtime.running()
    records: list[dict[str, Any]] = [{"kind": "export", "format": FORMAT, "version": VERSION}]
    ask = ExportRecords(None if into is None else os.path.realpath(into))  # as the write will follow
    for kind in ("knowledge", "episodic"):
        for owner in sorted(_owners(runtime, kind, running)):
            if kind == "episodic" and owner == SHARED:
                continue
            records += runtime.wait(runtime.request(kind, owner, ask), timeout, f"export {kind} {owner}")
    for key in sorted(_working_owners(runtime, running)):
        records += runtime.wait(
            runtime.request("working", key, ExportRecords()), timeout, f"export working {key}"
        )
    # boards that run, and with snapshots those saved by an earlier run (loaded when asked)
    if runtime.config.actors.blackboard_snapshot:
        boards = _owners(runtime, "blackboard", running)
    else:
        boards = {key for kind, key in running if kind == "blackboard"}
    for session in sorted(boards):
        records += _board_records(runtime, session, timeout)
    if (runtime.data_dir / ITEMS_FILE).exists() or any(k == "items" for k, _ in running):
        records += runtime.wait(runtime.request("items", ITEMS_KEY, ExportRecords()), timeout, "export items")
    records[1:] = sorted(records[1:], key=_sort_key)
    records[0]["records"] = len(records) - 1  # an import of a file cut short can tell
    return records


def _working_owners(runtime: Runtime, running: list[tuple[str, str]]) -> set[str]:
    """Agents with working memory: those whose actor runs, and those whose values outlived the
    actor (a retired agent's are kept for its next use, so a backup holds them too)."""
    return {key for kind, key in running if kind == "working"} | set(runtime.working_memories)


def _board_records(runtime: Runtime, session: str, timeout: float) -> list[dict[str, Any]]:
    """The ``signal`` records of one session's blackboard."""
    ask = functools.partial(runtime.request, "blackboard", session)
    records = []
    for name in runtime.wait(ask(ListSignals(None, session)), timeout, "export").keys:
        value = runtime.wait(ask(QuerySignal(name, session)), timeout, "export")
        if value.found:
            records.append(
                {
                    "kind": "signal",
                    "session": session,
                    "key": name,
                    "value": value.value,
                    "publisher": value.publisher_id,
                    "version": value.version,
                    "updated_at": value.updated_at.isoformat() if value.updated_at else None,
                }
            )
    return records


def write_export(records: Iterable[dict[str, Any]], target: Path) -> int:
    """Write records as JSON lines to ``target`` (checked by :func:`export_target`), atomically:
    a temporary file renamed over it."""
    lines = 0
    try:
        fd, tmp = tempfile.mkstemp(prefix=".export-", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                for record in records:
                    out.write(orjson.dumps(record, option=orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE))
                    lines += 1
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise StorageError(f"cannot write the export {target}: {exc}") from exc
    return lines


def export_target(path: str | os.PathLike[str], data_dir: Path) -> Path:
    """Where an export may be written: a new file or a regular file in an existing folder outside
    the data dir (a device, a folder or a symlink is never replaced, nor memstrata's own files)."""
    raw = check_path(path)
    target = Path(raw).expanduser()
    refused = refused_output(target, data_dir)
    if refused is not None:
        raise InvalidInputError(f"export path {raw!r} {refused}: write the export elsewhere")
    if not target.parent.is_dir():
        raise InvalidInputError(f"export path {raw!r}: the folder {str(target.parent)!r} does not exist")
    try:
        mode = target.lstat().st_mode
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise InvalidInputError(f"export path {raw!r} cannot be checked: {exc}") from exc
    if not stat.S_ISREG(mode):
        raise InvalidInputError(f"export path {raw!r} exists and is not a regular file: not replaced")
    return target


def read_export(path: str | os.PathLike[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The records of an export file, each with where it is (``"PATH line N"``), checked line by
    line for JSON and a known kind (a bad line names its number). The first line must be the
    header; when it counts the records (every export since the count was added does), a file
    with fewer or more is refused once read: it was cut short, or added to."""
    source = Path(check_path(path)).expanduser()
    try:
        if not stat.S_ISREG(source.stat().st_mode):  # a device or a pipe could stream forever
            raise InvalidInputError(f"cannot read the export {source}: not a regular file")
        handle = source.open("rb")
    except OSError as exc:
        raise InvalidInputError(f"cannot read the export {source}: {exc}") from exc
    header: dict[str, Any] | None = None
    count = 0
    with handle:
        for number, line in enumerate(handle, 1):
            if number > 1 and not line.strip():
                continue
            record = loads_or_refuse(line, f"{source} line {number}") if line.strip() else None
            if number == 1:
                if (
                    not isinstance(record, dict)
                    or record.get("format") != FORMAT
                    or record.get("version") != VERSION
                ):
                    raise InvalidInputError(
                        f"{source} is not a memstrata export (version {VERSION}): "
                        f"its first line is {line[:80]!r}"
                    )
                header = record
            if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
                raise InvalidInputError(f"{source} line {number} is not an object with a 'kind'")
            if record["kind"] not in _KIND_ORDER:
                raise InvalidInputError(f"{source} line {number} has unknown kind {record['kind']!r}")
            if number > 1:
                count += 1
            yield f"{source} line {number}", record
    if header is None:
        raise InvalidInputError(f"{source} is empty: not a memstrata export")
    expected = header.get("records")
    if expected is not None and (isinstance(expected, bool) or not isinstance(expected, int)):
        raise InvalidInputError(f"{source} line 1: records must be an integer, got {expected!r}")
    if expected is not None and expected != count:
        raise InvalidInputError(
            f"{source} holds {count} records where its header says {expected}: "
            f"{'cut short' if count < expected else 'added to'}; nothing was imported"
        )


# the message each kind of record amounts to when imported, with the record's name for each of
# the message's fields: a record is checked by the rules of a live write of the same data
_AS_MESSAGE: dict[str, tuple[type[Message], dict[str, str]]] = {
    "knowledge": (
        StoreKnowledge,
        {
            "agent_id": "owner",
            "content": "content",
            "category": "category",
            "tags": "tags",
            "scope": "scope",
            "author": "author",
        },
    ),
    "episode": (
        StoreMemory,
        {
            "agent_id": "agent",
            "task_run_id": "task_run_id",
            "content": "content",
            "title": "title",
            "tags": "tags",
            "kind": "episode_kind",
            "at": "at",
        },
    ),
    "working": (
        SetWorkingMemory,
        {"agent_id": "agent", "key": "key", "value": "value", "ttl_s": "expires_in_s", "task_id": "task_id"},
    ),
    "signal": (
        PublishSignal,
        {"key": "key", "value": "value", "publisher_id": "publisher", "session_id": "session"},
    ),
    "item": (
        PutItem,
        {
            "namespace": "namespace",
            "key": "key",
            "value": "value",
            "ttl_minutes": "ttl_minutes",
            "vectors": "vectors",
        },
    ),
}
# UNIX seconds: (field, may be null)
_TIMES = {
    "knowledge": (("created_at", True), ("updated_at", True)),
    "item": (("created_at", False), ("updated_at", False), ("expires_at", True)),
}
# fields an import reads as given, where the message would take a default or null in their place
_GIVEN = {"working": ("value",), "signal": ("session", "value")}


def check_record(where: str, record: dict[str, Any], *, max_content_bytes: int) -> None:
    """Refuse a record an import could not apply, naming ``where`` and the field: its fields
    must meet the rules of a live write of the same data (the message it amounts to); its ids
    must be integers every JSON client holds exactly (every door carries them as JSON numbers),
    its times what a datetime holds. Every record is checked before an import applies any."""
    kind = record["kind"]
    if kind == "export":
        return
    cls, fields = _AS_MESSAGE[kind]
    required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
    # a field left out is null where the message has no default: its rule says if that may be
    given = {field: record.get(name) for field, name in fields.items() if name in record or field in required}
    if kind == "episode":
        given["at"] = _episode_time(where, record.get("at"))
    missing = [name for name in _GIVEN.get(kind, ()) if name not in record]
    if missing:
        raise InvalidInputError(f"{where} ({kind}): {missing[0]} is missing")
    try:
        cls(**given)
        if "content" in given:
            check_content(given["content"], "content", max_bytes=max_content_bytes)
        if kind in ("knowledge", "episode"):
            check_int(record.get("id"), "id", 1, MAX_EXACT_JSON_INT)
        if kind == "episode":  # an id of text, as a task's is (null: a new one)
            check_task_id(record.get("uuid"), "uuid", optional=True)
        for name, optional in _TIMES.get(kind, ()):
            check_timestamp(record.get(name), name, optional=optional)
    except InvalidInputError as exc:
        message = str(exc)
        for field, name in fields.items():  # the record's names, not the message's
            message = message.replace(f"{cls.__name__}.{field}", name)
        raise InvalidInputError(f"{where} ({kind}): {message}") from None


def _check_item_dims(
    where: str, record: dict[str, Any], first: tuple[str, int] | None
) -> tuple[str, int] | None:
    """Refuse an item whose vectors differ in length from the first item vector of the file
    (an item store holds one dimension); returns the first vector's place and length."""
    vectors = record.get("vectors") if record["kind"] == "item" else None
    if not isinstance(vectors, dict):
        return first
    for field, vector in vectors.items():
        if not isinstance(vector, list):
            continue  # the item layer refuses it, before anything is imported
        if first is None:
            first = (where, len(vector))
        elif len(vector) != first[1]:
            raise InvalidInputError(
                f"{where} (item): vector {field!r} has {len(vector)} dimensions, the one at {first[0]} "
                f"has {first[1]}: an item store holds one dimension"
            )
    return first


def _episode_time(where: str, value: object) -> datetime:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return datetime.fromisoformat(value)
    raise InvalidInputError(f"{where} (episode): at must be an ISO 8601 time, got {value!r}")


def _retagged(record: dict[str, Any], moved: Mapping[tuple[str, str], str]) -> dict[str, Any]:
    """A knowledge record whose ``episode_id`` tag names an episode of its author (of its owner
    when it has none: the agent that promoted it) that the import gave another id: with that id."""
    tags = record.get("tags")
    if not isinstance(tags, dict) or not isinstance(tags.get("episode_id"), str):
        return record
    new = moved.get((str(record.get("author") or record["owner"]), tags["episode_id"]))
    return record if new is None else {**record, "tags": {**tags, "episode_id": new}}


def import_records(
    runtime: Runtime, lines: Iterable[tuple[str, dict[str, Any]]], *, timeout: float
) -> dict[str, int]:
    """Restore exported records (from :func:`read_export`) into the running system; returns
    counts by kind. Every record is checked (:func:`check_record`) before any is applied, so a
    file with a bad line changes nothing.

    Knowledge keeps its times (and its ids when the store was empty); episodes keep their uuid
    and time (and their ids when the store was empty) and are skipped when the same episode
    (uuid, time and contents) is there; a different one under a uuid held there is imported
    under a new uuid; archived ones are counted as skipped (restore their archive file); working
    memory and blackboard values are set again; items are upserted with their times, expiry and
    vectors. Episodes go before knowledge, so the ``episode_id`` tag of an entry promoted from
    an episode of the file names the id that episode has here.
    """
    from memstrata.actors._items_actor import ITEMS_KEY
    from memstrata.actors._store_messages import EpisodesImported, ImportRecords

    runtime.check_open()
    records = []
    dims: tuple[str, int] | None = None  # the first item vector's place and length
    for where, record in lines:
        check_record(where, record, max_content_bytes=runtime.config.max_content_bytes)
        dims = _check_item_dims(where, record, dims)
        records.append(record)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    signals: list[dict[str, Any]] = []
    items: list[dict[str, Any]] = []
    counts = {"knowledge": 0, "episode": 0, "working": 0, "signal": 0, "item": 0, "skipped": 0}
    for record in records:
        kind = record["kind"]
        if kind == "export":
            continue
        if kind == "item":
            items.append({k: v for k, v in record.items() if k != "kind"})
            continue
        if kind == "signal":
            signals.append(record)
            continue
        owner = str(record[_OWNER_KEY[kind]])
        if kind == "episode" and record.get("archive"):
            counts["skipped"] += 1
            continue
        actor = {"knowledge": "knowledge", "episode": "episodic", "working": "working"}[kind]
        groups.setdefault((actor, owner), []).append(record)
    if items:  # first: the one check that needs the store (its vectors' dimension) fails before anything
        try:
            added = runtime.wait(
                runtime.request("items", ITEMS_KEY, ImportRecords(tuple(items))), timeout, "import items"
            )
        except InvalidInputError as exc:
            source = "" if dims is None else f"{dims[0].rsplit(' line ', 1)[0]}: "
            raise InvalidInputError(f"{source}{exc}: nothing was imported") from None
        counts["item"] += int(added)
    moved: dict[tuple[str, str], str] = {}  # (agent, exported episode id) -> its id here, where other
    for (actor, owner), group in sorted(groups.items(), key=lambda g: (g[0][0] != "episodic", g[0])):
        if actor == "knowledge" and moved:
            group = [_retagged(record, moved) for record in group]
        added = runtime.wait(
            runtime.request(actor, owner, ImportRecords(tuple(group))), timeout, f"import {actor} {owner}"
        )
        if isinstance(added, EpisodesImported):
            moved.update(((owner, str(old)), str(new)) for old, new in added.ids.items())
            added = added.added
        kind = "episode" if actor == "episodic" else actor
        counts[kind] += int(added)
        counts["skipped"] += len(group) - int(added)
    for record in sorted(signals, key=_sort_key):
        message = PublishSignal(record["key"], record["value"], record.get("publisher"), record["session"])
        runtime.wait(runtime.request("blackboard", record["session"], message), timeout, "import signal")
        counts["signal"] += 1
    runtime.wait_idle(timeout)
    return counts
