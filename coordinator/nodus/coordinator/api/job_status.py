"""The Job's status tree (shape only: admission's `admit_status` checks types and unknown fields),
and the status pieces other kinds share: CONDITIONS, COST and ESTIMATE (Sweep, TrainingJob).
Descriptions are the spec pages' text (spec/job.md)."""
from __future__ import annotations

from typing import Any

from .schema import Bool, Int, List, Map, Obj, Str


def _s(description: str = "") -> Str:
    return Str(description=description)


def _i(description: str = "") -> Int:
    return Int(description=description)


def _b(description: str = "") -> Bool:
    return Bool(description=description)


def _o(description: str, **fields: Any) -> Obj:
    return Obj(description=description, fields=fields)


def _l(description: str, item: Any) -> List:
    return List(description=description, items=item)


CONDITIONS = _l("Conditions are the latest observations.", _o(
    "Condition is one observation, as in Kubernetes.",
    lastTransitionTime=_s("LastTransitionTime is when status last changed."),
    message=_s("Message is a human-readable explanation."),
    observedGeneration=_i("ObservedGeneration is the generation the condition was set for."),
    reason=_s("Reason is a CamelCase reason."),
    status=_s("Status is True, False or Unknown."),
    type=_s("Type is the condition type.")))

COST = _o(
    "Cost is status.cost on every kind that spends money. It is a display copy of the ledger: amounts are decimal "
    "USD strings, and nothing is charged from these fields.",
    bySegment=_o("CostSegments splits a charge by billing segment.",
                 bootUSD=_s("BootUSD is the charge from the start of billing until the program started."),
                 coveredByNodus=_l("CoveredByNodus lists the segments (Boot, Running, Restore, Teardown) with time "
                                   "Nodus paid for instead of charging it, such as the start and teardown of a run "
                                   "that failed because of Nodus.", _s()),
                 restoreUSD=_s("RestoreUSD is the charge for bringing a replacement up after capacity was lost."),
                 runningUSD=_s("RunningUSD is the charge while the program ran."),
                 storageUSD=_s("StorageUSD is the charge for checkpoints and outputs above the free inclusion "
                               "(status.storage.billedBytes), by the price book's GiB-month rate, posted hourly."),
                 teardownUSD=_s("TeardownUSD is the charge from stop until deletion was confirmed, with the billing "
                                "increment.")),
    final=_b("Final is true once the final charge has posted."),
    fundedUntilTime=_s("FundedUntilTime is when the current holds stop paying for the object."),
    heldUSD=_s("HeldUSD is what is currently held for it."),
    limitUSD=_s("LimitUSD is the object’s maxCostUSD, if it has one."),
    rateUSDPerHour=_s("RateUSDPerHour is the sum of the hourly rates of its capacity that is still billing."),
    totalUSD=_s("TotalUSD is what has been charged for this object so far."))


def _band(description: str, what: str) -> Obj:
    return _o(description, p50=_s(f"P50 is the median {what}."), p90=_s(f"P90 is the 90th-percentile {what}."))


def _startup_band() -> Obj:
    return _o(_DURATION_BAND, p50=_s("P50 is the median duration."), p90=_s("P90 is the 90th-percentile duration."),
              message=_s("Message says why there is no band, for example no measurements."))


_USD_BAND = "USDBand is a median and a 90th-percentile amount in USD."
_DURATION_BAND = "DurationBand is a median and a 90th-percentile duration, as Go duration strings."

