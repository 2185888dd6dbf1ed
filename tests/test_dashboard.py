"""The dashboard's pages, run with Streamlit's AppTest on a store written through the Store API.

Timers do not fire in AppTest, so "live" here means: the store changes, the next run shows it.
The browser test (test_dashboard_browser.py) checks the in-place refresh of a real server.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests import dashboard_fixture as fx
from tilepilot.dashboard import data, launch, live, text
from tilepilot.experiments import InputError
from tilepilot.storage import Store, WinnerRow

APP = Path(__file__).resolve().parents[1] / "tilepilot" / "dashboard" / "app.py"
GPU_SOURCE = text.source("gpu", fx.DEVICE)
REPLAY_SOURCE = text.source("replay", fx.DEVICE)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "dash.db"
    fx.build(path).store.close()
    return path


def app(monkeypatch: pytest.MonkeyPatch, *args: str) -> AppTest:
    monkeypatch.setattr(sys, "argv", [str(APP), *args])
    return AppTest.from_file(str(APP), default_timeout=30)


def page(monkeypatch: pytest.MonkeyPatch, db: Path, screen: str | None = None) -> AppTest:
    at = app(monkeypatch, "--db", str(db)).run()
    if screen is not None:
        at.switch_page(f"screens/{screen}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def frames(at: AppTest) -> list:
    return [d.value for d in at.dataframe]


def texts(at: AppTest) -> list[str]:
    return [t.value for t in at.text]


# -- Overview ------------------------------------------------------------------------------------

def test_overview_shows_progress_state_and_best_of_the_running_campaign(monkeypatch, db):
    at = page(monkeypatch, db)
    assert at.title[0].value == "Overview"
    assert metrics(at) == {"Trials (done / budget)": "4/16", "OK": "3", "Failed": "1",
                           "Queued": "2", "Running": "1"}
    assert "mm-live · running" in at.subheader[0].value
    campaigns, problems = frames(at)
    assert list(campaigns["campaign"]) == ["mm-replay", "mm-live"]
    assert list(campaigns["progress"]) == ["2/4", "4/16"]
    assert list(campaigns["source"]) == [REPLAY_SOURCE, GPU_SOURCE]
    assert list(problems["trials done / budget"]) == ["3/8", "1/8"]
    assert list(problems["best so far (ms)"]) == [0.4321, 1.2345]
    assert problems["best config"][0] == "BLOCK_SIZE_M=128 BLOCK_SIZE_N=256 num_warps=8 num_stages=3"
    assert any(GPU_SOURCE in c.value for c in at.caption)


def test_overview_draws_one_convergence_chart_per_problem(monkeypatch, db):
    at = page(monkeypatch, db)
    assert len(at.get("vega_lite_chart")) == 2
    captions = [c.value for c in at.caption]
    assert "M=4096 N=4096 K=512 dtype=fp16 · best 0.4321 ms" in captions
    assert "M=64 N=8192 K=2048 dtype=bf16 · best 1.234 ms" in captions


def test_convergence_charts_put_time_on_a_log_axis(monkeypatch, db):
    charts = page(monkeypatch, db).get("vega_lite_chart")
    assert len(charts) == 2
    for chart in charts:
        spec = json.loads(chart.proto.spec)
        assert [layer["encoding"]["y"]["scale"]["type"] for layer in spec["layer"]] == ["log", "log"]


def test_overview_of_the_finished_replay_campaign_says_replay_and_its_winner(monkeypatch, db):
    at = page(monkeypatch, db)
    at.selectbox(key="overview_campaign").set_value(2).run()
    assert "mm-replay · finished" in at.subheader[0].value
    assert metrics(at)["Trials (done / budget)"] == "2/4"
    problems = frames(at)[1]
    assert list(problems["best so far (ms)"]) == [0.6543]
    assert list(problems["winner (ms)"]) == [0.6543]
    assert list(problems["winner"]) == ["decided"]
    assert any(REPLAY_SOURCE in c.value for c in at.caption)


def test_overview_keeps_the_fastest_trial_as_best_so_far_beside_the_re_measured_winner(monkeypatch, tmp_path):
    campaign = fx.build(tmp_path / "dash.db")
    key = fx.experiment_key(fx.KERNEL, fx.VERSION, fx.P1, fx.cfg(128, 256, 8), fx.GPU_ENV)
    campaign.store.set_winner(WinnerRow(campaign.campaign_id, fx.P1.key(), key, 0.4711, 0.01, None, None, None))
    problems = frames(page(monkeypatch, tmp_path / "dash.db"))[1]
    assert list(problems["best so far (ms)"]) == [0.4321, 1.2345]  # as the chart caption says
    assert problems["winner (ms)"].iloc[0] == 0.4711 and problems["winner (ms)"].isna().iloc[1]
    assert list(problems["winner"]) == ["decided", ""]


def test_overview_of_an_empty_store_says_how_to_start(monkeypatch, tmp_path):
    path = tmp_path / "empty.db"
    Store(path).close()
    at = page(monkeypatch, path)
    assert "No campaign in this database yet" in at.info[0].value


def test_overview_follows_the_store_as_the_campaign_advances(monkeypatch, tmp_path):
    campaign = fx.build(tmp_path / "dash.db")
    at = page(monkeypatch, tmp_path / "dash.db")
    assert metrics(at)["Trials (done / budget)"] == "4/16"
    campaign.trial(fx.ok(fx.P1, fx.cfg(64, 256, 4, 4), 0.3999))
    campaign.store.set_queue_state(campaign.queue_ids["p1-next"], "done", worker="gpu-0")
    campaign.store.set_campaign_state(campaign.campaign_id, "finished")
    time.sleep(data.TTL_S + 0.2)  # the cached queries expire
    at.run()
    assert metrics(at) == {"Trials (done / budget)": "5/16", "OK": "4", "Failed": "1",
                           "Queued": "2", "Running": "0"}
    assert list(frames(at)[1]["best so far (ms)"]) == [0.3999, 1.2345]
    assert "mm-live · finished" in at.subheader[0].value


# -- GPUs --------------------------------------------------------------------------------------

def test_gpus_page_shows_one_card_per_gpu_with_nvml_readings(monkeypatch, db):
    at = page(monkeypatch, db, "gpus")
    values = [(m.label, m.value) for m in at.metric]
    assert values[:5] == [("Utilisation", "91 %"), ("Memory (of 80 GiB)", "40.0 GiB"),
                          ("SM clock", "1755 MHz"), ("Power", "612 W"), ("Temperature", "71 °C")]
    assert values[5:] == [("Utilisation", "3 %"), ("Memory (of 80 GiB)", "1.0 GiB"), ("SM clock", "345 MHz"),
                          ("Power", "93 W"), ("Temperature", "38 °C")]
    shown = texts(at)
    assert "throttle: none" in shown and "throttle: sw_power_cap" in shown
    assert "worker: gpu-0   now: mm-live M=4096 N=4096 K=512 fp16" in shown
    assert "worker: gpu-1   now: idle" in shown
    assert any(t.startswith("queue: M=4096 N=4096 K=512 dtype=fp16 | BLOCK_SIZE_M=64") for t in shown)
    assert len(at.get("arrow_line_chart")) + len(at.get("vega_lite_chart")) == 2


def test_gpus_page_says_no_gpu_visible_without_samples(monkeypatch, tmp_path):
    fx.build(tmp_path / "dash.db", gpus=False).store.close()
    at = page(monkeypatch, tmp_path / "dash.db", "gpus")
    assert not at.metric
    assert at.info[0].value.startswith("No GPU visible")


def test_gpus_page_says_no_gpu_visible_when_samples_are_old(monkeypatch, tmp_path):
    campaign = fx.build(tmp_path / "dash.db", gpus=False)
    fx.add_gpu_samples(campaign.store, now=time.time() - 2 * data.GPU_WINDOW_S)
    at = page(monkeypatch, tmp_path / "dash.db", "gpus")
    assert at.info[0].value.startswith("No GPU visible")


# -- Queue -------------------------------------------------------------------------------------

def test_queue_page_shows_running_and_next_in_priority_order_with_reasons(monkeypatch, db):
    at = page(monkeypatch, db, "queue")
    running, nxt = frames(at)
    assert list(running["worker"]) == ["gpu-0"]
    assert list(running["predicted (ms)"]) == [0.418]
    assert list(nxt["#"]) == [1, 2]
    assert list(nxt["priority"]) == [1.75, 0.5]
    assert list(nxt["reason"]) == ["rule: N tiles", "exploration"]
    assert list(nxt["rationale"]) == ["wider N tile for a skinny problem", "TPE exploration"]
    assert set(nxt["source"]) == {GPU_SOURCE}
    assert [s.value for s in at.subheader] == ["Running (1)", "Next (2 queued)", "Recently done (0 in all)"]


def test_queue_page_moves_a_finished_row_to_recently_done(monkeypatch, tmp_path):
    campaign = fx.build(tmp_path / "dash.db")
    qid = campaign.queue_ids["p1-next"]
    key = campaign.trial(fx.ok(fx.P1, fx.cfg(64, 256, 4, 4), 0.3999))
    campaign.store.set_queue_state(qid, "done", experiment_key=key)
    at = page(monkeypatch, tmp_path / "dash.db", "queue")
    done = frames(at)[-1]
    assert list(done["result"]) == ["ok"]
    assert list(done["median (ms)"]) == [0.3999]
    assert list(done["source"]) == [GPU_SOURCE]
    assert [s.value for s in at.subheader] == ["Running (0)", "Next (2 queued)", "Recently done (1 in all)"]


# -- Experiments -------------------------------------------------------------------------------

def test_experiments_page_lists_every_trial_with_problem_config_and_source(monkeypatch, db):
    at = page(monkeypatch, db, "experiments")
    table = frames(at)[0]
    assert len(table) == 6
    row = table[table["status"] == "out_of_resources"].iloc[0]
    assert row["problem"] == "M=4096 N=4096 K=512 dtype=fp16"
    assert row["config"] == "BLOCK_SIZE_M=256 BLOCK_SIZE_N=256 num_warps=8 num_stages=5"
    assert row["message"] == "shared memory 262144 > 232448"
    assert set(table["source"]) == {GPU_SOURCE, REPLAY_SOURCE}
    assert sorted(table["median (ms)"].dropna()) == [0.4321, 0.5123, 0.6543, 0.7777, 1.2345]
    assert at.multiselect(key="experiments_status").proto.placeholder == "all statuses"  # none chosen: all


@pytest.mark.parametrize(("widget", "value", "expected"), [
    ("experiments_status", ["out_of_resources"], {"rules"}),
    ("experiments_proposer", "rules", {"rules"}),
    ("experiments_campaign", 2, {"grid"}),
])
def test_experiments_page_filters(monkeypatch, db, widget, value, expected):
    at = page(monkeypatch, db, "experiments")
    if widget == "experiments_status":
        at.multiselect(key=widget).set_value(value).run()
    else:
        at.selectbox(key=widget).set_value(value).run()
    table = frames(at)[0]
    assert set(table["proposer"]) == expected
    assert len(table) == {"experiments_status": 1, "experiments_proposer": 2, "experiments_campaign": 2}[widget]


def test_experiments_detail_shows_config_rationale_and_message(monkeypatch, db):
    at = page(monkeypatch, db, "experiments")
    at.multiselect(key="experiments_status").set_value(["out_of_resources"]).run()
    assert metrics(at)["Status"] == "out_of_resources"
    assert at.json[1].value == ('{"BLOCK_SIZE_M": 256, "BLOCK_SIZE_N": 256, "num_warps": 8, '
                                '"num_stages": 5}')
    assert "largest tile that fits" in texts(at)
    assert at.code[0].value == "shared memory 262144 > 232448"


# -- Log -----------------------------------------------------------------------------------------

def test_log_page_lists_events_newest_first_and_filters_by_kind(monkeypatch, db):
    at = page(monkeypatch, db, "log")
    table = frames(at)[0]
    assert table["kind"][0] == "campaign_finished"
    assert table["message"][0] == "mm-replay finished: 1 winner"
    assert len(table) == 6
    assert at.multiselect(key="log_kinds").proto.placeholder == "all kinds"
    at.multiselect(key="log_kinds").set_value(["campaign_started"]).run()
    table = frames(at)[0]
    assert list(table["message"]) == ["mm-live started on 1 GPU"]
    assert list(table["campaign"]) == ["mm-live"]
    assert list(table["source"]) == [GPU_SOURCE]


# -- Input and safety ----------------------------------------------------------------------------

def test_missing_database_gives_a_message_not_a_traceback(monkeypatch, tmp_path):
    missing = tmp_path / "nowhere.db"
    at = app(monkeypatch, "--db", str(missing)).run()
    assert not at.exception
    assert at.error[0].value == "The dashboard cannot open its database."
    assert texts(at) == [f"no tilepilot database at {str(missing)!r} (run `tilepilot tune` first or pass --db)"]
    assert not missing.exists()


def test_no_db_argument_gives_a_message(monkeypatch):
    at = app(monkeypatch).run()
    assert not at.exception
    assert "tilepilot dashboard --db PATH" in texts(at)[0]


def test_text_from_users_and_models_is_shown_as_text_never_markup(monkeypatch, db):
    at = page(monkeypatch, db)
    assert f"Synthetic campaign. {fx.HOSTILE}" in texts(at)
    at.switch_page("screens/experiments.py").run()
    at.selectbox(key="experiments_proposer").set_value("optuna").run()
    detail = at.selectbox(key="experiment_detail")
    hostile = next(k for k in detail.options if "num_warps=8" in k)
    detail.select(hostile).run()
    assert fx.HOSTILE in texts(at)
    markup = [m.value for m in (*at.markdown, *at.caption, *at.subheader, *at.title)]
    assert not any("<b" in m or "javascript:" in m for m in markup)


# -- Launch --------------------------------------------------------------------------------------

def test_server_command_binds_loopback_by_default():
    cmd = launch.command("x.db")
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--server.headless") + 1] == "true"
    assert cmd[cmd.index("--browser.gatherUsageStats") + 1] == "false"
    assert cmd[cmd.index("--client.toolbarMode") + 1] == "viewer"  # no Deploy button
    assert cmd[-3:] == ["--", "--db", "x.db"]
    assert cmd[1:4] == ["-m", "streamlit", "run"] and cmd[4].endswith("app.py")


def test_serve_refuses_a_missing_database_and_a_bad_port(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        launch.serve(str(tmp_path / "nowhere.db"))
    with pytest.raises(InputError, match="not a TCP port"):
        launch.command("x.db", port=70000)


def test_source_names_every_backend():
    assert text.source("gpu", "H100") == "gpu = measured on H100"
    assert text.source("interpret", "cpu") == "interpret = CPU timings (Triton interpreter)"
    assert text.source("replay", "H100") == "replay = recorded on H100"


def test_live_parts_refresh_fast_while_a_campaign_runs_and_slowly_otherwise():
    assert live.interval(live=True, running=True) == live.REFRESH == "2s"
    assert live.interval(live=True, running=False) == live.IDLE_REFRESH
    assert live.interval(live=False, running=True) is None
