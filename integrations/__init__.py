"""Adapters that plug memstrata into orchestrators' own memory interfaces.

Each module imports its framework lazily and needs the matching extra:
``memstrata.integrations.langgraph`` (``memstrata[langgraph]``),
``memstrata.integrations.openai_agents`` (``memstrata[openai-agents]``),
``memstrata.integrations.autogen`` (``memstrata[autogen]``).
"""

if __name__ != "memstrata.integrations":  # nothing generic may be importable at top level
    raise ImportError(f"import memstrata.integrations, not {__name__}: it is part of the memstrata package")
