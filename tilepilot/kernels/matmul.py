"""Family `matmul`: C = A @ B in bf16 or fp16 with fp32 accumulation (Triton's GEMM tutorial).

Problem: M, N, K (positive ints up to 65536, each operand under 2**31 elements) and dtype
(bf16 | fp16); A is M×K, B is K×N, C is M×N, all row-major. The config space is the
tutorial's (tile sizes, the group size of the swizzled program order, warps and pipeline
stages) plus the kernel variant and its own parameters:

- VARIANT (default "grouped"): which kernel runs.
  - "grouped": the tutorial kernel, one program per output tile (matmul_triton.py);
  - "splitk": K cut into SPLIT_K ranges computed by separate programs, fp32 partials reduced in
    a fixed order by a second launch, so the result is deterministic (matmul_splitk_triton.py);
  - "persistent": one program per SM looping over the output tiles (a tile scheduler), loads
    of the next tile overlapping the epilogue of the current one (matmul_persistent_triton.py);
  - "tma": the persistent kernel loading and storing whole tiles through tensor descriptors
    (Hopper's bulk tensor copy engine), made on the host; needs sm_90 and a Triton with host
    tensor descriptors (`triton.tools.tensor_descriptor`), else the config is a `compile_error`
    that says so;
  - "splitk_fused": split-K in one launch: the program that finishes a tile's last K range sums
    the fp32 partials in a fixed order (deterministic) and writes C (matmul_splitk_fused_triton.py);
    for the decode shapes, where a second launch costs a large share of the time;
  - "tma_tail": the tma kernel with the last, partial wave of tiles split along K over the programs
    the wave would leave idle (deterministic reduction as splitk_fused), for problems whose tile
    count falls just over a multiple of the SM count (matmul_persistent_triton.py);
  - "streamk": the tma kernel's whole waves of tiles, then Stream-K over the last, partial wave:
    its tiles' K-blocks cut into one equal, contiguous range per SM, a tile shared by two programs
    summed in a fixed order (deterministic, as splitk_fused), so no SM waits out a partial wave,
    however few the tiles (matmul_persistent_triton.py);
  - "tma_splitk": split-K with the tma kernel's loads: one program per output tile and K range
    (grid: tiles × SPLIT_K) loading through tensor descriptors, its fp32 partial stored through
    pointers, then splitk's reduction launch (deterministic); for few tiles and a long K, where on
    the H100 it takes 1024×1024×16384 bf16 from 0.0621 (splitk, pointer loads) to 0.0594 ms at
    128×256×64 tiles, SPLIT_K=4 (bench/results/tma-splitk-probe-h100.json; cuBLAS 0.0572);
- SPLIT_K (default 1): the number of K ranges, 2 or more for VARIANT=splitk, splitk_fused or
  tma_splitk and 1 otherwise (tma_tail derives its own split from the tile count);
- EPILOGUE_SUBTILE (default False): tma, tma_tail and streamk store C in two halves, so the tile
  staged in shared memory for the store is half as large (Triton's 09-persistent-matmul tutorial);
- WARP_SPECIALIZE (default False): tma's tile loop with `tl.range(..., warp_specialize=True)`
  (separate load and MMA warps); where the installed Triton cannot do that for the target the
  config is a `compile_error` with Triton's reason;
- PAD_ROWS (default "none"; "A", "B" or "AB"): for tma, tma_tail and streamk, copy the
  operands named into a buffer whose rows are padded to a multiple of 128 bytes (a Triton kernel
  launched before the GEMM, matmul_pad_triton.py), and load them from there. TMA loads rows that
  start off a 128-byte boundary at a cost: on the H100 the tma kernel takes 3000×5000×1000 fp16
  (rows of 2000 and 10000 bytes) from 0.078 ms to 0.068 ms with B copied at each call
  (bench/results/pad-probe-h100.json). Only for an operand whose rows are not a multiple of 128
  bytes (A: K, B: N elements);
- ALIGN_HINT (default False): state the alignment of K and N that Triton cannot see. Triton
  specialises integer arguments on divisibility by 16 only, so a row of K=1000 fp16 elements
  (2000 bytes, a multiple of 16) looks unaligned and its loads go element by element. With
  ALIGN_HINT the host computes the largest power of two up to 16 bytes dividing K and N and the
  kernel restates them so the loads are vectors again (see matmul_triton.py). Only where it says
  something (K or N not a multiple of 16 but even) and not for "tma" (no pointer loads).

A config without these parameters (recorded before they existed) is the grouped kernel:
`SearchSpace.parse` fills in the defaults, and the family reads a missing one as its default.
The conditional parameters are constraints with a one-line reason, e.g. "SPLIT_K=4 is only for
VARIANT=splitk".

BLOCK_SIZE_N takes 160 and 192 besides powers of two, for VARIANT=tma only: a tile as wide as
cuBLAS's 192x128 and 160x256 ones can even out the waves where power-of-two tiles leave SMs idle
(6144×1536×4096: 384 tiles of 128×192 are 2.9 waves on 132 SMs, 288 of 128×256 are 2.2, so three
rounds of the larger tile); the kernel computes it as two column blocks, 128 + 64 or 128 + 32
(matmul_persistent_triton.matmul_tma_wide_kernel, which does not overlap a tile's
epilogue with the next tile's loads as the tma kernel does).

Constraints besides those: the pipelined tiles must fit shared memory, and the fp32 accumulator
(BM·BN / (32·num_warps) registers per thread) the 255 registers a thread has.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from tilepilot.experiments import Config, InputError, Param, Problem, SearchSpace, reads
from tilepilot.kernels.base import KernelFamily, Target, Work
from tilepilot.kernels.compile import hash_modules, launch

DTYPES = ("bf16", "fp16")
DTYPE_BYTES = {"bf16": 2, "fp16": 2}
MAX_DIM = 65536
MAX_ELEMENTS = 2**31 - 1  # the kernel indexes each operand with 32-bit offsets
TOLERANCE = {"bf16": 1e-2, "fp16": 2e-3}  # ||C - ref|| / ||ref||; output rounding alone is ~2e-3 / ~3e-4
H100_SHARED_BYTES = Target().max_shared_bytes
VECTOR_BYTES = 16  # the widest load a thread issues, and TMA's row-stride alignment
MAX_WORKSPACE_BYTES = 2**30  # split-K's fp32 partials, SPLIT_K × M × N × 4 bytes
PAD_ROW_BYTES = 128  # PAD_ROWS pads an operand's rows to a multiple of this
WARP_THREADS = 32
MAX_THREAD_REGISTERS = 255
INTERPRETER_PROGRAMS = 3  # persistent programs under the interpreter: fewer than the tiles, so each loops

PARAMS = (
    Param("BLOCK_SIZE_M", (16, 32, 64, 128, 256)),
    Param("BLOCK_SIZE_N", (16, 32, 64, 128, 160, 192, 256)),
    Param("BLOCK_SIZE_K", (16, 32, 64, 128, 256)),
    Param("GROUP_SIZE_M", (1, 4, 8, 16)),
    Param("num_warps", (2, 4, 8)),
    Param("num_stages", (2, 3, 4, 5)),
)
TILE_PARAMS = tuple(p.name for p in PARAMS)
VARIANTS = ("grouped", "splitk", "persistent", "tma", "splitk_fused", "tma_tail", "streamk", "tma_splitk")
SPLIT_VARIANTS = ("splitk", "splitk_fused", "tma_splitk")  # those that take SPLIT_K
TMA_VARIANTS = ("tma", "tma_tail", "streamk")  # those that load A and B and store C through tensor descriptors
DESCRIPTOR_LOADS = (*TMA_VARIANTS, "tma_splitk")  # those that load A and B through tensor descriptors
M_N_WORKSPACE = ("splitk", "tma_splitk")  # split-K whose partials are SPLIT_K × M×N floats, reduced by a launch
VARIANT_PARAMS = (
    Param("VARIANT", VARIANTS, default="grouped"),
    Param("SPLIT_K", (1, 2, 4, 8, 16), default=1),
    Param("ALIGN_HINT", (False, True), default=False),
    Param("EPILOGUE_SUBTILE", (False, True), default=False),
    Param("WARP_SPECIALIZE", (False, True), default=False),
    Param("PAD_ROWS", ("none", "A", "B", "AB"), default="none"),
)
DEFAULTS: dict[str, Any] = {p.name: p.default for p in VARIANT_PARAMS}


def setting(config: Config, name: str) -> Any:
    """A variant parameter of the config, its default where the config predates it."""
    return config.get(name, DEFAULTS[name])


def pipelined_shared_bytes(config: Config, problem: Problem) -> int:
    """Shared memory of the software pipeline: num_stages buffers of an A tile and a B tile."""
    bm, bn, bk = (int(config[k]) for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"))
    return int(config["num_stages"]) * (bm * bk + bk * bn) * DTYPE_BYTES[str(problem["dtype"])]


@reads("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_stages")
def shared_memory_fits(config: Config, problem: Problem) -> str | None:
    """The pipelined A/B tiles must fit the per-block shared memory of the device (H100: 227 KiB)."""
    need = pipelined_shared_bytes(config, problem)
    if need > H100_SHARED_BYTES:
        return (f"the {config['num_stages']}-stage pipeline needs {need} B of shared memory for its A and B "
                f"tiles, more than the {H100_SHARED_BYTES} B a block can have")
    return None


def alignment(dim: int, dtype: str) -> int:
    """What ALIGN_HINT asserts of a row of `dim` elements: 1 where Triton knows it by itself (dim a
    multiple of 16), else the largest power of two dividing dim, up to 16 bytes of elements."""
    if dim % 16 == 0:
        return 1
    align = 1
    while align * 2 * DTYPE_BYTES[dtype] <= VECTOR_BYTES and dim % (align * 2) == 0:
        align *= 2
    return align


def alignments(problem: Problem, config: Config) -> tuple[int, int]:
    """The kernel's ALIGN_K and ALIGN_N: (1, 1) without ALIGN_HINT."""
    if not setting(config, "ALIGN_HINT"):
        return 1, 1
    _, n, k = dims(problem)
    dtype = str(problem["dtype"])
    return alignment(k, dtype), alignment(n, dtype)


