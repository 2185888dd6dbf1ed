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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tilepilot.kernels.base import Target

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True)
class Pointer:
    """A tensor argument: its Triton element type ("bf16", "fp16", "fp32", ...), 16-byte aligned."""

    dtype: str


ArgValue = Pointer | int


def int_class(value: int) -> str:
    """How the JIT sees an int: "1" (a constant), "d16" (divisible by 16) or "-"."""
    if value == 1:
        return "1"
    return "d16" if value % 16 == 0 else "-"


def aot_compile(fn: Any, args: Mapping[str, ArgValue], constexprs: Mapping[str, Any], target: Target,
                *, num_warps: int, num_stages: int) -> Any:
    """Compile `fn` for `target`; `args` maps each runtime argument to a Pointer or an int value."""
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
        if isinstance(value, Pointer):
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
