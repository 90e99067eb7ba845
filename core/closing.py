"""A base for what a ``with`` block closes: stores, indexes, connections, registries."""

from __future__ import annotations

from typing import Self

__all__ = ["Closeable"]


class Closeable:
    """``with thing:`` returns ``thing`` and calls its :meth:`close` at the end of the block,
    whether or not the block raised (it does not swallow the exception). Put it last among a
    class's bases, so that a ``close`` of another base is the one that runs."""

    __slots__ = ()

    def close(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define close()")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
