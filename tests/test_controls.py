"""A person stays in charge: pause, resume and stop a running campaign; promote, drop and pin queue entries.

The campaigns run on the replay backend (SYNTHETIC timings, tests/replay_fixture.py) in a thread,
on an executor that hands batches back only when the test lets it (tests/gated_executor.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.cli_helpers import run as run_cli
from tests.gated_executor import DriverThread, read, wait_for
from tests.replay_fixture import write_campaign, write_dataset
from tilepilot.cli import main
from tilepilot.experiments import Config
from tilepilot.orchestrator.tune import TuneOptions, tune


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "matmul-synthetic.jsonl")


@pytest.fixture()
def campaign(tmp_path: Path) -> Path:
    return write_campaign(tmp_path / "c.toml", name="t", proposer="random", budget=12, extra="hypothesis_share = 0\n")


@pytest.fixture()
def running(tmp_path: Path, dataset: Path, campaign: Path):
    run = DriverThread(campaign, dataset, tmp_path / "t.db").start()
    wait_for(lambda: len(run.executor.submitted) == 1, what="the first batch")
    yield run
    run.close()


def control_events(run: DriverThread) -> list[dict]:
    return [d for _, d in run.events("control")]


def queued_ids(db: Path) -> list[int]:
    """Queued entries in the order they run (pinned first)."""
    return [i for (i,) in read(db, "SELECT id FROM queue WHERE state = 'queued' ORDER BY pinned DESC, "
                                   "priority DESC, id")]


def measured(db: Path) -> int:
    return read(db, "SELECT COUNT(*) FROM trials")[0][0]


def test_pause_dispatches_nothing_new_until_resumed(running, capsys):
    run, db = running, running.db
    code, out, err = run_cli(capsys, "pause", "t", "--db", db)
    assert code == 0 and "pause asked" in out, err
    wait_for(lambda: any(e["action"] == "pause" for e in control_events(run)), what="the pause")
    run.executor.release()  # what was running finishes
    wait_for(lambda: measured(db) == 4, what="the running batch")
    time.sleep(0.5)
    assert len(run.executor.submitted) == 1 and queued_ids(db)  # nothing new started, the queue waits
    code, out, _ = run_cli(capsys, "queue", "--db", db)
    assert code == 0 and "campaign t (running, paused by a person)" in out
    message, data = run.events("control")[0]
    assert message.startswith("paused by a person") and data["honoured"] and data["request"]
    code, out, _ = run_cli(capsys, "resume", "t", "--db", db)
    assert code == 0 and "resume asked" in out
    wait_for(lambda: any(e["action"] == "resume" for e in control_events(run)), what="the resume")
    run.executor.open()
    assert len(run.join()) == 2
    assert read(db, "SELECT state, control FROM campaigns") == [("finished", "")]
    assert measured(db) == 24


def test_stop_lets_running_work_finish_and_leaves_the_campaign_resumable(running, capsys, dataset, campaign):
    run, db = running, running.db
    code, out, err = run_cli(capsys, "stop", "t", "--db", db)
    assert code == 0 and "stop asked" in out, err
    wait_for(lambda: any(e["action"] == "stop" for e in control_events(run)), what="the stop")
    assert not run.driver.stopped  # the batch that runs is not abandoned
    run.executor.release()
    assert run.join() == [] and run.driver.stopped
    assert measured(db) == 4 and len(run.executor.submitted) == 1
    assert read(db, "SELECT state, control FROM campaigns") == [("interrupted", "")]
    assert read(db, "SELECT COUNT(*) FROM queue WHERE state IN ('compiling', 'running')") == [(0,)]
    (stopped,) = run.events("campaign_stopped")
    assert "stopped by a person after 4 trials" in stopped[0]
    run.store.close()
    out = tune(TuneOptions(campaign=campaign, backend="replay", dataset=dataset, db=db, resume=True))
    assert not out.stopped and len(out.winners) == 2
    keys = [k for (k,) in read(db, "SELECT experiment_key FROM trials")]
    assert len(keys) == len(set(keys)) == 24  # the budget spent in full, nothing measured twice


def test_promote_drop_and_pin_are_honoured_in_order_and_logged(running, capsys):
    run, db = running, running.db
    order = queued_ids(db)
    promote, drop, pin = order[-1], order[-2], order[-3]
    for action, qid in (("promote", promote), ("drop", drop), ("pin", pin)):
        code, out, err = run_cli(capsys, "queue", action, qid, "--db", db)
        assert code == 0 and f"queue entry {qid}" in out and f"{action} asked" in out, err
    wait_for(lambda: len(control_events(run)) == 3, what="the three requests")
    assert [(e["action"], e["queue_id"], e["honoured"]) for e in control_events(run)] == [
        ("promote", promote, True), ("drop", drop, True), ("pin", pin, True)]
    assert queued_ids(db)[:2] == [pin, promote]  # pinned first, then the promoted one
    assert read(db, "SELECT state, reason FROM queue WHERE id = ?", [drop]) == [("dropped", "dropped by a person")]
    code, out, _ = run_cli(capsys, "queue", "--db", db, "--json")
    listed = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in listed if r["state"] == "queued"][:2] == [pin, promote]
    assert next(r for r in listed if r["id"] == pin)["pinned"] and drop not in {r["id"] for r in listed}
    ((problem_key, config),) = read(db, "SELECT problem_key, config FROM queue WHERE id = ?", [drop])
    run.executor.open()
    run.join()
    second, third = run.executor.submitted[1:3]
    assert second.queue_ids[0] == pin  # the next batch starts with the pinned entry
    assert promote in second.queue_ids or third.queue_ids[0] == promote  # then the promoted one
    assert not [b for b in run.executor.submitted
                if b.problem.key() == problem_key and Config.of(json.loads(config)) in b.configs]  # never ran
    assert read(db, "SELECT state FROM campaigns") == [("finished",)]


def test_request_for_an_entry_that_started_is_answered_not_done(running):
    run = running
    started = run.executor.submitted[0].queue_ids[0]  # asked while it was queued; it started since
    run.store.add_request(run.campaign_id, "drop", queue_id=started)
    wait_for(lambda: control_events(run), what="the answer")
    (answer,) = run.events("control")
    assert answer[1]["honoured"] is False and "not done: it is running, not queued" in answer[0]
    run.executor.open()
    run.join()


def test_tune_prints_how_to_continue_a_stopped_campaign(tmp_path, dataset, campaign, capsys, monkeypatch):
    import tilepilot.cli as cli

    db = tmp_path / "s.db"

    def press_stop(self, progress):  # a person runs `tilepilot stop` after the first batch
        if progress.done == 4:
            assert main(["stop", "t", "--db", str(db)]) == 0

    monkeypatch.setattr(cli._ProgressBar, "__call__", press_stop)
    code, out, err = run_cli(capsys, "tune", campaign, "--backend", "replay", "--dataset", dataset, "--db", db)
    assert code == 0, err
    assert f"campaign t stopped by a person; continue it with: tilepilot tune {campaign} --db {db} --resume" in out
    assert read(db, "SELECT state FROM campaigns") == [("interrupted",)]


def test_control_mistakes_are_one_line_errors(tmp_path, dataset, campaign, capsys):
    db = tmp_path / "t.db"
    assert run_cli(capsys, "tune", campaign, "--backend", "replay", "--dataset", dataset, "--db", db)[0] == 0
    done_id = read(db, "SELECT MIN(id) FROM queue")[0][0]
    cases = [
        (("pause", "nope"), "no campaign 'nope' (known: t)"),
        (("stop", "t"), "campaign 't' is finished: there is nothing to stop"),
        (("resume", "t"), "campaign 't' is finished: there is nothing to resume"),
        (("queue", "drop", 9999), f"no queue entry 9999 in {db}"),
        (("queue", "pin", done_id), f"queue entry {done_id} is done, not queued: only a queued entry can be pinned"),
        (("queue", "promote", "x1"), "queue promote 'x1': an id is a whole number"),
        (("queue", "frob", 1), "unknown queue action 'frob' (allowed: promote, drop, pin, or none to list the queue)"),
        (("queue", "drop"), "queue drop needs the id of a queued entry"),
        (("queue", "--campaign", "nope"), "no campaign 'nope' (known: t)"),
    ]
    for argv, message in cases:
        code, out, err = run_cli(capsys, *argv, "--db", db)
        assert code == 2 and out == "", (argv, out)
        assert err.count("\n") == 1 and message in err, (argv, err)
    missing = tmp_path / "missing.db"
    code, _, err = run_cli(capsys, "pause", "t", "--db", missing)
    assert code == 2 and err.count("\n") == 1 and not missing.exists()
    code, _, err = run_cli(capsys, "queue", "pin", 1, "--db", missing)
    assert code == 2 and not missing.exists()


def test_resume_of_a_campaign_that_is_not_paused_says_so(tmp_path, dataset, campaign, capsys):
    db = tmp_path / "t.db"

    def interrupt(p):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tune(TuneOptions(campaign=campaign, backend="replay", dataset=dataset, db=db), on_progress=interrupt)
    code, _, err = run_cli(capsys, "resume", "t", "--db", db)
    assert code == 2 and "campaign 't' is not paused (it is interrupted; continue it with" in err
    code, _, err = run_cli(capsys, "stop", "t", "--db", db)
    assert code == 2 and "campaign 't' is interrupted already" in err
    code, out, _ = run_cli(capsys, "pause", "t", "--db", db)
    assert code == 0 and "the pause holds when it resumes" in out
    code, out, _ = run_cli(capsys, "queue", "--campaign", "t", "--db", db)
    assert code == 0 and "campaign t (interrupted, paused by a person)" in out
