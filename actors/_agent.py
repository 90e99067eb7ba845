"""The agent actor: an agent's task lifecycle, from prompt to write-back.

``TaskAssigned``: the actor starts the query's embedding, sends ``QueryKnowledge`` to the agent's
store (which ranks by keywords meanwhile) and returns at once to its mailbox; the replies come
back as messages, and a timer posts a deadline. The other searches (the shared store, recent
episodes, memory files, code) go out once the agent's store has answered, and the shared store
and the episodes, when hosted in this process, one after the other: searches are mostly Python,
and under the GIL two side by side do not run in parallel but convoy (each waits for the other
to hand the GIL back), so the agent's store, the largest and the critical path, searches alone,
then each small one alone (at 100k entries with a 1k shared store and 500 episodes, nothing
else running: from the agent's answer to the prompt p50 4.05 -> 3.73 ms, the whole retrieval
13.7 -> 13.2 ms). A store hosted in another process (on Ray, the shared store's host) competes
for no GIL here and is asked at once; so are the file and code searches, which may first sync
their index and must not hold each other up. Whichever completes the retrieval first (all
replies, or the deadline) answers the caller with a :class:`TaskPrompt`, so a stuck store costs
the caller the retrieval timeout and never blocks this actor. While it is in flight,
the runtime's :class:`~._foreground.Foreground` holds it, with the actors it asks: other agents'
write-back steps wait for it (boundedly), those of the actors it asks never do.

``TaskCompleted``/``TaskFailed``: the outcome is committed to the agent's outbox (all the outcomes
waiting in the mailbox in one transaction), the caller is answered (the write-back is now
durable), and the two parts (knowledge entry and episode) are sent to the store actors. Each
part's reply marks it done; a row whose parts are both done is deleted. Failed parts are retried
with backoff; rows left when the process dies are replayed the next time the agent's actor
starts (the system starts it for every outbox with rows).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from memstrata.core.constants import EMBED_CHARS, MAX_TOP_K  # EMBED_CHARS: what a query's vector is made of
from memstrata.layers import merge_hits
from memstrata.storage import prefetch_query

from ._agent_writeback import AgentWriteBack, _PartAnswered, _RetryWriteBack, _WriteBackPart, describe_error
from ._base import DEFERRED, set_result
from ._concurrency import TimerHandle
from ._outbox import Outbox
from ._prompt import build_prompt, fallback_prompt
from ._store_messages import BoundedSearch, Searched
from ._workspace import SearchFiles
from .messages import (
    SHARED,
    QueryKnowledge,
    SearchMemory,
    TaskAssigned,
    TaskCompleted,
    TaskFailed,
    TaskPrompt,
)

__all__ = ["AgentActor", "describe_error"]

_MAX_OPEN_TASKS = 10_000
_PART_LABELS = {
    "own": "knowledge query",
    "shared": "shared knowledge query",
    "episodes": "episode search",
    "files": "memory file search",
}


def _label(part: str) -> str:
    """What a retrieval part is, for ``reason`` (``code:shop`` -> ``code search of shop``)."""
    if part.startswith("code:"):
        return f"code search of {part[5:]}"
    return _PART_LABELS.get(part, part)


@dataclass(slots=True)
class _Retrieval:
    rid: int
    task: TaskAssigned
    reply: Future[Any] | None
    timeout_s: float
    top_k: int
    episodes_wanted: int
    waiting: set[str] = field(default_factory=set)
    results: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    timer: TimerHandle | None = None
    later: list[tuple[str, str, str, Any]] = field(default_factory=list)  # queued: see _send_later
    turns: set[str] = field(default_factory=set)  # parts asked that take turns (_takes_turns)
    embed_s: float = 0.0  # bound on the query embedding of each search, inside timeout_s
    started: float = 0.0  # monotonic
    degraded: dict[str, str] = field(default_factory=dict)  # part -> why it ranked by keywords only
    parts: list[str] = field(default_factory=list)  # every part asked for or planned, in order
    token: int | None = None  # in the runtime's foreground while in flight


@dataclass(frozen=True, slots=True)
class _RetrievalPart(_PartAnswered):
    """A part (``"own"``, ``"shared"``, ``"episodes"``, ...) of retrieval ``request_id`` is answered."""


@dataclass(frozen=True, slots=True)
class _RetrievalDeadline:
    rid: int


@dataclass(frozen=True, slots=True)
class Replay:
    """Internal: process every outbox row that is not already in flight."""


def _plain(text: str) -> str:
    """``text`` without its Markdown headings, its whitespace runs as one space: a section of a
    workspace's daily note (``## 10:04:31 task t1 completed``, then the summary) reads as the
    outcome entry it repeats."""
    return " ".join(" ".join(line for line in text.splitlines() if not line.lstrip().startswith("#")).split())


class AgentActor(AgentWriteBack):
    """One agent's task lifecycle; owns ``outbox/{agent}.sqlite``."""

    kind = "agent"

    def __init__(self, runtime: Any, key: str, owner: str | None = None) -> None:
        super().__init__(runtime, key, owner)
        self._retrievals: dict[int, _Retrieval] = {}
        self._rids = itertools.count(1)
        self._inflight: dict[int, set[str]] = {}
        self._tasks: dict[str, str] = {}
        self.counters: Counter[str] = Counter()
        self._reply: Future[Any] | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def open_layer(self) -> Any:
        outbox = Outbox(self.runtime.path("outbox", self.key), owner=self.runtime.instance)
        # rows left over by a crash (of this process or of this actor) are processed again
        self.runtime.post(self.actor_ref, Replay(), owner=self.owner)
        return outbox

    def refuses_when_degraded(self, message: Any) -> bool:
        return False  # prompts fall back and write-backs still reach the outbox

    def _deliver(self, envelope: Any) -> None:
        self._reply = envelope.reply
        try:
            super()._deliver(envelope)
        finally:
            self._reply = None

    def background(self, message: Any) -> bool:
        """Outcomes and their parts step aside for other agents' retrievals (see
        :mod:`._foreground`); a retrieval of this agent's never waits for them."""
        return isinstance(message, TaskCompleted | TaskFailed | _WriteBackPart | _RetryWriteBack | Replay)

    def batch_key(self, message: Any) -> str | None:
        if isinstance(message, TaskCompleted | TaskFailed):
            return "outcome"  # appended to the outbox in one transaction
        if isinstance(message, _WriteBackPart):
            return "stored"  # marked done in one transaction
        return None

    def handle_batch(self, messages: list[Any]) -> list[Any]:
        if isinstance(messages[0], _WriteBackPart):
            self._write_back_parts(messages)
            return [None] * len(messages)
        return self._write_back_many(messages)

    def handle(self, message: Any) -> Any:
        if isinstance(message, TaskAssigned):
            return self._assign(message)
        if isinstance(message, _RetrievalPart):
            return self._retrieval_part(message)
        if isinstance(message, _RetrievalDeadline):
            retrieval = self._retrievals.get(message.rid)
            if retrieval is not None:
                self._finish(retrieval, timed_out=True)
            return None
        if isinstance(message, TaskCompleted):
            return self._write_back("completed", message.task_id, message.summary)
        if isinstance(message, TaskFailed):
            return self._write_back("failed", message.task_id, message.reason)
        if isinstance(message, _WriteBackPart):
            return self._write_back_part(message)
        if isinstance(message, _RetryWriteBack | Replay):
            self._replay(message)
            return None
        return super().handle(message)

    def _replay(self, message: _RetryWriteBack | Replay) -> None:
        """Send again the parts not stored yet of one outbox row (a retry) or of every row not in
        flight (a replay of what a crash left); a row gone meanwhile is skipped."""
        rows = self.layer.pending() if isinstance(message, Replay) else [self.layer.get(message.row_id)]
        for row in rows:
            if row is not None:
                self._dispatch(row, replay=True)

    # -- pre-task retrieval --------------------------------------------------------------------

    def _exists(self, kind: str, key: str) -> bool:
        return self.runtime.existing(kind, key) is not None or self.runtime.path(kind, key).exists()

    def _assign(self, task: TaskAssigned) -> Any:
        config = self.runtime.config.for_agent(self.key)
        self._tasks.pop(task.task_id, None)
        self._tasks[task.task_id] = task.description
        while len(self._tasks) > _MAX_OPEN_TASKS:  # tasks begun and never ended: forget the oldest
            del self._tasks[next(iter(self._tasks))]
        self._new_run(task.task_id)
        retrieval = _Retrieval(
            rid=next(self._rids),
            task=task,
            reply=self._reply,
            timeout_s=config.retrieval_timeout_s,
            top_k=task.top_k or config.retrieval_top_k,
            episodes_wanted=config.recent_episodes_in_prompt,
            # the query's vector must come in time for the keyword ranking to still fit the budget
            embed_s=min(self.runtime.config.actors.query_embed_timeout_s, config.retrieval_timeout_s / 2),
            started=self.runtime.clock.monotonic(),  # deadlines run on the system's clock
        )
        self._retrievals[retrieval.rid] = retrieval
        degraded = self.runtime.supervision.degraded_reason(self.key)
        if degraded is not None:
            retrieval.errors["own"] = f"agent {self.key} is degraded: {degraded}"
            self._finish(retrieval, timed_out=False)
            return DEFERRED
        text = task.query or task.description
        own = self._exists("knowledge", self.key)
        shared = config.include_shared and self._exists("knowledge", SHARED)
        episodes = retrieval.episodes_wanted > 0 and self._exists("episodic", self.key)
        # computed while the stores rank by keywords: the agent's own stores embed the query
        # with its model, the shared store with the shared one (the same service unless the
        # agent's [embedding] names another)
        mine = self.runtime.embedder_for(self.key) if own or episodes else None
        if mine is not None:
            prefetch_query(mine, text[:EMBED_CHARS])
        common = self.runtime.embedder_for(SHARED) if shared else None
        if common is not None and common is not mine:
            prefetch_query(common, text[:EMBED_CHARS])
        query = QueryKnowledge(
            self.key,
            text,
            category=task.category,
            top_k=retrieval.top_k,
            tags=task.tags,
            scope=task.scope,
            min_score=config.retrieval_min_score,
        )
        if shared:
            shared_query = dataclasses.replace(query, agent_id=SHARED)
            retrieval.later.append(("shared", "knowledge", SHARED, shared_query))
        if episodes:
            # episodes that repeat a knowledge hit are dropped from the prompt: ask for top_k more
            wanted = min(retrieval.episodes_wanted + retrieval.top_k, MAX_TOP_K)
            search = SearchMemory(self.key, text, top_k=wanted)
            retrieval.later.append(("episodes", "episodic", self.key, search))
        # memory files and code: each bounded by its own count, within the same deadline
        if config.files_in_prompt > 0 and self.runtime.workspace_of(self.key) is not None:
            retrieval.later.append(
                ("files", "workspace", self.key, SearchFiles(text, config.files_in_prompt))
            )
        if config.code_in_prompt > 0:
            for name in self.runtime.codebases_of(self.key):
                code = SearchFiles(text, config.code_in_prompt)
                retrieval.later.append((f"code:{name}", "codebase", name, code))
        retrieval.parts = (["own"] if own else []) + [later[0] for later in retrieval.later]
        needs = {("agent", self.key), *((kind, key) for _, kind, key, _ in retrieval.later)}
        if own:
            needs.add(("knowledge", self.key))
        retrieval.token = self.runtime.foreground.enter(needs, retrieval.timeout_s)
        if own:
            self._request(retrieval, "own", "knowledge", self.key, query)
        if "own" not in retrieval.waiting:
            self._send_later(retrieval)
        if not retrieval.waiting:
            self._finish(retrieval, timed_out=False)
            return DEFERRED
        me, rid = self.actor_ref, retrieval.rid

        def deadline() -> None:
            self.runtime.post(me, _RetrievalDeadline(rid), owner=self.owner)

        retrieval.timer = self.runtime.scheduler.call_later(retrieval.timeout_s, deadline, on_clock=True)
        return DEFERRED

    def _send_later(self, retrieval: _Retrieval) -> None:
        """Sends the queued parts whose turn has come (once ``own`` has answered): a store search
        in this process when no other is in flight, the rest at once (see the module's docstring)."""
        queued, retrieval.later = retrieval.later, []
        for item in queued:
            part, kind, key, message = item
            if self._takes_turns(kind, key) and self._turn_of(retrieval) is not None:
                retrieval.later.append(item)
            else:
                self._request(retrieval, part, kind, key, message)

    def _takes_turns(self, kind: str, key: str) -> bool:
        """True for a knowledge or episode search run in this process."""
        return kind in ("knowledge", "episodic") and self.runtime.hosted_here(kind, key)

    @staticmethod
    def _turn_of(retrieval: _Retrieval) -> str | None:
        """The part in flight whose turn it is, if any."""
        return next((p for p in retrieval.parts if p in retrieval.turns and p in retrieval.waiting), None)

    def _request(self, retrieval: _Retrieval, part: str, kind: str, key: str, message: Any) -> None:
        left = retrieval.timeout_s - (self.runtime.clock.monotonic() - retrieval.started)
        bounded = BoundedSearch(message, max(0.0, min(retrieval.embed_s, left / 2)))
        try:
            future = self.runtime.request(kind, key, bounded)
        except Exception as exc:
            retrieval.errors[part] = describe_error(exc)
            return
        retrieval.waiting.add(part)
        if self._takes_turns(kind, key):
            retrieval.turns.add(part)
        self._post_when_done(future, _RetrievalPart, retrieval.rid, part)

    def _retrieval_part(self, message: _RetrievalPart) -> None:
        retrieval = self._retrievals.get(message.request_id)
        if retrieval is None:
            return  # answered already (deadline)
        error = message.future.exception()
        if error is not None:
            retrieval.errors[message.part] = describe_error(error)
        else:
            answer = message.future.result()
            if isinstance(answer, Searched):
                if answer.degraded:
                    retrieval.degraded[message.part] = answer.degraded
                answer = answer.result
            retrieval.results[message.part] = tuple(answer.hits)  # FilesFound has hits too
        retrieval.waiting.discard(message.part)
        self._send_later(retrieval)
        if not retrieval.waiting:
            self._finish(retrieval, timed_out=False)

    def _finish(self, retrieval: _Retrieval, *, timed_out: bool) -> None:
        self._retrievals.pop(retrieval.rid, None)
        if retrieval.timer is not None:
            retrieval.timer.cancel()
        task = retrieval.task
        hits = merge_hits(
            retrieval.results.get("own", ()),
            retrieval.results.get("shared", ()),
            retrieval.top_k,
            query=task.query or task.description,
            search=self.runtime.config.search,
            one_model=self.runtime.one_model(self.key, SHARED),
        )
        notes = []
        for part in dict.fromkeys([*_PART_LABELS, *retrieval.parts]):
            label = _label(part)
            if part in retrieval.errors:
                notes.append(f"{label} failed ({retrieval.errors[part]})")
            elif timed_out and part in retrieval.waiting:
                notes.append(f"{label} timed out after {retrieval.timeout_s:g} s")
            elif timed_out and any(part == later[0] for later in retrieval.later):
                before = _label(self._turn_of(retrieval) or "own")
                notes.append(f"{label} not started: the {before} had not answered")
        contents = {str(h.entry.content) for h in hits}
        shown = {_plain(content) for content in contents}  # a daily note repeating an entry: once
        files = [f for part in retrieval.parts if part == "files" or part.startswith("code:")
                 for f in retrieval.results.get(part, ())
                 if f.source != "file" or _plain(str(f.text)) not in shown]  # fmt: skip
        if hits or files:
            episodes = [
                e for e in retrieval.results.get("episodes", ()) if str(e.episode.content) not in contents
            ][: retrieval.episodes_wanted]
            text = build_prompt(task.description, hits, episodes, files)
            reasons = [f"degraded: {note}" for note in dict.fromkeys(retrieval.degraded.values())]
            if notes:
                reasons.append(f"partial: {'; '.join(notes)}")
            reason = "; ".join(reasons) or None
            prompt = TaskPrompt(
                text, tuple(hits), False, reason, self.key, task.task_id, tuple(episodes), tuple(files)
            )
        else:
            if "own" in retrieval.errors:
                reason = f"error: knowledge query failed ({retrieval.errors['own']})"
            elif timed_out and "own" in retrieval.waiting:
                reason = f"timeout: knowledge query took longer than {retrieval.timeout_s:g} s"
            else:
                reason = "no-hits: no knowledge matched the task"
            others = [n for n in notes if not n.startswith(_PART_LABELS["own"] + " ")]
            others += list(dict.fromkeys(retrieval.degraded.values()))
            if others:
                reason += f"; {'; '.join(others)}"
            prompt = TaskPrompt(fallback_prompt(task.description), (), True, reason, self.key, task.task_id)
            self.counters["fallbacks"] += 1
        self.counters["prompts"] += 1
        if retrieval.reply is not None:
            set_result(retrieval.reply, prompt)
        if retrieval.token is not None:  # after the answer: the steps it held back wake now
            self.runtime.foreground.leave(retrieval.token)

    def status(self) -> dict[str, Any]:
        base = super().status()
        base["open_tasks"] = len(self._tasks)
        base["pending_retrievals"] = len(self._retrievals)
        base["writebacks_in_flight"] = len(self._inflight)
        if self.layer is not None:
            counts = self.layer.counts()
            base["outbox_pending"] = counts["pending"]
            base["outbox_dead"] = counts["dead"]
        base.update(self.counters)
        return base
