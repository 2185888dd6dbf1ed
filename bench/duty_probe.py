"""Does leaving the GPU idle between samples steady the clock, and with it re-measurements?

A compute-bound kernel timed back to back draws the H100 to its power limit, and its SM clock
then wanders (1575-1980 MHz seen in bench/remeasure_probe.py), so five re-measurements of a
2048³ bf16 winner spread 6-10%. Here the same configs are re-measured five times at each duty
(the share of GPU time spent in the timed kernels, `TimingPlan.duty`: after each sample a spin
of (1/duty - 1) times its length, outside the events), the duties interleaved series by series
so that heat hits them alike, after 6 s of back-to-back evaluations. A thread reads NVML every
10 ms meanwhile: each series gets its SM clock's range and mean, its mean power and the share
of readings with each clock-event reason.

    python bench/duty_probe.py $OUT/duty-probe.json

Needs a CUDA GPU. A probe, not a campaign.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tilepilot.experiments import Config, Problem
from tilepilot.kernels import telemetry
from tilepilot.kernels.evaluate import Evaluator

REMEASURES = 5
DUTIES = (1.0, 0.5, 0.25)
HEAT_S = 6.0


def tile(bm: int, bn: int, bk: int, warps: int, stages: int) -> Config:
    return Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 8,
                      "num_warps": warps, "num_stages": stages})


CASES = {
    "2048": (Problem.of({"M": 2048, "N": 2048, "K": 2048, "dtype": "bf16"}),
             [tile(256, 128, 64, 8, 4), tile(128, 128, 32, 4, 5)]),
    "4096": (Problem.of({"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"}), [tile(256, 128, 64, 8, 4)]),
    "m16": (Problem.of({"M": 16, "N": 4096, "K": 4096, "dtype": "bf16"}), [tile(64, 64, 128, 8, 5)]),
}


class Sampler:
    """NVML readings every 10 ms in a thread: (time, SM MHz, W, clock-event mask)."""

    def __init__(self) -> None:
        import pynvml

        telemetry.nvml_available()
        self._nvml = pynvml
        self._h = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.readings: list[tuple[float, int, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n, h = self._nvml, self._h
        while not self._stop.is_set():
            self.readings.append((time.monotonic(), n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
                                  n.nvmlDeviceGetPowerUsage(h) / 1e3, n.nvmlDeviceGetCurrentClocksThrottleReasons(h)))
            time.sleep(0.01)

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        rs = [r for r in self.readings if t0 <= r[0] <= t1]
        if not rs:
            return {}
        reasons: dict[str, float] = {}
        for bit, name in telemetry.THROTTLE_REASONS:
            share = sum(1 for r in rs if r[3] & bit) / len(rs)
            if share:
                reasons[name] = round(share, 2)
        mhz = [r[1] for r in rs]
        return {"n": len(rs), "mhz_min": min(mhz), "mhz_max": max(mhz), "mhz_mean": round(statistics.fmean(mhz)),
                "w_mean": round(statistics.fmean(r[2] for r in rs)), "reasons": reasons}

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def main() -> int:
    import torch

    sampler = Sampler()
    ev = Evaluator("gpu")
    base = ev.plan
    out: dict[str, Any] = {"what": __doc__.splitlines()[0], "device": torch.cuda.get_device_name(0),
                           "command": " ".join(["python", *sys.argv]),
                           "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                           "torch": torch.__version__, "driver": telemetry.driver_version(), "cases": {}}
    import triton

    out["triton"] = triton.__version__
    for name, (problem, configs) in CASES.items():
        ev.plan = base
        ev.evaluate("matmul", problem, configs)
        t0 = time.monotonic()
        while time.monotonic() - t0 < HEAT_S:
            ev.evaluate("matmul", problem, configs)
        out["cases"][name] = {"heat": sampler.window(t0, time.monotonic())}
        arms: dict[float, dict[str, Any]] = {d: {"medians": [[] for _ in configs], "nvml": [], "timed_ms": [],
                                                  "wall_s": []} for d in DUTIES}
        for _ in range(REMEASURES):
            for d in DUTIES:
                ev.plan = dataclasses.replace(base, duty=d)
                t1 = time.monotonic()
                results = ev.remeasure("matmul", problem, configs)
                t2 = time.monotonic()
                for k, r in enumerate(results):
                    assert r.timing is not None, r.message
                    arms[d]["medians"][k].append(r.timing.median_ms)
                arms[d]["timed_ms"].append(round(sum(r.timing.timed_ms or 0 for r in results if r.timing), 1))
                arms[d]["wall_s"].append(round(t2 - t1, 3))
                arms[d]["nvml"].append(sampler.window(t1, t2))
        for d, a in arms.items():
            a["spreads"] = [round((max(m) - min(m)) / statistics.median(m), 4) for m in a["medians"]]
            a["median_of_medians_ms"] = [round(statistics.median(m), 5) for m in a["medians"]]
            print(f"{name:5} duty {d:4}: spreads {a['spreads']} medians {a['median_of_medians_ms']} "
                  f"MHz {[w.get('mhz_min') for w in a['nvml']]}-{[w.get('mhz_max') for w in a['nvml']]} "
                  f"W {[w.get('w_mean') for w in a['nvml']]} reasons {[w.get('reasons') for w in a['nvml']][:2]}",
                  flush=True)
        out["cases"][name]["arms"] = {str(d): a for d, a in arms.items()}
    sampler.close()
    Path(sys.argv[1]).write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
