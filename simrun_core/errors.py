"""Errors of the domain that name what is wrong and where."""


class WorkflowError(ValueError):
    """A workflow which is not valid; the message names the task and the field."""
