"""The `serve --listen` sockets (unix 0600, loopback tcp): binding is apart from the protocol."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from dataclasses import dataclass

from memstrata.core.errors import InvalidInputError

__all__ = ["Listener", "open_listener"]

_LOOPBACK = {"127.0.0.1": socket.AF_INET, "localhost": socket.AF_INET, "::1": socket.AF_INET6}


@dataclass(slots=True)
class Listener:
    """A bound, listening socket and how to tidy up after it (the unix socket file)."""

    sock: socket.socket
    address: str  # as given to --listen, with the real port for tcp:...:0
    path: str | None = None
    _inode: tuple[int, int] | None = None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.path is not None and self._inode is not None:
            with contextlib.suppress(OSError):
                info = os.lstat(self.path)
                if (info.st_dev, info.st_ino) == self._inode:  # still ours: remove it
                    os.unlink(self.path)
            self._inode = None


def open_listener(spec: str) -> Listener:
    """Bind ``unix:PATH`` (a socket file, mode 0600) or ``tcp:HOST:PORT`` (loopback hosts only)."""
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in ("unix", "tcp") or not rest:
        raise InvalidInputError(f"--listen must be unix:PATH or tcp:127.0.0.1:PORT, got {spec!r}")
    if kind == "unix":
        return _unix_listener(rest)
    host, sep, port_text = rest.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise InvalidInputError(f"--listen tcp: needs HOST:PORT with a port 0-65535, got {spec!r}")
    family = _LOOPBACK.get(host)
    if family is None:
        raise InvalidInputError(
            f"--listen {spec!r}: only a loopback host (127.0.0.1, localhost, [::1]) is served; "
            "the protocol has no authentication"
        )
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1" if host == "localhost" else host, int(port_text)))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise InvalidInputError(f"--listen {spec!r}: cannot listen: {exc.strerror or exc}") from exc
    port = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    return Listener(sock, f"tcp:{shown}:{port}")


def _unix_listener(path: str) -> Listener:
    path = os.path.abspath(os.path.expanduser(path))
    if len(os.fsencode(path)) >= 104:
        raise InvalidInputError(f"--listen unix:{path}: the path is too long for a socket (max 103 bytes)")
    with contextlib.suppress(FileNotFoundError):
        info = os.lstat(path)
        if not stat.S_ISSOCK(info.st_mode):
            raise InvalidInputError(f"--listen unix:{path}: the path exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:  # nobody listens: a stale file left by a server that died
            os.unlink(path)
        else:
            raise InvalidInputError(f"--listen unix:{path}: another server is listening there")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:  # the file is created 0600 (only this user may connect); Linux takes the mode from here
        os.fchmod(sock.fileno(), 0o600)
        previous = None
    except OSError:  # elsewhere: through the umask, which is process-wide, so only as a fallback
        previous = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise InvalidInputError(f"--listen unix:{path}: cannot listen: {exc.strerror or exc}") from exc
    finally:
        if previous is not None:
            os.umask(previous)
    os.chmod(path, 0o600)
    sock.listen(64)
    info = os.lstat(path)
    return Listener(sock, f"unix:{path}", path, (info.st_dev, info.st_ino))
