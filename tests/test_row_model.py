"""The row model (`agents/row_model.py`) and the `rules` proposer on the row-wise families' spaces.

Timings here are SYNTHETIC (functions of the config written in this file) except where a test reads
a recorded grid of `data/replay/`, which it names.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.proposer_toys import ENV, drive
from tilepilot.agents.base import ProposerContext, SearchState
from tilepilot.agents.portfolio import MODEL_PRIOR, PortfolioProposer
from tilepilot.agents.roofline import H100_SXM
from tilepilot.agents.row_model import RowConstants, estimate_rows, row_space
from tilepilot.agents.rules import RulesProposer
from tilepilot.experiments import Config, Param, Problem, Result, SearchSpace, Status, Timing
from tilepilot.kernels import get_family
from tilepilot.kernels.rowwise import PARAMS, next_power_of_2
from tilepilot.orchestrator.replay import load_dataset

REPO = Path(__file__).resolve().parents[1]


def problem(rows: int, cols: int, dtype: str = "bf16") -> Problem:
    return Problem.of({"rows": rows, "cols": cols, "dtype": dtype})


def row_config(block: int, per_program: int, warps: int, stages: int) -> Config:
    return Config.of({"BLOCK_SIZE": block, "ROWS_PER_PROGRAM": per_program, "num_warps": warps,
                      "num_stages": stages})


def rules_for(kernel: str, p: Problem, budget: int = 21) -> RulesProposer:
    return RulesProposer(ProposerContext(kernel, p, get_family(kernel).space(), seed=0, budget=budget))


def timed(p: Problem, config: Config, ms: float) -> Result:
    t = Timing(median_ms=ms, p20_ms=ms, p80_ms=ms, min_ms=ms, reps=1, l2_flushed=False, method="replay")
    return Result(p, config, Status.OK, ENV, timing=t)


def test_only_a_row_wise_space_and_problem_are_modelled() -> None:
    softmax = get_family("softmax")
    assert row_space(set(softmax.space().names), problem(8, 1024))
    assert not row_space(set(softmax.space().names), Problem.of({"M": 8, "N": 8, "K": 8, "dtype": "bf16"}))
    toy = SearchSpace((Param("BLOCK_SIZE", (256, 512)), Param("num_warps", (4, 8))))
    assert not row_space(set(toy.names), problem(8, 1024))
    # a user's row-wise family with an element size the model does not know: no model, no error
    names = set(softmax.space().names)
    assert not row_space(names, problem(8, 1024, "fp8"))
    own = SearchSpace(PARAMS)  # the row-wise parameters without softmax's constraints
    fp8 = RulesProposer(ProposerContext("my_rows", problem(8, 1024, "fp8"), own, seed=0, budget=8))
    assert all("no tile model" in c.rationale for c in fp8.propose(SearchState(), 2))


@pytest.mark.parametrize("kernel", ["softmax", "rmsnorm", "layernorm"])
@pytest.mark.parametrize("rows,cols", [(1, 8192), (256, 4096), (4096, 1000), (16384, 16384)])
def test_the_first_pick_reads_each_row_in_one_block_of_the_least_power_of_two(kernel: str, rows: int,
                                                                             cols: int) -> None:
    first = rules_for(kernel, problem(rows, cols)).propose(SearchState(), 1)[0]
    assert first.config["BLOCK_SIZE"] == next_power_of_2(cols)
    assert first.predicted_ms is not None and first.predicted_ms > 0
    assert "the row in one block" in first.rationale and "hypothesis:" in first.rationale


def test_two_passes_stream_the_input_twice() -> None:
    big = problem(16384, 16384)  # 512 MiB: nothing of it stays in L2
    one = estimate_rows("softmax", big, row_config(16384, 1, 16, 1), H100_SXM)
    two = estimate_rows("softmax", big, row_config(4096, 1, 16, 1), H100_SXM)
    assert one.single_pass and not two.single_pass
    assert one.limit == "stream"
    assert two.stream_us == pytest.approx(1.5 * one.stream_us)  # 3 transfers of the matrix against 2
    assert two.predicted_ms > one.predicted_ms


def test_one_row_waits_on_latency_and_more_warps_share_its_values() -> None:
    row = problem(1, 8192)
    times = {w: estimate_rows("softmax", row, row_config(8192, 1, w, 1), H100_SXM) for w in (4, 8, 16)}
    assert all(e.limit == "latency" and e.programs == 1 for e in times.values())
    assert times[16].predicted_ms < times[8].predicted_ms < times[4].predicted_ms


def test_pipelining_divides_the_wait_of_each_load() -> None:
    p = problem(256, 32768)
    flat = estimate_rows("rmsnorm", p, row_config(4096, 1, 8, 1), H100_SXM)
    deep = estimate_rows("rmsnorm", p, row_config(4096, 1, 8, 4), H100_SXM)
    assert deep.latency_us < flat.latency_us


def test_registers_past_one_program_spill_and_cost() -> None:
    p = problem(4096, 4096)
    k = RowConstants()
    held = estimate_rows("softmax", p, row_config(4096, 1, 1, 1), H100_SXM, k)  # 128 values a thread
    assert held.regs > H100_SXM.max_regs_per_thread
    assert held.blocks_per_sm >= 1
    lean = estimate_rows("softmax", p, row_config(4096, 1, 4, 1), H100_SXM, k)  # 32 values a thread
    assert held.latency_us > lean.latency_us


def test_the_shared_memory_of_the_pipeline_bounds_the_resident_programs() -> None:
    p = problem(65536, 16384)  # two passes: x, the weight and the bias, 3 stages in flight of each
    deep = estimate_rows("layernorm", p, row_config(8192, 1, 8, 4), H100_SXM)
    assert deep.blocks_per_sm == H100_SXM.smem_per_sm // (3 * 8192 * 2 * 3) == 1
    flat = estimate_rows("layernorm", p, row_config(8192, 1, 8, 1), H100_SXM)
    assert flat.blocks_per_sm > deep.blocks_per_sm


def test_measurements_correct_the_row_model() -> None:
    # SYNTHETIC: configs with 4 warps run 3x faster than the model says, the rest as it says
    p = problem(4096, 8192)
    r = rules_for("softmax", p, budget=40)

    def answer(c: Config) -> Result:
        modelled = r.prior_ms(c)
        return timed(p, c, modelled / 3 if c["num_warps"] == 4 else modelled)

    state = drive(r, budget=12, answer=answer)
    best = state.best()
    assert best is not None and best.config["num_warps"] == 4


def test_rules_scores_row_configs_before_any_result_so_the_portfolio_gives_it_the_head_start() -> None:
    p = problem(2048, 2048)
    ctx = ProposerContext("layernorm", p, get_family("layernorm").space(), seed=0, budget=21)
    scores = RulesProposer(ctx).score([row_config(2048, 1, 8, 1)])
    assert scores[0][0] is not None and "row model" in scores[0][1]
    portfolio = PortfolioProposer(ctx)
    try:
        rules = next(m for m in portfolio.members if m.name == "rules")
        assert rules.prior == MODEL_PRIOR
    finally:
        portfolio.close()


@pytest.mark.parametrize("kernel", ["softmax", "rmsnorm", "layernorm"])
def test_on_the_recorded_h100_grids_five_percent_of_the_grid_reaches_two_percent(kernel: str) -> None:
    # data/replay/KERNEL-h100.jsonl.gz, the grids the row model was written against: 21 of 420 configs
    family = get_family(kernel)
    dataset = load_dataset(REPO / f"data/replay/{kernel}-h100.jsonl.gz", family)
    for p in dataset.problems:
        ctx = ProposerContext(kernel, p, dataset.space(family, p), seed=0, budget=21)
        r = RulesProposer(ctx)
        state = SearchState()
        for _ in range(6):
            for cand in r.propose(state, 4)[:21 - len(state.results)]:
                result = dataset.result(p, cand.config)
                state.results[cand.config] = result
                r.observe([result])
        times = [x.median_ms for x in state.results.values() if x.median_ms is not None]
        optimum = dataset.optimum_ms(p)
        assert optimum is not None and min(times) <= optimum * 1.02 + 1e-12, p.label()
        assert math.isfinite(min(times))


@pytest.mark.parametrize("script, where", [("rows_gpu_campaign.py", ["--db", "rows.db"]), ("rows_warm.py", [])])
@pytest.mark.parametrize("args, named", [
    (["--families", "softmax,matmul"], "--families 'softmax,matmul'"),
    (["--set", "h900"], "--set h900"),
    (["--budget", "0"], "--budget 0"),
])
def test_the_row_benchmarks_refuse_bad_input_in_one_line(tmp_path: Path, script: str, where: list[str],
                                                         args: list[str], named: str) -> None:
    paths = [str(tmp_path / w) if w.endswith(".db") else w for w in where]
    proc = subprocess.run([sys.executable, str(REPO / "bench" / script), *args, *paths,
                           "--out", str(tmp_path / "out.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in proc.stderr
    assert not list(tmp_path.iterdir())


# ---- the store corrects the row model --------------------------------------------------------------
def _four_warps_fast(kernel: str, p: Problem) -> dict[Config, float]:
    """SYNTHETIC results of `p`: the row model's time, 3x faster with 4 warps."""
    space = get_family(kernel).space()
    out = {}
    for c in space:
        if space.check(c, p) is None:
            e = estimate_rows(kernel, p, c, H100_SXM)
            out[c] = e.predicted_ms / (3.0 if c["num_warps"] == 4 else 1.0)
    return out


