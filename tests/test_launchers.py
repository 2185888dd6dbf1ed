"""Kernel launchers built by the compiler, not by the GPU process (compile.build_launchers): the
kernels of a compiled config are all found, compilers racing on one launcher take turns, and on a
GPU with a Triton that builds one launcher per signature, a GPU process evaluating configs the
compile side compiled builds nothing with the C compiler, while without the launchers it would
(the count can tell)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tilepilot.kernels.compile import _compiled_kernels, _lock, build_launchers
from tilepilot.kernels.matmul import SplitKCompiled

REPO = Path(__file__).resolve().parents[1]


class _Kernel:
    def __init__(self, name: str) -> None:
        self.name, self.src, self.metadata = name, object(), object()


def test_every_kernel_of_a_compiled_config_is_found() -> None:
    main, reduce = _Kernel("main"), _Kernel("reduce")
    assert _compiled_kernels(main) == [main]
    assert _compiled_kernels(SplitKCompiled(main, reduce)) == [main, reduce]  # not just the main one it reads as
    assert _compiled_kernels((main, [reduce])) == [main, reduce]
    assert _compiled_kernels("not a kernel") == []


def test_a_launcher_being_built_elsewhere_is_waited_for(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    with open(path, "a") as held, open(path, "a") as mine:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert not _lock(mine, 0.05)  # held by the other: waited, then gave up
        fcntl.flock(held, fcntl.LOCK_UN)
        assert _lock(mine, 0.05)


def test_nothing_to_build_is_not_an_error() -> None:
    assert build_launchers("not a kernel") == 0


COMPILE = textwrap.dedent("""
    import json, sys
    from tilepilot.experiments import Config, Problem
    from tilepilot.kernels.base import Target
    from tilepilot.kernels.evaluate import compile_config
    configs, launchers = json.loads(sys.argv[1]), sys.argv[2] == "1"
    out = [compile_config("matmul", Problem.of({"M": 512, "N": 512, "K": 512, "dtype": "fp16"}), Config.of(c),
                          Target(), launchers=launchers) for c in configs]
    print(json.dumps([[o.status.value, o.launchers_built] for o in out]))
""")

EVALUATE = textwrap.dedent("""
    import json, sys
    from tilepilot.experiments import Config, Problem
    from tilepilot.kernels.evaluate import Evaluator
    from tilepilot.orchestrator.child import _CompileCounter, _warm_up_gpu
    ev = Evaluator("gpu", rounds=1, outclass_ratio=None)
    _warm_up_gpu()
    counter = _CompileCounter("gpu")
    results = ev.evaluate("matmul", Problem.of({"M": 512, "N": 512, "K": 512, "dtype": "fp16"}),
                          [Config.of(c) for c in json.loads(sys.argv[1])])
    print(json.dumps({"statuses": [r.status.value for r in results], "compiles": counter.take()}))
""")

CONFIGS = [
    {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8, "num_warps": 4, "num_stages": 3},
    {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8, "num_warps": 4, "num_stages": 3,
     "VARIANT": "splitk", "SPLIT_K": 2},
    {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8, "num_warps": 4, "num_stages": 3,
     "VARIANT": "tma"},  # its tensor descriptors are arguments of the launcher's own kind
]


def _run(script: str, env: dict[str, str], *args: str) -> object:
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          cwd=REPO, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
@pytest.mark.parametrize("launchers", [True, False])
def test_the_gpu_process_builds_no_launcher_the_compiler_built(tmp_path: Path, launchers: bool) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from triton.backends.nvidia import driver as nvidia

    if not hasattr(nvidia, "make_launcher"):
        pytest.skip("this Triton launches every kernel through one generic launcher: nothing per signature")
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    env.pop("TRITON_INTERPRET", None)
    compiled = _run(COMPILE, {**env, "CUDA_VISIBLE_DEVICES": ""}, json.dumps(CONFIGS), "1" if launchers else "0")
    assert [status for status, _ in compiled] == ["ok", "ok", "ok"]
    if launchers:
        # the grouped kernel's, the split-K kernel's and its reduction's, the tma kernel's: four signatures
        assert sum(built for _, built in compiled) == 4
    evaluated = _run(EVALUATE, env, json.dumps(CONFIGS))
    assert evaluated["statuses"] == ["ok", "ok", "ok"]
    assert evaluated["compiles"] == (0 if launchers else 4)
