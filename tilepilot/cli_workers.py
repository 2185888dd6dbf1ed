"""`tilepilot workers stop --address ADDR`: end the shared workers of a Ray cluster now.

Campaigns that join a cluster by address share its workers, which outlive the campaign that
started them and end by themselves after TILEPILOT_SHARED_IDLE_S seconds without a request
(orchestrator/shared.py). This verb ends them at once, GPU and compile workers alike, so that
their GPUs are free now. A campaign still running on the cluster starts the workers it needs
again (stop it first: `tilepilot stop CAMPAIGN`).
"""

from __future__ import annotations

import argparse
from typing import Any

from tilepilot.experiments import InputError

ACTIONS = ("stop",)


def add_workers_parser(sub: Any) -> None:
    """Register `workers` on the `tilepilot` command's subparsers."""
    text = "end the shared workers of a Ray cluster now (they otherwise end when idle)"
    w = sub.add_parser("workers", help=text, description=text[0].upper() + text[1:] + ".")
    w.add_argument("action", metavar="ACTION", help="stop")
    w.add_argument("--address", required=True, help="the Ray cluster ('auto' or host:port)")
    w.set_defaults(func=cmd_workers)


def cmd_workers(args: argparse.Namespace) -> int:
    if args.action not in ACTIONS:
        raise InputError(f"unknown workers action {args.action!r} (allowed: {', '.join(ACTIONS)})")
    from tilepilot.orchestrator.ray_runtime import shutdown, start_ray
    from tilepilot.orchestrator.shared import stop_shared_workers

    info = start_ray(args.address)
    try:
        stopped = stop_shared_workers()
    finally:
        shutdown()
    if not stopped:
        print(f"no shared workers on the cluster at {info.address}")
        return 0
    print(f"stopped {len(stopped)} shared worker(s) on the cluster at {info.address}: {', '.join(stopped)}")
    return 0
