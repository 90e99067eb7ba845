"""Retrieval-quality tuning: every definition a code chunk holds is named in what is embedded and
indexed for it, and the default fusion weighs the keyword list by the query's form."""

from __future__ import annotations

from pathlib import Path

import pytest

from memstrata import Config
from memstrata.config import SearchConfig
from memstrata.layers import KnowledgeStore
from memstrata.layers._chunk_code import chunk_syntax, embedding_text, keyword_words
from memstrata.layers._chunk_file import chunk_embedding_text, chunk_file, chunk_keyword_text
from memstrata.storage import rrf
from memstrata.storage._fusion import (
    DEFAULT_KEYWORD_WEIGHT,
    DEFAULT_RRF_K,
    PLAIN_RRF_K,
    STATEMENT_KEYWORD_WEIGHT,
    fusion_weights,
    is_question,
)
from tests.fakes import FakeEmbedder

RUST = """use std::io;

pub struct Reader {
    pos: usize,
}

impl Reader {
    pub fn remaining(&self) -> usize {
        self.pos
    }

    pub fn advanceCursor(&mut self, cnt: usize) {
        self.pos += cnt;
    }
}

const MAX_LEN: usize = 8;
"""

JS = """class HttpClient {
  sendRequest(url) {
    return fetch(url);
  }

  closeAll() {
    return null;
  }
}

function parseHeader(line) {
  return line.split(':');
}
"""


def test_chunk_names_every_definition_it_holds() -> None:
    chunks = chunk_syntax(RUST, ".rs", tokens=400, overlap=0)
    assert chunks is not None and len(chunks) == 1
    assert chunks[0].names == ("Reader", "remaining", "advanceCursor", "MAX_LEN")
    assert chunks[0].symbol == "Reader"
    js = chunk_syntax(JS, ".js", tokens=400, overlap=0)
    assert js is not None and js[0].names == ("HttpClient", "sendRequest", "closeAll", "parseHeader")


def test_small_chunks_name_only_what_starts_in_them() -> None:
    chunks = chunk_syntax(JS, ".js", tokens=20, overlap=0)
    assert chunks is not None and len(chunks) > 1
    by_name = {n: c for c in chunks for n in c.names}
    assert set(by_name) == {"HttpClient", "sendRequest", "closeAll", "parseHeader"}
    for name, chunk in by_name.items():
        assert name in chunk.text  # a name is listed only by the chunk where its definition starts
    later = by_name["closeAll"]
    assert "HttpClient" not in later.names and later.signature.startswith("class HttpClient")


def test_embedded_text_has_a_line_of_defined_names() -> None:
    _, chunks = chunk_file("src/reader.rs", RUST)
    text = chunk_embedding_text("src/reader.rs", "rust", chunks[0])
    lines = text.split("\n")
    assert lines[0] == "src reader"
    assert lines[1] == "reader remaining advance cursor max len"
    assert lines[2:] == chunks[0].text.split("\n")
    assert text == embedding_text("src/reader.rs", chunks[0])


def test_embedded_names_are_capped() -> None:
    source = "".join(f"function handlerNumber{i}Word() {{}}\n" for i in range(40))
    chunks = chunk_syntax(source, ".js", tokens=2000, overlap=0)
    assert chunks is not None and len(chunks[0].names) == 40
    names_line = embedding_text("a.js", chunks[0]).split("\n")[1]
    assert len(names_line.split()) == 32  # distinct words, at most 32


def test_keyword_text_repeats_the_defined_names() -> None:
    _, chunks = chunk_file("src/reader.rs", RUST)
    words = chunk_keyword_text("rust", chunks[0]).split()
    # symbol, then split mixed-case identifiers of the text, then the defined names once more
    assert words[:3] == ["reader", "advance", "cursor"]
    assert words[3:] == ["reader", "remaining", "advance", "cursor", "max", "len"]
    assert keyword_words("x", "", ()) == ""
    assert keyword_words("plain words", "", ("fetchUser",)).split() == ["fetch", "user"]


def test_prose_chunks_carry_no_names_line() -> None:
    _, chunks = chunk_file("notes.txt", "just a note about readers\n")
    assert chunks[0].names == ()
    assert chunk_embedding_text("notes.txt", "text", chunks[0]) == chunks[0].text


