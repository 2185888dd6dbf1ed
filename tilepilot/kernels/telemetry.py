"""NVML readings through pynvml (nvidia-ml-py).

NVML ignores CUDA_VISIBLE_DEVICES: a GPU is found by its UUID ("GPU-..."). Without a driver
`nvml_available()` is False ("no GPU visible"): `sample_all` returns [] and `sample_gpu` raises
BackendUnavailable, never anything else. NVML is initialised once per process.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from tilepilot.experiments import BackendUnavailable, GpuSample, Telemetry

log = logging.getLogger(__name__)

# Clock-event ("throttle") reason bits, as nvml.h defines them.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

_lock = threading.Lock()
_state: dict[str, Any] = {"init": None, "error": ""}  # init: None = not tried, True/False after


def nvml_available() -> bool:
    """True when NVML could be initialised (a driver is present)."""
    return _init()


def unavailable_reason() -> str:
    """Why NVML is not available ("" when it is)."""
    _init()
    return str(_state["error"])


def decode_throttle(mask: int) -> str:
    """Active clock-throttle reasons, comma-separated; "" when none."""
    return ",".join(name for bit, name in THROTTLE_REASONS if mask & bit)


def driver_version() -> str:
    if not _init():
        return ""
    import pynvml

    v = pynvml.nvmlSystemGetDriverVersion()
    return v.decode() if isinstance(v, bytes) else str(v)


def sample_gpu(uuid: str, node: str, worker: str = "", running: str = "") -> GpuSample:
    """One reading of the GPU with this UUID. Raises BackendUnavailable without NVML or GPU."""
    import pynvml

    if not _init():
        raise BackendUnavailable(f"no GPU visible: {_state['error']}")
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except pynvml.NVMLError as e:
        raise BackendUnavailable(f"GPU {uuid!r} is not visible to NVML: {e}") from None
    return _read(handle, pynvml.nvmlDeviceGetIndex(handle), uuid, node, worker, running)


def sample_all(node: str) -> list[GpuSample]:
    """One reading of every GPU of this node; [] when no GPU is visible."""
    import pynvml

    if not _init():
        return []
    samples = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        samples.append(_read(handle, index, _text(pynvml.nvmlDeviceGetUUID(handle)), node, "", ""))
    return samples


def result_telemetry(uuid: str | None) -> Telemetry:
    """SM clock, power and temperature of one GPU for a Result; empty without NVML."""
    if uuid is None or not _init():
        return Telemetry()
    s = sample_gpu(uuid, "")
    return Telemetry(sm_clock_mhz=s.sm_clock_mhz, power_w=s.power_w, temp_c=s.temp_c)


def _read(handle: Any, index: int, uuid: str, node: str, worker: str, running: str) -> GpuSample:
    import pynvml

    util = pynvml.nvmlDeviceGetUtilizationRates(handle)
    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return GpuSample(
        ts=time.time(), node=node, uuid=uuid, index=index,
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        util_pct=float(util.gpu),
        mem_used_mb=mem.used / 2**20, mem_total_mb=mem.total / 2**20,
        sm_clock_mhz=float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
        power_w=pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
        temp_c=float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
        throttle=decode_throttle(_throttle_mask(handle)),
        worker=worker, running=running,
    )


def _throttle_mask(handle: Any) -> int:
    import pynvml

    get = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    try:
        return int(get(handle))
    except pynvml.NVMLError_NotSupported:
        return 0


def _init() -> bool:
    with _lock:
        if _state["init"] is None:
            _state["init"], _state["error"] = _try_init()
            if not _state["init"]:
                log.info("no GPU visible: %s", _state["error"])
        return bool(_state["init"])


def _try_init() -> tuple[bool, str]:
    try:
        import pynvml
    except ImportError as e:
        return False, f"pynvml is not installed ({e})"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:  # no library, no driver, no permission: "no GPU visible"
        return False, f"NVML unavailable ({type(e).__name__}: {e})"
    return True, ""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
