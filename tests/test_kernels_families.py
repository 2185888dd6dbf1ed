"""Contract tests for every registered kernel family but the matmul_faults test family, plus the
example user family in campaigns/my_kernel (registered from outside tilepilot). Each matmul
variant on its own: tests/test_kernels_matmul_variants.py.

In this process (no torch, no triton): problems, the space and its constraints, the default
config, the work model. In child processes under the Triton interpreter (TRITON_INTERPRET=1
is set by the Evaluator before any kernel is imported; fp16/fp32 only): correct results for
several configs including ragged shapes, NaN-poisoned outputs fully overwritten, planted wrong
and unwritten outputs caught, invalid configs never launched. In a child with no GPU: the
ahead-of-time compile for sm_90. Then what is particular to each family: softmax on huge
logits, layernorm with a large mean, the fp8 rounding and scales. Last, the user family tuned
by `tilepilot tune --backend interpret` on Ray workers, found through TILEPILOT_KERNEL_MODULES.

bf16 and the hardware fp8 conversion run on the GPU only: tests/test_kernels_families_gpu.py.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tilepilot.experiments import Config, InputError, Problem, SearchSpace
from tilepilot.kernels import registry
from tilepilot.kernels.base import KernelFamily

REPO = Path(__file__).resolve().parents[1]
USER_FAMILY = "my_scaled_add"
USER_ENV = {"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'campaigns'}", "TILEPILOT_KERNEL_MODULES": "my_kernel"}
MATMUL_SPECIFIC = ("matmul_faults",)
SPACE_SAMPLE = 100_000  # a larger space is sampled in the constraint test


def attn(b: int, h: int, s: int, d: int, causal: bool, dtype: str) -> dict[str, Any]:
    return {"B": b, "H": h, "S": s, "D": d, "causal": causal, "dtype": dtype}


def rows(r: int, c: int, dtype: str) -> dict[str, Any]:
    return {"rows": r, "cols": c, "dtype": dtype}


def tokens(t: int, h: int, dtype: str) -> dict[str, Any]:
    return {"T": t, "H": h, "dtype": dtype}


def moe(m: int, e: int, topk: int, n: int, k: int, dtype: str) -> dict[str, Any]:
    return {"M": m, "E": e, "topk": topk, "N": n, "K": k, "dtype": dtype}


ROW_ISSUE = tuple(rows(r, c, "bf16") for r, c in ((1, 8192), (256, 4096), (4096, 8192), (16384, 16384)))
ROW_SMALL = (rows(33, 300, "fp16"), rows(4, 1000, "fp32"))  # ragged: 300 and 1000 are no block multiple
ROW_BAD = (
    (rows(0, 8, "fp16"), r"{name} problem rows=0 is not a positive integer"),
    (rows(1, True, "fp16"), r"{name} problem cols=True is not a positive integer"),
    (rows(1, 8, "int8"), r"{name} problem dtype='int8' is not one of \{{bf16, fp16, fp32\}}"),
    ({"cols": 8, "dtype": "fp16"}, r"{name} problem is missing rows"),
    ({**rows(1, 8, "fp16"), "eps": 1e-5}, r"unknown {name} problem key 'eps' \(allowed: rows, cols, dtype\)"),
    (rows(65536, 65536, "bf16"), r"has 4294967296 elements \(at most 2147483647 allowed\)"),
)


@dataclass(frozen=True)
class Case:
    small: tuple[dict[str, Any], ...]  # interpreter-sized, fp16/fp32, ragged
    shapes: tuple[dict[str, Any], ...]  # the issue's shape set
    bad: tuple[tuple[dict[str, Any], str], ...]  # a problem and the regex of its one-line error
    operands_are_the_work: bool = True  # False: work bytes count only what is read (fused_moe: experts hit)


def mm(m: int, n: int, k: int, dtype: str) -> dict[str, Any]:
    return {"M": m, "N": n, "K": k, "dtype": dtype}


def _point(space: SearchSpace, index: int) -> Config:
    """The config at `index` in the space's iteration order (the last parameter varies fastest)."""
    values = []
    for p in reversed(space.params):
        index, i = divmod(index, len(p.choices))
        values.append(p.choices[i])
    return Config.of(dict(zip(space.names, reversed(values), strict=True)))


