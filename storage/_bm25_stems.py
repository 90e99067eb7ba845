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
_KEYS_BLOCK = 1 << 15  # words whose keys are gathered at once


def _encoded(stem: str) -> bytes:
    return stem.encode("utf-8", "surrogatepass")


def _key(data: bytes) -> np.uint64:
    # a numpy scalar: searched with a Python int, numpy compares the keys as objects (100x slower)
    return np.uint64(int.from_bytes(data[:_KEY_BYTES].ljust(_KEY_BYTES, b"\0"), "big"))


def stem_arrays(stems: Sequence[str]) -> dict[str, npt.NDArray[Any]]:
    """The arrays of ``stems`` (numbered in this order) for an index file."""
    n = len(stems)
    data = "".join(stems).encode("utf-8", "surrogatepass")
    sizes = np.fromiter(map(len, stems), np.int64, n)  # in bytes when each character is one byte
    if len(data) != int(sizes.sum()):
        sizes = np.fromiter((len(_encoded(stem)) for stem in stems), np.int64, n)
    ends = np.cumsum(sizes, dtype=np.int64)
    text = np.frombuffer(data, dtype=np.uint8)
    # code point order is UTF-8's byte order (also for the surrogates surrogatepass lets through)
    order = np.fromiter(sorted(range(n), key=stems.__getitem__), np.int64, n)  # one pass if sorted
    return {
        "stem_text": text,
        "stem_ends": ends,
        "stem_order": order,
        "stem_keys": _keys(text, (ends - sizes)[order], sizes[order]),
    }


def _keys(
    text: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
) -> npt.NDArray[np.uint64]:
    """The first eight bytes of the words at ``starts`` (``sizes`` bytes long), zero-padded, as
    big-endian numbers; a block of words at a time (the gather's temporaries: ~3 MB a block)."""
    padded = np.concatenate([text, np.zeros(_KEY_BYTES, dtype=np.uint8)])
    column = np.arange(_KEY_BYTES)
    keys = np.empty(len(starts), dtype=np.uint64)
    for at in range(0, len(starts), _KEYS_BLOCK):
        block = slice(at, at + _KEYS_BLOCK)
        window = padded[starts[block, None] + column]
        window[column >= sizes[block, None]] = 0
        keys[block] = window.view(">u8").ravel()
    return keys


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
        data, ends = self._text.tobytes(), self._ends.tolist()
        starts = [0, *ends][:-1]
        if data.isascii():  # a byte a character: slices of one decoded text
            text = data.decode("ascii")
            return [text[a:b] for a, b in zip(starts, ends, strict=True)]
        return [data[a:b].decode("utf-8", "surrogatepass") for a, b in zip(starts, ends, strict=True)]
