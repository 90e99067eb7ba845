"""The memory tools over MCP (stdio), with the official ``mcp`` SDK's low-level server.

The tools, their schemas, annotations (read-only, destructive, idempotent: the registry's flags)
and their dispatcher are those of :mod:`memstrata.bridges.tools`, plus an optional ``agent_id``
argument (default: the server's agent; ``agent_id_argument=False`` binds every call to it). A
tool error comes back as a normal result with ``isError`` set and ``{"error": "..."}`` as its
text, so the model reads it; the protocol itself only fails for protocol faults. Tool calls run
in worker threads, so a slow embedding never blocks the session's event loop.

The stdio transport is memstrata's, not the SDK's: the SDK's drops a line it cannot validate
(not JSON, invalid UTF-8, too deep, an object as id, params that are not an object, an escaped
lone surrogate) without answering. Here every line is judged first with the JSON-lines server's
checks (:func:`memstrata.bridges._rpc_protocol.decode_line`), so each bad line gets exactly one JSON-RPC
error (with its id when it has a usable one, else ``null``) and the session goes on.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import threading
import typing
from collections import Counter
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

from memstrata.core.errors import MemstrataError

from ._json import MAX_DEPTH, dumps
from ._rpc_protocol import (
    DEFAULT_MAX_LINE_BYTES,
    ErrorCode,
    IdentifiedError,
    LineError,
    decode_line,
    read_line,
)
from ._schema import describe_type
from .tools import TOOLS, dispatch, mcp_annotations, tool_schemas

if TYPE_CHECKING:
    from memstrata._workspaces import Workspaces

__all__ = ["build_server", "judge_line", "require_sdk", "run_stdio", "serve_lines"]

_MISSING = "the MCP server needs the optional 'mcp' extra: pip install 'memstrata[mcp]'"

_INSTRUCTIONS = (
    "Long-term memory for this agent. Search before you start (memory_search, knowledge_query), "
    "read more with memory_get, and save what is worth keeping (memory_add, knowledge_store)."
)


def require_sdk() -> None:
    """Raise a one-line :class:`MemstrataError` naming the extra when the SDK is missing."""
    try:
        import mcp.server.lowlevel
        import mcp.server.stdio  # noqa: F401
    except ImportError as exc:
        raise MemstrataError(_MISSING) from exc


def _split_agent(arguments: dict[str, Any] | None, default: str) -> tuple[Any, str]:
    if not arguments or "agent_id" not in arguments:
        return arguments or {}, default
    rest = dict(arguments)
    agent = rest.pop("agent_id")
    return rest, default if agent is None else agent  # null: left out, as for every optional argument


def call(system: Any, workspaces: Workspaces | None, name: str, arguments: Any, agent_id: str) -> Any:
    """One tool call as the MCP server runs it (synchronous; never raises)."""
    args, agent = _split_agent(arguments if isinstance(arguments, dict) else None, agent_id)
    if not isinstance(agent, str) or not agent:
        return {"error": f"{name}: argument 'agent_id' must be a non-empty string"}
    if arguments is not None and not isinstance(arguments, dict):
        args = arguments
    return dispatch(name, args, system, agent_id=agent, workspaces=workspaces)


def build_server(
    system: Any, workspaces: Workspaces | None, *, agent_id: str, agent_id_argument: bool = True
) -> Any:
    """A low-level MCP ``Server`` exposing the memory tools for ``system``.

    ``agent_id_argument`` offers each tool an optional ``agent_id`` argument (one server, several
    agents); without it every call uses ``agent_id`` and an ``agent_id`` argument is refused."""
    require_sdk()
    import anyio.to_thread
    from mcp import types
    from mcp.server.lowlevel import Server

    from memstrata import __version__

    tools = [
        types.Tool(
            name=schema["name"],
            title=tool.title,
            description=schema["description"],
            input_schema=schema["parameters"],
            annotations=types.ToolAnnotations.model_validate(mcp_annotations(tool)),
        )
        for tool, schema in zip(TOOLS, tool_schemas(agent_id_argument=agent_id_argument), strict=True)
    ]

    async def list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: Any) -> Any:
        name, arguments = params.name, params.arguments

        def run() -> Any:
            if not agent_id_argument:
                return dispatch(name, arguments, system, agent_id=agent_id, workspaces=workspaces)
            return call(system, workspaces, name, arguments, agent_id)

        result = await anyio.to_thread.run_sync(run)
        is_error = isinstance(result, dict) and set(result) == {"error"}
        structured = result if isinstance(result, dict) else {"results": result}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=dumps(result).decode("utf-8"))],
            structured_content=structured,
            is_error=is_error,
        )

    return Server(
        "memstrata",
        version=__version__,
        instructions=_INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _error(request_id: Any, code: ErrorCode, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": int(code), "message": message}}


def _lone_surrogate(value: Any) -> str | None:
    """Where a parsed message holds a lone surrogate (it cannot be handed on as UTF-8), if anywhere."""
    stack: list[tuple[Any, str]] = [(value, "message")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return (
                    f"{where} holds a lone surrogate (\\u{ord(item[exc.start]):04x}) at character {exc.start}"
                )
        elif isinstance(item, dict):
            for key, child in item.items():
                stack.append((key, f"a key in {where}"))
                stack.append((child, f"{where}.{key}" if isinstance(key, str) else where))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
    return None


def _tool_call_problem(params: dict[str, Any]) -> str | None:
    """What the SDK refuses in a ``tools/call``'s params, named: its own error says only
    "Invalid request parameters" (a model that sends its arguments as a JSON string must learn
    which param is wrong)."""
    if "name" not in params:
        return "param 'name' is required"
    if not isinstance(params["name"], str):
        return f"param 'name' must be a string, got {describe_type(params['name'])}"
    arguments = params.get("arguments")
    if arguments is not None and not isinstance(arguments, dict):
        return f"param 'arguments' must be an object, got {describe_type(arguments)}"
    return None


@functools.cache
def _request_types() -> dict[str, Any]:
    """The SDK's model of each client request, by method (its union has no discriminator, so a
    failed validation lists a complaint from every member)."""
    from mcp import types

    return {
        typing.get_args(cls.model_fields["method"].annotation)[0]: cls
        for cls in typing.get_args(types.ClientRequest)
    }


def _params_problem(method: str, params: dict[str, Any] | None) -> str | None:
    """What the SDK's model of ``method`` refuses in ``params``, named (the SDK answers only
    "Invalid request parameters"); ``None`` for a method it does not know (it says so itself)."""
    model = _request_types().get(method)
    if model is None:
        return None
    request = {"method": method} if params is None else {"method": method, "params": params}
    try:
        model.model_validate(request)
    except Exception as exc:  # pydantic's ValidationError
        errors = exc.errors() if callable(getattr(exc, "errors", None)) else []  # type: ignore[attr-defined]
        first = errors[0] if errors else {}
        where = ".".join(str(part) for part in first.get("loc", ())[1:]) or "params"
        return f"param {where!r}: {' '.join(str(first.get('msg', exc)).split())[:200]}"
    return None


def judge_line(line: bytes, *, max_depth: int = MAX_DEPTH) -> tuple[Any, dict[str, Any] | None]:
    """One input line as ``(message, None)`` for the SDK, or ``(None, error response)``.

    Hostile lines are answered here because the SDK's transport drops what it cannot validate.
    """
    from mcp import types

    try:
        request = decode_line(line, max_depth=max_depth, require_id=False)
    except IdentifiedError as exc:
        return None, _error(exc.request_id, exc.error.code, str(exc.error))
    except LineError as exc:
        return None, _error(None, exc.code, str(exc))
    request_id = request.get("id")
    method = request.get("method")
    if "method" in request and not isinstance(method, str):
        return None, _error(request_id, ErrorCode.INVALID_REQUEST, "'method' must be a string")
    params = request.get("params")
    if params is not None and not isinstance(params, dict):
        return None, _error(
            request_id,
            ErrorCode.INVALID_PARAMS,
            f"{method}: params must be an object, got {describe_type(params)}",
        )
    problem = _tool_call_problem(params) if method == "tools/call" and params is not None else None
    if problem is None and isinstance(method, str) and request_id is not None:
        problem = _params_problem(method, params)
    if problem is not None:
        return None, _error(request_id, ErrorCode.INVALID_PARAMS, f"{method}: {problem}")
    if _ESCAPED_SURROGATE.search(line):
        where = _lone_surrogate(request)
        if where is not None:
            return None, _error(
                request_id, ErrorCode.INVALID_PARAMS, f"{method}: {where}; text must be valid Unicode"
            )
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except Exception as exc:  # pydantic's ValidationError: name the first problem, on one line
        errors = getattr(exc, "errors", None)
        detail = str(exc)
        if callable(errors):
            with contextlib.suppress(Exception):
                first = errors()[0]
                detail = f"{'.'.join(str(p) for p in first.get('loc', ()))}: {first.get('msg')}"
        text = " ".join(detail.split())[:300]
        return None, _error(
            request_id, ErrorCode.INVALID_REQUEST, f"not a valid JSON-RPC 2.0 message: {text}"
        )
    return message, None


_NOT_INITIALIZED = "the session is not initialized yet: send 'initialize' first"


def _encode(message: Any) -> bytes:
    try:
        text: str = message.model_dump_json(by_alias=True, exclude_unset=True)
        return text.encode("utf-8") + b"\n"
    except Exception:  # e.g. a lone surrogate in a result: written repaired, never dropped
        return dumps(message.model_dump(by_alias=True, exclude_unset=True, mode="python")) + b"\n"


async def serve_lines(
    server: Any,
    reader: IO[bytes],
    writer: IO[bytes],
    *,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    max_depth: int = MAX_DEPTH,
    drain_timeout_s: float = 300.0,
) -> None:
    """Run ``server`` over JSON-RPC lines on a pair of byte streams until end of input.

    At end of input, the requests already handed on are answered first (for at most
    ``drain_timeout_s``), so a client that writes its requests and closes still gets every answer.
    """
    import anyio
    import anyio.to_thread
    from mcp.shared._context_streams import create_context_streams
    from mcp.shared.message import SessionMessage

    write_lock = threading.Lock()

    def write(data: bytes) -> None:
        with write_lock:
            writer.write(data)
            writer.flush()

    read_send, read_receive = create_context_streams[Any](0)
    write_send, write_receive = create_context_streams[Any](0)
    # requests handed to the server and not answered yet, counted by id (a client may reuse an
    # id): end of input waits for them
    unanswered: Counter[Any] = Counter()
    answered = [anyio.Event()]

    def settle(request_id: Any) -> None:
        """One request of ``request_id`` needs no more waiting: answered, or cancelled (MCP
        answers no cancelled request)."""
        if unanswered[request_id] > 1:
            unanswered[request_id] -= 1
        elif unanswered.pop(request_id, 0):
            answered[0].set()

    async def read_input() -> None:
        initialized = False
        async with read_send:
            while True:
                try:
                    line = await anyio.to_thread.run_sync(read_line, reader, max_line_bytes)
                except LineError as exc:
                    await anyio.to_thread.run_sync(write, dumps(_error(None, exc.code, str(exc))) + b"\n")
                    continue
                if line is None:
                    break
                if not line.strip():
                    continue
                message, error = judge_line(line, max_depth=max_depth)
                if error is not None:
                    await anyio.to_thread.run_sync(write, dumps(error) + b"\n")
                    continue
                inner = getattr(message, "root", message)
                method = getattr(inner, "method", None)
                if method is not None and getattr(inner, "id", None) is not None:
                    if not initialized and method not in (
                        "initialize",
                        "ping",
                    ):  # the SDK's answer names nothing
                        refused = _error(inner.id, ErrorCode.INVALID_REQUEST, f"{method}: {_NOT_INITIALIZED}")
                        await anyio.to_thread.run_sync(write, dumps(refused) + b"\n")
                        continue
                    initialized = initialized or method == "initialize"
                    unanswered[inner.id] += 1
                elif method == "notifications/cancelled" and isinstance(getattr(inner, "params", None), dict):
                    settle(inner.params.get("requestId"))
                await read_send.send(SessionMessage(message))
            with anyio.move_on_after(drain_timeout_s):
                while unanswered:
                    await answered[0].wait()
                    answered[0] = anyio.Event()

    async def write_output() -> None:
        async with write_receive:
            async for session_message in write_receive:
                await anyio.to_thread.run_sync(write, _encode(session_message.message))
                inner = getattr(session_message.message, "root", session_message.message)
                if getattr(inner, "method", None) is None and getattr(inner, "id", None) is not None:
                    settle(inner.id)

    async with anyio.create_task_group() as group:
        group.start_soon(read_input)
        group.start_soon(write_output)
        await server.run(read_receive, write_send, server.create_initialization_options())


@contextlib.contextmanager
def _claim_stdio() -> Iterator[tuple[IO[bytes], IO[bytes]]]:
    """The protocol's own copies of stdin/stdout; meanwhile fd 0 reads nothing and fd 1 goes to
    stderr, so stray output of a library cannot corrupt the protocol stream."""
    sys.stdout.flush()
    wire_in, wire_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    try:
        with os.fdopen(wire_in, "rb") as reader, os.fdopen(wire_out, "wb") as writer:
            yield reader, writer
    finally:
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)


def run_stdio(
    system: Any,
    workspaces: Workspaces | None,
    *,
    agent_id: str,
    agent_id_argument: bool = True,
    reader: IO[bytes] | None = None,
) -> None:
    """Serve MCP on this process's stdin/stdout until the client closes the connection;
    ``reader``: the requests to answer instead of stdin's (those written before a SIGTERM)."""
    require_sdk()
    import anyio

    server = build_server(system, workspaces, agent_id=agent_id, agent_id_argument=agent_id_argument)
    with _claim_stdio() as (stdin, writer):
        anyio.run(lambda: serve_lines(server, stdin if reader is None else reader, writer))
