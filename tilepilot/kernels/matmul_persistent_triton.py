"""VARIANT=persistent, tma, tma_tail and streamk of the `matmul` family: persistent kernels with a
tile scheduler (Triton's 09-persistent-matmul tutorial); and tma_splitk, which borrows their K loop.

The host launches one program per SM (fewer when there are fewer tiles); program p computes the
output tiles p, p + P, p + 2P, ... (P programs) in the grouped order of the tutorial kernel, so
a program's loads of the next tile overlap the epilogue of the current one (the tile loop and the
K loop are flattened into one pipelined loop) and no launch pays for more than one wave.

- `matmul_persistent_kernel` loads through pointers, like the grouped kernel (wrapped edge rows
  and columns, masked K, ALIGN_K / ALIGN_N, see matmul_triton.py);
- `matmul_tma_kernel` loads A and B and stores C through tensor descriptors: on Hopper the bulk
  tensor copy engine (TMA) moves whole tiles between global and shared memory and fills
  out-of-bounds rows and columns with zeros, so the kernel needs no masks. The host makes the
  descriptors (`TensorDescriptor`, one per operand and block shape) and passes them as arguments;
  made in every program instead (`tl.make_tensor_descriptor`), they cost each launch about 2.3 us
  on an H100 (bench/results/hostdesc-probe-h100.json). TMA needs 16-byte aligned row strides (K and
  N times the element size): the family's constraints refuse other problems;
- `matmul_tma_tail_kernel` and `matmul_tma_streamk_kernel`: the tma kernel with the last, partial
  wave of tiles shared out among all the programs, split along K (see each kernel);
- `matmul_tma_splitk_kernel`: not persistent: one program per output tile and K range (grid: tiles ×
  SPLIT_K), each running the tma kernel's K loop over its range and storing its fp32 partial
  through pointers to a workspace that splitk_reduce_kernel (matmul_splitk_triton.py) sums in a
  fixed order: split-K with TMA loads, for few tiles and a long K;
- `matmul_tma_wide_kernel`: the tma kernel with a tile BLOCK_SIZE_N wide that is not a power of
  two (160 or 192, as cuBLAS's 192x128 or 160x256 tiles), which Triton's blocks cannot be: two
  column blocks side by side, of the largest power of two below it and the rest, each with its own
  descriptors and accumulator, the A tile loaded once for both products.

The descriptor arguments (`*_desc`) and their block shapes: `descriptor_blocks` in matmul.py.

Imported only inside a worker's child process.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tilepilot.kernels.matmul_triton import aligned, tile_pid


@triton.jit
def matmul_persistent_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, ALIGN_K: tl.constexpr, ALIGN_N: tl.constexpr,
):
    K = aligned(K, ALIGN_K)
    stride_am = aligned(stride_am, ALIGN_K)
    N = aligned(N, ALIGN_N)
    stride_bk = aligned(stride_bk, ALIGN_N)
    stride_cm = aligned(stride_cm, ALIGN_N)
    start = tl.program_id(axis=0)
    programs = tl.num_programs(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    k_blocks = tl.cdiv(K, BLOCK_SIZE_K)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    for tile in tl.range(start, num_pid_m * num_pid_n, programs, flatten=True):
        pid_m, pid_n = tile_pid(tile, num_pid_m, num_pid_n, GROUP_SIZE_M)
        offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
        offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
        accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(0, k_blocks):
            k_left = K - k * BLOCK_SIZE_K
            a_ptrs = a_ptr + offs_am[:, None] * stride_am + (k * BLOCK_SIZE_K + offs_k[None, :]) * stride_ak
            b_ptrs = b_ptr + (k * BLOCK_SIZE_K + offs_k[:, None]) * stride_bk + offs_bn[None, :] * stride_bn
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            accumulator = tl.dot(a, b, accumulator)
        offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
        c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
        tl.store(c_ptrs, accumulator.to(c_ptr.dtype.element_ty), mask=c_mask)


@triton.jit
def matmul_tma_kernel(
    a_desc, b_desc, c_desc,
    M, N, K,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr = False, WARP_SPECIALIZE: tl.constexpr = False,
):
    start = tl.program_id(axis=0)
    programs = tl.num_programs(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    k_blocks = tl.cdiv(K, BLOCK_SIZE_K)
    _whole_waves(a_desc, b_desc, c_desc, start, num_pid_m * num_pid_n, programs, num_pid_m, num_pid_n, k_blocks,
                 BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, EPILOGUE_SUBTILE, WARP_SPECIALIZE)


@triton.jit
def _k_range(a_desc, b_desc, pid_m, pid_n, k0, k1, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
             BLOCK_SIZE_K: tl.constexpr):
    """The fp32 product of one output tile over the K-blocks [k0, k1), loaded through the descriptors."""
    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(k0, k1):
        a = a_desc.load([pid_m * BLOCK_SIZE_M, k * BLOCK_SIZE_K])
        b = b_desc.load([k * BLOCK_SIZE_K, pid_n * BLOCK_SIZE_N])
        accumulator = tl.dot(a, b, accumulator)
    return accumulator


@triton.jit
def _whole_waves(a_desc, b_desc, c_desc, start, end, programs, num_pid_m, num_pid_n, k_blocks,
                 BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                 GROUP_SIZE_M: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    """Tiles start, start + programs, ... below `end`, each computed whole and stored: one tile loop
    flattened with its K loop, so the loads of the next tile overlap the epilogue of this one."""
    for tile in tl.range(start, end, programs, flatten=True, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = tile_pid(tile, num_pid_m, num_pid_n, GROUP_SIZE_M)
        accumulator = _k_range(a_desc, b_desc, pid_m, pid_n, 0, k_blocks, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
        _store_tile(c_desc, accumulator, pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N, BLOCK_SIZE_M, BLOCK_SIZE_N,
                    EPILOGUE_SUBTILE)


@triton.jit
def _store_tile(c_desc, accumulator, row, col, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                EPILOGUE_SUBTILE: tl.constexpr):
    """Store an fp32 tile through C's descriptor in C's dtype; with EPILOGUE_SUBTILE as two halves
    (left, right), so the staging buffer in shared memory is half a tile."""
    dtype = c_desc.dtype
    if EPILOGUE_SUBTILE:
        halves = tl.permute(tl.reshape(accumulator, (BLOCK_SIZE_M, 2, BLOCK_SIZE_N // 2)), (0, 2, 1))
        left, right = tl.split(halves)
        c_desc.store([row, col], left.to(dtype))
        c_desc.store([row, col + BLOCK_SIZE_N // 2], right.to(dtype))
    else:
        c_desc.store([row, col], accumulator.to(dtype))


@triton.jit
def matmul_tma_splitk_kernel(
    a_desc, b_desc, ws_ptr,
    M, N, K,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, SPLIT_K: tl.constexpr,
):
    """Split `program_id(1)`'s fp32 partial of tile `program_id(0)` over its range of whole K-blocks
    (the K-blocks over SPLIT_K, rounded up; the last range may be shorter), stored at its split's
    M×N slot of the workspace (rows past M and columns past N left out)."""
    tile = tl.program_id(axis=0)
    split = tl.program_id(axis=1)
    pid_m, pid_n = tile_pid(tile, tl.cdiv(M, BLOCK_SIZE_M), tl.cdiv(N, BLOCK_SIZE_N), GROUP_SIZE_M)
    k_blocks = tl.cdiv(K, BLOCK_SIZE_K)
    per_split = tl.cdiv(k_blocks, SPLIT_K)
    first = split * per_split
    last = min(first + per_split, k_blocks)
    accumulator = _k_range(a_desc, b_desc, pid_m, pid_n, first, last, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    ws = ws_ptr + split * M * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(ws, accumulator, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N), cache_modifier=".cg")


@triton.jit
def matmul_tma_wide_kernel(
    a_desc, b0_desc, b1_desc, c0_desc, c1_desc,
    M, N, K,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, BLOCK_SIZE_N1: tl.constexpr,
):
    """The tma kernel's tile loop for a tile of BLOCK_SIZE_N = N0 + BLOCK_SIZE_N1 columns (N0 and
    BLOCK_SIZE_N1 powers of two): columns [col, col + N0) and [col + N0, col + BLOCK_SIZE_N) are
    two products of the same A tile, through B's and C's descriptors of N0 and of BLOCK_SIZE_N1
    columns. TMA reads zeros past N and clips the stores there.

    Unlike the tma kernel's, the tile loop is not flattened with the K loop: flattened, the two
    accumulators' resets make ptxas serialise the warpgroup MMAs ("C7515: wgmma.mma_async
    instructions are serialized due to non wgmma instructions defining accumulator registers"),
    which cost 1.7x on an H100 at 4096³; the K loop alone keeps them asynchronous."""
    BLOCK_SIZE_N0: tl.constexpr = BLOCK_SIZE_N - BLOCK_SIZE_N1
    start = tl.program_id(axis=0)
    programs = tl.num_programs(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    k_blocks = tl.cdiv(K, BLOCK_SIZE_K)
    dtype = c0_desc.dtype
    for tile in tl.range(start, num_pid_m * num_pid_n, programs, flatten=False):
        pid_m, pid_n = tile_pid(tile, num_pid_m, num_pid_n, GROUP_SIZE_M)
        row = pid_m * BLOCK_SIZE_M
        col = pid_n * BLOCK_SIZE_N
        acc0 = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N0), dtype=tl.float32)
        acc1 = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N1), dtype=tl.float32)
        for k in range(0, k_blocks):
            a = a_desc.load([row, k * BLOCK_SIZE_K])
            acc0 = tl.dot(a, b0_desc.load([k * BLOCK_SIZE_K, col]), acc0)
            acc1 = tl.dot(a, b1_desc.load([k * BLOCK_SIZE_K, col + BLOCK_SIZE_N0]), acc1)
        c0_desc.store([row, col], acc0.to(dtype))
        c1_desc.store([row, col + BLOCK_SIZE_N0], acc1.to(dtype))


@triton.jit
def matmul_tma_tail_kernel(
    a_desc, b_desc, c_desc, ws_ptr, lock_ptr,
    M, N, K,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
):
    start = tl.program_id(axis=0)
    programs = tl.num_programs(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    k_blocks = tl.cdiv(K, BLOCK_SIZE_K)
    tiles = num_pid_m * num_pid_n
    tail = tiles % programs
    full = tiles - tail
    _whole_waves(a_desc, b_desc, c_desc, start, full, programs, num_pid_m, num_pid_n, k_blocks, BLOCK_SIZE_M,
                 BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, EPILOGUE_SUBTILE, False)
    # the last, partial wave: each of its tiles split along K over the idle programs
    splits = 1
    if tail > 0:
        splits = min(programs // tail, k_blocks)
    if start < tail * splits:
        unit_tile = start // splits
        split = start % splits
        pid_m, pid_n = tile_pid(full + unit_tile, num_pid_m, num_pid_n, GROUP_SIZE_M)
        per_split = tl.cdiv(k_blocks, splits)
        first = split * per_split
        last = min(first + per_split, k_blocks)
        accumulator = _k_range(a_desc, b_desc, pid_m, pid_n, first, last, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
        if splits == 1:
            _store_tile(c_desc, accumulator, pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N, BLOCK_SIZE_M, BLOCK_SIZE_N,
                    EPILOGUE_SUBTILE)
        else:
            tile_size: tl.constexpr = BLOCK_SIZE_M * BLOCK_SIZE_N
            offs_tile = tl.arange(0, BLOCK_SIZE_M)[:, None] * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)[None, :]
            ws_tile = ws_ptr + (unit_tile * splits).to(tl.int64) * tile_size + offs_tile
            tl.store(ws_tile + split * tile_size, accumulator, cache_modifier=".cg")
            tl.debug_barrier()  # every thread's partial is stored before the ticket is taken
            ticket = tl.atomic_add(lock_ptr + unit_tile, 1, sem="acq_rel", scope="gpu")
            if ticket == splits - 1:
                total = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
                for s in range(0, splits):
                    total += tl.load(ws_tile + s * tile_size, cache_modifier=".cg")
                _store_tile(c_desc, total, pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N, BLOCK_SIZE_M, BLOCK_SIZE_N,
                    EPILOGUE_SUBTILE)
                tl.atomic_xchg(lock_ptr + unit_tile, 0)


@triton.jit
def matmul_tma_streamk_kernel(
    a_desc, b_desc, c_desc, ws_ptr, lock_ptr,
    M, N, K,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
):
    """Stream-K over the last, partial wave (the "data-parallel + Stream-K" hybrid): the whole waves
    of tiles as the tma kernel runs them, then the K-blocks of the remaining tiles in one sequence,
    cut into one equal, contiguous range per program, so that no program idles while others finish
    the wave. A range is shorter than a tile's K-blocks, so it holds a piece of one tile or of two:
    the piece a range starts with goes to the program's slot 0 of the workspace, the piece it ends
    with to slot 1 (a tile whose K-blocks one range holds whole is stored at once). The program that
    draws a tile's last ticket sums its pieces in program order (deterministic, as splitk_fused),
    stores the tile and resets the counter."""
    start = tl.program_id(axis=0)
    programs = tl.num_programs(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    k_blocks = tl.cdiv(K, BLOCK_SIZE_K)
    tiles = num_pid_m * num_pid_n
    tail = tiles % programs
    full = tiles - tail
    _whole_waves(a_desc, b_desc, c_desc, start, full, programs, num_pid_m, num_pid_n, k_blocks, BLOCK_SIZE_M,
                 BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, EPILOGUE_SUBTILE, False)
    # the last wave's tiles: iterations [begin, end) of tail * k_blocks, at most k_blocks of them
    total = tail * k_blocks
    per = tl.cdiv(total, programs)
    begin = start * per
    end = tl.minimum(begin + per, total)
    tile_size: tl.constexpr = BLOCK_SIZE_M * BLOCK_SIZE_N
    offs_tile = tl.arange(0, BLOCK_SIZE_M)[:, None] * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)[None, :]
    for piece in tl.static_range(2):
        it = begin
        if piece == 1:
            it = tl.minimum((begin // k_blocks + 1) * k_blocks, end)  # where the next tile starts
        unit = it // k_blocks  # the tile among the last wave's
        k0 = it - unit * k_blocks
        k1 = tl.minimum(k_blocks, k0 + end - it)
        if k0 < k1:
            pid_m, pid_n = tile_pid(full + unit, num_pid_m, num_pid_n, GROUP_SIZE_M)
            accumulator = _k_range(a_desc, b_desc, pid_m, pid_n, k0, k1, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
            if k1 - k0 == k_blocks:
                _store_tile(c_desc, accumulator, pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N, BLOCK_SIZE_M,
                            BLOCK_SIZE_N, EPILOGUE_SUBTILE)
            else:
                first = unit * k_blocks // per  # the programs whose ranges hold a piece of this tile
                last = ((unit + 1) * k_blocks - 1) // per
                tl.store(ws_ptr + (start * 2 + piece).to(tl.int64) * tile_size + offs_tile, accumulator,
                         cache_modifier=".cg")
                tl.debug_barrier()  # every thread's piece is stored before the ticket is taken
                ticket = tl.atomic_add(lock_ptr + unit, 1, sem="acq_rel", scope="gpu")
                if ticket == last - first:
                    summed = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
                    for q in range(first, last + 1):
                        q_slot = (q * per // k_blocks != unit).to(tl.int64)  # its range began in the tile before
                        summed += tl.load(ws_ptr + (q * 2 + q_slot) * tile_size + offs_tile, cache_modifier=".cg")
                    _store_tile(c_desc, summed, pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N, BLOCK_SIZE_M,
                                BLOCK_SIZE_N, EPILOGUE_SUBTILE)
                    tl.atomic_xchg(lock_ptr + unit, 0)
