"""Ahead-of-time compilation of a `@triton.jit` function, specialised as a JIT launch would be.

Triton's JIT specialises each argument on its value at launch: an int equal to 1 becomes the
constant 1, an int or a pointer divisible by 16 carries the `tt.divisibility = 16` attribute
(other runtime arguments an empty attribute list), an int that does not fit 32 bits is i64.
`aot_compile` applies the same rules to the values a launch will pass, so the ahead-of-time
kernel is the kernel the JIT would build (same PTX, same speed: checked on an H100 with Triton
3.6), and `launch_args` gives the arguments in the order the compiled kernel's launcher takes
them (every argument, constants included, as the JIT passes them).

Works in a process with no CUDA context (`CUDA_VISIBLE_DEVICES=""`): the target is given.
A second call with the same arguments hits Triton's on-disk cache.

`build_launchers` builds, in the compiling process, the C launcher that a Triton of 3.6's kind
builds with gcc on a kernel's first launch in a process (one per kernel signature, cached on disk
beside the kernels): the GPU process then loads it from the cache instead of compiling it.

Also the helpers every family (built in or a user's) shares: `launch` (a closure running the
ahead-of-time kernel, or the JIT under the interpreter), `hash_modules` (a family's source
hash over its modules, without importing them) and `interpreting` (TRITON_INTERPRET is on).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib.util
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilepilot.experiments import Config
from tilepilot.kernels.base import Target

log = logging.getLogger(__name__)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
LAUNCHER_WAIT_S = 60.0  # build_launchers: the longest a compiler waits for another's build of a launcher
_launchers_seen: set[str] = set()  # build_launchers: (cache folder, signature) keys this process has handled


@dataclass(frozen=True)
class Pointer:
    """A tensor argument: its Triton element type ("bf16", "fp16", "fp32", ...), 16-byte aligned."""

    dtype: str


@dataclass(frozen=True)
class Descriptor:
    """A tensor descriptor argument made on the host (`TensorDescriptor`): its Triton element type
    and the block shape its loads and stores move."""

    dtype: str
    block_shape: tuple[int, ...]

    def signature(self) -> str:
        """The type Triton's JIT gives such an argument, e.g. "tensordesc<bf16[128, 64]>"."""
        return f"tensordesc<{self.dtype}[{', '.join(str(d) for d in self.block_shape)}]>"


ArgValue = Pointer | Descriptor | int


def int_class(value: int) -> str:
    """How the JIT sees an int: "1" (a constant), "d16" (divisible by 16) or "-"."""
    if value == 1:
        return "1"
    return "d16" if value % 16 == 0 else "-"


