"""The dashboard's pages, run with Streamlit's AppTest on a store written through the Store API.

Timers do not fire in AppTest, so "live" here means: the store changes, the next run shows it.
The browser test (test_dashboard_browser.py) checks the in-place refresh of a real server.
"""

from __future__ import annotations

import json
import sqlite3
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


def frame_with(at: AppTest, *columns: str):
    """The first table of the page that has every one of `columns`."""
    found = [f for f in frames(at) if set(columns) <= set(f.columns)]
    assert found, f"no table has the columns {columns}"
    return found[0]


PAST = ("measured", "status")  # the Experiments page's table of past experiments


# -- Overview ------------------------------------------------------------------------------------

def charts_of(at: AppTest, field: str) -> list[dict]:
    """The specs of the page's charts that encode `field` somewhere."""
    return [spec for spec in (json.loads(c.proto.spec) for c in at.get("vega_lite_chart")) if field in json.dumps(spec)]


def chart_tables(at: AppTest) -> list:
    """Every data set of every chart on the page."""
    from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
    tables = []
    for c in at.get("vega_lite_chart"):
        if c.proto.HasField("data") and c.proto.data.data:  # a frame given with a spec (st.vega_lite_chart)
            tables.append(convert_arrow_bytes_to_pandas_df(c.proto.data.data))
        tables.extend(convert_arrow_bytes_to_pandas_df(d.data.data) for d in c.proto.datasets)
    return tables


def chart_data(at: AppTest, field: str):
    """The data set of the first chart that has a column `field`."""
    found = [t for t in chart_tables(at) if field in t.columns]
    assert found, f"no chart data has a column {field!r}"
    return found[0]


def bound_ms(problem) -> float:
    """The roofline time bound of a fixture problem on the fixture's ceilings, from the family's work model."""
    from tilepilot.kernels.registry import get_family
    w = get_family(fx.KERNEL).work(problem)
    return max(w.flops / (fx.CEILINGS.matmul_tflops * 1e12), w.bytes / (fx.CEILINGS.copy_gbps * 1e9)) * 1e3


def test_overview_shows_progress_state_and_best_of_the_running_campaign(monkeypatch, db):
    at = page(monkeypatch, db)
    assert at.title[0].value == "Overview"
    assert list(metrics(at).items())[:5] == [("Trials (done / budget)", "4/16"), ("OK", "3"), ("Failed", "1"),
                                             ("Queued", "2"), ("Running", "2")]
    assert "mm-live · running" in at.subheader[0].value
    campaigns, problems = frames(at)
    assert list(campaigns["campaign"]) == ["mm-replay", "mm-live"]
    assert list(campaigns["progress"]) == ["2/4", "4/16"]
    assert list(campaigns["source"]) == [REPLAY_SOURCE, GPU_SOURCE]
    assert list(problems["trials done / budget"]) == ["3/8", "1/8"]
    assert list(problems["best so far (ms)"]) == [0.4321, 1.2345]
    assert problems["best config"][0] == "BLOCK_SIZE_M=128 BLOCK_SIZE_N=256 num_warps=8 num_stages=3"
    assert list(problems["proposer of best"]) == ["optuna", "rules"]
    assert any(GPU_SOURCE in c.value for c in at.caption)


def test_overview_shows_speedups_roofline_share_gpu_time_and_model_spend(monkeypatch, db):
    at = page(monkeypatch, db)
    campaigns, problems = frames(at)
    replay, live_ = campaigns.iloc[0], campaigns.iloc[1]
    assert replay["× vs median (geomean)"] == pytest.approx(((0.7777 + 0.6543) / 2) / 0.6543)
    assert replay["× vs baseline (geomean)"] == pytest.approx(0.5888 / 0.6543)
    assert replay["% of roofline (median)"] == pytest.approx(100 * bound_ms(fx.P1) / 0.6543)
    assert replay["GPU time"] == "0.143 s"  # recorded at its end: 100 repetitions × (0.7777 + 0.6543) ms
    assert (replay["LLM tokens (in / out)"], replay["LLM cost"], replay["ETA"]) == ("none", "—", "—")
    assert live_["GPU time"] == "0.227 s"  # summed: 52.5 ms timed + 100 × 0.5123 + 100 × 1.2345 ms
    assert (live_["LLM tokens (in / out)"], live_["LLM cost"]) == ("8k / 1.3k", "$0.0270 (+1 unpriced)")
    assert live_["ETA"].startswith("≈ ")
    assert list(problems["% of roofline"]) == pytest.approx([100 * bound_ms(fx.P1) / 0.4321,
                                                             100 * bound_ms(fx.P2) / 1.2345])
    assert problems["× vs median config"][0] == pytest.approx(((0.5123 + 0.4321) / 2) / 0.4321)
    assert problems["× vs baseline"].isna().all()  # no winner decided yet
    m = metrics(at)
    assert (m["GPU time"], m["LLM tokens (in / out)"], m["LLM cost"]) == ("0.227 s", "8k / 1.3k",
                                                                          "$0.0270 (+1 unpriced)")
    assert m["ETA"].startswith("≈ ") and m["Compile time"] == "2.44 s"  # 3 × 812.5 ms
    assert any(c.value.startswith("% of roofline against the ceilings of Synthetic GPU 80GB") and "copy 2000 GB/s" in
               c.value and "bf16 matmul 500 TFLOP/s" in c.value for c in at.caption)


def test_overview_of_the_finished_replay_campaign_says_replay_its_winner_and_the_baseline(monkeypatch, db):
    at = page(monkeypatch, db)
    at.selectbox(key="overview_campaign").set_value(2).run()
    assert "mm-replay · finished" in at.subheader[0].value
    assert metrics(at)["Trials (done / budget)"] == "2/4"
    assert metrics(at)["ETA"] == "—"
    problems = frames(at)[1]
    assert list(problems["best so far (ms)"]) == [0.6543]
    assert list(problems["winner (ms)"]) == [0.6543]
    assert list(problems["winner"]) == ["decided"]
    assert list(problems["baseline"]) == [fx.BASELINE]
    assert problems["× vs baseline"][0] == pytest.approx(0.5888 / 0.6543)
    assert any(REPLAY_SOURCE in c.value for c in at.caption)


