"""Names and limits every part of memstrata agrees on, defined once.

``MAX_TOP_K`` is 1,000: every public entry point (the messages, the CLI's ``--top-k``, the
knowledge store) already stopped there, and a result list is read into a prompt, where a longer
one only costs fusion work and tokens. Episodic search alone allowed 10,000, reachable only by
calling the layer directly.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "AGENT_ID_PATTERN",
    "APPROXIMATE_FROM",
    "ARCHIVES_DIR",
    "CATEGORY_PATTERN",
    "DEFAULT_SESSION",
    "EMBED_CHARS",
    "MAX_AUTHOR_CHARS",
    "MAX_ENTRY_ID",
    "MAX_EXACT_JSON_INT",
    "MAX_KEY_CHARS",
    "MAX_LABEL_CHARS",
    "MAX_LIST_LIMIT",
    "MAX_NAMESPACE_DEPTH",
    "MAX_OFFSET",
    "MAX_PATH_CHARS",
    "MAX_ROW_ID",
    "MAX_SCOPE_CHARS",
    "MAX_TAGS",
    "MAX_TAG_KEY_CHARS",
    "MAX_TAG_VALUE_CHARS",
    "MAX_TASK_ID_CHARS",
    "MAX_TITLE_CHARS",
    "MAX_TOP_K",
    "MAX_TTL_MINUTES",
    "MIN_LINE_BYTES",
    "MIN_ROW_ID",
    "MODES",
    "SHARED",
    "SYNCHRONOUS_MODES",
]

SHARED: Final = "shared"
"""The knowledge store every agent can read: ``knowledge/shared.sqlite``; not a valid agent id."""

DEFAULT_SESSION: Final = "default"
"""The blackboard session used when none is named."""

EMBED_CHARS: Final = 8_192
"""Characters of a text that make its vector: the models read a few hundred tokens, and
tokenising megabytes would only cost time."""

MAX_TOP_K: Final = 1_000
"""Most hits one search returns (see the module docstring for why 1,000)."""

MAX_LIST_LIMIT: Final = 10_000
"""Most entries one listing page returns."""

SYNCHRONOUS_MODES: Final = ("normal", "full")
"""SQLite's ``synchronous`` settings memstrata opens a database with (``storage.synchronous``):
"normal" survives the process being killed, "full" also power loss."""

ARCHIVES_DIR: Final = "episodic/archives"
"""Where, in the data dir, episode archives go when no path is given: the one folder of the data
dir an archive may be written to (everywhere else memstrata's own databases live)."""

MIN_LINE_BYTES: Final = 64
"""The shortest request line limit the line-delimited servers accept (JSON-RPC, MCP): a smaller
one could not carry even an error's own request."""

APPROXIMATE_FROM: Final = 100_000
"""Live vectors from which a store's vector search scans only the inverted lists nearest the
query instead of every row (measured recall@10: 0.94 at 100k on planted-topic vectors, 0.99 at
1M; exact below this many, or with ``approximate_from`` unset)."""

MODES: Final = ("hybrid", "vector", "keyword")
"""Search modes: both rankings fused, the vector ranking alone, the keyword ranking alone."""

AGENT_ID_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
"""Agent and session ids become file names: portable characters only."""

CATEGORY_PATTERN: Final = r"[a-z0-9][a-z0-9_-]{0,63}"
"""Knowledge categories and episode kinds (``pitfall``, ``planning-pitfall``, ``note``)."""

MAX_KEY_CHARS: Final = 1_024  # working-memory, blackboard and item keys
MAX_LABEL_CHARS: Final = 1_024  # one label of an item namespace
MAX_NAMESPACE_DEPTH: Final = 64  # labels in an item namespace
MAX_ENTRY_ID: Final = 2**62  # the largest knowledge entry or episode id a request may name
MAX_EXACT_JSON_INT: Final = 2**53 - 1  # the largest integer every JSON client holds exactly (imported ids)
MAX_OFFSET: Final = 2**62  # how many rows a listing may skip
MAX_TASK_ID_CHARS: Final = 256  # task ids and task-run ids
MAX_TAGS: Final = 64
MAX_TAG_KEY_CHARS: Final = 128
MAX_TAG_VALUE_CHARS: Final = 1_024
MAX_SCOPE_CHARS: Final = 1_024
MAX_AUTHOR_CHARS: Final = 256
MAX_PATH_CHARS: Final = 4_096  # a file or folder path given to any door (PATH_MAX on Linux)
MAX_TITLE_CHARS: Final = 1_000
MAX_TTL_MINUTES: Final = 100_000_000  # about 190 years: expiry times stay within every platform's range
MIN_ROW_ID: Final = -(2**63)  # what an SQLite integer can hold
MAX_ROW_ID: Final = 2**63 - 1
