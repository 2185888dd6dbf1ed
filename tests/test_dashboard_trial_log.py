"""The dashboard's shared trial log: new trials at once, results replaced in place after a reload
that runs in the background (no reader waits for it), and the server's warm-up read."""

from __future__ import annotations

import threading
from pathlib import Path

from tests import dashboard_fixture as fx
from tilepilot.dashboard import reads, server
from tilepilot.dashboard.trial_log import FULL_RELOAD_S, TrialLog


def medians(log: TrialLog, db: reads.DashboardDB, campaign_id: int, now: float) -> list[float | None]:
    return [p.median_ms for p in log.read(db, now=now)[campaign_id]]


def test_trial_log_shows_new_trials_at_once_and_a_replaced_result_after_a_background_reload(tmp_path: Path):
    live = fx.build(tmp_path / "dash.db")
    db = reads.open_db(tmp_path / "dash.db")
    log = TrialLog()
    assert medians(log, db, live.campaign_id, now=0.0) == [0.5123, 0.4321, None, 1.2345]

    live.trial(fx.ok(fx.P2, fx.cfg(32, 64), 1.5))  # a new trial: read at the next refresh
    assert medians(log, db, live.campaign_id, now=1.0)[-1] == 1.5

    again = fx.ok(fx.P1, fx.cfg(128, 128), 0.4999)  # the same experiment measured again: replaced in place
    key = fx.experiment_key(fx.KERNEL, fx.VERSION, again.problem, again.config, again.env)
    live.store.record_result(again, key=key, kernel=fx.KERNEL, kernel_version=fx.VERSION)
    assert medians(log, db, live.campaign_id, now=2.0)[0] == 0.5123  # trials only grow: not seen yet

    go_on = threading.Event()
    real = reads.all_trials

    def slow_all_trials(handle: reads.DashboardDB) -> tuple[dict[int, list[reads.TrialPoint]], int]:
        if not go_on.wait(timeout=10):  # the reload waits here until the test lets it go on
            raise AssertionError("the reload ran in the reader's thread: the reader waited for it")
        return real(handle)

    reads.all_trials = slow_all_trials  # type: ignore[assignment]
    try:
        later = FULL_RELOAD_S + 10
        assert medians(log, db, live.campaign_id, now=later)[0] == 0.5123  # answered at once, reload started
        live.trial(fx.ok(fx.P2, fx.cfg(16, 64), 1.75))  # written while the reload runs
        assert medians(log, db, live.campaign_id, now=later + 1)[-1] == 1.75
        go_on.set()
        log.wait_for_reload(timeout=30)
    finally:
        reads.all_trials = real  # type: ignore[assignment]
    after = medians(log, db, live.campaign_id, now=later + 2)
    assert after == [0.4999, 0.4321, None, 1.2345, 1.5, 1.75]  # the replaced result, and no trial twice or lost


def test_server_warm_up_fills_the_trial_log_the_pages_use(tmp_path: Path):
    from tilepilot.dashboard import data

    live = fx.build(tmp_path / "dash.db")
    data.trial_log.clear()
    server.warm(str(tmp_path / "dash.db"))
    path = str((tmp_path / "dash.db").resolve())
    assert data.trial_log(path)._loaded_at is not None  # read by the warm-up
    assert [p.median_ms for p in data.trials(path, live.campaign_id)] == [0.5123, 0.4321, None, 1.2345]


def test_server_warm_up_of_a_missing_store_reads_nothing_and_raises_nothing(tmp_path: Path):
    server.warm(str(tmp_path / "nowhere.db"))
    assert not (tmp_path / "nowhere.db").exists()
