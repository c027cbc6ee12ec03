"""An emulated kubelet: each admitted, scheduled pod's main container as a local process.

`Kubelet` serves the nodes of a `FakeCluster`. A pod bound to one of them (`spec.nodeName`),
without scheduling gates and still `Pending` is started: its one container to run (every
container but the emulated ones, Argo's `wait`) becomes `asyncio.create_subprocess_exec` of
its `command` + `args`, in a process group of its own, with

- the environment of the container (`value`s with the `$(VAR)` expansion and the `$$` escape
  of Kubernetes, `valueFrom.fieldRef`, `resourceFieldRef`, `configMapKeyRef`, `secretKeyRef`)
  over a small base environment (`PATH` led by `bin/` beside this module, the stand-ins of
  the tools of images, e.g. `buildctl` (`buildctl.py`), then this interpreter's directory;
  `HOME`, `LANG`, `HOSTNAME` the pod's name) and the `env_overrides` of the cluster;
- its volume mounts mapped to local directories: a PersistentVolumeClaim to the directory the
  cluster gives its claim, a hostPath to `<scratch>/<node>/<path>`, an emptyDir to a directory
  of the pod, each with its `subPath` (created as the kubelet does), a configMap or secret
  volume to a directory of the pod written as the kubelet's atomic writer writes it (the files
  are links into `..data`, a link to a timestamped directory of the contents; `items`,
  `defaultMode` and `optional` honoured); a pod whose configMap or secret is missing (and not
  optional) waits `ContainerCreating` and starts once it exists, as the kubelet retries the
  mount; every mount path that begins a path in an env value, the argv or `workingDir` is
  replaced by its local directory, so e.g. `SIMRUN_TASK_DIR=/store/runs/...` names the real
  local directory;
- its output (stdout and stderr together) appended to the pod's log (`Store.append_log`);
- the pod's status `Pending` -> `Running` -> `Succeeded`/`Failed` with `containerStatuses`
  (`state.running`, then `state.terminated` with `exitCode`, `reason` `Completed`/`Error`/
  `OOMKilled`), the emulated containers running beside it and `Completed` after it;
- a memory limit (`resources.limits.memory`) enforced by sampling the anonymous memory of the
  process tree every `memory_sample_s` (`simrun_harness.memory.process_tree_anon`): above it
  the group is killed with SIGKILL and the container ends `OOMKilled` with exit code 137, as
  the kernel's cgroup v2 `memory.oom.group` kill of the whole container;
- a deletion (the store's graceful deletion marks the pod): SIGTERM to the group, SIGKILL after
  `deletionGracePeriodSeconds`, then the pod is removed (`grace_period=0`) without a terminal
  status, so Argo finds it gone (`pod deleted`, spec 11 findings); a pod never started is
  removed at once;
- the taint manager's eviction: a pod on a node with a `NoExecute` taint it does not tolerate
  is deleted (gracefully) at once.

Every process group is killed when the kubelet stops.

Not emulated: images (the command runs on this machine, in this Python environment), init and
sidecar containers (a pod runs one container), `restartPolicy` other than `Never` (nothing is
restarted), probes, CPU limits and `ephemeral-storage`, `readOnly` mounts, users and security
contexts, `envFrom`, projected volumes, updates of a mounted configMap or secret,
`tolerationSeconds`, node pressure evictions, `activeDeadlineSeconds` (the Job controller's
is, `jobs.py`), the status of a pod deleted while it ran (not written).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import math
import os
import re
import signal
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simrun_harness.memory import process_tree_anon

from .reconcile import JSON, Reconciler, is_terminal, quantity, untolerated
from .store import ApiError, Store, now

EMULATED_CONTAINERS = ("wait",)
LOCAL_IP = "127.0.0.1"
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class ContainerError(Exception):
    """A container the kubelet cannot create: `CreateContainerConfigError` and its message."""


class VolumeNotReady(Exception):
    """A volume that cannot be mounted yet (its configMap or secret is missing): the pod waits
    `ContainerCreating` and the mount is tried again."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined variables replaced, `$$` made `$`, others kept."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _REFERENCE.sub(replace, text)


