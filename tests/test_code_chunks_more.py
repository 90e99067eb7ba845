"""Syntax-tree chunking beyond source code: GDScript, Markdown, JSON, TOML and YAML, with the
real grammar wheels (no fakes): what stays whole, where oversize nodes are cut, and the text
embedded and indexed for each chunk."""

from __future__ import annotations

import json

import pytest

from memstrata.config import FilesConfig
from memstrata.layers._chunk import Chunk, estimate_tokens, split_lines
from memstrata.layers._chunk_code import chunk_syntax, grammar_for
from memstrata.layers._chunk_file import chunk_embedding_text, chunk_file, chunk_keyword_text
from memstrata.layers._chunk_grammars import GRAMMARS
from memstrata.layers._chunk_markdown import chunk_markdown


def _check_exact(text: str, chunks: list[Chunk], budget: int) -> None:
    """Chunks are the file's own lines, in order, each within the budget."""
    lines = split_lines(text)
    assert chunks
    for c in chunks:
        assert c.text == "\n".join(lines[c.start_line - 1 : c.end_line])
        assert text[c.start_char : c.end_char] == c.text
        assert sum(max(1, estimate_tokens(line + "\n")) for line in c.text.split("\n")) <= budget
    assert [c.start_line for c in chunks] == sorted(c.start_line for c in chunks)
    covered = {n for c in chunks for n in range(c.start_line, c.end_line + 1)}
    assert {n for n, line in enumerate(lines, 1) if line.strip()} <= covered  # nothing lost


@pytest.mark.parametrize("suffix", [".gd", ".md", ".markdown", ".json", ".toml", ".yaml", ".yml"])
def test_every_listed_grammar_loads_from_its_wheel(suffix: str) -> None:
    assert grammar_for(suffix) is not None


def test_default_code_extensions_cover_the_chunked_languages() -> None:
    defaults = set(FilesConfig().code_extensions)
    assert {".c", ".h", ".cpp", ".hpp", ".cc", ".mjs", ".cjs", ".mts", ".gd"} <= defaults
    assert set(GRAMMARS) - defaults == set()  # every extension a grammar chunks is read by default


# -- GDScript ----------------------------------------------------------------------------------

GDSCRIPT = """\
extends CharacterBody2D
class_name Player

signal died(reason)

## Moves the player.
@rpc
func move(delta: float) -> void:
\tvar step := speed * delta
\tposition.x += step
\tposition.y += step

func jump() -> void:
\tvelocity.y = -jump_speed
\tis_on_floor = false

class Inventory extends Resource:
\tvar items := []
\tfunc add(item) -> void:
\t\titems.append(item)
\t\temit_changed()
\tfunc remove(item) -> void:
\t\titems.erase(item)
\t\temit_changed()
\tfunc count() -> int:
\t\treturn items.size()
"""


def test_gdscript_functions_stay_whole_with_their_doc_comment_and_annotation() -> None:
    language, chunks = chunk_file("scenes/player.gd", GDSCRIPT, tokens=40, overlap=0)
    assert language == "gdscript"
    _check_exact(GDSCRIPT, chunks, 40)
    move = next(c for c in chunks if "func move" in c.text)
    assert move.text.startswith("## Moves the player.\n@rpc\nfunc move") and move.symbol == "move"
    assert "position.y += step" in move.text
    jump = next(c for c in chunks if "func jump" in c.text)
    assert "is_on_floor = false" in jump.text
    for c in chunks:  # every cut falls before a definition (or its doc comment)
        assert c.text.lstrip().startswith(("extends", "## Moves", "func ", "class ")), c.text


def test_gdscript_oversize_class_is_split_between_its_methods_with_the_class_signature() -> None:
    _, chunks = chunk_file("scenes/player.gd", GDSCRIPT, tokens=20, overlap=0)
    _check_exact(GDSCRIPT, chunks, 20)
    inner = [c for c in chunks if c.start_line > 18]
    assert len(inner) >= 2
    for c in inner:
        assert c.text.lstrip().startswith(("func add", "func remove", "func count")), c.text
        assert c.signature == "class Inventory extends Resource:"
        assert c.symbol.startswith("Inventory.")
    text = chunk_embedding_text("scenes/player.gd", "gdscript", inner[0])
    assert text.startswith("scenes player inventory ")  # path and symbol as words
    assert "\nclass Inventory extends Resource:\n\tfunc " in text


