"""Does TMA multicast between the two CTAs of a cluster close the gap to cuBLAS where we trail it?

    python bench/multicast_probe.py --out bench/results/multicast-probe-h100.json

Every cuBLAS kernel where the tuned matmul trails runs in 1x2 or 2x1 clusters whose CTAs share one
operand's tile through TMA multicast (bench/results/ws-probe-h100.json), which Triton 3.6 cannot
express. Triton 3.9's Gluon dialect can: this probe's kernel (`mc_matmul_kernel`) runs two CTAs
per cluster, stacked along M, so they need the same B tile at every K step; the lead CTA loads it
once and the copy engine writes it into both CTAs' shared memory, while each CTA loads its own A
tile. A ring of STAGES slots is filled ahead of the warpgroup MMAs; before the lead refills a
slot it waits on a barrier both CTAs arrive at once their MMA of that slot is done (each copy of
B it overwrites lives in the other CTA too). Each arm is timed side by side with cuBLAS and one
config of the family's tma variant (`tma`, compiled by the installed Triton: what it makes of the
`tl` kernel; not always the shape's best recorded config) with the timer and plan of
bench/kernels.py (L2 cold), after its output is checked against the family's reference.
`mc-*` arms use the clusters; `solo-*` arms run the same kernel without them (one CTA a
program, no multicast), so the difference between the two is what the multicast buys. `pmc-*`
and `psolo-*` are the same pair for a persistent form of the kernel (`persistent_kernel`: one
program per SM, or per two SMs with clusters, whose ring runs on across its tiles), `wmc-*` and
`wsolo-*` for a warp-specialised one (`ws_kernel`: a warp of its own issues the loads), and
`ppmc-*` and `ppsolo-*` for a persistent ping-pong one (`pingpong_kernel`: a producer warp and two
warpgroups that take the program's tiles in turn, so one's epilogue overlaps the other's MMAs).
`--forms` picks which forms are timed.
Needs a Triton whose Gluon has cluster layouts (`cga_layout`) and multicast TMA loads (3.9).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

try:  # module-wide: the kernels' annotations (gl.constexpr) are looked up in this module's globals
    from triton.experimental.gluon import language as gl
except ImportError:  # a Triton without Gluon: has_multicast() says so
    gl = None

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# problem, the `tma` arm's config (BLOCK_SIZE_M, N, K, warps, stages, EPILOGUE_SUBTILE)
SHAPES = [((3000, 5000, 1000, "fp16"), (128, 256, 64, 8, 3, True)),
          ((1000, 3000, 2000, "bf16"), (128, 128, 64, 4, 4, False)),
          ((16384, 16384, 256, "bf16"), (128, 256, 64, 8, 4, True)),
          ((768, 3072, 768, "fp16"), (128, 128, 64, 4, 4, False)),
          ((1024, 1024, 16384, "bf16"), (128, 128, 64, 4, 4, False)),
          ((6144, 1536, 4096, "bf16"), (128, 256, 64, 8, 3, True)),
          ((4096, 4096, 4096, "bf16"), (128, 256, 64, 8, 3, True))]
# (rows per CTA, BLOCK_N, BLOCK_K, warps, stages)
TILES = [(128, 256, 64, 8, 4), (128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (128, 128, 64, 8, 5),
         (64, 256, 64, 4, 4), (64, 128, 64, 4, 6)]


# the persistent kernel keeps C's buffer beside the ring: fewer stages fit
PERSISTENT_TILES = [(128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (128, 128, 64, 8, 5), (64, 256, 64, 4, 4)]
WS_TILES = [(128, 256, 64, 8, 4), (128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (128, 128, 64, 8, 5)]
# the ping-pong kernel's warpgroup tile (its accumulator must fit one warpgroup's registers): 4 warps
PP_TILES = [(128, 128, 64, 4, 4), (128, 128, 64, 4, 5), (64, 256, 64, 4, 4)]


def gluon_kernel() -> Any:
    """The probe's Gluon kernels (one tile a program, persistent, warp-specialised, ping-pong),
    defined once Triton is known to have what they need."""
    from triton.experimental import gluon
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    @gluon.jit
    def _tile(pid, num_pid_m, num_pid_n, GROUP_SIZE_M: gl.constexpr):
        in_group = GROUP_SIZE_M * num_pid_n
        first_m = (pid // in_group) * GROUP_SIZE_M
        size_m = gl.minimum(num_pid_m - first_m, GROUP_SIZE_M)
        return first_m + (pid % in_group) % size_m, (pid % in_group) // size_m

    @gluon.jit
    def _load_slot(a_desc, b_desc, a_bufs, b_bufs, bar, slot, off_m, off_n, off_k, pred,
                   MULTICAST: gl.constexpr):
        """Fill ring slot `slot` with the A tile at (off_m, off_k) and the B tile at (off_k, off_n), both
        counted on `bar`; with MULTICAST the lead CTA's B load lands in both CTAs."""
        mbarrier.expect(bar.index(slot), a_desc.nbytes_per_cta + b_desc.nbytes_per_cta, pred=pred)
        tma.async_load(a_desc, [off_m, off_k], bar.index(slot), a_bufs.index(slot), pred=pred)
        tma.async_load(b_desc, [off_k, off_n], bar.index(slot), b_bufs.index(slot), pred=pred, multicast=MULTICAST)

    @gluon.jit
    def mc_matmul_kernel(a_desc, b_desc, c_desc, M, N, K, acc_layout: gl.constexpr, STAGES: gl.constexpr,
                         GROUP_SIZE_M: gl.constexpr, MULTICAST: gl.constexpr):
        """One output tile a program (with MULTICAST, a cluster of two CTAs stacked along M, the
        lead loading B's tile into both), its K steps through a ring of STAGES slots."""
        TILE_M: gl.constexpr = a_desc.block_shape[0]  # both CTAs' rows with MULTICAST
        BK: gl.constexpr = a_desc.block_shape[1]
        BN: gl.constexpr = b_desc.block_shape[1]
        pid_m, pid_n = _tile(gl.program_id(0), gl.cdiv(M, TILE_M), gl.cdiv(N, BN), GROUP_SIZE_M)
        off_m = pid_m * TILE_M
        off_n = pid_n * BN
        k_tiles = gl.cdiv(K, BK)

        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_shape, a_desc.layout)  # noqa: RUF005
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_shape, b_desc.layout)  # noqa: RUF005
        ready = mbarrier.allocate_mbarrier(batch=STAGES)  # each CTA's own: its slot is loaded
        # one for the pair, in the lead CTA: both CTAs are done with the slot
        empty = mbarrier.allocate_mbarrier(batch=STAGES, two_ctas=MULTICAST)
        for st in gl.static_range(STAGES):
            mbarrier.init(ready.index(st), count=1)
            mbarrier.init(empty.index(st), count=1)

        for i in gl.static_range(STAGES - 1):
            _load_slot(a_desc, b_desc, a_bufs, b_bufs, ready, i, off_m, off_n, i * BK, i < k_tiles, MULTICAST)

        acc = gl.zeros((TILE_M, BN), gl.float32, acc_layout)
        for k in range(k_tiles):
            s = k % STAGES
            mbarrier.wait(ready.index(s), (k // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, is_async=True)
            acc, _, _ = warpgroup_mma_wait(1, deps=[acc, a_bufs.index(s), b_bufs.index(s)])
            # the MMA of step k - 1 is done: its slot is the one step j refills
            j = k + STAGES - 1
            sj = j % STAGES
            refill = j < k_tiles
            mbarrier.arrive(empty.index(sj), pred=(k > 0) & refill)
            mbarrier.wait(empty.index(sj), ((j // STAGES) - 1) & 1, pred=refill & (j >= STAGES))
            _load_slot(a_desc, b_desc, a_bufs, b_bufs, ready, sj, off_m, off_n, j * BK, refill, MULTICAST)
        acc = warpgroup_mma_wait(0, deps=[acc])

        c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_shape, c_desc.layout)
        c_smem.store(acc.to(c_desc.dtype))
        tma.async_store(c_desc, [off_m, off_n], c_smem)
        tma.store_wait(0)

    @gluon.jit
    def _step_coords(step, start, programs, k_tiles, num_pid_m, num_pid_n, TILE_M: gl.constexpr,
                     BN: gl.constexpr, BK: gl.constexpr, GROUP_SIZE_M: gl.constexpr):
        """The tile offsets (rows, columns) and K offset of a program's `step`-th K step."""
        pid_m, pid_n = _tile(start + (step // k_tiles) * programs, num_pid_m, num_pid_n, GROUP_SIZE_M)
        return pid_m * TILE_M, pid_n * BN, (step % k_tiles) * BK

    @gluon.jit
    def persistent_kernel(a_desc, b_desc, c_desc, M, N, K, programs, acc_layout: gl.constexpr,
                          STAGES: gl.constexpr, GROUP_SIZE_M: gl.constexpr, MULTICAST: gl.constexpr):
        """mc_matmul_kernel over tiles start, start + programs, ...: the ring runs on across tiles (the
        loads of the next tile's first steps are in flight during this tile's last MMAs and its
        epilogue) and C leaves through a buffer of its own, stored asynchronously."""
        TILE_M: gl.constexpr = a_desc.block_shape[0]
        BK: gl.constexpr = a_desc.block_shape[1]
        BN: gl.constexpr = b_desc.block_shape[1]
        num_pid_m = gl.cdiv(M, TILE_M)
        num_pid_n = gl.cdiv(N, BN)
        start = gl.program_id(0)
        k_tiles = gl.cdiv(K, BK)
        total = gl.cdiv(num_pid_m * num_pid_n - start, programs) * k_tiles

        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_shape, a_desc.layout)  # noqa: RUF005
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_shape, b_desc.layout)  # noqa: RUF005
        c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_shape, c_desc.layout)
        ready = mbarrier.allocate_mbarrier(batch=STAGES)
        empty = mbarrier.allocate_mbarrier(batch=STAGES, two_ctas=MULTICAST)
        for st in gl.static_range(STAGES):
            mbarrier.init(ready.index(st), count=1)
            mbarrier.init(empty.index(st), count=1)

        for i in gl.static_range(STAGES - 1):
            pred = i < total
            om, on, ok = _step_coords(i, start, programs, k_tiles, num_pid_m, num_pid_n, TILE_M, BN, BK,
                                      GROUP_SIZE_M)
            _load_slot(a_desc, b_desc, a_bufs, b_bufs, ready, i, om, on, ok, pred, MULTICAST)

        acc = gl.zeros((TILE_M, BN), gl.float32, acc_layout)
        for g in range(total):
            s = g % STAGES
            kk = g % k_tiles
            mbarrier.wait(ready.index(s), (g // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, use_acc=kk > 0, is_async=True)
            acc, _, _ = warpgroup_mma_wait(1, deps=[acc, a_bufs.index(s), b_bufs.index(s)])
            j = g + STAGES - 1
            sj = j % STAGES
            refill = j < total
            mbarrier.arrive(empty.index(sj), pred=(g > 0) & refill)
            mbarrier.wait(empty.index(sj), ((j // STAGES) - 1) & 1, pred=refill & (j >= STAGES))
            om, on, ok = _step_coords(j, start, programs, k_tiles, num_pid_m, num_pid_n, TILE_M, BN, BK,
                                      GROUP_SIZE_M)
            _load_slot(a_desc, b_desc, a_bufs, b_bufs, ready, sj, om, on, ok, refill, MULTICAST)
            if kk == k_tiles - 1:
                acc = warpgroup_mma_wait(0, deps=[acc])
                cm, cn, _ck = _step_coords(g, start, programs, k_tiles, num_pid_m, num_pid_n, TILE_M, BN, BK,
                                           GROUP_SIZE_M)
                tma.store_wait(0)  # the last tile's store has read the buffer
                c_smem.store(acc.to(c_desc.dtype))
                fence_async_shared()
                tma.async_store(c_desc, [cm, cn], c_smem)
        tma.store_wait(0)

    @gluon.jit
    def _ws_loads(a_desc, b_desc, a_bufs, b_bufs, ready, mine, pair, off_m, off_n, k_tiles,
                  STAGES: gl.constexpr, MULTICAST: gl.constexpr):
        """The producer warp: fill slot k % STAGES once this CTA's MMAs (and with MULTICAST, the
        pair's, whose copy of B the lead's load also overwrites) are done with its last step."""
        BK: gl.constexpr = a_desc.block_shape[1]
        for k in range(k_tiles):
            s = k % STAGES
            again = k >= STAGES
            mbarrier.wait(mine.index(s), ((k // STAGES) - 1) & 1, pred=again)
            if MULTICAST:
                mbarrier.wait(pair.index(s), ((k // STAGES) - 1) & 1, pred=again)
            _load_slot(a_desc, b_desc, a_bufs, b_bufs, ready, s, off_m, off_n, k * BK, True, MULTICAST)

    @gluon.jit
    def _ws_mmas(a_bufs, b_bufs, ready, mine, pair, k_tiles, acc_layout: gl.constexpr, TILE_M: gl.constexpr,
                 BN: gl.constexpr, STAGES: gl.constexpr, MULTICAST: gl.constexpr):
        """The MMA warps: consume the slots in order, releasing each once the next MMA is issued."""
        acc = gl.zeros((TILE_M, BN), gl.float32, acc_layout)
        for k in range(k_tiles):
            s = k % STAGES
            mbarrier.wait(ready.index(s), (k // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, is_async=True)
            acc, _, _ = warpgroup_mma_wait(1, deps=[acc, a_bufs.index(s), b_bufs.index(s)])
            prev = (k + STAGES - 1) % STAGES
            mbarrier.arrive(mine.index(prev), pred=k > 0)
            if MULTICAST:
                mbarrier.arrive(pair.index(prev), pred=k > 0)
        acc = warpgroup_mma_wait(0, deps=[acc])
        return acc

    @gluon.jit
    def ws_kernel(a_desc, b_desc, c_desc, M, N, K, acc_layout: gl.constexpr, STAGES: gl.constexpr,
                  GROUP_SIZE_M: gl.constexpr, MULTICAST: gl.constexpr):
        """mc_matmul_kernel with its loads issued by a warp of their own (warp specialisation), so
        the MMA warps never wait for the other CTA of the pair, only for their data."""
        TILE_M: gl.constexpr = a_desc.block_shape[0]
        BN: gl.constexpr = b_desc.block_shape[1]
        BK: gl.constexpr = a_desc.block_shape[1]
        pid_m, pid_n = _tile(gl.program_id(0), gl.cdiv(M, TILE_M), gl.cdiv(N, BN), GROUP_SIZE_M)
        off_m = pid_m * TILE_M
        off_n = pid_n * BN
        k_tiles = gl.cdiv(K, BK)
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_shape, a_desc.layout)  # noqa: RUF005
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_shape, b_desc.layout)  # noqa: RUF005
        ready = mbarrier.allocate_mbarrier(batch=STAGES)
        mine = mbarrier.allocate_mbarrier(batch=STAGES)
        pair = mbarrier.allocate_mbarrier(batch=STAGES, two_ctas=MULTICAST)
        for st in gl.static_range(STAGES):
            mbarrier.init(ready.index(st), count=1)
            mbarrier.init(mine.index(st), count=1)
            mbarrier.init(pair.index(st), count=1)
        acc = gl.warp_specialize([
            (_ws_mmas, (a_bufs, b_bufs, ready, mine, pair, k_tiles, acc_layout, TILE_M, BN, STAGES, MULTICAST)),
            (_ws_loads, (a_desc, b_desc, a_bufs, b_bufs, ready, mine, pair, off_m, off_n, k_tiles, STAGES,
                         MULTICAST)),
        ], [1], [40])
        c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_shape, c_desc.layout)
        c_smem.store(acc.to(c_desc.dtype))
        fence_async_shared()
        tma.async_store(c_desc, [off_m, off_n], c_smem)
        tma.store_wait(0)

    @gluon.jit
    def _pp_loads(a_desc, b_desc, a_bufs, b_bufs, ready, mine, pair, start, programs, my_tiles, k_tiles,
                  num_pid_m, num_pid_n, GROUP_SIZE_M: gl.constexpr, STAGES: gl.constexpr,
                  MULTICAST: gl.constexpr):
        """The producer warp of the ping-pong kernel: every K step of the program's tiles, in order."""
        TILE_M: gl.constexpr = a_desc.block_shape[0]
        BK: gl.constexpr = a_desc.block_shape[1]
        BN: gl.constexpr = b_desc.block_shape[1]
        for g in range(my_tiles * k_tiles):
            s = g % STAGES
            again = g >= STAGES
            mbarrier.wait(mine.index(s), ((g // STAGES) - 1) & 1, pred=again)
            if MULTICAST:
                mbarrier.wait(pair.index(s), ((g // STAGES) - 1) & 1, pred=again)
            om, on, ok = _step_coords(g, start, programs, k_tiles, num_pid_m, num_pid_n, TILE_M, BN, BK,
                                      GROUP_SIZE_M)
            _load_slot(a_desc, b_desc, a_bufs, b_bufs, ready, s, om, on, ok, True, MULTICAST)

    @gluon.jit
    def _pp_mmas(a_bufs, b_bufs, c_desc, c_smem, ready, mine, pair, turn, start, programs, my_tiles, k_tiles,
                 num_pid_m, num_pid_n, first: gl.constexpr, acc_layout: gl.constexpr, GROUP_SIZE_M: gl.constexpr,
                 STAGES: gl.constexpr, MULTICAST: gl.constexpr):
        """One of the two consumer warpgroups: tiles first, first + 2, ... of the program, each with
        its own epilogue, which overlaps the other warpgroup's MMAs. The two take turns at the
        ring: a warpgroup starts a tile's MMAs once the other has issued all of its previous tile's
        (`turn`), so that no warpgroup waits on a slot's barrier more than one phase ahead."""
        TILE_M: gl.constexpr = c_desc.block_shape[0]
        BN: gl.constexpr = c_desc.block_shape[1]
        BK: gl.constexpr = a_bufs.shape[2]
        for i in range(first, my_tiles, 2):
            j = i // 2  # this warpgroup's j-th tile
            if first == 0:
                mbarrier.wait(turn.index(0), (j - 1) & 1, pred=j > 0)
            else:
                mbarrier.wait(turn.index(1), j & 1)
            acc = gl.zeros((TILE_M, BN), gl.float32, acc_layout)
            for kk in range(k_tiles):
                g = i * k_tiles + kk
                s = g % STAGES
                mbarrier.wait(ready.index(s), (g // STAGES) & 1)
                acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, is_async=True)
                acc, _, _ = warpgroup_mma_wait(1, deps=[acc, a_bufs.index(s), b_bufs.index(s)])
                prev = (g + STAGES - 1) % STAGES
                mbarrier.arrive(mine.index(prev), pred=kk > 0)
                if MULTICAST:
                    mbarrier.arrive(pair.index(prev), pred=kk > 0)
            mbarrier.arrive(turn.index(1 - first))  # the other warpgroup's turn
            acc = warpgroup_mma_wait(0, deps=[acc])
            last = (i * k_tiles + k_tiles - 1) % STAGES
            mbarrier.arrive(mine.index(last))
            if MULTICAST:
                mbarrier.arrive(pair.index(last))
            cm, cn, _ck = _step_coords(i * k_tiles, start, programs, k_tiles, num_pid_m, num_pid_n, TILE_M, BN,
                                       BK, GROUP_SIZE_M)
            tma.store_wait(0)  # this warpgroup's last store has read its buffer
            c_smem.store(acc.to(c_desc.dtype))
            fence_async_shared()
            tma.async_store(c_desc, [cm, cn], c_smem)
        tma.store_wait(0)

    @gluon.jit
    def pingpong_kernel(a_desc, b_desc, c_desc, M, N, K, programs, acc_layout: gl.constexpr,
                        STAGES: gl.constexpr, GROUP_SIZE_M: gl.constexpr, MULTICAST: gl.constexpr):
        """Persistent, warp-specialised: a producer warp fills the ring with every K step of the
        program's tiles in order, and two warpgroups (4 warps each) take the tiles in turn, so one's
        epilogue overlaps the other's MMAs. Each warpgroup's tile is TILE_M x BN (its accumulator
        holds BN fp32 registers a thread)."""
        TILE_M: gl.constexpr = a_desc.block_shape[0]
        BK: gl.constexpr = a_desc.block_shape[1]
        BN: gl.constexpr = b_desc.block_shape[1]
        num_pid_m = gl.cdiv(M, TILE_M)
        num_pid_n = gl.cdiv(N, BN)
        start = gl.program_id(0)
        k_tiles = gl.cdiv(K, BK)
        my_tiles = gl.cdiv(num_pid_m * num_pid_n - start, programs)
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_shape, a_desc.layout)  # noqa: RUF005
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_shape, b_desc.layout)  # noqa: RUF005
        c0 = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_shape, c_desc.layout)
        c1 = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_shape, c_desc.layout)
        ready = mbarrier.allocate_mbarrier(batch=STAGES)
        mine = mbarrier.allocate_mbarrier(batch=STAGES)
        pair = mbarrier.allocate_mbarrier(batch=STAGES, two_ctas=MULTICAST)
        turn = mbarrier.allocate_mbarrier(batch=2)
        for st in gl.static_range(STAGES):
            mbarrier.init(ready.index(st), count=1)
            mbarrier.init(mine.index(st), count=1)
            mbarrier.init(pair.index(st), count=1)
        mbarrier.init(turn.index(0), count=1)
        mbarrier.init(turn.index(1), count=1)
        gl.warp_specialize([
            (_pp_mmas, (a_bufs, b_bufs, c_desc, c0, ready, mine, pair, turn, start, programs, my_tiles, k_tiles,
                        num_pid_m, num_pid_n, 0, acc_layout, GROUP_SIZE_M, STAGES, MULTICAST)),
            (_pp_mmas, (a_bufs, b_bufs, c_desc, c1, ready, mine, pair, turn, start, programs, my_tiles, k_tiles,
                        num_pid_m, num_pid_n, 1, acc_layout, GROUP_SIZE_M, STAGES, MULTICAST)),
            (_pp_loads, (a_desc, b_desc, a_bufs, b_bufs, ready, mine, pair, start, programs, my_tiles, k_tiles,
                         num_pid_m, num_pid_n, GROUP_SIZE_M, STAGES, MULTICAST)),
        ], [4, 1], [232, 40])

    return mc_matmul_kernel, persistent_kernel, ws_kernel, pingpong_kernel


def has_multicast() -> str | None:
    """None where the installed Triton's Gluon has cluster layouts and multicast TMA loads, else why not."""
    import inspect

    import triton
    try:
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.hopper import tma
    except ImportError as e:
        return f"Triton {triton.__version__} has no Gluon ({e})"
    load = getattr(tma, "async_load", None)
    try:
        load_params = inspect.signature(load).parameters if load is not None else {}
    except (TypeError, ValueError):
        load_params = {}
    if "multicast" not in load_params or "cga_layout" not in getattr(gl.NVMMASharedLayout, "__dataclass_fields__", {}):
        return f"Triton {triton.__version__}'s Gluon has no multicast TMA load or no cluster layouts"
    return None


def launch(kernels: Any, arms: Any, tile: tuple[int, int, int, int, int], multicast: bool, out: Any,
           form: str = "tiles") -> Any:
    """A launch of `form` (tiles, persistent or ws) at `tile` on the arm's inputs into `out`, with
    two CTAs a cluster sharing B where `multicast`; the descriptors are made once, here."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    rows, bn, bk, warps, stages = tile
    a, b = arms.inputs[0], arms.inputs[1]
    gdtype = {"torch.float16": gl.float16, "torch.bfloat16": gl.bfloat16}[str(a.dtype)]
    tile_m = 2 * rows if multicast else rows
    split, shared = ([[1, 0]], [[0, 0]]) if multicast else ([], [])
    a_desc = TensorDescriptor.from_tensor(a, [tile_m, bk], gl.NVMMASharedLayout.get_default_for(
        [tile_m, bk], gdtype, cga_layout=split))
    b_desc = TensorDescriptor.from_tensor(b, [bk, bn], gl.NVMMASharedLayout.get_default_for(
        [bk, bn], gdtype, cga_layout=shared))
    c_desc = TensorDescriptor.from_tensor(out, [tile_m, bn], gl.NVMMASharedLayout.get_default_for(
        [tile_m, bn], gdtype, cga_layout=split))
    acc_layout = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, bn, 16],
                                           cga_layout=split)
    m, k = a.shape
    n = b.shape[1]
    tiles = -(-m // tile_m) * -(-n // bn)
    ctas = 2 if multicast else 1
    if form in ("persistent", "pp"):  # one program a cluster slot of the GPU's SMs
        import torch

        programs = min(tiles, torch.cuda.get_device_properties(a.device).multi_processor_count // ctas)
        persistent = kernels[1] if form == "persistent" else kernels[3]

        def run() -> None:
            persistent[(programs,)](a_desc, b_desc, c_desc, m, n, k, programs, acc_layout, stages, 8, multicast,
                                    num_warps=warps, num_ctas=ctas)
        return run

    kernel = kernels[2] if form == "ws" else kernels[0]

    def run_tiles() -> None:
        kernel[(tiles,)](a_desc, b_desc, c_desc, m, n, k, acc_layout, stages, 8, multicast,
                         num_warps=warps, num_ctas=ctas)

    return run_tiles


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", type=int, default=len(SHAPES), help="the first N shapes only")
    ap.add_argument("--forms", default="tiles,persistent,ws,pp",
                    help="kernel forms to time, comma-separated: tiles (mc-/solo- arms), persistent (pmc-/psolo-), "
                         "ws (wmc-/wsolo-), pp (ppmc-/ppsolo-)")
    args = ap.parse_args(argv)
    from kernels import Arms, gpu_probe, write_probe
    from record import tile_config

    from tilepilot.experiments import InputError

    forms = set(args.forms.split(","))
    if not forms <= {"tiles", "persistent", "ws", "pp"}:
        raise InputError(f"--forms {args.forms!r}: each must be tiles, persistent, ws or pp")
    fam, ev, target, timer = gpu_probe("matmul")
    missing = has_multicast()
    if missing:
        raise InputError(f"{missing}: this probe needs Triton 3.9 or later (bench/triton_overlay.sh)")
    kernels = gluon_kernel()
    rows = []
    for (m, n, k, dtype), (bm, bn, bk, w, s, sub) in SHAPES[:args.shapes]:
        problem = fam.parse_problem({"M": m, "N": n, "K": k, "dtype": dtype})
        config = tile_config(bm, bn, bk, w, s, VARIANT="tma", EPILOGUE_SUBTILE=sub)
        arms = Arms(fam, problem, target)
        arms.baseline("cublas")
        arms.config("tma", config)
        for form, tiles, (with_mc, without) in (("tiles", TILES, ("mc", "solo")),
                                                 ("persistent", PERSISTENT_TILES, ("pmc", "psolo")),
                                                 ("ws", WS_TILES, ("wmc", "wsolo")),
                                                 ("pp", PP_TILES, ("ppmc", "ppsolo"))):
            if form not in forms:
                continue
            for tile in tiles:
                name = "{}x{}x{}-w{}-s{}".format(*tile)
                for mc, arm in ((True, with_mc), (False, without)):
                    arms.add(f"{arm}-{name}",
                             lambda out, t=tile, a=arms, mc=mc, f=form: launch(kernels, a, t, mc, out, f),
                             tile=list(tile))
        row: dict[str, Any] = {"problem": problem.label(), "tma_config": config.as_dict(),
                               "arms": arms.medians(arms.time(timer, fam.l2_flush))}
        rows.append(row)
        got = {a: v.get("median_ms") or v.get("error") for a, v in row["arms"].items()}
        print(problem.label(), got, flush=True)
        write_probe(args.out, __doc__, "multicast_probe.py", argv, ev, rows)  # after each shape
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
