"""The FTS5 query builder and schema: any string is safe, and what users type is findable."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memstrata.errors import InvalidInputError
from memstrata.storage import (
    FTS_TOKENIZER,
    Database,
    Filter,
    KeywordQuery,
    apply_migrations,
    build_keyword_query,
    cjk_runs,
    fts_schema,
    identifier_words,
    keyword_search,
    keyword_terms,
    open_database,
)
from memstrata.storage._fulltext import separate_words

DOCS = {
    1: "The quick brown fox jumps over the lazy dog",
    2: "call parse_http_request before sending the reply",
    3: "def parseHttpRequest(raw): return HTTPServer(raw)",
    4: "The dog runs every morning in the park",
    5: "東京大学で機械学習を研究しています",
    6: "to be or not to be",
    7: "party tonight 🎉 with emoji 😀 and café crème",
    8: 'NEAR alpha beta gamma column:value "quoted" star* caret^',
    9: "北京是中国的首都",
    10: "日本語のテキスト検索は難しい",
}


def _migration(db: Database) -> None:
    db.execute("CREATE TABLE docs (id INTEGER PRIMARY KEY, body TEXT NOT NULL, idwords TEXT NOT NULL)")
    db.executescript(fts_schema("docs", ["body", "idwords"]))


def _store(db: Database, doc_id: int, body: str) -> None:
    db.execute(
        "INSERT OR REPLACE INTO docs(id, body, idwords) VALUES (?, ?, ?)",
        (doc_id, body, identifier_words(body)),
    )


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    path: Path = tmp_path_factory.mktemp("fts") / "fts.sqlite"
    database = open_database(path)
    apply_migrations(database, "fts-test", [_migration])
    with database.transaction():
        for doc_id, body in DOCS.items():
            _store(database, doc_id, body)
    yield database
    database.close()


def search(db: Database, text: str, limit: int = 20) -> list[int]:
    return keyword_search(db, "docs", ["body", "idwords"], build_keyword_query(text), limit, Filter())


def _run_match(db: Database, query: KeywordQuery) -> None:
    """Every expression runs against both indexes: neither may raise a syntax error."""
    for expression in (query.words, query.cjk):
        if expression is None:
            continue
        for table in ("docs_fts", "docs_tri"):
            db.query(f"SELECT rowid FROM {table} WHERE {table} MATCH ? LIMIT 5", (expression,))


FTS_SYNTAX = st.sampled_from(
    [
        '"', "'", "NEAR(", "NEAR", ")", "(", "*", "^", "col:", "body:", "{body idwords}:", "AND", "OR",
        "NOT", "+", "-", ":", ",", "\x00", "\ud800", "\udfff", " ", "東京", "🎉", "_", "camelCase",
        "snake_case", "\\", "''", '""', "-x", "a*b", "AND OR NOT",
    ]
)  # fmt: skip
ANY_TEXT = st.text(alphabet=st.characters(exclude_categories=()), max_size=60)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(FTS_SYNTAX, ANY_TEXT), max_size=12).map("".join))
def test_any_string_gives_a_match_sqlite_accepts(db: Database, text: str) -> None:
    query = build_keyword_query(text)
    _run_match(db, query)
    search(db, text)  # the full path, including the LIKE fallback for short CJK runs


@settings(max_examples=200, deadline=None)
@given(ANY_TEXT)
def test_query_expressions_are_only_quoted_terms(text: str) -> None:
    query = build_keyword_query(text)
    for expression in (query.words, query.cjk):
        if expression is None:
            continue
        for part in expression.split(" OR "):
            assert part.startswith('"') and part.endswith('"'), part
            assert '"' not in part[1:-1].replace('""', ""), part
            assert "\x00" not in part


HOSTILE = [
    '"',
    '""',
    'say "hello',
    "NEAR(alpha beta)",
    "NEAR(",
    "*",
    "alph*",
    "^alpha",
    "body:alpha",
    "{body}: alpha",
    "alpha AND beta",
    "alpha OR",
    "NOT alpha",
    "AND OR NOT",
    "alpha\x00beta",
    "\x00",
    "alpha\ud800beta",
    "\udfff",
    "x" * 100_000,
    "word " * 20_000,
    "🎉😀🔥",
    "東京大学",
    "東" * 100_000,
    "東京大学の" * 20_000,
    "-alpha +beta",
    "(((((",
    ")",
    "'",
    "\\",
    "",
    "   ",
]


@pytest.mark.parametrize("text", HOSTILE, ids=lambda t: repr(t[:20]))
def test_hostile_strings_never_raise(db: Database, text: str) -> None:
    _run_match(db, build_keyword_query(text))
    assert isinstance(search(db, text), list)


def test_non_string_input_is_an_empty_query() -> None:
    assert build_keyword_query(None).empty  # type: ignore[arg-type]
    assert build_keyword_query(b"bytes").empty  # type: ignore[arg-type]


def test_a_query_analysed_again_gives_the_same_and_a_list_of_its_own() -> None:
    """Three stores analyse each pre-task query: the analysis is kept, so what one caller does
    with its list cannot change what the next gets, and a text past the query limit is cut as
    it always was."""
    first = keyword_terms("parseHttpRequest before the café")
    first.append("poison")
    assert keyword_terms("parseHttpRequest before the café") == [
        "parsehttprequest",
        "café",
        "parse",
        "http",
        "request",
    ]
    long = "alpha " * 2000 + "omega"  # past MAX_QUERY_CHARS (4,096): omega is cut off
    assert keyword_terms(long) == keyword_terms(long[:4096]) == ["alpha", "alph"]
    assert build_keyword_query(long) == build_keyword_query(long[:4096])
    assert keyword_terms("the and of", keep_stop_words=True) == ["the", "and", "of"]
    assert keyword_terms("the and of") == []


def test_empty_and_symbol_only_queries_are_empty() -> None:
    for text in ("", "   ", "*", "()", '""', "\x00", "\ud800"):
        assert build_keyword_query(text).empty, text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('say "hello" to the fox', 1),
        ("NEAR(fox dog)", 1),
        ("^fox", 1),
        ("body:fox", 1),
        ("fox AND NOT cat", 1),
        ("fox\x00", 1),
        ("fox\ud800", 1),
        ("🎉 party", 7),
        ("cafe", 7),  # diacritics folded
        ("crème", 7),
    ],
)
def test_hostile_queries_still_find_their_words(db: Database, text: str, expected: int) -> None:
    assert expected in search(db, text)


def test_cjk_found_by_two_and_four_character_queries(db: Database) -> None:
    assert search(db, "東京") == [5]  # 2 characters: below trigram length, LIKE fallback
    assert search(db, "機械学習") == [5]  # 4 characters: trigram index
    assert search(db, "首都") == [9]
    assert 10 in search(db, "テキスト検索")


def test_long_cjk_query_matches_documents_holding_part_of_it(db: Database) -> None:
    # the whole run appears in no document, but its trigrams do
    assert search(db, "機械学習の論文を読む")[:1] == [5]


def test_snake_case_identifier_found_by_its_parts(db: Database) -> None:
    assert 2 in search(db, "http")
    assert 2 in search(db, "request")
    assert search(db, "parse_http_request")[0] in (2, 3)


def test_camel_case_identifier_found_by_its_parts(db: Database) -> None:
    assert 3 in search(db, "http")
    assert 3 in search(db, "request")
    assert 3 in search(db, "server")  # HTTPServer
    assert 3 in search(db, "parseHttpRequest")


def test_stemming_running_finds_runs(db: Database) -> None:
    assert search(db, "running") == [4]
    assert 4 in search(db, "mornings")


def test_stop_word_only_query_still_searches(db: Database) -> None:
    query = build_keyword_query("to be")
    assert query.words == '"to" OR "be"'
    assert search(db, "to be")[0] == 6


def test_stop_words_dropped_when_other_terms_exist() -> None:
    assert keyword_terms("the lazy dog") == ["lazy", "dog"]
    assert build_keyword_query("the lazy dog").words == '"lazy" OR "dog"'


def test_more_matching_terms_rank_first(db: Database) -> None:
    assert search(db, "lazy dog fox")[0] == 1


def test_identifier_words() -> None:
    assert identifier_words("parseHttpRequest") == "parse http request"
    assert identifier_words("HTTPServer getX") == "http server get x"
    assert identifier_words("plain words and snake_case only") == ""
    assert identifier_words("") == ""


def test_identifier_words_on_a_huge_token_finishes() -> None:
    # a 100 KB run of letters once took quadratic time in the identifier scanner
    assert identifier_words("a" * 100_000) == ""
    assert identifier_words("aB" * 50_000) == "a ba b"  # parts: a, Ba, ..., B


def _identifier_words_token_by_token(text: str) -> str:
    """The rule spelled out: every ASCII token with a case change, split into its camelCase parts."""
    words: list[str] = []
    for token in re.findall(r"[A-Za-z0-9_]+", text):
        if re.search(r"[a-z0-9][A-Z]|[A-Z]{2}[a-z]", token):
            for part in re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+", token):
                if part.lower() not in words:
                    words.append(part.lower())
    return " ".join(words)


@pytest.mark.parametrize(
    "text",
    [
        "plain prose. With Capitals",
        "parseHttpRequest",
        "HTTPServer x",
        "getX",
        "snake_case_name",
        "ABC",
        "iPhone",
    ],
)
def test_identifier_scan_matches_the_token_rule(text: str) -> None:
    # identifier_words searches for case changes and widens them to tokens, not token by token
    assert identifier_words(text) == _with_extra_terms(_identifier_words_token_by_token(text), text)


@given(st.text(alphabet=st.sampled_from("aAbBzZ09_ .-\u00e9\u4e2d\n"), max_size=60) | st.text(max_size=40))
def test_identifier_scan_property(text: str) -> None:
    assert identifier_words(text) == _with_extra_terms(_identifier_words_token_by_token(text), text)


def _with_extra_terms(words: str, text: str) -> str:
    """The identifier parts, then the ё -> е spellings and emoji terms identifier_words adds."""
    from memstrata.storage._fulltext import folded_and_symbol_terms

    return " ".join(dict.fromkeys([*words.split(), *folded_and_symbol_terms(text)]))


def test_cjk_runs() -> None:
    assert cjk_runs("東京 tokyo 東京 and 한국어, ひらがな") == ["東京", "한국어", "ひらがな"]
    assert cjk_runs("plain text") == []


def test_query_is_bounded() -> None:
    query = build_keyword_query(" ".join(f"w{i}" for i in range(1000)))
    assert query.words is not None and query.words.count(" OR ") < 32


def test_hostile_documents_are_indexed(tmp_path: Path) -> None:
    db = open_database(tmp_path / "docs.sqlite")
    apply_migrations(db, "fts-test", [_migration])
    with db.transaction():
        _store(db, 1, 'nul\x00inside NEAR( "quote" 🎉 ' + "long " * 20_000)
        _store(db, 2, "x" * 100_000)
    assert search(db, "inside") == [1]
    with pytest.raises(InvalidInputError, match="surrogate"):
        _store(db, 3, "lone \ud800 surrogate")
    db.close()


def test_filter_restricts_keyword_hits(db: Database) -> None:
    only_even = Filter(sql="SELECT id FROM docs WHERE id % 2 = 0")
    ids = keyword_search(db, "docs", ["body", "idwords"], build_keyword_query("dog fox"), 10, only_even)
    assert ids == [4]


@pytest.mark.parametrize("text", ["dog fox", "the", "parse http request", "emoji café", "alpha quoted"])
@pytest.mark.parametrize("allowed", [set(), {4}, {1, 4, 6}, set(range(1, 11, 2)), set(range(1, 11))])
def test_filtered_keyword_search_is_the_unfiltered_ranking_restricted(
    db: Database, text: str, allowed: set[int]
) -> None:
    # one ranked list (words only): BM25 does not depend on the filter, so order is kept
    query = build_keyword_query(text)
    assert query.cjk is None and not query.cjk_short
    everything = keyword_search(db, "docs", ["body", "idwords"], query, 100, Filter())
    listed = ", ".join(map(str, sorted(allowed))) or "NULL"
    flt = Filter(sql=f"SELECT id FROM docs WHERE id IN ({listed})")
    for limit in (1, 2, 100):
        got = keyword_search(db, "docs", ["body", "idwords"], query, limit, flt)
        assert got == [i for i in everything if i in allowed][:limit]


def test_filter_is_applied_to_matches_not_handed_to_fts5(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a ``rowid IN (...)`` constraint given to FTS5 makes it run the MATCH once per allowed id:
    # the plan must scan the MATCH result and test each row against the filter instead
    statements: list[tuple[str, tuple[object, ...]]] = []
    original = db.query

    def recording(sql: str, params: Any = ()) -> list[Any]:
        statements.append((sql, tuple(params)))
        return original(sql, params)

    monkeypatch.setattr(db, "query", recording)
    flt = Filter(sql="SELECT id FROM docs WHERE id > ?", params=(2,))
    keyword_search(db, "docs", ["body", "idwords"], build_keyword_query("dog 東京大学"), 5, flt)
    monkeypatch.undo()
    fts = [(sql, params) for sql, params in statements if " MATCH " in sql]
    # the trigram index; words are scored from the postings (Bm25Index), the filter as a mask
    assert len(fts) == 1
    for sql, params in fts:
        plan = " ".join(str(row[3]) for row in db.query("EXPLAIN QUERY PLAN " + sql, params))
        index = re.search(r"VIRTUAL TABLE INDEX \d+:(\S*)", plan)
        assert index is not None and "=" not in index.group(1), plan


# -- combining marks ------------------------------------------------------------------------------

MARKED_WORDS = [
    unicodedata.normalize("NFD", "Ångström"),  # decomposed Latin accents (Mn)
    unicodedata.normalize("NFD", "résumé"),
    "नमस्ते",  # Devanagari virama and vowel sign (Mn)
    "तालिका",  # Devanagari vowel signs (Mc): FTS5 splits there, so the query word is a phrase
    "தமிழ்",  # Tamil vowel sign (Mc) and virama (Mn)
    "ไม่มี",  # Thai tone mark and vowel (Mn)
    "x\u20ddy",  # an enclosing mark (Me)
]


def _marks() -> list[str]:
    """Every combining mark (Unicode categories Mn, Mc, Me) of the Unicode version Python uses."""
    return [chr(c) for c in range(0x110000) if unicodedata.category(chr(c))[0] == "M"]


def test_words_keep_exactly_the_combining_marks() -> None:
    """Every character between two letters (unassigned and private-use code points are no marks):
    the word holds on over it exactly when Python's ``\\w`` (not ``_``), an apostrophe or Unicode's
    categories Mn, Mc, Me say it belongs to a word."""
    from memstrata.storage._fulltext import _words

    points = [
        chr(c)
        for c in range(0x110000)
        if unicodedata.category(chr(c)) not in ("Cn", "Co", "Cs") and not chr(c).isspace()
    ]
    found = _words(" ".join(f"x{c}y" for c in points))
    expected: list[str] = []
    for c in points:
        inside = c.isalnum() or c in "'’" or unicodedata.category(c)[0] == "M"  # isalnum: [^\W_]
        expected += [f"x{c}y"] if inside else ["x", "y"]
    assert found == expected


def _fts5_tokens(db: Database, texts: Sequence[str]) -> list[list[str]]:
    """The tokens FTS5 makes of each text with the stores' tokenizer, in order."""
    db.execute(f"CREATE VIRTUAL TABLE temp.tok USING fts5(x, content='', tokenize='{FTS_TOKENIZER}')")
    db.execute("CREATE VIRTUAL TABLE temp.tok_vocab USING fts5vocab(temp, tok, instance)")
    db.executemany("INSERT INTO temp.tok(rowid, x) VALUES (?, ?)", [(i + 1, t) for i, t in enumerate(texts)])
    found: list[list[str]] = [[] for _ in texts]
    for doc, term in db.query("SELECT doc, term FROM temp.tok_vocab ORDER BY doc, offset"):
        found[int(doc) - 1].append(str(term))
    return found


