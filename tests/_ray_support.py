"""What the Ray tests share: a real Ray cluster on loopback, a config of the Ray engine, where a
named host runs, and bounded waits for a host that restarts.

Importing it needs the ``memstrata[ray]`` extra: test modules skip first
(``pytest.importorskip("ray")``) and import it after.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray
from ray import cluster_utils

from memstrata import Config
from memstrata.errors import MemstrataError

BOUND_S = 120.0  # how long a loaded 2-core machine may take to answer through Ray or restart a host


@contextlib.contextmanager
def ray_cluster(namespace: str, *, nodes: int = 2, labels: dict[str, str] | None = None) -> Iterator[Any]:
    """A Ray cluster of ``nodes`` nodes (1 or 2) on loopback, this process connected to it in
    ``namespace``. The head declares the custom resource ``node_a``, the second node ``node_b``
    (and ``labels``), so a test pins agents where it wants them."""
    made = cluster_utils.Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1}}
    )
    try:
        if nodes > 1:
            made.add_node(num_cpus=1, resources={"node_b": 1}, labels=labels or {})
        made.wait_for_nodes()
        ray.init(address=made.address, namespace=namespace, log_to_driver=False)
        yield made
    finally:
        ray.shutdown()
        made.shutdown()


def ray_config(data_dir: Path, address: str, namespace: str, **more: Any) -> Config:
    """A config of the Ray engine on the cluster at ``address`` (``more``: other keys, as
    ``Config.load`` takes them)."""
    return Config.load(
        env={},
        data_dir=data_dir,
        cluster__engine="ray",
        cluster__address=address,
        cluster__namespace=namespace,
        **more,
    )


def where(name: str, namespace: str, timeout: float = BOUND_S) -> tuple[str, int]:
    """The node id and process id of the named host (or node embedder)."""
    node, pid = ray.get(ray.get_actor(name, namespace=namespace).where.remote(), timeout=timeout)
    return str(node), int(pid)


def restarted(name: str, namespace: str, pid: int) -> int:
    """The process id of the named host once it answers from a process other than ``pid`` (Ray's
    errors while it restarts count as not yet), within ``BOUND_S``."""

    def moved() -> int:
        try:
            now = where(name, namespace)[1]
        except ray.exceptions.RayError:
            return 0
        return 0 if now == pid else now

    return int(until(moved, f"a new process of {name}"))


def until(check: Callable[[], Any], what: str, bound_s: float = BOUND_S) -> Any:
    """Ask ``check`` again until it returns a true value (a memstrata error while a host restarts
    counts as not yet), within ``bound_s``."""
    deadline = time.monotonic() + bound_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except MemstrataError as exc:
            last = exc
            continue
        if last:
            return last
    raise AssertionError(f"{what}: still {last!r} after {bound_s:g} s")
