"""Tools for testing and simulating multi-agent systems on memstrata.

- :class:`HashEmbedder`: a deterministic, fast embedder for tests and simulations. It is **not
  semantic**: texts that share words get similar vectors, synonyms do not. Vectors depend only on
  the text (never on the batch, the machine or the process), so runs replay exactly.
- :class:`ManualClock`: time that moves only when the test says so; advancing it fires the
  deadlines it passes (a pre-task retrieval's 5 s budget).
- :func:`simulation`: a system on both, with a seed, so a run replays exactly.
- :class:`Step` and :func:`run_steps`: a scripted task pipeline, each step a task an agent
  begins and then completes or fails, the clock advanced between steps.

Example::

    from memstrata.testing import Step, run_steps, simulation

    with simulation(tmp, seed=7) as system:
        run_steps(system, [Step("qa", "t1", "run the payment tests", "sandbox rate-limited", fails=True),
                           Step("qa", "t2", "rerun the payment tests", "passed serially")])
        system.export(tmp / "run.jsonl")   # byte-identical for the same seed and steps
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import itertools
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from memstrata._system import MemorySystem
from memstrata.actors import ManualClock
from memstrata.core.config import Config
from memstrata.core.errors import InvalidInputError, RequestTimeoutError
from memstrata.messages import TaskPrompt

__all__ = ["HashEmbedder", "ManualClock", "Step", "StepResult", "run_steps", "simulation"]

_WORDS = re.compile(r"\w+")


class HashEmbedder:
    """Feature-hashed bag of words and word pairs, L2-normalised (deterministic, not semantic).

    Each lower-cased word, and each pair of neighbouring words, adds +1 or -1 to one of ``dim``
    buckets chosen by a keyed BLAKE2b hash of the word. A text without words embeds to a fixed
    unit vector, so every text gets a valid vector.
    """

    def __init__(self, dim: int = 256) -> None:
        if not isinstance(dim, int) or isinstance(dim, bool) or not 8 <= dim <= 4096:
            raise ValueError(f"dim must be an integer from 8 to 4096, got {dim!r}")
        self._dim = dim

    @property
    def model_id(self) -> str:
        return f"memstrata-hash-v1-{self._dim}"

    @property
    def dim(self) -> int:
        return self._dim

    def _vector(self, text: str) -> npt.NDArray[np.float32]:
        vector = np.zeros(self._dim, dtype=np.float32)
        words = _WORDS.findall(text.lower())
        features = words + [f"{a} {b}" for a, b in itertools.pairwise(words)]
        for feature in features:
            digest = hashlib.blake2b(feature.encode("utf-8", "surrogatepass"), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self._dim
            vector[bucket] += 1.0 if digest[4] & 1 else -1.0
        norm = float(np.linalg.norm(vector))
        if norm == 0.0:
            vector[0] = 1.0
            return vector
        return vector / np.float32(norm)

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        return np.stack([self._vector(text) for text in texts])

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        return self._vector(text)

    def __repr__(self) -> str:
        return f"HashEmbedder(dim={self._dim})"


@contextlib.contextmanager
def simulation(
    data_dir: str | os.PathLike[str],
    *,
    seed: int | str = 0,
    start: dt.datetime | None = None,
    config: Config | None = None,
    dim: int = 256,
) -> Iterator[MemorySystem]:
    """A :class:`MemorySystem` for simulations: :class:`HashEmbedder`, a :class:`ManualClock`
    (``system.clock``, starting at ``start``) and ``seed``, storing under ``data_dir``. The same
    seed and the same calls give the same memory, byte for byte (see ``system.export``)."""
    base = config if config is not None else Config(data_dir=Path(data_dir))
    chosen = replace(base, data_dir=Path(data_dir))
    system = MemorySystem.start(chosen, embedder=HashEmbedder(dim), clock=ManualClock(start), seed=seed)
    try:
        yield system
    finally:
        system.stop()


@dataclass(frozen=True, slots=True)
class Step:
    """One scripted task: ``agent`` begins ``task_id`` and then completes it with ``outcome`` as
    its summary, or fails it with ``outcome`` as the reason; ``advance_s`` simulated seconds
    pass before it starts."""

    agent: str
    task_id: str
    description: str
    outcome: str
    fails: bool = False
    advance_s: float = 60.0


@dataclass(frozen=True, slots=True)
class StepResult:
    step: Step
    prompt: TaskPrompt  # what the agent was given before the task


def run_steps(system: MemorySystem, steps: Iterable[Step], *, timeout: float = 30.0) -> list[StepResult]:
    """Drive agents through their steps in order and return each step's prompt.

    Before each step the system's clock (a :class:`ManualClock`) is advanced by ``advance_s``;
    after it, every write-back has landed, so the next prompt sees what this step taught.
    """
    advance = getattr(system.clock, "advance", None)
    results: list[StepResult] = []
    for step in steps:
        if not isinstance(step, Step):
            raise InvalidInputError(f"steps must be Step objects, got {type(step).__name__}")
        if step.advance_s:
            if not callable(advance):
                raise InvalidInputError("run_steps advances the clock: start the system with a ManualClock")
            advance(step.advance_s)
        agent = system.agent(step.agent)
        prompt = agent.begin_task(step.task_id, step.description)
        if step.fails:
            agent.fail_task(step.task_id, step.outcome, timeout=timeout)
        else:
            agent.complete_task(step.task_id, step.outcome, timeout=timeout)
        if not system.wait_idle(timeout):
            raise RequestTimeoutError(f"step {step.task_id}: write-backs did not land within {timeout:g} s")
        results.append(StepResult(step, prompt))
    return results