def test_query_words_tokenise_as_the_words_of_documents(tmp_path: Path) -> None:
    """FTS5 makes the same tokens of a query's words as of the document word they come from,
    for words of several scripts and for every combining mark between two letters (beside the
    compatibility spelling a query also asks for, as a term of its own: ``separate_words``)."""
    words = [*MARKED_WORDS, *(f"a{m}b" for m in _marks())]
    queries = [
        [t for t in keyword_terms(w, keep_stop_words=True) if t not in separate_words(w)] for w in words
    ]
    with open_database(tmp_path / "tok.sqlite") as db:
        tokens = _fts5_tokens(db, [*words, *(term for terms in queries for term in terms)])
    of_terms = iter(tokens[len(words) :])
    for word, terms, of_word in zip(words, queries, tokens, strict=False):
        assert [t for _ in terms for t in next(of_terms)] == of_word, (word, terms)


def test_a_word_with_marks_finds_its_document_in_either_normal_form(tmp_path: Path) -> None:
    db = open_database(tmp_path / "marks.sqlite")
    apply_migrations(db, "fts-test", [_migration])
    bodies = ["नमस्ते दुनिया", "तालिका में समय", "मेरा नाम राम है", "Ångström unit of length", "a résumé"]
    for doc_id, body in enumerate(bodies, 1):
        _store(db, doc_id, body)
    assert search(db, "तालिका") == [2] and search(db, "नमस्ते") == [1]  # not every word of its letters
    for form in ("NFC", "NFD"):
        assert search(db, unicodedata.normalize(form, "Ångström")) == [4], form
        assert search(db, unicodedata.normalize(form, "résumé")) == [5], form
    db.close()