def test_overview_shows_no_roofline_share_without_stored_ceilings(monkeypatch, tmp_path):
    live_ = fx.build(tmp_path / "dash.db")
    live_.store.db.execute("DELETE FROM devices")  # a store whose device was never measured
    live_.store.db.conn.commit()
    at = page(monkeypatch, tmp_path / "dash.db")
    campaigns, problems = frames(at)
    assert problems["% of roofline"].isna().all() and campaigns["% of roofline (median)"].isna().all()
    assert any(c.value.startswith("% of roofline: — (no ceilings stored for Synthetic GPU 80GB") for c in at.caption)
    assert len(charts_of(at, "FLOP per byte")) == 1  # the results are drawn, with no roofline:
    assert not [t for t in chart_tables(at) if "note" in t.columns]


def test_overview_draws_a_convergence_panel_per_problem(monkeypatch, db):
    at = page(monkeypatch, db)
    assert len(charts_of(at, "best_so_far_ms")) == 1  # one chart, a panel per problem
    panels = chart_data(at, "best_so_far_ms")
    assert list(dict.fromkeys(panels["panel"])) == ["M=4096 N=4096 K=512 dtype=fp16 · best 0.4321 ms",
                                                    "M=64 N=8192 K=2048 dtype=bf16 · best 1.234 ms"]
    p1 = panels[panels["order"] == 0]
    assert list(p1["trial"]) == [1, 2, 3] and list(p1["best_so_far_ms"]) == [0.5123, 0.4321, 0.4321]
    assert p1["median_ms"].isna().tolist() == [False, False, True]  # the failed trial has no time


def test_convergence_charts_put_time_on_a_log_axis(monkeypatch, db):
    (spec,) = charts_of(page(monkeypatch, db), "best_so_far_ms")
    assert [layer["encoding"]["y"]["scale"]["type"] for layer in spec["spec"]["layer"]] == ["log", "log"]
    assert spec["resolve"]["scale"]["y"] == "independent"  # each problem on its own range


def test_roofline_chart_places_each_result_by_intensity_and_draws_both_ceilings(monkeypatch, db):
    from tilepilot.kernels.registry import get_family
    at = page(monkeypatch, db)
    points = chart_data(at, "% of roofline")
    w1 = get_family(fx.KERNEL).work(fx.P1)
    p1 = points[points["problem"] == "M=4096 N=4096 K=512 dtype=fp16"].sort_values("median_ms")
    assert list(p1["median_ms"]) == [0.4321, 0.5123] and list(p1["result"]) == ["best", "other"]
    assert p1["FLOP per byte"].tolist() == pytest.approx([w1.flops / w1.bytes] * 2)
    assert p1["TFLOP/s"].tolist() == pytest.approx([w1.flops / (ms * 1e-3) / 1e12 for ms in (0.4321, 0.5123)])
    notes = [t["note"][0] for t in chart_tables(at) if "note" in t.columns]
    assert notes == ["copy 2000 GB/s", "bf16 matmul 500 TFLOP/s"]
    line = next(t for t in chart_tables(at) if list(t.columns) == ["FLOP per byte", "TFLOP/s"] and len(t) > 2)
    assert line["TFLOP/s"].tolist() == pytest.approx([min(500.0, x * 2000.0 / 1000) for x in line["FLOP per byte"]])
    assert line["TFLOP/s"].max() == pytest.approx(500.0)  # the matmul ceiling; the slope is the copy bandwidth


def test_parameter_effect_chart_gives_time_over_the_problems_best_per_value(monkeypatch, db):
    at = page(monkeypatch, db)
    effects = chart_data(at, "q50")
    warps = effects[effects["param"] == "num_warps"].set_index("value")
    # P1: 0.5123 (warps 4) and 0.4321 (warps 8, its best); P2: 1.2345 (warps 4, its best)
    assert warps.loc["4", "n"] == 2 and warps.loc["8", "n"] == 1
    assert warps.loc["4", "q50"] == pytest.approx((0.5123 / 0.4321 + 1) / 2)
    assert warps.loc["8", "q50"] == pytest.approx(1.0)
    assert list(warps["order"]) == [0, 1]
    assert set(effects["param"]) == {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "num_warps"}


def test_parameter_effect_chart_names_instead_of_drawing_a_parameter_held_at_one_value(monkeypatch, db):
    at = page(monkeypatch, db)
    assert "num_stages" not in set(chart_data(at, "q50")["param"])  # every fixture config has num_stages=3
    assert any(c.value.endswith("At one value in every ok result, so not drawn: num\\_stages=3.") for c in at.caption)


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
    assert list(metrics(at).items())[:5] == [("Trials (done / budget)", "5/16"), ("OK", "4"), ("Failed", "1"),
                                             ("Queued", "2"), ("Running", "1")]
    assert list(frames(at)[1]["best so far (ms)"]) == [0.3999, 1.2345]
    assert "mm-live · finished" in at.subheader[0].value
    assert metrics(at)["ETA"] == "—"


def test_overview_thins_a_long_campaign_to_every_new_best_and_an_even_sample():
    from tilepilot.dashboard import digest
    from tilepilot.dashboard.reads import TrialPoint
    times = [10.0 - i * 0.001 if i % 97 == 0 else 20.0 + i % 7 for i in range(5000)]
    points = [TrialPoint(i, "p", f"k{i}", "{}", i + 1, "optuna", False, float(i), "ok", ms, 100, None, 1.0)
              for i, ms in enumerate(times)]
    drawn = digest.convergence(points, max_points=300)["p"]
    assert len(drawn) <= 300
    assert [p.seq for p in drawn if p.improved] == [i + 1 for i in range(0, 5000, 97)]  # every new best kept
    assert drawn[-1].seq == 5000 and drawn[-1].best_so_far_ms == pytest.approx(min(times))


