"""``python -m effectgate.cli``: the same as the ``effectgate`` command."""

from effectgate.cli import main

if __name__ == "__main__":
    main(prog_name="effectgate")
