"""`tilepilot export`: vLLM tuned-config files read back with vLLM's lookup, the Triton module
imported and its heuristic checked, the JSON checked against the store, and the CLI's errors."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from tests.export_fixture import PROBLEMS, TOKEN_COUNTS, build_store
from tilepilot.cli import main
from tilepilot.experiments import InputError
from tilepilot.kernels.registry import param_defaults
from tilepilot.storage.export import ExportEntry, export
from tilepilot.storage.export_vllm import VLLM_KEYS, file_name
from tilepilot.storage.queries import open_db

REPO = Path(__file__).resolve().parents[1]
BF16_FILE = "kernel=matmul,N=1024,K=2048,device_name=synthetic_device,dtype=bf16.json"


@pytest.fixture(scope="module")
def db_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("export"))


def store_winners(db: Path) -> dict[str, dict[str, Any]]:
    """problem_key -> the winners row with the winner's and runner-up's configs, read with plain SQL."""
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        rows = con.execute(
            "SELECT w.*, e.problem, e.config, e.device, e.backend, e.torch, e.triton, e.kernel_version, "
            "eu.config AS runner_up_config, c.name AS campaign FROM winners w "
            "JOIN experiments e ON e.key = w.experiment_key JOIN campaigns c ON c.id = w.campaign_id "
            "LEFT JOIN experiments eu ON eu.key = w.runner_up_key").fetchall()
    finally:
        con.close()
    return {r["problem_key"]: {**dict(r), "problem": json.loads(r["problem"]), "config": json.loads(r["config"]),
                               "runner_up_config": json.loads(r["runner_up_config"] or "null")} for r in rows}


def winner_of(db: Path, problem: dict[str, Any]) -> dict[str, Any]:
    found = [w for w in store_winners(db).values() if w["problem"] == problem]
    assert len(found) == 1
    return found[0]


def exported(db: Path, fmt: str, **filters: Any) -> list[Any]:
    with open_db(db) as handle:
        return export(handle, fmt, param_defaults=param_defaults, **filters)


# ---- vllm ---------------------------------------------------------------------------------------

def vllm_lookup(path: Path, m: int) -> dict[str, Any]:
    """What vLLM's fused-MoE layer does with a tuned-config file: int keys, the nearest M."""
    with open(path) as f:
        configs = {int(key): val for key, val in json.load(f).items()}
    return configs[min(configs.keys(), key=lambda x: abs(x - m))]


def test_vllm_lookup_picks_the_declared_winner_for_every_token_count(db_path, tmp_path):
    files = exported(db_path, "vllm")
    assert sorted(f.name for f in files) == sorted(
        [BF16_FILE, "kernel=matmul,N=512,K=512,device_name=synthetic_device,dtype=fp16.json"])
    bf16 = next(f for f in files if f.name == BF16_FILE)
    path = tmp_path / bf16.name
    path.write_text(bf16.text)
    data = json.loads(bf16.text)
    assert list(data) == [str(m) for m in TOKEN_COUNTS]  # string keys, ascending M
    assert all(list(cfg) == list(VLLM_KEYS) and all(type(v) is int for v in cfg.values()) for cfg in data.values())
    winners = {m: winner_of(db_path, {"M": m, "N": 1024, "K": 2048, "dtype": "bf16"})["config"] for m in TOKEN_COUNTS}
    defaults = param_defaults("matmul")
    assert all({k: c.pop(k) for k in defaults} == defaults for c in winners.values())  # plain kernel: vLLM's six
    assert len({json.dumps(c, sort_keys=True) for c in winners.values()}) >= 3  # the winners differ with M
    for m in TOKEN_COUNTS:
        assert vllm_lookup(path, m) == winners[m]
    for m in (2, 5, 40, 100, 200, 700, 3000, 100_000):  # untuned batch sizes: the nearest tuned M
        nearest = min(TOKEN_COUNTS, key=lambda t: abs(t - m))
        assert vllm_lookup(path, m) == winners[nearest]


def _entry(problem: dict[str, Any], config: dict[str, Any] | None = None, *, kernel: str = "fused_moe",
           device: str = "NVIDIA H100 80GB HBM3") -> ExportEntry:
    cfg = config or dict.fromkeys(VLLM_KEYS, 16)
    return ExportEntry(
        kernel=kernel, problem=problem, problem_key=json.dumps(problem), config=cfg, experiment_key="k",
        median_ms=1.0, rel_spread=0.01, runner_up_key=None, runner_up_config=None, runner_up_ms=None,
        runner_up_rel_spread=None, margin=None, tie=False, recheck_passed=None, campaign="c", campaign_id=1,
        decided_at=0.0, proposer="grid", rationale="", device=device, backend="gpu", kernel_version="1",
        torch="2.11", triton="3.6", driver="", hypotheses=())