def aot_compile(fn: Any, args: Mapping[str, ArgValue], constexprs: Mapping[str, Any], target: Target,
                *, num_warps: int, num_stages: int) -> Any:
    """Compile `fn` for `target`; `args` maps each runtime argument to a Pointer, a Descriptor or an int value."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    gpu_target = GPUTarget(target.backend, target.arch, target.warp_size)
    signature, consts, attrs = _specialise(fn.arg_names, args, constexprs, *_divisibility_attrs(gpu_target))
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=gpu_target, options={"num_warps": num_warps, "num_stages": num_stages})


def launch_args(arg_names: Sequence[str], values: Mapping[str, Any]) -> list[Any]:
    """Every argument in declaration order, constants included (Triton's launcher skips those)."""
    return [values[name] for name in arg_names]


def launch(fn: Any, grid: tuple[int, int, int], values: Mapping[str, Any], constexprs: Mapping[str, Any],
           config: Config, compiled: Any | None) -> Callable[[], None]:
    """A closure launching `fn` once: the ahead-of-time kernel if given, else through the JIT
    with the config's num_warps and, where the config has one, its num_stages (else Triton's
    default). `values` are the runtime arguments, `constexprs` the compile-time ones.

    Raises Triton's OutOfResources here, not in the closure, when the compiled kernel cannot
    be loaded on this device."""
    if compiled is None:
        kwargs = {**values, **constexprs, "num_warps": int(config["num_warps"])}
        if "num_stages" in config:
            kwargs["num_stages"] = int(config["num_stages"])

        def run_jit() -> None:
            fn[grid](**kwargs)

        return run_jit
    runner = compiled[grid]  # loads the binary: raises OutOfResources when it cannot run here
    args = launch_args(fn.arg_names, {**values, **constexprs})

    def run_aot() -> None:
        runner(*args)

    return run_aot


def build_launchers(compiled: Any) -> int:
    """Build the C launcher of each kernel in `compiled` (a CompiledKernel, or a tuple, list or
    dataclass holding several) into Triton's on-disk cache, where this Triton builds one launcher
    per kernel signature (3.6 does, with gcc, about 0.3 s, on the signature's first launch in a
    process; later versions launch every kernel through one generic launcher and need nothing).
    A GPU process launching the kernel later finds the launcher in the same cache and only loads it.

    Each signature is handled once per process and cache folder. Compilers racing on one
    signature take turns through a lock file in the cache folder: the first builds it, the others
    wait for it (at most LAUNCHER_WAIT_S) and load it, so that no compile is answered before its
    launcher is in the cache. Returns the launchers this call built or loaded; 0 where this
    Triton has none to build or this machine cannot build one (no libcuda, no C compiler: logged
    once, and the GPU process builds it on its first launch as before)."""
    try:
        from triton.backends.nvidia import driver as nvidia
    except ImportError:
        return 0
    if not hasattr(nvidia, "make_launcher"):  # a generic launcher: nothing per signature to build
        return 0
    cache_dir = os.environ.get("TRITON_CACHE_DIR", "")
    done = 0
    for kernel in _compiled_kernels(compiled):
        signature = getattr(kernel.src, "signature", None)
        if not isinstance(signature, dict) or getattr(kernel.metadata.target, "backend", "") != "cuda":
            continue
        what = repr((tuple(signature.values()), getattr(kernel.metadata, "tensordesc_meta", None)))
        key = hashlib.sha256(f"{cache_dir}\0{what}".encode()).hexdigest()[:16]
        if key in _launchers_seen:
            continue
        _launchers_seen.add(key)
        lock_path = Path(cache_dir or tempfile.gettempdir()) / f"tilepilot-launcher-{key}.lock"
        try:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            with open(lock_path, "a") as lock:
                if not _lock(lock, LAUNCHER_WAIT_S):
                    log.warning("the launcher of %s: waited %g s for another compiler's build; left to the "
                                "GPU process", kernel.name, LAUNCHER_WAIT_S)
                    continue
                nvidia.CudaLauncher(kernel.src, kernel.metadata)  # builds into the cache, or loads from it
        except Exception as e:  # the GPU process builds it on its first launch, as it would have
            log.warning("could not build the launcher of %s ahead: %s", kernel.name, str(e).splitlines()[0][:200])
            continue
        done += 1
    return done


def _lock(lock: Any, wait_s: float) -> bool:
    """Take an exclusive lock on the open file `lock` (released when it is closed), waiting up to
    `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


def _compiled_kernels(compiled: Any) -> list[Any]:
    """The CompiledKernels in `compiled`: those in its `compiled_parts` (a family's wrapper of
    several kernels says so), itself, or those in a tuple, list or dataclass."""
    parts = getattr(compiled, "compiled_parts", None)
    if isinstance(parts, (tuple, list)):
        return [k for part in parts for k in _compiled_kernels(part)]
    if hasattr(compiled, "metadata") and hasattr(compiled, "src"):
        return [compiled]
    if isinstance(compiled, (tuple, list)):
        parts = list(compiled)
    elif dataclasses.is_dataclass(compiled) and not isinstance(compiled, type):
        parts = [getattr(compiled, f.name) for f in dataclasses.fields(compiled)]
    else:
        return []
    return [k for part in parts for k in _compiled_kernels(part)]


def hash_modules(*modules: str) -> str:
    """Hash of the source files of `modules` (12 hex digits), read without importing them, so
    that the CPU side needs no triton. Raises ImportError for a module that cannot be found."""
    h = hashlib.sha256()
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ImportError(f"module {name} not found")
        h.update(Path(spec.origin).read_bytes())
    return h.hexdigest()[:12]


def interpreting() -> bool:
    """Whether this process runs Triton kernels under the interpreter (TRITON_INTERPRET on)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _specialise(arg_names: Sequence[str], args: Mapping[str, ArgValue], constexprs: Mapping[str, Any],
                divisible: Any, not_divisible: Any,
                ) -> tuple[dict[str, str], dict[str, Any], dict[tuple[int, ...], Any]]:
    missing = [n for n in arg_names if n not in args and n not in constexprs]
    if missing:
        raise ValueError(f"no value for kernel argument(s) {', '.join(missing)}")
    signature: dict[str, str] = {}
    consts: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    for i, name in enumerate(arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            consts[name] = constexprs[name]
            continue
        value = args[name]
        if isinstance(value, Descriptor):
            signature[name] = value.signature()  # no divisibility attribute, as the JIT gives none
        elif isinstance(value, Pointer):
            signature[name] = "*" + value.dtype
            attrs[(i,)] = divisible
        elif int_class(value) == "1":
            signature[name] = "constexpr"
            consts[name] = 1
        else:
            signature[name] = "i32" if INT32_MIN <= value <= INT32_MAX else "i64"
            attrs[(i,)] = divisible if value % 16 == 0 else not_divisible
    return signature, consts, attrs


def _divisibility_attrs(gpu_target: Any) -> tuple[Any, Any]:
    """The attributes Triton's JIT attaches to a runtime argument divisible by 16, and to one that
    is not (every runtime argument gets an entry, as in the JIT), for this target's backend."""
    from triton.compiler.compiler import make_backend

    backend = make_backend(gpu_target)
    return backend.parse_attr("D"), backend.parse_attr("")
