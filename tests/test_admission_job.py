"""Job admission: every rule of spec/job.md, table-driven, plus folding, defaults, field validation and updates."""
from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from nodus.coordinator.resources import merge_patch as merged  # the API's own RFC 7386
from nodus.coordinator.api import admission
from nodus.coordinator.api.kinds import resolve
from nodus.coordinator.errors import NodusError

JOB = resolve("jobs")
OPEN = {"egress": {"policy": "Open"}}
"""An image gang's pods share the node's network, so its egress must be Open (docs/adr/0033)."""
BASE: dict[str, Any] = {
    "apiVersion": "nodus.dev/v1",
    "kind": "Job",
    "metadata": {"name": "train", "labels": {"team": "ml"}},
    "spec": {"image": "ghcr.io/acme/train:1", "command": ["python", "train.py"]},
}
SECRET_HF = {
    "apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "hf", "namespace": "p"}, "type": "Opaque",
    "status": {"version": 2, "versionID": "sv-hf-2", "keys": ["HF_TOKEN", "EXTRA"], "versions": [
        {"version": 1, "versionID": "sv-hf-1", "keys": ["HF_TOKEN"], "createTime": "2025-01-01T00:00:00Z"},
        {"version": 2, "versionID": "sv-hf-2", "keys": ["HF_TOKEN", "EXTRA"], "createTime": "2025-01-02T00:00:00Z"},
    ]},
}


class Store:
    """An in-memory Lookup."""

    def __init__(self, *objects: tuple[str, str, dict[str, Any]]) -> None:
        self.objects = {(plural, project, obj["metadata"]["name"]): obj for plural, project, obj in objects}

    async def get(self, plural: str, project: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((plural, project, name)))




def create(obj: dict[str, Any], store: Store | None = None, **kw: Any) -> admission.Admitted:
    return asyncio.run(admission.admit_create(JOB, obj, store or Store(("secrets", "p", SECRET_HF)), project="p", **kw))


def update(old: dict[str, Any], new: dict[str, Any], **kw: Any) -> admission.Admitted:
    return asyncio.run(admission.admit_update(JOB, old, new, Store(), project="p", **kw))


def causes_of(obj: dict[str, Any], **kw: Any) -> list[tuple[str, str]]:
    with pytest.raises(NodusError) as info:
        create(obj, **kw)
    assert info.value.reason == "Invalid" and info.value.code.http == 422
    return [(c.field, c.message) for c in info.value.causes]


def spec(**fields: Any) -> dict[str, Any]:
    return {"spec": fields}


def assert_causes(found: list[tuple[str, str]], expected: list[tuple[str, str]]) -> None:
    for field, fragment in expected:
        assert any(f == field and fragment in m for f, m in found), f"{field}: …{fragment}… not in {found}"


SIX = [{"name": f"o{i}", "path": f"/o/{i}"} for i in range(33)]

