"""The compile-ahead pool: CPU processes that fill each node's Triton cache before a GPU needs it.

`CompileWorker` is a Ray actor with one CPU and no visible GPU (Ray no longer blanks
CUDA_VISIBLE_DEVICES for actors that ask for none: LIBRARIES.md). Like `EvalWorker`, it
supervises one persistent child process (child.py, role "compile") that imports triton once
and compiles with `compile_config`. A compile can hang (USERS.md): after `timeout_s` the child
is killed and replaced, and the compile is `compile_error` "compile timed out". A child that
dies under a compile is replaced and the compile tried once more; a second death is a
`compile_error` too. So the ObjectRef that `compile` returns always holds a CompileOutcome.

`CompilePool` starts the actors on every node that has GPUs (every node, on a cluster without
GPUs), as many per node as the node has CPUs left after its GPU workers' `num_cpus`, and sends
each compile to every such node, since each node's GPU workers read their own local cache.
It never sends the same compile twice at once (racing first compiles of one cache key can
yield a wrong kernel: LIBRARIES.md). On each node a `CompileQueue` hands the compiles to the
compile workers as they come free (pull), roughly in the order they were sent (Ray does not
promise an async actor's order): none is assigned ahead to a worker busy with a slow compile
while another worker is idle.

Shared (campaigns on one cluster, see ray_executor.py): the compile workers are named actors
that every campaign's pool finds, and a compile goes to the worker its cache key hashes to, so
two campaigns never compile one key at once either (a compile worker does one at a time), and
no queue stands between (a key's worker is not free to choose). Shared compile workers are
detached and end by themselves when idle, as shared GPU workers do (shared.py): a pool whose
worker ended that way loses a compile to it at most, and `heal()` starts a fresh one.
`heal()`, after a compile was lost with its worker or node, drops the workers of nodes that are
gone and replaces those that died on live ones.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import itertools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tilepilot.experiments import Config, Problem, Status, TilepilotError
from tilepilot.kernels.base import Target
from tilepilot.kernels.evaluate import CompileOutcome
from tilepilot.kernels.registry import get_family
from tilepilot.orchestrator.child import Child, ChildError, Died, Done, Failed, TimedOut, describe_exit
from tilepilot.orchestrator.executor import NoWorkerLeft
from tilepilot.orchestrator.ray_runtime import LOST
from tilepilot.orchestrator.shared import IdleExit, shared_idle_s, shared_options
from tilepilot.orchestrator.worker import GPU_WORKER_CPUS, STARTUP_TIMEOUT_S

log = logging.getLogger(__name__)

COMPILE_TIMEOUT_S = 120.0
ARRIVAL_S = 0.002  # CompileQueue: how long a compile waits for those sent with it to arrive
PROBE_S = 10.0  # heal(): a compile worker that does not answer this soon is busy, not dead
RENAME_WAIT_S = 0.5  # heal(), shared: a lost worker's name may stay bound to it for a moment
COMPILE_ENV = {"CUDA_VISIBLE_DEVICES": ""}


@dataclass(frozen=True)
class CompilerInfo:
    node: str  # Ray node id
    child_pid: int | None
    respawns: int  # children replaced after a hang or a death
    compiles: int | None = None  # Triton compiles its children made (cache misses; None: cannot tell)


@ray.remote(num_cpus=1, runtime_env={"env_vars": COMPILE_ENV})
class CompileWorker:
    def __init__(self, *, timeout_s: float = COMPILE_TIMEOUT_S, startup_timeout_s: float = STARTUP_TIMEOUT_S,
                 idle_exit_s: float | None = None) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s!r}")
        self._timeout_s = timeout_s
        self._startup_timeout_s = startup_timeout_s
        self._respawns = 0
        self._compiles: int | None = 0
        self._child = Child("compile")
        self._child.start(startup_timeout_s)
        self._life = IdleExit(idle_exit_s, lambda: self._child.stop(), "compile worker")
        self._life.start()

    def info(self) -> CompilerInfo:
        with self._life.request():
            return CompilerInfo(ray.get_runtime_context().get_node_id(), self._child.pid, self._respawns,
                                self._compiles)

    def retire(self) -> None:
        """End this worker now, its child stopped first (shared.py); never returns."""
        self._life.end_now("asked to retire")

    def compile(self, kernel: str, problem: Problem, config: Config, target: Target) -> CompileOutcome:
        """Compile into this node's Triton cache. Hangs and deaths come back as compile_error."""
        with self._life.request():
            return self._compile(kernel, problem, config, target)

    def _compile(self, kernel: str, problem: Problem, config: Config, target: Target) -> CompileOutcome:
        deaths: list[int | None] = []
        while True:
            reply = self._child.request(("compile", kernel, problem, config, target),
                                        step_s=self._timeout_s, total_s=self._timeout_s)
            made = self._child.note.get("compiles", 0)
            self._compiles = None if made is None or self._compiles is None else self._compiles + made
            if isinstance(reply, Done):
                return reply.payload  # type: ignore[no-any-return]
            if isinstance(reply, Failed) and isinstance(reply.error, TilepilotError):
                raise reply.error  # e.g. BackendUnavailable: this Triton cannot compile for the target
            self._replace(reply)
            if isinstance(reply, TimedOut):
                return CompileOutcome(Status.COMPILE_ERROR, f"compile timed out after {self._timeout_s:g} s "
                                      "(the compiler process was killed)", reply.waited_s * 1e3, None)
            if not isinstance(reply, Died):
                raise reply.error if isinstance(reply, Failed) else ChildError(f"unexpected reply {reply}")
            deaths.append(reply.exitcode)
            if len(deaths) == 2:
                codes = ", then ".join(describe_exit(c) for c in deaths)
                return CompileOutcome(Status.COMPILE_ERROR,
                                      f"the compiler process died twice compiling this config ({codes})", 0.0, None)

    def _replace(self, reply: Any) -> None:
        old = self._child.pid
        self._child.kill()
        self._child = Child("compile")
        self._child.start(self._startup_timeout_s)
        self._respawns += 1
        log.warning("compiler child %s replaced by %s after %s", old, self._child.pid, reply)


