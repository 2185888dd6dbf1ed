"""`RayExecutor`: batches on Ray workers, one per GPU (or CPU slots for the interpreter).

For the gpu backend every config is compiled ahead in the CPU compile pool while the GPUs
are busy with earlier batches; a batch goes to a GPU worker once all of its configs have
compiled (configs that fail to compile come back as results without touching a GPU).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
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
    Timing,
)
from tilepilot.kernels.base import KernelFamily
from tilepilot.orchestrator.compile_pool import CompilePool
from tilepilot.orchestrator.executor import Batch, Executor, Verdict
from tilepilot.orchestrator.ray_runtime import fetch
from tilepilot.orchestrator.worker import GPU_WORKER_CPUS, EvalWorker

log = logging.getLogger(__name__)

CONFIG_TIMEOUT_S = {"gpu": 60.0, "interpret": 300.0}


@dataclass
class _Pending:
    batch: Batch
    compiles: dict[Any, int] = field(default_factory=dict)  # compile ref -> config index
    failed: dict[int, Result] = field(default_factory=dict)  # index -> compile failure result


class RayExecutor(Executor):
    def __init__(self, family: KernelFamily, backend: str, *, workers: int | None = None,
                 timeout_s: float | None = None) -> None:
        if backend not in CONFIG_TIMEOUT_S:
            raise InputError(f"backend {backend!r} does not run on Ray workers (allowed: gpu, interpret)")
        self.family = family
        self.backend = backend
        self.timeout_s = timeout_s or CONFIG_TIMEOUT_S[backend]
        self.kernel_version = family.kernel_version()
        self.workers = self._start_workers(workers)
        infos = fetch([w.info.remote() for w in self.workers])
        self.infos = dict(zip(self.workers, infos, strict=True))
        devices = sorted({i.environment.device for i in infos})
        if len(devices) > 1:
            raise InputError(f"workers see different devices ({', '.join(devices)}); "
                             "run one campaign per device model")
        self.environment: Environment = infos[0].environment
        self.target = infos[0].target
        self.pool = CompilePool(gpu_worker_cpus=GPU_WORKER_CPUS) if backend == "gpu" else None
        self.idle: list[Any] = list(self.workers)
        self.compiling: list[_Pending] = []
        self.ready: list[_Pending] = []
        self.running_refs: dict[Any, tuple[Any, _Pending]] = {}  # eval ref -> (worker, pending)
        self.settled: list[tuple[Batch, list[Result]]] = []  # finished without a worker

    def _start_workers(self, count: int | None) -> list[Any]:
        if self.backend == "gpu":
            gpus = int(ray.cluster_resources().get("GPU", 0))
            if gpus == 0:
                raise InputError("backend 'gpu' needs a GPU, and the Ray cluster has none "
                                 "(use --backend replay or interpret)")
            n = min(count or gpus, gpus)
            opts: dict[str, Any] = {"num_gpus": 1, "num_cpus": GPU_WORKER_CPUS}
        else:
            n = count or 1
            opts = {"num_gpus": 0, "num_cpus": 1}
        return [EvalWorker.options(**opts).remote(self.backend, worker_id=f"{self.backend}-{i}")
                for i in range(n)]

    # ---- Executor ------------------------------------------------------------------------
    def free_slots(self) -> int:
        # keep one compiled batch waiting per worker so no GPU waits for the compiler
        return max(0, 2 * len(self.workers) - self.in_flight())

    def in_flight(self) -> int:
        return len(self.compiling) + len(self.ready) + len(self.running_refs) + len(self.settled)

    def submit(self, batch: Batch) -> None:
        pending = _Pending(batch)
        if self.pool is None or self.target is None:
            self.ready.append(pending)
        else:
            for i, config in enumerate(batch.configs):
                ref = self.pool.submit(self.family.name, batch.problem, config, self.target)
                pending.compiles[ref] = i
            self.compiling.append(pending)
        self._start_ready()

    def poll(self, timeout_s: float) -> list[tuple[Batch, list[Result]]]:
        finished, self.settled = self.settled, []
        # one compile ref may serve several batches (the pool compiles each cache key once)
        refs = list(dict.fromkeys([r for p in self.compiling for r in p.compiles] + list(self.running_refs)))
        if not refs:
            return finished
        ray.wait(refs, num_returns=1, timeout=timeout_s)  # the first to finish, then all that have
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in done:
            if ref in self.running_refs:
                worker, pending = self.running_refs.pop(ref)
                self.idle.append(worker)
                wid = self.infos[worker].worker_id
                results = [replace(r, extra={**r.extra, "worker": wid}) for r in fetch(ref)]
                finished.append((pending.batch, self._merge(pending, results)))
            else:
                self._compiled(ref)
        self._start_ready()
        return finished

    def remeasure(self, problem: Problem, configs: Sequence[Config]) -> list[Result]:
        worker = self.workers[0]
        return fetch(worker.remeasure.remote(self.family.name, problem, list(configs), 5, self.timeout_s))

    def recheck(self, problem: Problem, config: Config) -> Verdict | None:
        check = fetch(self.workers[0].recheck.remote(self.family.name, problem, config, self.timeout_s))
        return Verdict(check.passed, check.max_rel_err, check.message)

    def baseline(self, problem: Problem) -> tuple[str, Timing] | None:
        timing = fetch(self.workers[0].baseline.remote(self.family.name, problem, self.timeout_s))
        return (self.family.baseline_name or "baseline", timing) if timing else None

    def ceilings(self) -> dict[str, DeviceCeilings]:
        if self.backend != "gpu":
            return {}
        seen: set[tuple[str, str]] = set()
        out: dict[str, DeviceCeilings] = {}
        for worker, info in self.infos.items():
            env = info.environment
            if (env.device, env.driver) in seen:
                continue
            seen.add((env.device, env.driver))
            measured = fetch(worker.ceilings.remote(self.timeout_s))
            if measured is not None:
                out[info.worker_id] = measured
        return out

    def samples(self) -> list[GpuSample]:
        if self.backend != "gpu":
            return []
        return [s for s in fetch([w.sample.remote() for w in self.workers]) if s is not None]

    def running(self) -> dict[str, str]:
        return {self.infos[w].worker_id: p.batch.problem.label() for w, p in self.running_refs.values()}

    def close(self) -> None:
        for w in self.workers:
            ray.kill(w)
        if self.pool is not None:
            self.pool.close()

    # ---- internals -----------------------------------------------------------------------
    def _compiled(self, ref: Any) -> None:
        outcome = fetch(ref)
        for pending in [p for p in self.compiling if ref in p.compiles]:
            index = pending.compiles.pop(ref)
            if outcome.status is not Status.OK:
                pending.failed[index] = Result(
                    problem=pending.batch.problem, config=pending.batch.configs[index],
                    status=outcome.status, env=self.environment, message=outcome.message,
                    compile_ms=outcome.compile_ms,
                    extra={"shared_bytes": outcome.shared_bytes} if outcome.shared_bytes else {})
            if not pending.compiles:
                self.compiling.remove(pending)
                self.ready.append(pending)

    def _start_ready(self) -> None:
        for pending in [p for p in self.ready if len(p.failed) == len(p.batch.configs)]:
            self.ready.remove(pending)  # nothing compiled: no GPU needed
            self.settled.append((pending.batch, self._merge(pending, [])))
        while self.idle and self.ready:
            pending = self.ready.pop(0)
            configs = [c for i, c in enumerate(pending.batch.configs) if i not in pending.failed]
            worker = self.idle.pop(0)
            ref = worker.evaluate.remote(self.family.name, pending.batch.problem, configs,
                                         self.timeout_s)
            self.running_refs[ref] = (worker, pending)

    @staticmethod
    def _merge(pending: _Pending, results: list[Result]) -> list[Result]:
        """Compile failures and the worker's results, back in the batch's order."""
        it = iter(results)
        return [pending.failed[i] if i in pending.failed else next(it)
                for i in range(len(pending.batch.configs))]
