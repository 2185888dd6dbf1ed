"""`EvalWorker`: the Ray actor of one GPU (or of one CPU slot, for the interpreter).

It never runs a kernel itself: it supervises one child process (child.py) that holds the CUDA
context, and turns the ways a child can fail into results (DESIGN.md, "The worker"):

- a sticky CUDA error: that config is `crashed` with the error's message; the child is
  replaced; the config is not retried; the rest of the batch goes on on the fresh child;
- the child dies with no error of its own (a segfault, killed): it is replaced and the config
  that was running is retried once, alone, on the fresh child; a second death is `poison`;
- no answer in time: the child is killed, the running config is `timeout`, the child is
  replaced and the batch goes on;
- out of memory comes back from the evaluator as `oom`.

Timeouts: `timeout_s` is a budget per config. Each step of a request (verifying config i, one
timed block of config i: the child announces each with ("start", i)) may take `timeout_s`, and
a request for n configs may take `n * timeout_s` in all. The config of the step that overran is
the one recorded as `timeout`.

Configs that had not finished when their child failed are sent again, on the fresh child; they
are not retries (they did nothing wrong). Results of configs that failed this way carry the
environment the child reported at startup. Whatever else the child raises is a bug: the child
is replaced and the error raised; a TilepilotError (e.g. bf16 under the interpreter:
BackendUnavailable) is raised as it is, and the child kept.

Quarantine: a worker counts its infrastructure failures in a row: a child that dies with no
error of its own, a fresh child that fails to start, a child found dead between requests. Any
clean answer from a child ends the run. When a config has killed two children, a fresh child is
asked for a small computation on the device ("health") before the config is called `poison`:
if that answers, the config was at fault and the run ends; if it dies too, the device is. After
QUARANTINE_AFTER failures in a row the worker is quarantined: its child is killed, the request
that was running raises WorkerQuarantined (its configs get no results; the caller sends them
elsewhere) and so does every later one. The actor stays alive, holding its GPU, so that Ray
places nothing else on a failing device. A failing device thus costs three child starts, and a
poison config never quarantines a healthy one.

What the children cost beyond their results: each request's note (child.py) counts the Triton
compiles a child made (cache misses; the compile pool should have made them all, so a GPU child
compiles nothing) and the GPU timer's warm-ups after idling. `run_batch` returns the batch's
counts and when its child request started and ended (epoch seconds); `info` the totals.

The actor is threaded (`max_concurrency`), so that `info` and `sample` answer while a batch
runs. A caller may send the next batch before the last one returns: it waits for its turn in the
actor, and the child starts it as soon as the last one ends, with no round trip in between.
Requests to the child take turns in the order they arrived (a ticket lock): callers that share
the worker (several campaigns on one cluster, each reaching it by name) are served in
turn, and no two requests ever run on the device at once. `run_batch` reports how long a batch
waited for its turn. Create the actor with an explicit `num_cpus` (a GPU actor otherwise holds
a CPU for its whole life: LIBRARIES.md).

Shared by campaigns on one cluster (`idle_exit_s` given; shared.py): the actor is detached and
ends by itself once no request has come for `idle_exit_s` seconds, its child stopped first; a
request that comes as it ends never runs, and its caller sees the worker lost. `retire` ends it
now (`tilepilot workers stop`). A campaign's own worker (`idle_exit_s` None) is killed by its
campaign.

Fault injection (tests only): TILEPILOT_FAULT_WORKERS, a comma-separated list of worker ids,
makes the children of those workers die on every request (child.py, fault "die").
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import ray

from tilepilot.experiments import (
    Config,
    DeviceCeilings,
    Environment,
    GpuSample,
    InputError,
    Problem,
    Result,
    Status,
    TilepilotError,
    Timing,
)
from tilepilot.kernels.base import Target
from tilepilot.kernels.evaluate import Check
from tilepilot.orchestrator.child import (
    Child,
    ChildStartupError,
    Died,
    Done,
    Failed,
    Reply,
    Sticky,
    TimedOut,
    describe_exit,
)
from tilepilot.orchestrator.shared import IdleExit

log = logging.getLogger(__name__)

BACKENDS = ("gpu", "interpret")
GPU_WORKER_CPUS = 1  # num_cpus of each GPU actor; the compile pool gets the node's other CPUs
STARTUP_TIMEOUT_S = 300.0
MAX_CONCURRENCY = 16  # requests waiting for their turn (one per sharing campaign), info() and sample()
RECOVERIES_KEPT = 1000
QUARANTINE_AFTER = 3  # infrastructure failures in a row (see the module docstring)
FAULT_WORKERS_ENV = "TILEPILOT_FAULT_WORKERS"


class WorkerQuarantined(TilepilotError):
    """The worker failed QUARANTINE_AFTER times in a row through no fault of a config: it takes no more work."""

    def __init__(self, worker_id: str, reason: str) -> None:
        super().__init__(f"worker {worker_id} is quarantined: {reason}")
        self.worker_id = worker_id
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.worker_id, self.reason)


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    node: str  # host name
    backend: str  # gpu | interpret
    gpu_uuid: str | None  # "GPU-...", None under the interpreter
    environment: Environment
    target: Target | None  # what the compile pool compiles for; None under the interpreter
    child_pid: int | None
    running: str = ""  # kernel, problem and config the child runs now; "" when idle
    respawns: int = 0  # children replaced after a crash, a death or a timeout
    recover_s: tuple[float, ...] = ()  # seconds from each failure to the fresh child being ready
    node_id: str = ""  # the Ray node the actor runs on
    quarantined: str = ""  # why the worker takes no more work; "" while it does
    failures: tuple[str, ...] = ()  # its infrastructure failures in a row so far
    compiles: int | None = None  # Triton compiles its children made (None: this Triton cannot tell)
    wakes: int = 0  # GPU timer warm-ups after an idle spell


@dataclass(frozen=True)
class BatchReply:
    """What `run_batch` returns: the batch's results and how long it waited for its turn."""

    results: list[Result]
    waited_s: float
    worker_id: str
    started_at: float = 0.0  # epoch seconds: the batch's turn began (its child request went out)
    ended_at: float = 0.0  # epoch seconds: the child answered its last request
    compiles: int | None = None  # Triton compiles the child made for it (None: this Triton cannot tell)
    wakes: int = 0  # GPU timer warm-ups after an idle spell before it


