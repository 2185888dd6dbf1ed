"""Family `fused_moe`: the grouped GEMM of a top-k mixture-of-experts layer, as vLLM's
`fused_moe` Triton kernel runs it (its first GEMM: tokens times their experts' w1).

Problem: M tokens, E experts, each token routed to topk distinct experts, N output features,
K input features, dtype (bf16 | fp16). Inputs: hidden states A [M, K], the stacked expert
weights B [E, N, K] (vLLM's w1 layout: expert e computes A @ B[e]^T) and the router logits
[M, E] (float32); output C [M, topk, N]: C[t, k] = A[t] @ B[ids[t, k]]^T, where ids =
`route(logits)` is the top-k of the logits (distinct experts per token, in descending order).
The kernel is in `fused_moe_triton.py`.

The launcher's set-up (not timed) routes and aligns: `align_block_size` sorts the (token,
slot) pairs by expert and pads each expert's group to a multiple of BLOCK_SIZE_M, in PyTorch
(vLLM's `moe_align_block_size` is a CUDA op doing the same). The alignment depends on the
config's BLOCK_SIZE_M, so it is redone per config; the timed closure launches the Triton
kernel only. The grid covers EM rows, the most the padding can take:
min(M·topk + E·(BLOCK_SIZE_M - 1), M·topk·BLOCK_SIZE_M) rounded up to a multiple of
BLOCK_SIZE_M (as vLLM's grid, which the host sizes without reading the routing back);
programs past the padded length actually used return at once.

Config space: vLLM's benchmark_moe space is BLOCK_SIZE_M {16, 32, 64, 128, 256}, BLOCK_SIZE_N
{32, 64, 128, 256}, BLOCK_SIZE_K {64, 128, 256}, GROUP_SIZE_M {1, 16, 32, 64}, num_warps
{4, 8}, num_stages {2, 3, 4, 5}: 1920 points, too many to record as a full grid per problem.
Kept here (384 points; 150 to 272 valid per problem of the issue's shape set), with why:
- BLOCK_SIZE_M {16, 64, 128}: 256 dropped: never picked in the tuned H100 table for Mixtral
  (E=8, N=7168) that SGLang ships for Triton 3.3.1 (from vLLM's benchmark_moe; it stops at
  128), and with 256 rows only BLOCK_SIZE_N ≤ 128 keeps the accumulator in registers. 32
  dropped: like 16 it is below the 64 rows of a Hopper warpgroup MMA, and where an expert
  gets under 64 rows the two differ only in padding; that table picks it once (M=8).
- BLOCK_SIZE_N {32, 64, 128, 256}: as vLLM.
- BLOCK_SIZE_K {32, 64, 128, 256}: vLLM's three plus 32, the value of vLLM's own default
  config for M > E (so that the untuned launch is a point of the space).
- GROUP_SIZE_M {1, 8}: 1 (no grouping) and 8, vLLM's default for M > E. 16 to 64 dropped:
  consecutive blocks of rows share tiles of B only while they belong to one expert, and with
  the tiles that suit many tokens (BLOCK_SIZE_M 64 or 128) an expert of the issue's shapes
  has about 8 to 16 blocks (M=4096, top-2 of 8: ~1024 rows each), so larger groups mostly
  span experts whose weights differ.
- num_warps {4, 8}: as vLLM.
- num_stages {3, 4}: 3 is Triton's default (what vLLM's untuned launch gets), 4 the value that
  table picks most; 2 is never picked there; 5 (picked for 4 of its 18 batch sizes) is
  dropped to keep the grid under ~270 valid configs per problem.

Constraints (each config that breaks one is `invalid`, never launched):
- the num_stages copies of an A tile and a B tile fit the block's shared memory (227 KiB);
- BLOCK_SIZE_M is at most max(64, the next power of two ≥ M): an expert receives at most M
  rows (each token picks it once), and below 64 a tile is under one warpgroup MMA anyway;
- BLOCK_SIZE_N / BLOCK_SIZE_K are at most the power of two N / K needs (min 32): more adds
  only masked lanes;
- the fp32 accumulator is at most 128 registers per thread (BM·BN / (32·num_warps)): a
  thread has 255, and beyond half of them the tile spills;
- every warp has at least one 16×8 MMA tile of the accumulator (BM·BN ≥ 128·num_warps);
- GROUP_SIZE_M larger than the number of row blocks (EM / BLOCK_SIZE_M) orders the programs
  as the next smaller choice does: only the smallest such choice is kept.

Default config: vLLM's `get_default_config` for an unquantised untuned shape: M ≤ E:
BLOCK_SIZE_M 16, BLOCK_SIZE_N 32, BLOCK_SIZE_K 64, GROUP_SIZE_M 1; else 64, 64, 32, 8; with
Triton's launch defaults num_warps 4, num_stages 3 (vLLM's dict sets neither). BLOCK_SIZE_N
and BLOCK_SIZE_K are clamped to what N and K need (only for N or K under 64).

Inputs: A and B ~ N(0, 1) in the problem's dtype; logits ~ N(0, 1) in float32, so the top-k
is a uniformly random set of topk distinct experts per token (ties have probability ~0).

Reference: a loop over the experts in PyTorch, float32 (TF32 off): for each expert, the
rows of A routed to it times B[e]^T, scattered to their (token, slot). Error: the largest
relative error of one output row, max over (t, k) of ||C[t,k] - ref[t,k]|| / ||ref[t,k]||:
a row computed with the wrong expert, or left unwritten, counts fully however many rows the
problem has (the norm over all of C would hide one row in 24576). Tolerance: 1e-2 for bf16,
2e-3 for fp16 (fp32 accumulation; the output's rounding alone gives ~2e-3 and ~3e-4 per row).

Work: FLOPs 2·M·topk·N·K. Bytes: A read once (M·K), the weights of the experts the routing
hits read once, C written once (M·topk·N), all at the dtype's size. With topk distinct
experts per token drawn uniformly, an expert is missed by one token with probability
1 - topk/E, so the expected number of experts hit is E·(1 - (1 - topk/E)^M) (exactly topk at
M = 1, E once M·topk ≫ E); the router logits and the routing tables are not counted.

L2 is flushed between timed launches (cold): in a model each MoE layer streams its experts'
weights once per forward pass, and between two calls of one layer every other layer's
weights pass through L2; a warm L2 would hold a decode step's few hit experts (E=64 at N=1408,
K=2048: 5.8 MB each) and flatter the kernel.

Baseline: eager PyTorch, a loop over the experts that have tokens, each a gather of their
rows and one torch.matmul in the problem's dtype written into C (the routing's index lists
made outside the timed closure, as for the kernel).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from tilepilot.experiments import Config, InputError, Param, Problem, SearchSpace
from tilepilot.kernels.base import KernelFamily, Target, Work
from tilepilot.kernels.compile import hash_modules, launch

DTYPES = ("bf16", "fp16")
DTYPE_BYTES = {"bf16": 2, "fp16": 2}
KEYS = ("M", "E", "topk", "N", "K", "dtype")
MAX_M = 2**20
MAX_E = 1024
MAX_DIM = 65536  # N and K
MAX_ELEMENTS = 2**31 - 1  # A, one expert's weights and C are indexed with 32-bit offsets
TOLERANCE = {"bf16": 1e-2, "fp16": 2e-3}  # largest relative error of one output row
SHARED_BYTES = Target().max_shared_bytes
WARP = 32
WARPGROUP_ROWS = 64  # rows of one Hopper warpgroup MMA
MMA_TILE = 16 * 8  # outputs of one warp-level MMA
MAX_ACC_REGS = 128  # fp32 accumulator registers per thread, of the 255 a thread has

GROUP_SIZES = (1, 8)
PARAMS = (
    Param("BLOCK_SIZE_M", (16, 64, 128)),
    Param("BLOCK_SIZE_N", (32, 64, 128, 256)),
    Param("BLOCK_SIZE_K", (32, 64, 128, 256)),
    Param("GROUP_SIZE_M", GROUP_SIZES),
    Param("num_warps", (4, 8)),
    Param("num_stages", (3, 4)),
)


def dims(problem: Problem) -> tuple[int, int, int, int, int]:
    """(M, E, topk, N, K)."""
    return (int(problem["M"]), int(problem["E"]), int(problem["topk"]), int(problem["N"]),
            int(problem["K"]))


def pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def padded_rows(problem: Problem, block_m: int) -> int:
    """EM: the most rows the per-expert padding can take, a multiple of block_m (the grid's rows)."""
    m, e, topk, _, _ = dims(problem)
    pairs = m * topk
    bound = min(pairs + e * (block_m - 1), pairs * block_m)
    return -(-bound // block_m) * block_m


def expected_experts_hit(problem: Problem) -> float:
    """E·(1 - (1 - topk/E)^M): the expected number of distinct experts M tokens route to."""
    m, e, topk, _, _ = dims(problem)
    return e * (1.0 - (1.0 - topk / e) ** m)


# ---- constraints ------------------------------------------------------------------------------
def _tiles(config: Config) -> tuple[int, int, int]:
    return int(config["BLOCK_SIZE_M"]), int(config["BLOCK_SIZE_N"]), int(config["BLOCK_SIZE_K"])


def shared_memory_fits(config: Config, problem: Problem) -> str | None:
    bm, bn, bk = _tiles(config)
    need = int(config["num_stages"]) * (bm * bk + bk * bn) * DTYPE_BYTES[str(problem["dtype"])]
    if need > SHARED_BYTES:
        return (f"the {config['num_stages']}-stage pipeline needs {need} B of shared memory for its A and B "
                f"tiles, more than the {SHARED_BYTES} B a block can have")
    return None


def block_m_fits_tokens(config: Config, problem: Problem) -> str | None:
    bm, m = int(config["BLOCK_SIZE_M"]), int(problem["M"])
    limit = max(WARPGROUP_ROWS, pow2_at_least(m))
    if bm > limit:
        return (f"BLOCK_SIZE_M={bm} is more rows than an expert can receive (at most M={m}, each token picks it "
                f"once) and than one {WARPGROUP_ROWS}-row warpgroup MMA: use at most {limit}")
    return None


def block_n_fits(config: Config, problem: Problem) -> str | None:
    return _block_fits("BLOCK_SIZE_N", int(config["BLOCK_SIZE_N"]), "N", int(problem["N"]))


def block_k_fits(config: Config, problem: Problem) -> str | None:
    return _block_fits("BLOCK_SIZE_K", int(config["BLOCK_SIZE_K"]), "K", int(problem["K"]))


def _block_fits(param: str, block: int, dim: str, size: int) -> str | None:
    limit = max(32, pow2_at_least(size))
    if block > limit:
        return f"{param}={block} is wider than {dim}={size} needs ({limit}): only masked lanes added"
    return None


def accumulator_fits_registers(config: Config, problem: Problem) -> str | None:
    bm, bn, _ = _tiles(config)
    warps = int(config["num_warps"])
    regs = bm * bn // (WARP * warps)
    if regs > MAX_ACC_REGS:
        return (f"the {bm}×{bn} fp32 accumulator takes {regs} registers per thread with num_warps={warps}, "
                f"more than {MAX_ACC_REGS} of the 255 a thread has: it spills")
    return None


def warps_have_work(config: Config, problem: Problem) -> str | None:
    bm, bn, _ = _tiles(config)
    warps = int(config["num_warps"])
    if bm * bn < MMA_TILE * warps:
        return (f"a {bm}×{bn} tile has {bm * bn // MMA_TILE} 16×8 MMA tile(s) for num_warps={warps}: "
                "warps left idle")
    return None


def group_size_m_distinct(config: Config, problem: Problem) -> str | None:
    group, bm = int(config["GROUP_SIZE_M"]), int(config["BLOCK_SIZE_M"])
    smaller = [g for g in GROUP_SIZES if g < group]
    blocks = padded_rows(problem, bm) // bm
    if smaller and max(smaller) >= blocks:
        return (f"GROUP_SIZE_M={group} orders the programs as GROUP_SIZE_M={max(smaller)} does: there are at most "
                f"{blocks} block(s) of {bm} rows")
    return None


CONSTRAINTS = (shared_memory_fits, block_m_fits_tokens, block_n_fits, block_k_fits, accumulator_fits_registers,
               warps_have_work, group_size_m_distinct)


# ---- routing and its alignment (torch, device side) ------------------------------------------
def route(logits: Any, topk: int) -> Any:
    """The top-k experts of each token, [M, topk] int64, in descending order of the logits."""
    import torch

    return torch.topk(logits, topk, dim=-1).indices


def align_block_size(topk_ids: Any, num_experts: int, block_m: int, rows: int) -> tuple[Any, Any, Any]:
    """vLLM's moe_align_block_size in PyTorch: (sorted_token_ids [rows] int32, expert_ids
    [rows / block_m] int32, num_tokens_post_padded [1] int32). The flat pair indices t·topk + k
    are grouped by expert in increasing order, each group padded with M·topk to a multiple of
    block_m; experts with no token get no block; blocks past the padded length are never read."""
    import torch

    device = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    pairs = flat.numel()
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    order = torch.argsort(flat, stable=True)
    experts = flat[order]
    rank = torch.arange(pairs, device=device) - (torch.cumsum(counts, 0) - counts)[experts]
    sorted_ids = torch.full((rows,), pairs, dtype=torch.int32, device=device)
    sorted_ids[(torch.cumsum(padded, 0) - padded)[experts] + rank] = order.to(torch.int32)
    block_experts = torch.repeat_interleave(torch.arange(num_experts, device=device), padded // block_m)
    expert_ids = torch.zeros(rows // block_m, dtype=torch.int32, device=device)
    expert_ids[: block_experts.numel()] = block_experts.to(torch.int32)
    return sorted_ids, expert_ids, padded.sum().reshape(1).to(torch.int32)


def row_error(out: Any, ref: Any) -> float:
    """max over output rows (t, k) of ||out[t,k] - ref[t,k]|| / ||ref[t,k]|| (the absolute norm
    where a reference row is all zeros); inf when not finite."""
    import torch

    n = ref.shape[-1]
    ref64 = ref.reshape(-1, n).double()
    diff = torch.linalg.vector_norm(out.reshape(-1, n).double() - ref64, dim=1)
    den = torch.linalg.vector_norm(ref64, dim=1)
    rel = torch.where(den > 0, diff / torch.where(den > 0, den, 1.0), diff)
    err = float(rel.max()) if rel.numel() else 0.0
    return err if math.isfinite(err) else math.inf


class FusedMoeFamily(KernelFamily):
    name: ClassVar[str] = "fused_moe"
    baseline_name: ClassVar[str] = "eager PyTorch (torch.matmul per expert)"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = ("grouped GEMM of a top-k MoE layer (vLLM fused_moe_kernel): tokens sorted and "
                                  "padded per expert, C[t, k] = A[t] @ B[ids[t, k]]^T, fp32 accumulation")
    dtypes: ClassVar[tuple[str, ...]] = DTYPES
    l2_flush: ClassVar[bool] = True

    # ---- CPU side ---------------------------------------------------------------------------
    def space(self) -> SearchSpace:
        return SearchSpace(PARAMS, CONSTRAINTS)

    def parse_problem(self, raw: Mapping[str, Any]) -> Problem:
        return parse_fused_moe_problem(raw)

    def default_config(self, problem: Problem) -> Config:
        m, e, _, n, k = dims(problem)
        bm, bn, bk, group = (16, 32, 64, 1) if m <= e else (64, 64, 32, 8)
        return Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": min(bn, max(32, pow2_at_least(n))),
                          "BLOCK_SIZE_K": min(bk, max(32, pow2_at_least(k))), "GROUP_SIZE_M": group,
                          "num_warps": 4, "num_stages": 3})

    def work(self, problem: Problem) -> Work:
        m, _, topk, n, k = dims(problem)
        size = DTYPE_BYTES[str(problem["dtype"])]
        weights = expected_experts_hit(problem) * n * k
        return Work(flops=2.0 * m * topk * n * k, bytes=float((m * k + weights + m * topk * n) * size))

    def specialisation(self, problem: Problem, config: Config) -> str:
        from tilepilot.kernels.compile import int_class

        m, _, topk, n, k = dims(problem)
        return (f"{problem['dtype']} topk:{topk} N:{int_class(n)} K:{int_class(k)} NK:{int_class(n * k)} "
                f"pairs:{int_class(m * topk)}")

    def source_hash(self) -> str:
        return hash_modules(type(self).__module__, "tilepilot.kernels.fused_moe_triton",
                            "tilepilot.kernels.matmul_triton")  # its tile order (tile_pid)

    # ---- device side ------------------------------------------------------------------------
    def compile(self, problem: Problem, config: Config, target: Target) -> Any:
        from tilepilot.kernels import fused_moe_triton
        from tilepilot.kernels.compile import Pointer, aot_compile

        dtype = str(problem["dtype"])
        args: dict[str, Any] = {"a_ptr": Pointer(dtype), "b_ptr": Pointer(dtype), "c_ptr": Pointer(dtype),
                                "sorted_token_ids_ptr": Pointer("i32"), "expert_ids_ptr": Pointer("i32"),
                                "num_tokens_post_padded_ptr": Pointer("i32")}
        args.update(_int_args(problem, config))
        return aot_compile(fused_moe_triton.fused_moe_kernel, args, _constexprs(problem, config), target,
                           num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]))

    def make_inputs(self, problem: Problem, seed: int, device: str) -> tuple[Any, ...]:
        import torch

        m, e, _, n, k = dims(problem)
        dtype = torch_dtype(problem)
        gen = torch.Generator(device=device).manual_seed(seed)
        a = torch.randn((m, k), generator=gen, device=device, dtype=torch.float32).to(dtype)
        b = torch.randn((e, n, k), generator=gen, device=device, dtype=torch.float32).to(dtype)
        logits = torch.randn((m, e), generator=gen, device=device, dtype=torch.float32)
        return (a, b, logits)

    def make_output(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        import torch

        m, _, topk, n, _ = dims(problem)
        return torch.empty((m, topk, n), dtype=inputs[0].dtype, device=inputs[0].device)

    def reference(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        import torch

        a, b, logits = inputs
        m, e, topk, n, _ = dims(problem)
        out = torch.zeros((m, topk, n), dtype=torch.float32, device=a.device)
        allow_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False  # a true fp32 product
        try:
            for expert, tokens, slots in expert_rows(route(logits, topk), e):
                out[tokens, slots] = a[tokens].float() @ b[expert].float().T
        finally:
            torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        return out

    def tolerance(self, problem: Problem) -> float:
        return TOLERANCE[str(problem["dtype"])]

    def error(self, problem: Problem, out: Any, ref: Any) -> float:
        """`row_error`: the largest relative error of one output row (see the module docstring)."""
        return row_error(out, ref)

    def launcher(self, problem: Problem, config: Config, inputs: tuple[Any, ...], out: Any,
                 compiled: Any | None) -> Callable[[], None]:
        from tilepilot.kernels import fused_moe_triton

        a, b, logits = inputs
        _check_operands(problem, a, b, logits, out)
        _, e, topk, n, _ = dims(problem)
        bm, bn = int(config["BLOCK_SIZE_M"]), int(config["BLOCK_SIZE_N"])
        rows = padded_rows(problem, bm)
        sorted_ids, expert_ids, post_padded = align_block_size(route(logits, topk), e, bm, rows)
        grid = (rows // bm * ((n + bn - 1) // bn), 1, 1)
        values: dict[str, Any] = {"a_ptr": a, "b_ptr": b, "c_ptr": out, "sorted_token_ids_ptr": sorted_ids,
                                  "expert_ids_ptr": expert_ids, "num_tokens_post_padded_ptr": post_padded,
                                  **_int_args(problem, config)}
        return launch(fused_moe_triton.fused_moe_kernel, grid, values, _constexprs(problem, config), config,
                      compiled)

    def baseline(self, problem: Problem, inputs: tuple[Any, ...], out: Any) -> Callable[[], None] | None:
        """Eager PyTorch: per expert with tokens, its rows of A times B[e]^T, written into C."""
        a, b, logits = inputs
        _, e, topk, _, _ = dims(problem)
        rows = expert_rows(route(logits, topk), e)

        def run() -> None:
            for expert, tokens, slots in rows:
                out[tokens, slots] = a[tokens] @ b[expert].T

        return run


# ---- helpers ----------------------------------------------------------------------------------
def parse_fused_moe_problem(raw: Mapping[str, Any]) -> Problem:
    name = FusedMoeFamily.name
    if not isinstance(raw, Mapping):
        raise InputError(f"{name} problem {raw!r:.80} is not a table of {', '.join(KEYS)}")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise InputError(f"unknown {name} problem key {unknown[0]!r} (allowed: {', '.join(KEYS)})")
    limits = {"M": MAX_M, "E": MAX_E, "topk": MAX_E, "N": MAX_DIM, "K": MAX_DIM}
    for key, limit in limits.items():
        if key not in raw:
            raise InputError(f"{name} problem is missing {key} (a positive integer up to {limit})")
        value = raw[key]
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
            raise InputError(f"{name} problem {key}={value!r} is not a positive integer up to {limit}")
    dtype = raw.get("dtype")
    if dtype not in DTYPES:
        raise InputError(f"{name} problem dtype={dtype!r} is not one of {{{', '.join(DTYPES)}}}")
    m, e, topk, n, k = (raw[key] for key in KEYS[:5])
    if topk > e:
        raise InputError(f"{name} problem topk={topk} is more than E={e} (each token picks topk distinct experts)")
    for label, count in (("A (M×K)", m * k), ("one expert's weights (N×K)", n * k), ("C (M×topk×N)", m * topk * n)):
        if count > MAX_ELEMENTS:
            raise InputError(f"{name} problem M={m} E={e} topk={topk} N={n} K={k}: {label} has {count} elements "
                             f"(at most {MAX_ELEMENTS} allowed)")
    return Problem.of({"M": m, "E": e, "topk": topk, "N": n, "K": k, "dtype": dtype})


def torch_dtype(problem: Problem) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}[str(problem["dtype"])]


def expert_rows(topk_ids: Any, num_experts: int) -> list[tuple[int, Any, Any]]:
    """(expert, token indices, slot indices) for each expert that receives at least one token."""
    import torch

    rows = []
    for expert in range(num_experts):
        tokens, slots = torch.nonzero(topk_ids == expert, as_tuple=True)
        if tokens.numel():
            rows.append((expert, tokens, slots))
    return rows


def _int_args(problem: Problem, config: Config) -> dict[str, int]:
    m, _, topk, n, k = dims(problem)
    return {"N": n, "K": k, "EM": padded_rows(problem, int(config["BLOCK_SIZE_M"])), "num_valid_tokens": m * topk,
            "stride_am": k, "stride_ak": 1, "stride_be": n * k, "stride_bk": 1, "stride_bn": k,
            "stride_cm": n, "stride_cn": 1}


def _constexprs(problem: Problem, config: Config) -> dict[str, int]:
    consts = {key: int(config[key]) for key in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")}
    consts["top_k"] = int(problem["topk"])
    return consts


def _check_operands(problem: Problem, a: Any, b: Any, logits: Any, out: Any) -> None:
    import torch

    m, e, topk, n, k = dims(problem)
    dtype = torch_dtype(problem)
    expected = (("A", a, (m, k), dtype), ("B", b, (e, n, k), dtype), ("logits", logits, (m, e), torch.float32),
                ("C", out, (m, topk, n), dtype))
    for label, tensor, shape, want in expected:
        if tuple(tensor.shape) != shape or tensor.dtype != want:
            raise ValueError(f"operand {label} is {tuple(tensor.shape)} {tensor.dtype}, the problem "
                             f"{problem.label()} needs {shape} {want}")
        if not tensor.is_contiguous() or tensor.data_ptr() % 16:
            raise ValueError(f"operand {label} must be contiguous and 16-byte aligned")
