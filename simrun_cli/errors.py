"""The errors of the command line that end a command with a message and an exit code."""


class CliError(Exception):
    """A command cannot go on: `message` goes to stderr, the command exits with `code`."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def check_id(value: str, what: str = "run") -> str:
    """The id of a run (or a task) as given; CliError for an empty one, which would name
    another route (`/runs//history`) rather than no run."""
    if not value.strip():
        shown = "" if value == "" else f" ({value!r})"
        listing = "simrun list" if what == "run" else "simrun status RUN"
        raise CliError(f"the {what} id is empty{shown}: give the id of a {what} ({listing})")
    return value
