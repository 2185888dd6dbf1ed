"""The steps a worker runs: `compile_config` (CPU process, no CUDA context) and `Evaluator`
(the worker's child process, which owns the CUDA context): verify, then time, several configs
of one problem at a time.

`Evaluator.evaluate` gives one Result per config, in order. For each config: `on_start(i)`;
the space's constraints (`invalid`); compile (GPU: ahead of time, normally a hit in the
on-disk cache; `compile_error`); shared memory against the device limit, or Triton's
OutOfResources at load (`out_of_resources`); verification on every input set of the problem
(inputs and reference made once per problem and cached; the output poisoned with NaN before
each launch; `family.error(problem, out, ref)` against `family.tolerance(problem)`, NaN or inf
never passes: `wrong_result`). Then the verified configs are timed together, interleaved, with
adaptive repetitions under the evaluator's TimingPlan (see timing.py), and NVML is read once right
after (SM clock, power, temperature).

Outclassed (GPU, a plan with `outclass_ratio`, the evaluator's own by default, never `remeasure`):
each verification launch is timed with CUDA events as it runs. A config whose verification launches
took, in the median, at least `outclass_ratio` (2) times the problem's reference time and at least
`outclass_min_ms` is not timed further, like an autotuner that re-benchmarks only the configs near
the best: its Timing is those launches (one per input set, L2 not flushed, stop reason
"outclassed"). The reference is the lower of the best median this evaluator has timed for the
problem (the process runs the kernel code it imported, so the best stays that code's) and the
batch's lowest verification median. Slow configs are where
a grid's GPU time goes (a config 10x off costs 10x per launch); none of them can be a winner.

Cold L2 (a family with `l2_flush`): the timed launches rotate over copies of the problem's data
(the input sets first, then clones of them, each copy with its own output) that together exceed
twice the L2, made once per problem and kept with its inputs; where that many copies would take
more than `cold_cap_bytes` (or half the free GPU memory), L2 is flushed before each launch
instead. A Result's `extra` says which: `cold_copies` (the number of copies) when rotated. It
also carries the family's work model (`work_flops`, `work_bytes`), for roofline percentages.

`max_rel_err` in a Result or a Check is the family's error measure (`KernelFamily.error`:
||out - ref|| / ||ref|| over all outputs unless the family says otherwise), the largest over
the input sets for a verified config, the failing one's for `wrong_result`; inf when the output
had NaN or inf.

A sticky CUDA error raises StickyCudaError(index, message): the caller records `crashed` for
that config and replaces the process. Out of memory (failures.py) is `oom`, whether it comes while
making a problem's inputs (every config of the batch), preparing or verifying one config (that
config) or timing (the configs being timed): the cached problems but the newest are dropped,
cached GPU memory is returned, and the batch goes on in the same process. Triton's
OutOfResources is `out_of_resources`, not `oom`. Any other exception is a bug and raises.

Under the interpreter (backend "interpret": TRITON_INTERPRET=1 is set before any kernel module
is imported; fp16 only, bf16 is refused) kernels launch through the JIT on the CPU and are
timed with perf_counter: CPU timings, method "cpu-wallclock".
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import statistics
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tilepilot.experiments import (
    BackendUnavailable,
    Config,
    DeviceCeilings,
    Environment,
    InputError,
    Problem,
    Result,
    Status,
    Telemetry,
    Timing,
)
from tilepilot.kernels import failures, telemetry
from tilepilot.kernels.base import KernelFamily, Target, poison
from tilepilot.kernels.compile import build_launchers, interpreting
from tilepilot.kernels.registry import get_family
from tilepilot.kernels.timing import (
    METHOD_EVENTS,
    STOP_OUTCLASSED,
    GpuTimer,
    TimingPlan,
    cold_copies_needed,
    summarise,
    time_cpu,
)

log = logging.getLogger(__name__)

BACKENDS = ("gpu", "interpret")
INTERPRETER_DEVICE = "cpu (Triton interpreter)"
INTERPRETER_DTYPES = ("fp16", "fp32")
MAX_CACHED_PROBLEMS = 4
RECHECK_SEED_OFFSET = 1_000_003
CPU_ROUNDS = 3
COLD_CAP_BYTES = 2 * 2**30  # memory for the copies of one problem's data rotated for cold timing
MAX_COLD_COPIES = 512
OUTCLASS_RATIO = 2.0  # see the module docstring

OnStart = Callable[[int], None]


def _noop(i: int) -> None:
    return None


class StickyCudaError(Exception):
    """Config `index` left the CUDA context unusable; the process must exit."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(f"config {index} left the CUDA context unusable: {message}")
        self.index = index
        self.message = message


