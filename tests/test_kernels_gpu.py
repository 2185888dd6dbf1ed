"""The kernels on a real GPU: correctness (bf16, fp16, masked shapes), ahead-of-time compilation
in a process without a GPU followed by a cache hit, the AOT kernel being the JIT's kernel, the
sticky illegal-address path, a kernel that never ends, timings against cuBLAS, and NVML."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tilepilot.experiments import Config, Problem, Status

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

REPO = Path(__file__).resolve().parents[1]


def cfg(bm: int, bn: int, bk: int, g: int = 8, w: int = 4, s: int = 3, **extra: str) -> Config:
    return Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": g,
                      "num_warps": w, "num_stages": s, **extra})


def prob(m: int, n: int, k: int, dtype: str) -> Problem:
    return Problem.of({"M": m, "N": n, "K": k, "dtype": dtype})


@pytest.fixture(scope="module")
def evaluator() -> Iterator[object]:
    from tilepilot.kernels.evaluate import Evaluator

    yield Evaluator("gpu", rounds=2, block_ms=2.0, outclass_ratio=None)  # every config timed


def child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **extra}
    env.pop("TRITON_INTERPRET", None)
    return env


@pytest.mark.parametrize("problem", [prob(33, 47, 65, "fp16"), prob(33, 47, 65, "bf16"),
                                     prob(1, 4096, 4096, "bf16"), prob(3000, 5000, 1000, "fp16"),
                                     prob(512, 512, 512, "bf16")], ids=lambda p: p.label())
def test_matmul_is_correct_on_gpu(evaluator, problem: Problem) -> None:
    configs = [cfg(64, 64, 32), cfg(128, 128, 64, w=8, s=4), cfg(128, 256, 64, w=8)]
    results = evaluator.evaluate("matmul", problem, configs)
    tol = 1e-2 if problem["dtype"] == "bf16" else 2e-3
    for r in results:
        assert r.status is Status.OK, r.message
        assert 0 < r.max_rel_err < tol
        assert r.timing.method in ("cuda-events", "cuda-graph") and r.timing.l2_flushed and r.timing.median_ms > 0
        assert r.timing.stop_reason in ("spread", "cap") and r.timing.timed_ms > 0
        assert r.extra["n_spills"] is not None and r.extra["shared_bytes"] > 0
        assert r.env.backend == "gpu" and r.env.driver


def test_aot_compile_without_gpu_then_cache_hit_in_gpu_process(evaluator, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    problem, config = prob(2048, 2048, 2048, "fp16"), cfg(128, 64, 64, g=4, w=4, s=4)
    code = f"""
        import json
        from tilepilot.experiments import Config, Problem
        from tilepilot.kernels.base import Target
        from tilepilot.kernels.evaluate import compile_config
        o = compile_config("matmul", Problem.of({problem.as_dict()!r}), Config.of({config.as_dict()!r}), Target())
        print(json.dumps([o.status.value, o.compile_ms, o.shared_bytes]))
    """
    env = child_env(CUDA_VISIBLE_DEVICES="", TRITON_CACHE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    status, cold_ms, shared = json.loads(proc.stdout.strip().splitlines()[-1])
    assert status == "ok"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    [result] = evaluator.evaluate("matmul", problem, [config])
    assert result.status is Status.OK, result.message
    assert result.extra["shared_bytes"] == shared
    assert result.compile_ms < min(100.0, cold_ms / 5), (result.compile_ms, cold_ms)


def test_aot_kernel_is_the_kernel_the_jit_builds() -> None:
    from tilepilot.kernels import matmul_triton
    from tilepilot.kernels.matmul import MatmulFamily, _int_args, _kernel

    family = MatmulFamily()
    for problem in (prob(4096, 4096, 4096, "bf16"), prob(1, 4096, 4096, "bf16"), prob(3000, 5000, 1000, "fp16")):
        config = cfg(128, 128, 64, w=8, s=4)
        inputs = family.make_inputs(problem, 0, "cuda")
        out = family.make_output(problem, inputs)
        aot = family.compile(problem, config, _device_target())
        grid = (1, 1, 1)
        _, _, constexprs = _kernel(problem, config)  # FEW_ROWS at M = 1 included
        jit = matmul_triton.matmul_kernel[grid](*inputs, out, **_int_args(problem), **constexprs,
                                                num_warps=8, num_stages=4)
        assert dict(aot.src.signature) == dict(jit.src.signature)
        assert _norm_attrs(aot.src.attrs) == _norm_attrs(jit.src.attrs)
        assert aot.asm["ptx"] == jit.asm["ptx"], problem.label()


def test_illegal_address_raises_sticky_error_for_that_config() -> None:
    code = """
        from tilepilot.experiments import Config, Problem
        from tilepilot.kernels.evaluate import Evaluator, StickyCudaError
        base = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8, "num_warps": 4,
                "num_stages": 3}
        p = Problem.of({"M": 256, "N": 256, "K": 256, "dtype": "bf16"})
        try:
            Evaluator("gpu").evaluate("matmul_faults", p, [Config.of({**base, "FAULT": f}) for f in ("none", "oob")])
        except StickyCudaError as e:
            print("sticky", e.index, e.message)
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=child_env(), timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("sticky 1 ") and "illegal" in line.lower()


