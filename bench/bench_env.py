"""What a CPU-side benchmark record says about where it ran: the machine (CPU model, cores,
platform, Python, load and niceness at the start) and the commit of the code it measured;
`run_main`, which every benchmark's `main` runs under (a bad input: one line, exit code 2); and
`campaign_toml`, the campaign file the benchmarks that run `tilepilot tune` write; `retimed_ratios`,
two configs timed again side by side on the GPU."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def machine() -> dict[str, Any]:
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
            "nice": os.getpriority(os.PRIO_PROCESS, 0)}


def git(*args: str) -> str:
    """The output of `git ARGS` in the repository, or "unknown" where git cannot say."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_main(main: Callable[[], int | None]) -> int:
    """A benchmark's `main`, its exit code returned; a bad input or a missing backend (no CUDA GPU
    for a GPU benchmark: `InputError` and its kinds) ends it with one line on stderr and exit code 2,
    not a traceback."""
    import sys

    from tilepilot.experiments import InputError

    try:
        return main() or 0
    except InputError as e:
        print(f"{Path(sys.argv[0]).name}: error: {e}", file=sys.stderr)
        return 2


def campaign_toml(name: str, kernel: str, proposer: str, budget: int, *, seed: int = 0,
                  space: Mapping[str, Sequence[Any]] | None = None, configs: Iterable[Mapping[str, Any]] = (),
                  problems: Iterable[Mapping[str, Any]] = (), **settings: Any) -> str:
    """A campaign file's text: its [campaign] table (name, kernel, proposer, budget per problem,
    seed, then `settings` such as hypothesis_share=0), the [space] limits, the [[configs]] to run
    first and the [[problems]]."""
    head = {"name": name, "kernel": kernel, "proposer": proposer, "budget": budget, "seed": seed, **settings}
    lines = ["[campaign]", *(f"{k} = {json.dumps(v)}" for k, v in head.items())]
    if space:
        lines += ["", "[space]", *(f"{k} = {json.dumps(list(v))}" for k, v in space.items())]
    for table, rows in (("configs", configs), ("problems", problems)):
        for row in rows:
            lines += ["", f"[[{table}]]", *(f"{k} = {json.dumps(v)}" for k, v in row.items())]
    return "\n".join(lines) + "\n"


def retimed_ratios(ev: Any, kernel: str, problem: Any, a: Any, b: Any, repeats: int) -> list[float]:
    """Configs `a` and `b` of `problem` timed together, interleaved (`Evaluator.remeasure` of the GPU
    evaluator `ev`), `repeats` times: the ratio of a's median to b's in each where both gave one."""
    ratios = []
    for _ in range(repeats):
        ta, tb = ev.remeasure(kernel, problem, [a, b])
        if ta.median_ms and tb.median_ms:
            ratios.append(ta.median_ms / tb.median_ms)
    return ratios
