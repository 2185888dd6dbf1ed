"""`tilepilot import`: seed the history with configs tuned elsewhere, marked as imported.

Two sources:
- vLLM tuned-config files (`E={E},N={N},device_name={device}[,dtype={selector}][,block_shape=[n,k]].json`,
  and tilepilot's own `kernel={kernel},...` names): JSON keyed by the token count M, one config
  per key, plus an optional "triton_version". Each key is the config vLLM's tuner chose for that M;
  the file holds no timing. The file's N is vLLM's (w2.shape[2]); a `fused_moe` problem's N is
  twice that (w1's gate and up rows, see `export_vllm`). The name carries neither topk nor K:
  `--problem topk=2 --problem K=4096` give them (and dtype=bf16|fp16 where the name has none).
- Triton's autotune cache (`@triton.autotune(..., cache_results=True)` or TRITON_CACHE_AUTOTUNING=1):
  `<cache dir>/<hash>/<function>.autotune.json` holding `{"key": [values of the autotune key
  arguments..., "torch.<dtype>" per tensor argument], "configs_timings": [[Config.__dict__,
  [median, p20, p80] ms from do_bench], ...]}` (Triton 3.2 on; a failed config is timed
  `Infinity`; later versions write each key value as text, "512", which is read as 512). The file
  names neither the GPU nor the key's argument names: `--device` and `--key` say them.

How an import is stored (nothing here was measured by tilepilot):
- one `experiments` row per (problem, config) with backend "imported", `origin` =
  "vllm:<file>" or "triton-cache:<file>" (absolute paths) and `origin_data` = what the source
  said (vLLM: the file and its key M, the file's triton_version going to the `triton` column;
  Triton: the tuning key, its timings in ms or null for a failed config, and whether it was the
  cache's pick), `kernel_version` "imported:<source>";
- no `results` row: there is no tilepilot measurement, so no status, no time. The driver never
  reuses an imported experiment as a measurement (its key has backend "imported");
- one `imported` event per file (source, counts) for provenance.
Importing the same file again adds nothing.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilepilot.experiments import Config, Environment, InputError, Problem, experiment_key
from tilepilot.storage.export_vllm import GATED_W1
from tilepilot.storage.filters import Filters, conditions
from tilepilot.storage.queries import ReadOnlyDB, history_filters
from tilepilot.storage.rows import dumps, loads
from tilepilot.storage.store import Store

log = logging.getLogger(__name__)

SOURCES = ("vllm", "triton-cache")
BACKEND = "imported"
DEFAULT_VLLM_KERNEL = "fused_moe"
_NAME_PART = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\[[^\]]*\]|[^,]*)")
# vLLM dtype selector -> the problem's dtype (others are kept as written, e.g. fp8_w8a8)
_VLLM_DTYPES = {"float32": "fp32"}
# torch dtype names in a Triton tuning key -> the problem's dtype
_TORCH_DTYPES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32",
                 "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8_e5m2", "torch.int8": "int8"}
_TRITON_CONFIG_ATTRS = ("num_warps", "num_stages")


@dataclass(frozen=True)
class ImportEntry:
    kernel: str
    problem: Problem
    config: Config
    env: Environment
    origin: str
    data: dict[str, Any]

    @property
    def key(self) -> str:
        return experiment_key(self.kernel, "imported:" + self.origin.partition(":")[0], self.problem, self.config,
                              self.env)


@dataclass(frozen=True)
class ImportReport:
    source: str  # vllm | triton-cache
    path: str
    kernel: str
    device: str
    entries: int
    added: int  # experiments new to the store
    problems: int


@dataclass(frozen=True)
class ImportedRow:
    """An experiment imported from elsewhere: a config the source chose or timed, never measured here."""

    experiment_key: str
    origin: str  # "vllm:<file>" | "triton-cache:<file>"
    source: str  # vllm | triton-cache
    kernel: str
    problem: dict[str, Any]
    problem_key: str
    config: dict[str, Any]
    config_key: str
    device: str
    triton: str
    imported_at: float
    picked: bool  # the source's choice for this problem (every vLLM entry; the fastest of a Triton cache)
    source_ms: float | None  # the source's own median (Triton's do_bench), None when it gave none
    origin_data: dict[str, Any]


# ---- reading the sources ---------------------------------------------------------------------

def read_vllm(path: Path, *, kernel: str | None = None, extra: Mapping[str, Any] | None = None,
              device: str | None = None) -> list[ImportEntry]:
    """The entries of one vLLM tuned-config file. `extra` gives problem fields the file name does
    not carry (fused_moe: topk, K; dtype when the name has no dtype selector)."""
    origin = f"vllm:{path.resolve()}"
    parts = _name_parts(path)
    kernel = kernel or str(parts.pop("kernel", DEFAULT_VLLM_KERNEL))
    parts.pop("kernel", None)
    name_device = parts.pop("device_name", None)
    if name_device is None and device is None:
        raise InputError(f"{path.name}: the file name has no device_name=...; pass --device NAME")
    dev = device or str(name_device).replace("_", " ")
    dtype = parts.pop("dtype", None)
    fields = {k: _number(v) for k, v in parts.items()}
    if kernel in GATED_W1 and isinstance(fields.get("N"), int):
        fields["N"] = 2 * fields["N"]  # vLLM names the file by w2.shape[2]; fused_moe's N is w1's rows
    if dtype is not None:
        fields["dtype"] = _VLLM_DTYPES.get(str(dtype), str(dtype))
    fields.update(extra or {})
    doc = _json(path)
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a JSON object keyed by the token count M")
    triton = str(doc.pop("triton_version", ""))
    env = Environment(BACKEND, dev, "", triton)
    entries = []
    for raw_m, raw_cfg in doc.items():
        if not re.fullmatch(r"\d+", str(raw_m)):
            raise InputError(f"{path}: key {raw_m!r} is not a token count (vLLM keys are whole numbers M)")
        if not isinstance(raw_cfg, dict) or not raw_cfg:
            raise InputError(f"{path}: M={raw_m}: {raw_cfg!r:.60} is not a config object")
        problem = _problem(kernel, {"M": int(raw_m), **fields}, f"{path.name} M={raw_m}")
        config = _config(kernel, raw_cfg, f"{path.name} M={raw_m}")
        data = {"file": path.name, "M": int(raw_m), "picked": True, "in_space": _in_space(kernel, config)}
        entries.append(ImportEntry(kernel, problem, config, env, origin, data))
    if not entries:
        raise InputError(f"{path}: no configs in it")
    return entries


def read_triton_cache(path: Path, *, kernel: str, key_names: Sequence[str], device: str | None,
                      function: str | None = None, extra: Mapping[str, Any] | None = None,
                      triton: str = "") -> list[ImportEntry]:
    """The entries of Triton autotune cache files: `path` is one `*.autotune.json` or a folder
    searched for them (e.g. ~/.triton/cache)."""
    if not device:
        raise InputError("--device NAME is needed for a Triton cache: its files do not name the GPU")
    if not key_names:
        raise InputError("--key NAMES is needed for a Triton cache (the autotune key's argument names in "
                         "order, e.g. M,N,K): its files hold the values only")
    files = [path] if path.is_file() else sorted(path.rglob("*.autotune.json"))
    if function is not None:
        files = [f for f in files if _function(f) == function]
    if not files:
        what = f" of function {function!r}" if function else ""
        raise InputError(f"no Triton autotune results{what} under {str(path)!r} (files named <function>.autotune.json)")
    functions = sorted({_function(f) for f in files})
    if len(functions) > 1:
        raise InputError(f"{str(path)!r} holds autotune results of {len(functions)} functions "
                         f"({', '.join(functions)}): choose one with --function")
    env = Environment(BACKEND, device, "", triton)
    out: list[ImportEntry] = []
    for f in files:
        out.extend(_triton_file(f, kernel, list(key_names), env, dict(extra or {})))
    return out


def _triton_file(path: Path, kernel: str, key_names: list[str], env: Environment,
                 extra: dict[str, Any]) -> list[ImportEntry]:
    doc = _json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("key"), list) or not isinstance(
            doc.get("configs_timings"), list):
        raise InputError(f"{path}: not a Triton autotune result "
                         '(expected {"key": [...], "configs_timings": [...]})')
    raw_key = doc["key"]
    key = [_key_value(v) for v in raw_key]  # Triton 3.2 to 3.6 write the values, later ones str() of each
    if len(key) < len(key_names):
        raise InputError(f"{path}: its tuning key {key!r:.80} has {len(key)} value(s), fewer than --key names "
                         f"({', '.join(key_names)})")
    fields: dict[str, Any] = dict(zip(key_names, key, strict=False))
    dtypes = [v for v in key[len(key_names):] if isinstance(v, str) and v.startswith("torch.")]
    if dtypes and "dtype" not in extra and "dtype" not in fields:
        fields["dtype"] = _TORCH_DTYPES.get(dtypes[0], dtypes[0].removeprefix("torch."))
    fields.update(extra)
    where = f"{path.name} key={key}"
    problem = _problem(kernel, fields, where)
    parsed = [(_triton_config(kernel, c, where), _timings(t, where)) for c, t in _pairs(doc["configs_timings"], where)]
    finite = [t[0] for _, t in parsed if t is not None]
    fastest = min(finite) if finite else None
    origin = f"triton-cache:{path.resolve()}"
    out = []
    for config, timings in parsed:
        picked = timings is not None and timings[0] == fastest
        data = {"file": path.name, "function": _function(path), "tuning_key": raw_key, "timings_ms": timings,
                "picked": picked, "in_space": _in_space(kernel, config)}
        out.append(ImportEntry(kernel, problem, config, env, origin, data))
    return out


def _pairs(items: list[Any], where: str) -> list[tuple[Any, Any]]:
    out = []
    for item in items:
        if not isinstance(item, list | tuple) or len(item) != 2 or not isinstance(item[0], dict):
            raise InputError(f"{where}: {item!r:.80} is not a [config, timings] pair")
        out.append((item[0], item[1]))
    return out


def _timings(raw: Any, where: str) -> list[float] | None:
    """[median, p20, p80] in ms (a single number is a median), None for a config that failed (inf)."""
    values = raw if isinstance(raw, list) else [raw]
    if not values or any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        raise InputError(f"{where}: timings {raw!r:.60} are not numbers")
    if any(not math.isfinite(v) for v in values):
        return None
    return [float(v) for v in values]


def _triton_config(kernel: str, raw: dict[str, Any], where: str) -> Config:
    kwargs = raw.get("kwargs")
    if not isinstance(kwargs, dict):
        raise InputError(f"{where}: config {raw!r:.80} has no kwargs")
    data = dict(kwargs)
    for attr in _TRITON_CONFIG_ATTRS:
        if raw.get(attr) is not None:
            data[attr] = raw[attr]
    if raw.get("num_ctas") not in (None, 1):
        data["num_ctas"] = raw["num_ctas"]
    if raw.get("maxnreg") is not None:
        data["maxnreg"] = raw["maxnreg"]
    return _config(kernel, data, where)


def _key_value(v: Any) -> Any:
    """A tuning-key value as the problem holds it: "512" -> 512 (a key written as text)."""
    if isinstance(v, str) and re.fullmatch(r"-?\d+", v):
        return int(v)
    if isinstance(v, str) and re.fullmatch(r"-?\d+\.\d*(e-?\d+)?", v):
        return float(v)
    return v


def _function(path: Path) -> str:
    return path.name.removesuffix(".autotune.json")


def _name_parts(path: Path) -> dict[str, str]:
    stem = path.name.removesuffix(".json")
    parts = {m.group(1): m.group(2) for m in _NAME_PART.finditer(stem)}
    if "E" not in parts and "kernel" not in parts:
        raise InputError(f"{path.name}: not a vLLM tuned-config name (E={{E}},N={{N}},device_name={{name}}"
                         "[,dtype=...].json, or tilepilot's kernel=...,device_name=...json)")
    return parts


def _number(text: str) -> Any:
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read {str(path)!r}: {e}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None


def _problem(kernel: str, fields: dict[str, Any], where: str) -> Problem:
    from tilepilot.kernels.registry import get_family

    family = get_family(kernel)
    try:
        return family.parse_problem(fields)
    except InputError as e:
        raise InputError(f"{where}: {e} (pass the fields the file does not carry with --problem NAME=VALUE)") from None


def _config(kernel: str, raw: Mapping[str, Any], where: str) -> Config:
    """The config as the family's space writes it (parameters the file lacks at their defaults,
    e.g. matmul's VARIANT=grouped for a vLLM file), or as given where the space does not take it."""
    from tilepilot.kernels.registry import get_family

    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, int | float | str):
            raise InputError(f"{where}: config value {k}={v!r:.40} is not a number or text")
    try:
        return get_family(kernel).space().parse(dict(raw))
    except InputError:
        return Config.of(dict(raw))


