"""Joining the Ray cluster that ``[cluster] address`` names, from a driver or a command.

A head that does not answer is a clear error at once; a process already connected stays as it is.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator

import ray

from memstrata.core.config import Config
from memstrata.core.errors import SystemStoppedError

__all__ = ["connect", "joined"]

_PROBE_S = 5.0  # how long a head's address may take to accept a connection


def connect(config: Config) -> None:
    """Join the cluster ``[cluster] address`` names, unless this process is connected already."""
    if ray.is_initialized():
        return
    address = config.cluster.address
    _probe(address)
    try:
        ray.init(
            address=None if address == "local" else address,
            namespace=config.cluster.namespace,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    except Exception as exc:
        raise SystemStoppedError(f"cannot join the Ray cluster at {address!r}: {exc}") from exc


def _probe(address: str) -> None:
    """A head that does not answer is a clear error at once (Ray itself retries for minutes)."""
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_S):
            pass
    except OSError as exc:
        raise SystemStoppedError(
            f"cannot join the Ray cluster at {address!r}: nothing answers at {host}:{port} "
            f"within {_PROBE_S:g} s ({exc})"
        ) from exc


@contextlib.contextmanager
def joined(config: Config) -> Iterator[None]:
    """This process connected to the configured cluster for the block; a connection it made
    is closed after it (one it had before is kept)."""
    made = not ray.is_initialized()
    connect(config)
    try:
        yield
    finally:
        if made:
            ray.shutdown()
