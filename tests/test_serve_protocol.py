"""The JSON-RPC machinery in-process, over a small method table: framing, limits, lanes, errors."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import orjson
import pytest

from memstrata.bridges._server import ErrorCode, JsonLinesServer, Method
from memstrata.errors import DatabaseBusyError, InvalidInputError, StorageError


class _Output(io.RawIOBase):
    """Collects response lines and fires an event when a response with a given id is written."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.written: dict[Any, threading.Event] = {}
        self._lock = threading.Lock()

    def on(self, request_id: Any) -> threading.Event:
        return self.written.setdefault(request_id, threading.Event())

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        for raw in bytes(data).splitlines():
            message = orjson.loads(raw)
            for response in message if isinstance(message, list) else [message]:
                with self._lock:
                    self.lines.append(response)
                self.on(response.get("id")).set()
        return len(data)

    def by_id(self) -> dict[Any, dict[str, Any]]:
        return {r["id"]: r for r in self.lines}


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def _table(out: _Output, log: list[Any]) -> dict[str, Method]:
    def echo(p: dict[str, Any]) -> Any:
        return p

    def wait_for(p: dict[str, Any]) -> Any:
        assert out.on(p["until_id"]).wait(10), "the other response never came"
        return "waited"

    def append(p: dict[str, Any]) -> Any:
        if "until_id" in p:
            assert out.on(p["until_id"]).wait(10)
        log.append(p["n"])
        return p["n"]

    def fail(p: dict[str, Any]) -> Any:
        kind = p["kind"]
        if kind == "invalid":
            raise InvalidInputError("category 'Bad Cat' is not valid")
        if kind == "busy":
            raise DatabaseBusyError("database x stayed locked")
        if kind == "storage":
            raise StorageError("disk full\nsecond line")
        raise RuntimeError("boom")

    return {
        "echo": Method("echo", {"type": "object"}, echo),
        "wait_for": Method(
            "wait_for",
            _obj({"until_id": {}, "lane": {"type": "string"}}, ["until_id"]),
            wait_for,
            lambda p: p.get("lane"),
        ),
        "append": Method(
            "append",
            _obj({"n": {"type": "integer"}, "until_id": {}}, ["n"]),
            append,
            lambda p: "log",
        ),
        "fail": Method("fail", _obj({"kind": {"type": "string"}}, ["kind"]), fail),
    }


def _serve(lines: list[bytes], **options: Any) -> tuple[_Output, list[Any], JsonLinesServer]:
    out = _Output()
    log: list[Any] = []
    server = JsonLinesServer(_table(out, log), workers=4, **options)
    server.serve(io.BytesIO(b"".join(lines)), out)  # type: ignore[arg-type]
    return out, log, server


def _line(obj: Any) -> bytes:
    return orjson.dumps(obj) + b"\n"


def test_valid_request_gets_result_with_its_id() -> None:
    out, _, server = _serve([_line({"id": 1, "method": "echo", "params": {"a": [1, 2]}})])
    assert out.lines == [{"jsonrpc": "2.0", "id": 1, "result": {"a": [1, 2]}}]
    assert server.stats.requests == 1


def test_string_ids_and_missing_params() -> None:
    out, _, _ = _serve(
        [_line({"id": "x-1", "method": "echo"}), _line({"id": 2, "method": "echo", "params": None})]
    )
    assert out.by_id() == {
        "x-1": {"jsonrpc": "2.0", "id": "x-1", "result": {}},
        2: {"jsonrpc": "2.0", "id": 2, "result": {}},
    }


def test_responses_come_out_of_order_and_match_by_id() -> None:
    out, _, _ = _serve(
        [
            _line({"id": 1, "method": "wait_for", "params": {"until_id": 2, "lane": "a"}}),
            _line({"id": 2, "method": "echo", "params": {"second": True}}),
        ]
    )
    assert [r["id"] for r in out.lines] == [2, 1]
    assert out.by_id()[1]["result"] == "waited"


def test_same_lane_runs_in_arrival_order_even_with_free_workers() -> None:
    requests = [_line({"id": 0, "method": "append", "params": {"n": 0, "until_id": "go"}})]
    requests += [_line({"id": n, "method": "append", "params": {"n": n}}) for n in range(1, 20)]
    requests.append(_line({"id": "go", "method": "echo"}))
    out, log, _ = _serve(requests)
    assert log == list(range(20))
    assert len(out.lines) == 21