CASES: list[tuple[str, dict[str, Any], list[tuple[str, str]]]] = [
    # envelope and metadata
    ("api-version-missing", {"apiVersion": None}, [("apiVersion", "Required value")]),
    ("api-version-wrong", {"apiVersion": "batch/v1"}, [("apiVersion", 'must be "nodus.dev/v1"')]),
    ("kind-missing", {"kind": None}, [("kind", "Required value")]),
    ("kind-wrong", {"kind": "Sweep"}, [("kind", 'Invalid value: "Sweep": must be "Job"')]),
    ("name-missing", {"metadata": {"name": None}}, [("metadata.name", "Required value")]),
    ("name-bad", {"metadata": {"name": "Train_1"}}, [("metadata.name", "RFC 1123 label")]),
    ("name-long", {"metadata": {"name": "a" * 64}}, [("metadata.name", "no more than 63")]),
    ("generate-name-bad", {"metadata": {"name": None, "generateName": "Bad_"}}, [("metadata.generateName", "prefix")]),
    ("label-key-bad", {"metadata": {"labels": {"bad key": "x"}}}, [("metadata.labels", 'Invalid value: "bad key"')]),
    ("label-prefix-bad", {"metadata": {"labels": {"Acme.com/x": "y"}}}, [("metadata.labels", "prefix part")]),
    ("label-value-bad", {"metadata": {"labels": {"team": "-ml"}}}, [("metadata.labels", "a valid label")]),
    ("label-value-long", {"metadata": {"labels": {"team": "x" * 64}}}, [("metadata.labels", "no more than 63")]),
    ("label-value-type", {"metadata": {"labels": {"team": 5}}}, [("metadata.labels[team]", "must be of type string")]),
    ("annotation-key-bad", {"metadata": {"annotations": {"a/b/c": "x"}}}, [("metadata.annotations", "at most one '/'")]),
    ("metadata-unknown", {"metadata": {"nmae": "x"}}, [("metadata.nmae", "Unknown field")]),
    ("namespace-other", {"metadata": {"namespace": "q"}}, [("metadata.namespace", "does not match the project")]),
    ("finalizer-bad", {"metadata": {"finalizers": ["bad finalizer"]}}, [("metadata.finalizers[0]", "name part")]),
    ("owner-ref-incomplete", {"metadata": {"ownerReferences": [{"kind": "Sweep"}]}},
     [("metadata.ownerReferences[0].uid", "Required value")]),
    ("spec-missing", {"spec": None}, [("spec", "Required value")]),
    ("spec-type", {"spec": "x"}, [("spec", "must be of type object")]),
    ("top-level-unknown", {"specs": {}}, [("specs", "Unknown field")]),
    # counts
    ("completions-zero", spec(completions=0), [("spec.completions", "Invalid value: 0: must be between 1 and 10000")]),
    ("completions-high", spec(completions=10001), [("spec.completions", "must be between 1 and 10000")]),
    ("completions-type", spec(completions="3"), [("spec.completions", 'Invalid value: "3": must be of type integer')]),
    ("completions-bool", spec(completions=True), [("spec.completions", "must be of type integer")]),
    ("completions-fraction", spec(completions=1.5), [("spec.completions", "must be of type integer")]),
    ("parallelism-zero", spec(parallelism=0), [("spec.parallelism", "must be between 1 and 256")]),
    ("parallelism-high", spec(completions=1000, parallelism=300), [("spec.parallelism", "must be between 1 and 256")]),
    ("parallelism-above-completions", spec(completions=2, parallelism=3),
     [("spec.parallelism", "min(completions, 256) = 2")]),
    ("backoff-negative", spec(backoffLimit=-1), [("spec.backoffLimit", "must be between 0 and 100")]),
    ("backoff-high", spec(backoffLimit=101), [("spec.backoffLimit", "must be between 0 and 100")]),
    ("ttl-negative", spec(ttlSecondsAfterFinished=-1), [("spec.ttlSecondsAfterFinished", "greater than or equal to 0")]),
    # what runs
    ("no-command-no-image", spec(image=None, command=None), [("spec.command", "a Job needs a command or an image")]),
    ("empty-image", spec(image=""), [("spec.image", "Required value")]),
    ("command-type", spec(command="python train.py"), [("spec.command", "must be of type array")]),
    ("command-item-type", spec(command=["python", 3]), [("spec.command[1]", "must be of type string")]),
    ("working-dir-relative", spec(workingDir="src"), [("spec.workingDir", "absolute path")]),
    ("state-bad", spec(state="Stopped"),
     [("spec.state", 'Unsupported value: "Stopped": supported values: "Running", "Suspended", "Cancelled"')]),
    # env
    ("env-name-bad", spec(env=[{"name": "1X", "value": "a"}]), [("spec.env[0].name", "must match the regex")]),
    ("env-name-missing", spec(env=[{"value": "a"}]), [("spec.env[0].name", "Required value")]),
    ("env-both", spec(env=[{"name": "X", "value": "a", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}}]),
     [("spec.env[0]", "Forbidden: exactly one of value or valueFrom")]),
    ("env-neither", spec(env=[{"name": "X"}]), [("spec.env[0]", "Required value: exactly one of value or valueFrom")]),
    ("env-duplicate", spec(env=[{"name": "X", "value": "a"}, {"name": "X", "value": "b"}]),
     [("spec.env[1].name", 'Duplicate value: "X"')]),
    ("env-unknown-field", spec(env=[{"name": "X", "value": "a"}, {"name": "Y", "value": "b"}, {"nmae": "Z"}]),
     [("spec.env[2].nmae", "Unknown field")]),
    ("env-secret-key-missing", spec(env=[{"name": "X", "valueFrom": {"secretKeyRef": {"name": "hf"}}}]),
     [("spec.env[0].valueFrom.secretKeyRef.key", "Required value")]),
    ("env-value-from-empty", spec(env=[{"name": "X", "valueFrom": {}}]),
     [("spec.env[0].valueFrom.secretKeyRef", "Required value")]),
    # inputs
    ("input-name-bad", spec(inputs=[{"name": "1data", "volume": {"name": "v"}}]),
     [("spec.inputs[0].name", "must match the regex")]),
    ("input-name-long", spec(inputs=[{"name": "a" * 65, "volume": {"name": "v"}}]),
     [("spec.inputs[0].name", "must match the regex")]),
    ("input-duplicate", spec(inputs=[{"name": "a", "volume": {"name": "v"}}, {"name": "a", "volume": {"name": "w"}}]),
     [("spec.inputs[1].name", "Duplicate value")]),
    ("input-no-source", spec(inputs=[{"name": "a"}]),
     [("spec.inputs[0]", "exactly one of volume, output, bucket, url, fromWorkspace or fromStage")]),
    ("input-two-sources", spec(inputs=[{"name": "a", "volume": {"name": "v"}, "url": {"url": "https://x.dev/f"}}]),
     [("spec.inputs[0]", "Forbidden: exactly one of")]),
    ("input-url-http", spec(inputs=[{"name": "a"}, {"name": "b", "url": {"url": "http://x.dev/f"}}]),
     [("spec.inputs[1].url.url", "https://")]),
    ("input-url-sha-bad", spec(inputs=[{"name": "a", "url": {"url": "https://x.dev/f", "sha256": "abc"}}]),
     [("spec.inputs[0].url.sha256", "64 hexadecimal")]),
    ("input-bucket-uri-bad", spec(inputs=[{"name": "a", "bucket": {"uri": "gs://b/k"}}]),
     [("spec.inputs[0].bucket.uri", "s3://bucket/key")]),
    ("input-bucket-sha-bad", spec(inputs=[{"name": "a", "bucket": {"uri": "s3://b/k", "sha256": "z" * 64}}]),
     [("spec.inputs[0].bucket.sha256", "64 hexadecimal")]),
    ("input-output-job-missing", spec(inputs=[{"name": "a", "output": {"name": "model"}}]),
     [("spec.inputs[0].output.job", "Required value")]),
    ("input-output-index-negative", spec(inputs=[{"name": "a", "output": {"job": "j", "name": "m", "index": -1}}]),
     [("spec.inputs[0].output.index", "greater than or equal to 0")]),
    ("input-stage-incomplete", spec(inputs=[{"name": "a", "fromStage": {"stage": "s"}}]),
     [("spec.inputs[0].fromStage.output", "Required value")]),
    ("input-workspace-name-missing", spec(inputs=[{"name": "a", "fromWorkspace": {}}]),
     [("spec.inputs[0].fromWorkspace.name", "Required value")]),
    ("input-volume-name-missing", spec(inputs=[{"name": "a", "volume": {"revision": 2}}]),
     [("spec.inputs[0].volume.name", "Required value")]),
    # outputs
    ("outputs-too-many", spec(outputs=SIX), [("spec.outputs", "Too many: 33: must have at most 32 items")]),
    ("output-name-bad", spec(outputs=[{"name": "Model", "path": "/m"}]), [("spec.outputs[0].name", "must match")]),
    ("output-name-reserved-prefix", spec(outputs=[{"name": "nodus.logs", "path": "/m"}]),
     [("spec.outputs[0].name", '"nodus." prefix is reserved')]),
    ("output-name-outputs", spec(outputs=[{"name": "outputs", "path": "/m"}]),
     [("spec.outputs[0].name", '"outputs" is reserved')]),
    ("output-path-relative", spec(outputs=[{"name": "m", "path": "m"}]), [("spec.outputs[0].path", "absolute path")]),
    ("output-path-missing", spec(outputs=[{"name": "m"}]), [("spec.outputs[0].path", "Required value")]),
    ("output-duplicate", spec(outputs=[{"name": "m", "path": "/a"}, {"name": "m", "path": "/b"}]),
     [("spec.outputs[1].name", "Duplicate value")]),
    ("output-from-ranks-bad", spec(outputs=[{"name": "m", "path": "/a", "fromRanks": "One"}]),
     [("spec.outputs[0].fromRanks", 'supported values: "Zero", "All"')]),
    ("output-sink-mode-bad", spec(outputs=[{"name": "m", "path": "/a", "sink": {"connection": "pg", "table": "t",
                                                                               "mode": "Upsert"}}]),
     [("spec.outputs[0].sink.mode", "Unsupported value")]),
    ("output-sink-table-missing", spec(outputs=[{"name": "m", "path": "/a", "sink": {"connection": "pg"}}]),
     [("spec.outputs[0].sink.table", "Required value")]),
    # distributed
    ("dist-both", spec(distributed={"nodes": 2, "totalGPUs": 16}),
     [("spec.distributed", "exactly one of nodes or totalGPUs may be set")]),
    ("dist-neither", spec(distributed={"launcher": "Torchrun"}), [("spec.distributed", "exactly one of nodes or totalGPUs")]),
    ("dist-nodes-one", spec(distributed={"nodes": 1}), [("spec.distributed.nodes", "must be between 2 and 16")]),
    ("dist-completions", spec(distributed={"nodes": 2}, completions=4),
     [("spec.completions", "must be 1 for a distributed Job")]),
    ("dist-verl-cpu", spec(distributed={"nodes": 2, "launcher": "Verl"}),
     [("spec.distributed.launcher", "needs GPUs")]),
    ("dist-nodes-beta", spec(distributed={"nodes": 9}), [("spec.distributed.nodes", "at most 8 during the beta")]),
    ("dist-nodes-high", spec(distributed={"nodes": 17}), [("spec.distributed.nodes", "must be between 2 and 16")]),
    ("dist-total-high", spec(distributed={"totalGPUs": 65}), [("spec.distributed.totalGPUs", "between 2 and 64")]),
    ("dist-total-low", spec(distributed={"totalGPUs": 1}), [("spec.distributed.totalGPUs", "between 2 and 64")]),
    ("dist-per-node-bad", spec(distributed={"nodes": 2, "gpusPerNode": 3}),
     [("spec.distributed.gpusPerNode", 'Unsupported value: 3: supported values: "1", "2", "4", "8"')]),
    ("dist-per-node-mismatch", spec(distributed={"nodes": 2, "gpusPerNode": 4}, resources={"gpu": {"count": 8}}),
     [("spec.distributed.gpusPerNode", "must equal spec.resources.gpu.count (8)")]),
    ("dist-total-not-multiple", spec(distributed={"totalGPUs": 12, "gpusPerNode": 8}),
     [("spec.distributed.totalGPUs", "multiple of the GPUs per node (8)")]),
    ("dist-total-beyond-beta", spec(distributed={"totalGPUs": 64, "gpusPerNode": 4}),
     [("spec.distributed.totalGPUs", "at most 8 nodes during the beta")]),
    ("dist-launcher-bad", spec(distributed={"nodes": 2, "launcher": "MPI"}), [("spec.distributed.launcher", "Unsupported")]),
    ("dist-network-bad", spec(distributed={"nodes": 2, "network": "Local"}), [("spec.distributed.network", "Unsupported")]),
    ("dist-transport-bad", spec(distributed={"nodes": 2, "transport": "UDP"}),
     [("spec.distributed.transport", "Unsupported")]),
    ("dist-startup-short", spec(distributed={"nodes": 2, "startupTimeout": "1m"}),
     [("spec.distributed.startupTimeout", 'Invalid value: "1m": must be between 5m and 60m')]),
    ("dist-startup-long", spec(distributed={"nodes": 2, "startupTimeout": "2h"}),
     [("spec.distributed.startupTimeout", "must be between 5m and 60m")]),
    ("dist-retries-high", spec(distributed={"nodes": 2, "maxAssemblyRetries": 6}),
     [("spec.distributed.maxAssemblyRetries", "between 0 and 5")]),
    # resources
    ("gpu-count-bad", spec(resources={"gpu": {"count": 3}}), [("spec.resources.gpu.count", "Unsupported value: 3")]),
    ("gpu-type-empty", spec(resources={"gpu": {"type": []}}), [("spec.resources.gpu.type", "at least 1 item")]),
    ("gpu-type-many", spec(resources={"gpu": {"type": [f"g{i}" for i in range(9)]}}),
     [("spec.resources.gpu.type", "Too many: 9: must have at most 8 items")]),
    ("gpu-type-duplicate", spec(resources={"gpu": {"type": ["H100", "H100"]}}),
     [("spec.resources.gpu.type[1]", "Duplicate value")]),
    ("gpu-interconnect-bad", spec(resources={"gpu": {"interconnect": "PCIe"}}),
     [("spec.resources.gpu.interconnect", 'supported values: "Any", "NVLink"')]),
    ("gpu-min-memory-bad", spec(resources={"gpu": {"minMemory": "80GB"}}),
     [("spec.resources.gpu.minMemory", "must be a quantity")]),
    ("gpu-shorthand-bad", spec(resources={"gpu": "H100:x"}), [("spec.resources.gpu", '"TYPE:COUNT"')]),
    ("cpu-bad", spec(resources={"cpu": "lots"}), [("spec.resources.cpu", 'Invalid value: "lots": must be a quantity')]),
    ("memory-negative", spec(resources={"memory": "-1Gi"}), [("spec.resources.memory", "at least 0")]),
    ("resources-nodes-zero", spec(resources={"nodes": 0}), [("spec.resources.nodes", "greater than or equal to 1")]),
    ("resources-nodes-conflict", spec(resources={"nodes": 3}, distributed={"nodes": 2}),
     [("spec.resources.nodes", "conflicts with spec.distributed.nodes (2)")]),
    ("resources-nodes-vs-total", spec(resources={"nodes": 3}, distributed={"totalGPUs": 16}),
     [("spec.resources.nodes", "conflicts with spec.distributed.totalGPUs")]),
    # initCommand, recovery, windows
    ("init-timeout-long", spec(initCommand={"command": ["make"], "timeout": "31m"}),
     [("spec.initCommand.timeout", "must be greater than 0s and at most 30m")]),
    ("init-command-missing", spec(initCommand={"timeout": "5m"}), [("spec.initCommand.command", "Required value")]),
    ("max-attempts-zero", spec(recovery={"maxAttempts": 0}), [("spec.recovery.maxAttempts", "between 1 and 32")]),
    ("max-attempts-high", spec(recovery={"maxAttempts": 33}), [("spec.recovery.maxAttempts", "between 1 and 32")]),
    ("interval-short", spec(recovery={"checkpoint": {"interval": "30s"}}),
     [("spec.recovery.checkpoint.interval", "must be between 1m and 6h")]),
    ("interval-long", spec(recovery={"checkpoint": {"interval": "7h"}}),
     [("spec.recovery.checkpoint.interval", "must be between 1m and 6h")]),
    ("interval-word", spec(recovery={"checkpoint": {"interval": "often"}}),
     [("spec.recovery.checkpoint.interval", "must be a duration")]),
    ("max-size-high", spec(recovery={"checkpoint": {"maxSize": "3Ti"}}),
     [("spec.recovery.checkpoint.maxSize", "at most 2Ti")]),
    ("max-size-zero", spec(recovery={"checkpoint": {"maxSize": "0"}}),
     [("spec.recovery.checkpoint.maxSize", "greater than 0")]),
    ("paths-relative", spec(recovery={"checkpoint": {"paths": ["state"]}}),
     [("spec.recovery.checkpoint.paths[0]", "absolute path")]),
    ("paths-too-many", spec(recovery={"checkpoint": {"paths": [f"/s/{i}" for i in range(65)]}}),
     [("spec.recovery.checkpoint.paths", "Too many: 65: must have at most 64 items")]),
    ("format-bad", spec(recovery={"checkpoint": {"format": "Zip"}}), [("spec.recovery.checkpoint.format", "Unsupported")]),
    ("integration-bad", spec(recovery={"checkpoint": {"integration": "Lightning"}}),
     [("spec.recovery.checkpoint.integration", "Unsupported")]),
    ("retain-bad", spec(recovery={"checkpoint": {"retainAfterFinish": "1w"}}),
     [("spec.recovery.checkpoint.retainAfterFinish", 'unknown unit "w"')]),
    ("continuity-bad", spec(recovery={"continuity": "Never"}), [("spec.recovery.continuity", "Unsupported")]),
    ("on-interruption-bad", spec(recovery={"onInterruption": "Retry"}), [("spec.recovery.onInterruption", "Unsupported")]),
    ("min-progress-bad", spec(recovery={"minProgressDuration": "-1m"}),
     [("spec.recovery.minProgressDuration", "at least 0s")]),
    ("scaledown-long", spec(scaledownWindow="21m"), [("spec.scaledownWindow", "must be between 0s and 20m")]),
    ("timeout-zero", spec(timeout="0s"), [("spec.timeout", "must be greater than 0s")]),
    ("timeout-bad", spec(timeout="1 hour"), [("spec.timeout", "must be a duration")]),
    ("expected-duration-bad", spec(expectedDuration="fast"), [("spec.expectedDuration", "must be a duration")]),
    ("complete-by-bad", spec(completeByTime="tomorrow"), [("spec.completeByTime", "RFC 3339")]),
    ("ads-zero", spec(activeDeadlineSeconds=0), [("spec.activeDeadlineSeconds", "greater than or equal to 1")]),
    ("ads-conflict", spec(activeDeadlineSeconds=60, timeout="2m"),
     [("spec.activeDeadlineSeconds", 'conflicts with spec.timeout ("2m")')]),
    # placement
    ("dedicated-false", spec(placement={"dedicated": False}), [("spec.placement.dedicated", "only true is accepted")]),
    ("interruptible-bad", spec(placement={"interruptible": "Always"}),
     [("spec.placement.interruptible", 'supported values: "Never", "Allow", "Prefer"')]),
    ("profile-bad", spec(placement={"profile": "Fast"}), [("spec.placement.profile", "Unsupported")]),
    ("queue-timeout-negative", spec(placement={"queueTimeout": "-1h"}), [("spec.placement.queueTimeout", "at least 0s")]),
    ("max-rate-zero", spec(placement={"maxRateUSDPerHour": "0"}), [("spec.placement.maxRateUSDPerHour", "greater than 0")]),
    ("max-rate-float", spec(placement={"maxRateUSDPerHour": 2.5}),
     [("spec.placement.maxRateUSDPerHour", "a JSON number is not accepted")]),
    ("regions-type", spec(placement={"regions": "us"}), [("spec.placement.regions", "must be of type array")]),
    # money
    ("max-cost-zero", spec(maxCostUSD="0"), [("spec.maxCostUSD", 'Invalid value: "0": must be greater than 0')]),
    ("max-cost-float", spec(maxCostUSD=10.5), [("spec.maxCostUSD", "Invalid value: 10.5: must be a decimal USD string")]),
    ("max-cost-int", spec(maxCostUSD=10), [("spec.maxCostUSD", "a JSON number is not accepted")]),
    ("max-cost-precision", spec(maxCostUSD="1.0000001"), [("spec.maxCostUSD", "at most 6 decimal places")]),
    # network
    ("egress-allow-without-allowlist", spec(network={"egress": {"policy": "Deny", "allow": ["pypi.org"]}}),
     [("spec.network.egress.allow", "Forbidden: allowed only with policy AllowList")]),
    ("egress-allow-too-many", spec(network={"egress": {"policy": "AllowList",
                                                       "allow": [f"h{i}.dev" for i in range(129)]}}),
     [("spec.network.egress.allow", "Too many: 129")]),
    ("egress-policy-bad", spec(network={"egress": {"policy": "Closed"}}), [("spec.network.egress.policy", "Unsupported")]),
    # volumes
    ("volume-relative", spec(volumes=[{"volume": "v", "mountPath": "data"}]),
     [("spec.volumes[0].mountPath", "absolute path")]),
    ("volume-root", spec(volumes=[{"volume": "v", "mountPath": "/"}]), [("spec.volumes[0].mountPath", "system path (/)")]),
    ("volume-usr", spec(volumes=[{"volume": "v", "mountPath": "/usr/local/data"}]),
     [("spec.volumes[0].mountPath", "system path (/usr)")]),
    ("volume-nodus", spec(volumes=[{"volume": "v", "mountPath": "/nodus/state"}]),
     [("spec.volumes[0].mountPath", "system path (/nodus)")]),
    ("volume-var-run", spec(volumes=[{"volume": "v", "mountPath": "/var/run/"}]),
     [("spec.volumes[0].mountPath", "system path (/var/run)")]),
    ("volume-revision-writable", spec(volumes=[{"volume": "v", "mountPath": "/data", "revision": 3}]),
     [("spec.volumes[0].revision", "only with readOnly")]),
    ("volume-name-missing", spec(volumes=[{"mountPath": "/data"}]), [("spec.volumes[0].volume", "Required value")]),
    ("volume-duplicate-mount", spec(volumes=[{"volume": "v", "mountPath": "/d"}, {"volume": "w", "mountPath": "/d"}]),
     [("spec.volumes[1].mountPath", "Duplicate value")]),
    # source
    ("source-both", spec(source={"blob": "sha256:" + "a" * 64, "git": {"repo": "acme/train"}}),
     [("spec.source", "exactly one of git or blob may be set")]),
    ("source-neither", spec(source={}), [("spec.source", "exactly one of git or blob must be set")]),
    ("source-blob-bad", spec(source={"blob": "md5:abc"}), [("spec.source.blob", "sha256:")]),
    ("source-repo-bad", spec(source={"git": {"repo": "not a repo"}}), [("spec.source.git.repo", "owner/name")]),
    ("source-repo-missing", spec(source={"git": {"ref": "main"}}), [("spec.source.git.repo", "Required value")]),
    # sidecars
    ("sidecar-name-missing", spec(sidecars=[{"image": "redis"}]), [("spec.sidecars[0].name", "Required value")]),
    ("sidecar-duplicate", spec(sidecars=[{"name": "a", "image": "x"}, {"name": "a", "image": "y"}]),
     [("spec.sidecars[1].name", "Duplicate value")]),
    ("sidecar-no-command", spec(sidecars=[{"name": "a"}]), [("spec.sidecars[0].command", "Required value")]),
    ("sidecar-env-bad", spec(sidecars=[{"name": "a", "image": "x", "env": [{"name": "B-C", "value": "1"}]}]),
     [("spec.sidecars[0].env[0].name", "must match the regex")]),
    ("sidecar-startup-bad", spec(sidecars=[{"name": "a", "image": "x", "startupTimeout": "0s"}]),
     [("spec.sidecars[0].startupTimeout", "greater than 0s")]),
    # secrets
    ("secret-version-zero", spec(secrets=[{"name": "hf", "version": 0}]),
     [("spec.secrets[0].version", "greater than or equal to 1")]),
    ("secret-duplicate", spec(secrets=["hf", "hf"]), [("spec.secrets[1].name", "Duplicate value")]),
    ("secret-name-missing", spec(secrets=[{"version": 1}]), [("spec.secrets[0].name", "Required value")]),
    ("secret-not-found", spec(secrets=["nope"]), [("spec.secrets[0].name", 'Not found: "nope"')]),
    ("secret-version-not-found", spec(secrets=[{"name": "hf", "version": 7}]),
     [("spec.secrets[0].version", "Not found: 7")]),
    ("secret-ref-not-found", spec(env=[{"name": "T", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "K"}}}]),
     [("spec.env[0].valueFrom.secretKeyRef.name", 'Not found: "gone"')]),
    ("secret-key-missing", spec(env=[{"name": "T", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "NOPE"}}}]),
     [("spec.env[0].valueFrom.secretKeyRef.key", 'not a key of Secret "hf" version 2')]),
    ("secret-key-not-in-pinned-version", spec(secrets=[{"name": "hf", "version": 1}],
                                              env=[{"name": "T", "valueFrom": {"secretKeyRef": {"name": "hf",
                                                                                                "key": "EXTRA"}}}]),
     [("spec.env[0].valueFrom.secretKeyRef.key", "version 1 (keys: HF_TOKEN)")]),
    ("sidecar-secret-ref-not-found",
     spec(sidecars=[{"name": "a", "image": "x", "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "gone",
                                                                                                      "key": "K"}}}]}]),
     [("spec.sidecars[0].env[0].valueFrom.secretKeyRef.name", "Not found")]),
]