def test_update_and_delete_keep_both_indexes_in_sync(tmp_path: Path) -> None:
    db = open_database(tmp_path / "docs.sqlite")
    apply_migrations(db, "fts-test", [_migration])
    _store(db, 1, "alpha 東京大学")
    db.execute("UPDATE docs SET body = ? WHERE id = 1", ("beta 上海市場",))
    assert search(db, "alpha") == [] and search(db, "東京大学") == []
    assert search(db, "beta") == [1] and search(db, "上海市場") == [1]
    db.execute("DELETE FROM docs WHERE id = 1")
    assert search(db, "beta") == [] and search(db, "上海市場") == []
    db.close()


def test_yo_and_emoji_are_found_in_every_keyword_index(tmp_path: Path) -> None:
    """ё and е find each other, and an emoji is a term: knowledge, episodes and file chunks."""
    from memstrata import Config
    from memstrata._workspaces import Workspaces
    from memstrata.layers import EpisodicMemory, KnowledgeStore
    from tests.fakes import FakeEmbedder

    embedder = FakeEmbedder()
    texts = ["Журнал развёртывания сервиса", "Release party 🚀🎉 tonight", "plain text about nothing"]
    with KnowledgeStore.open(tmp_path / "k.sqlite", embedder) as store:
        ids = [store.add(t, category="pattern") for t in texts]
        for query, want in (("развертывания", 0), ("развёртывания", 0), ("🚀", 1), ("🎉", 1)):
            hits = store.search(query, mode="keyword", top_k=3)
            assert [h.entry.id for h in hits] == [ids[want]], (query, hits)
    with EpisodicMemory.open(tmp_path / "e.sqlite", embedder) as episodic:
        eids = [episodic.record(t) for t in texts]
        for query, want in (("развертывания", 0), ("🎉", 1)):
            hits = episodic.search(query, top_k=3, mode="keyword")
            assert hits and hits[0].episode.id == eids[want], (query, hits)
    root = tmp_path / "notes"
    root.mkdir()
    (root / "MEMORY.md").write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    with Workspaces(tmp_path / "data", config=Config(data_dir=tmp_path / "data"), embedder=embedder) as ws:
        ws.index(root)
        for query in ("развертывания", "🚀"):
            hits = ws.search(query, min_score=0.99)
            assert hits and hits[0].match_type in ("keyword", "hybrid"), (query, hits)


