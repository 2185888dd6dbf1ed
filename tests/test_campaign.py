"""Campaign files: every mistake is one CampaignError line naming the bad key or value."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from tilepilot.experiments import CampaignError, InputError, Problem, load_campaign, parse_campaign


def _matmul_like(raw: Mapping[str, Any]) -> Problem:
    for k in ("M", "N", "K"):
        if not isinstance(raw.get(k), int) or raw[k] < 1:
            raise InputError(f"{k}={raw.get(k)!r} is not a positive integer")
    if raw.get("dtype") not in ("bf16", "fp16"):
        raise InputError(f"dtype={raw.get('dtype')!r} is not one of bf16, fp16")
    return Problem.of({k: raw[k] for k in ("M", "N", "K", "dtype")})


KERNELS = {"matmul": _matmul_like, "softmax": _matmul_like}
PROPOSERS = ["grid", "optuna", "random"]
GOOD = """
[campaign]
name = "llama-mlp"
kernel = "matmul"
proposer = "optuna"
budget = 40
seed = 0
[[problems]]
M = 4096
N = 4096
K = 4096
dtype = "bf16"
"""


def parse(text: str):
    return parse_campaign(text, kernels=KERNELS, proposers=PROPOSERS)


def test_good_campaign_loads():
    c = parse(GOOD)
    assert (c.name, c.kernel, c.proposer, c.budget, c.seed) == ("llama-mlp", "matmul", "optuna", 40, 0)
    assert c.problems == (Problem.of({"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"}),)
    assert c.source == GOOD


def test_proposer_defaults_to_optuna():
    c = parse(GOOD.replace('proposer = "optuna"\n', ""))
    assert c.proposer == "optuna"


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (('kernel = "matmul"', 'kernel = "matmull"'), "unknown kernel 'matmull' (known kernels: matmul, softmax)"),
        (('proposer = "optuna"', 'proposer = "bayes"'), "unknown proposer 'bayes' (known proposers: grid, optuna"),
        (("budget = 40", "budget = 0"), "campaign.budget=0 is not"),
        (("budget = 40", 'budget = "40"'), "campaign.budget='40' is not"),
        (("budget = 40", "budget = true"), "campaign.budget=True is not"),
        (("seed = 0", "seed = 1.5"), "campaign.seed=1.5 is not an integer"),
        (("seed = 0", "seed = -1"), "campaign.seed=-1 is not an integer from 0 to 4294967295"),
        (("seed = 0", "seed = 0\nhypothesis_share = 0.9"), "campaign.hypothesis_share=0.9 is not the share"),
        (("seed = 0", 'seed = 0\nhypothesis_share = "a lot"'), "campaign.hypothesis_share='a lot' is not"),
        (('name = "llama-mlp"', 'name = "a b;drop"'), "campaign.name='a b;drop' is not"),
        (('name = "llama-mlp"\n', ""), "missing campaign.name"),
        (("seed = 0", "seed = 0\nbudgett = 3"), "unknown key campaign.budgett (allowed: name, kernel"),
        (('dtype = "bf16"', 'dtype = "fp8"'), "problem 1: dtype='fp8' is not one of bf16, fp16"),
        (("M = 4096", "M = -1"), "problem 1: M=-1 is not a positive integer"),
        (("[[problems]]", "[[problem]]"), "unknown table 'problem' (allowed: campaign, problems, space, configs)"),
        (("[campaign]", "[campaign"), "not valid TOML"),
    ],
)
def test_bad_campaign_is_one_line_naming_the_value(edit, expected):
    with pytest.raises(CampaignError) as e:
        parse(GOOD.replace(*edit))
    msg = str(e.value)
    assert expected in msg
    assert "\n" not in msg


def test_missing_campaign_table():
    with pytest.raises(CampaignError, match=r"missing \[campaign\] table"):
        parse("[[problems]]\nM = 1\n")


def test_duplicate_problem_is_refused():
    text = GOOD + GOOD[GOOD.index("[[problems]]"):]
    with pytest.raises(CampaignError, match="listed twice"):
        parse(text)


def test_problems_may_be_omitted_for_replay():
    c = parse(GOOD[: GOOD.index("[[problems]]")])
    assert c.problems == ()


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(CampaignError, match="does not exist"):
        load_campaign(tmp_path / "nope.toml", kernels=KERNELS, proposers=PROPOSERS)
    bad = tmp_path / "bin.toml"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CampaignError, match="cannot be read"):
        load_campaign(bad, kernels=KERNELS, proposers=PROPOSERS)


def test_space_and_configs_tables_are_kept():
    text = GOOD + '\n[space]\nnum_warps = [4, 8]\n\n[[configs]]\nnum_warps = 4\nBLOCK_SIZE_M = 64\n'
    c = parse(text)
    assert c.space == (("num_warps", (4, 8)),)
    assert c.configs == ((("num_warps", 4), ("BLOCK_SIZE_M", 64)),)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("\n[space]\nnum_warps = []\n", "space.num_warps must be a non-empty list"),
        ("\n[space]\nnum_warps = 4\n", "space.num_warps must be a non-empty list"),
        ("\nconfigs = 3\n", "'configs' must be an array of tables"),
    ],
)
def test_bad_space_or_configs(extra, expected):
    text = extra + GOOD if extra.startswith("\nconfigs") else GOOD + extra
    with pytest.raises(CampaignError, match=expected):
        parse(text)


def test_space_narrowed_rejects_unknown_parameter_and_choice():
    from tilepilot.experiments import Param, SearchSpace

    space = SearchSpace((Param("num_warps", (2, 4, 8)), Param("num_stages", (2, 3))))
    assert space.narrowed({"num_warps": [4, 8]}).param("num_warps").choices == (4, 8)
    with pytest.raises(InputError, match=r"space.warps: unknown parameter \(allowed: num_warps, num_stages\)"):
        space.narrowed({"warps": [4]})
    with pytest.raises(InputError, match=r"space.num_warps: 16 is not one of \{2, 4, 8\}"):
        space.narrowed({"num_warps": [16]})


def test_valid_prunes_on_the_parameters_a_constraint_reads_and_keeps_the_order():
    from tilepilot.experiments import Param, Problem, SearchSpace, reads

    calls = {"tile": 0, "split": 0, "whole": 0}

    @reads("BLOCK", "num_warps")
    def tile(config, problem):
        calls["tile"] += 1
        return "too big" if config["BLOCK"] * config["num_warps"] > problem["limit"] else None

    @reads("SPLIT", "VARIANT")  # read in another order than the space's
    def split(config, problem):
        calls["split"] += 1
        return "no split" if config["VARIANT"] == "plain" and config["SPLIT"] != 1 else None

    def whole(config, problem):  # unmarked: decided on whole configs
        calls["whole"] += 1
        return "odd" if (config["BLOCK"] + config["SPLIT"]) % 3 == 0 else None

    params = (Param("BLOCK", (16, 32, 64, 128)), Param("num_warps", (2, 4, 8)), Param("VARIANT", ("plain", "split")),
              Param("SPLIT", (1, 2, 4)), Param("stages", (2, 3)))
    space = SearchSpace(params, (tile, split, whole))
    problem = Problem.of({"limit": 256})
    brute = [c for c in space if space.check(c, problem) is None]
    calls.update(tile=0, split=0, whole=0)
    assert space.valid(problem) == brute and 0 < len(brute) < space.size
    assert calls["tile"] == 4 * 3  # once per (BLOCK, num_warps), not once per config
    assert calls["split"] < space.size and calls["whole"] < space.size
    assert SearchSpace(()).valid(problem) == list(SearchSpace(()))  # no parameters: the one empty config
    assert SearchSpace((params[0], Param("none_left", ()))).valid(problem) == []
