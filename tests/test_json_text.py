"""The JSON reader: numbers no double holds are kept with their place, never read as infinity."""

from __future__ import annotations

import pytest

from memstrata.core.json_text import BeyondDouble, DoubleRangeError, loads, loads_marking


def test_a_number_beyond_a_double_is_refused_with_its_place() -> None:
    with pytest.raises(DoubleRangeError) as refused:
        loads(b'{"a": [1, -1e400]}')
    assert (refused.value.path, refused.value.digits) == ("a[1]", "-1e400")
    assert str(refused.value).startswith(
        "number -1e400 at 'a[1]' is outside the range of a double (magnitude up to about 1.8e308)"
    )
    assert loads(b"[1e308, 1e-400]") == [1e308, 0.0]


def test_loads_marking_keeps_a_number_beyond_a_double_as_written() -> None:
    value, marked = loads_marking(b'{"id": 3, "v": 2E+308, "t": "\\ud800"}', lone_surrogates=True)
    assert marked and value["id"] == 3 and value["t"] == "\ud800"
    assert isinstance(value["v"], BeyondDouble) and value["v"].digits == "2E+308"
