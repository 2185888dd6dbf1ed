"""Do decode-shaped matmuls (B read once) go faster when B's loads are marked evict-first in L2?

    python bench/evict_probe.py --out bench/results/evict-probe-h100.json
    python bench/evict_probe.py --ptx-only --out bench/results/evict-probe-ptx-h100.json

A decode matmul streams B (32 MB at 4096×4096 bf16) once, and takes about twice the time HBM
needs to deliver it (bench/results/decode-probe-h100.json: a kernel that only reads B takes 20.4 µs,
1.6 TB/s). Before each timed launch the L2 is flushed by zeroing a buffer twice its size, which
leaves the L2 full of dirty lines: each line of B brought in can first write one back. A load
marked evict-first (`eviction_policy="evict_first"`, PTX `L2::evict_first` through a cache
policy) makes B's own lines the first to go, so B replaces B and the rest of L2 stays as it was.

For the decode shapes of the recorded problems, timed side by side with the timer and plan of
bench/kernels.py (events around each launch, L2 flushed before it), under two flushes: `dirty`,
the timer's own (a zeroed buffer), and `clean`, the same buffer read instead of written (the L2
left full of clean lines, as after a kernel that only read):
- `cublas`: torch.matmul;
- `grouped-*` / `fused-*` (VARIANT=grouped / splitk_fused) at the configs bench/kernels.py's
  finalists come from, each as the family's kernel (`plain`) and as the same kernel with B's loads
  evict-first (`evict`); copies of the family's kernels, here with an EVICT_B switch;
- `read-plain` / `read-evict`: a kernel that only reads B, without and with evict-first.
Each matmul arm's output is checked against the family's reference before it is timed.

`--ptx-only`: instead of timing, the memory operations in the PTX the installed Triton builds for
the matmul kernel (64×32×128 tiles, 5 stages, at M = 64) and the read kernel, each without and with
evict-first.

What it found (bench/results/evict-probe-h100.json, Triton 3.6): the matmul arms take the same time
either way, because Triton 3.6 drops the eviction policy from the `cp.async` copies its pipeline
turns these loads into (evict-probe-ptx-h100.json: the same loads in both, no `createpolicy`; Triton
3.9 keeps it as an `L2::cache_hint`); the read kernel, whose plain loads keep it, gains about 2 µs
after the zeroing flush. And the flush itself matters: cuBLAS and every arm are 3-10 µs faster after
the reading flush.
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
from tilepilot.kernels.timing import GpuTimer  # noqa: E402

SHAPES = ((1, 4096, 4096), (4, 4096, 4096), (16, 4096, 4096), (64, 4096, 4096), (128, 4096, 4096),
          (256, 4096, 4096), (8, 14336, 4096), (32, 8192, 8192), (512, 14336, 4096))
VARIANTS = ("grouped", "splitk_fused")
PER_VARIANT = 3  # finalists of each variant timed per shape
READ_PROGRAMS = 1056  # the read kernel's fastest program count in decode-probe-h100.json (8 warps)


@triton.jit
def partial_tile(a_ptr, b_ptr, pid_m, pid_n, split, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                 BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                 SPLIT_K: tl.constexpr, EVICT_B: tl.constexpr):
    """matmul_splitk_triton.split_partial with B's loads evict-first when EVICT_B."""
    k_blocks = tl.cdiv(K, BLOCK_SIZE_K)
    per_split = tl.cdiv(k_blocks, SPLIT_K)
    first = split * per_split
    last = min(first + per_split, k_blocks)
    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + (first * BLOCK_SIZE_K + offs_k[None, :]) * stride_ak)
    b_ptrs = b_ptr + ((first * BLOCK_SIZE_K + offs_k[:, None]) * stride_bk + offs_bn[None, :] * stride_bn)
    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(first, last):
        k_left = K - k * BLOCK_SIZE_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        if EVICT_B:
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0, eviction_policy="evict_first")
        else:
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        accumulator = tl.dot(a, b, accumulator)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    return accumulator


