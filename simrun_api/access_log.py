"""The access log of the service without secrets: the values of query parameters named like a
secret (`token`, `access_token`, `api_key`, `secret`, `password`, ...) are written as
`REDACTED`. The service takes its token from the `Authorization` header only, but a client may
still put one in a URL, and the access log is read by more people than the tokens file."""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus

ACCESS_LOGGER = "uvicorn.access"
REDACTED = "REDACTED"
SECRET_NAME = re.compile(r"token|key|secret|passw|pwd|auth|credential|signature|cookie", re.I)


def redact_query(path: str) -> str:
    """`path` (with its query string) with the values of secret-like parameters replaced."""
    base, question, query = path.partition("?")
    if not question:
        return path
    parameters = []
    for parameter in query.split("&"):
        name, equals, _ = parameter.partition("=")
        if equals and SECRET_NAME.search(unquote_plus(name)):
            parameter = f"{name}={REDACTED}"
        parameters.append(parameter)
    return f"{base}?{'&'.join(parameters)}"


class RedactQuerySecrets(logging.Filter):
    """Redacts the path of uvicorn's access log records (`client - "METHOD PATH HTTP/v" status`,
    the path its third argument)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True


def redact_access_log() -> None:
    """Redact the access log from now on (once; after uvicorn configured its logging)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(known, RedactQuerySecrets) for known in logger.filters):
        logger.addFilter(RedactQuerySecrets())