@pytest.mark.parametrize("patch, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_job_rule(patch: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    assert_causes(causes_of(merged(BASE, patch)), expected)


def test_valid_job_is_admitted_with_defaults_written() -> None:
    admitted = create(BASE)
    assert admitted.warnings == ()
    assert admitted.object["apiVersion"] == "nodus.dev/v1" and admitted.object["kind"] == "Job"
    assert admitted.object["metadata"] == {"name": "train", "labels": {"team": "ml"}}
    assert admitted.object["spec"] == {
        "image": "ghcr.io/acme/train:1",
        "command": ["python", "train.py"],
        "backoffLimit": 6,
        "completions": 1,
        "parallelism": 1,
        "placement": {"interruptible": "Never", "profile": "Balanced", "queueTimeout": "24h0m0s"},
        "recovery": {
            "checkpoint": {"integration": "Auto", "interval": "auto", "maxSize": "1Ti", "paths": ["/nodus/state"],
                           "retainAfterFinish": "168h0m0s", "format": "Snapshot"},
            "continuity": "Checkpointed", "maxAttempts": 3, "minProgressDuration": "2m0s", "onInterruption": "Resume",
        },
        "state": "Running",
    }
    assert "status" not in admitted.object


def test_each_job_gets_its_own_defaults() -> None:
    """The defaults are worked out once per schema node (ADR 0106); what each Job gets is still its own: a
    change to one Job's defaulted list or materialized object shows in no other Job admitted after it."""
    first = create(BASE).object["spec"]
    first["recovery"]["checkpoint"]["paths"].append("/elsewhere")
    first["placement"]["profile"] = "Cheapest"
    first["recovery"]["checkpoint"]["interval"] = "5m"
    second = create(BASE).object["spec"]
    assert second["recovery"]["checkpoint"]["paths"] == ["/nodus/state"]
    assert second["recovery"]["checkpoint"]["interval"] == "auto"
    assert second["placement"] == {"interruptible": "Never", "profile": "Balanced", "queueTimeout": "24h0m0s"}


def test_nested_defaults_and_dcp_for_distributed_jobs() -> None:
    obj = merged(BASE, spec(distributed={"nodes": 2}, resources={"gpu": {"type": ["H100"], "count": 8}}, network=OPEN,
                            inputs=[{"name": "w", "output": {"job": "prep", "name": "weights"}}],
                            outputs=[{"name": "m", "path": "/m", "sink": {"connection": "pg", "table": "t"}}]))
    out = create(obj).object["spec"]
    assert out["recovery"]["checkpoint"]["format"] == "Dcp"
    assert out["distributed"] == {"nodes": 2, "launcher": "Plain", "maxAssemblyRetries": 2, "network": "Regional",
                                  "startupTimeout": "15m0s", "transport": "Auto"}
    assert out["resources"]["gpu"]["interconnect"] == "Any"
    assert out["inputs"][0]["output"]["index"] == 0
    assert out["outputs"][0]["fromRanks"] == "Zero" and out["outputs"][0]["sink"]["mode"] == "Append"


def test_a_job_needs_only_a_command() -> None:
    assert "image" not in create(merged(BASE, spec(image=None))).object["spec"]
    assert create(merged(BASE, spec(command=None))).object["spec"]["image"]


def test_explicit_values_are_kept_and_canonicalized() -> None:
    out = create(merged(BASE, spec(timeout="90m", placement={"queueTimeout": "0s", "profile": "Cost"},
                                   completeByTime="2025-06-01T12:00:00+02:00",
                                   recovery={"checkpoint": {"interval": "10m", "format": "Snapshot"}}))).object["spec"]
    assert out["timeout"] == "1h30m0s"
    assert out["placement"] == {"queueTimeout": "0s", "profile": "Cost", "interruptible": "Never"}
    assert out["completeByTime"] == "2025-06-01T10:00:00Z"
    assert out["recovery"]["checkpoint"]["interval"] == "10m0s"


@pytest.mark.parametrize("patch, field, value", [
    (spec(activeDeadlineSeconds=3600), "timeout", "1h0m0s"),
    (spec(activeDeadlineSeconds=3600, timeout="60m"), "timeout", "1h0m0s"),
    (spec(activeDeadlineSeconds=90), "timeout", "1m30s"),
    (spec(resources={"nodes": 4, "gpu": {"count": 8}}, network=OPEN), "distributed", None),
    (spec(resources={"nodes": 2}, distributed={"nodes": 2}, network=OPEN), "distributed", None),
    (spec(secrets=["hf"]), "secrets", [{"name": "hf"}]),
    (spec(resources={"gpu": "H100:8"}), "resources", {"gpu": {"type": ["H100"], "count": 8, "interconnect": "Any"}}),
    (spec(resources={"gpu": "A100"}), "resources", {"gpu": {"type": ["A100"], "interconnect": "Any"}}),
])
def test_aliases_are_folded(patch: dict[str, Any], field: str, value: Any) -> None:
    out = create(merged(BASE, patch)).object["spec"]
    assert "activeDeadlineSeconds" not in out
    assert "nodes" not in out.get("resources", {})
    if field == "distributed":
        assert out["distributed"]["nodes"] == merged(BASE, patch)["spec"]["resources"]["nodes"]
    else:
        assert out[field] == value


def test_resources_nodes_one_is_dropped() -> None:
    out = create(merged(BASE, spec(resources={"nodes": 1, "cpu": 4}))).object["spec"]
    assert out["resources"] == {"cpu": "4"} and "distributed" not in out


def test_generate_name_without_name() -> None:
    obj = merged(BASE, {"metadata": {"name": None, "generateName": "train-"}})
    assert create(obj).object["metadata"]["generateName"] == "train-"


def test_system_metadata_and_status_pass_through() -> None:
    meta = {"uid": "u-1", "resourceVersion": "42", "generation": 3, "creationTimestamp": "2025-01-01T00:00:00Z",
            "managedFields": [{"manager": "kubectl"}], "annotations": {"nodus.dev/x": "y"}, "finalizers": ["nodus.dev/stop"]}
    obj = merged(BASE, {"metadata": meta, "status": {"phase": "Running", "whatever": 1}})
    out = create(obj).object
    assert all(out["metadata"][k] == v for k, v in meta.items())
    assert out["status"] == {"phase": "Running", "whatever": 1}


def test_all_violations_are_reported_at_once() -> None:
    obj = merged(BASE, spec(completions=0, backoffLimit=500, foo=1, state="Done",
                            inputs=[{"name": "a"}, {"name": "b", "url": {"url": "http://x"}}]))
    with pytest.raises(NodusError) as info:
        create(obj)
    err = info.value
    fields = [c.field for c in err.causes]
    assert fields == ["spec.completions", "spec.backoffLimit", "spec.foo", "spec.state", "spec.inputs[0]",
                      "spec.inputs[1].url.url"]
    assert err.message.startswith('Job.nodus.dev "train" is invalid: spec.completions: Invalid value: 0: ')
    status = err.to_status("req_1")
    assert status["code"] == 422 and status["reason"] == "Invalid" and status["apiVersion"] == "v1"
    assert status["details"]["kind"] == "Job" and status["details"]["name"] == "train"
    assert status["details"]["causes"][0] == {"reason": "FieldValueInvalid", "field": "spec.completions",
                                              "message": "Invalid value: 0: must be between 1 and 10000"}
    assert {c["reason"] for c in status["details"]["causes"]} >= {"FieldValueUnknown", "FieldValueNotSupported",
                                                                   "FieldValueRequired"}


UNKNOWN = merged(BASE, {"spec": {"foo": 1, "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"},
                                                   {"name": "C", "value": "3", "nmae": "x"}]}, "extra": True})


