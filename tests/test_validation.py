"""The one validation module: each rule once, with hostile strings; and that every caller uses it."""

from __future__ import annotations

import datetime as dt
import math
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstrata.core import constants, validation
from memstrata.errors import InvalidInputError
from memstrata.layers import BlackboardState, WorkingMemory

HOSTILE_NAMES = ["a\ud800", "a\udfff", "\udc80", "a\x00b", "a\nb"]
RTL = "\u202eevil\u202c"
EMOJI = "🚀 launch"


def _one_line(exc: pytest.ExceptionInfo[InvalidInputError], name: str) -> None:
    message = str(exc.value)
    assert name in message
    assert "\n" not in message
    assert len(message) < 400


# -- names: unpaired surrogates are rejected, never repaired into one name ----------------------


def test_the_two_surrogate_tag_keys_are_rejected_not_collapsed() -> None:
    for key in ("a\ud800", "a\udfff"):
        with pytest.raises(InvalidInputError, match="lone surrogates") as info:
            validation.check_tags({key: "v"})
        _one_line(info, "tags key")
    with pytest.raises(InvalidInputError):
        validation.check_tags(dict([("a\ud800", "1"), ("a\udfff", "2")]))  # two keys in Python, one in UTF-8


@pytest.mark.parametrize("value", ["a\ud800", "a\udfff", "\ud83d"])
def test_every_kind_of_name_rejects_unpaired_surrogates(value: str) -> None:
    checks: list[tuple[Any, str]] = [
        (lambda: validation.check_agent_id(value), "agent_id"),
        (lambda: validation.check_session_id(value), "session_id"),
        (lambda: validation.check_task_id(value), "task_id"),
        (lambda: validation.check_key(value), "key"),
        (lambda: validation.check_signal_key(value), "key"),
        (lambda: validation.check_signal_pattern(value + "*"), "key_or_prefix"),
        (lambda: validation.check_category(value), "category"),
        (lambda: validation.check_scope("/src/" + value), "scope"),
        (lambda: validation.check_tags([value]), "tags"),
    ]
    for call, name in checks:
        with pytest.raises(InvalidInputError) as info:
            call()
        _one_line(info, name)


def test_a_paired_surrogate_emoji_is_a_fine_key_tag_and_task_id() -> None:
    assert validation.check_key(EMOJI) == EMOJI
    assert validation.check_tags({EMOJI: EMOJI}) == {EMOJI: EMOJI}
    assert validation.check_task_id(EMOJI) == EMOJI
    assert validation.check_scope(f"/{EMOJI}/x") == f"/{EMOJI}/x"


def test_rtl_marks_are_kept_as_given_in_names_and_text() -> None:
    assert validation.check_key(RTL) == RTL
    assert validation.check_tags({RTL: RTL}) == {RTL: RTL}
    assert validation.check_content(RTL, max_bytes=100) == RTL


def test_nul_is_rejected_in_keys_and_ids_and_control_characters_in_task_ids_and_tag_keys() -> None:
    with pytest.raises(InvalidInputError, match="NUL"):
        validation.check_key("a\x00b")
    with pytest.raises(InvalidInputError, match="control"):
        validation.check_task_id("t\x00")
    with pytest.raises(InvalidInputError, match="control"):
        validation.check_tags({"a\tb": ""})
    with pytest.raises(InvalidInputError, match="agent_id"):
        validation.check_agent_id("a\x00")


@pytest.mark.parametrize("bad", ["", ".", "a.", "-a", "x" * 65, "con", "LPT1.txt", "a b", "é", "a/b"])
def test_agent_ids_are_portable_file_names(bad: str) -> None:
    with pytest.raises(InvalidInputError, match="agent_id"):
        validation.check_agent_id(bad)


def test_shared_is_a_target_not_an_agent_and_any_session_id() -> None:
    assert validation.check_agent_id(constants.SHARED, allow_shared=True) == "shared"
    with pytest.raises(InvalidInputError, match="reserved"):
        validation.check_agent_id("Shared")
    assert validation.check_session_id("shared") == "shared"


def test_huge_names_are_rejected_with_a_short_message() -> None:
    huge = "k" * 1_000_000
    for call in (
        lambda: validation.check_key(huge),
        lambda: validation.check_task_id(huge),
        lambda: validation.check_tags({huge: ""}),
        lambda: validation.check_scope("/" + huge),
        lambda: validation.check_category(huge),
    ):
        with pytest.raises(InvalidInputError) as info:
            call()
        assert len(str(info.value)) < 400


def test_signal_keys_and_patterns() -> None:
    assert validation.check_signal_pattern("*") == "*"
    assert validation.check_signal_pattern("build.*") == "build.*"
    with pytest.raises(InvalidInputError, match="only at the end"):
        validation.check_signal_pattern("a*b*")
    with pytest.raises(InvalidInputError, match="reserved for prefix"):
        validation.check_signal_key("a*")


