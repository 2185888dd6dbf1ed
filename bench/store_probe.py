"""Where the output write bounds a matmul (16384x16384x256), does storing C from registers
(`tl.store` through pointers) overlap the next tile's main loop better than the tma kernel's
store through C's tensor descriptor, and how far is either from the device's write rate?

    python bench/store_probe.py --out bench/results/store-probe-h100.json

For shapes whose output is large against their K, timed side by side with the timer and plan of
bench/kernels.py: `cublas`; VARIANT=tma configs of the family (C stored through its descriptor,
whole or as two halves with EPILOGUE_SUBTILE); `ptr-*`: this script's kernel, the tma kernel's
persistent tile loop (flattened with the K loop, A and B loaded through host descriptors) with C
stored from registers through pointers (masked, no staging in shared memory); and `write-only`:
`out.fill_(0)`, the same bytes written by one PyTorch kernel (not a matmul: the write ceiling).
Each matmul arm's output is checked against the family's reference before it is timed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tilepilot.kernels.matmul_triton import tile_pid  # noqa: E402

SHAPES = [(16384, 16384, 256, "bf16"), (8192, 8192, 512, "bf16"), (8192, 2048, 512, "fp16"),
          (4096, 4096, 1024, "bf16"), (4096, 4096, 4096, "bf16")]
TILES = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4),
         (256, 128, 64, 8, 3), (128, 128, 128, 8, 3)]


@triton.jit
def tma_ptr_store_kernel(a_desc, b_desc, c_ptr, M, N, K, stride_cm,
                         BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                         GROUP_SIZE_M: tl.constexpr):
    start = tl.program_id(axis=0)
    programs = tl.num_programs(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    k_blocks = tl.cdiv(K, BLOCK_SIZE_K)
    for tile in tl.range(start, num_pid_m * num_pid_n, programs, flatten=True):
        pid_m, pid_n = tile_pid(tile, num_pid_m, num_pid_n, GROUP_SIZE_M)
        accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(k_blocks):
            a = a_desc.load([pid_m * BLOCK_SIZE_M, k * BLOCK_SIZE_K])
            b = b_desc.load([k * BLOCK_SIZE_K, pid_n * BLOCK_SIZE_N])
            accumulator = tl.dot(a, b, accumulator)
        offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(c_ptrs, accumulator.to(c_ptr.dtype.element_ty), mask=mask)



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from kernels import Arms, gpu_probe, write_probe
    from triton.tools.tensor_descriptor import TensorDescriptor

    from tilepilot.experiments import Config
    from tilepilot.kernels.matmul import _programs

    def ptr_store(inputs: tuple[Any, ...], out: Any, bm: int, bn: int, bk: int, w: int, s: int) -> Any:
        a, b = inputs
        m, k = a.shape
        n = b.shape[1]
        a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
        b_desc = TensorDescriptor.from_tensor(b, [bk, bn])
        grid = (min(_programs(a), -(-m // bm) * -(-n // bn)),)

        def launch() -> None:
            tma_ptr_store_kernel[grid](a_desc, b_desc, out, m, n, k, out.stride(0), BLOCK_SIZE_M=bm,
                                       BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=8, num_warps=w, num_stages=s)
        return launch

    fam, ev, target, timer = gpu_probe("matmul")
    rows = []
    for m, n, k, dtype in SHAPES:
        problem = fam.parse_problem({"M": m, "N": n, "K": k, "dtype": dtype})
        arms = Arms(fam, problem, target)
        arms.baseline("cublas")
        for bm, bn, bk, w, s in TILES:
            for subtile in (False, True):
                c = Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 8,
                               "num_warps": w, "num_stages": s, "VARIANT": "tma", "EPILOGUE_SUBTILE": subtile})
                if fam.space().check(c, problem) is None:
                    arms.config(f"tma{'-sub' if subtile else ''}-{bm}x{bn}x{bk}-w{w}s{s}", c)
            arms.add(f"ptr-{bm}x{bn}x{bk}-w{w}s{s}",
                     lambda out, a=arms, t=(bm, bn, bk, w, s): ptr_store(a.inputs, out, *t),
                     config={"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "num_warps": w,
                             "num_stages": s})
        sink = fam.make_output(problem, arms.inputs)
        timings = arms.time(timer, fam.l2_flush, extra={"write-only": lambda o=sink: o.fill_(0)})
        row: dict[str, Any] = {"problem": problem.label(), "output_bytes": m * n * sink.element_size(),
                               "arms": arms.medians(timings)}
        rows.append(row)
        got = {a: r.get("median_ms") for a, r in row["arms"].items() if r.get("median_ms")}
        best_tma = min(((v, a) for a, v in got.items() if a.startswith("tma")), default=None)
        best_ptr = min(((v, a) for a, v in got.items() if a.startswith("ptr")), default=None)
        print(problem.label(), "cublas", got.get("cublas"), "| best tma", best_tma, "| best ptr", best_ptr,
              "| write-only", got.get("write-only"), flush=True)
    write_probe(args.out, __doc__, "store_probe.py", argv, ev, rows)
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