# -- GPUs --------------------------------------------------------------------------------------

def test_gpus_page_shows_one_card_per_gpu_of_every_node_with_nvml_readings(monkeypatch, db):
    at = page(monkeypatch, db, "gpus")
    assert [s.value for s in at.subheader] == ["Node node-a · 2 GPU(s)", "Node node-b · 2 GPU(s)"]
    values = [(m.label, m.value) for m in at.metric]
    assert len(values) == 4 * 5
    assert values[:5] == [("Utilisation", "91 %"), ("Memory (of 80 GiB)", "40.0 GiB"),
                          ("SM clock", "1755 MHz"), ("Power", "612 W"), ("Temperature", "71 °C")]
    assert values[5:10] == [("Utilisation", "3 %"), ("Memory (of 80 GiB)", "1.0 GiB"), ("SM clock", "345 MHz"),
                            ("Power", "93 W"), ("Temperature", "38 °C")]
    assert values[10:15] == [("Utilisation", "68 %"), ("Memory (of 80 GiB)", "30.0 GiB"), ("SM clock", "1660 MHz"),
                             ("Power", "455 W"), ("Temperature", "66 °C")]
    assert values[15:] == [("Utilisation", "0 %"), ("Memory (of 80 GiB)", "0.5 GiB"), ("SM clock", "210 MHz"),
                           ("Power", "71 W"), ("Temperature", "35 °C")]
    sparklines = [list(m.proto.chart_data) for m in at.metric]
    assert sparklines[0] == [87.0, 88.0, 89.0, 90.0, 91.0]  # utilisation over the window, oldest first
    assert sparklines[12] == [1620.0, 1630.0, 1640.0, 1650.0, 1660.0]  # node-b GPU 0's SM clock
    assert any(c.value.startswith("4 GPU(s) on 2 node(s)") for c in at.caption)


def test_gpus_page_says_what_each_gpu_runs_from_the_queue_and_how_it_throttled(monkeypatch, db):
    shown = texts(page(monkeypatch, db, "gpus"))
    assert shown[:2] == ["throttle: none", "worker: gpu-0"]
    assert shown[2].startswith("now: mm-live | M=4096 N=4096 K=512 dtype=fp16 | BLOCK_SIZE_M=64 BLOCK_SIZE_N=256 "
                               "num_warps=4 num_stages=4 (optuna, running for ")
    assert shown[3:6] == ["throttle: sw_power_cap (throttled in 5 of 5 samples: sw_power_cap)", "worker: gpu-1",
                          "now: idle"]
    # node-b's GPU 0 stores no note of what it runs: the queue row on its worker says it
    assert shown[7] == "worker: gpu-2"
    assert shown[8].startswith("now: mm-live | M=64 N=8192 K=2048 dtype=bf16 | BLOCK_SIZE_M=64 BLOCK_SIZE_N=256 "
                               "num_warps=4 num_stages=4 (rules, running for ")
    assert shown[9:12] == ["throttle: none now (throttled in 2 of 5 samples: hw_slowdown)", "worker: gpu-3",
                           "now: idle"]


def test_gpus_page_lists_rows_running_on_a_worker_with_no_samples(monkeypatch, tmp_path):
    live_ = fx.build(tmp_path / "dash.db")
    live_.store.set_queue_state(live_.queue_ids["p1-llm"], "compiling", worker="gpu-9")
    at = page(monkeypatch, tmp_path / "dash.db", "gpus")
    assert at.subheader[-1].value == "Running on no GPU shown above (1)"
    assert texts(at)[-2].startswith("worker gpu-9: mm-live | M=4096 N=4096 K=512 dtype=fp16 | BLOCK_SIZE_M=128")


def test_gpus_page_says_no_gpu_visible_without_samples(monkeypatch, tmp_path):
    fx.build(tmp_path / "dash.db", gpus=False).store.close()
    at = page(monkeypatch, tmp_path / "dash.db", "gpus")
    assert not at.metric
    assert at.info[0].value.startswith("No GPU visible")


def test_gpus_page_says_no_gpu_visible_now_and_shows_the_last_readings_when_samples_are_old(monkeypatch, tmp_path):
    campaign = fx.build(tmp_path / "dash.db", gpus=False)
    fx.add_gpu_samples(campaign.store, now=time.time() - 2 * data.GPU_WINDOW_S)
    at = page(monkeypatch, tmp_path / "dash.db", "gpus")
    assert at.info[0].value.startswith("No GPU visible now")
    assert "the last readings the store holds, up to 10 min ago" in at.info[0].value
    assert [s.value for s in at.subheader] == ["Node node-a · 2 GPU(s)", "Node node-b · 2 GPU(s)"]
    assert [(m.label, m.value) for m in at.metric][:2] == [("Utilisation", "91 %"), ("Memory (of 80 GiB)", "40.0 GiB")]
    assert any(c.value.startswith("4 GPU(s) on 2 node(s) · NVML readings of the last recorded 5 minutes")
               for c in at.caption)


# -- Queue -------------------------------------------------------------------------------------

def test_queue_page_shows_running_next_and_done_with_proposer_rationale_hypothesis_and_prediction(monkeypatch, db):
    at = page(monkeypatch, db, "queue")
    running, nxt, done, _ = frames(at)
    assert list(running["worker"]) == ["gpu-0", "gpu-2"]
    assert list(running["predicted (ms)"]) == [0.418, 1.05]
    assert list(running["proposer"]) == ["optuna", "rules"]
    assert list(nxt["#"]) == [1, 2]
    assert list(nxt["pinned"]) == [True, False]  # pinned first, whatever its priority was
    assert list(nxt["priority"]) == [3.0, 1.25]
    assert list(nxt["reason"]) == ["pinned by a person", "in proposal order (llm)"]
    assert list(nxt["proposer"]) == ["optuna", "llm"]
    assert list(nxt["hypothesis"]) == ["", "H-0000beef"]
    assert nxt["rationale"][1] == f"deeper pipeline for a short K {fx.HOSTILE}"
    assert nxt["predicted (ms)"][1] == 0.4711 and nxt["predicted (ms)"].isna()[0]
    assert set(nxt["source"]) == {GPU_SOURCE}
    assert list(done["result"]) == ["dropped"]
    assert done["reason"][0].startswith("dropped: needs the same shared memory")
    assert [s.value for s in at.subheader] == ["Running (2)", "Next (2 queued)", "Recently done (1 in all)",
                                               "Why the queue changed"]