# -- tags: one accepted shape --------------------------------------------------------------------


def test_tags_have_one_shape_sorted_with_bare_tags_as_empty_values() -> None:
    assert list(validation.check_tags({"b": "2", "a": "1"})) == ["a", "b"]
    assert validation.check_tags(["urgent", "db"]) == {"db": "", "urgent": ""}
    assert validation.check_tags(("x",)) == {"x": ""}
    assert validation.check_tags(frozenset({"y"})) == {"y": ""}
    assert validation.check_tags(None) == {}
    for bad, needle in [
        ("k=v", "must be a dict"),
        ({"k": 1}, r"tags\['k'\] must be a str"),
        ({1: "v"}, "keys must be str"),
        ({" ": "v"}, "tags key"),
        ({"k" * 129: ""}, "1-128"),
        ({"k": "v" * 1025}, "over the limit of 1024"),
        ({f"k{i}": "" for i in range(65)}, "over the limit of 64"),
        ([1], "keys must be str"),
    ]:
        with pytest.raises(InvalidInputError, match=needle):
            validation.check_tags(bad)


def test_tag_values_are_free_text_repaired() -> None:
    assert validation.check_tags({"k": "v\ud800"}) == {"k": "v\ufffd"}


# -- scopes, categories, modes, numbers -----------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "normal"),
    [
        ("/", "/"),
        ("", "/"),
        ("src/auth", "/src/auth"),
        ("/a//b/./c/", "/a/b/c"),
        ("/src/auth /", "/src/auth"),
        (" / src / my dir /", "/src/my dir"),
    ],
)
def test_scopes_are_normalised(given: str, normal: str) -> None:
    assert validation.check_scope(given) == normal
    assert validation.check_scope(normal) == normal  # a normal scope normalises to itself


@pytest.mark.parametrize("bad", ["/a/../b", "..", "/a/ .. /b", "/a\x00", "/x\ud800", 5, "/" + "a" * 1024])
def test_bad_scopes(bad: object) -> None:
    with pytest.raises(InvalidInputError, match="scope"):
        validation.check_scope(bad)


def test_categories_and_modes() -> None:
    assert validation.check_category("planning-pitfall") == "planning-pitfall"
    for bad in ("", "Bad", "a b", "-x", 3, None):
        with pytest.raises(InvalidInputError, match="category"):
            validation.check_category(bad)
    assert [validation.check_mode(m) for m in constants.MODES] == list(constants.MODES)
    with pytest.raises(InvalidInputError, match="hybrid, vector, keyword"):
        validation.check_mode("fuzzy")


def test_top_k_bound_is_the_one_constant() -> None:
    assert validation.check_top_k(constants.MAX_TOP_K) == constants.MAX_TOP_K == 1_000
    for bad in (0, constants.MAX_TOP_K + 1, True, 2.0, "3"):
        with pytest.raises(InvalidInputError, match="top_k"):
            validation.check_top_k(bad)


def test_numbers_are_finite() -> None:
    assert validation.check_number(None, "ttl_s") is None
    assert validation.check_number(2, "ttl_s") == 2.0
    for bad in (math.nan, math.inf, -math.inf, -1, True, "1", 10**400):
        with pytest.raises(InvalidInputError, match="ttl_s"):
            validation.check_number(bad, "ttl_s")
    for bad in (0, -1, math.inf, 10**400, -(10**400)):  # beyond a double: refused, never OverflowError
        with pytest.raises(InvalidInputError, match="ttl_s must be a positive number of seconds"):
            validation.check_ttl(bad, "ttl_s")
    assert validation.check_ttl(10**300, "ttl_s") == 1e300
    assert validation.check_min_score(-1) == -1.0
    for bad in (1.5, math.nan):
        with pytest.raises(InvalidInputError, match="min_score"):
            validation.check_min_score(bad)


def test_row_ids_fit_sqlite() -> None:
    assert validation.check_row_id(2**63 - 1) == 2**63 - 1
    for bad in (2**63, -(2**63) - 1, True, "1"):
        with pytest.raises(InvalidInputError, match="id"):
            validation.check_row_id(bad)


# -- free text and sizes ----------------------------------------------------------------------------


def test_content_size_is_counted_in_utf8_bytes_and_named() -> None:
    assert validation.check_content("é" * 5, max_bytes=10) == "é" * 5
    with pytest.raises(InvalidInputError, match=r"content is 12 bytes of UTF-8.*max_content_bytes"):
        validation.check_content("é" * 6, max_bytes=10)
    with pytest.raises(InvalidInputError, match=r"StoreKnowledge\.content is 4000001 characters"):
        validation.check_content("x" * 4_000_001, "StoreKnowledge.content", max_bytes=1_000_000)
    for empty in ("", " \n\t"):
        with pytest.raises(InvalidInputError, match="empty"):
            validation.check_content(empty, max_bytes=10)


