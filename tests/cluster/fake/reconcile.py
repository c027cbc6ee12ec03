"""What the emulated controllers (Argo, Kueue, the kubelet) share: their loop and pod arithmetic.

A `Reconciler` is level-triggered as a Kubernetes controller is: it watches some kinds of the
`Store` and, after every batch of changes (and every `resync_s` besides), runs `reconcile()`
over the whole present state, so a missed or repeated event changes nothing. All reconcilers of
a `FakeCluster` run as tasks of one asyncio loop in one thread, so one reconcile never
interleaves with another; they write only through the store's locked calls. An exception in a
reconcile is logged and kept in `errors` (a test asserts there are none) and the loop goes on.

The helpers read pods and nodes as the scheduler and Kueue count them: requests per container
(limits where requests are absent, init containers as their largest one), quantities as
`Decimal`, node selectors, taints and tolerations.

Not done: informers' caches (every reconcile lists the store, which is small in tests), work
queues with rate limits, leader election.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from .schemas import parse_quantity
from .store import CLOSED, CUT_ABRUPT, CUT_CLEAN, Store

JSON = dict[str, Any]
TERMINAL = ("Succeeded", "Failed")

log = logging.getLogger(__name__)


class Reconciler:
    """Runs `reconcile()` after changes of the kinds in `plurals`, and every `resync_s`."""

    name = "reconciler"
    plurals: tuple[str, ...] = ()

    def __init__(self, store: Store, *, resync_s: float = 0.5) -> None:
        self.store = store
        self.resync_s = resync_s
        self.errors: list[str] = []
        self._wake: asyncio.Event | None = None

    def poke(self) -> None:
        """Ask for a reconcile soon (from the loop's own thread)."""
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        """Reconcile until cancelled."""
        self._wake = asyncio.Event()
        watchers = [self.store.watch(plural) for plural in self.plurals]
        pumps = [asyncio.create_task(self._pump_watch(watcher)) for watcher in watchers]
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.resync_s):
                        await self._wake.wait()
                self._wake.clear()
                try:
                    await self.reconcile()
                except asyncio.CancelledError:
                    raise
                except Exception:  # kept for the test, the loop goes on
                    text = traceback.format_exc()
                    log.error("%s: reconcile failed\n%s", self.name, text)
                    self.errors.append(text)
        finally:
            for pump in pumps:
                pump.cancel()
            for watcher in watchers:
                watcher.close()
            await asyncio.gather(*pumps, return_exceptions=True)
            await self.close()

    async def _pump_watch(self, watcher: Any) -> None:
        assert self._wake is not None
        while True:
            item = await watcher.get()
            if item in (CLOSED, CUT_CLEAN, CUT_ABRUPT):
                return
            self._wake.set()

    def refuse(self, message: str) -> None:
        """Keep a refusal of the emulator (an input it does not emulate) for the test to see."""
        if message not in self.errors:  # once: a reconcile repeats what it refuses
            log.error("%s: %s", self.name, message)
            self.errors.append(message)

    async def reconcile(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        """Release what the reconciler holds (processes, timers) once its loop ends."""


# --- quantities and requests ---------------------------------------------------------------


def quantity(value: Any) -> Decimal:
    """A Kubernetes quantity as a number (`500m` is 0.5, `1Gi` is 1073741824)."""
    return parse_quantity(value)


def container_requests(container: Mapping[str, Any]) -> dict[str, Decimal]:
    """What a container requests: its requests, else its limits (the API server's default)."""
    resources = container.get("resources") or {}
    amounts = {k: quantity(v) for k, v in (resources.get("limits") or {}).items()}
    amounts.update({k: quantity(v) for k, v in (resources.get("requests") or {}).items()})
    return amounts


def add(total: dict[str, Decimal], amounts: Mapping[str, Decimal], sign: int = 1) -> None:
    for name, amount in amounts.items():
        total[name] = total.get(name, Decimal(0)) + sign * amount


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """What a pod requests as the scheduler and Kueue count it: its containers together, or an
    init container alone where it requests more, plus the pod's overhead."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        add(total, container_requests(container))
    for container in spec.get("initContainers") or []:
        for name, amount in container_requests(container).items():
            total[name] = max(total.get(name, Decimal(0)), amount)
    add(total, {k: quantity(v) for k, v in (spec.get("overhead") or {}).items()})
    return total


def fits(demand: Mapping[str, Decimal], free: Mapping[str, Decimal]) -> bool:
    """Whether every amount demanded (above zero) is free."""
    return all(
        amount <= 0 or free.get(name, Decimal(0)) >= amount for name, amount in demand.items()
    )


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL


def node_allocatable(node: Mapping[str, Any]) -> dict[str, Decimal]:
    status = node.get("status") or {}
    amounts = status.get("allocatable") or status.get("capacity") or {}
    return {name: quantity(value) for name, value in amounts.items()}


def node_free(node: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> dict[str, Decimal]:
    """The allocatable resources of a node less the requests of the live pods bound to it."""
    free = node_allocatable(node)
    name = node["metadata"]["name"]
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName") == name and not is_terminal(pod):
            add(free, pod_requests(pod), -1)
    return free


# --- selectors, taints, tolerations --------------------------------------------------------


def selector_matches(selector: Mapping[str, str] | None, labels: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in (selector or {}).items())


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Whether a toleration of the list tolerates the taint (as `ToleratesTaint`)."""
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key") or ""
        operator = toleration.get("operator") or "Equal"
        if key and key != taint.get("key"):
            continue
        if not key and operator != "Exists":
            continue
        if operator == "Exists" or (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def untolerated(
    pod: Mapping[str, Any], node: Mapping[str, Any], effects: tuple[str, ...]
) -> list[JSON]:
    """The taints of the node with one of `effects` that the pod does not tolerate."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    return [
        taint
        for taint in (node.get("spec") or {}).get("taints") or []
        if taint.get("effect") in effects and not tolerates(tolerations, taint)
    ]


def schedulable_on(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether the scheduler would put the pod on the node, resources apart: the node is not
    cordoned, matches the pod's node selector and carries no taint the pod does not tolerate."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    labels = (node.get("metadata") or {}).get("labels") or {}
    if not selector_matches((pod.get("spec") or {}).get("nodeSelector"), labels):
        return False
    return not untolerated(pod, node, ("NoSchedule", "NoExecute"))
