"""Syntax-tree chunking of source code: boundaries, line ranges, symbols and search text."""

from __future__ import annotations

from pathlib import Path

import pytest

from memstrata.layers._chunk import Chunk, split_lines
from memstrata.layers._chunk_code import chunk_syntax, embedding_text, keyword_words, split_identifier
from memstrata.layers._chunk_file import chunk_embedding_text, chunk_file, chunk_keyword_text
from memstrata.layers._chunk_lines import chunk_code

# One real snippet per language: (path, source, first lines of its top-level definitions)
SNIPPETS: dict[str, tuple[str, str, list[int]]] = {}

SNIPPETS["python"] = (
    "pkg/http.py",
    """\
import os


# Parses one header line.
@cache
def parse_header(line):
    name, _, value = line.partition(':')
    return name.strip(), value.strip()


class Client:
    def __init__(self, base):
        self.base = base

    def get(self, path):
        return self.base + path
""",
    [4, 11],
)

SNIPPETS["rust"] = (
    "src/conn.rs",
    """\
use std::fmt;

/// A connection.
#[derive(Debug)]
pub struct Conn {
    addr: String,
}

impl Conn {
    pub fn open(addr: &str) -> Self {
        Conn { addr: addr.to_string() }
    }
}

fn parse_http_header(line: &str) -> Option<(&str, &str)> {
    line.split_once(':')
}
""",
    [3, 9, 15],
)

SNIPPETS["typescript"] = (
    "web/client.ts",
    """\
import { x } from "./x";

export interface Options {
  timeout: number;
}

/** Fetches with retries. */
export async function fetchWithRetry(url: string): Promise<string> {
  return url;
}

export class Client {
  get(path: string): string {
    return path;
  }
}
""",
    [3, 7, 12],
)

SNIPPETS["tsx"] = (
    "web/view.tsx",
    """\
import React from 'react';

export function Hello(props: { name: string }) {
  return <div>Hello {props.name}</div>;
}

export const Bye = () => {
  return <p>bye</p>;
};
""",
    [3, 7],
)

SNIPPETS["javascript"] = (
    "lib/chunk.js",
    """\
const slice = require('./slice');

/**
 * Splits an array into groups.
 */
function chunk(array, size) {
  return slice(array, 0, size);
}

class Queue {
  push(item) {
    this.items.push(item);
  }
}

module.exports = chunk;
""",
    [3, 10],
)

SNIPPETS["go"] = (
    "server/server.go",
    """\
package server

import "fmt"

// Server serves requests.
type Server struct {
\tAddr string
}

// Start starts the server.
func (s *Server) Start() error {
\tfmt.Println(s.Addr)
\treturn nil
}

func NewServer(addr string) *Server {
\treturn &Server{Addr: addr}
}
""",
    [5, 10, 16],
)

SNIPPETS["java"] = (
    "src/Cache.java",
    """\
package demo;

import java.util.Map;

/** A small cache. */
public class Cache {
    private Map<String, String> items;

    @Override
    public String toString() {
        return items.toString();
    }
}

interface Store {
    String get(String key);
}
""",
    [5, 15],
)

SNIPPETS["csharp"] = (
    "src/Greeter.cs",
    """\
using System;

namespace Demo
{
    /// <summary>Greets.</summary>
    public class Greeter
    {
        public string Greet(string name)
        {
            return $"Hi {name}";
        }
    }
}
""",
    [5],
)

SNIPPETS["c"] = (
    "src/buf.c",
    """\
#include <stdlib.h>

/* A growable buffer. */
struct buf {
    char *data;
    size_t len;
};

int buf_grow(struct buf *b, size_t n) {
    b->len += n;
    return 0;
}
""",
    [3, 9],
)

SNIPPETS["cpp"] = (
    "src/vec.cpp",
    """\
#include <vector>

namespace geo {

class Vec {
 public:
  double norm() const { return 0.0; }
};

}  // namespace geo

double dot(const geo::Vec& a, const geo::Vec& b) {
  return 0.0;
}
""",
    [3, 12],
)


def _check_exact(text: str, chunks: list[Chunk]) -> None:
    lines = split_lines(text)
    for c in chunks:
        assert c.text == "\n".join(lines[c.start_line - 1 : c.end_line])
        assert text[c.start_char : c.end_char] == c.text


