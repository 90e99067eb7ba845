"""A Ray host's restart log, without Ray: each new process of a host replays the restarts (and
revives) of the earlier ones into its supervision, so the budget holds across them."""

from __future__ import annotations

import math
import time
from pathlib import Path

from memstrata.actors._ray_restarts import RestartLog
from memstrata.actors._supervision import Supervision

NAME = "agent:a1"


def _process(data_dir: Path, restarted: bool, window_s: float = math.inf) -> tuple[Supervision, RestartLog]:
    """What a host's process knows after its start (a fresh supervision, as a new process has)."""
    supervision = Supervision(max_restarts=1, window_s=window_s, clock=time.monotonic)
    log = RestartLog(data_dir, NAME, "a1")
    log.start(supervision, restarted)
    return supervision, log


def test_restarts_and_revives_hold_across_the_host_s_processes(data_dir: Path) -> None:
    first, _ = _process(data_dir, restarted=False)
    assert first.restarts() == {} and first.degraded() == {}
    again, _ = _process(data_dir, restarted=True)
    assert again.restarts() == {"host:agent:a1": 1} and again.degraded() == {}
    past, log = _process(data_dir, restarted=True)  # knows of the first restart
    assert past.degraded_reason("a1") == (
        "host actor crashed 2 times since it started "
        "(last: ActorCrashedError: the Ray host 'agent:a1' died and Ray restarted it)"
    )
    log.revived()
    revived, log = _process(data_dir, restarted=True)
    assert revived.degraded() == {}  # the revive came before this restart: a whole budget
    assert revived.restarts() == {"host:agent:a1": 2}
    log.remove()
    assert not log.path.exists()
    fresh, _ = _process(data_dir, restarted=True)  # a restart of a host started after the removal
    assert fresh.restarts() == {"host:agent:a1": 1}
    anew, log = _process(data_dir, restarted=False)  # a first start forgets what was logged before it
    assert anew.restarts() == {} and not log.path.exists()


def test_restarts_older_than_the_window_are_forgotten_and_a_stray_line_is_skipped(data_dir: Path) -> None:
    log = RestartLog(data_dir, NAME, "a1")
    log.path.parent.mkdir()
    log.path.write_text(f"restart {time.time() - 120.0!r}\nnot an event\n", encoding="utf-8")
    supervision, _ = _process(data_dir, restarted=True, window_s=60.0)
    assert supervision.degraded() == {}  # the one of two minutes ago is outside the window
    assert supervision.restarts() == {"host:agent:a1": 2}
