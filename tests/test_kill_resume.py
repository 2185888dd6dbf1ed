"""`tilepilot tune` killed with SIGKILL at random points, then resumed: every config measured
once, every budget spent exactly, nothing left running, and (grid proposer) the same results
as a run that was never interrupted.

SYNTHETIC data: the timings come from a formula, not from a GPU (see tests/replay_fixture.py).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBLEMS = [
    {"M": 512, "N": 512, "K": 512, "dtype": "fp16"},
    {"M": 1024, "N": 256, "K": 2048, "dtype": "bf16"},
    {"M": 64, "N": 4096, "K": 1024, "dtype": "fp16"},
    {"M": 2048, "N": 2048, "K": 128, "dtype": "bf16"},
]
GRID = {  # 384 configs per problem, 380 of them within the shared-memory limit
    "BLOCK_SIZE_M": (32, 64, 128, 256),
    "BLOCK_SIZE_N": (32, 64, 128, 256),
    "BLOCK_SIZE_K": (32, 64),
    "GROUP_SIZE_M": (1, 8),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4),
}
BUDGET = 200
TOTAL = BUDGET * len(PROBLEMS)
REPEATS = 10


def synthetic(problem: dict, config: dict) -> tuple[str, float | None]:
    """A status and a time that are the same in every process; every ok time is distinct."""
    digest = hashlib.sha256(json.dumps([problem, config], sort_keys=True).encode()).digest()
    h = int.from_bytes(digest[:4], "big")
    if h % 11 == 0:
        return "out_of_resources", None
    return "ok", round(0.01 + (h % 1_000_000) * 1e-7 + config["BLOCK_SIZE_M"] / problem["M"] * 1e-3, 9)


def write_big_dataset(path: Path) -> Path:
    lines = []
    for problem in PROBLEMS:
        for values in itertools.product(*GRID.values()):
            config = dict(zip(GRID, values, strict=True))
            status, median = synthetic(problem, config)
            lines.append(json.dumps({"kernel": "matmul", "problem": problem, "config": config, "status": status,
                                     "median_ms": median, "device": "synthetic device", "torch": "0.0",
                                     "triton": "0.0", "message": "synthetic" if median is None else ""}))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_campaign(path: Path, proposer: str) -> Path:
    path.write_text(f'[campaign]\nname = "kr"\nkernel = "matmul"\nproposer = "{proposer}"\n'
                    f"budget = {BUDGET}\nseed = 7\n"
                    # hypothesis experiments are drawn from the results seen so far, so a resumed
                    # run draws other pairs; off here, so that the grid run can be compared with
                    # one never killed (tests/test_hypotheses.py covers a resumed ledger)
                    "hypothesis_share = 0\n")
    return path


def tune_cmd(campaign: Path, dataset: Path, db: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tilepilot", "tune", str(campaign), "--backend", "replay",
            "--dataset", str(dataset), "--db", str(db), *extra]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def query(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def trial_count(db: Path) -> int:
    """Trials in the db so far (0 while the file or its schema does not exist yet)."""
    if not db.exists():
        return 0
    try:
        return int(query(db, "SELECT COUNT(*) FROM trials")[0][0])
    except sqlite3.OperationalError:  # no schema yet, or the writer holds a lock for a moment
        return 0


def kill_after(proc: subprocess.Popen[bytes], db: Path, at_least: int, extra_s: float) -> int:
    """SIGKILL the run once `at_least` trials are in the db (plus `extra_s`); returns the trials then."""
    deadline = time.monotonic() + 60
    while trial_count(db) < at_least:
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before {at_least} trials"
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.005)
    time.sleep(extra_s)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL, "the run finished before it was killed"
    return trial_count(db)


# ---- what the db must hold after a campaign finished ---------------------------------------------
def trials_by_problem(db: Path) -> dict[str, list[tuple]]:
    rows = query(db, "SELECT t.problem_key, e.config_key, t.seq, t.reused, r.status, r.median_ms, t.experiment_key "
                     "FROM trials t JOIN experiments e ON e.key = t.experiment_key "
                     "JOIN results r ON r.experiment_key = t.experiment_key ORDER BY t.id")
    out: dict[str, list[tuple]] = {}
    for r in rows:
        out.setdefault(r[0], []).append(r[1:])
    return out


def check_finished_campaign(db: Path) -> None:
    assert query(db, "SELECT name, state FROM campaigns") == [("kr", "finished")]
    by_problem = trials_by_problem(db)
    assert len(by_problem) == len(PROBLEMS)
    for problem_key, trials in by_problem.items():
        configs = [t[0] for t in trials]
        assert len(configs) == len(set(configs)), f"{problem_key}: a config was tried twice"
        assert sorted(t[1] for t in trials) == list(range(1, len(trials) + 1)), f"{problem_key}: seq has gaps"
        assert sum(t[3] != "invalid" for t in trials) == BUDGET, f"{problem_key}: budget not spent exactly"
        assert not any(t[2] for t in trials), f"{problem_key}: a trial reused a result nobody tried"
    keys = [k for (k,) in query(db, "SELECT experiment_key FROM trials")]
    assert len(keys) == len(set(keys)) == TOTAL
    assert query(db, "SELECT COUNT(*) FROM results")[0][0] == TOTAL
    assert query(db, "SELECT COUNT(*) FROM experiments")[0][0] == TOTAL
    assert query(db, "SELECT state, COUNT(*) FROM queue WHERE state NOT IN ('done', 'dropped') GROUP BY state") == []
    done = [k for (k,) in query(db, "SELECT experiment_key FROM queue WHERE state = 'done'")]
    assert len(done) == len(set(done)) and set(done) == set(keys)
    winners = dict(query(db, "SELECT problem_key, median_ms FROM winners"))
    assert set(winners) == set(by_problem)
    for problem_key, trials in by_problem.items():
        assert winners[problem_key] == min(t[4] for t in trials if t[3] == "ok")


def outcome(db: Path) -> tuple[set[tuple[str, str, str]], set[tuple]]:
    tried = {(p, t[0], t[3]) for p, trials in trials_by_problem(db).items() for t in trials}
    winners = set(query(db, "SELECT problem_key, experiment_key, median_ms FROM winners"))
    return tried, winners


# ---- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kill")
    paths = {"root": root, "dataset": write_big_dataset(root / "big.jsonl"),
             "grid": write_campaign(root / "grid.toml", "grid"),
             "random": write_campaign(root / "random.toml", "random")}
    reference = root / "reference.db"
    done = subprocess.run(tune_cmd(paths["grid"], paths["dataset"], reference), capture_output=True, env=env(),
                          timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    check_finished_campaign(reference)
    paths["reference"] = reference
    return paths


# ---- the test ------------------------------------------------------------------------------------
@pytest.mark.parametrize("rep", range(REPEATS))
def test_kill_9_then_resume_tries_every_config_once(rep: int, big: dict[str, Path], tmp_path: Path) -> None:
    rng = random.Random(rep)
    proposer = "random" if rep % 3 == 2 else "grid"
    campaign, dataset, db = big[proposer], big["dataset"], tmp_path / "kr.db"
    kills = 2 if rep % 4 == 3 else 1  # some runs are killed again while resuming
    # spread the kill points over the run: from the first trials to nine tenths of them
    points = [max(1, int(TOTAL * (0.02 + 0.8 * (rep + rng.random()) / REPEATS)))]
    if kills == 2:
        points.append(points[0] + rng.randint(20, 100))
    resume: tuple[str, ...] = ()
    for at_least in points:
        proc = subprocess.Popen(tune_cmd(campaign, dataset, db, *resume), env=env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seen = kill_after(proc, db, at_least, rng.uniform(0, 0.03))
        assert 0 < seen < TOTAL
        resume = ("--resume",)
    assert query(db, "SELECT state FROM campaigns") == [("running",)]  # a kill -9 leaves no trace

    finished = subprocess.run(tune_cmd(campaign, dataset, db, "--resume"), capture_output=True, env=env(),
                              timeout=120)
    assert finished.returncode == 0, finished.stderr.decode()
    assert b"Traceback" not in finished.stderr
    check_finished_campaign(db)
    if proposer == "grid":  # deterministic: the same configs, results and winners as the run never killed
        assert outcome(db) == outcome(big["reference"])
