"""The whole loop on the CPU: campaign file → proposer → Ray worker → interpreter → SQLite."""

from __future__ import annotations

import sqlite3

from tilepilot.orchestrator.tune import TuneOptions, tune

CAMPAIGN = """
[campaign]
name = "cpu-loop"
kernel = "matmul_faults"
proposer = "random"
budget = 3
seed = 0

[space]
BLOCK_SIZE_M = [16, 32]
BLOCK_SIZE_N = [16, 32]
BLOCK_SIZE_K = [16, 32]
GROUP_SIZE_M = [4]
num_warps = [4]
num_stages = [2]
FAULT = ["none"]

# an illegal memory access, measured first: recorded as crashed, the campaign goes on
[[configs]]
BLOCK_SIZE_M = 16
BLOCK_SIZE_N = 16
BLOCK_SIZE_K = 16
GROUP_SIZE_M = 4
num_warps = 4
num_stages = 2
FAULT = "oob"

[[problems]]
M = 40
N = 24
K = 48
dtype = "fp16"
"""


def test_interpret_campaign_survives_a_crash_and_declares_a_winner(tmp_path, ray_session):
    toml = tmp_path / "c.toml"
    toml.write_text(CAMPAIGN)
    out = tune(TuneOptions(campaign=toml, backend="interpret", db=tmp_path / "t.db"))
    assert out.plan.backend == "interpret" and "interpreter" in out.device
    [winner] = out.winners
    con = sqlite3.connect(tmp_path / "t.db")
    try:
        statuses = dict(con.execute(
            "SELECT json_extract(e.config, '$.FAULT'), r.status FROM trials t "
            "JOIN experiments e ON e.key = t.experiment_key JOIN results r ON r.experiment_key = e.key "
            "WHERE json_extract(e.config, '$.FAULT') = 'oob'").fetchall())
        counts = dict(con.execute("SELECT r.status, COUNT(*) FROM results r GROUP BY 1").fetchall())
        queue = con.execute("SELECT state, worker FROM queue").fetchall()
        state = con.execute("SELECT state FROM campaigns").fetchone()[0]
        methods = {m for (m,) in con.execute("SELECT timing_method FROM results WHERE status = 'ok'")}
    finally:
        con.close()
    assert statuses == {"oob": "crashed"}
    assert counts == {"crashed": 1, "ok": 2}  # budget 3: the crash counts, two good configs
    assert all(s == "done" and w == "interpret-0" for s, w in queue)
    assert state == "finished"
    assert methods == {"cpu-wallclock"}  # CPU timings, labelled as such
    assert winner.median_ms > 0 and winner.baseline_ms is None
