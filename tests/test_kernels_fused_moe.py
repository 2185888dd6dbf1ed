"""What is particular to the `fused_moe` family (the shared contract is in test_kernels_families.py).

In this process (no torch, no triton): the config space and its constraints on the issue's
shapes, vLLM's default config, the work model's expected number of experts hit. In one child
process (torch, and the kernel under the Triton interpreter, fp16): the per-expert alignment,
the kernel against the reference on ragged M, experts that receive no tokens, topk = 1 and
topk = E, tiles masked in every direction, a wrong expert caught by the per-row error, the
work model against sampled routings, and the eager baseline. bf16 runs on the GPU only
(tests/test_kernels_families_gpu.py).
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

from tilepilot.experiments import Config, Problem
from tilepilot.kernels import fused_moe
from tilepilot.kernels.fused_moe import FusedMoeFamily

REPO = Path(__file__).resolve().parents[1]
FAMILY = FusedMoeFamily()
ISSUE_MODELS = ((8, 2, 14336, 4096), (64, 6, 1408, 2048))  # E, topk, N, K
ISSUE_TOKENS = (1, 16, 64, 256, 1024, 4096)


def moe(m: int, e: int, topk: int, n: int, k: int, dtype: str = "bf16") -> Problem:
    return FAMILY.parse_problem({"M": m, "E": e, "topk": topk, "N": n, "K": k, "dtype": dtype})


def cfg(bm: int, bn: int, bk: int, group: int = 1, warps: int = 4, stages: int = 3) -> Config:
    return Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": group,
                      "num_warps": warps, "num_stages": stages})


def issue_problems() -> list[Problem]:
    return [moe(m, e, t, n, k) for e, t, n, k in ISSUE_MODELS for m in ISSUE_TOKENS]


# ---- in this process -------------------------------------------------------------------------------
def test_full_grid_of_every_issue_shape_is_recordable_in_minutes() -> None:
    space = FAMILY.space()
    assert space.size == 384
    counts = [len(space.valid(p)) for p in issue_problems()]
    assert all(150 <= c <= 272 for c in counts), counts


def test_default_config_is_vllms_untuned_rule() -> None:
    decode = dict(cfg(16, 32, 64, 1, 4, 3))  # M <= E
    prefill = dict(cfg(64, 64, 32, 8, 4, 3))  # M > E
    for p in issue_problems():
        expected = decode if int(p["M"]) <= int(p["E"]) else prefill
        assert dict(FAMILY.default_config(p)) == expected, p.label()
    # tiles are clamped only where N or K is smaller than the rule's tile
    assert dict(FAMILY.default_config(moe(4, 8, 2, 20, 24, "fp16"))) == dict(cfg(16, 32, 32, 1, 4, 3))


@pytest.mark.parametrize(("problem", "config", "expected"), [
    (moe(4096, 8, 2, 14336, 4096), cfg(128, 256, 256, 8, 8, 4), "needs 786432 B of shared memory"),
    (moe(16, 8, 2, 14336, 4096), cfg(128, 64, 64), "BLOCK_SIZE_M=128 is more rows than an expert can receive"),
    (moe(4096, 8, 2, 14336, 4096), cfg(128, 256, 64, 8, 4, 3), "takes 256 registers per thread with num_warps=4"),
    (moe(4096, 8, 2, 14336, 4096), cfg(16, 32, 64, 1, 8, 3), "4 16×8 MMA tile(s) for num_warps=8"),
    (moe(1, 8, 1, 14336, 4096), cfg(16, 64, 64, 8), "GROUP_SIZE_M=8 orders the programs as GROUP_SIZE_M=1"),
    (moe(16, 8, 2, 40, 4096), cfg(16, 128, 64), "BLOCK_SIZE_N=128 is wider than N=40 needs (64)"),
    (moe(16, 8, 2, 64, 20), cfg(16, 64, 64), "BLOCK_SIZE_K=64 is wider than K=20 needs (32)"),
], ids=lambda v: v.label() if hasattr(v, "label") else str(v)[:24])
def test_constraints_name_what_is_wrong(problem: Problem, config: Config, expected: str) -> None:
    reason = FAMILY.space().check(config, problem)
    assert reason is not None and expected in reason and "\n" not in reason


def test_tiles_that_fit_stay_valid() -> None:
    space = FAMILY.space()
    big = moe(4096, 8, 2, 14336, 4096)
    assert space.check(cfg(128, 256, 64, 8, 8, 4), big) is None  # 192 KiB of stages, 128 registers a thread
    assert space.check(cfg(64, 128, 128, 8, 4, 4), big) is None
    assert space.check(cfg(64, 64, 64), moe(1, 8, 2, 14336, 4096)) is None  # one warpgroup MMA for one token
    assert space.check(cfg(16, 64, 64, 8), moe(1, 8, 2, 14336, 4096)) is None  # 2 row blocks: grouping reorders


def test_work_counts_only_the_experts_the_routing_hits() -> None:
    one = moe(1, 64, 6, 1408, 2048)
    assert fused_moe.expected_experts_hit(one) == pytest.approx(6)
    assert FAMILY.work(one).bytes == pytest.approx((2048 + 6 * 1408 * 2048 + 6 * 1408) * 2)
    many = moe(4096, 8, 2, 14336, 4096)
    assert fused_moe.expected_experts_hit(many) == pytest.approx(8)
    assert FAMILY.work(many).flops == 2 * 4096 * 2 * 14336 * 4096
    all_experts = moe(3, 4, 4, 64, 64, "fp16")
    assert fused_moe.expected_experts_hit(all_experts) == 4


def test_padded_rows_is_a_block_multiple_and_covers_the_worst_routing() -> None:
    for m, e, topk in ((1, 8, 2), (5, 4, 2), (33, 8, 3), (4096, 64, 6)):
        p = moe(m, e, topk, 64, 64, "fp16")
        for bm in (16, 64, 128):
            rows = fused_moe.padded_rows(p, bm)
            worst = min(m * topk + e * (bm - 1), m * topk * bm)  # every hit expert padded by up to bm - 1
            assert rows % bm == 0 and worst <= rows < worst + bm


# ---- in a child: torch, and the kernel under the interpreter -------------------------------------------
CHILD = """
import json
import torch
from tilepilot.experiments import Config
from tilepilot.kernels import get_family
from tilepilot.kernels.base import relative_error
from tilepilot.kernels.evaluate import Evaluator

