"""Each family's tuned config against its baselines, timed side by side in one run on one GPU.

    python bench/kernels.py --out bench/results/kernels-h100.json [--families matmul,softmax,...]
        [--time-budget-s 540] [--workers 14] [--cold-l2 copies|flush]

Per problem of the family's shape set (bench/record.ISSUE_SHAPES; matmul: the recorded problems),
these arms are timed together, interleaved (A B C, B C A, ...), by the same GPU timer the
campaigns use (tilepilot.kernels.timing: CUDA events, or CUDA-graph replay for short kernels;
L2 cold or warm as the family says; rounds until a 1% spread or a 100 ms cap per arm):
- `tuned`: the winner among the FINALISTS fastest configs of each recorded full grid of the family for
  that problem (data/replay/FAMILY-h100.jsonl), and the fastest of each kernel variant there,
  when the grid was recorded; for matmul among the
  fastest over all shipped matmul datasets (the tutorial grid and the kernel variants' grids: the
  best variant), each config's median taken relative to the baseline recorded in the same dataset.
  As a campaign declares its winner, the finalists are first re-measured together, interleaved, in
  this run (their times are in the row's `finalists`); the fastest is then timed afresh with the
  other arms, so its reported time is not the minimum of the measurements that chose it;
- matmul `tuned-grouped`: the fastest config of the tutorial grid alone (data/replay/matmul-h100.jsonl.gz,
  the plain grouped kernel), when the best variant is another config;
- `default`: the config the family uses untuned (`default_config`);
- `baseline`: the family's own baseline (`baseline_name`: cuBLAS for matmul, PyTorch's SDPA for
  attention, eager PyTorch for the others);
- `torch.compile`: the baseline's PyTorch code through torch.compile (softmax, the norms and
  the fp8 quantiser; attention's baseline is already a fused kernel and fused_moe's a Python
  loop over experts, so they have none);
- matmul `tutorial`: the best of the configs in Triton's matmul tutorial autotune list, i.e.
  what `@triton.autotune` over that list would pick;
- silu_mul_fp8_quant `vllm-fallback`: the launch settings of vLLM's Triton fallback (one group
  of 128 per program, one row, one warp).
Every arm's output is checked against the family's reference before it is timed; an arm that
fails the check is reported and not timed.

A family timed with a cold L2 (matmul, fused_moe) gets it as `--cold-l2` says. `copies` (the
default): each config and baseline arm rotates over copies of the problem's data, enough that
the others touched twice the L2 between two uses of one copy, as the campaigns' evaluator times
every config (and as the shipped datasets were recorded); where the copies would not fit, the L2
is flushed. `flush`: a buffer twice the L2 is zeroed before each launch, as Triton's do_bench
does (and as this script timed every run before 2026-11-28): the L2 is then full of dirty lines,
which the timed kernel writes back to HBM as it brings its own data in
(bench/results/evict-probe-h100.json: 1×4096×4096 takes cuBLAS 21.2 µs after the zeroing flush and
17.4 µs after a flush that only reads). Each arm's `cold_l2` says which it got.

The device ceilings (copy bandwidth, cuBLAS bf16 rate) are measured at the start of the run
(tilepilot.kernels.ceilings), so each time also reads as a percentage of them. Rows are written
as they finish; running the command again skips the problems already in --out (a run cut by
--time-budget-s resumes).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import multiprocessing as mp
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import record  # noqa: E402

from tilepilot.experiments import Config, Problem  # noqa: E402
from tilepilot.kernels.base import poison, written  # noqa: E402

log = logging.getLogger("kernels")
FAMILIES = ("matmul", "softmax", "rmsnorm", "layernorm", "silu_mul_fp8_quant", "fused_moe", "attention")
COMPILED_BASELINE = ("softmax", "rmsnorm", "layernorm", "silu_mul_fp8_quant")
TUTORIAL = [  # Triton's matmul tutorial (03-matrix-multiplication.py), get_cuda_autotune_config, fp16 list
    (128, 256, 64, 8, 8, 3), (64, 256, 32, 8, 4, 4), (128, 128, 32, 8, 4, 4), (128, 64, 32, 8, 4, 4),
    (64, 128, 32, 8, 4, 4), (128, 32, 32, 8, 4, 4), (64, 32, 32, 8, 2, 5), (32, 64, 32, 8, 2, 5)]
FINALISTS = 2  # the fastest recorded configs of each dataset, re-measured before the tuned arm is chosen
VLLM_FALLBACK = {"GROUPS_PER_PROGRAM": 1, "ROWS_PER_PROGRAM": 1, "num_warps": 1, "num_stages": 1}


def tutorial_configs() -> list[Config]:
    names = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
    return [Config.of(dict(zip(names, v, strict=True))) for v in TUTORIAL]


def shapes(kernel: str) -> list[Problem]:
    return record.problems_for(kernel, "all" if kernel == "matmul" else "issue")


def datasets(kernel: str) -> list[Path]:
    """The shipped datasets the tuned arm picks from: matmul's all (the tutorial grid and the
    variants' grids), another family's `default_dataset`."""
    from tilepilot.experiments import InputError
    from tilepilot.orchestrator.replay import DATA_DIR, default_dataset

    if kernel == "matmul":
        return sorted([*DATA_DIR.glob("matmul-*.jsonl"), *DATA_DIR.glob("matmul-*.jsonl.gz")])
    try:
        return [default_dataset(kernel)]
    except InputError:
        return []


def tuned_configs(kernel: str, paths: list[Path] | None = None) -> dict[str, Config]:
    """Problem key -> the fastest config recorded for it over the datasets (`datasets(kernel)`)."""
    return {key: cs[0] for key, cs in tuned_finalists(kernel, paths).items()}


def tuned_finalists(kernel: str, paths: list[Path] | None = None,
                    per_dataset: int = FINALISTS) -> dict[str, list[Config]]:
    """Problem key -> the `per_dataset` fastest configs of each dataset that holds the problem
    (`datasets(kernel)`), and the fastest of each kernel variant (`VARIANT`) there, distinct,
    fastest first: the first is the fastest recorded config. Each variant sends its best because
    what a recording says of one variant against another can go stale when a kernel changes (the
    tma variants' recorded times predate their host-made descriptors, which took ~2.3 us off
    every launch): the re-measurement decides.

    Datasets recorded in different runs (other timing settings, another day) are compared through
    their own baseline: a config's median over the baseline's median of the same dataset, where
    every dataset holding the problem has a baseline line for it; the raw median otherwise. A
    baseline timed slow in one recording flatters that dataset's configs, so each dataset sends
    its own fastest, and the re-measurement decides (`pick_finalist`)."""
    from tilepilot.kernels import get_family
    from tilepilot.orchestrator.replay import load_dataset

    found: dict[str, list[tuple[float, float | None, Config]]] = {}
    for path in datasets(kernel) if paths is None else paths:
        ds = load_dataset(path, get_family(kernel))
        for p in ds.problems:
            base = ds.baseline(p)
            rows = sorted(((r.median_ms, c) for c, r in ds.records(p).items() if r.median_ms is not None),
                          key=lambda x: (x[0], x[1].key()))
            variants = {}
            for ms, c in rows:
                variants.setdefault(c.as_dict().get("VARIANT"), (ms, c))
            chosen = dict.fromkeys([*rows[:per_dataset], *variants.values()])
            found.setdefault(p.key(), []).extend((ms, base[1].median_ms if base else None, c) for ms, c in chosen)
    out = {}
    for key, rows in found.items():
        relative = all(b is not None for _, b, _ in rows)
        ranked = sorted(rows, key=lambda x: (x[0] / x[1] if relative and x[1] else x[0], x[2].key()))
        out[key] = list(dict.fromkeys(c for _, _, c in ranked))
    return out


def pick_finalist(family: Any, problem: Problem, finalists: list[Config], timer: Any,
                  target: Any, cold_l2: str = "flush") -> tuple[Config | None, list[dict[str, Any]]]:
    """The fastest of the finalists, timed together as bench_problem times its arms, and each
    one's time (or why it did not run)."""
    if len(finalists) < 2:
        return (finalists[0] if finalists else None), []
    arms = Arms(family, problem, target, cold_l2=cold_l2, l2_bytes=getattr(timer, "l2_bytes", 0))
    for i, c in enumerate(finalists):
        arms.config(f"finalist-{i}", c)
    timings = arms.time(timer, family.l2_flush)
    notes = [{**arms.notes[f"finalist-{i}"], "median_ms": _sig(timings[f"finalist-{i}"].median_ms)
              if f"finalist-{i}" in timings else None} for i in range(len(finalists))]
    if not timings:
        return finalists[0], notes
    best = min(timings, key=lambda n: timings[n].median_ms)
    return finalists[int(best.removeprefix("finalist-"))], notes


