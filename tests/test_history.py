"""`tilepilot history | best | show | compare` as a query tool: filters by campaign, kernel, problem
ranges, device, toolchain, status, proposer and date, each checked against plain SQL on the store;
bad filters are one line naming the value and what is allowed (exit 2); values are bound, never
pasted into SQL. Replay backend on the synthetic dataset of `replay_fixture` (two devices)."""

from __future__ import annotations

import csv
import io
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.cli_helpers import run, sql
from tests.replay_fixture import write_campaign, write_dataset
from tilepilot.cli import main
from tilepilot.kernels.registry import param_defaults


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Campaigns r (random, 6) and g (grid, 4) on 'synthetic device', o (grid, 6) on 'other device'."""
    root = tmp_path_factory.mktemp("history")
    ds = write_dataset(root / "d.jsonl")
    other = root / "other.jsonl"
    other.write_text(ds.read_text().replace("synthetic device", "other device").replace('"triton": "0.0"',
                                                                                        '"triton": "3.6.0"'))
    db = root / "h.db"
    for name, proposer, budget, data in (("r", "random", 6, ds), ("g", "grid", 4, ds), ("o", "grid", 6, other)):
        camp = write_campaign(root / f"{name}.toml", name=name, proposer=proposer, budget=budget)
        assert main(["tune", str(camp), "--backend", "replay", "--dataset", str(data), "--db", str(db)]) == 0
    return db


@pytest.fixture()
def db(store: Path, tmp_path: Path) -> Path:
    """A copy each test may change (dates)."""
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{store}{suffix}").exists():
            shutil.copy(f"{store}{suffix}", tmp_path / f"h.db{suffix}")
    return tmp_path / "h.db"


def history(capsys: pytest.CaptureFixture[str], db: Path, *filters: object) -> list[dict[str, Any]]:
    code, out, err = run(capsys, "history", "--db", db, "--json", *filters)
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def keys(rows: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    return {(r["campaign"], r["experiment_key"]) for r in rows}


TRIALS = ("SELECT c.name AS campaign, t.experiment_key, e.problem, e.device, e.triton, r.status, t.proposer, "
          "r.measured_at FROM trials t JOIN campaigns c ON c.id = t.campaign_id JOIN experiments e ON e.key = "
          "t.experiment_key JOIN results r ON r.experiment_key = t.experiment_key")


def expected(db: Path, keep: Any) -> set[tuple[Any, ...]]:
    return {(r["campaign"], r["experiment_key"]) for r in sql(db, TRIALS) if keep({**r, "problem": json.loads(
        r["problem"])})}


# ---- filters --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "keep"), [
    ("M<=64", lambda p: p["M"] <= 64),
    ("M>64", lambda p: p["M"] > 64),
    ("M>=64,K<1024", lambda p: p["M"] >= 64 and p["K"] < 1024),
    ("dtype!=fp16", lambda p: p["dtype"] != "fp16"),
    ("N=1024", lambda p: p["N"] == 1024),
    ("M<1", lambda p: False),
])
def test_problem_ranges_select_exactly_the_matching_trials(db, capsys, text, keep):
    got = history(capsys, db, "--problem", text)
    assert keys(got) == expected(db, lambda r: keep(r["problem"]))


def test_several_problem_filters_must_all_hold(db, capsys):
    got = history(capsys, db, "--problem", "M<=512", "--problem", "K>=1024")
    assert keys(got) == expected(db, lambda r: r["problem"]["M"] <= 512 and r["problem"]["K"] >= 1024)
    assert got and all(r["problem"]["K"] == 2048 for r in got)


def test_device_backend_and_toolchain_filters(db, capsys):
    other = history(capsys, db, "--device", "OTHER")  # a part of the name, any case
    assert keys(other) == expected(db, lambda r: r["device"] == "other device") and other
    assert keys(history(capsys, db, "--triton", "3.6")) == keys(other)  # 3.6 matches 3.6.0
    assert keys(history(capsys, db, "--triton", "3.6.0")) == keys(other)
    assert keys(history(capsys, db, "--triton", "3")) == keys(other)  # a major version matches its releases
    assert history(capsys, db, "--triton", "3.60") == [] and history(capsys, db, "--triton", "3.6.0.1") == []
    assert keys(history(capsys, db, "--torch", "0.0", "--device", "synthetic")) == expected(
        db, lambda r: r["device"] == "synthetic device")
    assert len(history(capsys, db, "--backend", "replay")) == len(sql(db, TRIALS))
    assert history(capsys, db, "--backend", "gpu") == []


def test_campaign_proposer_status_and_kernel_filters(db, capsys):
    assert keys(history(capsys, db, "--campaign", "g", "--proposer", "grid")) == expected(
        db, lambda r: r["campaign"] == "g" and r["proposer"] == "grid")
    assert keys(history(capsys, db, "--campaign", "g")) == expected(db, lambda r: r["campaign"] == "g")
    assert keys(history(capsys, db, "--status", "ok,out_of_resources")) == expected(
        db, lambda r: r["status"] in ("ok", "out_of_resources"))
    assert keys(history(capsys, db, "--status", "ok", "--status", "out_of_resources")) == expected(
        db, lambda r: r["status"] in ("ok", "out_of_resources"))
    assert history(capsys, db, "--kernel", "softmax") == []


def test_date_filters_take_dates_times_and_spans(db, capsys):
    con = sqlite3.connect(db)
    con.execute("UPDATE results SET measured_at = 1767225600.0 WHERE experiment_key IN "  # 2026-01-01 00:00 UTC
                "(SELECT experiment_key FROM trials WHERE campaign_id = (SELECT id FROM campaigns WHERE name = 'g'))")
    con.commit()
    con.close()
    old = expected(db, lambda r: r["measured_at"] < 1767225601)
    assert old and keys(history(capsys, db, "--until", "2026-01-02")) == old
    assert keys(history(capsys, db, "--until", "2026-01-01T00:00:01")) == old
    assert history(capsys, db, "--until", "2026-01-01") == []  # until is exclusive
    assert keys(history(capsys, db, "--since", "2026-01-01", "--until", "2026-01-01T00:00:01Z")) == old
    recent = expected(db, lambda r: r["measured_at"] > 1767225601)
    assert keys(history(capsys, db, "--since", "30d")) == recent  # the fixture was written moments ago
    assert history(capsys, db, "--since", "2099-01-01") == []


def test_imported_experiments_show_as_imported_and_filter_by_status(db, capsys, tmp_path):
    f = tmp_path / "kernel=matmul,N=512,K=512,device_name=vendor_GPU,dtype=fp16.json"
    cfg = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8, "num_warps": 4,
           "num_stages": 3}
    f.write_text(json.dumps({"512": cfg}))
    assert run(capsys, "import", f, "--db", db)[0] == 0
    everything = history(capsys, db)
    imported = [r for r in everything if r["status"] == "imported"]
    assert len(imported) == 1 and everything[-1] == imported[0]  # after the measured rows
    assert imported[0]["median_ms"] is None and imported[0]["origin"] == f"vllm:{f.resolve()}"
    assert imported[0]["device"] == "vendor GPU"  # the config as matmul's space writes it: grouped kernel defaults
    assert imported[0]["config"] == {**cfg, **param_defaults("matmul")}
    assert history(capsys, db, "--status", "imported") == imported
    assert history(capsys, db, "--status", "imported", "--campaign", "r") == []  # no campaign imported it
    assert history(capsys, db, "--status", "ok", "--device", "vendor") == []
    code, out, _ = run(capsys, "history", "--db", db, "--status", "imported")
    assert code == 0 and "imported" in out.splitlines()[1] and "vLLM's tuned config for M=512" in out
    code, out, _ = run(capsys, "history", "--db", db, "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows[-1]["status"] == "imported" and rows[-1]["origin"].startswith("vllm:")


def test_best_takes_the_history_filters(db, capsys):
    code, out, err = run(capsys, "best", "--db", db, "--json", "--device", "other", "--problem", "M<=64")
    assert code == 0, err
    rows = [json.loads(x) for x in out.splitlines()]
    assert [(r["campaign"], r["problem"]["M"]) for r in rows] == [("o", 64)]
    ok = [r for r in sql(db, TRIALS) if r["campaign"] == "o" and json.loads(r["problem"])["M"] == 64
          and r["status"] == "ok"]
    winner = sql(db, "SELECT w.* FROM winners w JOIN campaigns c ON c.id = w.campaign_id WHERE c.name = 'o' AND "
                     "w.problem_key LIKE '%\"M\":64%'")[0]
    assert rows[0]["experiment_key"] == winner["experiment_key"] and rows[0]["median_ms"] == winner["median_ms"]
    assert len(ok) == rows[0]["ok"]


# ---- bad filters ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "names", "allowed"), [
    (["--problem", "M<=x"], "'M<=x'", "number"),
    (["--problem", "M"], "'M'", "<=, >=, <, >, =, !="),
    (["--problem", "M N<=5"], "'M N'", "letters, digits"),
    (["--problem", "M<=99999999999999999999"], "99999999999999999999", "64-bit"),
    (["--since", "yesterday"], "'yesterday'", "YYYY-MM-DD"),
    (["--until", "2026-13-01"], "'2026-13-01'", "YYYY-MM-DD"),
    (["--status", "ok,nope"], "'nope'", "compile_error"),
    (["--backend", "cuda"], "'cuda'", "gpu, interpret, replay, imported"),
    (["--triton", "3.6; DROP TABLE results"], "DROP TABLE results", "version"),
    (["--device", ""], "''", "name"),
    (["--campaign", "nope"], "'nope'", "known: r, g, o"),
    (["--problem", "Q>=5"], "'Q'", "fields: K, M, N, dtype"),  # no stored problem has it: it would match nothing
    (["--problem", "m<=64"], "'m'", "fields: K, M, N, dtype"),
    (["--kernel", "matmul", "--problem", "M<=64,topk=2"], "'topk'", "no problem of kernel 'matmul'"),
])
def test_bad_filter_is_one_line_naming_the_value_and_what_is_allowed(store, capsys, argv, names, allowed):
    before = store.read_bytes()
    for verb in ("history", "best") if "--status" not in argv else ("history",):
        code, out, err = run(capsys, verb, "--db", store, *argv)
        assert code == 2 and out == "", err
        assert err.startswith("tilepilot: error:") and err.count("\n") == 1
        assert names in err and allowed in err, err
    assert store.read_bytes() == before


def test_a_field_is_checked_only_against_problems_the_store_holds(store, capsys):
    # a kernel with no stored problems has no fields to name: the filter matches nothing, quietly
    assert history(capsys, store, "--kernel", "softmax", "--problem", "rows<=64") == []
    assert history(capsys, store, "--kernel", "softmax", "--problem", "M<=64") == []


@pytest.mark.parametrize("value", ["matmul' OR '1'='1", "%", "_", "\" OR 1=1 --"])
def test_filter_values_are_bound_not_pasted(store, capsys, value):
    for flag in ("--kernel", "--device", "--proposer"):
        assert history(capsys, store, flag, value) == []
    assert history(capsys, store, "--problem", f"dtype={value}") == []


# ---- compare --------------------------------------------------------------------------------------
def best_rows(db: Path, campaign: str) -> dict[str, dict[str, Any]]:
    rows = sql(db, "SELECT w.problem_key, w.median_ms, e.config_key FROM winners w JOIN campaigns c ON "
                   "c.id = w.campaign_id JOIN experiments e ON e.key = w.experiment_key WHERE c.name = ?", (campaign,))
    return {r["problem_key"]: r for r in rows}


def test_compare_two_campaigns_gives_each_winner_and_the_ratio(db, capsys):
    code, out, err = run(capsys, "compare", "r", "g", "--db", db, "--json")
    assert code == 0, err
    rows = [json.loads(x) for x in out.splitlines()]
    a, b = best_rows(db, "r"), best_rows(db, "g")
    assert {r["problem_key"] for r in rows} == set(a) == set(b)
    for r in rows:
        x, y = a[r["problem_key"]], b[r["problem_key"]]
        assert (r["a_ms"], r["b_ms"]) == (x["median_ms"], y["median_ms"])
        assert r["ratio"] == pytest.approx(y["median_ms"] / x["median_ms"])
        assert r["same_config"] == (x["config_key"] == y["config_key"])
    code, out, err = run(capsys, "compare", "r", "g", "--db", db)
    assert code == 0 and out.splitlines()[0] == "a = r, b = g (campaigns); ratio = b / a"
    assert len(out.splitlines()) == 2 + len(rows)


def test_compare_two_devices_times_each_winner_on_the_other_device(db, capsys):
    code, out, err = run(capsys, "compare", "synthetic", "other", "--by", "device", "--db", db, "--json")
    assert code == 0, err
    rows = [json.loads(x) for x in out.splitlines()]
    assert len(rows) == 2
    times = {(r["device"], r["problem"], r["config"]): r["median_ms"] for r in sql(
        db, "SELECT e.device, e.problem_key AS problem, e.config_key AS config, MIN(r.median_ms) AS median_ms FROM "
            "experiments e JOIN results r ON r.experiment_key = e.key WHERE r.status = 'ok' GROUP BY 1, 2, 3")}
    for r in rows:
        b_winner = best_rows(db, "o")[r["problem_key"]]
        assert r["b_ms"] == b_winner["median_ms"]
        a_key = [k for (dev, p, k) in times if dev == "synthetic device" and p == r["problem_key"]
                 and times[(dev, p, k)] == r["a_ms"]]
        assert a_key  # a's time is one measured on device a
        assert r["b_config_on_a_ms"] == times.get(("synthetic device", r["problem_key"], b_winner["config_key"]))


@pytest.mark.parametrize(("argv", "names"), [
    (["r", "nope"], "'nope'"),
    (["synthetic", "device", "--by", "device"], "matches 2 devices"),
    (["synthetic", "nowhere", "--by", "device"], "'nowhere'"),
    (["r", "g", "--by", "gpu"], "'gpu'"),
])
def test_compare_mistakes_are_one_line(store, capsys, argv, names):
    code, out, err = run(capsys, "compare", *argv, "--db", store)
    assert code == 2 and out == "" and err.count("\n") == 1 and names in err, err


# ---- show -----------------------------------------------------------------------------------------
def test_show_gives_everything_stored_about_an_experiment(db, capsys):
    w = sql(db, "SELECT w.*, c.name FROM winners w JOIN campaigns c ON c.id = w.campaign_id WHERE c.name = 'r'")[0]
    key = w["experiment_key"]
    code, out, err = run(capsys, "show", key[:10], "--db", db, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["experiment"]["key"] == key
    result = sql(db, "SELECT * FROM results WHERE experiment_key = ?", (key,))[0]
    assert {k: v for k, v in doc["result"].items() if k != "extra"} == {k: v for k, v in result.items() if k != "extra"}
    trials = sql(db, "SELECT c.name, t.seq, t.proposer, t.rationale FROM trials t JOIN campaigns c ON "
                     "c.id = t.campaign_id WHERE t.experiment_key = ? ORDER BY t.id", (key,))
    assert [(t["campaign"], t["seq"], t["proposer"], t["rationale"]) for t in doc["trials"]] == [
        tuple(t.values()) for t in trials]
    assert {"campaign": "r", "role": "winner"}.items() <= doc["winner_of"][0].items()
    assert doc["winner_of"][0]["median_ms"] == w["median_ms"]
    events = sql(db, "SELECT id FROM events WHERE json_extract(data, '$.experiment') = ?", (key,))
    assert [e["id"] for e in doc["events"]] == [e["id"] for e in events] and events
    code, out, err = run(capsys, "show", key, "--db", db)
    assert code == 0 and out.startswith(f"experiment {key}\n") and "winner of:" in out and "result: ok" in out


@pytest.mark.parametrize(("text", "names"), [("zz", "'zz'"), ("0" * 32, "no experiment"), ("x' OR 1", "x' OR 1")])
def test_show_refuses_what_is_not_one_experiment(store, capsys, text, names):
    code, out, err = run(capsys, "show", text, "--db", store)
    assert code == 2 and out == "" and err.count("\n") == 1 and names in err, err


def test_show_asks_for_more_of_an_ambiguous_prefix(db, capsys):
    con = sqlite3.connect(db)
    for k in ("abcd" + "0" * 28, "abcd" + "1" * 28):  # two rows whose keys share a prefix
        con.execute("INSERT INTO experiments (key, kernel, kernel_version, problem, problem_key, config, "
                    "config_key, backend, device, torch, triton, created_at) SELECT ?, kernel, kernel_version, "
                    "problem, problem_key, config, config_key, backend, device, torch, triton, created_at "
                    "FROM experiments LIMIT 1", (k,))
    con.commit()
    con.close()
    code, out, err = run(capsys, "show", "ABCD", "--db", db)
    assert code == 2 and err.count("\n") == 1 and "'abcd' starts 2 experiment keys" in err and "give more of it" in err
    code, out, err = run(capsys, "show", "abcd1", "--db", db)
    assert code == 0 and out.startswith("experiment abcd111") and "result: none" in out
