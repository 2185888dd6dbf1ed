"""The `tilepilot` command. Thin: parses, calls into the packages, prints.

Exit codes: 0 success, 2 bad input (one line on stderr), 1 anything else, 130 interrupted,
141 the reader of our output went away (`tilepilot history | head`).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from tilepilot.experiments import InputError, TilepilotError, at_default

log = logging.getLogger("tilepilot")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{self.prog}: {message}")


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
        return code
    except BrokenPipeError:
        _discard_stdout()
        return 141
    except InputError as e:
        print(f"tilepilot: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tilepilot: interrupted", file=sys.stderr)
        return 130
    except TilepilotError as e:
        print(f"tilepilot: error: {e}", file=sys.stderr)
        return 1


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that flushing what is left at exit raises nothing."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError):  # stdout has no file descriptor (captured, closed)
        pass


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tilepilot", description="Tuning campaigns for Triton kernels.")
    sub = p.add_subparsers(parser_class=_Parser, metavar="COMMAND")

    t = sub.add_parser("tune", help="run (or resume) a tuning campaign")
    t.add_argument("campaign", type=Path, help="campaign file (TOML)")
    t.add_argument("--backend", default="auto", help="auto | gpu | interpret | replay (default: auto)")
    t.add_argument("--dataset", type=Path, help="recorded measurements for the replay backend (JSON Lines)")
    t.add_argument("--db", type=Path, default=Path("tilepilot.db"), help="SQLite store (default: tilepilot.db)")
    t.add_argument("--budget", type=int, help="distinct configs per problem (overrides the file)")
    t.add_argument("--proposer", help="proposer name (overrides the file)")
    t.add_argument("--address", help="join an existing Ray cluster ('auto' or host:port)")
    t.add_argument("--workers", type=int, help="number of workers (default: one per GPU; 1 for interpret)")
    t.add_argument("--resume", action="store_true", help="continue a campaign of the same name")
    t.add_argument("--dry-run", action="store_true", help="validate and show the plan; run nothing")
    t.add_argument("--cold", action="store_true",
                   help="start without what the store holds (no warm start: neither the winners of nearby "
                        "problems queued first nor their results and the learnings correcting the rules model)")
    t.set_defaults(func=cmd_tune)

    k = sub.add_parser("kernels", help="list the kernel families")
    k.set_defaults(func=cmd_kernels)

    from tilepilot.cli_history import add_parsers

    add_parsers(sub)  # history, best, show, compare, import, cost, report

    d = sub.add_parser("dashboard", help="serve the live dashboard")
    _db_arg(d)
    d.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    d.add_argument("--port", type=int, default=8501)
    d.set_defaults(func=cmd_dashboard)
    _graph_parser(sub)
    _export_parser(sub)
    _merge_parser(sub)
    from tilepilot.cli_control import add_control_parsers

    add_control_parsers(sub)  # pause, resume, stop, queue
    from tilepilot.cli_workers import add_workers_parser

    add_workers_parser(sub)  # workers stop
    return p


def _db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", type=Path, default=Path("tilepilot.db"), help="SQLite store (default: tilepilot.db)")


def _format_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="JSON, one object per row")
    g.add_argument("--csv", action="store_true", help="CSV with a header")


# ---- tune ---------------------------------------------------------------------------------
def cmd_tune(args: argparse.Namespace) -> int:
    from tilepilot.orchestrator.tune import TuneOptions, plan, tune

    opts = TuneOptions(campaign=args.campaign, backend=args.backend, dataset=args.dataset, db=args.db,
                       budget=args.budget, proposer=args.proposer, address=args.address,
                       resume=args.resume, dry_run=args.dry_run, workers=_positive(args.workers, "--workers"),
                       cold=args.cold)
    if opts.dry_run:
        p = plan(opts)
        c = p.campaign
        print(f"campaign {c.name}: kernel {c.kernel}, proposer {c.proposer}, backend {p.backend}, "
              f"budget {c.budget} per problem, {len(c.problems)} problem(s), "
              f"at most {c.budget * len(c.problems)} configs measured (results in the store are reused, free)")
        for prob in c.problems:
            valid = len(p.spaces[prob].valid(prob))
            print(f"  {prob.label()}: {valid} valid configs in the space")
        _print_estimate(p, args.db)
        return 0
    bar = _ProgressBar()
    try:
        outcome = tune(opts, on_progress=bar)
    except KeyboardInterrupt:
        bar.close()
        print(f"tilepilot: interrupted; resume with: tilepilot tune {args.campaign} --db {args.db} --resume",
              file=sys.stderr)
        return 130
    bar.close()
    if outcome.stopped:
        print(f"campaign {outcome.plan.campaign.name} stopped by a person; continue it with: "
              f"tilepilot tune {args.campaign} --db {args.db} --resume")
        return 0
    backend = outcome.plan.backend
    label = {"replay": f"replayed from measurements recorded on {outcome.device}",
             "interpret": "Triton interpreter: CPU timings, not GPU",
             "gpu": f"measured on {outcome.device}"}[backend]
    print(f"campaign {outcome.plan.campaign.name} finished ({backend}: {label})")
    from tilepilot.storage.queries import best, open_db

    with open_db(args.db) as db:
        rows = best(db, campaign=outcome.plan.campaign.name)
    _print_best(rows)
    print(f"results in {args.db.resolve()}  (tilepilot dashboard --db {args.db})")
    return 0


def _print_estimate(p: Any, db_path: Path) -> None:
    """The campaign's GPU time and model cost, estimated from the history in the store (storage/cost.py)."""
    est = _estimate_plan(p, db_path)
    if est is None:
        print(f"estimate: no store at {db_path} yet, so no history to estimate from")
        return
    gpu = "unknown" if est.gpu_seconds is None else f"{est.gpu_seconds:.4g} GPU-s"
    llm = "unknown" if est.llm_cost_usd is None else f"${est.llm_cost_usd:.4f}"
    print(f"estimate: {gpu} for {est.measured:.0f} of {est.trials} trial(s) measured (the rest found in the "
          f"store), model cost {llm}")
    print(f"  from {est.basis}")


