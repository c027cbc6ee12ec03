"""The fake Kubernetes API, driven by kubernetes-asyncio's real clients over real HTTP.

These pin the protocol the Argo backend will rely on: Status bodies of 404/409/410/422,
resourceVersions, watches resumed after a cut, 410 and relist, bookmarks, guarded node
patches, pod logs. They also pin what kubernetes-asyncio itself does with them (how its
`Watch` surfaces 410, which Content-Type its patch calls send), so a change of the client
shows here first.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from fake import MERGE_PATCH, FakeKubernetes, Store
from fake.schemas import reference_dir
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

NS = "simrun"
ARGO = ("argoproj.io", "v1alpha1")
TIMEOUT_S = 10


@pytest.fixture
def cluster() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        yield server


@asynccontextmanager
async def api_client(cluster: FakeKubernetes) -> AsyncIterator[client.ApiClient]:
    async with client.ApiClient(cluster.configuration()) as api:
        yield api


def run(coro: Any) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(TIMEOUT_S):
            return await coro

    return asyncio.run(bounded())


def recorded(name: str = "dag-diamond-succeeded-recorded-v2-podnames.yaml") -> tuple[dict, dict]:
    """A recorded Workflow of Argo's testdata as a client would submit it, and its status."""
    text = (reference_dir() / "argo-workflows" / "testdata" / name).read_text()
    workflow = yaml.safe_load(text)
    status = workflow.pop("status")
    meta = workflow["metadata"]
    for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "generateName"):
        meta.pop(key, None)
    meta.update(name="run-1", namespace=NS, labels={"simrun/run": "run-1"})
    return workflow, status


def status_body(error: ApiException) -> dict:
    body = json.loads(error.body)
    assert body["kind"] == "Status" and body["status"] == "Failure"
    assert body["code"] == error.status
    return body


async def create_workflow(api: client.ApiClient, workflow: dict) -> dict:
    objects = client.CustomObjectsApi(api)
    return await objects.create_namespaced_custom_object(*ARGO, NS, "workflows", workflow)


def list_workflows(objects: client.CustomObjectsApi, **kwargs: Any) -> Any:
    return objects.list_namespaced_custom_object(*ARGO, NS, "workflows", **kwargs)


def test_discovery_and_version(cluster: FakeKubernetes) -> None:
    async def scenario() -> None:
        async with api_client(cluster) as api:
            version = await client.VersionApi(api).get_code()
            assert version.major == "1" and version.git_version.startswith("v1.")
            groups = await client.ApisApi(api).get_api_versions()
            assert "argoproj.io" in {g.name for g in groups.groups}
            resources = await client.CustomObjectsApi(api).get_api_resources(*ARGO)
            assert "workflows" in {r.name for r in resources.resources}

    run(scenario())


