"""GPUs through NVML (`nvidia-ml-py`, imported as `pynvml`).

Every reading is optional: a counter a GPU does not support (NVML_ERROR_NOT_SUPPORTED, or any other
NVML error) stays at its zero value instead of failing the whole GPU. Without NVML (no library, no
driver, init failing) the host simply has no GPUs, said once in an info line.

Xid errors arrive through an NVML event set; a daemon thread waits on it and keeps the last 64 per
GPU, which every reading carries (`Gpu.xid_events`). Every reading is judged (`gpu_health.judge`):
an unhealthy GPU says why in `unhealthy_reason`/`unhealthy_message`, which placement reads.
"""
from __future__ import annotations

import collections
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp

from nodus.v1 import common_pb2

from .gpu_health import HealthRules, judge
from .settings import SimulatedGpus

log = logging.getLogger("nodus.agent.nvml")

XID_KEEP = 64


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class Nvml:
    """One NVML session for the agent's life."""

    def __init__(self, module: Any = None, rules: HealthRules = HealthRules()) -> None:
        self.rules = rules
        self.nv: Any = None
        self.handles: list[Any] = []
        self.driver_version = ""
        self.cuda_version = ""
        self.xids: dict[int, collections.deque[common_pb2.XidEvent]] = {}
        self.unhealthy = ("", "")
        """(reason, message) every reading carries while the host's GPUs must not be used (`mark_unhealthy`)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            nv = module
            if nv is None:
                import pynvml as nv  # type: ignore[no-redef]
            nv.nvmlInit()
        except Exception as e:  # noqa: BLE001 - no library, no driver, no device: no GPUs
            log.info("NVML unavailable (%s): this host reports no GPUs", e)
            return
        self.nv = nv
        try:
            count = nv.nvmlDeviceGetCount()
            self.handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as e:  # noqa: BLE001
            log.info("NVML could not list GPUs (%s): this host reports no GPUs", e)
            self.handles = []
        self.driver_version = _text(self._try(nv.nvmlSystemGetDriverVersion, default=""))
        cuda = self._try(nv.nvmlSystemGetCudaDriverVersion, default=0)
        if cuda:
            self.cuda_version = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        self.xids = {i: collections.deque(maxlen=XID_KEEP) for i in range(len(self.handles))}

    @property
    def available(self) -> bool:
        return self.nv is not None

    def mark_unhealthy(self, reason: str, message: str) -> None:
        """Every GPU of the host reads unhealthy (a stale CDI spec fails them all), or healthy with ("", "")."""
        if (reason, message) != self.unhealthy:
            if reason:
                log.warning("GPUs unhealthy (%s): %s", reason, message)
            elif self.unhealthy[0]:
                log.info("GPUs healthy again (was %s)", self.unhealthy[0])
        self.unhealthy = (reason, message)

    def _stamp(self, gpus: list[common_pb2.Gpu]) -> list[common_pb2.Gpu]:
        """Each GPU's verdict: the host-wide mark first (a stale CDI spec), else its own readings'."""
        for gpu in gpus:
            gpu.unhealthy_reason, gpu.unhealthy_message = self.unhealthy if self.unhealthy[0] else judge(gpu,
                                                                                                     self.rules)
        return gpus

    def _try(self, fn: Callable[..., Any], *args: Any, default: Any = None) -> Any:
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: leave the field unset
            return default

    def read(self) -> list[common_pb2.Gpu]:
        """Every GPU's identity and current health readings, ordered by index."""
        if self.nv is None:
            return []
        return self._stamp([self._gpu(i, h) for i, h in enumerate(self.handles)])

    def _gpu(self, index: int, h: Any) -> common_pb2.Gpu:
        nv, t = self.nv, self._try
        gpu = common_pb2.Gpu(index=index, name=_text(t(nv.nvmlDeviceGetName, h, default="")),
                             uuid=_text(t(nv.nvmlDeviceGetUUID, h, default="")))
        mem = t(nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            gpu.memory_bytes = int(mem.total)
        corrected, uncorrected = nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        volatile, aggregate = nv.NVML_VOLATILE_ECC, nv.NVML_AGGREGATE_ECC
        gpu.ecc.volatile_corrected = int(t(nv.nvmlDeviceGetTotalEccErrors, h, corrected, volatile, default=0))
        gpu.ecc.volatile_uncorrected = int(t(nv.nvmlDeviceGetTotalEccErrors, h, uncorrected, volatile, default=0))
        gpu.ecc.aggregate_corrected = int(t(nv.nvmlDeviceGetTotalEccErrors, h, corrected, aggregate, default=0))
        gpu.ecc.aggregate_uncorrected = int(t(nv.nvmlDeviceGetTotalEccErrors, h, uncorrected, aggregate, default=0))
        rows = t(nv.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            corr, unc, pending, failure = rows
            gpu.remapped_rows.correctable = int(corr)
            gpu.remapped_rows.uncorrectable = int(unc)
            gpu.remapped_rows.pending = bool(pending)
            gpu.remapped_rows.failure = bool(failure)
        gpu.temperature_c = int(t(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU, default=0))
        milliwatts = t(nv.nvmlDeviceGetPowerUsage, h)
        if milliwatts is not None:
            gpu.power_w = f"{milliwatts / 1000:.1f}"
        gpu.pcie.generation = int(t(nv.nvmlDeviceGetCurrPcieLinkGeneration, h, default=0))
        gpu.pcie.width = int(t(nv.nvmlDeviceGetCurrPcieLinkWidth, h, default=0))
        gpu.pcie.max_generation = int(t(nv.nvmlDeviceGetMaxPcieLinkGeneration, h, default=0))
        gpu.pcie.max_width = int(t(nv.nvmlDeviceGetMaxPcieLinkWidth, h, default=0))
        gpu.nvlink_active_links = self._nvlinks(h)
        with self._lock:
            gpu.xid_events.extend(self.xids.get(index, ()))
        return gpu

    def _nvlinks(self, h: Any) -> int:
        nv = self.nv
        active = 0
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if nv.nvmlDeviceGetNvLinkState(h, link) == nv.NVML_FEATURE_ENABLED:
                    active += 1
            except Exception:  # noqa: BLE001 - past the last link, or no NVLink at all
                break
        return active

    # -- Xid events --------------------------------------------------------------------------------
    def start_xid_watch(self) -> None:
        if self.nv is None or not self.handles or self._thread is not None:
            return
        nv = self.nv
        try:
            event_set = nv.nvmlEventSetCreate()
        except Exception as e:  # noqa: BLE001
            log.info("NVML events unavailable (%s): no Xid reporting", e)
            return
        registered = 0
        for h in self.handles:
            try:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, event_set)
                registered += 1
            except Exception:  # noqa: BLE001 - e.g. not supported on this GPU
                continue
        if not registered:
            self._try(nv.nvmlEventSetFree, event_set)
            return
        self._thread = threading.Thread(target=self._watch, args=(event_set,), name="nvml-xid", daemon=True)
        self._thread.start()

    def _watch(self, event_set: Any) -> None:
        nv = self.nv
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait_v2(event_set, 1000)
            except Exception as e:  # noqa: BLE001
                if getattr(e, "value", None) == getattr(nv, "NVML_ERROR_TIMEOUT", object()):
                    continue
                if self._stop.wait(1.0):
                    break
                continue
            self.record_xid(data)
        self._try(nv.nvmlEventSetFree, event_set)

    def record_xid(self, data: Any) -> None:
        """Files one NVML event (device handle, eventType, eventData = the Xid code) under its GPU."""
        index = next((i for i, h in enumerate(self.handles) if h == data.device), None)
        if index is None:
            index = int(self._try(self.nv.nvmlDeviceGetIndex, data.device, default=-1))
        if index not in self.xids:
            return
        ts = Timestamp()
        ts.FromNanoseconds(time.time_ns())
        event = common_pb2.XidEvent(code=int(data.eventData), time=ts)
        with self._lock:
            self.xids[index].append(event)
        log.warning("GPU %d: Xid %d", index, event.code)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self.nv is not None:
            self._try(self.nv.nvmlShutdown)
            self.nv = None


class SimulatedNvml(Nvml):
    """GPUs that are not there (`--simulate-gpus`), for development and tests: each is reported with
    `simulated` set, so that no listing passes them off as real. NVML is never opened.

    `faults` (`--simulate-gpu-faults FILE`) is a JSON file read at every reading, so a test or an
    operator rehearsing a failure can make a simulated GPU report what a failing one does: an object
    from GPU index to the readings to report, in the proto's JSON names, for example
    `{"1": {"xidEvents": [{"code": 79}], "ecc": {"volatileUncorrected": "2"}, "temperatureC": 95,
    "remappedRows": {"pending": true}}}`. No file reports healthy GPUs; a file that does not parse is
    said at ERROR level and its last good contents stay in force."""

    def __init__(self, spec: SimulatedGpus, rules: HealthRules = HealthRules(), faults: Path | None = None) -> None:
        self.rules = rules
        self.nv = None
        self.spec = spec
        self.faults = faults
        self._faults: dict[int, dict[str, Any]] = {}
        self._faults_seen: tuple[float, int] | None = None
        self.handles = [None] * spec.count  # the runtime counts the host's GPUs by these
        self.driver_version = ""
        self.cuda_version = ""
        self.xids = {}
        self.unhealthy = ("", "")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        log.warning("simulating %d %s GPU(s) of %d bytes each: nothing real backs them", spec.count, spec.model,
                    spec.memory_bytes)
        if faults is not None and faults.exists():
            self._faults = load_faults(faults, spec.count)  # a bad file at start stops the agent (ValueError)

    def _read_faults(self) -> dict[int, dict[str, Any]]:
        if self.faults is None:
            return {}
        try:
            st = self.faults.stat()
        except FileNotFoundError:
            self._faults, self._faults_seen = {}, None
            return {}
        seen = (st.st_mtime, st.st_size)
        if seen != self._faults_seen:
            self._faults_seen = seen
            try:
                self._faults = load_faults(self.faults, self.spec.count)
            except (OSError, ValueError) as e:
                log.error("--simulate-gpu-faults %s: %s; the previous faults stay in force", self.faults, e)
        return self._faults

    def read(self) -> list[common_pb2.Gpu]:
        faults = self._read_faults()
        gpus = []
        for i in range(self.spec.count):
            gpu = common_pb2.Gpu()
            if i in faults:
                json_format.ParseDict(faults[i], gpu)
            gpu.index, gpu.name, gpu.uuid, gpu.simulated = i, self.spec.model, f"GPU-simulated-{i}", True
            gpu.memory_bytes = self.spec.memory_bytes
            gpus.append(gpu)
        return self._stamp(gpus)


def load_faults(path: Path, count: int) -> dict[int, dict[str, Any]]:
    """The simulated readings of `--simulate-gpu-faults FILE`, checked against the Gpu message."""
    try:
        doc = json.loads(path.read_text() or "{}")
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ValueError('must be an object from GPU index to readings, such as {"0": {"temperatureC": 95}}')
    out: dict[int, dict[str, Any]] = {}
    for key, readings in doc.items():
        if not str(key).isdigit() or int(key) >= count:
            raise ValueError(f"{key!r} is not the index of a simulated GPU (0 to {count - 1})")
        if not isinstance(readings, dict):
            raise ValueError(f"GPU {key}: readings must be an object, such as {{\"temperatureC\": 95}}")
        try:
            json_format.ParseDict(readings, common_pb2.Gpu())
        except json_format.ParseError as e:
            raise ValueError(f"GPU {key}: {e}") from e
        out[int(key)] = readings
    return out
