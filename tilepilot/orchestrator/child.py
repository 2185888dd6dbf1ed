"""The supervised child process: the one process of a worker that imports torch and triton,
holds the CUDA context (role "gpu"), runs the Triton interpreter ("interpret"), or compiles
ahead ("compile").

Both sides of the protocol live here. The parent (`Child`) spawns the process with the
multiprocessing "spawn" context and the role's environment already set, so that it holds
before any kernel module is imported (TRITON_INTERPRET=1 for the interpreter; no visible GPU
for the compiler). Over one Pipe:

- child -> parent at startup: ("ready", info) or ("error", exception, text);
- parent -> child: ("evaluate", kernel, problem, configs), ("remeasure", kernel, problem,
  configs, rounds), ("recheck", kernel, problem, config), ("baseline", kernel, problem),
  ("ceilings",), ("info",), ("compile", kernel, problem, config, target), ("stop",);
- child -> parent while working: ("start", i) each time config i of the request starts a
  step (verification, a timed block), then ("done", payload);
- before ("done", payload), where the role counts them: ("note", counts), what the request
  cost beyond its payload: "compiles", the Triton compiles (on-disk cache misses) it made, and
  in a GPU child the C modules Triton built (kernel launchers), None where this Triton cannot
  tell; "wakes", the GPU timer's warm-ups after an idle spell. The GPU
  child should compile nothing (the compile pool fills the cache ahead): the counts show it;
- a sticky CUDA error: ("sticky", i, message), then the child exits (a poisoned CUDA context
  never recovers);
- any other exception: ("error", exception or None, text), and the child stays up;
- ("health",): a small computation on the child's device (a matmul, synchronised), answered
  ("done", value): a worker asks it after a config killed two children, to tell a poison
  config (the fresh child answers) from a failing device (it dies too).

Fault injection (for tests of the worker's quarantine, never set in a real campaign): a Child
made with `fault="die"` exits with INJECTED_EXIT_CODE on every request but "stop", as the
process of a failing GPU would; the worker sets it for the ids listed in TILEPILOT_FAULT_WORKERS.

Everything sent pickles: Results, Checks, Timings, DeviceCeilings and CompileOutcomes are frozen
dataclasses.
The compile role runs at a lower CPU priority (COMPILE_NICE): on a node whose every CPU compiles,
the GPU children and the campaign driver still get a CPU when they need one.
Warm start: before it answers "ready", a compile child compiles one small matmul into a throwaway
cache (a process's first Triton compile costs about a second more than the next ones: Triton's
NVIDIA backend, LLVM and ptxas loading), and a GPU child starts Triton's CUDA driver (0.27 s on an
H200 with a fresh cache: its C helpers are built) and runs a small random fill and matmuls in fp32,
fp16 and bf16 (the CUDA context, cuRAND and cuBLAS), and computes Triton's own key (a hash of its
compiler library, which the first cache lookup of a compiled kernel needs: 0.4 s of the first
batch's 0.7 s on an H100 host), so that a campaign's first batch pays none of it. The seconds it
took are in the child's info ("warm_up_s").
The child exits by itself when its parent is gone. This module imports neither torch nor
triton at module level: it is the first module the spawned process loads.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from tilepilot.experiments import TilepilotError

log = logging.getLogger(__name__)

ROLES = ("gpu", "interpret", "compile")
# The environment each role starts with (None: unset). Ray sets CUDA_VISIBLE_DEVICES for a
# GPU actor; the child inherits it.
ROLE_ENV: dict[str, dict[str, str | None]] = {
    "gpu": {"TRITON_INTERPRET": None},
    "interpret": {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""},
    "compile": {"TRITON_INTERPRET": None, "CUDA_VISIBLE_DEVICES": ""},
}
STICKY_EXIT_CODE = 1
INJECTED_EXIT_CODE = 5
FAULTS = ("die",)
PARENT_GONE_EXIT_CODE = 4
PARENT_POLL_S = 1.0
KILL_WAIT_S = 30.0
COMPILE_NICE = 5  # added to the compile role's niceness

_spawn_lock = threading.Lock()


class ChildError(RuntimeError):
    """An unexpected exception in the child process (a bug); carries the child's traceback."""


class ChildStartupError(RuntimeError):
    """The child process could not start (a broken installation or a bug)."""


# ---- replies, as the parent sees them ---------------------------------------------------------
@dataclass(frozen=True)
class Done:
    payload: Any


@dataclass(frozen=True)
class Sticky:
    index: int  # the config of the request that left the CUDA context unusable
    message: str


@dataclass(frozen=True)
class Died:
    index: int | None  # the config running when the child died; None before the first start
    exitcode: int | None