# Each constraint names the parameters it reads (`reads`), so that SearchSpace.valid prunes a
# refused choice of them at once: the variant parameters make the space 9.4 million points.
@reads("VARIANT", "SPLIT_K")
def split_settings(config: Config, problem: Problem) -> str | None:
    """SPLIT_K belongs to the split-K variants, which need at least two splits."""
    variant, split = setting(config, "VARIANT"), int(setting(config, "SPLIT_K"))
    if variant in SPLIT_VARIANTS and split < 2:
        return f"VARIANT={variant} needs SPLIT_K of 2 or more"
    if variant not in SPLIT_VARIANTS and split != 1:
        return f"SPLIT_K={split} is only for VARIANT={' or '.join(SPLIT_VARIANTS)}"
    return None


@reads("VARIANT", "EPILOGUE_SUBTILE", "WARP_SPECIALIZE")
def descriptor_settings(config: Config, problem: Problem) -> str | None:
    """EPILOGUE_SUBTILE belongs to the tensor-descriptor variants; WARP_SPECIALIZE to VARIANT=tma."""
    variant = setting(config, "VARIANT")
    if setting(config, "EPILOGUE_SUBTILE") and variant not in TMA_VARIANTS:
        return f"EPILOGUE_SUBTILE=True is only for VARIANT={' or '.join(TMA_VARIANTS)}"
    if setting(config, "WARP_SPECIALIZE") and variant != "tma":
        return "WARP_SPECIALIZE=True is only for VARIANT=tma"
    return None