@pytest.mark.parametrize(
    ("text", "question"),
    [
        ("When did Caroline go to the support group?", True),
        ("what is the retry policy", True),
        ("  How  many workers", True),
        ("Which? ", True),
        ("wie geht's？", True),
        ("Returns the number of bytes remaining", False),
        ("whatever happened", False),  # a question word only as a whole word
        ("the http client", False),
        ("", False),
    ],
)
def test_is_question(text: str, question: bool) -> None:
    assert is_question(text) is question


def test_default_fusion_weighs_keywords_by_the_query_form() -> None:
    defaults = (DEFAULT_RRF_K,)
    assert defaults == (5,) and DEFAULT_KEYWORD_WEIGHT == 1.5 and STATEMENT_KEYWORD_WEIGHT == 1.25
    question = fusion_weights(True, True, 1.0, DEFAULT_KEYWORD_WEIGHT, query="Where is the lock taken?")
    statement = fusion_weights(True, True, 1.0, DEFAULT_KEYWORD_WEIGHT, query="take the lock")
    assert question == [1.0, DEFAULT_KEYWORD_WEIGHT]
    assert statement == [1.0, STATEMENT_KEYWORD_WEIGHT]
    # without the query, as before
    assert fusion_weights(True, True, 1.0, DEFAULT_KEYWORD_WEIGHT) == [1.0, DEFAULT_KEYWORD_WEIGHT]
    # a lone list weighs 1 whatever the query
    assert fusion_weights(False, True, 1.0, DEFAULT_KEYWORD_WEIGHT, query="take the lock") == [1.0]
    assert fusion_weights(False, False, 1.0, DEFAULT_KEYWORD_WEIGHT, query="take the lock") == []


@pytest.mark.parametrize(
    ("k", "vector_weight", "keyword_weight"),
    [(PLAIN_RRF_K, 1.0, 1.0), (DEFAULT_RRF_K, 1.0, 2.0), (DEFAULT_RRF_K, 0.5, 1.5), (10, 1.0, 1.5)],
)
def test_settings_other_than_the_default_are_used_as_given(
    k: int, vector_weight: float, keyword_weight: float
) -> None:
    got = fusion_weights(True, True, vector_weight, keyword_weight, query="take the lock", k=k)
    assert got == [vector_weight, keyword_weight]


@pytest.mark.parametrize(
    ("query", "weight"), [("payment retry cache", 1.25), ("where is payment retry?", 1.5)]
)
def test_hybrid_search_fuses_with_the_query_weight(
    data_dir: Path, fake_embedder: FakeEmbedder, query: str, weight: float
) -> None:
    """Through a store: the hybrid list is the RRF of the two single lists with the keyword
    weight the query's form picks, and explicit settings are kept."""
    words = ["queue", "retry", "payment", "cache", "index", "token", "lock", "deploy"]
    entries = [{"content": " ".join(words[(i * 3 + j) % 8] for j in range(i % 4 + 1))} for i in range(40)]
    with KnowledgeStore.open(data_dir / "q.sqlite", fake_embedder) as store:
        store.add_many(entries)
        vector = [h.entry.id for h in store.search(query, top_k=50, mode="vector")]
        keyword = [h.entry.id for h in store.search(query, top_k=50, mode="keyword")]
        hits = store.search(query, top_k=10)
        expected = rrf([vector, keyword], k=DEFAULT_RRF_K, weights=[1.0, weight])[:10]
        assert [(h.entry.id, h.vector_rank, h.keyword_rank) for h in hits] == [
            (f.key, *f.ranks) for f in expected
        ]
        assert [h.score for h in hits] == pytest.approx([f.score for f in expected])
    fixed = Config(data_dir=data_dir, search=SearchConfig(rrf_k=5, keyword_weight=2.0))
    with KnowledgeStore.open(data_dir / "q2.sqlite", fake_embedder, config=fixed) as store:
        store.add_many(entries)
        vector = [h.entry.id for h in store.search(query, top_k=50, mode="vector")]
        keyword = [h.entry.id for h in store.search(query, top_k=50, mode="keyword")]
        hits = store.search(query, top_k=10)
        expected = rrf([vector, keyword], k=5, weights=[1.0, 2.0])[:10]
        assert [h.entry.id for h in hits] == [f.key for f in expected]