def test_malformed_lines_get_null_id_errors_and_serving_continues() -> None:
    bad = [
        b"{not json\n",
        b"\xff\xfe garbage\n",
        b"[1, 2, 3]\n",  # a batch of three invalid requests: three errors
        b'"just a string"\n',
        b'{"method": 7}\n',  # no id, but not a notification either: not a request
        b'{"id": true, "method": "echo"}\n',
        b'{"id": {"a": 1}, "method": "echo"}\n',
    ]
    out, _, server = _serve([*bad, _line({"id": 9, "method": "echo"})])
    errors = [r for r in out.lines if "error" in r]
    assert len(errors) == len(bad) + 2
    assert all(r["id"] is None for r in errors)
    codes = [r["error"]["code"] for r in errors]
    assert codes[:2] == [ErrorCode.PARSE_ERROR, ErrorCode.PARSE_ERROR]
    assert set(codes[2:]) == {ErrorCode.INVALID_REQUEST}
    assert out.by_id()[9] == {"jsonrpc": "2.0", "id": 9, "result": {}}
    assert server.stats.bad_lines == len(bad) + 2
    assert all("\n" not in r["error"]["message"] for r in errors)


def test_blank_lines_are_ignored() -> None:
    out, _, _ = _serve([b"\n", b"   \r\n", _line({"id": 1, "method": "echo"})])
    assert out.lines == [{"jsonrpc": "2.0", "id": 1, "result": {}}]


def test_unknown_method_and_unknown_field_keep_the_id() -> None:
    out, _, _ = _serve(
        [
            _line({"id": 1, "method": "drop_tables"}),
            _line({"id": 2, "method": "echo", "param": {}}),
            _line({"id": 3, "method": 42}),
        ]
    )
    by_id = out.by_id()
    assert by_id[1]["error"]["code"] == ErrorCode.METHOD_NOT_FOUND
    assert "drop_tables" in by_id[1]["error"]["message"] and "echo" in by_id[1]["error"]["message"]
    assert by_id[2]["error"]["code"] == ErrorCode.INVALID_REQUEST
    assert "'param'" in by_id[2]["error"]["message"]
    assert by_id[3]["error"]["code"] == ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({}, "missing required param 'kind'"),
        ({"kind": 5}, "param 'kind' must be a string, got an integer"),
        ({"kind": "x", "extra": 1}, "unknown param 'extra'"),
        ([1, 2], "params must be an object, got an array"),
        ("text", "params must be an object, got a string"),
    ],
)
def test_invalid_params_name_the_param(params: Any, needle: str) -> None:
    out, _, _ = _serve([_line({"id": 1, "method": "fail", "params": params})])
    (response,) = out.lines
    assert response["error"]["code"] == ErrorCode.INVALID_PARAMS
    assert needle in response["error"]["message"]


@pytest.mark.parametrize(
    ("kind", "code", "needle"),
    [
        ("invalid", ErrorCode.INVALID_PARAMS, "category 'Bad Cat'"),
        ("busy", ErrorCode.BUSY, "stayed locked"),
        ("storage", ErrorCode.RUNTIME_ERROR, "disk full second line"),
        ("boom", ErrorCode.INTERNAL_ERROR, "internal error: RuntimeError: boom"),
    ],
)
def test_method_errors_map_to_codes_as_one_line(kind: str, code: ErrorCode, needle: str) -> None:
    out, _, _ = _serve([_line({"id": 7, "method": "fail", "params": {"kind": kind}})])
    (response,) = out.lines
    assert response["id"] == 7
    assert response["error"]["code"] == code
    assert needle in response["error"]["message"]
    assert "Traceback" not in response["error"]["message"]


def test_oversized_line_is_refused_and_the_next_line_is_served() -> None:
    huge = _line({"id": 1, "method": "echo", "params": {"blob": "x" * 5000}})
    out, _, _ = _serve([huge, _line({"id": 2, "method": "echo"})], max_line_bytes=1000)
    assert out.lines[0]["id"] is None
    assert out.lines[0]["error"]["code"] == ErrorCode.INVALID_REQUEST
    assert "longer than 1000 bytes" in out.lines[0]["error"]["message"]
    assert out.lines[1] == {"jsonrpc": "2.0", "id": 2, "result": {}}


def test_line_exactly_at_the_limit_is_accepted() -> None:
    body = orjson.dumps({"id": 1, "method": "echo", "params": {"p": ""}})
    padded = body[:-3] + b"x" * (100 - len(body)) + body[-3:]
    assert len(padded) == 100
    out, _, _ = _serve([padded + b"\n"], max_line_bytes=100)
    assert out.lines[0]["id"] == 1 and "result" in out.lines[0]


