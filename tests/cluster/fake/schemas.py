"""Validation of the objects the fake Kubernetes API accepts.

Workflows are checked against Argo's v4.1.2 `schema.json` (definition
`io.argoproj.workflow.v1alpha1.Workflow`, IntOrString and Quantity relaxed as
`tests/upstream/README.md` describes), the Kueue kinds against their CRDs (v1beta2), and the few
core kinds the backend uses (pods, nodes, configmaps, secrets, jobs, priority classes) by hand,
with the rules of the API server that matter to simrun: names, labels, container shapes,
taints, the 1 MiB of a ConfigMap. Every schema is loaded once per process.

Errors are `FieldError`s named like the API server names them (`spec.templates[0].name`), so
a refused object answers a 422 Status whose causes point at the field. Unknown fields (a
misspelt `entrypointt`) are reported apart, as the server's `fieldValidation=Strict` does.

Not done: CEL rules (`x-kubernetes-validations`), formats (`date-time`), the version
conversion of CRDs, the many cross-field rules of pod validation, the immutability of pod specs.
"""

from __future__ import annotations

import base64
import binascii
import copy
import functools
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft7Validator, Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

WORKFLOW_DEFINITION = "io.argoproj.workflow.v1alpha1.Workflow"
CONFIGMAP_MAX_BYTES = 1024 * 1024


def reference_dir() -> Path:
    """The upstream reference data the tests carry (`tests/upstream/`)."""
    return Path(__file__).resolve().parents[2] / "upstream"


# --- errors -------------------------------------------------------------------------------


def _quote(value: Any) -> str:
    """A value as Go's `%q`/`%v` print it in a field error."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


@dataclass(frozen=True)
class FieldError:
    """One refused field, as `k8s.io/apimachinery/pkg/util/validation/field.Error`."""

    field: str
    type: str  # FieldValueRequired, FieldValueInvalid, FieldValueNotSupported, ...
    detail: str = ""
    value: Any = None
    supported: tuple[str, ...] = ()

    def body(self) -> str:
        """The message without the field, as the Status cause carries it."""
        if self.type == "FieldValueRequired":
            text = "Required value"
        elif self.type == "FieldValueNotSupported":
            text = f"Unsupported value: {_quote(self.value)}"
            if self.supported:
                text += ": supported values: " + ", ".join(json.dumps(s) for s in self.supported)
            return text
        elif self.type == "FieldValueDuplicate":
            text = f"Duplicate value: {_quote(self.value)}"
        elif self.type == "FieldValueTooLong":
            text = "Too long"
        elif self.type == "FieldValueForbidden":
            text = "Forbidden"
        else:
            text = f"Invalid value: {_quote(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


def required(path: str, detail: str = "") -> FieldError:
    return FieldError(path, "FieldValueRequired", detail)


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(path, "FieldValueInvalid", detail, value)


def not_supported(path: str, value: Any, supported: Iterable[str]) -> FieldError:
    return FieldError(path, "FieldValueNotSupported", "", value, tuple(supported))


@dataclass
class Result:
    """What a validation found: refused fields, and unknown fields (a strict decoder's)."""

    errors: list[FieldError] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)

    def extend(self, other: Result) -> None:
        self.errors.extend(other.errors)
        self.unknown.extend(other.unknown)


# --- names and labels ---------------------------------------------------------------------

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL_RE = re.compile(f"^{_DNS_LABEL}$")
_DNS_SUBDOMAIN_RE = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_QUALIFIED_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QUALIFIED_NAME_RE = re.compile(f"^{_QUALIFIED_NAME}$")
_LABEL_VALUE_RE = re.compile(f"^({_QUALIFIED_NAME})?$")
_CONFIG_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")
_CONFIG_KEY_MSG = (
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. "
    "'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
)

_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
_QUALIFIED_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
    "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)


def dns_subdomain(path: str, value: Any) -> list[FieldError]:
    if not isinstance(value, str) or len(value) > 253 or not _DNS_SUBDOMAIN_RE.match(value):
        return [invalid(path, value, _SUBDOMAIN_MSG)]
    return []


def dns_label(path: str, value: Any) -> list[FieldError]:
    if not isinstance(value, str) or len(value) > 63 or not _DNS_LABEL_RE.match(value):
        return [invalid(path, value, _LABEL_MSG)]
    return []


