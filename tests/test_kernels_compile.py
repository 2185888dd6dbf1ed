"""Ahead-of-time compilation on a machine with no GPU: `compile_config` in a child process with
CUDA_VISIBLE_DEVICES="" fills the on-disk cache, a second call hits it, shared memory is
predicted against the target's limit, and an impossible target is BackendUnavailable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json
from tilepilot.experiments import BackendUnavailable, Problem
from tilepilot.kernels import get_family
from tilepilot.kernels.base import Target
from tilepilot.kernels.evaluate import compile_config
from tilepilot.kernels.matmul import pipelined_shared_bytes

family = get_family("matmul")
problem = Problem.of({"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"})
config = family.default_config(problem)
first = compile_config("matmul", problem, config, Target())
again = compile_config("matmul", problem, config, Target())
small = compile_config("matmul", problem, config, Target(max_shared_bytes=100_000))
out = {"first": [first.status.value, first.message, first.compile_ms, first.shared_bytes],
       "again_ms": again.compile_ms, "estimate": pipelined_shared_bytes(config, problem),
       "small": [small.status.value, small.message]}
try:
    compile_config("matmul", problem, config, Target(backend="nonexistent"))
except BackendUnavailable as e:
    out["no_backend"] = str(e)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def child(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "",
           "TRITON_CACHE_DIR": str(tmp_path_factory.mktemp("triton-cache"))}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_compile_without_gpu_fills_the_cache_and_hits_it_again(child: dict[str, Any]) -> None:
    status, message, first_ms, _ = child["first"]
    assert (status, message) == ("ok", "")
    assert child["again_ms"] < first_ms / 5


def test_shared_memory_of_the_compiled_kernel_matches_the_estimate(child: dict[str, Any]) -> None:
    assert child["first"][3] == child["estimate"]


def test_shared_memory_over_the_target_limit_is_out_of_resources(child: dict[str, Any]) -> None:
    status, message = child["small"]
    assert status == "out_of_resources" and "100000 B" in message


def test_target_without_a_backend_is_backend_unavailable(child: dict[str, Any]) -> None:
    assert "cannot compile for nonexistent" in child["no_backend"]


def test_compile_config_refuses_interpreter_mode() -> None:
    code = """
        from tilepilot.experiments import BackendUnavailable, Problem
        from tilepilot.kernels.base import Target
        from tilepilot.kernels.evaluate import compile_config
        try:
            compile_config("matmul", Problem.of({"M": 16, "N": 16, "K": 16, "dtype": "fp16"}),
                           __import__("tilepilot.kernels").kernels.get_family("matmul").default_config(None), Target())
        except BackendUnavailable as e:
            print("refused:", e)
    """
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "refused:" in proc.stdout and "TRITON_INTERPRET" in proc.stdout


def test_a_host_descriptor_argument_has_the_type_the_jit_gives_it() -> None:
    import torch
    from triton.runtime.jit import mangle_type
    from triton.tools.tensor_descriptor import TensorDescriptor

    from tilepilot.kernels.compile import Descriptor

    base = torch.empty((3000, 1000), dtype=torch.float16, device="meta")
    assert Descriptor("fp16", (128, 64)).signature() == mangle_type(TensorDescriptor.from_tensor(base, [128, 64]))


def test_tma_kernels_take_a_host_descriptor_per_operand_and_block() -> None:
    from tilepilot.experiments import Config
    from tilepilot.kernels.matmul import descriptor_blocks

    def cfg(bn: int, subtile: bool = False, variant: str = "tma") -> Config:
        return Config.of({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8,
                          "num_warps": 8, "num_stages": 3, "VARIANT": variant, "EPILOGUE_SUBTILE": subtile})

    assert descriptor_blocks(cfg(256)) == {"a_desc": ("a", (128, 64)), "b_desc": ("b", (64, 256)),
                                           "c_desc": ("c", (128, 256))}
    assert descriptor_blocks(cfg(256, subtile=True))["c_desc"] == ("c", (128, 128))  # C stored in halves
    assert descriptor_blocks(cfg(192)) == {"a_desc": ("a", (128, 64)), "b0_desc": ("b", (64, 128)),
                                           "b1_desc": ("b", (64, 64)), "c0_desc": ("c", (128, 128)),
                                           "c1_desc": ("c", (128, 64))}
    assert descriptor_blocks(cfg(256, variant="grouped")) == {}