@dataclass(frozen=True)
class CompileOutcome:
    status: Status  # OK | COMPILE_ERROR | OUT_OF_RESOURCES
    message: str
    compile_ms: float
    shared_bytes: int | None
    launchers_built: int = 0  # C launchers built (or found) in the cache with it: compile.build_launchers


@dataclass(frozen=True)
class Check:
    """A re-check on fresh inputs; `max_rel_err` is the family's error measure (see above)."""

    passed: bool
    max_rel_err: float
    message: str


def compile_config(kernel: str, problem: Problem, config: Config, target: Target, *,
                   launchers: bool = True) -> CompileOutcome:
    """Compile one config into the on-disk Triton cache, in a process with no CUDA context, and
    (with `launchers`) the C launchers its kernels need where this Triton builds one per kernel
    signature, so that the GPU process compiles nothing at all (compile.build_launchers).

    Predicts OUT_OF_RESOURCES from the kernel's shared memory against `target.max_shared_bytes`.
    Raises BackendUnavailable when this process cannot compile for the target at all.
    """
    if interpreting():
        raise BackendUnavailable("compile_config needs a process without TRITON_INTERPRET=1")
    family = get_family(kernel)
    compiled, ms, error = _compile(family, problem, config, target)
    if compiled is None:
        return CompileOutcome(Status.COMPILE_ERROR, error, ms, None)
    shared = int(compiled.metadata.shared)
    if shared > target.max_shared_bytes:
        return CompileOutcome(Status.OUT_OF_RESOURCES, _shared_message(shared, target), ms, shared)
    built = build_launchers(compiled) if launchers else 0
    return CompileOutcome(Status.OK, "", ms, shared, built)


@dataclass
class _ProblemData:
    inputs: list[tuple[Any, ...]]
    refs: list[Any]
    out: Any
    tolerance: float
    copies: list[tuple[tuple[Any, ...], Any]] | None = None  # (inputs, out) rotated cold; [] when too large


@dataclass
class _Verified:
    index: int
    launches: list[Callable[[], None]]
    max_rel_err: float
    compile_ms: float | None
    extra: dict[str, Any] = field(default_factory=dict)
    compiled: Any = None
    verify_ms: list[float] = field(default_factory=list)  # GPU: each verification launch, CUDA events


