"""bench/search.py on another family's recorded grid (`--kernel`), and its one-line refusals."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import search  # type: ignore[import-not-found]  # noqa: E402


@pytest.mark.parametrize(("argv", "message"), [
    (["--kernel", "nope", "--protocol", "shipped"], "unknown --kernel 'nope' (allowed: attention,"),
    (["--kernel", "softmax"], "--kernel softmax: only --protocol shipped"),
    (["--kernel", "softmax", "--protocol", "shipped", "--arm", "history"],
     "--kernel softmax: --arm history is for matmul (allowed here: --arm search or warm)"),
    (["--batch", "0"], "--batch 0: must be 1 or more"),
    (["--arm", "history", "--heads", "T,nope"], "unknown --heads 'nope' (allowed: warm, n, cc,"),
    (["--noise", "1.5"], "--noise 1.5: must be at least 0 and below 1"),
    (["--noise", "0.02", "--arm", "warm"], "--noise 0.02: only for --arm search"),
    (["--order-mark", "1.5", "--protocol", "shipped"], "--order-mark 1.5: must be from 0 to 1"),
    (["--order-mark", "0"], "--order-mark with --protocol lopo: only with --protocol shipped"),
])
def test_a_bad_kernel_or_protocol_is_one_line_and_exit_2(argv: list[str], message: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        search.main([*argv, "--out", str(tmp_path / "out.json")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "\n".join(err)
    assert not (tmp_path / "out.json").exists()


def test_another_family_is_searched_on_its_own_recorded_grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "KERNEL", "matmul")  # main sets the module's family: restored after the test
    out = tmp_path / "rmsnorm.json"
    assert search.main(["--kernel", "rmsnorm", "--protocol", "shipped", "--proposers", "random",
                        "--seeds", "1", "--jobs", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["kernel"] == "rmsnorm" and result["dataset"]["path"].endswith("rmsnorm-h100.jsonl.gz")
    regret = result["proposers"]["random"]["regret"]
    assert set(regret) == {str(b) for b in result["budgets"]}
    assert all(row["held_out"]["problems"] >= 4 for row in regret.values())


def test_the_history_arm_runs_the_store_heads_on_a_recorded_grid(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "KERNEL", "matmul")
    out = tmp_path / "history.json"
    assert search.main(["--arm", "history", "--protocol", "shipped", "--dataset",
                        str(REPO / "data/replay/matmul-h200.jsonl.gz"), "--heads", "T,Twarm,warmall",
                        "--seeds", "1", "--jobs", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["results"]["other-problems"]
    assert set(rows) == {"cold", "T", "Twarm", "warmall", "fixed-list"}
    for head in ("cold", "T", "Twarm", "warmall"):
        regret = rows[head]["regret"]
        assert regret["problems"] == 6 and 0 <= regret["problems_within_2pct_every_seed"] <= 6
        assert rows[head]["to_2pct"]["median"] >= 1


def test_campaign_replay_runs_the_driver_on_a_recorded_grid_and_scores_every_winner(tmp_path: Path) -> None:
    import campaign_replay  # type: ignore[import-not-found]

    from tests.replay_fixture import PROBLEMS, write_dataset

    dataset = write_dataset(tmp_path / "grid.jsonl")
    out = tmp_path / "r.json"
    assert campaign_replay.main(["--dataset", str(dataset), "--proposers", "rules", "--budget", "4",
                                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    (grid,) = report["grids"]
    assert grid["protocol"] == "shipped" and report["budget"] == 4
    (row,) = grid["proposers"]
    regrets = [p["regret"] for p in row["per_problem"].values()]
    assert row["problems"] == len(regrets) == len(PROBLEMS)
    assert all(r >= 0 for r in regrets) and row["within_2pct"] == sum(r <= 0.02 for r in regrets)


def test_campaign_replay_refuses_a_missing_dataset_in_one_line(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    import campaign_replay  # type: ignore[import-not-found]

    with pytest.raises(SystemExit) as e:
        campaign_replay.main(["--dataset", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "r.json")])
    assert e.value.code == 2
    assert "--dataset" in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "r.json").exists()


def test_noise_spreads_each_time_by_a_draw_of_the_seed_problem_and_config_and_the_winner_is_scored_by_its_recorded_time(
) -> None:
    from tilepilot.experiments import Config, Environment, Problem, Result, Status, Timing

    problem = Problem.of({"M": 64, "N": 64, "K": 64, "dtype": "fp16"})
    env = Environment(backend="replay", device="d", driver="", torch="", triton="")

    def result(bm: int, ms: float) -> Result:
        t = Timing(median_ms=ms, p20_ms=ms, p80_ms=ms, min_ms=ms, reps=1, l2_flushed=True, method="replay")
        return Result(problem, Config.of({"BLOCK_SIZE_M": bm}), Status.OK, env, timing=t)

    a, b = result(64, 1.0), result(128, 1.0)
    assert search.noisy(a, 0, 0.0) is a  # no noise: the recorded result
    assert search.noisy(a, 0, 0.05).median_ms == search.noisy(a, 0, 0.05).median_ms  # one draw a config
    draws = {search.noisy(r, s, 0.05).median_ms for r in (a, b) for s in range(5)}
    assert len(draws) == 10 and all(0.7 < d < 1.4 for d in draws)
    # the campaign declares the best it measured; its regret is that config's recorded time
    trace = search.Trace((a.config, b.config, a.config), (1.0, 0.9, 1.1), (1.0, 1.2, 0.8))
    assert search.declared(trace) == (1.0, 1.2, 1.2)



def test_several_history_datasets_are_one_store_whose_winners_queued_first_are_the_campaigns_devices(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "KERNEL", "matmul")
    data = REPO / "data/replay"
    fresh, h200 = data / "matmul-h100-fresh.jsonl.gz", data / "matmul-h200.jsonl.gz"
    history, source = search.load_history(f"{fresh},{h200}")
    assert history is not None and len(history.problems) == 12 + 6
    assert {source[q].path.name for q in history.problems} == {fresh.name, h200.name}
    assert set(history.devices) == {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    out = tmp_path / "stores.json"
    assert search.main(["--arm", "history", "--protocol", "shipped",
                        "--dataset", str(data / "matmul-h100-fresh2.jsonl.gz"), "--history",
                        f"{fresh},{h200}", "--heads", "T,Twarm,warm", "--seeds", "1", "--jobs", "1",
                        "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["results"]) == {"other-problems", search.STORES}
    rows = result["results"][search.STORES]
    assert set(rows) == {"cold", "T", "Twarm", "fixed-list"}  # the heads without the store's results: not here
    assert "of the campaign's device only" in result["scopes"][search.STORES]
    for head in ("cold", "T", "Twarm"):
        assert rows[head]["regret"]["problems"] == 16 and len(rows[head]["to_2pct_per_problem"]) == 16


@pytest.mark.parametrize(("history", "message"), [
    ("matmul-h100-fresh.jsonl.gz", "holds M=2048 N=14336 K=4096 bf16 of --dataset"),
    ("matmul-h200.jsonl.gz,matmul-h200.jsonl.gz", "M=1 N=6144 K=4096 bf16 is in both matmul-h200.jsonl.gz and "
                                                  "matmul-h200.jsonl.gz"),
])
def test_a_history_holding_a_problem_twice_is_refused_in_one_line(history: str, message: str, tmp_path: Path) -> None:
    import subprocess

    data = REPO / "data/replay"
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench/search.py"), "--arm", "history", "--protocol", "shipped",
                           "--dataset", str(data / "matmul-h100-fresh.jsonl.gz"), "--heads", "T",
                           "--history", ",".join(str(data / h) for h in history.split(",")), "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and message in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_the_shipped_protocol_scores_the_model_with_the_order_mark_asked_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "ORDER_MARK", None)  # main sets it: restored after the test
    grid = str(REPO / "data/replay/matmul-h200-rerecord-shuffled.jsonl.gz")
    marks = {}
    for argv in ([], ["--order-mark", "0"]):
        out = tmp_path / f"s{len(argv)}.json"
        assert search.main(["--dataset", grid, "--protocol", "shipped", "--proposers", "rules", "--seeds", "1",
                            "--jobs", "1", "--out", str(out), *argv]) == 0
        result = json.loads(out.read_text())
        marks[result["order_mark"]] = {c["order_mark"] for c in result["rules_constants"].values()}
    assert marks == {1.0: {1.0}, 0.0: {0.0}}
