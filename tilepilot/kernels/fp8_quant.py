"""Family `silu_mul_fp8_quant`: the SwiGLU activation fused with per-token-group fp8 quantisation
of block-quantised LLM inference (the input of an fp8 down projection).

Problem: T tokens, H (a multiple of 128, at most 2**20), dtype (bf16 | fp16) of the input
x [T, 2·H] = [gate | up]. Outputs: q, fp8 e4m3 (torch.float8_e4m3fn) [T, H], and one float32
scale per group of 128 consecutive columns of a row, [T, H/128] row-major:

    y = silu(x[:, :H]) * x[:, H:];  scale = max(max|y| over the group, 1e-10) / 448;
    q = fp8(clamp(y / scale, -448, 448))

(vLLM's `silu_and_mul` then `per_token_group_quant_fp8`, with its eps). Dequantised: q · scale.
The kernel is in `fp8_quant_triton.py`.

Config space: GROUPS_PER_PROGRAM (groups of a row per program), ROWS_PER_PROGRAM (rows per
program, handled one after the other), num_warps, num_stages (pipelining of the row loop).
vLLM's Triton fallback launches one group of one row per program with one warp: the config
{1, 1, 1, 1}, in the space.

Inputs: x ~ N(0, 1) with each token row scaled by 2**U(-3, 3), so that scales differ by up to
64× between rows (a scale written to the wrong row cannot pass).

Reference: the unfused computation in PyTorch, float32, returned as (q as float32, scale):
the reference's own quantise step, so the kernel is compared with what the same formula
gives. The kernel computes y in float32 too, but its exp and division are not torch's; a few
float32 ulps move y / scale across a rounding midpoint of the fp8 grid now and then (y
perturbed by 1e-6 relative: 1.6 elements in 10^5), and that element is then one fp8 step
away (up to 1/8 of its value).

Correctness: `compare()`, whose `error` is the family's `error` (what the evaluator holds
against the tolerance and records as max_rel_err), the larger of
- q_rel_err = ||q·s/s_ref - q_ref|| / ||q_ref||: the output dequantised and put back on the
  reference's scales, i.e. in the reference's fp8 units, so every group weighs alike (each spans
  up to ±448; rms ~90) however small its scale. With correct scales it is the error of q:
  measured on 1M elements, one-step flips in 1.6e-5 of them give ~5e-4, in 1% of them ~8e-3;
  rounding toward zero instead of to nearest gives ~6e-2. A wrong scale counts with its own
  relative error (all scales ×1.5 give 0.5);
- scale_rel_err = ||s - s_ref|| / ||s_ref|| (~1e-6 for a correct kernel);
and inf when either is not finite. The tolerance is 5e-3, raised for small problems to leave
room for 4 elements one step off at the top of the range (a step of 32 there):
2 · 32 / (90 · sqrt(T·H)), 1.1e-2 at T·H = 4096. Also reported, and not held against the
tolerance: dequant_rel_err = ||q·s - q_ref·s_ref|| / ||q_ref·s_ref||, which weighs each group by
its scale squared (rows differ by up to 64×): a flip in a row of large scale counts up to ~3×
what the tolerance allows for (with y perturbed by 1e-6 relative, as a correct kernel's float32
differs, it went over the tolerance in 1 of 400 input sets at T=256, H=128, q_rel_err at most
0.39 of it), and q written wrongly in rows of small scale hardly shows; the largest fp8 ulp
distance and the number of elements off by one ulp or more.

Work: 7 FLOPs per output element (silu: negate, exp, add, divide; the product; |y| max; the
division by the scale); bytes: x read once, q and the scales written once.

L2 is not flushed between timed launches: x is the output of the gate/up projection that runs
just before, in L2 when it fits (decode shapes), and q is read by the down projection just after.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from tilepilot.experiments import Config, InputError, Param, Problem, SearchSpace
from tilepilot.kernels.base import KernelFamily, Target, Work, relative_error
from tilepilot.kernels.compile import hash_modules, interpreting, launch

DTYPES = ("bf16", "fp16")
DTYPE_BYTES = {"bf16": 2, "fp16": 2}
GROUP_SIZE = 128
FP8_MAX = 448.0  # largest finite float8_e4m3fn
EPS = 1e-10  # vLLM's per_token_group_quant_fp8: max|y| is clamped to at least this
MAX_T = 2**31 - 1
MAX_H = 2**20
MAX_ELEMENTS = 2**31 - 1  # x has T·2H elements, indexed with 32-bit offsets
TOLERANCE = 5e-3
Q_RMS = 90.0  # rms of q in fp8 units for these inputs (measured: 88 to 111)
TOP_STEP = 32.0  # spacing of e4m3 values in [256, 448]
ALLOWED_FLIPS = 4
FLOPS_PER_ELEMENT = 7
ROW_SCALE_LOG2 = 3.0
WARP = 32

PARAMS = (
    Param("GROUPS_PER_PROGRAM", (1, 2, 4, 8, 16)),
    Param("ROWS_PER_PROGRAM", (1, 2, 4, 8, 16)),
    Param("num_warps", (1, 2, 4, 8, 16)),
    Param("num_stages", (1, 2, 3, 4)),
)


def dims(problem: Problem) -> tuple[int, int]:
    return int(problem["T"]), int(problem["H"])


def n_groups(problem: Problem) -> int:
    return int(problem["H"]) // GROUP_SIZE


# ---- constraints ------------------------------------------------------------------------------
def groups_fit_row(config: Config, problem: Problem) -> str | None:
    per_program, groups = int(config["GROUPS_PER_PROGRAM"]), n_groups(problem)
    limit = 1 << max(0, groups - 1).bit_length()
    if per_program > limit:
        return (f"GROUPS_PER_PROGRAM={per_program} is more than a row of {groups} group(s) needs ({limit}): "
                "only masked lanes added")
    return None


def rows_per_program_fit(config: Config, problem: Problem) -> str | None:
    per_program, tokens = int(config["ROWS_PER_PROGRAM"]), int(problem["T"])
    if per_program > tokens:
        return f"ROWS_PER_PROGRAM={per_program} is more than the problem's {tokens} row(s)"
    return None


def threads_have_work(config: Config, problem: Problem) -> str | None:
    tile, threads = int(config["GROUPS_PER_PROGRAM"]) * GROUP_SIZE, WARP * int(config["num_warps"])
    if threads > tile:
        return f"{threads} threads (num_warps={config['num_warps']}) for a tile of {tile} elements leave threads idle"
    return None


def stages_need_a_loop(config: Config, problem: Problem) -> str | None:
    stages = int(config["num_stages"])
    if stages > 1 and int(config["ROWS_PER_PROGRAM"]) == 1:
        return f"num_stages={stages} pipelines the row loop, and one row per program has none (use num_stages=1)"
    return None


# ---- comparison -------------------------------------------------------------------------------
@dataclass(frozen=True)
class QuantCheck:
    """How far a quantised output is from the reference's own quantisation."""

    q_rel_err: float  # ||q·s/s_ref - q_ref|| / ||q_ref||: the dequantised error in the reference's fp8 units
    dequant_rel_err: float  # ||q·s - q_ref·s_ref|| / ||q_ref·s_ref||
    scale_rel_err: float  # ||s - s_ref|| / ||s_ref||
    max_ulp: int  # largest distance in fp8 steps between q and q_ref (NaN counts as 1 << 16)
    off_by_ulps: int  # elements of q not equal to q_ref

    @property
    def error(self) -> float:
        """max(q_rel_err, scale_rel_err), to hold against the tolerance; inf if either is not
        finite (NaN or inf in q or in the scales), so that such an output never passes.
        dequant_rel_err is left out: see the module docstring."""
        err = max(self.q_rel_err, self.scale_rel_err)
        return err if math.isfinite(self.q_rel_err) and math.isfinite(self.scale_rel_err) else math.inf