def _in_space(kernel: str, config: Config) -> bool:
    from tilepilot.kernels.registry import get_family

    try:
        get_family(kernel).space().parse(config.as_dict())
    except InputError:
        return False
    return True


# ---- writing ---------------------------------------------------------------------------------

def store_entries(store: Store, entries: Sequence[ImportEntry], *, source: str, path: Path) -> ImportReport:
    """Insert the entries' experiments (an experiment already here is left as it is) and log the import."""
    now = time.time()
    added = 0
    with store.transaction():
        for e in entries:
            cur = store.db.execute(
                "INSERT INTO experiments (key, kernel, kernel_version, problem, problem_key, config, config_key, "
                "backend, device, torch, triton, driver, created_at, origin, origin_data) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(key) DO NOTHING",
                [e.key, e.kernel, "imported:" + source, dumps(e.problem.as_dict()), e.problem.key(),
                 dumps(e.config.as_dict()), e.config.key(), e.env.backend, e.env.device, e.env.torch, e.env.triton,
                 e.env.driver, now, e.origin, dumps(e.data)])
            added += cur.rowcount
        report = ImportReport(source, str(path.resolve()), entries[0].kernel, entries[0].env.device, len(entries),
                              added, len({e.problem.key() for e in entries}))
        store.log_event("imported", f"imported {len(entries)} config(s) of {report.kernel} on {report.device} "
                        f"from {source} {report.path}: {added} new", data={**vars(report)})
    return report


