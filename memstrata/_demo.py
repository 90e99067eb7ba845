"""``make run``: a simulated multi-agent pipeline on real storage and the real default model.

Four agents (planner, backend, frontend, qa) work through a graph of 20 tasks for a "checkout v2"
feature. Tasks run in rounds: in each round every agent with a task whose dependencies are done
runs it in its own thread, all agents at once. Some tasks fail (the same ones every run); their
reasons become pitfalls in the failing agent's knowledge and, through the orchestrator, in the
shared store, so later related tasks, of the same or of another agent, get them in their prompt.
Agents report status on the session blackboard; a dashboard subscribes to it. At the end the
system is stopped and started again to show that what was learned persisted, episodes are
recalled, and a summary table is printed.

Every run starts from an empty ``demo`` folder under the data dir (it is recreated only if it
carries the demo's marker file), so runs are repeatable and never touch other agents' memory.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from memstrata.actors import Clock
from memstrata.core.config import Config
from memstrata.core.errors import InvalidInputError
from memstrata.messages import Signal, TaskPrompt
from memstrata.storage import Embedder

from ._system import MemorySystem

__all__ = ["DemoSummary", "run_demo"]

_MARKER = ".memstrata-demo"
AGENTS = ("planner", "backend", "frontend", "qa")


@dataclass(frozen=True, slots=True)
class _Task:
    id: str
    agent: str
    description: str
    after: tuple[str, ...]
    outcome: str  # the summary, or the failure reason
    fails: bool = False


TASKS: tuple[_Task, ...] = (
    _Task("t01", "planner", "Write the technical plan for checkout v2: cart, payment, confirmation", (),
          "Plan: cart service, payment adapter and confirmation page; payment calls must be idempotent"),
    _Task("t02", "backend", "Design the orders database schema for checkout v2", ("t01",),
          "Orders schema designed: orders, order_items and payments tables with foreign keys"),
    _Task("t03", "backend", "Add a migration creating the orders and order_items tables", ("t02",),
          "The orders migration locked the orders table for four minutes in staging: schema changes on "
          "large tables must run online, in small batches", fails=True),
    _Task("t04", "frontend", "Build the cart page with quantity editing", ("t01",),
          "Cart page built with optimistic quantity updates and server validation"),
    _Task("t05", "backend", "Implement the payment adapter for the card provider", ("t02",),
          "The card provider rejected retried charges as duplicates: every charge request needs an "
          "idempotency key", fails=True),
    _Task("t06", "qa", "Write end-to-end tests for the cart page", ("t04",),
          "Cart end-to-end tests written for add, remove and quantity changes"),
    _Task("t07", "backend", "Rerun the orders migration as an online schema change in batches", ("t03",),
          "Orders migration applied online in batches of 10,000 rows without locking"),
    _Task("t08", "backend", "Implement payment charge retries with exponential backoff", ("t05",),
          "Charge retries use exponential backoff and reuse the idempotency key of the first attempt"),
    _Task("t09", "frontend", "Build the payment form with card number validation", ("t04",),
          "The payment form posted full card numbers to our own API: card data must go straight to the "
          "provider's tokenization iframe", fails=True),
    _Task("t10", "qa", "Run the end-to-end checkout tests in the staging payment sandbox", ("t06", "t08"),
          "Checkout tests flaked because the staging payment sandbox rate-limits parallel test runs: run "
          "payment tests serially", fails=True),
    _Task("t11", "frontend", "Rebuild the payment form on the provider's card tokenization iframe", ("t09",),
          "Payment form rebuilt on the tokenization iframe; no card data reaches our servers"),
    _Task("t12", "backend", "Add a migration with an index on orders.customer_id", ("t07",),
          "Index on orders.customer_id created concurrently, in batches, with no table lock"),
    _Task("t13", "qa", "Stabilise the payment end-to-end tests in the staging sandbox", ("t10",),
          "Payment end-to-end tests run serially against the sandbox and pass ten times in a row"),
    _Task("t14", "frontend", "Build the order confirmation page", ("t11",),
          "Order confirmation page built with order summary and receipt download"),
    _Task("t15", "backend", "Send order confirmation emails after the payment succeeds", ("t08", "t12"),
          "Confirmation emails are queued after the payment webhook, once per order"),
    _Task("t16", "planner", "Review the payment and migration risks of checkout v2 before launch", ("t13",),
          "Risk review done: idempotent charges, online migrations and serial sandbox tests are in place"),
    _Task("t17", "qa", "Test the refund flow against the staging payment sandbox", ("t14", "t15"),
          "Refund flow tested serially against the sandbox: full and partial refunds pass"),
    _Task("t18", "backend", "Add a migration creating the refunds table", ("t15",),
          "Refunds table created by an online migration in batches"),
    _Task("t19", "frontend", "Add analytics events to the checkout funnel pages", ("t14",),
          "Analytics events added for cart view, payment start and order confirmation"),
    _Task("t20", "planner", "Write the launch checklist for checkout v2", ("t16", "t17", "t18", "t19"),
          "Launch checklist written and shared with the team"),
)  # fmt: skip
AFTER_RESTART = _Task(
    "t21", "backend", "Plan a schema migration adding a currency column to the large payments table", (), ""
)


@dataclass
class DemoSummary:
    """What a demo run did (the CLI prints the text; tests read these numbers)."""

    data_dir: Path
    seconds: float = 0.0
    completed: int = 0
    failed: int = 0
    prompts_with_knowledge: int = 0
    fallbacks: int = 0
    pitfalls_reused: list[tuple[str, str]] = field(default_factory=list)  # (task, pitfall's task)
    signals_seen: int = 0
    persisted_after_restart: bool = False
    embedding: dict[str, Any] = field(default_factory=dict)
    per_agent: dict[str, dict[str, int]] = field(default_factory=dict)


def _prepare(base: Path) -> Path:
    """``base/demo``, emptied; refuses a folder the demo did not create."""
    target = base / "demo"
    if target.exists():
        if not (target / _MARKER).is_file():
            if any(target.iterdir()):
                raise InvalidInputError(
                    f"{target} exists and was not created by the demo; refusing to clear it"
                )
        else:
            shutil.rmtree(target)
    target.mkdir(parents=True, exist_ok=True)
    (target / _MARKER).write_text("created by `memstrata demo`; cleared at the start of every demo run\n")
    return target


def _pitfall_sources(prompt: TaskPrompt) -> list[str]:
    return [str(h.entry.tags.get("taskId")) for h in prompt.hits if h.entry.category == "pitfall"]


def run_demo(
    data_dir: Path | None = None,
    *,
    out: Callable[[str], Any] = print,
    seed: int = 7,
    embedder: Embedder | None = None,
    config: Config | None = None,
    clock: Clock | None = None,
    export_to: Path | None = None,
) -> DemoSummary:
    """Run the simulated pipeline in ``{data_dir}/demo`` (default data dir: ``Config.load()``'s).

    ``out`` receives each line of the report; ``seed`` orders the agents within each round and
    seeds the system's ids; ``embedder`` defaults to the configured model (the packaged offline
    one). ``clock`` (e.g. a ``ManualClock``, advanced a minute per round) dates everything, and
    ``export_to`` receives the system's export (see ``MemorySystem.export``) before it stops:
    with a clock, two runs with one seed export the same bytes.
    """
    started = time.monotonic()
    base_config = config or Config.load()
    root = _prepare(Path(data_dir) if data_dir is not None else Path(base_config.data_dir))
    config = replace(base_config, data_dir=root)
    rng = random.Random(seed)
    summary = DemoSummary(root)
    out(f"memstrata demo: 4 agents, {len(TASKS)} tasks, data in {root}")

    system = MemorySystem.start(config, embedder=embedder, clock=clock, seed=seed)
    status = system.status()
    emb = status["embedding"]
    driver = status["driver"]
    out(
        f"model {emb['model']} ({emb['dim']} dims){' KEYWORD-ONLY' if emb['keyword_only'] else ''}, "
        f"vectors {status['vectors']}, driver {driver['driver']} {driver['sqlite_version']}"
    )
    try:
        _pipeline(system, rng, summary, out)
        out("")
        out("episodic recall: qa.recall('flaky payment sandbox tests')")
        for hit in system.agent("qa").recall("flaky payment sandbox tests", top_k=3):
            episode = hit.episode
            out(f"  {hit.score:.2f}  {episode.title}: {_short(episode.content, 80)}")
        summary.per_agent = _per_agent(system, summary)
        summary.embedding = {k: v for k, v in system.status()["embedding"].items() if k != "note"}
        if export_to is not None:
            system.export(export_to)
    finally:
        system.stop()

    out("")
    out("restart: the system is stopped and started again on the same files")
    with MemorySystem.start(config, embedder=embedder, clock=clock, seed=seed) as again:
        prompt = again.agent(AFTER_RESTART.agent).begin_task(AFTER_RESTART.id, AFTER_RESTART.description)
        sources = _pitfall_sources(prompt)
        summary.persisted_after_restart = bool(sources)
        out(f"  {AFTER_RESTART.id} {AFTER_RESTART.agent}: {AFTER_RESTART.description}")
        out(f"  prompt after restart recalls pitfalls of {', '.join(sources) or 'nothing'}:")
        for line in prompt.text.splitlines():
            out(f"    {_short(line, 150)}")
    summary.seconds = time.monotonic() - started
    _table(summary, out)
    return summary


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _pipeline(
    system: MemorySystem, rng: random.Random, summary: DemoSummary, out: Callable[[str], Any]
) -> None:
    board = system.blackboard("checkout-v2")
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def dashboard(signal: Signal) -> None:  # runs on the blackboard's delivery thread
        with lock:
            seen[signal.key.split(":")[0]] += 1

    board.subscribe("agent:*", dashboard)
    board.subscribe("task:*", dashboard)
    planner = system.agent("planner")
    conventions = [
        "All service calls that move money must be idempotent",
        "Database migrations run in the release pipeline, never by hand",
        "Frontend code never handles raw card numbers",
    ]
    for text in conventions:
        planner.store_knowledge(text, category="pattern", tags={"source": "handbook"}, shared=True)
    out(f"seeded {len(conventions)} team conventions into the shared store")

    done: set[str] = set()
    results: dict[str, tuple[TaskPrompt, bool]] = {}
    remaining = list(TASKS)
    round_no = 0
    while remaining:
        round_no += 1
        # one ready task per agent per round: a prompt never races its own agent's write-back,
        # so every run prints the same prompts
        by_agent: dict[str, list[_Task]] = {}
        for task in remaining:
            if set(task.after) <= done and task.agent not in by_agent:
                by_agent[task.agent] = [task]
        ready = sorted((t for tasks in by_agent.values() for t in tasks), key=lambda t: t.id)
        if not ready:  # pragma: no cover - the graph is acyclic
            raise RuntimeError("task graph is stuck")
        order = sorted(by_agent)
        rng.shuffle(order)
        threads = [
            threading.Thread(target=_work, args=(system, board, by_agent[a], results), name=f"demo-{a}")
            for a in order
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        out("")
        out(f"round {round_no}: {', '.join(t.id for t in ready)}")
        for task in sorted(ready, key=lambda t: t.id):
            prompt, _ = results[task.id]
            _report(task, prompt, summary, out)
            if task.fails:
                # the orchestrator shares every failure with the whole team
                planner.store_knowledge(
                    task.outcome, category="pitfall", tags={"taskId": task.id}, shared=True
                )
            done.add(task.id)
            remaining.remove(task)
        system.wait_idle(30)  # write-backs of this round land before the next round's prompts
        advance = getattr(system.clock, "advance", None)
        if callable(advance):
            advance(60.0)  # a simulated minute per round

    with lock:
        summary.signals_seen = sum(seen.values())
        agent_signals, task_signals = seen["agent"], seen["task"]
    out("")
    out(
        f"blackboard 'checkout-v2': {agent_signals} agent status and {task_signals} task signals delivered "
        f"to the dashboard; current status:"
    )
    for key in board.list("agent:"):
        out(f"  {key} = {board.get(key)}")


def _work(
    system: MemorySystem, board: Any, tasks: list[_Task], results: dict[str, tuple[TaskPrompt, bool]]
) -> None:
    for task in tasks:
        agent = system.agent(task.agent)
        board.publish(f"agent:{task.agent}:status", f"working on {task.id}", publisher=task.agent)
        prompt = agent.begin_task(task.id, task.description)
        agent.set_working("current-task", {"id": task.id, "hits": len(prompt.hits)})
        if task.fails:
            agent.fail_task(task.id, task.outcome)
        else:
            agent.complete_task(task.id, task.outcome)
        board.publish(
            f"task:{task.id}", {"state": "failed" if task.fails else "done", "agent": task.agent}, task.agent
        )
        board.publish(f"agent:{task.agent}:status", "idle", publisher=task.agent)
        results[task.id] = (prompt, task.fails)


def _report(task: _Task, prompt: TaskPrompt, summary: DemoSummary, out: Callable[[str], Any]) -> None:
    mark = "FAILED" if task.fails else "done"
    if task.fails:
        summary.failed += 1
    else:
        summary.completed += 1
    if prompt.fallback:
        summary.fallbacks += 1
        context = f"fallback ({(prompt.reason or '').split(':')[0]})"
    else:
        summary.prompts_with_knowledge += 1
        context = f"{len(prompt.hits)} entries"
    out(f"  {task.id} {task.agent:<8} {_short(task.description, 62):<62} {mark:<6} prompt: {context}")
    learned = [s for s in _pitfall_sources(prompt) if s != "None"]
    for source in learned:
        summary.pitfalls_reused.append((task.id, source))
    if learned:
        line = next(
            (x for x in prompt.text.splitlines() if x.startswith("<entry") and 'category="pitfall"' in x), ""
        )
        out(f"      pitfalls of {', '.join(sorted(set(learned)))} in the prompt, best: {_short(line, 130)}")
    if task.fails:
        out(f"      reason: {_short(task.outcome, 120)}")


def _per_agent(system: MemorySystem, summary: DemoSummary) -> dict[str, dict[str, int]]:
    system.wait_idle(30)
    status = system.status()["agents"]
    table: dict[str, dict[str, int]] = {}
    for agent in AGENTS:
        state = status.get(agent, {})
        counters = state.get("agent", {})
        table[agent] = {
            "tasks": sum(1 for t in TASKS if t.agent == agent),
            "failed": sum(1 for t in TASKS if t.agent == agent and t.fails),
            "prompts": int(counters.get("prompts", 0)),
            "fallbacks": int(counters.get("fallbacks", 0)),
            "knowledge": int(state.get("knowledge", {}).get("count", 0)),
            "episodes": int(state.get("episodic", {}).get("count", 0)),
        }
    return table


def _table(summary: DemoSummary, out: Callable[[str], Any]) -> None:
    columns = ("tasks", "failed", "prompts", "fallbacks", "knowledge", "episodes")
    out("")
    out(f"{'agent':<10}" + "".join(f"{c:>11}" for c in columns))
    totals: Counter[str] = Counter()
    for agent, row in summary.per_agent.items():
        out(f"{agent:<10}" + "".join(f"{row[c]:>11}" for c in columns))
        totals.update(row)
    out(f"{'total':<10}" + "".join(f"{totals[c]:>11}" for c in columns))
    out("")
    reused = sorted({source for _, source in summary.pitfalls_reused})
    out(
        f"{summary.completed} tasks done, {summary.failed} failed; {summary.prompts_with_knowledge} prompts "
        f"carried knowledge, {summary.fallbacks} fell back; pitfalls of {', '.join(reused) or 'no task'} "
        f"reappeared in {len(summary.pitfalls_reused)} later prompts"
    )
    emb = summary.embedding
    if emb.get("texts_requested"):
        out(
            f"embedding: {emb.get('model_calls')} model calls for {emb.get('texts_requested')} texts and "
            f"{emb.get('query_requests')} queries (largest batch {emb.get('largest_batch')})"
        )
    out(f"finished in {summary.seconds:.1f} s; inspect: memstrata --data-dir {summary.data_dir} status")
