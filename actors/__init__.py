"""memstrata.actors"""

if __name__ != "memstrata.actors":  # nothing generic may be importable at top level
    raise ImportError(f"import memstrata.actors, not {__name__}: it is part of the memstrata package")
