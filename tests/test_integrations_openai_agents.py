"""The OpenAI Agents SDK's Session on memstrata (memstrata.integrations.openai_agents)."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="the openai-agents extra is not installed")

from agents import Agent, Runner, set_tracing_disabled
from agents.memory import SessionSettings
from agents.testing import ScriptedModel, assistant_message

from memstrata.errors import InvalidInputError, SystemStoppedError
from memstrata.integrations.openai_agents import InputTypeError, MemstrataSession, SessionClosedError

set_tracing_disabled(True)  # no network: nothing is exported


def test_history_order_limit_pop_clear(tmp_path: Path) -> None:
    async def scenario() -> None:
        session = MemstrataSession("s1", tmp_path / "h.sqlite")
        await session.add_items([{"role": "user", "content": f"m{i}"} for i in range(5)])
        assert [i["content"] for i in await session.get_items()] == ["m0", "m1", "m2", "m3", "m4"]
        assert [i["content"] for i in await session.get_items(limit=2)] == ["m3", "m4"]
        assert await session.get_items(limit=0) == []
        assert (await session.pop_item()) == {"role": "user", "content": "m4"}
        assert len(await session.get_items()) == 4
        other = MemstrataSession("s2", str(tmp_path / "h.sqlite"))
        await other.add_items([{"role": "user", "content": "elsewhere"}])
        await session.clear_session()
        assert await session.get_items() == [] and await session.pop_item() is None
        assert len(await other.get_items()) == 1
        session.close()
        other.close()
        with pytest.raises(SystemStoppedError):
            await session.add_items([])

    asyncio.run(scenario())


def test_settings_limit_and_bad_input() -> None:
    async def scenario() -> None:
        session = MemstrataSession("s", session_settings=SessionSettings(limit=1))
        await session.add_items([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
        assert [i["content"] for i in await session.get_items()] == ["b"]
        assert len(await session.get_items(limit=5)) == 2
        with pytest.raises(InvalidInputError, match="not JSON"):
            await session.add_items([{"role": "user", "content": object()}])

    asyncio.run(scenario())
    with pytest.raises(InvalidInputError, match="session_id"):
        MemstrataSession("")


def test_runner_with_a_scripted_model_keeps_the_conversation(tmp_path: Path) -> None:
    async def scenario() -> None:
        model = ScriptedModel()
        agent = Agent(name="helper", model=model)
        session = MemstrataSession("chat", tmp_path / "chat.sqlite")
        model.enqueue([assistant_message("Paris")])
        first = await Runner.run(agent, "Capital of France?", session=session)
        assert first.final_output == "Paris"
        model.enqueue([assistant_message("About 2 million")])
        await Runner.run(agent, "Its population?", session=session)
        history = await session.get_items()
        assert len(history) == 4
        assert history[0]["content"] == "Capital of France?"
        session.close()

    asyncio.run(scenario())


def test_history_is_episodic_memory_and_deletion_is_for_good(tmp_path: Path) -> None:
    from memstrata import Config, MemorySystem
    from memstrata.actors import ManualClock
    from memstrata.testing import HashEmbedder

    t0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    clock = ManualClock(t0)

    async def scenario(system: MemorySystem) -> None:
        session = MemstrataSession("chat-1", system=system, agent_id="helper")
        items = [{"role": "user", "content": "the violet harbor lantern", "extra": [1, 2.5, None]}]
        items.append({"role": "assistant", "content": "the copper falcon"})
        await session.add_items(items)
        assert await session.get_items() == items  # each item's JSON kept exactly
        helper = system.agent("helper")
        found = helper.recall("violet harbor lantern", task_run_id="chat-1")
        assert [h.episode.content for h in found][:1] == [
            '{"role":"user","content":"the violet harbor lantern","extra":[1,2.5,null]}'
        ]
        archived = helper.archive_episodes(tmp_path / "before.sqlite", task_run_id="chat-1")
        assert archived.archived == 2 and await session.get_items() == []
        helper.restore_episodes(tmp_path / "before.sqlite")
        assert await session.pop_item() == items[1]
        await session.clear_session()
        assert await session.get_items() == []
        # gone for good: no search finds them and restoring the older archive brings none back
        assert helper.restore_episodes(tmp_path / "before.sqlite") == 0
        assert helper.recall("violet harbor lantern", task_run_id="chat-1") == []
        session.close()

    with MemorySystem.start(Config(data_dir=tmp_path / "d"), embedder=HashEmbedder(), clock=clock) as system:
        asyncio.run(scenario(system))


def test_a_note_remembered_in_the_run_is_not_an_item_and_two_sessions_keep_one_order(tmp_path: Path) -> None:
    """A note the agent remembers with the conversation's id as its task run is left alone by
    get_items, pop_item and clear_session (it broke them: not JSON, and popped first); two
    session objects of one conversation add in one order, on a clock that stands still."""
    from memstrata import Config, MemorySystem
    from memstrata.actors import ManualClock
    from memstrata.testing import HashEmbedder

    async def scenario(system: MemorySystem) -> None:
        first = MemstrataSession("chat-42", system=system, agent_id="helper")
        second = MemstrataSession("chat-42", system=system, agent_id="helper")
        await first.add_items([{"n": 1}])
        system.agent("helper").remember("user prefers tea", task_run_id="chat-42")
        for n in range(2, 8):
            await (first if n % 2 else second).add_items([{"n": n}])
        assert await first.get_items() == [{"n": n} for n in range(1, 8)]
        assert await second.get_items(limit=2) == [{"n": 6}, {"n": 7}]
        assert await second.pop_item() == {"n": 7}
        await first.clear_session()
        assert await second.get_items() == [] and await second.pop_item() is None
        notes = system.agent("helper").list_episodes(task_run_id="chat-42")
        assert [e.content for e in notes] == ["user prefers tea"]
        first.close()
        second.close()

    clock = ManualClock(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))  # never advanced
    with MemorySystem.start(Config(data_dir=tmp_path / "d"), embedder=HashEmbedder(), clock=clock) as system:
        asyncio.run(scenario(system))


def test_order_survives_a_clock_stepping_back_and_long_histories_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memstrata.integrations.openai_agents as module
    from memstrata import Config, MemorySystem
    from memstrata.actors import ManualClock
    from memstrata.testing import HashEmbedder

    class WallClock(ManualClock):
        """A wall clock the test can step back (as NTP may)."""

        def __init__(self, start: dt.datetime) -> None:
            super().__init__(start)
            self.wall = start

        def now(self) -> dt.datetime:
            return self.wall

    monkeypatch.setattr(module, "_PAGE", 3)  # several list requests for one read
    clock = WallClock(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))

    async def scenario(system: MemorySystem) -> None:
        session = MemstrataSession("s", system=system)
        await session.add_items([{"n": i} for i in range(4)])
        clock.wall = dt.datetime(2029, 1, 1, tzinfo=dt.UTC)  # the wall clock stepped back a year
        await session.add_items([{"n": 4}])
        again = MemstrataSession("s", system=system)  # a new handle reads the latest time first
        await again.add_items([{"n": 5}, {"n": 6}])
        assert [i["n"] for i in await session.get_items()] == list(range(7))
        assert [i["n"] for i in await again.get_items(limit=5)] == [2, 3, 4, 5, 6]
        assert [i["n"] for i in await again.get_items(limit=-1)] == list(range(7))
        await again.clear_session()
        assert await session.get_items() == []

    with MemorySystem.start(Config(data_dir=tmp_path / "d"), embedder=HashEmbedder(), clock=clock) as system:
        asyncio.run(scenario(system))


def test_bad_ids_and_items_are_refused_by_name() -> None:
    with pytest.raises(InvalidInputError, match="task_run_id"):
        MemstrataSession("bad\x00id")
    with pytest.raises(InvalidInputError, match="agent_id"):
        MemstrataSession("s", agent_id="no spaces allowed")
    with pytest.raises(InvalidInputError, match="db_path or system"):
        MemstrataSession("s", "x", system=object())


def test_nan_and_infinity_are_refused_by_name_and_nothing_of_the_call_is_stored() -> None:
    async def scenario() -> None:
        session = MemstrataSession("s")
        with pytest.raises(InvalidInputError, match=r"items\[0\] .*NaN or infinity.*value\['score'\]$"):
            await session.add_items([{"role": "user", "content": "hi", "score": math.nan}])
        with pytest.raises(InvalidInputError, match=r"items\[1\] .*NaN or infinity.*value\['w'\]\[0\]$"):
            await session.add_items([{"content": "kept?"}, {"w": [-math.inf]}])
        assert await session.get_items() == []
        await session.add_items([{"content": "null", "extra": None}])  # null itself is JSON
        assert await session.get_items() == [{"content": "null", "extra": None}]
        session.close()

    asyncio.run(scenario())


def test_arguments_of_the_wrong_type_are_refused_by_name() -> None:
    async def scenario() -> None:
        session = MemstrataSession("s")
        await session.add_items([{"n": 1}, {"n": 2}])
        for limit in ("3", 2.0, True):
            with pytest.raises(InvalidInputError, match=r"^limit must be an integer or None"):
                await session.get_items(limit=limit)  # type: ignore[arg-type]
        for items in ("abc", {"n": 3}, None, 5):
            with pytest.raises(InvalidInputError, match=r"^items must be a list of items, got"):
                await session.add_items(items)  # type: ignore[arg-type]
        assert await session.get_items() == [{"n": 1}, {"n": 2}]  # nothing split into characters or keys
        await session.add_items(({"n": 3},))  # a tuple is a sequence of items too
        assert await session.get_items(limit=1) == [{"n": 3}]
        session.close()

    asyncio.run(scenario())
    for settings in (5, {"limit": "many"}, {"bogus": 1}):
        with pytest.raises(InvalidInputError, match=r"^session_settings must be") as caught:
            MemstrataSession("s", session_settings=settings)
        assert "\n" not in str(caught.value)


def test_the_wrong_types_raise_what_the_sdk_raises_too() -> None:
    """Code written for the SDK's SQLiteSession catches TypeError (unknown settings, an item that
    is not JSON) and RuntimeError (a closed session): it catches memstrata's errors too."""

    async def scenario() -> None:
        session = MemstrataSession("s")
        with pytest.raises(TypeError, match=r"^items\[0\] is not JSON") as caught:
            await session.add_items([{"role": "user", "content": object()}])
        assert isinstance(caught.value, InvalidInputError) and isinstance(caught.value, InputTypeError)
        big = {"role": "tool", "output": {"order_id": 2**64}}
        with pytest.raises(
            TypeError, match=r"^items\[1\] is not JSON: .*found 18446744073709551616 at value"
        ):
            await session.add_items([{"role": "user", "content": "kept out too"}, big])
        assert await session.get_items() == []  # nothing of the call is stored
        with pytest.raises(TypeError, match=r"^items must be a list"):
            await session.add_items("abc")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"^limit must be an integer"):
            await session.get_items(limit="3")  # type: ignore[arg-type]
        session.close()
        for call in (session.get_items(), session.add_items([]), session.pop_item(), session.clear_session()):
            with pytest.raises(RuntimeError, match="is closed") as closed:
                await call
            assert isinstance(closed.value, SystemStoppedError)
            assert isinstance(closed.value, SessionClosedError)

    asyncio.run(scenario())
    with pytest.raises(TypeError, match=r"^session_settings must be"):
        MemstrataSession("s", session_settings={"limitt": 1})  # the SDK: TypeError, unknown field
    with pytest.raises(ValueError, match=r"^session_settings must be") as caught:
        MemstrataSession("s", session_settings={"limit": "many"})  # the SDK: pydantic's ValueError
    assert not isinstance(caught.value, TypeError)
    with pytest.raises(TypeError, match=r"^session_id must be"):
        MemstrataSession(5)  # type: ignore[arg-type]


