"""`simrun export WORKFLOW --cwl FILE`: a run prepared in a store without a service, and its CWL
workflow (simrun_core.cwl), for cwltool on this machine or Toil on Slurm.

The export runs where the store is (on Slurm: a machine that mounts the shared file system): it
writes the run as the service would have accepted it, `runs/<run>/events.jsonl` with its
`submitted` event (and `run.json`, its fold), `tasks/<task>/settings.json`, `provenance.json`
and `out/` of every task, and with `--source` the snapshots of the sources below `snapshots/`.
The run is planned with the task types installed here on the nodes of `--nodes` (a Slurm
cluster's shape), else on this machine. No service follows the run: the CWL runner runs its
steps, which write the ledger, the outputs and the reports into the store in place. The export
is the one writer of the run's log (`ev.Writer.EXPORT` in its `submitted` event), which a
service on the store folds and lists, never appending to it.
"""

from __future__ import annotations

import getpass
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import msgspec

from simrun_cli.errors import CliError
from simrun_cli.provenance import SourceError, parse_source
from simrun_cli.request import plan_tasks
from simrun_cli.snapshots import STORE_VARIABLE, SourcePolicy, local_store, record_sources
from simrun_core.clock import now
from simrun_core.cwl import DEFAULT_SCRATCH, export_cwl, planned_submission, to_cwl
from simrun_core.errors import WorkflowError
from simrun_core.fold import fold
from simrun_core.local_layout import LOCAL_DIR
from simrun_core.planner import Node
from simrun_core.plugins import load_task_types
from simrun_core.store import LogWriter, RunPaths, new_run_id, write_atomic, write_record_cache
from simrun_core.workflow import SplitMode, load_workflow

DEFAULT_STORE = "simrun-store"
"""The store of an export without `--store`, in the current directory."""


class Exported(msgspec.Struct, kw_only=True):
    """What `simrun export` prepared and wrote, and the commands that run it."""

    run: str
    store: str
    cwl: str
    tasks: list[str]
    steps: list[str]
    cwltool: str
    toil_slurm: str


@dataclass(frozen=True)
class ExportOptions:
    """The options of `simrun export`."""

    workflow: Path
    cwl: Path
    store: Path | None = None
    sources: tuple[str, ...] = ()
    nodes: Path | None = None
    group: str | None = None
    single_server: bool = False
    scratch: str = DEFAULT_SCRATCH


def machine_node() -> Node:
    """This machine as the one node to plan on: its CPUs and its memory."""
    cores = len(os.sched_getaffinity(0))
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    return Node(name=os.uname().nodename or "localhost", cores=cores, memory_gb=memory_gb)


def export_run(options: ExportOptions) -> Exported:
    """Prepare the run of a workflow file in the store and write its CWL file; CliError naming
    what is wrong, and then nothing of the run is left in the store."""
    from simrun_cli.rendering import load_nodes

    store = (options.store or Path(DEFAULT_STORE)).expanduser().resolve()
    _check_store(store)
    try:
        named = [parse_source(option) for option in options.sources]
        model = named[0][1] if named else None
        workflow = plan_tasks(load_workflow(options.workflow), model, str(options.workflow))
    except SourceError as error:
        raise CliError(str(error)) from None
    except WorkflowError as error:
        raise CliError(str(error.naming(str(options.workflow)))) from None
    nodes = load_nodes(options.nodes) if options.nodes is not None else [machine_node()]
    types = load_task_types()
    run_id = new_run_id()
    try:
        submitted, settings = planned_submission(
            workflow,
            types,
            nodes,
            run_id=run_id,
            time=now(),
            submitted_by=_user(),
            group=options.group,
            split=SplitMode.SINGLE_SERVER if options.single_server else None,
        )
        if named:  # copied once the workflow is planned: a refused one writes nothing
            store.mkdir(parents=True, exist_ok=True)
            sources = record_sources(named, SourcePolicy("store", store))
            submitted = msgspec.structs.replace(submitted, sources=sources)
    except WorkflowError as error:
        raise CliError(str(error.naming(str(options.workflow)))) from None
    except SourceError as error:
        raise CliError(str(error)) from None
    record = fold([submitted])
    try:
        document = to_cwl(record, types, store=str(store), scratch=options.scratch)
    except WorkflowError as error:
        raise CliError(str(error.naming(str(options.workflow)))) from None
    paths = RunPaths(store, run_id)
    try:
        paths.dir.mkdir(parents=True)
        provenance = msgspec.json.encode(submitted.sources)
        for task_id, task_settings in settings.items():
            paths.out(task_id).mkdir(parents=True)
            paths.logs(task_id).mkdir()
            write_atomic(paths.settings(task_id), msgspec.json.encode(task_settings))
            write_atomic(paths.provenance(task_id), provenance)
        writer = LogWriter(paths.events)
        try:
            writer.append(submitted)
        finally:
            writer.close()
        write_record_cache(paths, record)
        cwl = export_cwl(options.cwl, document).resolve()
    except ImportError as error:
        _remove(paths)
        raise CliError(str(error)) from None
    except (OSError, ValueError) as error:
        _remove(paths)
        raise CliError(f"the run cannot be exported: {error}") from None
    return Exported(
        run=run_id,
        store=str(store),
        cwl=str(cwl),
        tasks=[task.id for task in workflow.tasks],
        steps=[step["id"] for step in document["steps"]],
        cwltool=cwltool_command(cwl, store, options.scratch),
        toil_slurm=toil_command(cwl, store, run_id, options.scratch),
    )


def cwltool_command(cwl: Path, store: Path, scratch: str) -> str:
    """The command that runs an exported workflow on this machine."""
    parts = ["cwltool", "--no-container", "--parallel", str(cwl)]
    return shlex.join([*parts, "--store", str(store), "--scratch", scratch])


def toil_command(cwl: Path, store: Path, run_id: str, scratch: str) -> str:
    """The command that runs an exported workflow on Slurm with Toil, its job store beside the
    run (the store on a shared file system every node mounts at the same path)."""
    job_store = RunPaths(store, run_id).dir / "toil-jobstore"
    parts = ["toil-cwl-runner", "--batchSystem", "slurm", "--jobStore", str(job_store)]
    parts += ["--no-container", str(cwl), "--store", str(store), "--scratch", scratch]
    return shlex.join(parts)


def _check_store(store: Path) -> None:
    """Refuse the store of a service (a local service's `.simrun/store/`, the mounted store of
    `SIMRUN_STORE`): a service writes its store alone, and would list the exported run among
    its own as `submitting` for ever (it never writes a log of another writer)."""
    mounted = os.environ.get(STORE_VARIABLE, "").strip()
    local = store == local_store(store.parent.parent) and store.parent.name == LOCAL_DIR
    if local or (mounted and store == Path(mounted).expanduser().resolve()):
        raise CliError(
            f"--store {store}: the store of a service, which writes it alone: give the export "
            "a store of its own"
        )
    if store.exists() and not store.is_dir():
        raise CliError(f"--store {store}: no directory")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _remove(paths: RunPaths) -> None:
    import shutil

    shutil.rmtree(paths.dir, ignore_errors=True)