ESTIMATE = _o(
    "Estimate is returned in status.estimate by a dry-run (?dryRun=All) and on create for every compute kind "
    "(ADR-031). Amounts are decimal USD strings; the ETag of the dry-run response binds a later create to it.",
    assemblyBoundUSD=_s("AssemblyBoundUSD is the most a multi-node Job can cost if its members never assemble."),
    blockingReasons=_l("BlockingReasons say why a real create would fail now, with the amounts and a fix.", _o(
        "BlockingReason says why a create would fail now.",
        code=_s("Code is the error code the create would return, for example InsufficientCredits."),
        fix=_s("Fix says what to do."),
        message=_s("Message states the reason with the amounts involved."))),
    concurrentHoldUSD=_s("ConcurrentHoldUSD is the total of the holds for every slot that starts at once."),
    costUSD=_band(_USD_BAND, "amount"),
    gangHoldUSD=_s("GangHoldUSD is the total of the member holds of a multi-node Job."),
    holdUSD=_s("HoldUSD is the first hold that must fit your balance, every matching Budget and the object’s own cap."),
    minimumChargeUSD=_s("MinimumChargeUSD is the billing increment rounding charged once per allocation."),
    overheadUSD=_band(_USD_BAND, "amount"),
    placementPreview=_o("PlacementPreview is the customer-safe description of the capacity a create would use.",
                        explain=_s("Explain is the scheduler’s explanation, the same shape as Attempt "
                                   "status.placement.explain."),
                        interruptible=_b("Interruptible reports whether the capacity can be reclaimed."),
                        offering=_s("Offering is the offering id, for example h100-sxm-80g-x8-us."),
                        regionClass=_s("RegionClass is the region class of the offering."),
                        warmReuse=_b("WarmReuse reports whether warm capacity would be reused.")),
    pricebookVersion=_s("PricebookVersion is the price book the estimate used."),
    rateUSDPerHour=_s("RateUSDPerHour is the hourly rate of the chosen capacity."),
    binding=_o("EstimateBinding is the dry-run estimate a create sent with If-Match was bound to.",
               etag=_s("ETag is the dry run's ETag the create sent."),
               maxRateUSDPerHour=_s("MaxRateUSDPerHour is the bound: no attempt is placed above it."),
               pricebookVersion=_s("PricebookVersion is the price book that estimate used."),
               rateUSDPerHour=_s("RateUSDPerHour is the rate that estimate quoted.")),
    startup=_o("StartupEstimate is the expected time to start, from this fleet's measured start times of the "
               "offering.", cold=_startup_band(), warm=_startup_band()),
    topology=_s("Topology is the resolved multi-node topology of a gang Job."),
    validUntil=_s("ValidUntil is when the prices this estimate used stop being current. A create bound by If-Match "
                  "is admitted after it too, and never placed above rateUSDPerHour plus 10 %."),
    warnings=_l("Warnings are non-blocking notes, for example ColdStart or InterruptibleSelected.", _o(
        "EstimateWarning is a non-blocking note on an estimate.",
        code=_s("Code is the CamelCase warning code."),
        message=_s("Message explains the warning."))))

