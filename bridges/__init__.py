"""memstrata.bridges"""

if __name__ != "memstrata.bridges":  # nothing generic may be importable at top level
    raise ImportError(f"import memstrata.bridges, not {__name__}: it is part of the memstrata package")