def test_workflow_create_get_list_patch_delete(cluster: FakeKubernetes) -> None:
    workflow, _ = recorded()

    async def scenario() -> None:
        async with api_client(cluster) as api:
            objects = client.CustomObjectsApi(api)
            created = await create_workflow(api, workflow)
            meta = created["metadata"]
            assert meta["resourceVersion"] == "1" and meta["generation"] == 1
            assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
            got = await objects.get_namespaced_custom_object(*ARGO, NS, "workflows", "run-1")
            assert got == created

            listed = await list_workflows(objects, label_selector="simrun/run=run-1")
            assert [i["metadata"]["name"] for i in listed["items"]] == ["run-1"]
            assert listed["metadata"]["resourceVersion"] == "1"
            assert listed["items"][0]["kind"] == "Workflow"  # custom objects keep kind in lists
            other = await list_workflows(objects, label_selector="simrun/run=run-2")
            assert other["items"] == []

            # A dict body makes CustomObjectsApi send application/json-patch+json, which the
            # server refuses: merge patches need `_content_type` (the backend must pass it).
            with pytest.raises(ApiException) as default:
                await objects.patch_namespaced_custom_object(
                    *ARGO, NS, "workflows", "run-1", {"spec": {"shutdown": "Stop"}}
                )
            assert default.value.status == 400
            assert cluster.requests[-1].content_type == "application/json-patch+json"

            patched = await objects.patch_namespaced_custom_object(
                *ARGO,
                NS,
                "workflows",
                "run-1",
                {"spec": {"shutdown": "Stop"}},
                _content_type=MERGE_PATCH,
            )
            assert patched["spec"]["shutdown"] == "Stop"
            assert patched["spec"]["entrypoint"] == workflow["spec"]["entrypoint"]
            assert patched["metadata"]["generation"] == 2
            assert int(patched["metadata"]["resourceVersion"]) > 1
            again = await objects.patch_namespaced_custom_object(
                *ARGO,
                NS,
                "workflows",
                "run-1",
                {"spec": {"shutdown": "Stop"}},
                _content_type=MERGE_PATCH,
            )
            assert again["metadata"]["resourceVersion"] == patched["metadata"]["resourceVersion"]

            deleted = await objects.delete_namespaced_custom_object(*ARGO, NS, "workflows", "run-1")
            assert deleted["status"] == "Success" and deleted["details"]["uid"] == meta["uid"]
            with pytest.raises(ApiException) as missing:
                await objects.get_namespaced_custom_object(*ARGO, NS, "workflows", "run-1")
            body = status_body(missing.value)
            assert (body["reason"], body["code"]) == ("NotFound", 404)
            assert body["message"] == 'workflows.argoproj.io "run-1" not found'
            assert body["details"] == {"name": "run-1", "group": "argoproj.io", "kind": "workflows"}

    run(scenario())


def test_second_create_is_409_already_exists(cluster: FakeKubernetes) -> None:
    workflow, _ = recorded()

    async def scenario() -> None:
        async with api_client(cluster) as api:
            await create_workflow(api, workflow)
            with pytest.raises(ApiException) as exists:
                await create_workflow(api, workflow)
            body = status_body(exists.value)
            assert (body["reason"], body["code"]) == ("AlreadyExists", 409)
            assert body["message"] == 'workflows.argoproj.io "run-1" already exists'
        assert cluster.store.resource_version == 1

    run(scenario())


def test_watch_sees_added_then_modified_with_growing_resource_versions(
    cluster: FakeKubernetes,
) -> None:
    workflow, status = recorded()

    async def scenario() -> None:
        async with api_client(cluster) as api:
            objects = client.CustomObjectsApi(api)
            start = (await list_workflows(objects))["metadata"]["resourceVersion"]
            seen: list[tuple[str, int, str | None]] = []
            stream = watch.Watch().stream(
                objects.list_namespaced_custom_object,
                *ARGO,
                NS,
                "workflows",
                label_selector="simrun/run=run-1",
                resource_version=start,
                timeout_seconds=TIMEOUT_S,
            )
            await create_workflow(api, workflow)
            async for event in stream:
                obj = event["object"]
                seen.append(
                    (
                        event["type"],
                        int(obj["metadata"]["resourceVersion"]),
                        (obj.get("status") or {}).get("phase"),
                    )
                )
                if len(seen) == 1:
                    running = copy.deepcopy(status) | {"phase": "Running"}
                    cluster.store.update_status("workflows", "run-1", running, NS)
                    cluster.store.update_status("workflows", "run-1", status, NS)
                if len(seen) == 3:
                    break
            await stream.close()
        assert [(t, p) for t, _, p in seen] == [
            ("ADDED", None),
            ("MODIFIED", "Running"),
            ("MODIFIED", "Succeeded"),
        ]
        versions = [rv for _, rv, _ in seen]
        assert versions == sorted(versions) and len(set(versions)) == 3

    run(scenario())


