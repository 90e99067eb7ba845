"""Writes of many rows as one ``INSERT ... SELECT`` (new knowledge rows, vectors, the vector change
log) store exactly what one statement per row stores, in the same order; what cannot go that
way (text JSON cannot carry, many distinct metadata values, rows pending apart) still goes row by
row."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import memstrata.layers._knowledge_rows as row_sql
import memstrata.layers._knowledge_writes as writes
import memstrata.storage._vectors as vectors_module
from memstrata.errors import InvalidInputError
from memstrata.layers import KnowledgeStore
from memstrata.layers._knowledge_schema import _Item
from memstrata.storage import VectorIndex, disable_vec_for_tests, open_database
from memstrata.storage._vector_checks import check_vectors
from memstrata.storage._vector_inserts import MAX_CODED, insert_statement
from tests._support import check_knowledge
from tests.fakes import FakeEmbedder

DIM = 16
META = {"cat": "text", "n": "integer", "score": "float", "flag": "boolean"}


def _vectors(n: int, seed: int = 3) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def _metas(n: int) -> list[dict[str, Any]]:
    scores = (0.0, -0.0, 0.5, 1e-300, -2.5)
    return [
        {"cat": ("a", "b'c", "", "é 中")[i % 4], "n": (i % 3) - 1, "score": scores[i % 5], "flag": i % 2 == 0}
        for i in range(n)
    ]


def _statements(original: Callable[..., Any], *, one_statement: bool, used: list[bool]) -> Callable[..., Any]:
    """``original`` (a builder of one statement for many rows, ``None`` when it cannot), or with
    ``one_statement=False`` a stand-in that always declines; ``used`` notes what each call gave."""

    def statement(*args: Any) -> Any:
        found = original(*args) if one_statement else None
        used.append(found is not None)
        return found

    return statement


def _vector_rows(path: Path, *, one_statement: bool, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What the vector table, its chunk layout (vec0) and change log hold after two writes."""
    used: list[bool] = []
    insert_statement = _statements(vectors_module.insert_statement, one_statement=one_statement, used=used)
    monkeypatch.setattr(vectors_module, "insert_statement", insert_statement)
    db = open_database(path)
    try:
        index = VectorIndex(db, "items", DIM, metadata=META)
        ids = [int(i) for i in np.random.default_rng(1).permutation(np.arange(1, 301))]
        index.upsert_many(ids, _vectors(300), _metas(300))
        index.upsert_many(ids[:40:3], _vectors(14, seed=4), _metas(14)[::-1])  # replaced
        rows = db.query(f"SELECT rowid, embedding, cat, n, score, flag FROM {index.table} ORDER BY rowid")
        signs = [np.copysign(1.0, r[4]) for r in rows]
        layout = (
            db.query(f"SELECT rowid, chunk_id, chunk_offset FROM {index.table}_rowids ORDER BY rowid")
            if (index.backend == "vec0")
            else []
        )
        log = db.query(f"SELECT seq, item, op FROM {index.log_table} ORDER BY seq")
        types = db.query(
            f"SELECT DISTINCT typeof(cat), typeof(n), typeof(score), typeof(flag) FROM {index.table}"
        )
        return [
            [tuple(r) for r in rows],
            signs,
            [tuple(r) for r in layout],
            [tuple(r) for r in log],
            types,
            used,
        ]
    finally:
        db.close()
        monkeypatch.undo()


@pytest.mark.parametrize("vec0", [True, False])
def test_vectors_in_one_statement_are_stored_as_row_by_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vec0: bool
) -> None:
    disable_vec_for_tests(not vec0)
    try:
        one = _vector_rows(tmp_path / "one.sqlite", one_statement=True, monkeypatch=monkeypatch)
        each = _vector_rows(tmp_path / "each.sqlite", one_statement=False, monkeypatch=monkeypatch)
    finally:
        disable_vec_for_tests(False)
    assert one[:5] == each[:5]
    assert one[5] == [True, True] and each[5] == [False, False]
    assert len(one[0]) == 300 and len(one[3]) == 314  # every write logged, in the order given
    assert one[4] == [("text", "integer", "real", "integer")]


def test_metadata_columns_go_by_code_shared_or_row_by_row() -> None:
    ids, array = [5, 6, 7], _vectors(3)
    shared = insert_statement("t", ["cat"], ids, array, [{"cat": "x"}] * 3)
    assert shared is not None and shared[1][2:] == ["x"]  # bound once
    coded = insert_statement("t", ["n"], ids, array, [{"n": 2}, {"n": 9}, {"n": 2}])
    assert coded is not None and coded[1][2:] == [b"\x00\x01\x00", 2, 9]
    zeros = insert_statement("t", ["s"], ids, array, [{"s": 0.0}, {"s": -0.0}, {"s": 0.0}])
    assert zeros is not None and zeros[1][2] == b"\x00\x01\x00"  # -0.0 kept apart from 0.0
    many = [{"n": i} for i in range(MAX_CODED + 1)]
    assert insert_statement("t", ["n"], list(range(len(many))), _vectors(len(many)), many) is None
    assert insert_statement("t", ["v"], ids, array, [{"v": 1}, {"v": "1"}, {"v": 1}]) is None


