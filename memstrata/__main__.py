"""``python -m memstrata``: the command line."""

from memstrata.bridges.cli import main

if __name__ == "__main__":
    main()