def test_rows_indexed_before_the_yo_emoji_terms_gain_them_once(tmp_path: Path) -> None:
    """A store written before ё folding and emoji terms existed: its rows are upgraded on open
    (named migration ``yo-emoji-1``), and the original spelling keeps matching throughout."""
    from memstrata.layers import KnowledgeStore
    from memstrata.storage import get_meta, open_database
    from memstrata.storage._migrations import KEYWORD_TERMS, refresh_keyword_terms
    from tests.fakes import FakeEmbedder

    path = tmp_path / "old.sqlite"
    embedder = FakeEmbedder()
    with KnowledgeStore.open(path, embedder) as store:
        old = store.add("Журнал развёртывания 🚀", category="pattern")
    with open_database(path) as db:  # as an older version left it: no extra terms, no record
        db.execute("UPDATE knowledge SET ident = ''")
        db.execute("DELETE FROM metadata WHERE key = 'keyword_terms'")
    with open_database(path, read_only=True) as db:
        assert refresh_keyword_terms(db, table="knowledge", column="ident", source="content") == 0
    with KnowledgeStore.open(path, embedder) as store:
        assert [h.entry.id for h in store.search("развёртывания", mode="keyword")] == [old]
        assert [h.entry.id for h in store.search("развертывания", mode="keyword")] == [old]
        assert [h.entry.id for h in store.search("🚀", mode="keyword")] == [old]
    with open_database(path) as db:
        assert get_meta(db, "keyword_terms") == KEYWORD_TERMS
        assert refresh_keyword_terms(db, table="knowledge", column="ident", source="content") == 0


