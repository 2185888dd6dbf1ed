"""`tune`: from a campaign file and the command line's choices to a finished campaign.

Everything the user gave is validated in `plan()` before anything is written or started,
so a mistake costs one line on stderr and leaves the store as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tilepilot.agents.registry import DEFAULT_PROPOSER, get_proposer, proposer_names
from tilepilot.agents.tile_model import configured_constants
from tilepilot.experiments import (
    BackendUnavailable,
    Campaign,
    Config,
    InputError,
    Problem,
    SearchSpace,
    load_campaign,
)
from tilepilot.kernels.base import KernelFamily
from tilepilot.kernels.registry import get_family, problem_parsers
from tilepilot.orchestrator.driver import Driver, ProgressFn
from tilepilot.orchestrator.executor import Executor
from tilepilot.orchestrator.replay import ReplayDataset, default_dataset, load_dataset
from tilepilot.storage.store import Store, WinnerRow

log = logging.getLogger(__name__)

BACKENDS = ("auto", "gpu", "interpret", "replay")
INTERPRET_MAX_FLOPS = 2e8  # the interpreter runs a program at a time on the CPU


@dataclass(frozen=True)
class TuneOptions:
    campaign: Path
    backend: str = "auto"
    dataset: Path | None = None
    db: Path = Path("tilepilot.db")
    budget: int | None = None
    proposer: str | None = None
    address: str | None = None
    resume: bool = False
    dry_run: bool = False
    workers: int | None = None
    cold: bool = False  # a new campaign starts without the winners of nearby problems (no warm start)


@dataclass(frozen=True)
class Plan:
    campaign: Campaign
    family: KernelFamily
    backend: str
    dataset: ReplayDataset | None
    spaces: dict[Problem, SearchSpace]
    first: tuple[Config, ...] = ()  # the campaign file's [[configs]], measured first


@dataclass(frozen=True)
class Outcome:
    plan: Plan
    campaign_id: int
    device: str
    winners: list[WinnerRow]
    stopped: bool = False  # a person stopped it (`tilepilot stop`): interrupted, resumable with --resume


def plan(opts: TuneOptions) -> Plan:
    if opts.backend not in BACKENDS:
        raise InputError(f"unknown backend {opts.backend!r} (allowed: {', '.join(BACKENDS)})")
    campaign = load_campaign(opts.campaign, kernels=problem_parsers(), proposers=proposer_names(),
                             default_proposer=DEFAULT_PROPOSER)
    if opts.budget is not None:
        if not 1 <= opts.budget <= 100_000:
            raise InputError(f"--budget {opts.budget} is out of range (allowed: 1 to 100000)")
        campaign = replace(campaign, budget=opts.budget)
    if opts.proposer is not None:
        if opts.proposer not in proposer_names():
            raise InputError(f"unknown proposer {opts.proposer!r} (known proposers: "
                             f"{', '.join(proposer_names())})")
        campaign = replace(campaign, proposer=opts.proposer)
    get_proposer(campaign.proposer)  # one that cannot run here (llm without a key) fails now, before any work
    for member in campaign.members:
        get_proposer(member)
    configured_constants()  # a bad TILEPILOT_RULES_CONSTANTS file too
    family = get_family(campaign.kernel)
    first = _first_configs(family, campaign, opts.campaign)
    backend = resolve_backend(opts.backend, opts.address, opts.dataset)
    narrow = dict(campaign.space)
    if backend == "replay":
        for flag, value in (("--address", opts.address), ("--workers", opts.workers)):
            if value is not None:
                raise InputError(f"{flag} is for the gpu and interpret backends, not replay")
        dataset = load_dataset(opts.dataset or default_dataset(campaign.kernel), family)
        if not campaign.problems:
            campaign = campaign.with_problems(dataset.problems)
        spaces = {p: _narrowed(dataset.space(family, p), narrow, opts.campaign) for p in campaign.problems}
        return Plan(campaign, family, backend, dataset, spaces, first)
    if opts.dataset is not None:
        raise InputError(f"--dataset is for the replay backend, not {backend!r}")
    if not campaign.problems:
        raise InputError(f"{opts.campaign}: no [[problems]] (only a replay campaign may omit them)")
    if backend == "interpret":
        _check_interpretable(family, campaign.problems)
    space = _narrowed(family.space(), narrow, opts.campaign)
    return Plan(campaign, family, backend, None, {p: space for p in campaign.problems}, first)


def _narrowed(space: SearchSpace, choices: dict[str, tuple[object, ...]], origin: Path) -> SearchSpace:
    try:
        return space.narrowed(choices) if choices else space
    except InputError as e:
        raise InputError(f"{origin}: {e}") from None


def _first_configs(family: KernelFamily, campaign: Campaign, origin: Path) -> tuple[Config, ...]:
    space = family.space()
    out: list[Config] = []
    for i, raw in enumerate(campaign.configs, start=1):
        try:
            out.append(space.parse(dict(raw)))
        except InputError as e:
            raise InputError(f"{origin}: configs {i}: {e}") from None
    return tuple(out)


def resolve_backend(name: str, address: str | None, dataset: Path | None) -> str:
    if name != "auto":
        return name
    if dataset is not None:
        return "replay"
    if address is not None:
        return "gpu"
    from tilepilot.kernels.telemetry import nvml_available

    return "gpu" if nvml_available() else "replay"


def _check_interpretable(family: KernelFamily, problems: Sequence[Problem]) -> None:
    for p in problems:
        if p.get("dtype") == "bf16":
            raise BackendUnavailable(
                f"backend 'interpret' refuses bf16 ({p.label()}): the Triton interpreter computes "
                "bf16 wrongly without an error; use fp16, or the gpu or replay backend")
        if family.work(p).flops > INTERPRET_MAX_FLOPS:
            raise BackendUnavailable(
                f"problem {p.label()} is too large for the interpreter "
                f"(at most {INTERPRET_MAX_FLOPS:.0e} FLOPs; use the gpu or replay backend)")


def open_campaign(store: Store, p: Plan, opts: TuneOptions, device: str) -> int:
    existing = store.get_campaign(p.campaign.name)
    if existing is None:
        dataset = str(p.dataset.path) if p.dataset else ""
        return store.create_campaign(p.campaign, backend=p.backend, dataset=dataset, device=device)
    if not opts.resume:
        raise InputError(f"campaign {p.campaign.name!r} already exists in {opts.db} "
                         "(use --resume to continue it, or another name)")
    mismatch = [f"{k} {getattr(existing, k)!r} vs {v!r}" for k, v in
                (("kernel", p.campaign.kernel), ("backend", p.backend), ("device", device))
                if getattr(existing, k) != v]
    if mismatch:
        raise InputError(f"cannot resume {p.campaign.name!r}: it ran with a different "
                         f"{'; '.join(mismatch)}")
    store.set_campaign_state(existing.id, "running")
    return existing.id


def make_executor(p: Plan, opts: TuneOptions) -> Executor:
    if p.backend == "replay":
        from tilepilot.orchestrator.replay_executor import ReplayExecutor

        assert p.dataset is not None
        return ReplayExecutor(p.dataset)
    from tilepilot.orchestrator.ray_executor import RayExecutor
    from tilepilot.orchestrator.ray_runtime import start_ray

    start_ray(opts.address)
    return RayExecutor(p.family, p.backend, workers=opts.workers)


def tune(opts: TuneOptions, *, on_progress: ProgressFn | None = None) -> Outcome:
    p = plan(opts)
    store = Store(opts.db)  # a bad --db fails here, before any worker starts
    try:
        executor = make_executor(p, opts)
        try:
            campaign_id = open_campaign(store, p, opts, executor.environment.device)
            try:
                driver = Driver(p.campaign, p.family, store, executor, spaces=p.spaces,
                                campaign_id=campaign_id, first=p.first, on_progress=on_progress,
                                warm_start=not (opts.cold or opts.resume), history=not opts.cold)
                winners = driver.run()
            except BaseException:
                store.set_campaign_state(campaign_id, "interrupted")
                store.log_event("campaign_interrupted", f"campaign {p.campaign.name} interrupted; "
                                "resume with --resume", campaign_id=campaign_id)
                raise
            return Outcome(p, campaign_id, executor.environment.device, winners, stopped=driver.stopped)
        finally:
            executor.close()
    finally:
        store.close()
