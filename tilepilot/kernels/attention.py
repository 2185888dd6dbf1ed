"""Family `attention`: O = softmax(Q Kᵀ / sqrt(D)) V, the forward pass of flash attention
(Triton's fused-attention tutorial; the kernel is in `attention_triton.py`).

Problem: B (batch), H (heads), S (sequence length, queries = keys), D (head dim: 32, 64 or
128), causal (bool: query i sees keys 0..i) and dtype (bf16 | fp16). Q, K, V and O are
[B, H, S, D] contiguous in the input dtype; the softmax runs in float32 with the scale 1/sqrt(D).

Config space: BLOCK_M (queries per program), BLOCK_N (keys per step), num_warps and num_stages
(the software pipeline of the key loop), and the kernel variant:
- VARIANT (default "plain"): which kernel runs.
  - "plain": the kernel of `attention_triton.py`, loading through pointers (masked at the ends);
  - "tma": the same block walk with the K and V tiles loaded through tensor descriptors
    (`attention_tma_triton.py`, the Hopper path of Triton's fused-attention tutorial): the bulk
    tensor copy engine fills the pipelined K and V buffers in shared memory, rows past S
    zero-filled, no masked loads in the key loop. Needs sm_90 and a Triton with `tl.make_tensor_descriptor`,
    else the config is a `compile_error` that says so; runs under the interpreter too.
  A config recorded before VARIANT existed is the plain kernel (`SearchSpace.parse` fills in the
  default, and the family reads a missing VARIANT as it).
The constraints below name what is wrong:
- causal: BLOCK_N <= BLOCK_M, the diagonal band of BLOCK_M keys is walked BLOCK_N at a time;
- no block longer than the sequence needs (only masked rows or keys added);
- the K and V tiles of the pipeline and the Q tile within the H100's 227 KiB of shared memory
  per block (`shared_bytes`, what sm_90 compiles allocate; the tma variant adds its copies'
  barriers, `TMA_BARRIER_BYTES`);
- the fp32 accumulator and score tile and the 16-bit probability tile that each thread holds
  must leave room for the rest of the kernel in the 255 registers a thread can have
  (`tile_registers`): beyond `MAX_TILE_REGISTERS` ptxas spills (sm_90 compiles).
Default: the tutorial's choice for the head dim (BLOCK_M 128; BLOCK_N 64 and 4 warps,
4 stages for D <= 64; BLOCK_N 32 and 8 warps, 3 stages for D = 128), smaller blocks for
sequences shorter than a block.

Reference: `torch.nn.functional.scaled_dot_product_attention` on the inputs upcast to float32,
with TF32 off. Error (`error`, what the evaluator holds against the tolerance): the largest
relative error of one query's output row, max over b, h, i of ||O[b,h,i] - ref[b,h,i]|| /
||ref[b,h,i]||. The norm over the whole output would hide late rows: a causal row i averages
i + 1 random rows of V, so its norm falls as 1/sqrt(i + 1), and dropping the diagonal block of
the last 64 queries at S=4096 moves that norm by 4e-3 only, and those rows by up to 0.22.
A correct kernel rounds P to the input dtype before the P·V product (as every flash kernel
does) and O at the end; simulated in float32 on the issue's shapes, that gives row errors with
a median of 2.3e-3 (bf16) and 2.9e-4 (fp16), at most 3.6e-3 and 4.4e-4 over 16k rows (a row is
D elements, so the spread is small); measured on an H100 (Triton 3.6, the issue's 8 shapes, 524k
rows each, 3 or 4 configs each), the largest bf16 row error was 3.1e-3 to 3.8e-3. The
tolerances, 1e-2 and 2e-3, leave 2.5× and 4.5× room above that and stay far below a real
mistake (one key past the causal diagonal let in moves the worst row by 1.4; a row not written
at all is 1).

Work: FLOPs of the two products, 2·D per query-key pair each: 4·B·H·S²·D non-causal, and
4·B·H·D·S(S+1)/2 causal (exactly the pairs the mask keeps; the softmax's exponentials and
sums are not counted). Bytes: Q, K and V read once and O written once, 4·B·H·S·D·2.

Baseline ("PyTorch SDPA"): `scaled_dot_product_attention` in the input dtype, held to its
flash-attention backend; it allocates its own output. On an H100 (torch 2.11, Triton 3.6) the
default config took 0.69 to 1.01 of its time on the issue's 8 shapes (two runs).

L2 is not flushed between timed launches. In a model Q, K and V are written by the QKV
projection just before the attention, so what fits in L2 is warm there. At the issue's sizes
(Q, K, V: 50 MB at S=1024, D=64 up to 400 MB at S=4096, D=128, against the H100's 50 MB L2)
most of them are evicted between launches and come from HBM either way; and the kernel is
compute-bound: S/2 FLOPs per byte of its least traffic (512 at S=1024, against the H100's
~300 of dense bf16 TFLOP/s per TB/s of HBM), each K and V tile read cdiv(S, BLOCK_M) times,
all but the first from L2. A flush would change these timings little and would misstate small
problems, whose inputs a model has in L2.
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
HEAD_DIMS = (32, 64, 128)
KEYS = ("B", "H", "S", "D", "causal", "dtype")
MAX_ELEMENTS = 2**31 - 1  # each operand is indexed with 32-bit offsets
MAX_HEADS = 65535  # B·H is the grid's second axis
TOLERANCE = {"bf16": 1e-2, "fp16": 2e-3}
LOG2_E = 1.4426950408889634
H100_SHARED_BYTES = Target().max_shared_bytes
WARP = 32
MAX_TILE_REGISTERS = 192  # see tile_registers
TMA_BARRIER_BYTES = 1024  # the tma variant's copy barriers, aligned as its swizzled tiles (sm_90 compiles)

PARAMS = (
    Param("BLOCK_M", (64, 128)),
    Param("BLOCK_N", (32, 64, 128)),
    Param("num_warps", (4, 8)),
    Param("num_stages", (2, 3, 4, 5)),
)
VARIANTS = ("plain", "tma")
VARIANT_PARAMS = (Param("VARIANT", VARIANTS, default="plain"),)
DEFAULTS: dict[str, Any] = {p.name: p.default for p in VARIANT_PARAMS}


def setting(config: Config, name: str) -> Any:
    """A variant parameter of the config, its default where the config predates it."""
    return config.get(name, DEFAULTS[name])


def dims(problem: Problem) -> tuple[int, int, int, int]:
    return int(problem["B"]), int(problem["H"]), int(problem["S"]), int(problem["D"])


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def qk_scale(problem: Problem) -> float:
    """1/sqrt(D) in base 2: the kernel takes exp2 of the scaled scores."""
    return LOG2_E / math.sqrt(int(problem["D"]))


# ---- problem ----------------------------------------------------------------------------------
def parse_attention_problem(raw: Mapping[str, Any]) -> Problem:
    if not isinstance(raw, Mapping):
        raise InputError(f"attention problem {raw!r:.80} is not a table of {', '.join(KEYS)}")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise InputError(f"unknown attention problem key {unknown[0]!r} (allowed: {', '.join(KEYS)})")
    for key in ("B", "H", "S"):
        if key not in raw:
            raise InputError(f"attention problem is missing {key} (a positive integer)")
        value = raw[key]
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_ELEMENTS:
            raise InputError(f"attention problem {key}={value!r} is not a positive integer up to {MAX_ELEMENTS}")
    d = raw.get("D")
    if not isinstance(d, int) or isinstance(d, bool) or d not in HEAD_DIMS:
        raise InputError(f"attention problem D={d!r} is not one of {{{', '.join(map(str, HEAD_DIMS))}}}")
    causal = raw.get("causal")
    if not isinstance(causal, bool):
        raise InputError(f"attention problem causal={causal!r} is not one of {{true, false}}")
    dtype = raw.get("dtype")
    if dtype not in DTYPES:
        raise InputError(f"attention problem dtype={dtype!r} is not one of {{{', '.join(DTYPES)}}}")
    b, h, s = raw["B"], raw["H"], raw["S"]
    if b * h > MAX_HEADS:
        raise InputError(f"attention problem B={b} H={h} has {b * h} heads in all (at most {MAX_HEADS} allowed)")
    if b * h * s * d > MAX_ELEMENTS:
        raise InputError(f"attention problem B={b} H={h} S={s} D={d}: each operand has {b * h * s * d} elements "
                         f"(at most {MAX_ELEMENTS} allowed)")
    return Problem.of({"B": b, "H": h, "S": s, "D": d, "causal": causal, "dtype": dtype})


# ---- constraints: None when the config suits the problem, else the reason ---------------------
def causal_diagonal_tiles(config: Config, problem: Problem) -> str | None:
    bm, bn = int(config["BLOCK_M"]), int(config["BLOCK_N"])
    if problem["causal"] and bn > bm:
        return f"causal: BLOCK_N={bn} is longer than the diagonal band of BLOCK_M={bm} keys it walks"
    return None


def blocks_fit_sequence(config: Config, problem: Problem) -> str | None:
    s = int(problem["S"])
    for name in ("BLOCK_M", "BLOCK_N"):
        block, param = int(config[name]), next(p for p in PARAMS if p.name == name)
        limit = max(int(param.choices[0]), next_power_of_2(s))  # type: ignore[call-overload]
        if block > limit:
            return f"{name}={block} is longer than a sequence of {s} needs ({limit}): only masked lanes added"
    return None


def shared_bytes(config: Config, problem: Problem) -> int:
    """Shared memory of the kernel: num_stages buffers of a K tile and a V tile (BLOCK_N × D
    each) and the Q tile (BLOCK_M × D) that the first product reads from shared memory, all in
    the input dtype. Exactly what Triton 3.9 allocates for sm_90 on every config of the space
    (tests/test_kernels_attention.py compiles a sample); VARIANT=tma at most TMA_BARRIER_BYTES
    more (its copies' barriers; the O tile it stores reuses the pipeline's buffers)."""
    bm, bn, d = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(problem["D"])
    size = DTYPE_BYTES[str(problem["dtype"])]
    tiles = (int(config["num_stages"]) * 2 * bn + bm) * d * size
    return tiles + (TMA_BARRIER_BYTES if setting(config, "VARIANT") == "tma" else 0)


def shared_memory_fits(config: Config, problem: Problem) -> str | None:
    need = shared_bytes(config, problem)
    if need > H100_SHARED_BYTES:
        return (f"the {config['num_stages']}-stage pipeline of K and V tiles with the Q tile needs {need} B of "
                f"shared memory, more than the {H100_SHARED_BYTES} B a block can have")
    return None


def tile_registers(config: Config, problem: Problem) -> int:
    """32-bit registers per thread for the tiles a program keeps in registers across the key
    loop: the fp32 accumulator (BLOCK_M × D), the fp32 scores (BLOCK_M × BLOCK_N) and the
    16-bit probabilities (two to a register).

    Compiled for sm_90 (Triton 3.9, ptxas 13.4, every config of the space at D = 64 and 128,
    causal and not): every config at 176 or fewer used at most 255 registers without a spill;
    every config at 224 or more (BLOCK_M=128 with BLOCK_N=64 at D=128, or with BLOCK_N=128,
    on 4 warps) spilled 80 to 1900 bytes per thread. Nothing lies in between; the limit is
    MAX_TILE_REGISTERS = 192."""
    bm, bn, d = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(problem["D"])
    return (bm * d + bm * bn + bm * bn // 2) // (WARP * int(config["num_warps"]))


def registers_fit(config: Config, problem: Problem) -> str | None:
    need = tile_registers(config, problem)
    if need > MAX_TILE_REGISTERS:
        return (f"the accumulator, score and probability tiles take {need} registers per thread with "
                f"num_warps={config['num_warps']} (at most {MAX_TILE_REGISTERS} of 255 leave room: ptxas spills)")
    return None


SPACE = SearchSpace((*PARAMS, *VARIANT_PARAMS),
                    (causal_diagonal_tiles, blocks_fit_sequence, shared_memory_fits, registers_fit))


class AttentionFamily(KernelFamily):
    name: ClassVar[str] = "attention"
    baseline_name: ClassVar[str] = "PyTorch SDPA"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = ("flash-attention forward, softmax(Q Kᵀ / sqrt(D)) V, bf16/fp16, causal or not, "
                                  "float32 online softmax (fused-attention tutorial; variants plain, tma)")
    dtypes: ClassVar[tuple[str, ...]] = DTYPES
    l2_flush: ClassVar[bool] = False

    # ---- CPU side ---------------------------------------------------------------------------
    def space(self) -> SearchSpace:
        return SPACE

    def parse_problem(self, raw: Mapping[str, Any]) -> Problem:
        return parse_attention_problem(raw)

    def default_config(self, problem: Problem) -> Config:
        """The tutorial's choice for the head dim, blocks shortened to what the sequence needs."""
        d, s = int(problem["D"]), int(problem["S"])
        block_n, warps, stages = (64, 4, 4) if d <= 64 else (32, 8, 3)
        block_m = min(128, max(64, next_power_of_2(s)))
        block_n = min(block_n, block_m, max(32, next_power_of_2(s)))
        return Config.of({"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages,
                          **DEFAULTS})

    def work(self, problem: Problem) -> Work:
        b, h, s, d = dims(problem)
        pairs = s * (s + 1) // 2 if problem["causal"] else s * s
        return Work(flops=4.0 * b * h * d * pairs, bytes=float(4 * b * h * s * d * DTYPE_BYTES[str(problem["dtype"])]))

    def specialisation(self, problem: Problem, config: Config) -> str:
        from tilepilot.kernels.compile import int_class

        return f"{problem['dtype']} D:{problem['D']} causal:{problem['causal']} S:{int_class(int(problem['S']))}"

    def source_hash(self) -> str:
        return hash_modules(type(self).__module__, "tilepilot.kernels.attention_triton",
                            "tilepilot.kernels.attention_tma_triton")

    # ---- device side ------------------------------------------------------------------------
    def compile(self, problem: Problem, config: Config, target: Target) -> Any:
        from tilepilot.kernels.compile import Pointer, aot_compile
        from tilepilot.kernels.matmul import _require_tma

        if setting(config, "VARIANT") == "tma":
            _require_tma(target)
        dtype = str(problem["dtype"])
        args: dict[str, Any] = {f"{name}_ptr": Pointer(dtype) for name in ("q", "k", "v", "o")}
        args["S"] = int(problem["S"])
        return aot_compile(_kernel(config), args, _constexprs(problem, config), target,
                           num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]))

    def make_inputs(self, problem: Problem, seed: int, device: str) -> tuple[Any, ...]:
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)
        dtype = torch_dtype(problem)
        return tuple(torch.randn(dims(problem), generator=gen, device=device, dtype=torch.float32).to(dtype)
                     for _ in range(3))

    def make_output(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        import torch

        return torch.empty_like(inputs[0])

    def reference(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        import torch

        q, k, v = (t.float() for t in inputs)
        allow_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False  # true fp32 products where the math backend runs
        try:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(problem["causal"]))
        finally:
            torch.backends.cuda.matmul.allow_tf32 = allow_tf32

    def tolerance(self, problem: Problem) -> float:
        return TOLERANCE[str(problem["dtype"])]

    def error(self, problem: Problem, out: Any, ref: Any) -> float:
        """`row_error(out, ref)`: the largest relative error of one query's output row (see the
        module docstring); inf for NaN or inf."""
        return row_error(out, ref)

    def launcher(self, problem: Problem, config: Config, inputs: tuple[Any, ...], out: Any,
                 compiled: Any | None) -> Callable[[], None]:
        _check_operands(problem, inputs, out)
        q, k, v = inputs
        b, h, s, _ = dims(problem)
        grid = ((s + int(config["BLOCK_M"]) - 1) // int(config["BLOCK_M"]), b * h, 1)
        values = {"q_ptr": q, "k_ptr": k, "v_ptr": v, "o_ptr": out, "S": s}
        run = launch(_kernel(config), grid, values, _constexprs(problem, config), config, compiled)
        if setting(config, "VARIANT") == "tma":  # the descriptors are made on the device, in scratch memory
            return _with_scratch(run, compiled, grid[0] * grid[1], out)
        return run

    def baseline(self, problem: Problem, inputs: tuple[Any, ...], out: Any) -> Callable[[], None] | None:
        """PyTorch's SDPA in the input dtype, held to its flash-attention backend (the others:
        `sdpa_backends`)."""
        return sdpa_backends(problem, inputs)["flash"]


SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


def sdpa_backends(problem: Problem, inputs: tuple[Any, ...]) -> dict[str, Callable[[], Any]]:
    """`scaled_dot_product_attention` in the input dtype held to each of PyTorch's fused backends
    (`SDPA_BACKENDS`: flash, efficient (memory-efficient), cudnn), by name: closures that return
    the output. One that cannot run these inputs on this device raises RuntimeError when called."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = inputs
    causal = bool(problem["causal"])

    def held(backend: Any) -> Callable[[], Any]:
        def run() -> Any:
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return run

    return {name: held(getattr(SDPBackend, attr)) for name, attr in SDPA_BACKENDS.items()}


def row_error(out: Any, ref: Any) -> float:
    """max over rows of ||out_row - ref_row|| / ||ref_row|| (rows along the last dim, in float32);
    a row whose reference is all zeros counts its absolute error. `math.inf` when not finite."""
    import torch

    r = ref.float()
    diff = torch.linalg.vector_norm(out.float() - r, dim=-1)
    norm = torch.linalg.vector_norm(r, dim=-1)
    err = float(torch.where(norm > 0, diff / norm, diff).max()) if diff.numel() else 0.0
    return err if math.isfinite(err) else math.inf


def torch_dtype(problem: Problem) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}[str(problem["dtype"])]


def _with_scratch(run: Callable[[], None], compiled: Any | None, programs: int, out: Any) -> Callable[[], None]:
    """`run` with the global scratch memory the device-made tensor descriptors of the tma variant
    live in: allocated here, once, and handed to Triton's launcher through `triton.set_allocator`
    at each launch."""
    if compiled is None:
        return run  # the interpreter keeps descriptors on the host
    import torch
    import triton

    need = int(getattr(compiled.metadata, "global_scratch_size", 0)) * programs
    scratch = torch.empty(max(need, 1), dtype=torch.uint8, device=out.device)

    def allocate(size: int, alignment: int, stream: Any) -> Any:
        if size > scratch.numel():
            raise RuntimeError(f"the tma kernel asks for {size} B of scratch memory, {scratch.numel()} B set aside")
        return scratch

    def run_tma() -> None:
        triton.set_allocator(allocate)
        run()

    return run_tma


def _kernel(config: Config) -> Any:
    """The variant's Triton function."""
    from tilepilot.kernels import attention_tma_triton, attention_triton

    if setting(config, "VARIANT") == "tma":
        return attention_tma_triton.attention_tma_kernel
    return attention_triton.attention_kernel


def _constexprs(problem: Problem, config: Config) -> dict[str, Any]:
    consts = {"HEAD_DIM": int(problem["D"]), "BLOCK_M": int(config["BLOCK_M"]), "BLOCK_N": int(config["BLOCK_N"]),
              "CAUSAL": bool(problem["causal"]), "QK_SCALE": qk_scale(problem)}
    return consts


def _check_operands(problem: Problem, inputs: tuple[Any, ...], out: Any) -> None:
    if len(inputs) != 3:
        raise ValueError(f"attention takes 3 inputs (q, k, v), got {len(inputs)}")
    shape, dtype = dims(problem), torch_dtype(problem)
    for name, t in zip(("q", "k", "v", "out"), (*inputs, out), strict=True):
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(f"operand {name} is {tuple(t.shape)} {t.dtype}, the problem {problem.label()} "
                             f"needs {shape} {dtype}")
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError(f"operand {name} must be contiguous and 16-byte aligned")