STAND_INS = Path(__file__).parent / "bin"
"""The stand-ins of the tools of images that cannot run here (`buildctl`), first on `PATH`."""


def default_base_env() -> dict[str, str]:
    """The environment every process starts from: the stand-ins, then this interpreter, first
    on `PATH`."""
    path = os.pathsep.join(
        [str(STAND_INS), str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    )
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/root")}
    for key in ("LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


@dataclass
class _Run:
    """A started pod: its process and how it ended."""

    namespace: str
    name: str
    uid: str
    container: str
    process: asyncio.subprocess.Process | None = None
    task: asyncio.Task[None] | None = None
    started_at: str = ""
    oom: bool = False
    terminating: bool = False
    kill: asyncio.TimerHandle | None = None
    others: list[str] = field(default_factory=list)
    """The emulated containers (Argo's `wait`), reported beside the one that runs."""


class Kubelet(Reconciler):
    """The kubelet of the cluster's nodes; `claims` maps a claim's name to its local directory."""

    name = "kubelet"
    plurals = ("pods", "nodes")

    def __init__(
        self,
        store: Store,
        *,
        nodes: Iterable[str],
        claims: Mapping[str, Path],
        scratch: Path,
        work: Path,
        base_env: Mapping[str, str] | None = None,
        env_overrides: Mapping[str, str] | None = None,
        memory_sample_s: float = 0.05,
        emulated_containers: tuple[str, ...] = EMULATED_CONTAINERS,
        resync_s: float = 0.5,
    ) -> None:
        super().__init__(store, resync_s=resync_s)
        self.node_names = set(nodes)
        self.claims = {name: Path(path) for name, path in claims.items()}
        self.scratch = Path(scratch)
        self.work = Path(work)
        self.base_env = dict(base_env) if base_env is not None else default_base_env()
        self.env_overrides = dict(env_overrides or {})
        self.memory_sample_s = memory_sample_s
        self.emulated = emulated_containers
        self.runs: dict[str, _Run] = {}
        self.started: list[JSON] = []
        """Every pod as the kubelet got it when it started it, in order (for tests)."""
        self.evictions: list[str] = []
        self._broken: set[str] = set()
        self._closing = False

    # -- the loop

    async def reconcile(self) -> None:
        pods, _ = self.store.list("pods")
        nodes = {n["metadata"]["name"]: n for n in self.store.list("nodes")[0]}
        present = {p["metadata"]["uid"] for p in pods}
        for uid, run in list(self.runs.items()):
            if uid not in present and run.process is not None and run.process.returncode is None:
                self._signal(run, signal.SIGKILL)  # removed without grace
        for pod in pods:
            spec = pod.get("spec") or {}
            if spec.get("nodeName") not in self.node_names:
                continue
            meta = pod["metadata"]
            run = self.runs.get(meta["uid"])
            deleting = bool(meta.get("deletionTimestamp"))
            if run is None:
                if deleting:
                    self._remove(pod)
                elif self._startable(pod):
                    await self._start(pod)
                continue
            if deleting and not run.terminating:
                self._terminate(run, int(meta.get("deletionGracePeriodSeconds") or 0))
        for pod in pods:
            node = nodes.get((pod.get("spec") or {}).get("nodeName") or "")
            if node is None or node["metadata"]["name"] not in self.node_names:
                continue
            if is_terminal(pod) or pod["metadata"].get("deletionTimestamp"):
                continue
            if untolerated(pod, node, ("NoExecute",)):
                self.evictions.append(pod["metadata"]["name"])
                self._delete(pod)

    def _startable(self, pod: JSON) -> bool:
        spec = pod.get("spec") or {}
        return (
            not spec.get("schedulingGates")
            and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
            and pod["metadata"]["uid"] not in self._broken
        )

    def signal(self, namespace: str, name: str, signum: int) -> None:
        """Signal the running containers of a pod (Argo's exec of `kill` into them)."""
        for run in self.runs.values():
            if run.namespace == namespace and run.name == name:
                self._signal(run, signal.Signals(signum))

    async def close(self) -> None:
        """Kill every process group and reap the processes; no status is written any more."""
        self._closing = True
        for run in self.runs.values():
            if run.kill is not None:
                run.kill.cancel()
            self._signal(run, signal.SIGKILL)
        tasks = [run.task for run in self.runs.values() if run.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=5)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- starting a pod

    async def _start(self, pod: JSON) -> None:
        meta = pod["metadata"]
        try:
            container, argv, env, cwd = self._prepare(pod)
        except VolumeNotReady as error:
            self._write_waiting(pod, "ContainerCreating", str(error))  # again: a no-op write
            return
        except ContainerError as error:
            self._broken.add(meta["uid"])
            self._write_waiting(pod, "CreateContainerConfigError", str(error))
            return
        run = _Run(meta["namespace"], meta["name"], meta["uid"], container["name"])
        run.others = [
            c["name"] for c in pod["spec"].get("containers") or [] if c["name"] in self.emulated
        ]
        self.runs[run.uid] = run
        self.started.append(copy.deepcopy(pod))
        run.started_at = now()
        # A pipe of our own rather than asyncio's: `Process.wait()` would wait for the pipe's
        # end too, which a process left in the background could hold open.
        read_end, write_end = os.pipe()
        try:
            run.process = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                cwd=cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=write_end,
                stderr=write_end,
                start_new_session=True,
            )
        except OSError as error:
            os.close(read_end)
            message = f"failed to create containerd task: exec: {argv[0]!r}: {error.strerror}"
            self._write_terminated(pod, run, 128, "StartError", message)
            return
        finally:
            os.close(write_end)
        self._write_running(pod, run)
        run.task = asyncio.create_task(self._supervise(pod, run, container, read_end))

    def _prepare(self, pod: JSON) -> tuple[JSON, list[str], dict[str, str], str]:
        """The container to run, its argv, environment and working directory."""
        meta, spec = pod["metadata"], pod["spec"]
        runnable = [c for c in spec.get("containers") or [] if c["name"] not in self.emulated]
        if len(runnable) != 1:
            names = [c["name"] for c in runnable]
            raise ContainerError(f"the fake kubelet runs one container per pod, not {names}")
        if spec.get("initContainers"):
            raise ContainerError("init containers are not emulated")
        container = runnable[0]
        mounts = self._mounts(pod, container)

        def local(text: str) -> str:
            return _translate(text, mounts)

        env = dict(self.base_env)
        env["HOSTNAME"] = meta["name"]
        defined: dict[str, str] = {}  # as Kubernetes expands them, before the local paths
        if container.get("envFrom"):
            raise ContainerError("envFrom is not emulated")
        for entry in container.get("env") or []:
            if "valueFrom" in entry:
                defined[entry["name"]] = self._value_from(pod, container, entry)
            else:
                defined[entry["name"]] = expand(str(entry.get("value", "")), defined)
        env.update({name: local(value) for name, value in defined.items()})
        env.update(self.env_overrides)
        command = list(container.get("command") or []) + list(container.get("args") or [])
        if not container.get("command"):
            raise ContainerError("no command: the fake kubelet cannot run an image's entrypoint")
        argv = [local(expand(str(part), defined)) for part in command]
        working = container.get("workingDir")
        cwd = Path(local(working)) if working else self.work / meta["namespace"] / meta["name"]
        cwd.mkdir(parents=True, exist_ok=True)
        return container, argv, env, str(cwd)

    def _mounts(self, pod: JSON, container: JSON) -> list[tuple[str, Path]]:
        meta, spec = pod["metadata"], pod["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        mounts: list[tuple[str, Path]] = []
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"])
            if volume is None:
                raise ContainerError(f'volume "{mount["name"]}" of a mount is no volume of the pod')
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"].get("claimName", "")
                if claim not in self.claims:
                    raise ContainerError(f'persistentvolumeclaim "{claim}" not found')
                root = self.claims[claim]
            elif "hostPath" in volume:
                root = self.scratch / spec["nodeName"] / volume["hostPath"]["path"].lstrip("/")
            elif "emptyDir" in volume:
                root = self.work / meta["namespace"] / meta["name"] / "volumes" / mount["name"]
            elif "configMap" in volume or "secret" in volume:
                root = self._config_volume(pod, volume)
                path = root / mount["subPath"] if mount.get("subPath") else root
                mounts.append((mount["mountPath"].rstrip("/") or "/", path))
                continue
            else:
                kinds = sorted(k for k in volume if k != "name")
                raise ContainerError(f'volume "{mount["name"]}": {kinds} volumes are not emulated')
            path = root / mount["subPath"] if mount.get("subPath") else root
            path.mkdir(parents=True, exist_ok=True)
            mounts.append((mount["mountPath"].rstrip("/") or "/", path))
        return mounts

    def _config_volume(self, pod: JSON, volume: JSON) -> Path:
        """A configMap or secret volume written as the kubelet's atomic writer writes it:
        `..<time>/` with the contents, `..data` a link to it, every file a link into `..data`.
        VolumeNotReady while the object (not optional) or an item's key (not optional) is
        missing; an optional one that is missing is an empty directory."""
        meta = pod["metadata"]
        secret = "secret" in volume
        source = volume["secret"] if secret else volume["configMap"]
        plural, name = (
            ("secrets", source.get("secretName")) if secret else ("configmaps", source.get("name"))
        )
        optional = bool(source.get("optional"))
        root = self.work / meta["namespace"] / meta["name"] / "volumes" / volume["name"]
        if (root / "..data").exists():
            return root  # written when the pod was prepared before
        try:
            obj = self.store.get(plural, name or "", meta["namespace"])
        except ApiError as error:
            if error.code != 404 or not optional:
                what = "secret" if secret else "configmap"
                raise VolumeNotReady(
                    f'MountVolume.SetUp failed for volume "{volume["name"]}" : {what} '
                    f'"{name}" not found'
                ) from None
            obj = {}
        contents: dict[str, bytes] = {}
        for key, value in (obj.get("data") or {}).items():
            contents[key] = base64.b64decode(value) if secret else str(value).encode()
        for key, value in (obj.get("binaryData") or {}).items():
            contents[key] = base64.b64decode(value)
        for key, value in (obj.get("stringData") or {}).items() if secret else ():
            contents[key] = str(value).encode()
        mode = int(source.get("defaultMode", 0o644))
        files: dict[str, tuple[bytes, int]] = {}
        items = source.get("items")
        if items is None:
            files = {key: (value, mode) for key, value in contents.items()}
        else:
            for item in items:
                if item["key"] not in contents:
                    if obj and not optional:
                        what = "secret" if secret else "config"
                        raise VolumeNotReady(
                            f'MountVolume.SetUp failed for volume "{volume["name"]}" : '
                            f"references non-existent {what} key: {item['key']}"
                        )
                    continue
                files[item["path"]] = (contents[item["key"]], int(item.get("mode", mode)))
        root.mkdir(parents=True, exist_ok=True)
        stamp = root / f"..{now().replace(':', '_')}.{os.getpid()}"
        stamp.mkdir()
        for path, (content, file_mode) in files.items():
            target = stamp / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            target.chmod(file_mode)
        (root / "..data").symlink_to(stamp.name)
        for top in sorted({path.split("/", 1)[0] for path in files}):
            (root / top).symlink_to(f"..data/{top}")
        return root

    def _value_from(self, pod: JSON, container: JSON, entry: JSON) -> str:
        source = entry["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"].get("fieldPath", "")
            match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
            if match:
                return str((pod["metadata"].get(match.group(1)) or {}).get(match.group(2), ""))
            values = {
                "metadata.name": pod["metadata"]["name"],
                "metadata.namespace": pod["metadata"]["namespace"],
                "metadata.uid": pod["metadata"]["uid"],
                "spec.nodeName": pod["spec"].get("nodeName", ""),
                "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
                "status.podIP": LOCAL_IP,
                "status.hostIP": LOCAL_IP,
            }
            if path not in values:
                raise ContainerError(f"fieldRef {path!r} is not emulated")
            return values[path]
        if "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            part, _, resource = ref.get("resource", "").partition(".")
            amounts = (container.get("resources") or {}).get(part) or {}
            if resource not in amounts:
                raise ContainerError(f"resourceFieldRef {ref.get('resource')!r}: no such amount")
            divisor = quantity(ref.get("divisor", "1"))
            return str(math.ceil(quantity(amounts[resource]) / divisor))
        for kind, plural in (("configMapKeyRef", "configmaps"), ("secretKeyRef", "secrets")):
            if kind in source:
                ref = source[kind]
                try:
                    obj = self.store.get(plural, ref["name"], pod["metadata"]["namespace"])
                except ApiError as error:
                    raise ContainerError(error.message) from None
                data = obj.get("data") or {}
                if ref["key"] not in data:
                    raise ContainerError(f"couldn't find key {ref['key']} in {plural[:-1]}")
                value = data[ref["key"]]
                return base64.b64decode(value).decode() if plural == "secrets" else value
        raise ContainerError(f"valueFrom {sorted(source)} is not emulated")

    # -- running it

    async def _supervise(self, pod: JSON, run: _Run, container: JSON, read_end: int) -> None:
        try:
            await self._run(pod, run, container, read_end)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # kept for the test
            self.refuse(f"pod {run.namespace}/{run.name}: {error!r}")

    async def _run(self, pod: JSON, run: _Run, container: JSON, read_end: int) -> None:
        process = run.process
        assert process is not None
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_end, "rb", 0)
        )
        limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
        limit_bytes = int(quantity(limit)) if limit is not None else None
        output = asyncio.create_task(self._copy_output(run, reader))
        watch = (
            asyncio.create_task(self._watch_memory(run, process.pid, limit_bytes))
            if limit_bytes
            else None
        )
        try:
            try:
                returncode = await process.wait()
            finally:
                if watch is not None:
                    watch.cancel()
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)  # the container ends with its main
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await output  # the rest of the output, until the pipe's end
        finally:
            output.cancel()
            transport.close()
        if run.kill is not None:
            run.kill.cancel()
        code = returncode if returncode >= 0 else 128 - returncode
        reason = "OOMKilled" if run.oom else ("Completed" if code == 0 else "Error")
        self._finish(pod, run, code, reason)

    async def _copy_output(self, run: _Run, stream: asyncio.StreamReader) -> None:
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return
            self.store.append_log(run.namespace, run.name, run.container, chunk)

    async def _watch_memory(self, run: _Run, pid: int, limit: int) -> None:
        while True:
            used = process_tree_anon(pid)
            if used is None:
                return
            if used > limit:
                run.oom = True
                self._signal(run, signal.SIGKILL)
                return
            await asyncio.sleep(self.memory_sample_s)

    def _signal(self, run: _Run, signum: signal.Signals) -> None:
        process = run.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signum)

    def _terminate(self, run: _Run, grace_s: int) -> None:
        """A deletion: SIGTERM now, SIGKILL after the grace period."""
        run.terminating = True
        if grace_s <= 0:
            self._signal(run, signal.SIGKILL)
            return
        self._signal(run, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        run.kill = loop.call_later(grace_s, self._signal, run, signal.SIGKILL)

    def _finish(self, pod: JSON, run: _Run, code: int, reason: str) -> None:
        if self._closing:
            return
        try:
            current = self.store.get("pods", run.name, run.namespace)
        except ApiError:
            return
        if current["metadata"].get("uid") != run.uid:
            return
        if current["metadata"].get("deletionTimestamp"):
            self._remove(current)
            return
        written = self._write_terminated(pod, run, code, reason, "")
        if written is not None and written["metadata"].get("deletionTimestamp"):
            self._remove(written)

    # -- the pod's status

    def _update_status(self, pod: JSON, change: Any) -> JSON | None:
        meta = pod["metadata"]
        uid = meta["uid"]

        def mutate(obj: JSON) -> None:
            if obj["metadata"].get("uid") != uid or obj["metadata"].get("deletionTimestamp"):
                return  # another pod of the name, or one being deleted: no status any more
            change(obj.setdefault("status", {}))

        try:
            return self.store.update(
                "pods", meta["name"], mutate, meta["namespace"], subresource="status"
            )
        except ApiError as error:
            if error.code == 404:
                return None
            raise

    def _container_status(self, container: JSON, state: JSON, ready: bool, pid: int) -> JSON:
        return {
            "name": container["name"],
            "image": container.get("image", ""),
            "imageID": "",
            "containerID": f"fake://{pid}",
            "ready": ready,
            "started": ready,
            "restartCount": 0,
            "state": state,
        }

    def _conditions(self, status: JSON, ready: bool, reason: str | None = None) -> None:
        stamp = now()
        kept = [
            c
            for c in status.get("conditions") or []
            if c.get("type") not in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ]
        for kind in ("Initialized", "PodScheduled"):
            kept.append({"type": kind, "status": "True", "lastTransitionTime": stamp})
        for kind in ("ContainersReady", "Ready"):
            condition = {
                "type": kind,
                "status": "True" if ready else "False",
                "lastTransitionTime": stamp,
            }
            if reason:
                condition["reason"] = reason
            kept.append(condition)
        status["conditions"] = kept

    def _write_running(self, pod: JSON, run: _Run) -> None:
        pid = run.process.pid if run.process is not None else 0
        containers = pod["spec"].get("containers") or []

        def change(status: JSON) -> None:
            status["phase"] = "Running"
            status["hostIP"] = LOCAL_IP
            status["podIP"] = LOCAL_IP
            status["podIPs"] = [{"ip": LOCAL_IP}]
            status["startTime"] = run.started_at
            self._conditions(status, True)
            state = {"running": {"startedAt": run.started_at}}
            status["containerStatuses"] = [
                self._container_status(c, state, True, pid) for c in containers
            ]

        self._update_status(pod, change)

    def _write_terminated(
        self, pod: JSON, run: _Run, code: int, reason: str, message: str
    ) -> JSON | None:
        pid = run.process.pid if run.process is not None else 0
        finished = now()
        containers = pod["spec"].get("containers") or []

        def change(status: JSON) -> None:
            status["phase"] = "Succeeded" if code == 0 else "Failed"
            status["hostIP"] = LOCAL_IP
            status["podIP"] = LOCAL_IP
            status.setdefault("startTime", run.started_at)
            self._conditions(status, False, "PodCompleted" if code == 0 else "PodFailed")
            statuses = []
            for container in containers:
                terminated: JSON = {
                    "exitCode": code,
                    "reason": reason,
                    "startedAt": run.started_at,
                    "finishedAt": finished,
                    "containerID": f"fake://{pid}",
                }
                if container["name"] in run.others:
                    terminated.update(exitCode=0, reason="Completed")
                elif message:
                    terminated["message"] = message
                statuses.append(
                    self._container_status(container, {"terminated": terminated}, False, pid)
                )
            status["containerStatuses"] = statuses

        return self._update_status(pod, change)

    def _write_waiting(self, pod: JSON, reason: str, message: str) -> None:
        containers = pod["spec"].get("containers") or []

        def change(status: JSON) -> None:
            state = {"waiting": {"reason": reason, "message": message}}
            status["containerStatuses"] = [
                self._container_status(c, state, False, 0) for c in containers
            ]

        self._update_status(pod, change)

    # -- deletions

    def _remove(self, pod: JSON) -> None:
        """The end of a deletion: remove the pod object (grace period 0)."""
        meta = pod["metadata"]
        try:
            self.store.delete(
                "pods",
                meta["name"],
                meta["namespace"],
                grace_period=0,
                preconditions={"uid": meta["uid"]},
            )
        except ApiError as error:
            if error.code not in (404, 409):
                raise

    def _delete(self, pod: JSON) -> None:
        meta = pod["metadata"]
        try:
            self.store.delete("pods", meta["name"], meta["namespace"])
        except ApiError as error:
            if error.code != 404:
                raise


def _translate(text: str, mounts: list[tuple[str, Path]]) -> str:
    """Every mount path that begins a path in `text` made its local directory."""
    if not mounts or "/" not in text:
        return text
    ordered = sorted(mounts, key=lambda m: len(m[0]), reverse=True)
    pattern = re.compile(
        r"(?<![\w.-])(" + "|".join(re.escape(path) for path, _ in ordered) + r")(?=/|$|[^\w.-])",
        re.M,
    )
    local = dict(ordered)
    return pattern.sub(lambda match: str(local[match.group(1)]), text)
