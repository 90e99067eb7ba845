"""The README and docs/ stay true: every Python example runs and every relative link resolves.

Each ```python block runs in its own interpreter, in a fresh folder that is also its home and
data dir, so an example can neither read a developer's config nor leave anything behind. A block
preceded by ``<!-- not-a-test -->`` is a fragment and is skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP_MARK = "<!-- not-a-test -->"
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")


def doc_files() -> list[Path]:
    """README.md first, then every page of docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def code_blocks(text: str) -> list[tuple[int, str, str, bool]]:
    """(first line number, language, code, skipped) of every fenced block in a Markdown text."""
    lines = text.splitlines()
    blocks: list[tuple[int, str, str, bool]] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, language = opening.group(1), opening.group(2).lower()
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if end == len(lines):
            raise AssertionError(f"line {i + 1}: code fence {fence} is never closed")
        previous = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
        blocks.append((i + 1, language, "\n".join(lines[i + 1 : end]), previous == SKIP_MARK))
        i = end + 1
    return blocks


def python_examples() -> list[pytest.ParameterSet]:
    params = []
    for path in doc_files():
        for line, language, code, skipped in code_blocks(path.read_text(encoding="utf-8")):
            if language not in ("python", "py"):
                continue
            label = f"{path.relative_to(ROOT)}:{line}"
            marks = [pytest.mark.skip(reason="marked not-a-test")] if skipped else []
            params.append(pytest.param(code, id=label, marks=marks))
    return params


def _model_dir() -> str:
    """Where the default model is assembled for this user, kept when HOME moves to a temp dir."""
    import platformdirs

    return os.environ.get("MEMSTRATA_MODEL_DIR") or str(
        Path(platformdirs.user_cache_dir("memstrata")) / "models"
    )


@pytest.mark.parametrize("code", python_examples())
def test_docs_python_example_runs(code: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTRATA_")}
    env.update(
        HOME=str(home),
        MEMSTRATA_DATA_DIR=str(tmp_path / "data"),
        MEMSTRATA_MODEL_DIR=_model_dir(),
        # the examples call the `memstrata` command as an installed user would
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    )
    env.pop("XDG_CONFIG_HOME", None)
    env.pop("XDG_DATA_HOME", None)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=home, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"example failed:\n{code}\n--- stderr ---\n{done.stderr[-4000:]}"
    # the examples are meant to show the real model at work, not the keyword-only fallback
    assert "KEYWORD-ONLY" not in done.stderr, done.stderr[-2000:]


def test_examples_are_found_and_fragments_can_opt_out() -> None:
    text = "Intro\n\n```python\nx = 1\n```\n\n<!-- not-a-test -->\n\n```python\ny(\n```\n\n````sh\nls\n````\n"
    assert code_blocks(text) == [
        (3, "python", "x = 1", False),
        (9, "python", "y(", True),
        (13, "sh", "ls", False),
    ]
    found = {param.id for param in python_examples()}
    assert any(label.startswith("README.md:") for label in found), found
    assert len(found) >= 6, found
    with pytest.raises(AssertionError, match="never closed"):
        code_blocks("```python\nx = 1\n")


def test_docs_toml_examples_are_valid_config_files() -> None:
    """Every ```toml block in the docs is a (partial) config file that Config accepts as shown."""
    import tomllib

    from memstrata import Config

    checked = 0
    for path in doc_files():
        for line, language, code, skipped in code_blocks(path.read_text(encoding="utf-8")):
            if language != "toml" or skipped:
                continue
            where = f"{path.relative_to(ROOT)}:{line}"
            try:
                Config.from_mapping(tomllib.loads(code))
            except Exception as exc:
                raise AssertionError(f"{where}: {exc}") from exc
            checked += 1
    assert checked >= 2


def test_documented_config_error_is_the_real_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from memstrata import Config, ConfigError

    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    shown = re.search(r"`(configuration: config key 'search\.top_k'.*?)`", text, re.S)
    assert shown, "docs/configuration.md no longer shows the example error"
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        Config.load(env={"MEMSTRATA_SEARCH__TOP_K": "lots"})
    assert str(caught.value) == " ".join(shown.group(1).split())


# -- links -------------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)


def _prose(text: str) -> str:
    """The text without fenced blocks and inline code, where brackets are not links."""
    return INLINE_CODE.sub("", _unfenced(text))


def _unfenced(text: str) -> str:
    """The text with its fenced blocks blanked (a ``#`` line there is not a heading)."""
    lines = text.splitlines()
    keep = []
    fence: str | None = None
    for line in lines:
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)
            keep.append("")
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
            keep.append("")
        else:
            keep.append(line)
    return "\n".join(keep)


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped (a code span keeps its text,
    without the backticks), spaces as '-', repeats numbered."""
    seen: dict[str, int] = {}
    result = set()
    for line in _unfenced(text).splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def test_anchors_follow_github() -> None:
    text = (
        "# Bridges: CLI, MCP\n## JSON-lines server: memstrata from any language\n## Usage\n## Usage\n"
        "## The `memstrata status` command\n```\n# not a heading\n```\n"
    )
    assert anchors(text) == {
        "bridges-cli-mcp",
        "json-lines-server-memstrata-from-any-language",
        "usage",
        "usage-1",
        "the-memstrata-status-command",
    }


def relative_links(path: Path) -> list[str]:
    targets = LINK.findall(_prose(path.read_text(encoding="utf-8")))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
            continue
        if ROOT not in resolved.parents and resolved != ROOT:
            broken.append(f"{target}: outside the repository")
            continue
        if (
            anchor
            and resolved.suffix == ".md"
            and anchor not in anchors(resolved.read_text(encoding="utf-8"))
        ):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{path.relative_to(ROOT)}: broken links: {broken}"


def test_a_broken_link_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("[ok](#a) `[code](nowhere.md)` [bad](missing.md) [web](https://x.org)\n# A\n")
    assert relative_links(page) == ["#a", "missing.md"]
    assert not (tmp_path / "missing.md").exists()


# -- the README as a front door ----------------------------------------------------------------


def test_readme_is_a_short_front_door_that_links_every_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = readme.splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move reference material into docs/"
    first_example = next(i for i, line in enumerate(lines, 1) if line.strip() == "```python")
    assert first_example <= 60, f"the first Python example is at line {first_example}"
    linked = {Path(t.partition("#")[0]).name for t in relative_links(ROOT / "README.md")}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.name not in linked]
    assert not unlinked, f"README.md does not link {unlinked}"
