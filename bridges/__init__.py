"""memstrata.bridges: the outside world's ways in.

``memstrata.bridges.cli`` (the ``memstrata`` command), ``memstrata.bridges.tools`` (LLM tool
schemas and their dispatcher); the JSON-lines server (``memstrata serve``) and the MCP server
(``memstrata mcp``) are started from the command line.
"""

if __name__ != "memstrata.bridges":  # nothing generic may be importable at top level
    raise ImportError(f"import memstrata.bridges, not {__name__}: it is part of the memstrata package")