def import_path(store: Store, path: Path, *, source: str | None = None, kernel: str | None = None,
                extra: Mapping[str, Any] | None = None, device: str | None = None, key_names: Sequence[str] = (),
                function: str | None = None, triton: str = "") -> ImportReport:
    """Read one file or folder and store it. `source` defaults from the path (a folder or
    *.autotune.json: triton-cache; other *.json: vllm). Raises InputError for what cannot be read."""
    source = source or detect_source(path)
    if source not in SOURCES:
        raise InputError(f"unknown import source {source!r} (allowed: {', '.join(SOURCES)})")
    if not path.exists():
        raise InputError(f"{str(path)!r} does not exist")
    if source == "vllm":
        if path.is_dir():
            raise InputError(f"{str(path)!r} is a folder; give vLLM tuned-config files (*.json)")
        entries = read_vllm(path, kernel=kernel, extra=extra, device=device)
    else:
        if kernel is None:
            raise InputError("--kernel NAME is needed for a Triton cache (which tilepilot kernel it tuned)")
        entries = read_triton_cache(path, kernel=kernel, key_names=key_names, device=device, function=function,
                                    extra=extra, triton=triton)
    return store_entries(store, entries, source=source, path=path)


def detect_source(path: Path) -> str:
    if path.is_dir() or path.name.endswith(".autotune.json"):
        return "triton-cache"
    return "vllm"