def test_queue_page_says_why_each_entry_moved(monkeypatch, db):
    at = page(monkeypatch, db, "queue")
    nxt, changes = frames(at)[1], frames(at)[3]
    assert nxt["last move"][0] == f"pinned: queue entry {nxt['entry'][0]} pinned at the head of the queue by a person"
    assert nxt["last move"][1] == ("moved up 3→1: moved up: tests H-0000beef, which the last 4 results made likely "
                                   f"(1.21x over 2 pairs) {fx.HOSTILE}")
    assert list(changes["change"]) == ["pinned", "asked to pin", "dropped", "moved up"]
    moved = changes.iloc[3]
    assert (moved["places"], moved["entry"]) == ("3→1", nxt["entry"][1])
    assert moved["config"] == "BLOCK_SIZE_M=128 BLOCK_SIZE_N=64 num_warps=4 num_stages=5"
    assert changes.iloc[2]["config"] == "BLOCK_SIZE_M=256 BLOCK_SIZE_N=128 num_warps=8 num_stages=5"


def test_queue_history_reads_what_a_driver_wrote_and_ignores_what_it_did_not():
    from tilepilot.dashboard import queue_history
    from tilepilot.dashboard.reads import QueueEvent
    events = [QueueEvent(3, 30.0, 1, "reordered", "re-scored", {"moves": [
                  {"queue_id": 7, "from": 2, "to": 5, "reason": "moved down: tests H-1, validated already"},
                  "not a move", {"queue_id": "x", "from": None}]}),
              QueueEvent(2, 20.0, 1, "control", "not done", {"action": "promote", "queue_id": 7, "honoured": False}),
              QueueEvent(1, 10.0, 1, "reordered", "old format", {})]
    rows = queue_history.changes(events)
    assert [(c.what, c.queue_id, c.before, c.after) for c in rows] == [
        ("moved down", 7, 2, 5), ("moved", None, None, None), ("promoted: not done", 7, None, None),
        ("re-scored", None, None, None)]
    assert queue_history.describe(queue_history.last_change(rows)[7]) == \
        "moved down 2→5: moved down: tests H-1, validated already"


def test_queue_page_moves_a_finished_row_to_recently_done(monkeypatch, tmp_path):
    campaign = fx.build(tmp_path / "dash.db")
    qid = campaign.queue_ids["p1-next"]
    key = campaign.trial(fx.ok(fx.P1, fx.cfg(64, 256, 4, 4), 0.3999))
    campaign.store.set_queue_state(qid, "done", experiment_key=key)
    at = page(monkeypatch, tmp_path / "dash.db", "queue")
    done = frames(at)[2]
    assert list(done["result"]) == ["ok", "dropped"]
    assert done["median (ms)"][0] == 0.3999
    assert done["predicted / measured"][0] == pytest.approx(0.418 / 0.3999)
    assert list(done["source"]) == [GPU_SOURCE, GPU_SOURCE]
    assert [s.value for s in at.subheader][:3] == ["Running (1)", "Next (2 queued)", "Recently done (2 in all)"]


# -- Experiments -------------------------------------------------------------------------------

def test_experiments_page_lists_every_trial_with_problem_config_and_source(monkeypatch, db):
    at = page(monkeypatch, db, "experiments")
    table = frame_with(at, *PAST)
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
    table = frame_with(at, *PAST)
    assert set(table["proposer"]) == expected
    assert len(table) == {"experiments_status": 1, "experiments_proposer": 2, "experiments_campaign": 2}[widget]


def test_experiments_page_filters_by_kernel_and_problem(monkeypatch, db):
    at = page(monkeypatch, db, "experiments")
    assert at.selectbox(key="experiments_kernel").options == ["all kernels", fx.KERNEL]
    problem = at.selectbox(key="experiments_problem")
    assert problem.options[0] == "all problems" and "M=64 N=8192 K=2048 dtype=bf16" in problem.options
    problem.set_value(fx.P2.key()).run()
    table = frame_with(at, *PAST)
    assert set(table["problem"]) == {"M=64 N=8192 K=2048 dtype=bf16"} and len(table) >= 1
    assert metrics(at)["Problems"] == "1"
    at.selectbox(key="experiments_problem").set_value(None).run()
    at.selectbox(key="experiments_kernel").set_value(fx.KERNEL).run()  # the fixture's only kernel: every trial
    assert len(frame_with(at, *PAST)) == 6
    from tilepilot.dashboard import reads
    handle = reads.open_db(db)
    assert reads.trial_list(handle, kernel="softmax") == [] and len(reads.trial_list(handle, kernel=fx.KERNEL)) == 6


def test_experiments_page_sums_up_every_past_experiment_the_filters_keep(monkeypatch, db):
    at = page(monkeypatch, db, "experiments")
    m = metrics(at)
    past = frame_with(at, *PAST)
    assert m["Past experiments"] == str(len(past)) and m["OK"] == str((past["status"] == "ok").sum())
    assert m["Failed"] == str((past["status"] != "ok").sum())
    assert m["Fastest"] == text.ms(past["median (ms)"].min())
    at.selectbox(key="experiments_proposer").set_value("rules").run()
    assert (metrics(at)["Past experiments"], metrics(at)["OK"], metrics(at)["Failed"]) == ("2", "1", "1")
    assert any(c.value.startswith("by status: ") and "out_of_resources 1" in c.value for c in at.caption)