class _Turns:
    """A ticket lock: holders enter in the order they asked."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0
        self._serving = 0

    def take(self) -> int:
        """A ticket now, to wait on later with `turn(ticket)`."""
        with self._cond:
            self._next += 1
            return self._next - 1

    @contextmanager
    def turn(self, ticket: int | None = None) -> Iterator[float]:
        """Wait for this caller's turn (a ticket taken now, or the one given); yields the seconds it waited."""
        t0 = time.monotonic()
        with self._cond:
            if ticket is None:
                ticket = self._next
                self._next += 1
            while self._serving != ticket:
                self._cond.wait()
        try:
            yield time.monotonic() - t0
        finally:
            with self._cond:
                self._serving += 1
                self._cond.notify_all()


@ray.remote(max_concurrency=MAX_CONCURRENCY)
class EvalWorker:
    def __init__(self, backend: str, *, worker_id: str | None = None, input_sets: int = 3, seed: int = 0,
                 rounds: int = 3, block_ms: float = 1.0, spread_target: float = 0.02, time_cap_ms: float = 15.0,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S, idle_exit_s: float | None = None) -> None:
        if backend not in BACKENDS:
            raise InputError(f"unknown worker backend {backend!r} (allowed: {', '.join(BACKENDS)})")
        self._backend = backend
        self._options = {"input_sets": input_sets, "seed": seed, "rounds": rounds, "block_ms": block_ms,
                         "spread_target": spread_target, "time_cap_ms": time_cap_ms}
        self._startup_timeout_s = startup_timeout_s
        self._turns = _Turns()
        self._order = threading.Condition()  # run_batch requests numbered by their one caller (see `_in_order`)
        self._next_seq = 0
        self._node = socket.gethostname()
        self._node_id = ray.get_runtime_context().get_node_id()
        self._running = ""  # what the child runs now, for sample()
        self._respawns = 0
        self._recover_s: list[float] = []
        self._streak: list[str] = []  # infrastructure failures in a row
        self._quarantined = ""
        self._compiles: int | None = 0  # totals of the children's notes; None once one could not tell
        self._wakes = 0
        injected = {w.strip() for w in os.environ.get(FAULT_WORKERS_ENV, "").split(",")}
        self._fault = "die" if worker_id is not None and worker_id in injected else None
        self._worker_id = worker_id or ""
        self._child, started = self._spawn()
        self._env: Environment = started["environment"]
        self._target: Target | None = started["target"]
        self._uuid: str | None = started["gpu_uuid"]
        self._worker_id = worker_id or self._default_id()
        self._life = IdleExit(idle_exit_s, lambda: self._child.stop(), f"worker {self._worker_id}")
        self._life.start()

    # ---- the actor's methods ------------------------------------------------------------------
    def info(self) -> WorkerInfo:
        with self._life.request():
            return WorkerInfo(self._worker_id, self._node, self._backend, self._uuid, self._env, self._target,
                              self._child.pid, self._running, self._respawns, tuple(self._recover_s),
                              self._node_id, self._quarantined, tuple(self._streak), self._compiles, self._wakes)

    def retire(self) -> None:
        """End this worker now (its child stopped first unless a request runs); never returns:
        the caller sees the actor gone."""
        self._life.end_now("asked to retire")

    def evaluate(self, kernel: str, problem: Problem, configs: Sequence[Config], timeout_s: float) -> list[Result]:
        """One Result per config, in order; `timeout_s` per config (see the module docstring)."""
        with self._life.request(), self._turn():
            return self._batch("evaluate", kernel, problem, list(configs), (), timeout_s)

    def run_batch(self, kernel: str, problem: Problem, configs: Sequence[Config], timeout_s: float,
                  seq: int | None = None) -> BatchReply:
        """`evaluate`, with the seconds the batch waited for its turn (other callers' requests).
        `seq`: the batch's number from the actor's one caller (0, 1, ...), which holds it a batch
        ahead: batches run in that order, whichever of the actor's threads got to its request first."""
        with self._life.request(), self._turn(self._in_order(seq)) as waited_s:
            compiles, wakes = self._compiles, self._wakes
            started = time.time()
            results = self._batch("evaluate", kernel, problem, list(configs), (), timeout_s)
            ended = time.time()
            made = None if compiles is None or self._compiles is None else self._compiles - compiles
        return BatchReply(results, waited_s, self._worker_id, started, ended, made, self._wakes - wakes)

    def remeasure(self, kernel: str, problem: Problem, configs: Sequence[Config], rounds: int,
                  timeout_s: float) -> list[Result]:
        """Time the configs again, interleaved, `rounds` rounds; `timeout_s` per config."""
        with self._life.request(), self._turn():
            return self._batch("remeasure", kernel, problem, list(configs), (rounds,), timeout_s)

    def recheck(self, kernel: str, problem: Problem, config: Config, timeout_s: float) -> Check:
        """Verify one config on fresh inputs. A crash, death or timeout is a failed Check."""
        with self._life.request(), self._turn():
            outcome = self._single(("recheck", kernel, problem, config), timeout_s,
                                   _describe(kernel, problem, [config]))
        if isinstance(outcome, Done):
            return outcome.payload  # type: ignore[no-any-return]
        status, message = outcome
        return Check(False, math.nan, f"{status}: {message}")

    def baseline(self, kernel: str, problem: Problem, timeout_s: float) -> Timing | None:
        """The vendor library's timing (None under the interpreter, or when it fails: logged)."""
        with self._life.request(), self._turn():
            outcome = self._single(("baseline", kernel, problem), timeout_s,
                                   lambda i: f"{kernel} {problem.label()} vendor baseline")
        if isinstance(outcome, Done):
            return outcome.payload  # type: ignore[no-any-return]
        log.warning("worker %s: the baseline of %s %s failed (%s: %s)", self._worker_id, kernel,
                    problem.label(), *outcome)
        return None

    def ceilings(self, timeout_s: float) -> DeviceCeilings | None:
        """This GPU's copy bandwidth and matmul rate, measured now (None under the interpreter, or
        when the measurement fails: logged)."""
        with self._life.request(), self._turn():
            outcome = self._single(("ceilings",), timeout_s, lambda i: "device ceilings")
        if isinstance(outcome, Done):
            return outcome.payload  # type: ignore[no-any-return]
        log.warning("worker %s: measuring the device ceilings failed (%s: %s)", self._worker_id, *outcome)
        return None

    def sample(self) -> GpuSample | None:
        """An NVML reading of this worker's GPU, tagged with what it runs now; None without one."""
        with self._life.request():
            if self._uuid is None:
                return None
            from tilepilot.kernels import telemetry

            if not telemetry.nvml_available():
                return None
            return telemetry.sample_gpu(self._uuid, self._node, self._worker_id, self._running)

    # ---- turns and quarantine -----------------------------------------------------------------
    def _in_order(self, seq: int | None) -> int | None:
        """The turn ticket of request number `seq`, taken after request seq - 1 took its own (None:
        the request is not numbered and takes its ticket on arrival)."""
        if seq is None:
            return None
        with self._order:
            while self._next_seq != seq:
                self._order.wait()
            ticket = self._turns.take()
            self._next_seq += 1
            self._order.notify_all()
        return ticket

    @contextmanager
    def _turn(self, ticket: int | None = None) -> Iterator[float]:
        """This request's turn on the child (in arrival order, or the ticket's); refused once the
        worker is quarantined."""
        with self._turns.turn(ticket) as waited_s:
            if self._quarantined:
                raise WorkerQuarantined(self._worker_id, self._quarantined)
            yield waited_s

    def _strike(self, what: str) -> None:
        """Count one infrastructure failure; the QUARANTINE_AFTER-th in a row quarantines the worker."""
        self._streak.append(what)
        log.warning("worker %s: %s (%d in a row)", self._worker_id, what, len(self._streak))
        if len(self._streak) < QUARANTINE_AFTER:
            return
        self._quarantined = f"{len(self._streak)} infrastructure failures in a row: " + "; ".join(self._streak)
        self._child.kill()
        log.error("worker %s quarantined: %s", self._worker_id, self._quarantined)
        raise WorkerQuarantined(self._worker_id, self._quarantined)

    def _health_check(self, timeout_s: float) -> None:
        """A small computation on the device in a fresh child: an answer ends the run of failures."""
        self._ask(("health",), timeout_s, 1, lambda i: "a health check")

    # ---- batches through child failures -------------------------------------------------------
    def _batch(self, op: str, kernel: str, problem: Problem, configs: list[Config], extra: tuple[Any, ...],
               timeout_s: float) -> list[Result]:
        _check_timeout(timeout_s)
        results: dict[int, Result] = {}
        deaths: dict[int, list[int | None]] = {}
        todo = list(range(len(configs)))
        while todo:
            # a config whose child died runs again alone, on the fresh child
            group = todo[:1] if todo[0] in deaths else todo
            chosen = [configs[j] for j in group]
            reply = self._ask((op, kernel, problem, chosen, *extra), timeout_s, len(group),
                              _describe(kernel, problem, chosen))
            if isinstance(reply, Done):
                for j, result in zip(group, reply.payload, strict=True):
                    results[j] = _after_retry(result, deaths.get(j))
                todo = [j for j in todo if j not in group]
                continue
            culprit = group[_index(reply)]
            failure = self._judge(reply, timeout_s, deaths.setdefault(culprit, []))
            todo.remove(culprit)
            if failure is None:
                todo.insert(0, culprit)
            else:
                results[culprit] = Result(problem, configs[culprit], failure[0], self._env, message=failure[1])
        return [results[j] for j in range(len(configs))]

    def _single(self, message: tuple[Any, ...], timeout_s: float,
                describe: Callable[[int], str]) -> Done | tuple[Status, str]:
        """A one-config request, retried once if the child dies under it."""
        _check_timeout(timeout_s)
        deaths: list[int | None] = []
        while True:
            reply = self._ask(message, timeout_s, 1, describe)
            if isinstance(reply, Done):
                return reply
            failure = self._judge(reply, timeout_s, deaths)
            if failure is not None:
                return failure

    def _judge(self, reply: Reply, timeout_s: float, deaths: list[int | None]) -> tuple[Status, str] | None:
        """`_failure`, except that a config is called poison only once a fresh child has shown the
        device healthy (else the health check's death counts against the worker, not the config)."""
        failure = _failure(reply, timeout_s, deaths)
        if failure is not None and failure[0] is Status.POISON:
            self._health_check(timeout_s)  # its death is a strike: the third in a row quarantines the worker
        return failure

    def _ask(self, message: tuple[Any, ...], timeout_s: float, n: int, describe: Callable[[int], str]) -> Reply:
        """One request to the child; replaces the child after anything but a clean answer."""
        def started(i: int) -> None:
            self._running = describe(i)

        if not self._child.alive():  # died while idle: no config's fault
            self._strike(f"child {self._child.pid} was found dead between requests")
            self._replace("died between requests")
        try:
            reply = self._child.request(message, step_s=timeout_s, total_s=timeout_s * n, on_start=started)
        finally:
            self._running = ""
        self._count(self._child.note)
        if isinstance(reply, Done):
            self._streak.clear()
        if isinstance(reply, Failed):
            if not isinstance(reply.error, TilepilotError):
                self._replace(f"raised {reply.error}")
            raise reply.error
        if isinstance(reply, Died):
            running = describe(reply.index) if reply.index is not None else f"the {message[0]} request"
            self._strike(f"child {self._child.pid} died ({describe_exit(reply.exitcode)}) running {running}")
        if not isinstance(reply, Done):
            self._replace(_what_happened(reply))
        return reply

    def _count(self, note: dict[str, Any]) -> None:
        """Add a child's note (child.py) to the totals; a request with no note (its child failed)
        adds nothing."""
        if not note:
            return
        compiles = note.get("compiles")
        self._compiles = None if compiles is None or self._compiles is None else self._compiles + compiles
        self._wakes += int(note.get("wakes") or 0)

    # ---- children -----------------------------------------------------------------------------
    def _spawn(self) -> tuple[Child, dict[str, Any]]:
        child = Child(self._backend, self._options, fault=self._fault)
        return child, child.start(self._startup_timeout_s)

    def _replace(self, what: str) -> None:
        t0 = time.monotonic()
        old = self._child.pid
        self._child.kill()
        while True:
            try:
                fresh, started = self._spawn()
                break
            except ChildStartupError as e:
                self._strike(f"a fresh child failed to start ({e})")
        self._child = fresh
        if started["environment"] != self._env:
            raise ChildStartupError(f"a fresh child reports {started['environment']}, not {self._env}")
        recover = time.monotonic() - t0
        self._respawns += 1
        self._recover_s = [*self._recover_s[-(RECOVERIES_KEPT - 1):], recover]
        log.warning("worker %s: child %s %s; child %s took over in %.1f s", self._worker_id, old, what,
                    self._child.pid, recover)

    def _default_id(self) -> str:
        if self._uuid:
            return f"{self._node}:{self._uuid[:12]}"
        return f"{self._node}:cpu-{ray.get_runtime_context().get_actor_id()[:8]}"