@triton.jit
def probe_matmul_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, lock_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
    SPLIT_K: tl.constexpr, EVICT_B: tl.constexpr,
):
    """The grouped kernel (SPLIT_K = 1) or splitk_fused (SPLIT_K > 1), B's loads evict-first when EVICT_B."""
    tile = tl.program_id(axis=0)
    pid_m, pid_n = tile_pid(tile, tl.cdiv(M, BLOCK_SIZE_M), tl.cdiv(N, BLOCK_SIZE_N), GROUP_SIZE_M)
    split = tl.program_id(axis=1)
    acc = partial_tile(a_ptr, b_ptr, pid_m, pid_n, split, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                       BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, SPLIT_K, EVICT_B)
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    if SPLIT_K == 1:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
    else:
        tile_size: tl.constexpr = BLOCK_SIZE_M * BLOCK_SIZE_N
        offs_tile = tl.arange(0, BLOCK_SIZE_M)[:, None] * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)[None, :]
        ws_tile = ws_ptr + tile.to(tl.int64) * (SPLIT_K * tile_size) + offs_tile
        tl.store(ws_tile + split * tile_size, acc, mask=c_mask, cache_modifier=".cg")
        tl.debug_barrier()
        ticket = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:
            total = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                total += tl.load(ws_tile + s * tile_size, mask=c_mask, other=0.0, cache_modifier=".cg")
            tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=c_mask)
            tl.atomic_xchg(lock_ptr + tile, 0)


@triton.jit
def read_kernel(b_ptr, out_ptr, n_elements, per_program, BLOCK: tl.constexpr, EVICT_B: tl.constexpr):
    pid = tl.program_id(0)
    start = pid * per_program
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for off in range(start, min(start + per_program, n_elements), BLOCK):
        idx = off + tl.arange(0, BLOCK)
        if EVICT_B:
            x = tl.load(b_ptr + idx, mask=idx < n_elements, other=0.0, eviction_policy="evict_first")
        else:
            x = tl.load(b_ptr + idx, mask=idx < n_elements, other=0.0)
        acc += x.to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


def probe_launch(a: Any, b: Any, c: dict[str, Any], evict: bool) -> Any:
    """For Arms.add: probe_matmul_kernel at config `c` (grouped or splitk_fused) writing `out`."""
    import torch

    (m, k), n = a.shape, b.shape[1]
    bm, bn, bk = c["BLOCK_SIZE_M"], c["BLOCK_SIZE_N"], c["BLOCK_SIZE_K"]
    split = c.get("SPLIT_K", 1)
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    ws = torch.empty(max(1, tiles * split * bm * bn if split > 1 else 1), device=a.device, dtype=torch.float32)
    locks = torch.zeros(tiles, device=a.device, dtype=torch.int32)

    def make(out: Any) -> Any:
        def run() -> None:
            probe_matmul_kernel[(tiles, split)](
                a, b, out, ws, locks, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                out.stride(0), out.stride(1), BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk,
                GROUP_SIZE_M=c["GROUP_SIZE_M"], SPLIT_K=split, EVICT_B=evict, num_warps=c["num_warps"],
                num_stages=c["num_stages"])
        return run
    return make


class CleanFlushTimer(GpuTimer):
    """The bench timer, its L2 flush reading the flush buffer instead of zeroing it: the L2 is
    left full of clean lines."""

    def flush(self) -> None:
        if self._flush_buf is None:
            super().flush()
        self._sink = self._flush_buf.sum()


def read_share(b: Any) -> int:
    """Elements of B each of the read kernel's programs reads: a whole number of its 4096-element blocks."""
    return triton.cdiv(triton.cdiv(b.numel(), READ_PROGRAMS), 4096) * 4096


PTX_OPS = r"((?:ld\.global|cp\.async|createpolicy)[\w:.]*)"  # the loads and cache policies in a PTX listing