def test_unknown_fields_strict() -> None:
    found = causes_of(UNKNOWN)
    assert [f for f, _ in found] == ["spec.foo", "spec.env[2].nmae", "extra"]
    assert all("Unknown field" in m for _, m in found)


def test_unknown_fields_warn() -> None:
    admitted = create(UNKNOWN, field_validation="Warn")
    assert admitted.warnings == ('unknown field "spec.foo"', 'unknown field "spec.env[2].nmae"', 'unknown field "extra"')
    assert "foo" not in admitted.object["spec"] and "extra" not in admitted.object
    assert admitted.object["spec"]["env"][2] == {"name": "C", "value": "3"}


def test_unknown_fields_ignore() -> None:
    admitted = create(UNKNOWN, field_validation="Ignore")
    assert admitted.warnings == () and "foo" not in admitted.object["spec"]


def test_warn_still_refuses_invalid_values() -> None:
    assert_causes(causes_of(merged(UNKNOWN, spec(completions=0)), field_validation="Warn"),
                  [("spec.completions", "between 1 and 10000")])


@pytest.mark.parametrize("value", ["strict", "Fail", ""])
def test_bad_field_validation_is_a_bad_request(value: str) -> None:
    with pytest.raises(NodusError) as info:
        create(BASE, field_validation=value)
    assert info.value.reason == "BadRequest" and "fieldValidation" in info.value.message
    assert "Strict, Warn, Ignore" in info.value.message