def test_watch_resumes_after_a_clean_cut_without_losing_a_transition(
    cluster: FakeKubernetes,
) -> None:
    """Without timeout_seconds, the client's Watch reconnects from its last resourceVersion."""
    workflow, status = recorded()

    async def scenario() -> None:
        async with api_client(cluster) as api:
            objects = client.CustomObjectsApi(api)
            await create_workflow(api, workflow)
            phases: list[str | None] = []
            w = watch.Watch()
            async for event in w.stream(
                objects.list_namespaced_custom_object, *ARGO, NS, "workflows"
            ):
                phases.append((event["object"].get("status") or {}).get("phase"))
                if len(phases) == 1:
                    last = event["object"]["metadata"]["resourceVersion"]
                    assert cluster.cut_watches() == 1
                    for phase in ("Pending", "Running", "Succeeded"):  # written while disconnected
                        cluster.store.update_status(
                            "workflows", "run-1", status | {"phase": phase}, NS
                        )
                if len(phases) == 4:
                    w.stop()
                    break
            await w.close()
        assert phases == [None, "Pending", "Running", "Succeeded"]
        requests = cluster.watch_requests("workflows")
        assert len(requests) == 2
        assert "resourceVersion" not in requests[0].query  # the first watch lists what exists
        assert requests[1].query["resourceVersion"] == last

    run(scenario())


def test_abrupt_cut_raises_and_a_resume_from_the_last_version_loses_nothing(
    cluster: FakeKubernetes,
) -> None:
    """A dropped connection is no clean end: kubernetes-asyncio raises aiohttp's error."""
    workflow, status = recorded()

    async def scenario() -> None:
        async with api_client(cluster) as api:
            objects = client.CustomObjectsApi(api)
            await create_workflow(api, workflow)
            w = watch.Watch()
            with pytest.raises(aiohttp.ClientPayloadError):
                async for event in w.stream(
                    objects.list_namespaced_custom_object, *ARGO, NS, "workflows"
                ):
                    assert event["type"] == "ADDED"
                    cluster.cut_watches(abrupt=True)
                    cluster.store.update_status(
                        "workflows", "run-1", status | {"phase": "Running"}, NS
                    )
            last = w.resource_version
            assert last == "1"
            resumed = watch.Watch()
            async for event in resumed.stream(
                objects.list_namespaced_custom_object, *ARGO, NS, "workflows", resource_version=last
            ):
                assert (event["type"], event["object"]["status"]["phase"]) == (
                    "MODIFIED",
                    "Running",
                )
                break
            await resumed.close()

    run(scenario())


def test_a_watch_racing_a_writer_thread_and_a_cut_sees_every_write_once_in_order(
    cluster: FakeKubernetes,
) -> None:
    """Writes from another thread (as the emulators will make) while the client reconnects."""
    small = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "small", "namespace": NS},
        "spec": {
            "entrypoint": "main",
            "templates": [{"name": "main", "container": {"image": "x"}}],
        },
    }
    cluster.store.create("workflows", small, NS)
    writes = 300

    def writer() -> None:
        for i in range(1, writes + 1):
            cluster.store.update_status("workflows", "small", {"progress": f"{i}/{writes}"}, NS)
            if i == writes // 2:
                cluster.cut_watches()

    async def scenario() -> list[tuple[int, str]]:
        async with api_client(cluster) as api:
            objects = client.CustomObjectsApi(api)
            seen: list[tuple[int, str]] = []
            w = watch.Watch()
            thread = threading.Thread(target=writer)
            async for event in w.stream(
                objects.list_namespaced_custom_object, *ARGO, NS, "workflows"
            ):
                if event["type"] == "ADDED":
                    thread.start()
                    continue
                obj = event["object"]
                seen.append((int(obj["metadata"]["resourceVersion"]), obj["status"]["progress"]))
                if len(seen) == writes:
                    w.stop()
                    break
            await w.close()
            thread.join()
            return seen

    seen = run(scenario())
    assert [progress for _, progress in seen] == [f"{i}/{writes}" for i in range(1, writes + 1)]
    assert [rv for rv, _ in seen] == list(range(2, writes + 2))
    assert len(cluster.watch_requests("workflows")) == 2