CASES = {
    "matmul": Case(
        (mm(33, 47, 65, "fp16"), mm(1, 48, 100, "fp16")),  # ragged: M=1, no block multiple, K even but unaligned
        (mm(4096, 4096, 4096, "bf16"), mm(3000, 5000, 1000, "fp16"), mm(1, 4096, 4096, "bf16")),
        ((mm(1, 1, 1, "fp32"), r"dtype='fp32' is not one of \{{bf16, fp16\}}"),
         (mm(0, 1, 1, "bf16"), r"M=0 is not a positive integer up to 65536"),
         ({"N": 1, "K": 1, "dtype": "bf16"}, r"{name} problem is missing M"),
         ({**mm(1, 1, 1, "bf16"), "batch": 2}, r"unknown {name} problem key 'batch' \(allowed: M, N, K, dtype\)"),
         (mm(65536, 65536, 16, "bf16"), r"C \(M×N\) has 4294967296 elements"))),
    "attention": Case(
        (attn(1, 2, 100, 64, False, "fp16"), attn(1, 2, 100, 64, True, "fp16"),  # ragged: 100 is no block multiple
         attn(2, 1, 45, 128, True, "fp16")),
        tuple(attn(4, 32, s, d, c, "bf16") for s in (1024, 4096) for d in (64, 128) for c in (False, True)),
        ((attn(1, 1, 64, 96, False, "fp16"), r"D=96 is not one of \{{32, 64, 128\}}"),
         (attn(1, 1, 64, 64, "yes", "fp16"), r"causal='yes' is not one of \{{true, false\}}"),
         (attn(1, 1, 64, 64, False, "fp32"), r"dtype='fp32' is not one of \{{bf16, fp16\}}"),
         (attn(1, 1, 0, 64, False, "fp16"), r"S=0 is not a positive integer"),
         ({"B": 1, "S": 64, "D": 64, "causal": False, "dtype": "fp16"}, r"{name} problem is missing H"),
         ({**attn(1, 1, 64, 64, False, "fp16"), "scale": 0.1},
          r"unknown {name} problem key 'scale' \(allowed: B, H, S, D, causal, dtype\)"),
         (attn(256, 256, 64, 64, False, "fp16"), r"B=256 H=256 has 65536 heads in all \(at most 65535 allowed\)"),
         (attn(1, 1, 2**25, 128, True, "bf16"), r"each operand has 4294967296 elements"))),
    "softmax": Case(ROW_SMALL, ROW_ISSUE, ROW_BAD),
    "rmsnorm": Case(ROW_SMALL, ROW_ISSUE, ROW_BAD),
    "layernorm": Case(ROW_SMALL, ROW_ISSUE, ROW_BAD),
    "silu_mul_fp8_quant": Case(
        (tokens(5, 384, "fp16"), tokens(16, 1024, "fp16")),  # 3 groups per row: masked group tiles
        tuple(tokens(t, h, "bf16") for t in (1, 16, 256, 4096, 16384) for h in (4096, 14336)),
        ((tokens(4, 100, "fp16"), r"H=100 is not a multiple of the group size 128"),
         (tokens(4, 128, "fp32"), r"dtype='fp32' is not one of \{{bf16, fp16\}}"),
         (tokens(0, 128, "fp16"), r"T=0 is not a positive integer"),
         ({**tokens(1, 128, "fp16"), "group": 64}, r"unknown {name} problem key 'group' \(allowed: T, H, dtype\)"),
         (tokens(2**20, 2**20, "bf16"), r"x \(T×2H\) has 2199023255552 elements"))),
    "fused_moe": Case(
        (moe(5, 4, 2, 80, 96, "fp16"), moe(16, 8, 2, 48, 40, "fp16")),  # ragged N and K; M·topk not a block multiple
        tuple(moe(m, e, t, n, k, "bf16") for e, t, n, k in ((8, 2, 14336, 4096), (64, 6, 1408, 2048))
              for m in (1, 16, 64, 256, 1024, 4096)),
        ((moe(4, 4, 5, 64, 64, "fp16"), r"topk=5 is more than E=4"),
         (moe(4, 4, 2, 64, 64, "fp32"), r"dtype='fp32' is not one of \{{bf16, fp16\}}"),
         (moe(0, 4, 2, 64, 64, "fp16"), r"M=0 is not a positive integer"),
         ({**moe(4, 4, 2, 64, 64, "fp16"), "renormalize": True},
          r"unknown {name} problem key 'renormalize' \(allowed: M, E, topk, N, K, dtype\)"),
         (moe(1048576, 8, 2, 4096, 4096, "bf16"), r"A \(M×K\) has 4294967296 elements"),
         (moe(65536, 8, 2, 32768, 64, "bf16"), r"C \(M×topk×N\) has 4294967296 elements")),
        operands_are_the_work=False),
    USER_FAMILY: Case(
        ({"n": 1000, "dtype": "fp16"}, {"n": 4099, "dtype": "fp32"}),
        ({"n": 1, "dtype": "fp32"}, {"n": 2**28, "dtype": "fp16"}),
        (({"n": 0, "dtype": "fp16"}, r"n=0 is not a positive integer"),
         ({"n": 8, "dtype": "bf16"}, r"dtype='bf16' is not one of \{{fp16, fp32\}}"),
         ({"n": 8, "dtype": "fp16", "m": 1}, r"unknown {name} problem key 'm'"))),
}
FAMILIES = sorted(CASES)


