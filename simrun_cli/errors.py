"""The errors of the command line that end a command with a message and an exit code."""


class CliError(Exception):
    """A command cannot go on: `message` goes to stderr, the command exits with `code`."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
