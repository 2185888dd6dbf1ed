"""Record a kernel family's full grid on a GPU: the replay dataset (JSON Lines) plus baseline times.

    python bench/record.py --out data/replay/matmul-h100.jsonl \\
        --cublas-out bench/results/matmul-h100-cublas.json --log bench/results/record-matmul-h100.json \\
        [--problems all | 4096x4096x4096:bf16,64x4096x4096:bf16 ...] [--time-budget-s 420] [--workers 14]
    python bench/record.py --kernel softmax [--problems issue | '[{"rows": 1, "cols": 8192, "dtype": "bf16"}]']

Other families (`--kernel NAME`): the grid is every config of the family's space (those that
violate a constraint are recorded as "invalid" with the reason), the problems are the issue's
shape set for the family (`ISSUE_SHAPES`, `--problems issue`, the default) or a JSON list of
problem objects, and the default files are data/replay/NAME-h100.jsonl and
bench/results/record-NAME-h100.json. The baseline (the family's `baseline`, e.g. eager
PyTorch) is timed the same way and written as a baseline line of the dataset.

The grid: BLOCK_SIZE_M, BLOCK_SIZE_N in {64,128,256}, BLOCK_SIZE_K in {32,64,128}, GROUP_SIZE_M=8,
num_warps in {4,8}, num_stages in {3,4,5} (162 configs). Configs are compiled ahead in spawned
CPU processes (CUDA_VISIBLE_DEVICES="", one compile per specialisation and config), then each
problem is evaluated by the same `Evaluator` the workers use (verification on 3 input sets,
interleaved timing with CUDA events, L2 flushed before each launch).

One line per (problem, config), appended per problem; pairs already in --out are skipped, so a
run cut short by --time-budget-s is resumed by running the same command again. A line:
{"kernel", "problem": {M, N, K, dtype}, "config": {6 params}, "status", "median_ms", "p20_ms",
"p80_ms", "min_ms", "reps" (null unless ok), "max_rel_err", "sm_clock_mhz", "power_w", "temp_c"
(NVML after the timing; null for never-launched configs), "message", "device", "driver", "torch",
"triton", "recorded_at" (YYYY-MM-DD), "compile_ms", "shared_bytes", "n_regs", "n_spills",
"l2_flushed", "method", "kernel_version"}; floats rounded to 5 significant digits. Configs that
violate the space's constraints are recorded as "invalid" with the reason.

The cuBLAS time of each problem (torch.matmul, timed the same way by Evaluator.baseline) goes
to --cublas-out: one JSON object with the device and versions and "problems" keyed by problem
label. --log gets one entry per invocation (command, device, versions, wall time).

`--variants` (matmul): each problem's grid is the kernel variants' (`variants_grid`: grouped with
ALIGN_HINT where it applies, splitk, persistent, tma; 144 to 252 configs a problem), e.g.
`--variants --out data/replay/matmul-variants-h100.jsonl` (gzip the file to ship it).

`--streamk-only` (matmul): VARIANT=streamk alone (`streamk_grid`), shipped as its own dataset with
its own cuBLAS times (data/replay/matmul-variants-streamk-h100.jsonl.gz).

`--wide-only` (matmul): VARIANT=tma at BLOCK_SIZE_N 160 and 192 alone (`wide_grid`), shipped as its
own dataset with its own cuBLAS times (data/replay/matmul-variants-wide-h100.jsonl.gz).

`--narrow-only` (matmul): tiles 16 and 32 columns wide alone (`narrow_grid`), on the decode shapes
(`--problems decode`: M <= 256), shipped as its own dataset with its own cuBLAS times
(data/replay/matmul-variants-narrow-h100.jsonl.gz).

`--pad-only` (matmul): VARIANT=tma with PAD_ROWS (`pad_grid`), on the problems whose rows it can
pad (`--problems 3000x5000x1000:fp16,1000x3000x2000:bf16` among the recorded ones), shipped as its
own dataset with its own cuBLAS times (data/replay/matmul-variants-pad-h100.jsonl.gz).

`--tma-splitk-only` (matmul): VARIANT=tma_splitk alone (`tma_splitk_grid`), shipped as its own
dataset with its own cuBLAS times (data/replay/matmul-variants-tmasplitk-h100.jsonl.gz).

`--group-only` (matmul): the tuned config of each problem in the table's run
(bench/results/kernels-all-h100.json) at GROUP_SIZE_M 1, 4 and 16 (`group_grid`; every other grid
holds 8 alone), shipped as its own dataset with its own cuBLAS times
(data/replay/matmul-variants-group-h100.jsonl.gz).

`--aot-vs-jit FILE` instead times a few configs launched ahead-of-time and through the JIT,
interleaved, and checks that both are the same kernel (identical PTX). `--repeat-check FILE`
re-times 10 recorded configs per problem in a new process and compares medians.
`--probe-timing FILE` writes timing quantiles per input set, with and without the L2 flush.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import itertools
import json
import logging
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tilepilot.experiments import Config, Problem, Result

log = logging.getLogger("record")
MATMUL = "matmul"


def _rows(*shapes: tuple[int, int]) -> list[dict[str, Any]]:
    return [{"rows": r, "cols": c, "dtype": "bf16"} for r, c in shapes]


ROW_SHAPES = _rows((1, 8192), (256, 4096), (4096, 8192), (16384, 16384))
# The issue's shape sets ("so that results compare"), per family.
ISSUE_SHAPES: dict[str, list[dict[str, Any]]] = {
    "softmax": ROW_SHAPES, "rmsnorm": ROW_SHAPES, "layernorm": ROW_SHAPES,
    "silu_mul_fp8_quant": [{"T": t, "H": h, "dtype": "bf16"} for t in (1, 16, 256, 4096, 16384) for h in (4096, 14336)],
    "fused_moe": [{"M": m, "E": e, "topk": k, "N": n, "K": kk, "dtype": "bf16"}
                  for e, k, n, kk in ((8, 2, 14336, 4096), (64, 6, 1408, 2048)) for m in (1, 16, 64, 256, 1024, 4096)],
    "attention": [{"B": 4, "H": 32, "S": s_, "D": d, "causal": c, "dtype": "bf16"}
                  for s_ in (1024, 4096) for d in (64, 128) for c in (False, True)],
}

REQUIRED = ["4096x4096x4096:bf16", "64x4096x4096:bf16", "16384x1024x1024:bf16", "1024x1024x16384:bf16",
            "4096x4096x4096:fp16", "2048x8192x2048:fp16", "1x4096x4096:bf16", "16x4096x4096:bf16",
            "128x4096x4096:bf16"]
EXTRA = ["6144x1536x4096:bf16", "3000x5000x1000:fp16", "8192x8192x8192:bf16", "512x14336x4096:bf16",
         "1000x3000x2000:bf16", "2048x2048x2048:fp16", "32x8192x8192:bf16", "8192x2048x512:fp16",
         "256x4096x4096:bf16", "1024x4096x4096:bf16", "2048x4096x4096:bf16", "4096x4096x1024:bf16",
         "4x4096x4096:bf16", "8x14336x4096:bf16", "4096x11008x4096:bf16", "2048x2048x8192:bf16",
         "8192x8192x2048:fp16", "1500x1500x1500:fp16", "768x3072x768:fp16", "16384x16384x256:bf16"]


TILE_NAMES = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
# The matmul variants' grids (--variants), each variant's tiles as (BLOCK_SIZE_M, BLOCK_SIZE_N, num_warps):
# split-K small-M and wave-filling tiles, the persistent kernels the tutorial's tiles (TMA also 256×128).
SPLITK_TILES = ((16, 64, 4), (16, 128, 4), (64, 64, 4), (64, 128, 4), (128, 128, 8), (128, 256, 8))
PERSISTENT_TILES = ((64, 128, 4), (128, 64, 4), (128, 128, 4), (128, 128, 8), (64, 256, 4), (128, 256, 8))
FUSED_TILES = ((16, 64, 4), (16, 128, 4), (32, 64, 4), (64, 64, 4), (64, 128, 4), (128, 128, 8))
TMA_TILES = (*PERSISTENT_TILES, (256, 128, 8))


def grid(kernel: str = MATMUL) -> list[Config]:
    """The recorded grid: the tutorial's 162 matmul configs, or every config of another family's space."""
    if kernel != MATMUL:
        from tilepilot.kernels import get_family

        return list(get_family(kernel).space())
    values = ([64, 128, 256], [64, 128, 256], [32, 64, 128], [8], [4, 8], [3, 4, 5])
    return [Config.of(dict(zip(TILE_NAMES, v, strict=True))) for v in itertools.product(*values)]


def variants_grid(problem: Problem) -> list[Config]:
    """The matmul variants' grid for one problem (`--variants`), ALIGN_HINT on wherever it says
    something (K or N even but no multiple of 16), off elsewhere:
    - grouped with ALIGN_HINT (only where it applies; the plain grouped grid is `grid()`):
      BLOCK_SIZE_M, BLOCK_SIZE_N in {64,128,256}, BLOCK_SIZE_K in {32,64,128}, warps {4,8}, stages {3,4} (108);
    - splitk: SPLITK_TILES × BLOCK_SIZE_K {64,128} × stages {3,4} × SPLIT_K {2,4,8} (72);
    - persistent and tma: PERSISTENT_TILES × BLOCK_SIZE_K {32,64,128} × stages {3,4} (36 each; tma
      without ALIGN_HINT, it has no pointer loads);
    - `new_variants_grid`: splitk_fused, tma_tail, tma with EPILOGUE_SUBTILE and 256×128 tiles.
    GROUP_SIZE_M=8 throughout. Configs a constraint refuses are recorded as invalid with the reason."""
    hint = _hint(problem)
    out = [tile_config(bm, bn, bk, w, s, ALIGN_HINT=True)
           for bm, bn, bk, w, s in itertools.product([64, 128, 256], [64, 128, 256], [32, 64, 128], [4, 8], [3, 4])
           ] if hint else []
    out += [tile_config(bm, bn, bk, w, s, VARIANT="splitk", SPLIT_K=k, ALIGN_HINT=hint)
            for (bm, bn, w), bk, s, k in itertools.product(SPLITK_TILES, [64, 128], [3, 4], [2, 4, 8])]
    for variant, hinted in (("persistent", hint), ("tma", False)):
        out += [tile_config(bm, bn, bk, w, s, VARIANT=variant, ALIGN_HINT=hinted)
                for (bm, bn, w), bk, s in itertools.product(PERSISTENT_TILES, [32, 64, 128], [3, 4])]
    return out + new_variants_grid(problem)


def new_variants_grid(problem: Problem) -> list[Config]:
    """The variants added after the first recording (`--variants --new-only` records just these):
    - splitk_fused: FUSED_TILES × BLOCK_SIZE_K {64,128} × stages {3,5} × SPLIT_K {2,4,8,16} (96);
    - tma_tail: TMA_TILES × BLOCK_SIZE_K {32,64,128} × stages {3,4} × EPILOGUE_SUBTILE {False,True} (84);
    - tma with EPILOGUE_SUBTILE (TMA_TILES × BLOCK_SIZE_K {32,64,128} × stages {3,4}, 42) and without it
      on the 256×128 tile (6)."""
    hint = _hint(problem)
    out = [tile_config(bm, bn, bk, w, s, VARIANT="splitk_fused", SPLIT_K=k, ALIGN_HINT=hint)
           for (bm, bn, w), bk, s, k in itertools.product(FUSED_TILES, [64, 128], [3, 5], [2, 4, 8, 16])]
    out += [tile_config(bm, bn, bk, w, s, VARIANT="tma_tail", EPILOGUE_SUBTILE=sub)
            for (bm, bn, w), bk, s, sub in itertools.product(TMA_TILES, [32, 64, 128], [3, 4], [False, True])]
    out += [tile_config(bm, bn, bk, w, s, VARIANT="tma", EPILOGUE_SUBTILE=True)
            for (bm, bn, w), bk, s in itertools.product(TMA_TILES, [32, 64, 128], [3, 4])]
    out += [tile_config(256, 128, bk, 8, s, VARIANT="tma") for bk, s in itertools.product([32, 64, 128], [3, 4])]
    return out


def streamk_grid(problem: Problem) -> list[Config]:
    """VARIANT=streamk on tma_tail's grid (`--streamk-only`, recorded apart from the variants' dataset,
    with its own cuBLAS times): TMA_TILES × BLOCK_SIZE_K {32,64,128} × stages {3,4} ×
    EPILOGUE_SUBTILE {False,True} (84)."""
    return [tile_config(bm, bn, bk, w, s, VARIANT="streamk", EPILOGUE_SUBTILE=sub)
            for (bm, bn, w), bk, s, sub in itertools.product(TMA_TILES, [32, 64, 128], [3, 4], [False, True])]


def wide_grid(problem: Problem) -> list[Config]:
    """VARIANT=tma at the tile widths that are not powers of two (`--wide-only`, recorded apart from
    the variants' dataset, with its own cuBLAS times): BLOCK_SIZE_M {64,128,256} × BLOCK_SIZE_N
    {160,192} × BLOCK_SIZE_K {32,64,128} × warps {4,8} × stages {3,4} (72; shared memory and
    registers refuse about half)."""
    return [tile_config(bm, bn, bk, w, s, VARIANT="tma")
            for bm, bn, bk, w, s in itertools.product([64, 128, 256], [160, 192], [32, 64, 128], [4, 8], [3, 4])]


def narrow_grid(problem: Problem) -> list[Config]:
    """Tiles 16 and 32 columns wide (`--narrow-only`, recorded apart, with their own cuBLAS times, on the
    decode shapes, M <= 256): N/32 programs fill the SMs without splitting K, so no fp32 partials are
    written, and B, the weight read once, is the only traffic that counts:
    - grouped: BLOCK_SIZE_M {16,32,64} × BLOCK_SIZE_N {16,32} × BLOCK_SIZE_K {128,256} × warps {2,4}
      × stages {3,4,5} (72);
    - splitk_fused at 32 columns: BLOCK_SIZE_M {16,64} × BLOCK_SIZE_K {128,256} × stages {3,5} ×
      SPLIT_K {2,4}, 4 warps (16)."""
    out = [tile_config(bm, bn, bk, w, s)
           for bm, bn, bk, w, s in itertools.product([16, 32, 64], [16, 32], [128, 256], [2, 4], [3, 4, 5])]
    out += [tile_config(bm, 32, bk, 4, s, VARIANT="splitk_fused", SPLIT_K=k)
            for bm, bk, s, k in itertools.product([16, 64], [128, 256], [3, 5], [2, 4])]
    return out


def pad_grid(problem: Problem) -> list[Config]:
    """VARIANT=tma with PAD_ROWS (`--pad-only`, recorded apart, with its own cuBLAS times): TMA_TILES ×
    BLOCK_SIZE_K {32,64,128} × stages {3,4} × EPILOGUE_SUBTILE {False,True} × each PAD_ROWS the problem
    allows (A where K, B where N is not a multiple of 128 bytes; up to 252); none where neither is."""
    from tilepilot.kernels import get_family
    from tilepilot.kernels.matmul import pad_rows_applies

    base = [tile_config(bm, bn, bk, w, s, VARIANT="tma", EPILOGUE_SUBTILE=sub)
            for (bm, bn, w), bk, s, sub in itertools.product(TMA_TILES, [32, 64, 128], [3, 4], [False, True])]
    space = get_family(MATMUL).space()
    pads = [pad for pad in ("A", "B", "AB")
            if pad_rows_applies(space.parse({**base[0].as_dict(), "PAD_ROWS": pad}), problem) is None]
    return [Config.of({**c.as_dict(), "PAD_ROWS": pad}) for pad in pads for c in base]


TMA_SPLITK_TILES = ((64, 128, 4), (64, 256, 4), (128, 128, 8), (128, 256, 8))


def tma_splitk_grid(problem: Problem) -> list[Config]:
    """VARIANT=tma_splitk (`--tma-splitk-only`, recorded apart, with its own cuBLAS times):
    TMA_SPLITK_TILES × BLOCK_SIZE_K {64,128} × stages {3,4} × SPLIT_K {2,4,8} (48; the workspace cap
    refuses it on the largest outputs, and a split left without K-blocks on the short K)."""
    return [tile_config(bm, bn, bk, w, s, VARIANT="tma_splitk", SPLIT_K=k)
            for (bm, bn, w), bk, s, k in itertools.product(TMA_SPLITK_TILES, [64, 128], [3, 4], [2, 4, 8])]


GROUP_TABLE = Path(__file__).resolve().parent / "results" / "kernels-all-h100.json"


@functools.cache
def _tuned_in_table(path: Path) -> dict[str, dict[str, Any]]:
    """Problem label -> the tuned matmul config of a bench/kernels.py run (read once)."""
    return {r["label"]: r["arms"]["tuned"]["config"] for r in json.loads(path.read_text())["rows"]
            if r["kernel"] == MATMUL and "tuned" in r["arms"]}


def group_grid(problem: Problem) -> list[Config]:
    """The problem's tuned config in the table's run (GROUP_TABLE) at GROUP_SIZE_M 1, 4 and 16
    (`--group-only`, recorded apart, with its own cuBLAS times): the recorded grids fix the tile
    order at 8, and bench/group_probe.py found others faster on some shapes. [] for a problem the
    table lacks."""
    from tilepilot.kernels import get_family

    config = _tuned_in_table(GROUP_TABLE).get(problem.label())
    if config is None:
        return []
    space = get_family(MATMUL).space()
    return [space.parse({**config, "GROUP_SIZE_M": g}) for g in (1, 4, 16)]


# The `--*-only` flags (matmul): flag, the grid it records instead of the whole one, what that grid is.
ONLY_GRIDS: tuple[tuple[str, Callable[[Problem], list[Config]], str], ...] = (
    ("--new-only", new_variants_grid, "the variants added after the first recording"),
    ("--streamk-only", streamk_grid,
     "VARIANT=streamk, e.g. --out data/replay/matmul-variants-streamk-h100.jsonl"),
    ("--wide-only", wide_grid,
     "VARIANT=tma at BLOCK_SIZE_N 160 and 192, e.g. --out data/replay/matmul-variants-wide-h100.jsonl"),
    ("--narrow-only", narrow_grid, "tiles 16 and 32 columns wide, e.g. --problems decode "
     "--out data/replay/matmul-variants-narrow-h100.jsonl"),
    ("--pad-only", pad_grid, "VARIANT=tma with PAD_ROWS, e.g. --problems "
     "3000x5000x1000:fp16,1000x3000x2000:bf16 --out data/replay/matmul-variants-pad-h100.jsonl"),
    ("--group-only", group_grid, "the table's tuned configs at GROUP_SIZE_M 1, 4, 16, e.g. "
     "--out data/replay/matmul-variants-group-h100.jsonl"),
    ("--tma-splitk-only", tma_splitk_grid,
     "VARIANT=tma_splitk, e.g. --out data/replay/matmul-variants-tmasplitk-h100.jsonl"),
)


def only_grid(args: argparse.Namespace) -> Callable[[Problem], list[Config]] | None:
    """The grid of the first `--*-only` flag set in `args` (ONLY_GRIDS), None where none is."""
    for flag, grid_of, _ in ONLY_GRIDS:
        if getattr(args, flag.removeprefix("--").replace("-", "_")):
            return grid_of
    return None


def tile_config(bm: int, bn: int, bk: int, w: int, s: int, **variant: Any) -> Config:
    """A matmul config as the recorded grids hold it: the tile, GROUP_SIZE_M 8, and every variant
    parameter at its default unless given."""
    return Config.of({**dict(zip(TILE_NAMES, (bm, bn, bk, 8, w, s), strict=True)),
                      "VARIANT": "grouped", "SPLIT_K": 1, "ALIGN_HINT": False, "EPILOGUE_SUBTILE": False,
                      "WARP_SPECIALIZE": False, "PAD_ROWS": "none", **variant})


def _hint(problem: Problem) -> bool:
    """Whether ALIGN_HINT says something for this problem."""
    from tilepilot.kernels.matmul import alignments

    return alignments(problem, tile_config(64, 64, 64, 4, 3, ALIGN_HINT=True)) != (1, 1)


def parse_problem(spec: str) -> Problem:
    from tilepilot.kernels import get_family

    dims, _, dtype = spec.partition(":")
    m, n, k = (int(x) for x in dims.lower().split("x"))
    return get_family(MATMUL).parse_problem({"M": m, "N": n, "K": k, "dtype": dtype})


def problem_specs(arg: str) -> list[str]:
    if arg == "all":
        return REQUIRED + EXTRA
    if arg == "required":
        return REQUIRED
    if arg == "decode":
        return [s for s in REQUIRED + EXTRA if int(s.split("x")[0]) <= 256]
    return [s.strip() for s in arg.split(",") if s.strip()]


def problems_for(kernel: str, arg: str) -> list[Problem]:
    from tilepilot.kernels import get_family

    if kernel == MATMUL:
        return [parse_problem(s) for s in problem_specs(arg)]
    family = get_family(kernel)
    raw = ISSUE_SHAPES[kernel] if arg in ("issue", "all") else json.loads(arg)
    return [family.parse_problem(r) for r in raw]


def sig5(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.5g}")


# ---- compile ahead ---------------------------------------------------------------------------------
def _child_init() -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch is imported in this process
    logging.basicConfig(level=logging.WARNING)


def _compile_task(kernel: str, problem: dict[str, Any], config: dict[str, Any],
                  target: dict[str, Any]) -> dict[str, Any]:
    from tilepilot.kernels.base import Target
    from tilepilot.kernels.evaluate import compile_config

    o = compile_config(kernel, Problem.of(problem), Config.of(config), Target(**target))
    return {"status": o.status.value, "message": o.message, "compile_ms": o.compile_ms, "shared": o.shared_bytes}


def submit_compiles(pool: ProcessPoolExecutor, todo: list[tuple[Problem, list[Config]]],
                    target: Any, kernel: str = MATMUL) -> dict[tuple[str, str], Future[dict[str, Any]]]:
    """One compile per (specialisation, config), in the order the problems will be evaluated."""
    from tilepilot.kernels import get_family

    family = get_family(kernel)
    futures: dict[tuple[str, str], Future[dict[str, Any]]] = {}
    tdict = {"backend": target.backend, "arch": target.arch, "warp_size": target.warp_size,
             "max_shared_bytes": target.max_shared_bytes}
    for problem, configs in todo:
        for c in configs:
            key = (family.specialisation(problem, c), c.key())
            if key not in futures and family.space().check(c, problem) is None:
                futures[key] = pool.submit(_compile_task, kernel, problem.as_dict(), c.as_dict(), tdict)
    return futures


# ---- dataset ---------------------------------------------------------------------------------------
def load_done(path: Path) -> set[tuple[str, str]]:
    """(problem, config) keys of the lines in `path`; a matmul config recorded before a variant
    parameter existed counts with that parameter at its default, as `tile_config` writes it."""
    from tilepilot.kernels.matmul import DEFAULTS

    done: set[tuple[str, str]] = set()
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if "config" not in row:  # a baseline line
                    continue
                config = {**DEFAULTS, **row["config"]} if row.get("kernel") == MATMUL else row["config"]
                done.add((Problem.of(row["problem"]).key(), Config.of(config).key()))
    return done


def row(result: Result, today: str, kernel_version: str, kernel: str = MATMUL) -> dict[str, Any]:
    t = result.timing
    ex = result.extra
    return {
        "kernel": kernel, "problem": result.problem.as_dict(), "config": result.config.as_dict(),
        "status": result.status.value,
        "median_ms": sig5(t.median_ms) if t else None, "p20_ms": sig5(t.p20_ms) if t else None,
        "p80_ms": sig5(t.p80_ms) if t else None, "min_ms": sig5(t.min_ms) if t else None,
        "reps": t.reps if t else None, "max_rel_err": sig5(result.max_rel_err),
        "sm_clock_mhz": result.telemetry.sm_clock_mhz, "power_w": sig5(result.telemetry.power_w),
        "temp_c": result.telemetry.temp_c, "message": result.message,
        "device": result.env.device, "driver": result.env.driver, "torch": result.env.torch,
        "triton": result.env.triton, "recorded_at": today,
        "compile_ms": sig5(result.compile_ms), "shared_bytes": ex.get("shared_bytes"),
        "n_regs": ex.get("n_regs"), "n_spills": ex.get("n_spills"),
        "l2_flushed": t.l2_flushed if t else None, "method": t.method if t else None,
        "kernel_version": kernel_version,
    }


def append_rows(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with path.open("a") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


def update_cublas(path: Path, label: str, entry: dict[str, Any], header: dict[str, Any]) -> None:
    data = json.loads(path.read_text()) if path.exists() else {**header, "problems": {}}
    data["problems"][label] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


# ---- the recording ---------------------------------------------------------------------------------
def record(args: argparse.Namespace) -> dict[str, Any]:
    from tilepilot.kernels import get_family, telemetry
    from tilepilot.kernels.evaluate import Evaluator

    start = time.monotonic()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = load_done(out)
    kernel = args.kernel
    problems = problems_for(kernel, args.problems)
    configs_all = grid(kernel)

    def configs_of(p: Problem) -> list[Config]:
        only = only_grid(args)
        if only is not None:
            return only(p)
        return variants_grid(p) if args.variants else configs_all

    todo = [(p, [c for c in configs_of(p) if (p.key(), c.key()) not in done]) for p in problems]
    todo = [(p, cs) for p, cs in todo if cs]
    ev = Evaluator("gpu", input_sets=3, seed=args.seed, rounds=args.rounds, block_ms=args.block_ms,
                   spread_target=args.spread_target, time_cap_ms=args.time_cap_ms,
                   **({"outclass_ratio": None} if args.time_every else {}))
    env, family, today = ev.environment(), get_family(kernel), dt.date.today().isoformat()
    flush = "L2 flushed before each launch" if family.l2_flush else "L2 not flushed"
    header = {"device": env.device, "driver": env.driver, "torch": env.torch, "triton": env.triton,
              "baseline": family.baseline_name or "baseline",
              "method": f"{family.baseline_name or 'baseline'}, CUDA events, {flush}, median of reps"}
    summary: dict[str, Any] = {"problems_done": [], "rows_written": 0, "gpu_before": _gpu_state(ev)}
    log.info("%d problems to record (%d already complete)", len(todo), len(problems) - len(todo))
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=ctx, initializer=_child_init) as pool:
        futures = submit_compiles(pool, todo, ev.target(), kernel)
        last_s = 0.0
        for problem, configs in todo:
            left = args.time_budget_s - (time.monotonic() - start)
            if left < 1.5 * last_s + 10:
                log.info("time budget: stopping before %s (%.0f s left)", problem.label(), left)
                break
            t0 = time.monotonic()
            for c in configs:
                key = (family.specialisation(problem, c), c.key())
                if key in futures:
                    futures[key].result()
            compiled_s = time.monotonic() - t0
            results = ev.evaluate(kernel, problem, configs)
            append_rows(out, (row(r, today, family.kernel_version(), kernel) for r in results))
            cublas = ev.baseline(kernel, problem)
            if cublas is not None:
                entry = _cublas_entry(problem, cublas, family.work(problem).flops, today)
                update_cublas(Path(args.cublas_out), problem.label(), entry, header)
                append_rows(out, [baseline_row(entry, header, kernel)])
            last_s = time.monotonic() - t0
            summary["problems_done"].append(problem.label())
            summary["rows_written"] += len(results)
            _log_problem(problem, results, cublas, family, compiled_s, last_s)
        pool.shutdown(wait=False, cancel_futures=True)
    summary["gpu_after"] = _gpu_state(ev)
    summary.update(env.as_dict())
    summary["nvml"] = telemetry.nvml_available()
    return summary


def baseline_row(entry: dict[str, Any], header: dict[str, Any], kernel: str = MATMUL) -> dict[str, Any]:
    """The dataset line replay reads as the baseline's time for the problem (cuBLAS for matmul)."""
    return {"kernel": kernel, "problem": entry["problem"], "baseline": header["baseline"],
            "median_ms": entry["median_ms"], "p20_ms": entry["p20_ms"], "p80_ms": entry["p80_ms"],
            "reps": entry["reps"], **{k: header[k] for k in ("device", "driver", "torch", "triton", "method")},
            "recorded_at": entry["recorded_at"]}


def _cublas_entry(problem: Problem, t: Any, flops: float, today: str) -> dict[str, Any]:
    return {"problem": problem.as_dict(), "median_ms": sig5(t.median_ms), "p20_ms": sig5(t.p20_ms),
            "p80_ms": sig5(t.p80_ms), "min_ms": sig5(t.min_ms), "reps": t.reps,
            "tflops": sig5(flops / (t.median_ms * 1e-3) / 1e12), "recorded_at": today}


def _log_problem(problem: Problem, results: list[Result], cublas: Any, family: Any, compiled_s: float,
                 total_s: float) -> None:
    ok = [r for r in results if r.median_ms is not None]
    best = min(ok, key=lambda r: r.median_ms or 0.0) if ok else None
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status.value] = counts.get(r.status.value, 0) + 1
    work = family.work(problem)
    log.info("%s: %s; best %s %.4f ms (%.0f TFLOP/s) | baseline %.4f ms (%.0f TFLOP/s) | wait-compile %.1f s, "
             "total %.1f s", problem.label(), counts, best.config.label() if best else "-",
             best.median_ms if best else float("nan"), work.tflops(best.median_ms) if best else float("nan"),
             cublas.median_ms if cublas else float("nan"), work.tflops(cublas.median_ms) if cublas else 0.0,
             compiled_s, total_s)