def qualified_name(path: str, value: Any) -> list[FieldError]:
    """A label key, annotation key, finalizer or taint key: `[prefix/]name`."""
    if not isinstance(value, str) or not value:
        return [invalid(path, value, "name part must be non-empty")]
    prefix, _, name = value.rpartition("/")
    errors = []
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.match(prefix)):
        errors.append(invalid(path, value, "prefix part " + _SUBDOMAIN_MSG))
    if len(name) > 63:
        errors.append(invalid(path, value, "name part must be no more than 63 characters"))
    elif not _QUALIFIED_NAME_RE.match(name):
        errors.append(invalid(path, value, _QUALIFIED_MSG))
    return errors


def label_value(path: str, value: Any) -> list[FieldError]:
    if not isinstance(value, str):
        return [invalid(path, value, "must be a string")]
    if len(value) > 63:
        return [invalid(path, value, "must be no more than 63 characters")]
    if not _LABEL_VALUE_RE.match(value):
        return [invalid(path, value, _LABEL_VALUE_MSG)]
    return []


def validate_metadata(
    obj: dict[str, Any], *, namespaced: bool, name_rule: Callable[[str, Any], list[FieldError]]
) -> list[FieldError]:
    """The rules of `ValidateObjectMeta`: name, namespace, labels, annotations, owners."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return [required("metadata")]
    errors: list[FieldError] = []
    name = meta.get("name")
    if not name:
        errors.append(required("metadata.name", "name or generateName is required"))
    else:
        errors += name_rule("metadata.name", name)
    if namespaced and meta.get("namespace"):
        errors += dns_label("metadata.namespace", meta["namespace"])
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict):
        errors.append(invalid("metadata.labels", labels, "must be a map of strings"))
    else:
        for key, value in labels.items():
            errors += qualified_name("metadata.labels", key)
            errors += label_value("metadata.labels", value)
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict):
        errors.append(invalid("metadata.annotations", annotations, "must be a map of strings"))
    else:
        for key, value in annotations.items():
            errors += qualified_name("metadata.annotations", key.lower())
            if not isinstance(value, str):
                errors.append(invalid(f"metadata.annotations[{key}]", value, "must be a string"))
        size = sum(len(k) + len(str(v)) for k, v in annotations.items())
        if size > 256 * 1024:
            errors.append(
                FieldError(
                    "metadata.annotations", "FieldValueTooLong", "must have at most 262144 bytes"
                )
            )
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for key in ("apiVersion", "kind", "name", "uid"):
            if not isinstance(ref, dict) or not ref.get(key):
                errors.append(required(f"metadata.ownerReferences[{i}].{key}"))
    for i, fin in enumerate(meta.get("finalizers") or []):
        errors += qualified_name(f"metadata.finalizers[{i}]", fin)
    return errors


# --- quantities ---------------------------------------------------------------------------

_QUANTITY_RE = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_SUFFIXES = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def parse_quantity(value: Any) -> Decimal:
    """A Kubernetes quantity (`"500m"`, `"4Gi"`, `2`, `"1e3"`) as a Decimal, else ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        return Decimal(str(value))
    if not isinstance(value, str):
        raise ValueError(f"not a quantity: {value!r}")
    match = _QUANTITY_RE.match(value.strip())
    if not match:
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix = match.groups()
    try:
        base = Decimal(number)
    except InvalidOperation as exc:
        raise ValueError(f"not a quantity: {value!r}") from exc
    if suffix in _SUFFIXES:
        return base * _SUFFIXES[suffix]
    if suffix[:1] in "eE":
        try:
            return base * (Decimal(10) ** int(suffix[1:]))
        except ValueError:
            pass
    raise ValueError(f"not a quantity: {value!r}")


_QUANTITY_MSG = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)


# --- JSON schemas -------------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """Refuse unknown fields wherever a schema lists its properties (README's `strict`)."""
    if isinstance(schema, dict):
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        for value in schema.values():
            _strict(value)
    elif isinstance(schema, list):
        for value in schema:
            _strict(value)
    return schema


