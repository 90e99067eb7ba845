"""The memory tools over MCP (stdio), with the official ``mcp`` SDK's low-level server.

The tools, their schemas and their dispatcher are those of :mod:`memstrata.bridges.tools`, plus
an optional ``agent_id`` argument (default: the server's agent). A tool error comes back as a
normal result with ``isError`` set and ``{"error": "..."}`` as its text, so the model reads it;
the protocol itself only fails for protocol faults. Tool calls run in worker threads, so a slow
embedding never blocks the session's event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memstrata.errors import MemstrataError

from ._json import dumps
from .tools import dispatch, tool_schemas

if TYPE_CHECKING:
    from memstrata._workspaces import Workspaces

__all__ = ["build_server", "require_sdk", "run_stdio"]

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
    return rest, agent


def call(system: Any, workspaces: Workspaces | None, name: str, arguments: Any, agent_id: str) -> Any:
    """One tool call as the MCP server runs it (synchronous; never raises)."""
    args, agent = _split_agent(arguments if isinstance(arguments, dict) else None, agent_id)
    if not isinstance(agent, str) or not agent:
        return {"error": f"{name}: argument 'agent_id' must be a non-empty string"}
    if arguments is not None and not isinstance(arguments, dict):
        args = arguments
    return dispatch(name, args, system, agent_id=agent, workspaces=workspaces)


def build_server(system: Any, workspaces: Workspaces | None, *, agent_id: str) -> Any:
    """A low-level MCP ``Server`` exposing the memory tools for ``system``."""
    require_sdk()
    import anyio.to_thread
    from mcp import types
    from mcp.server.lowlevel import Server

    from memstrata import __version__

    tools = [
        types.Tool(name=t["name"], description=t["description"], input_schema=t["parameters"])
        for t in tool_schemas(agent_id_argument=True)
    ]

    async def list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: Any) -> Any:
        name, arguments = params.name, params.arguments

        def run() -> Any:
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


def run_stdio(system: Any, workspaces: Workspaces | None, *, agent_id: str) -> None:
    """Serve MCP on this process's stdin/stdout until the client closes the connection."""
    require_sdk()
    import anyio
    from mcp.server.stdio import stdio_server

    server = build_server(system, workspaces, agent_id=agent_id)

    async def serve() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(serve)