@reads("ALIGN_HINT", "VARIANT")
def align_hint_applies(config: Config, problem: Problem) -> str | None:
    """ALIGN_HINT must say something Triton does not know, to a kernel that loads through pointers."""
    if not setting(config, "ALIGN_HINT"):
        return None
    if setting(config, "VARIANT") in DESCRIPTOR_LOADS:
        return (f"ALIGN_HINT=True is for pointer loads; VARIANT={setting(config, 'VARIANT')} loads through "
                "tensor descriptors")
    if alignments(problem, config) == (1, 1):
        _, n, k = dims(problem)
        return (f"ALIGN_HINT=True has nothing to assert: K={k} and N={n} are each a multiple of 16 "
                "(Triton specialises on that by itself) or odd")
    return None


@reads("VARIANT", "SPLIT_K", "BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K")
def splitk_fits(config: Config, problem: Problem) -> str | None:
    """Every split gets at least one BLOCK_SIZE_K block, and the fp32 partials fit the workspace cap."""
    if setting(config, "VARIANT") not in SPLIT_VARIANTS:
        return None
    _, _, k = dims(problem)
    split, bk = int(setting(config, "SPLIT_K")), int(config["BLOCK_SIZE_K"])
    blocks = -(-k // bk)
    if (split - 1) * -(-blocks // split) >= blocks:
        return (f"SPLIT_K={split} leaves a split without work: K={k} is {blocks} block(s) of "
                f"BLOCK_SIZE_K={bk}")
    need = split * workspace_elements(problem, config) * 4
    if need > MAX_WORKSPACE_BYTES:
        shape = "M×N" if setting(config, "VARIANT") in M_N_WORKSPACE else "the tiles"
        return (f"SPLIT_K={split} needs a {need / 2**20:.0f} MiB fp32 workspace (SPLIT_K × {shape}), more than "
                f"{MAX_WORKSPACE_BYTES // 2**20} MiB")
    return None


def workspace_elements(problem: Problem, config: Config) -> int:
    """fp32 elements of one split's partials: M×N (splitk, tma_splitk), whole output tiles
    (splitk_fused)."""
    m, n, _ = dims(problem)
    if setting(config, "VARIANT") in M_N_WORKSPACE:
        return m * n
    bm, bn = int(config["BLOCK_SIZE_M"]), int(config["BLOCK_SIZE_N"])
    return -(-m // bm) * -(-n // bn) * bm * bn


@reads("VARIANT", "BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_stages", "EPILOGUE_SUBTILE")
def tma_fits(config: Config, problem: Problem) -> str | None:
    """TMA needs 16-byte aligned row strides; the stored C tile (half of it with EPILOGUE_SUBTILE)
    is staged in shared memory too, where C leaves through a descriptor (not tma_splitk's partials)."""
    variant = setting(config, "VARIANT")
    if variant not in DESCRIPTOR_LOADS:
        return None
    _, n, k = dims(problem)
    dtype = str(problem["dtype"])
    size = DTYPE_BYTES[dtype]
    bad = [f"{name}={v}" for name, v in (("K", k), ("N", n)) if v * size % VECTOR_BYTES]
    if bad:
        return (f"VARIANT={variant} needs rows of a multiple of {VECTOR_BYTES} bytes: {dtype} rows of "
                f"{' and '.join(bad)} elements are not")
    if variant not in TMA_VARIANTS:
        return None  # the pipeline alone: shared_memory_fits
    c_tile = int(config["BLOCK_SIZE_M"]) * int(config["BLOCK_SIZE_N"]) * size
    need = pipelined_shared_bytes(config, problem) + (c_tile // 2 if setting(config, "EPILOGUE_SUBTILE") else c_tile)
    if need > H100_SHARED_BYTES:
        return (f"VARIANT={variant} needs {need} B of shared memory for its {config['num_stages']}-stage A and B "
                f"tiles and the C tile it stores, more than the {H100_SHARED_BYTES} B a block can have")
    return None


def padded(config: Config) -> str:
    """The operands PAD_ROWS copies into padded rows, "a" and/or "b" ("" for none)."""
    pads = str(setting(config, "PAD_ROWS"))
    return "" if pads == "none" else pads.lower()


def row_cols(problem: Problem, operand: str) -> int:
    """Elements in a row of operand "a" (K) or "b" (N)."""
    _, n, k = dims(problem)
    return k if operand == "a" else n


@reads("PAD_ROWS", "VARIANT")
def pad_rows_applies(config: Config, problem: Problem) -> str | None:
    """PAD_ROWS is for the persistent tensor-descriptor variants (the others load rows through
    pointers; tma_splitk's launch holds its reduction already), and only for operands whose rows are
    not a multiple of 128 bytes already."""
    pads = padded(config)
    if not pads:
        return None
    variant = setting(config, "VARIANT")
    if variant not in TMA_VARIANTS:
        return (f"PAD_ROWS={setting(config, 'PAD_ROWS')} is only for VARIANT={' or '.join(TMA_VARIANTS)}, "
                "the persistent kernels that load through tensor descriptors")
    size = DTYPE_BYTES[str(problem["dtype"])]
    for operand in pads:
        cols = row_cols(problem, operand)
        if cols * size % PAD_ROW_BYTES == 0:
            return (f"PAD_ROWS={setting(config, 'PAD_ROWS')} has nothing to pad in {operand.upper()}: its rows "
                    f"of {'K' if operand == 'a' else 'N'}={cols} {problem['dtype']} elements are "
                    f"{cols * size} bytes, a multiple of {PAD_ROW_BYTES}")
    return None


def pad_pitch(problem: Problem, operand: str) -> int:
    """Row pitch in elements of operand's padded copy: its row length rounded up to 128 bytes."""
    step = PAD_ROW_BYTES // DTYPE_BYTES[str(problem["dtype"])]
    return -(-row_cols(problem, operand) // step) * step


@reads("BLOCK_SIZE_M", "BLOCK_SIZE_N", "num_warps")
def accumulator_fits_registers(config: Config, problem: Problem) -> str | None:
    """The fp32 accumulator of a tile, BM·BN / (32·num_warps) registers per thread, must fit the
    255 a thread can have: one that does not always spills. The recorded H100 and H200 grids predate
    this constraint: every such config measured there (672) spilled at least 128 registers and ran
    at least 1.9x slower than its problem's best. They are also the slowest to compile (ptxas:
    11-13 s for a 128×256 tile with num_warps=2, against a median of 0.3 s)."""
    bm, bn, warps = int(config["BLOCK_SIZE_M"]), int(config["BLOCK_SIZE_N"]), int(config["num_warps"])
    regs = bm * bn // (WARP_THREADS * warps)
    if regs > MAX_THREAD_REGISTERS:
        return (f"the {bm}×{bn} fp32 accumulator takes {regs} registers per thread with num_warps={warps}, "
                f"more than the {MAX_THREAD_REGISTERS} a thread can have: it always spills")
    return None


@reads("BLOCK_SIZE_N", "VARIANT")
def wide_tile(config: Config, problem: Problem) -> str | None:
    """A BLOCK_SIZE_N that is not a power of two is two column blocks of the tma kernel."""
    bn = int(config["BLOCK_SIZE_N"])
    if bn & (bn - 1) and setting(config, "VARIANT") != "tma":
        return f"BLOCK_SIZE_N={bn} (not a power of two) is only for VARIANT=tma"
    return None


@reads("BLOCK_SIZE_N", "EPILOGUE_SUBTILE", "WARP_SPECIALIZE")
def wide_tile_store(config: Config, problem: Problem) -> str | None:
    """Each column block of a tile BLOCK_SIZE_N wide that is not a power of two is stored whole (no
    EPILOGUE_SUBTILE, no WARP_SPECIALIZE)."""
    bn = int(config["BLOCK_SIZE_N"])
    if bn & (bn - 1) == 0:
        return None
    for name in ("EPILOGUE_SUBTILE", "WARP_SPECIALIZE"):
        if setting(config, name):
            return f"{name}=True is not for BLOCK_SIZE_N={bn}, which is stored as two column blocks"
    return None


def wide_split(bn: int) -> int:
    """The second column block of a tile BLOCK_SIZE_N wide: 0 for a power of two, else what is
    left past the largest power of two below it (192 -> 64, 160 -> 32)."""
    return bn - (1 << (bn.bit_length() - 1))


def descriptor_blocks(config: Config) -> dict[str, tuple[str, tuple[int, int]]]:
    """The tensor descriptor arguments of a tma-family kernel: name -> (operand "a", "b" or "c",
    block shape). C's block is half a tile wide with EPILOGUE_SUBTILE; a tile BLOCK_SIZE_N wide that
    is not a power of two has B and C descriptors for each of its two column blocks. {} for the
    variants that load through pointers; A's and B's alone for tma_splitk, which stores its partials
    through pointers."""
    if setting(config, "VARIANT") not in DESCRIPTOR_LOADS:
        return {}
    bm, bn, bk = (int(config[name]) for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"))
    if setting(config, "VARIANT") == "tma_splitk":
        return {"a_desc": ("a", (bm, bk)), "b_desc": ("b", (bk, bn))}
    n1 = wide_split(bn)
    if n1:
        return {"a_desc": ("a", (bm, bk)), "b0_desc": ("b", (bk, bn - n1)), "b1_desc": ("b", (bk, n1)),
                "c0_desc": ("c", (bm, bn - n1)), "c1_desc": ("c", (bm, n1))}
    c_cols = bn // 2 if setting(config, "EPILOGUE_SUBTILE") else bn
    return {"a_desc": ("a", (bm, bk)), "b_desc": ("b", (bk, bn)), "c_desc": ("c", (bm, c_cols))}


CONSTRAINTS = (wide_tile, wide_tile_store, split_settings, descriptor_settings, align_hint_applies,
               shared_memory_fits, splitk_fits, tma_fits, pad_rows_applies, accumulator_fits_registers)


class MatmulFamily(KernelFamily):
    name: ClassVar[str] = "matmul"
    baseline_name: ClassVar[str] = "cuBLAS (torch.matmul)"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = ("C = A @ B, bf16/fp16 in and out, fp32 accumulation (Triton GEMM tutorial; "
                                  "variants grouped, splitk, persistent, tma, splitk_fused, tma_tail, streamk, "
                                  "tma_splitk)")
    dtypes: ClassVar[tuple[str, ...]] = DTYPES
    l2_flush: ClassVar[bool] = True

    # ---- CPU side ---------------------------------------------------------------------------
    def space(self) -> SearchSpace:
        return SearchSpace((*PARAMS, *VARIANT_PARAMS), CONSTRAINTS)

    def parse_problem(self, raw: Mapping[str, Any]) -> Problem:
        return parse_matmul_problem(raw)

    def default_config(self, problem: Problem) -> Config:
        return Config.of({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64,
                          "GROUP_SIZE_M": 8, "num_warps": 8, "num_stages": 3, **DEFAULTS})

    def work(self, problem: Problem) -> Work:
        m, n, k = dims(problem)
        size = DTYPE_BYTES[str(problem["dtype"])]
        return Work(flops=2.0 * m * n * k, bytes=float((m * k + k * n + m * n) * size))

    def specialisation(self, problem: Problem, config: Config) -> str:
        from tilepilot.kernels.compile import int_class

        m, n, k = dims(problem)
        spec = f"{problem['dtype']} M:{int_class(m)} N:{int_class(n)} K:{int_class(k)}"
        align = alignments(problem, config)
        if align != (1, 1):
            spec += f" ALIGN_K:{align[0]} ALIGN_N:{align[1]}"
        if setting(config, "VARIANT") == "splitk":
            spec += f" MN:{int_class(m * n)}"  # the reduction's length
        if few_rows(problem, config):
            spec += " FEW_ROWS"
        return spec

    def source_hash(self) -> str:
        """The family module and its kernel modules, so that an edited kernel is a new experiment."""
        return hash_modules(type(self).__module__, *KERNEL_MODULES)

    # ---- device side ------------------------------------------------------------------------
    def compile(self, problem: Problem, config: Config, target: Target) -> Any:
        from tilepilot.kernels import matmul_pad_triton, matmul_splitk_triton
        from tilepilot.kernels.compile import Descriptor, Pointer, aot_compile

        variant = setting(config, "VARIANT")
        if variant in DESCRIPTOR_LOADS:
            _require_tma(target)
        fn, ints, constexprs = _kernel(problem, config)
        dtype = str(problem["dtype"])
        kinds = {"ws_ptr": "fp32", "lock_ptr": "i32"}
        args: dict[str, Any] = {name: Pointer(kinds.get(name, dtype)) for name in fn.arg_names
                                if name.endswith("_ptr")}
        args.update({name: Descriptor(dtype, block) for name, (_, block) in descriptor_blocks(config).items()})
        main = aot_compile(fn, {**args, **ints}, constexprs, target,
                           num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]))
        if padded(config):
            return PaddedCompiled(main, {operand: aot_compile(matmul_pad_triton.pad_rows_kernel,
                                                              _pad_args(problem, operand, Pointer(dtype)),
                                                              _pad_constexprs(problem, operand), target,
                                                              num_warps=matmul_pad_triton.WARPS, num_stages=1)
                                         for operand in padded(config)})
        if variant not in M_N_WORKSPACE:
            return main
        m, n, _ = dims(problem)
        reduce = aot_compile(matmul_splitk_triton.splitk_reduce_kernel,
                             {"ws_ptr": Pointer("fp32"), "c_ptr": Pointer(dtype), "MN": m * n},
                             _reduce_constexprs(config), target, num_warps=matmul_splitk_triton.REDUCE_WARPS,
                             num_stages=1)
        return SplitKCompiled(main, reduce)

    def make_inputs(self, problem: Problem, seed: int, device: str) -> tuple[Any, ...]:
        import torch

        m, n, k = dims(problem)
        dtype = torch_dtype(problem)
        gen = torch.Generator(device=device).manual_seed(seed)
        a = torch.randn((m, k), generator=gen, device=device, dtype=torch.float32).to(dtype)
        b = torch.randn((k, n), generator=gen, device=device, dtype=torch.float32).to(dtype)
        return (a, b)

    def make_output(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        import torch

        m, n, _ = dims(problem)
        return torch.empty((m, n), dtype=inputs[0].dtype, device=inputs[0].device)

    def reference(self, problem: Problem, inputs: tuple[Any, ...]) -> Any:
        import torch

        a, b = inputs
        allow_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False  # a true fp32 product
        try:
            return torch.matmul(a.float(), b.float())
        finally:
            torch.backends.cuda.matmul.allow_tf32 = allow_tf32

    def tolerance(self, problem: Problem) -> float:
        return TOLERANCE[str(problem["dtype"])]

    def launcher(self, problem: Problem, config: Config, inputs: tuple[Any, ...], out: Any,
                 compiled: Any | None) -> Callable[[], None]:
        a, b = inputs
        _check_operands(problem, a, b, out)
        variant = setting(config, "VARIANT")
        if variant in M_N_WORKSPACE:
            return _splitk_launcher(problem, config, a, b, out, compiled)
        fn, ints, constexprs = _kernel(problem, config)
        m, n, _ = dims(problem)
        bm, bn = int(config["BLOCK_SIZE_M"]), int(config["BLOCK_SIZE_N"])
        tiles = -(-m // bm) * -(-n // bn)
        blocks = descriptor_blocks(config)
        copies = _pad_copies(problem, config, {"a": a, "b": b}, compiled)
        pointers: dict[str, Any] = ({"a_ptr": a, "b_ptr": b, "c_ptr": out} if not blocks
                                    else _descriptors(blocks, {"a": a, "b": b, "c": out,
                                                               **{name: dst for name, (dst, _) in copies.items()}}))
        grid = (tiles, 1, 1) if variant == "grouped" else (min(tiles, _programs(a)), 1, 1)
        if variant == "splitk_fused":
            split = int(setting(config, "SPLIT_K"))
            grid = (tiles, split, 1)
            pointers.update(ws_ptr=_workspace(split * workspace_elements(problem, config), a.device),
                            lock_ptr=_locks(tiles, a.device))
        if variant == "tma_tail":  # every SM, so that tiles fewer than the SMs are split too
            grid = (_programs(a), 1, 1)
            pointers.update(ws_ptr=_workspace(grid[0] * bm * bn, a.device), lock_ptr=_locks(grid[0], a.device))
        if variant == "streamk":  # every SM; at most two pieces a program, fewer last-wave tiles than SMs
            grid = (_programs(a), 1, 1)
            pointers.update(ws_ptr=_workspace(grid[0] * 2 * bm * bn, a.device), lock_ptr=_locks(grid[0], a.device))
        run = launch(fn, grid, {**pointers, **ints}, constexprs, config, compiled)
        if not copies:
            return run
        pads = [copy for _, copy in copies.values()]

        def run_padded() -> None:
            for copy in pads:
                copy()
            run()

        return run_padded

    def baseline(self, problem: Problem, inputs: tuple[Any, ...], out: Any) -> Callable[[], None] | None:
        import torch

        a, b = inputs

        def run() -> None:
            torch.matmul(a, b, out=out)

        return run


KERNEL_MODULES = ("tilepilot.kernels.matmul_triton", "tilepilot.kernels.matmul_splitk_triton",
                  "tilepilot.kernels.matmul_persistent_triton", "tilepilot.kernels.matmul_splitk_fused_triton",
                  "tilepilot.kernels.matmul_pad_triton")


class _Composite:
    """A main kernel compiled with the others its launch needs. To the evaluator it reads as the
    main kernel (its metadata, registers and spills; `compiled[grid]` launches it)."""

    compiled_parts: tuple[Any, ...]  # every kernel in it (compile.build_launchers)

    def __init__(self, main: Any) -> None:
        self.main = main

    def __getattr__(self, name: str) -> Any:
        return getattr(self.main, name)

    def __getitem__(self, grid: tuple[int, int, int]) -> Any:
        return self.main[grid]


class SplitKCompiled(_Composite):
    """The split-K kernel and its reduction compiled together."""

    def __init__(self, main: Any, reduce: Any) -> None:
        super().__init__(main)
        self.reduce = reduce
        self.compiled_parts = (main, reduce)


class PaddedCompiled(_Composite):
    """A tensor-descriptor kernel and the copy kernel of each operand PAD_ROWS pads ("a", "b")."""

    def __init__(self, main: Any, pads: dict[str, Any]) -> None:
        super().__init__(main)
        self.pads = pads
        self.compiled_parts = (main, *pads.values())


# ---- variants: which kernel, its arguments, its launch ------------------------------------------
def _kernel(problem: Problem, config: Config) -> tuple[Any, dict[str, int], dict[str, Any]]:
    """The variant's Triton function, its integer arguments and its compile-time constants."""
    from tilepilot.kernels import (
        matmul_persistent_triton,
        matmul_splitk_fused_triton,
        matmul_splitk_triton,
        matmul_triton,
    )

    variant = setting(config, "VARIANT")
    ints, constexprs = _int_args(problem), _constexprs(config)
    align_k, align_n = alignments(problem, config)
    aligned = {**constexprs, "ALIGN_K": align_k, "ALIGN_N": align_n}
    mnk = {k: ints[k] for k in ("M", "N", "K")}
    subtile = bool(setting(config, "EPILOGUE_SUBTILE"))
    if variant == "tma" and wide_split(constexprs["BLOCK_SIZE_N"]):
        return matmul_persistent_triton.matmul_tma_wide_kernel, mnk, {
            **constexprs, "BLOCK_SIZE_N1": wide_split(constexprs["BLOCK_SIZE_N"])}
    if variant == "tma":
        return matmul_persistent_triton.matmul_tma_kernel, mnk, {
            **constexprs, "EPILOGUE_SUBTILE": subtile, "WARP_SPECIALIZE": bool(setting(config, "WARP_SPECIALIZE"))}
    if variant == "tma_tail":
        return matmul_persistent_triton.matmul_tma_tail_kernel, mnk, {**constexprs, "EPILOGUE_SUBTILE": subtile}
    if variant == "streamk":
        return matmul_persistent_triton.matmul_tma_streamk_kernel, mnk, {**constexprs, "EPILOGUE_SUBTILE": subtile}
    if variant == "tma_splitk":
        return (matmul_persistent_triton.matmul_tma_splitk_kernel, mnk,
                {**constexprs, "SPLIT_K": int(setting(config, "SPLIT_K"))})
    if variant == "persistent":
        return matmul_persistent_triton.matmul_persistent_kernel, ints, aligned
    aligned["FEW_ROWS"] = few_rows(problem, config)
    if variant == "splitk_fused":
        return (matmul_splitk_fused_triton.matmul_splitk_fused_kernel, ints,
                {**aligned, "SPLIT_K": int(setting(config, "SPLIT_K"))})
    if variant == "splitk":
        ints = {k: v for k, v in ints.items() if not k.startswith("stride_c")}
        return matmul_splitk_triton.matmul_splitk_kernel, ints, {**aligned, "SPLIT_K": int(setting(config, "SPLIT_K"))}
    return matmul_triton.matmul_kernel, ints, aligned


FEW_ROWS_VARIANTS = ("grouped", "splitk", "splitk_fused")  # the kernels whose A rows past M may be masked


def few_rows(problem: Problem, config: Config) -> bool:
    """FEW_ROWS of the grouped and split-K kernels: M is below one tile's rows, so A's rows past M are
    masked rather than loaded again (matmul_triton.py)."""
    m, _, _ = dims(problem)
    return setting(config, "VARIANT") in FEW_ROWS_VARIANTS and m < int(config["BLOCK_SIZE_M"])


def _pad_args(problem: Problem, operand: str, pointer: Any) -> dict[str, Any]:
    """pad_rows_kernel's arguments for operand "a" (M×K) or "b" (K×N), `pointer` as src and dst."""
    m, n, k = dims(problem)
    rows, cols = (m, k) if operand == "a" else (k, n)
    return {"src_ptr": pointer, "dst_ptr": pointer, "rows": rows, "cols": cols, "ld": pad_pitch(problem, operand)}


def _pad_constexprs(problem: Problem, operand: str) -> dict[str, int]:
    from tilepilot.kernels import matmul_pad_triton

    dtype = str(problem["dtype"])
    return {"ALIGN": alignment(row_cols(problem, operand), dtype),
            "LD_ALIGN": PAD_ROW_BYTES // DTYPE_BYTES[dtype], "BLOCK_R": matmul_pad_triton.BLOCK_R,
            "BLOCK_C": matmul_pad_triton.BLOCK_C}


def _pad_copies(problem: Problem, config: Config, operands: dict[str, Any],
                compiled: Any | None) -> dict[str, tuple[Any, Callable[[], None]]]:
    """Operand name -> (its padded copy, a closure that makes it) for each operand PAD_ROWS pads.
    The copies live in this process's padded-rows buffer (`_shared`), made here, outside the timed
    closure."""
    from tilepilot.kernels import matmul_pad_triton

    names = padded(config)
    if not names:
        return {}
    src = [operands[name] for name in names]
    pitches = [pad_pitch(problem, name) for name in names]
    sizes = [t.shape[0] * ld * t.element_size() for t, ld in zip(src, pitches, strict=True)]  # multiples of 128
    buf = _shared(_PADDED, sum(sizes), "uint8", src[0].device)
    out: dict[str, tuple[Any, Callable[[], None]]] = {}
    offset = 0
    for name, t, ld, size in zip(names, src, pitches, sizes, strict=True):
        rows, cols = t.shape
        dst = buf[offset:offset + rows * ld * t.element_size()].view(t.dtype).view(rows, ld)[:, :cols]
        offset += size
        grid = (-(-rows // matmul_pad_triton.BLOCK_R), -(-cols // matmul_pad_triton.BLOCK_C), 1)
        values = {**_pad_args(problem, name, None), "src_ptr": t, "dst_ptr": dst}
        out[name] = (dst, launch(matmul_pad_triton.pad_rows_kernel, grid, values, _pad_constexprs(problem, name),
                                 Config.of({"num_warps": matmul_pad_triton.WARPS, "num_stages": 1}),
                                 None if compiled is None else compiled.pads[name]))
    return out


def _reduce_constexprs(config: Config) -> dict[str, int]:
    from tilepilot.kernels import matmul_splitk_triton

    return {"SPLIT_K": int(setting(config, "SPLIT_K")), "BLOCK": matmul_splitk_triton.REDUCE_BLOCK}


def _splitk_launcher(problem: Problem, config: Config, a: Any, b: Any, out: Any,
                     compiled: Any | None) -> Callable[[], None]:
    """Two launches (splitk, tma_splitk): the partial products into the workspace (`_workspace`,
    allocated here, outside the timed closure, as are tma_splitk's descriptors), then their
    reduction into `out`."""

    from tilepilot.kernels import matmul_splitk_triton

    m, n, _ = dims(problem)
    split = int(setting(config, "SPLIT_K"))
    fn, ints, constexprs = _kernel(problem, config)
    tiles = -(-m // int(config["BLOCK_SIZE_M"])) * -(-n // int(config["BLOCK_SIZE_N"]))
    ws = _workspace(split * m * n, a.device)
    blocks = descriptor_blocks(config)
    operands = _descriptors(blocks, {"a": a, "b": b}) if blocks else {"a_ptr": a, "b_ptr": b}
    partials = launch(fn, (tiles, split, 1), {**operands, "ws_ptr": ws, **ints}, constexprs, config,
                      None if compiled is None else compiled.main)
    reduce_grid = (-(-(m * n) // matmul_splitk_triton.REDUCE_BLOCK), 1, 1)
    reduce = launch(matmul_splitk_triton.splitk_reduce_kernel, reduce_grid, {"ws_ptr": ws, "c_ptr": out, "MN": m * n},
                    _reduce_constexprs(config),
                    Config.of({"num_warps": matmul_splitk_triton.REDUCE_WARPS, "num_stages": 1}),
                    None if compiled is None else compiled.reduce)

    def run() -> None:
        partials()
        reduce()

    return run


_WORKSPACES: dict[str, Any] = {}  # device -> the largest split-K workspace made there so far
_LOCKS: dict[str, Any] = {}  # device -> the largest set of split-K tile counters made there so far
_PADDED: dict[str, Any] = {}  # device -> the largest buffer of PAD_ROWS's copies made there so far


def _shared(store: dict[str, Any], numel: int, dtype: str, device: Any, zero: bool = False) -> Any:
    """`numel` elements of `store`'s buffer on `device`, made (zeroed with `zero`) or grown when too
    small: launches built on an older one keep it alive as long as they live."""
    import torch

    key = str(device)
    buf = store.get(key)
    if buf is None or buf.numel() < numel:
        store.pop(key, None)
        make = torch.zeros if zero else torch.empty
        buf = store[key] = make(numel, dtype=getattr(torch, dtype), device=device)
    return buf[:numel]


def _workspace(numel: int, device: Any) -> Any:
    """`numel` fp32 elements of this process's split-K workspace on `device`, grown when too small.

    One workspace shared by every split-K launch, as a GEMM library keeps one: launches run one
    after another on a stream, each writing its partials and reducing them before the next starts.
    The evaluator builds launches for every input set, cold copy and config of a batch before it
    times them; one workspace each would not fit (63 split-K configs × 8 copies × 480 MB). PAD_ROWS's
    copies share a buffer of their own (`_PADDED`) likewise: each launch makes them before its GEMM."""
    return _shared(_WORKSPACES, numel, "float32", device)


def _descriptors(blocks: dict[str, tuple[str, tuple[int, int]]], tensors: dict[str, Any]) -> dict[str, Any]:
    """The host-made tensor descriptors of `descriptor_blocks` over the operands, by argument name:
    made once per launcher, outside the timed closure (each launch turns them into CUDA tensor maps
    on the CPU)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return {name: TensorDescriptor.from_tensor(tensors[operand], list(block))
            for name, (operand, block) in blocks.items()}


def _locks(count: int, device: Any) -> Any:
    """`count` int32 tile counters of this process on `device`, zero between launches (the program
    that reduces a tile resets its counter), grown when too few; shared as the workspace is."""
    return _shared(_LOCKS, count, "int32", device, zero=True)


def _programs(a: Any) -> int:
    """Programs of a persistent launch: one per SM (fewer under the interpreter, so each loops)."""
    import torch

    if a.device.type != "cuda":
        return INTERPRETER_PROGRAMS
    return int(torch.cuda.get_device_properties(a.device).multi_processor_count)


def _require_tma(target: Target) -> None:
    """VARIANT=tma compiles only for a Hopper (or later) target with a Triton that has host tensor
    descriptors."""
    import importlib.util

    import triton
    from triton.compiler.errors import CompilationError

    if target.backend != "cuda" or target.arch < 90:
        raise CompilationError("", None, f"VARIANT=tma needs TMA (cuda sm_90 or later); the target is "
                                         f"{target.backend} sm_{target.arch}")
    if importlib.util.find_spec("triton.tools.tensor_descriptor") is None:
        raise CompilationError("", None, f"VARIANT=tma needs host tensor descriptors "
                                         f"(triton.tools.tensor_descriptor), which Triton {triton.__version__} "
                                         f"does not have")


# ---- helpers shared with the faults family ---------------------------------------------------
def parse_matmul_problem(raw: Mapping[str, Any]) -> Problem:
    if not isinstance(raw, Mapping):
        raise InputError(f"matmul problem {raw!r:.80} is not a table of M, N, K, dtype")
    allowed = ("M", "N", "K", "dtype")
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise InputError(f"unknown matmul problem key {unknown[0]!r} (allowed: {', '.join(allowed)})")
    for key in ("M", "N", "K"):
        if key not in raw:
            raise InputError(f"matmul problem is missing {key} (a positive integer up to {MAX_DIM})")
        value = raw[key]
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DIM:
            raise InputError(f"matmul problem {key}={value!r} is not a positive integer up to {MAX_DIM}")
    dtype = raw.get("dtype")
    if dtype not in DTYPES:
        raise InputError(f"matmul problem dtype={dtype!r} is not one of {{{', '.join(DTYPES)}}}")
    m, n, k = raw["M"], raw["N"], raw["K"]
    for name, count in (("A (M×K)", m * k), ("B (K×N)", k * n), ("C (M×N)", m * n)):
        if count > MAX_ELEMENTS:
            raise InputError(f"matmul problem M={m} N={n} K={k}: {name} has {count} elements "
                             f"(at most {MAX_ELEMENTS} allowed)")
    return Problem.of({"M": m, "N": n, "K": k, "dtype": dtype})


def dims(problem: Problem) -> tuple[int, int, int]:
    return int(problem["M"]), int(problem["N"]), int(problem["K"])


def torch_dtype(problem: Problem) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}[str(problem["dtype"])]


def _int_args(problem: Problem) -> dict[str, int]:
    m, n, k = dims(problem)
    return {"M": m, "N": n, "K": k, "stride_am": k, "stride_ak": 1, "stride_bk": n, "stride_bn": 1,
            "stride_cm": n, "stride_cn": 1}


def _constexprs(config: Config) -> dict[str, int]:
    return {k: int(config[k]) for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")}


def _check_operands(problem: Problem, a: Any, b: Any, out: Any) -> None:
    m, n, k = dims(problem)
    shapes = (tuple(a.shape), tuple(b.shape), tuple(out.shape))
    if shapes != ((m, k), (k, n), (m, n)):
        raise ValueError(f"operand shapes {shapes} do not match the problem {problem.label()}")
    for t in (a, b, out):
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError("matmul operands must be contiguous and 16-byte aligned")