def test_kernel_that_never_ends_runs_until_its_process_is_killed() -> None:
    code = """
        from tilepilot.experiments import Config, Problem
        from tilepilot.kernels.evaluate import Evaluator
        base = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8, "num_warps": 4,
                "num_stages": 3}
        p = Problem.of({"M": 256, "N": 256, "K": 256, "dtype": "bf16"})
        Evaluator("gpu").evaluate("matmul_faults", p, [Config.of({**base, "FAULT": "hang"})],
                                  on_start=lambda i: print("started", i, flush=True))
        print("returned", flush=True)
    """
    with subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True,
                          env=child_env()) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "started 0"
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        finally:
            proc.kill()
        proc.wait(timeout=60)


def test_timings_are_sane_against_cublas(evaluator) -> None:
    from tilepilot.kernels import get_family

    problem = prob(4096, 4096, 4096, "bf16")
    family = get_family("matmul")
    [result] = evaluator.evaluate("matmul", problem, [family.default_config(problem)])
    cublas = evaluator.baseline("matmul", problem)
    work = family.work(problem)
    assert result.status is Status.OK
    assert 100 < work.tflops(cublas.median_ms) < 1200
    assert 50 < work.tflops(result.median_ms) < 1200
    assert result.median_ms < 5 * cublas.median_ms
    assert cublas.p20_ms <= cublas.median_ms <= cublas.p80_ms


def test_a_config_far_slower_than_the_best_is_verified_but_not_timed_further() -> None:
    from tilepilot.kernels.evaluate import Evaluator

    ev = Evaluator("gpu")  # outclass_ratio 2 by default
    problem, fast, slow = prob(4096, 4096, 4096, "fp16"), cfg(128, 256, 64, w=8), cfg(32, 32, 32, w=2, s=2)
    first = ev.evaluate("matmul", problem, [fast, slow])
    assert [r.status for r in first] == [Status.OK, Status.OK]
    assert first[0].timing.stop_reason in ("spread", "cap") and first[0].timing.l2_flushed
    t = first[1].timing
    assert (t.stop_reason, t.reps, t.l2_flushed) == ("outclassed", 3, False)  # its 3 verification launches
    assert t.median_ms >= 2 * first[0].timing.median_ms and t.timed_ms == pytest.approx(3 * t.median_ms, rel=0.2)
    [alone] = ev.evaluate("matmul", problem, [slow])  # the best timed before is the reference
    assert alone.timing.stop_reason == "outclassed"
    [close] = ev.remeasure("matmul", problem, [slow])  # a re-measurement times every config
    assert close.timing.stop_reason in ("spread", "cap") and close.timing.l2_flushed
    assert 0.8 < t.median_ms / close.timing.median_ms < 1.25  # the verification launches told its time


def test_recheck_passes_on_fresh_inputs(evaluator) -> None:
    check = evaluator.recheck("matmul", prob(1000, 3000, 2000, "bf16"), cfg(128, 128, 64, w=8))
    assert check.passed and 0 < check.max_rel_err < 1e-2


def test_nvml_reads_the_evaluators_gpu(evaluator) -> None:
    from tilepilot.kernels import telemetry

    assert telemetry.nvml_available()
    uuid = evaluator.gpu_uuid()
    sample = telemetry.sample_gpu(uuid, "node", "w0", "test")
    assert sample.uuid == uuid and sample.name == torch.cuda.get_device_name(0)
    assert sample.sm_clock_mhz > 0 and sample.power_w > 0 and sample.mem_total_mb > 1000
    assert any(s.uuid == uuid for s in telemetry.sample_all("node"))
    [result] = evaluator.evaluate("matmul", prob(256, 256, 256, "fp16"), [cfg(64, 64, 32)])
    assert result.telemetry.sm_clock_mhz > 0 and result.telemetry.temp_c > 0


def _device_target() -> object:
    from tilepilot.kernels.evaluate import Evaluator

    return Evaluator("gpu").target()


def _norm_attrs(attrs: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in dict(attrs).items()}  # type: ignore[call-overload]