def test_free_text_is_repaired_not_rejected() -> None:
    assert validation.check_content("a\ud800b", max_bytes=10) == "a\ufffdb"
    assert validation.check_optional_text("t\udfff", "title", max_chars=5) == "t\ufffd"
    assert validation.check_optional_text("", "title", max_chars=5) is None
    assert validation.check_author("x\ud801") == "x\ufffd"
    with pytest.raises(InvalidInputError, match="title is 6 characters"):
        validation.check_optional_text("x" * 6, "title", max_chars=5)


def test_task_run_ids_may_be_absent_where_optional() -> None:
    assert validation.check_task_id(None, "task_run_id", optional=True) is None
    assert validation.check_task_id("", "task_run_id", optional=True) is None
    with pytest.raises(InvalidInputError, match="task_id"):
        validation.check_task_id("")


# -- times --------------------------------------------------------------------------------------------


def test_times_must_be_aware() -> None:
    aware = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    assert validation.check_aware(aware, "at") is aware
    assert validation.check_datetime("2025-01-01T00:00:00+00:00", "since") == aware
    assert validation.check_datetime(None, "since") is None
    with pytest.raises(InvalidInputError, match="at must be timezone-aware"):
        validation.check_aware(dt.datetime(2025, 1, 1), "at")
    with pytest.raises(InvalidInputError, match="since must be an ISO-8601"):
        validation.check_datetime("yesterday", "since")
    with pytest.raises(InvalidInputError, match="out of range"):
        validation.check_aware(dt.datetime.max.replace(tzinfo=dt.timezone(-dt.timedelta(hours=1))), "at")


def test_timestamps_are_what_a_datetime_holds() -> None:
    first = dt.datetime(1, 1, 1, tzinfo=dt.UTC).timestamp()
    last = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC).timestamp()
    for seconds in (first, last, 0, 1.7e9):  # every one shows as a date, as each door shows it
        stamp = validation.check_timestamp(seconds, "created_at")
        assert stamp is not None and dt.datetime.fromtimestamp(stamp, dt.UTC).timestamp() == seconds
    assert validation.check_timestamp(None, "expires_at", optional=True) is None
    for bad in (first - 1, last + 1, 1e300, math.nan, math.inf, True, "1", 10**400, None):
        with pytest.raises(InvalidInputError, match="created_at must be a number of UNIX seconds within"):
            validation.check_timestamp(bad, "created_at")


# -- JSON values ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, [1, {"x": math.nan}]])
def test_json_values_reject_nan_and_infinity(bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="NaN or infinity") as info:
        validation.check_json_value(bad, "value for key 'k'")
    _one_line(info, "'k'")


def test_json_values_keep_null_and_name_the_spot() -> None:
    assert validation.check_json_value({"a": None, "b": [1.5, None]}, "v") == b'{"a":null,"b":[1.5,null]}'
    with pytest.raises(InvalidInputError, match=r"value\['b'\]\[1\]"):
        validation.check_json_value({"a": None, "b": [1.5, math.inf]}, "v")
    with pytest.raises(InvalidInputError, match="JSON-serialisable"):
        validation.check_json_value({1, 2}, "v")


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        (2**63, "value"),
        ({"a": [1, 2**64 - 1]}, r"value\['a'\]\[1\]"),
        ([-(2**63) - 1], r"value\[0\]"),
        (10**40, "value"),
    ],
)
def test_json_values_hold_integers_to_64_bits_and_name_the_spot(bad: Any, where: str) -> None:
    """orjson writes up to 2**64 - 1 (and refuses more without saying where); every door reads
    64 bits signed, so the Python API holds values to the same range."""
    with pytest.raises(
        InvalidInputError, match=rf"^v must hold integers within the 64-bit range .* at {where}$"
    ):
        validation.check_json_value(bad, "v")


def test_json_values_name_the_first_bad_integer_in_document_order() -> None:
    with pytest.raises(InvalidInputError, match=rf"found {2**63} at value\['a'\]$"):
        validation.check_json_value({"a": 2**63, "b": [2**64 - 1]}, "v")
    edges = {"low": -(2**63), "high": 2**63 - 1, "text": "9" * 40}
    assert orjson.loads(validation.check_json_value(edges, "v")) == edges


def test_blackboard_and_working_memory_reject_nan_naming_the_key() -> None:
    board = BlackboardState()
    for value in (math.nan, math.inf, {"x": [-math.inf]}):
        with pytest.raises(InvalidInputError, match=r"'temperature'.*NaN or infinity"):
            board.publish("temperature", value)
    assert board.get("temperature") is None
    memory = WorkingMemory()
    with pytest.raises(InvalidInputError, match=r"'ratio'.*NaN or infinity"):
        memory.set("ratio", math.nan)
    assert "ratio" not in memory