def test_body_must_be_an_object() -> None:
    with pytest.raises(NodusError) as info:
        create([1, 2])  # type: ignore[arg-type]
    assert info.value.reason == "BadRequest"


def test_secrets_are_pinned_at_admission() -> None:
    obj = merged(BASE, spec(secrets=["hf"], env=[{"name": "T", "valueFrom": {"secretKeyRef": {"name": "hf",
                                                                                            "key": "EXTRA"}}}]))
    out = create(obj).object
    assert out["spec"]["secrets"] == [{"name": "hf"}]
    assert out["status"] == {"secretVersions": {"hf": 2}, "secretVersionIDs": {"hf": "sv-hf-2"}}


def test_pinning_an_older_version() -> None:
    obj = merged(BASE, spec(secrets=[{"name": "hf", "version": 1}],
                            env=[{"name": "T", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}}]))
    assert create(obj).object["status"]["secretVersions"] == {"hf": 1}


def test_env_only_reference_is_pinned_too() -> None:
    obj = merged(BASE, spec(env=[{"name": "T", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}}]))
    assert create(obj).object["status"]["secretVersionIDs"] == {"hf": "sv-hf-2"}


# -- updates -----------------------------------------------------------------------------------------

STORED = merged(create(merged(BASE, spec(maxCostUSD="10.00", secrets=["hf"]))).object,
                {"metadata": {"uid": "u", "resourceVersion": "7"}})


