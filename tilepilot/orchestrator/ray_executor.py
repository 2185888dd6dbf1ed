"""`RayExecutor`: batches on Ray workers, one per GPU (or CPU slots for the interpreter).

For the gpu backend every config is compiled ahead in the CPU compile pool while the GPUs
are busy with earlier batches; a batch goes to a GPU worker once all of its configs have
compiled (configs that fail to compile come back as results without touching a GPU). A worker
with room and no compiled batch waiting does not wait for a batch's slowest compile: it gets
the compiled part of the oldest batch still compiling, and the remainder follows as its own
part once compiled (or sooner, in parts, as workers have room). The driver still gets each
batch once, with one result per config in its order; a trace (BatchTrace) is kept per part.

The pipeline, so that no GPU waits for a compile or for the driver: `free_slots` takes batches
while the pool has fewer configs compiling than it runs at once (`CompilePool.capacity`) or
fewer than READY_PER_GPU batches per GPU wait for a GPU, and never once READY_PER_GPU per GPU
have compiled and wait; each worker holds PER_WORKER batches, the one it runs and the next, which
waits in its actor and starts as soon as the last one ends, with no round trip to the driver in
between (shared workers hold one each, so that campaigns keep taking turns batch by batch).
`trace=True` keeps a BatchTrace of every batch (executor.py) and `waited_s`, the
driver's time blocked in `poll`; benchmarks read them.

Faults (a worker survives its own child's failures by itself: worker.py):

- A worker lost (its actor killed, its process or its whole node gone): the batch it was running
  goes back to the head of this executor's queue and runs on the next free worker, and a new
  actor is started in the lost one's place (events `worker_lost`, `requeued`, `worker_started`;
  the last says how long the worker was away). A compile lost with its compile worker is sent
  again.
- A worker quarantined (worker.py: infrastructure failures in a row): it gets no more work and
  its batch is re-queued (event `quarantined`, with the reason). A worker slot whose actors die
  or fail to start QUARANTINE_AFTER times in a row, with no batch finished in between, is
  quarantined too, and no new actor is started for it.
- No worker left (every one quarantined, or none reachable for `startup_timeout_s`): `poll`
  raises NoWorkerLeft, one line; the driver stops and the campaign can be resumed.

Sharing a cluster (`shared`; by default when this process joined a cluster by address): the
workers are named actors in the namespace "tilepilot" (`tilepilot-gpu-0`, ...) that every
campaign on the cluster finds instead of starting its own. Two campaigns then send their
batches to the same workers, which serve them in the order they arrive (worker.py), so the
GPUs are shared batch by batch and never measure two things at once; a batch that waited
WAITED_NOTE_S or more for its turn is logged (`waited`). A shared worker is detached: it
outlives the campaign that started it, serving the others on, and ends by itself once no
campaign has sent it anything for TILEPILOT_SHARED_IDLE_S seconds, or when a person runs
`tilepilot workers stop` (shared.py). A campaign whose shared worker ended that way sees it lost
(its batch, if it had sent one, re-queued) and asks for it again by name, which starts a fresh
one. Closing, a campaign leaves its shared workers running for the others, except those that
have not answered it within CLOSE_WAIT_S (not placed, or still starting), which are killed
rather than left to hold a GPU once placed (a campaign also waiting for one asks for it again).
Not shared, each campaign starts its own workers and kills them when it closes; a worker that
asks for GPUs another job holds waits for them (event `waiting`), Ray's resource accounting
keeping every GPU to one worker.

TILEPILOT_WORKER_RESOURCES (a JSON object, e.g. '{"tilepilot_gpu": 1}') adds custom Ray
resources that each worker holds: a way to pin workers to the nodes that offer them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from tilepilot.experiments import (
    Config,
    DeviceCeilings,
    Environment,
    GpuSample,
    InputError,
    Problem,
    Result,
    Status,
    Timing,
)
from tilepilot.kernels.base import KernelFamily
from tilepilot.orchestrator.compile_pool import CompilePool
from tilepilot.orchestrator.executor import Batch, BatchTrace, Executor, ExecutorEvent, NoWorkerLeft, Verdict
from tilepilot.orchestrator.ray_runtime import LOST, fetch, joined_cluster
from tilepilot.orchestrator.shared import shared_idle_s, shared_options
from tilepilot.orchestrator.worker import (
    GPU_WORKER_CPUS,
    QUARANTINE_AFTER,
    STARTUP_TIMEOUT_S,
    BatchReply,
    EvalWorker,
    WorkerInfo,
    WorkerQuarantined,
)

log = logging.getLogger(__name__)

CONFIG_TIMEOUT_S = {"gpu": 60.0, "interpret": 300.0}
WORKER_RESOURCES_ENV = "TILEPILOT_WORKER_RESOURCES"
JOIN_GRACE_S = 5.0  # after the first worker answers, how long start-up waits for the others
WAITED_NOTE_S = 1.0  # a batch that waited this long for a shared worker's turn is logged
WAITING_NOTE_S = 10.0  # a worker not started after this long is logged as waiting for resources
SAMPLE_WAIT_S = 10.0
CLOSE_WAIT_S = 1.0  # shared, closing: a worker that has not answered by then is killed (not placed, or still starting)
RENAME_WAIT_S = 0.5  # shared: a lost actor's name may stay bound to it for a moment; ask again this much later
REASON_CHARS = 300
PER_WORKER = 2  # batches a worker holds: the one it runs, and the next waiting in its actor
READY_PER_GPU = 2  # compiled batches waiting for a GPU, per GPU, beyond those the workers hold


@dataclass
class _Pending:
    """One batch on its way: its compiles, and the parts of it sent to workers (a part is the
    configs compiled by the time a worker had room; the rest, the remainder, goes when compiled)."""

    batch: Batch
    compiles: dict[Any, int] = field(default_factory=dict)  # compile ref -> config index
    failed: dict[int, Result] = field(default_factory=dict)  # index -> compile failure result
    compiled_at: dict[int, float] = field(default_factory=dict)  # index compiled -> when (epoch seconds)
    sent: set[int] = field(default_factory=set)  # indices held by a worker or measured
    results: dict[int, Result] = field(default_factory=dict)  # index -> a worker's result
    dropped: set[int] = field(default_factory=set)  # indices withdrawn while a part was on a worker
    requeued: bool = False  # a part came back from a lost worker: it goes first
    submitted: float = field(default_factory=time.time)  # epoch seconds, for BatchTrace
    compiled: float = 0.0

    def unsent(self) -> list[int]:
        """Indices compiled and not yet sent to a worker, in the batch's order."""
        return sorted(i for i in self.compiled_at if i not in self.sent and i not in self.dropped)

    def complete(self) -> bool:
        return len(self.failed) + len(self.results) + len(self.dropped) == len(self.batch.configs)

    def sub(self, indices: Sequence[int]) -> Batch:
        """The batch cut down to `indices` (the whole batch when they are all of it)."""
        if len(indices) == len(self.batch.configs):
            return self.batch
        return replace(self.batch, configs=tuple(self.batch.configs[i] for i in indices),
                       queue_ids=tuple(self.batch.queue_ids[i] for i in indices))

    def outcome(self) -> tuple[Batch, list[Result]]:
        """What the driver gets: one result per config not withdrawn, in the batch's order."""
        kept = [i for i in range(len(self.batch.configs)) if i not in self.dropped]
        return self.sub(kept), [self.failed[i] if i in self.failed else self.results[i] for i in kept]