def test_expired_resource_version_is_410_and_a_relist_recovers(cluster: FakeKubernetes) -> None:
    workflow, status = recorded()

    async def scenario() -> None:
        async with api_client(cluster) as api:
            objects = client.CustomObjectsApi(api)
            old = (await create_workflow(api, workflow))["metadata"]["resourceVersion"]
            cluster.store.update_status("workflows", "run-1", status | {"phase": "Running"}, NS)
            cluster.store.compact()

            # On the wire: HTTP 200 and one ERROR event whose object is a 410 Expired Status.
            raw = await list_workflows(
                objects, watch=True, resource_version=old, _preload_content=False
            )
            assert raw.status == 200
            line = json.loads(await raw.content.readline())
            raw.release()
            assert line["type"] == "ERROR"
            assert line["object"]["code"] == 410 and line["object"]["reason"] == "Expired"
            assert line["object"]["message"] == "too old resource version: 1 (2)"

            # kubernetes-asyncio turns it into ApiException(410): at once with timeout_seconds,
            for kwargs in ({"timeout_seconds": 5}, {}):
                before = len(cluster.watch_requests())
                w = watch.Watch()
                with pytest.raises(ApiException) as gone:
                    async for _ in w.stream(
                        objects.list_namespaced_custom_object,
                        *ARGO,
                        NS,
                        "workflows",
                        resource_version=old,
                        **kwargs,
                    ):
                        pass
                assert gone.value.status == 410
                assert gone.value.reason.startswith("Expired: too old resource version")
                # ... and after one retry with the same stale version when it watches forever.
                again = cluster.watch_requests()[before:]
                assert [r.query["resourceVersion"] for r in again] == [old] * (1 if kwargs else 2)

            relisted = await list_workflows(objects)
            assert relisted["items"][0]["status"]["phase"] == "Running"
            w = watch.Watch()
            stream = w.stream(
                objects.list_namespaced_custom_object,
                *ARGO,
                NS,
                "workflows",
                resource_version=relisted["metadata"]["resourceVersion"],
                timeout_seconds=5,
            )
            cluster.store.update_status("workflows", "run-1", status, NS)
            async for event in stream:
                assert (event["type"], event["object"]["status"]["phase"]) == (
                    "MODIFIED",
                    "Succeeded",
                )
                break
            await w.close()

    run(scenario())


def test_bookmarks_carry_only_the_resource_version(cluster: FakeKubernetes) -> None:
    workflow, _ = recorded()

    async def scenario() -> None:
        async with api_client(cluster) as api:
            objects = client.CustomObjectsApi(api)
            await create_workflow(api, workflow)
            w = watch.Watch()
            types = []
            async for event in w.stream(
                objects.list_namespaced_custom_object,
                *ARGO,
                NS,
                "workflows",
                allow_watch_bookmarks=True,
                timeout_seconds=5,
            ):
                types.append(event["type"])
                if event["type"] == "ADDED":
                    cluster.store.create("configmaps", {"metadata": {"name": "other"}}, NS)
                    assert cluster.store.bookmark("workflows") == 1
                else:
                    assert event["raw_object"] == {
                        "kind": "Workflow",
                        "apiVersion": "argoproj.io/v1alpha1",
                        "metadata": {"resourceVersion": "2"},  # the configmap's: one counter
                    }
                    assert w.resource_version == "2"
                    break
            await w.close()
        assert types == ["ADDED", "BOOKMARK"]

    run(scenario())


def test_bookmarks_arrive_on_their_own() -> None:
    async def scenario(cluster: FakeKubernetes) -> None:
        async with api_client(cluster) as api:
            core = client.CoreV1Api(api)
            w = watch.Watch()
            async for event in w.stream(
                core.list_namespaced_pod,
                NS,
                allow_watch_bookmarks=True,
                resource_version="0",
                timeout_seconds=5,
            ):
                assert event["type"] == "BOOKMARK"
                assert event["raw_object"]["metadata"] == {"resourceVersion": "0"}
                break
            await w.close()

    with FakeKubernetes(bookmark_interval_s=0.05) as cluster:
        run(scenario(cluster))