@dataclass(frozen=True)
class TimedOut:
    index: int | None  # the config running when the deadline passed; None before the first start
    waited_s: float  # how long the step that was cut short had run


@dataclass(frozen=True)
class Failed:
    error: Exception  # a TilepilotError as raised in the child, else a ChildError


Reply = Done | Sticky | Died | TimedOut | Failed


def describe_exit(code: int | None) -> str:
    """'exit code 3', 'killed by SIGKILL', ... for a multiprocessing exit code."""
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# ---- parent side ------------------------------------------------------------------------------
class Child:
    """One child process seen from its parent. Not thread-safe: the caller serialises requests.

    `options` are keyword arguments of the role's server (for "gpu"/"interpret": the
    Evaluator's input_sets, seed, rounds, block_ms, spread_target, time_cap_ms).
    """

    def __init__(self, role: str, options: Mapping[str, Any] | None = None, *, fault: str | None = None) -> None:
        if role not in ROLES:
            raise ValueError(f"unknown child role {role!r} (allowed: {', '.join(ROLES)})")
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown injected fault {fault!r} (allowed: {', '.join(FAULTS)})")
        self.role = role
        self.options = dict(options or {})
        self.fault = fault
        self.running: int | None = None  # index of the config of the current request running now
        self.note: dict[str, Any] = {}  # the ("note", counts) of the last request, {} without one
        self._proc: Any = None
        self._conn: Connection | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        if self._proc is None or not self._proc.is_alive():
            return False
        # is_alive() calls a child that something else already reaped alive (waitpid: ECHILD),
        # so ask the process table too: gone, or a zombie, is dead
        try:
            os.kill(self._proc.pid, 0)  # type: ignore[arg-type]
            state = Path(f"/proc/{self._proc.pid}/stat").read_text().rsplit(") ", 1)[-1][:1]
        except ProcessLookupError:
            return False
        except OSError:
            return True  # no /proc here: trust is_alive()
        return state != "Z"

    def start(self, timeout_s: float) -> dict[str, Any]:
        """Spawn the child and wait for it to be ready; returns its info dict.

        Raises the child's TilepilotError (e.g. BackendUnavailable), or ChildStartupError.
        """
        ctx = mp.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe()
        with _environment(ROLE_ENV[self.role]):
            self._proc = ctx.Process(target=main, args=(child_conn, self.role, self.options, self.fault),
                                     name=f"tilepilot-{self.role}", daemon=True)
            self._proc.start()
        child_conn.close()
        self._conn = parent_conn
        reply = self._receive_startup(timeout_s)
        if reply[0] == "ready":
            return dict(reply[1])
        self.kill()
        error, text = reply[1], reply[2]
        if isinstance(error, TilepilotError):
            raise error
        raise ChildStartupError(f"the {self.role} child process failed to start: {text}")

    def _receive_startup(self, timeout_s: float) -> tuple[Any, ...]:
        assert self._conn is not None
        try:
            if self._conn.poll(timeout_s):
                return self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(KILL_WAIT_S)
            raise ChildStartupError(f"the {self.role} child process exited while starting "
                                    f"({describe_exit(self._proc.exitcode)})") from None
        self.kill()
        raise ChildStartupError(f"the {self.role} child process was not ready within {timeout_s:g} s")

    def request(self, message: tuple[Any, ...], *, step_s: float, total_s: float,
                on_start: Callable[[int], None] | None = None) -> Reply:
        """Send one request and wait for its reply.

        Deadlines: each step (from the request, or from the last ("start", i), to the next
        message) may take `step_s`, the whole request `total_s`. When one passes, the child
        is killed and TimedOut names the config that was running. A Sticky or Died reply
        also leaves the child dead; after any of the three, call `start` on a new Child.
        """
        assert self._conn is not None, "start() the child first"
        self.running = None
        self.note = {}
        progress = time.monotonic()  # when the current step began
        total_deadline = progress + total_s
        try:
            self._conn.send(message)
        except (BrokenPipeError, OSError):
            return self._died()
        while True:
            now = time.monotonic()
            deadline = min(progress + step_s, total_deadline)
            if now >= deadline:
                self.kill()
                return TimedOut(self.running, now - progress)
            try:
                if not self._conn.poll(deadline - now):
                    continue
                reply = self._conn.recv()
            except (EOFError, OSError):
                return self._died()
            kind = reply[0]
            if kind == "start":
                self.running = int(reply[1])
                progress = time.monotonic()
                if on_start is not None:
                    on_start(self.running)
            elif kind == "note":
                self.note = dict(reply[1])
            elif kind == "done":
                return Done(reply[1])
            elif kind == "sticky":
                self._proc.join(KILL_WAIT_S)
                self.kill()
                return Sticky(int(reply[1]), str(reply[2]))
            elif kind == "error":
                error, text = reply[1], reply[2]
                return Failed(error if isinstance(error, TilepilotError) else ChildError(text))
            else:
                raise ChildError(f"unknown message {kind!r} from the {self.role} child process")

    def _died(self) -> Died:
        self._proc.join(KILL_WAIT_S)
        code = self._proc.exitcode
        self.kill()
        return Died(self.running, code)

    def kill(self) -> None:
        """Kill the process (SIGKILL) and reap it. Safe to call twice."""
        if self._proc is not None and self._proc.exitcode is None:
            self._proc.kill()
            self._proc.join(KILL_WAIT_S)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the child to exit; kill it if it does not within `timeout_s`."""
        if self._conn is not None and self._proc.exitcode is None:
            try:
                self._conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(timeout_s)
        self.kill()


@contextmanager
def _environment(changes: Mapping[str, str | None]) -> Iterator[None]:
    """Set (or unset) variables in os.environ while a child is spawned, then restore them."""
    with _spawn_lock:
        saved = {k: os.environ.get(k) for k in changes}
        try:
            for k, v in changes.items():
                _set_env(k, v)
            yield
        finally:
            for k, v in saved.items():
                _set_env(k, v)


def _set_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


# ---- child side -------------------------------------------------------------------------------
def main(conn: Connection, role: str, options: Mapping[str, Any], fault: str | None = None) -> None:
    """Entry point of the spawned process."""
    _exit_with_parent(os.getppid())
    if role == "compile":
        os.nice(COMPILE_NICE)
    try:
        server = _EvalServer(role, **options) if role in ("gpu", "interpret") else _CompileServer()
        info = server.info()
    except Exception as e:
        conn.send(("error", *_portable(e)))
        return
    conn.send(("ready", info))
    _serve(conn, server, fault)


def _serve(conn: Connection, server: _EvalServer | _CompileServer, fault: str | None = None) -> None:
    from tilepilot.kernels.evaluate import StickyCudaError

    def on_start(i: int) -> None:
        conn.send(("start", i))

    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request[0] == "stop":
            return
        if fault == "die":
            os._exit(INJECTED_EXIT_CODE)
        try:
            payload = server.handle(request[0], request[1:], on_start)
        except StickyCudaError as e:
            conn.send(("sticky", e.index, e.message))
            os._exit(STICKY_EXIT_CODE)
        except Exception as e:
            conn.send(("error", *_portable(e)))
            continue
        try:
            conn.send(("note", server.counts()))
            conn.send(("done", payload))
        except Exception as e:  # a payload that does not pickle is a bug, not a crash of the config
            conn.send(("error", *_portable(e)))


class _CompileCounter:
    """Counts the Triton compiles (on-disk cache misses) of this process through Triton's
    compilation listener (`triton.knobs.compilation.listener`, Triton 3.4 on); `take()` is None
    where this Triton has no listener; always 0 under the interpreter, which compiles nothing.
    In a GPU child it also counts the C modules Triton builds with the C compiler (a kernel's
    launcher, where this Triton builds one per signature: the compile pool builds those ahead,
    compile.build_launchers), by wrapping `triton.runtime.build._build`, the one function that
    runs it."""

    def __init__(self, role: str) -> None:
        self.misses: int | None = 0 if role == "interpret" else None
        if role == "interpret":
            return
        try:
            from triton import knobs

            compilation = knobs.compilation
            compilation.listener  # noqa: B018 - an AttributeError says this Triton has none
        except (ImportError, AttributeError):
            return
        self.misses = 0
        compilation.listener = self._listen
        if role == "gpu":
            self._count_c_builds()

    def _listen(self, *, cache_hit: bool, **_: Any) -> None:
        if not cache_hit and self.misses is not None:
            self.misses += 1

    def _count_c_builds(self) -> None:
        from triton.runtime import build

        run = getattr(build, "_build", None)
        if run is None:
            return

        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.misses is not None:
                self.misses += 1
            return run(*args, **kwargs)

        build._build = counted

    def take(self) -> int | None:
        """The compiles since the last call."""
        n = self.misses
        if n is not None:
            self.misses = 0
        return n


class _EvalServer:
    def __init__(self, backend: str, **options: Any) -> None:
        from tilepilot.kernels.evaluate import Evaluator

        self.evaluator = Evaluator(backend, **options)
        t0 = time.perf_counter()
        if backend == "gpu":
            _warm_up_gpu()
        self.warm_up_s = time.perf_counter() - t0
        self.compiles = _CompileCounter(backend)
        self._wakes = 0

    def counts(self) -> dict[str, int | None]:
        """What the last request cost beyond its payload (see the module docstring)."""
        timer = getattr(self.evaluator, "_timer", None)  # the GPU timer, once made
        wakes = timer.wakes if timer is not None else 0
        new, self._wakes = wakes - self._wakes, wakes
        return {"compiles": self.compiles.take(), "wakes": new}

    def info(self) -> dict[str, Any]:
        ev = self.evaluator
        return {"pid": os.getpid(), "environment": ev.environment(), "target": ev.target(),
                "gpu_uuid": ev.gpu_uuid(), "warm_up_s": round(self.warm_up_s, 3)}

    def handle(self, op: str, args: tuple[Any, ...], on_start: Callable[[int], None]) -> Any:
        ev = self.evaluator
        if op == "evaluate":
            kernel, problem, configs = args
            return ev.evaluate(kernel, problem, configs, on_start=on_start)
        if op == "remeasure":
            kernel, problem, configs, rounds = args
            return ev.remeasure(kernel, problem, configs, rounds=rounds, on_start=on_start)
        if op == "recheck":
            return ev.recheck(*args)
        if op == "baseline":
            return ev.baseline(*args)
        if op == "ceilings":
            return ev.ceilings()
        if op == "health":
            return _health(ev.backend)
        if op == "info":
            return self.info()
        raise ValueError(f"unknown request {op!r} for an evaluating child")


def _warm_up_gpu() -> None:
    """The CUDA context, cuRAND (inputs) and cuBLAS (references in fp32, baselines in fp16 and
    bf16), initialised before the first batch (see the module docstring)."""
    import torch
    from triton.runtime import driver

    driver.active.get_current_device()  # Triton's CUDA driver: its C helpers built (gcc) and loaded
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        pass
    else:  # hashes libtriton (0.4 s on an H100 host): the first lookup of a compiled kernel needs it
        triton_key()
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn((256, 256), generator=gen, device="cuda", dtype=torch.float32)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        y = x.to(dtype)
        y @ y
    torch.cuda.synchronize()


def _warm_up_compiler() -> None:
    """One small matmul compiled for sm_90 into a throwaway cache (see the module docstring). A
    failure is logged and left to the real compiles to report."""
    import tempfile

    from tilepilot.experiments import Config, Problem
    from tilepilot.kernels.base import Target
    from tilepilot.kernels.evaluate import compile_config

    config = Config.of({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8,
                        "num_warps": 4, "num_stages": 2})
    with tempfile.TemporaryDirectory(prefix="tilepilot-warm-up-") as tmp, _environment({"TRITON_CACHE_DIR": tmp}):
        try:
            compile_config("matmul", Problem.of({"M": 64, "N": 64, "K": 64, "dtype": "fp16"}), config, Target(),
                           launchers=False)
        except Exception as e:  # the real compiles say what is wrong, config by config
            log.warning("compiler warm-up failed: %s", e)


def _health(backend: str) -> float:
    """A 64x64 matmul on the child's device, synchronised by reading the sum back (4096 * 64)."""
    import torch

    x = torch.ones(64, 64, device="cuda" if backend == "gpu" else "cpu")
    return float((x @ x).sum().item())