@pytest.mark.parametrize("depth", [80, 5000])
def test_deeply_nested_request_is_refused(depth: int) -> None:
    nested = b'{"id": 1, "method": "echo", "params": {"v": ' + b"[" * depth + b"]" * depth + b"}}\n"
    out, _, _ = _serve([nested, _line({"id": 2, "method": "echo"})])
    # past orjson's own limit the id cannot be read; below it, the answer keeps the id
    assert out.lines[0]["id"] == (None if depth > 1000 else 1)
    assert out.lines[0]["error"]["code"] == ErrorCode.INVALID_REQUEST
    assert "nested deeper than" in out.lines[0]["error"]["message"]
    assert out.lines[1]["id"] == 2


def test_last_line_without_newline_is_served() -> None:
    out, _, _ = _serve([b'{"id": 1, "method": "echo"}'])
    assert out.lines == [{"jsonrpc": "2.0", "id": 1, "result": {}}]


def test_lone_surrogate_in_a_result_is_written_not_dropped() -> None:
    def odd(_p: dict[str, Any]) -> Any:
        return {"text": "a\ud800b"}

    out = _Output()
    server = JsonLinesServer({"odd": Method("odd", {"type": "object"}, odd)})
    server.serve(io.BytesIO(_line({"id": 1, "method": "odd"})), out)  # type: ignore[arg-type]
    assert out.lines[0]["result"]["text"].startswith("a") and out.lines[0]["result"]["text"].endswith("b")


_BIG = 123456789012345678901234567890


def test_an_escaped_lone_surrogate_id_is_echoed_exactly() -> None:
    lines = [
        b'{"id": "\\ud800", "method": "echo"}',
        b'{"id": "x\\udc00", "method": "nope"}',
        f'{{"id": "\\udfff", "method": "echo", "params": {{"v": {_BIG}}}}}'.encode(),
    ]
    out = io.BytesIO()
    JsonLinesServer({"echo": Method("echo", {"type": "object"}, lambda p: p)}).serve(
        io.BytesIO(b"\n".join(lines)), out
    )
    raw = out.getvalue()
    assert raw.count(b'"id":"\\ud800"') == raw.count(b'"id":"x\\udc00"') == raw.count(b'"id":"\\udfff"') == 1
    by_id = {r["id"]: r for r in map(json.loads, raw.decode("utf-8").splitlines())}
    assert by_id["\ud800"]["result"] == {}
    assert by_id["x\udc00"]["error"]["code"] == ErrorCode.METHOD_NOT_FOUND
    assert by_id["\udfff"]["error"]["code"] == ErrorCode.INVALID_PARAMS
    assert str(_BIG) in by_id["\udfff"]["error"]["message"]


def test_integers_beyond_64_bits_are_refused_never_read_as_floats() -> None:
    def raw(text: str) -> bytes:
        return text.encode() + b"\n"

    out, _, _ = _serve(
        [
            raw(f'{{"id": 1, "method": "echo", "params": {{"v": {{"n": {_BIG}}}}}}}'),
            raw(f'{{"id": 2, "method": "echo", "params": {{"v": [{2**63 - 1}, {-(2**63)}, 1.5e300]}}}}'),
            raw(f'{{"id": 3, "method": "echo", "params": {{"v": {2**63}}}}}'),  # orjson reads it as an int
            raw(f'{{"id": 4, "method": "echo", "params": {{"v": "{_BIG}"}}}}'),
            raw(f'{{"id": {_BIG}, "method": "echo"}}'),
            raw(f'{{"id": 5, "method": "echo", "extra": -{_BIG}}}'),
            raw(f'{{"method": "echo", "params": {{"v": {_BIG}}}}}'),  # a notification: not answered
            raw(f'[{{"id": 6, "method": "echo", "params": {{"v": {_BIG}}}}}, {{"id": 7, "method": "echo"}}]'),
        ]
    )
    by_id = out.by_id()
    assert set(by_id) == {None, 1, 2, 3, 4, 5, 6, 7}, out.lines
    assert by_id[1]["error"] == {
        "code": ErrorCode.INVALID_PARAMS,
        "message": f"echo: integer {_BIG} in param 'v.n' is outside the 64-bit range (-2**63 to 2**63 - 1)",
    }
    assert by_id[2]["result"] == {"v": [2**63 - 1, -(2**63), 1.5e300]}
    assert by_id[3]["error"]["code"] == ErrorCode.INVALID_PARAMS
    assert f"integer {2**63} in param 'v'" in by_id[3]["error"]["message"]
    assert by_id[4]["result"] == {"v": str(_BIG)}
    assert by_id[None]["error"] == {
        "code": ErrorCode.INVALID_REQUEST,
        "message": f"a request's 'id' {_BIG} is outside the 64-bit range (-2**63 to 2**63 - 1)",
    }
    assert by_id[5]["error"]["code"] == ErrorCode.INVALID_REQUEST
    assert f"integer -{_BIG} at 'extra'" in by_id[5]["error"]["message"]
    assert by_id[6]["error"]["code"] == ErrorCode.INVALID_PARAMS
    assert by_id[7]["result"] == {}
    assert len(out.lines) == 8


