"""``memstrata cluster status`` and ``memstrata cluster down``: the Ray deployment of the config.

Both join the cluster ``[cluster] address`` names as a plain driver: no memory system starts and
no model loads, so they answer in a second or two. ``status`` shows what ``status()``'s
``cluster`` section says, node by node: the hosts (with the agents whose actors they run, their
restarts and degraded agents) and the node embedders. ``down`` ends every host and node
embedder of ``[cluster] namespace`` for good (their mailboxes drained and files committed first),
other drivers' agents included; the data stays on disk for the next start.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click

from memstrata.core.errors import ConfigError

from . import _cli_shared as sh

if TYPE_CHECKING:
    from memstrata.core.config import Config

__all__ = ["cluster", "render_status"]


@contextlib.contextmanager
def _joined(ctx: click.Context) -> Iterator[tuple[Config, Any]]:
    """The config and the Ray engine's admin module, this process joined to the cluster."""
    config = sh.state(ctx).config
    if config.cluster.engine != "ray":
        raise ConfigError(
            f"no Ray cluster configured: config key 'cluster.engine' is {config.cluster.engine!r} "
            "(set it to 'ray', e.g. MEMSTRATA_CLUSTER__ENGINE=ray)"
        )
    if config.cluster.address == "local":
        raise ConfigError(
            "no Ray cluster configured: config key 'cluster.address' is 'local' (a private Ray that ends "
            "with its process); give the head's address, 'auto' or 'host:port'"
        )
    try:
        from memstrata.actors import _ray_runtime as engine
    except ImportError as exc:
        raise ConfigError(
            f"cluster commands need the memstrata[ray] extra (pip install 'memstrata[ray]'): {exc}"
        ) from exc
    with engine.joined(config):
        yield config, engine


def _label(actor: str) -> str:
    """What an actor of a host is for: its agent, ``session S`` or ``item store``."""
    kind, _, key = actor.partition(":")
    if kind == "blackboard":
        return f"session {key}"
    return "item store" if kind == "items" else key


def render_status(report: dict[str, Any]) -> list[str]:
    """The cluster part of a status report as lines: each node, then its hosts and embedders."""
    hosts: dict[str, Any] = report["hosts"]
    embedders: dict[str, str] = report.get("embedders", {})
    nodes: list[dict[str, Any]] = report["nodes"]
    lines = [
        f"cluster {report['address']}, namespace {report['namespace']}: "
        f"{sum(n['alive'] for n in nodes)} of {len(nodes)} nodes alive, {len(hosts)} hosts, "
        f"{len(embedders)} embedders"
    ]
    placed: set[str] = set()
    for node in nodes:
        node_id = str(node["node_id"])
        state = "alive" if node["alive"] else "dead"
        lines.append(f"node {node_id[:12]} ({state}, {node['address']})")
        for name, host in hosts.items():
            if host.get("node") != node_id:
                continue
            placed.add(name)
            agents = sorted({_label(actor) for actor in host["actors"]})
            extra = "".join(
                [
                    f", restarts {sum(host['restarts'].values())}" if host["restarts"] else "",
                    f", degraded {', '.join(sorted(host['degraded']))}" if host["degraded"] else "",
                ]
            )
            lines.append(f"  {name} (pid {host['pid']}): {', '.join(agents) or 'no actors'}{extra}")
        lines += [f"  {name}" for name, on in sorted(embedders.items()) if on == node_id]
    for name, host in hosts.items():
        if name not in placed:
            lines.append(f"  {name}: {host.get('error', 'on a node not listed')}")
    return lines


@click.group("cluster")
def cluster() -> None:
    """The Ray cluster of [cluster] engine = "ray": what runs where, and ending it."""


@cluster.command("status")
@click.option(
    "--timeout",
    type=sh.FiniteRange(0.1, 600),
    default=5.0,
    show_default=True,
    help="Seconds each host has to report.",
)
@sh.json_option
@click.pass_context
def status(ctx: click.Context, timeout: float, as_json: bool) -> None:
    """The nodes, the hosts on each (and the agents they run) and the node embedders."""
    with _joined(ctx) as (config, engine):
        report = engine.cluster_report(config, timeout)
    if as_json:
        sh.echo_json(report)
        return
    for line in render_status(report):
        click.echo(line)


@cluster.command("down")
@click.option(
    "--timeout",
    type=sh.FiniteRange(0.1, 3600),
    default=None,
    help="Seconds the hosts have to drain and commit (default: actors.stop_timeout_s).",
)
@sh.json_option
@click.pass_context
def down(ctx: click.Context, timeout: float | None, as_json: bool) -> None:
    """End every host and node embedder of the namespace for good (every driver's agents);
    the data stays on disk for the next start."""
    with _joined(ctx) as (config, engine):
        limit = config.actors.stop_timeout_s if timeout is None else timeout
        ended, problems = engine.end_cluster(config, limit)
    if as_json:
        sh.echo_json({"namespace": config.cluster.namespace, "ended": ended, "problems": problems})
        return
    if not ended:
        click.echo(f"nothing to end in namespace {config.cluster.namespace}")
    for name in ended:
        click.echo(f"ended {name}")
    for problem in problems:
        click.echo(f"{sh.PROG}: warning: {problem}", err=True)
