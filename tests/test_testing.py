"""memstrata.testing: a deterministic embedder and a manual clock for simulations."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from memstrata import Config, MemorySystem
from memstrata.testing import HashEmbedder, ManualClock


def test_hash_embedder_is_deterministic_across_processes_and_batches() -> None:
    texts = ["deploy the billing service", "", "Ünïcode wörds and 漢字", "deploy billing"]
    embedder = HashEmbedder(64)
    batch = embedder.embed_documents(texts)
    assert batch.shape == (4, 64) and batch.dtype == np.float32
    assert np.allclose(np.linalg.norm(batch, axis=1), 1.0)
    for text, row in zip(texts, batch, strict=True):
        assert np.array_equal(embedder.embed_query(text), row)  # no dependence on the batch
    code = (
        "from memstrata.testing import HashEmbedder; import sys; "
        "sys.stdout.write(HashEmbedder(64).embed_query('deploy the billing service').tobytes().hex())"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert bytes.fromhex(other.stdout) == batch[0].tobytes()  # hash seeds do not leak in


def test_hash_embedder_ranks_shared_words_first_but_is_not_semantic() -> None:
    embedder = HashEmbedder()
    query = embedder.embed_query("billing service outage")
    near = embedder.embed_query("the billing service had an outage")
    far = embedder.embed_query("a recipe for lemon cake")
    synonym = embedder.embed_query("payments system downtime")
    assert float(query @ near) > 0.4 > 0.2 > float(query @ far)
    assert float(query @ synonym) < 0.3


@pytest.mark.parametrize("dim", [0, 7, 5000, True, 64.0])
def test_hash_embedder_rejects_bad_dimensions(dim: object) -> None:
    with pytest.raises(ValueError, match="dim must be"):
        HashEmbedder(dim)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("start", "needle"),
    [
        (1.7e9, "start must be a timezone-aware datetime, got float"),
        ("2025-01-01T00:00:00Z", "start must be a timezone-aware datetime, got str"),
        (datetime(2025, 1, 1), "start must be timezone-aware"),
    ],
)
def test_manual_clock_refuses_a_start_that_is_not_an_aware_datetime(start: object, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):  # an InvalidInputError, never an AttributeError
        ManualClock(start)  # type: ignore[arg-type]


def test_a_system_runs_on_the_testing_tools(tmp_path: Path) -> None:
    clock = ManualClock()
    with MemorySystem.start(Config(data_dir=tmp_path), embedder=HashEmbedder(), clock=clock) as system:
        agent = system.agent("a")
        agent.remember("deployed the billing service")
        clock.advance(3600)
        agent.remember("rolled back the billing service")
        hits = agent.recall("billing service", top_k=2)
    assert sorted(h.episode.content for h in hits) == [
        "deployed the billing service",
        "rolled back the billing service",
    ]
    stamps = sorted(h.episode.at for h in hits)
    assert stamps[1] == clock.now() and (stamps[1] - stamps[0]).total_seconds() == 3600


def test_scripted_steps_drive_agents_and_replay_exactly(tmp_path: Path) -> None:
    from memstrata.errors import InvalidInputError
    from memstrata.testing import Step, run_steps, simulation

    steps = [
        Step(
            "qa",
            "t1",
            "run the payment tests in the sandbox",
            "the sandbox rate-limits parallel runs",
            fails=True,
        ),
        Step("qa", "t2", "rerun the payment tests in the sandbox", "passed when run serially"),
        Step("dev", "t3", "ship the payment fix", "shipped", advance_s=3600),
    ]
    exports = []
    for run in ("one", "two"):
        with simulation(tmp_path / run, seed=5) as system:
            results = run_steps(system, steps)
            assert system.clock.now().isoformat() == "2025-01-01T01:02:00+00:00"
            system.export(tmp_path / f"{run}.jsonl")
        exports.append((tmp_path / f"{run}.jsonl").read_bytes())
        assert [r.step.task_id for r in results] == ["t1", "t2", "t3"]
        assert results[0].prompt.fallback  # nothing learned yet
        second = results[1].prompt
        assert not second.fallback and "rate-limits parallel runs" in second.text  # learned from t1
    assert exports[0] == exports[1]
    with simulation(tmp_path / "three", seed=5) as system, pytest.raises(InvalidInputError, match="Step"):
        run_steps(system, ["t1"])  # type: ignore[list-item]
    real = MemorySystem.start(Config(data_dir=tmp_path / "real"), embedder=HashEmbedder())
    with real, pytest.raises(InvalidInputError, match="ManualClock"):
        run_steps(real, steps[:1])