def _estimate_plan(p: Any, db_path: Path) -> Any:
    """The estimate of a planned campaign from the store's history, or None without a store."""
    from tilepilot.storage.cost import estimate
    from tilepilot.storage.queries import open_db

    if not db_path.is_file():
        return None
    device, version = _plan_device(p)
    with open_db(db_path) as db:
        same = db.rows("SELECT id FROM campaigns WHERE name = ?", [p.campaign.name])
        return estimate(db.rows, kernel=p.campaign.kernel, device=device, backend=p.backend, kernel_version=version,
                        valid={prob: len(p.spaces[prob].valid(prob)) for prob in p.campaign.problems},
                        budget=p.campaign.budget, proposer=p.campaign.proposer,
                        exclude_campaign=same[0]["id"] if same else None)


def _plan_device(p: Any) -> tuple[str | None, str | None]:
    """The device and kernel version a planned campaign will record (None: not known before it starts)."""
    if p.backend == "replay":
        return p.dataset.device, p.dataset.identity
    if p.backend == "interpret":
        return "cpu (Triton interpreter)", p.family.kernel_version()
    from tilepilot.kernels.telemetry import nvml_available, sample_all

    gpus = sample_all("local") if nvml_available() else []
    return (gpus[0].name if gpus else None), p.family.kernel_version()


def _positive(v: int | None, flag: str) -> int | None:
    if v is not None and v < 1:
        raise InputError(f"{flag} {v} must be at least 1")
    return v


class _ProgressBar:
    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = -1

    def __call__(self, p: Any) -> None:
        width = 30
        filled = int(width * p.done / max(1, p.total))
        line = f"[{'#' * filled}{'.' * (width - filled)}] {p.done}/{p.total} trials"
        if self.tty:
            print("\r" + line, end="", file=sys.stderr, flush=True)
        elif p.done * 10 // max(1, p.total) != self.last:  # every 10% when logging to a file
            self.last = p.done * 10 // max(1, p.total)
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tty:
            print(file=sys.stderr)


