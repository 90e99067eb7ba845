"""A note saved as UTF-16 or UTF-32 (NUL bytes, like a binary file) is skipped saying what it is."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from memstrata import Codebase, Config
from memstrata.errors import InvalidInputError
from tests.fakes import FakeEmbedder


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    then = time.time_ns() - 3600 * 10**9
    os.utime(path, ns=(then, then))


def test_utf16_and_utf32_text_is_named_and_binary_stays_binary(tmp_path: Path) -> None:
    root = tmp_path / "src"
    write(root / "windows.md", "# Notes\n\nsaved by Notepad\n".encode("utf-16"))  # with its BOM
    write(root / "big_endian.md", b"\xfe\xff" + "# Notes\n".encode("utf-16-be"))
    write(root / "wide.md", "# Notes\n".encode("utf-32"))
    write(root / "image.json", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    write(root / "bom.md", "\ufeff# UTF-8 with a BOM\n".encode())
    with Codebase.open(root, config=Config(data_dir=tmp_path / "data"), embedder=FakeEmbedder()) as index:
        skipped = dict(index.sync().skipped)
        assert skipped == {
            "windows.md": "not UTF-8 text (UTF-16, by its byte-order mark)",
            "big_endian.md": "not UTF-8 text (UTF-16, by its byte-order mark)",
            "wide.md": "not UTF-8 text (UTF-32, by its byte-order mark)",
            "image.json": "binary (NUL byte in the first 8 KB)",
        }
        with pytest.raises(InvalidInputError, match="UTF-16"):
            index.get("windows.md")
        assert index.get("bom.md") == "# UTF-8 with a BOM"
