"""The memory layers as plain synchronous classes (no threads; actors serialise access)."""

from __future__ import annotations

if __name__ != "memstrata.layers":  # nothing generic may be importable at top level
    raise ImportError(f"import memstrata.layers, not {__name__}: it is part of the memstrata package")

from typing import TYPE_CHECKING

from memstrata.core.lazy import lazy_attributes

if TYPE_CHECKING:
    from ._blackboard import BlackboardState
    from ._episodic import Episode, EpisodeHit, EpisodicMemory
    from ._file_results import FileHit, SyncStats
    from ._files import Codebase, MemoryFiles
    from ._knowledge import KnowledgeEntry, KnowledgeHit, KnowledgeStore
    from ._knowledge_merge import merge_hits
    from ._search_hits import SearchHits
    from ._working import WorkingMemory

_LAZY = {
    "KnowledgeStore": "._knowledge",
    "KnowledgeEntry": "._knowledge",
    "KnowledgeHit": "._knowledge",
    "merge_hits": "._knowledge_merge",
    "EpisodicMemory": "._episodic",
    "Episode": "._episodic",
    "EpisodeHit": "._episodic",
    "MemoryFiles": "._files",
    "Codebase": "._files",
    "FileHit": "._file_results",
    "SearchHits": "._search_hits",
    "SyncStats": "._file_results",
    "WorkingMemory": "._working",
    "BlackboardState": "._blackboard",
}

__all__ = [
    "BlackboardState",
    "Codebase",
    "Episode",
    "EpisodeHit",
    "EpisodicMemory",
    "FileHit",
    "KnowledgeEntry",
    "KnowledgeHit",
    "KnowledgeStore",
    "MemoryFiles",
    "SearchHits",
    "SyncStats",
    "WorkingMemory",
    "merge_hits",
]


lazy_attributes(__name__, _LAZY)