@pytest.mark.parametrize("patch, field", [
    (spec(completions=5), "spec.completions"),
    (spec(image="other:2"), "spec.image"),
    (spec(command=["bash"]), "spec.command"),
    (spec(env=[{"name": "A", "value": "1"}]), "spec.env"),
    (spec(resources={"gpu": {"count": 8}}), "spec.resources"),
    (spec(placement={"profile": "Cost"}), "spec.placement.profile"),
    (spec(recovery={"continuity": "Ephemeral"}), "spec.recovery.continuity"),
    (spec(recovery={"checkpoint": {"maxSize": "2Ti"}}), "spec.recovery.checkpoint.maxSize"),
    (spec(secrets=None), "spec.secrets"),
])
def test_update_immutable_field_is_named(patch: dict[str, Any], field: str) -> None:
    with pytest.raises(NodusError) as info:
        update(STORED, merged(STORED, patch))
    assert [(c.field, c.message.endswith("field is immutable")) for c in info.value.causes] == [(field, True)]


def test_update_immutable_message_is_kubernetes_worded() -> None:
    with pytest.raises(NodusError) as info:
        update(STORED, merged(STORED, spec(completions=5)))
    assert info.value.causes[0].message == "Invalid value: 5: field is immutable"


@pytest.mark.parametrize("patch", [
    spec(parallelism=1), spec(backoffLimit=10), spec(timeout="2h"), spec(activeDeadlineSeconds=600),
    spec(maxCostUSD="25.50"), spec(recovery={"maxAttempts": 10}), spec(recovery={"checkpoint": {"interval": "30m"}}),
    spec(recovery={"checkpoint": {"retainAfterFinish": "24h"}}), spec(ttlSecondsAfterFinished=60),
    spec(state="Suspended"), spec(state="Cancelled"), {"metadata": {"labels": {"team": "infra"}}},
])
def test_update_mutable_fields(patch: dict[str, Any]) -> None:
    out = update(STORED, merged(STORED, patch)).object
    assert out["spec"]["completions"] == 1


