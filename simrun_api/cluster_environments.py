"""The environments of the runs on a cluster: a lock from the snapshots, an image built once
(spec 28, 42). The `Environments` of a service whose backend builds images (the Argo backend).

`resolve` locks the environment of a run whose model (its first source) was snapshotted with a
`pyproject.toml` (`simrun_api.environment_resolver`, in a thread): the run's image is then the
one of its lock, named by `simrun_core.environment.image_ref`. A model without a
`pyproject.toml` runs in the service's default image (`Resolved(None)`). The lock is written to
`runs/<run>/environment.lock`; the build inputs of the image, its Dockerfile and which wheel of
simrun it installs, to `environments/<hash of the image>/` of the store
(`simrun_core.environment.build_inputs`). They are named by the image, as `build` is asked for
the image only (and so is after a restart, from the `environment-resolved` of the run's log):
whichever run asks for it finds them, and two runs of one environment write the same files.

`build` makes sure the registry has the image: found there (`Made(None, cached=True)`), else
built by the backend from a flat build context of the Dockerfile and the simrun wheel of the
service (`simrun_wheel` of the settings). One image is built once however many runs ask at
once: they wait for the same build, which a cancelled run does not cancel (it is shielded;
`close` ends the builds in flight). Every failure is an `EnvironmentRefused` saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import shutil
import tempfile
from pathlib import Path

import msgspec

import simrun_core
from simrun_api.backends.base import Backend, ImageBuilds
from simrun_api.environment_resolver import resolve_environment
from simrun_api.environments import EnvironmentRefused, Environments, Made, Resolved
from simrun_core.cluster import ClusterConfig
from simrun_core.environment import (
    BUILD_CONSTRAINTS,
    Environment,
    build_inputs,
    dockerfile,
    image_ref,
)
from simrun_core.fold import RunRecord
from simrun_core.provenance import SourceProvenance
from simrun_core.store import RunPaths, write_atomic

log = logging.getLogger(__name__)

DOCKERFILE = "Dockerfile"
INPUTS = "build.json"
NO_WHEEL = "the service has no simrun wheel to build with"


class BuildInputs(msgspec.Struct, frozen=True, kw_only=True):
    """What the Dockerfile of an image was computed with, beside it in the store."""

    image: str
    lock_sha256: str
    simrun_version: str
    wheel: str
    """The file name of the simrun wheel the Dockerfile copies."""
    wheel_sha256: str | None


class Wheel(msgspec.Struct, frozen=True):
    """The simrun wheel of the service: its file, name, hash and the version it installs."""

    path: Path | None
    name: str
    sha256: str | None
    version: str


def service_wheel(path: Path | None) -> Wheel:
    """The wheel the images of the service install; one that is missing is no wheel (its name
    is then the one of this simrun, which no build ever copies)."""
    version = simrun_core.__version__
    default = f"simrun-{version}-py3-none-any.whl"
    if path is None or not path.is_file():
        return Wheel(None, path.name if path is not None else default, None, version)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    parts = path.name.split("-")
    wheel_version = parts[1] if len(parts) >= 5 and path.name.endswith(".whl") else version
    return Wheel(path, path.name, digest, f"{wheel_version} sha256:{digest}")


class ClusterEnvironments:
    """Resolves the environments of runs from their snapshots and builds their images (see the
    module). `store` is the run store as the service sees it, `backend` builds the images in
    `cluster` (its `registry`, `base_image`, `system_packages`), `python` is the version of the
    images, `simrun_wheel` the wheel of simrun they install, `build_constraints` the pins of the
    build backends (the package's `build_constraints.txt` by default)."""

    def __init__(
        self,
        store: Path,
        backend: ImageBuilds,
        cluster: ClusterConfig,
        *,
        python: str,
        simrun_wheel: Path | None,
        build_constraints: Path | None = None,
    ) -> None:
        self.store = store
        self.backend = backend
        self.cluster = cluster
        self.python = python
        self.wheel = service_wheel(simrun_wheel)
        self.build_constraints = build_constraints or BUILD_CONSTRAINTS
        self._builds: dict[str, asyncio.Task[Made]] = {}

    # -- resolve ----------------------------------------------------------------------------

    async def resolve(self, record: RunRecord) -> Resolved:
        """The image of a run's environment and the hash of its lock; `Resolved(None)` for a
        run whose model has no `pyproject.toml` (or was not snapshotted)."""
        model = record.sources[0] if record.sources else None
        if model is None or not model.snapshot:
            return Resolved(image=None)
        if not (self.store / model.snapshot).is_dir():
            raise EnvironmentRefused(
                f"the snapshot {model.snapshot} of the model {model.name} is not in the store"
            )
        if not (self.store / model.snapshot / "pyproject.toml").is_file():
            return Resolved(image=None)
        if not self.cluster.registry:
            raise EnvironmentRefused(
                "the cluster has no registry to build the image of the environment in "
                "(`cluster.registry` of the settings)"
            )
        libraries = [source for source in record.sources[1:] if source.snapshot]
        try:
            env = await asyncio.to_thread(self._resolve, model, libraries)
            text = dockerfile(
                env, self.cluster.base_image_ref(), self.wheel.name, self.cluster.system_packages
            )
            image = image_ref(env, self.cluster.registry, text)
            await asyncio.to_thread(self._keep, record.id, env, image, text)
        except (ValueError, RuntimeError, OSError) as error:
            raise EnvironmentRefused(str(error)) from None
        log.info("run %s: environment %s resolved, image %s", record.id, env.lock_sha256, image)
        return Resolved(image=image, lock_sha256=env.lock_sha256)

    def _resolve(self, model: SourceProvenance, libraries: list[SourceProvenance]) -> Environment:
        return resolve_environment(
            self.store,
            model,
            libraries,
            self.python,
            simrun_version=self.wheel.version,
            build_constraints=self.build_constraints,
        )

    def _keep(self, run_id: str, env: Environment, image: str, text: str) -> None:
        """The run's lock and the image's build inputs, each written whole."""
        write_atomic(RunPaths(self.store, run_id).environment_lock, env.lock.encode())
        inputs = build_inputs(self.store, image)
        inputs.mkdir(parents=True, exist_ok=True)
        write_atomic(inputs / DOCKERFILE, text.encode())
        kept = BuildInputs(
            image=image,
            lock_sha256=env.lock_sha256,
            simrun_version=env.simrun_version,
            wheel=self.wheel.name,
            wheel_sha256=self.wheel.sha256,
        )
        write_atomic(inputs / INPUTS, msgspec.json.format(msgspec.json.encode(kept)) + b"\n")

    # -- build ------------------------------------------------------------------------------

    async def build(self, image: str) -> Made:
        """Make sure the registry has `image`: found, or built from its inputs in the store (one
        build for all who ask at once; a cancelled caller leaves it to the others)."""
        task = self._builds.get(image)
        if task is None:
            task = asyncio.ensure_future(self._make(image))
            self._builds[image] = task
            task.add_done_callback(lambda done: self._forget(image, done))
        return await asyncio.shield(task)

    def _forget(self, image: str, task: asyncio.Task[Made]) -> None:
        if self._builds.get(image) is task:
            del self._builds[image]
        if not task.cancelled():
            task.exception()  # retrieved: a build nobody waits for any more fails quietly

    async def _make(self, image: str) -> Made:
        try:
            found = await self.backend.has_image(image)
        except (ValueError, RuntimeError) as error:
            raise EnvironmentRefused(
                f"whether the registry has {image} is not known: {error}"
            ) from None
        if found:
            log.info("image %s is in the registry", image)
            return Made(seconds=None, cached=True)
        text, inputs = await asyncio.to_thread(self._inputs, image)
        wheel = self.wheel
        if wheel.path is None or wheel.sha256 is None:
            raise EnvironmentRefused(NO_WHEEL)
        if (inputs.wheel, inputs.wheel_sha256) != (wheel.name, wheel.sha256):
            raise EnvironmentRefused(
                f"the image {image} was resolved with the simrun wheel {inputs.wheel} "
                f"(sha256 {inputs.wheel_sha256}), the service has {wheel.name} (sha256 "
                f"{wheel.sha256}) now: submit the run again"
            )
        loop = asyncio.get_running_loop()
        with tempfile.TemporaryDirectory(prefix="simrun-build-context-") as context:
            await asyncio.to_thread(_context, Path(context), text, wheel.path)
            started = loop.time()
            try:
                await self.backend.build_image(context, image)
            except Exception as error:  # the build's, the registry's or the API's: the reason
                raise EnvironmentRefused(f"the image {image} cannot be built: {error}") from None
            seconds = loop.time() - started
        log.info("image %s built in %.1f s", image, seconds)
        return Made(seconds=round(seconds, 3))

    def _inputs(self, image: str) -> tuple[str, BuildInputs]:
        directory = build_inputs(self.store, image)
        try:
            text = (directory / DOCKERFILE).read_text()
            inputs = msgspec.json.decode((directory / INPUTS).read_bytes(), type=BuildInputs)
        except (OSError, msgspec.DecodeError) as error:
            raise EnvironmentRefused(
                f"the build inputs of {image} are not in the store ({directory}: {error}): "
                "submit the run again to resolve its environment anew"
            ) from None
        if inputs.image != image:
            raise EnvironmentRefused(f"the build inputs in {directory} are of {inputs.image}")
        return text, inputs

    async def close(self) -> None:
        """End the builds in flight (their Jobs go on in the cluster: a later build waits for
        the one of the image it finds there)."""
        tasks = list(self._builds.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


def _context(directory: Path, text: str, wheel: Path) -> None:
    """The flat build context: the Dockerfile and the wheel."""
    (directory / DOCKERFILE).write_text(text)
    shutil.copyfile(wheel, directory / wheel.name)


def environments_for(
    store: Path,
    backend: Backend,
    cluster: ClusterConfig,
    *,
    python: str,
    simrun_wheel: Path | None,
    build_constraints: Path | None = None,
) -> Environments | None:
    """The environments of a service: `ClusterEnvironments` for a backend that builds images
    (`Capabilities.images` and its `image_builds`) in a cluster with a registry; None (every
    run in the service's own environment or default image) else."""
    images = backend.capabilities.image_builds
    if not backend.capabilities.images or images is None:
        return None
    if not cluster.registry:
        log.warning(
            "the cluster has no registry (`cluster.registry`): every run runs in the default "
            "image, none in an image of its environment"
        )
        return None
    if simrun_wheel is None or not simrun_wheel.is_file():
        log.warning("%s: images of environments found in the registry only", NO_WHEEL)
    return ClusterEnvironments(
        store,
        images,
        cluster,
        python=python,
        simrun_wheel=simrun_wheel,
        build_constraints=build_constraints,
    )