def compare(out: tuple[Any, Any], ref: tuple[Any, Any]) -> QuantCheck:
    """Compare (q fp8, scales) with the reference's (q as float32, scales)."""
    import torch

    q, s = out
    q_ref, s_ref = ref[0].double(), ref[1].double()
    s = s.double()
    deq = q.double() * s.repeat_interleave(GROUP_SIZE, dim=1)
    deq_ref = q_ref * s_ref.repeat_interleave(GROUP_SIZE, dim=1)
    on_ref_scales = q.double() * (s / s_ref).repeat_interleave(GROUP_SIZE, dim=1)  # deq / s_ref
    steps = (_fp8_order(q) - _fp8_order(q_ref.to(torch.float8_e4m3fn))).abs()
    steps = torch.where(q.float().isnan(), torch.full_like(steps, 1 << 16), steps)
    return QuantCheck(relative_error(on_ref_scales, q_ref), relative_error(deq, deq_ref), relative_error(s, s_ref),
                      int(steps.max()) if steps.numel() else 0, int((steps != 0).sum()))


def _fp8_order(q: Any) -> Any:
    """Each fp8 value's position on the number line (consecutive values differ by 1; ±0 are 0)."""
    import torch

    codes = q.view(torch.uint8).to(torch.int32)
    magnitude = codes & 0x7F
    return torch.where(codes >= 0x80, -magnitude, magnitude)