def test_update_unchanged_object_passes() -> None:
    assert update(STORED, copy.deepcopy(STORED)).object == STORED


def test_update_max_cost_lowered_is_refused() -> None:
    with pytest.raises(NodusError) as info:
        update(STORED, merged(STORED, spec(maxCostUSD="5.00")))
    assert [(c.field, c.message) for c in info.value.causes] == [
        ("spec.maxCostUSD", 'Invalid value: "5.00": may only be raised (was "10.00")')]


def test_update_max_cost_removed_is_refused() -> None:
    with pytest.raises(NodusError) as info:
        update(STORED, merged(STORED, spec(maxCostUSD=None)))
    assert info.value.causes[0].field == "spec.maxCostUSD" and "may only be raised" in info.value.causes[0].message


def test_update_max_cost_equal_or_added() -> None:
    assert update(STORED, merged(STORED, spec(maxCostUSD="10.000")))
    no_cap = create(BASE).object
    assert update(no_cap, merged(no_cap, spec(maxCostUSD="3.00"))).object["spec"]["maxCostUSD"] == "3.00"


def test_update_carries_pins_over() -> None:
    assert STORED["status"]["secretVersions"] == {"hf": 2}
    new = merged(STORED, {"spec": {"parallelism": 1}, "status": {"secretVersions": {"hf": 1}, "phase": "Running"}})
    out = update(STORED, new).object
    assert out["status"] == {"secretVersions": {"hf": 2}, "secretVersionIDs": {"hf": "sv-hf-2"}, "phase": "Running"}


