"""The object storage of the fake Kubernetes API: one resourceVersion, history, watch fan-out.

`Store` is what etcd plus the API server's registry are to a real cluster: every write takes
the next value of ONE resourceVersion counter shared by all kinds (as etcd's revision), sets
`uid`, `creationTimestamp` and `generation`, validates the object (`schemas.py`) and appends an
event to a bounded history from which watches start; a watch whose resourceVersion is older
than the history gets an ERROR event with a 410 Expired Status, as the real watch cache
answers. The HTTP layer (`api.py`) and the emulators to come (Argo controller, Kueue, kubelet)
share it; it is thread-safe, its calls are synchronous and short.

Behaviour kept from the real server because clients depend on it: no-op writes do not bump
the resourceVersion; a write carrying a stale `metadata.resourceVersion` is a 409 Conflict;
status is written only through `/status` for kinds with a status subresource (not Workflows,
whose CRD has none); objects with finalizers are only marked (`deletionTimestamp`) until their
last finalizer goes; DELETE of a Job orphans its dependents unless `propagationPolicy` says
otherwise; a watch with a selector sees an object leave it as DELETED.

Not done: RBAC and authentication, namespaces as objects (any namespace is accepted),
`limit`/`continue` paging (lists are whole), server-side apply, admission beyond the hooks
registered with `add_admission`, version conversion, the immutability rules of pod specs.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import copy
import datetime as dt
import json
import random
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import schemas
from .schemas import FieldError, Result

JSON = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


# --- errors -------------------------------------------------------------------------------


class ApiError(Exception):
    """An error the API server answers with a `Status` object."""

    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> JSON:
        body: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def _details(kind: Kind, name: str, kind_name: str | None = None) -> JSON:
    details: JSON = {"name": name}
    if kind.group:
        details["group"] = kind.group
    details["kind"] = kind_name or kind.plural
    return details


def not_found(kind: Kind, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{kind.resource} "{name}" not found', _details(kind, name))


def already_exists(kind: Kind, name: str) -> ApiError:
    return ApiError(
        409, "AlreadyExists", f'{kind.resource} "{name}" already exists', _details(kind, name)
    )


def conflict(kind: Kind, name: str, why: str) -> ApiError:
    message = f'Operation cannot be fulfilled on {kind.resource} "{name}": {why}'
    return ApiError(409, "Conflict", message, _details(kind, name))


OPTIMISTIC_LOCK = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def invalid(kind: Kind, name: str, errors: list[FieldError]) -> ApiError:
    text = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(str(e) for e in errors) + "]"
    details = _details(kind, name, kind.kind)
    details["causes"] = [{"reason": e.type, "message": e.body(), "field": e.field} for e in errors]
    return ApiError(422, "Invalid", f'{kind.qualified_kind} "{name}" is invalid: {text}', details)


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def unsupported_media(kind: Kind, content_type: str) -> ApiError:
    accepted = [JSON_PATCH, MERGE_PATCH, APPLY_PATCH]
    if kind.builtin:
        accepted.insert(2, STRATEGIC_PATCH)
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{', '.join(accepted)}" + (f" (got {content_type})" if content_type else ""),
    )


# --- kinds --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """A resource the fake serves: its names, scope and the rules of its registry."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool = False
    generation: bool = False
    builtin: bool = True  # a built-in kind: items of its lists carry no kind/apiVersion
    status_on_create: str = "keep"  # keep | drop | pod
    return_deleted: bool = False  # DELETE answers the object (pods) rather than a Status
    default_propagation: str = "Background"
    validate: Callable[[JSON], Result] | None = None
    crd: Callable[[], schemas.CrdVersion] | None = None  # schema defaults come from it
    name_rule: Callable[[str, Any], list[FieldError]] = schemas.dns_subdomain
    field_selectors: tuple[str, ...] = ("metadata.name", "metadata.namespace")
    subresources: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ("create", "delete", "get", "list", "patch", "update", "watch")

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> str:
        """The qualified resource of messages: `pods`, `workflows.argoproj.io`, `jobs.batch`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind


def _crd(filename: str) -> Callable[[], schemas.CrdVersion]:
    return lambda: schemas.crd_version(filename, "v1beta2")


def _crd_validator(filename: str) -> Callable[[JSON], Result]:
    return lambda obj: schemas.validate_crd_object(schemas.crd_version(filename, "v1beta2"), obj)


def default_kinds() -> dict[str, Kind]:
    """The kinds served, by plural (unique among them)."""
    kueue = "kueue.x-k8s.io"
    kinds = [
        Kind(
            "",
            "v1",
            "pods",
            "Pod",
            True,
            status_subresource=True,
            generation=True,
            status_on_create="pod",
            return_deleted=True,
            validate=schemas.validate_pod,
            field_selectors=(
                "metadata.name",
                "metadata.namespace",
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ),
            subresources=("status", "log"),
        ),
        Kind(
            "",
            "v1",
            "nodes",
            "Node",
            False,
            status_subresource=True,
            return_deleted=False,
            validate=schemas.validate_node,
            field_selectors=("metadata.name", "spec.unschedulable"),
            subresources=("status",),
        ),
        Kind("", "v1", "configmaps", "ConfigMap", True, validate=schemas.validate_configmap),
        Kind(
            "",
            "v1",
            "secrets",
            "Secret",
            True,
            validate=schemas.validate_secret,
            field_selectors=("metadata.name", "metadata.namespace", "type"),
        ),
        Kind(
            "batch",
            "v1",
            "jobs",
            "Job",
            True,
            status_subresource=True,
            generation=True,
            status_on_create="drop",
            default_propagation="Orphan",
            validate=schemas.validate_job,
            name_rule=schemas.dns_label,
            field_selectors=("metadata.name", "metadata.namespace", "status.successful"),
            subresources=("status",),
        ),
        Kind(
            "scheduling.k8s.io",
            "v1",
            "priorityclasses",
            "PriorityClass",
            False,
            validate=schemas.validate_priority_class,
            field_selectors=("metadata.name",),
        ),
        Kind(
            "argoproj.io",
            "v1alpha1",
            "workflows",
            "Workflow",
            True,
            generation=True,
            builtin=False,
            validate=schemas.validate_workflow,
        ),
    ]
    for plural, kind, namespaced, status in (
        ("clusterqueues", "ClusterQueue", False, True),
        ("localqueues", "LocalQueue", True, True),
        ("resourceflavors", "ResourceFlavor", False, False),
        ("workloadpriorityclasses", "WorkloadPriorityClass", False, False),
        ("topologies", "Topology", False, False),
        ("workloads", "Workload", True, True),
    ):
        filename = f"kueue/{kueue}_{plural}.yaml"
        kinds.append(
            Kind(
                kueue,
                "v1beta2",
                plural,
                kind,
                namespaced,
                status_subresource=status,
                generation=True,
                builtin=False,
                status_on_create="drop" if status else "keep",
                validate=_crd_validator(filename),
                crd=_crd(filename),
                field_selectors=("metadata.name", "metadata.namespace")
                if namespaced
                else ("metadata.name",),
                subresources=("status",) if status else (),
            )
        )
    return {k.plural: k for k in kinds}


# --- selectors ----------------------------------------------------------------------------

_REQUIREMENT = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9][-A-Za-z0-9_./]*)\s*"
    r"(?:(?P<op>==|=|!=|\s+in\s+|\s+notin\s+)\s*(?P<value>\([^)]*\)|[^,()\s]*))?\s*$"
)


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # = != in notin exists !exists
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values  # != and notin


def _split_selector(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    return parts


def parse_label_selector(selector: str | Mapping[str, str] | None) -> list[Requirement]:
    """A label selector (`a=b,c!=d,e in (f,g),!h`) or a dict of equalities; 400 if malformed."""
    if not selector:
        return []
    if isinstance(selector, Mapping):
        return [Requirement(k, "=", (v,)) for k, v in selector.items()]
    requirements = []
    for part in _split_selector(selector):
        match = _REQUIREMENT.match(part)
        if not match:
            raise bad_request(
                f"unable to parse requirement: {part.strip()!r}: invalid label selector"
            )
        key, op, value = match["key"], (match["op"] or "").strip(), match["value"]
        if match["neg"]:
            if op:
                raise bad_request(f"unable to parse requirement: {part.strip()!r}")
            requirements.append(Requirement(key, "!exists"))
        elif not op:
            requirements.append(Requirement(key, "exists"))
        elif op in ("in", "notin"):
            if not value or not value.startswith("("):
                raise bad_request(f"unable to parse requirement: {part.strip()!r}: expected '('")
            values = tuple(v.strip() for v in value[1:-1].split(",") if v.strip())
            requirements.append(Requirement(key, op, values))
        else:
            requirements.append(Requirement(key, "!=" if op == "!=" else "=", (value or "",)))
    return requirements


def parse_field_selector(
    kind: Kind, selector: str | Mapping[str, str] | None
) -> list[tuple[str, str, str]]:
    """A field selector (`spec.nodeName=n1,status.phase!=Failed`); 400 for fields the kind lacks."""
    if not selector:
        return []
    if isinstance(selector, Mapping):
        terms = [(k, "=", v) for k, v in selector.items()]
    else:
        terms = []
        for part in selector.split(","):
            match = re.match(r"^\s*([^=!\s]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
            if not match:
                raise bad_request(f"invalid selector: '{selector}'; can't understand '{part}'")
            terms.append((match[1], "!=" if match[2] == "!=" else "=", match[3]))
    for name, _, _ in terms:
        if name not in kind.field_selectors:
            raise bad_request(f"field label not supported: {name}")
    return terms


def _field_value(obj: JSON, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _matches(
    obj: JSON | None, labels: list[Requirement], fields: list[tuple[str, str, str]]
) -> bool:
    if obj is None:
        return False
    object_labels = (obj.get("metadata") or {}).get("labels") or {}
    if not all(r.matches(object_labels) for r in labels):
        return False
    return all((_field_value(obj, path) == value) == (op == "=") for path, op, value in fields)


# --- patches ------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f'JSON pointer must be empty or start with a "/": {path!r}')
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _locate(doc: Any, parts: list[str], op: str, path: str) -> tuple[Any, str]:
    parent = doc
    for part in parts[:-1]:
        if isinstance(parent, dict) and part in parent:
            parent = parent[part]
        elif isinstance(parent, list) and part.isdigit() and int(part) < len(parent):
            parent = parent[int(part)]
        else:
            raise ApiError(
                422, "Invalid", f'{op} operation does not apply: doc is missing path: "{path}"'
            )
    return parent, parts[-1]


def json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch; 400 for a malformed patch, 422 when an operation does not apply."""
    if not isinstance(operations, list) or not all(
        isinstance(o, dict) and "op" in o for o in operations
    ):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(doc)
    for operation in operations:
        op, path = operation["op"], operation.get("path", "")
        parts = _pointer(path)
        if op in ("move", "copy"):
            source_parts = _pointer(operation.get("from", ""))
            parent, key = _locate(doc, source_parts, op, operation.get("from", ""))
            value = _get(parent, key, op, operation.get("from", ""))
            if op == "move":
                _remove(parent, key, op, path)
            doc = _add(doc, parts, copy.deepcopy(value), op, path)
        elif op == "add":
            doc = _add(doc, parts, copy.deepcopy(operation.get("value")), op, path)
        elif op == "remove":
            parent, key = _locate(doc, parts, op, path)
            _remove(parent, key, op, path)
        elif op == "replace":
            if not parts:
                doc = copy.deepcopy(operation.get("value"))
                continue
            parent, key = _locate(doc, parts, op, path)
            _get(parent, key, op, path)
            if isinstance(parent, list):
                parent[int(key)] = copy.deepcopy(operation.get("value"))
            else:
                parent[key] = copy.deepcopy(operation.get("value"))
        elif op == "test":
            parent, key = (None, "") if not parts else _locate(doc, parts, op, path)
            current = doc if not parts else _get(parent, key, op, path)
            if current != operation.get("value"):
                raise ApiError(422, "Invalid", f"testing value {path} failed: test failed")
        else:
            raise bad_request(f"Unexpected kind: {op}")
    return doc