@ray.remote(num_cpus=0)
class CompileQueue:
    """One node's compile workers, handed out as they come free: a compile waits for a free worker
    (an async actor, so waiting takes no thread), the lowest `seq` first (Ray may start an async
    actor's calls out of order; the pool numbers them as it sends them), and gets the worker freed
    last (its process is warm: a cold one takes longer even to read the cache).

    A worker lost under a compile does not come back (its compile raises the loss): `swap` puts
    its replacement in."""

    def __init__(self, workers: list[Any]) -> None:
        self._idle = list(reversed(workers))  # a stack: the last one is handed out first
        self._waiting: list[tuple[int, asyncio.Future[Any]]] = []  # a heap by seq

    async def compile(self, seq: int, kernel: str, problem: Problem, config: Config,
                      target: Target) -> CompileOutcome:
        turn: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (seq, turn))
        await asyncio.sleep(ARRIVAL_S)  # compiles sent together arrive together: all take their place first
        self._hand_out()
        worker = await turn
        try:
            outcome: CompileOutcome = await worker.compile.remote(kernel, problem, config, target)
        except LOST:
            raise
        except BaseException:
            self._free(worker)
            raise
        self._free(worker)
        return outcome

    async def idle(self) -> int:
        """Workers free now (and an answer: the queue is alive)."""
        return len(self._idle)

    async def swap(self, old: Any, new: Any) -> None:
        """`new` replaces `old` (lost): `old` leaves the idle ones if it is there, `new` joins them."""
        self._idle = [new, *(w for w in self._idle if w != old)]
        self._hand_out()

    def _free(self, worker: Any) -> None:
        self._idle.append(worker)
        self._hand_out()

    def _hand_out(self) -> None:
        while self._idle and self._waiting:
            _, turn = heapq.heappop(self._waiting)
            turn.set_result(self._idle.pop())


@ray.remote(num_cpus=0)
def _first_of(*outcomes: CompileOutcome) -> CompileOutcome:
    """Ready once every node has compiled; the outcome is the same on each."""
    return outcomes[0]


