"""The OpenAI Agents SDK's Session on memstrata (memstrata.integrations.openai_agents)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("agents", reason="the openai-agents extra is not installed")

from agents import Agent, Runner, set_tracing_disabled
from agents.memory import SessionSettings
from agents.testing import ScriptedModel
from memstrata.integrations.openai_agents import MemstrataSession
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

from memstrata.errors import InvalidInputError, SystemStoppedError

set_tracing_disabled(True)  # no network: nothing is exported


def reply(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="m",
        type="message",
        role="assistant",
        content=[ResponseOutputText(text=text, type="output_text", annotations=[], logprobs=[])],
        status="completed",
    )


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
        model.enqueue([reply("Paris")])
        first = await Runner.run(agent, "Capital of France?", session=session)
        assert first.final_output == "Paris"
        model.enqueue([reply("About 2 million")])
        await Runner.run(agent, "Its population?", session=session)
        history = await session.get_items()
        assert len(history) == 4
        assert history[0]["content"] == "Capital of France?"
        session.close()

    asyncio.run(scenario())
