"""The matmul variants (grouped, splitk, persistent, tma, splitk_fused, tma_tail, streamk, tma_splitk;
ALIGN_HINT) without a GPU.

Under the Triton interpreter, in a child process (TRITON_INTERPRET=1 is set by the Evaluator before
any kernel is imported; fp16 only): every variant is correct on ragged shapes, M=1 and an unaligned
K included, through the Evaluator (outputs poisoned with NaN before each checked launch); a planted
wrong output is `wrong_result` for every variant; an invalid variant config is never launched; the
persistent kernels run with fewer programs than tiles, so each loops; split-K and stream-K (and
split-K on descriptors) give the same bits on every run. In a child with no GPU: every variant
compiles ahead of time for sm_90 (split-K with its reduction), TMA becomes bulk tensor copies,
ALIGN_HINT turns the element-wise loads of an unaligned problem into 16-byte asynchronous copies,
and TMA for a pre-Hopper target is a `compile_error` that says why. bf16 and the timings:
tests/test_kernels_matmul_gpu.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SMALL = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 2, "num_warps": 4,
         "num_stages": 2}
VARIANTS = [  # (VARIANT, SPLIT_K, ALIGN_HINT)
    ("grouped", 1, False), ("grouped", 1, True), ("splitk", 2, False), ("splitk", 4, True),
    ("persistent", 1, False), ("persistent", 1, True), ("tma", 1, False), ("splitk_fused", 2, False),
    ("splitk_fused", 4, True), ("tma_tail", 1, False), ("streamk", 1, False), ("tma_splitk", 2, False),
    ("tma_splitk", 3, False)]
# ragged: M=1; K=72 and N=40 even but no multiple of 16 (ALIGN 8); K=100 (ALIGN 4) with N=48;
# everything odd (no hint possible, no TMA); 4 tiles on 3 programs, so tma_tail and streamk split the
# last tile in 3; one tile of 10 K-blocks on 3 programs, so streamk splits it in 4, 4 and 2; 5 tiles of 3
# K-blocks on 3 programs: streamk's second program ends one of the last two tiles and starts the other
PROBLEMS = [{"M": 33, "N": 40, "K": 72, "dtype": "fp16"}, {"M": 1, "N": 48, "K": 100, "dtype": "fp16"},
            {"M": 50, "N": 45, "K": 67, "dtype": "fp16"}, {"M": 20, "N": 40, "K": 96, "dtype": "fp16"},
            {"M": 16, "N": 32, "K": 160, "dtype": "fp16"}, {"M": 80, "N": 32, "K": 48, "dtype": "fp16"}]


def run_child(code: str, *args: str, env: dict[str, str] | None = None) -> Any:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    full_env.pop("TRITON_INTERPRET", None)
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "child.py"
        script.write_text(textwrap.dedent(code))
        proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=full_env,
                              timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


INTERPRETER_CHILD = """
import json, sys
import torch
from tilepilot.experiments import Config
from tilepilot.kernels import get_family, register
from tilepilot.kernels.evaluate import Evaluator

small, variants, raws = (json.loads(a) for a in sys.argv[1:4])
ev = Evaluator("interpret", input_sets=2, seed=3)  # TRITON_INTERPRET=1 before any kernel import
family = get_family("matmul")


class LastRowZeroed(type(family)):
    name = "test_matmul_last_row_zeroed"
    def launcher(self, problem, config, inputs, out, compiled):
        run = super().launcher(problem, config, inputs, out, compiled)
        def buggy():
            run()
            out[-1, :] = 0
        return buggy


