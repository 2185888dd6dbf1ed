"""vLLM tuned-config files: JSON keyed by the token count M, one config object per key.

The format is the one vLLM's fused-MoE layer reads (`get_moe_configs` in
vllm/model_executor/layers/fused_moe): string keys that parse as int M, each value
`{BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages}`; at run time
vLLM parses the keys and takes the config of the nearest M,
`configs[min(configs, key=lambda x: abs(x - M))]`.

File names. A problem with E (experts) and N gets vLLM's own name (`get_config_file_name` in
vllm/model_executor/layers/fused_moe/fused_moe.py), so that vLLM finds the file in
`VLLM_TUNED_CONFIG_FOLDER`: `E={E},N={N},device_name={device}[,dtype={selector}].json`, where
the device name has its spaces replaced by "_" (H200 variants are named NVIDIA_H200, as vLLM
does) and the dtype selector is omitted for fp16/bf16 (vLLM looks those up without one),
"float32" for fp32, and the problem's dtype otherwise (e.g. fp8_w8a8). vLLM's N is w2.shape[2],
the intermediate size after silu_and_mul, while the `fused_moe` family's N is the first GEMM's
(w1's rows: gate and up projections, twice that): its files are named N/2, as vLLM's
benchmark_moe names them. The name carries neither topk nor K (nor, for fp16/bf16, the dtype):
two tuned problems that differ only there would share a file and are refused (narrow the export).
Any other kernel whose problems have an M and whose configs are exactly those six parameters
(e.g. matmul; a matmul winner whose variant parameters say "the plain tutorial kernel",
VARIANT=grouped SPLIT_K=1 ALIGN_HINT=False, is such a config) gets the same content under
`kernel={kernel},{dims},device_name={device},dtype={dtype}.json`, with the problem's other fields
as `name=value` in the problem's order: vLLM does not look this name up itself, it only keeps
files apart.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from tilepilot.experiments import InputError
from tilepilot.storage.export import ExportEntry, ExportFile

log = logging.getLogger(__name__)

GATED_W1 = ("fused_moe",)  # kernels whose problem N counts w1's gate and up rows (vLLM's N is half)
VLLM_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
# Kernel-variant parameters at the values that mean vLLM's own kernel (matmul's defaults): not extra keys.
PLAIN_KERNEL = {"VARIANT": "grouped", "SPLIT_K": 1, "ALIGN_HINT": False, "EPILOGUE_SUBTILE": False,
                "WARP_SPECIALIZE": False, "PAD_ROWS": "none"}
# tilepilot dtype -> vLLM's dtype selector (None: no selector in the file name)
_DTYPE_SELECTOR: dict[str, str | None] = {"fp16": None, "bf16": None, "fp32": "float32", "float32": "float32"}


def render_vllm(entries: Sequence[ExportEntry], *, kernel_chosen: bool) -> list[ExportFile]:
    """One file per (kernel, device, problem without M), keys sorted by M.

    Raises InputError when a chosen kernel's problems have no M or its configs are not exactly
    vLLM's six parameters, or when two problems would give the same M in the same file.
    """
    files: dict[str, dict[int, tuple[ExportEntry, dict[str, int]]]] = {}
    skipped: dict[str, str] = {}
    for e in entries:
        reason = unsupported(e)
        if reason:
            if kernel_chosen:
                raise InputError(f"--format vllm cannot carry kernel {e.kernel!r}: {reason}")
            skipped.setdefault(e.kernel, reason)
            continue
        name = file_name(e)
        m = int(e.problem["M"])
        seen = files.setdefault(name, {})
        if m in seen:
            raise InputError(f"{name}: two tuned problems have M={m} ({_label(seen[m][0].problem)} and "
                             f"{_label(e.problem)}); narrow the export with --problem or --campaign")
        seen[m] = (e, {k: int(e.config[k]) for k in VLLM_KEYS})
    for kernel, reason in sorted(skipped.items()):
        log.warning("left out kernel %s: %s", kernel, reason)
    if not files:
        raise InputError("--format vllm: no selected winner fits vLLM's format ("
                         + "; ".join(f"{k}: {r}" for k, r in sorted(skipped.items())) + ")")
    return [ExportFile(name, _text(by_m)) for name, by_m in sorted(files.items())]


def unsupported(e: ExportEntry) -> str:
    """Why vLLM's format cannot carry this winner ("" when it can)."""
    m = e.problem.get("M")
    if not isinstance(m, int) or isinstance(m, bool):
        return f"its problems have no integer token count M (they have {', '.join(e.problem)})"
    if e.kernel in GATED_W1 and (not isinstance(e.problem.get("N"), int) or e.problem["N"] % 2):
        return f"its N={e.problem.get('N')!r} is not even (vLLM names the file by N/2: w1 holds gate and up rows)"
    keys = {k for k, v in e.config.items() if k not in PLAIN_KERNEL or type(v) is not type(PLAIN_KERNEL[k])
            or v != PLAIN_KERNEL[k]}
    if keys != set(VLLM_KEYS):
        missing, extra = sorted(set(VLLM_KEYS) - keys), sorted(keys - set(VLLM_KEYS))
        what = [f"lack {', '.join(missing)}"] if missing else []
        what += [f"also set {', '.join(extra)}"] if extra else []
        return f"vLLM configs are exactly {', '.join(VLLM_KEYS)}; its configs {' and '.join(what)}"
    return ""


def file_name(e: ExportEntry) -> str:
    device = device_name(e.device)
    p = e.problem
    if "E" in p and "N" in p:
        selector = dtype_selector(p.get("dtype"))
        return (f"E={p['E']},N={vllm_n(e.kernel, p['N'])},device_name={device}"
                + (f",dtype={selector}" if selector else "") + ".json")
    dims = ",".join(f"{k}={v}" for k, v in p.items() if k not in ("M", "dtype"))
    dtype = f",dtype={p['dtype']}" if "dtype" in p else ""
    return f"kernel={e.kernel}" + (f",{dims}" if dims else "") + f",device_name={device}{dtype}.json"


def vllm_n(kernel: str, n: Any) -> Any:
    """The N of vLLM's file name: w2.shape[2], half of fused_moe's N (w1's gate and up rows)."""
    return n // 2 if kernel in GATED_W1 else n


def device_name(device: str) -> str:
    """The device as vLLM writes it in file names."""
    name = device.replace(" ", "_")
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def dtype_selector(dtype: Any) -> str | None:
    if dtype is None:
        return None
    return _DTYPE_SELECTOR.get(str(dtype), str(dtype))


def _text(by_m: dict[int, tuple[ExportEntry, dict[str, int]]]) -> str:
    return json.dumps({str(m): cfg for m, (_, cfg) in sorted(by_m.items())}, indent=4) + "\n"


def _label(problem: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in problem.items())
