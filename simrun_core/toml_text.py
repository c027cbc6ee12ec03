"""TOML text of parsed TOML: what `tomllib` reads, written back (`tomllib` only reads).

For a `pyproject.toml` changed as data (the temporary project of an environment,
`simrun_core.environment.project_pyproject`): tables as `[headers]`, arrays of tables as
`[[headers]]`, everything else inline. Comments and the layout of the original are not kept;
`tomllib.loads(dumps(data)) == data` for every value `tomllib` gives. Pure.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

_BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")


def dumps(data: Mapping[str, Any]) -> str:
    """The TOML document of a table; TypeError for a value TOML has no form of."""
    lines: list[str] = []
    _table(lines, (), data)
    return "\n".join(lines).strip("\n") + "\n"


def _table(lines: list[str], path: tuple[str, ...], table: Mapping[str, Any]) -> None:
    inline = [(key, value) for key, value in table.items() if not _is_section(value)]
    tables = [(key, value) for key, value in table.items() if isinstance(value, Mapping)]
    arrays = [(key, value) for key, value in table.items() if _is_table_array(value)]
    if path and (inline or not (tables or arrays)):
        lines += ["", f"[{_dotted(path)}]"]
    lines += [f"{_key(key)} = {_value(value)}" for key, value in inline]
    for key, value in tables:
        _table(lines, (*path, key), value)
    for key, items in arrays:
        for item in items:
            lines += ["", f"[[{_dotted((*path, key))}]]"]
            _array_item(lines, (*path, key), item)


def _array_item(lines: list[str], path: tuple[str, ...], item: Mapping[str, Any]) -> None:
    """The body of one `[[path]]`: its values, then its tables below the header."""
    lines += [
        f"{_key(key)} = {_value(value)}" for key, value in item.items() if not _is_section(value)
    ]
    for key, value in item.items():
        if isinstance(value, Mapping):
            _table(lines, (*path, key), value)
        elif _is_table_array(value):
            for nested in value:
                lines += ["", f"[[{_dotted((*path, key))}]]"]
                _array_item(lines, (*path, key), nested)


def _is_section(value: Any) -> bool:
    return isinstance(value, Mapping) or _is_table_array(value)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _dotted(path: Sequence[str]) -> str:
    return ".".join(_key(part) for part in path)


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(text: str) -> str:
    # A JSON string is a TOML basic string, but for DEL, which TOML wants escaped.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, datetime.date | datetime.time):  # datetime is a date
        return value.isoformat()
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    raise TypeError(f"TOML has no value of {type(value).__name__}: {value!r}")
