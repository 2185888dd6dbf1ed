"""What is particular to the `attention` family (the shared contract is in test_kernels_families.py).

In this process (no torch, no triton): the config space and each constraint's reason, the
default config, the work model, the specialisation. In a child with no GPU: sm_90 compiles
whose shared memory is the constraint's model and whose spills ptxas reports as the register
rule predicts. In a child under the Triton interpreter (fp16; bf16 runs on the GPU only,
tests/test_kernels_families_gpu.py): a query never sees a later key, ragged and tiny sequence
lengths, nothing written past the output, huge logits, and the row-wise error measure, each for
both variants (plain, tma). On the GPU (`gpu` mark): the tma variant in bf16 on the issue's shapes
and ragged ones, its bulk tensor copies on the GPU's Triton, and every SDPA backend's output.
The tma variant for a pre-Hopper target is a `compile_error` that says why.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.test_kernels_families import run_child
from tilepilot.experiments import Config, InputError, Problem
from tilepilot.kernels import attention
from tilepilot.kernels.attention import AttentionFamily

FAMILY = AttentionFamily()


def problem(s: int, d: int, causal: bool, *, b: int = 4, h: int = 32, dtype: str = "bf16") -> Problem:
    return FAMILY.parse_problem({"B": b, "H": h, "S": s, "D": d, "causal": causal, "dtype": dtype})


def config(bm: int, bn: int, warps: int, stages: int, variant: str = "plain") -> Config:
    return Config.of({"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages, "VARIANT": variant})


# ---- in this process -----------------------------------------------------------------------------
def test_space_is_the_tutorial_grid_per_variant_and_every_config_is_valid_or_says_why() -> None:
    space = FAMILY.space()
    assert space.names == ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "VARIANT") and space.size == 96
    assert space.param("VARIANT").choices == ("plain", "tma") and space.param("VARIANT").default == "plain"
    counts = {}
    for s in (1024, 4096):
        for d in (64, 128):
            for causal in (False, True):
                p = problem(s, d, causal)
                for variant in ("plain", "tma"):
                    reasons = [space.check(c, p) for c in space if c["VARIANT"] == variant]
                    assert all(r is None or (r and "\n" not in r) for r in reasons)
                    counts[(s, d, causal, variant)] = reasons.count(None)
    for v in ("plain", "tma"):  # the variants share the tile grid and its limits
        assert counts[(1024, 64, False, v)] == counts[(4096, 64, False, v)] == 44  # BLOCK_M=128, BLOCK_N=128, 4 warps
        assert counts[(1024, 128, False, v)] == counts[(4096, 128, False, v)] == 34
        assert counts[(1024, 64, True, v)] == 36 and counts[(1024, 128, True, v)] == 30  # and no BLOCK_N > BLOCK_M


def test_a_config_recorded_before_variants_is_the_plain_kernel() -> None:
    old = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
    assert FAMILY.space().parse(old) == config(128, 64, 4, 3)
    assert attention.setting(Config.of(old), "VARIANT") == "plain"
    assert FAMILY.space().check(Config.of(old), problem(1024, 64, False)) is None


@pytest.mark.parametrize(("p", "c", "expected"), [
    (problem(1024, 64, True), config(64, 128, 4, 2), "causal: BLOCK_N=128 is longer than the diagonal band of "
                                                       "BLOCK_M=64 keys"),
    (problem(1024, 128, False), config(128, 128, 8, 4), "needs 294912 B of shared memory, more than the 232448 B"),
    (problem(1024, 128, False), config(64, 128, 8, 5), "needs 344064 B of shared memory"),
    (problem(1024, 128, False), config(128, 64, 4, 2), "take 224 registers per thread with num_warps=4"),
    (problem(1024, 64, False), config(128, 128, 4, 2), "take 256 registers per thread"),
    (problem(40, 64, False), config(128, 32, 8, 2), "BLOCK_M=128 is longer than a sequence of 40 needs (64)"),
    (problem(20, 64, True), config(64, 64, 8, 2), "BLOCK_N=64 is longer than a sequence of 20 needs (32)"),
    (problem(1024, 128, False), config(128, 32, 4, 5), None),  # 176 registers: no spill
    (problem(1024, 128, False), config(64, 128, 8, 3), None),  # 212992 B of shared memory fits
    (problem(1024, 64, False), config(64, 128, 4, 5), None),  # BLOCK_N > BLOCK_M is fine without the causal mask
    (problem(1024, 128, False), config(64, 128, 8, 3, "tma"), None),  # 214016 B with the copies' barriers
    (problem(1024, 128, False), config(128, 64, 4, 2, "tma"), "take 224 registers per thread"),
    (problem(1024, 64, True), config(64, 128, 4, 2, "tma"), "causal: BLOCK_N=128 is longer than the diagonal band"),
], ids=str)
def test_constraints_name_what_is_wrong(p: Problem, c: Config, expected: str | None) -> None:
    reason = FAMILY.space().check(c, p)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason, reason


def test_default_config_is_the_tutorials_choice_for_the_head_dim() -> None:
    assert FAMILY.default_config(problem(4096, 64, True)) == config(128, 64, 4, 4, "plain")
    assert FAMILY.default_config(problem(1024, 32, False)) == config(128, 64, 4, 4)
    assert FAMILY.default_config(problem(4096, 128, False)) == config(128, 32, 8, 3)
    assert FAMILY.default_config(problem(40, 64, True)) == config(64, 64, 4, 4)  # shortened to the sequence
    assert FAMILY.default_config(problem(20, 64, True)) == config(64, 32, 4, 4)


def test_work_counts_every_query_key_pair_the_mask_keeps() -> None:
    full, causal = FAMILY.work(problem(1024, 64, False)), FAMILY.work(problem(1024, 64, True))
    assert full.flops == 4 * 4 * 32 * 1024 * 1024 * 64
    assert causal.flops == 4 * 4 * 32 * 64 * (1024 * 1025 // 2)
    assert causal.flops / full.flops == pytest.approx(0.5, abs=1e-3)
    assert full.bytes == causal.bytes == 4 * (4 * 32 * 1024 * 64) * 2  # Q, K, V read and O written once


def test_sequence_lengths_of_one_divisibility_class_share_a_kernel() -> None:
    c = config(128, 64, 4, 3)
    assert FAMILY.specialisation(problem(1024, 64, True), c) == FAMILY.specialisation(problem(4096, 64, True), c)
    others = {FAMILY.specialisation(p, c) for p in (problem(1000, 64, True), problem(1024, 128, True),
                                                  problem(1024, 64, False), problem(1024, 64, True, dtype="fp16"))}
    assert len(others) == 4 and FAMILY.specialisation(problem(1024, 64, True), c) not in others


@pytest.mark.parametrize(("raw", "message"), [
    ({"causal": 1}, r"causal=1 is not one of \{true, false\}"),
    ({"D": True}, r"D=True is not one of \{32, 64, 128\}"),
    ({"S": 2.0}, r"S=2.0 is not a positive integer"),
])
def test_causal_is_a_bool_and_sizes_are_ints(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        FAMILY.parse_problem({"B": 1, "H": 1, "S": 64, "D": 64, "causal": False, "dtype": "fp16", **raw})


def test_softmax_scale_is_one_over_sqrt_d_in_base_two() -> None:
    assert attention.qk_scale(problem(64, 128, False)) == pytest.approx(1.4426950408889634 / 128**0.5)


# ---- sm_90 compiles, no GPU ----------------------------------------------------------------------------
COMPILE_CHILD = """
import json, re, subprocess, sys, tempfile
from tilepilot.experiments import Config, Problem
from tilepilot.kernels.attention import AttentionFamily, registers_fit, shared_bytes
from tilepilot.kernels.base import Target
from triton.backends.nvidia import compiler