def test_experiments_page_shows_what_runs_now_and_what_is_queued_next(monkeypatch, db):
    at = page(monkeypatch, db, "experiments")
    running = frame_with(at, "worker", "state", "started")
    queued = frame_with(at, "#", "reason")
    with sqlite3.connect(db) as conn:
        (in_store,) = conn.execute("SELECT COUNT(*) FROM queue WHERE state IN ('compiling', 'running')").fetchone()
    assert len(running) == in_store > 0 and len(queued) > 0
    assert set(running["campaign"]) == {"mm-live"}
    at.multiselect(key="experiments_status").set_value(["ok"]).run()  # only past experiments have a status
    assert not [f for f in frames(at) if "worker" in f.columns and "started" in f.columns]


def test_experiments_detail_shows_config_rationale_and_message(monkeypatch, db):
    at = page(monkeypatch, db, "experiments")
    at.multiselect(key="experiments_status").set_value(["out_of_resources"]).run()
    assert metrics(at)["Status"] == "out_of_resources"
    assert at.json[1].value == ('{"BLOCK_SIZE_M": 256, "BLOCK_SIZE_N": 256, "num_warps": 8, '
                                '"num_stages": 5}')
    assert "largest tile that fits" in texts(at)
    assert at.code[0].value == "shared memory 262144 > 232448"
    assert any(c.value == "No timing: the config did not run correctly." for c in at.caption)


def test_experiments_detail_shows_timing_spread_telemetry_resources_and_how_timing_stopped(monkeypatch, db):
    at = page(monkeypatch, db, "experiments")
    detail = at.selectbox(key="experiment_detail")
    detail.select(next(k for k in detail.options if "num_warps=8 num_stages=3" in k)).run()
    m = metrics(at)
    assert (m["Status"], m["Median"], m["Predicted"], m["Compile"]) == ("ok", "0.4321 ms", "0.45 ms", "812.5 ms")
    assert (m["SM clock"], m["Power"], m["Temperature"]) == ("1710 MHz", "598 W", "69 °C")
    assert (m["Registers / thread"], m["Spills"], m["Max relative error"]) == ("168", "4", "3.25e-04")
    assert m["% of roofline"] == f"{100 * bound_ms(fx.P1) / 0.4321:.0f} %"
    timing = dict(zip(frame_with(at, "timing")["timing"], frame_with(at, "timing")["value"], strict=True))
    assert timing["p20 – p80"] == f"{0.4321 * 0.995:.4g} ms – {0.4321 * 1.004:.4g} ms"
    assert timing["repetitions"] == "120" and timing["method"] == "cuda-graph"
    assert timing["spread target"] == "1.00 %" and timing["time cap"] == "200 ms"
    assert timing["stopped by"] == "spread reached the target" and timing["GPU time timing it"] == "52.5 ms"
    hyps = frame_with(at, "hypothesis", "how")
    assert list(hyps["hypothesis"]) == ["H-0000beef"] and list(hyps["how"]) == ["its trial tests it"]
    (tried,) = [f for f in frames(at) if list(f.columns) == ["campaign", "trial", "proposer", "predicted (ms)",
                                                              "reused", "rationale"]]
    assert list(tried["campaign"]) == ["mm-live"] and list(tried["rationale"]) == [fx.HOSTILE]


def test_experiment_detail_names_the_hypotheses_it_is_evidence_for(monkeypatch, ledger_db):
    path, ledger = ledger_db
    at = page(monkeypatch, path, "experiments")
    key_a = ledger.pairs["validated"][0][0]
    at.selectbox(key="experiment_detail").set_value(key_a).run()
    hyps = frame_with(at, "hypothesis", "how")
    h = ledger.hypotheses["validated"]
    assert set(zip(hyps["hypothesis"], hyps["how"], strict=True)) == {(h.id, "its trial tests it"),
                                                                       (h.id, "supports (as a)")}
    assert hyps["statement"][0] == h.text


# -- Log -----------------------------------------------------------------------------------------

def test_log_page_lists_events_newest_first_and_filters_by_kind(monkeypatch, db):
    at = page(monkeypatch, db, "log")
    table = frames(at)[0]
    assert table["kind"][0] == "campaign_finished"
    assert table["message"][0] == "mm-replay finished: 1 winner"
    assert len(table) == 10  # started, 4 results, re-ordered, dropped, a request and its answer, finished
    assert at.multiselect(key="log_kinds").proto.placeholder == "all kinds"
    assert list(at.multiselect(key="log_kinds").options) == [
        "campaign_finished", "campaign_started", "control", "control_request", "dropped", "reordered", "result"]
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
    assert no_markup(at)


def no_markup(at: AppTest) -> bool:
    """No element that renders markdown carries the hostile text's markup."""
    markup = [m.value for m in (*at.markdown, *at.caption, *at.subheader, *at.title, *at.info, *at.error)]
    return not any("<b" in m or "javascript:" in m for m in markup)


@pytest.mark.parametrize("screen", ["overview", "gpus", "queue", "experiments", "log"])
def test_no_page_renders_stored_text_as_markup(monkeypatch, db, screen):
    at = page(monkeypatch, db, None if screen == "overview" else screen)
    assert no_markup(at)
    tables = [f.to_csv() for f in frames(at)]
    if screen == "queue":  # the model's rationale and a re-scoring's reason, verbatim, in tables
        assert sum(fx.HOSTILE in t for t in tables) >= 2


# -- Launch --------------------------------------------------------------------------------------

def test_server_command_binds_loopback_by_default():
    cmd = launch.command("x.db")
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--server.headless") + 1] == "true"
    assert cmd[cmd.index("--browser.gatherUsageStats") + 1] == "false"
    assert cmd[cmd.index("--client.toolbarMode") + 1] == "viewer"  # no Deploy button
    assert cmd[-3:] == ["--", "--db", "x.db"]
    assert cmd[1:4] == ["-m", "tilepilot.dashboard.server", "run"] and cmd[4].endswith("app.py")
    assert cmd[cmd.index("--server.fileWatcherType") + 1] == "none"  # a viewer: no reruns on file changes


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