def test_a_row_problem_of_the_store_corrects_the_model_before_any_result() -> None:
    from tests.test_rules import History

    target, near = problem(4096, 8192), problem(2048, 8192)
    history = History({near: _four_warps_fast("softmax", near)})
    ctx = ProposerContext("softmax", target, get_family("softmax").space(), seed=0, budget=21, history=history)
    r = RulesProposer(ctx)
    first = r.propose(SearchState(), 4)
    assert all(c.config["num_warps"] == 4 for c in first)
    assert "model ×0.3" in first[0].rationale and "rows=2048 cols=8192" in first[0].rationale
    notes = r.drain_records().notes
    assert any("the nearest row-wise problem the store holds" in n for n in notes)
    cold = RulesProposer(ProposerContext("softmax", target, get_family("softmax").space(), seed=0, budget=21))
    assert not all(c.config["num_warps"] == 4 for c in cold.propose(SearchState(), 4))


def test_rows_that_need_two_passes_are_corrected_only_by_rows_that_do() -> None:
    from tests.test_rules import History

    long_rows, short_rows, other_long = problem(4096, 32768), problem(4096, 8192), problem(1024, 65536)
    history = History({short_rows: _four_warps_fast("rmsnorm", short_rows)})
    ctx = ProposerContext("rmsnorm", long_rows, get_family("rmsnorm").space(), seed=0, budget=21, history=history)
    r = RulesProposer(ctx)
    r.propose(SearchState(), 4)
    assert not r.drain_records().notes and history.asked == []
    history = History({short_rows: _four_warps_fast("rmsnorm", short_rows),
                       other_long: _four_warps_fast("rmsnorm", other_long)})
    ctx = ProposerContext("rmsnorm", long_rows, get_family("rmsnorm").space(), seed=0, budget=21, history=history)
    r = RulesProposer(ctx)
    assert all(c.config["num_warps"] == 4 for c in r.propose(SearchState(), 4))
    assert history.asked == [other_long]
