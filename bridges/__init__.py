"""memstrata.bridges"""

if __name__ != "memstrata.bridges":  # nothing generic may be importable at top level
    raise ImportError("import memstrata.bridges, not bridges: memstrata's folders live under the memstrata package")