# -- Hypotheses ----------------------------------------------------------------------------------

@pytest.fixture
def ledger_db(tmp_path: Path) -> tuple[Path, fx.Ledger]:
    path = tmp_path / "ledger.db"
    ledger = fx.build_ledger(path)
    ledger.live.store.close()
    return path, ledger


def test_hypotheses_page_groups_every_state_with_effect_ci_noise_and_reason(monkeypatch, ledger_db):
    path, ledger = ledger_db
    at = page(monkeypatch, path, "hypotheses")
    assert metrics(at)["Active"] == "2" and metrics(at)["Validated"] == "1"
    assert metrics(at)["Ruled out"] == "1" and metrics(at)["Inconclusive"] == "1"
    assert [s.value for s in at.subheader][:4] == ["Active (2)", "Validated (1)", "Ruled out (1)", "Inconclusive (1)"]
    active, validated, ruled_out, inconclusive = frames(at)[:4]
    assert list(active["state"]) == ["testing", "proposed"]
    assert active["statement"][1] == f"GROUP_SIZE_M=16 beats GROUP_SIZE_M=8 {fx.HOSTILE}"
    row = validated.iloc[0]
    assert row["id"] == ledger.hypotheses["validated"].id
    assert row["statement"] == "num_stages=4 beats num_stages=3 when K ≥ 4096"
    assert row["scope"] == "K ≥ 4096" and row["pairs"] == 3 and row["a faster in"] == "3 of 3"
    assert row["effect (×)"] == pytest.approx((1.309 * 1.27 * 1.35) ** (1 / 3))
    assert row["95% CI"] == "1.234–1.388" and row["noise %"] == pytest.approx(2.1)
    assert row["reason"].startswith("validated: effect beyond the noise")
    assert ruled_out["effect (×)"][0] == pytest.approx((0.71 * 0.69) ** 0.5)
    assert ruled_out["reason"][0] == "ruled out: BLOCK_SIZE_M=128 is faster in every pair"
    assert inconclusive["reason"][0] == "inconclusive: no budget left in scope for more pairs"


def test_hypothesis_drill_down_shows_evidence_pairs_verdict_history_and_its_learning(monkeypatch, ledger_db):
    path, ledger = ledger_db
    at = page(monkeypatch, path, "hypotheses")
    h = ledger.hypotheses["validated"]
    at.selectbox(key="hypothesis_detail").set_value(h.id).run()
    assert "num_stages=4 beats num_stages=3 when K ≥ 4096" in texts(at)
    assert metrics(at)["Effect (×)"] == "1.309" and metrics(at)["95% CI"] == "1.23–1.39"
    assert metrics(at)["Pairs (a faster)"] == "3 (3)" and metrics(at)["Noise"] == "2.1 %"
    evidence, history = frames(at)[4:6]
    assert list(evidence["relation"]) == ["supports"] * 3
    assert sorted(evidence["ratio b/a"]) == pytest.approx([1.27, 1.309, 1.35])
    first = evidence[evidence["experiment a"] == ledger.pairs["validated"][0][0]].iloc[0]
    assert first["config a"] == "BLOCK_SIZE_M=128 BLOCK_SIZE_N=128 num_warps=4 num_stages=4"
    assert first["config b"] == "BLOCK_SIZE_M=128 BLOCK_SIZE_N=128 num_warps=4 num_stages=3"
    assert (first["a (ms)"], first["b (ms)"]) == (2.0, 2.618)
    assert first["problem"] == "M=2048 N=2048 K=8192 dtype=fp16"
    assert list(history["state"]) == ["testing", "validated"]
    assert ledger.learning.text in texts(at)
    assert any("6 supporting experiment(s)" in c.value for c in at.caption)
    assert any(c.value.endswith("numbers: " + GPU_SOURCE) for c in at.caption)


def test_hypothesis_drill_down_of_a_refuted_one_shows_refuting_pairs_and_no_learning(monkeypatch, ledger_db):
    path, ledger = ledger_db
    at = page(monkeypatch, path, "hypotheses")
    at.selectbox(key="hypothesis_detail").set_value(ledger.hypotheses["ruled_out"].id).run()
    evidence = frames(at)[4]
    assert list(evidence["relation"]) == ["refutes", "refutes"]
    assert sorted(evidence["ratio b/a"]) == pytest.approx([0.69, 0.71])
    assert "None: only a validated hypothesis becomes a learning." in [c.value for c in at.caption]


def test_hypotheses_page_follows_new_verdicts(monkeypatch, tmp_path):
    ledger = fx.build_ledger(tmp_path / "ledger.db")
    at = page(monkeypatch, tmp_path / "ledger.db", "hypotheses")
    assert metrics(at)["Validated"] == "1"
    h = ledger.hypotheses["testing"]
    ledger.live.store.record_verdict(fx.Verdict(h.id, fx.HypothesisState.VALIDATED, 5, 5, 0, 1.1234, 1.05, 1.2,
                                                0.02, "validated: effect beyond the noise"))
    time.sleep(data.TTL_S + 0.2)
    at.run()
    assert metrics(at)["Validated"] == "2" and metrics(at)["Active"] == "1"
    assert list(frames(at)[1]["effect (×)"]) == pytest.approx([1.1234, 1.309259], rel=1e-5)


def test_hypotheses_page_filters_by_campaign_and_says_when_there_is_none(monkeypatch, ledger_db):
    path, _ = ledger_db
    at = page(monkeypatch, path, "hypotheses")
    at.selectbox(key="hypotheses_campaign").set_value(1).run()  # mm-live has no hypothesis
    assert at.info[0].value.startswith("No hypothesis yet")


def test_hypothesis_text_from_a_model_is_shown_as_text(monkeypatch, ledger_db):
    path, ledger = ledger_db
    at = page(monkeypatch, path, "hypotheses")
    at.selectbox(key="hypothesis_detail").set_value(ledger.hypotheses["proposed"].id).run()
    assert f"GROUP_SIZE_M=16 beats GROUP_SIZE_M=8 {fx.HOSTILE}" in texts(at)
    assert f"model says {fx.HOSTILE}" in texts(at)
    markup = [m.value for m in (*at.markdown, *at.caption, *at.subheader, *at.title)]
    assert not any("<b" in m or "javascript:" in m for m in markup)