# ---- module helpers ------------------------------------------------------------------------------
def _failure(reply: Reply, timeout_s: float, deaths: list[int | None]) -> tuple[Status, str] | None:
    """The status and message a failed reply gives its config; None: run it once more.

    `deaths` holds the exit codes of the children that died under this config, and grows.
    """
    if isinstance(reply, Sticky):
        return Status.CRASHED, reply.message
    if isinstance(reply, TimedOut):
        return Status.TIMEOUT, (f"no answer within {timeout_s:g} s; the child process was killed "
                                "and replaced")
    assert isinstance(reply, Died), reply
    deaths.append(reply.exitcode)
    if len(deaths) < 2:
        return None
    codes = ", then ".join(describe_exit(c) for c in deaths)
    return Status.POISON, f"the child process died twice running this config ({codes}); not run again"


def _after_retry(result: Result, deaths: list[int | None] | None) -> Result:
    """A result from a retry says so in `extra`."""
    if not deaths:
        return result
    note = f"first run: the child process died ({describe_exit(deaths[0])}); this result is from the retry"
    return dataclasses.replace(result, extra={**result.extra, "retried": note})


def _index(reply: Reply) -> int:
    index = reply.index if isinstance(reply, (Sticky, Died, TimedOut)) else None
    return index if index is not None else 0  # nothing had started: the first config


def _what_happened(reply: Reply) -> str:
    if isinstance(reply, Sticky):
        return f"hit a sticky CUDA error ({reply.message})"
    if isinstance(reply, TimedOut):
        return f"was killed after {reply.waited_s:.1f} s without an answer"
    assert isinstance(reply, Died), reply
    return f"died ({describe_exit(reply.exitcode)})"


def _describe(kernel: str, problem: Problem, configs: Sequence[Config]) -> Callable[[int], str]:
    return lambda i: f"{kernel} {problem.label()} {configs[i].label()}"


def _check_timeout(timeout_s: float) -> None:
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, not {timeout_s!r}")
