"""FTS5: schema helpers and a query builder that turns any string into a safe MATCH expression.

User text is never passed to FTS5 as syntax. It is cut into word terms (identifiers split at
``snake_case`` and ``camelCase`` boundaries as well), stop words are dropped, and every term is
double-quoted and joined with ``OR`` so BM25 ranks documents that match more terms first. Runs
of CJK characters go to a trigram index, where a quoted run matches as a substring.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

__all__ = [
    "FTS_TOKENIZER",
    "MAX_QUERY_TERMS",
    "KeywordQuery",
    "build_keyword_query",
    "cjk_runs",
    "fold_letters",
    "folded_and_symbol_terms",
    "fts_schema",
    "identifier_words",
    "keyword_terms",
    "separate_words",
]

MAX_QUERY_TERMS = 32
MAX_QUERY_CHARS = 4_096
MAX_CJK_PHRASE = 32
# query texts whose analysis is kept: a pre-task retrieval asks three stores about the same text,
# and each analysed it twice (its BM25 words, its MATCH expressions), ~0.1 ms a time
_KEPT_QUERIES = 256
TOKENIZER = "porter unicode61 remove_diacritics 2"
FTS_TOKENIZER = TOKENIZER  # public name, for stores that declare their own FTS5 tables

# English function words: matching them adds noise to BM25 and costs long posting lists.
_STOP_WORDS_TEXT = """
    a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for
    from further had has have having he her here hers herself him himself his how i if in
    into is it its itself just me more most my myself no nor not now of off on once only or
    other our ours ourselves out over own same she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up
    very was we were what when where which while who whom why will with would you your yours
    yourself yourselves
