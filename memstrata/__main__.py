"""``python -m memstrata``: the command line."""

from memstrata.bridges._console import main

if __name__ == "__main__":
    main()
