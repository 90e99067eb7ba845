"""The asyncio twin: the same handles and methods as coroutines, async subscription iterators."""

from __future__ import annotations

import asyncio
import inspect
import threading
from pathlib import Path
from typing import Any

import pytest

from memstrata import (
    Agent,
    AsyncAgent,
    AsyncBlackboard,
    AsyncMemorySystem,
    Blackboard,
    Config,
    MemorySystem,
)
from memstrata.errors import InvalidInputError, SystemStoppedError
from memstrata.messages import Signal, TaskPrompt
from tests.fakes import FakeEmbedder


def _public(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if not name.startswith("_") and callable(value)}


def test_every_handle_method_has_an_async_twin_with_the_same_signature() -> None:
    pairs = [(Agent, AsyncAgent), (Blackboard, AsyncBlackboard)]
    for sync_cls, async_cls in pairs:
        missing = _public(sync_cls) - _public(async_cls)
        assert not missing, f"{async_cls.__name__} lacks {sorted(missing)}"
        for name in _public(sync_cls) - {"subscribe"}:
            twin = getattr(async_cls, name)
            assert inspect.iscoroutinefunction(twin), f"{async_cls.__name__}.{name} is not a coroutine"
            assert inspect.signature(twin) == inspect.signature(getattr(sync_cls, name))
    for name in ("wait_idle", "retire", "revive", "ask", "status", "stop", "tell", "export", "import_"):
        assert inspect.iscoroutinefunction(getattr(AsyncMemorySystem, name)), name


def _public_names(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


# names of MemorySystem the twin leaves out on purpose, with the reason
_NOT_TWINNED: dict[str, str] = {}


def test_the_async_system_has_every_public_name_of_the_system() -> None:
    missing = _public_names(MemorySystem) - _public_names(AsyncMemorySystem) - set(_NOT_TWINNED)
    assert not missing, f"AsyncMemorySystem lacks {sorted(missing)}"
    assert not set(_NOT_TWINNED) & _public_names(AsyncMemorySystem), "a name listed as absent is there"


def test_the_async_system_reads_the_clock_and_embedders_of_the_system(data_dir: Path) -> None:
    async def main() -> None:
        embedder = FakeEmbedder()
        async with AsyncMemorySystem.start(Config(data_dir=data_dir), embedder=embedder) as system:
            assert system.clock is system.sync.clock
            assert system.embedder is system.sync.embedder
            assert inspect.iscoroutinefunction(AsyncMemorySystem.embedder_for)
            assert inspect.signature(AsyncMemorySystem.embedder_for) == inspect.signature(
                MemorySystem.embedder_for
            )
            assert await system.embedder_for("planner") is system.sync.embedder_for("planner")
            with pytest.raises(InvalidInputError):
                await system.embedder_for("")

    asyncio.run(main())


def test_sixteen_agents_work_concurrently_under_asyncio(data_dir: Path) -> None:
    async def one_agent(system: AsyncMemorySystem, n: int) -> tuple[str, TaskPrompt, list[str]]:
        agent = system.agent(f"agent-{n}")
        await agent.store_knowledge(f"agent {n} learned that widget {n} needs a torque of {n} Nm")
        prompt = await agent.begin_task(f"t{n}", f"tighten widget {n}")
        await agent.complete_task(f"t{n}", f"widget {n} tightened to {n} Nm")
        await agent.set_working("step", n)
        hits = await agent.query_knowledge(f"widget {n} torque", top_k=3, include_shared=False)
        return agent.id, prompt, [hit.entry.content for hit in hits]

    async def main() -> list[tuple[str, TaskPrompt, list[str]]]:
        async with AsyncMemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
            results = await asyncio.gather(*(one_agent(system, n) for n in range(16)))
            assert await system.wait_idle(30)
            working = await asyncio.gather(
                *(system.agent(f"agent-{n}").get_working("step") for n in range(16))
            )
            assert working == list(range(16))
            status = await system.status()
            assert status
            return results

    results = asyncio.run(main())
    assert len({agent_id for agent_id, _, _ in results}) == 16
    for n, (_, prompt, contents) in enumerate(results):
        assert f"widget {n} needs a torque" in prompt.text, prompt.text
        assert any(f"widget {n}" in text for text in contents)
    # everything is durable: a synchronous system over the same data dir sees each outcome
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as again:
        for n in range(16):
            contents = [e.content for e in again.agent(f"agent-{n}").list_knowledge()]
            assert f"widget {n} tightened to {n} Nm" in contents


def test_subscription_yields_current_values_then_changes_and_nothing_after_unsubscribe(
    data_dir: Path,
) -> None:
    async def main() -> tuple[list[tuple[str, object]], list[tuple[str, object]], object]:
        async with AsyncMemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
            board = system.blackboard("s1")
            await board.publish("agent:a:status", "idle", wait=True)
            await board.publish("other", 1, wait=True)
            seen: list[tuple[str, object]] = []
            async with board.subscribe("agent:*") as signals:
                assert signals.id is not None
                await board.publish("agent:b:status", "busy", wait=True)
                await board.publish("other", 2, wait=True)
                await board.publish("agent:a:status", "done", wait=True)
                async for signal in signals:
                    seen.append((signal.key, signal.value))
                    if len(seen) == 3:
                        break
            after: list[tuple[str, object]] = []
            await board.publish("agent:a:status", "late", wait=True)
            assert await system.wait_idle(10)
            async for signal in signals:  # the queue holds nothing past the unsubscribe
                after.append((signal.key, signal.value))
            return seen, after, await board.get("agent:a:status")

    seen, after, last = asyncio.run(main())
    assert seen == [("agent:a:status", "idle"), ("agent:b:status", "busy"), ("agent:a:status", "done")]
    assert after == []
    assert last == "late"


def test_a_cancelled_await_still_stores_the_write(data_dir: Path) -> None:
    async def main() -> None:
        async with AsyncMemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
            agent = system.agent("a")
            task = asyncio.ensure_future(agent.store_knowledge("kept even when nobody waits"))
            await asyncio.sleep(0)  # one loop turn: the task sends its call, then its wait is cancelled
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await system.wait_idle(10)
            contents = [e.content for e in await agent.list_knowledge()]
            assert "kept even when nobody waits" in contents

    asyncio.run(main())


def test_bad_input_raises_the_same_clear_error(data_dir: Path) -> None:
    async def main() -> None:
        system = await AsyncMemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder())
        try:
            with pytest.raises(InvalidInputError, match="agent"):
                system.agent("bad id with spaces\x00")
            with pytest.raises(InvalidInputError):
                await system.agent("a").store_knowledge("x", category="Not A Category!")
            with pytest.raises(InvalidInputError):
                system.blackboard("s").subscribe(42)  # type: ignore[arg-type]
        finally:
            await system.stop()
        assert system.stopped

    asyncio.run(main())


