"""Host inventory (psutil) and GPU inventory (NVML), the latter through a fake `pynvml` module."""
from __future__ import annotations

import inspect
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

import psutil
import pytest

from nodus.agent import inventory
from nodus.agent.nvml import Nvml


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


NOT_SUPPORTED, TIMEOUT, DRIVER_NOT_LOADED = 3, 10, 9


def fake_pynvml(gpus: list[dict[str, Any]], fail_init: bool = False) -> types.ModuleType:
    """A stand-in for nvidia-ml-py with the calls the agent makes; a missing key is NOT_SUPPORTED."""
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    consts = dict(NVML_MEMORY_ERROR_TYPE_CORRECTED=0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_VOLATILE_ECC=0,
                  NVML_AGGREGATE_ECC=1, NVML_TEMPERATURE_GPU=0, NVML_FEATURE_ENABLED=1, NVML_NVLINK_MAX_LINKS=36,
                  NVML_ERROR_TIMEOUT=TIMEOUT, NVML_ERROR_NOT_SUPPORTED=NOT_SUPPORTED,
                  NVML_ERROR_DRIVER_NOT_LOADED=DRIVER_NOT_LOADED, nvmlEventTypeXidCriticalError=8)
    for k, v in consts.items():
        setattr(m, k, v)
    events: list[Any] = []
    m.events = events  # type: ignore[attr-defined]
    m.shutdown_called = False  # type: ignore[attr-defined]

    def get(h: int, key: str) -> Any:
        if key not in gpus[h]:
            raise NVMLError(NOT_SUPPORTED)
        return gpus[h][key]

    def init() -> None:
        if fail_init:
            raise NVMLError(DRIVER_NOT_LOADED)

    def shutdown() -> None:
        m.shutdown_called = True  # type: ignore[attr-defined]

    def ecc(h: int, kind: int, counter: int) -> int:
        return get(h, "ecc")[(kind, counter)]

    def nvlink(h: int, link: int) -> int:
        links = get(h, "nvlink")
        if link >= len(links):
            raise NVMLError(NOT_SUPPORTED)
        return links[link]

    def wait(event_set: Any, timeout_ms: int) -> Any:
        if events:
            return events.pop(0)
        time.sleep(min(timeout_ms, 20) / 1000)
        raise NVMLError(TIMEOUT)

    m.__dict__.update(
        nvmlInit=init, nvmlShutdown=shutdown, nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlSystemGetDriverVersion=lambda: b"550.54.15", nvmlSystemGetCudaDriverVersion=lambda: 12040,
        nvmlDeviceGetName=lambda h: get(h, "name"), nvmlDeviceGetUUID=lambda h: get(h, "uuid"),
        nvmlDeviceGetMemoryInfo=lambda h, version=None: types.SimpleNamespace(total=get(h, "memory"), free=0, used=0),
        nvmlDeviceGetTotalEccErrors=ecc, nvmlDeviceGetRemappedRows=lambda h: get(h, "remapped"),
        nvmlDeviceGetTemperature=lambda h, sensor: get(h, "temp"),
        nvmlDeviceGetPowerUsage=lambda h: get(h, "power_mw"),
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: get(h, "pcie")[0],
        nvmlDeviceGetCurrPcieLinkWidth=lambda h: get(h, "pcie")[1],
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: get(h, "pcie")[2],
        nvmlDeviceGetMaxPcieLinkWidth=lambda h: get(h, "pcie")[3],
        nvmlDeviceGetNvLinkState=nvlink, nvmlEventSetCreate=lambda: "event-set",
        nvmlDeviceRegisterEvents=lambda h, kinds, s: None, nvmlEventSetWait_v2=wait,
        nvmlEventSetFree=lambda s: None, nvmlDeviceGetIndex=lambda h: h)
    return m


H100 = {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0f6b5a7e-1111-2222-3333-444455556666",
        "memory": 85_520_809_984, "ecc": {(0, 0): 3, (1, 0): 0, (0, 1): 12, (1, 1): 1},
        "remapped": (2, 1, 0, 1), "temp": 41, "power_mw": 71_345, "pcie": (5, 16, 5, 16), "nvlink": [1] * 18}
# An older, PCIe card: no row remapping, no NVLink, a degraded link, name as bytes (old bindings).
A10 = {"name": b"NVIDIA A10", "uuid": b"GPU-a10", "memory": 24_146_608_128, "ecc": {(0, 0): 0, (1, 0): 0, (0, 1): 0,
       (1, 1): 0}, "temp": 35, "power_mw": 15_000, "pcie": (3, 8, 4, 16)}


def _shape(fn: Any) -> list[tuple[Any, bool]]:
    """How a function can be called: each parameter's kind and whether it has a default."""
    return [(p.kind, p.default is not p.empty) for p in inspect.signature(fn).parameters.values()]


