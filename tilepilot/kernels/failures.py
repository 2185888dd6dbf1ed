"""Which exceptions are a config's own failure (data), and which are bugs (raised).

Compile: Triton's CompilationError, ptxas failures and MLIR pass failures are `compile_error`;
a Triton without a backend for the target is BackendUnavailable (the machine's fault, not the
config's). Launch: Triton's OutOfResources and CUDA's "too many resources requested" are
`out_of_resources` (never `oom`: a config asking more of a block than the SM has is the
config's own limit); torch.cuda.OutOfMemoryError (torch.OutOfMemoryError), and a CUDA "out of
memory" error raised as a plain RuntimeError (Triton's driver calls), are `oom`; an illegal or misaligned address, a
launch failure, an illegal instruction, ... leave the CUDA context unusable ("sticky"). Anything
else is not classified: the caller lets it raise.
"""

from __future__ import annotations

from tilepilot.experiments import Status

STICKY_MARKERS = (
    "illegal memory access", "illegal address", "misaligned address", "unspecified launch failure",
    "illegal instruction", "invalid program counter", "hardware stack error", "device-side assert",
    "launch timed out", "cuda_error_illegal_address", "cuda_error_launch_failed",
    "cuda_error_misaligned_address", "cuda_error_illegal_instruction", "cuda_error_hardware_stack_error",
    "cuda_error_invalid_pc", "cuda_error_assert", "cuda_error_launch_timeout", "unrecoverable",
)
RESOURCE_MARKERS = ("too many resources requested", "out of resources", "cuda_error_launch_out_of_resources")
OOM_MARKERS = ("out of memory", "cuda_error_out_of_memory")
PASS_FAILURE_MARKERS = ("passmanager::run failed", "ptxas", "failed to legalize", "llvm error")
NO_BACKEND_MARKERS = ("compatible backends for target",)


def one_line(e: BaseException, limit: int = 500) -> str:
    """The first non-empty line of an exception's text, prefixed with its type, cut to `limit`."""
    text = str(e).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    msg = f"{type(e).__name__}: {first}" if first else type(e).__name__
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def is_sticky(e: BaseException) -> bool:
    text = str(e).lower()
    return isinstance(e, RuntimeError) and any(m in text for m in STICKY_MARKERS)


def launch_failure(e: BaseException) -> Status | None:
    """OUT_OF_RESOURCES or OOM for a known launch failure that leaves the context usable, else None."""
    import torch
    from triton.runtime.errors import OutOfResources

    if isinstance(e, OutOfResources):
        return Status.OUT_OF_RESOURCES
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return Status.OOM
    if not isinstance(e, RuntimeError) or is_sticky(e):
        return None
    text = str(e).lower()
    if any(m in text for m in RESOURCE_MARKERS):
        return Status.OUT_OF_RESOURCES
    if any(m in text for m in OOM_MARKERS):
        return Status.OOM
    return None


def compile_failure(e: BaseException) -> str | None:
    """"compile_error" or "no_backend" for a known compile failure, else None."""
    from triton.compiler.errors import CompilationError

    ptxas_error = _optional_error("PTXASError")
    if isinstance(e, CompilationError) or (ptxas_error is not None and isinstance(e, ptxas_error)):
        return "compile_error"
    text = str(e).lower()
    if isinstance(e, RuntimeError) and any(m in text for m in NO_BACKEND_MARKERS):
        return "no_backend"
    if isinstance(e, RuntimeError) and any(m in text for m in PASS_FAILURE_MARKERS):
        return "compile_error"
    return None


def _optional_error(name: str) -> type[BaseException] | None:
    from triton.runtime import errors

    return getattr(errors, name, None)
