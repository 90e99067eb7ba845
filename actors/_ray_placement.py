"""Where a Ray host runs: its name, the Ray options of its placement, and why no node can take it.

A host's name holds the agent id or session id, so every driver and worker of the cluster
reaches the same host by name. Its placement (``ClusterConfig.placement``) becomes Ray actor
options. A host no alive node can take (its placement names a resource or label none has) waits
for one, which a caller would see only as a late answer: :func:`unplaceable` says why instead.
"""

from __future__ import annotations

from typing import Any

from memstrata.core.config import Config

from ._ray_admin import nodes

__all__ = ["host_name", "placement_options", "unplaceable"]


def host_name(config: Config, kind: str, key: str) -> str:
    """The Ray name of the host of ``(kind, key)``: the agent id or session id is in it."""
    if kind == "blackboard":
        return f"blackboard:{key}"
    if kind == "items":
        return "items"
    return f"agent:{key}" if config.cluster.group == "agent" else f"{kind}:{key}"


def placement_options(where: str) -> dict[str, Any]:
    """Ray actor options for a placement (see ``ClusterConfig.placement``)."""
    kind, _, rest = where.partition(":")
    if kind == "resource":
        return {"resources": {rest: 0.001}}
    if kind == "label":
        label_key, _, label_value = rest.partition("=")
        return {"label_selector": {label_key: label_value}}
    return {"scheduling_strategy": "SPREAD"}


def unplaceable(where: str) -> str | None:
    """Why no alive node of the cluster can take a host placed ``where``; ``None`` if one can."""
    kind, _, rest = where.partition(":")
    if kind not in ("resource", "label"):
        return None
    try:
        alive = [node for node in nodes() if node["alive"]]
    except Exception:  # the cluster cannot be asked: no claim either way
        return None
    if kind == "resource":
        if any(rest in node["resources"] for node in alive):
            return None
        return f"no alive node declares the resource {rest!r}"
    label_key, _, label_value = rest.partition("=")
    if any(node["labels"].get(label_key) == label_value for node in alive):
        return None
    return f"no alive node has the label {label_key}={label_value}"