def run_child(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> Any:
    """Run `code` as a script in a fresh interpreter (a file: @triton.jit reads its source);
    its last stdout line is JSON."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    full_env.pop("TRITON_INTERPRET", None)  # the Evaluator sets it itself, before any kernel import
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "child.py"
        script.write_text(textwrap.dedent(code))
        proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                              env=full_env, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def env_for(name: str) -> dict[str, str]:
    return USER_ENV if name == USER_FAMILY else {}


# ---- in this process: no torch, no triton ----------------------------------------------------------
@pytest.fixture(scope="module", params=FAMILIES)
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def family(name: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[KernelFamily]:
    registry._reset_for_tests()
    if name == USER_FAMILY:
        monkeypatch.syspath_prepend(str(REPO / "campaigns"))
        from my_kernel.family import ScaledAddFamily  # type: ignore[import-not-found]

        registry.register(ScaledAddFamily)
    yield registry.get_family(name)
    registry._reset_for_tests()


def test_every_registered_family_has_a_contract_case() -> None:
    registry._reset_for_tests()
    built_in = set(registry.family_names()) - set(MATMUL_SPECIFIC)
    assert built_in == set(CASES) - {USER_FAMILY}


class TestFamilyContract:
    def test_parse_problem_keeps_every_shape_and_is_idempotent(self, family: KernelFamily, name: str) -> None:
        for raw in (*CASES[name].small, *CASES[name].shapes):
            problem = family.parse_problem(raw)
            assert problem.as_dict() == raw
            assert family.parse_problem(problem.as_dict()) == problem

    def test_parse_problem_rejects_with_one_line_naming_key_and_allowed(self, family: KernelFamily,
                                                                          name: str) -> None:
        for raw, pattern in CASES[name].bad:
            with pytest.raises(InputError, match=pattern.format(name=name)) as err:
                family.parse_problem(raw)
            assert "\n" not in str(err.value)

    def test_default_config_is_in_the_space_and_valid_for_every_shape(self, family: KernelFamily,
                                                                       name: str) -> None:
        space = family.space()
        for raw in (*CASES[name].small, *CASES[name].shapes):
            problem = family.parse_problem(raw)
            config = family.default_config(problem)
            assert space.parse(config.as_dict()) == config
            assert space.check(config, problem) is None, (problem.label(), config.label())

    def test_constraints_prune_with_a_one_line_reason_and_leave_choices(self, family: KernelFamily,
                                                                         name: str) -> None:
        space = family.space()
        assert space.constraints and space.size > 1
        pruned = 0
        # every point of a small space; of matmul's 9.4 million, every 97th (a prime stride, so that
        # the sample does not keep the fastest-varying parameters fixed)
        stride = 1 if space.size <= SPACE_SAMPLE else 97
        sample = [_point(space, i) for i in range(0, space.size, stride)]
        for raw in (*CASES[name].small, *CASES[name].shapes):
            problem = family.parse_problem(raw)
            valid = space.valid(problem)
            assert len(valid) >= 2, problem.label()
            keys = {c.key() for c in valid}
            for config in sample:
                reason = space.check(config, problem)
                assert reason is None or (isinstance(reason, str) and reason and "\n" not in reason)
                assert (reason is None) == (config.key() in keys), (problem.label(), config.label())
                pruned += reason is not None
        assert pruned > 0  # each family's constraints do prune something on its own shapes

    def test_work_model_grows_with_the_problem(self, family: KernelFamily, name: str) -> None:
        works = [family.work(family.parse_problem(raw)) for raw in CASES[name].shapes]
        for w in works:
            assert w.flops > 0 and w.bytes > 0
            assert w.gbps(1.0) == pytest.approx(w.bytes / 1e-3 / 1e9)
        biggest = max(works, key=lambda w: w.bytes)
        assert biggest.flops == max(w.flops for w in works)

    def test_specialisation_and_version_are_stable_strings(self, family: KernelFamily, name: str) -> None:
        problem = family.parse_problem(CASES[name].small[0])
        config = family.default_config(problem)
        assert family.specialisation(problem, config) == family.specialisation(problem, config)
        version, _, digest = family.kernel_version().partition("+")
        assert version == family.version and len(digest) == 12
        assert family.l2_flush in (True, False) and family.description

    # ---- under the interpreter ------------------------------------------------------------------
    def test_several_configs_are_correct_on_ragged_shapes(self, interpreted: dict[str, Any]) -> None:
        for problem in interpreted["problems"]:
            for status, err, message, method, _ in problem["valid"]:
                assert (status, message, method) == ("ok", "", "cpu-wallclock"), problem["label"]
                assert 0 <= err < problem["tolerance"]

    def test_configs_cover_each_kernel_path(self, interpreted: dict[str, Any], name: str) -> None:
        specs = {spec for p in interpreted["problems"] for *_, spec in p["valid"]}
        if name in ("softmax", "rmsnorm", "layernorm"):
            assert any("single-pass" in s for s in specs) and any("two-pass" in s for s in specs)
        assert len(specs) >= 2

    def test_poisoned_output_is_fully_overwritten(self, interpreted: dict[str, Any]) -> None:
        for problem in interpreted["problems"]:
            assert problem["poisoned_before"] > 0 and problem["nonfinite_after"] == 0

    def test_work_bytes_are_the_inputs_and_outputs(self, interpreted: dict[str, Any], name: str) -> None:
        for problem in interpreted["problems"]:
            if CASES[name].operands_are_the_work:
                assert problem["work_bytes"] == problem["operand_bytes"]
            else:  # less than all operands; the family's own tests check its formula
                assert 0 < problem["work_bytes"] < problem["operand_bytes"]

    def test_inputs_are_random_never_zero_and_seeded(self, interpreted: dict[str, Any]) -> None:
        for problem in interpreted["problems"]:
            assert problem["zero_fraction"] < 0.01
            assert problem["same_seed_equal"] and not problem["other_seed_equal"]

    def test_wrong_output_is_wrong_result(self, interpreted: dict[str, Any]) -> None:
        for problem in interpreted["problems"]:
            status, err, message = problem["wrong"]
            assert status == "wrong_result" and err > problem["tolerance"], problem["label"]
            assert message.startswith("relative error")

    def test_unwritten_output_never_passes(self, interpreted: dict[str, Any]) -> None:
        for problem in interpreted["problems"]:
            status, message = problem["unwritten"]
            assert status == "wrong_result" and "NaN" in message

    def test_invalid_config_is_never_launched(self, interpreted: dict[str, Any]) -> None:
        for problem in interpreted["problems"]:
            if problem["invalid"] is not None:
                status, message = problem["invalid"]
                assert status == "invalid" and message


CONTRACT_CHILD = """
import json, random, sys
import torch
from tilepilot.experiments import Problem
from tilepilot.kernels import get_family, register
from tilepilot.kernels.evaluate import Evaluator

name, raws = sys.argv[1], json.loads(sys.argv[2])
ev = Evaluator("interpret", input_sets=2, seed=5)  # sets TRITON_INTERPRET=1 before any kernel import
family = get_family(name)


def tensors(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


class LastPartZeroed(type(family)):
    name = "test_last_part_zeroed"
    def launcher(self, problem, config, inputs, out, compiled):
        run = super().launcher(problem, config, inputs, out, compiled)
        flat = tensors(out)[0].view(-1)
        def buggy():
            run()
            flat[-max(1, flat.numel() // 32):] = 0
        return buggy


class NeverWrites(type(family)):
    name = "test_never_writes"
    def launcher(self, problem, config, inputs, out, compiled):
        super().launcher(problem, config, inputs, out, compiled)
        return lambda: None


register(LastPartZeroed)
register(NeverWrites)
report = {"problems": []}
for raw in raws:
    p = family.parse_problem(raw)
    space = family.space()
    valid = space.valid(p)
    configs = [family.default_config(p), valid[0], random.Random(0).choice(valid)]
    invalid = next((c for c in space if space.check(c, p)), None)
    results = ev.evaluate(name, p, configs + ([invalid] if invalid else []))
    inputs = family.make_inputs(p, 11, "cpu")
    out = family.make_output(p, inputs)
    for t in tensors(out):
        t.fill_(float("nan"))
    poisoned = sum(int(t.float().isnan().sum()) for t in tensors(out))
    family.launcher(p, configs[1], inputs, out, None)()
    again = family.make_inputs(p, 11, "cpu")
    other = family.make_inputs(p, 12, "cpu")
    [wrong] = ev.evaluate("test_last_part_zeroed", p, configs[:1])
    [unwritten] = ev.evaluate("test_never_writes", p, configs[:1])
    report["problems"].append({
        "label": p.label(), "tolerance": family.tolerance(p),
        "valid": [[r.status.value, r.max_rel_err, r.message, r.timing.method if r.timing else None,
                   r.extra.get("specialisation")] for r in results[:3]],
        "invalid": [results[3].status.value, results[3].message] if invalid else None,
        "poisoned_before": poisoned,
        "nonfinite_after": sum(int((~t.float().isfinite()).sum()) for t in tensors(out)),
        "work_bytes": family.work(p).bytes,
        "operand_bytes": sum(t.nbytes for t in [*inputs, *tensors(out)]),
        "zero_fraction": max(float((t == 0).float().mean()) for t in inputs),
        "same_seed_equal": all(torch.equal(a, b) for a, b in zip(inputs, again)),
        "other_seed_equal": all(torch.equal(a, b) for a, b in zip(inputs, other)),
        "wrong": [wrong.status.value, wrong.max_rel_err, wrong.message],
        "unwritten": [unwritten.status.value, unwritten.message],
    })
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def interpreted(name: str) -> dict[str, Any]:
    result: dict[str, Any] = run_child(CONTRACT_CHILD, name, json.dumps(CASES[name].small), env=env_for(name))
    return result


# ---- ahead-of-time compile, no GPU -------------------------------------------------------------------
COMPILE_CHILD = """
import json, sys
from tilepilot.experiments import Config
from tilepilot.kernels import get_family
from tilepilot.kernels.base import Target
from tilepilot.kernels.evaluate import compile_config
from tilepilot.kernels.rowwise import pipelined_shared_bytes

out = {}
for name, raw, configs in json.loads(sys.argv[1]):
    family = get_family(name)
    p = family.parse_problem(raw)
    for c in [family.default_config(p)] + [Config.of(c) for c in configs]:
        o = compile_config(name, p, c, Target())
        vectors = {"softmax": 0, "rmsnorm": 1, "layernorm": 2}.get(name)
        predicted = pipelined_shared_bytes(c, p, vectors) if vectors is not None else None
        out.setdefault(name, []).append([c.label(), o.status.value, o.message, o.shared_bytes, predicted])
print(json.dumps(out))
"""


def row_config(block: int, per_program: int, warps: int, stages: int) -> dict[str, int]:
    return {"BLOCK_SIZE": block, "ROWS_PER_PROGRAM": per_program, "num_warps": warps, "num_stages": stages}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pipelined = [row_config(2048, 2, 4, 3), row_config(8192, 4, 8, 2)]
    jobs = [[n, rows(4096, 8192, "bf16"), pipelined] for n in ("softmax", "rmsnorm", "layernorm")]
    jobs.append(["attention", attn(4, 32, 4096, 128, True, "bf16"),
                 [{"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
                  {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 5}]])
    jobs.append(["silu_mul_fp8_quant", tokens(4096, 14336, "bf16"),
                 [{"GROUPS_PER_PROGRAM": 1, "ROWS_PER_PROGRAM": 1, "num_warps": 1, "num_stages": 1},
                  {"GROUPS_PER_PROGRAM": 16, "ROWS_PER_PROGRAM": 8, "num_warps": 8, "num_stages": 3}]])
    jobs.append(["fused_moe", moe(4096, 8, 2, 14336, 4096, "bf16"),
                 [{"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8, "num_warps": 8,
                   "num_stages": 4},
                  {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1, "num_warps": 4,
                   "num_stages": 4}]])
    tile = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8, "num_warps": 4,
            "num_stages": 3}
    jobs.append(["matmul", mm(3000, 5000, 1000, "fp16"),
                 [{**tile, "VARIANT": "splitk", "SPLIT_K": 2, "ALIGN_HINT": True},
                  {**tile, "VARIANT": "tma", "SPLIT_K": 1, "ALIGN_HINT": False}]])
    jobs.append([USER_FAMILY, {"n": 2**20, "dtype": "fp16"}, []])
    env = {**USER_ENV, "CUDA_VISIBLE_DEVICES": "", "TRITON_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}
    result: dict[str, Any] = run_child(COMPILE_CHILD, json.dumps(jobs), env=env)
    return result


def test_every_family_compiles_ahead_of_time_for_sm90_without_a_gpu(compiled: dict[str, Any]) -> None:
    assert set(compiled) == set(FAMILIES)
    for name, outcomes in compiled.items():
        for label, status, message, shared, _ in outcomes:
            assert (status, message) == ("ok", ""), (name, label)
            assert shared is not None and shared <= 232448


def test_pipelined_shared_memory_matches_the_constraint_model(compiled: dict[str, Any]) -> None:
    for name in ("softmax", "rmsnorm", "layernorm"):
        for label, _, _, shared, predicted in compiled[name]:
            assert predicted <= shared <= predicted + 1024, (name, label, shared, predicted)


def test_loading_the_families_imports_neither_torch_nor_triton() -> None:
    code = """
        import json, sys
        from tilepilot.kernels import family_names, get_family
        for name, raw in json.loads(sys.argv[1]).items():
            f = get_family(name)
            p = f.parse_problem(raw)
            f.space().valid(p); f.kernel_version(); f.work(p); f.specialisation(p, f.default_config(p))
        print(json.dumps([sorted(family_names()), "torch" in sys.modules, "triton" in sys.modules]))
    """
    names, torch_loaded, triton_loaded = run_child(code, json.dumps({n: CASES[n].shapes[0] for n in FAMILIES}),
                                                   env=USER_ENV)
    assert set(FAMILIES) <= set(names)
    assert (torch_loaded, triton_loaded) == (False, False)


# ---- what is particular to each family -------------------------------------------------------------
SPECIFIC_CHILD = """
import json, math
import torch
from tilepilot.experiments import Config
from tilepilot.kernels import get_family
from tilepilot.kernels.evaluate import Evaluator

Evaluator("interpret")  # TRITON_INTERPRET=1 before the kernels are imported
import triton
import triton.language as tl
from tilepilot.kernels import fp8_quant_triton

out = {}


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def run(name, raw, config, inputs):
    f = get_family(name)
    p = f.parse_problem(raw)
    assert f.space().check(Config.of(config), p) is None
    y = f.make_output(p, inputs)
    f.launcher(p, Config.of(config), inputs, y, None)()
    return f, p, y


two_pass = {"BLOCK_SIZE": 256, "ROWS_PER_PROGRAM": 2, "num_warps": 2, "num_stages": 2}
one_pass = {"BLOCK_SIZE": 1024, "ROWS_PER_PROGRAM": 1, "num_warps": 4, "num_stages": 1}

# softmax: logits far beyond exp's range, the row maximum in the last block (rescaled sums)
x = torch.linspace(-3.0e4, 6.0e4, 4 * 1000, dtype=torch.float32).view(4, 1000).to(torch.float16)
x[1] = x[1].flip(0)
x[2] = 65000.0
x[3, 500] = 65504.0
ref = torch.softmax(x.float(), dim=-1)
out["softmax_huge"] = [rel(run("softmax", {"rows": 4, "cols": 1000, "dtype": "fp16"}, c, (x,))[2], ref)
                       for c in (two_pass, one_pass)]

# layernorm: mean 1000 and unit variance in fp32; E[x²] - E[x]² in fp32 would lose 6 of 7 digits
g = torch.Generator().manual_seed(0)
x = torch.randn((4, 1000), generator=g) + 1000.0
w, b = 0.5 + torch.rand(1000, generator=g), 0.1 * torch.randn(1000, generator=g)
f = get_family("layernorm")
p = f.parse_problem({"rows": 4, "cols": 1000, "dtype": "fp32"})
out["layernorm_mean"] = [rel(run("layernorm", p.as_dict(), c, (x, w, b))[2], f.reference(p, (x, w, b)))
                         for c in (two_pass, one_pass)]


# fp8: the rounding in float32 against torch's conversion, on every e4m3 value, every midpoint
# between neighbours, values a hair off the midpoints, tiny values of both signs and zeros
@triton.jit
def round_kernel(x_ptr, q_ptr, N: tl.constexpr, ROUND: tl.constexpr):
    offs = tl.arange(0, N)
    v = tl.load(x_ptr + offs)
    if ROUND:
        v = fp8_quant_triton._round_to_e4m3(v)
    tl.store(q_ptr + offs, v.to(q_ptr.dtype.element_ty))


grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
grid = grid[grid.isfinite()].unique()
mids = (grid[1:] + grid[:-1]) / 2
up, down = torch.full_like(mids, 1e4), torch.full_like(mids, -1e4)
values = torch.cat([grid, mids, mids.nextafter(up), mids.nextafter(down), torch.tensor([0.0, -0.0, 1e-7, -1e-7]),
                    (torch.rand(8192, generator=g) * 2 - 1) * 448])
n = 1 << (values.numel() - 1).bit_length()
values = torch.cat([values, torch.zeros(n - values.numel())])
expected = values.to(torch.float8_e4m3fn).view(torch.uint8)
for flag in (True, False):
    q = torch.empty(n, dtype=torch.float8_e4m3fn)
    round_kernel[(1,)](values, q, N=n, ROUND=flag)
    out[f"round_{flag}_mismatches"] = int((q.view(torch.uint8) != expected).sum())
    out["tested_values"] = n

# fp8: the whole kernel with and without rounding in float32; scales corrupted after the launch
f = get_family("silu_mul_fp8_quant")
p = f.parse_problem({"T": 5, "H": 384, "dtype": "fp16"})
config = {"GROUPS_PER_PROGRAM": 2, "ROWS_PER_PROGRAM": 2, "num_warps": 2, "num_stages": 2}
x = f.make_inputs(p, 0, "cpu")
ref = f.reference(p, x)
checks = {}
for flag in (True, False):
    q, s = f.make_output(p, x)
    fp8_quant_triton.silu_mul_fp8_quant_kernel[(3, 2, 1)](
        x[0], q, s, 5, 384, EPS=1e-10, FP8_MAX=448.0, GROUP_SIZE=128, GROUPS_PER_PROGRAM=2, ROWS_PER_PROGRAM=2,
        NUM_STAGES=2, ROUND_IN_FP32=flag)
    checks[f"kernel_round_{flag}"] = f.compare((q, s), ref)
_, _, (q, s) = run("silu_mul_fp8_quant", p.as_dict(), config, x)
checks["launcher"] = f.compare((q, s), ref)
checks["scales_x1.5"] = f.compare((q, s * 1.5), ref)
checks["scales_rolled"] = f.compare((q, s.roll(1, dims=0)), ref)
out.update({k: [c.dequant_rel_err, c.scale_rel_err, c.max_ulp, c.off_by_ulps, c.error] for k, c in checks.items()})
out["fp8_tolerance"] = f.tolerance(p)
out["elements"] = q.numel()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def specific() -> dict[str, Any]:
    result: dict[str, Any] = run_child(SPECIFIC_CHILD)
    return result


def test_softmax_is_safe_on_logits_beyond_exp_range_in_both_passes(specific: dict[str, Any]) -> None:
    assert all(err < 1e-3 for err in specific["softmax_huge"]), specific["softmax_huge"]


def test_layernorm_variance_survives_a_large_mean(specific: dict[str, Any]) -> None:
    # x - mean in float32 is itself off by up to ulp(1000)/2 = 3e-5, so ~4e-5 is the floor here;
    # E[x²] - E[x]² in float32 would be off by ~1e-2 (ulp(1e6) = 0.06 against a variance of 1).
    assert all(err < 1e-4 for err in specific["layernorm_mean"]), specific["layernorm_mean"]


def test_fp8_rounding_in_fp32_matches_torch_bit_for_bit(specific: dict[str, Any]) -> None:
    assert specific["tested_values"] > 8192 and specific["round_True_mismatches"] == 0


def test_interpreter_fp8_cast_alone_is_wrong_which_is_why_the_kernel_rounds_first(specific: dict[str, Any]) -> None:
    # If this fails, Triton's interpreter converts to fp8 correctly now, and ROUND_IN_FP32 can go.
    assert specific["round_False_mismatches"] > 0
    assert specific["kernel_round_False"][4] > specific["fp8_tolerance"]


def test_fp8_kernel_matches_the_reference_quantisation(specific: dict[str, Any]) -> None:
    for key in ("kernel_round_True", "launcher"):
        _, scale, max_ulp, off, error = specific[key]
        assert error < specific["fp8_tolerance"] and scale < 1e-5, key
        assert max_ulp <= 1 and off <= specific["elements"] // 1000, key


def test_fp8_compare_catches_wrong_scales(specific: dict[str, Any]) -> None:
    for key in ("scales_x1.5", "scales_rolled"):
        assert specific[key][4] > 10 * specific["fp8_tolerance"], key


# fp8 through the Evaluator: q written correctly, the scales planted wrong after the launch
FP8_PLANTED_CHILD = """
import json
from tilepilot.experiments import Config
from tilepilot.kernels import get_family, register
from tilepilot.kernels.evaluate import Evaluator

ev = Evaluator("interpret", input_sets=2, seed=5)  # TRITON_INTERPRET=1 before any kernel import
family = get_family("silu_mul_fp8_quant")


def planted(label, corrupt):
    class Planted(type(family)):
        name = "test_fp8_" + label
        def launcher(self, problem, config, inputs, out, compiled):
            run = super().launcher(problem, config, inputs, out, compiled)
            def buggy():
                run()
                corrupt(*out)
            return buggy
    register(Planted)
    return Planted.name


def times_1_5(q, s):
    s.mul_(1.5)


def rows_swapped(q, s):  # the rows with the largest and the smallest scale trade places
    i, j = int(s[:, 0].argmax()), int(s[:, 0].argmin())
    s[[i, j]] = s[[j, i]]


def one_nan(q, s):
    s[-1, -1] = float("nan")


def small_row_q_zeroed(q, s):  # the row that weighs least in the dequantised values
    q[int(s.amax(dim=1).argmin())] = 0


p = family.parse_problem({"T": 5, "H": 384, "dtype": "fp16"})
config = Config.of({"GROUPS_PER_PROGRAM": 2, "ROWS_PER_PROGRAM": 2, "num_warps": 2, "num_stages": 2})
out = {"tolerance": family.tolerance(p)}
for label, corrupt in (("correct", lambda q, s: None), ("scales_x1.5", times_1_5), ("rows_swapped", rows_swapped),
                       ("scale_nan", one_nan), ("small_row_q_zeroed", small_row_q_zeroed)):
    name = planted(label, corrupt)
    [r] = ev.evaluate(name, p, [config])
    out[label] = [r.status.value, r.max_rel_err, r.message, ev.recheck(name, p, config).passed]

# a correct kernel's float32 differs from torch's: y perturbed by 1e-6 relative, quantised by the same
# formula, on a shape whose one-step flips weigh the most beside the tolerance (1 group a row, 256 rows)
import torch
from tilepilot.kernels.fp8_quant import EPS, FP8_MAX
p = family.parse_problem({"T": 256, "H": 128, "dtype": "fp16"})
errors, flips = [], 0
for seed in range(40):
    x = family.make_inputs(p, seed, "cpu")
    xf = x[0].float()
    y = torch.nn.functional.silu(xf[:, :128]) * xf[:, 128:]
    y = y * (1 + 1e-6 * torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)))
    s = y.abs().amax(dim=1).clamp(min=EPS) / FP8_MAX
    q = (y / s[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    check = family.compare((q, s[:, None]), family.reference(p, x))
    errors.append(family.error(p, (q, s[:, None]), family.reference(p, x)))
    flips += check.off_by_ulps
out["rounding"] = {"tolerance": family.tolerance(p), "max_error": max(errors), "flips": flips}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def fp8_planted() -> dict[str, Any]:
    result: dict[str, Any] = run_child(FP8_PLANTED_CHILD)
    return result


def test_fp8_correct_output_passes_the_family_error(fp8_planted: dict[str, Any]) -> None:
    status, err, message, rechecked = fp8_planted["correct"]
    assert (status, message, rechecked) == ("ok", "", True)
    assert 0 <= err < fp8_planted["tolerance"]


@pytest.mark.parametrize("planted", ["scales_x1.5", "rows_swapped"])
def test_fp8_correct_q_with_wrong_scales_is_wrong_result(fp8_planted: dict[str, Any], planted: str) -> None:
    status, err, message, rechecked = fp8_planted[planted]
    assert status == "wrong_result" and err > 10 * fp8_planted["tolerance"], (planted, err)
    assert message.startswith("relative error") and not rechecked


def test_fp8_q_zeroed_in_the_row_of_smallest_scale_is_wrong_result(fp8_planted: dict[str, Any]) -> None:
    # that row weighs ~1/4096 of the largest in the dequantised values; in fp8 units it weighs alike
    status, err, message, rechecked = fp8_planted["small_row_q_zeroed"]
    assert status == "wrong_result" and err > 10 * fp8_planted["tolerance"], err
    assert message.startswith("relative error") and not rechecked


def test_fp8_tolerance_leaves_room_for_a_correct_kernels_rounding_flips(fp8_planted: dict[str, Any]) -> None:
    rounding = fp8_planted["rounding"]
    assert rounding["flips"] > 0  # the perturbation does move elements one fp8 step
    assert rounding["max_error"] < rounding["tolerance"], rounding


def test_fp8_nan_in_one_scale_is_wrong_result(fp8_planted: dict[str, Any]) -> None:
    status, err, message, rechecked = fp8_planted["scale_nan"]
    assert status == "wrong_result" and "NaN" in message and not rechecked
    assert err == float("inf")


def test_fp8_vllm_fallback_launch_is_in_the_space() -> None:
    family = registry.get_family("silu_mul_fp8_quant")
    fallback = Config.of({"GROUPS_PER_PROGRAM": 1, "ROWS_PER_PROGRAM": 1, "num_warps": 1, "num_stages": 1})
    for raw in CASES["silu_mul_fp8_quant"].shapes:
        assert family.space().check(fallback, Problem.of(raw)) is None


def test_row_constraints_name_what_is_wrong() -> None:
    family = registry.get_family("layernorm")
    space = family.space()
    problem = family.parse_problem(rows(4, 1000, "fp32"))
    cases = [(row_config(4096, 1, 4, 1), "longer than a row of 1000 columns needs (1024)"),
             (row_config(256, 1, 16, 1), "512 threads (num_warps=16) for a block of 256 elements"),
             (row_config(1024, 1, 4, 2), "num_stages=2 pipelines a loop"),
             (row_config(256, 4, 2, 1), None)]
    for config, expected in cases:
        reason = space.check(Config.of(config), problem)
        assert (reason is None) if expected is None else (reason is not None and expected in reason)
    big = family.parse_problem(rows(2, 32768, "fp32"))
    assert space.check(Config.of(row_config(16384, 1, 16, 2)), big) is None  # 1 × 3 loads × 64 KiB fits
    reason = space.check(Config.of(row_config(16384, 1, 16, 3)), big)
    assert reason is not None and "393216 B of shared memory" in reason
    assert space.check(Config.of(row_config(1024, 2, 4, 1)), family.parse_problem(rows(1, 1000, "fp32")))


# ---- a user family end to end: `tilepilot tune --backend interpret` on Ray workers ---------------------
@pytest.mark.slow  # starts Ray: about 30 s on a 2-core machine
def test_user_family_tunes_end_to_end_with_tilepilot_tune_on_the_interpreter(tmp_path: Path) -> None:
    db = tmp_path / "my.db"
    env = {**os.environ, **USER_ENV}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-m", "tilepilot", "tune", str(REPO / "campaigns" / "my-kernel.toml"),
                           "--backend", "interpret", "--db", str(db)], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "campaign my-kernel finished (interpret" in proc.stdout
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT e.kernel, e.backend, r.status, r.timing_method, r.max_rel_err FROM experiments e "
                           "JOIN results r ON r.experiment_key = e.key").fetchall()
        winners = con.execute("SELECT COUNT(*) FROM winners").fetchone()[0]
    finally:
        con.close()
    assert len(rows) == 4 * 2 and winners == 2  # budget 4 on each of the campaign's 2 problems
    for kernel, backend, status, method, err in rows:
        assert (kernel, backend, status, method) == (USER_FAMILY, "interpret", "ok", "cpu-wallclock")
        assert 0 <= err < 1e-3
