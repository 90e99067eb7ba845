"""The checksum of index-file arrays: every single flipped bit and swapped word changes it; a
file written with the earlier CRC32 entries is still verified."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from memstrata.storage._index_files import DamagedFile, checksum, read_index, write_index


def test_every_flipped_bit_and_swapped_word_changes_the_checksum() -> None:
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, 203, dtype=np.uint8)  # not a multiple of 8 bytes: a padded tail
    base = checksum(data)
    assert base == checksum(data.copy())
    for byte in range(len(data)):
        for bit in range(8):
            flipped = data.copy()
            flipped[byte] ^= np.uint8(1 << bit)
            assert checksum(flipped) != base, (byte, bit)
    words = rng.integers(0, 2**63, 64, dtype=np.int64)
    swapped = words.copy()
    swapped[[3, 40]] = swapped[[40, 3]]
    assert checksum(swapped) != checksum(words)
    assert checksum(np.zeros(0, dtype=np.int64)) == 0
    big = rng.integers(0, 2**63, (1 << 20) + 5, dtype=np.int64)  # more than one block of words
    moved = big.copy()
    moved[-1] ^= 1 << 62
    assert checksum(moved) != checksum(big)


def test_a_file_with_crc32_entries_is_still_verified(tmp_path: Path) -> None:
    path = tmp_path / "f"
    arrays = {"a": np.arange(1000, dtype=np.int64), "b": np.ones(10, dtype=np.bool_)}
    assert write_index(path, {"kind": "x"}, arrays)
    raw = path.read_bytes()
    prefix = struct.Struct("<16sQI4x")
    magic, length, _ = prefix.unpack(raw[: prefix.size])
    header = json.loads(raw[prefix.size : prefix.size + length])
    for entry in header["arrays"]:  # as the earlier writer described them
        entry["crc"] = zlib.crc32(np.ascontiguousarray(arrays[entry["name"]]).data.cast("B"))
        del entry["sum64"]
    text = json.dumps(header, separators=(",", ":")).encode()
    start = (prefix.size + length + 63) // 64 * 64
    new_start = (prefix.size + len(text) + 63) // 64 * 64
    body = raw[start:]
    rewritten = prefix.pack(magic, len(text), zlib.crc32(text)) + text
    path.write_bytes(rewritten + b"\0" * (new_start - len(rewritten)) + body)
    found = read_index(path)
    assert found is not None and np.array_equal(found.arrays["a"], arrays["a"])
    del found
    damaged = bytearray(path.read_bytes())
    damaged[new_start + 8] ^= 1  # a bit of a[1]
    path.write_bytes(bytes(damaged))
    with pytest.raises(DamagedFile, match="checksum"):
        read_index(path)


@pytest.mark.parametrize("n_bytes", [0, 1, 7, 8, 9, 8 * 1023, 8 * 1024, 8 * 1025 + 3, 8 * 5000 + 5])
def test_the_checksum_is_the_weighted_sum_of_words_it_is_defined_as(n_bytes: int) -> None:
    """Sums by rows and columns give the sum of word ``i`` times ``2i + 1``, modulo 2**64, as the
    files already written hold it (checked against Python's integers, which do not wrap)."""
    rng = np.random.default_rng(n_bytes)
    data = rng.integers(0, 256, n_bytes, dtype=np.uint8)
    padded = data.tobytes() + b"\0" * (-n_bytes % 8)
    words = [int.from_bytes(padded[i : i + 8], "little") for i in range(0, len(padded), 8)]
    assert checksum(data) == sum((2 * i + 1) * w for i, w in enumerate(words)) % 2**64
    top = np.full(n_bytes // 8, 2**64 - 1, dtype=np.uint64)  # every sum overflows
    assert checksum(top) == sum((2 * i + 1) * (2**64 - 1) for i in range(len(top))) % 2**64
