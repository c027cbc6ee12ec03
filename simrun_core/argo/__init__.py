"""Argo manifests of runs, one module per concept: the `Workflow` of a run (`workflow`), its
pod templates (`pod`), their retries (`retry`), label values (`labels`) and the rendering of a
workflow file without a cluster (`render`). Plain dicts, validated in the tests against Argo's
schema and CRD (tests/upstream/README.md)."""

from simrun_core.argo.labels import label_value
from simrun_core.argo.render import render_run
from simrun_core.argo.workflow import workflow_manifest
from simrun_core.naming import workflow_name

__all__ = ["label_value", "render_run", "workflow_manifest", "workflow_name"]