# ---- kernels ------------------------------------------------------------------------------
def cmd_kernels(args: argparse.Namespace) -> int:
    from tilepilot.kernels.registry import family_names, get_family

    for name in family_names():
        f = get_family(name)
        space = f.space()
        print(f"{name}  (version {f.version}; dtypes {', '.join(f.dtypes)})")
        print(f"    {f.description}")
        for prm in space.params:
            print(f"    {prm.name}: {', '.join(str(c) for c in prm.choices)}")
    return 0


# ---- history and best (the verbs are in cli_history) ----------------------------------------
def _print_best(rows: Sequence[Any]) -> None:
    if not rows:
        print("no winners yet")
        return
    table = []
    for r in rows:
        d = _plain(r)
        table.append({
            "campaign": d.get("campaign", ""),
            "problem": _compact(d.get("problem")),
            "winner": _compact(d.get("config")),
            "median_ms": d.get("median_ms"),
            "vs median config": _ratio(d.get("speedup_vs_median")),
            "vs " + (d.get("baseline_name") or "baseline"): _ratio(d.get("speedup_vs_baseline")),
            "roofline": f"{d['roofline_pct']:.0f}%" if d.get("roofline_pct") is not None else "-",
            "note": "tie" if d.get("tie") else "",
        })
    _print_table(table, list(table[0]))


def _ratio(v: Any) -> str:
    return f"{v:.2f}x" if isinstance(v, int | float) else "-"


def _problem_filter(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--problem {item!r} is not KEY=VALUE (e.g. M=4096 or dtype=bf16)")
        digits = value[1:] if value.startswith("-") else value
        out[key] = int(value) if digits.isascii() and digits.isdigit() else value
    return out


def _field_names(view: type) -> list[str]:
    return [f.name for f in dataclasses.fields(view)]


def _plain(row: Any) -> dict[str, Any]:
    d = dataclasses.asdict(row) if dataclasses.is_dataclass(row) else dict(row)
    return {k: (dict(v) if hasattr(v, "as_dict") else v) for k, v in d.items()}


# Short names for table cells only; JSON and CSV keep the parameters' own names.
_SHORT = (("BLOCK_SIZE_", "B"), ("GROUP_SIZE_", "G"), ("num_warps", "warps"), ("num_stages", "stages"))


def _short(name: str) -> str:
    for long, short in _SHORT:
        name = name.replace(long, short)
    return name


def _compact(v: Any) -> str:
    """A table cell: a config or problem as `key=value` pairs with short names, leaving out the
    parameters that hold their default (a variant's own ones: VARIANT=grouped, SPLIT_K=1)."""
    if isinstance(v, dict | tuple | list):
        items = v.items() if isinstance(v, dict) else v
        hidden = _variant_defaults()
        return " ".join(f"{_short(str(k))}={x}" for k, x in items if not at_default(k, x, hidden))
    return "" if v is None else str(v)


@functools.cache
def _variant_defaults() -> dict[str, Any]:
    """Every known family's parameters that have a default, with it."""
    from tilepilot.kernels.registry import family_names, param_defaults

    out: dict[str, Any] = {}
    for name in family_names():
        out.update(param_defaults(name))
    return out


def _emit(args: argparse.Namespace, rows: list[dict[str, Any]], cols: list[str], fields: list[str]) -> None:
    """A table of `cols`, or every field as JSON Lines or CSV (the same header with or without rows)."""
    if args.json:
        for r in rows:
            print(json.dumps(r, default=str))
    elif args.csv:
        w = csv.DictWriter(sys.stdout, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (json.dumps(v) if isinstance(v, dict) else v) for k, v in r.items()})
    else:
        _print_table([{c: _cell(r.get(c)) for c in cols} for r in rows], cols)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}"
    text = _compact(v)
    return text if len(text) <= 72 else text[:69] + "..."