def test_show_in_the_knowledge_graph_centres_the_graph_on_the_hypothesis(monkeypatch, ledger_db):
    path, ledger = ledger_db
    at = page(monkeypatch, path, "hypotheses")
    h = ledger.hypotheses["validated"]
    at.selectbox(key="hypothesis_detail").set_value(h.id).run()
    at.button(key=f"graph_{h.id}").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Knowledge graph"
    assert at.selectbox(key="graph_focus").value == f"hypothesis:{h.id}"
    assert at.selectbox(key="graph_open").value == f"hypothesis:{h.id}"  # and opened
    assert f"learning:{ledger.learning.id}" in graph_nodes(at)["id"].tolist()
    assert ledger.learning.text in texts(at)


# -- Knowledge graph ------------------------------------------------------------------------------

def graph_nodes(at: AppTest):
    """The nodes the graph chart draws (its node dataset: the one with a `kind` and a `tag` column)."""
    from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
    chart = next(c for c in at.get("vega_lite_chart") if c.key == "graph_chart")
    tables = [convert_arrow_bytes_to_pandas_df(d.data.data) for d in chart.proto.datasets]
    return next(t for t in tables if "tag" in t.columns)


def click_node(at: AppTest, node: str) -> AppTest:
    """What the browser sends when a node is clicked: the chart's selection, as its widget state."""
    chart = next(c for c in at.get("vega_lite_chart") if c.key == "graph_chart")
    states = at._tree.get_widget_states()
    state = states.widgets.add()
    state.id = chart.proto.id
    state.string_value = json.dumps({"selection": {"node": [{"id": node}]}})
    return at._run(states)


def test_graph_overview_draws_hypotheses_learnings_and_their_evidence(monkeypatch, ledger_db):
    path, ledger = ledger_db
    at = page(monkeypatch, path, "graph")
    nodes = graph_nodes(at)
    ids = set(nodes["id"])
    assert {f"hypothesis:{h.id}" for h in ledger.hypotheses.values()} <= ids
    assert f"learning:{ledger.learning.id}" in ids
    assert {f"experiment:{k}" for pair in ledger.pairs["validated"] for k in pair[:2]} <= ids
    assert not set(nodes["kind"]) & {"kernel", "device"}  # the filters, not drawn
    assert len(nodes) <= 300
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    params = {p["name"]: p["select"] for p in spec["params"]}
    assert params["node"]["type"] == "point" and params["zoom"]["type"] == "interval"
    assert any(p.get("bind") == "scales" for p in spec["params"])  # pan and zoom
    assert list(at.get("vega_lite_chart")[0].proto.selection_mode) == ["node"]
    learnings = frames(at)[-1]
    assert list(learnings["learning"]) == [ledger.learning.text]
    assert list(learnings["scope"]) == ["K ≥ 4096"] and list(learnings["pairs"]) == [3]
    assert len(learnings["evidence experiments"][0]) == 6


def test_clicking_a_hypothesis_node_opens_its_evidence(monkeypatch, ledger_db):
    path, ledger = ledger_db
    at = page(monkeypatch, path, "graph")
    h = ledger.hypotheses["ruled_out"]
    click_node(at, f"hypothesis:{h.id}")
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="graph_open").value == f"hypothesis:{h.id}"
    assert h.text in texts(at)
    evidence = next(f for f in frames(at) if "relation" in f.columns)
    assert list(evidence["relation"]) == ["refutes", "refutes"]


def test_clicking_a_learning_node_opens_the_learning_with_its_supporting_pairs(monkeypatch, ledger_db):
    path, ledger = ledger_db
    at = page(monkeypatch, path, "graph")
    click_node(at, f"learning:{ledger.learning.id}")
    assert ledger.learning.text in texts(at)
    assert metrics(at)["Evidence experiments"] == "6"
    evidence = next(f for f in frames(at) if "relation" in f.columns)
    assert sorted(evidence["ratio b/a"]) == pytest.approx([1.27, 1.309, 1.35])


def test_opening_an_experiment_shows_its_links_and_centres_the_graph_on_it(monkeypatch, ledger_db):
    path, ledger = ledger_db
    at = page(monkeypatch, path, "graph")
    key_a, _, _ = ledger.pairs["validated"][0]
    at.selectbox(key="graph_open").set_value(f"experiment:{key_a}").run()
    shown = texts(at)
    assert f"ok · 2 ms · {GPU_SOURCE}" in shown
    assert f"supports {ledger.hypotheses['validated'].id}: num_stages=4 beats num_stages=3 when K ≥ 4096" in shown
    assert f"tests {ledger.hypotheses['validated'].id}: num_stages=4 beats num_stages=3 when K ≥ 4096" in shown
    assert {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_warps": 4, "num_stages": 4} in [
        json.loads(j.value) for j in at.json]
    at.button(key="graph_centre").click().run()
    assert at.selectbox(key="graph_focus").value == f"experiment:{key_a}"
    assert at.selectbox(key="graph_open").value == f"experiment:{key_a}"
    nodes = graph_nodes(at)
    assert f"experiment:{key_a}" in set(nodes["id"])
    assert f"hypothesis:{ledger.hypotheses['validated'].id}" in set(nodes["id"])


def test_graph_centred_on_a_hypothesis_draws_its_evidence_and_learning_only(monkeypatch, ledger_db):
    path, ledger = ledger_db
    at = page(monkeypatch, path, "graph")
    h = ledger.hypotheses["validated"]
    at.selectbox(key="graph_focus").set_value(f"hypothesis:{h.id}").run()
    nodes = graph_nodes(at)
    assert set(nodes[nodes["kind"] == "hypothesis"]["id"]) == {f"hypothesis:{h.id}"}
    assert set(nodes[nodes["kind"] == "experiment"]["id"]) == {
        f"experiment:{k}" for pair in ledger.pairs["validated"] for k in pair[:2]}
    assert set(nodes[nodes["kind"] == "learning"]["id"]) == {f"learning:{ledger.learning.id}"}