def test_a_watch_with_a_selector_sees_an_object_leave_it_as_deleted(
    cluster: FakeKubernetes,
) -> None:
    workflow, _ = recorded()

    async def scenario() -> None:
        async with api_client(cluster) as api:
            objects = client.CustomObjectsApi(api)
            await create_workflow(api, workflow)
            w = watch.Watch()
            seen = []
            async for event in w.stream(
                objects.list_namespaced_custom_object,
                *ARGO,
                NS,
                "workflows",
                label_selector="simrun/run",
                timeout_seconds=5,
            ):
                seen.append((event["type"], event["object"]["metadata"]["resourceVersion"]))
                if len(seen) == 1:
                    await objects.patch_namespaced_custom_object(
                        *ARGO,
                        NS,
                        "workflows",
                        "run-1",
                        {"metadata": {"labels": {"simrun/run": None}}},
                        _content_type=MERGE_PATCH,
                    )
                else:
                    break
            await w.close()
        assert seen == [("ADDED", "1"), ("DELETED", "2")]

    run(scenario())


def worker_node(name: str) -> dict:
    return {
        "metadata": {"name": name, "labels": {"simrun/worker": "true"}},
        "spec": {"taints": [{"key": "other", "value": "x", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"cpu": "8", "memory": "32Gi"},
            "capacity": {"cpu": "8", "memory": "32Gi"},
        },
    }


def test_node_patch_with_a_stale_resource_version_is_409(cluster: FakeKubernetes) -> None:
    cluster.store.create("nodes", worker_node("n1"))

    async def scenario() -> None:
        async with api_client(cluster) as api:
            core = client.CoreV1Api(api)
            node = await core.read_node("n1")
            stale = node.metadata.resource_version
            reservation = {"key": "simrun/reserved", "value": "run-1", "effect": "NoExecute"}
            patched = await core.patch_node(
                "n1",
                {
                    "metadata": {"resourceVersion": stale, "labels": {"simrun/reserved": "run-1"}},
                    "spec": {"taints": [*[t.to_dict() for t in node.spec.taints], reservation]},
                },
            )
            # CoreV1Api sends a dict as a strategic merge patch; taints have no merge key
            assert cluster.requests[-1].content_type == "application/strategic-merge-patch+json"
            assert [t.key for t in patched.spec.taints] == ["other", "simrun/reserved"]
            assert patched.metadata.labels == {"simrun/worker": "true", "simrun/reserved": "run-1"}
            assert patched.status.allocatable == {"cpu": "8", "memory": "32Gi"}
            assert int(patched.metadata.resource_version) > int(stale)

            with pytest.raises(ApiException) as refused:
                await core.patch_node(
                    "n1",
                    {"metadata": {"resourceVersion": stale}, "spec": {"taints": [reservation]}},
                )
            body = status_body(refused.value)
            assert (body["reason"], body["code"]) == ("Conflict", 409)
            assert body["message"].startswith(
                'Operation cannot be fulfilled on nodes "n1": the object has been modified'
            )

            # The JSON patch form of the same guard: a failed `test` is a 422.
            with pytest.raises(ApiException) as failed:
                await core.patch_node(
                    "n1",
                    [
                        {"op": "test", "path": "/metadata/resourceVersion", "value": stale},
                        {"op": "replace", "path": "/spec/taints", "value": []},
                    ],
                )
            assert failed.value.status == 422
            node = await core.read_node("n1")
            assert len(node.spec.taints) == 2
            assert node.metadata.resource_version == patched.metadata.resource_version

    run(scenario())


def pod(name: str, containers: tuple[str, ...] = ("main",), labels: dict | None = None) -> dict:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "containers": [
                {
                    "name": c,
                    "image": "python:3.11",
                    "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
                }
                for c in containers
            ],
            "restartPolicy": "Never",
        },
    }


def bind(cluster: FakeKubernetes, name: str, node: str) -> None:
    """What the scheduler would do (the kubelet to come will own this)."""

    def assign(obj: dict) -> None:
        obj["spec"]["nodeName"] = node

    cluster.store.update("pods", name, assign, NS)


