"""An OpenAI Agents SDK ``Runner`` keeping its conversation in memstrata (no network: a scripted model).

The conversation is a task run of the agent's episodic memory, so it can also be searched.
Run: ``python examples/openai_agents_session.py [data-dir]`` (a temporary one without it).
"""

from __future__ import annotations

import asyncio
import sys

from agents import Agent, Runner, set_tracing_disabled
from agents.testing import ScriptedModel
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

from memstrata.integrations.openai_agents import MemstrataSession


def reply(text: str) -> ResponseOutputMessage:
    """One scripted model answer."""
    return ResponseOutputMessage(
        id="msg",
        type="message",
        role="assistant",
        content=[ResponseOutputText(text=text, type="output_text", annotations=[], logprobs=[])],
        status="completed",
    )


async def main(path: str | None = None) -> int:
    set_tracing_disabled(True)
    model = ScriptedModel()
    agent = Agent(name="planner", instructions="Answer briefly.", model=model)
    session = MemstrataSession("trip-planning", path)
    for question, answer in [("Where should we go?", "Lisbon"), ("When?", "In May")]:
        model.enqueue([reply(answer)])
        result = await Runner.run(agent, question, session=session)
        print(f"{question} -> {result.final_output}")
    history = await session.get_items()
    print("items kept:", len(history), "last two:", await session.get_items(limit=2))
    hits = session.agent.recall("Lisbon", task_run_id="trip-planning", top_k=1)
    print("recalled:", hits[0].episode.content if hits else None)
    session.close()
    return len(history)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:2]))
