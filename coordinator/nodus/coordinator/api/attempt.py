"""Attempt (nodus.dev/v1): one run of one Job index, read-only for customers.

The job controller creates Attempts, the scheduler places them and the agent stream folds what the
node agent reports into their status (docs/adr/0009-controllers.md). Customers get, list and watch
them (`nodus get attempts JOB`, `kubectl get attempts -l nodus.dev/job=JOB`); every write by anyone
but the coordinator itself answers 405 MethodNotAllowed. The tree below is what `kubectl explain
attempts` shows; admission never runs it for a write, because there are no customer writes.

Naming: `<job>-<index>-<number>` (a DNS subdomain; a Job name is at most 63 characters, so the name
fits easily in 253), labels `nodus.dev/job` and `nodus.dev/index`, and an ownerReference to the Job.
The attempt id on the wire (Assignment.attempt_id, NODUS_ATTEMPT) is `spec.id`, `att-` and 16 hex
digits, chosen at creation: unique in the cluster, short in logs and in the agent's directories, and
different for a Job deleted and recreated under the same name.
"""
from __future__ import annotations

from typing import Any

from nodus.v1 import common_pb2

from ..errors import Cause
from .limits import AdmissionLimits
from .schema import Bool, Int, KindSchema, List, Map, Obj, Str

JOB_LABEL = "nodus.dev/job"
INDEX_LABEL = "nodus.dev/index"
RANK_LABEL = "nodus.dev/rank"
PHASES = tuple("".join(word.capitalize() for word in name.removeprefix("ATTEMPT_PHASE_").split("_"))
               for name in common_pb2.AttemptPhase.keys() if name != "ATTEMPT_PHASE_UNSPECIFIED")
"""common.proto's AttemptPhase names as CamelCase words, in the proto's order (controllers/attempt_machine.py
defines the enum; tests hold the two equal)."""


def attempt_name(job: str, index: int, number: int) -> str:
    return f"{job}-{index}-{number}"


def _s(description: str, **kw: Any) -> Str:
    return Str(description=description, **kw)


def _i(description: str) -> Int:
    return Int(description=description)


_GPU = Obj(description="GPU is the accelerator request, as on the Job.", fields={
    "count": _i("Count is the GPUs reserved."),
    "exact": Bool(description="Exact pins the exact variant."),
    "interconnect": _s("Interconnect is Any or NVLink."),
    "minMemory": _s("MinMemory is the per-GPU memory floor."),
    "type": List(description="Type lists accelerator ids or families.", items=Str()),
})

ATTEMPT_SPEC = Obj(description="AttemptSpec is what the coordinator decided for this run.", fields={
    "id": _s("ID is the attempt id used on the agent stream and in NODUS_ATTEMPT: att- and 16 hex digits."),
    "job": _s("Job is the owning Job's name."),
    "jobUID": _s("JobUID is the owning Job's metadata.uid."),
    "index": _i("Index is the Job index this attempt runs (NODUS_INDEX)."),
    "number": _i("Number is the attempt number within the index, from 1 (NODUS_ATTEMPT_NUMBER)."),
    "node": _s("Node is the node the scheduler placed the attempt on; empty while Pending."),
    "offering": _s("Offering is the offering key of the node it was placed on."),
    "regionClass": _s("RegionClass is the region class of the node it was placed on."),
    "rateUSDPerHour": _s("RateUSDPerHour is the offering's customer rate, frozen when the attempt was placed "
                         "(with a price book)."),
    "interruptible": Bool(description="Interruptible is true when the offering it was placed on can be reclaimed."),
    "epoch": _i("Epoch is the gang epoch of a gang member (the fencing token of its checkpoints); 0 otherwise."),
    "gang": Obj(description="Gang places a member in its gang: epoch, rank and size.", fields={
        "epoch": _i("Epoch is the gang epoch, from 1 (NODUS_GANG_EPOCH)."),
        "rank": _i("Rank is the member's node rank, 0..size-1 (NODUS_RANK)."),
        "size": _i("Size is the number of members (NODUS_NODES)."),
    }),
    "env": Map(description="Env is what the attempt knows from its creation (a gang member's rank variables).",
               values=Str()),
    "gpuIndexes": List(description="GPUIndexes are the host GPU indexes reserved on the node.", items=Int()),
    "runtime": _s("Runtime is process (no image) or oci (an image): what the node must offer."),
    "image": _s("Image is the Job's image; empty runs in the node's own environment."),
    "command": List(description="Command is the Job's command followed by its args (a summary).", items=Str()),
    "resources": Obj(description="Resources are the capacity the attempt reserves on its node.", fields={
        "cpu": _s("CPU is the vCPU floor."),
        "memory": _s("Memory is the host memory floor."),
        "disk": _s("Disk is the ephemeral disk floor."),
        "gpu": _GPU,
    }),
    "placement": Obj(description="Placement is the Job's hard placement constraints.", fields={
        "regions": List(description="Regions are the region classes the node must be in.", items=Str()),
        "offerings": List(description="Offerings are the offering ids the node must be sold as.", items=Str()),
        "preferNode": _s("PreferNode is a gang rank's node of the previous epoch, taken when it still fits."),
        "avoidNodes": List(description="AvoidNodes are nodes a gang rank must not use again.", items=Str()),
    }),
    "stop": Obj(description="Stop is set when the coordinator wants the attempt stopped.", fields={
        "reason": _s("Reason is why: Cancelled, Suspended, DeadlineExceeded, BackoffLimitExceeded, Drained, …"),
        "graceSeconds": _i("GraceSeconds is the time between SIGTERM and SIGKILL."),
        "time": _s("Time is when the stop was requested."),
        "checkpointSeq": _i("CheckpointSeq asks for a checkpoint with this seq before the stop (a Suspend)."),
    }),
})