def test_the_fake_holds_to_the_installed_nvidia_ml_py() -> None:
    """The fake's names, constants and call shapes are the real binding's (it drifted: 18 NVLinks
    where nvidia-ml-py has 36, a GetMemoryInfo without its version argument)."""
    import pynvml as real

    fake = fake_pynvml([H100])
    names = [n for n in vars(fake) if n.startswith(("nvml", "NVML"))]
    assert len(names) > 30
    for name in names:
        assert hasattr(real, name), f"pynvml has no {name}"
        ours, theirs = getattr(fake, name), getattr(real, name)
        if callable(theirs):
            assert _shape(ours) == _shape(theirs), (name, inspect.signature(ours), inspect.signature(theirs))
        else:
            assert ours == theirs, (name, ours, theirs)
    memory_fields = {f[0] for f in real.c_nvmlMemory_t._fields_}
    assert {"total", "free", "used"} <= memory_fields
    assert issubclass(real.NVMLError, Exception) and real.NVMLError(NOT_SUPPORTED).value == NOT_SUPPORTED


def test_nvml_fields_map_onto_the_gpu_message() -> None:
    nvml = Nvml(fake_pynvml([H100, A10]))
    assert nvml.available and nvml.driver_version == "550.54.15" and nvml.cuda_version == "12.4"
    h100, a10 = nvml.read()
    assert (h100.index, h100.name, h100.uuid, h100.memory_bytes) == (0, H100["name"], H100["uuid"], H100["memory"])
    assert (h100.ecc.volatile_corrected, h100.ecc.volatile_uncorrected, h100.ecc.aggregate_corrected,
            h100.ecc.aggregate_uncorrected) == (3, 0, 12, 1)
    r = h100.remapped_rows
    assert (r.correctable, r.uncorrectable, r.pending, r.failure) == (2, 1, False, True)
    assert h100.temperature_c == 41 and h100.power_w == "71.3"
    assert (h100.pcie.generation, h100.pcie.width, h100.pcie.max_generation, h100.pcie.max_width) == (5, 16, 5, 16)
    assert h100.nvlink_active_links == 18
    assert (a10.index, a10.name, a10.uuid) == (1, "NVIDIA A10", "GPU-a10")
    assert not a10.HasField("remapped_rows") or a10.remapped_rows.correctable == 0
    assert a10.nvlink_active_links == 0
    assert (a10.pcie.generation, a10.pcie.width, a10.pcie.max_generation, a10.pcie.max_width) == (3, 8, 4, 16)
    nvml.close()


def test_xid_events_are_collected_per_gpu() -> None:
    module = fake_pynvml([H100, A10])
    nvml = Nvml(module)
    nvml.start_xid_watch()
    module.events.append(types.SimpleNamespace(device=1, eventType=8, eventData=79))
    module.events.append(types.SimpleNamespace(device=1, eventType=8, eventData=48))
    deadline = time.monotonic() + 5
    while len(nvml.read()[1].xid_events) < 2:
        assert time.monotonic() < deadline, "Xid events never arrived"
        time.sleep(0.02)
    h100, a10 = nvml.read()
    assert [x.code for x in a10.xid_events] == [79, 48] and not h100.xid_events
    assert a10.xid_events[0].time.seconds > 0
    nvml.close()
    assert module.shutdown_called


def test_without_nvml_the_host_has_no_gpus_and_says_so_once(monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([H100], fail_init=True))
    with caplog.at_level("INFO", logger="nodus.agent.nvml"):
        nvml = Nvml()
    assert not nvml.available and nvml.read() == [] and nvml.handles == []
    assert [r.levelname for r in caplog.records] == ["INFO"] and "no GPUs" in caplog.records[0].message
    monkeypatch.setitem(sys.modules, "pynvml", None)  # the library is not installed at all
    assert Nvml().read() == []


def test_the_agent_imports_pynvml_by_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([H100]))
    nvml = Nvml()
    inv = inventory.node_inventory(tmp_path, nvml, runtimes=[1], region="us", offering="h100-x1",
                                   labels={"a": "b"}, advertise_address="10.0.0.5", interruptible=True)
    assert [g.uuid for g in inv.gpus] == [H100["uuid"]]
    assert inv.host.driver_version == "550.54.15" and inv.host.cuda_version == "12.4"
    assert (inv.region_class, inv.offering, dict(inv.labels), inv.advertise_address, inv.interruptible) == (
        "us", "h100-x1", {"a": "b"}, "10.0.0.5", True)
    nvml.close()


def test_host_numbers_are_sane(tmp_path: Path) -> None:
    nvml = Nvml(fake_pynvml([], fail_init=True))
    host = inventory.host(tmp_path, nvml)
    assert host.cpus == (psutil.cpu_count() or 1) and host.cpus == os.cpu_count()
    assert host.memory_bytes == psutil.virtual_memory().total > 256 << 20
    st = os.statvfs(tmp_path)
    assert host.disk_bytes == st.f_blocks * st.f_frsize
    assert 0 < inventory.disk_free(tmp_path) <= host.disk_bytes
    assert host.driver_version == "" and host.cuda_version == ""


def test_labels_parse_from_flags_and_config() -> None:
    assert inventory.parse_labels("zone=a, tier=gold,") == {"zone": "a", "tier": "gold"}
    assert inventory.parse_labels({"zone": "b", "n": 3}) == {"zone": "b", "n": "3"}
    assert inventory.parse_labels(None) == {}
    with pytest.raises(ValueError, match="not key=value"):
        inventory.parse_labels("zone")
