"""AutoGen ``Memory`` on memstrata (``pip install 'memstrata[autogen]'``).

Each memory is one item of a memstrata system's item store under ``("autogen", collection_name)``,
its text embedded by the system's shared embedder (or by the ``embedder`` given, its vector then
sent with the item), its metadata kept as the JSON it was given (numbers, booleans, lists,
objects: no string encoding). Without a running system, a private one is started on
``persistence_path`` (a folder), or in a temporary folder removed at :meth:`MemstrataMemory.close`.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import BaseModel, Field

from memstrata.core.constants import MAX_TOP_K
from memstrata.core.validation import check_top_k, show
from memstrata.errors import InvalidInputError, SystemStoppedError
from memstrata.messages import ClearNamespace
from memstrata.storage import Embedder, load_embedder

from ._common import InputTypeError, json_bytes, missing, open_system, settled

if TYPE_CHECKING:
    from memstrata._items import Items

try:
    from autogen_core import CancellationToken, Component
    from autogen_core.memory import (
        Memory,
        MemoryContent,
        MemoryMimeType,
        MemoryQueryResult,
        UpdateContextResult,
    )
    from autogen_core.model_context import ChatCompletionContext
    from autogen_core.models import SystemMessage
except ImportError as exc:  # the adapter is optional: say which extra brings it
    raise missing("autogen_core", "autogen", exc) from exc

__all__ = ["NAMESPACE", "InputTypeError", "MemstrataMemory", "MemstrataMemoryConfig"]

NAMESPACE = "autogen"
_TEXT_TYPES = {MemoryMimeType.TEXT.value, MemoryMimeType.MARKDOWN.value}
_QUERY_OPTIONS = ("k", "top_k")


def _check_collection_name(name: str) -> None:
    """Refuse a name the item store cannot hold as a namespace label, by the store's own rule,
    when the memory is made: otherwise every later add and query fails naming the store's
    message instead of the setting at fault."""
    try:
        ClearNamespace((NAMESPACE, name))
    except InvalidInputError as exc:
        reason = str(exc).removeprefix(f"{ClearNamespace.__name__}.namespace ")
        raise InvalidInputError(
            f"collection_name {show(name)} cannot be an item store namespace label: {reason}"
        ) from None


def _check_query_options(options: dict[str, Any]) -> None:
    """Refuse options this query does not read (a typo such as ``topk``, another memory's
    ``distance_threshold``), as a Python call refuses an unexpected keyword: ignored, they
    would change nothing without a word."""
    unknown = sorted(set(options) - set(_QUERY_OPTIONS))
    if unknown:
        names = ", ".join(repr(name) for name in unknown)
        plural = "s" if len(unknown) > 1 else ""
        article = "" if plural else "an "
        raise InputTypeError(f"query got {article}unknown option{plural} {names} (it takes k or top_k)")


def _with_score(metadata: dict[str, Any], score: float) -> dict[str, Any]:
    """A memory's metadata with the search ``score`` added where AutoGen's vector memories put it
    (``metadata["score"]``); a ``score`` of the memory's own is kept, as ``user_score`` (or
    ``user_user_score``, ..., the first key the metadata does not hold)."""
    result = dict(metadata)
    if "score" in metadata:
        key = "user_score"
        while key in metadata:
            key = f"user_{key}"
        result[key] = metadata["score"]
    result["score"] = score
    return result


class MemstrataMemoryConfig(BaseModel):
    """The memory's settings; the names match AutoGen's vector memories where they mean the same."""

    collection_name: str = Field(default="memstrata_memory", min_length=1)
    persistence_path: str | None = Field(
        default=None, description="a folder for the item database; None keeps it in memory"
    )
    k: int = Field(default=3, gt=0, le=MAX_TOP_K, description="how many memories a query returns at most")
    score_threshold: float | None = Field(  # NaN would compare false and filter nothing
        default=None, allow_inf_nan=False, description="lowest cosine similarity a returned memory may have"
    )
    allow_reset: bool = False
    embedding_model: str | None = Field(
        default=None, description="a fastembed model; None: memstrata's default"
    )


class MemstrataMemory(Memory, Component[MemstrataMemoryConfig]):
    """Vector memory for AutoGen agents, kept by memstrata.

    ``embedder``: any memstrata ``Embedder`` (tests pass ``memstrata.testing.HashEmbedder``);
    ``system``: a running ``MemorySystem`` whose embedder and data dir are used.
    """

    component_type = "memory"
    component_config_schema = MemstrataMemoryConfig
    component_provider_override = "memstrata.integrations.autogen.MemstrataMemory"

    def __init__(
        self,
        config: MemstrataMemoryConfig | None = None,
        *,
        embedder: Embedder | None = None,
        system: Any = None,
    ) -> None:
        self._config = config or MemstrataMemoryConfig()
        _check_collection_name(self._config.collection_name)
        self._namespace = (NAMESPACE, self._config.collection_name)
        if embedder is None and system is None and self._config.embedding_model:
            embedder = load_embedder(self._config.embedding_model)
        target = system if system is not None else self._config.persistence_path
        self._opened = open_system(target, embedder=embedder, what="MemstrataMemory persistence_path")
        shared = self._opened.system.embedder
        # the system's own embedder embeds in its item actor (one batching queue for every agent
        # of the process); another model given here embeds in the memory, its vectors sent along
        self._embedder = None if embedder in (None, shared) or self._opened.private else embedder
        if self._embedder is None and shared is None:
            self._opened.release()
            raise InvalidInputError("MemstrataMemory needs an embedding model: the system runs keyword-only")

    @property
    def collection_name(self) -> str:
        return self._config.collection_name

    @staticmethod
    def _text(content: MemoryContent) -> str:
        mime = content.mime_type.value if isinstance(content.mime_type, MemoryMimeType) else content.mime_type
        if mime in _TEXT_TYPES:
            if not isinstance(content.content, str):
                raise InvalidInputError(
                    f"{mime} content must be a string, got {type(content.content).__name__}"
                )
            return content.content
        if mime == MemoryMimeType.JSON.value:
            if not isinstance(content.content, dict):
                raise InvalidInputError("JSON content must be a dict")
            return json_bytes(content.content, "memory content").decode()
        raise InvalidInputError(f"Unsupported content type: {mime}")

    async def add(self, content: MemoryContent, cancellation_token: CancellationToken | None = None) -> None:
        text = self._text(content)
        mime = content.mime_type.value if isinstance(content.mime_type, MemoryMimeType) else content.mime_type
        value = {"content": content.content, "mime_type": mime, "metadata": content.metadata or {}}
        for part in ("content", "metadata"):  # each checked apart, so the error names the one at fault
            json_bytes(value[part], f"memory {part}")

        # the key is the memory's content hash: a simulation's runs write the same keys, and the
        # same memory added twice is kept once
        key = hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]

        def write() -> None:
            if self._embedder is None:  # the actor embeds "content" as _text reads it
                self._items.put(self._namespace, key, value, index=["content"])
                return
            vector = self._embedder.embed_documents([text])[0].tolist()
            self._items.put(self._namespace, key, value, vectors={"content": vector})

        await settled(write)

    async def query(
        self,
        query: str | MemoryContent = "",
        cancellation_token: CancellationToken | None = None,
        **kwargs: Any,
    ) -> MemoryQueryResult:
        """The memories nearest ``query`` in meaning, best first: at most ``k`` (``top_k``, the
        name Redis memory reads, is the same; given both, they must agree), none for a blank
        query; any other option is refused by name."""
        if not isinstance(query, str | MemoryContent):
            raise InputTypeError(f"query must be a string or a MemoryContent, got {type(query).__name__}")
        _check_query_options(kwargs)
        text = query if isinstance(query, str) else self._text(query)
        if "k" in kwargs and "top_k" in kwargs and kwargs["k"] != kwargs["top_k"]:
            given = f"k={kwargs['k']!r}, top_k={kwargs['top_k']!r}"
            raise InvalidInputError(f"give k or top_k (the same count), not both: {given}")
        name = "top_k" if "top_k" in kwargs else "k"
        k = check_top_k(kwargs.get(name, self._config.k), name)
        if not text.strip():  # nothing to be near: as "" finds nothing, so does "  "
            return MemoryQueryResult(results=[])

        def read() -> list[Any]:
            if self._embedder is None:
                return list(self._items.search(self._namespace, query=text, limit=k))
            vector = self._embedder.embed_query(text).tolist()
            return list(self._items.search(self._namespace, query_vector=vector, limit=k))

        records = await asyncio.to_thread(read)
        threshold = self._config.score_threshold
        results = []
        for rec in records:
            if rec.score is None or (threshold is not None and rec.score < threshold):
                continue
            metadata = _with_score(rec.value.get("metadata") or {}, float(rec.score))
            results.append(
                MemoryContent(
                    content=rec.value["content"], mime_type=rec.value["mime_type"], metadata=metadata
                )
            )
        return MemoryQueryResult(results=results)

    async def update_context(self, model_context: ChatCompletionContext) -> UpdateContextResult:
        """Adds the memories relevant to the last message as one system message."""
        messages = await model_context.get_messages()
        if not messages:
            return UpdateContextResult(memories=MemoryQueryResult(results=[]))
        last = messages[-1].content
        found = await self.query(last if isinstance(last, str) else str(last))
        if found.results:
            lines = "\n".join(f"{n}. {m.content!s}" for n, m in enumerate(found.results, 1))
            await model_context.add_message(SystemMessage(content=f"\nRelevant memories:\n{lines}\n"))
        return UpdateContextResult(memories=found)

    async def clear(self) -> None:
        await settled(self._items.clear, self._namespace)

    async def reset(self) -> None:
        """Deletes every memory of the collection; refused unless ``allow_reset``."""
        if not self._config.allow_reset:
            raise InvalidInputError(
                f"reset of collection {self.collection_name!r} is not allowed: set allow_reset=True"
            )
        await self.clear()

    async def close(self) -> None:
        """Lets a private system go (a running system given stays as it is); the memory then
        refuses every call (``SystemStoppedError``), whoever else shares its system."""
        await asyncio.to_thread(self._opened.release)

    @property
    def _items(self) -> Items:
        if self._opened.released:
            raise SystemStoppedError(f"this {type(self).__name__} is closed")
        return self._opened.system.items

    def _to_config(self) -> MemstrataMemoryConfig:
        return self._config

    @classmethod
    def _from_config(cls, config: MemstrataMemoryConfig) -> MemstrataMemory:
        return cls(config)