def test_words_the_tokenizer_does_not_separate_are_found_in_every_keyword_index(tmp_path: Path) -> None:
    """Full-width letters and digits, ligatures and unit signs, as Japanese and typeset text write
    them, find and are found by the plain spelling (Unicode's compatibility folding, NFKC), and a
    word written against Japanese text without a space is found by itself, in knowledge, episodes
    and file chunks."""
    from memstrata import Config
    from memstrata._workspaces import Workspaces
    from memstrata.layers import EpisodicMemory, KnowledgeStore
    from tests.fakes import FakeEmbedder

    embedder = FakeEmbedder()
    texts = [
        "ＡＰＩキーの更新手順 ＶＥＲ２ Pythonで自動化",
        "The ﬁle system stalls at 5㎏ loads",
        "plain api notes on the file server",
    ]
    cases = (
        ("API", {0, 2}),
        ("ＡＰＩ", {0, 2}),
        ("ver2", {0}),
        ("python", {0}),
        ("5kg", {1}),
        ("ﬁle", {1, 2}),
        ("file", {1, 2}),
    )
    with KnowledgeStore.open(tmp_path / "k.sqlite", embedder) as store:
        ids = [store.add(t, category="pattern") for t in texts]
        for query, want in cases:
            hits = store.search(query, mode="keyword", top_k=5)
            assert {h.entry.id for h in hits} == {ids[i] for i in want}, (query, hits)
    with EpisodicMemory.open(tmp_path / "e.sqlite", embedder) as episodic:
        eids = [episodic.record(t) for t in texts]
        for query, want in cases:
            hits = episodic.search(query, top_k=5, mode="keyword")
            assert {h.episode.id for h in hits} == {eids[i] for i in want}, (query, hits)
    root = tmp_path / "notes"
    root.mkdir()
    for i, text in enumerate(texts):
        (root / f"note{i}.md").write_text(text + "\n", encoding="utf-8")
    with Workspaces(tmp_path / "data", config=Config(data_dir=tmp_path / "data"), embedder=embedder) as ws:
        ws.index(root)
        for query, want in cases:
            hits = [h for h in ws.search(query, max_results=10, min_score=0.99) if h.match_type != "vector"]
            assert {h.path for h in hits} == {f"note{i}.md" for i in want}, (query, hits)