"""
STOP_WORDS = frozenset(_STOP_WORDS_TEXT.split())

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*", re.UNICODE)
# the characters ``\w`` leaves out that are neither ASCII nor space: among them the combining marks
# (Unicode categories Mn, Mc, Me), which belong to their word (see :func:`_words`)
_NOT_WORD = re.compile(r"[^\w\s\x00-\x7f]")
# English clitics after an apostrophe: ``unicode61`` indexes "session's" as "session" "s", so a
# quoted "session's" is a phrase, which FTS5 matches position by position (at 1M entries 10-90 ms
# the first time a process meets one, against a few ms for a word). The clitic tells a search
# nothing the word before it does not, so the query keeps that word alone ("don't": "don").
_CLITIC = re.compile(r"['’](?:s|t|d|ll|re|ve|m)$", re.IGNORECASE)
# the characters of an ASCII identifier-like token
_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
# a case change inside a token: ``parseHttp``, ``getX``, ``HTTPServer`` (but not ``HTTP`` or ``Word``),
# matched at its capital letter: a pattern that starts with one character class lets ``re`` skip
# ahead to the next capital instead of trying every position (3x faster on prose)
_CASE_CHANGE = re.compile(r"[A-Z](?:(?<=[a-z0-9][A-Z])|(?=[A-Z][a-z]))")
_CAMEL_PARTS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_CJK = re.compile(
    "[\u2e80-\u2fdf\u3040-\u30ff\u3100-\u31bf\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+"
)
# the letters among them, which a word written against them is glued to (the kana block's voicing
# marks, U+3099-U+309C, are left out: the tokenizer already separates words at them); compiled on
# first use, as only text with such letters needs it (10 ms of a process's start otherwise)
_CJK_LETTERS = (
    "[\u2e80-\u2fdf\u3040-\u3098\u309d-\u30ff\u3100-\u31bf"
    "\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+"
)


# Russian readers treat ё as е (most texts print е): both spellings must find each other
_FOLD = str.maketrans("ёЁ", "еЕ")
_YO = re.compile(r"[^\W_]*[ёЁ][^\W_]*")
# where pictographs live; each candidate is kept only if Unicode calls it a symbol ("So")
_SYMBOLS = re.compile("[\u2190-\u2bff\u3030\u303d\u3297\u3299\U0001f000-\U0001faff]")


def fold_letters(text: str) -> str:
    """``text`` with the letters folded that ``unicode61`` leaves apart but readers do not: ё -> е."""
    return text.translate(_FOLD)


def separate_words(text: str) -> list[str]:
    """The words of ``text``, lower case, that ``unicode61`` does not make tokens of by itself:
    words as Unicode's compatibility folding (NFKC) writes them (full-width ``ＡＰＩ`` -> ``api``,
    the ligature ``ﬁle`` -> ``file``, ``5㎏`` -> ``5kg``), and words written against CJK text
    without a space (``APIキー``, ``Pythonで``: one token to the tokenizer, which a query for
    ``api`` or ``python`` would miss). An index holds them as extra terms, so either spelling
    finds both. Composition alone (NFC) adds nothing: the tokenizer reads composed and
    decomposed letters alike."""
    if text.isascii():
        return []
    composed, folded = unicodedata.normalize("NFC", text), unicodedata.normalize("NFKC", text)
    letters = re.compile(_CJK_LETTERS)  # cached by ``re`` after the first call
    runs = list(letters.finditer(composed))
    glued = any(
        (run.start() > 0 and composed[run.start() - 1].isalnum())
        or (run.end() < len(composed) and composed[run.end()].isalnum())
        for run in runs
    )
    if folded == composed and not glued:  # most text: nothing to add
        return []
    unglued = letters.sub(" ", folded)
    # both sides cut by one rule, so only what differs comes out (twice as fast as ``_words``,
    # whose care for combining marks the tokenizer repeats on these words when it indexes them)
    written = set(_WORD.findall(composed.lower()))
    return [word for word in dict.fromkeys(_WORD.findall(unglued.lower())) if word not in written]


def _symbol_terms(text: str) -> list[str]:
    """One indexable term per distinct emoji (or other pictograph) in ``text``.

    ``unicode61`` treats symbols as separators, so an emoji is spelled as an ASCII word that
    survives it (``🚀`` -> ``emoji1f680``); the same spelling is used at query time.
    """
    found: dict[str, None] = {}
    for match in _SYMBOLS.finditer(text):
        char = match.group(0)
        if unicodedata.category(char) == "So":
            found.setdefault(f"emoji{ord(char):x}", None)
    return list(found)


def identifier_words(text: str) -> str:
    """The extra indexed words of ``text``, for an extra indexed column.

    ``unicode61`` already splits ``snake_case`` at underscores, but keeps ``parseHttpRequest``
    as one token; this returns ``"parse http request"`` for it so a query for ``http`` finds it.
    It also holds the ё -> е spelling of words written with ё, the words the tokenizer does not
    separate (full-width ``ＡＰＩ`` as ``api``, ``APIキー`` as ``api``) and one term per emoji (see
    :func:`fold_letters`, :func:`separate_words` and :func:`keyword_terms`), which the tokenizer
    cannot produce itself.
    """
    words: list[str] = []
    seen: set[str] = set()

    def add(word: str) -> None:
        if word not in seen:
            seen.add(word)
            words.append(word)

    for ident in _case_change_tokens(text):
        for part in _CAMEL_PARTS.findall(ident):
            add(part.lower())
    for term in folded_and_symbol_terms(text):
        add(term)
    return " ".join(words)


def folded_and_symbol_terms(text: str) -> list[str]:
    """The terms :func:`identifier_words` adds beyond identifier parts: ё -> е spellings, the
    words of :func:`separate_words`, emoji."""
    if text.isascii():  # neither ё, nor CJK or compatibility letters, nor pictographs: no scans
        return []
    terms: dict[str, None] = {}
    if "ё" in text or "Ё" in text:
        for match in _YO.finditer(text):
            terms.setdefault(fold_letters(match.group(0)).lower(), None)
    for word in separate_words(text):
        terms.setdefault(word, None)
    for term in _symbol_terms(text):
        terms.setdefault(term, None)
    return list(terms)


def _case_change_tokens(text: str) -> list[str]:
    """The identifier-like tokens holding a case change, found from the case changes outward.

    Plain words and ``snake_case`` (which unicode61 already splits) are never looked at one by
    one, so a megabyte of prose costs one regex scan.
    """
    tokens: list[str] = []
    match = _CASE_CHANGE.search(text)
    while match is not None:
        start, end = match.start(), match.end()
        while start > 0 and text[start - 1] in _TOKEN_CHARS:
            start -= 1
        while end < len(text) and text[end] in _TOKEN_CHARS:
            end += 1
        tokens.append(text[start:end])
        match = _CASE_CHANGE.search(text, end)
    return tokens


def cjk_runs(text: str) -> list[str]:
    """The distinct runs of CJK characters (scripts written without spaces) in ``text``, in order."""
    if text.isascii():
        return []
    return list(dict.fromkeys(_CJK.findall(text)))


def keyword_terms(text: str, *, keep_stop_words: bool = False) -> list[str]:
    """Distinct lower-case terms of ``text`` in order: words plus the parts of identifiers.

    A word written with ё also yields its ё -> е spelling, a word such as full-width ``ＡＰＩ``
    its compatibility spelling ``api``, and an emoji its indexed term (see
    :func:`identifier_words`), so either spelling finds both, in old and new indexes alike.
    """
    return list(_kept_terms(_short(text), keep_stop_words))


def _short(text: str) -> str:
    """``text`` cut to the query limit before its analysis is kept (kept texts stay small)."""
    return _clean(text)[:MAX_QUERY_CHARS] if len(text) > MAX_QUERY_CHARS else text


@functools.lru_cache(maxsize=_KEPT_QUERIES)
def _kept_terms(text: str, keep_stop_words: bool) -> tuple[str, ...]:
    text = _clean(text)[:MAX_QUERY_CHARS]
    terms: list[str] = []
    seen: set[str] = set()

    def add(term: str) -> None:
        term = term.lower().replace("’", "'")
        if term and term not in seen and (keep_stop_words or term not in STOP_WORDS):
            seen.add(term)
            terms.append(term)

    for found in _words(_CJK.sub(" ", text)):
        word = _CLITIC.sub("", found)
        add(word)
        add(fold_letters(word))
    for part in identifier_words(text).split():
        add(part)
    return tuple(terms)


def _words(text: str) -> list[str]:
    """The words of ``text``, combining marks kept inside them: FTS5 tokenises a query word as
    it does the same word in a document only when given all of it. Python's ``\\w`` leaves the
    marks out, which cut a decomposed "résumé" into "re" "sume" and a Devanagari word into
    letters. Each distinct character ``\\w`` leaves out is looked up once (none in ASCII or plain
    text); the marks among them stand in for a letter while the words are found."""
    masked = text
    if not text.isascii():
        marks = [c for c in set(_NOT_WORD.findall(text)) if unicodedata.category(c)[0] == "M"]
        if marks:
            masked = text.translate(dict.fromkeys(map(ord, marks), "a"))
    return [text[m.start() : m.end()] for m in _WORD.finditer(masked)]


def _clean(text: str) -> str:
    # lone surrogates and NUL cannot reach SQLite; they carry no searchable meaning anyway
    return text.encode("utf-8", "ignore").decode("utf-8").replace("\x00", " ")


def _quote(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True)
class KeywordQuery:
    """Safe MATCH expressions: ``words`` for the porter index, ``cjk`` for the trigram index."""

    words: str | None
    cjk: str | None
    cjk_short: tuple[str, ...]  # 1-2 character CJK runs, too short for trigrams: LIKE fallback

    @property
    def empty(self) -> bool:
        return self.words is None and self.cjk is None and not self.cjk_short


def build_keyword_query(text: str) -> KeywordQuery:
    """Turn any ``str`` into a :class:`KeywordQuery`; never raises, may be empty."""
    if not isinstance(text, str):
        return KeywordQuery(None, None, ())
    return _kept_query(_short(text))


@functools.lru_cache(maxsize=_KEPT_QUERIES)
def _kept_query(text: str) -> KeywordQuery:
    text = _clean(text)[:MAX_QUERY_CHARS]
    terms = keyword_terms(text)
    if not terms:  # a query made only of stop words still deserves an answer
        terms = keyword_terms(text, keep_stop_words=True)
    terms = terms[:MAX_QUERY_TERMS]
    words = " OR ".join(_quote(t) for t in terms) if terms else None
    runs = cjk_runs(text)
    grams: dict[str, None] = {}
    for run in (r for r in runs if len(r) >= 3):
        # the run itself (when short enough to be a plausible phrase), then its trigrams: a
        # document holding only part of the run still matches
        if len(run) <= MAX_CJK_PHRASE:
            grams[run] = None
        for i in range(len(run) - 2 if len(run) > 3 else 0):
            if len(grams) >= MAX_QUERY_TERMS:
                break
            grams.setdefault(run[i : i + 3], None)
        if len(grams) >= MAX_QUERY_TERMS:
            break
    short_runs = [r for r in runs if len(r) < 3]
    if grams or any(len(r) == 2 for r in short_runs):
        short_runs = [r for r in short_runs if len(r) == 2]  # one character is noise beside more
    cjk = " OR ".join(_quote(g) for g in grams) if grams else None
    return KeywordQuery(words, cjk, tuple(short_runs[:8]))


def fts_schema(table: str, columns: list[str], *, key: str = "id") -> str:
    """SQL for two external-content FTS5 indexes on ``table`` plus the triggers that sync them.

    ``{table}_fts`` (porter stemming, diacritics folded) serves word queries; ``{table}_tri``
    (trigram) serves CJK and other text without spaces. ``columns`` are columns of ``table``.
    """
    cols = ", ".join(columns)
    new_cols = ", ".join(f"new.{c}" for c in columns)
    old_cols = ", ".join(f"old.{c}" for c in columns)
    parts = []
    for suffix, tokenizer in (("fts", TOKENIZER), ("tri", "trigram")):
        name = f"{table}_{suffix}"
        parts.append(
            f"CREATE VIRTUAL TABLE {name} USING fts5({cols}, content='{table}', content_rowid='{key}', "
            f"tokenize='{tokenizer}');"
        )
    parts.append(
        f"CREATE TRIGGER {table}_ai AFTER INSERT ON {table} BEGIN\n"
        f"  INSERT INTO {table}_fts(rowid, {cols}) VALUES (new.{key}, {new_cols});\n"
        f"  INSERT INTO {table}_tri(rowid, {cols}) VALUES (new.{key}, {new_cols});\nEND;"
    )
    parts.append(
        f"CREATE TRIGGER {table}_ad AFTER DELETE ON {table} BEGIN\n"
        f"  INSERT INTO {table}_fts({table}_fts, rowid, {cols}) VALUES ('delete', old.{key}, {old_cols});\n"
        f"  INSERT INTO {table}_tri({table}_tri, rowid, {cols}) "
        f"VALUES ('delete', old.{key}, {old_cols});\nEND;"
    )
    update_of = ", ".join(columns)
    parts.append(
        f"CREATE TRIGGER {table}_au AFTER UPDATE OF {update_of} ON {table} BEGIN\n"
        f"  INSERT INTO {table}_fts({table}_fts, rowid, {cols}) VALUES ('delete', old.{key}, {old_cols});\n"
        f"  INSERT INTO {table}_tri({table}_tri, rowid, {cols}) VALUES ('delete', old.{key}, {old_cols});\n"
        f"  INSERT INTO {table}_fts(rowid, {cols}) VALUES (new.{key}, {new_cols});\n"
        f"  INSERT INTO {table}_tri(rowid, {cols}) VALUES (new.{key}, {new_cols});\nEND;"
    )
    return "\n".join(parts)
