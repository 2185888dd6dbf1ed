"""Does Triton's `num_ctas` (thread-block clusters) give the tma variant the multicast loads cuBLAS uses?

    python bench/cluster_probe.py --out bench/results/cluster-probe-h100.json

cuBLAS runs 1x2 and 2x1 clusters on every matmul shape where the tuned config trails it
(bench/results/ws-probe-h100.json): two CTAs share one operand's tile through TMA multicast,
halving its traffic from L2. Triton's `tl` has no cluster API; its CUDA backend takes a
`num_ctas` option. For VARIANT=tma (the recorded best tile of each shape) this compiles the
kernel with num_ctas 1 and 2 and reports whether the PTX holds cluster or multicast
instructions, then times both, with cuBLAS, by the timer and plan of bench/kernels.py (each
launch checked against the family's reference first). The committed result was recorded when the
tma kernel made its descriptors in every program; it takes host-made ones since.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SHAPES = [((4096, 4096, 4096, "bf16"), (128, 256, 64, 8, 3)), ((1000, 3000, 2000, "bf16"), (256, 128, 64, 8, 4)),
          ((3000, 5000, 1000, "fp16"), (128, 256, 64, 8, 3))]


def compile_ctas(family: Any, problem: Any, config: Any, target: Any, num_ctas: int) -> Any:
    """The family's compile of `config`, with the CUDA backend's num_ctas option set."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tilepilot.kernels import matmul
    from tilepilot.kernels.compile import Descriptor, Pointer, _divisibility_attrs, _specialise

    fn, ints, constexprs = matmul._kernel(problem, config)
    dtype = str(problem["dtype"])
    args: dict[str, Any] = {name: Pointer(dtype) for name in fn.arg_names if name.endswith("_ptr")}
    args.update({name: Descriptor(dtype, block) for name, (_, block) in matmul.descriptor_blocks(config).items()})
    gpu_target = GPUTarget(target.backend, target.arch, target.warp_size)
    signature, consts, attrs = _specialise(fn.arg_names, {**args, **ints}, constexprs,
                                           *_divisibility_attrs(gpu_target))
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=gpu_target, options={"num_warps": int(config["num_warps"]),
                                                           "num_stages": int(config["num_stages"]),
                                                           "num_ctas": num_ctas})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from kernels import Arms, gpu_probe, write_probe
    from record import tile_config

    fam, ev, target, timer = gpu_probe("matmul")
    rows = []
    for (m, n, k, dtype), (bm, bn, bk, w, s) in SHAPES:
        problem = fam.parse_problem({"M": m, "N": n, "K": k, "dtype": dtype})
        config = tile_config(bm, bn, bk, w, s, VARIANT="tma", EPILOGUE_SUBTILE=True)
        arms = Arms(fam, problem, target)
        arms.baseline("cublas")
        ptx: dict[str, Any] = {}
        for ctas in (1, 2):
            try:
                compiled = compile_ctas(fam, problem, config, target, ctas)
            except Exception as e:  # a num_ctas the backend refuses is the answer
                ptx[f"ctas{ctas}"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
                continue
            text = compiled.asm.get("ptx", "")
            ptx[f"ctas{ctas}"] = {"multicast": text.count("multicast"), "cluster": text.count("cluster"),
                                  "shared_bytes": int(compiled.metadata.shared)}
            arms.add(f"tma-ctas{ctas}", lambda out, c=compiled, a=arms, p=problem, cf=config:
                     fam.launcher(p, cf, a.inputs, out, c))
        row = {"problem": problem.label(), "config": config.as_dict(), "ptx": ptx,
               "arms": arms.medians(arms.time(timer, fam.l2_flush))}
        rows.append(row)
        print(problem.label(), ptx, {a: v.get("median_ms") or v.get("error") for a, v in row["arms"].items()},
              flush=True)
    write_probe(args.out, __doc__, "cluster_probe.py", argv, ev, rows)
    return 0


if __name__ == "__main__":
    from bench_env import run_main

    raise SystemExit(run_main(main))