@functools.cache
def _argo_root() -> dict[str, Any]:
    path = reference_dir() / "argo-workflows" / "v4.1.2" / "schema.json"
    root: dict[str, Any] = json.loads(path.read_text())
    root.pop("oneOf", None)
    definitions = root["definitions"]
    definitions["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"type": ["string", "integer"]}
    definitions["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {"type": ["string", "number"]}
    return _strict(root)


@functools.cache
def argo_validator(definition: str = WORKFLOW_DEFINITION) -> Draft202012Validator:
    """A validator of one definition of Argo's schema.json (strict, relaxed), built once."""
    root = dict(_argo_root())
    root["$ref"] = f"#/definitions/{definition}"
    return Draft202012Validator(root)


@dataclass(frozen=True)
class CrdVersion:
    """One served version of a CRD: its names and its (strict) schema."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool
    schema: dict[str, Any]

    @functools.cached_property
    def validator(self) -> Draft7Validator:
        return Draft7Validator(self.schema)


@functools.cache
def crd_version(filename: str, version: str) -> CrdVersion:
    """A version of a CRD of `reference/kueue/` (or another file under reference)."""
    path = reference_dir() / filename
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    spec = crd["spec"]
    entry = next(v for v in spec["versions"] if v["name"] == version)
    return CrdVersion(
        group=spec["group"],
        version=version,
        plural=spec["names"]["plural"],
        kind=spec["names"]["kind"],
        namespaced=spec["scope"] == "Namespaced",
        status_subresource="status" in (entry.get("subresources") or {}),
        schema=_strict(copy.deepcopy(entry["schema"]["openAPIV3Schema"])),
    )


def apply_defaults(schema: dict[str, Any], value: Any) -> None:
    """Fill in the `default`s of a structural schema, as the API server does for CRDs."""
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for name, sub in properties.items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                apply_defaults(sub, value[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name, item in value.items():
                if name not in properties:
                    apply_defaults(extra, item)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            apply_defaults(schema["items"], item)


def _without_nulls(value: Any) -> Any:
    """A copy without `null` members: the server treats them as absent (it prunes them)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _path(parts: Iterable[Any], prefix: str = "") -> str:
    text = prefix
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif re.match(r"^[A-Za-z_$][A-Za-z0-9_$-]*$", str(part)):
            text += f".{part}" if text else str(part)
        else:
            text += f"[{part}]"
    return text


def _translate(error: ValidationError, prefix: str, result: Result) -> None:
    path = _path(error.absolute_path, prefix)
    kind = error.validator
    if kind == "required":
        instance = error.instance if isinstance(error.instance, dict) else {}
        for name in error.validator_value:
            if name not in instance:
                result.errors.append(required(_path([name], path)))
    elif kind == "additionalProperties" and error.validator_value is False:
        known = set((error.schema or {}).get("properties") or {})
        patterns = list(((error.schema or {}).get("patternProperties") or {}).keys())
        for name in error.instance:
            if name not in known and not any(re.search(p, name) for p in patterns):
                result.unknown.append(_path([name], path))
    elif kind == "enum":
        result.errors.append(
            not_supported(path, error.instance, [str(v) for v in error.validator_value])
        )
    elif kind == "const":
        result.errors.append(not_supported(path, error.instance, [str(error.validator_value)]))
    elif kind == "type":
        expected = error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        result.errors.append(
            invalid(path, error.instance, f"{path} in body must be of type {expected}")
        )
    elif kind in ("oneOf", "anyOf", "allOf") and error.context:
        _translate(best_match(error.context), prefix, result)
    else:
        result.errors.append(invalid(path, error.instance, error.message))


def check_schema(
    validator: Draft7Validator | Draft202012Validator, value: Any, prefix: str = ""
) -> Result:
    """The errors of a JSON schema as field errors and unknown fields, nulls ignored."""
    result = Result()
    errors = sorted(
        validator.iter_errors(_without_nulls(value)),
        key=lambda e: [str(p) for p in e.absolute_path],
    )
    for error in errors:
        _translate(error, prefix, result)
    return result


# --- the kinds ----------------------------------------------------------------------------


def validate_workflow(obj: dict[str, Any]) -> Result:
    """An Argo Workflow against schema.json v4.1.2 (strict, IntOrString/Quantity relaxed)."""
    return check_schema(argo_validator(), obj)


def validate_crd_object(crd: CrdVersion, obj: dict[str, Any]) -> Result:
    """An object of a CRD against its openAPIV3Schema (strict); `apiVersion`/`kind` apart."""
    result = check_schema(crd.validator, obj)
    expected = f"{crd.group}/{crd.version}"
    if obj.get("apiVersion") != expected:
        result.errors.append(not_supported("apiVersion", obj.get("apiVersion"), [expected]))
    if obj.get("kind") != crd.kind:
        result.errors.append(not_supported("kind", obj.get("kind"), [crd.kind]))
    return result


def _resources(path: str, resources: Any) -> list[FieldError]:
    if resources is None:
        return []
    if not isinstance(resources, dict):
        return [invalid(path, resources, "must be an object")]
    errors: list[FieldError] = []
    parsed: dict[str, dict[str, Decimal]] = {"limits": {}, "requests": {}}
    for part in ("limits", "requests"):
        for name, value in (resources.get(part) or {}).items():
            try:
                amount = parse_quantity(value)
            except ValueError:
                errors.append(invalid(f"{path}.{part}[{name}]", value, _QUANTITY_MSG))
                continue
            if amount < 0:
                errors.append(
                    invalid(f"{path}.{part}[{name}]", value, "must be greater than or equal to 0")
                )
            parsed[part][name] = amount
    for name, request in parsed["requests"].items():
        limit = parsed["limits"].get(name)
        if limit is not None and request > limit:
            errors.append(
                invalid(
                    f"{path}.requests",
                    resources["requests"][name],
                    f"must be less than or equal to {name} limit of {resources['limits'][name]}",
                )
            )
    return errors


def _containers(path: str, containers: Any, names: set[str]) -> Result:
    result = Result()
    if not isinstance(containers, list):
        result.errors.append(invalid(path, containers, "must be a list"))
        return result
    for i, container in enumerate(containers):
        where = f"{path}[{i}]"
        if not isinstance(container, dict):
            result.errors.append(invalid(where, container, "must be an object"))
            continue
        result.extend(
            check_schema(argo_validator("io.k8s.api.core.v1.Container"), container, where)
        )
        name = container.get("name")
        if not name:
            result.errors.append(required(f"{where}.name"))
        else:
            result.errors += dns_label(f"{where}.name", name)
            if name in names:
                result.errors.append(FieldError(f"{where}.name", "FieldValueDuplicate", "", name))
            names.add(name)
        result.errors += _resources(f"{where}.resources", container.get("resources"))
    return result


_RESTART_POLICIES = ("Always", "OnFailure", "Never")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def validate_pod_spec(spec: Any, path: str = "spec") -> Result:
    """The parts of `ValidatePodSpec` simrun's pods exercise (containers, volumes, ...)."""
    result = Result()
    if not isinstance(spec, dict):
        result.errors.append(required(path))
        return result
    if not spec.get("containers"):
        result.errors.append(required(f"{path}.containers"))
    names: set[str] = set()
    result.extend(_containers(f"{path}.containers", spec.get("containers") or [], names))
    result.extend(_containers(f"{path}.initContainers", spec.get("initContainers") or [], names))
    volumes: set[str] = set()
    for i, volume in enumerate(spec.get("volumes") or []):
        where = f"{path}.volumes[{i}]"
        result.extend(check_schema(argo_validator("io.k8s.api.core.v1.Volume"), volume, where))
        name = volume.get("name") if isinstance(volume, dict) else None
        if name:
            result.errors += dns_label(f"{where}.name", name)
            if name in volumes:
                result.errors.append(FieldError(f"{where}.name", "FieldValueDuplicate", "", name))
            volumes.add(name)
    for i, toleration in enumerate(spec.get("tolerations") or []):
        result.extend(
            check_schema(
                argo_validator("io.k8s.api.core.v1.Toleration"),
                toleration,
                f"{path}.tolerations[{i}]",
            )
        )
    for key, definition in (
        ("affinity", "io.k8s.api.core.v1.Affinity"),
        ("securityContext", "io.k8s.api.core.v1.PodSecurityContext"),
    ):
        if spec.get(key) is not None:
            result.extend(check_schema(argo_validator(definition), spec[key], f"{path}.{key}"))
    policy = spec.get("restartPolicy")
    if policy is not None and policy not in _RESTART_POLICIES:
        result.errors.append(not_supported(f"{path}.restartPolicy", policy, _RESTART_POLICIES))
    for key, value in (spec.get("nodeSelector") or {}).items():
        result.errors += qualified_name(f"{path}.nodeSelector", key)
        result.errors += label_value(f"{path}.nodeSelector", value)
    for i, gate in enumerate(spec.get("schedulingGates") or []):
        if not isinstance(gate, dict) or not gate.get("name"):
            result.errors.append(required(f"{path}.schedulingGates[{i}].name"))
    grace = spec.get("terminationGracePeriodSeconds")
    if grace is not None and (not isinstance(grace, int) or grace < 0):
        result.errors.append(
            invalid(f"{path}.terminationGracePeriodSeconds", grace, "must be >= 0")
        )
    return result


def validate_pod(obj: dict[str, Any]) -> Result:
    return validate_pod_spec(obj.get("spec"))


def validate_node(obj: dict[str, Any]) -> Result:
    result = Result()
    seen: set[tuple[str, str]] = set()
    for i, taint in enumerate((obj.get("spec") or {}).get("taints") or []):
        where = f"spec.taints[{i}]"
        if not isinstance(taint, dict):
            result.errors.append(invalid(where, taint, "must be an object"))
            continue
        if not taint.get("key"):
            result.errors.append(required(f"{where}.key"))
        else:
            result.errors += qualified_name(f"{where}.key", taint["key"])
        if taint.get("value"):
            result.errors += label_value(f"{where}.value", taint["value"])
        effect = taint.get("effect")
        if not effect:
            result.errors.append(required(f"{where}.effect"))
        elif effect not in _TAINT_EFFECTS:
            result.errors.append(not_supported(f"{where}.effect", effect, _TAINT_EFFECTS))
        pair = (taint.get("key", ""), effect or "")
        if pair in seen:
            result.errors.append(
                FieldError(
                    where,
                    "FieldValueDuplicate",
                    "taints must be unique by key and effect pair",
                    pair[0],
                )
            )
        seen.add(pair)
    for part in ("capacity", "allocatable"):
        for name, value in ((obj.get("status") or {}).get(part) or {}).items():
            try:
                parse_quantity(value)
            except ValueError:
                result.errors.append(invalid(f"status.{part}[{name}]", value, _QUANTITY_MSG))
    return result


def _config_data(obj: dict[str, Any], kind: str) -> Result:
    result = Result()
    total = 0
    keys: set[str] = set()
    for part in ("data", "binaryData") if kind == "ConfigMap" else ("data", "stringData"):
        values = obj.get(part) or {}
        if not isinstance(values, dict):
            result.errors.append(invalid(part, values, "must be a map"))
            continue
        for key, value in values.items():
            if len(key) > 253 or not _CONFIG_KEY_RE.match(key):
                result.errors.append(
                    invalid(
                        f"{part}[{key}]",
                        key,
                        _CONFIG_KEY_MSG,
                    )
                )
            if key in keys:
                result.errors.append(FieldError(f"{part}[{key}]", "FieldValueDuplicate", "", key))
            keys.add(key)
            if not isinstance(value, str):
                result.errors.append(invalid(f"{part}[{key}]", value, "must be a string"))
                continue
            if part == "binaryData" or (kind == "Secret" and part == "data"):
                try:  # bytes on the wire as base64: their size is the decoded one
                    size = len(base64.b64decode(value, validate=True))
                except binascii.Error:
                    result.errors.append(invalid(f"{part}[{key}]", value, "must be base64"))
                    continue
            else:
                size = len(value.encode())
            total += len(key) + size
    if total > CONFIGMAP_MAX_BYTES:
        result.errors.append(
            FieldError("[]", "FieldValueTooLong", f"must have at most {CONFIGMAP_MAX_BYTES} bytes")
        )
    return result


def validate_configmap(obj: dict[str, Any]) -> Result:
    return _config_data(obj, "ConfigMap")


def validate_secret(obj: dict[str, Any]) -> Result:
    return _config_data(obj, "Secret")


def validate_job(obj: dict[str, Any]) -> Result:
    result = Result()
    spec = obj.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("template"), dict):
        result.errors.append(required("spec.template"))
        return result
    pod_spec = spec["template"].get("spec")
    result.extend(validate_pod_spec(pod_spec, "spec.template.spec"))
    policy = (pod_spec or {}).get("restartPolicy") if isinstance(pod_spec, dict) else None
    if policy not in ("OnFailure", "Never"):
        result.errors.append(
            not_supported("spec.template.spec.restartPolicy", policy, ("OnFailure", "Never"))
        )
    for key in (
        "backoffLimit",
        "activeDeadlineSeconds",
        "ttlSecondsAfterFinished",
        "parallelism",
        "completions",
    ):
        value = spec.get(key)
        if value is not None and (not isinstance(value, int) or value < 0):
            result.errors.append(
                invalid(f"spec.{key}", value, "must be greater than or equal to 0")
            )
    return result


def validate_priority_class(obj: dict[str, Any]) -> Result:
    result = Result()
    value = obj.get("value")
    if value is None:
        result.errors.append(required("value"))
    elif not isinstance(value, int) or isinstance(value, bool):
        result.errors.append(invalid("value", value, "must be an integer"))
    return result