def _gpu_state(ev: Any) -> dict[str, Any] | None:
    from tilepilot.kernels import telemetry

    if not telemetry.nvml_available():
        return None
    s = telemetry.sample_gpu(ev.gpu_uuid(), os.uname().nodename)
    return {"sm_clock_mhz": s.sm_clock_mhz, "power_w": s.power_w, "temp_c": s.temp_c, "throttle": s.throttle,
            "mem_used_mb": round(s.mem_used_mb)}


# ---- AOT vs JIT ------------------------------------------------------------------------------------
def aot_vs_jit(args: argparse.Namespace) -> dict[str, Any]:
    """Time the same configs launched ahead-of-time and through the JIT, interleaved."""
    import torch

    from tilepilot.kernels import get_family, matmul_triton
    from tilepilot.kernels.evaluate import Evaluator
    from tilepilot.kernels.matmul import _int_args, _kernel
    from tilepilot.kernels.timing import GpuTimer, TimingPlan

    family = get_family(MATMUL)
    ev = Evaluator("gpu")
    target = ev.target()
    timer = GpuTimer()
    rows = []
    for spec in ("4096x4096x4096:bf16", "1x4096x4096:bf16", "3000x5000x1000:fp16"):
        problem = parse_problem(spec)
        inputs = family.make_inputs(problem, 0, "cuda")
        out = family.make_output(problem, inputs)
        configs = [family.default_config(problem), Config.of({**family.default_config(problem).as_dict(),
                   "BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "num_warps": 4, "num_stages": 4})]
        for c in configs:
            t0 = time.perf_counter()
            aot = family.compile(problem, c, target)
            compile_ms = (time.perf_counter() - t0) * 1e3
            aot_launch = family.launcher(problem, c, inputs, out, aot)
            grid = (-(-int(problem["M"]) // int(c["BLOCK_SIZE_M"])) * -(-int(problem["N"]) // int(c["BLOCK_SIZE_N"])),
                    1, 1)
            kwargs = {"a_ptr": inputs[0], "b_ptr": inputs[1], "c_ptr": out, **_int_args(problem),
                      **_kernel(problem, c)[2]}  # the AOT kernel's constants, FEW_ROWS at M = 1 included
            jit_kernel = matmul_triton.matmul_kernel[grid](**kwargs, num_warps=int(c["num_warps"]),
                                                            num_stages=int(c["num_stages"]))

            def jit_launch(kwargs: dict[str, Any] = kwargs, grid: tuple[int, int, int] = grid,
                           c: Config = c) -> None:
                matmul_triton.matmul_kernel[grid](**kwargs, num_warps=int(c["num_warps"]),
                                                  num_stages=int(c["num_stages"]))

            torch.cuda.synchronize()
            timings = []
            for _ in range(3):  # three independent interleaved measurements
                timings.append(timer.time([[aot_launch], [jit_launch]], TimingPlan(rounds=6, block_ms=10.0),
                                          lambda i: None))
            rows.append({
                "problem": problem.label(), "config": c.label(), "aot_compile_ms_in_gpu_process": sig5(compile_ms),
                "same_ptx": aot.asm["ptx"] == jit_kernel.asm["ptx"],
                "same_attrs": str(sorted(aot.src.attrs.items())) == str(sorted(jit_kernel.src.attrs.items())),
                "aot_median_ms": [sig5(t[0].median_ms) for t in timings],
                "jit_median_ms": [sig5(t[1].median_ms) for t in timings],
            })
            log.info("%s", rows[-1])
    return {"rows": rows, **ev.environment().as_dict(), "date": dt.date.today().isoformat(),
            "method": "CUDA events, L2 flushed, 6 interleaved rounds x ~10 ms blocks, 3 repeats"}


# ---- how reproducible are the recorded medians? ---------------------------------------------------
def repeat_check(args: argparse.Namespace) -> dict[str, Any]:
    """Re-time the 5 fastest and 5 random ok configs of every recorded problem (interleaved, in a
    new process), and compare each new median with the recorded one."""
    import random

    from tilepilot.kernels.evaluate import Evaluator

    rows = [json.loads(line) for line in Path(args.out).read_text().splitlines() if line.strip()]
    by_problem: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["status"] == "ok":
            by_problem.setdefault(Problem.of(r["problem"]).key(), []).append(r)
    ev = Evaluator("gpu", seed=args.seed + 1, rounds=args.rounds, block_ms=args.block_ms)
    rng = random.Random(args.seed)
    picks = []
    for ok in by_problem.values():
        ok.sort(key=lambda r: r["median_ms"])
        picks.append(ok[:5] + rng.sample(ok[5:], min(5, len(ok) - 5)))
    todo = [(Problem.of(c[0]["problem"]), [Config.of(r["config"]) for r in c]) for c in picks]
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=mp.get_context("spawn"),
                             initializer=_child_init) as pool:
        for f in submit_compiles(pool, todo, ev.target(), args.kernel).values():
            f.result()
    out = []
    for chosen, (problem, configs) in zip(picks, todo, strict=True):
        results = ev.evaluate(args.kernel, problem, configs)
        ratios = [res.median_ms / r["median_ms"] for res, r in zip(results, chosen, strict=True) if res.median_ms]
        again_best = min(range(5), key=lambda i: results[i].median_ms or float("inf"))
        top = [res.median_ms or float("inf") for res in results[:5]]
        out.append({"problem": problem.label(), "ratios_again_over_recorded": [sig5(x) for x in ratios],
                    "best_recorded_is_best_again_among_top5": again_best == 0,
                    "recorded_best_again_over_best_again": sig5(top[0] / min(top))})
        log.info("%s", out[-1])
    devs = sorted(abs(x - 1) for o in out for x in o["ratios_again_over_recorded"])
    return {"rows": out, "median_abs_dev": sig5(devs[len(devs) // 2]),
            "p90_abs_dev": sig5(devs[int(0.9 * (len(devs) - 1))]), "max_abs_dev": sig5(devs[-1]),
            "best_stays_best": sum(o["best_recorded_is_best_again_among_top5"] for o in out), "problems": len(out),
            "worst_recorded_best_again_over_best_again": max(o["recorded_best_again_over_best_again"] for o in out),
            **ev.environment().as_dict(), "date": dt.date.today().isoformat()}


def probe_timing(args: argparse.Namespace) -> dict[str, Any]:
    """Where do bimodal timings of memory-bound problems come from? Quantiles of single-set blocks,
    with and without the L2 flush, for cuBLAS and two Triton configs."""
    import torch

    from tilepilot.kernels import get_family
    from tilepilot.kernels.evaluate import Evaluator
    from tilepilot.kernels.timing import GpuTimer, quantile

    family, ev, timer = get_family(MATMUL), Evaluator("gpu"), GpuTimer()
    target, report = ev.target(), []
    for spec in ("16x4096x4096:bf16", "64x4096x4096:bf16", "4096x4096x4096:bf16"):
        problem = parse_problem(spec)
        sets = [family.make_inputs(problem, s, "cuda") for s in range(3)]
        out = family.make_output(problem, sets[0])
        kernels: dict[str, list[Any]] = {"cublas": [family.baseline(problem, x, out) for x in sets]}
        for c in (Config.of({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 8,
                             "num_warps": 4, "num_stages": 5}),
                  Config.of({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8,
                             "num_warps": 8, "num_stages": 4})):
            compiled = family.compile(problem, c, target)
            kernels[c.label()] = [family.launcher(problem, c, x, out, compiled) for x in sets]
        for name, launches in kernels.items():
            for fn in launches:
                fn()
            torch.cuda.synchronize()
            for variant, fns, flush in (("set0", launches[:1], True), ("set1", launches[1:2], True),
                                        ("set2", launches[2:], True), ("rotating", launches, True),
                                        ("set0-noflush", launches[:1], False)):
                s = sorted(x for _ in range(4) for x in timer._block(fns, 50, flush))
                report.append({"problem": problem.label(), "kernel": name, "variant": variant,
                               "q10_q50_q90_ms": [sig5(quantile(s, q)) for q in (0.1, 0.5, 0.9)]})
                log.info("%s", report[-1])
    return {"rows": report, **ev.environment().as_dict(), "date": dt.date.today().isoformat()}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernel", default=MATMUL, help="the family to record (default matmul)")
    p.add_argument("--problems", default="all",
                   help="matmul: all | required | comma-separated MxNxK:dtype; others: issue | a JSON list")
    p.add_argument("--out", help="default data/replay/KERNEL-h100.jsonl")
    p.add_argument("--cublas-out", "--baseline-out", dest="cublas_out",
                   help="baseline times; default bench/results/matmul-h100-cublas.json for matmul, "
                        "bench/results/KERNEL-h100-baseline.json otherwise")
    p.add_argument("--log", help="default bench/results/record-KERNEL-h100.json")
    p.add_argument("--variants", action="store_true",
                   help="matmul: record the variants' grid (variants_grid) instead of the tutorial's 162 configs")
    for flag, grid_of, what in ONLY_GRIDS:
        p.add_argument(flag, action="store_true", help=f"matmul: record only {what} ({grid_of.__name__})")
    p.add_argument("--time-budget-s", type=float, default=420.0)
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--block-ms", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--spread-target", type=float, default=0.01, help="stop timing a config at this spread")
    p.add_argument("--time-cap-ms", type=float, default=60.0, help="GPU ms of timing per config at most")
    p.add_argument("--time-every", action="store_true",
                   help="time every config, also those whose verification took twice the problem's best "
                        "(by default they are recorded from those launches, stop reason outclassed)")
    p.add_argument("--aot-vs-jit", default="", help="write the AOT-vs-JIT check to this file and exit")
    p.add_argument("--repeat-check", default="", help="re-time recorded configs, write the comparison, exit")
    p.add_argument("--probe-timing", default="", help="write timing quantiles per input set / flush, exit")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.out = args.out or f"data/replay/{args.kernel}-h100.jsonl"
    args.cublas_out = args.cublas_out or (f"bench/results/{args.kernel}-h100-cublas.json" if args.kernel == MATMUL
                                          else f"bench/results/{args.kernel}-h100-baseline.json")
    args.log = args.log or f"bench/results/record-{args.kernel}-h100.json"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    started = time.monotonic()
    for path, step in ((args.aot_vs_jit, aot_vs_jit), (args.repeat_check, repeat_check),
                       (args.probe_timing, probe_timing)):
        if path:
            Path(path).write_text(json.dumps(step(args), indent=1) + "\n")
            return 0
    summary = record(args)
    entry = {"command": " ".join(["python", "bench/record.py", *(argv or sys.argv[1:])]),
             "date": dt.date.today().isoformat(), "wall_s": round(time.monotonic() - started, 1),
             "workers": args.workers, "rounds": args.rounds, "block_ms": args.block_ms, **summary}
    logp = Path(args.log)
    data = json.loads(logp.read_text()) if logp.exists() else {"runs": []}
    data["runs"].append(entry)
    logp.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