class Evaluator:
    """Verifies and times configs inside the process that owns the CUDA context (or the CPU,
    under the interpreter). Not thread-safe: one per process."""

    def __init__(self, backend: str, *, input_sets: int = 3, seed: int = 0, rounds: int = 3,
                 block_ms: float = 1.0, spread_target: float = 0.02, time_cap_ms: float = 15.0,
                 cold_cap_bytes: int = COLD_CAP_BYTES, outclass_ratio: float | None = OUTCLASS_RATIO) -> None:
        if backend not in BACKENDS:
            raise InputError(f"unknown backend {backend!r} for the evaluator (allowed: {', '.join(BACKENDS)})")
        if (input_sets < 1 or rounds < 1 or not block_ms > 0 or spread_target < 0 or not time_cap_ms > 0
                or (outclass_ratio is not None and not outclass_ratio > 1)):
            raise InputError(f"bad timing options (input_sets={input_sets}, rounds={rounds}, block_ms={block_ms}, "
                             f"spread_target={spread_target}, time_cap_ms={time_cap_ms}, "
                             f"outclass_ratio={outclass_ratio}): input_sets and rounds at least 1, block_ms and "
                             "time_cap_ms positive, spread_target at least 0, outclass_ratio above 1 or None")
        self.backend = backend
        self.input_sets = input_sets
        self.seed = seed
        self.plan = TimingPlan(rounds=rounds, block_ms=block_ms, spread_target=spread_target,
                               time_cap_ms=time_cap_ms, outclass_ratio=outclass_ratio)
        self.cold_cap_bytes = cold_cap_bytes
        self._problems: OrderedDict[tuple[str, Problem], _ProblemData] = OrderedDict()
        self._best_ms: dict[tuple[str, Problem], float] = {}  # (kernel, problem): best median timed
        self._timer: GpuTimer | None = None
        self._env: Environment | None = None
        self._rechecks = 0
        if backend == "interpret":
            _enter_interpreter()
        else:
            _require_gpu()

    # ---- environment --------------------------------------------------------------------------
    def environment(self) -> Environment:
        if self._env is None:
            import torch
            import triton

            if self.backend == "interpret":
                self._env = Environment("interpret", INTERPRETER_DEVICE, torch.__version__, triton.__version__, "")
            else:
                self._env = Environment("gpu", torch.cuda.get_device_name(0), torch.__version__,
                                        triton.__version__, telemetry.driver_version())
        return self._env

    def target(self) -> Target | None:
        if self.backend == "interpret":
            return None
        import torch

        props = torch.cuda.get_device_properties(0)
        shared = getattr(props, "shared_memory_per_block_optin", None)
        if not shared:
            from triton.runtime import driver

            shared = driver.active.utils.get_device_properties(0)["max_shared_mem"]
        return Target("cuda", props.major * 10 + props.minor, 32, int(shared))

    def gpu_uuid(self) -> str | None:
        if self.backend == "interpret":
            return None
        import torch

        uuid = str(torch.cuda.get_device_properties(0).uuid)
        return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"

    # ---- the steps ------------------------------------------------------------------------------
    def evaluate(self, kernel: str, problem: Problem, configs: Sequence[Config], *,
                 on_start: OnStart = _noop, plan: TimingPlan | None = None) -> list[Result]:
        """One Result per config, in order (see the module docstring). `plan` replaces the
        evaluator's timing plan for this call (its `flush_l2` is always the family's)."""
        return self._run(kernel, problem, configs, plan or self.plan, on_start)

    def remeasure(self, kernel: str, problem: Problem, configs: Sequence[Config], *, rounds: int = 5,
                  on_start: OnStart = _noop) -> list[Result]:
        """Evaluate again, more closely: at least `rounds` interleaved rounds of twice the usual
        block length, half the spread target and four times the time cap."""
        plan = dataclasses.replace(self.plan, rounds=rounds, block_ms=2 * self.plan.block_ms,
                                   spread_target=self.plan.spread_target / 2, time_cap_ms=4 * self.plan.time_cap_ms,
                                   outclass_ratio=None)
        return self._run(kernel, problem, configs, plan, on_start)

    def ceilings(self) -> DeviceCeilings | None:
        """The device's copy bandwidth and matmul rate (see ceilings.py); None under the interpreter."""
        if self.backend == "interpret":
            return None
        from tilepilot.kernels.ceilings import measure_ceilings

        return measure_ceilings()

    def recheck(self, kernel: str, problem: Problem, config: Config) -> Check:
        """Verify one config again on fresh inputs (a seed never used for the cached sets)."""
        family, problem = self._family(kernel, problem)
        self._rechecks += 1
        seed = self.seed + RECHECK_SEED_OFFSET * self._rechecks
        inputs = family.make_inputs(problem, seed, self._device())
        data = _ProblemData([inputs], [family.reference(problem, inputs)],
                            family.make_output(problem, inputs), family.tolerance(problem))
        outcome = self._prepare(0, family, problem, config, data)
        if isinstance(outcome, Result):
            err = outcome.max_rel_err if outcome.max_rel_err is not None else math.nan
            return Check(False, err, f"{outcome.status}: {outcome.message}")
        return Check(True, outcome.max_rel_err, "")

    def baseline(self, kernel: str, problem: Problem) -> Timing | None:
        """The vendor library on the same problem, timed the same way. None under the interpreter
        (no vendor GPU library there) or when the family has no baseline."""
        family, problem = self._family(kernel, problem)
        if self.backend == "interpret":
            return None
        data = self._data(kernel, family, problem)
        copies = self._cold_copies(family, problem, data) if family.l2_flush else []
        pairs = copies or [(inputs, data.out) for inputs in data.inputs]
        launches = [family.baseline(problem, inputs, out) for inputs, out in pairs]
        if any(fn is None for fn in launches):
            return None
        plan = dataclasses.replace(self.plan, flush_l2=family.l2_flush)
        return self._gpu_timer().time([launches], plan, _noop, cold=[bool(copies)])[0]  # type: ignore[list-item]

    # ---- internals ------------------------------------------------------------------------------
    def _run(self, kernel: str, problem: Problem, configs: Sequence[Config], plan: TimingPlan,
             on_start: OnStart) -> list[Result]:
        family, problem = self._family(kernel, problem)
        try:
            data = self._data(kernel, family, problem)
        except Exception as e:
            if failures.launch_failure(e) is not Status.OOM:
                raise
            self._free()
            return [self._failed(problem, c, Status.OOM, f"inputs do not fit: {failures.one_line(e)}")
                    for c in configs]
        outcomes: list[Result | _Verified] = []
        for i, config in enumerate(configs):
            on_start(i)
            outcomes.append(self._prepare(i, family, problem, config, data))
        verified = [o for o in outcomes if isinstance(o, _Verified)]
        plan = dataclasses.replace(plan, flush_l2=family.l2_flush)
        best_key = (kernel, problem)
        outclassed = outclassed_timings(verified, plan, self._best_ms.get(best_key, math.inf))
        try:
            timings, copies = self._time(family, problem, data, [v for v in verified if v.index not in outclassed],
                                         configs, plan, on_start)
        except Exception as e:
            if failures.launch_failure(e) is not Status.OOM:
                raise
            self._free()
            outcomes = [self._failed(problem, configs[o.index], Status.OOM, f"while timing: {failures.one_line(e)}",
                                     max_rel_err=o.max_rel_err, compile_ms=o.compile_ms, extra=o.extra)
                        if isinstance(o, _Verified) and o.index not in outclassed else o for o in outcomes]
            timings, copies = {}, 0
        if timings:
            best = min(t.median_ms for t in timings.values())
            self._best_ms[best_key] = min(best, self._best_ms.get(best_key, math.inf))
        timings = {**timings, **outclassed}
        tele = telemetry.result_telemetry(self.gpu_uuid())
        work = family.work(problem)
        measured = {"work_flops": work.flops, "work_bytes": work.bytes, **({"cold_copies": copies} if copies else {})}
        results = []
        for config, outcome in zip(configs, outcomes, strict=True):
            if isinstance(outcome, Result):  # a never-launched (invalid) config gets no telemetry
                results.append(outcome if outcome.status is Status.INVALID else _with_telemetry(outcome, tele))
            else:
                results.append(Result(problem, config, Status.OK, self.environment(), timings[outcome.index],
                                      max_rel_err=outcome.max_rel_err, compile_ms=outcome.compile_ms,
                                      telemetry=tele, extra={**outcome.extra, **measured}))
        return results

    def _prepare(self, i: int, family: KernelFamily, problem: Problem, config: Config,
                 data: _ProblemData) -> Result | _Verified:
        """Check, compile and verify one config: a failed Result, or the launches to time."""
        reason = family.space().check(config, problem)
        if reason:
            return self._failed(problem, config, Status.INVALID, reason)
        compiled, compile_ms, extra = None, None, {"specialisation": family.specialisation(problem, config)}
        target = self.target()
        if target is not None:
            compiled, compile_ms, error = _compile(family, problem, config, target)
            if compiled is None:
                return self._failed(problem, config, Status.COMPILE_ERROR, error, compile_ms=compile_ms)
            extra["shared_bytes"] = int(compiled.metadata.shared)
            if extra["shared_bytes"] > target.max_shared_bytes:
                return self._failed(problem, config, Status.OUT_OF_RESOURCES,
                                    _shared_message(extra["shared_bytes"], target), compile_ms=compile_ms,
                                    extra=extra)
        errors: list[float] = []
        launch_ms: list[float] = []
        try:
            launches = [family.launcher(problem, config, inputs, data.out, compiled) for inputs in data.inputs]
            for s, fn in enumerate(launches):
                errors.append(self._checked_launch(family, problem, fn, data.out, data.refs[s], launch_ms))
                if not _passes(errors[-1], data.tolerance):
                    return self._failed(problem, config, Status.WRONG_RESULT,
                                        _wrong_message(errors[-1], data.tolerance, s, data.out),
                                        max_rel_err=errors[-1], compile_ms=compile_ms, extra=extra)
        except Exception as e:
            status = self._launch_failure(i, e)
            return self._failed(problem, config, status, failures.one_line(e), compile_ms=compile_ms, extra=extra)
        if compiled is not None:
            extra.update(n_regs=getattr(compiled, "n_regs", None), n_spills=getattr(compiled, "n_spills", None))
        return _Verified(i, launches, max(errors), compile_ms, extra, compiled, launch_ms)

    def _checked_launch(self, family: KernelFamily, problem: Problem, fn: Callable[[], None], out: Any,
                        ref: Any, launch_ms: list[float]) -> float:
        """Poison the output, launch once, and the family's error of the output (inf where the
        family's error is not a finite number). GPU: the launch's time (CUDA events) is appended
        to `launch_ms`."""
        import torch

        poison(out)
        if self.backend == "gpu":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            launch_ms.append(start.elapsed_time(end))
        else:
            fn()
        err = float(family.error(problem, out, ref))
        return err if math.isfinite(err) else math.inf

    def _launch_failure(self, i: int, e: Exception) -> Status:
        """The status of a known launch failure; raises StickyCudaError or the exception itself."""
        if failures.is_sticky(e):
            raise StickyCudaError(i, failures.one_line(e)) from e
        status = failures.launch_failure(e)
        if status is None:
            raise e
        if status is Status.OOM:
            self._free()
        return status

    def _free(self) -> None:
        """Drop cached problems but the newest, and return cached GPU memory to the driver."""
        while len(self._problems) > 1:
            self._problems.popitem(last=False)
        if self.backend == "gpu":
            import torch

            torch.cuda.empty_cache()

    def _time(self, family: KernelFamily, problem: Problem, data: _ProblemData, verified: list[_Verified],
              configs: Sequence[Config], plan: TimingPlan, on_start: OnStart) -> tuple[dict[int, Timing], int]:
        """The timings of the verified configs by index, and the number of copies rotated for
        cold timing (0: none)."""
        if not verified:
            return {}, 0
        current = [0]

        def started(j: int) -> None:
            current[0] = verified[j].index
            on_start(verified[j].index)

        copies: list[tuple[tuple[Any, ...], Any]] = []
        try:
            if self.backend == "interpret":
                timings = time_cpu([v.launches for v in verified], CPU_ROUNDS, started)
            else:
                copies = self._cold_copies(family, problem, data) if plan.flush_l2 else []
                launches = [[family.launcher(problem, configs[v.index], inputs, out, v.compiled)
                             for inputs, out in copies] if copies else v.launches for v in verified]
                timings = self._gpu_timer().time(launches, plan, started, cold=[bool(copies)] * len(verified))
        except RuntimeError as e:
            if failures.is_sticky(e):
                raise StickyCudaError(current[0], failures.one_line(e)) from e
            raise
        return {v.index: t for v, t in zip(verified, timings, strict=True)}, len(copies)

    def _cold_copies(self, family: KernelFamily, problem: Problem,
                     data: _ProblemData) -> list[tuple[tuple[Any, ...], Any]]:
        """The (inputs, out) copies rotated for cold timing, made once per problem (see the module
        docstring); [] when they would not fit."""
        if data.copies is None:
            data.copies = cold_copies(family, problem, data.inputs, data.out, self._gpu_timer().l2_bytes,
                                      self.cold_cap_bytes)
        return data.copies

    def _family(self, kernel: str, problem: Problem) -> tuple[KernelFamily, Problem]:
        family = get_family(kernel)
        problem = family.parse_problem(problem.as_dict())
        dtype = problem.get("dtype")
        if self.backend == "interpret" and dtype is not None and dtype not in INTERPRETER_DTYPES:
            raise BackendUnavailable(f"dtype {dtype} under the Triton interpreter gives wrong numbers silently "
                                     f"(allowed there: {', '.join(INTERPRETER_DTYPES)}); use the gpu backend")
        return family, problem

    def _data(self, kernel: str, family: KernelFamily, problem: Problem) -> _ProblemData:
        key = (kernel, problem)
        data = self._problems.get(key)
        if data is not None:
            self._problems.move_to_end(key)
            return data
        while len(self._problems) >= MAX_CACHED_PROBLEMS:
            self._problems.popitem(last=False)
        inputs = [family.make_inputs(problem, self.seed * 1000 + s, self._device()) for s in range(self.input_sets)]
        refs = [family.reference(problem, x) for x in inputs]
        data = _ProblemData(inputs, refs, family.make_output(problem, inputs[0]), family.tolerance(problem))
        self._problems[key] = data
        return data

    def _device(self) -> str:
        return "cpu" if self.backend == "interpret" else "cuda"

    def _gpu_timer(self) -> GpuTimer:
        if self._timer is None:
            self._timer = GpuTimer()
        return self._timer

    def _failed(self, problem: Problem, config: Config, status: Status, message: str, *,
                max_rel_err: float | None = None, compile_ms: float | None = None,
                extra: dict[str, Any] | None = None) -> Result:
        return Result(problem, config, status, self.environment(), message=message, max_rel_err=max_rel_err,
                      compile_ms=compile_ms, extra=dict(extra or {}))