def test_rows_indexed_before_compatibility_spellings_gain_them_once(tmp_path: Path) -> None:
    """A store upgraded by ``yo-emoji-1`` only: its rows gain the compatibility spellings on the
    next writable open (``yo-emoji-nfkc-2``), once, and keep their earlier extra terms."""
    from memstrata.layers import KnowledgeStore
    from memstrata.storage import get_meta, open_database
    from memstrata.storage._migrations import KEYWORD_TERMS, refresh_keyword_terms
    from tests.fakes import FakeEmbedder

    path = tmp_path / "old.sqlite"
    embedder = FakeEmbedder()
    with KnowledgeStore.open(path, embedder) as store:
        old = store.add("ＡＰＩ gateway for развёртывания", category="pattern")
    with open_database(path) as db:  # as the previous upgrade left it
        db.execute("UPDATE knowledge SET ident = 'развертывания'")
        db.execute("UPDATE metadata SET value = 'yo-emoji-1' WHERE key = 'keyword_terms'")
    with KnowledgeStore.open(path, embedder) as store:
        for query in ("API", "ＡＰＩ", "развертывания"):
            assert [h.entry.id for h in store.search(query, mode="keyword")] == [old], query
    with open_database(path) as db:
        assert get_meta(db, "keyword_terms") == KEYWORD_TERMS == "yo-emoji-nfkc-2"
        assert db.execute("SELECT ident FROM knowledge").fetchone()[0].split() == ["развертывания", "api"]
        assert refresh_keyword_terms(db, table="knowledge", column="ident", source="content") == 0


def test_separate_words_are_only_those_the_tokenizer_does_not_make() -> None:
    assert separate_words("ＡＢＣ－１２３ and ﬁle") == ["abc", "123", "file"]
    assert separate_words("x² Ⅳ") == ["x2", "iv"]
    assert separate_words("APIキーを Pythonで 東京 api") == ["python"]  # "api" stands alone too
    assert separate_words("plain ascii text") == []
    assert separate_words("café re\u0301sume\u0301 ёлка 東京") == []  # composition is not folding
