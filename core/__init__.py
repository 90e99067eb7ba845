"""The ground floor every other part imports: errors, config, the one validation module, constants.

Nothing here imports storage, layers, actors, bridges or the facade.
"""

if __name__ != "memstrata.core":  # nothing generic may be importable at top level
    raise ImportError(f"import memstrata.core, not {__name__}: it is part of the memstrata package")
