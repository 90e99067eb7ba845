"""Returning freed C heap memory to the operating system."""

from __future__ import annotations

import contextlib
import ctypes
import sys

__all__ = ["trim_heap"]


def trim_heap() -> None:
    """Hand the C heap's free pages back to the OS (glibc only; elsewhere nothing happens).

    glibc keeps large freed blocks mapped once its allocation threshold has grown past them, so a
    one-off burst of temporaries (building an ONNX Runtime session, which turns the int8 weights
    into float32 ones; building a vector mirror's inverted lists) would otherwise stay resident
    for as long as the process lives: ~60 MB for the model, ~50 MB for lists over 100k vectors.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