class _Gate:
    """Holds a session's writes in their thread until the test lets them go."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        assert self.release.wait(60), "the test never let the write go"
        return self._call(*args, **kwargs)


async def _cancel_while_held(gate: _Gate, write: Any) -> asyncio.Task[Any]:
    """Starts ``write``, cancels it (twice) while the gate holds it in its thread, and checks the
    cancellation does not get through before the write's outcome is known."""
    task = asyncio.ensure_future(write)
    assert await asyncio.to_thread(gate.entered.wait, 60)
    task.cancel()
    for _ in range(20):  # loop turns, not time: a cancelled plain to_thread would be done here
        await asyncio.sleep(0)
    task.cancel()  # a second cancellation is absorbed as well
    for _ in range(20):
        await asyncio.sleep(0)
    assert not task.done(), "the cancellation got through while the write was still running"
    gate.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    return task


def test_a_cancelled_write_lets_the_cancellation_through_only_once_its_outcome_is_known(
    tmp_path: Path,
) -> None:
    """As the SDK's SQLiteSession: a cancelled add_items, pop_item or clear_session never lands
    after the caller saw CancelledError, so a rewind right after it pops the right item."""

    async def scenario() -> None:
        session = MemstrataSession("c", tmp_path / "h")
        await session.add_items([{"content": "first"}])
        agent = session.agent
        ask = agent.ask
        agent.ask = gate = _Gate(ask)
        await _cancel_while_held(gate, session.add_items([{"content": "cancelled"}]))
        agent.ask = ask
        # the write is committed, before the caller learned of the cancellation
        assert [i["content"] for i in await session.get_items()] == ["first", "cancelled"]
        assert await session.pop_item() == {"content": "cancelled"}  # what Runner's rewind does
        assert [i["content"] for i in await session.get_items()] == ["first"]

        await session.add_items([{"content": "second"}])
        delete = agent.delete_episode
        agent.delete_episode = gate = _Gate(delete)
        await _cancel_while_held(gate, session.pop_item())
        assert [i["content"] for i in await session.get_items()] == ["first"]

        agent.delete_episode = gate = _Gate(delete)
        await _cancel_while_held(gate, session.clear_session())
        agent.delete_episode = delete
        assert await session.get_items() == []
        session.close()

    asyncio.run(scenario())