@pytest.mark.parametrize("language", sorted(SNIPPETS))
def test_chunks_start_only_at_definitions_at_a_small_budget(language: str) -> None:
    """Small neighbours may share a chunk, but every cut falls before a definition (with its
    comments and attributes), never inside one that fits."""
    path, text, starts = SNIPPETS[language]
    budget = 64 if language in ("csharp", "java") else 40  # their classes fit whole
    _, chunks = chunk_file(path, text, tokens=budget, overlap=0)
    _check_exact(text, chunks)
    assert len(chunks) >= 2 or language == "csharp"  # one namespace: one chunk
    first = next(n for n, line in enumerate(split_lines(text), 1) if line.strip())
    for c in chunks:
        assert c.start_line in {first, *starts}, (language, [(c.start_line, c.end_line) for c in chunks])


@pytest.mark.parametrize("language", sorted(SNIPPETS))
def test_whole_file_is_one_chunk_when_it_fits(language: str) -> None:
    path, text, _ = SNIPPETS[language]
    _, chunks = chunk_file(path, text, tokens=400, overlap=80)
    assert len(chunks) == 1
    first = next(n for n, line in enumerate(split_lines(text), 1) if line.strip())
    assert chunks[0].start_line == first and chunks[0].end_line == len(split_lines(text))


def test_definition_that_fits_is_never_cut() -> None:
    text = "".join(
        f"fn f{n}(x: u32) -> u32 {{\n    let y = x + {n};\n    let z = y * 2;\n    z - 1\n}}\n\n"
        for n in range(30)
    )
    chunks = chunk_syntax(text, ".rs", tokens=60, overlap=10)
    assert chunks is not None and len(chunks) > 3
    _check_exact(text, chunks)
    for c in chunks:
        assert c.text.startswith("fn f") and c.text.endswith("}"), c.text


def test_small_neighbours_are_merged_up_to_the_budget() -> None:
    text = "".join(f"def f{n}():\n    return {n}\n\n\n" for n in range(20))
    chunks = chunk_syntax(text, ".py", tokens=60, overlap=0)
    assert chunks is not None and 2 <= len(chunks) < 20
    assert all(c.text.startswith("def f") for c in chunks)


def test_oversized_definition_is_split_between_statements_with_its_signature() -> None:
    body = "".join(f"        total = total + compute_value({n}, factor)\n" for n in range(60))
    text = f"class Engine:\n    def run(self, factor):\n        total = 0\n{body}        return total\n"
    chunks = chunk_syntax(text, ".py", tokens=120, overlap=0)
    assert chunks is not None and len(chunks) >= 3
    _check_exact(text, chunks)
    assert chunks[0].start_line == 1
    for c in chunks[1:]:
        assert c.text.lstrip().startswith(("total", "return")), c.text[:40]
        assert c.symbol == "Engine.run"
        assert c.signature == "class Engine:\n    def run(self, factor):"


def test_methods_split_out_of_a_large_class_keep_the_class_signature() -> None:
    methods = "".join(
        f"  method{n}(a, b) {{\n    const x = a + b + {n};\n    const y = x * {n};\n    return x - y;\n  }}\n"
        for n in range(12)
    )
    text = f"export class Store extends Base {{\n{methods}}}\n"
    chunks = chunk_syntax(text, ".js", tokens=80, overlap=0)
    assert chunks is not None and len(chunks) >= 3
    _check_exact(text, chunks)
    later = chunks[1:]
    assert all(c.signature == "export class Store extends Base {" for c in later)
    assert all(c.text.lstrip().startswith("method") for c in later)
    assert later[0].symbol.startswith("Store.method")


def test_leading_comments_and_attributes_stay_with_their_item() -> None:
    _, text, _ = SNIPPETS["rust"]
    chunks = chunk_syntax(text, ".rs", tokens=24, overlap=0)
    assert chunks is not None
    conn = next(c for c in chunks if "pub struct Conn" in c.text)
    assert conn.text.startswith("/// A connection.\n#[derive(Debug)]")
    assert conn.symbol == "Conn"


def test_unknown_extension_falls_back_to_lines() -> None:
    text = "proc main {} {\n  puts hello\n}\n" * 40
    assert chunk_syntax(text, ".tcl", tokens=40, overlap=8) is None
    language, chunks = chunk_file("run.tcl", text, tokens=40, overlap=8)
    assert language == "tcl"
    assert chunks == chunk_code(text, tokens=40, overlap=8)


