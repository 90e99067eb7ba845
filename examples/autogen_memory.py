"""An AutoGen assistant agent with memstrata as its memory (no network: a replayed model).

Run: ``python examples/autogen_memory.py [folder]`` (a temporary one without it).
"""

from __future__ import annotations

import asyncio
import sys

from autogen_agentchat.agents import AssistantAgent
from autogen_core.memory import MemoryContent, MemoryMimeType
from autogen_core.models import SystemMessage
from autogen_ext.models.replay import ReplayChatCompletionClient

from memstrata.integrations.autogen import MemstrataMemory, MemstrataMemoryConfig
from memstrata.testing import HashEmbedder


async def main(folder: str | None = None) -> list[str]:
    config = MemstrataMemoryConfig(collection_name="household", persistence_path=folder, k=2)
    memory = MemstrataMemory(config, embedder=HashEmbedder())  # offline; omit for the default model
    await memory.add(
        MemoryContent(
            content="The spare key is under the blue flower pot",
            mime_type=MemoryMimeType.TEXT,
            metadata={"room": "garden", "confidence": 0.9, "checked": True},
        )
    )
    await memory.add(MemoryContent(content="Bins go out on Tuesday evening", mime_type=MemoryMimeType.TEXT))
    client = ReplayChatCompletionClient(["It is under the blue flower pot."])
    agent = AssistantAgent("helper", model_client=client, memory=[memory])
    result = await agent.run(task="Where is the spare key?")
    seen = [m.content for m in await agent.model_context.get_messages() if isinstance(m, SystemMessage)]
    print("answer:", result.messages[-1].to_text())
    print("memory given to the model:", seen)
    await memory.close()
    return [str(s) for s in seen]


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:2]))
