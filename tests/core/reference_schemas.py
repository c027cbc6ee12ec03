"""Validators of the upstream schemas in `tests/upstream/` (its README says how), each built once.

Argo's `schema.json` (v4.1.2) types quantities and int-or-strings as strings, its CRD as either;
both are made strict (`additionalProperties: false` wherever a schema lists properties), so a
misspelt field fails as `kubectl apply --validate=strict` would fail it.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft7Validator, Draft202012Validator
from jsonschema.protocols import Validator

REFERENCE = Path(__file__).parents[1] / "upstream"
ARGO = REFERENCE / "argo-workflows" / "v4.1.2"
KUEUE = REFERENCE / "kueue"
WORKFLOW = "io.argoproj.workflow.v1alpha1.Workflow"
CONTAINER = "io.k8s.api.core.v1.Container"
KUEUE_CRDS = {
    "ClusterQueue": "kueue.x-k8s.io_clusterqueues.yaml",
    "LocalQueue": "kueue.x-k8s.io_localqueues.yaml",
    "ResourceFlavor": "kueue.x-k8s.io_resourceflavors.yaml",
    "Topology": "kueue.x-k8s.io_topologies.yaml",
    "WorkloadPriorityClass": "kueue.x-k8s.io_workloadpriorityclasses.yaml",
}


def strict(schema: Any, *, required: bool = True) -> Any:
    """The schema rejecting unknown fields (the README's `strict`); without `required`, one
    that takes a part of an object too (a patch)."""
    if isinstance(schema, dict):
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        if not required and isinstance(schema.get("required"), list):
            del schema["required"]
        for value in schema.values():
            strict(value, required=required)
    elif isinstance(schema, list):
        for value in schema:
            strict(value, required=required)
    return schema


@functools.cache
def _argo_schema() -> dict[str, Any]:
    return json.loads((ARGO / "schema.json").read_text())


def _of_definition(name: str, *, required: bool = True) -> Validator:
    root = copy.deepcopy(_argo_schema())
    root.pop("oneOf", None)
    root["$ref"] = f"#/definitions/{name}"
    return Draft202012Validator(strict(root, required=required))


def _of_pod_spec_patch() -> Validator:
    """`schema.json` has no PodSpec: the part a patch of simrun's has, its containers those of
    the schema, with Kubernetes' type of the grace period (int64)."""
    root = copy.deepcopy(_argo_schema())
    root.pop("oneOf", None)
    root.update(
        type="object",
        properties={
            "terminationGracePeriodSeconds": {"type": "integer", "minimum": 0},
            "containers": {"type": "array", "items": {"$ref": f"#/definitions/{CONTAINER}"}},
        },
    )
    return Draft202012Validator(strict(root, required=False))


@functools.cache
def argo_schema() -> Validator:
    """Argo's `schema.json` at the Workflow definition, strict."""
    return _of_definition(WORKFLOW)


@functools.cache
def pod_spec_patch_schema() -> Validator:
    """A `podSpecPatch` of simrun's, strict, every field optional."""
    return _of_pod_spec_patch()


def _crd(path: Path, version: str) -> Validator:
    crd = yaml.load(path.read_text(), Loader=yaml.CSafeLoader)
    served = next(item for item in crd["spec"]["versions"] if item["name"] == version)
    return Draft7Validator(strict(served["schema"]["openAPIV3Schema"]))


@functools.cache
def argo_crd() -> Validator:
    """The full Workflow CRD of Argo v4.1.2, `v1alpha1`, strict: what the API server applies."""
    return _crd(ARGO / "argoproj.io_workflows.yaml", "v1alpha1")


@functools.cache
def kueue_crd(kind: str) -> Validator:
    """The CRD of a Kueue kind, at `v1beta2`, its storage version, strict."""
    return _crd(KUEUE / KUEUE_CRDS[kind], "v1beta2")


def errors(validator: Validator, document: Any) -> list[str]:
    """Every error of a document, as `path: message`."""
    found = sorted(validator.iter_errors(document), key=lambda error: list(error.absolute_path))
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in found]
