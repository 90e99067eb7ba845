"""A Ray host's restarts, kept on disk so they count against its owner's restart budget.

Ray restarts a host whose process died (killed, out of memory, its node gone) in a new process,
whose supervision starts empty: counted there alone, a host that keeps dying would never use up
``actors.max_restarts``, and ``status()`` would never show it. A driver cannot count them either:
a host that dies and comes back between two of its calls shows it nothing, and each driver would
see other deaths. So each host logs its own restarts in the data dir (``hosts/{name}.restarts``,
``:`` written as ``-``) and replays the log into its supervision before it serves anything: each
restart is a crash of the child ``("host", name)`` of the host's agent (or session), at the time
it happened, and a revive of the owner is logged too, so the budget stands as it did. A host that
is not a restart (the first of its name, or one started after ``stop_cluster``) begins the log
anew; a host stopped for good removes it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from memstrata.core.errors import ActorCrashedError

from ._supervision import Supervision

__all__ = ["RestartLog"]

log = logging.getLogger("memstrata.actors")

_RESTART = "restart"
_REVIVE = "revive"


class RestartLog:
    """One host's restarts by Ray, and its owner's revives since, in the order they happened."""

    def __init__(self, data_dir: Path, name: str, owner: str) -> None:
        self.name = name
        self.owner = owner
        self.path = data_dir / "hosts" / f"{name.replace(':', '-')}.restarts"

    def start(self, supervision: Supervision, restarted: bool) -> None:
        """A first start begins the log anew; a restart is added to it, and the log replayed
        into ``supervision`` (degrading the owner if this restart is past its budget)."""
        if not restarted:
            self.remove()
            return
        now = time.time()
        try:
            self._add(_RESTART, now)
            events = self._read()
        except OSError as exc:  # the host serves all the same; only this restart is counted
            log.error("%s: cannot keep its restarts in %s: %s", self.name, self.path, exc)
            events = [(_RESTART, now)]
        died = ActorCrashedError(f"the Ray host {self.name!r} died and Ray restarted it")
        for event, at in events:
            if event == _REVIVE:
                supervision.revive(self.owner)
            else:
                supervision.child_failed("host", self.name, self.owner, died, ago=max(0.0, now - at))
        reason = supervision.degraded_reason(self.owner)
        if reason is None:
            log.warning("%s was restarted by Ray: its process died", self.name)
        else:
            log.error(
                "%s was restarted by Ray: its process died; %s is degraded: %s", self.name, self.owner, reason
            )

    def revived(self) -> None:
        """The owner was revived: a later restart replays its budget from here."""
        if not self.path.exists():
            return  # never restarted: nothing to replay
        try:
            self._add(_REVIVE, time.time())
        except OSError as exc:
            log.error("%s: cannot log the revive in %s: %s", self.name, self.path, exc)

    def remove(self) -> None:
        """Forget the restarts (a host stopped for good, or the first of its name): a whole budget."""
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            log.error("%s: cannot remove %s: %s", self.name, self.path, exc)

    def _add(self, event: str, at: float) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as out:
            out.write(f"{event} {at!r}\n")

    def _read(self) -> list[tuple[str, float]]:
        """The logged events, oldest first (a line that does not read as one is skipped)."""
        events = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            event, _, at = line.partition(" ")
            try:
                when = float(at)
            except ValueError:
                continue
            if event in (_RESTART, _REVIVE):
                events.append((event, when))
        return events