def test_pods_by_label_and_node_and_their_watch(cluster: FakeKubernetes) -> None:
    async def scenario() -> None:
        async with api_client(cluster) as api:
            core = client.CoreV1Api(api)
            created = await core.create_namespaced_pod(NS, pod("a", labels={"simrun/run": "run-1"}))
            assert created.status.phase == "Pending" and created.status.qos_class == "Guaranteed"
            await core.create_namespaced_pod(NS, pod("b", labels={"simrun/run": "run-2"}))
            w = watch.Watch()
            stream = w.stream(
                core.list_namespaced_pod,
                NS,
                field_selector="spec.nodeName=n1",
                resource_version=str(cluster.store.resource_version),
                timeout_seconds=5,
            )
            bind(cluster, "a", "n1")
            async for event in stream:
                assert event["type"] == "ADDED"  # it entered the selector
                assert isinstance(event["object"], client.V1Pod)
                assert event["object"].spec.node_name == "n1"
                break
            await w.close()

            on_node = await core.list_namespaced_pod(NS, field_selector="spec.nodeName=n1")
            assert [p.metadata.name for p in on_node.items] == ["a"]
            by_run = await core.list_namespaced_pod(
                NS, label_selector="simrun/run in (run-2, run-3)"
            )
            assert [p.metadata.name for p in by_run.items] == ["b"]
            assert (
                await core.list_namespaced_pod(
                    NS, label_selector="simrun/run!=run-1,simrun/run!=run-2"
                )
                is not None
            )

            deleted = await core.delete_namespaced_pod("a", NS)
            assert deleted.metadata.name == "a"  # pods answer DELETE with the object
            with pytest.raises(ApiException) as missing:
                await core.read_namespaced_pod("a", NS)
            assert status_body(missing.value)["message"] == 'pods "a" not found'

            with pytest.raises(ApiException) as unsupported:
                await list_workflows(
                    client.CustomObjectsApi(api), field_selector="spec.shutdown=Stop"
                )
            assert (
                status_body(unsupported.value)["message"]
                == "field label not supported: spec.shutdown"
            )

    run(scenario())


def test_pod_logs_tail_limit_and_container(cluster: FakeKubernetes) -> None:
    async def scenario() -> None:
        async with api_client(cluster) as api:
            core = client.CoreV1Api(api)
            await core.create_namespaced_pod(NS, pod("p", containers=("wait", "main")))
            assert (
                await core.read_namespaced_pod_log("p", NS, container="main") == ""
            )  # not scheduled
            bind(cluster, "p", "n1")
            with pytest.raises(ApiException) as waiting:
                await core.read_namespaced_pod_log("p", NS, container="main")
            assert status_body(waiting.value)["message"] == (
                'container "main" in pod "p" is waiting to start: ContainerCreating'
            )
            cluster.store.append_log(NS, "p", "main", "one\ntwo\nthree\n")
            assert (
                await core.read_namespaced_pod_log("p", NS, container="main", tail_lines=2)
                == "two\nthree\n"
            )
            assert (
                await core.read_namespaced_pod_log(
                    "p", NS, container="main", tail_lines=2, limit_bytes=5
                )
                == "two\nt"
            )
            with pytest.raises(ApiException) as ambiguous:
                await core.read_namespaced_pod_log("p", NS)
            assert status_body(ambiguous.value)["message"] == (
                "a container name must be specified for pod p, choose one of: [wait main]"
            )
            with pytest.raises(ApiException) as unknown:
                await core.read_namespaced_pod_log("p", NS, container="nope")
            assert unknown.value.status == 400

            # The client json-decodes a log that parses as JSON: read raw text instead.
            cluster.store.append_log(NS, "p", "wait", '{"units": 3}')
            assert await core.read_namespaced_pod_log("p", NS, container="wait") == "{'units': 3}"
            raw = await core.read_namespaced_pod_log(
                "p", NS, container="wait", _preload_content=False
            )
            assert (await raw.read()).decode() == '{"units": 3}'

    run(scenario())


