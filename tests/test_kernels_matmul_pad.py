"""PAD_ROWS of the matmul family without a GPU: which configs may pad which operand (and the
one-line reason where not), the record grid of `bench/record.py --pad-only`; under the Triton
interpreter, in a child process (fp16), every tensor-descriptor variant with A, B or both padded is
correct through the Evaluator, and a launch never reads the padding columns (they hold NaN) nor
writes the operands; in a child with no GPU, a padded config compiles ahead of time for sm_90 with
its copy kernels, whose loads and stores are 16-byte vectors. On the H100: tests/test_kernels_matmul_gpu.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.test_kernels_matmul_variants import run_child
from tilepilot.experiments import Config, Problem
from tilepilot.kernels.matmul import MatmulFamily, pad_pitch

FAMILY = MatmulFamily()
REPO = Path(__file__).resolve().parents[1]
TILE = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 4, "num_warps": 4,
        "num_stages": 2}


def problem(m: int, n: int, k: int, dtype: str = "fp16") -> Problem:
    return FAMILY.parse_problem({"M": m, "N": n, "K": k, "dtype": dtype})


def config(variant: str = "tma", pad: str = "B", **more: Any) -> Config:
    return FAMILY.space().parse({**TILE, "VARIANT": variant, "PAD_ROWS": pad, **more})


@pytest.mark.parametrize(("cfg", "prob", "message"), [
    (config("grouped"), problem(3000, 5000, 1000),
     "PAD_ROWS=B is only for VARIANT=tma or tma_tail or streamk, the persistent kernels that load through tensor "
     "descriptors"),
    (config("splitk_fused", "A", SPLIT_K=2), problem(3000, 5000, 1000),
     "PAD_ROWS=A is only for VARIANT=tma or tma_tail or streamk, the persistent kernels that load through tensor "
     "descriptors"),
    (config("tma", "B"), problem(4096, 4096, 1000),
     "PAD_ROWS=B has nothing to pad in B: its rows of N=4096 fp16 elements are 8192 bytes, a multiple of 128"),
    (config("streamk", "AB"), problem(3000, 5000, 1024, "bf16"),
     "PAD_ROWS=AB has nothing to pad in A: its rows of K=1024 bf16 elements are 2048 bytes, a multiple of 128"),
])
def test_pad_rows_is_refused_where_it_has_nothing_to_do(cfg: Config, prob: Problem, message: str) -> None:
    assert FAMILY.space().check(cfg, prob) == message


def test_pad_rows_is_allowed_for_each_operand_whose_rows_are_off_128_bytes() -> None:
    space = FAMILY.space()
    unaligned = problem(3000, 5000, 1000)  # rows of 2000 and 10000 bytes
    for variant in ("tma", "tma_tail", "streamk"):
        for pad in ("A", "B", "AB"):
            assert space.check(config(variant, pad), unaligned) is None, (variant, pad)
    assert space.check(config("tma", "A"), problem(3000, 4096, 1000)) is None  # A alone is off
    assert space.check(config("tma", "none"), problem(4096, 4096, 4096)) is None
    # the row pitch of a copy: rounded up to 128 bytes
    assert (pad_pitch(unaligned, "a"), pad_pitch(unaligned, "b")) == (1024, 5056)
    assert pad_pitch(problem(1000, 3000, 2000, "bf16"), "b") == 3008


def test_the_pad_record_grid_holds_each_pad_the_problem_allows() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    import record  # type: ignore[import-not-found]

    grid = record.pad_grid(problem(3000, 5000, 1000))
    assert len(grid) == 252 and {c["PAD_ROWS"] for c in grid} == {"A", "B", "AB"}
    assert {c["VARIANT"] for c in grid} == {"tma"} and len(set(grid)) == 252
    assert {c["PAD_ROWS"] for c in record.pad_grid(problem(3000, 4096, 1000))} == {"A"}
    assert record.pad_grid(problem(4096, 4096, 4096, "bf16")) == []


INTERPRETER_CHILD = """
import json, sys
import torch
from tilepilot.experiments import Config
from tilepilot.kernels import get_family, matmul
from tilepilot.kernels.evaluate import Evaluator

