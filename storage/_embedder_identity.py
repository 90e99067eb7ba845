"""The ``model_id`` and ``dim`` every embedder answers, apart from the model code and numpy: a
process that only names a model (the command line's quick query) can define one cheaply."""

from __future__ import annotations

__all__ = ["ModelIdentity"]


class ModelIdentity:
    """The ``model_id`` and ``dim`` of the :class:`~memstrata.storage.Embedder` protocol, read
    from ``_model_id`` and ``_dim``: one definition for every embedder, wrapper and test double
    that sets them."""

    _model_id: str
    _dim: int

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dim(self) -> int:
        return self._dim