def test_jobs_configmaps_and_the_propagation_of_deletes(cluster: FakeKubernetes) -> None:
    def job(name: str) -> dict:
        template = pod("x")
        template["spec"]["containers"][0]["command"] = ["buildctl", "build"]
        return {"metadata": {"name": name}, "spec": {"template": template, "backoffLimit": 0}}

    async def scenario() -> None:
        async with api_client(cluster) as api:
            batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
            for name, propagation, survives in (
                ("orphaning", None, True),
                ("cascading", "Background", False),
            ):
                created = await batch.create_namespaced_job(NS, job(name))
                assert created.status is None or created.status.active is None
                owner = {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": created.metadata.uid,
                }
                context = {
                    "metadata": {"name": f"{name}-context", "ownerReferences": [owner]},
                    "data": {"Dockerfile": "FROM x\n"},
                }
                await core.create_namespaced_config_map(NS, context)
                assert (await batch.read_namespaced_job(name, NS)).spec.backoff_limit == 0
                kwargs = {"propagation_policy": propagation} if propagation else {}
                await batch.delete_namespaced_job(name, NS, **kwargs)
                with pytest.raises(ApiException):
                    await batch.read_namespaced_job(name, NS)
                if survives:  # batch/v1 Jobs orphan their dependents by default
                    left = await core.read_namespaced_config_map(f"{name}-context", NS)
                    assert left.metadata.owner_references is None
                else:
                    with pytest.raises(ApiException) as gone:
                        await core.read_namespaced_config_map(f"{name}-context", NS)
                    assert gone.value.status == 404

            big = {"metadata": {"name": "big"}, "data": {"blob": "x" * (1024 * 1024)}}
            with pytest.raises(ApiException) as too_big:
                await core.create_namespaced_config_map(NS, big)
            body = status_body(too_big.value)
            assert body["reason"] == "Invalid"
            assert (
                body["message"]
                == 'ConfigMap "big" is invalid: []: Too long: must have at most 1048576 bytes'
            )
            await core.delete_namespaced_config_map("orphaning-context", NS)

    run(scenario())


def test_invalid_workflows_are_refused_naming_the_field(cluster: FakeKubernetes) -> None:
    workflow, _ = recorded()

    def broken(change: Any) -> dict:
        copied = copy.deepcopy(workflow)
        change(copied)
        return copied

    async def refused(api: client.ApiClient, body: dict) -> dict:
        with pytest.raises(ApiException) as error:
            await create_workflow(api, body)
        return status_body(error.value)

    async def scenario() -> None:
        async with api_client(cluster) as api:
            body = await refused(
                api, broken(lambda w: w["spec"]["templates"][1]["container"].pop("image"))
            )
            assert (body["code"], body["reason"]) == (422, "Invalid")
            assert body["message"] == (
                'Workflow.argoproj.io "run-1" is invalid: '
                "spec.templates[1].container.image: Required value"
            )
            assert body["details"]["causes"] == [
                {
                    "reason": "FieldValueRequired",
                    "message": "Required value",
                    "field": "spec.templates[1].container.image",
                }
            ]
            body = await refused(api, broken(lambda w: w["spec"].update(templates={"a": 1})))
            assert body["details"]["causes"][0]["field"] == "spec.templates"
            body = await refused(
                api, broken(lambda w: w["metadata"]["labels"].update({"simrun/group": "a b"}))
            )
            assert body["details"]["causes"][0]["field"] == "metadata.labels"
            body = await refused(api, broken(lambda w: w["spec"].update(entrypointt="x")))
            assert (body["code"], body["message"]) == (
                400,
                'strict decoding error: unknown field "spec.entrypointt"',
            )
            # integers where Argo's schema says IntOrString/Quantity pass, as on a real server
            fine = broken(lambda w: w["spec"]["templates"][1].update(retryStrategy={"limit": 100}))
            assert (await create_workflow(api, fine))["spec"]["templates"][1]["retryStrategy"][
                "limit"
            ] == 100
        assert cluster.store.resource_version == 1  # nothing refused was stored

    run(scenario())


