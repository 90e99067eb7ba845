"""``distinct`` is ``numpy.unique`` of a flat array, for every dtype the engine gives it."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from memstrata.storage._distinct import distinct


@given(
    hnp.arrays(
        st.sampled_from([np.int64, np.int32, np.uint8]), hnp.array_shapes(min_dims=1, max_dims=2, max_side=40)
    )
)
def test_distinct_is_numpy_unique(values: np.ndarray) -> None:
    got = distinct(values)
    assert got.dtype == values.dtype
    np.testing.assert_array_equal(got, np.unique(values))
