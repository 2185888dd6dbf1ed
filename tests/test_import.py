"""`tilepilot import`: vLLM tuned-config files and Triton's autotune cache seed the history as
imported experiments: origin vllm:<file> / triton-cache:<file>, what the source said kept in
origin_data, no result row (nothing measured here, no time invented), shown as imported by
history and best, never reused by a campaign as a measurement, and importing twice adds nothing.

The Triton cache files are written the way Triton's `Autotuner.check_disk_cache` writes them
(`{"key": tuning key, "configs_timings": [(Config.__dict__, [median, p20, p80]), ...]}`, a failed
config timed inf), with the installed triton's own `Config` objects; the timings in them are
made up for the test and labelled so (SYNTHETIC)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli_helpers import run, sql
from tests.export_fixture import build_store
from tests.replay_fixture import write_campaign, write_dataset
from tilepilot.cli import main
from tilepilot.kernels.registry import param_defaults

H100 = "NVIDIA H100 80GB HBM3"
MOE_FILE = "E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json"


def cfg(bm: int, bn: int, bk: int, gm: int, warps: int, stages: int) -> dict[str, int]:
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": gm, "num_warps": warps,
            "num_stages": stages}


# A vLLM tuned-config file as vLLM's benchmark_moe writes it: keys M, a triton_version entry.
MOE_CONFIGS = {"1": cfg(16, 64, 128, 1, 4, 4), "16": cfg(16, 128, 128, 1, 4, 3), "256": cfg(64, 128, 64, 8, 4, 4),
               "4096": cfg(128, 256, 64, 8, 8, 4)}


@pytest.fixture()
def moe_file(tmp_path: Path) -> Path:
    path = tmp_path / MOE_FILE
    path.write_text(json.dumps({**MOE_CONFIGS, "triton_version": "3.3.1"}, indent=4))
    return path


MOE_ARGS = ("--problem", "topk=2", "--problem", "K=4096", "--problem", "dtype=bf16")


# ---- vLLM -----------------------------------------------------------------------------------------
def test_vllm_file_becomes_imported_experiments_without_results(moe_file, tmp_path, capsys):
    db = tmp_path / "i.db"
    code, out, err = run(capsys, "import", moe_file, "--db", db, *MOE_ARGS)
    assert code == 0, err
    assert "4 config(s) of fused_moe on NVIDIA H100 80GB HBM3 for 4 problem(s), 4 new" in out
    rows = sql(db, "SELECT * FROM experiments ORDER BY json_extract(problem, '$.M')")
    assert [json.loads(r["problem"]) for r in rows] == [
        {"M": int(m), "E": 8, "topk": 2, "N": 14336, "K": 4096, "dtype": "bf16"} for m in MOE_CONFIGS]  # N: w1's rows
    assert [json.loads(r["config"]) for r in rows] == list(MOE_CONFIGS.values())
    for r in rows:
        assert r["origin"] == f"vllm:{moe_file.resolve()}" and r["backend"] == "imported"
        assert r["device"] == H100 and r["triton"] == "3.3.1" and r["kernel_version"] == "imported:vllm"
        data = json.loads(r["origin_data"])
        assert data["file"] == MOE_FILE and data["picked"] is True and str(data["M"]) in MOE_CONFIGS
    assert sql(db, "SELECT COUNT(*) AS n FROM results")[0]["n"] == 0  # nothing measured, no time invented
    assert sql(db, "SELECT COUNT(*) AS n FROM trials")[0]["n"] == 0
    event = sql(db, "SELECT * FROM events WHERE kind = 'imported'")
    assert len(event) == 1 and json.loads(event[0]["data"])["added"] == 4


def test_importing_the_same_file_again_adds_nothing(moe_file, tmp_path, capsys):
    db = tmp_path / "i.db"
    assert run(capsys, "import", moe_file, "--db", db, *MOE_ARGS)[0] == 0
    before = sql(db, "SELECT * FROM experiments ORDER BY key")
    code, out, err = run(capsys, "import", moe_file, "--db", db, *MOE_ARGS)
    assert code == 0 and ", 0 new" in out, err
    assert sql(db, "SELECT * FROM experiments ORDER BY key") == before


def test_history_and_best_show_imported_configs_as_imported(moe_file, tmp_path, capsys):
    db = tmp_path / "i.db"
    assert run(capsys, "import", moe_file, "--db", db, *MOE_ARGS)[0] == 0
    code, out, err = run(capsys, "history", "--db", db, "--json")
    rows = [json.loads(x) for x in out.splitlines()]
    assert code == 0 and len(rows) == 4 and {r["status"] for r in rows} == {"imported"}
    assert all(r["median_ms"] is None and r["campaign"] is None and r["proposer"] == "vllm" for r in rows)
    code, out, err = run(capsys, "best", "--db", db)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "no winners yet" and "imported (the source's pick; not measured here):" in lines
    assert sum(f"vllm:{MOE_FILE}" in line for line in lines) == 4
    code, out, err = run(capsys, "best", "--db", db, "--json", "--problem", "M>=256")
    picks = [json.loads(x) for x in out.splitlines()]
    assert sorted(p["problem"]["M"] for p in picks) == [256, 4096] and {p["status"] for p in picks} == {"imported"}


def test_imported_problem_matches_the_family_so_it_compares_with_measured_ones(moe_file, tmp_path, capsys):
    from tilepilot.kernels.registry import get_family

    db = tmp_path / "i.db"
    assert run(capsys, "import", moe_file, "--db", db, *MOE_ARGS)[0] == 0
    family = get_family("fused_moe")
    for r in sql(db, "SELECT problem, problem_key FROM experiments"):
        assert family.parse_problem(json.loads(r["problem"])).key() == r["problem_key"]
    space = family.space()
    in_space = {json.dumps(json.loads(r["config"])): json.loads(r["origin_data"])["in_space"]
                for r in sql(db, "SELECT config, origin_data FROM experiments")}
    for text, flag in in_space.items():
        try:
            space.parse(json.loads(text))
            assert flag is True
        except Exception:
            assert flag is False


def test_round_trip_export_vllm_then_import_gives_the_declared_winners(tmp_path, capsys):
    src = build_store(tmp_path)
    out = tmp_path / "configs"
    assert main(["export", "--db", str(src), "--format", "vllm", "-o", str(out)]) == 0
    db = tmp_path / "fresh.db"
    for f in sorted(out.iterdir()):
        code, _, err = run(capsys, "import", f, "--db", db, "--device", "synthetic device")
        assert code == 0, err
    winners = {(r["problem_key"], r["config_key"]) for r in sql(
        src, "SELECT w.problem_key, e.config_key FROM winners w JOIN experiments e ON e.key = w.experiment_key")}
    imported = {(r["problem_key"], r["config_key"]) for r in sql(db, "SELECT problem_key, config_key FROM experiments")}
    assert imported == winners


def test_a_campaign_never_reuses_an_imported_config_as_a_measurement(tmp_path, capsys):
    ds = write_dataset(tmp_path / "d.jsonl")
    f = tmp_path / "kernel=matmul,N=512,K=512,device_name=synthetic_device,dtype=fp16.json"
    grid_first = cfg(64, 64, 32, 8, 4, 3)  # the grid proposer's first config
    f.write_text(json.dumps({"512": grid_first}))
    db = tmp_path / "t.db"
    assert run(capsys, "import", f, "--db", db)[0] == 0
    imported = sql(db, "SELECT key FROM experiments")[0]["key"]
    camp = write_campaign(tmp_path / "g.toml", name="g", proposer="grid", budget=4)
    assert run(capsys, "tune", camp, "--backend", "replay", "--dataset", ds, "--db", db)[0] == 0
    assert sql(db, "SELECT COUNT(*) AS n FROM trials WHERE experiment_key = ?", (imported,))[0]["n"] == 0
    assert sql(db, "SELECT COUNT(*) AS n FROM trials WHERE reused = 1")[0]["n"] == 0
    assert sql(db, "SELECT COUNT(*) AS n FROM results WHERE experiment_key = ?", (imported,))[0]["n"] == 0
    measured = sql(db, "SELECT e.key FROM experiments e JOIN results r ON r.experiment_key = e.key WHERE "
                       "e.config_key = (SELECT config_key FROM experiments WHERE key = ?) AND "
                       "json_extract(e.problem, '$.M') = 512", (imported,))
    assert len(measured) == 1 and measured[0]["key"] != imported  # measured as its own experiment


# ---- Triton's autotune cache ----------------------------------------------------------------------
def triton_cache(folder: Path, function: str, key: list[Any], timed: list[tuple[dict[str, int], Any]]) -> Path:
    """One cache entry as Triton's check_disk_cache writes it, with the installed triton's Config."""
    import triton

    entries = []
    for c, timings in timed:
        kwargs = {k: v for k, v in c.items() if k not in ("num_warps", "num_stages")}
        config = triton.Config(kwargs, num_warps=c["num_warps"], num_stages=c["num_stages"])
        entries.append((config.__dict__, timings))
    entry = folder / "7b1e2c0f9d8a" / f"{function}.autotune.json"
    entry.parent.mkdir(parents=True)
    entry.write_text(json.dumps({"key": key, "configs_timings": entries}))
    return entry


# SYNTHETIC timings (ms: median, p20, p80); the third config failed (Triton times it inf)
TIMED = [(cfg(64, 64, 32, 8, 4, 3), [0.120, 0.118, 0.123]), (cfg(128, 128, 64, 8, 8, 3), [0.081, 0.080, 0.083]),
         (cfg(128, 128, 64, 8, 8, 4), [float("inf")] * 3)]


@pytest.mark.parametrize("as_text", [False, True])  # Triton 3.9 writes the key's values, a later one str() of each
def test_triton_cache_keeps_its_timings_as_the_sources_not_ours(tmp_path, capsys, as_text):
    cache = tmp_path / "cache"
    key: list[Any] = [512, 1024, 2048, "torch.float16", "torch.float16", "torch.float16"]
    entry = triton_cache(cache, "matmul_kernel", [str(k) for k in key] if as_text else key, TIMED)
    db = tmp_path / "t.db"
    code, out, err = run(capsys, "import", cache, "--db", db, "--kernel", "matmul", "--key", "M,N,K",
                         "--device", H100, "--triton", "3.6.0")
    assert code == 0, err
    assert "3 config(s) of matmul on NVIDIA H100 80GB HBM3 for 1 problem(s), 3 new" in out
    rows = sql(db, "SELECT * FROM experiments")
    assert {r["origin"] for r in rows} == {f"triton-cache:{entry.resolve()}"}
    assert {r["problem"] for r in rows} == {json.dumps({"M": 512, "N": 1024, "K": 2048, "dtype": "fp16"})}
    by_config = {r["config"]: json.loads(r["origin_data"]) for r in rows}
    for c, timings in TIMED:  # stored as matmul's space writes them: the grouped kernel's defaults filled in
        data = by_config[json.dumps({**c, **param_defaults("matmul")})]
        assert data["timings_ms"] == (None if timings[0] == float("inf") else timings)
        assert data["picked"] is (c == TIMED[1][0]) and data["function"] == "matmul_kernel"
        assert data["tuning_key"][:3] == (["512", "1024", "2048"] if as_text else [512, 1024, 2048])
    assert sql(db, "SELECT COUNT(*) AS n FROM results")[0]["n"] == 0
    code, out, err = run(capsys, "best", "--db", db, "--json")
    (pick,) = [json.loads(x) for x in out.splitlines()]
    assert pick["config"] == {**TIMED[1][0], **param_defaults("matmul")}
    assert pick["source_ms"] == 0.081 and pick["status"] == "imported"
    code, out, err = run(capsys, "history", "--db", db)
    assert "timed 0.081 ms by Triton's autotuner, its pick" in out and "failed in Triton" in out


@pytest.mark.parametrize(("argv", "names"), [
    (["--key", "M,N,K", "--device", H100], "--kernel"),
    (["--kernel", "matmul", "--device", H100], "--key"),
    (["--kernel", "matmul", "--key", "M,N,K"], "--device"),
    (["--kernel", "matmul", "--key", "M,N,K", "--device", H100, "--function", "other"], "'other'"),
    (["--kernel", "nope", "--key", "M,N,K", "--device", H100], "'nope'"),
    (["--kernel", "matmul", "--key", "M,N", "--device", H100], "K"),
])
def test_triton_cache_mistakes_are_one_line_and_write_nothing(tmp_path, capsys, argv, names):
    cache = tmp_path / "cache"
    triton_cache(cache, "matmul_kernel", [512, 1024, 2048, "torch.float16"], TIMED)
    db = tmp_path / "t.db"
    code, out, err = run(capsys, "import", cache, "--db", db, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and names in err, err
    assert not db.exists() or sql(db, "SELECT COUNT(*) AS n FROM experiments")[0]["n"] == 0


def test_triton_cache_of_two_functions_asks_which(tmp_path, capsys):
    cache = tmp_path / "cache"
    triton_cache(cache / "a", "matmul_kernel", [512, 1024, 2048, "torch.float16"], TIMED)
    triton_cache(cache / "b", "softmax_kernel", [4096, "torch.float16"], TIMED)
    code, out, err = run(capsys, "import", cache, "--db", tmp_path / "t.db", "--kernel", "matmul", "--key", "M,N,K",
                         "--device", H100)
    assert out == ""
    assert code == 2 and "2 functions (matmul_kernel, softmax_kernel)" in err and "--function" in err
    code, _out, err = run(capsys, "import", cache, "--db", tmp_path / "t.db", "--kernel", "matmul", "--key", "M,N,K",
                         "--device", H100, "--function", "matmul_kernel")
    assert code == 0, err


@pytest.mark.parametrize(("name", "content", "extra", "names"), [
    (MOE_FILE, {"1": cfg(16, 64, 128, 1, 4, 4)}, ["--problem", "K=4096", "--problem", "dtype=bf16"], "topk"),
    (MOE_FILE, {"one": cfg(16, 64, 128, 1, 4, 4)}, list(MOE_ARGS), "'one'"),
    (MOE_FILE, {"1": "BLOCK_SIZE_M=16"}, list(MOE_ARGS), "not a config object"),
    (MOE_FILE, "[1, 2", list(MOE_ARGS), "not JSON"),
    ("tuned.json", {"1": cfg(16, 64, 128, 1, 4, 4)}, list(MOE_ARGS), "not a vLLM tuned-config name"),
    ("E=8,N=7168.json", {"1": cfg(16, 64, 128, 1, 4, 4)}, list(MOE_ARGS), "--device"),
])
def test_bad_vllm_file_is_one_line_and_writes_nothing(tmp_path, capsys, name, content, extra, names):
    f = tmp_path / name
    f.write_text(content if isinstance(content, str) else json.dumps(content))
    db = tmp_path / "v.db"
    code, out, err = run(capsys, "import", f, "--db", db, *extra)
    assert code == 2 and out == "" and err.startswith("tilepilot: error:") and err.count("\n") == 1, err
    assert names in err, err
    assert not db.exists() or sql(db, "SELECT COUNT(*) AS n FROM experiments")[0]["n"] == 0


def test_missing_path_is_refused_before_anything_is_written(moe_file, tmp_path, capsys):
    db = tmp_path / "v.db"
    code, _out, err = run(capsys, "import", moe_file, tmp_path / "absent.json", "--db", db, *MOE_ARGS)
    assert code == 2 and "absent.json" in err and not db.exists()