# ---- module helpers ------------------------------------------------------------------------------
def outclassed_timings(verified: Sequence[_Verified], plan: TimingPlan, best_ms: float) -> dict[int, Timing]:
    """The Timings of the verified configs that need no timing (see the module docstring), by
    index: those whose verification launches took, in the median, at least `plan.outclass_ratio`
    times the lower of `best_ms` and the batch's lowest verification median (and at least
    `plan.outclass_min_ms`). None without `plan.outclass_ratio` or verification times."""
    if plan.outclass_ratio is None:
        return {}
    medians = {v.index: statistics.median(v.verify_ms) for v in verified if v.verify_ms}
    if not medians:
        return {}
    bar = max(plan.outclass_min_ms, plan.outclass_ratio * min(best_ms, *medians.values()))
    return {v.index: summarise(v.verify_ms, l2_flushed=False, method=METHOD_EVENTS, spread_target=plan.spread_target,
                               time_cap_ms=plan.time_cap_ms, stop_reason=STOP_OUTCLASSED, timed_ms=sum(v.verify_ms))
            for v in verified if v.index in medians and medians[v.index] >= bar}


def _compile(family: KernelFamily, problem: Problem, config: Config, target: Target,
             ) -> tuple[Any | None, float, str]:
    t0 = time.perf_counter()
    try:
        compiled = family.compile(problem, config, target)
    except Exception as e:
        kind = failures.compile_failure(e)
        if kind is None:
            raise
        if kind == "no_backend":
            raise BackendUnavailable(f"this Triton cannot compile for {target.backend} sm_{target.arch}: "
                                     f"{failures.one_line(e)}") from None
        return None, (time.perf_counter() - t0) * 1e3, failures.one_line(e)
    return compiled, (time.perf_counter() - t0) * 1e3, ""


