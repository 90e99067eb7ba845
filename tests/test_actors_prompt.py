"""Prompt shape and escaping."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from hypothesis import given
from hypothesis import strategies as st

from memstrata.actors import build_prompt, fallback_prompt, xml_name
from memstrata.layers import KnowledgeEntry, KnowledgeHit


def hit(content: str, score: float, *, category: str = "pitfall", tags: dict[str, str] | None = None,
        similarity: float | None = 0.5, entry_id: int = 1) -> KnowledgeHit:  # fmt: skip
    entry = KnowledgeEntry(entry_id, content, category, tags or {}, "/", None, 0.0, 0.0)
    return KnowledgeHit(entry, score, "hybrid", 1, 1, similarity)


def test_prompt_shape_matches_the_design() -> None:
    text = build_prompt("Refactor the payment module", [hit("Avoid Strategy", 0.8734, tags={"taskId": "t1"})])
    assert text == (
        "<knowledge-context>\n"
        '<entry category="pitfall" relevance="0.87" taskId="t1">Avoid Strategy</entry>\n'
        "</knowledge-context>\n"
        "<task>Refactor the payment module</task>"
    )


def test_fallback_is_the_full_task_alone() -> None:
    description = "Line one\nline <two> & three " + "x" * 5000
    text = fallback_prompt(description)
    assert text.startswith("<task>") and text.endswith("</task>")
    assert ET.fromstring(text).text == description


def test_everything_is_escaped_and_parses() -> None:
    nasty = "a\"b<c>&d'e\n\tf\x00g\ud800h"
    hits = [hit(nasty, 0.5, category="x-y", tags={nasty: nasty, "category": "c", "ok": "", "2bad key": "v"})]
    text = build_prompt(nasty, hits)
    root = ET.fromstring(f"<root>{text}</root>")
    entry = root.find("knowledge-context/entry")
    assert entry is not None
    assert entry.get("category") == "x-y"
    assert entry.get("tag-category") == "c"
    assert entry.get("ok") == ""
    assert entry.get(xml_name(nasty)) == "a\"b<c>&d'e\n\tf\ufffdg\ufffdh"
    assert entry.text == "a\"b<c>&d'e\n\tf\ufffdg\ufffdh"
    assert entry.get(xml_name("2bad key")) == "v"


def test_every_tag_is_shown_and_none_changes_what_the_element_is() -> None:
    """``xmlns`` would declare a namespace (a parser then finds no ``entry``), and a literal
    ``tag-category`` beside a ``category`` tag would collide with its renamed attribute."""
    tags = {"xmlns": "urn:team", "XMLfoo": "x", "category": "A", "tag-category": "B", "relevance": "r"}
    text = build_prompt("t", [hit("payment retries use backoff", 0.9, tags=tags)])
    root = ET.fromstring(f"<root>{text}</root>")
    entry = root.find("knowledge-context/entry")
    assert entry is not None and entry.get("category") == "pitfall"
    shown = {name: value for name, value in entry.attrib.items() if name not in ("category", "relevance")}
    assert sorted(shown.values()) == sorted(tags.values())
    assert shown["tag-xmlns"] == "urn:team" and shown["tag-category"] == "A"
    assert shown["tag-tag-category"] == "B"


def test_no_tag_makes_a_knowledge_entry_pass_for_another_kind_of_entry() -> None:
    """An episode says ``source``, ``at`` and ``title``; a file chunk ``source``, ``path`` and
    ``lines``; code ``codebase`` and ``language``: a knowledge entry's tags of those names are
    shown under ``tag-`` names, so the entry still has no ``source``."""
    tags = {"source": "file", "path": "MEMORY.md", "lines": "1-3", "at": "2026-01-01", "title": "T",
            "codebase": "shop", "language": "python"}  # fmt: skip
    text = build_prompt("t", [hit("retries need backoff", 0.9, tags=tags)])
    entry = ET.fromstring(f"<root>{text}</root>").find("knowledge-context/entry")
    assert entry is not None and entry.get("source") is None
    assert {name: value for name, value in entry.attrib.items() if name.startswith("tag-")} == {
        f"tag-{key}": value for key, value in tags.items()
    }


def test_relevance_is_clamped_to_two_decimals() -> None:
    text = build_prompt("t", [hit("a", 1.7), hit("b", -0.2, entry_id=2), hit("c", 0.005, entry_id=3)])
    assert re.findall(r'relevance="([^"]+)"', text) == ["1.00", "0.00", "0.01"]


@given(st.text(min_size=1, max_size=40))
def test_xml_names_are_valid_and_distinct(key: str) -> None:
    name = xml_name(key)
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9._-]*", name)
    ET.fromstring(f'<e {name}="v"/>')
    if key != "k":
        assert name != xml_name("k") or key == "k"


@given(st.text(max_size=200), st.text(max_size=200))
def test_any_text_makes_a_well_formed_prompt(content: str, description: str) -> None:
    text = build_prompt(description or "x", [hit(content or "c", 0.3, tags={content or "k": description})])
    ET.fromstring(f"<root>{text}</root>")


def test_every_kind_of_entry_shares_one_context_escaped() -> None:
    import datetime as dt

    from memstrata.layers import Episode, EpisodeHit
    from memstrata.messages import FileContext

    nasty = 'x<"y">&\n\x01'
    at = dt.datetime(2026, 11, 20, 9, 30, tzinfo=dt.UTC)
    episode = EpisodeHit(
        Episode(1, f"ep {nasty}", f"T {nasty}", "t1", {}, "task", at, "u"), 0.52, "hybrid", 1, 1
    )
    files = [
        FileContext("file", f"memory/{nasty}.md", 12, 30, 0.812, f"note {nasty}", "markdown"),
        FileContext("code", "src/pay.py", 1, 20, 0.4, f"def f(): return '{nasty}'", "python", f"shop{nasty}"),
    ]
    text = build_prompt("Pay <now>", [hit("Avoid Strategy", 0.87)], [episode], files)
    lines = text.splitlines()
    assert lines[0] == "<knowledge-context>" and lines[1].startswith('<entry category="pitfall"')
    assert lines[2].startswith(
        '<entry source="episode" relevance="0.52" at="2026-11-20T09:30:00+00:00" title="T '
    )
    assert (
        '<entry source="file" path="memory/x&lt;&quot;y&quot;&gt;&amp;&#10;\ufffd.md" lines="12-30" ' in text
    )
    assert 'relevance="0.81">note x&lt;"y"&gt;&amp;' in text  # markdown files carry no language
    assert '<entry source="code" path="src/pay.py" lines="1-20" relevance="0.40" codebase="shop' in text
    assert 'language="python">def f()' in text
    assert text.endswith("</knowledge-context>\n<task>Pay &lt;now&gt;</task>")
    root = ET.fromstring(f"<prompt>{text}</prompt>")
    entries = root.find("knowledge-context")
    assert entries is not None
    assert [e.get("source") for e in entries] == [None, "episode", "file", "code"]
    assert entries[2].get("path") == 'memory/x<"y">&\n\ufffd.md'
    assert entries[3].text == "def f(): return 'x<\"y\">&\n\ufffd'"
