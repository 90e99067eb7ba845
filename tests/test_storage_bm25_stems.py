"""The words of a BM25 index file as arrays: every word is found at its number, no other word is,
whatever their scripts, lengths and shared prefixes, and the arrays round-trip through a file."""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstrata.storage import _index_files
from memstrata.storage._bm25_stems import STEM_ARRAYS, StemTable, stem_arrays

# words sharing their first eight bytes (and more) share a key: told apart by their bytes
_PREFIXED = st.builds(lambda tail: "internationali" + tail, st.text(max_size=6))
_ASCII = st.text(alphabet=string.ascii_lowercase + string.digits + "_", max_size=12)
_WORDS = st.one_of(  # ASCII words alone take a shorter path
    st.lists(st.one_of(st.text(max_size=20), _PREFIXED), unique=True, max_size=200),
    st.lists(st.one_of(_ASCII, _PREFIXED.filter(str.isascii)), unique=True, max_size=200),
)


def _table(stems: list[str]) -> StemTable:
    table = StemTable.of(stem_arrays(stems))
    assert table is not None
    return table


@settings(max_examples=150, deadline=None)
@given(_WORDS, st.lists(st.one_of(st.text(max_size=20), _PREFIXED), max_size=30))
def test_every_word_is_found_at_its_number_and_no_other(stems: list[str], others: list[str]) -> None:
    table = _table(stems)
    assert len(table) == len(stems) and bool(table) == bool(stems)
    assert [table.get(stem) for stem in stems] == list(range(len(stems)))
    for other in others:
        assert table.get(other) == (stems.index(other) if other in stems else None)
        assert (other in table) == (other in stems)
    assert table.stems() == stems


def test_the_words_round_trip_through_an_index_file(tmp_path: Path) -> None:
    stems = ["queue", "", "ünïcode", "日本語", "a\x00b", "internationalization", "internationalize"]
    stems.append("\U0001f600")
    path = tmp_path / "words"
    assert _index_files.write_index(path, {}, stem_arrays(stems))
    found = _index_files.read_index(path)
    assert found is not None
    table = StemTable.of(found.arrays)
    assert table is not None
    assert [table.get(stem) for stem in stems] == list(range(len(stems)))
    assert table.get("internationaliz") is None and table.stems() == stems


def test_an_empty_table_holds_nothing() -> None:
    for table in (StemTable(), _table([])):
        assert not table and len(table) == 0 and table.get("queue") is None and table.stems() == []


@pytest.mark.parametrize(
    "change",
    [
        "missing",
        "dtype",
        "keys out of order",
        "ends past the text",
        "ends falling",
        "order out of range",
        "short",
    ],
)
def test_arrays_that_do_not_fit_give_no_table(change: str) -> None:
    arrays = {name: np.array(a) for name, a in stem_arrays(["alpha", "beta", "gamma"]).items()}
    if change == "missing":
        del arrays[STEM_ARRAYS[0]]
    elif change == "dtype":
        arrays["stem_ends"] = arrays["stem_ends"].astype(np.int32)
    elif change == "keys out of order":
        arrays["stem_keys"] = arrays["stem_keys"][::-1].copy()
    elif change == "ends past the text":
        arrays["stem_ends"][-1] += 1
    elif change == "ends falling":
        arrays["stem_ends"][0] = arrays["stem_ends"][1] + 1
    elif change == "order out of range":
        arrays["stem_order"][1] = 3
    else:
        arrays["stem_keys"] = arrays["stem_keys"][:2]
    assert StemTable.of(arrays) is None


def test_words_looked_up_are_remembered_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from memstrata.storage import _bm25_stems

    monkeypatch.setattr(_bm25_stems, "_REMEMBERED", 4)
    table = _table(["alpha", "beta"])
    for n in range(10):
        assert table.get(f"missing{n}") is None and len(table._looked_up) <= 4
    assert table.get("beta") == 1 and table._looked_up["beta"] == 1


def test_keys_gathered_in_blocks_equal_the_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    from memstrata.storage import _bm25_stems

    stems = [f"word{n:02d}" + "é" * (n % 3) for n in range(20)] + ["", "a", "internationalization"]
    whole = stem_arrays(stems)["stem_keys"]
    monkeypatch.setattr(_bm25_stems, "_KEYS_BLOCK", 3)
    assert stem_arrays(stems)["stem_keys"].tolist() == whole.tolist()
    assert [_table(stems).get(stem) for stem in stems] == list(range(len(stems)))