@dataclass(frozen=True)
class _Part:
    """Configs of one batch sent to a worker together."""

    indices: tuple[int, ...]
    compiled: float  # when the last of them compiled
    dispatched: float


@dataclass
class _Slot:
    """One worker's place: the actor that fills it now, and what happened to those before."""

    worker_id: str
    actor: Any = None
    info: WorkerInfo | None = None  # of the current actor, once it has answered
    last: WorkerInfo | None = None  # of the last actor that answered (where a lost one ran)
    starting: Any = None  # the current actor's info() ref while it starts
    since: float = 0.0  # when the current actor was asked for
    lost_at: float | None = None  # when the slot lost its last working actor
    why: str = ""  # why the current actor was started ("" for the first)
    strikes: list[str] = field(default_factory=list)  # lost or failed actors in a row
    dead: list[Any] = field(default_factory=list)  # handles of its lost actors
    retry_at: float | None = None  # shared: when to ask for its name again (still bound to a dead actor)
    quarantined: str = ""
    held: int = 0  # batches sent to the current actor and not yet returned (at most PER_WORKER)
    sent: int = 0  # parts of batches sent to the current actor so far: the next one's `seq`
    last_ended: float = 0.0  # when the current actor ended this executor's last batch (its clock)
    noted_waiting: bool = False

    @property
    def ready(self) -> bool:
        return self.info is not None and not self.quarantined

    def where(self) -> dict[str, str]:
        info = self.info or self.last
        return {"worker": self.worker_id, "node": info.node_id if info else "", "host": info.node if info else ""}