def ptx_rows() -> list[dict[str, Any]]:
    """Each kernel (the matmul at 64×32×128 tiles, 5 stages, M = 64; the read kernel) without and with
    evict-first: the distinct memory operations of the PTX the installed Triton builds for it."""
    import re

    import torch

    m, n, k = 64, 4096, 4096
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    ws = torch.empty(1, device="cuda", dtype=torch.float32)
    locks = torch.zeros(n // 32, device="cuda", dtype=torch.int32)
    sink = torch.empty(READ_PROGRAMS, device="cuda", dtype=torch.float32)
    rows = []
    for evict in (False, True):
        mm = probe_matmul_kernel[(n // 32, 1)](
            a, b, out, ws, locks, m, n, k, k, 1, n, 1, n, 1, BLOCK_SIZE_M=64, BLOCK_SIZE_N=32, BLOCK_SIZE_K=128,
            GROUP_SIZE_M=8, SPLIT_K=1, EVICT_B=evict, num_warps=4, num_stages=5)
        rd = read_kernel[(READ_PROGRAMS,)](b, sink, b.numel(), read_share(b), BLOCK=4096, EVICT_B=evict,
                                           num_warps=8)
        for name, compiled in (("matmul 64x32x128 s5", mm), ("read", rd)):
            rows.append({"kernel": name, "evict_first": evict,
                         "ops": sorted(set(re.findall(PTX_OPS, compiled.asm["ptx"])))})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ptx-only", action="store_true", help="record the kernels' PTX memory operations, no timing")
    args = ap.parse_args(argv)

    import torch
    from kernels import Arms, gpu_probe, tuned_finalists, write_probe

    fam, ev, target, timer = gpu_probe("matmul")
    if args.ptx_only:
        rows = ptx_rows()
        for r in rows:
            print(r, flush=True)
        write_probe(args.out, __doc__, "evict_probe.py", argv, ev, rows)
        return 0
    clean = CleanFlushTimer()
    finalists = tuned_finalists("matmul")
    rows = []
    for m, n, k in SHAPES:
        problem = fam.parse_problem({"M": m, "N": n, "K": k, "dtype": "bf16"})
        arms = Arms(fam, problem, target)
        arms.baseline("cublas")
        a, b = arms.inputs
        picked: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
        for cfg in finalists.get(problem.key(), []):
            d = cfg.as_dict()
            v = d.get("VARIANT", "grouped")
            if v in picked and len(picked[v]) < PER_VARIANT and not d.get("ALIGN_HINT"):
                picked[v].append(d)
        for v, cfgs in picked.items():
            for c in cfgs:
                tag = (f"{'fused' if v == 'splitk_fused' else v}-{c['BLOCK_SIZE_M']}x{c['BLOCK_SIZE_N']}x"
                       f"{c['BLOCK_SIZE_K']}-w{c['num_warps']}s{c['num_stages']}g{c['GROUP_SIZE_M']}"
                       f"k{c.get('SPLIT_K', 1)}")
                for evict in (False, True):
                    arms.add(f"{tag}-{'evict' if evict else 'plain'}", probe_launch(a, b, c, evict), config=c)
        sink = torch.empty(READ_PROGRAMS, device="cuda", dtype=torch.float32)
        per = read_share(b)
        extra = {}
        for evict in (False, True):
            def run(b: Any = b, sink: Any = sink, per: int = per, evict: bool = evict) -> None:
                read_kernel[(READ_PROGRAMS,)](b, sink, b.numel(), per, BLOCK=4096, EVICT_B=evict, num_warps=8)
            run()
            extra[f"read-{'evict' if evict else 'plain'}"] = run
        row: dict[str, Any] = {"problem": problem.label()}
        for flush, t in (("dirty", timer), ("clean", clean)):
            row[flush] = arms.medians(arms.time(t, fam.l2_flush, extra=extra))
            best = sorted((x["median_ms"], name) for name, x in row[flush].items() if x.get("median_ms"))
            print(problem.label(), flush, "cublas", row[flush].get("cublas", {}).get("median_ms"), best[:8],
                  flush=True)
        rows.append(row)
    write_probe(args.out, __doc__, "evict_probe.py", argv, ev, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