Evaluator("interpret")  # TRITON_INTERPRET=1 before the kernel is imported
from tilepilot.kernels import fused_moe

f = get_family("fused_moe")
out = {}


def problem(m, e, topk, n, k):
    return f.parse_problem({"M": m, "E": e, "topk": topk, "N": n, "K": k, "dtype": "fp16"})


def config(bm, bn, bk, group=1, warps=4, stages=3):
    return Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": group,
                      "num_warps": warps, "num_stages": stages})


def run(p, c, inputs):
    assert f.space().check(c, p) is None, (p.label(), c.label(), f.space().check(c, p))
    y = f.make_output(p, inputs)
    y.fill_(float("nan"))
    f.launcher(p, c, inputs, y, None)()
    return f.error(p, y, f.reference(p, inputs)), int(y.isnan().sum())


# alignment: every (token, slot) pair once, in a block of its own expert; padding is M·topk
def check_alignment(ids, e, bm, rows):
    sorted_ids, expert_ids, post = fused_moe.align_block_size(ids, e, bm, rows)
    pairs, post = ids.numel(), int(post)
    real = sorted_ids[:post]
    flat = ids.reshape(-1)
    ok = post % bm == 0 and post <= rows and bool((sorted_ids[post:] == pairs).all())
    ok &= sorted(real[real < pairs].tolist()) == list(range(pairs))
    blocks = real.view(-1, bm)
    for b in range(post // bm):
        members = blocks[b][blocks[b] < pairs].long()
        ok &= members.numel() > 0 and bool((flat[members] == expert_ids[b]).all())
    counts = torch.bincount(flat, minlength=e)
    ok &= post == int(((counts + bm - 1) // bm * bm).sum())
    ok &= set(expert_ids[: post // bm].tolist()) == set(torch.nonzero(counts).flatten().tolist())
    return ok


checks = []
for seed, (m, e, topk) in enumerate([(1, 8, 2), (5, 4, 2), (33, 8, 3), (100, 64, 6), (7, 4, 4), (9, 16, 1)]):
    p = problem(m, e, topk, 32, 32)
    _, _, logits = f.make_inputs(p, seed, "cpu")
    ids = fused_moe.route(logits, topk)
    distinct = all(len(set(row)) == topk for row in ids.tolist())
    for bm in (16, 64, 128):
        checks.append(distinct and check_alignment(ids, e, bm, fused_moe.padded_rows(p, bm)))
out["alignment"] = checks

# the kernel against the reference: ragged M, masked tiles (N = 40 and K = 72 are no tile multiple)
ragged = {}
for m, e, topk, c in [(1, 8, 2, config(16, 32, 32)), (3, 8, 2, config(64, 64, 64, 8, 8, 4)),
                      (17, 4, 3, config(16, 64, 32, 8, 4, 4)), (33, 8, 2, config(64, 32, 64, 1, 4, 3)),
                      (33, 8, 1, config(16, 32, 64, 8, 4, 3)), (6, 4, 4, config(16, 64, 128, 1, 8, 3))]:
    p = problem(m, e, topk, 40, 72)
    ragged[p.label() + " " + c.label()] = run(p, c, f.make_inputs(p, m, "cpu"))
out["ragged"] = ragged
out["tolerance"] = f.tolerance(problem(1, 8, 2, 40, 72))

# experts that receive no tokens: logits push every token to experts 2 and 5 (of 8)
p = problem(12, 8, 2, 40, 72)
a, b, logits = f.make_inputs(p, 0, "cpu")
logits[:, [2, 5]] += 100.0
_, expert_ids, post = fused_moe.align_block_size(fused_moe.route(logits, 2), 8, 16, fused_moe.padded_rows(p, 16))
out["few_experts"] = {"error": run(p, config(16, 32, 32, 8), (a, b, logits)),
                      "experts": sorted(set(expert_ids[: int(post) // 16].tolist()))}

# a wrong expert for one block is caught; so is one wrong row among many, which the global norm hides
p = problem(33, 8, 2, 40, 72)
inputs = f.make_inputs(p, 1, "cpu")
c = config(16, 32, 32)
align = fused_moe.align_block_size
def shifted(ids, e, bm, rows):
    sorted_ids, expert_ids, post = align(ids, e, bm, rows)
    expert_ids[0] = (expert_ids[0] + 1) % e
    return sorted_ids, expert_ids, post
fused_moe.align_block_size = shifted
out["shifted_expert"] = run(p, c, inputs)
fused_moe.align_block_size = align
ref = torch.randn((8192, 6, 64), generator=torch.Generator().manual_seed(0))
bad = ref + 1e-3 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
bad[7, 3] = ref[8, 3]
out["one_wrong_row"] = [fused_moe.row_error(bad, ref), relative_error(bad, ref)]

# the work model's expected experts hit against sampled routings
samples = {}
for m, e, topk in [(1, 64, 6), (4, 64, 6), (16, 64, 6), (3, 8, 2)]:
    p = problem(m, e, topk, 32, 32)
    g = torch.Generator().manual_seed(m)
    hits = [len(set(fused_moe.route(torch.randn((m, e), generator=g), topk).flatten().tolist())) for _ in range(3000)]
    samples[p.label()] = [sum(hits) / len(hits), fused_moe.expected_experts_hit(p)]
out["hits"] = samples

# the eager baseline computes what the kernel does
p = problem(17, 8, 2, 40, 72)
inputs = f.make_inputs(p, 2, "cpu")
y = f.make_output(p, inputs)
y.fill_(float("nan"))
f.baseline(p, inputs, y)()
out["baseline"] = f.error(p, y, f.reference(p, inputs))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def child() -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TRITON_INTERPRET", None)  # the Evaluator sets it itself, before the kernel import
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "child.py"  # a file: @triton.jit reads its source
        script.write_text(textwrap.dedent(CHILD))
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600,
                              check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_alignment_puts_each_pair_once_in_a_block_of_its_expert(child: dict[str, Any]) -> None:
    assert len(child["alignment"]) == 18 and all(child["alignment"])


def test_ragged_token_counts_and_masked_tiles_match_the_reference(child: dict[str, Any]) -> None:
    for label, (err, nans) in child["ragged"].items():
        assert nans == 0 and 0 <= err < child["tolerance"], (label, err)


def test_experts_without_tokens_get_no_block_and_the_rest_is_right(child: dict[str, Any]) -> None:
    err, nans = child["few_experts"]["error"]
    assert child["few_experts"]["experts"] == [2, 5]
    assert nans == 0 and err < child["tolerance"]


def test_a_block_computed_with_the_wrong_expert_is_caught(child: dict[str, Any]) -> None:
    err, nans = child["shifted_expert"]
    assert nans == 0 and err > 0.5


def test_per_row_error_catches_one_wrong_row_the_global_norm_hides(child: dict[str, Any]) -> None:
    row_err, global_err = child["one_wrong_row"]
    assert row_err > 1.0 and global_err < 1e-2  # 1 row in 49152: sqrt(2 / 49152) = 6e-3 over all of C


def test_expected_experts_hit_matches_sampled_routings(child: dict[str, Any]) -> None:
    for label, (sampled, formula) in child["hits"].items():
        assert sampled == pytest.approx(formula, rel=0.02), label


def test_eager_baseline_matches_the_reference(child: dict[str, Any]) -> None:
    assert 0 <= child["baseline"] < child["tolerance"]