class _CompileServer:
    def __init__(self) -> None:
        import triton  # noqa: F401 - imported once, for every compile to come

        from tilepilot.kernels import evaluate

        self.compile_config = evaluate.compile_config
        t0 = time.perf_counter()
        _warm_up_compiler()
        self.warm_up_s = time.perf_counter() - t0
        self.compiles = _CompileCounter("compile")

    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "warm_up_s": round(self.warm_up_s, 3)}

    def counts(self) -> dict[str, int | None]:
        return {"compiles": self.compiles.take()}

    def handle(self, op: str, args: tuple[Any, ...], on_start: Callable[[int], None]) -> Any:
        if op == "compile":
            on_start(0)
            return self.compile_config(*args)
        if op == "info":
            return self.info()
        raise ValueError(f"unknown request {op!r} for a compiling child")


def _portable(e: Exception) -> tuple[Exception | None, str]:
    """The exception itself where it is a TilepilotError that pickles, and its text."""
    text = "".join(traceback.format_exception(e)).strip()
    if isinstance(e, TilepilotError):
        try:
            pickle.dumps(e)
            return e, text
        except Exception:
            pass
    return None, text


def _exit_with_parent(parent_pid: int) -> None:
    """Exit when the parent is gone (its actor killed): never leave a GPU context behind."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(PARENT_GONE_EXIT_CODE)

    threading.Thread(target=watch, name="tilepilot-parent-watch", daemon=True).start()
