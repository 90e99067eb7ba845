"""The words of a BM25 index file (:mod:`._bm25_file`), kept as arrays and looked up where they lie.

A complete file lists every word of the index: ~200k at 100k entries. Listed in the file's JSON
header, they were parsed and put in a dict at every open, 60-110 ms of a fresh process's first
search and most of what ``memstrata query`` did besides loading the model. Here they are four
arrays the file maps and checksums like its others:

* ``stem_text``: the words' UTF-8 bytes end to end, in the order of the file's postings;
* ``stem_ends``: where each word's bytes end;
* ``stem_order``: the words' numbers sorted by their bytes;
* ``stem_keys``: the first eight bytes of each word of ``stem_order``, zero-padded, as a
  big-endian number (non-decreasing, since byte order survives the cut and the padding).

A word is found by a binary search of the keys and a comparison of the bytes of the few words
that share its key (a few microseconds); opening the file reads none of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["STEM_ARRAYS", "StemTable", "stem_arrays"]

STEM_ARRAYS = ("stem_text", "stem_ends", "stem_order", "stem_keys")
_DTYPES = (np.dtype(np.uint8), np.dtype(np.int64), np.dtype(np.int64), np.dtype(np.uint64))
_KEY_BYTES = 8
_REMEMBERED = 1 << 14  # words looked up (found or not) remembered, then forgotten all at once


def _encoded(stem: str) -> bytes:
    return stem.encode("utf-8", "surrogatepass")


def _key(data: bytes) -> np.uint64:
    # a numpy scalar: searched with a Python int, numpy compares the keys as objects (100x slower)
    return np.uint64(int.from_bytes(data[:_KEY_BYTES].ljust(_KEY_BYTES, b"\0"), "big"))


def stem_arrays(stems: Sequence[str]) -> dict[str, npt.NDArray[Any]]:
    """The arrays of ``stems`` (numbered in this order) for an index file."""
    encoded = [_encoded(stem) for stem in stems]
    order = sorted(range(len(encoded)), key=encoded.__getitem__)  # one pass when sorted already
    keys = b"".join(encoded[number][:_KEY_BYTES].ljust(_KEY_BYTES, b"\0") for number in order)
    return {
        "stem_text": np.frombuffer(b"".join(encoded), dtype=np.uint8),
        "stem_ends": np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), dtype=np.int64),
        "stem_order": np.asarray(order, dtype=np.int64),
        "stem_keys": np.frombuffer(keys, dtype=">u8").astype(np.uint64),
    }


class StemTable:
    """Word -> its number in an index file, read from the file's arrays (empty: no file)."""

    __slots__ = ("_ends", "_keys", "_looked_up", "_order", "_text")

    def __init__(self) -> None:
        self._text = np.zeros(0, dtype=np.uint8)
        self._ends = self._order = np.zeros(0, dtype=np.int64)
        self._keys = np.zeros(0, dtype=np.uint64)
        self._looked_up: dict[str, int | None] = {}

    @classmethod
    def of(cls, arrays: Mapping[str, npt.NDArray[Any]]) -> StemTable | None:
        """The table of a file's arrays; ``None`` when they are missing or do not fit one another
        (checked in one pass over the small arrays: the bytes are compared when looked up)."""
        try:
            text, ends, order, keys = (arrays[name] for name in STEM_ARRAYS)
        except KeyError:
            return None
        n = len(ends)
        if (
            (text.dtype, ends.dtype, order.dtype, keys.dtype) != _DTYPES
            or (text.ndim, ends.ndim, order.ndim, keys.ndim) != (1, 1, 1, 1)
            or len(order) != n
            or len(keys) != n
            or (n == 0 and len(text) != 0)
            or (n and (int(ends[0]) < 0 or int(ends[-1]) != len(text) or bool(np.any(ends[1:] < ends[:-1]))))
            or (n and (int(order.min()) < 0 or int(order.max()) >= n))
            or bool(np.any(keys[1:] < keys[:-1]))
        ):
            return None
        table = cls()
        table._text, table._ends, table._order, table._keys = text, ends, order, keys
        return table

    def __len__(self) -> int:
        return len(self._ends)

    def __bool__(self) -> bool:
        return len(self._ends) > 0

    def __contains__(self, stem: object) -> bool:
        return isinstance(stem, str) and self.get(stem) is not None

    def _word(self, number: int) -> bytes:
        start = int(self._ends[number - 1]) if number else 0
        return self._text[start : int(self._ends[number])].tobytes()

    def get(self, stem: str) -> int | None:
        """``stem``'s number, or ``None`` when the file does not hold it."""
        if stem in self._looked_up:
            return self._looked_up[stem]
        number = self._search(_encoded(stem)) if len(self._ends) else None
        if len(self._looked_up) >= _REMEMBERED:
            self._looked_up.clear()
        self._looked_up[stem] = number
        return number

    def _search(self, data: bytes) -> int | None:
        key = _key(data)
        low, high = int(self._keys.searchsorted(key, "left")), int(self._keys.searchsorted(key, "right"))
        while low < high:  # the words sharing the key, in byte order
            middle = (low + high) // 2
            number = int(self._order[middle])
            word = self._word(number)
            if word < data:
                low = middle + 1
            elif word > data:
                high = middle
            else:
                return number
        return None

    def stems(self) -> list[str]:
        """Every word, by number; :class:`UnicodeDecodeError` when the text is not UTF-8."""
        text, ends = self._text.tobytes(), self._ends.tolist()
        starts = [0, *ends][:-1]
        return [text[a:b].decode("utf-8", "surrogatepass") for a, b in zip(starts, ends, strict=True)]