def _mixed() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {"content": f"entry {i} calls parseHttpRequest{i % 3}", "category": ("pattern", "pitfall")[i % 2]}
        for i in range(12)
    ]
    items += [
        {"content": "支付系统的重试策略 with retries", "tags": {"lang": "go"}, "author": "ann"},
        {"content": 'quote " backslash \\ tab\t and emoji 😀', "scope": "/team/a", "author": None},
        {"content": "line\u2028separator, control \x01 and DEL \x7f", "tags": ["alpha"]},
        {"content": "entry 3 calls parseHttpRequest0", "category": "pitfall"},  # a duplicate
    ]
    return items


def _knowledge(path: Path, items: list[dict[str, Any]], *, one_statement: bool, now: float) -> list[Any]:
    with KnowledgeStore.open(path, FakeEmbedder(dim=DIM)) as store:
        store.clock = lambda: now
        calls: list[bool] = []
        original = row_sql.row_insert
        writes.row_insert = _statements(original, one_statement=one_statement, used=calls)
        try:
            ids = store.add_many(items, vectors=_vectors(len(items)))
            store.add_many([*items[:3], {"content": "one more"}], vectors=_vectors(4, seed=8))
        finally:
            writes.row_insert = original
        assert check_knowledge(store._db, store._vectors, full=True).problems == []
        rows = store._db.query("SELECT * FROM knowledge ORDER BY id")
        fts = store._db.query("SELECT rowid, content, tag_text, ident FROM knowledge_fts ORDER BY rowid")
        hits = [h.entry.id for h in store.search("parseHttpRequest retries", mode="keyword")]
        return [ids, [tuple(r) for r in rows], [tuple(r) for r in fts], hits, calls]


@pytest.mark.parametrize("now", [1234.5, 1732470000.123456])  # a literal time, a bound one
def test_knowledge_rows_in_one_statement_are_stored_as_row_by_row(tmp_path: Path, now: float) -> None:
    items = _mixed()
    one = _knowledge(tmp_path / "one.sqlite", items, one_statement=True, now=now)
    each = _knowledge(tmp_path / "each.sqlite", items, one_statement=False, now=now)
    assert one[:4] == each[:4]
    assert one[4] == [True, True] and each[4] == [False, False]


def test_what_json_cannot_carry_is_bound_row_by_row(tmp_path: Path) -> None:
    items = [{"content": "a NUL \x00 inside"}, {"content": "plain"}, {"content": "\\u0000 written out"}]
    with KnowledgeStore.open(tmp_path / "k.sqlite", FakeEmbedder(dim=DIM)) as store:
        ids = store.add_many(items, vectors=_vectors(3))
        stored = [store.get(i) for i in ids]
        assert [e.content if e else None for e in stored] == [i["content"] for i in items]
    plain = _Item("plain", "pattern", {}, "/", None).seal()
    plain.prepare()
    assert row_sql.row_plan([plain]).texts is not None
    nul = _Item("x\x00y", "pattern", {}, "/", None)
    nul.prepare()
    assert row_sql.row_plan([nul, plain]).texts is None
    surrogate = _Item("lone \ud800", "pattern", {}, "/", None)
    surrogate.prepare()
    assert row_sql.row_plan([surrogate]).texts is None
    assert row_sql.row_insert(row_sql.row_plan([plain, plain]), [0, 1], 1.5) is None  # pending apart


@pytest.mark.parametrize(
    ("row", "error"),
    [
        ([1e30, -1e30, 3e38], None),  # finite, its squares overflow
        ([1.0, 0.0, 0.0], None),
        ([0.0, 0.0, 0.0], "zero vector"),
        ([1e-30, 0.0, 0.0], "zero vector"),  # its float32 norm is zero, as before
        ([np.inf, 1.0, 0.0], "NaN or infinity"),
        ([np.nan, 1.0, 0.0], "NaN or infinity"),
    ],
)
def test_vector_checks(row: list[float], error: str | None) -> None:
    array = np.array([[0.5, 0.5, 0.5], row], dtype=np.float32)
    if error is None:
        assert check_vectors(array, 3).shape == (2, 3)
    else:
        with pytest.raises(InvalidInputError, match=error):
            check_vectors(array, 3)