class RayExecutor(Executor):
    def __init__(self, family: KernelFamily, backend: str, *, workers: int | None = None,
                 timeout_s: float | None = None, worker_env: Mapping[str, str] | None = None,
                 worker_resources: Mapping[str, float] | None = None, shared: bool | None = None,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S, trace: bool = False) -> None:
        if backend not in CONFIG_TIMEOUT_S:
            raise InputError(f"backend {backend!r} does not run on Ray workers (allowed: gpu, interpret)")
        self.family = family
        self.backend = backend
        self.timeout_s = timeout_s or CONFIG_TIMEOUT_S[backend]
        self.kernel_version = family.kernel_version()
        self.shared = joined_cluster() if shared is None else shared
        self.per_worker = 1 if self.shared else PER_WORKER
        self._idle_exit_s = shared_idle_s() if self.shared else None  # shared workers end when idle this long
        self.startup_timeout_s = startup_timeout_s
        self._options = self._actor_options(worker_env, _resources(worker_resources))
        self._events: list[ExecutorEvent] = []
        self._starts: dict[Any, _Slot] = {}  # info ref of an actor starting -> its slot
        self._expected: Environment | None = None
        self._unserved_since: float | None = None
        self.compiling: list[_Pending] = []
        self.ready: list[_Pending] = []
        self.running_refs: dict[Any, tuple[_Slot, Any, _Pending]] = {}  # eval ref -> (slot, actor, pending)
        self._parts: dict[Any, _Part] = {}  # eval ref -> the part of its batch it runs
        self.settled: list[tuple[Batch, list[Result]]] = []  # finished, for the next `poll`
        self.traces: list[BatchTrace] | None = [] if trace else None
        self.waited_s = 0.0  # time `poll` spent blocked waiting for Ray
        self.slots = [_Slot(w) for w in self._worker_ids(workers)]
        self.pool: CompilePool | None = None
        for slot in self.slots:
            self._launch(slot, "")
        try:
            first = self._await_first()
        except NoWorkerLeft:  # the workers asked for must not wait in the cluster for a node, nor start later
            self.close()
            raise
        self.environment: Environment = first.environment
        self.target = first.target
        self.pool = (CompilePool(gpu_worker_cpus=GPU_WORKER_CPUS, shared=self.shared, env=worker_env)
                     if backend == "gpu" else None)  # the same TRITON_CACHE_DIR as the GPU workers'

    def _worker_ids(self, count: int | None) -> list[str]:
        if self.backend == "gpu":
            gpus = int(ray.cluster_resources().get("GPU", 0))
            if gpus == 0:
                raise InputError("backend 'gpu' needs a GPU, and the Ray cluster has none "
                                 "(use --backend replay or interpret)")
            return [f"gpu-{i}" for i in range(min(count or gpus, gpus))]
        return [f"{self.backend}-{i}" for i in range(count or 1)]

    def _actor_options(self, env: Mapping[str, str] | None, resources: dict[str, float]) -> dict[str, Any]:
        opts: dict[str, Any] = ({"num_gpus": 1, "num_cpus": GPU_WORKER_CPUS} if self.backend == "gpu"
                                else {"num_gpus": 0, "num_cpus": 1, "scheduling_strategy": "SPREAD"})
        if resources:
            opts["resources"] = resources
        if env:
            opts["runtime_env"] = {"env_vars": dict(env)}
        return opts

    # ---- Executor ------------------------------------------------------------------------
    def free_slots(self) -> int:
        """One more batch while the pipeline has room (see the module docstring)."""
        usable = sum(1 for s in self.slots if not s.quarantined)
        if self.pool is None:
            return max(0, (self.per_worker + READY_PER_GPU) * usable - self.in_flight())
        compiling = len({r for p in self.compiling for r in p.compiles})
        return pipeline_room(usable, ready=len(self.ready), waiting=len(self.ready) + len(self.compiling),
                             compiling=compiling, capacity=self.pool.capacity)

    def in_flight(self) -> int:
        batches = {id(p) for p in [*self.compiling, *self.ready, *(v[2] for v in self.running_refs.values())]}
        return len(batches) + len(self.settled)

    def withdraw(self) -> list[Batch]:
        """The batches compiling or compiled and waiting for a worker; a worker's batches (the one
        it runs and the next it holds) stay. Their compiles go on and warm the cache. Of a batch
        with a part on a worker, the configs no worker holds come back (its compile failures stay
        with the part: they are results), and the driver gets the part's results alone."""
        back: list[Batch] = []
        for pending in [*self.compiling, *self.ready]:
            if not pending.sent:
                back.append(pending.batch)
                continue
            rest = [i for i in range(len(pending.batch.configs)) if i not in pending.sent and i not in pending.failed]
            pending.dropped.update(rest)
            pending.compiles.clear()
            back.append(pending.sub(rest))
            if pending.complete():  # its parts came back already
                self.settled.append(pending.outcome())
        self.compiling, self.ready = [], []
        return back

    def submit(self, batch: Batch) -> None:
        pending = _Pending(batch)
        if self.pool is None or self.target is None:
            pending.compiled = pending.submitted
            pending.compiled_at = dict.fromkeys(range(len(batch.configs)), pending.submitted)
            self.ready.append(pending)
        else:
            for i, config in enumerate(batch.configs):
                ref = self.pool.submit(self.family.name, batch.problem, config, self.target)
                pending.compiles[ref] = i
            self.compiling.append(pending)
        self._start_ready()

    def poll(self, timeout_s: float) -> list[tuple[Batch, list[Result]]]:
        self._relaunch_due()
        # one compile ref may serve several batches (the pool compiles each cache key once)
        refs = list(dict.fromkeys([r for p in self.compiling for r in p.compiles]
                                  + list(self.running_refs) + list(self._starts)))
        if refs:
            t0 = time.perf_counter()
            ray.wait(refs, num_returns=1, timeout=timeout_s)  # the first to finish, then all that have
            self.waited_s += time.perf_counter() - t0
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in done:
                if ref in self.running_refs:
                    self._returned(ref)
                elif ref in self._starts:
                    self._started(self._starts[ref])
                else:
                    self._compiled(ref)
        self._start_ready()
        self._watch()
        finished, self.settled = self.settled, []
        return finished

    def remeasure(self, problem: Problem, configs: Sequence[Config]) -> list[Result]:
        return self._call("remeasure", self.family.name, problem, list(configs), 5,  # type: ignore[no-any-return]
                          self.timeout_s)

    def recheck(self, problem: Problem, config: Config) -> Verdict | None:
        check = self._call("recheck", self.family.name, problem, config, self.timeout_s)
        return Verdict(check.passed, check.max_rel_err, check.message)

    def baseline(self, problem: Problem) -> tuple[str, Timing] | None:
        timing = self._call("baseline", self.family.name, problem, self.timeout_s)
        return (self.family.baseline_name or "baseline", timing) if timing else None

    def ceilings(self) -> dict[str, DeviceCeilings]:
        if self.backend != "gpu":
            return {}
        seen: set[tuple[str, str]] = set()
        out: dict[str, DeviceCeilings] = {}
        for slot in [s for s in self.slots if s.ready]:
            assert slot.info is not None
            env = slot.info.environment
            if (env.device, env.driver) in seen:
                continue
            actor = slot.actor
            try:
                measured = fetch(actor.ceilings.remote(self.timeout_s))
            except WorkerQuarantined as e:
                self._quarantine(slot, e.reason)
                continue
            except LOST as e:
                self._lose(slot, actor, _line(e))
                continue
            seen.add((env.device, env.driver))
            if measured is not None:
                out[slot.worker_id] = measured
        return out

    def samples(self) -> list[GpuSample]:
        if self.backend != "gpu":
            return []
        asked = {s.actor.sample.remote(): (s, s.actor) for s in self.slots if s.ready}
        if not asked:
            return []
        done, _ = ray.wait(list(asked), num_returns=len(asked), timeout=SAMPLE_WAIT_S)
        out = []
        for ref in done:
            slot, actor = asked[ref]
            try:
                sample = ray.get(ref)
            except LOST as e:
                if not slot.held:  # a busy one is handled when its batch comes back
                    self._lose(slot, actor, _line(e))
                continue
            if sample is not None:
                out.append(sample)
        return out

    def running(self) -> dict[str, str]:
        return {slot.worker_id: p.batch.problem.label() for slot, _, p in self.running_refs.values()}

    def events(self) -> list[ExecutorEvent]:
        out, self._events = self._events, []
        return out

    def close(self) -> None:
        """Kill this campaign's own workers; of shared ones, only those that have not answered
        within CLOSE_WAIT_S (never placed, or still starting; the others serve other campaigns on,
        and end when idle: module docstring)."""
        unstarted = [s for s in self.slots if s.actor is not None and s.starting is not None]
        if self.shared and unstarted:
            asked = {s.starting: s for s in unstarted}
            answered, _ = ray.wait(list(asked), num_returns=len(asked), timeout=CLOSE_WAIT_S)
            unstarted = [s for ref, s in asked.items() if ref not in answered]
        for slot in unstarted if self.shared else self.slots:
            if slot.actor is not None:
                ray.kill(slot.actor)
        if self.pool is not None:
            self.pool.close()

    # ---- workers: start, loss, quarantine ------------------------------------------------
    def _launch(self, slot: _Slot, why: str) -> None:
        opts = dict(self._options)
        if self.shared:
            opts |= shared_options(f"tilepilot-{slot.worker_id}")
        slot.actor = EvalWorker.options(**opts).remote(self.backend, worker_id=slot.worker_id,
                                                       idle_exit_s=self._idle_exit_s)
        slot.info = None
        slot.held = slot.sent = 0
        slot.last_ended = 0.0
        slot.why = why
        slot.retry_at = None
        slot.starting = slot.actor.info.remote()
        self._starts[slot.starting] = slot
        slot.since = time.monotonic()
        slot.noted_waiting = False

    def _starting(self) -> bool:
        return bool(self._starts) or any(s.retry_at is not None and not s.quarantined for s in self.slots)

    def _wait_starts(self, timeout_s: float, *, first: bool = False) -> None:
        """Wait up to `timeout_s` for a starting worker to answer (or a name to ask for again)."""
        self._relaunch_due()
        if not self._starts:
            time.sleep(min(timeout_s, RENAME_WAIT_S))
            return
        done, _ = ray.wait(list(self._starts), num_returns=1, timeout=min(timeout_s, RENAME_WAIT_S))
        for ref in done:
            if ref in self._starts:
                self._started(self._starts[ref], first=first)

    def _relaunch_due(self) -> None:
        """Ask again for shared workers whose names were still bound to their lost actors."""
        now = time.monotonic()
        for slot in self.slots:
            if slot.retry_at is not None and slot.retry_at <= now and not slot.quarantined:
                self._launch(slot, slot.why)

    def _await_first(self) -> WorkerInfo:
        """Wait for the first worker to answer (and a little for the others); its info."""
        deadline = time.monotonic() + self.startup_timeout_s
        while not any(s.ready for s in self.slots):
            self._check_usable()
            left = deadline - time.monotonic()
            if not self._starting() or left <= 0:
                raise NoWorkerLeft(f"no worker started within {self.startup_timeout_s:g} s "
                                   f"({len(self.slots)} asked for with {_describe_options(self._options)})")
            self._wait_starts(left, first=True)
        if self._starts:
            done, _ = ray.wait(list(self._starts), num_returns=len(self._starts), timeout=JOIN_GRACE_S)
            for ref in done:
                if ref in self._starts:
                    self._started(self._starts[ref], first=True)
        info = next(s.info for s in self.slots if s.ready)
        assert info is not None
        return info

    def _started(self, slot: _Slot, *, first: bool = False) -> None:
        """A starting actor answered (or failed): the slot is ready, or it struck out once more."""
        ref, slot.starting = slot.starting, None
        self._starts.pop(ref, None)
        actor = slot.actor
        try:
            info: WorkerInfo = fetch(ref)
        except LOST as e:
            if any(actor == dead for dead in slot.dead):  # shared: its name still names the lost actor
                slot.actor, slot.retry_at = None, time.monotonic() + RENAME_WAIT_S
                return
            self._lose(slot, actor, f"its actor failed to start: {_line(e)}")
            return
        if self._expected is None:
            self._expected = info.environment
        elif info.environment != self._expected:
            if first:
                raise InputError(f"workers see different devices or toolchains ({self._expected} and "
                                 f"{info.environment}); run one campaign per device model")
            self._quarantine(slot, f"it reports {info.environment}, not {self._expected}")
            return
        slot.info = slot.last = info
        if info.quarantined:  # a shared worker that another campaign's work quarantined
            self._quarantine(slot, info.quarantined)
            return
        now = time.monotonic()
        back = f"; back {now - slot.lost_at:.1f} s after it was lost" if slot.lost_at is not None else ""
        self._event("worker_started", f"worker {slot.worker_id} started on node {info.node_id[:8]} ({info.node}) "
                    f"in {now - slot.since:.1f} s{back}", **slot.where(), startup_s=round(now - slot.since, 3),
                    back_s=None if slot.lost_at is None else round(now - slot.lost_at, 3), replaces=slot.why)
        slot.lost_at = None

    def _lose(self, slot: _Slot, actor: Any, reason: str) -> None:
        """The slot's actor is gone: start another in its place, or quarantine the slot."""
        if actor is not slot.actor or slot.quarantined:
            return  # that actor was replaced already
        where = slot.where()
        slot.info = None
        slot.held = 0
        slot.dead = [*slot.dead[-(QUARANTINE_AFTER - 1):], actor]
        if slot.starting is not None:
            self._starts.pop(slot.starting, None)
            slot.starting = None
        slot.strikes.append(reason)
        if not self.shared:
            ray.kill(actor)  # it may only be unreachable: it must not keep its GPU from the new one
        self._event("worker_lost", f"worker {slot.worker_id} on node {where['node'][:8]} ({where['host']}) lost: "
                    f"{reason}", **where, reason=reason)
        if len(slot.strikes) >= QUARANTINE_AFTER:
            self._quarantine(slot, f"{len(slot.strikes)} lost or failed actors in a row: " + "; ".join(slot.strikes))
            return
        if slot.lost_at is None:
            slot.lost_at = time.monotonic()
        self._launch(slot, reason)

    def _quarantine(self, slot: _Slot, reason: str) -> None:
        """No more work for this slot; its actor (if alive) keeps holding its GPU."""
        if slot.quarantined:
            return
        reason = _line(reason)
        where = slot.where()
        slot.quarantined = reason
        slot.retry_at = None
        if slot.starting is not None:
            self._starts.pop(slot.starting, None)
            slot.starting = None
        self._event("quarantined", f"worker {slot.worker_id} on node {where['node'][:8]} ({where['host']}) "
                    f"quarantined: {reason}; it gets no more work", **where, reason=reason)

    def _watch(self) -> None:
        """Raise NoWorkerLeft when no worker can work any more; log workers kept waiting."""
        self._check_usable()
        now = time.monotonic()
        for slot in self.slots:
            waiting = slot.starting is not None or (slot.retry_at is not None and not slot.quarantined)
            if waiting and not slot.noted_waiting and now - slot.since > WAITING_NOTE_S:
                slot.noted_waiting = True
                self._event("waiting", f"worker {slot.worker_id} not started after {now - slot.since:.0f} s: it "
                            f"waits for {_describe_options(self._options)} (held by other jobs, or on a node "
                            "that is gone)", worker=slot.worker_id, waited_s=round(now - slot.since, 3))
        if any(s.ready for s in self.slots):
            self._unserved_since = None
            return
        self._unserved_since = self._unserved_since or now
        if now - self._unserved_since > self.startup_timeout_s:
            raise NoWorkerLeft(f"no worker has been available for {now - self._unserved_since:.0f} s "
                               f"({len(self.slots)} asked for with {_describe_options(self._options)})")

    def _check_usable(self) -> None:
        if all(s.quarantined for s in self.slots):
            why = "; ".join(f"{s.worker_id}: {s.quarantined}" for s in self.slots)
            raise NoWorkerLeft(f"every worker is quarantined, so the campaign cannot go on ({why})")

    def _call(self, method: str, *args: Any) -> Any:
        """One request to some working worker (an idle one first), tried elsewhere if it is lost."""
        while True:
            slot = self._some_worker()
            actor = slot.actor
            try:
                return fetch(getattr(actor, method).remote(*args))
            except WorkerQuarantined as e:
                self._quarantine(slot, e.reason)
            except LOST as e:
                self._lose(slot, actor, _line(e))

    def _some_worker(self) -> _Slot:
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            ready = [s for s in self.slots if s.ready]
            if ready:
                return min(ready, key=lambda s: s.held)
            self._check_usable()
            left = deadline - time.monotonic()
            if not self._starting() or left <= 0:
                raise NoWorkerLeft(f"no worker available within {self.startup_timeout_s:g} s")
            self._wait_starts(left)

    def _event(self, kind: str, message: str, **data: Any) -> None:
        log.log(logging.WARNING if kind in ("worker_lost", "quarantined", "requeued") else logging.INFO, "%s", message)
        self._events.append(ExecutorEvent(kind, message, data))

    # ---- batches ---------------------------------------------------------------------------
    def _returned(self, ref: Any) -> None:
        slot, actor, pending = self.running_refs.pop(ref)
        part = self._parts.pop(ref)
        if actor is slot.actor:
            slot.held -= 1
        try:
            reply: BatchReply = fetch(ref)
        except WorkerQuarantined as e:
            self._quarantine(slot, e.reason)
            self._requeue(pending, part, slot, "its worker was quarantined")
            return
        except LOST as e:
            self._lose(slot, actor, _line(e))
            self._requeue(pending, part, slot, "its worker was lost")
            return
        slot.strikes.clear()
        others = _waited_for_others(reply, slot.last_ended if actor is slot.actor else 0.0)
        if actor is slot.actor:
            slot.last_ended = max(slot.last_ended, reply.ended_at)
        if others >= WAITED_NOTE_S:
            self._event("waited", f"{len(reply.results)} config(s) of {pending.batch.problem.label()} waited "
                        f"{others:.1f} s for worker {slot.worker_id}, busy with another campaign's work",
                        worker=slot.worker_id, waited_s=round(others, 3), batch=pending.batch.id)
        results = [replace(r, extra={**r.extra, "worker": slot.worker_id}) for r in reply.results]
        pending.results.update(zip(part.indices, results, strict=True))
        if self.traces is not None:
            self.traces.append(BatchTrace(pending.batch.id, slot.worker_id, len(results), pending.submitted,
                                          part.compiled, part.dispatched, reply.started_at, reply.ended_at,
                                          time.time(), reply.compiles, reply.wakes))
        self._settle(pending)

    def _requeue(self, pending: _Pending, part: _Part, slot: _Slot, why: str) -> None:
        """Back to the head of the queue: the next free worker runs it."""
        pending.sent.difference_update(part.indices)
        pending.requeued = True
        if pending in self.ready:
            self.ready.remove(pending)
        if pending not in self.compiling:
            self.ready.insert(0, pending)
        batch = pending.sub(part.indices)
        self._event("requeued", f"{len(batch.configs)} config(s) of {batch.problem.label()} back in the queue: "
                    f"{why} ({slot.worker_id})", **slot.where(), batch=batch.id, queue_ids=list(batch.queue_ids),
                    reason=why)

    def _compiled(self, ref: Any) -> None:
        waiting = [p for p in self.compiling if ref in p.compiles]
        if not waiting:
            return
        try:
            outcome = fetch(ref)
        except (*LOST, RayTaskError) as e:
            if not _is_lost(e):
                raise
            self._recompile(ref, waiting, _line(e))
            return
        now = time.time()
        for pending in waiting:
            index = pending.compiles.pop(ref)
            if outcome.status is not Status.OK:
                pending.failed[index] = Result(
                    problem=pending.batch.problem, config=pending.batch.configs[index],
                    status=outcome.status, env=self.environment, message=outcome.message,
                    compile_ms=outcome.compile_ms,
                    extra={"shared_bytes": outcome.shared_bytes} if outcome.shared_bytes else {})
            else:
                pending.compiled_at[index] = now
            if not pending.compiles:
                pending.compiled = now
                self.compiling.remove(pending)
                if pending.unsent():
                    self.ready.append(pending)
                self._settle(pending)

    def _settle(self, pending: _Pending) -> None:
        """A batch with every config measured, failed or withdrawn goes to the driver, whole."""
        if pending.complete() and pending not in self.compiling and pending not in self.ready:
            self.settled.append(pending.outcome())

    def _recompile(self, ref: Any, waiting: list[_Pending], reason: str) -> None:
        """A compile lost with its compile worker (or node): the pool heals and compiles it again."""
        assert self.pool is not None and self.target is not None
        self.pool.heal()
        for pending in waiting:
            index = pending.compiles.pop(ref)
            config = pending.batch.configs[index]
            again = self.pool.submit(self.family.name, pending.batch.problem, config, self.target)
            pending.compiles[again] = index
            self._event("requeued", f"compile of {pending.batch.problem.label()} {config.label()} sent again: "
                        f"{reason}", batch=pending.batch.id, reason=reason)

    def _start_ready(self) -> None:
        """Send work to workers with room: a re-queued part first, then the compiled batches in
        the order they compiled, and with none of those the compiled part of the oldest batch
        still compiling (its remainder follows when compiled: no worker waits for a straggler)."""
        while True:
            free = [s for s in self.slots if s.ready and s.held < self.per_worker]
            if not free:
                return
            first = [p for p in self.compiling if p.requeued]
            pending = next((p for p in [*first, *self.ready, *self.compiling] if p.unsent()), None)
            if pending is None:
                return
            if pending in self.ready:
                self.ready.remove(pending)
            self._send(min(free, key=lambda s: s.held), pending)  # an idle worker first

    def _send(self, slot: _Slot, pending: _Pending) -> None:
        indices = tuple(pending.unsent())
        configs = [pending.batch.configs[i] for i in indices]
        # numbered, so the batch it holds ahead runs after this one (a shared actor has other callers: unnumbered)
        seq = None if self.shared else slot.sent
        slot.sent += 1
        ref = slot.actor.run_batch.remote(self.family.name, pending.batch.problem, configs, self.timeout_s, seq)
        pending.sent.update(indices)
        pending.requeued = False
        self.running_refs[ref] = (slot, slot.actor, pending)
        self._parts[ref] = _Part(indices, max(pending.compiled_at[i] for i in indices), time.time())
        slot.held += 1