def test_graph_scope_filter_keeps_matching_learnings_and_reports_a_bad_filter(monkeypatch, ledger_db):
    path, _ = ledger_db
    at = page(monkeypatch, path, "graph")
    at.text_input(key="graph_scope").input("K<=1024").run()
    assert frames(at) == [] and "Learnings (0)" in [s.value for s in at.subheader]
    at.text_input(key="graph_scope").input("K<<4").run()
    assert at.error[0].value.startswith("bad problem filter 'K<<4'")


def test_graph_bounds_a_large_graph_to_the_nearest_nodes_of_its_centre():
    import networkx as nx

    from tilepilot.dashboard import network
    g = nx.MultiDiGraph()
    g.add_node("kernel:k", kind="kernel")
    for i in range(1000):
        g.add_node(f"experiment:{i:04d}", kind="experiment")
        g.add_edge(f"experiment:{i:04d}", "kernel:k", key="ran")
        if i:
            g.add_edge(f"experiment:{i - 1:04d}", f"experiment:{i:04d}", key="ran")
    shown, left_out = network.bounded(g, "experiment:0500")
    assert len(shown) == network.MAX_NODES == 300 and left_out == 700
    assert "kernel:k" not in shown
    assert set(shown) == {f"experiment:{i:04d}" for i in range(350, 650)}


def test_graph_page_of_an_empty_store_says_how_to_start(monkeypatch, tmp_path):
    path = tmp_path / "empty.db"
    Store(path).close()
    at = page(monkeypatch, path, "graph")
    assert "No campaign in this database yet" in at.info[0].value


def test_graph_overview_leaves_out_whole_hypotheses_beyond_the_node_bound(monkeypatch, ledger_db):
    from tilepilot.dashboard import network
    path, ledger = ledger_db
    monkeypatch.setattr(network, "MAX_NODES", 12)
    at = page(monkeypatch, path, "graph")
    nodes = graph_nodes(at)
    assert len(nodes) <= 12
    drawn = set(nodes[nodes["kind"] == "hypothesis"]["id"])
    assert f"hypothesis:{ledger.hypotheses['testing'].id}" in drawn  # being tested: drawn first
    left_out = len(ledger.hypotheses) - len(drawn)
    assert left_out and f"{left_out} more hypothesis(es) not drawn, to keep the picture within 12 nodes: " \
        "centre on one to see it" in [c.value for c in at.caption]


def test_typing_an_experiment_key_prefix_centres_the_graph_on_it(monkeypatch, ledger_db):
    path, ledger = ledger_db
    at = page(monkeypatch, path, "graph")
    key_a = ledger.pairs["ruled_out"][0][0]
    at.text_input(key="graph_experiment").input(key_a[:8]).run()
    assert at.selectbox(key="graph_focus").value == f"experiment:{key_a[:8]}"
    nodes = graph_nodes(at)
    assert f"experiment:{key_a}" in set(nodes["id"])
    assert f"hypothesis:{ledger.hypotheses['ruled_out'].id}" in set(nodes["id"])
    at.text_input(key="graph_experiment").input("zzzzzzzz").run()
    assert "is not an experiment key" in at.error[0].value


def test_graph_layout_does_not_depend_on_the_order_the_rows_came_in():
    import networkx as nx

    from tilepilot.dashboard import network
    edges = [(f"experiment:{i}", f"hypothesis:H-{i % 3}", "supports") for i in range(12)]
    forward, backward = nx.MultiDiGraph(), nx.MultiDiGraph()
    for g, order in ((forward, edges), (backward, edges[::-1])):
        for u, v, k in order:
            g.add_node(u, kind="experiment")
            g.add_node(v, kind="hypothesis")
            g.add_edge(u, v, key=k)
    assert network.layout(forward) == network.layout(backward)


# -- a busy store ------------------------------------------------------------------------------------

def test_every_page_renders_the_render_benchmarks_store(monkeypatch, tmp_path):
    """The store bench/dashboard_render.py times (many campaigns, two kernels, two devices, re-orderings,
    a ledger, model calls, eight GPUs on two nodes), at 1500 experiments: every page renders it."""
    from bench import dashboard_render
    path = tmp_path / "busy.db"
    dashboard_render.build(path, 1500)
    at = page(monkeypatch, path)
    assert at.title[0].value == "Overview" and "mm-big · running" in at.subheader[0].value
    for screen, title in list(dashboard_render.PAGES.items())[1:]:
        at.switch_page(f"screens/{screen}.py").run()
        assert not at.exception, [e.value for e in at.exception]
        assert at.title[0].value == title
    at.switch_page("screens/gpus.py").run()
    assert [s.value for s in at.subheader] == ["Node node-a · 4 GPU(s)", "Node node-b · 4 GPU(s)"]


def test_progress_counts_measured_trials_and_a_reused_one_is_free() -> None:
    from tilepilot.dashboard import digest
    from tilepilot.dashboard.reads import CampaignInfo, TrialPoint

    problem = {"M": 64, "N": 64, "K": 64, "dtype": "fp16"}
    key = json.dumps(problem, sort_keys=True, separators=(",", ":"))
    info = CampaignInfo(1, "c", "matmul", "rules", "replay", "dev", "", "running", 4, "", (problem,), 0.0, 0.0,
                        None, 0.0, 0.0, "", 0, 1)
    points = [TrialPoint(i, key, f"e{i}", "{}", i, "rules", i == 1, float(i), "ok", 1.0 + i, 10, None, None)
              for i in range(1, 4)]  # the first reused from the store
    d = digest.digest(info, points, {}, {}, [], None, now=10.0)
    assert (d.spent, d.total, d.problems[0].counted, d.problems[0].reused) == (2, 4, 2, 1)
