"""Does making the tma variant's tensor descriptors on the host, not in each program, save time?

    python bench/hostdesc_probe.py --out bench/results/hostdesc-probe-h100.json

The tma variant's programs each build their three descriptors in global scratch memory at the
start of the launch (`tl.make_tensor_descriptor`), and wait for them to be visible to the copy
engine before their first load. Built once on the host (`TensorDescriptor`, passed as kernel
arguments), they cost the launch nothing on the GPU. Here the same tile loop as the family's tma
kernel, with descriptors as arguments (`host`), is timed beside the family's launch of the same
config (`device`) and cuBLAS, by the timer and plan of bench/kernels.py, for the recorded best
tma config of shapes where the tuned config trails cuBLAS by 2-8%; each launch is checked against
the family's reference first. `host` goes through Triton's JIT launcher, which turns the
descriptors into CUDA tensor maps on the CPU at every launch.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tilepilot.kernels.matmul_persistent_triton import _store_tile  # noqa: E402
from tilepilot.kernels.matmul_triton import tile_pid  # noqa: E402

# problem, tma config (BLOCK_SIZE_M, N, K, warps, stages, EPILOGUE_SUBTILE)
SHAPES = [((4096, 4096, 1024, "bf16"), (128, 256, 64, 8, 3, True)),
          ((2048, 4096, 4096, "bf16"), (128, 256, 64, 8, 3, True)),
          ((16384, 1024, 1024, "bf16"), (128, 256, 64, 8, 4, True)),
          ((8192, 2048, 512, "fp16"), (128, 128, 64, 4, 4, True)),
          ((4096, 4096, 4096, "bf16"), (128, 256, 64, 8, 3, True)),
          ((16384, 16384, 256, "bf16"), (128, 256, 64, 8, 4, True))]


@triton.jit
def host_desc_kernel(a_desc, b_desc, c_desc, M, N, K,
                     BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                     GROUP_SIZE_M: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr):
    """matmul_tma_kernel's tile loop with its descriptors as arguments."""
    start = tl.program_id(axis=0)
    programs = tl.num_programs(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    k_blocks = tl.cdiv(K, BLOCK_SIZE_K)
    for tile in tl.range(start, num_pid_m * num_pid_n, programs, flatten=True):
        pid_m, pid_n = tile_pid(tile, num_pid_m, num_pid_n, GROUP_SIZE_M)
        accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(0, k_blocks):
            a = a_desc.load([pid_m * BLOCK_SIZE_M, k * BLOCK_SIZE_K])
            b = b_desc.load([k * BLOCK_SIZE_K, pid_n * BLOCK_SIZE_N])
            accumulator = tl.dot(a, b, accumulator)
        _store_tile(c_desc, accumulator, pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N, BLOCK_SIZE_M, BLOCK_SIZE_N,
                    EPILOGUE_SUBTILE)


def host_launch(arms: Any, config: Any, out: Any) -> Any:
    """A closure launching host_desc_kernel for `config` on the problem of `arms` into `out`."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from tilepilot.kernels import matmul

    m, n, k = matmul.dims(arms.problem)
    bm, bn, bk = (int(config[name]) for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"))
    sub = bool(config["EPILOGUE_SUBTILE"])
    a, b = arms.inputs
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(b, [bk, bn])
    c_desc = TensorDescriptor.from_tensor(out, [bm, bn // 2 if sub else bn])
    programs = min(-(-m // bm) * -(-n // bn), matmul._programs(a))
    kernel = host_desc_kernel[(programs,)]

    def run() -> None:
        kernel(a_desc, b_desc, c_desc, m, n, k, BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=8,
               EPILOGUE_SUBTILE=sub, num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]))

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from kernels import Arms

    from tilepilot.experiments import Config
    from tilepilot.kernels import get_family
    from tilepilot.kernels.evaluate import Evaluator
    from tilepilot.kernels.timing import GpuTimer

    fam = get_family("matmul")
    ev = Evaluator("gpu")
    target, timer = ev.target(), GpuTimer()
    rows = []
    for (m, n, k, dtype), (bm, bn, bk, w, s, sub) in SHAPES:
        problem = fam.parse_problem({"M": m, "N": n, "K": k, "dtype": dtype})
        config = Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 8,
                            "num_warps": w, "num_stages": s, "VARIANT": "tma", "SPLIT_K": 1, "ALIGN_HINT": False,
                            "EPILOGUE_SUBTILE": sub, "WARP_SPECIALIZE": False})
        arms = Arms(fam, problem, target)
        arms.add("cublas", lambda out, p=problem, a=arms: fam.baseline(p, a.inputs, out))
        arms.config("device", config)
        arms.add("host", lambda out, a=arms, c=config: host_launch(a, c, out))
        row = {"problem": problem.label(), "config": config.as_dict(),
               "arms": arms.medians(arms.time(timer, fam.l2_flush))}
        rows.append(row)
        print(problem.label(), {a: v.get("median_ms") or v.get("error") for a, v in row["arms"].items()}, flush=True)
    Path(args.out).write_text(json.dumps({
        "what": __doc__.split("\n\n")[0], "command": "python bench/hostdesc_probe.py " + " ".join(argv or sys.argv[1:]),
        "date": dt.date.today().isoformat(), **ev.environment().as_dict(), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