def _get(parent: Any, key: str, op: str, path: str) -> Any:
    if isinstance(parent, dict) and key in parent:
        return parent[key]
    if isinstance(parent, list) and key.isdigit() and int(key) < len(parent):
        return parent[int(key)]
    raise ApiError(422, "Invalid", f'{op} operation does not apply: doc is missing key: "{path}"')


def _remove(parent: Any, key: str, op: str, path: str) -> None:
    _get(parent, key, op, path)
    if isinstance(parent, list):
        del parent[int(key)]
    else:
        del parent[key]


def _add(doc: Any, parts: list[str], value: Any, op: str, path: str) -> Any:
    if not parts:
        return value
    parent, key = _locate(doc, parts, op, path)
    if isinstance(parent, list):
        if key == "-":
            parent.append(value)
        elif key.isdigit() and int(key) <= len(parent):
            parent.insert(int(key), value)
        else:
            raise ApiError(
                422, "Invalid", f'{op} operation does not apply: doc is missing path: "{path}"'
            )
    elif isinstance(parent, dict):
        parent[key] = value
    else:
        raise ApiError(
            422, "Invalid", f'{op} operation does not apply: doc is missing path: "{path}"'
        )
    return doc


# The lists of built-in kinds that a strategic merge patch merges by a key (patchMergeKey).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "ownerReferences": "uid",
    "conditions": "type",
    "imagePullSecrets": "name",
    "schedulingGates": "name",
    "addresses": "type",
    "hostAliases": "ip",
}
PRIMITIVE_MERGE = {"finalizers"}


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch of a built-in kind, for the lists in `MERGE_KEYS`.

    Maps merge as in a JSON merge patch; lists with a merge key merge by it; other lists are
    replaced (as `spec.taints`, which has no merge key). Directives: `$patch: replace|delete`,
    `$retainKeys`, `$deleteFromPrimitiveList/<field>`; `$setElementOrder/<field>` is ignored.
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [v for v in result.get(name) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and key in MERGE_KEYS:
            result[key] = _merge_list(result.get(key) or [], value, MERGE_KEYS[key])
        elif isinstance(value, list) and key in PRIMITIVE_MERGE:
            merged_list = list(result.get(key) or [])
            merged_list += [v for v in value if v not in merged_list]
            result[key] = merged_list
        else:
            result[key] = copy.deepcopy(value)
    if isinstance(patch.get("$retainKeys"), list):
        result = {k: v for k, v in result.items() if k in patch["$retainKeys"]}
    return result


def _merge_list(current: list[Any], patch: list[Any], key: str) -> list[Any]:
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    result = [copy.deepcopy(c) for c in current]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            result.append(copy.deepcopy(item))
            continue
        index = next(
            (i for i, c in enumerate(result) if isinstance(c, dict) and c.get(key) == item[key]),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
            continue
        if index is None:
            result.append(strategic_merge_patch({}, item))
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


# --- watchers -----------------------------------------------------------------------------

CUT_CLEAN = "CUT_CLEAN"  # the stream ends as a server closing it at its timeout
CUT_ABRUPT = "CUT_ABRUPT"  # the connection drops mid-stream
CLOSED = "CLOSED"


@dataclass
class Event:
    """A change in the history: the object after it (before it for DELETED) and before it."""

    type: str
    plural: str
    rv: int
    obj: JSON
    prev: JSON | None


class Watcher:
    """One watch: the events it has to send, in order, filled under the store's lock.

    Items are `(type, object)` pairs, `("BOOKMARK", {...})`, `("ERROR", status)`, or one of
    `CUT_CLEAN`, `CUT_ABRUPT`, `CLOSED` once the watch is over. Consumers read them with
    `await get()` (any event loop) or `get_blocking()` (a thread).
    """

    def __init__(
        self,
        store: Store,
        kind: Kind,
        namespace: str | None,
        labels: list[Requirement],
        fields: list[tuple[str, str, str]],
        *,
        bookmarks: bool,
        remote: bool,
    ) -> None:
        self.store = store
        self.kind = kind
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.bookmarks = bookmarks
        self.remote = remote
        self._items: collections.deque[Any] = collections.deque()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async_event: asyncio.Event | None = None
        self._thread_event = threading.Event()
        self.done = False

    def _in_scope(self, obj: JSON | None) -> bool:
        if obj is None:
            return False
        if self.namespace and (obj.get("metadata") or {}).get("namespace") != self.namespace:
            return False
        return _matches(obj, self.labels, self.fields)

    def offer(self, event: Event) -> None:
        """Queue an event as this watch sees it: entering/leaving its selector is ADDED/DELETED."""
        if event.plural != self.kind.plural:
            return
        now, before = self._in_scope(event.obj), self._in_scope(event.prev)
        if event.type == "ADDED":
            if now:
                self.push((event.type, event.obj))
        elif event.type == "MODIFIED":
            if now and before:
                self.push(("MODIFIED", event.obj))
            elif now:
                self.push(("ADDED", event.obj))
            elif before:
                assert event.prev is not None
                gone = copy.deepcopy(event.prev)
                gone["metadata"]["resourceVersion"] = str(event.rv)
                self.push(("DELETED", gone))
        elif event.type == "DELETED" and before:
            self.push(("DELETED", event.obj))

    def push(self, item: Any) -> None:
        with self._lock:
            if self.done:
                return
            self._items.append(item)
            if item in (CUT_CLEAN, CUT_ABRUPT, CLOSED):
                self.done = True
        self._wake()

    def _wake(self) -> None:
        self._thread_event.set()
        if self._loop is not None and self._async_event is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                self._loop.call_soon_threadsafe(self._async_event.set)

    def _pop(self) -> Any:
        with self._lock:
            return self._items.popleft() if self._items else None

    async def get(self, timeout: float | None = None) -> Any:
        """The next item, or None after `timeout` seconds without one."""
        if self._async_event is None:
            self._loop = asyncio.get_running_loop()
            self._async_event = asyncio.Event()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            self._async_event.clear()
            item = self._pop()
            if item is not None:
                return item
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._async_event.wait(), remaining)
            except TimeoutError:
                return None

    def get_blocking(self, timeout: float | None = None) -> Any:
        """The next item for a consumer in a thread, or None after `timeout` seconds."""
        while True:
            self._thread_event.clear()
            item = self._pop()
            if item is not None:
                return item
            if not self._thread_event.wait(timeout):
                return None

    def close(self) -> None:
        """Stop the watch and leave the store's fan-out."""
        self.store._unregister(self)
        self.push(CLOSED)


# --- the store ----------------------------------------------------------------------------


def now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def normalise(obj: Any) -> Any:
    """A deep copy as the wire has it (datetimes as RFC 3339 strings), as a client sends it."""
    return json.loads(json.dumps(obj, default=_json_default))


_GENERATE_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_SYSTEM_FIELDS = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
)
_TERMINAL = ("Succeeded", "Failed")


