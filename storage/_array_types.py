"""The numpy array types the engine passes around, one name each: vectors and similarities are
float32 everywhere (the model's output, the mirror's rows), row ids and positions int64, masks
bool; BM25's numbers are float64, as FTS5 computes them, so its scores match FTS5's."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["Bm25Floats", "BoolArray", "FloatArray", "IntArray"]

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
Bm25Floats = npt.NDArray[np.float64]  # term counts, document lengths and scores of BM25
