"""The default model's id and dimension, alone: a process that only names the model (``memstrata
status``, a store's open) reads them without importing numpy and ONNX Runtime with the model."""

from __future__ import annotations

__all__ = ["DEFAULT_DIM", "DEFAULT_MODEL_ID"]

DEFAULT_MODEL_ID = "all-MiniLM-L6-v2-int8-dq"  # int8 products: see ._quantize
DEFAULT_DIM = 384
