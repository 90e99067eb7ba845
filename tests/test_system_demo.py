"""``make run``: the simulated pipeline runs on the real model, learns, and is repeatable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memstrata._demo import run_demo
from memstrata.errors import InvalidInputError

pytestmark = pytest.mark.model


def test_demo_learns_from_failures_and_repeats_identically(tmp_path: Path, real_embedder: Any) -> None:
    lines: list[str] = []
    first = run_demo(tmp_path, out=lines.append, embedder=real_embedder)
    assert first.data_dir == tmp_path / "demo"
    assert (first.completed, first.failed) == (16, 4)
    reused = dict(first.pitfalls_reused)
    assert reused  # a pitfall learned from a failed task reached a later prompt
    assert ("t07", "t03") in first.pitfalls_reused  # the migration retry saw the migration failure
    assert ("t13", "t10") in first.pitfalls_reused  # the test fix saw the flaky-test failure
    assert first.persisted_after_restart
    assert first.signals_seen >= 60
    assert first.per_agent["backend"]["knowledge"] == 8
    assert sum(row["episodes"] for row in first.per_agent.values()) == 20
    text = "\n".join(lines)
    assert "blackboard 'checkout-v2'" in text and "episodic recall" in text and "total" in text
    second = run_demo(tmp_path, out=lambda line: None, embedder=real_embedder)
    assert second.pitfalls_reused == first.pitfalls_reused
    assert second.per_agent == first.per_agent


def test_demo_refuses_a_folder_it_did_not_create(tmp_path: Path) -> None:
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "precious.txt").write_text("keep me")
    with pytest.raises(InvalidInputError, match="not created by the demo"):
        run_demo(tmp_path, out=lambda line: None)
    assert (tmp_path / "demo" / "precious.txt").read_text() == "keep me"