def vllm_reference_name(e: int, n: int, device: str, dtype: str | None) -> str:
    """vLLM's file name for (E, N, device, dtype selector), as its get_config_file_name builds it."""
    device_name = device.replace(" ", "_")
    if "H200" in device_name.split("_"):
        device_name = "NVIDIA_H200"
    return f"E={e},N={n},device_name={device_name}" + (f",dtype={dtype}" if dtype else "") + ".json"


@pytest.mark.parametrize(("dtype", "selector"), [("bf16", None), ("fp16", None), ("fp32", "float32"),
                                                 ("fp8_w8a8", "fp8_w8a8"), ("int8_w8a16", "int8_w8a16")])
@pytest.mark.parametrize("device", ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA A100-SXM4-80GB"])
def test_vllm_file_name_is_the_one_vllm_looks_up_for_experts(dtype, selector, device):
    # fused_moe's N is w1's rows (gate and up: 14336 for Mixtral at TP2); vLLM looks the file up by
    # w2.shape[2], the intermediate size after silu_and_mul (7168), as its benchmark_moe names it
    entry = _entry({"M": 64, "E": 8, "N": 14336, "K": 4096, "dtype": dtype}, device=device)
    assert file_name(entry) == vllm_reference_name(8, 7168, device, selector)


def test_vllm_export_refuses_a_kernel_whose_configs_are_not_vllms():
    from tilepilot.storage.export_vllm import render_vllm

    rows = _entry({"rows": 8, "cols": 4096, "dtype": "bf16"}, {"BLOCK_SIZE": 1024, "num_warps": 4}, kernel="softmax")
    with pytest.raises(InputError, match="integer token count M"):
        render_vllm([rows], kernel_chosen=True)
    extra = _entry({"M": 64, "E": 8, "N": 512}, {**dict.fromkeys(VLLM_KEYS, 16), "SPLIT_K": 2})
    with pytest.raises(InputError, match="also set SPLIT_K"):
        render_vllm([extra], kernel_chosen=True)
    both = [extra, _entry({"M": 64, "E": 8, "N": 512, "K": 1024})]
    out = render_vllm(both, kernel_chosen=False)  # not chosen: the misfit is left out, the rest exported
    assert [f.name for f in out] == ["E=8,N=256,device_name=NVIDIA_H100_80GB_HBM3.json"]


def test_vllm_export_refuses_two_problems_with_the_same_file_and_m():
    from tilepilot.storage.export_vllm import render_vllm

    a = _entry({"M": 64, "E": 8, "N": 512, "K": 1024, "dtype": "bf16"})
    b = _entry({"M": 64, "E": 8, "N": 512, "K": 2048, "dtype": "bf16"})
    with pytest.raises(InputError, match="two tuned problems have M=64"):
        render_vllm([a, b], kernel_chosen=True)


# ---- triton -------------------------------------------------------------------------------------

def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config_dict(cfg: Any) -> dict[str, Any]:
    """A triton.Config as the store writes the config: the export leaves out the parameters that
    hold their default (matmul's VARIANT, SPLIT_K, ALIGN_HINT: the plain kernel takes none)."""
    return {**param_defaults("matmul"), **cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


@pytest.fixture(scope="module")
def tuned(db_path, tmp_path_factory) -> ModuleType:
    (text,) = (f.text for f in exported(db_path, "triton"))
    path = tmp_path_factory.mktemp("triton") / "tuned_matmul.py"
    path.write_text(text)
    return load_module(path)


def test_triton_module_lists_each_winner_and_its_runner_up(db_path, tuned):
    winners = store_winners(db_path)
    assert tuned.KERNEL == "matmul" and tuned.DEVICE == "synthetic device" and tuned.KEY == ["M", "N", "K"]
    assert len(tuned.TUNED) == len(PROBLEMS) == len(winners)
    for problem, configs in tuned.TUNED:
        w = winner_of(db_path, problem)
        assert [config_dict(c) for c in configs] == [w["config"], w["runner_up_config"]]
        assert all(any(c is k for k in tuned.CONFIGS) for c in configs)
    assert len(tuned.CONFIGS) == len({json.dumps(config_dict(c), sort_keys=True) for c in tuned.CONFIGS})


def log_distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    return sum((math.log2(a[k]) - math.log2(b[k])) ** 2 for k in ("M", "N", "K"))


@pytest.mark.parametrize("problem", [
    {"M": 3, "N": 1024, "K": 2048, "dtype": "bf16"},
    {"M": 100, "N": 1000, "K": 2000, "dtype": "bf16"},
    {"M": 200, "N": 1024, "K": 2048, "dtype": "bf16"},
    {"M": 8192, "N": 4096, "K": 1024, "dtype": "bf16"},
    {"M": 64, "N": 64, "K": 64, "dtype": "fp16"},
    {"M": 4096, "N": 8192, "K": 8192, "dtype": "fp16"},
])
def test_triton_pick_takes_the_nearest_tuned_problem_of_the_same_dtype(db_path, tuned, problem):
    same = [p for p in PROBLEMS if p["dtype"] == problem["dtype"]]
    nearest = min(same, key=lambda p: log_distance(problem, p))
    assert config_dict(tuned.pick(**problem)) == winner_of(db_path, nearest)["config"]


def test_triton_pick_returns_the_winner_of_every_tuned_problem(db_path, tuned):
    for problem in PROBLEMS:
        assert config_dict(tuned.pick(**problem)) == winner_of(db_path, problem)["config"]
    without_dtype = tuned.pick(M=64, N=1024, K=2048)  # dtype optional: nearest over all dtypes
    assert config_dict(without_dtype) == winner_of(db_path, PROBLEMS[2])["config"]


def test_triton_pick_refuses_untuned_dtype_and_missing_dimensions(tuned):
    with pytest.raises(LookupError, match="fp32"):
        tuned.pick(M=64, N=1024, K=2048, dtype="fp32")
    with pytest.raises(TypeError, match="missing: K"):
        tuned.pick(M=64, N=1024)
    with pytest.raises(TypeError, match="unknown: dtyp"):
        tuned.pick(M=64, N=1024, K=2048, dtyp="bf16")


def test_triton_prune_hook_reads_the_problem_from_the_kernel_arguments(db_path, tuned):
    a = SimpleNamespace(dtype="torch.float16")
    kept = tuned.prune(tuned.CONFIGS, {"a_ptr": a, "b_ptr": a, "c_ptr": a, "M": 512, "N": 512, "K": 512})
    assert [config_dict(c) for c in kept] == [winner_of(db_path, PROBLEMS[-1])["config"]]
    b = SimpleNamespace(dtype="torch.bfloat16")
    kept = tuned.prune(tuned.CONFIGS, {"a_ptr": b, "M": 1}, N=1024, K=2048)
    assert [config_dict(c) for c in kept] == [winner_of(db_path, PROBLEMS[0])["config"]]


def test_triton_picked_config_launches_the_matmul_kernel_under_the_interpreter(tuned):
    """The exported Config's kwargs are the kernel's meta-parameters: a real launch, checked."""
    script = textwrap.dedent(f"""
        import importlib.util, json, sys
        import torch, triton
        spec = importlib.util.spec_from_file_location("tuned", {tuned.__file__!r})
        tuned = importlib.util.module_from_spec(spec); spec.loader.exec_module(tuned)
        from tilepilot.kernels.matmul_triton import matmul_kernel
        M, N, K = 48, 80, 96  # an untuned fp16 shape: the nearest tuned problem is 512^3
        a, b = torch.randn(M, K).half(), torch.randn(K, N).half()
        c = torch.full((M, N), float("nan"), dtype=torch.float16)
        args = dict(a_ptr=a, b_ptr=b, c_ptr=c, M=M, N=N, K=K, stride_am=K, stride_ak=1, stride_bk=N,
                    stride_bn=1, stride_cm=N, stride_cn=1)
        (cfg,) = tuned.prune(tuned.CONFIGS, args)
        meta = cfg.all_kwargs()
        grid = (triton.cdiv(M, meta["BLOCK_SIZE_M"]) * triton.cdiv(N, meta["BLOCK_SIZE_N"]),)
        matmul_kernel[grid](**args, **{{k: v for k, v in meta.items() if k in cfg.kwargs}},
                            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        err = ((c.float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm()).item()
        print(json.dumps({{"config": {{**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}},
                          "err": err}}))
    """)
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert {**param_defaults("matmul"), **got["config"]} == config_dict(tuned.pick(M=48, N=80, K=96, dtype="fp16"))
    assert got["err"] < 2e-3


@pytest.mark.gpu
def test_autotune_with_the_export_runs_the_winner_on_the_gpu(db_path, tuned):
    """@triton.autotune(configs=CONFIGS, key=KEY, prune) on the matmul kernel: each tuned shape runs
    its declared winner (and an untuned one the nearest tuned problem's), and computes C = A @ B."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import triton

    from tilepilot.kernels.matmul_triton import matmul_kernel

    kernel = triton.autotune(configs=tuned.CONFIGS, key=tuned.KEY,
                             prune_configs_by={"early_config_prune": tuned.prune})(matmul_kernel)
    untuned = {"M": 100, "N": 1000, "K": 2000, "dtype": "bf16"}
    for problem in [*PROBLEMS, untuned]:
        m, n, k = problem["M"], problem["N"], problem["K"]
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[problem["dtype"]]
        a = torch.randn(m, k, device="cuda").to(dtype)
        b = torch.randn(k, n, device="cuda").to(dtype)
        c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)

        def grid(meta: dict[str, Any], m: int = m, n: int = n) -> tuple[int]:
            return (triton.cdiv(m, meta["BLOCK_SIZE_M"]) * triton.cdiv(n, meta["BLOCK_SIZE_N"]),)

        kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
        torch.cuda.synchronize()
        ran = config_dict(kernel.best_config)
        if problem is untuned:
            nearest = min((p for p in PROBLEMS if p["dtype"] == "bf16"), key=lambda p: log_distance(problem, p))
            assert ran == winner_of(db_path, nearest)["config"]
        else:
            assert ran == winner_of(db_path, problem)["config"]
        ref = a.float() @ b.float()
        err = ((c.float() - ref).norm() / ref.norm()).item()
        assert err < {"bf16": 1e-2, "fp16": 2e-3}[problem["dtype"]], (problem, err)


def test_triton_export_needs_one_kernel_and_one_device(db_path, tmp_path):
    from tilepilot.storage.export_triton import render_triton

    e = _entry({"M": 64, "N": 512, "K": 512, "dtype": "bf16"}, kernel="matmul")
    with pytest.raises(InputError, match="one module per device"):
        render_triton([e, _entry({"M": 64, "N": 512, "K": 512, "dtype": "bf16"}, kernel="matmul", device="B")],
                      source="x")
    with pytest.raises(InputError, match="one module per kernel"):
        render_triton([e, _entry({"M": 64, "N": 512, "K": 512, "dtype": "bf16"}, kernel="other")], source="x")


# ---- json ---------------------------------------------------------------------------------------

def test_json_export_explains_each_winner_with_the_stores_numbers(db_path):
    (out,) = exported(db_path, "json")
    doc = json.loads(out.text)
    assert doc["format"] == "tilepilot.winners/1"
    winners = store_winners(db_path)
    assert len(doc["winners"]) == len(winners)
    con = sqlite3.connect(db_path)
    try:
        evidence = con.execute("SELECT hypothesis_id, experiment_a, experiment_b FROM evidence").fetchall()
        tested = dict(con.execute("SELECT experiment_key, hypothesis_id FROM trials WHERE hypothesis_id IS NOT NULL"))
    finally:
        con.close()
    ties = 0
    for entry in doc["winners"]:
        w = winners[json.dumps(entry["problem"], sort_keys=True, separators=(",", ":"))]
        assert entry["config"] == w["config"] and entry["median_ms"] == w["median_ms"]
        assert entry["margin"] == w["margin"] and entry["tie"] == bool(w["tie"]) and entry["noise"] == w["rel_spread"]
        assert entry["runner_up"]["config"] == w["runner_up_config"]
        assert entry["runner_up"]["median_ms"] == w["runner_up_ms"]
        assert entry["evidence"]["winner"] == w["experiment_key"]
        assert entry["evidence"]["runner_up"] == w["runner_up_key"]
        keys = {w["experiment_key"], w["runner_up_key"]}
        expected = {h for h, a, b in evidence if a in keys or b in keys}
        if w["experiment_key"] in tested:
            expected.add(tested[w["experiment_key"]])
        assert set(entry["evidence"]["hypotheses"]) == expected
        assert entry["device"] == "synthetic device" and entry["backend"] == "replay"
        assert entry["versions"] == {"kernel": w["kernel_version"], "torch": "0.0", "triton": "0.0", "driver": ""}
        assert entry["campaign"] == "grid"
        assert ("a tie" in entry["why"]) == entry["tie"]
        ties += entry["tie"]
    assert 0 < ties < len(winners)  # the fixture has both: the flag is data, not a constant


def test_export_takes_the_latest_decision_when_campaigns_tuned_the_same_problem(tmp_path):
    db = build_store(tmp_path, name="first", budget=32)
    build_store(tmp_path, name="second", proposer="random", budget=3)
    doc = json.loads(exported(db, "json")[0].text)
    assert {e["campaign"] for e in doc["winners"]} == {"second"}
    first = json.loads(exported(db, "json", campaign="first")[0].text)
    assert {e["campaign"] for e in first["winners"]} == {"first"}


# ---- command line -------------------------------------------------------------------------------

def test_cli_writes_vllm_files_to_a_folder_and_json_to_stdout(db_path, tmp_path, capsys):
    assert main(["export", "--db", str(db_path), "--format", "vllm", "-o", str(tmp_path / "configs")]) == 0
    assert sorted(p.name for p in (tmp_path / "configs").iterdir())[0] == BF16_FILE
    capsys.readouterr()
    assert main(["export", "--db", str(db_path), "--format", "json", "--problem", "M=64"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [e["problem"]["M"] for e in doc["winners"]] == [64]
    assert main(["export", "--db", str(db_path), "--format", "vllm", "--problem", "dtype=fp16"]) == 0
    winner = {k: v for k, v in winner_of(db_path, PROBLEMS[-1])["config"].items() if k in VLLM_KEYS}
    assert json.loads(capsys.readouterr().out) == {"512": winner}


@pytest.mark.parametrize(("argv", "message"), [
    (["--format", "xml"], "unknown export format 'xml' (allowed: vllm, triton, json)"),
    (["--format", "vllm"], "gives 2 files"),
    (["--format", "json", "--campaign", "nope"], "no campaign 'nope' (known: grid)"),
    (["--format", "json", "--kernel", "softmax"], "no declared winners to export for kernel 'softmax'"),
    (["--format", "json", "-o", "/nonexistent-folder/x.json"], "folder '/nonexistent-folder' does not exist"),
    (["--format", "triton", "--problem", "M"], "is not KEY=VALUE"),
    ([], "the following arguments are required: --format"),
])
def test_cli_export_mistakes_are_one_line_and_exit_2(db_path, capsys, argv, message):
    assert main(["export", "--db", str(db_path), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cli_export_of_a_missing_store_is_one_line(tmp_path, capsys):
    assert main(["export", "--db", str(tmp_path / "none.db"), "--format", "json"]) == 2
    assert "no tilepilot database" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()


# ---- fused_moe: the file vLLM's fused-MoE layer looks up ------------------------------------------

MOE_TOKENS = (1, 16, 64, 256, 1024)
MOE_SHAPE = {"E": 8, "topk": 2, "N": 1024, "K": 512, "dtype": "bf16"}  # N: w1's rows (gate and up)


def moe_ms(problem: dict[str, Any], config: dict[str, Any]) -> float:
    """SYNTHETIC: rows per expert decide the best BLOCK_SIZE_M; the rest is a mild preference."""
    rows = problem["M"] * problem["topk"] / problem["E"]
    waste = max(1.0, config["BLOCK_SIZE_M"] / max(rows, 1.0))
    return round(0.01 * waste * (1 + 0.07 * (config["num_warps"] == 8)) * (1 + 0.03 * abs(config["num_stages"] - 3.6))
                 * (128 / config["BLOCK_SIZE_N"]) ** 0.2 * (1 + 0.02 * (config["GROUP_SIZE_M"] == 1))
                 * (64 / config["BLOCK_SIZE_K"]) ** 0.1 * (1 + 0.001 * problem["M"] ** 0.5), 7)


@pytest.fixture(scope="module")
def moe_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tilepilot.kernels.registry import get_family
    from tilepilot.orchestrator.tune import TuneOptions, tune

    folder = tmp_path_factory.mktemp("moe")
    family = get_family("fused_moe")
    lines = []
    for m in MOE_TOKENS:
        problem = family.parse_problem({"M": m, **MOE_SHAPE})
        for config in family.space().valid(problem)[::3]:
            c = config.as_dict()
            median = moe_ms(problem.as_dict(), c)
            lines.append(json.dumps({"kernel": "fused_moe", "problem": problem.as_dict(), "config": c, "status": "ok",
                                     "median_ms": median, "p20_ms": median * 0.99, "p80_ms": median * 1.01, "reps": 40,
                                     "device": "synthetic device", "torch": "0.0", "triton": "0.0"}))
    dataset = folder / "moe.jsonl"
    dataset.write_text("\n".join(lines) + "\n")
    camp = folder / "moe.toml"
    camp.write_text('[campaign]\nname = "moe"\nkernel = "fused_moe"\nproposer = "grid"\nbudget = 1000\nseed = 1\n')
    tune(TuneOptions(campaign=camp, backend="replay", dataset=dataset, db=folder / "moe.db"))
    return folder / "moe.db"


def test_fused_moe_export_is_the_file_vllm_looks_up_and_picks_the_declared_winners(moe_db, tmp_path):
    files = exported(moe_db, "vllm", kernel="fused_moe")
    # vLLM's name: E and w2.shape[2] (the intermediate size after silu_and_mul: half of w1's N); no
    # dtype selector for bf16
    assert [f.name for f in files] == [vllm_reference_name(8, MOE_SHAPE["N"] // 2, "synthetic device", None)]
    path = tmp_path / files[0].name
    path.write_text(files[0].text)
    data = json.loads(files[0].text)
    assert list(data) == [str(m) for m in MOE_TOKENS]
    assert all(set(cfg) == set(VLLM_KEYS) and all(isinstance(v, int) for v in cfg.values()) for cfg in data.values())
    winners = {w["problem"]["M"]: w["config"] for w in store_winners(moe_db).values()}
    assert sorted(winners) == list(MOE_TOKENS)
    assert len({json.dumps(c, sort_keys=True) for c in winners.values()}) > 1  # the winners differ with M
    for m in (1, 2, 5, 12, 16, 40, 64, 100, 256, 600, 1024, 50_000):
        nearest = min(MOE_TOKENS, key=lambda t: abs(t - m))
        assert vllm_lookup(path, m) == winners[nearest]


def test_json_export_carries_baseline_median_config_recheck_and_learnings(db_path):
    (out,) = exported(db_path, "json")
    doc = json.loads(out.text)
    winners = store_winners(db_path)
    con = sqlite3.connect(db_path)
    try:
        learned = dict(con.execute("SELECT hypothesis_id, id FROM learnings"))
    finally:
        con.close()
    for entry in doc["winners"]:
        w = winners[json.dumps(entry["problem"], sort_keys=True, separators=(",", ":"))]
        assert entry["median_config_ms"] == w["median_config_ms"]
        assert entry["speedup_vs_median_config"] == pytest.approx(w["median_config_ms"] / w["median_ms"])
        assert entry["recheck_err"] == w["recheck_err"]
        expected = None if w["baseline_ms"] is None else {
            "name": w["baseline_name"], "median_ms": w["baseline_ms"], "speedup": w["baseline_ms"] / w["median_ms"]}
        assert entry["baseline"] == expected
        assert entry["evidence"]["learnings"] == sorted(learned[h] for h in entry["evidence"]["hypotheses"]
                                                        if h in learned)


def test_triton_export_leaves_out_variant_parameters_at_their_default(tmp_path):
    from tilepilot.storage.export_triton import render_triton

    base = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8, "num_warps": 4,
            "num_stages": 3}
    defaults = param_defaults("matmul")
    assert {"VARIANT", "SPLIT_K"} <= set(defaults)
    plain = _entry({"M": 64, "N": 512, "K": 512, "dtype": "bf16"}, {**base, **defaults}, kernel="matmul")
    split = _entry({"M": 16, "N": 512, "K": 8192, "dtype": "bf16"},
                   {**base, **defaults, "VARIANT": "splitk", "SPLIT_K": 4}, kernel="matmul")
    module = tmp_path / "only_plain.py"
    module.write_text(render_triton([plain], source="x", defaults=defaults))
    tuned = load_module(module)
    assert tuned.VARIANT_PARAMS == [] and tuned.CONFIGS[0].kwargs == {k: v for k, v in base.items()
                                                                       if not k.startswith("num_")}
    module = tmp_path / "with_split.py"
    module.write_text(render_triton([plain, split], source="x", defaults=defaults))
    tuned = load_module(module)
    assert tuned.VARIANT_PARAMS == ["SPLIT_K", "VARIANT"]
    assert tuned.CONFIGS[1].kwargs["VARIANT"] == "splitk" and tuned.CONFIGS[1].kwargs["SPLIT_K"] == 4
    assert "VARIANT" not in tuned.CONFIGS[0].kwargs
