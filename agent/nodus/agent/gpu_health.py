"""Whether a GPU may take new work, judged from its NVML readings (pure: a reading in, a verdict out).

A GPU is unhealthy, and its agent says why in every reading (`Gpu.unhealthy_reason` and
`unhealthy_message`, which placement reads to give it no new work), when:

- it reported an Xid error a program cannot cause (NVIDIA's Kubernetes device plugin makes the same
  cut: 13, 31, 43, 45, 68 and 109 are a program's own faults, such as an illegal address; anything else,
  79 "fallen off the bus" or 48 "double-bit ECC" for instance, is the device's). An Xid stays on the
  GPU until the agent restarts, as the device plugin keeps it until the node is rebooted or reset;
- the driver counted uncorrectable ECC errors since it loaded (volatile, so a reset clears them);
- a row remapping failed (the GPU should not be used again) or waits for a GPU reset;
- it runs at or above `HealthRules.max_temperature_c` (`nodus-agent --gpu-max-temperature`), where the
  GPU slows itself down; it turns healthy again once it cools below.

The first fault in that order names the verdict; a stale CDI spec, which fails every GPU of the host,
is stamped by `Nvml.mark_unhealthy` ahead of all of these.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # kept import-light: settings.py (flag checks before the daemon loads) reads the defaults
    from nodus.v1 import common_pb2

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""Xid codes a program causes (an illegal address, a timeout it ran into, a killed context)."""
DEFAULT_MAX_TEMPERATURE_C = 90
"""Around where data-centre GPUs start to slow themselves down (H100: 87-90 °C)."""


class GpuFault(str, enum.Enum):
    """Why a GPU must not take new work, as `Gpu.unhealthy_reason` carries it."""

    XID_ERROR = "XidError"
    UNCORRECTABLE_ECC = "UncorrectableEccErrors"
    ROW_REMAP_FAILED = "RowRemapFailed"
    ROW_REMAP_PENDING = "RowRemapPending"
    OVERHEATING = "Overheating"


@dataclass(frozen=True, slots=True)
class HealthRules:
    max_temperature_c: int = DEFAULT_MAX_TEMPERATURE_C
    application_xids: frozenset[int] = field(default=APPLICATION_XIDS)


def judge(gpu: common_pb2.Gpu, rules: HealthRules = HealthRules()) -> tuple[str, str]:
    """(reason, message) for an unhealthy GPU, ("", "") for a healthy one."""
    device = [x for x in gpu.xid_events if x.code not in rules.application_xids]
    if device:
        codes = ", ".join(str(c) for c in dict.fromkeys(x.code for x in device))
        last = device[-1]
        when = f" at {last.time.ToJsonString()}" if last.HasField("time") else ""
        return GpuFault.XID_ERROR.value, (f"GPU {gpu.index} reported Xid {codes} (the last{when}); "
                                          "restart the agent after the GPU is reset or replaced")
    ecc = gpu.ecc.volatile_uncorrected
    if ecc > 0:
        return GpuFault.UNCORRECTABLE_ECC.value, (f"GPU {gpu.index} has {ecc} uncorrectable ECC error(s) since "
                                                  "the driver loaded; reset the GPU")
    if gpu.remapped_rows.failure:
        return GpuFault.ROW_REMAP_FAILED.value, f"GPU {gpu.index}: a memory row remapping failed; replace the GPU"
    if gpu.remapped_rows.pending:
        return GpuFault.ROW_REMAP_PENDING.value, (f"GPU {gpu.index}: a memory row remapping waits for a GPU "
                                                  "reset")
    if gpu.temperature_c >= rules.max_temperature_c:
        return GpuFault.OVERHEATING.value, (f"GPU {gpu.index} is at {gpu.temperature_c} °C, at or above the "
                                            f"{rules.max_temperature_c} °C limit (--gpu-max-temperature)")
    return "", ""
