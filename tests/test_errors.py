"""The exception hierarchy: the tree its module documents is the tree its classes form."""

from __future__ import annotations

import memstrata.errors
from memstrata.core import errors


def _tree(cls: type, depth: int = 0) -> list[str]:
    """``cls`` and its subclasses in the module, as the docstring draws them (children sorted)."""
    here = {getattr(errors, name) for name in errors.__all__}
    also = [b.__name__ for b in cls.__bases__ if b not in here and b is not Exception]
    line = "  " * depth + cls.__name__ + (f" (also {', '.join(also)})" if also else "")
    children = sorted((c for c in here if cls in c.__bases__), key=lambda c: c.__name__)
    return [line] + [sub for child in children for sub in _tree(child, depth + 1)]


def test_the_documented_tree_is_the_tree_of_the_classes() -> None:
    assert errors.__doc__ is not None
    drawn = errors.__doc__.split("The tree::\n\n", 1)[1].strip("\n").splitlines()
    assert [line.removeprefix("    ") for line in drawn] == _tree(errors.MemstrataError)


def test_every_error_is_a_memstrata_error_and_public_under_memstrata_errors() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.MemstrataError), name
        assert getattr(memstrata.errors, name) is cls
