"""The routes of the service, one module per concern; `ROUTES` is every one of them."""

from simrun_api.routes.follow import (
    run_events,
    servers,
    service_events,
    task_logs,
    task_output_file,
    task_outputs,
    task_outputs_archive,
    task_workers,
)
from simrun_api.routes.runs import (
    cancel_run,
    estimate,
    get_run,
    history,
    list_runs,
    local_instance,
    me,
    run_progress,
    submit,
    validate,
    wait_run,
)
from simrun_api.routes.snapshots import snapshot_missing, upload_snapshot
from simrun_api.routes.store import cleanup, compare, delete_run, usage

ROUTES = [
    me,
    local_instance,
    validate,
    submit,
    estimate,
    list_runs,
    get_run,
    wait_run,
    run_progress,
    history,
    run_events,
    service_events,
    servers,
    task_workers,
    task_logs,
    task_outputs,
    task_output_file,
    task_outputs_archive,
    snapshot_missing,
    upload_snapshot,
    cancel_run,
    delete_run,
    cleanup,
    usage,
    compare,
]