def test_a_turn_episode_that_holds_no_item_is_skipped_with_one_warning_and_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A turn recorded through another door as plain text (or JSON that is not an object) is not
    an item: get_items, pop_item and clear_session pass over it, as SQLiteSession passes over a
    row it cannot decode, and the log names it once; it stays in the agent's memory."""
    from memstrata import Config, MemorySystem
    from memstrata.actors import ManualClock
    from memstrata.testing import HashEmbedder

    clock = ManualClock(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))

    async def scenario(system: MemorySystem) -> None:
        session = MemstrataSession("chat-7", system=system, agent_id="helper")
        items = [{"role": "user", "content": f"m{n}"} for n in range(3)]
        await session.add_items(items)
        clock.advance(1)
        helper = system.agent("helper")
        bad = [helper.remember(text, task_run_id="chat-7", kind="turn") for text in ("prefers tea", "42")]
        caplog.set_level("WARNING", logger="memstrata.integrations.openai_agents")
        assert await session.get_items() == items
        assert await session.get_items(limit=2) == items[1:]
        assert await session.get_items(limit=2) == items[1:]
        warned = [r.getMessage() for r in caplog.records if "not an item" in r.getMessage()]
        assert len(warned) == 2 and all(any(f"episode {i} " in w for w in warned) for i in bad)
        assert sorted(session.skipped_episodes) == bad
        assert await session.pop_item() == items[2]
        await session.clear_session()
        assert await session.get_items() == [] and await session.pop_item() is None
        left = helper.list_episodes(task_run_id="chat-7")
        assert sorted(e.id for e in left) == sorted(bad)  # another door's turns are left alone
        with pytest.raises(TypeError, match=r"^items\[1\] must be a JSON object \(a dict\), got int 42$"):
            await session.add_items([{"n": 1}, 42])
        assert await session.get_items() == []  # nothing of that call is stored
        session.close()

    with MemorySystem.start(Config(data_dir=tmp_path / "d"), embedder=HashEmbedder(), clock=clock) as system:
        asyncio.run(scenario(system))