def _print_table(rows: list[dict[str, Any]], cols: list[str], out: Callable[[str], None] = print) -> None:
    if not rows:
        out("no rows")
        return
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    out("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for row in cells:
        out("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


# ---- dashboard ----------------------------------------------------------------------------
def cmd_dashboard(args: argparse.Namespace) -> int:
    from tilepilot.dashboard.launch import serve
    from tilepilot.storage.queries import open_db

    if not 1 <= args.port <= 65535:
        raise InputError(f"--port {args.port} is not a port number (1 to 65535)")
    open_db(args.db).close()  # a missing file or another program's database is one line here
    return serve(str(args.db), host=args.host, port=args.port)


# ---- graph --------------------------------------------------------------------------------
def _graph_parser(sub: Any) -> None:
    g = sub.add_parser("graph", help="query the knowledge graph: hypotheses, evidence, learnings",
                       description="What the store knows about a kernel on a device (--kernel, --device, "
                       "--problem), the evidence of a hypothesis (--hypothesis), the neighbourhood of an "
                       "experiment (--experiment) or the learnings that apply to a problem (--learnings-for). "
                       "--json prints one JSON document; --export writes the graph as node-link JSON "
                       "(without a query: the whole graph).")
    _db_arg(g)
    g.add_argument("--kernel", help="kernel family, e.g. matmul")
    g.add_argument("--device", help="a part of the device name, e.g. H100")
    g.add_argument("--problem", metavar="FILTER", help='problem scope, e.g. "M<=64" or "M<=64,K>=4096"')
    q = g.add_mutually_exclusive_group()
    q.add_argument("--hypothesis", metavar="ID", help="the experiments that support or refute hypothesis ID")
    q.add_argument("--experiment", metavar="KEY", help="the neighbourhood of an experiment (key or prefix)")
    q.add_argument("--learnings-for", metavar="PROBLEM",
                   help='the learnings that apply to a problem, e.g. "M=48,N=4096,K=4096,dtype=bf16"')
    g.add_argument("--relation", choices=("supports", "refutes"), help="with --hypothesis: only this relation")
    g.add_argument("--radius", type=int, default=2, help="with --experiment: edges from it (1 to 6, default 2)")
    g.add_argument("--json", action="store_true", help="one JSON document")
    g.add_argument("--export", type=Path, metavar="FILE", help="write the graph as node-link JSON")
    g.set_defaults(func=cmd_graph)


def cmd_graph(args: argparse.Namespace) -> int:
    from tilepilot.storage import graph
    from tilepilot.storage.queries import open_db

    if args.relation and not args.hypothesis:
        raise InputError("--relation goes with --hypothesis")
    if args.radius != 2 and not args.experiment:
        raise InputError("--radius goes with --experiment")
    with open_db(args.db) as db:
        if args.hypothesis:
            doc, g = _graph_support(graph.support(db, args.hypothesis, relation=args.relation))
        elif args.experiment:
            doc, g = _graph_neighbourhood(graph.neighbourhood(db, args.experiment, radius=args.radius))
        elif args.learnings_for:
            doc, g = _graph_learnings(db, args)
        elif args.kernel:
            doc, g = _graph_knowledge(graph.knowledge(db, kernel=args.kernel, device=args.device, scope=args.problem))
        elif args.export:
            if args.problem:
                raise InputError("--problem needs --kernel")
            g = graph.build_graph(db, device=args.device)
            doc = {"tables": [], "nodes": g.number_of_nodes(), "edges": g.number_of_edges()}
        else:
            raise InputError("tilepilot graph needs --kernel, --hypothesis, --experiment or --learnings-for "
                             "(or --export FILE for the whole graph)")
    if args.export:
        graph.export(g, args.export)
        print(f"wrote {g.number_of_nodes()} nodes and {g.number_of_edges()} edges to {args.export}",
              file=sys.stderr)
    if args.json:
        print(json.dumps({k: v for k, v in doc.items() if k != "tables"}, default=str))
    else:
        for title, rows, cols in doc["tables"]:
            print(title)
            if cols and rows:
                _print_table([{c: r.get(c) for c in cols} for r in rows], cols, out=lambda line: print("  " + line))
            elif cols:
                print("  none")
    return 0


def _graph_knowledge(k: Any) -> tuple[dict[str, Any], Any]:
    problems = [dataclasses.asdict(p) for p in k.problems]
    hyps = [h.as_dict() for h in k.hypotheses]
    lrns = [x.as_dict() for x in k.learnings]
    where = f"on devices matching {k.device!r}" if k.device else "on every device"
    head = (f"{k.kernel} {where}, {k.scope.text()}: {len(problems)} problem(s), {len(hyps)} hypothesis(es), "
            f"{len(lrns)} learning(s)")
    for p in problems:
        p["best"] = _compact(p["best_config"])
    for h in hyps:
        h["ci"] = f"{h['ci_low']:.2f}-{h['ci_high']:.2f}" if h["ci_low"] and h["ci_high"] else ""
    tables = [(head, [], []),
              ("problems:", problems, ["problem", "device", "experiments", "ok", "best_ms", "best"]),
              ("hypotheses:", hyps, ["id", "state", "text", "pairs", "effect", "ci"]),
              ("learnings:", lrns, ["id", "scope_text", "claim", "effect", "pairs", "torch", "triton"])]
    doc = {"kernel": k.kernel, "device": k.device, "scope": k.scope.as_list(), "problems": problems,
           "hypotheses": hyps, "learnings": lrns, "tables": tables}
    return doc, k.graph


def _graph_support(s: Any) -> tuple[dict[str, Any], Any]:
    h = s.hypothesis.as_dict()
    rows = [dataclasses.asdict(e) for e in s.evidence]
    param = s.hypothesis.hypothesis.param
    for r in rows:
        r["pair"] = _compact({k: v for k, v in r["config_a"].items() if k != param})
    head = f"{h['id']} ({h['state']}): {h['text']} - {h['reason']}"
    cols = ["relation", "ratio", "problem", "pair", "experiment_a", "experiment_b"]
    return {"hypothesis": h, "evidence": rows, "tables": [(head, rows, cols)]}, s.graph


def _graph_neighbourhood(n: Any) -> tuple[dict[str, Any], Any]:
    rows = [dataclasses.asdict(x) for x in n.nodes]
    head = f"{len(rows)} node(s) within {n.radius} edge(s) of {n.center}" + (
        f" ({len(n.truncated)} node(s) with more neighbours than shown)" if n.truncated else "")
    edges = [{"source": u, "target": v, "kind": k} for u, v, k in n.graph.edges(keys=True)]
    return ({"center": n.center, "radius": n.radius, "nodes": rows, "edges": edges, "truncated": list(n.truncated),
             "tables": [(head, rows, ["distance", "kind", "node", "label"])]}, n.graph)


def _graph_learnings(db: Any, args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from tilepilot.experiments import Scope
    from tilepilot.storage import graph

    if not args.kernel:
        raise InputError("--learnings-for needs --kernel")
    scope = Scope.parse(args.learnings_for)
    if not scope.bounds or any(b.op != "=" for b in scope.bounds):
        raise InputError(f"--learnings-for {args.learnings_for!r} is not KEY=VALUE pairs "
                         "(e.g. M=48,N=4096,K=4096,dtype=bf16)")
    problem = {b.param: b.value for b in scope.bounds}
    rows, g = graph.learnings_for(db, kernel=args.kernel, device=args.device, problem=problem)
    docs = [x.as_dict() for x in rows]
    head = f"{len(docs)} learning(s) apply to {args.kernel} {_compact(problem)}"
    cols = ["id", "scope_text", "claim", "effect", "pairs", "device"]
    return {"problem": problem, "learnings": docs, "tables": [(head, docs, cols)]}, g


# ---- export -------------------------------------------------------------------------------
def _export_parser(sub: Any) -> None:
    e = sub.add_parser("export", help="write the declared winners as vLLM config files, a Triton module or JSON",
                       description="Export the declared winners (one per kernel, device and problem; the latest "
                       "decision when several campaigns tuned a problem). --format vllm: JSON keyed by the token "
                       "count M, one file per kernel, device and remaining dims, named the way vLLM looks them "
                       "up (-o is a folder, e.g. the one VLLM_TUNED_CONFIG_FOLDER names); triton: a Python module "
                       "with triton.Config lists and a pick() heuristic for @triton.autotune; json: winners with "
                       "their margin over the runner-up, noise, tie flag, device, versions and evidence ids.")
    _db_arg(e)
    e.add_argument("--format", required=True, metavar="FORMAT", help="vllm | triton | json")
    e.add_argument("--campaign", help="only this campaign's winners")
    e.add_argument("--kernel", help="only this kernel family")
    e.add_argument("--device", help="only devices whose name contains this (case-insensitive), e.g. H100")
    e.add_argument("--problem", action="append", default=[], metavar="KEY=VALUE",
                   help="only problems with this value, e.g. --problem dtype=bf16 (repeatable)")
    e.add_argument("-o", "--output", type=Path, metavar="PATH",
                   help="file to write (json, triton) or folder (vllm); default: standard output")
    e.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from tilepilot.kernels.registry import param_defaults
    from tilepilot.storage.export import export
    from tilepilot.storage.queries import open_db

    problem = _problem_filter(args.problem) or None
    with open_db(args.db) as db:
        files = export(db, args.format, campaign=args.campaign, kernel=args.kernel, device=args.device,
                       problem=problem, param_defaults=param_defaults)
    if args.output is None:
        if len(files) > 1:
            raise InputError(f"--format {args.format} gives {len(files)} files ({', '.join(f.name for f in files)}): "
                             "pass -o FOLDER to write them")
        if files[0].name:
            print(f"(vLLM file name: {files[0].name})", file=sys.stderr)
        sys.stdout.write(files[0].text)
        return 0
    written = _write_files(args.output, files, folder=args.format == "vllm")
    print(f"wrote {len(written)} file(s): {', '.join(str(w) for w in written)}", file=sys.stderr)
    return 0


def _write_files(out: Path, files: Sequence[Any], *, folder: bool) -> list[Path]:
    """Write the export; a path the user gave that cannot be written is one line (exit 2)."""
    if not out.parent.is_dir():
        raise InputError(f"-o {str(out)!r}: folder {str(out.parent)!r} does not exist")
    if folder and out.exists() and not out.is_dir():
        raise InputError(f"-o {str(out)!r} is a file; --format vllm writes a folder of files")
    if not folder and out.is_dir():
        raise InputError(f"-o {str(out)!r} is a folder; give a file name")
    paths = [out / f.name for f in files] if folder else [out]
    try:
        if folder:
            out.mkdir(exist_ok=True)
        for path, f in zip(paths, files, strict=True):
            path.write_text(f.text)
    except OSError as e:
        raise InputError(f"cannot write {str(out)!r}: {e.strerror or e}") from None
    return paths


# ---- merge --------------------------------------------------------------------------------
def _merge_parser(sub: Any) -> None:
    m = sub.add_parser("merge", help="fold another machine's store into this one",
                       description="Copy everything of OTHER.db that this store lacks: experiments deduplicated "
                       "by key, campaigns with their trials, queue, winners, events, GPU samples and hypothesis "
                       "ledger. A campaign whose name is taken here by a different campaign is renamed NAME@OTHER. "
                       "Each merge is logged as a merged_from event; merging the same file again changes nothing.")
    m.add_argument("other", type=Path, metavar="OTHER.db", help="the store to fold in (read only)")
    _db_arg(m)
    m.set_defaults(func=cmd_merge)


def cmd_merge(args: argparse.Namespace) -> int:
    from tilepilot.storage.merge import describe, merge_file

    report = merge_file(args.db, args.other)
    print(f"{args.other} -> {args.db}: {describe(report)}")
    for old, new in report.renamed.items():
        print(f"  campaign {old!r} of {args.other} is named {new!r} here: a different campaign had its name")
    if report.hypotheses_renamed:
        pairs = ", ".join(f"{a} -> {b}" for a, b in report.hypotheses_renamed.items())
        print(f"  hypothesis ids taken here by another campaign, renamed: {pairs}")
    if report.results_kept and report.changed:
        print(f"  {report.results_kept} experiment(s) were measured in both stores: this store's results are kept")
    return 0