def test_nan_is_refused_even_on_a_line_with_an_escaped_surrogate() -> None:
    out, _, _ = _serve(
        [
            b'{"id": "\\ud800", "method": "echo", "params": {"v": NaN}}\n',
            b'{"id": 1, "method": "echo", "params": {"v": [1, -Infinity]}}\n',
        ]
    )
    messages = [r["error"]["message"] for r in out.lines]
    assert all(r["id"] is None and r["error"]["code"] == ErrorCode.PARSE_ERROR for r in out.lines)
    assert messages == [
        "invalid JSON: NaN is not a JSON number (numbers must be finite)",
        "invalid JSON: -Infinity is not a JSON number (numbers must be finite): line 1 column 49 (char 48)",
    ]


_DOUBLE = "is outside the range of a double (magnitude up to about 1.8e308)"


def test_numbers_beyond_a_double_are_refused_with_the_request_id_never_read_as_infinity() -> None:
    out, _, _ = _serve(
        [
            b'{"id": 1, "method": "echo", "params": {"v": {"n": 1e400}}}\n',
            b'{"id": "s", "method": "echo", "params": {"t": "\\ud800", "v": [1, -2e308]}}\n',
            b'{"id": 2, "method": "echo", "params": {"v": [1.5e300, 1e308, 1e-400, "1e400"]}}\n',
            b'{"id": 3, "method": "echo", "extra": 1' + b"0" * 400 + b".5}\n",
            b'{"id": 1e400, "method": "echo"}\n',
            b'{"method": "echo", "params": {"v": 1e400}}\n',  # a notification: not answered
            b'[{"id": 4, "method": "echo", "params": {"v": 1E+999}}, {"id": 5, "method": "echo"}]\n',
            b'{"id": 6, "method": "echo", "params": {"v": 1e400, "w": 123456789012345678901234567890}}\n',
        ]
    )
    by_id = out.by_id()
    assert set(by_id) == {None, 1, "s", 2, 3, 4, 5, 6}, out.lines
    assert by_id[1]["error"] == {
        "code": ErrorCode.INVALID_PARAMS,
        "message": f"echo: number 1e400 in param 'v.n' {_DOUBLE}",
    }
    assert by_id["s"]["error"] == {
        "code": ErrorCode.INVALID_PARAMS,
        "message": f"echo: number -2e308 in param 'v[1]' {_DOUBLE}",
    }
    assert by_id[2]["result"] == {"v": [1.5e300, 1e308, 0.0, "1e400"]}
    assert by_id[3]["error"]["code"] == ErrorCode.INVALID_REQUEST
    assert (
        by_id[3]["error"]["message"]
        == f"number 100000000000000000000000...000000.5 (402 digits) at 'extra' {_DOUBLE}"
    )
    assert by_id[None]["error"] == {
        "code": ErrorCode.INVALID_REQUEST,
        "message": f"a request's 'id' 1e400 {_DOUBLE}",
    }
    assert by_id[4]["error"]["message"] == f"echo: number 1E+999 in param 'v' {_DOUBLE}"
    assert by_id[5]["result"] == {}
    assert by_id[6]["error"]["code"] == ErrorCode.INVALID_PARAMS  # either number names the refusal
    assert len(out.lines) == 8


def test_unserialisable_result_becomes_an_error_response() -> None:
    def bad(_p: dict[str, Any]) -> Any:
        return {"value": object()}

    out = _Output()
    server = JsonLinesServer({"bad": Method("bad", {"type": "object"}, bad)})
    server.serve(io.BytesIO(_line({"id": 1, "method": "bad"})), out)  # type: ignore[arg-type]
    assert out.lines[0]["id"] == 1
    assert out.lines[0]["error"]["code"] == ErrorCode.INTERNAL_ERROR


def test_many_concurrent_requests_all_answered() -> None:
    requests = [_line({"id": i, "method": "echo", "params": {"i": i}}) for i in range(500)]
    out, _, _ = _serve(requests)
    assert sorted(r["id"] for r in out.lines) == list(range(500))
    assert all(r["result"] == {"i": r["id"]} for r in out.lines)