# ---- reading back ------------------------------------------------------------------------------

def imported(db: ReadOnlyDB, *, limit: int | None = None, picked_only: bool = False,
             **filters: Any) -> list[ImportedRow]:
    """Imported experiments, newest first, with the filters of `queries.history` (an imported
    experiment matches no campaign, proposer or status but "imported")."""
    f = history_filters(db, **filters)
    return select_imported(db, f, limit=limit, picked_only=picked_only)


def select_imported(db: ReadOnlyDB, f: Filters, *, limit: int | None = None,
                    picked_only: bool = False) -> list[ImportedRow]:
    if not f.wants_imported:
        return []
    where, params = conditions(f, measured=False)
    where.append("e.origin != ''")
    if picked_only:
        where.append("json_extract(e.origin_data, '$.picked') = 1")
    rows = db.rows("SELECT e.* FROM experiments e WHERE " + " AND ".join(where)
                   + " ORDER BY e.created_at DESC, e.origin, e.problem_key LIMIT ?",
                   [*params, -1 if limit is None else limit])
    return [_imported_row(r) for r in rows]


def _imported_row(r: Mapping[str, Any]) -> ImportedRow:
    data = loads(r["origin_data"])
    timings = data.get("timings_ms")
    return ImportedRow(
        experiment_key=r["key"], origin=r["origin"], source=r["origin"].partition(":")[0], kernel=r["kernel"],
        problem=loads(r["problem"]), problem_key=r["problem_key"], config=loads(r["config"]),
        config_key=r["config_key"], device=r["device"], triton=r["triton"], imported_at=r["created_at"],
        picked=bool(data.get("picked")), source_ms=timings[0] if timings else None, origin_data=data)