def _shared_message(shared: int, target: Target) -> str:
    return f"needs {shared} B of shared memory, more than the {target.max_shared_bytes} B a block can have"


def _wrong_message(err: float, tol: float, input_set: int, out: Any) -> str:
    bad = 0 if math.isfinite(err) else _nonfinite(out)
    if bad:
        return f"output has {bad} NaN or inf element(s) (not written, or computed so) on input set {input_set}"
    return f"relative error {err:.3g} > tolerance {tol:.3g} on input set {input_set}"


def _nonfinite(out: Any) -> int:
    return sum(int((~t.float().isfinite()).sum()) for t in (out if isinstance(out, (tuple, list)) else (out,)))


def _passes(err: float, tol: float) -> bool:
    return math.isfinite(err) and err <= tol


def _tensors(obj: Any) -> list[Any]:
    import torch

    items = obj if isinstance(obj, (tuple, list)) else (obj,)
    return [t for t in items if isinstance(t, torch.Tensor)]


def cold_copies(family: KernelFamily, problem: Problem, input_sets: Sequence[tuple[Any, ...]], out: Any,
                l2_bytes: int, cap_bytes: int = COLD_CAP_BYTES) -> list[tuple[tuple[Any, ...], Any]]:
    """The (inputs, out) copies of a problem's data rotated for cold timing: enough that between two
    uses of one copy the others touched twice the L2 (`cold_copies_needed`); the input sets first
    (the first with `out`), then clones of them, each with an output of its own. [] where the memory
    they add would pass `cap_bytes` or half the free GPU memory, or runs out: the L2 is then flushed
    before each launch instead."""
    import torch

    in_bytes, out_bytes = _nbytes(input_sets[0]), _nbytes(out)
    need = cold_copies_needed(in_bytes + out_bytes, l2_bytes)
    new_bytes = max(0, need - len(input_sets)) * in_bytes + (need - 1) * out_bytes
    free, _ = torch.cuda.mem_get_info()
    if need > MAX_COLD_COPIES or new_bytes > min(cap_bytes, free // 2):
        log.info("%s %s: %d copies (%.0f MB more) for cold timing do not fit; flushing L2 instead",
                 family.name, problem.label(), need, new_bytes / 1e6)
        return []
    try:
        copies = []
        for k in range(need):
            inputs = input_sets[k] if k < len(input_sets) else _clone(input_sets[k % len(input_sets)])
            copies.append((inputs, out if k == 0 else family.make_output(problem, inputs)))
    except torch.cuda.OutOfMemoryError:
        copies = []
        torch.cuda.empty_cache()
    return copies


def _nbytes(obj: Any) -> int:
    """Bytes of the tensors in `obj` (a tensor, or a tuple or list of values)."""
    return sum(t.numel() * t.element_size() for t in _tensors(obj))


def _clone(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """A copy of an input set: its tensors cloned, anything else as it is."""
    import torch

    return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in inputs)


def _with_telemetry(result: Result, tele: Telemetry) -> Result:
    return Result(result.problem, result.config, result.status, result.env, result.timing, result.message,
                  result.max_rel_err, result.compile_ms, tele, result.extra)


def _enter_interpreter() -> None:
    """Set TRITON_INTERPRET=1; refuse if a kernel module was already imported for the GPU."""
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton" not in sys.modules:
        return
    from triton.runtime.jit import JITFunction

    for name, module in list(sys.modules.items()):
        if name.startswith("tilepilot.kernels.") and module is not None and any(
                isinstance(v, JITFunction) for v in vars(module).values()):
            raise BackendUnavailable(f"{name} was imported before TRITON_INTERPRET=1 was set; "
                                     "start the interpreter backend in a fresh process")


def _require_gpu() -> None:
    if interpreting():
        raise BackendUnavailable("TRITON_INTERPRET=1 is set: the gpu backend needs it unset")
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailable("no CUDA GPU visible to torch; use the interpret or replay backend")
