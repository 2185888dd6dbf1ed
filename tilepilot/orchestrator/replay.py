"""Replay: answers from measurements recorded on a real GPU.

A dataset is JSON Lines, one object per measured (problem, config):
`{"kernel", "problem", "config", "status", "median_ms", "device", "torch", "triton",
"recorded_at", ...}` (extra keys allowed; `median_ms` null unless `status` is ok).
A line with a `"baseline"` key instead of a `"config"` is the vendor library's timing of
the problem (e.g. `"baseline": "cuBLAS (torch.matmul)"`), measured in the same run.
The searchable space of a problem is exactly the configs recorded for it, and a proposer
sees a recorded timing only through an evaluation that counts against its budget.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilepilot.experiments import (
    Config,
    DatasetError,
    Environment,
    InputError,
    Problem,
    Result,
    SearchSpace,
    Status,
    Telemetry,
    Timing,
)
from tilepilot.kernels.base import KernelFamily

REQUIRED = ("kernel", "problem", "config", "status", "median_ms", "device", "torch", "triton")
DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "replay"


@dataclass(frozen=True)
class Record:
    problem: Problem
    config: Config
    status: Status
    median_ms: float | None
    p20_ms: float | None
    p80_ms: float | None
    reps: int
    message: str
    env: Environment
    sm_clock_mhz: float | None
    max_rel_err: float | None


class ReplayDataset:
    """The records of one kernel family, indexed by problem and config."""

    def __init__(self, path: Path, kernel: str, records: Sequence[Record], identity: str,
                 baselines: Mapping[Problem, tuple[str, Timing]] | None = None) -> None:
        self.path = path
        self.kernel = kernel
        self.identity = identity  # replaces the kernel version in experiment keys
        self._baselines = dict(baselines or {})
        self._by_problem: dict[Problem, dict[Config, Record]] = {}
        for r in records:
            self._by_problem.setdefault(r.problem, {})[r.config] = r

    @property
    def problems(self) -> list[Problem]:
        return list(self._by_problem)

    @property
    def devices(self) -> list[str]:
        return sorted({r.env.device for recs in self._by_problem.values() for r in recs.values()})

    @property
    def device(self) -> str:
        """The device a campaign on this dataset runs as: its devices, joined by " + "."""
        return " + ".join(self.devices)

    def records(self, problem: Problem) -> dict[Config, Record]:
        try:
            return self._by_problem[problem]
        except KeyError:
            known = "; ".join(p.label() for p in self.problems)
            raise DatasetError(
                f"problem {problem.label()} is not in the dataset {self.path.name} (recorded: {known})"
            ) from None

    def space(self, family: KernelFamily, problem: Problem) -> SearchSpace:
        return family.space().restricted(list(self.records(problem)))

    def baseline(self, problem: Problem) -> tuple[str, Timing] | None:
        return self._baselines.get(problem)

    def optimum_ms(self, problem: Problem) -> float | None:
        times = [r.median_ms for r in self.records(problem).values() if r.median_ms is not None]
        return min(times) if times else None

    def optimum(self, problem: Problem) -> Config:
        """The recorded optimum of a problem: its fastest config, ties going to the first config key."""
        records = self.records(problem)
        timed = [c for c, r in records.items() if r.median_ms is not None]
        if not timed:
            raise DatasetError(f"no config of {problem.label()} was timed in the dataset {self.path.name}, "
                               "so it has no recorded optimum")
        return min(timed, key=lambda c: (records[c].median_ms, c.key()))

    def result(self, problem: Problem, config: Config) -> Result:
        rec = self.records(problem).get(config)
        if rec is None:
            raise DatasetError(f"config {config.label()} was not recorded for {problem.label()}")
        timing = None
        if rec.status is Status.OK and rec.median_ms is not None:
            timing = Timing(
                median_ms=rec.median_ms,
                p20_ms=rec.p20_ms if rec.p20_ms is not None else rec.median_ms,
                p80_ms=rec.p80_ms if rec.p80_ms is not None else rec.median_ms,
                min_ms=rec.p20_ms if rec.p20_ms is not None else rec.median_ms,
                reps=rec.reps,
                l2_flushed=True,
                method="replay",
            )
        return Result(
            problem=problem, config=config, status=rec.status, env=rec.env, timing=timing,
            message=rec.message, max_rel_err=rec.max_rel_err,
            telemetry=Telemetry(sm_clock_mhz=rec.sm_clock_mhz),
            extra={"dataset": self.path.name},
        )

GZIP_MAGIC = b"\x1f\x8b"


def default_dataset(kernel: str) -> Path:
    """The shipped dataset for a kernel family: its grid recorded on the H100, KERNEL-h100.jsonl (or
    .jsonl.gz), where shipped, else the first KERNEL-*.jsonl[.gz] by name (other grids of a family,
    e.g. matmul-h100-fresh.jsonl.gz or matmul-h200.jsonl.gz, are chosen with --dataset)."""
    for own in (DATA_DIR / f"{kernel}-h100.jsonl", DATA_DIR / f"{kernel}-h100.jsonl.gz"):
        if own.is_file():
            return own
    candidates = sorted([*DATA_DIR.glob(f"{kernel}-*.jsonl"), *DATA_DIR.glob(f"{kernel}-*.jsonl.gz")])
    if not candidates:
        shipped = ", ".join(sorted(p.name for p in DATA_DIR.glob("*.jsonl*"))) or "none"
        raise InputError(f"no recorded dataset for kernel {kernel!r} (shipped: {shipped}); pass --dataset FILE")
    return candidates[0]


def load_dataset(path: str | Path, family: KernelFamily) -> ReplayDataset:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"dataset {str(p)!r} does not exist") from None
    except OSError as e:
        raise DatasetError(f"dataset {str(p)!r} cannot be read: {e}") from None
    if raw[:2] == GZIP_MAGIC:  # JSON Lines compressed with gzip (data/replay/*.jsonl.gz)
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise DatasetError(f"dataset {str(p)!r} is not valid gzip: {e}") from None
    records: list[Record] = []
    baselines: dict[Problem, tuple[str, Timing]] = {}
    space = family.space()
    for n, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{p.name}:{n}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise DatasetError(f"{p.name}:{n}: expected a JSON object")
        if obj.get("kernel") != family.name:
            continue  # a dataset may hold several families; take this one's lines
        if "baseline" in obj:
            problem, timing = _baseline(obj, family, f"{p.name}:{n}")
            baselines[problem] = (str(obj["baseline"]), timing)
            continue
        records.append(_record(obj, family, space, f"{p.name}:{n}"))
    if not records:
        raise DatasetError(f"dataset {p.name} has no records for kernel {family.name!r}")
    identity = "replay:" + hashlib.sha256(raw).hexdigest()[:16]
    return ReplayDataset(p, family.name, records, identity, baselines)


def _baseline(obj: Mapping[str, Any], family: KernelFamily, where: str) -> tuple[Problem, Timing]:
    if not isinstance(obj.get("problem"), dict):
        raise DatasetError(f"{where}: problem={obj.get('problem')!r:.80} is not a JSON object")
    try:
        problem = family.parse_problem(obj["problem"])
    except InputError as e:
        raise DatasetError(f"{where}: {e}") from None
    median = _number(obj.get("median_ms"), where, "median_ms")
    if median is None:
        raise DatasetError(f"{where}: a baseline line needs median_ms")
    p20 = _number(obj.get("p20_ms"), where, "p20_ms") or median
    p80 = _number(obj.get("p80_ms"), where, "p80_ms") or median
    return problem, Timing(median, p20, p80, p20, _reps(obj.get("reps"), where), True, "replay")


def _reps(v: object, where: str) -> int:
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 10**9:
        raise DatasetError(f"{where}: reps={v!r:.80} is not a whole number from 0 to 1000000000")
    return v


def _record(obj: Mapping[str, Any], family: KernelFamily, space: SearchSpace, where: str) -> Record:
    missing = [k for k in REQUIRED if k not in obj]
    if missing:
        raise DatasetError(f"{where}: missing key(s) {', '.join(missing)}")
    for key in ("problem", "config"):
        if not isinstance(obj[key], dict):
            raise DatasetError(f"{where}: {key}={obj[key]!r:.80} is not a JSON object")
    try:
        problem = family.parse_problem(obj["problem"])
        config = space.parse(obj["config"])
        status = Status(obj["status"])
    except (InputError, ValueError, TypeError) as e:
        raise DatasetError(f"{where}: {e}") from None
    median = _number(obj.get("median_ms"), where, "median_ms")
    if (status is Status.OK) != (median is not None):
        raise DatasetError(f"{where}: median_ms must be a positive number exactly when status is ok")
    env = Environment(backend="replay", device=str(obj["device"]), torch=str(obj["torch"]),
                      triton=str(obj["triton"]), driver=str(obj.get("driver", "")))
    return Record(
        problem=problem, config=config, status=status, median_ms=median,
        p20_ms=_number(obj.get("p20_ms"), where, "p20_ms"),
        p80_ms=_number(obj.get("p80_ms"), where, "p80_ms"),
        reps=_reps(obj.get("reps"), where), message=str(obj.get("message") or ""), env=env,
        sm_clock_mhz=_number(obj.get("sm_clock_mhz"), where, "sm_clock_mhz"),
        max_rel_err=_number(obj.get("max_rel_err"), where, "max_rel_err", positive=False),
    )


def _number(v: object, where: str, key: str, *, positive: bool = True) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or (positive and v <= 0):
        raise DatasetError(f"{where}: {key}={v!r} is not a {'positive ' if positive else ''}finite number")
    return float(v)
