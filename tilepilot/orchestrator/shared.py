"""Workers that the campaigns on one Ray cluster share: how long they live, and how they end.

A shared worker (a GPU worker, or a compile worker of a shared pool) is a named actor in the
namespace "tilepilot" that every campaign on the cluster finds by name (`get_if_exists`). It
is started detached (`lifetime="detached"`): Ray would otherwise end it with the campaign
process that happened to start it (owner fate-sharing), taking it from the campaigns still
using it. Being detached, nothing ends it but itself, a person, or its node going away, so:

- it ends by itself once no request has come for TILEPILOT_SHARED_IDLE_S seconds (default
  SHARED_IDLE_S: five minutes; read by the campaign that starts the worker, which passes it
  on), never while a request runs or waits for its turn: its child process is stopped, then the
  actor is killed (`ray.kill` on itself: Ray frees the name at once, and a campaign asking for
  it later starts a fresh one). Every request counts as use, `info` and the GPU workers'
  periodic `sample` included, so a running campaign (even a paused one, on GPUs) keeps its
  workers;
- `tilepilot workers stop --address ADDR` ends every shared worker of the cluster now
  (`stop_shared_workers`): each is asked to `retire` (an idle one stops its child first; a busy
  one is killed at once, its child following within a second, child.py), and one that does not
  go within STOP_WAIT_S (a compile worker finishing its compile, an actor never placed) is
  killed. A campaign still running starts its workers again when it next needs them.

The race between a request and the idle exit: a request that arrives once the worker has
decided to end waits there until the process is gone, so its caller sees a lost worker (Ray's
ActorDiedError) and takes the path for one (ray_executor.py: the batch re-queued, a fresh
worker started), never a hang and never a batch half-run on a stopped child. Two campaigns
asking for a name at once get one actor (`get_if_exists`).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import ray

from tilepilot.experiments import InputError
from tilepilot.orchestrator.ray_runtime import NAMESPACE

log = logging.getLogger(__name__)

SHARED_IDLE_ENV = "TILEPILOT_SHARED_IDLE_S"
SHARED_IDLE_S = 300.0  # a shared worker with no request this long ends by itself
EXIT_GRACE_S = 10.0  # after killing itself, how long an actor waits for Ray before it exits anyway
STOP_WAIT_S = 10.0  # `stop_shared_workers`: how long a worker has to retire before it is killed
_PARKED_S = 1.0  # a request that came too late sleeps in steps of this, until the process is gone


def shared_idle_s() -> float:
    """Seconds a shared worker may go without a request before it ends: TILEPILOT_SHARED_IDLE_S,
    else SHARED_IDLE_S. Raises InputError when the variable is not a positive number of seconds."""
    raw = os.environ.get(SHARED_IDLE_ENV, "").strip()
    if not raw:
        return SHARED_IDLE_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise InputError(f"{SHARED_IDLE_ENV}={raw!r} is not a positive number of seconds (e.g. 300; "
                         f"unset: {SHARED_IDLE_S:g})")
    return value


def shared_options(name: str) -> dict[str, Any]:
    """Ray actor options that make an actor the shared worker `name`: found by every campaign on
    the cluster (started by the first that asks), and outliving the campaign that started it."""
    return {"name": name, "namespace": NAMESPACE, "get_if_exists": True, "lifetime": "detached"}


class IdleExit:
    """Inside an actor: counts its requests, and with `idle_s` ends the actor once no request has
    come for that long (`cleanup` first: it stops the actor's child). `idle_s` None: the actor
    lives until it is killed (a campaign's own worker, killed when the campaign closes).

    Thread-safe: the actor's request threads, its watcher thread and `end_now` may race."""

    def __init__(self, idle_s: float | None, cleanup: Callable[[], None], what: str) -> None:
        if idle_s is not None and not idle_s > 0:
            raise ValueError(f"idle_s must be positive or None, not {idle_s!r}")
        self._idle_s = idle_s
        self._cleanup = cleanup
        self._what = what
        self._lock = threading.Lock()
        self._active = 0  # requests running or waiting for their turn
        self._last = time.monotonic()  # when the last request ended (or the actor started)
        self._ending = False

    def start(self) -> None:
        """Start watching for idleness (call once the actor is ready to serve)."""
        with self._lock:
            self._last = time.monotonic()
        if self._idle_s is not None:
            threading.Thread(target=self._watch, name="tilepilot-idle-exit", daemon=True).start()

    @contextmanager
    def request(self) -> Iterator[None]:
        """Around every request: the actor is in use until it ends. A request that comes once
        the actor has decided to end never runs: it waits for the process to go (see the module
        docstring), and its caller sees the actor lost."""
        with self._lock:
            late = self._ending
            if not late:
                self._active += 1
        if late:
            _park()
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                self._last = time.monotonic()

    def end_now(self, why: str) -> None:
        """End the actor now (a person asked): its child stopped first if no request runs, else
        left to follow its parent. Does not return."""
        with self._lock:
            already = self._ending
            self._ending = True
            busy = self._active > 0
        if already:  # the idle watcher (or another retire) is ending it
            _park()
        self._end(why, clean=not busy)

    def _watch(self) -> None:
        assert self._idle_s is not None
        while True:
            with self._lock:
                if self._ending:  # `end_now` is ending it
                    return
                idle = time.monotonic() - self._last
                if not self._active and idle >= self._idle_s:
                    self._ending = True
                    break
                wait = self._idle_s if self._active else self._idle_s - idle
            time.sleep(max(wait, 0.05))
        self._end(f"no request for {idle:.1f} s (idle limit {self._idle_s:g} s, {SHARED_IDLE_ENV})", clean=True)

    def _end(self, why: str, *, clean: bool) -> None:
        log.warning("%s ends: %s", self._what, why)
        if clean:
            try:
                self._cleanup()
            except Exception:  # the actor ends all the same; its child follows its parent (child.py)
                log.exception("%s: stopping its child failed", self._what)
        try:
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
        finally:
            time.sleep(EXIT_GRACE_S)  # Ray kills this process meanwhile
            os._exit(0)


def _park() -> NoReturn:
    """Wait for this process to be ended (by `IdleExit._end`, in another thread)."""
    while True:
        time.sleep(_PARKED_S)


def stop_shared_workers(wait_s: float = STOP_WAIT_S) -> list[str]:
    """End every shared worker of the cluster this process is connected to, now (see the module
    docstring); the names of those ended, sorted."""
    names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                   if a["namespace"] == NAMESPACE)
    handles: dict[str, Any] = {}
    for name in names:
        try:
            handles[name] = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:  # it ended meanwhile
            continue
    asked: dict[Any, str] = {}
    for name, handle in handles.items():
        if hasattr(handle, "retire"):
            asked[handle.retire.remote()] = name
        else:  # started by a tilepilot that had no `retire`
            ray.kill(handle, no_restart=True)
    _, left = ray.wait(list(asked), num_returns=len(asked), timeout=wait_s) if asked else ([], [])
    for ref in left:
        log.info("shared worker %s did not retire within %g s: killed", asked[ref], wait_s)
        ray.kill(handles[asked[ref]], no_restart=True)
    return list(handles)
