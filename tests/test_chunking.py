"""Chunkers: exact line ranges, budgets, overlap, fences, Python structure, hostile text."""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memstrata.errors import InvalidInputError
from memstrata.layers._chunk import (
    Chunk,
    estimate_tokens,
    model_token_counter,
    normalize_newlines,
    split_lines,
)
from memstrata.layers._chunk_code import chunk_syntax
from memstrata.layers._chunk_file import chunk_file, language_for
from memstrata.layers._chunk_lines import chunk_code
from memstrata.layers._chunk_markdown import chunk_markdown
from memstrata.layers._chunk_python import chunk_python


def _syntax(suffix: str):
    """The syntax-tree chunker for one grammar, called like the other chunkers."""

    def chunk(text: str, *, tokens: int = 400, overlap: int = 80, count=None) -> list[Chunk]:
        chunks = chunk_syntax(text, suffix, tokens=tokens, overlap=overlap, count=count)
        assert chunks is not None, f"no grammar for {suffix}"
        return chunks

    chunk.__name__ = f"chunk_syntax{suffix.replace('.', '_')}"
    return chunk


chunk_syntax_py, chunk_syntax_rs, chunk_syntax_js = _syntax(".py"), _syntax(".rs"), _syntax(".js")
CHUNKERS = [chunk_markdown, chunk_code, chunk_python, chunk_syntax_py, chunk_syntax_rs, chunk_syntax_js]


def check_invariants(source: str, chunks: list[Chunk], budget: int) -> None:
    """What every chunker promises, whatever the input."""
    text = normalize_newlines(source)
    lines = split_lines(text)
    previous_start = -1
    for c in chunks:
        assert c.text == text[c.start_char : c.end_char]
        assert c.text.strip(), "whitespace-only chunk"
        assert c.start_line == text.count("\n", 0, c.start_char) + 1
        assert c.end_line == text.count("\n", 0, c.end_char - 1) + 1
        assert 1 <= c.start_line <= c.end_line <= len(lines)
        starts_line = c.start_char == 0 or text[c.start_char - 1] == "\n"
        ends_line = c.end_char == len(text) or text[c.end_char] == "\n"
        if starts_line and ends_line:
            assert c.text == "\n".join(lines[c.start_line - 1 : c.end_line])
        # only a line over the budget is ever cut inside
        if not starts_line:
            assert _over(lines[c.start_line - 1], budget)
        if not ends_line:
            assert _over(lines[c.end_line - 1], budget)
        assert estimate_tokens(c.text) <= budget + 1, (estimate_tokens(c.text), budget)
        assert c.start_char > previous_start, "chunks go forward"
        previous_start = c.start_char
    covered = [False] * len(text)
    for c in chunks:
        for i in range(c.start_char, c.end_char):
            covered[i] = True
    missing = [i for i, ch in enumerate(text) if not ch.isspace() and not covered[i]]
    assert not missing, f"characters not in any chunk: {text[missing[0] : missing[0] + 40]!r}"


