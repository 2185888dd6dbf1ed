"""NVML telemetry: decoding, and the "no GPU visible" state on a machine without a driver."""

from __future__ import annotations

import pytest

from tilepilot.experiments import BackendUnavailable
from tilepilot.kernels import telemetry


def test_throttle_reasons_decode_to_names() -> None:
    assert telemetry.decode_throttle(0) == ""
    assert telemetry.decode_throttle(0x1 | 0x4 | 0x40) == "gpu_idle,sw_power_cap,hw_thermal_slowdown"


@pytest.mark.skipif(telemetry.nvml_available(), reason="NVML is available here")
def test_without_a_driver_no_gpu_is_visible_and_nothing_crashes() -> None:
    assert telemetry.nvml_available() is False
    assert "NVML" in telemetry.unavailable_reason() or "pynvml" in telemetry.unavailable_reason()
    assert telemetry.sample_all("node-a") == []
    assert telemetry.driver_version() == ""
    assert telemetry.result_telemetry("GPU-0") == telemetry.Telemetry()
    with pytest.raises(BackendUnavailable, match="no GPU visible"):
        telemetry.sample_gpu("GPU-0", "node-a", "w0", "")
