"""Starting Ray, or joining a cluster, and asking it what it has.

Without an address a local Ray starts with the GPUs it finds (no dashboard, warnings only).
With "auto" or "host:port" tilepilot joins a running cluster (`ray start --head` on one
machine, `ray start --address=...` on the others; every node needs the same auth token:
LIBRARIES.md). A cluster that cannot be reached is one InputError line, not a minutes-long
retry loop: "host:port" is probed with a plain TCP connection first, then asked for its
cluster id with this machine's token.

Token authentication: `ray start --head` turns it on when a token exists (`~/.ray/auth_token`,
which any local `ray.init()` writes), but Ray sends the token only to a cluster it finds by
itself, never to one named by address or RAY_ADDRESS, which then refuses the driver after
20 s of retries. So when RAY_AUTH_MODE is unset and this machine has a token, joining turns
token mode on (a cluster without authentication accepts it too).
"""

from __future__ import annotations

import logging
import os
import re
import socket
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import (
    ActorUnschedulableError,
    AuthenticationError,
    NodeDiedError,
    ObjectLostError,
    RayActorError,
    RayTaskError,
    RpcError,
    WorkerCrashedError,
)

from tilepilot.experiments import InputError, TilepilotError

log = logging.getLogger(__name__)

ADDRESS_RE = re.compile(r"^(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:]+\]):(?P<port>[0-9]{1,5})$")
PROBE_TIMEOUT_S = 5.0
NAMESPACE = "tilepilot"  # of the named actors that campaigns on one cluster share
# what ray.get raises when the actor or the node behind a reference is gone (not the work's own error)
LOST = (RayActorError, WorkerCrashedError, NodeDiedError, ObjectLostError, ActorUnschedulableError)

_joined = False  # this process joined a cluster by address (rather than starting a local Ray)


@dataclass(frozen=True)
class NodeResources:
    node_id: str
    host: str
    ip: str
    cpus: float
    gpus: float


@dataclass(frozen=True)
class RayInfo:
    address: str  # the cluster's GCS address
    started_here: bool  # True: a local Ray this process started (and shuts down)
    nodes: tuple[NodeResources, ...]

    @property
    def cpus(self) -> float:
        return sum(n.cpus for n in self.nodes)

    @property
    def gpus(self) -> float:
        return sum(n.gpus for n in self.nodes)


def start_ray(address: str | None, *, num_cpus: int | None = None, num_gpus: int | None = None) -> RayInfo:
    """Start a local Ray (address None) or join the cluster at `address` ("auto" or "host:port").

    If Ray is already initialised in this process, it is used as it is. `num_cpus` and
    `num_gpus` limit a local Ray; they are refused with an address (the cluster has its own).
    Raises InputError when the address is malformed or no cluster answers there.
    """
    if ray.is_initialized():
        log.info("Ray is already initialised in this process; using it")
        return _describe(started_here=False)
    if address is None:
        ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
                 logging_level=logging.WARNING)
        info = _describe(started_here=True)
        log.info("started a local Ray: %g CPUs, %g GPUs", info.cpus, info.gpus)
        return info
    if num_cpus is not None or num_gpus is not None:
        raise InputError("num_cpus and num_gpus apply to a local Ray only, not to a cluster at "
                         f"{address!r} (leave them out, or leave out the address)")
    _join(address)
    global _joined
    _joined = True
    info = _describe(started_here=False)
    log.info("joined the Ray cluster at %s: %d nodes, %g CPUs, %g GPUs", info.address, len(info.nodes),
             info.cpus, info.gpus)
    return info


def joined_cluster() -> bool:
    """Whether `start_ray` joined a cluster by address in this process (other campaigns may share it)."""
    return _joined


def cluster_nodes() -> list[NodeResources]:
    """The alive nodes of the cluster this process is connected to, with their CPUs and GPUs."""
    return [NodeResources(n["NodeID"], n.get("NodeManagerHostname", ""), n.get("NodeManagerAddress", ""),
                          float(n["Resources"].get("CPU", 0)), float(n["Resources"].get("GPU", 0)))
            for n in ray.nodes() if n["Alive"]]


def cluster_gpus() -> dict[str, int]:
    """GPUs per node, keyed by host name ("host@ip" where two nodes share a host name)."""
    nodes = cluster_nodes()
    hosts = [n.host for n in nodes]
    return {(n.host if hosts.count(n.host) == 1 else f"{n.host}@{n.ip}"): int(n.gpus) for n in nodes}


def fetch(refs: Any, *, timeout_s: float | None = None) -> Any:
    """`ray.get`, except that a TilepilotError raised in a task or actor comes back as itself
    (one line, e.g. BackendUnavailable), not wrapped in Ray's remote traceback."""
    try:
        return ray.get(refs, timeout=timeout_s)
    except RayTaskError as e:
        if isinstance(e.cause, TilepilotError):
            raise e.cause from None
        raise


def shutdown() -> None:
    """Leave the cluster (and stop a local Ray this process started)."""
    global _joined
    _joined = False
    if ray.is_initialized():
        ray.shutdown()


def _join(address: str) -> None:
    target = address
    if address == "auto":  # ray.init reads RAY_ADDRESS for "auto"
        target = os.environ.get("RAY_ADDRESS") or address
    if target != "auto":
        host, port = _parse(target, given=address)
        _probe(host, port, target)
    try:
        _use_token(None if target == "auto" else target)
        ray.init(address=address, logging_level=logging.WARNING)
    except AuthenticationError as e:
        reason = str(e).split(". ")[0].rsplit(": ", 1)[-1]  # "RPC error: InvalidAuthToken: <reason>. <advice>"
        raise InputError(f"cannot join a Ray cluster at {address!r}: {reason} (it uses token authentication: "
                         "put the head's token in ~/.ray/auth_token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH, "
                         "and leave RAY_AUTH_MODE unset or 'token')") from None
    except (ConnectionError, RpcError) as e:  # RpcError: an open port with no Ray GCS behind it (~40 s)
        raise InputError(f"cannot join a Ray cluster at {address!r}: {_first_line(e)}") from None


def _use_token(gcs_address: str | None) -> None:
    """Send this machine's token if it has one and RAY_AUTH_MODE is unset, as Ray does for a
    cluster it finds by itself; then ask the GCS for its cluster id, which fails at once with
    AuthenticationError on a missing or wrong token (ray.init would retry for 20 s)."""
    from ray._private.authentication import authentication_token_setup as setup
    from ray._raylet import GcsClient

    quiet = logging.getLogger(setup.__name__)  # its warning is for a head: "set ...=disabled to opt out"
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    finally:
        quiet.setLevel(level)
    setup.ensure_token_if_auth_enabled(None, create_token_if_missing=False)  # token mode without a token
    if gcs_address is not None:
        GcsClient(address=gcs_address)


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _parse(address: str, *, given: str) -> tuple[str, int]:
    m = ADDRESS_RE.match(address)
    if m is None or not 0 < int(m["port"]) < 65536:
        source = "" if address == given else " (from RAY_ADDRESS)"
        raise InputError(f"Ray address {address!r}{source} is not 'auto' or host:port (e.g. 10.0.0.5:6379)")
    return m["host"].strip("[]"), int(m["port"])


def _probe(host: str, port: int, address: str) -> None:
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise InputError(f"no Ray cluster answers at {address!r} ({reason}); start one with "
                         "`ray start --head`, or leave out the address for a local Ray") from None


def _describe(*, started_here: bool) -> RayInfo:
    address = ray.get_runtime_context().gcs_address
    return RayInfo(address, started_here, tuple(cluster_nodes()))