class CompilePool:
    """The driver's handle on the compile workers. Not thread-safe: one driver thread uses it.

    `per_node`: compile workers per node (default: the node's CPUs minus `gpu_worker_cpus`
    for each of its GPUs; at least one, which then takes no CPU of its own). `env`: extra
    environment of the compile processes (e.g. TRITON_CACHE_DIR, which must be the one the GPU
    workers read; CUDA_VISIBLE_DEVICES stays empty).
    """

    def __init__(self, *, per_node: int | None = None, timeout_s: float = COMPILE_TIMEOUT_S,
                 gpu_worker_cpus: float = GPU_WORKER_CPUS, env: Mapping[str, str] | None = None,
                 shared: bool = False) -> None:
        runtime_env = {"env_vars": {**(env or {}), **COMPILE_ENV}}
        self.shared = shared
        self._idle_exit_s = shared_idle_s() if shared else None
        self._timeout_s = timeout_s
        self._node_options: dict[str, dict[str, Any]] = {}
        self.workers: dict[str, list[Any]] = {}
        for node_id, cpus, gpus in _compile_nodes():
            n = per_node if per_node is not None else int(cpus - gpus * gpu_worker_cpus)
            options: dict[str, Any] = {"runtime_env": runtime_env,
                                       "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
            if n < 1:
                log.warning("node %s has no CPU left for compiling; one compile worker shares its CPUs", node_id)
                n, options["num_cpus"] = 1, 0
            self._node_options[node_id] = options
            self.workers[node_id] = [self._start(node_id, i) for i in range(n)]
        self._queues: dict[str, Any] = {} if shared else {n: self._start_queue(n) for n in self.workers}
        self._load: dict[Any, int] = {w: 0 for ws in self.workers.values() for w in ws}
        self._inflight: dict[Any, Any] = {}  # actor ref -> its worker (None: through the node's queue)
        self._by_key: dict[tuple[str, ...], tuple[Any, list[Any]]] = {}  # key -> (returned ref, actor refs)
        self._seq = itertools.count()  # the order compiles are sent in, for the queues

    @property
    def size(self) -> int:
        return len(self._load)

    @property
    def capacity(self) -> int:
        """Compiles the pool runs at once: every compile goes to each node, so the node with the
        fewest compile workers sets it (0 with none left)."""
        return min((len(ws) for ws in self.workers.values()), default=0)

    def submit(self, kernel: str, problem: Problem, config: Config, target: Target) -> Any:
        """Compile on every node of the pool; an ObjectRef to the CompileOutcome, ready when all have.

        A compile already in flight with the same cache key (kernel, specialisation, config,
        target) is not sent again: its ref is returned.
        """
        self._prune()
        key = (kernel, get_family(kernel).specialisation(problem, config), config.key(), repr(target))
        if key in self._by_key:
            return self._by_key[key][0]
        refs = []
        for node_id, workers in self.workers.items():
            queue = self._queues.get(node_id)
            worker = None if queue is not None else self._pick(workers, key)
            ref = (queue.compile.remote(next(self._seq), kernel, problem, config, target) if queue is not None
                   else worker.compile.remote(kernel, problem, config, target))
            if worker is not None:
                self._load[worker] += 1
            self._inflight[ref] = worker
            refs.append(ref)
        ref = refs[0] if len(refs) == 1 else _first_of.remote(*refs)
        self._by_key[key] = (ref, refs)
        return ref

    def heal(self) -> None:
        """Drop the workers of nodes that are gone; replace those that died on live nodes.

        Raises NoWorkerLeft when no node is left to compile on."""
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        for node_id in list(self.workers):
            if node_id not in alive:
                log.warning("node %s is gone: its %d compile worker(s) are dropped", node_id,
                            len(self.workers[node_id]))
                for worker in self.workers.pop(node_id):
                    self._forget(worker)
                self._queues.pop(node_id, None)
                continue
        probes = {w.info.remote(): (node_id, i) for node_id, ws in self.workers.items() for i, w in enumerate(ws)}
        done, _ = ray.wait(list(probes), num_returns=len(probes), timeout=PROBE_S) if probes else ([], [])
        for ref in done:  # one that does not answer in time is busy compiling, not dead
            node_id, i = probes[ref]
            try:
                ray.get(ref)
                continue
            except LOST:
                pass
            old = self.workers[node_id][i]
            self._forget(old)
            self.workers[node_id][i] = fresh = self._start(node_id, i, lost=old)
            self._load[fresh] = 0
            if node_id in self._queues:
                self._queues[node_id].swap.remote(old, fresh)
            log.warning("compile worker %d of node %s was lost; a new one replaces it", i, node_id)
        self._heal_queues()
        if not self._load:
            raise NoWorkerLeft("no compile worker left: every node the compile pool used is gone")

    def _heal_queues(self) -> None:
        """A node's queue lost while its node lives (killed): a new one with the node's workers."""
        asked = {q.idle.remote(): n for n, q in self._queues.items()}
        done, _ = ray.wait(list(asked), num_returns=len(asked), timeout=PROBE_S) if asked else ([], [])
        for ref in done:
            try:
                ray.get(ref)
            except LOST:
                node_id = asked[ref]
                self._queues[node_id] = self._start_queue(node_id)
                log.warning("the compile queue of node %s was lost; a new one replaces it", node_id)

    def close(self) -> None:
        if not self.shared:  # shared workers live on for the other campaigns, and end when idle (shared.py)
            for actor in [*self._load, *self._queues.values()]:
                ray.kill(actor)
        self._queues.clear()
        self._load.clear()
        self._inflight.clear()
        self._by_key.clear()

    def _start(self, node_id: str, index: int, *, lost: Any = None) -> Any:
        """Compile worker `index` of the node: a new actor, or (shared) the one of that name, asked
        again while the name still names `lost` (Ray frees a dead actor's name a moment later)."""
        options = dict(self._node_options[node_id])
        if not self.shared:
            return CompileWorker.options(**options).remote(timeout_s=self._timeout_s)
        options |= shared_options(f"tilepilot-compile-{node_id[:16]}-{index}")
        deadline = time.monotonic() + RENAME_WAIT_S * 10
        while True:
            worker = CompileWorker.options(**options).remote(timeout_s=self._timeout_s,
                                                             idle_exit_s=self._idle_exit_s)
            if lost is None or worker != lost or time.monotonic() > deadline:
                return worker
            time.sleep(RENAME_WAIT_S)

    def _start_queue(self, node_id: str) -> Any:
        strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
        return CompileQueue.options(scheduling_strategy=strategy).remote(self.workers[node_id])

    def _pick(self, workers: list[Any], key: tuple[str, ...]) -> Any:
        """Shared: the worker the cache key hashes to (see the module docstring)."""
        digest = hashlib.sha256(repr(key).encode()).digest()
        return workers[int.from_bytes(digest[:8], "big") % len(workers)]

    def _forget(self, worker: Any) -> None:
        self._load.pop(worker, None)
        self._inflight = {r: w for r, w in self._inflight.items() if w is not worker}

    def _prune(self) -> None:
        """Forget compiles that have finished: their workers are free, their keys may go again."""
        if not self._inflight:
            return
        done, _ = ray.wait(list(self._inflight), num_returns=len(self._inflight), timeout=0, fetch_local=False)
        for ref in done:
            worker = self._inflight.pop(ref)
            if worker is not None and worker in self._load:
                self._load[worker] -= 1
        self._by_key = {k: v for k, v in self._by_key.items() if any(r in self._inflight for r in v[1])}


def _compile_nodes() -> list[tuple[str, float, float]]:
    """(node id, CPUs, GPUs) of the alive nodes with GPUs, or of all alive nodes if none has one."""
    nodes = [(n["NodeID"], float(n["Resources"].get("CPU", 0)), float(n["Resources"].get("GPU", 0)))
             for n in ray.nodes() if n["Alive"]]
    with_gpus = [n for n in nodes if n[2] > 0]
    return with_gpus or [n for n in nodes if n[1] > 0]
