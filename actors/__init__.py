"""memstrata.actors: the pykka actor tree behind :class:`memstrata.MemorySystem`.

Most users never import this package: the facade hides it. Orchestrators that want the pieces
(a clock for simulations, the batching embedder, the prompt builder) find them here. Each name
is imported on first use: a process that needs one piece does not import the actor tree
(~60 ms).
"""

if __name__ != "memstrata.actors":  # nothing generic may be importable at top level
    raise ImportError(f"import memstrata.actors, not {__name__}: it is part of the memstrata package")

from typing import TYPE_CHECKING

from memstrata.core.lazy import lazy_attributes

if TYPE_CHECKING:
    from memstrata.layers import merge_hits

    from ._agent import AgentActor
    from ._base import MemoryActor
    from ._blackboard import BlackboardActor
    from ._clock import Clock, IdSource, ManualClock, SystemClock
    from ._embedding import BatchingEmbedder, EmbeddingStats
    from ._episodic_actor import EpisodicActor
    from ._knowledge_actor import KnowledgeStoreActor
    from ._prompt import build_prompt, fallback_prompt, xml_attr, xml_name, xml_text
    from ._runtime import Runtime, route
    from ._shutdown import StopReport
    from ._store_factory import LayerStores, StoreFactory
    from ._supervision import Supervision
    from ._supervisors import (
        AgentSupervisor,
        BlackboardSupervisor,
        KnowledgeSupervisor,
        MemorySupervisor,
        Supervisor,
    )
    from ._working_actor import WorkingMemoryActor

_LAZY = {
    "AgentActor": "._agent",
    "MemoryActor": "._base",
    "BlackboardActor": "._blackboard",
    "Clock": "._clock",
    "IdSource": "._clock",
    "ManualClock": "._clock",
    "SystemClock": "._clock",
    "BatchingEmbedder": "._embedding",
    "EmbeddingStats": "._embedding",
    "EpisodicActor": "._episodic_actor",
    "KnowledgeStoreActor": "._knowledge_actor",
    "build_prompt": "._prompt",
    "fallback_prompt": "._prompt",
    "merge_hits": "memstrata.layers._knowledge_merge",  # the knowledge layer's, named here too
    "xml_attr": "._prompt",
    "xml_name": "._prompt",
    "xml_text": "._prompt",
    "Runtime": "._runtime",
    "route": "._runtime",
    "StopReport": "._shutdown",
    "LayerStores": "._store_factory",
    "StoreFactory": "._store_factory",
    "Supervision": "._supervision",
    "AgentSupervisor": "._supervisors",
    "BlackboardSupervisor": "._supervisors",
    "KnowledgeSupervisor": "._supervisors",
    "MemorySupervisor": "._supervisors",
    "Supervisor": "._supervisors",
    "WorkingMemoryActor": "._working_actor",
}

__all__ = [
    "AgentActor",
    "AgentSupervisor",
    "BatchingEmbedder",
    "BlackboardActor",
    "BlackboardSupervisor",
    "Clock",
    "EmbeddingStats",
    "EpisodicActor",
    "IdSource",
    "KnowledgeStoreActor",
    "KnowledgeSupervisor",
    "LayerStores",
    "ManualClock",
    "MemoryActor",
    "MemorySupervisor",
    "Runtime",
    "StopReport",
    "StoreFactory",
    "Supervision",
    "Supervisor",
    "SystemClock",
    "WorkingMemoryActor",
    "build_prompt",
    "fallback_prompt",
    "merge_hits",
    "route",
    "xml_attr",
    "xml_name",
    "xml_text",
]

lazy_attributes(__name__, _LAZY)