# ---- module helpers ------------------------------------------------------------------------------
def pipeline_room(gpus: int, *, ready: int, waiting: int, compiling: int, capacity: int) -> int:
    """Batches a compile-ahead executor takes now (0 or 1; the driver asks again after each):
    with `gpus` usable GPUs, `ready` batches compiled and waiting for one, `waiting` batches
    waiting for one or compiling, `compiling` configs compiling, in a pool that runs `capacity`
    compiles at once. None once READY_PER_GPU per GPU have compiled and wait; else one while the
    pool has room, or fewer than READY_PER_GPU per GPU wait (so small batches still queue ahead)."""
    if gpus <= 0 or ready >= READY_PER_GPU * gpus:
        return 0
    return 1 if compiling < capacity or waiting < READY_PER_GPU * gpus else 0


def _waited_for_others(reply: BatchReply, own_ended: float) -> float:
    """Of the time a batch waited for its turn, the part spent behind other callers' requests: not
    behind this executor's own batch before it (PER_WORKER), which the actor ended at `own_ended`
    (the actor's clock, as the reply's)."""
    asked = reply.started_at - reply.waited_s
    own = max(0.0, min(own_ended, reply.started_at) - asked)
    return max(0.0, reply.waited_s - own)


def _resources(given: Mapping[str, float] | None) -> dict[str, float]:
    """Custom resources each worker holds: those given, else TILEPILOT_WORKER_RESOURCES, else none."""
    if given is not None:
        return {str(k): float(v) for k, v in given.items()}
    raw = os.environ.get(WORKER_RESOURCES_ENV, "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and k and isinstance(v, int | float) and not isinstance(v, bool) and v > 0
            for k, v in value.items()):
        raise InputError(f"{WORKER_RESOURCES_ENV}={raw!r} is not a JSON object of resource names and positive "
                         'amounts (e.g. {"tilepilot_gpu": 1})')
    return {k: float(v) for k, v in value.items()}


def _describe_options(opts: Mapping[str, Any]) -> str:
    wants = {"CPU": opts.get("num_cpus", 0), "GPU": opts.get("num_gpus", 0), **opts.get("resources", {})}
    return ", ".join(f"{v:g} {k}" for k, v in wants.items() if v)


def _is_lost(e: BaseException) -> bool:
    return isinstance(e, LOST) or (isinstance(e, RayTaskError) and isinstance(e.cause, LOST))


def _line(e: BaseException | str, limit: int = REASON_CHARS) -> str:
    """One line of an error or a text, cut to `limit` characters: the first line, or for a lost
    actor Ray's sentences without the indented fields ("The actor died ... because its node has
    died ...")."""
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    if isinstance(e, RayActorError):
        text = " ".join(ln.strip() for ln in lines if not ln[0].isspace())
    else:
        text = lines[0].strip() if lines else type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