def test_update_validates_the_new_object_and_reports_everything() -> None:
    with pytest.raises(NodusError) as info:
        update(STORED, merged(STORED, spec(parallelism=0, completions=2, foo=1)))
    assert [c.field for c in info.value.causes] == ["spec.parallelism", "spec.foo", "spec.completions"]


def test_update_field_validation_warn() -> None:
    out = update(STORED, merged(STORED, spec(foo=1)), field_validation="Warn")
    assert out.warnings == ('unknown field "spec.foo"',)


def test_admit_status_checks_shape() -> None:
    ok = admission.admit_status(JOB, merged(STORED, {"status": {"phase": "Running", "succeeded": 1,
                                                                "cost": {"totalUSD": "1.20"}}}))
    assert ok.object["status"]["cost"] == {"totalUSD": "1.20"}
    with pytest.raises(NodusError) as info:
        admission.admit_status(JOB, merged(STORED, {"status": {"succeeded": "one", "phaze": "x",
                                                               "gang": {"members": [{"rank": "0"}]}}}))
    assert [(c.field, c.reason) for c in info.value.causes] == [
        ("status.succeeded", "FieldValueInvalid"), ("status.phaze", "FieldValueUnknown"),
        ("status.gang.members[0].rank", "FieldValueInvalid")]
    warned = admission.admit_status(JOB, merged(STORED, {"status": {"phaze": "x"}}), field_validation="Warn")
    assert warned.warnings == ('unknown field "status.phaze"',) and "phaze" not in warned.object["status"]


@pytest.mark.parametrize("patch", [
    {}, spec(activeDeadlineSeconds=3600, resources={"nodes": 2, "gpu": "H100:8"}, secrets=["hf"], network=OPEN),
    spec(timeout="90m", completeByTime="2025-06-01T12:00:00+02:00", placement={"queueTimeout": "36h"}),
    spec(outputs=[{"name": "m", "path": "/m", "sink": {"connection": "pg", "table": "t"}}],
         inputs=[{"name": "w", "output": {"job": "prep", "name": "weights"}}]),
])
def test_admission_is_idempotent(patch: dict[str, Any]) -> None:
    """The stored form admits to itself: re-applying what a GET returned changes nothing."""
    first = create(merged(BASE, patch)).object
    first.pop("status", None)
    again = create(copy.deepcopy(first)).object
    again.pop("status", None)
    assert again == first
    assert update(first, copy.deepcopy(first)).object == first


def test_update_with_equivalent_spelling_is_not_a_change() -> None:
    new = merged(STORED, spec(placement={"queueTimeout": "24h"}, recovery={"minProgressDuration": "120s"}))
    assert update(STORED, new).object["spec"] == STORED["spec"]