async def _in_thread(event: threading.Event) -> bool:
    """Wait for an event set by a pool thread without blocking the loop (bounded: a safety net)."""
    return await asyncio.get_running_loop().run_in_executor(None, event.wait, 30)


def test_stop_is_idempotent_and_later_calls_raise_system_stopped_error(data_dir: Path) -> None:
    async def main() -> None:
        async with AsyncMemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
            agent, board = system.agent("a"), system.blackboard("s")
            await agent.remember("before the stop")
            assert (await system.stop()).drained
            assert (await system.stop()).drained  # a second stop, as in the synchronous API
            assert system.stopped
            with pytest.raises(SystemStoppedError):
                await agent.remember("after the stop")
            with pytest.raises(SystemStoppedError):
                await board.publish("k", 1, wait=True)
            with pytest.raises(SystemStoppedError):
                await system.retire("a")
            assert await system.wait_idle(10)
            assert (await system.status())["stopped"] is True
        # leaving the block stopped it once more, quietly

    asyncio.run(main())


def test_a_task_cancelled_inside_a_subscription_after_stop_gets_cancelled_error(data_dir: Path) -> None:
    async def main() -> None:
        async with AsyncMemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
            board = system.blackboard("s")
            entered = asyncio.Event()

            async def holder() -> None:
                async with board.subscribe("k*"):
                    entered.set()
                    await asyncio.Event().wait()  # until cancelled

            task = asyncio.create_task(holder())
            await asyncio.wait_for(entered.wait(), 30)
            await system.stop()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())


def test_iteration_ends_when_the_system_stops_after_the_queued_signals(data_dir: Path) -> None:
    async def main() -> None:
        system = await AsyncMemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder())
        board = system.blackboard("s")
        await board.publish("k1", 1, wait=True)
        subscription = board.subscribe("k*")
        entered = asyncio.Event()

        async def consume() -> list[tuple[str, object]]:
            seen: list[tuple[str, object]] = []
            async with subscription as signals:
                entered.set()
                async for signal in signals:
                    seen.append((signal.key, signal.value))
            return seen

        task = asyncio.create_task(consume())
        await asyncio.wait_for(entered.wait(), 30)
        await board.publish("k2", 2, wait=True)
        await system.stop()
        assert await asyncio.wait_for(task, 30) == [("k1", 1), ("k2", 2)]

        async def again() -> list[Signal]:
            return [signal async for signal in subscription]

        assert await asyncio.wait_for(again(), 30) == []  # ended for good, not waiting again

    asyncio.run(main())


