"""The recorded H100 grids of the kernel families beyond matmul (data/replay/*-h100.jsonl.gz):
each is a full grid of its family's space over the issue's shapes, with the family's baseline, and
a replay campaign on it runs end to end and declares winners that are the recorded times."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tilepilot.experiments import DatasetError, Problem, Status
from tilepilot.kernels import get_family
from tilepilot.orchestrator.replay import DATA_DIR, ReplayDataset, default_dataset, load_dataset
from tilepilot.orchestrator.tune import TuneOptions, tune
from tilepilot.storage.queries import BestRow, best, open_db

# KERNEL-h100.jsonl.gz; matmul's (the tutorial's 162 configs, a subspace of its family's) and its
# variants' grids are checked in tests/test_kernels_matmul.py
RECORDED = sorted(p.name.split("-h100")[0] for p in DATA_DIR.glob("*-h100.jsonl.gz")
                  if "-variants-" not in p.name and p.name != "matmul-h100.jsonl.gz")


def test_the_issue_families_are_recorded() -> None:
    assert {"softmax", "rmsnorm", "layernorm", "silu_mul_fp8_quant"} <= set(RECORDED)


@pytest.mark.parametrize("kernel", RECORDED)
def test_each_recording_is_a_full_grid_of_at_least_four_problems_with_a_baseline(kernel: str) -> None:
    family = get_family(kernel)
    ds = load_dataset(default_dataset(kernel), family)
    assert len(ds.problems) >= 4
    space = list(family.space())
    for p in ds.problems:
        records = ds.records(p)
        assert set(records) == set(space), p.label()
        ok = [r for r in records.values() if r.median_ms is not None]
        assert len(ok) >= 10 and all(r.median_ms > 0 for r in ok)
        # every config the space rejects for this shape was recorded as invalid, never timed
        for c, r in records.items():
            assert (family.space().check(c, p) is None) == (r.status is not Status.INVALID), (p.label(), c.label())
        name, timing = ds.baseline(p) or ("", None)
        assert name == family.baseline_name and timing is not None and timing.median_ms > 0
        assert {r.env.device for r in ok} == {"NVIDIA H100 80GB HBM3"}


def replayed_winners(tmp_path: Path, campaign: str, ds: ReplayDataset) -> list[tuple[BestRow, Problem]]:
    """Run the replay campaign `campaign` (a campaign file's text, named "r") on `ds`: one winner
    per problem, each with its problem, whose recorded time it must be."""
    family = get_family(ds.kernel)
    (tmp_path / "c.toml").write_text(campaign)
    tune(TuneOptions(campaign=tmp_path / "c.toml", backend="replay", dataset=ds.path, db=tmp_path / "t.db"))
    with open_db(tmp_path / "t.db") as db:
        winners = best(db, campaign="r")
    assert len(winners) == len(ds.problems)
    out = []
    for w in winners:
        problem = next(p for p in ds.problems if p.key() == w.problem_key)
        assert w.median_ms == ds.records(problem)[family.space().parse(w.config)].median_ms
        out.append((w, problem))
    return out


@pytest.mark.parametrize("kernel", RECORDED)
def test_a_replay_campaign_on_each_recording_declares_the_recorded_winners(tmp_path: Path, kernel: str) -> None:
    ds = load_dataset(default_dataset(kernel), get_family(kernel))
    campaign = f'[campaign]\nname = "r"\nkernel = "{kernel}"\nproposer = "random"\nbudget = 12\nseed = 3\n'
    for w, problem in replayed_winners(tmp_path, campaign, ds):
        assert w.median_ms >= ds.optimum_ms(problem)
        assert w.baseline_ms == ds.baseline(problem)[1].median_ms


def test_a_gzip_dataset_and_its_plain_text_load_the_same(tmp_path: Path) -> None:
    path = default_dataset("softmax")
    plain = tmp_path / "softmax.jsonl"
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    a, b = load_dataset(path, get_family("softmax")), load_dataset(plain, get_family("softmax"))
    assert a.identity == b.identity and a.problems == b.problems


def test_a_truncated_gzip_dataset_is_a_dataset_error(tmp_path: Path) -> None:
    bad = tmp_path / "cut.jsonl.gz"
    bad.write_bytes(gzip.compress(json.dumps({"kernel": "softmax"}).encode() * 50)[:40])
    with pytest.raises(DatasetError, match="not valid gzip"):
        load_dataset(bad, get_family("softmax"))


def test_the_recorded_optimum_is_the_fastest_config_ties_going_to_the_first_key(tmp_path: Path) -> None:
    path = default_dataset("softmax")
    rows = [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines() if line.strip()]
    family = get_family("softmax")
    ds = load_dataset(path, family)
    problem = ds.problems[0]
    fastest = ds.optimum(problem)
    assert ds.records(problem)[fastest].median_ms == ds.optimum_ms(problem)
    # another config of the problem tied with the fastest: the first of the two by config key wins
    mine = [r for r in rows if "config" in r and family.parse_problem(r["problem"]) == problem
            and r.get("median_ms") is not None]
    other = next(r for r in mine if ds.space(family, problem).parse(r["config"]) != fastest)
    other["median_ms"] = ds.optimum_ms(problem)
    tied = tmp_path / "tied.jsonl"
    tied.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tds = load_dataset(tied, family)
    pair = {fastest, tds.space(family, problem).parse(other["config"])}
    assert tds.optimum(problem) == min(pair, key=lambda c: c.key())
    # a problem none of whose configs was timed has no optimum
    for r in rows:
        if "config" in r and family.parse_problem(r["problem"]) == problem:
            r["median_ms"], r["status"] = None, "compile_error"
    untimed = tmp_path / "untimed.jsonl"
    untimed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DatasetError, match=f"no config of {problem.label()} was timed"):
        load_dataset(untimed, family).optimum(problem)


def test_the_h200_matmul_recording_is_a_full_grid_of_problems_the_h100_grid_lacks(tmp_path: Path) -> None:
    family = get_family("matmul")
    h200 = load_dataset(DATA_DIR / "matmul-h200.jsonl.gz", family)
    h100 = load_dataset(default_dataset("matmul"), family)
    assert len(h200.problems) >= 6 and not set(h200.problems) & set(h100.problems)
    for p in h200.problems:
        records = h200.records(p)
        assert set(records) == set(h100.records(h100.problems[0])), p.label()  # the same 162 configs
        ok = [r for r in records.values() if r.median_ms is not None]
        assert len(ok) >= 100 and {r.env.device for r in ok} == {"NVIDIA H200"}
        name, timing = h200.baseline(p) or ("", None)
        assert name == family.baseline_name and timing is not None and timing.median_ms > 0
    campaign = '[campaign]\nname = "r"\nkernel = "matmul"\nproposer = "rules"\nbudget = 8\n'
    replayed_winners(tmp_path, campaign, h200)


def test_the_fresh_h100_matmul_recording_is_a_full_grid_of_problems_no_other_grid_holds(tmp_path: Path) -> None:
    # data/replay/matmul-h100-fresh.jsonl.gz: the hold-out that bench/search.py scores with the shipped
    # constants, so none of its problems may be one the constants were fitted on (the H100 grid) or
    # another hold-out holds (the H200 grid). The configs the register constraint refuses are recorded
    # as invalid, with the reason, not timed.
    family = get_family("matmul")
    # the default of a replay campaign stays the grid the constants were fitted on, although the
    # fresh grid's name sorts first
    assert default_dataset("matmul") == DATA_DIR / "matmul-h100.jsonl.gz"
    fresh = load_dataset(DATA_DIR / "matmul-h100-fresh.jsonl.gz", family)
    h100 = load_dataset(default_dataset("matmul"), family)
    h200 = load_dataset(DATA_DIR / "matmul-h200.jsonl.gz", family)
    assert len(fresh.problems) == 12 and not set(fresh.problems) & (set(h100.problems) | set(h200.problems))
    grid = set(h100.records(h100.problems[0]))
    for p in fresh.problems:
        records = fresh.records(p)
        assert set(records) == grid, p.label()
        ok = [r for r in records.values() if r.status is Status.OK]
        invalid = [r for r in records.values() if r.status is Status.INVALID]
        assert len(ok) + len(invalid) == len(grid) and len(ok) >= 90
        assert {r.env.device for r in ok} == {"NVIDIA H100 80GB HBM3"} and all(r.message for r in invalid)
        assert all(family.space().check(c, p) for c, r in records.items() if r.status is Status.INVALID)
        name, timing = fresh.baseline(p) or ("", None)
        assert name == family.baseline_name and timing is not None and timing.median_ms > 0
    campaign = '[campaign]\nname = "r"\nkernel = "matmul"\nbudget = 8\n'  # the default proposer
    replayed_winners(tmp_path, campaign, fresh)