tile, raws = (json.loads(a) for a in sys.argv[1:3])
ev = Evaluator("interpret", input_sets=2, seed=3)  # TRITON_INTERPRET=1 before any kernel import
family = get_family("matmul")
report = []
for raw in raws:
    p = family.parse_problem(raw)
    configs = [family.space().parse({**tile, "VARIANT": v, "PAD_ROWS": pad})
               for v in ("tma", "tma_tail", "streamk") for pad in ("A", "B", "AB")]
    configs = [c for c in configs if family.space().check(c, p) is None]
    results = ev.evaluate("matmul", p, configs)
    # in this process: the shared buffer of the copies full of NaN first, so a read of a padding
    # column would show in C
    matmul._shared(matmul._PADDED, 1 << 20, "uint8", "cpu").fill_(255)
    inputs = family.make_inputs(p, 7, "cpu")
    before = [t.clone() for t in inputs]
    ref = family.reference(p, inputs)
    direct = []
    for c in configs:
        out = family.make_output(p, inputs).fill_(float("nan"))
        family.launcher(p, c, inputs, out, None)()
        direct.append([c["VARIANT"], c["PAD_ROWS"], family.error(p, out, ref)])
    report.append({"label": p.label(), "tolerance": family.tolerance(p),
                   "results": [[c["VARIANT"], c["PAD_ROWS"], r.status.value, r.max_rel_err, r.message]
                               for c, r in zip(configs, results)],
                   "direct": direct, "inputs_kept": all(torch.equal(a, b) for a, b in zip(before, inputs))})
print(json.dumps(report))
"""
# K=72, N=40: rows of 144 and 80 bytes (A and B off); K=96, N=40 with 3 programs over 4 tiles
PROBLEMS = [{"M": 33, "N": 40, "K": 72, "dtype": "fp16"}, {"M": 20, "N": 40, "K": 96, "dtype": "fp16"}]


def test_padded_operands_are_correct_under_the_interpreter() -> None:
    report = run_child(INTERPRETER_CHILD, json.dumps(TILE), json.dumps(PROBLEMS))
    ran = set()
    for p in report:
        assert len(p["results"]) == 9, p["label"]
        for variant, pad, status, err, message in p["results"]:
            assert (status, message) == ("ok", ""), (p["label"], variant, pad)
            assert 0 <= err < p["tolerance"], (p["label"], variant, pad, err)
            ran.add((variant, pad))
        for variant, pad, err in p["direct"]:
            assert 0 <= err < p["tolerance"], (p["label"], variant, pad, err)  # no NaN from the padding
        assert p["inputs_kept"], p["label"]
    assert len(ran) == 9


COMPILE_CHILD = """
import json, re
from tilepilot.experiments import Config
from tilepilot.kernels import get_family
from tilepilot.kernels.base import Target
from tilepilot.kernels.evaluate import compile_config

family = get_family("matmul")
p = family.parse_problem({"M": 3000, "N": 5000, "K": 1000, "dtype": "fp16"})
c = family.space().parse({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8,
                          "num_warps": 8, "num_stages": 3, "VARIANT": "tma", "EPILOGUE_SUBTILE": True,
                          "PAD_ROWS": "AB"})
o = compile_config("matmul", p, c, Target())
k = family.compile(p, c, Target())
ops = {}
for name, part in k.pads.items():
    for m in re.finditer(r"^\\s*(?:@%p\\d+\\s+)?((?:ld|st)\\.global[\\w:.]*)", part.asm["ptx"], re.M):
        ops.setdefault(name, {})[m.group(1)] = ops.get(name, {}).get(m.group(1), 0) + 1
main = "cp.async.bulk.tensor" in k.asm["ptx"]
print(json.dumps({"status": o.status.value, "message": o.message, "parts": len(k.compiled_parts), "ops": ops,
                  "main_tma": main}))
"""


def test_a_padded_config_compiles_with_vector_copies_for_sm90_without_a_gpu(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "", "TRITON_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}
    out = run_child(COMPILE_CHILD, env=env)
    assert (out["status"], out["message"]) == ("ok", "")
    assert out["parts"] == 3 and out["main_tma"]  # the GEMM and a copy kernel for each of A and B
    for name in ("a", "b"):
        ops = out["ops"][name]
        assert set(ops) == {"ld.global.v4.b32", "st.global.v4.b32"}, (name, ops)