def test_iteration_ends_when_the_wrapped_synchronous_system_is_stopped_directly(data_dir: Path) -> None:
    async def main() -> None:
        sync = MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder())
        system = AsyncMemorySystem(sync)  # its owner stops it, through the synchronous object
        board = system.blackboard("s")
        await board.publish("k1", 1, wait=True)
        entered = asyncio.Event()

        async def consume() -> list[str]:
            async with board.subscribe("k*") as signals:
                entered.set()
                return [signal.key async for signal in signals]

        task = asyncio.create_task(consume())
        await asyncio.wait_for(entered.wait(), 30)
        await asyncio.get_running_loop().run_in_executor(None, sync.stop)
        assert await asyncio.wait_for(task, 30) == ["k1"]
        with pytest.raises(SystemStoppedError):
            await board.publish("k2", 2, wait=True)
        late = board.subscribe("k*")  # made after the stop: refused, and iterates nothing
        with pytest.raises(SystemStoppedError):
            await late.__aenter__()
        assert [signal async for signal in late] == []

    asyncio.run(main())


def test_a_cancelled_start_stops_the_system_it_started(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[MemorySystem] = []
    entered, release, stopped = threading.Event(), threading.Event(), threading.Event()
    init, stop = MemorySystem.__init__, MemorySystem.stop

    def held_init(self: MemorySystem, runtime: Any) -> None:  # the system exists; its start goes on
        init(self, runtime)
        made.append(self)
        entered.set()
        release.wait(30)

    def seen_stop(self: MemorySystem, timeout: float | None = None) -> Any:
        try:
            return stop(self, timeout)
        finally:
            stopped.set()

    monkeypatch.setattr(MemorySystem, "__init__", held_init)
    monkeypatch.setattr(MemorySystem, "stop", seen_stop)

    async def main() -> None:
        starting = asyncio.ensure_future(
            AsyncMemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder())
        )
        assert await _in_thread(entered)
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        release.set()  # the start now completes in its thread, for nobody
        assert await _in_thread(stopped)

    try:
        asyncio.run(main())
        assert len(made) == 1 and made[0].stopped
    finally:
        release.set()
        for system in made:
            stop(system)


def test_a_subscription_whose_entry_is_cancelled_is_removed(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = threading.Event(), threading.Event()
    subscribe = Blackboard.subscribe

    def held_subscribe(self: Blackboard, key_or_prefix: str, callback: Any) -> Any:
        made = subscribe(self, key_or_prefix, callback)  # live now; the caller is cancelled next
        entered.set()
        release.wait(30)
        return made

    monkeypatch.setattr(Blackboard, "subscribe", held_subscribe)

    async def main() -> dict[str, Any]:
        async with AsyncMemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
            board = system.blackboard("s")

            async def consumer() -> None:
                async with board.subscribe("k*") as signals:
                    async for _ in signals:
                        pass

            task = asyncio.create_task(consumer())
            assert await _in_thread(entered)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            release.set()
            assert await system.wait_idle(30)
            for n in range(3):
                await board.publish(f"k{n}", n, wait=True)
            assert await system.wait_idle(30)
            board_status: dict[str, Any] = (await system.status())["blackboards"]["s"]
            return board_status

    try:
        board_status = asyncio.run(main())
    finally:
        release.set()
    assert (board_status["subscribers"], board_status["delivered"]) == (0, 0)


def test_wrappers_of_one_system_share_one_pool(data_dir: Path) -> None:
    """Wrapping a running system per request made a pool per wrapper, each kept (with its idle
    threads) until the system stopped."""
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:

        async def scenario() -> None:
            wrappers = [AsyncMemorySystem(system) for _ in range(20)]
            for n, wrapper in enumerate(wrappers):
                await wrapper.agent("a1").remember(f"note {n}")
            assert len({id(w._pool) for w in wrappers}) == 1
            assert AsyncMemorySystem(system)._pool is wrappers[0]._pool

        asyncio.run(scenario())
        assert len(system.agent("a1").list_episodes()) == 20
        pool = AsyncMemorySystem(system)._pool
    assert pool.closed  # the system's stop released it


def test_leaving_an_async_for_ends_its_subscription(data_dir: Path) -> None:
    """A bare ``async for`` started the subscription itself; leaving it (or its event loop
    ending) ends it: no subscriber left behind, no delivery failing on a closed loop."""
    from tests._support import eventually

    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        board = system.blackboard("s1")
        board.publish("job:1", "queued", wait=True)

        async def first_job() -> Any:
            async for signal in AsyncMemorySystem(system).blackboard("s1").subscribe("job:*"):
                return signal.value
            return None

        def subscribers() -> int:
            return int(system.status()["blackboards"]["s1"]["subscribers"])

        assert asyncio.run(first_job()) == "queued"
        assert eventually(lambda: subscribers() == 0)
        board.publish("job:2", "queued", wait=True)
        assert system.wait_idle(30)
        assert system.status()["blackboard_subscriber_errors"] == 0 and subscribers() == 0
