"""The runnable examples in examples/ work as shipped (each needs its extra; none needs a network)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str, needs: str) -> ModuleType:
    pytest.importorskip(needs, reason=f"the extra providing {needs} is not installed")
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_langgraph_example_graph_reads_what_it_wrote(tmp_path: Path) -> None:
    recalled = load("langgraph_store", "langgraph.graph").main(str(tmp_path / "data"))
    assert recalled[0] == "tomatoes need more sun"
    assert "water the tomatoes on friday" in recalled


def test_openai_agents_example_keeps_both_turns(tmp_path: Path) -> None:
    module = load("openai_agents_session", "agents")
    assert asyncio.run(module.main(str(tmp_path / "data"))) == 4


def test_autogen_example_gives_the_memory_to_the_model(tmp_path: Path) -> None:
    module = load("autogen_memory", "autogen_ext.models.replay")
    seen = asyncio.run(module.main(str(tmp_path)))
    assert len(seen) == 1 and "blue flower pot" in seen[0]
