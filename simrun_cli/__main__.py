"""`python -m simrun_cli`: the same as the `simrun` command."""

from simrun_cli.main import main

if __name__ == "__main__":
    main()
