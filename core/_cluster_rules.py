"""Rules for the ``[cluster]`` config values that name Ray things: the cluster's address, the
namespace and where actors are placed (``placement``, ``pins``). They run when the config loads,
so a malformed address or a placement Ray would refuse is a ConfigError naming the key rather
than a failure when the actors start.
"""

from __future__ import annotations

import re

from memstrata.core.validation import fail

__all__ = ["check_pins", "check_placement", "check_ray_address", "check_ray_name"]


_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_HOST_PORT = re.compile(r"[A-Za-z0-9_.-]+:[0-9]{1,5}")


def check_ray_address(value: object, name: str) -> object:
    if not isinstance(value, str) or not (
        value in ("auto", "local")
        or (value.startswith("ray://") and _HOST_PORT.fullmatch(value[6:]))
        or _HOST_PORT.fullmatch(value)
    ):
        raise fail(name, "must be 'auto', 'local', 'ray://host:port' or 'host:port'", value)
    return value


def check_ray_name(value: object, name: str) -> object:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise fail(name, "must be 1-64 letters, digits, '_', '.' or '-'", value)
    return value


# Ray's own resources (CPU, memory, accelerators): a host asks for none of them (num_cpus = 0),
# and Ray refuses them by this name in a placement's "resources", so they cannot place a host
_RAY_RESOURCES = frozenset(
    {"CPU", "GPU", "TPU", "NPU", "HPU", "neuron_cores", "memory", "object_store_memory"}
    | {"FURIOSA", "MBLT", "RBLN", "TTNPU"}
)


def _is_placement(value: str) -> bool:
    """A placement reads ``spread``, ``resource:NAME`` or ``label:KEY=VALUE``."""
    kind, _, rest = value.partition(":")
    label_key, eq, label_value = rest.partition("=")
    return bool(
        value == "spread"
        or (kind == "resource" and _NAME.fullmatch(rest))
        or (kind == "label" and eq and _NAME.fullmatch(label_key) and _NAME.fullmatch(label_value))
    )


def _builtin_resource(name: str, where: str, value: object) -> None:
    """A placement on one of Ray's own resources is refused, saying what to use instead."""
    kind, _, resource = where.partition(":")
    if kind == "resource" and resource in _RAY_RESOURCES:
        raise fail(
            name,
            f"cannot place on {resource!r}, one of Ray's own resources (a host takes none of them); "
            "declare a custom resource on the nodes (ray start --resources '{\"NAME\": 1}') "
            "and use 'resource:NAME', or a node label",
            value,
        )


def check_placement(value: object, name: str) -> object:
    if not isinstance(value, str) or not _is_placement(value):
        raise fail(name, "must be 'spread', 'resource:NAME' or 'label:KEY=VALUE'", value)
    _builtin_resource(name, value, value)
    return value


def check_pins(value: object, name: str) -> object:
    if not isinstance(value, list | tuple):
        raise fail(
            name, "must be a list of 'agent_id=resource:NAME' or 'agent_id=label:KEY=VALUE' items", value
        )
    for pin in value:
        agent, sep, where = pin.partition("=") if isinstance(pin, str) else ("", "", "")
        if not sep or not agent or where == "spread" or not _is_placement(where):
            raise fail(name, "items must read 'agent_id=resource:NAME' or 'agent_id=label:KEY=VALUE'", pin)
        _builtin_resource(name, where, pin)
    return value
