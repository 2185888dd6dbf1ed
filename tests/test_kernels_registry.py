"""The kernel registry: names, lazy built-ins, user families (register, env var, child processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tilepilot.experiments import InputError
from tilepilot.kernels import registry
from tilepilot.kernels.matmul import MatmulFamily

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    registry._reset_for_tests()
    yield
    registry._reset_for_tests()


def run_child(code: str, env: dict[str, str] | None = None) -> str:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_unknown_kernel_error_lists_known_kernels() -> None:
    known = ", ".join(registry.family_names())
    assert "matmul, matmul_faults" in known
    with pytest.raises(InputError) as err:
        registry.get_family("nope")
    assert str(err.value) == f"unknown kernel 'nope' (known kernels: {known})"


def test_builtins_are_known_and_shared() -> None:
    assert registry.family_names() == sorted(registry.BUILTINS)
    assert {"matmul", "matmul_faults"} <= set(registry.family_names())
    assert registry.get_family("matmul") is registry.get_family("matmul")
    assert registry.get_family("matmul").name == "matmul"


def test_problem_parsers_check_problems_of_each_family() -> None:
    parsers = registry.problem_parsers()
    assert set(parsers) == set(registry.BUILTINS)
    assert parsers["matmul"]({"M": 8, "N": 8, "K": 8, "dtype": "fp16"})["M"] == 8
    with pytest.raises(InputError):
        parsers["matmul"]({"M": 8, "N": 8, "K": 8, "dtype": "int8"})


def test_registered_user_family_is_found_by_name() -> None:
    class UserMatmul(MatmulFamily):
        name = "user_matmul"

    registry.register(UserMatmul)
    assert "user_matmul" in registry.family_names()
    assert isinstance(registry.get_family("user_matmul"), UserMatmul)


def test_register_refuses_a_builtin_name_and_a_taken_name() -> None:
    class Impostor(MatmulFamily):
        name = "matmul"

    with pytest.raises(InputError, match="built-in"):
        registry.register(Impostor)

    class First(MatmulFamily):
        name = "twice"

    class Second(MatmulFamily):
        name = "twice"

    registry.register(First)
    with pytest.raises(InputError, match="registered twice"):
        registry.register(Second)


def test_env_var_modules_register_families_in_child_processes(tmp_path: Path) -> None:
    (tmp_path / "my_kernels.py").write_text(textwrap.dedent("""
        from tilepilot.kernels import register
        from tilepilot.kernels.matmul import MatmulFamily

        @register
        class EnvMatmul(MatmulFamily):
            name = "env_matmul"
    """))
    out = run_child("""
        import json
        from tilepilot.kernels import family_names, get_family
        print(json.dumps([family_names(), type(get_family("env_matmul")).__name__]))
    """, env={"PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}", "TILEPILOT_KERNEL_MODULES": "my_kernels"})
    names, cls = json.loads(out)
    assert "env_matmul" in names and cls == "EnvMatmul"


def test_env_var_naming_a_missing_module_is_an_input_error() -> None:
    os.environ["TILEPILOT_KERNEL_MODULES"] = "no_such_module_xyz"
    try:
        with pytest.raises(InputError, match="no_such_module_xyz"):
            registry.family_names()
    finally:
        del os.environ["TILEPILOT_KERNEL_MODULES"]


def test_loading_families_imports_neither_torch_nor_triton() -> None:
    out = run_child("""
        import json, sys
        from tilepilot.kernels import get_family
        from tilepilot.experiments import Problem
        for name in ("matmul", "matmul_faults"):
            f = get_family(name)
            p = f.parse_problem({"M": 64, "N": 64, "K": 64, "dtype": "bf16"})
            f.space().valid(p); f.kernel_version(); f.work(p); f.specialisation(p, f.default_config(p))
        print(json.dumps(["torch" in sys.modules, "triton" in sys.modules]))
    """)
    assert json.loads(out) == [False, False]


def test_every_family_with_a_baseline_names_it() -> None:
    from tilepilot.kernels.base import KernelFamily

    for name in registry.family_names():
        family = registry.get_family(name)
        has_baseline = type(family).baseline is not KernelFamily.baseline
        assert bool(family.baseline_name) == has_baseline, name
    assert registry.get_family("matmul").baseline_name == "cuBLAS (torch.matmul)"