JOB_STATUS = _o(
    "JobStatus is what Nodus observed about a Job.",
    active=_i("Active is the number of indexes with a live attempt."),
    attempts=_o("AttemptCounts counts attempts of one slot.",
                current=_i("Current is the current attempt’s number, from 1."),
                max=_i("Max is recovery.maxAttempts."),
                total=_i("Total is how many attempts have run.")),
    checkpoint=_o("CheckpointStatus is the latest committed checkpoint.",
                  interval=_s("Interval is the cadence in use."),
                  restoredFromSeq=_i("RestoredFromSeq is the checkpoint the current attempt restored."),
                  seq=_i("Seq is the checkpoint sequence number."),
                  size=_i("Size is its size in bytes."),
                  time=_s("Time is when it committed.")),
    completedIndexes=_s("CompletedIndexes lists the succeeded indexes as compressed ranges, for example 0-3,5."),
    completionTime=_s("CompletionTime is when the Job reached a terminal phase."),
    conditions=CONDITIONS,
    cost=COST,
    estimate=ESTIMATE,
    failed=_i("Failed is the number of customer failures (non-zero exits, OOM) across all indexes."),
    fix=_s("Fix is the reason’s documented fix."),
    gang=_o("GangStatus is the current epoch of a gang Job, in offering keys only.",
            epoch=_i("Epoch is the gang epoch."),
            members=_l("Members are the ranks of this epoch.", _o(
                "GangMember is one rank of a gang epoch.",
                attempt=_s("Attempt is the rank’s attempt id."),
                offering=_s("Offering is the rank’s offering key."),
                path=_s("Path is Private, Public, Direct or Relayed."),
                phase=_s("Phase is the rank attempt’s phase."),
                rank=_i("Rank is 0..size-1."),
                regionClass=_s("RegionClass is the rank’s region class."))),
            phase=_s("Phase is Queued, Assembling, Meshing, Starting, Running, Recovering, Stopping, Releasing or Done."),
            probe=_o("GangProbe is a measured network path.",
                     busGbps=_s("BusGbps is the measured all-reduce bus bandwidth."),
                     measuredTime=_s("MeasuredTime is when it was measured."),
                     path=_s("Path is the measured path."),
                     rttMs=_s("RTTMs is the measured round-trip time.")),
            ready=_i("Ready is how many ranks registered, meshed and passed the probe."),
            rendezvous=_s("Rendezvous is rank 0’s advertised address."),
            restarts=_i("Restarts counts gang restarts."),
            size=_i("Size is the number of ranks."),
            started=_i("Started is how many ranks started the command."),
            transport=_s("Transport is the weakest pair’s path: Private, Public, Direct or Relayed.")),
    handledRequests=Map(description="HandledRequests records the last handled *-requested-at annotation per action.",
                        values=_s()),
    image=_o("ImageStatus is the pinned image.",
             digest=_s("Digest is the pinned digest."),
             reference=_s("Reference is the image as written."),
             user=_s("User is the user the image’s config runs its process as (root when it names none). Only an "
                     "image that runs as root is placed on offerings that start the Nodus node agent inside the "
                     "image itself.")),
    inputs=_l("Inputs are the pinned inputs.", _o(
        "InputStatus is a pinned input.",
        name=_s("Name is the input."),
        sha256=_s("SHA256 is the verified digest."),
        volumeRevision=_i("VolumeRevision is the pinned Volume revision."))),
    inputsReadyTime=_s("InputsReadyTime is when declared inputs finished materializing."),
    links=_l("Links are related pages, for example W&B runs.", _o(
        "Link is a related page.", kind=_s("Kind names the link, for example wandb."), url=_s("URL is the page."))),
    message=_s("Message is a scrubbed explanation (at most three log lines for a customer exit)."),
    observedGeneration=_i("ObservedGeneration is the spec generation the status reflects."),
    outputs=_l("Outputs are the committed outputs.", _o(
        "OutputStatus is a committed output.",
        directory=_b("Directory is true when a directory was collected (stored as a tar.zst archive): an output "
                     "input of it is that directory tree."),
        index=_i("Index is the Job index that produced it."),
        name=_s("Name is the declared output."),
        path=_s("Path is where it was collected from."),
        rank=_i("Rank is the gang rank that produced it (fromRanks All)."),
        sha256=_s("SHA256 is the content digest."),
        sink=_o("SinkStatus is the state of one sink load.",
                message=_s("Message explains a failure."),
                phase=_s("Phase is Pending, Loading, Loaded or Failed."),
                rows=_i("Rows is how many rows were loaded.")),
        size=_i("Size is the size in bytes."))),
    phase=_s("Phase is the run-to-completion phase."),
    placement=_o("JobPlacement is where the current attempt runs, in customer terms.",
                 interruptible=_b("Interruptible is true on reclaimable capacity."),
                 offering=_s("Offering is the offering key, for example h100-sxm-80g-x1-us."),
                 rateUSDPerHour=_s("RateUSDPerHour is the frozen customer rate."),
                 regionClass=_s("RegionClass is the region class."),
                 warmReuse=_b("WarmReuse is true when warm capacity was reused.")),
    progress=_o("Progress is what the program reported.",
                metrics=Map(description="Metrics are the latest scalar metrics, as decimal strings.", values=_s()),
                stage=_s("Stage is a domain stage name."),
                units=_o("ProgressUnits counts work units.",
                         completed=_i("Completed is units done."),
                         total=_i("Total is units planned, when known."))),
    reason=_s("Reason says why the Job failed, stopped for good or is suspended."),
    secretVersionIDs=Map(description="SecretVersionIDs identify the pinned versions, which every attempt receives: a "
                                     "Secret deleted and recreated under the same name is a different Secret.",
                         values=_s()),
    secretVersions=Map(description="SecretVersions are pinned at admission; replacements reuse them.", values=_i()),
    sidecarImages=_l("SidecarImages are the pinned images of the sidecars that name their own (a sidecar without "
                     "one runs status.image).", _o(
        "SidecarImageStatus is a sidecar's pinned image.",
        digest=_s("Digest is the pinned digest."),
        name=_s("Name is the sidecar."),
        reference=_s("Reference is the image as written."),
        user=_s("User is the user the image’s config runs its process as (root when it names none)."))),
    source=_o("SourceStatus is the resolved code.",
              blob=_s("Blob is the uploaded blob."),
              commit=_s("Commit is the resolved git commit.")),
    startTime=_s("StartTime is the first Running."),
    stopByTime=_s("StopByTime is the funded edge while Funded is False: a money-driven suspend checkpoints until then "
                  "and stops without the checkpoint once it passes (ADR-086)."),
    storage=_o("StorageStatus is the bytes a Job owns.",
               billedBytes=_i("BilledBytes is the share above the free inclusion."),
               bytes=_i("Bytes is checkpoints plus outputs.")),
    succeeded=_i("Succeeded is the number of indexes that succeeded."),
    suspendFailures=_i("SuspendFailures counts the failed checkpoints of the current customer suspend. After the first "
                       "try and two retries the Job keeps running with SuspendFailed; the count resets when "
                       "spec.state leaves Suspended."),
    suspendedDuration=_s("SuspendedDuration is the time spent Suspended since timeoutStartTime; spec.timeout does not "
                         "count it."),
    timeoutStartTime=_s("TimeoutStartTime is the first Provisioning, where the spec.timeout clock starts."),
    timeoutTime=_s("TimeoutTime is when spec.timeout fires: timeoutStartTime plus the current spec.timeout plus "
                   "suspendedDuration, so an edit to spec.timeout moves it."),
    topology=_o("Topology is the resolved shape of a gang Job; it never changes across epochs.",
                accelerator=_s("Accelerator is the resolved accelerator id."),
                gpusPerNode=_i("GPUsPerNode is the GPUs on each node."),
                network=_s("Network is the locality the gang was placed under."),
                nodes=_i("Nodes is the gang size."),
                resolvedFrom=_s("ResolvedFrom is Nodes or TotalGPUs."),
                totalGPUs=_i("TotalGPUs is nodes × gpusPerNode.")),
    unitMetrics=_o("UnitMetrics summarize per-unit timings.",
                   completed=_i("Completed is units done."),
                   costPerUnitUSD=_s("CostPerUnitUSD is cost divided by units."),
                   p50Ms=_i("P50Ms is the median unit time."),
                   p95Ms=_i("P95Ms is the 95th percentile unit time.")),
    volumes=_l("Volumes are the pinned volume mounts (pinned at admission; replacements reuse them).", _o(
        "VolumeMountStatus is a pinned volume mount.",
        mountPath=_s("MountPath is the mount point."),
        revision=_i("Revision is the pinned Volume revision."),
        sha256=_s("SHA256 is the digest of the revision's archive."),
        volume=_s("Volume is the Volume."))))

__all__ = ["CONDITIONS", "COST", "ESTIMATE", "JOB_STATUS"]