ATTEMPT_STATUS = Obj(description="AttemptStatus is what the coordinator and the node agent observed.", fields={
    "phase": _s("Phase is where the attempt stands: " + ", ".join(PHASES) + ". Succeeded, Failed, Lost and "
                "Cancelled are terminal.", enum=PHASES),
    "reason": _s("Reason is the CamelCase reason for the phase, for example Completed, Error, OOMKilled, NodeLost, "
                 "Drained, Cancelled, Suspended, DeadlineExceeded, WaitingForCapacity."),
    "message": _s("Message is a scrubbed explanation: at most three log lines of a customer exit, or why the "
                  "attempt waits for capacity."),
    "exitCode": _i("ExitCode is the main command's exit code (128 + signal for a signal)."),
    "oomKilled": Bool(description="OOMKilled is true when the kernel's OOM killer ended the main command."),
    "provisioningTime": _s("ProvisioningTime is when the scheduler placed the attempt."),
    "startTime": _s("StartTime is when the main command started."),
    "finishTime": _s("FinishTime is when the attempt reached a terminal phase."),
    "inputsReadyTime": _s("InputsReadyTime is when declared inputs finished materializing."),
    "inputs": List(description="Inputs are the inputs as the node agent materialized them.", items=Obj(
        description="MaterializedInput is one input as it arrived.", fields={
            "name": _s("Name is the input."),
            "sha256": _s("SHA256 is the digest of what arrived, hex, computed at the end of the stream."),
        })),
    "warnings": List(description="Warnings are notes that stop nothing, for example GpuUnhealthy: a GPU the attempt "
                                 "holds turned unhealthy while it runs (it keeps running; the GPU gets no new work).",
                     items=Obj(description="AttemptWarning is one note.", fields={
                         "code": _s("Code is the CamelCase warning code."),
                         "message": _s("Message names what is wrong and what to do."),
                     })),
    "logBytes": _i("LogBytes is the size of the attempt's log in the blob store, as garbage collection last "
                   "measured it; its Job's status.storage counts it."),
    "logFinal": Bool(description="LogFinal is true once the attempt ended and its log's size is final."),
    "volumeCommits": List(description="VolumeCommits are the Volume revisions its writable mounts (readOnly: false) "
                                      "became when its index succeeded.", items=Obj(
        description="VolumeCommit is one writable mount committed.", fields={
            "volume": _s("Volume is the Volume's name."),
            "revision": _i("Revision is the revision the mount became (0: none, see message)."),
            "message": _s("Message says why nothing was committed, for example the Volume was deleted."),
        })),
    "lostTime": _s("LostTime is when the coordinator recorded the attempt Lost."),
    "reportTime": _s("ReportTime is the agent's clock at its latest report (orders reports)."),
    "restoredFromSeq": _i("RestoredFromSeq is the checkpoint restored before the command; 0 if none."),
    "imagePull": Obj(description="ImagePull is how far the node has pulled the attempt's images (its own and its "
                                 "sidecars'); unset for an attempt without an image.", fields={
        "bytesDone": _i("BytesDone is the bytes of blobs on the node so far, cached ones included."),
        "bytesTotal": _i("BytesTotal is the bytes of every blob the images need (compressed, as their manifests "
                         "size them)."),
    }),
    "network": Obj(description="Network is what the attempt's pod did on the network.", fields={
        "deniedConnections": _i("DeniedConnections counts the connections the pod tried and its network.egress "
                                "rules refused (unset until one is)."),
    }),
    "checkpoints": List(description="Checkpoints are the checkpoints this attempt committed, newest last (at most "
                                    "8); the coordinator refused any from a superseded attempt or epoch.",
                        items=Obj(description="CommittedCheckpoint is one committed checkpoint's manifest.", fields={
                            "seq": _i("Seq is the checkpoint sequence number."),
                            "sha256": _s("SHA256 is the archive's digest, hex."),
                            "size": _i("Size is the archive's size in bytes."),
                            "uri": _s("URI is where the archive is: blob://sha256/<hex>, or the s3:// URI of its "
                                      "manifest in the Job's Connection."),
                            "time": _s("Time is when it committed."),
                            "epoch": _i("Epoch is the gang epoch that wrote it."),
                            "paths": List(description="Paths are the saved paths.", items=Str()),
                            "pause": _s("Pause is how long the program was held for the local copy."),
                            "reason": _s("Reason is Periodic, Suspend, Preemption or Requested (nodus checkpoint now)."),
                            "format": _s("Format is Snapshot or Dcp."),
                            "rank": _i("Rank is the gang rank whose part of a Dcp checkpoint this is."),
                            "ranks": _i("Ranks is how many parts the Dcp checkpoint has (the gang's size)."),
                            "connection": _s("Connection is the Job's Connection an s3:// checkpoint went to; "
                                             "retention deletes it with its keys."),
                        })),
    "supersededCheckpoints": List(
        description="SupersededCheckpoints are checkpoints pushed out of the newest 8 by newer ones; the retention "
                    "sweep deletes their archives, then drops them from this list.",
        items=Obj(description="SupersededCheckpoint is an archive to delete.", fields={
            "seq": _i("Seq is the checkpoint sequence number."),
            "sha256": _s("SHA256 is the archive's digest, hex."),
            "size": _i("Size is the archive's size in bytes."),
            "uri": _s("URI is where the archive is."),
            "connection": _s("Connection is the Connection of an s3:// checkpoint."),
        })),
    "gang": Obj(description="Gang is what the member's agent reported of its gang steps.", fields={
        "epoch": _i("Epoch is the gang epoch the report is for."),
        "done": _s("Done is the last step finished: Assemble (prepared, ports reserved) or Mesh (probed)."),
        "address": _s("Address is the member's advertised address."),
        "port": _i("Port is the rendezvous port the member reserved (rank 0's is MASTER_PORT)."),
        "probePort": _i("ProbePort is the port of the member's probe echo."),
        "probe": Obj(description="Probe is the member's network measurement.", fields={
            "rttMs": _s("RTTMs is the slowest median round trip to another member, in milliseconds."),
            "busGbps": _s("BusGbps is the all-reduce bus bandwidth in Gbit/s."),
            "path": _s("Path is Private, Public, Direct or Relayed."),
            "measuredTime": _s("MeasuredTime is when it was measured."),
            "error": _s("Error says what could not be measured."),
        }),
    }),
    "suspendFailed": Obj(description="SuspendFailed records failed suspend checkpoints.", fields={
        "generation": _i("Generation is the Job generation whose suspend failed."),
        "tries": _i("Tries is how many checkpoint tries failed."),
    }),
    "outputs": List(description="Outputs are the committed outputs.", items=Obj(
        description="AttemptOutput is one committed output.", fields={
            "name": _s("Name is the declared output (outputs for /nodus/outputs)."),
            "path": _s("Path is where it was collected from."),
            "rank": _i("Rank is the gang rank that produced it."),
            "uri": _s("URI is where it was uploaded (blob://sha256/<hex>)."),
            "sha256": _s("SHA256 is the content digest, hex."),
            "size": _i("Size is the size in bytes."),
        })),
    "progress": Obj(description="Progress is the latest line the program wrote to $NODUS_PROGRESS.", fields={
        "stage": _s("Stage is a domain stage name."),
        "units": Obj(description="Units counts work units.", fields={
            "completed": _i("Completed is units done."), "total": _i("Total is units planned, when known.")}),
        "metrics": Map(description="Metrics are the latest scalar metrics, as decimal strings.", values=Str()),
        "step": _i("Step is the training step."),
        "totalSteps": _i("TotalSteps is the planned training steps."),
        "tokensPerSecond": _s("TokensPerSecond is the throughput, as a decimal string."),
        "gpuMemoryBytes": _i("GPUMemoryBytes is the GPU memory in use."),
        "time": _s("Time is the agent's clock when the line was read."),
    }),
    "unitSamplesMs": List(description="UnitSamplesMs are per-unit times derived from successive progress lines, "
                                      "newest last (at most 64).", items=Int()),
    "placement": Obj(description="Placement is the scheduler's explanation.", fields={
        "explain": _s("Explain says why the attempt went where it went, or why it waits."),
    }),
})


def _no_rules(body: dict[str, Any], limits: AdmissionLimits) -> list[Cause]:
    return []


ATTEMPT = KindSchema(
    kind="Attempt",
    description="Attempt is one run of one Job index: where it runs, its phase, its exit and its progress. The "
                "coordinator creates and updates Attempts; customers read them.",
    body=Obj(fields={"spec": ATTEMPT_SPEC}),
    status=ATTEMPT_STATUS,
    rules=_no_rules,
)