def test_blackboard_rejects_the_two_surrogate_keys() -> None:
    board = BlackboardState()
    for key in ("a\ud800", "a\udfff"):
        with pytest.raises(InvalidInputError, match="blackboard key"):
            board.publish(key, 1)
    assert len(board) == 0


def test_working_memory_keys_follow_the_one_key_rule() -> None:
    memory = WorkingMemory()
    for key in ("a\ud800", "a\x00", "", "k" * 1025):
        with pytest.raises(InvalidInputError, match="working memory key"):
            memory.set(key, 1)


# -- one module ------------------------------------------------------------------------------------


def test_every_public_check_is_documented() -> None:
    for name in validation.__all__:
        assert getattr(validation, name).__doc__, name


def test_rules_and_constants_are_defined_once() -> None:
    """No second definition of a rule or shared constant creeps back outside memstrata.core."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    pattern = re.compile(
        r"^(?:SHARED|EMBED_CHARS|MAX_TOP_K|MODES|MAX_KEY_CHARS)\b\s*(?::[^=]*)?=|"
        r"^def _?(?:check_tags|check_scope|check_category|check_agent_id|check_json_value|to_jsonable)\(",
        re.M,
    )
    found = [
        f"{path.relative_to(root)}: {match.group(0)}"
        for folder in ("memstrata", "actors", "layers", "storage", "bridges")
        for path in sorted((root / folder).rglob("*.py"))
        for match in pattern.finditer(path.read_text(encoding="utf-8"))
    ]
    assert found == []


def test_to_jsonable_is_the_one_json_helper() -> None:
    from pathlib import PurePosixPath
    from typing import NamedTuple

    import numpy as np

    from memstrata.core.jsonable import to_jsonable

    class Pair(NamedTuple):
        a: int
        b: dt.timedelta

    at = dt.datetime(2025, 1, 2, 3, 4, tzinfo=dt.UTC)
    value = {
        "at": at,
        "day": at.date(),
        "pair": Pair(1, dt.timedelta(seconds=1.5)),
        "path": PurePosixPath("/a/b"),
        "set": frozenset({3}),
        "vector": np.arange(2, dtype=np.float32),
        7: np.int64(5),
    }
    assert to_jsonable(value) == {
        "at": "2025-01-02T03:04:00+00:00",
        "day": "2025-01-02",
        "pair": {"a": 1, "b": 1.5},
        "path": "/a/b",
        "set": [3],
        "vector": [0.0, 1.0],
        "7": 5,
    }


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40), st.text(alphabet=" \t\n\r\x0b\x0c", max_size=5), st.integers()))
def test_plain_content_is_content_the_full_check_returns_unchanged(value: object) -> None:
    """The bulk load's shortcut accepts only what ``check_content`` accepts, unchanged."""
    if validation.is_plain_content(value, max_bytes=30):
        assert validation.check_content(value, max_bytes=30) == value
    elif isinstance(value, str) and value.isascii() and len(value) <= 30:
        with pytest.raises(InvalidInputError):  # ASCII it turns down is refused by the full check
            validation.check_content(value, max_bytes=30)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("/tmp/\ud800", r"^where must be valid UTF-8 text \(no lone surrogates\), got '/tmp/\\ud800'$"),
        (
            os.fsdecode(b"/tmp/caf\xe9"),
            r"^where must be valid UTF-8 text \(no lone surrogates\), got '/tmp/caf\\xe9'$",
        ),
        ("", r"^where must be a non-empty path, got ''$"),
        ("a\x00b", "NUL"),
        ("x" * 4097, "over the limit of 4096"),
        (b"/tmp", "must be a path given as a string, got bytes"),
    ],
)
def test_check_path_refuses_what_no_database_or_answer_can_hold(value: object, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        validation.check_path(value, "where")


def test_check_path_keeps_a_good_path_as_given() -> None:
    assert validation.check_path(Path("/tmp/ü x"), "where") == "/tmp/ü x"


def test_check_language_normalises_spellings_and_names_the_known_ones() -> None:
    names = {"python": "python", "py": "python", "markdown": "markdown", "md": "markdown"}
    assert [validation.check_language(v, names) for v in ("Python", ".py", " md ")] == ["python"] * 2 + [
        "markdown"
    ]
    with pytest.raises(
        InvalidInputError, match=r"^language 'cobol' is not a known language: use one of markdown, python "
    ):
        validation.check_language("cobol", names)
    with pytest.raises(InvalidInputError, match="non-empty"):
        validation.check_language(" ", names)