def arm_plan(flush_l2: bool) -> Any:
    """How every arm here is timed: at least 5 interleaved rounds of 2 ms of GPU time, then rounds
    until a 1% spread or 100 ms of GPU time per arm."""
    from tilepilot.kernels.timing import TimingPlan

    return TimingPlan(rounds=5, block_ms=2.0, flush_l2=flush_l2, spread_target=0.01, time_cap_ms=100.0)


COLD_L2 = ("copies", "flush")  # --cold-l2: how a family timed cold gets a cold L2


class Arms:
    """Named launch closures for one problem, each checked against the reference.

    `cold_l2` ("copies" or "flush") says how a family timed cold (`l2_flush`) gets a cold L2:
    "copies" rotates each config and baseline arm over copies of the data made as a campaign's
    evaluator makes them (tilepilot.kernels.evaluate.cold_copies), so consecutive launches read data
    no recent launch touched and the L2 holds the other copies' lines; "flush" zeroes a buffer twice
    the L2 before each launch (as Triton's do_bench does), which leaves the L2 full of dirty lines
    that the timed kernel writes back as it reads. Arms added with `add` (a probe's own launches) are
    flushed either way.
    """

    def __init__(self, family: Any, problem: Problem, target: Any, device: str = "cuda",
                 cold_l2: str = "flush", l2_bytes: int = 0) -> None:
        if cold_l2 not in COLD_L2:
            raise ValueError(f"cold_l2 must be one of {', '.join(COLD_L2)}, not {cold_l2!r}")
        self.family, self.problem, self.target, self.device = family, problem, target, device
        self.inputs = family.make_inputs(problem, 0, device)
        self.ref = family.reference(problem, self.inputs)
        self.launches: dict[str, Callable[[], None]] = {}
        self.notes: dict[str, dict[str, Any]] = {}
        self.copies: list[tuple[tuple[Any, ...], Any]] = []  # (inputs, out) rotated for a cold L2
        if cold_l2 == "copies" and family.l2_flush and device == "cuda":
            from tilepilot.kernels.evaluate import cold_copies

            self.copies = cold_copies(family, problem, [self.inputs], family.make_output(problem, self.inputs),
                                      l2_bytes)
        self.rotated: dict[str, list[Callable[[], None]]] = {}  # arm -> its launch on each copy

    def add(self, arm: str, make: Callable[[Any], Callable[[], None]], **note: Any) -> None:
        import torch

        out = self.family.make_output(self.problem, self.inputs)
        try:
            fn = make(out)
            poison(out)
            got = fn()
            if self.device == "cuda":
                torch.cuda.synchronize()
            # a baseline that returns its result instead of writing `out` is checked on what it returned
            err = self.family.error(self.problem, out if got is None or written(out) else got, self.ref)
        except Exception as e:  # an arm that cannot run is reported, the others go on
            self.notes[arm] = {**note, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            log.warning("%s %s: %s", self.problem.label(), arm, self.notes[arm]["error"])
            return
        tol = self.family.tolerance(self.problem)
        self.notes[arm] = {**note, "max_rel_err": _sig(err), "tolerance": tol}
        if not err <= tol:
            self.notes[arm]["error"] = f"wrong result: error {err:.3g} over tolerance {tol:.3g}"
            return
        self.launches[arm] = fn

    def _rotate(self, arm: str, launch: Callable[[tuple[Any, ...], Any], Callable[[], None]]) -> None:
        """With copies, `arm` (checked) launches on each copy in turn when timed."""
        if self.copies and arm in self.launches:
            self.rotated[arm] = [launch(inputs, out) for inputs, out in self.copies]

    def baseline(self, arm: str, /, **note: Any) -> None:
        """The family's baseline (cuBLAS for matmul) as the arm `arm`; `note` is kept with it (its
        `name`, say)."""
        self.add(arm, lambda out: self.family.baseline(self.problem, self.inputs, out), **note)
        self._rotate(arm, lambda inputs, out: self.family.baseline(self.problem, inputs, out))

    def config(self, arm: str, config: Config) -> None:
        family, problem = self.family, self.problem
        compiled: list[Any] = []

        def make(out: Any) -> Callable[[], None]:
            compiled.append(family.compile(problem, config, self.target))
            return family.launcher(problem, config, self.inputs, out, compiled[0])

        self.add(arm, make, config=config.as_dict())
        self._rotate(arm, lambda inputs, out: family.launcher(problem, config, inputs, out, compiled[0]))

    def time(self, timer: Any, flush_l2: bool, extra: dict[str, Callable[[], None]] | None = None) -> dict[str, Any]:
        """Arm name -> Timing: every arm that passed its check, and the `extra` launches (checked
        by the caller), timed together, interleaved, by `timer` with `arm_plan(flush_l2)`; an arm
        with copies rotates over them instead of a flush."""
        launches = {**self.launches, **(extra or {})}
        names = list(launches)
        timed = timer.time([self.rotated.get(n, [launches[n]]) for n in names], arm_plan(flush_l2), lambda i: None,
                           cold=[n in self.rotated for n in names])
        return dict(zip(names, timed, strict=True))

    def cold(self, arm: str) -> str:
        """How `arm` got a cold L2 when timed cold: "N copies" or "flush"."""
        return f"{len(self.copies)} copies" if arm in self.rotated else "flush"

    def medians(self, timings: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Arm name -> its median, p20, p80 and timing method beside its notes; an arm that was
        not timed (it failed its check) keeps its notes alone."""
        out = {n: {"median_ms": _sig(t.median_ms), "p20_ms": _sig(t.p20_ms), "p80_ms": _sig(t.p80_ms),
                   "method": t.method, **self.notes.get(n, {})} for n, t in timings.items()}
        for n, note in self.notes.items():
            out.setdefault(n, note)
        return out


def gpu_probe(kernel: str) -> tuple[Any, Any, Any, Any]:
    """What a probe under bench/ times with, as this script does: the family, a gpu Evaluator, its
    target and the GPU timer."""
    from tilepilot.kernels import get_family
    from tilepilot.kernels.evaluate import Evaluator
    from tilepilot.kernels.timing import GpuTimer

    ev = Evaluator("gpu")
    return get_family(kernel), ev, ev.target(), GpuTimer()


def write_probe(out: str, doc: str, script: str, argv: list[str] | None, ev: Any, rows: list[Any]) -> None:
    """A probe's result: what it asks (its docstring's first paragraph), the command, the date,
    the device and versions, and its rows."""
    Path(out).write_text(json.dumps({
        "what": doc.split("\n\n")[0], "command": f"python bench/{script} " + " ".join(argv or sys.argv[1:]),
        "date": dt.date.today().isoformat(), **ev.environment().as_dict(), "rows": rows}, indent=1) + "\n")


def _sig(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(f"{x:.5g}")


def bench_problem(family: Any, problem: Problem, tuned: Config | None, timer: Any, target: Any,
                  ceilings: Any, grouped: Config | None = None, cold_l2: str = "flush") -> dict[str, Any]:
    import torch

    arms = Arms(family, problem, target, cold_l2=cold_l2, l2_bytes=getattr(timer, "l2_bytes", 0))
    if tuned is not None:
        arms.config("tuned", tuned)
    if grouped is not None and grouped != tuned:
        arms.config("tuned-grouped", grouped)
    arms.config("default", family.default_config(problem))
    if family.name == "matmul":
        for i, c in enumerate(tutorial_configs()):
            arms.config(f"tutorial-{i}", c)
    if family.name == "silu_mul_fp8_quant":
        arms.config("vllm-fallback", Config.of(VLLM_FALLBACK))
    arms.baseline("baseline", name=family.baseline_name)
    if family.name == "attention":  # every fused SDPA backend; the fastest per shape becomes `sdpa-best`
        from tilepilot.kernels.attention import sdpa_backends

        for backend, fn in sdpa_backends(problem, arms.inputs).items():
            arms.add(f"sdpa-{backend}", lambda out, fn=fn: fn, name=f"scaled_dot_product_attention ({backend})")
    if family.name in COMPILED_BASELINE:
        arms.add("torch.compile", lambda out: torch.compile(family.baseline(problem, arms.inputs, out)),
                 name=f"torch.compile of the {family.baseline_name} baseline")
    timings = arms.time(timer, family.l2_flush)
    work = family.work(problem)
    row: dict[str, Any] = {"kernel": family.name, "problem": problem.as_dict(), "label": problem.label(),
                           "flops": work.flops, "bytes": work.bytes, "arms": {}}
    for name, t in timings.items():
        ms = t.median_ms
        row["arms"][name] = {
            **arms.notes[name], "median_ms": _sig(ms), "p20_ms": _sig(t.p20_ms), "p80_ms": _sig(t.p80_ms),
            "reps": t.reps, "method": t.method, "l2_flushed": t.l2_flushed,
            **({"cold_l2": arms.cold(name)} if family.l2_flush else {}),
            "tflops": _sig(work.tflops(ms)), "gbps": _sig(work.gbps(ms)),
            "pct_copy_bandwidth": _sig(100 * work.gbps(ms) / ceilings.copy_gbps),
            "pct_matmul_rate": _sig(100 * work.tflops(ms) / ceilings.matmul_tflops)}
    for name, note in arms.notes.items():
        row["arms"].setdefault(name, note)
    tutorial = [a for n, a in row["arms"].items() if n.startswith("tutorial-") and a.get("median_ms")]
    if tutorial:
        row["arms"]["tutorial"] = min(tutorial, key=lambda a: a["median_ms"])
    sdpa = [n for n, a in row["arms"].items() if n.startswith("sdpa-") and a.get("median_ms")]
    if sdpa:
        fastest = min(sdpa, key=lambda n: row["arms"][n]["median_ms"])
        row["arms"]["sdpa-best"] = {**row["arms"][fastest], "backend": fastest.removeprefix("sdpa-")}
    return row


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per family: the geometric mean of the tuned config's speed-up over each other arm, and the
    tuned config's share of the copy bandwidth at each shape."""
    out: dict[str, Any] = {}
    for kernel in dict.fromkeys(r["kernel"] for r in rows):
        mine = [r for r in rows if r["kernel"] == kernel]
        others = sorted({n for r in mine for n in r["arms"] if n != "tuned" and not n.startswith("tutorial-")})
        fam: dict[str, Any] = {"problems": len(mine), "tuned_speedup_geomean": {}}
        for other in others:
            ratios = [r["arms"][other]["median_ms"] / r["arms"]["tuned"]["median_ms"] for r in mine
                      if r["arms"].get("tuned", {}).get("median_ms") and r["arms"].get(other, {}).get("median_ms")]
            if ratios:
                fam["tuned_speedup_geomean"][other] = {
                    "geomean": _sig(math.exp(sum(math.log(x) for x in ratios) / len(ratios))),
                    "min": _sig(min(ratios)), "max": _sig(max(ratios)), "n": len(ratios)}
        fam["tuned_pct_copy_bandwidth"] = {r["label"]: r["arms"]["tuned"]["pct_copy_bandwidth"]
                                           for r in mine if r["arms"].get("tuned", {}).get("median_ms")}
        out[kernel] = fam
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results/kernels-h100.json")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--time-budget-s", type=float, default=540.0)
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--cold-l2", choices=COLD_L2, default="copies",
                    help="how the families timed cold get a cold L2: rotating copies of the data, as campaigns "
                         "time (default), or a flush before each launch, as Triton's do_bench")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    start = time.monotonic()

    import torch

    from tilepilot.kernels import get_family
    from tilepilot.kernels.ceilings import measure_ceilings
    from tilepilot.kernels.evaluate import Evaluator
    from tilepilot.kernels.timing import GpuTimer

    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {"rows": [], "runs": []}
    earlier = {r.get("cold_l2", "flush") for r in report["runs"]}  # runs before --cold-l2 flushed
    if earlier - {args.cold_l2}:
        ap.error(f"--cold-l2 {args.cold_l2}: {out} holds rows timed with --cold-l2 {', '.join(sorted(earlier))}; "
                 "resume with that or write to another --out")
    done = {(r["kernel"], Problem.of(r["problem"]).key()) for r in report["rows"]}
    ev = Evaluator("gpu")
    target, timer = ev.target(), GpuTimer()
    ceilings = measure_ceilings()
    run = {"command": " ".join(["python", "bench/kernels.py", *(argv if argv is not None else sys.argv[1:])]),
           "date": dt.date.today().isoformat(), **ev.environment().as_dict(), "cold_l2": args.cold_l2,
           "ceilings": {"copy_gbps": _sig(ceilings.copy_gbps), "matmul_tflops": _sig(ceilings.matmul_tflops),
                        "details": ceilings.details}}
    kernels = [k.strip() for k in args.families.split(",") if k.strip()]
    todo = [(k, p) for k in kernels for p in shapes(k) if (k, p.key()) not in done]
    finalists = {k: tuned_finalists(k) for k in kernels}
    tutorial_grid = ROOT / "data" / "replay" / "matmul-h100.jsonl.gz"
    grouped = tuned_configs("matmul", [tutorial_grid]) if "matmul" in kernels else {}
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=mp.get_context("spawn"),
                             initializer=record._child_init) as pool:  # warm Triton's cache ahead
        futures = []
        for k in kernels:
            fam = get_family(k)
            jobs = []
            for p in shapes(k):
                cs = [fam.default_config(p), *finalists[k].get(p.key(), [])]
                cs += [grouped[p.key()]] if k == "matmul" and p.key() in grouped else []
                cs += tutorial_configs() if k == "matmul" else []
                cs += [Config.of(VLLM_FALLBACK)] if k == "silu_mul_fp8_quant" else []
                jobs.append((p, cs))
            futures += list(record.submit_compiles(pool, jobs, target, k).values())
        last = 0.0
        for kernel, problem in todo:
            if time.monotonic() - start + 1.5 * last + 20 > args.time_budget_s:
                log.info("time budget: stopping before %s %s", kernel, problem.label())
                break
            t0 = time.monotonic()
            fam = get_family(kernel)
            tuned, timed_finalists = pick_finalist(fam, problem, finalists[kernel].get(problem.key(), []), timer,
                                                   target, args.cold_l2)
            row = bench_problem(fam, problem, tuned, timer, target, ceilings,
                                grouped.get(problem.key()) if kernel == "matmul" else None, args.cold_l2)
            if timed_finalists:
                row["finalists"] = timed_finalists
            report["rows"].append(row)
            last = time.monotonic() - t0
            arms = {n: a.get("median_ms") for n, a in row["arms"].items() if not n.startswith("tutorial-")}
            log.info("%s %s (%.0f s): %s", kernel, problem.label(), last, arms)
            report["summary"] = summarise(report["rows"])
            out.write_text(json.dumps({**report, "runs": [*report["runs"], run]}, indent=1) + "\n")
            torch.cuda.empty_cache()
        pool.shutdown(wait=False, cancel_futures=True)
    run["wall_s"] = round(time.monotonic() - start, 1)
    report["runs"].append(run)
    report["summary"] = summarise(report["rows"])
    out.write_text(json.dumps(report, indent=1) + "\n")
    for kernel, fam in report["summary"].items():
        log.info("%s: %s", kernel, json.dumps(fam["tuned_speedup_geomean"]))
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
