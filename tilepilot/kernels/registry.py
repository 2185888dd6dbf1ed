"""The kernel registry: family names to `KernelFamily` objects.

Built-in families are imported lazily, by name. User families come in three ways, all of
which a worker's child process also sees:

- `register(FamilyClass)` in the running process;
- the entry-point group `tilepilot.kernels` (each entry point loads a `KernelFamily` subclass);
- env var `TILEPILOT_KERNEL_MODULES`: comma-separated import paths of modules whose import
  calls `register(...)` (child processes inherit the environment, so they see them too).

An unknown name raises InputError listing the known ones.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

from tilepilot.experiments import InputError, Problem
from tilepilot.kernels.base import KernelFamily

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "tilepilot.kernels"
MODULES_ENV = "TILEPILOT_KERNEL_MODULES"

# name -> "module:ClassName", imported on first use
BUILTINS: dict[str, str] = {
    "matmul": "tilepilot.kernels.matmul:MatmulFamily",
    "matmul_faults": "tilepilot.kernels.faults:MatmulFaultsFamily",
    "softmax": "tilepilot.kernels.softmax:SoftmaxFamily",
    "rmsnorm": "tilepilot.kernels.norms:RmsnormFamily",
    "layernorm": "tilepilot.kernels.norms:LayernormFamily",
    "silu_mul_fp8_quant": "tilepilot.kernels.fp8_quant:SiluMulFp8QuantFamily",
    "attention": "tilepilot.kernels.attention:AttentionFamily",
    "fused_moe": "tilepilot.kernels.fused_moe:FusedMoeFamily",
}

_lock = threading.RLock()
_registered: dict[str, type[KernelFamily]] = {}
_instances: dict[str, KernelFamily] = {}
_plugins_loaded = False


def register(family_cls: type[KernelFamily]) -> type[KernelFamily]:
    """Make a user family known by its `name`. Usable as a class decorator.

    Raises InputError when the name is already taken by a different class.
    """
    name = getattr(family_cls, "name", None)
    if not isinstance(name, str) or not name:
        raise InputError(f"kernel family {family_cls.__qualname__} has no 'name' (a non-empty string)")
    with _lock:
        known = _registered.get(name)
        if known is not None and known is not family_cls:
            raise InputError(f"kernel {name!r} is registered twice ({_qualname(known)} and {_qualname(family_cls)})")
        if name in BUILTINS and _qualname(family_cls) != BUILTINS[name]:
            raise InputError(f"kernel {name!r} is a built-in kernel; choose another name")
        _registered[name] = family_cls
        _instances.pop(name, None)
    return family_cls


def family_names() -> list[str]:
    """Every known family name, sorted."""
    _load_plugins()
    with _lock:
        return sorted(set(BUILTINS) | set(_registered))


def get_family(name: str) -> KernelFamily:
    """The (shared, stateless) family object for `name`. Raises InputError for an unknown name."""
    _load_plugins()
    with _lock:
        inst = _instances.get(name)
        if inst is not None:
            return inst
        cls = _registered.get(name)
        if cls is None and name in BUILTINS:
            cls = _import_object(BUILTINS[name])
            _registered[name] = cls
        if cls is None:
            raise InputError(f"unknown kernel {name!r} (known kernels: {', '.join(family_names())})")
        inst = cls()
        _instances[name] = inst
        return inst


def problem_parsers() -> dict[str, Callable[[Mapping[str, Any]], Problem]]:
    """name -> family.parse_problem, for `experiments.load_campaign(kernels=...)`."""
    return {name: get_family(name).parse_problem for name in family_names()}


def _load_plugins() -> None:
    """Import the modules named in the env var and the entry points, once per process."""
    global _plugins_loaded
    with _lock:
        if _plugins_loaded:
            return
        _plugins_loaded = True
        for module in _env_modules():
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise InputError(f"{MODULES_ENV}: cannot import module {module!r}: {e}") from None
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            obj = ep.load()
            if not (isinstance(obj, type) and issubclass(obj, KernelFamily)):
                raise InputError(f"entry point {ep.name!r} in {ENTRY_POINT_GROUP} is not a KernelFamily subclass")
            register(obj)


def _env_modules() -> list[str]:
    raw = os.environ.get(MODULES_ENV, "")
    return [m.strip() for m in raw.split(",") if m.strip()]


def _import_object(path: str) -> type[KernelFamily]:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def _qualname(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _reset_for_tests() -> None:
    """Forget user registrations and plugin loading (tests only)."""
    global _plugins_loaded
    with _lock:
        _registered.clear()
        _instances.clear()
        _plugins_loaded = False


def param_defaults(kernel: str) -> dict[str, Any]:
    """A kernel's parameters that have a default (its variants' own parameters, e.g. matmul's
    VARIANT and SPLIT_K); none for a kernel this installation does not know."""
    try:
        params = get_family(kernel).space().params
    except InputError:
        return {}
    return {p.name: p.default for p in params if p.default is not None}
