"""memstrata.actors: the pykka actor tree behind :class:`memstrata.MemorySystem`.

Most users never import this package: the facade hides it. Orchestrators that want the pieces
(a clock for simulations, the batching embedder, the prompt builder) find them here.
"""

if __name__ != "memstrata.actors":  # nothing generic may be importable at top level
    raise ImportError(f"import memstrata.actors, not {__name__}: it is part of the memstrata package")

from ._agent import AgentActor
from ._base import MemoryActor, Supervision
from ._blackboard import BlackboardActor
from ._clock import Clock, IdSource, ManualClock, SystemClock
from ._embedding import BatchingEmbedder, EmbeddingStats
from ._episodic_actor import EpisodicActor
from ._knowledge_actor import KnowledgeStoreActor
from ._prompt import build_prompt, fallback_prompt, merge_hits, xml_attr, xml_name, xml_text
from ._runtime import Runtime, StopReport, route
from ._store_factory import LayerStores, StoreFactory
from ._supervisors import (
    AgentSupervisor,
    BlackboardSupervisor,
    KnowledgeSupervisor,
    MemorySupervisor,
    Supervisor,
)
from ._working_actor import WorkingMemoryActor

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