def _over(line: str, budget: int) -> bool:
    return max(estimate_tokens(line + "\n"), len(line) // 8) > budget


# -- edge cases --------------------------------------------------------------------------------


@pytest.mark.parametrize("chunker", CHUNKERS)
@pytest.mark.parametrize("text", ["", "\n", "\n\n\n", "   \n\t\n  ", "\r\n\r\n"])
def test_empty_and_blank_text_gives_no_chunks(chunker, text):
    assert chunker(text) == []


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_single_line_without_newline(chunker):
    chunks = chunker("hello world")
    assert [(c.start_line, c.end_line, c.text) for c in chunks] == [(1, 1, "hello world")]


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_blank_lines_around_text_are_trimmed_with_exact_lines(chunker):
    chunks = chunker("\n\n\nalpha\nbeta\n\n\n")
    assert [(c.start_line, c.end_line, c.text) for c in chunks] == [(4, 5, "alpha\nbeta")]


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_crlf_and_cr_are_line_breaks(chunker):
    chunks = chunker("one\r\ntwo\rthree\r\n")
    assert [(c.start_line, c.end_line, c.text) for c in chunks] == [(1, 3, "one\ntwo\nthree")]


def test_markdown_cuts_at_headings_first():
    section = "para " * 60 + "end."
    text = f"# A\n\n{section}\n\n## B\n\n{section}\n\n## C\n\n{section}\n"
    chunks = chunk_markdown(text, tokens=100, overlap=20)
    check_invariants(text, chunks, 100)
    assert [c.text.splitlines()[0] for c in chunks] == ["# A", "## B", "## C"]
    # a cut at a heading needs no overlap: sections do not bleed into each other
    assert all(sum(line.startswith("#") for line in c.text.splitlines()) == 1 for c in chunks)


def test_small_sections_are_packed_together():
    text = "# Day\n\n## 09:00\n\nDeployed.\n\n## 10:00\n\nMeeting.\n"
    chunks = chunk_markdown(text)
    assert len(chunks) == 1 and chunks[0].start_line == 1 and chunks[0].end_line == 9


def test_long_section_is_cut_between_paragraphs_with_overlap():
    paragraphs = [f"Paragraph {i} " + "word " * 40 + "done." for i in range(12)]
    text = "# Notes\n\n" + "\n\n".join(paragraphs) + "\n"
    chunks = chunk_markdown(text, tokens=200, overlap=80)
    check_invariants(text, chunks, 200)
    assert len(chunks) > 2
    for a, b in itertools.pairwise(chunks):
        assert b.text.startswith("Paragraph"), "cut at a paragraph start"
        assert b.start_char < a.end_char, "consecutive chunks of one section overlap"
        shared = a.end_char - b.start_char
        assert estimate_tokens(text[b.start_char : a.end_char]) <= 80 and shared > 0


def test_list_items_are_preferred_cut_points_over_line_middles():
    items = "\n".join(f"- item {i} " + "x" * 60 for i in range(30))
    text = "Intro line\n" + items + "\n"
    chunks = chunk_markdown(text, tokens=100, overlap=0)
    check_invariants(text, chunks, 100)
    assert all(c.text.startswith(("- item", "Intro")) for c in chunks)


def test_fences_are_never_cut_when_they_fit():
    fence = "```python\n" + "\n".join(f"x{i} = {i}  # line" for i in range(25)) + "\n```"
    prose = "Some prose sentence here. " * 10
    text = f"# T\n\n{prose}\n\n{fence}\n\n{prose}\n\n{fence}\n\n{prose}\n"
    budget = estimate_tokens(fence) + 20
    chunks = chunk_markdown(text, tokens=budget, overlap=30)
    check_invariants(text, chunks, budget)
    starts = [i for i in range(len(text)) if text.startswith(fence, i)]
    assert len(starts) == 2
    for s in starts:
        e = s + len(fence)
        assert any(c.start_char <= s and e <= c.end_char for c in chunks), "fence kept whole"
        for c in chunks:
            assert not (s < c.start_char < e) and not (s < c.end_char < e), "no chunk edge inside a fence"


def test_oversized_fence_is_cut_at_line_boundaries():
    fence = "~~~\n" + "\n".join(f"line {i} with some code" for i in range(200)) + "\n~~~"
    chunks = chunk_markdown(fence, tokens=100, overlap=10)
    check_invariants(fence, chunks, 100)
    assert len(chunks) > 5


def test_unclosed_fence_runs_to_the_end():
    text = "intro\n\n```\ncode a\n\n# not a heading\ncode b\n"
    chunks = chunk_markdown(text, tokens=400)
    assert len(chunks) == 1 and chunks[0].end_line == 7
    # inside the fence "#" starts no section: with a budget that only fits the fence, the
    # chunk edge falls before the fence, never at the "# not a heading" line
    chunks = chunk_markdown("intro " * 20 + text, tokens=20, overlap=0)
    assert not any(c.text.startswith("# not") for c in chunks)
    assert any(c.text.startswith("```") and c.text.endswith("code b") for c in chunks)


def test_oversized_paragraph_is_cut_at_sentence_ends():
    sentences = [f"Sentence number {i} talks about something." for i in range(80)]
    text = " ".join(sentences)  # one paragraph on one line
    chunks = chunk_markdown(text, tokens=60, overlap=15)
    check_invariants(text, chunks, 60)
    assert len(chunks) > 5
    assert all(c.start_line == c.end_line == 1 for c in chunks)
    assert all(c.text.startswith("Sentence number") and c.text.endswith(".") for c in chunks)


def test_wrapped_paragraph_is_cut_after_a_line_ending_a_sentence():
    lines = []
    for i in range(40):
        lines.append(f"This is wrapped text line {i} of a long")
        lines.append(f"paragraph, and sentence {i} ends here.")
    text = "\n".join(lines)
    chunks = chunk_markdown(text, tokens=80, overlap=0)
    check_invariants(text, chunks, 80)
    assert all(c.text.startswith("This is wrapped") for c in chunks)


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_a_single_huge_line_is_split_safely(chunker):
    line = "".join(f"token{i}," for i in range(20_000))  # no spaces, no sentence ends: 150 KB
    chunks = chunker(line, tokens=100, overlap=20)
    check_invariants(line, chunks, 100)
    assert "".join(c.text for c in chunks) == line  # no overlap inside a line: pieces tile it
    spaced = "word " * 5000
    chunks = chunker(spaced, tokens=100, overlap=20)
    check_invariants(spaced, chunks, 100)


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_cjk_emoji_and_surrogates_never_break(chunker):
    text = "日本語のテキスト。" * 300 + "\n" + "🙂 emoji " * 200 + "\n\ud800 lone surrogate\n\x00nul\n"
    chunks = chunker(text, tokens=50, overlap=10)
    check_invariants(text, chunks, 50)


def test_bad_budget_arguments_are_rejected():
    with pytest.raises(InvalidInputError, match="tokens"):
        chunk_markdown("x", tokens=0)
    with pytest.raises(InvalidInputError, match="overlap"):
        chunk_markdown("x", tokens=100, overlap=100)


def test_token_counter_is_used_for_the_budget():
    calls = []

    def words(text: str) -> int:
        calls.append(text)
        return len(text.split())

    text = "\n".join("one two three four five" for _ in range(100))
    chunks = chunk_code(text, tokens=50, overlap=0, count=words)
    assert calls
    assert all(len(c.text.split()) <= 50 for c in chunks)
    assert len(chunks) == 10


def test_model_counter_counts_long_text_in_pieces():
    # a tokenizer that truncates at 256 tokens must not hide a long line's real size
    def truncating(text: str) -> int:
        return min(256, len(text))

    count = model_token_counter(truncating)
    assert count("a" * 1000) == 1000
    assert count("abc") == 3


# -- Python ------------------------------------------------------------------------------------


def _defs(tree: ast.Module) -> list[tuple[int, int]]:
    spans = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            spans.append((start, node.end_lineno or node.lineno))
    return spans


def test_python_definitions_with_decorators_stay_whole():
    source = textwrap.dedent(
        '''
        """Module docstring."""
        import os


        # helper used below
        @decorator(arg=1)
        @other
        def first(a, b):
            """Add."""
            return a + b


        class Thing:
            """A thing."""

            def method(self):
                return os.getcwd()


        async def third():
            await something()
        '''
    )
    chunks = chunk_python(source, tokens=40, overlap=10)
    check_invariants(source, chunks, 40)
    lines = split_lines(source)
    for start, end in _defs(ast.parse(source)):
        if estimate_tokens("\n".join(lines[start - 1 : end])) <= 40:
            assert any(c.start_line <= start and end <= c.end_line for c in chunks), (start, end)
    decorated = next(c for c in chunks if "def first" in c.text)
    assert "# helper used below\n@decorator(arg=1)\n@other\ndef first" in decorated.text


def test_large_python_function_is_cut_at_statement_boundaries():
    body = "\n".join(f"    value_{i} = compute({i}, 'text', other={i})" for i in range(120))
    source = f"def big():\n{body}\n    return value_0\n"
    chunks = chunk_python(source, tokens=100, overlap=20)
    check_invariants(source, chunks, 100)
    assert len(chunks) > 3
    assert chunks[0].text.startswith("def big():")
    for c in chunks:
        for line in c.text.splitlines():
            assert line.startswith(("def big", "    value_", "    return"))


def test_multiline_statements_are_not_cut_when_they_fit():
    call = "    result = call(\n" + "\n".join(f"        arg{i}," for i in range(8)) + "\n    )"
    source = "def f():\n" + "\n".join([call] * 10) + "\n"
    chunks = chunk_python(source, tokens=80, overlap=0)
    check_invariants(source, chunks, 80)
    for c in chunks[1:]:
        assert c.text.startswith("    result = call("), c.text[:40]


def test_unparsable_python_falls_back_to_line_chunking():
    source = "def broken(:\n    pass\n" + "x = 1\n" * 50
    chunks = chunk_python(source, tokens=50, overlap=0)
    check_invariants(source, chunks, 50)
    assert chunks


@pytest.mark.parametrize("chunker", [chunk_python, chunk_syntax_py])
def test_python_chunker_on_real_modules(chunker):
    import json.decoder
    import textwrap as module

    for mod in (module, json.decoder):
        source = Path(inspect.getfile(mod)).read_text(encoding="utf-8")
        chunks = chunker(source)
        check_invariants(source, chunks, 400)
        lines = split_lines(source)
        for start, end in _defs(ast.parse(source)):
            if estimate_tokens("\n".join(lines[start - 1 : end])) <= 350:
                assert any(c.start_line <= start and end <= c.end_line for c in chunks)


def test_dispatch_by_extension():
    assert language_for("a/b.py") == "python"
    assert language_for("x.TSX") == "typescript"
    assert language_for("README.md") == "markdown"
    assert language_for("Makefile") == "text"
    language, chunks = chunk_file("notes.md", "# T\n\ntext\n")
    assert language == "markdown" and chunks
    assert language_for("src/vec.cxx") == "cpp" and language_for("a.mts") == "typescript"


def test_chunk_file_uses_the_syntax_tree_for_code_and_lines_otherwise():
    source = "def f(x):\n    return x\n\n\nclass A:\n    pass\n"
    language, chunks = chunk_file("pkg/m.py", source, tokens=12, overlap=0)
    assert language == "python"
    assert chunks == chunk_syntax(source, ".py", tokens=12, overlap=0)
    assert [c.symbol for c in chunks] == ["f", "A"]
    language, chunks = chunk_file("notes.txt", "# Title\n\nSome text.\n")
    assert language == "text" and chunks == chunk_markdown("# Title\n\nSome text.\n")
    language, chunks = chunk_file("conf.ini", "[a]\nx = 1\n")
    assert language == "ini" and chunks == chunk_code("[a]\nx = 1\n") and chunks[0].symbol == ""


# -- properties --------------------------------------------------------------------------------

_LINE = st.one_of(
    st.just(""),
    st.just("   "),
    st.sampled_from(["# Heading", "## Sub heading", "###### deep", "Title", "=====", "-----", "***"]),
    st.sampled_from(["```", "```python", "~~~", "- item", "1. first", "> quote", "    indented code"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=60),
    st.builds(lambda n: "word " * n + "end.", st.integers(0, 400)),
    st.builds(lambda n: "x" * n, st.integers(0, 3000)),
    st.sampled_from(
        ["def f(x):", "    return x", "class A:", "    pass", "@dec", "}", "if (a) {", "日本語。"]
    ),
)

_SOURCE = st.lists(_LINE, max_size=60).map("\n".join) | st.text(max_size=400)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=_SOURCE, budget=st.integers(8, 300), overlap_share=st.floats(0, 0.9))
def test_invariants_hold_for_any_text(source, budget, overlap_share):
    overlap = min(budget - 1, int(budget * overlap_share))
    text = normalize_newlines(source)
    min_fill = budget // 4
    repeat = 1 + min(overlap, budget - min_fill) / min_fill  # overlap never makes chunks crawl
    for chunker in CHUNKERS:
        chunks = chunker(source, tokens=budget, overlap=overlap)
        check_invariants(source, chunks, budget)
        embedded = sum(estimate_tokens(c.text) for c in chunks)
        assert embedded <= repeat * (estimate_tokens(text) + text.count("\n")) + budget + len(chunks)


@settings(max_examples=60, deadline=None)
@given(
    functions=st.lists(
        st.tuples(st.integers(0, 40), st.booleans()),
        min_size=1,
        max_size=12,
    ),
    budget=st.integers(30, 200),
    chunker=st.sampled_from([chunk_python, chunk_syntax_py]),
)
def test_python_invariants_and_whole_definitions(functions, budget, chunker):
    parts = []
    for n, (size, decorated) in enumerate(functions):
        body = "\n".join(f"    v{i} = {i} * {n}" for i in range(size)) or "    pass"
        parts.append(("@decorator\n" if decorated else "") + f"def fn_{n}(arg):\n{body}\n")
    source = "import os\n\n\n" + "\n\n".join(parts)
    chunks = chunker(source, tokens=budget, overlap=budget // 5)
    check_invariants(source, chunks, budget)
    lines = split_lines(source)
    for start, end in _defs(ast.parse(source)):
        if (
            sum(max(1, estimate_tokens(line + "\n"), len(line) // 8) for line in lines[start - 1 : end])
            <= budget
        ):
            assert any(c.start_line <= start and end <= c.end_line for c in chunks)