register(LastRowZeroed)
report = []
for raw in raws:
    p = family.parse_problem(raw)
    configs = [Config.of({**small, "VARIANT": v, "SPLIT_K": s, "ALIGN_HINT": h}) for v, s, h in variants]
    results = ev.evaluate("matmul", p, configs)
    wrong = ev.evaluate("test_matmul_last_row_zeroed", p, [c for c, r in zip(configs, results)
                                                           if r.status.value == "ok"])
    inputs = family.make_inputs(p, 7, "cpu")
    same_bits = {}
    for v, s in (("splitk", 2), ("streamk", 1), ("tma_splitk", 3)):
        c = Config.of({**small, "VARIANT": v, "SPLIT_K": s})
        if family.space().check(c, p) is not None:
            continue
        runs = []
        for _ in range(2):
            out = family.make_output(p, inputs).fill_(float("nan"))
            family.launcher(p, c, inputs, out, None)()
            runs.append(out)
        same_bits[v] = bool(torch.equal(runs[0], runs[1]))
    subtiled = ev.evaluate("matmul", p, [Config.of({**small, "VARIANT": v, "EPILOGUE_SUBTILE": True})
                                         for v in ("tma", "tma_tail", "streamk")])
    report.append({
        "label": p.label(), "tolerance": family.tolerance(p),
        "results": [[c["VARIANT"], c["SPLIT_K"], c["ALIGN_HINT"], r.status.value, r.max_rel_err, r.message,
                     r.timing.method if r.timing else None] for c, r in zip(configs, results)],
        "wrong": [[r.config["VARIANT"], r.status.value, r.message] for r in wrong],
        "same_bits": same_bits,
        "subtiled": [[r.config["VARIANT"], r.status.value, r.max_rel_err, r.message] for r in subtiled],
        "tiles": -(-p["M"] // small["BLOCK_SIZE_M"]) * -(-p["N"] // small["BLOCK_SIZE_N"]),
    })
from tilepilot.kernels.matmul import INTERPRETER_PROGRAMS, _programs
report.append({"programs": _programs(torch.empty(1)), "interpreter_programs": INTERPRETER_PROGRAMS})
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def interpreted() -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = run_child(INTERPRETER_CHILD, json.dumps(SMALL), json.dumps(VARIANTS),
                                             json.dumps(PROBLEMS))
    return result


def test_every_variant_is_correct_on_ragged_shapes_under_the_interpreter(interpreted: list[dict[str, Any]]) -> None:
    ran = set()
    for problem in interpreted[:-1]:
        for variant, split, hint, status, err, message, method in problem["results"]:
            if status == "invalid":
                continue
            assert (status, message, method) == ("ok", "", "cpu-wallclock"), (problem["label"], variant, message)
            assert 0 <= err < problem["tolerance"], (problem["label"], variant, err)
            ran.add((variant, split, hint))
    assert ran == {tuple(v) for v in VARIANTS}  # each variant ran somewhere


def outcomes(interpreted: list[dict[str, Any]], label: str) -> dict[tuple[str, int, bool], tuple[str, str]]:
    [problem] = [p for p in interpreted[:-1] if p["label"] == label]
    return {(v, s, h): (status, message) for v, s, h, status, _, message, _ in problem["results"]}


def test_invalid_variant_configs_are_refused_with_the_reason(interpreted: list[dict[str, Any]]) -> None:
    odd = outcomes(interpreted, "M=50 N=45 K=67 fp16")
    assert odd[("tma", 1, False)] == ("invalid", "VARIANT=tma needs rows of a multiple of 16 bytes: fp16 rows of "
                                                 "K=67 and N=45 elements are not")
    assert odd[("grouped", 1, True)][0] == "invalid" and "nothing to assert" in odd[("grouped", 1, True)][1]
    short = outcomes(interpreted, "M=33 N=40 K=72 fp16")
    assert short[("splitk", 4, True)] == ("invalid", "SPLIT_K=4 leaves a split without work: K=72 is 5 block(s) of "
                                                     "BLOCK_SIZE_K=16")


def test_planted_wrong_output_is_wrong_result_for_every_variant(interpreted: list[dict[str, Any]]) -> None:
    for problem in interpreted[:-1]:
        assert problem["wrong"], problem["label"]
        for variant, status, message in problem["wrong"]:
            assert status == "wrong_result" and message.startswith("relative error"), (problem["label"], variant)


def test_persistent_kernels_loop_with_fewer_programs_than_tiles(interpreted: list[dict[str, Any]]) -> None:
    programs = interpreted[-1]["programs"]
    assert programs == interpreted[-1]["interpreter_programs"]
    assert any(p["tiles"] > programs for p in interpreted[:-1])


def test_split_reductions_give_the_same_bits_on_every_run(interpreted: list[dict[str, Any]]) -> None:
    assert all(p["same_bits"]["splitk"] for p in interpreted[:-1])
    for v in ("streamk", "tma_splitk"):
        runs = [p["same_bits"][v] for p in interpreted[:-1] if v in p["same_bits"]]
        assert len(runs) >= 3 and all(runs), v


def test_tma_epilogue_in_two_halves_is_correct_where_tma_runs(interpreted: list[dict[str, Any]]) -> None:
    ran = 0
    for problem in interpreted[:-1]:
        for variant, status, err, message in problem["subtiled"]:
            assert status in ("ok", "invalid"), (problem["label"], variant, message)
            if status == "ok":
                assert 0 <= err < problem["tolerance"], (problem["label"], variant, err)
                ran += 1
            else:
                assert "needs rows of a multiple of 16 bytes" in message
    assert ran >= 6


WIDE_CHILD = """
import json, sys
from tilepilot.experiments import Config
from tilepilot.kernels import get_family
from tilepilot.kernels.evaluate import Evaluator

ev = Evaluator("interpret", input_sets=2, seed=5)
family = get_family("matmul")
out = []
for raw in json.loads(sys.argv[1]):
    p = family.parse_problem(raw)
    configs = [Config.of({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 2,
                          "num_warps": 4, "num_stages": 2, "VARIANT": v, "EPILOGUE_SUBTILE": sub})
               for bn, v, sub in ((160, "tma", False), (192, "tma", False), (192, "grouped", False),
                                  (192, "tma", True), (160, "streamk", False))]
    for c, r in zip(configs, ev.evaluate("matmul", p, configs)):
        out.append([p.label(), c["BLOCK_SIZE_N"], c["VARIANT"], c["EPILOGUE_SUBTILE"], r.status.value, r.max_rel_err,
                    r.message, family.tolerance(p)])
print(json.dumps(out))
"""
# N=200: a 192-wide tile's second one has 8 of its 128 + 64 columns, a 160-wide one 40 of 128 + 32;
# N=168: one 192-wide tile whose 64-column block is 40 columns in; 3 programs loop over 6 and 4 tiles
WIDE_PROBLEMS = [{"M": 40, "N": 200, "K": 48, "dtype": "fp16"}, {"M": 33, "N": 168, "K": 72, "dtype": "fp16"}]


def test_wide_tiles_are_correct_under_the_interpreter_and_only_for_tma() -> None:
    rows = run_child(WIDE_CHILD, json.dumps(WIDE_PROBLEMS))
    ok = [(label, bn) for label, bn, variant, sub, status, err, message, tol in rows
          if status == "ok" and 0 <= err < tol and variant == "tma" and not sub]
    assert len(ok) == 4, rows
    refused = {(bn, variant, sub): message for _, bn, variant, sub, status, _, message, _ in rows
               if status == "invalid"}
    assert refused == {
        (192, "grouped", False): "BLOCK_SIZE_N=192 (not a power of two) is only for VARIANT=tma",
        (192, "tma", True): "EPILOGUE_SUBTILE=True is not for BLOCK_SIZE_N=192, which is stored as two column blocks",
        (160, "streamk", False): "BLOCK_SIZE_N=160 (not a power of two) is only for VARIANT=tma"}
    assert len(rows) == 10


COMPILE_CHILD = """
import json, re, sys
from tilepilot.experiments import Config
from tilepilot.kernels import get_family
from tilepilot.kernels.base import Target
from tilepilot.kernels.evaluate import compile_config

family = get_family("matmul")
base = json.loads(sys.argv[1])
out = {"compile": [], "ptx": {}}
OP = r"^\\s*(?:@%p\\d+\\s+)?((?:ld|st|cp|wgmma)\\.[\\w:.]+)"
for raw, variant, split, hint, *wide in json.loads(sys.argv[2]):
    p = family.parse_problem(raw)
    c = Config.of({**base, "VARIANT": variant, "SPLIT_K": split, "ALIGN_HINT": hint,
                   **({"BLOCK_SIZE_N": wide[0], "num_warps": 8} if wide else {})})
    o = compile_config("matmul", p, c, Target())
    out["compile"].append([p.label(), variant, split, hint, o.status.value, o.message, o.shared_bytes])
    if o.status.value == "ok":
        k = family.compile(p, c, Target())
        ops = {}
        label = f"{p.label()} {variant} {split} {hint}" + (f" N{wide[0]}" if wide else "")
        for ptx in [k.asm["ptx"]] + ([k.reduce.asm["ptx"]] if variant == "splitk" else []):
            for m in re.finditer(OP, ptx, re.M):
                ops[m.group(1)] = ops.get(m.group(1), 0) + 1
        out["ptx"][label] = ops
        if variant == "tma_splitk":
            out["ptx"][label + " reduce"] = {m.group(1): 1 for m in re.finditer(OP, k.reduce.asm["ptx"], re.M)}
o = compile_config("matmul", family.parse_problem(json.loads(sys.argv[2])[0][0]),
                   Config.of({**base, "VARIANT": "tma"}), Target(arch=80, max_shared_bytes=166912))
out["tma_sm80"] = [o.status.value, o.message]
print(json.dumps(out))
"""

BIG = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8, "num_warps": 4,
       "num_stages": 3}
