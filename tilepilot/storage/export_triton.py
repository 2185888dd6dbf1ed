"""A Python module of `triton.Config`s for one kernel on one device, with a heuristic.

The generated module defines:
- `CONFIGS`: every exported config once (winners first), for `@triton.autotune(configs=CONFIGS, key=KEY)`;
- `TUNED`: (problem, [winner, runner-up]) per tuned problem;
- `KEY`: the problem's integer dimensions (the kernel's arguments of those names);
- `pick(**problem) -> triton.Config`: the winner of the nearest tuned problem, nearest in log2
  space of the KEY dimensions among the problems with the same non-integer fields (dtype);
- `prune(configs, named_args, **kwargs)`: an `early_config_prune` hook that keeps only
  `pick(...)` of the call's arguments, so the autotuned kernel runs the tuned winner (or the
  nearest one for an unseen shape) without benchmarking anything.

The text is deterministic: the same store and filters give the same bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from tilepilot.experiments import InputError, at_default
from tilepilot.storage.export import ExportEntry

# Config parameters that are `triton.Config` keyword arguments, not kernel meta-parameters.
CONFIG_ATTRS = ("num_warps", "num_stages", "num_ctas", "maxnreg")

_HEADER = '''"""Tuned Triton configs exported by tilepilot (`tilepilot export --format triton`). Generated: do not edit.

Use with the kernel whose arguments include the names in KEY:

    @triton.autotune(configs=CONFIGS, key=KEY, prune_configs_by={"early_config_prune": prune})
    @triton.jit
    def kernel(...): ...