def test_a_turn_over_max_content_bytes_is_kept_whole_and_goes_with_its_episode(tmp_path: Path) -> None:
    """A tool output larger than an episode may hold (SQLiteSession stores it) is kept whole in
    the item store, its episode holding the beginning for searches; popping or clearing the turn
    deletes both, and a call that fails stores neither."""
    from memstrata import Config, MemorySystem
    from memstrata.testing import HashEmbedder

    namespace = ("openai-agents", "helper", "chat-9")

    async def scenario(system: MemorySystem) -> None:
        session = MemstrataSession("chat-9", system=system, agent_id="helper")
        big = {"type": "function_call_output", "call_id": "c1", "output": "harbor lantern " * 100}
        items = [{"role": "user", "content": "look it up"}, big, {"role": "assistant", "content": "done"}]
        await session.add_items(items)
        assert await session.get_items() == items
        assert await session.get_items(limit=2) == items[1:]
        episodes = session.agent.list_episodes(task_run_id="chat-9")
        assert all(len(e.content.encode()) <= 1_000 for e in episodes)
        hits = session.agent.recall("harbor lantern", task_run_id="chat-9")
        assert hits[0].episode.content.startswith('{"type":"function_call_output","call_id":"c1"')
        assert len(system.items.search(namespace)) == 1
        await session.add_items([big])
        assert len(system.items.search(namespace)) == 2  # the same output twice: two bodies
        assert await session.pop_item() == big
        assert len(system.items.search(namespace)) == 1
        assert await session.get_items() == items
        await session.clear_session()
        assert await session.get_items() == [] and system.items.search(namespace) == []

        agent = session.agent
        ask = agent.ask

        def refuse(message: Any) -> Any:
            raise SystemStoppedError("the episodic actor is gone")

        agent.ask = refuse
        with pytest.raises(SystemStoppedError):
            await session.add_items([big])
        agent.ask = ask
        assert system.items.search(namespace) == []  # the body written first is taken back
        assert agent.list_episodes(task_run_id="chat-9") == []
        with pytest.raises(InvalidInputError, match=r"^items\[1\] is not JSON"):
            await session.add_items([big, {"w": math.nan}])
        assert system.items.search(namespace) == [] and await session.get_items() == []
        session.close()

    config = Config(data_dir=tmp_path / "d", max_content_bytes=1_000)
    with MemorySystem.start(config, embedder=HashEmbedder()) as system:
        asyncio.run(scenario(system))
