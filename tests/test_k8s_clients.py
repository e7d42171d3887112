"""The official Kubernetes Python clients against a running coordinator, as a notebook user drives them.

`kubernetes` (CustomObjectsApi, watch.Watch) and `kubernetes-asyncio` each run every verb a user
needs on Jobs: create, get, list with a label selector, merge patch, watch from a resourceVersion and
delete. Both load the coordinator's own kubeconfig (its CA and token), as `kubectl` does. The clients
send create bodies without a Content-Type header, which the gateway must read as JSON.
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conftest import Coordinator, job

GROUP, VERSION, PLURAL = "nodus.dev", "v1", "jobs"


def _labelled(name: str, team: str) -> dict[str, Any]:
    body = job(name)
    body["metadata"]["labels"] = {"team": team}
    return body


def test_the_official_python_client_drives_every_verb(shared_coordinator: Coordinator) -> None:
    from kubernetes import client, config, watch
    from kubernetes.client.rest import ApiException

    api = client.CustomObjectsApi(config.new_client_from_config(config_file=str(shared_coordinator.kubeconfig)))
    ns = "default"
    created = api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _labelled("sync-a", "vision"))
    api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _labelled("sync-b", "speech"))
    assert created["metadata"]["uid"] and created["spec"]["command"] == ["python3", "-c", "print('hi')"]

    got = api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "sync-a")
    assert got["metadata"]["uid"] == created["metadata"]["uid"]

    listed = api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, label_selector="team=vision")
    names = {item["metadata"]["name"] for item in listed["items"]}
    assert "sync-a" in names and "sync-b" not in names
    start = listed["metadata"]["resourceVersion"]

    patched = api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "sync-a",
                                                 {"metadata": {"labels": {"stage": "eval"}}})
    assert patched["metadata"]["labels"] == {"team": "vision", "stage": "eval"}

    api.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "sync-a")
    with pytest.raises(ApiException) as gone:
        api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "sync-a")
    assert gone.value.status == 404

    # The watch from the list's resourceVersion replays what happened since, in order, for the selector.
    seen: list[tuple[str, str]] = []
    w = watch.Watch()
    for event in w.stream(api.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL, label_selector="team=vision",
                          resource_version=start, timeout_seconds=30):
        obj = event["object"]
        seen.append((event["type"], obj["metadata"]["name"]))
        if event["type"] == "DELETED":
            w.stop()
    assert seen[0] == ("MODIFIED", "sync-a") and seen[-1] == ("DELETED", "sync-a")
    assert all(name == "sync-a" for _, name in seen)


def test_kubernetes_asyncio_drives_every_verb(shared_coordinator: Coordinator) -> None:
    async def drive() -> None:
        from kubernetes_asyncio import client, config, watch
        from kubernetes_asyncio.client.exceptions import ApiException

        api_client = await config.new_client_from_config(config_file=str(shared_coordinator.kubeconfig))
        async with api_client:
            api = client.CustomObjectsApi(api_client)
            ns = "default"
            created = await api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _labelled("async-a", "nlp"))
            await api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _labelled("async-b", "rl"))
            got = await api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "async-a")
            assert got["metadata"]["uid"] == created["metadata"]["uid"]

            listed = await api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, label_selector="team=nlp")
            assert [i["metadata"]["name"] for i in listed["items"]] == ["async-a"]
            start = listed["metadata"]["resourceVersion"]

            # kubernetes-asyncio sends a JSON patch unless told otherwise, as against a real API server.
            patched = await api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "async-a",
                                                               {"metadata": {"labels": {"stage": "train"}}},
                                                               _content_type="application/merge-patch+json")
            assert patched["metadata"]["labels"] == {"team": "nlp", "stage": "train"}
            await api.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "async-a")
            with pytest.raises(ApiException) as gone:
                await api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "async-a")
            assert gone.value.status == 404

            seen: list[tuple[str, str]] = []
            async with watch.Watch() as w:
                async for event in w.stream(api.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL,
                                            label_selector="team=nlp", resource_version=start, timeout_seconds=30):
                    seen.append((event["type"], event["object"]["metadata"]["name"]))
                    if event["type"] == "DELETED":
                        w.stop()
            assert seen[0] == ("MODIFIED", "async-a") and seen[-1] == ("DELETED", "async-a")

    asyncio.run(drive())


def test_query_booleans_read_as_the_api_server_reads_them(shared_coordinator: Coordinator) -> None:
    s = shared_coordinator.session()
    url = shared_coordinator.url(f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}")
    assert s.get(url, params={"watch": "False"}, timeout=10).json()["kind"] == "JobList"
    refused = s.get(url, params={"watch": "yes"}, timeout=10)
    assert refused.status_code == 400
    assert "watch='yes'" in refused.json()["message"] and "?watch=true" in refused.json()["fix"]