def test_kueue_objects_are_validated_and_defaulted(cluster: FakeKubernetes) -> None:
    group = ("kueue.x-k8s.io", "v1beta2")
    queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "simrun"},
        "spec": {
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [
                        {
                            "name": "worker",
                            "resources": [
                                {"name": "cpu", "nominalQuota": 24},
                                {"name": "memory", "nominalQuota": "96Gi"},
                            ],
                        }
                    ],
                }
            ],
            "preemption": {"withinClusterQueue": "LowerPriority"},
        },
    }

    async def scenario() -> None:
        async with api_client(cluster) as api:
            objects = client.CustomObjectsApi(api)
            bad = copy.deepcopy(queue)
            bad["spec"]["preemption"]["withinClusterQueue"] = "Sometimes"
            with pytest.raises(ApiException) as refused:
                await objects.create_cluster_custom_object(*group, "clusterqueues", bad)
            cause = status_body(refused.value)["details"]["causes"][0]
            assert cause["field"] == "spec.preemption.withinClusterQueue"
            assert cause["reason"] == "FieldValueNotSupported"
            created = await objects.create_cluster_custom_object(*group, "clusterqueues", queue)
            assert created["spec"]["queueingStrategy"] == "BestEffortFIFO"  # the CRD's default
            assert created["spec"]["preemption"]["reclaimWithinCohort"] == "Never"
            assert "namespace" not in created["metadata"]

    run(scenario())


def test_one_resource_version_across_kinds_and_finalizers(cluster: FakeKubernetes) -> None:
    store = cluster.store
    versions = [
        store.create("nodes", worker_node("n1"))["metadata"]["resourceVersion"],
        store.create("pods", pod("a"), NS)["metadata"]["resourceVersion"],
        store.create("configmaps", {"metadata": {"name": "c", "finalizers": ["simrun/keep"]}}, NS)[
            "metadata"
        ]["resourceVersion"],
    ]
    assert versions == ["1", "2", "3"]
    watcher = store.watch("configmaps", NS, "3")
    marked, gone = store.delete("configmaps", "c", NS)
    assert not gone and marked["metadata"]["deletionTimestamp"]
    store.patch("configmaps", "c", {"metadata": {"finalizers": None}}, MERGE_PATCH, NS)
    kinds = [watcher.get_blocking(1)[0], watcher.get_blocking(1)[0]]
    assert kinds == ["MODIFIED", "DELETED"]
    watcher.close()
    assert store.resource_version == 5


def test_a_kubeconfig_for_another_process(cluster: FakeKubernetes, tmp_path: Path) -> None:
    path = cluster.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS)
    workflow, _ = recorded()
    cluster.store.create("workflows", workflow, NS)

    async def scenario() -> None:
        configuration = client.Configuration()
        await config.load_kube_config(config_file=str(path), client_configuration=configuration)
        async with client.ApiClient(configuration) as api:
            listed = await list_workflows(client.CustomObjectsApi(api))
            assert [i["metadata"]["name"] for i in listed["items"]] == ["run-1"]

    run(scenario())


def test_graceful_pod_deletion_waits_for_the_kubelet() -> None:
    """With `graceful_pods` a running pod is only marked; the kubelet ends it with grace 0."""
    with FakeKubernetes(Store(graceful_pods=True)) as cluster:
        store = cluster.store
        store.create("pods", pod("a"), NS)
        bind(cluster, "a", "n1")

        async def scenario() -> None:
            async with api_client(cluster) as api:
                marked = await client.CoreV1Api(api).delete_namespaced_pod("a", NS)
                assert marked.metadata.deletion_timestamp is not None
                assert marked.metadata.deletion_grace_period_seconds == 30

        run(scenario())
        assert store.get("pods", "a", NS)["metadata"]["deletionTimestamp"]
        _, gone = store.delete("pods", "a", NS, grace_period=0)
        assert gone
        assert store.list("pods", NS)[0] == []
