"""The query verbs of the `tilepilot` command: history, best, show, compare, import, cost, report.

Thin, like `cli`: parses, calls into `storage` (and `report`), prints. Every filter is checked
by `storage.filters` and bound as a parameter; a bad one is one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tilepilot.cli import (
    _compact,
    _db_arg,
    _emit,
    _field_names,
    _format_args,
    _plain,
    _positive,
    _print_best,
    _print_table,
    _problem_filter,
)
from tilepilot.experiments import InputError

HISTORY_COLUMNS = ["campaign", "problem", "config", "status", "median_ms", "proposer", "rationale"]
IMPORT_FIELDS = ["origin", "source_ms", "picked"]  # columns an imported row adds to history's CSV


def add_parsers(sub: Any) -> None:
    _history_parser(sub)
    _best_parser(sub)
    _show_parser(sub)
    _compare_parser(sub)
    _import_parser(sub)
    _cost_parser(sub)
    _report_parser(sub)


def _filter_args(p: argparse.ArgumentParser, *, status: bool) -> None:
    p.add_argument("--campaign", help="a campaign's name")
    p.add_argument("--kernel", help="kernel family, e.g. matmul")
    p.add_argument("--problem", action="append", default=[], metavar="FILTER",
                   help='problem ranges, e.g. "M<=64", "M<=64,K>=4096", dtype=bf16 (repeatable: all must hold)')
    p.add_argument("--device", help="a part of the device name (case-insensitive), e.g. H100")
    p.add_argument("--backend", help="gpu | interpret | replay | imported")
    p.add_argument("--torch", metavar="VERSION", help="torch version or its prefix, e.g. 2.11")
    p.add_argument("--triton", metavar="VERSION", help="triton version or its prefix, e.g. 3.6")
    p.add_argument("--proposer", help="the proposer that proposed the trial, e.g. rules")
    if status:
        p.add_argument("--status", action="append", metavar="STATUS",
                       help="ok, compile_error, ..., or imported (repeatable, or comma-separated)")
    p.add_argument("--since", metavar="WHEN",
                   help="measured at or after: 2026-11-21, 2026-11-21T08:00 (UTC), or a span back such as 36h, 7d")
    p.add_argument("--until", metavar="WHEN", help="measured before (same forms as --since)")


def _filters(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    return {"campaign": args.campaign, "kernel": args.kernel, "problem": args.problem or None,
            "device": args.device, "backend": args.backend, "torch": args.torch, "triton": args.triton,
            "proposer": args.proposer, "since": args.since, "until": args.until, **extra}


# ---- history --------------------------------------------------------------------------------------
def _history_parser(sub: Any) -> None:
    h = sub.add_parser("history", help="experiments in the store, filtered",
                       description="Experiments measured here (newest first), then those imported from vLLM "
                       "files or Triton's cache (status 'imported': not measured here, no time of ours).")
    _db_arg(h)
    _filter_args(h, status=True)
    h.add_argument("--limit", type=int, help="at most this many rows")
    _format_args(h)
    h.set_defaults(func=cmd_history)


def cmd_history(args: argparse.Namespace) -> int:
    from tilepilot.storage.imports import select_imported
    from tilepilot.storage.queries import history, history_filters, open_db
    from tilepilot.storage.views import HistoryRow

    limit = _positive(args.limit, "--limit")
    given = _filters(args, status=args.status)
    with open_db(args.db) as db:
        rows = [dict(_plain(r), origin="") for r in history(db, limit=limit, **given)]
        left = None if limit is None else limit - len(rows)
        if left is None or left > 0:
            f = history_filters(db, **given)
            rows += [_imported_dict(r) for r in select_imported(db, f, limit=left)]
    _emit(args, rows, HISTORY_COLUMNS, [*_field_names(HistoryRow), *IMPORT_FIELDS])
    return 0


def _imported_dict(r: Any) -> dict[str, Any]:
    d = _plain(r)
    src = r.origin_data
    if r.source == "vllm":
        why = f"vLLM's tuned config for M={src.get('M')} in {src.get('file')}"
    else:
        timed = f"timed {r.source_ms:.4g} ms by Triton's autotuner" if r.source_ms is not None else "failed in Triton"
        why = f"{timed}{', its pick' if r.picked else ''} ({src.get('file')})"
    return {**d, "campaign": None, "status": "imported", "median_ms": None, "proposer": r.source,
            "rationale": why, "backend": "imported", "measured_at": r.imported_at}


# ---- best -----------------------------------------------------------------------------------------
def _best_parser(sub: Any) -> None:
    b = sub.add_parser("best", help="the winner per problem",
                       description="Per campaign and problem: the declared winner, else the fastest ok result; "
                       "then the configs imported from elsewhere that their source picked (not measured here).")
    _db_arg(b)
    _filter_args(b, status=False)
    _format_args(b)
    b.set_defaults(func=cmd_best)


def cmd_best(args: argparse.Namespace) -> int:
    from tilepilot.storage.imports import select_imported
    from tilepilot.storage.queries import best, history_filters, open_db
    from tilepilot.storage.views import BestRow

    given = _filters(args)
    with open_db(args.db) as db:
        rows = best(db, **given)
        imported = select_imported(db, history_filters(db, **given), picked_only=True)
    if args.json or args.csv:
        found = [dict(_plain(r), origin="", status="ok") for r in rows]
        found += [{**_plain(r), "status": "imported", "decided": False} for r in imported]
        _emit(args, found, [], [*_field_names(BestRow), "origin", "status"])
        return 0
    _print_best(rows)
    if imported:
        print()
        print("imported (the source's pick; not measured here):")
        table = [{"from": f"{r.source}:{Path(r.origin.partition(':')[2]).name}", "problem": _compact(r.problem),
                  "config": _compact(r.config), "device": r.device,
                  "source ms": "-" if r.source_ms is None else f"{r.source_ms:.4g}"} for r in imported]
        _print_table(table, list(table[0]), out=lambda line: print("  " + line))
    return 0


# ---- show -----------------------------------------------------------------------------------------
def _show_parser(sub: Any) -> None:
    s = sub.add_parser("show", help="one experiment with everything stored about it",
                       description="The experiment, its result (every timing field and telemetry), the trials "
                       "that tried it, its queue entries, the winners it is or is runner-up of, hypothesis evidence, "
                       "learnings and events. KEY is an experiment key or a unique prefix (4+ hex digits).")
    s.add_argument("key", metavar="KEY")
    _db_arg(s)
    s.add_argument("--json", action="store_true", help="one JSON document")
    s.set_defaults(func=cmd_show)


def cmd_show(args: argparse.Namespace) -> int:
    from tilepilot.storage.lookup import experiment_detail
    from tilepilot.storage.queries import open_db

    with open_db(args.db) as db:
        doc = experiment_detail(db, args.key)
    if args.json:
        print(json.dumps(doc, default=str))
        return 0
    e, r = doc["experiment"], doc["result"]
    print(f"experiment {e['key']}")
    for k in ("kernel", "kernel_version", "problem", "config", "device", "backend", "torch", "triton", "driver"):
        print(f"  {k}: {_compact(e[k])}")
    print(f"  created: {_when(e['created_at'])}")
    if e.get("origin"):
        print(f"  imported from {e['origin']} (not measured here): {json.dumps(e['origin_data'])}")
    if r is None:
        print("result: none (nothing measured here)")
    else:
        print(f"result: {r['status']}" + (f": {r['message']}" if r["message"] else ""))
        skip = {"experiment_key", "status", "message", "extra"}
        for k, v in r.items():
            if k not in skip and v not in (None, ""):
                print(f"  {k}: {_when(v) if k.endswith('_at') else v}")
        if r["extra"]:
            print(f"  extra: {json.dumps(r['extra'])}")
    _section("trials", doc["trials"], ["campaign", "seq", "proposer", "predicted_ms", "hypothesis_id", "reused",
                                       "rationale"])
    _section("queue", doc["queue"], ["campaign", "state", "priority", "reason", "worker"])
    _section("winner of", doc["winner_of"], ["campaign", "role", "median_ms", "margin", "tie", "recheck_passed"])
    _section("hypothesis evidence", doc["evidence"], ["hypothesis_id", "relation", "ratio", "other", "statement",
                                                      "hypothesis_state"])
    _section("learnings", doc["learnings"], ["id", "hypothesis_id", "text", "effect", "pairs"])
    _section("events", doc["events"], ["ts", "kind", "message"])
    return 0


def _section(title: str, rows: list[dict[str, Any]], cols: list[str]) -> None:
    print(f"{title}:" + ("" if rows else " none"))
    if rows:
        shown = [{c: (_when(r.get(c)) if c == "ts" else r.get(c)) for c in cols} for r in rows]
        _print_table(shown, cols, out=lambda line: print("  " + line))


def _when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "" if ts is None else str(ts)
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


# ---- compare --------------------------------------------------------------------------------------
def _compare_parser(sub: Any) -> None:
    c = sub.add_parser("compare", help="two campaigns or two devices side by side",
                       description="The problems both sides tuned (then those of one side only): each side's "
                       "winner, the ratio b/a of their times (above 1: b is slower), and each winner's time on the "
                       "other side where the other side measured it.")
    c.add_argument("a", metavar="A", help="a campaign name (or with --by device, a part of a device name)")
    c.add_argument("b", metavar="B")
    _db_arg(c)
    c.add_argument("--by", default="campaign", help="campaign | device (default: campaign)")
    c.add_argument("--kernel", help="kernel family")
    c.add_argument("--problem", action="append", default=[], metavar="FILTER", help='e.g. "M<=64" (repeatable)')
    _format_args(c)
    c.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from tilepilot.storage.compare import CompareRow, compare
    from tilepilot.storage.queries import open_db

    with open_db(args.db) as db:
        result = compare(db, args.a, args.b, by=args.by, kernel=args.kernel, problem=args.problem or None)
    rows = [_plain(r) for r in result.rows]
    if args.json or args.csv:
        _emit(args, rows, [], _field_names(CompareRow))
        return 0
    print(f"a = {result.a}, b = {result.b} ({result.by}s); ratio = b / a")
    table = [{"problem": _compact(r["problem"]), "a winner": _compact(r["a_config"]) or "-",
              "a ms": _ms(r["a_ms"]), "b winner": "same" if r["same_config"] else (_compact(r["b_config"]) or "-"),
              "b ms": _ms(r["b_ms"]), "b/a": "-" if r["ratio"] is None else f"{r['ratio']:.3f}",
              "a's on b ms": _ms(r["a_config_on_b_ms"]), "b's on a ms": _ms(r["b_config_on_a_ms"])} for r in rows]
    if table:
        _print_table(table, list(table[0]))
    else:
        print("no problems in common or apart: nothing to compare")
    return 0


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.4g}"


# ---- import ---------------------------------------------------------------------------------------
def _import_parser(sub: Any) -> None:
    i = sub.add_parser("import", help="seed the history from vLLM tuned-config files or Triton's autotune cache",
                       description="Store configs tuned elsewhere as imported experiments (origin vllm:<file> or "
                       "triton-cache:<file>): not measured here, so they have no result and no time of ours; history "
                       "and best show them as imported. A folder or *.autotune.json is read as Triton's cache "
                       "(Triton keeps it in ~/.triton/cache or $TRITON_CACHE_DIR), any other *.json as a vLLM file. "
                       "Importing a file again adds nothing.")
    i.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    _db_arg(i)
    i.add_argument("--from", dest="source", metavar="SOURCE", help="vllm | triton-cache (default: from the path)")
    i.add_argument("--kernel", help="the tilepilot kernel tuned (vLLM default: fused_moe, or the file's kernel=)")
    i.add_argument("--problem", action="append", default=[], metavar="KEY=VALUE",
                   help="problem fields the source does not carry, e.g. --problem topk=2 --problem K=4096")
    i.add_argument("--device", help="the GPU's name (vLLM: taken from the file name; needed for a Triton cache)")
    i.add_argument("--key", metavar="NAMES",
                   help="Triton cache: the autotune key's argument names in order, e.g. M,N,K")
    i.add_argument("--function", help="Triton cache: only this kernel function's results")
    i.add_argument("--triton", metavar="VERSION", default="", help="Triton cache: the Triton version that tuned it")
    i.set_defaults(func=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    from tilepilot.storage.imports import import_path
    from tilepilot.storage.store import Store

    extra = _problem_filter(args.problem)
    names = [k.strip() for k in (args.key or "").split(",") if k.strip()]
    for path in args.paths:  # every path is checked before anything is written
        if not path.exists():
            raise InputError(f"{str(path)!r} does not exist")
    with Store(args.db) as store:
        for path in args.paths:
            r = import_path(store, path, source=args.source, kernel=args.kernel, extra=extra, device=args.device,
                            key_names=names, function=args.function, triton=args.triton)
            print(f"{path}: {r.entries} config(s) of {r.kernel} on {r.device} for {r.problems} problem(s), "
                  f"{r.added} new (from {r.source}; imported, not measured here)")
    return 0


# ---- cost -----------------------------------------------------------------------------------------
def _cost_parser(sub: Any) -> None:
    c = sub.add_parser("cost", help="GPU-seconds and model cost of campaigns, beside their estimates",
                       description="Per campaign: GPU-seconds per device (the time its workers spent timing the "
                       "results it measured itself), model tokens and dollars per model, and the estimate made "
                       "before it ran beside the actual.")
    c.add_argument("campaign", nargs="?", help="one campaign (default: every campaign)")
    _db_arg(c)
    c.add_argument("--json", action="store_true", help="JSON, one object per campaign")
    c.set_defaults(func=cmd_cost)


def cmd_cost(args: argparse.Namespace) -> int:
    from tilepilot.storage.cost import campaign_cost
    from tilepilot.storage.queries import campaign_id_of, open_db
    from tilepilot.storage.rows import loads

    with open_db(args.db) as db:
        ids = [campaign_id_of(db, args.campaign)] if args.campaign else [
            r["id"] for r in db.rows("SELECT id FROM campaigns ORDER BY id")]
        found = []
        for cid in ids:
            c = db.rows("SELECT name, estimate FROM campaigns WHERE id = ?", [cid])[0]
            found.append((c["name"], campaign_cost(db.rows, cid), loads(c["estimate"])))
    if args.json:
        for name, cost, est in found:
            print(json.dumps({"campaign": name, **cost.as_dict(), "estimate": est}))
        return 0
    if not found:
        print("no campaigns")
    for name, cost, est in found:
        _print_cost(name, cost, est)
    return 0


def _print_cost(name: str, cost: Any, est: dict[str, Any]) -> None:
    print(f"campaign {name}: {cost.gpu_seconds:.4g} GPU-s over {cost.measured} measured result(s), "
          f"{cost.reused} reused; model ${cost.llm_cost_usd:.4f}")
    for d in cost.devices:
        print(f"  {d.device} ({d.backend}): {d.gpu_seconds:.4g} s, {d.results} result(s)")
    for m in cost.models:
        print(f"  {m.model}: {m.calls} call(s) ({m.failed} failed), {m.input_tokens} in / {m.output_tokens} out "
              f"tokens, ${m.cost_usd:.4f}" + (f", {m.unpriced} without a known price" if m.unpriced else ""))
    e = est.get("estimate")
    if e:
        print(f"  estimated before it ran: {_est(e.get('gpu_seconds'), 'GPU-s')}, {_est(e.get('llm_cost_usd'), '$')}"
              + (f"; actual / estimate: GPU {_x(est.get('ratio', {}).get('gpu_seconds'))}" if "ratio" in est else ""))


def _est(v: Any, unit: str) -> str:
    if v is None:
        return f"{unit} unknown"
    return f"${v:.4f}" if unit == "$" else f"{v:.4g} {unit}"


def _x(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}x"


# ---- report ---------------------------------------------------------------------------------------
def _report_parser(sub: Any) -> None:
    r = sub.add_parser("report", help="a campaign report: HTML (self-contained, with plots) and Markdown",
                       description="What was tuned and on what, convergence per problem, the winners' roofline "
                       "position, the effect of each parameter, hypotheses with verdicts and evidence, learnings, "
                       "failures by status and cost. Without --out or --markdown: Markdown on standard output.")
    r.add_argument("campaign", help="the campaign's name")
    _db_arg(r)
    r.add_argument("--out", type=Path, metavar="FILE.html", help="write the HTML report here")
    r.add_argument("--markdown", type=Path, metavar="FILE.md",
                   help="write the Markdown report here (its plots as SVG files in FILE_files/)")
    r.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from tilepilot.report import build_report, render_html, render_markdown
    from tilepilot.storage.queries import open_db

    for path in (args.out, args.markdown):
        if path is not None and not path.parent.is_dir():
            raise InputError(f"{str(path)!r}: folder {str(path.parent)!r} does not exist")
        if path is not None and path.is_dir():
            raise InputError(f"{str(path)!r} is a folder; give a file name")
    with open_db(args.db) as db:
        report = build_report(db, args.campaign)
    written: list[str] = []
    try:
        if args.out is not None:
            args.out.write_text(render_html(report), encoding="utf-8")
            written.append(str(args.out))
        if args.markdown is not None:
            folder = args.markdown.with_name(args.markdown.stem + "_files")
            text, images = render_markdown(report, image_folder=folder.name)
            if images:
                folder.mkdir(exist_ok=True)
            for name, svg in images.items():
                (folder / name).write_text(svg, encoding="utf-8")
            args.markdown.write_text(text, encoding="utf-8")
            written.append(str(args.markdown))
    except OSError as e:
        raise InputError(f"cannot write the report: {e.strerror or e}") from None
    if written:
        print(f"wrote {', '.join(written)}", file=sys.stderr)
    else:
        sys.stdout.write(render_markdown(report, image_folder=None)[0])
    return 0