# -- Markdown ----------------------------------------------------------------------------------


def _markdown(sections: int) -> str:
    parts = ["# Guide\n\nAn introduction to the guide.\n"]
    for n in range(sections):
        parts.append(
            f"\n## Step {n}\n\nRun the step number {n} with care and check its output twice.\n\n"
            f"- first item of step {n}\n- second item of step {n}\n\n"
            f"```sh\nmake step-{n}\n```\n"
        )
    return "".join(parts)


def test_markdown_sections_that_fit_are_never_cut() -> None:
    text = _markdown(6)
    language, chunks = chunk_file("docs/guide.md", text, tokens=70, overlap=10)
    assert language == "markdown"
    _check_exact(text, chunks, 70)
    lines = split_lines(text)
    for c in chunks:
        first = lines[c.start_line - 1]
        assert first.startswith(("# Guide", "## Step")), first  # every chunk starts at a heading
        # and a section it starts is whole: it ends where the next heading begins
        nxt = c.end_line + 1
        while nxt <= len(lines) and not lines[nxt - 1].strip():
            nxt += 1
        assert nxt > len(lines) or lines[nxt - 1].startswith("## Step"), (c.start_line, c.end_line)
    step = next(c for c in chunks if c.text.startswith("## Step 2"))
    assert step.symbol == "Guide.Step 2" and step.signature == "# Guide"


def test_oversize_markdown_section_is_cut_between_blocks_with_the_heading_trail() -> None:
    paragraphs = "".join(
        f"Paragraph {n} explains one detail of the install in a full sentence of words.\n\n"
        for n in range(12)
    )
    text = f"# Manual\n\n## Install\n\n{paragraphs}```sh\npip install tool\n```\n"
    _, chunks = chunk_file("docs/manual.md", text, tokens=60, overlap=0)
    _check_exact(text, chunks, 60)
    assert len(chunks) >= 3
    lines = split_lines(text)
    for c in chunks:
        first = lines[c.start_line - 1]
        assert first.startswith(("# Manual", "## Install", "Paragraph", "```")), first
        assert not c.text.endswith("```sh")  # a fence that fits is never cut
    later = [c for c in chunks if c.start_line > 3]
    assert later and all(c.signature == "# Manual\n## Install" for c in later)
    embedded = chunk_embedding_text("docs/manual.md", "markdown", later[-1])
    assert embedded.startswith("# Manual\n## Install\n")  # no path: a moved note is not re-embedded
    assert embedded.endswith(later[-1].text)


def test_a_long_markdown_paragraph_is_cut_at_sentence_ends() -> None:
    text = "# T\n\n" + "".join(f"Sentence number {n} goes on\nand ends here.\n" for n in range(30))
    _, chunks = chunk_file("notes.md", text, tokens=40, overlap=0)
    _check_exact(text, chunks, 40)
    assert len(chunks) >= 4
    assert all(c.text.endswith("and ends here.") for c in chunks)


def test_text_before_the_first_heading_has_no_symbol_or_signature() -> None:
    text = "Preamble text here.\n\nMore preamble.\n\n# Title\n\nBody.\n"
    _, chunks = chunk_file("notes.md", text, tokens=8, overlap=0)
    _check_exact(text, chunks, 8)
    assert [(c.start_line, c.symbol, c.signature) for c in chunks] == [
        (1, "", ""),
        (3, "", ""),
        (5, "Title", ""),
    ]


def test_plain_text_keeps_the_paragraph_chunker_and_embeds_as_is() -> None:
    text = "Title\n\nOne paragraph of notes.\n"
    language, chunks = chunk_file("notes.txt", text)
    assert language == "text" and chunks == chunk_markdown(text)
    assert chunk_embedding_text("notes.txt", "text", chunks[0]) == chunks[0].text


