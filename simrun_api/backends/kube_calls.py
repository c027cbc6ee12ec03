"""The calls of the Kubernetes API the cluster backend makes with `_preload_content=False`: the
body read once (so an answer is the JSON the API serialises, not a model kubernetes-asyncio
builds), an error status raised as ApiException, a 404 of a delete ignored."""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException


async def read_body(response: Any) -> bytes:
    """The body of a response read with `_preload_content=False`; ApiException for an error
    status (kubernetes-asyncio checks the status only when it reads the body itself)."""
    try:
        data: bytes = await response.read()
    finally:
        response.release()
    if not 200 <= response.status <= 299:
        error = ApiException(status=response.status, reason=response.reason)
        error.body = data
        raise error
    return data


async def read_json(call: Awaitable[Any]) -> Any:
    """The JSON of a call made with `_preload_content=False`, as the API serialises it."""
    return json.loads(await read_body(await call))


async def ignore_missing(call: Awaitable[Any]) -> None:
    """Make a call made with `_preload_content=False`; a 404 (it is gone already) is no
    error."""
    try:
        await read_body(await call)
    except ApiException as error:
        if error.status != 404:
            raise