class SiluMulFp8QuantFamily(KernelFamily):
    name: ClassVar[str] = "silu_mul_fp8_quant"
    baseline_name: ClassVar[str] = "eager PyTorch, unfused"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = ("silu(x[:, :H]) * x[:, H:] quantised to fp8 e4m3 with one float32 scale "
                                  "per 128-column group (fused SwiGLU + per-token-group quant)")
    dtypes: ClassVar[tuple[str, ...]] = DTYPES
    l2_flush: ClassVar[bool] = False

    # ---- CPU side ---------------------------------------------------------------------------
    def space(self) -> SearchSpace:
        return SearchSpace(PARAMS, (groups_fit_row, rows_per_program_fit, threads_have_work, stages_need_a_loop))

    def parse_problem(self, raw: Mapping[str, Any]) -> Problem:
        allowed = ("T", "H", "dtype")
        unknown = sorted(set(raw) - set(allowed))
        if unknown:
            raise InputError(f"unknown {self.name} problem key {unknown[0]!r} (allowed: {', '.join(allowed)})")
        for key, limit in (("T", MAX_T), ("H", MAX_H)):
            if key not in raw:
                raise InputError(f"{self.name} problem is missing {key} (a positive integer)")
            value = raw[key]
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
                raise InputError(f"{self.name} problem {key}={value!r} is not a positive integer up to {limit}")
        if raw["H"] % GROUP_SIZE:
            raise InputError(f"{self.name} problem H={raw['H']} is not a multiple of the group size {GROUP_SIZE}")
        dtype = raw.get("dtype")
        if dtype not in DTYPES:
            raise InputError(f"{self.name} problem dtype={dtype!r} is not one of {{{', '.join(DTYPES)}}}")
        t, h = raw["T"], raw["H"]
        if t * 2 * h > MAX_ELEMENTS:
            raise InputError(f"{self.name} problem T={t} H={h}: x (T×2H) has {t * 2 * h} elements "
                             f"(at most {MAX_ELEMENTS} allowed)")
        return Problem.of({"T": t, "H": h, "dtype": dtype})

    def default_config(self, problem: Problem) -> Config:
        groups = min(8, 1 << max(0, n_groups(problem) - 1).bit_length())
        return Config.of({"GROUPS_PER_PROGRAM": groups, "ROWS_PER_PROGRAM": 1, "num_warps": 4, "num_stages": 1})

    def work(self, problem: Problem) -> Work:
        t, h = dims(problem)
        size = DTYPE_BYTES[str(problem["dtype"])]
        return Work(flops=float(FLOPS_PER_ELEMENT * t * h),
                    bytes=float(t * 2 * h * size + t * h * 1 + t * n_groups(problem) * 4))

    def specialisation(self, problem: Problem, config: Config) -> str:
        from tilepilot.kernels.compile import int_class

        t, h = dims(problem)
        return f"{problem['dtype']} T:{int_class(t)} H:{int_class(h)}"

    def source_hash(self) -> str:
        return hash_modules(type(self).__module__, "tilepilot.kernels.fp8_quant_triton")

    # ---- device side ------------------------------------------------------------------------
    def compile(self, problem: Problem, config: Config, target: Target) -> Any:
        from tilepilot.kernels import fp8_quant_triton
        from tilepilot.kernels.compile import Pointer, aot_compile

        t, h = dims(problem)
        args = {"x_ptr": Pointer(str(problem["dtype"])), "q_ptr": Pointer("fp8e4nv"), "s_ptr": Pointer("fp32"),
                "T": t, "H": h}
        return aot_compile(fp8_quant_triton.silu_mul_fp8_quant_kernel, args, _constexprs(config, False), target,
                           num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]))

    def make_inputs(self, problem: Problem, seed: int, device: str) -> tuple[Any, ...]:
        import torch

        t, h = dims(problem)
        gen = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn((t, 2 * h), generator=gen, device=device, dtype=torch.float32)
        row_log2 = (2 * torch.rand((t, 1), generator=gen, device=device) - 1) * ROW_SCALE_LOG2
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[str(problem["dtype"])]
        return ((x * torch.exp2(row_log2)).to(dtype),)

    def make_output(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        import torch

        t, h = dims(problem)
        device = inputs[0].device
        return (torch.empty((t, h), dtype=torch.float8_e4m3fn, device=device),
                torch.empty((t, n_groups(problem)), dtype=torch.float32, device=device))

    def reference(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        import torch

        t, h = dims(problem)
        x = inputs[0].float()
        y = (torch.nn.functional.silu(x[:, :h]) * x[:, h:]).view(t, n_groups(problem), GROUP_SIZE)
        scale = y.abs().amax(dim=-1).clamp(min=EPS) / FP8_MAX
        q = (y / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return (q.view(t, h).float(), scale)

    def tolerance(self, problem: Problem) -> float:
        t, h = dims(problem)
        return max(TOLERANCE, TOP_STEP * math.sqrt(ALLOWED_FLIPS) / (Q_RMS * math.sqrt(t * h)))

    def compare(self, out: tuple[Any, Any], ref: tuple[Any, Any]) -> QuantCheck:
        """Dequantised values and scales against the reference (see the module docstring)."""
        return compare(out, ref)

    def error(self, problem: Problem, out: Any, ref: Any) -> float:
        """`compare(out, ref).error`: q on the reference's scales and the scales themselves, each
        relative to the reference (see the module docstring); inf for NaN or inf."""
        return compare(out, ref).error

    def launcher(self, problem: Problem, config: Config, inputs: tuple[Any, ...], out: Any,
                 compiled: Any | None) -> Callable[[], None]:
        from tilepilot.kernels import fp8_quant_triton

        (x,) = inputs
        q, s = out
        _check_operands(problem, x, q, s)
        t, h = dims(problem)
        groups, rows = int(config["GROUPS_PER_PROGRAM"]), int(config["ROWS_PER_PROGRAM"])
        grid = ((t + rows - 1) // rows, (n_groups(problem) + groups - 1) // groups, 1)
        values = {"x_ptr": x, "q_ptr": q, "s_ptr": s, "T": t, "H": h}
        round_in_fp32 = compiled is None and interpreting()
        return launch(fp8_quant_triton.silu_mul_fp8_quant_kernel, grid, values, _constexprs(config, round_in_fp32),
                      config, compiled)

    def baseline(self, problem: Problem, inputs: tuple[Any, ...], out: Any) -> Callable[[], None] | None:
        """Eager PyTorch, unfused (there is no vendor kernel for this): the reference's steps,
        ending in the fp8 values and the scales the kernel writes."""
        import torch

        (x,) = inputs
        t, h = dims(problem)

        def run() -> Any:
            xf = x.float()
            y = (torch.nn.functional.silu(xf[:, :h]) * xf[:, h:]).view(t, n_groups(problem), GROUP_SIZE)
            scale = y.abs().amax(dim=-1).clamp(min=EPS) / FP8_MAX
            q = (y / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
            return q.view(t, h), scale

        return run


def _constexprs(config: Config, round_in_fp32: bool) -> dict[str, Any]:
    return {"EPS": EPS, "FP8_MAX": FP8_MAX, "GROUP_SIZE": GROUP_SIZE,
            "GROUPS_PER_PROGRAM": int(config["GROUPS_PER_PROGRAM"]),
            "ROWS_PER_PROGRAM": int(config["ROWS_PER_PROGRAM"]), "NUM_STAGES": int(config["num_stages"]),
            "ROUND_IN_FP32": round_in_fp32}


def _check_operands(problem: Problem, x: Any, q: Any, s: Any) -> None:
    import torch

    t, h = dims(problem)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[str(problem["dtype"])]
    expected = (((t, 2 * h), dtype), ((t, h), torch.float8_e4m3fn), ((t, n_groups(problem)), torch.float32))
    for name, tensor, (shape, want) in zip(("x", "q", "scales"), (x, q, s), expected, strict=True):
        if tuple(tensor.shape) != shape or tensor.dtype != want:
            raise ValueError(f"operand {name} is {tuple(tensor.shape)} {tensor.dtype}, the problem "
                             f"{problem.label()} needs {shape} {want}")
        if not tensor.is_contiguous() or tensor.data_ptr() % 16:
            raise ValueError(f"operand {name} must be contiguous and 16-byte aligned")