def _qos_class(pod: JSON) -> str:
    containers = (pod.get("spec") or {}).get("containers") or []
    requests = [((c.get("resources") or {}).get("requests") or {}) for c in containers]
    limits = [((c.get("resources") or {}).get("limits") or {}) for c in containers]
    if not any(requests) and not any(limits):
        return "BestEffort"
    for request, limit in zip(requests, limits, strict=True):
        for resource in ("cpu", "memory"):
            if resource not in limit:
                return "Burstable"
            if resource in request and schemas.parse_quantity(
                request[resource]
            ) != schemas.parse_quantity(limit[resource]):
                return "Burstable"
    return "Guaranteed"


Admission = Callable[[str, JSON, JSON | None], None]


@dataclass
class _Options:
    strict: bool = True
    graceful_pods: bool = False


class Store:
    """Objects by kind, one resourceVersion, a bounded event history, the watchers.

    `history` is how many events a watch can start behind the present; `strict` refuses
    unknown fields of schema-validated kinds (as `fieldValidation=Strict`); with
    `graceful_pods` a DELETE of a running pod only marks it (`deletionTimestamp`) and the
    kubelet ends it with `delete(..., grace_period=0)`.
    """

    def __init__(
        self, *, history: int = 10_000, strict: bool = True, graceful_pods: bool = False
    ) -> None:
        self.kinds = default_kinds()
        self.options = _Options(strict=strict, graceful_pods=graceful_pods)
        self._lock = threading.RLock()
        self._rv = 0
        self._base = 0  # the newest resourceVersion no longer in the history
        self._history: collections.deque[Event] = collections.deque()
        self._history_size = history
        self._objects: dict[str, dict[tuple[str, str], JSON]] = {p: {} for p in self.kinds}
        self._watchers: set[Watcher] = set()
        self._admission: dict[str, list[Admission]] = collections.defaultdict(list)
        self._logs: dict[tuple[str, str, str], bytes] = {}
        self.created: collections.Counter[tuple[str, str, str]] = collections.Counter()
        """How often each (plural, namespace, name) was created (refused creates and dry
        runs not counted), for tests that check an object was made once."""
        self.log_reader: Callable[[str, str, str], bytes | None] | None = None

    # -- plumbing

    def kind(self, plural: str) -> Kind:
        try:
            return self.kinds[plural]
        except KeyError:
            raise ApiError(
                404, "NotFound", "the server could not find the requested resource"
            ) from None

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion (that of the last write)."""
        return self._rv

    def add_admission(self, plural: str, hook: Admission) -> None:
        """Call `hook(operation, obj, old)` before a write of the kind is validated.

        The hook may change `obj` in place (a mutating webhook, e.g. Kueue's scheduling gates)
        or raise `ApiError` to refuse it. `operation` is CREATE or UPDATE.
        """
        self._admission[plural].append(hook)

    def _namespace(self, kind: Kind, namespace: str | None) -> str:
        if not kind.namespaced:
            return ""
        if not namespace:
            raise bad_request("the namespace of the object must be set")
        return namespace

    def _stored(self, kind: Kind, namespace: str | None, name: str) -> JSON:
        obj = self._objects[kind.plural].get((self._namespace(kind, namespace), name))
        if obj is None:
            raise not_found(kind, name)
        return obj

    def _check(self, kind: Kind, obj: JSON, name: str, field_validation: str | None) -> None:
        errors = schemas.validate_metadata(
            obj, namespaced=kind.namespaced, name_rule=kind.name_rule
        )
        result = kind.validate(obj) if kind.validate else Result()
        strict = field_validation == "Strict" or (field_validation is None and self.options.strict)
        if result.unknown and strict:
            unknown = ", ".join(f'unknown field "{f}"' for f in sorted(set(result.unknown)))
            raise bad_request(f"strict decoding error: {unknown}")
        errors += result.errors
        if errors:
            raise invalid(kind, name, errors)

    def _commit(
        self, kind: Kind, key: tuple[str, str], new: JSON | None, prev: JSON | None, kind_of: str
    ) -> JSON:
        self._rv += 1
        if new is not None:
            new["metadata"]["resourceVersion"] = str(self._rv)
            self._objects[kind.plural][key] = new
            obj = new
        else:
            self._objects[kind.plural].pop(key, None)
            assert prev is not None
            obj = copy.deepcopy(prev)
            obj["metadata"]["resourceVersion"] = str(self._rv)
        event = Event(kind_of, kind.plural, self._rv, obj, prev)
        self._history.append(event)
        while len(self._history) > self._history_size:
            self._base = self._history.popleft().rv
        for watcher in list(self._watchers):
            watcher.offer(event)
        return obj

    def _unregister(self, watcher: Watcher) -> None:
        with self._lock:
            self._watchers.discard(watcher)

    # -- reads

    def get(self, plural: str, name: str, namespace: str | None = None) -> JSON:
        """A copy of an object; ApiError 404 if there is none."""
        with self._lock:
            return copy.deepcopy(self._stored(self.kind(plural), namespace, name))

    def list(
        self,
        plural: str,
        namespace: str | None = None,
        labels: str | Mapping[str, str] | None = None,
        fields: str | Mapping[str, str] | None = None,
    ) -> tuple[list[JSON], int]:
        """Copies of the matching objects in key order, and the resourceVersion of the list."""
        kind = self.kind(plural)
        label_reqs = parse_label_selector(labels)
        field_reqs = parse_field_selector(kind, fields)
        with self._lock:
            items = [
                copy.deepcopy(obj)
                for (ns, _), obj in sorted(self._objects[plural].items())
                if (not namespace or ns == namespace) and _matches(obj, label_reqs, field_reqs)
            ]
            return items, self._rv

    # -- writes

    def create(
        self,
        plural: str,
        obj: JSON,
        namespace: str | None = None,
        *,
        field_validation: str | None = None,
        dry_run: bool = False,
    ) -> JSON:
        """Create an object (201 semantics): 422 if invalid, 409 if its name exists."""
        kind = self.kind(plural)
        obj = normalise(obj)
        if not isinstance(obj, dict):
            raise bad_request("the body of the request is not an object")
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        for key, expected in (("apiVersion", kind.api_version), ("kind", kind.kind)):
            if obj.setdefault(key, expected) != expected:
                raise bad_request(
                    f"the {key} of the object ({obj[key]}) does not match the expected "
                    f"{key} ({expected})"
                )
        with self._lock:
            if kind.namespaced:
                body_ns = meta.get("namespace")
                if namespace and body_ns and body_ns != namespace:
                    raise bad_request(
                        "the namespace of the provided object does not match the namespace "
                        "sent on the request"
                    )
                meta["namespace"] = self._namespace(kind, namespace or body_ns)
            else:
                meta.pop("namespace", None)
            if meta.get("resourceVersion"):
                raise bad_request("resourceVersion should not be set on objects to be created")
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + "".join(random.choices(_GENERATE_CHARS, k=5))
            for key in (*_SYSTEM_FIELDS, "selfLink", "managedFields"):
                meta.pop(key, None)
            if kind.status_on_create == "drop":
                obj.pop("status", None)
            for hook in self._admission.get(plural, []):
                hook("CREATE", obj, None)
            if kind.status_on_create == "pod":
                obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
            if kind.crd is not None:
                schemas.apply_defaults(kind.crd().schema, obj)
            name = meta.get("name") or ""
            self._check(kind, obj, name, field_validation)
            if kind.status_on_create == "pod":
                obj["status"]["qosClass"] = _qos_class(obj)
            key = (meta.get("namespace", ""), name)
            if key in self._objects[plural]:
                raise already_exists(kind, name)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now()
            if kind.generation:
                meta["generation"] = 1
            if dry_run:
                meta["resourceVersion"] = ""
                return copy.deepcopy(obj)
            self.created[(plural, *key)] += 1
            return copy.deepcopy(self._commit(kind, key, obj, None, "ADDED"))

    def update(
        self,
        plural: str,
        name: str,
        mutate: Callable[[JSON], JSON | None],
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        field_validation: str | None = None,
        dry_run: bool = False,
    ) -> JSON:
        """Read-modify-write under the lock: `mutate` gets a copy (returns it or a new one).

        The rules of an update apply: a changed `metadata.resourceVersion` that is not the
        current one is a 409 Conflict; the status goes only through `subresource="status"` for
        kinds with a status subresource; a write that changes nothing changes no
        resourceVersion; removing the last finalizer of a deleted object deletes it.
        """
        kind = self.kind(plural)
        if subresource not in (None, "status") or (
            subresource == "status" and not kind.status_subresource
        ):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        with self._lock:
            current = self._stored(kind, namespace, name)
            candidate = copy.deepcopy(current)
            changed = mutate(candidate)
            new = normalise(candidate if changed is None else changed)
            if not isinstance(new, dict) or not isinstance(new.get("metadata"), dict):
                raise bad_request("the object must have metadata")
            return self._update(kind, current, new, subresource, field_validation, dry_run)

    def _update(
        self,
        kind: Kind,
        current: JSON,
        new: JSON,
        subresource: str | None,
        field_validation: str | None,
        dry_run: bool,
    ) -> JSON:
        meta, old_meta = new["metadata"], current["metadata"]
        name = old_meta["name"]
        if meta.get("name", name) != name or (
            kind.namespaced
            and meta.get("namespace", old_meta["namespace"]) != old_meta["namespace"]
        ):
            raise bad_request(
                "the name or namespace of the object does not match the one on the URL"
            )
        wanted = meta.get("resourceVersion")
        if wanted and wanted != old_meta["resourceVersion"]:
            raise conflict(kind, name, OPTIMISTIC_LOCK)
        if subresource == "status":
            status = new.get("status")
            new = copy.deepcopy(current)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
            meta = new["metadata"]
        elif kind.status_subresource:
            if "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            else:
                new.pop("status", None)
        new["apiVersion"], new["kind"] = kind.api_version, kind.kind
        for key in _SYSTEM_FIELDS:
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        meta["name"] = name
        if kind.namespaced:
            meta["namespace"] = old_meta["namespace"]
        meta["resourceVersion"] = old_meta["resourceVersion"]
        for hook in self._admission.get(kind.plural, []):
            hook("UPDATE", new, copy.deepcopy(current))
        if kind.crd is not None:
            schemas.apply_defaults(kind.crd().schema, new)
        if new == current:
            return copy.deepcopy(current)
        self._check(kind, new, name, field_validation)
        if kind.generation:
            ignored = ("metadata", "status") if kind.status_subresource else ("metadata",)
            if {k: v for k, v in new.items() if k not in ignored} != {
                k: v for k, v in current.items() if k not in ignored
            }:
                meta["generation"] = int(old_meta.get("generation", 1)) + 1
        if dry_run:
            return copy.deepcopy(new)
        key = (old_meta.get("namespace", ""), name)
        if old_meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return copy.deepcopy(self._delete_now(kind, key, new, None))
        return copy.deepcopy(self._commit(kind, key, new, current, "MODIFIED"))

    def replace(
        self,
        plural: str,
        obj: JSON,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        field_validation: str | None = None,
        dry_run: bool = False,
    ) -> JSON:
        """PUT: the whole object (guarded by its resourceVersion when it carries one)."""
        name = ((obj or {}).get("metadata") or {}).get("name")
        if not name:
            raise bad_request("the name of the object must be set")
        body = normalise(obj)
        return self.update(
            plural,
            name,
            lambda _current: body,
            namespace,
            subresource=subresource,
            field_validation=field_validation,
            dry_run=dry_run,
        )

    def patch(
        self,
        plural: str,
        name: str,
        body: Any,
        content_type: str = MERGE_PATCH,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        field_validation: str | None = None,
        dry_run: bool = False,
    ) -> JSON:
        """PATCH by the media type of the body: merge, JSON (RFC 6902) or strategic merge."""
        kind = self.kind(plural)
        media = content_type.split(";")[0].strip().lower()
        if media == MERGE_PATCH:
            if not isinstance(body, dict):
                raise bad_request("a merge patch must be a JSON object")
            apply: Callable[[JSON], JSON] = lambda current: merge_patch(current, body)  # noqa: E731
        elif media == JSON_PATCH:
            apply = lambda current: json_patch(current, body)  # noqa: E731
        elif media == STRATEGIC_PATCH and kind.builtin:
            if not isinstance(body, dict):
                raise bad_request("a strategic merge patch must be a JSON object")
            apply = lambda current: strategic_merge_patch(current, body)  # noqa: E731
        else:
            raise unsupported_media(kind, media)
        return self.update(
            plural,
            name,
            apply,
            namespace,
            subresource=subresource,
            field_validation=field_validation,
            dry_run=dry_run,
        )

    def update_status(
        self, plural: str, name: str, status: JSON, namespace: str | None = None
    ) -> JSON:
        """Set the status of an object (through `/status` where the kind has one)."""

        def mutate(obj: JSON) -> None:
            obj["status"] = status

        subresource = "status" if self.kind(plural).status_subresource else None
        return self.update(plural, name, mutate, namespace, subresource=subresource)

    def delete(
        self,
        plural: str,
        name: str,
        namespace: str | None = None,
        *,
        propagation: str | None = None,
        grace_period: int | None = None,
        preconditions: Mapping[str, str] | None = None,
    ) -> tuple[JSON, bool]:
        """Delete an object; returns it and whether it is gone (False: marked, finalizers or grace).

        Dependents (by `metadata.ownerReferences`) are deleted for `Background`/`Foreground`
        propagation and lose the reference for `Orphan`, the default of Jobs.
        """
        kind = self.kind(plural)
        if propagation not in (None, "Background", "Foreground", "Orphan"):
            raise bad_request(f"Unsupported propagationPolicy: {propagation}")
        with self._lock:
            current = self._stored(kind, namespace, name)
            meta = current["metadata"]
            for precondition in ("uid", "resourceVersion"):
                wanted = (preconditions or {}).get(precondition)
                actual = meta.get(precondition)
                if wanted and wanted != actual:
                    why = f"Precondition failed: {precondition} in precondition: {wanted}, "
                    raise conflict(kind, name, f"{why}{precondition} in object meta: {actual}")
            key = (meta.get("namespace", ""), name)
            if meta.get("finalizers"):
                if meta.get("deletionTimestamp"):
                    return copy.deepcopy(current), False
                marked = copy.deepcopy(current)
                marked["metadata"]["deletionTimestamp"] = now()
                marked["metadata"]["deletionGracePeriodSeconds"] = 0
                return copy.deepcopy(self._commit(kind, key, marked, current, "MODIFIED")), False
            if (
                plural == "pods"
                and self.options.graceful_pods
                and (current.get("spec") or {}).get("nodeName")
                and (current.get("status") or {}).get("phase") not in _TERMINAL
            ):
                grace = grace_period
                if grace is None:
                    grace = int(
                        (current.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
                    )
                if grace > 0:
                    if meta.get("deletionTimestamp"):
                        return copy.deepcopy(current), False
                    marked = copy.deepcopy(current)
                    deadline = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(
                        seconds=grace
                    )
                    marked["metadata"]["deletionTimestamp"] = deadline.isoformat().replace(
                        "+00:00", "Z"
                    )
                    marked["metadata"]["deletionGracePeriodSeconds"] = grace
                    return copy.deepcopy(
                        self._commit(kind, key, marked, current, "MODIFIED")
                    ), False
            gone = self._delete_now(kind, key, current, propagation)
            return copy.deepcopy(gone), True

    def _delete_now(
        self, kind: Kind, key: tuple[str, str], last: JSON, propagation: str | None
    ) -> JSON:
        gone = self._commit(kind, key, None, last, "DELETED")
        uid = last["metadata"].get("uid")
        policy = propagation or kind.default_propagation
        for other in self.kinds.values():
            for (ns, other_name), obj in list(self._objects[other.plural].items()):
                refs = obj["metadata"].get("ownerReferences") or []
                if not any(r.get("uid") == uid for r in refs):
                    continue
                if kind.namespaced and other.namespaced and ns != key[0]:
                    continue
                if policy == "Orphan":
                    orphan = copy.deepcopy(obj)
                    orphan["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid]
                    if not orphan["metadata"]["ownerReferences"]:
                        del orphan["metadata"]["ownerReferences"]
                    self._commit(other, (ns, other_name), orphan, obj, "MODIFIED")
                else:
                    self.delete(other.plural, other_name, ns or None, propagation="Background")
        return gone

    # -- watches

    def watch(
        self,
        plural: str,
        namespace: str | None = None,
        resource_version: str | None = None,
        labels: str | Mapping[str, str] | None = None,
        fields: str | Mapping[str, str] | None = None,
        *,
        bookmarks: bool = False,
        send_initial_events: bool = False,
        remote: bool = False,
    ) -> Watcher:
        """A watch from `resource_version` (exclusive), or from now with ADDED for what exists.

        Without a resourceVersion (or "0") the watch starts with an ADDED event per matching
        object, as the real server's "get state and start at most recent". A resourceVersion
        older than the history queues one ERROR event with a 410 Expired Status.
        """
        kind = self.kind(plural)
        watcher = Watcher(
            self,
            kind,
            namespace if kind.namespaced else None,
            parse_label_selector(labels),
            parse_field_selector(kind, fields),
            bookmarks=bookmarks,
            remote=remote,
        )
        with self._lock:
            if resource_version in (None, "", "0") or send_initial_events:
                for (ns, _), obj in sorted(self._objects[plural].items()):
                    if (not watcher.namespace or ns == watcher.namespace) and _matches(
                        obj, watcher.labels, watcher.fields
                    ):
                        watcher.push(("ADDED", obj))
                if send_initial_events and bookmarks:
                    watcher.push(("BOOKMARK", self._bookmark(kind, initial_end=True)))
            else:
                try:
                    since = int(resource_version)
                except ValueError:
                    raise ApiError(
                        400,
                        "BadRequest",
                        f'resourceVersion: Invalid value: "{resource_version}": must be an integer',
                    ) from None
                if since < self._base:
                    error = expired(f"too old resource version: {since} ({self._base})")
                    watcher.push(("ERROR", error.status()))
                    watcher.push(CLOSED)
                    return watcher
                for event in self._history:
                    if event.rv > since:
                        watcher.offer(event)
            self._watchers.add(watcher)
        return watcher

    def _bookmark(self, kind: Kind, initial_end: bool = False) -> JSON:
        meta: JSON = {"resourceVersion": str(self._rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": meta}

    def send_bookmark(self, watcher: Watcher) -> None:
        """Queue a BOOKMARK with the present resourceVersion (after everything queued before)."""
        with self._lock:
            if watcher.bookmarks:
                watcher.push(("BOOKMARK", self._bookmark(watcher.kind)))

    def bookmark(self, plural: str | None = None) -> int:
        """Test hook: a BOOKMARK now to every watch that allowed them; returns how many."""
        with self._lock:
            watchers = [
                w for w in self._watchers if w.bookmarks and plural in (None, w.kind.plural)
            ]
            for watcher in watchers:
                self.send_bookmark(watcher)
            return len(watchers)

    def cut_watches(self, *, abrupt: bool = False, plural: str | None = None) -> int:
        """Test hook: end the HTTP watches now; returns how many.

        A clean cut ends the stream as the server's own timeout does (the client sees the end
        of the body); an abrupt one drops the connection mid-body. Nothing written after the
        cut reaches the cut watch: a client resuming from its last resourceVersion gets it.
        """
        with self._lock:
            cut = [w for w in self._watchers if w.remote and plural in (None, w.kind.plural)]
            for watcher in cut:
                self._watchers.discard(watcher)
                watcher.push(CUT_ABRUPT if abrupt else CUT_CLEAN)
            return len(cut)

    def compact(self) -> int:
        """Test hook: forget the history, so that every older resourceVersion is expired (410)."""
        with self._lock:
            self._history.clear()
            self._base = self._rv
            return self._base

    def watch_count(self, plural: str | None = None, *, remote: bool | None = None) -> int:
        """How many watches are open (of a kind; HTTP ones only with `remote=True`)."""
        with self._lock:
            return sum(
                1
                for w in self._watchers
                if plural in (None, w.kind.plural) and remote in (None, w.remote)
            )

    # -- logs

    def append_log(self, namespace: str, pod: str, container: str, data: str | bytes) -> None:
        """Add output to the log of a container (the kubelet to come writes through this)."""
        chunk = data.encode() if isinstance(data, str) else data
        with self._lock:
            key = (namespace, pod, container)
            self._logs[key] = self._logs.get(key, b"") + chunk

    def read_log(
        self,
        namespace: str,
        pod: str,
        container: str | None = None,
        *,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
    ) -> bytes:
        """The log of a container as `pods/{name}/log` answers it (the errors included)."""
        kind = self.kind("pods")
        with self._lock:
            obj = self._stored(kind, namespace, pod)
            spec = obj.get("spec") or {}
            names = [c["name"] for c in spec.get("containers") or []]
            init_names = [c["name"] for c in spec.get("initContainers") or []]
            if container is None:
                if len(names) != 1:
                    message = (
                        f"a container name must be specified for pod {pod}, "
                        f"choose one of: [{' '.join(names)}]"
                    )
                    if init_names:
                        message += f" or one of the init containers: [{' '.join(init_names)}]"
                    raise bad_request(message)
                container = names[0]
            if container not in names + init_names:
                raise bad_request(f"container {container} is not valid for pod {pod}")
            if not spec.get("nodeName"):
                return b""
            data = self.log_reader(namespace, pod, container) if self.log_reader else None
            if data is None:
                data = self._logs.get((namespace, pod, container))
            if data is None:
                status = obj.get("status") or {}
                statuses = (status.get("containerStatuses") or []) + (
                    status.get("initContainerStatuses") or []
                )
                state = next(
                    (s.get("state") or {} for s in statuses if s.get("name") == container), {}
                )
                if "waiting" in state or not state:
                    reason = (state.get("waiting") or {}).get("reason") or "ContainerCreating"
                    raise bad_request(
                        f'container "{container}" in pod "{pod}" is waiting to start: {reason}'
                    )
                data = b""
        if tail_lines is not None:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-tail_lines:]) if tail_lines > 0 else b""
        if limit_bytes is not None:
            data = data[:limit_bytes]
        return data


def ensure_items(values: Iterable[JSON], kind: Kind) -> list[JSON]:
    """List items as the server writes them: built-in kinds without kind/apiVersion."""
    if not kind.builtin:
        return list(values)
    return [{k: v for k, v in item.items() if k not in ("kind", "apiVersion")} for item in values]