UNALIGNED = {"M": 3000, "N": 5000, "K": 1000, "dtype": "fp16"}
ALIGNED = {"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"}
COMPILE_JOBS = [[UNALIGNED, "grouped", 1, False], [UNALIGNED, "grouped", 1, True], [UNALIGNED, "splitk", 2, True],
                [UNALIGNED, "persistent", 1, True], [UNALIGNED, "tma", 1, False], [ALIGNED, "splitk", 4, False],
                [ALIGNED, "persistent", 1, False], [ALIGNED, "tma", 1, False], [UNALIGNED, "splitk_fused", 4, True],
                [ALIGNED, "splitk_fused", 2, False], [UNALIGNED, "tma_tail", 1, False], [ALIGNED, "tma_tail", 1, False],
                [ALIGNED, "streamk", 1, False], [UNALIGNED, "tma", 1, False, 192], [ALIGNED, "tma_splitk", 4, False],
                [UNALIGNED, "tma_splitk", 2, False]]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    env = {"CUDA_VISIBLE_DEVICES": "", "TRITON_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}
    result: dict[str, Any] = run_child(COMPILE_CHILD, json.dumps(BIG), json.dumps(COMPILE_JOBS), env=env)
    return result


def test_every_variant_compiles_ahead_of_time_for_sm90_without_a_gpu(compiled: dict[str, Any]) -> None:
    assert len(compiled["compile"]) == len(COMPILE_JOBS)
    for label, variant, split, hint, status, message, shared in compiled["compile"]:
        assert (status, message) == ("ok", ""), (label, variant, split, hint)
        assert 0 < shared <= 232448


def test_tma_variant_loads_and_stores_through_bulk_tensor_copies(compiled: dict[str, Any]) -> None:
    for label in ("M=3000 N=5000 K=1000 fp16 tma 1 False", "M=4096 N=4096 K=4096 bf16 tma 1 False",
                  "M=3000 N=5000 K=1000 fp16 tma_tail 1 False", "M=4096 N=4096 K=4096 bf16 streamk 1 False"):
        ops = compiled["ptx"][label]
        assert any(op.startswith("cp.async.bulk.tensor") for op in ops), (label, ops)
        assert not any(op.startswith("ld.global") for op in ops if "tma " in label), (label, ops)


def test_a_192_wide_tile_is_two_warpgroup_products_of_128_and_64_columns(compiled: dict[str, Any]) -> None:
    ops = compiled["ptx"]["M=3000 N=5000 K=1000 fp16 tma 1 False N192"]
    assert ops.get("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16", 0) > 0, ops
    assert ops.get("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16", 0) > 0, ops
    assert any(op.startswith("cp.async.bulk.tensor") for op in ops)
    assert not any(op.startswith("ld.global") for op in ops)


def test_align_hint_turns_element_loads_into_16_byte_async_copies(compiled: dict[str, Any]) -> None:
    plain = compiled["ptx"]["M=3000 N=5000 K=1000 fp16 grouped 1 False"]
    hinted = compiled["ptx"]["M=3000 N=5000 K=1000 fp16 grouped 1 True"]
    assert plain.get("ld.global.b16", 0) > 0 and plain.get("st.global.b16", 0) > 0  # one element at a time
    assert "cp.async.cg.shared.global" in hinted and not any(op.startswith("ld.global") for op in hinted)
    assert hinted.get("st.global.v4.b32", 0) > 0 and "st.global.b16" not in hinted  # 16-byte stores of C


def test_fused_reductions_take_a_ticket_and_read_the_partials_past_l1(compiled: dict[str, Any]) -> None:
    for label in ("M=4096 N=4096 K=4096 bf16 splitk_fused 2 False", "M=3000 N=5000 K=1000 fp16 splitk_fused 4 True",
                  "M=4096 N=4096 K=4096 bf16 tma_tail 1 False", "M=4096 N=4096 K=4096 bf16 streamk 1 False"):
        ops = compiled["ptx"][label]
        assert any(op.startswith("ld.global.cg") for op in ops), (label, ops)
        assert any(op.startswith("st.global.cg") for op in ops), (label, ops)


def test_splitk_compiles_its_reduction_too(compiled: dict[str, Any]) -> None:
    ops = compiled["ptx"]["M=4096 N=4096 K=4096 bf16 splitk 4 False"]
    assert any(op.startswith("ld.global.v4") for op in ops)  # the reduction reads the fp32 partials as vectors
    for label in ("M=4096 N=4096 K=4096 bf16 tma_splitk 4 False", "M=3000 N=5000 K=1000 fp16 tma_splitk 2 False"):
        ops = compiled["ptx"][f"{label} reduce"]
        assert any(op.startswith("ld.global.v4") for op in ops), (label, ops)


def test_tma_splitk_loads_through_bulk_tensor_copies_and_stores_fp32_partials(compiled: dict[str, Any]) -> None:
    for label in ("M=4096 N=4096 K=4096 bf16 tma_splitk 4 False", "M=3000 N=5000 K=1000 fp16 tma_splitk 2 False"):
        ops = compiled["ptx"][label]
        assert any(op.startswith("cp.async.bulk.tensor") for op in ops), (label, ops)
        assert any(op.startswith("wgmma.mma_async") for op in ops), (label, ops)
        assert not any(op.startswith("ld.global") for op in ops), (label, ops)  # A and B only through TMA
        assert any(op.startswith("st.global.cg") for op in ops), (label, ops)  # the partials, past L1
        assert not any(op.startswith("cp.async.bulk.global") for op in ops), (label, ops)  # no C descriptor


def test_tma_for_a_pre_hopper_target_is_a_compile_error_that_says_why(compiled: dict[str, Any]) -> None:
    status, message = compiled["tma_sm80"]
    assert status == "compile_error"
    assert "VARIANT=tma needs TMA (cuda sm_90 or later); the target is cuda sm_80" in message