try:
    ptxas = compiler.get_ptxas(90).path
except TypeError:  # Triton 3.6 takes no arch
    ptxas = compiler.get_ptxas().path
family = AttentionFamily()
out = []
for raw, cfg in json.loads(sys.argv[1]):
    p, c = Problem.of(raw), Config.of(cfg)
    kernel = family.compile(p, c, Target())
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(kernel.asm["ptx"])
        f.flush()
        log = subprocess.run([ptxas, "-v", "--regAllocOptLevel=2", "--gpu-name=sm_90a", f.name, "-o", "/dev/null"],
                             capture_output=True, text=True, check=True).stderr
    spills = re.search(r"(\\d+) bytes spill stores", log)
    out.append([p.label(), c.label(), int(kernel.metadata.shared), shared_bytes(c, p), registers_fit(c, p),
                int(spills.group(1)), len(re.findall(r"cp\\.async\\.bulk\\.tensor", kernel.asm["ptx"]))])
from tilepilot.kernels.evaluate import compile_config
raw, cfg = json.loads(sys.argv[1])[-1]
o = compile_config("attention", Problem.of(raw), Config.of(cfg), Target(arch=80, max_shared_bytes=166912))
out.append([o.status.value, o.message])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> list[list[Any]]:
    jobs = [(problem(1024, 128, True), config(128, 32, 4, 2)),  # 176 registers: the most that do not spill
            (problem(1024, 128, False), config(128, 64, 4, 2)),  # 224: the fewest that do
            (problem(1024, 64, False), config(64, 128, 8, 3)),
            (problem(1000, 128, False, dtype="fp16"), config(64, 32, 8, 5)),
            (problem(1024, 128, True), config(128, 32, 4, 2, "tma")),
            (problem(1024, 128, False), config(128, 64, 4, 2, "tma")),
            (problem(1024, 64, False), config(64, 128, 8, 3, "tma")),
            (problem(1000, 64, True, dtype="fp16"), config(64, 64, 4, 3, "tma"))]
    env = {"CUDA_VISIBLE_DEVICES": "", "TRITON_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}
    result: list[list[Any]] = run_child(COMPILE_CHILD, json.dumps([[p.as_dict(), c.as_dict()] for p, c in jobs]),
                                        env=env)
    return result


def test_shared_memory_model_is_what_sm90_compiles_allocate(compiled: list[list[Any]]) -> None:
    for label, cfg, shared, predicted, *_ in compiled[:-1]:
        if cfg.endswith("VARIANT=plain"):
            assert shared == predicted, (label, cfg, shared, predicted)
        else:  # the copies' barriers: 1024 B where the tiles are swizzled by 128 B, less where by 64
            assert predicted - attention.TMA_BARRIER_BYTES < shared <= predicted, (label, cfg, shared, predicted)


def test_register_rule_rejects_exactly_the_configs_ptxas_spills(compiled: list[list[Any]]) -> None:
    for label, cfg, _, _, reason, spills, _ in compiled[:-1]:
        assert (reason is not None) == (spills > 0), (label, cfg, reason, spills)
    assert sum(spills > 0 for *_, spills, _ in compiled[:-1]) == 2  # one per variant


def test_tma_variant_loads_keys_and_values_by_bulk_tensor_copies(compiled: list[list[Any]]) -> None:
    for label, cfg, *_, bulk in compiled[:-1]:
        assert (bulk > 0) == cfg.endswith("VARIANT=tma"), (label, cfg, bulk)


def test_tma_for_a_pre_hopper_target_is_a_compile_error_that_says_why(compiled: list[list[Any]]) -> None:
    status, message = compiled[-1]
    assert status == "compile_error"
    assert "VARIANT=tma needs TMA (cuda sm_90 or later); the target is cuda sm_80" in message


# ---- under the interpreter -------------------------------------------------------------------------------
INTERPRET_CHILD = """
import json, math
import torch
from tilepilot.experiments import Config
from tilepilot.kernels import get_family
from tilepilot.kernels.evaluate import Evaluator

Evaluator("interpret")  # TRITON_INTERPRET=1 before the kernel is imported
from tilepilot.kernels import attention, attention_triton

family = get_family("attention")
CONFIGS = [Config.of(dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "VARIANT"), c)))
           for c in ((64, 32, 4, 2, "plain"), (64, 64, 4, 3, "plain"), (128, 64, 8, 2, "plain"),
                     (128, 32, 4, 4, "plain"), (64, 32, 4, 2, "tma"), (128, 64, 8, 2, "tma"))]
out = {}


def problem(b, h, s, d, causal):
    return family.parse_problem({"B": b, "H": h, "S": s, "D": d, "causal": causal, "dtype": "fp16"})


def run(p, config, inputs):
    y = family.make_output(p, inputs)
    y.fill_(float("nan"))
    family.launcher(p, config, inputs, y, None)()
    return y


def fitting(p):
    return [c for c in CONFIGS if family.space().check(c, p) is None]


# causal: K and V changed from key 37 on (and from 70 on: the second query block of BLOCK_M=64) leave
# every earlier query's output bit for bit the same, and change every later one
p = problem(1, 2, 100, 64, True)
q, k, v = family.make_inputs(p, 0, "cpu")
masks = []
for first in (37, 70):
    k2, v2 = k.clone(), v.clone()
    k2[:, :, first:] = 4 * torch.randn_like(k2[:, :, first:].float()).half()
    v2[:, :, first:] = 4 * torch.randn_like(v2[:, :, first:].float()).half()
    for c in fitting(p):
        a, b = run(p, c, (q, k, v)), run(p, c, (q, k2, v2))
        same = (a == b).all(dim=-1).all(dim=(0, 1))
        masks.append([first, c.label(), bool(same[:first].all()), bool((~same[first:]).all())])
out["causal_later_keys"] = masks

# not causal: V changed at the last key only (in the tail block past the last full one) changes every row
p = problem(1, 2, 100, 64, False)
q, k, v = family.make_inputs(p, 0, "cpu")
v2 = v.clone()
v2[:, :, -1] += 1.0
out["noncausal_last_key"] = [bool((run(p, c, (q, k, v)) != run(p, c, (q, k, v2))).any(dim=-1).all())
                             for c in fitting(p)]

# ragged and tiny sequence lengths, every head dim, causal and not, against the reference
ragged = []
for s, d in ((1, 64), (17, 32), (64, 128), (65, 64), (100, 32), (129, 64)):
    for causal in (False, True):
        p = problem(2, 1, s, d, causal)
        inputs = family.make_inputs(p, s, "cpu")
        ref = family.reference(p, inputs)
        for c in fitting(p):
            ragged.append([p.label(), c.label(), family.error(p, run(p, c, inputs), ref), family.tolerance(p)])
out["ragged"] = ragged

# nothing is written past the output: O is the front of a larger buffer whose tail holds a sentinel
p = problem(2, 3, 100, 64, True)
q, k, v = family.make_inputs(p, 1, "cpu")
buf = torch.full((q.numel() + 4096,), 7.0, dtype=torch.float16)
o = buf[:q.numel()].view(q.shape)
c = CONFIGS[2]
attention_triton.attention_kernel[(1, 6, 1)](q, k, v, o, 100, **attention._constexprs(p, c), num_warps=8, num_stages=2)
out["sentinel_kept"] = bool((buf[q.numel():] == 7.0).all())
out["sentinel_error"] = family.error(p, o, family.reference(p, (q, k, v)))
buf.fill_(7.0)
family.launcher(p, CONFIGS[5], (q, k, v), o, None)()  # the tma variant's zero-filled tail tiles
out["tma_sentinel_kept"] = bool((buf[q.numel():] == 7.0).all())
out["tma_sentinel_error"] = family.error(p, o, family.reference(p, (q, k, v)))

# huge logits (|q·k|/sqrt(D) in the thousands), the largest key moving right block by block (rescaled sums)
p = problem(1, 2, 100, 64, False)
g = torch.Generator().manual_seed(3)
q = (torch.randn((1, 2, 100, 64), generator=g) * 30).half()
k = (torch.randn((1, 2, 100, 64), generator=g) * torch.linspace(1, 30, 100)[:, None]).half()
v = torch.randn((1, 2, 100, 64), generator=g).half()
logits = (q.float() @ k.float().transpose(-1, -2)) / 8
out["logit_range"] = [float(logits.min()), float(logits.max())]
ref = family.reference(p, (q, k, v))
huge = []
for causal in (False, True):
    pc = problem(1, 2, 100, 64, causal)
    for c in fitting(pc):
        y = run(pc, c, (q, k, v))
        huge.append([bool(y.isfinite().all()), family.error(pc, y, family.reference(pc, (q, k, v)))])
out["huge"] = huge
out["huge_tolerance"] = family.tolerance(p)

# the error measure: a causal problem run without the mask, NaN, and one late row wrong
p = problem(1, 2, 100, 64, True)
inputs = family.make_inputs(p, 0, "cpu")
ref = family.reference(p, inputs)
y = family.make_output(p, inputs)
consts = {**attention._constexprs(p, CONFIGS[0]), "CAUSAL": False}
attention_triton.attention_kernel[(2, 2, 1)](*inputs, y, 100, **consts, num_warps=4, num_stages=2)
out["unmasked_error"] = family.error(p, y, ref)
y = run(p, CONFIGS[0], inputs)
out["correct_error"] = family.error(p, y, ref)
late = y.clone()
late[0, 1, 99] *= 1.02
out["late_row_error"] = family.error(p, late, ref)
out["late_row_global_error"] = float((late.float() - ref).norm() / ref.norm())
nan = y.clone()
nan[0, 0, 50, 3] = float("nan")
out["nan_error"] = family.error(p, nan, ref)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def interpreted() -> dict[str, Any]:
    result: dict[str, Any] = run_child(INTERPRET_CHILD)
    return result


def test_a_query_never_sees_a_later_key(interpreted: dict[str, Any]) -> None:
    rows = interpreted["causal_later_keys"]
    assert len(rows) >= 6
    for first, cfg, earlier_same, later_changed in rows:
        assert earlier_same and later_changed, (first, cfg)


def test_without_the_mask_every_query_sees_the_last_key_of_a_ragged_sequence(interpreted: dict[str, Any]) -> None:
    assert len(interpreted["noncausal_last_key"]) >= 3 and all(interpreted["noncausal_last_key"])


def test_ragged_and_tiny_sequences_match_the_reference(interpreted: dict[str, Any]) -> None:
    assert len(interpreted["ragged"]) >= 30
    for label, cfg, err, tol in interpreted["ragged"]:
        assert 0 <= err < tol, (label, cfg, err)


def test_nothing_is_written_past_the_output(interpreted: dict[str, Any]) -> None:
    assert interpreted["sentinel_kept"] and interpreted["sentinel_error"] < 2e-3
    assert interpreted["tma_sentinel_kept"] and interpreted["tma_sentinel_error"] < 2e-3


def test_both_variants_ran_every_interpreter_case(interpreted: dict[str, Any]) -> None:
    for variant in ("plain", "tma"):
        assert sum(cfg.endswith(f"VARIANT={variant}") for _, cfg, _, _ in interpreted["ragged"]) >= 12
        assert sum(cfg.endswith(f"VARIANT={variant}") for _, cfg, _, _ in interpreted["causal_later_keys"]) >= 2


def test_huge_logits_stay_finite_and_correct(interpreted: dict[str, Any]) -> None:
    low, high = interpreted["logit_range"]
    assert low < -1000 and high > 1000  # exp of these overflows float32 without the running maximum
    assert len(interpreted["huge"]) >= 6
    for finite, err in interpreted["huge"]:
        assert finite and err < interpreted["huge_tolerance"], err


def test_row_error_catches_what_the_global_norm_hides(interpreted: dict[str, Any]) -> None:
    tol = 2e-3
    assert interpreted["correct_error"] < tol
    assert interpreted["unmasked_error"] > 100 * tol
    # one late causal row 2% off: the global norm hardly moves, the row error is the 2%
    assert interpreted["late_row_global_error"] < tol < interpreted["late_row_error"]
    assert interpreted["late_row_error"] == pytest.approx(0.02, rel=0.05)
    assert interpreted["nan_error"] == float("inf")


# ---- on the GPU (bf16, the compiled kernels) -------------------------------------------------------------
@pytest.fixture(scope="module")
def gpu_evaluator() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from tilepilot.kernels.evaluate import Evaluator

    return Evaluator("gpu", rounds=2, block_ms=2.0, outclass_ratio=None)  # every config timed


ISSUE_SHAPES = [(s, d, c) for s in (1024, 4096) for d in (64, 128) for c in (False, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ISSUE_SHAPES, ids=lambda v: "S={} D={} causal={}".format(*v))
def test_tma_variant_is_correct_on_the_issue_shapes_in_bf16(gpu_evaluator: Any, record_property: Any,
                                                            shape: tuple[int, int, bool]) -> None:
    from tilepilot.experiments import Status

    p = problem(*shape)
    plain = FAMILY.default_config(p)
    tma = Config.of({**plain.as_dict(), "VARIANT": "tma"})
    results = gpu_evaluator.evaluate("attention", p, [plain, tma, config(64, 64, 4, 3, "tma")])
    for r in results:
        assert r.status is Status.OK, (r.config.label(), r.message)
        assert 0 <= r.max_rel_err < FAMILY.tolerance(p), (r.config.label(), r.max_rel_err)
        assert r.extra["n_spills"] == 0 and r.extra["shared_bytes"] <= attention.shared_bytes(r.config, p)
        record_property(r.config.label(), f"{r.max_rel_err:.2e} max row err, {r.median_ms:.4f} ms")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1000, 128, True), (1000, 64, False), (1, 64, True), (77, 32, False)],
                         ids=lambda v: "S={} D={} causal={}".format(*v))
def test_tma_variant_is_correct_on_ragged_shapes(gpu_evaluator: Any, shape: tuple[int, int, bool]) -> None:
    from tilepilot.experiments import Status

    p = problem(*shape, b=2, h=3)
    configs = [c for c in FAMILY.space().valid(p) if c["VARIANT"] == "tma"][:3]
    assert configs
    for r in gpu_evaluator.evaluate("attention", p, configs):
        assert r.status is Status.OK, (p.label(), r.config.label(), r.message)
        assert 0 <= r.max_rel_err < FAMILY.tolerance(p), (p.label(), r.config.label(), r.max_rel_err)


@pytest.mark.gpu
def test_tma_variant_copies_keys_and_values_by_bulk_tensor_copies_on_this_triton(gpu_evaluator: Any) -> None:
    p = problem(4096, 128, True)
    ptx = FAMILY.compile(p, config(128, 64, 8, 3, "tma"), gpu_evaluator.target()).asm["ptx"]
    assert "cp.async.bulk.tensor.2d" in ptx and "wgmma.mma_async" in ptx


@pytest.mark.gpu
def test_every_sdpa_backend_is_checked_against_the_reference(gpu_evaluator: Any) -> None:
    p = problem(1024, 64, True, b=1, h=4)
    inputs = FAMILY.make_inputs(p, 0, "cuda")
    ref = FAMILY.reference(p, inputs)
    errors = {}
    for name, run in attention.sdpa_backends(p, inputs).items():
        try:
            errors[name] = FAMILY.error(p, run(), ref)
        except RuntimeError:  # a backend this device or build lacks
            continue
    assert "flash" in errors and all(err < FAMILY.tolerance(p) for err in errors.values()), errors