def test_broken_source_still_chunks_exactly() -> None:
    text = "fn broken( {\n    let x = ;\n}\n\nfn fine() -> u8 {\n    1\n}\n"
    chunks = chunk_syntax(text, ".rs", tokens=400, overlap=0)
    assert chunks is not None and chunks
    _check_exact(text, chunks)
    assert chunks[0].start_line == 1 and chunks[-1].end_line == 7


def test_a_zero_width_error_node_past_the_last_line_is_passed_over() -> None:
    """An unclosed class, stray lines and a continued #define at the end of the file: tree-sitter
    ends the tree with a zero-width ERROR node one row past the last line."""
    body = "".join(f"    int value_{i} = compute({i}, {i + 1});\n" for i in range(80))
    text = (
        "*/\npublic class X {\n" + body + "\x0b\n    return x\nclass A:\n    return x\n    return x\n \n"
        "package main\n#define X(a) \\\n]\npackage main\n{\n|a|b|\n\x0c\n@deco\n@deco\né\n|a|b|\n"
        "#define X(a) \\\n"
    )
    chunks = chunk_syntax(text, ".cpp", tokens=400, overlap=80)
    assert chunks is not None and chunks
    _check_exact(text, chunks)
    assert chunks[-1].end_line == len(split_lines(text))


def test_crlf_and_empty_input() -> None:
    assert chunk_syntax("", ".go", tokens=50, overlap=0) == []
    text = "package a\r\n\r\nfunc F() int {\r\n\treturn 1\r\n}\r\n"
    chunks = chunk_syntax(text, ".go", tokens=50, overlap=0)
    assert chunks is not None and chunks[-1].end_line == 5


@pytest.mark.parametrize(
    ("identifier", "words"),
    [
        ("parseHttpHeader", ["parse", "http", "header"]),
        ("parseHTTPHeader2", ["parse", "http", "header", "2"]),
        ("snake_case_name", ["snake", "case", "name"]),
        ("path::to::fn_name", ["path", "to", "fn", "name"]),
        ("XMLParser", ["xml", "parser"]),
    ],
)
def test_identifiers_split_into_words(identifier: str, words: list[str]) -> None:
    assert split_identifier(identifier) == words


def test_keyword_text_holds_split_identifiers_and_the_symbol() -> None:
    words = keyword_words("let h = parseHttpHeader(raw_line); crate::net::open_socket()", "Conn.sendAll")
    assert words.split() == ["conn", "send", "all", "parse", "http", "header"]
    # snake_case and paths are cut by the full-text tokenizer itself, so they are not repeated
    chunk = Chunk(1, 1, "fetchUserName()", 0, 15, symbol="api::load_user")
    assert chunk_keyword_text("rust", chunk).split() == ["api", "load", "user", "fetch", "name"]


def test_embedded_text_is_path_signature_then_body() -> None:
    chunk = Chunk(5, 6, "    return x", 10, 22, symbol="A.f", signature="class A:\n    def f(self):")
    # the path and the symbol as words, then the signature, then the text
    assert embedding_text("pkg/a.py", chunk) == "pkg a f\nclass A:\n    def f(self):\n    return x"
    assert chunk_embedding_text("pkg/a.py", "python", chunk) == embedding_text("pkg/a.py", chunk)
    plain = Chunk(1, 1, "def g(): pass", 0, 13, symbol="g")
    assert chunk_embedding_text("pkg/a.py", "python", plain) == "pkg a g\ndef g(): pass"
    assert chunk_embedding_text("notes.md", "markdown", plain) == "def g(): pass"


def test_a_new_chunker_version_rechunks_on_the_next_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memstrata import Codebase, Config
    from memstrata.layers import _index_db
    from tests.fakes import FakeEmbedder

    root = tmp_path / "repo"
    root.mkdir()
    (root / "conn.rs").write_text(SNIPPETS["rust"][1])
    (root / "http.py").write_text(SNIPPETS["python"][1])
    config = Config(data_dir=tmp_path / "data")
    with Codebase.open(root, embedder=FakeEmbedder(), config=config) as cb:
        first = cb.sync()
        assert first.files_processed == 2
        assert cb.sync().files_unchanged == 2
        words = dict(cb.store.db.query("SELECT path, words FROM chunks"))
        assert words["conn.rs"].split()[0] == "conn" and "http" in words["http.py"].split()
    monkeypatch.setattr(_index_db, "CHUNKER_VERSION", _index_db.CHUNKER_VERSION + 1)
    with Codebase.open(root, embedder=FakeEmbedder(), config=config) as cb:
        again = cb.sync()
        assert again.files_processed == 2 and again.chunks_purged == first.chunks_indexed
