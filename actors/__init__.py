"""memstrata.actors"""

if __name__ != "memstrata.actors":  # nothing generic may be importable at top level
    raise ImportError("import memstrata.actors, not actors: memstrata's folders live under the memstrata package")