With `prune`, each new shape runs `pick(...)`: the winner of the tuned problem nearest to it
(same dtype, distance in log2 of the KEY dimensions), with no benchmarking. Without `prune`,
autotune benchmarks every config of CONFIGS once per new key. `TUNED` lists each tuned problem
with its configs, the winner first and the runner-up second.
"""

from __future__ import annotations

import math
from typing import Any

import triton

'''

_FUNCTIONS = '''

def pick(**problem: Any) -> triton.Config:
    """The winner of the tuned problem nearest to `problem`.

    Fields not in KEY (e.g. dtype) must match when given; the nearest is the smallest sum of
    squared log2 ratios of the KEY dimensions, the first listed on a tie. Raises TypeError
    when a KEY dimension is missing or a field unknown, LookupError when no tuned problem matches the rest.
    """
    missing = [k for k in KEY if k not in problem]
    unknown = [k for k in problem if k not in KEY and k not in CATEGORICAL]
    if missing or unknown:
        raise TypeError(f"pick() takes {', '.join(KEY)} and optionally {', '.join(CATEGORICAL) or 'nothing else'}; "
                        f"missing: {', '.join(missing) or 'none'}; unknown: {', '.join(unknown) or 'none'}")
    fixed = {k: v for k, v in problem.items() if k in CATEGORICAL}
    candidates = [(p, c) for p, c in TUNED if all(p.get(k) == v for k, v in fixed.items())]
    if not candidates:
        tuned = sorted({", ".join(f"{k}={p.get(k)}" for k in CATEGORICAL) for p, _ in TUNED})
        raise LookupError(f"no tuned {KERNEL} problem with {fixed} (tuned: {'; '.join(tuned)})")

    def distance(p: dict[str, Any]) -> float:
        return sum((math.log2(max(float(problem[k]), 1.0)) - math.log2(max(float(p[k]), 1.0))) ** 2 for k in KEY)

    return min(candidates, key=lambda pc: distance(pc[0]))[1][0]


def prune(configs: list[triton.Config], named_args: dict[str, Any], **kwargs: Any) -> list[triton.Config]:
    """`early_config_prune` hook: only `pick(...)` for this call (dtype from the first tensor argument)."""
    args = {**named_args, **kwargs}
    problem = {k: args[k] for k in KEY if k in args}
    if "dtype" in CATEGORICAL:
        tensor = next((v for v in args.values() if hasattr(v, "dtype")), None)
        if tensor is not None:
            name = str(tensor.dtype).removeprefix("torch.")
            problem["dtype"] = DTYPES.get(name, name)
    return [pick(**problem)]
'''


def render_triton(entries: Sequence[ExportEntry], *, source: str, defaults: Mapping[str, Any] | None = None) -> str:
    """The module's text. Raises InputError for winners of several kernels or devices, or problems
    without an integer dimension. A parameter listed in `defaults` is left out of a config where it
    holds its default value (a variant's own parameters: the base kernel does not take them); the
    module's VARIANT_PARAMS lists the ones some exported config still carries."""
    defaults = defaults or {}
    entries = [_without_defaults(e, defaults) for e in entries]
    _one("kernel", {e.kernel for e in entries}, "--kernel")
    _one("device", {e.device for e in entries}, "--device")
    key = _int_fields(entries)
    categorical = sorted({k for e in entries for k in e.problem if k not in key})
    configs: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    for e in entries:  # winners first, then runners-up: CONFIGS[0] is a winner
        _index(e.config, configs, index)
    for e in entries:
        if e.runner_up_config is not None:
            _index(e.runner_up_config, configs, index)
    lines = [_HEADER,
             f"KERNEL = {entries[0].kernel!r}",
             f"DEVICE = {entries[0].device!r}",
             f"BACKEND = {', '.join(sorted({e.backend for e in entries}))!r}",
             f"SOURCE = {source!r}",
             f"KEY = {key!r}",
             f"CATEGORICAL = {categorical!r}",
             f"VARIANT_PARAMS = {sorted({k for e in entries for k in e.config if k in defaults})!r}"
             "  # a config carrying one of these needs the kernel variant that takes it",
             "DTYPES = {'float16': 'fp16', 'bfloat16': 'bf16', 'float32': 'fp32'}  # torch dtype -> problem dtype",
             "",
             "CONFIGS: list[triton.Config] = ["]
    lines += [f"    {_config_src(c)}," for c in configs]
    lines += ["]", "",
              "# (problem, [winner, runner-up]) per tuned problem, with the medians (ms) they were chosen on.",
              "TUNED: list[tuple[dict[str, Any], list[triton.Config]]] = ["]
    for e in entries:
        picked = [index[_cfg_key(e.config)]]
        if e.runner_up_config is not None and index[_cfg_key(e.runner_up_config)] != picked[0]:
            picked.append(index[_cfg_key(e.runner_up_config)])
        refs = ", ".join(f"CONFIGS[{i}]" for i in picked)
        lines.append(f"    ({e.problem!r}, [{refs}]),  # {_note(e)}")
    lines.append("]")
    return "\n".join(lines) + "\n" + _FUNCTIONS


def _without_defaults(e: ExportEntry, defaults: Mapping[str, Any]) -> ExportEntry:
    def strip(config: dict[str, Any] | None) -> dict[str, Any] | None:
        if config is None:
            return None
        return {k: v for k, v in config.items() if not at_default(k, v, defaults)}

    return dataclasses.replace(e, config=strip(e.config), runner_up_config=strip(e.runner_up_config))


def _one(what: str, values: set[str], flag: str) -> None:
    if len(values) > 1:
        raise InputError(f"--format triton writes one module per {what}; the selection has "
                         f"{len(values)} ({', '.join(sorted(values))}): choose one with {flag}")


def _int_fields(entries: Sequence[ExportEntry]) -> list[str]:
    first = entries[0].problem
    key = [k for k in first if all(_is_int(e.problem.get(k)) for e in entries)]
    if not key:
        raise InputError(f"kernel {entries[0].kernel!r}: its problems have no integer dimension to pick by")
    return key


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _cfg_key(config: dict[str, Any]) -> str:
    return repr(sorted(config.items()))


def _index(config: dict[str, Any], configs: list[dict[str, Any]], index: dict[str, int]) -> None:
    k = _cfg_key(config)
    if k not in index:
        index[k] = len(configs)
        configs.append(config)


def _config_src(config: dict[str, Any]) -> str:
    meta = {k: v for k, v in config.items() if k not in CONFIG_ATTRS}
    attrs = "".join(f", {k}={config[k]!r}" for k in CONFIG_ATTRS if k in config)
    return f"triton.Config({meta!r}{attrs})"


def _note(e: ExportEntry) -> str:
    if e.runner_up_ms is None:
        return f"{e.median_ms:.4g} ms"
    verdict = "tie" if e.tie else f"+{e.margin:.1%}" if e.margin is not None else ""
    return f"{e.median_ms:.4g} ms vs {e.runner_up_ms:.4g} ms ({verdict})"