# -- JSON, TOML, YAML --------------------------------------------------------------------------


def test_json_is_cut_at_top_level_keys_then_inside_an_oversize_value() -> None:
    document = {
        "name": "demo-package",
        "version": "1.2.3",
        "scripts": {f"task{n}": f"node scripts/task{n}.js --flag {n}" for n in range(14)},
        "license": "MIT",
    }
    text = json.dumps(document, indent=2) + "\n"
    language, chunks = chunk_file("package.json", text, tokens=60, overlap=0)
    assert language == "json"
    _check_exact(text, chunks, 60)
    lines = split_lines(text)
    scripts = [c for c in chunks if c.symbol.startswith("scripts")]
    assert len(scripts) >= 2  # the value is too large: cut between its own keys
    for c in scripts[1:]:
        assert lines[c.start_line - 1].lstrip().startswith('"task'), c.text
    inside = [c for c in scripts[1:] if '"license"' not in c.text]
    assert inside and all(c.signature == '  "scripts": {' for c in inside)
    assert any(c.symbol == "license" or '"license"' in c.text for c in chunks)
    first = chunks[0]
    assert first.start_line == 1 and '"version": "1.2.3"' in first.text
    embedded = chunk_embedding_text("package.json", "json", inside[-1])
    assert embedded.startswith("package scripts task")
    assert '\n  "scripts": {\n' in embedded
    assert "scripts" in chunk_keyword_text("json", inside[-1]).split()


def test_toml_tables_stay_whole_and_carry_their_name() -> None:
    text = (
        '[project]\nname = "demo"\nversion = "0.1.0"\n\n'
        '[tool.ruff]\nline-length = 100\nselect = ["E", "F", "I"]\n\n'
        '[[tool.mypy.overrides]]\nmodule = "tests.*"\nstrict = false\n'
    )
    language, chunks = chunk_file("pyproject.toml", text, tokens=20, overlap=0)
    assert language == "toml"
    _check_exact(text, chunks, 20)
    assert [(c.start_line, c.end_line, c.symbol) for c in chunks] == [
        (1, 3, "project"),
        (5, 7, "tool.ruff"),
        (9, 11, "tool.mypy.overrides"),
    ]


def test_yaml_is_cut_at_top_level_keys_and_nested_chunks_keep_their_parents() -> None:
    steps = "".join(f"      - name: step {n}\n        run: make target-{n} VERBOSE=1\n" for n in range(10))
    head = "name: CI\non:\n  push:\n    branches: [main]\n"
    text = f"{head}jobs:\n  test:\n    runs-on: ubuntu-latest\n    steps:\n{steps}"
    language, chunks = chunk_file(".github/workflows/ci.yml", text, tokens=50, overlap=0)
    assert language == "yaml"
    _check_exact(text, chunks, 50)
    lines = split_lines(text)
    assert chunks[0].start_line == 1
    assert any(lines[c.start_line - 1].startswith("jobs:") for c in chunks)
    nested = [c for c in chunks if c.start_line > 9]
    assert nested
    for c in nested:
        assert lines[c.start_line - 1].lstrip().startswith("- name: step"), c.text
        assert c.signature == "jobs:\n  test:\n    steps:"
        assert c.symbol == "jobs.test.steps"


def test_broken_data_files_still_chunk_exactly() -> None:
    for path, text in (
        ("a.json", '{"a": [1, 2,\n "b": }\n{"c": 3}\n'),
        ("a.yaml", "a: [1, 2\nb: : :\n  - c\n"),
        ("a.toml", "[a\nx = \ny = 2\n"),
        ("a.md", "```\nunclosed fence\n# not a heading\n"),
    ):
        chunks = chunk_syntax(text, "." + path.split(".")[1], tokens=40, overlap=0)
        assert chunks is not None
        _check_exact(text, chunks, 40)
