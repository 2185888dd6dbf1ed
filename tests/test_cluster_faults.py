"""A Ray cluster of two nodes on one machine (`ray start --head`, then `ray start --address`), with
`tilepilot tune --address` campaigns on the interpret backend:

- two campaigns at once share the cluster's one "GPU" (a custom resource `tilepilot_gpu` stands
  in for it: each worker holds one, TILEPILOT_WORKER_RESOURCES): they reach the same named worker,
  which serves their batches in turn; no two measurements ever overlap, and each campaign gets
  turns before the other has finished;
- the campaign that started the shared worker ends while another still uses it: the worker is
  detached, so the other finishes on it with no loss and no re-queue; `tilepilot workers stop`
  then ends it (and its child) at once;
- the second node is killed (every process of its Ray session, raylet included) while its worker
  is in the middle of a batch: the batch is re-queued and finished on the head's worker, and every
  experiment of the campaign ends exactly once with a result.

The witness of where and when work ran is the `test_slow` family's log (tests/worker_families.py).
Shared workers outlive the campaigns, so each test ends the ones it leaves with `workers stop`.
The head detects a dead node within about a second (health checks every 0.5 s; the default waits
about 15 s). Processes are stopped by session id, never by name (tests/test_ray_cluster.py).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.test_ray_cluster import RAY, RAY_ENV, _free_port, _kill_session
from tests.worker_families import MEASURE_LOG

REPO = Path(__file__).resolve().parents[1]
RESOURCES = json.dumps({"tilepilot_gpu": 1})
FAST_NODE_DEATH = {"RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "500",
                   "RAY_health_check_failure_threshold": "3", "RAY_health_check_initial_delay_ms": "0"}
SPACE = """
[space]
BLOCK_SIZE_M = [16, 32]
BLOCK_SIZE_N = [16, 32]
BLOCK_SIZE_K = [16, 32]
GROUP_SIZE_M = [1]
num_warps = [4]
num_stages = [2]
FAULT = ["sleep"]
"""


@dataclass(frozen=True)
class Cluster:
    address: str
    env: dict[str, str]  # HOME with the head's token, the test families, the markers folder
    tmp: Path
    markers: Path


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    tmp = Path(tempfile.mkdtemp(prefix="tp-clu-", dir="/tmp"))  # short: Ray's socket paths are limited
    markers = tmp / "markers"
    markers.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in RAY_ENV}
    env |= {"HOME": str(tmp / "home"), "PYTHONPATH": str(REPO), "TILEPILOT_KERNEL_MODULES": "tests.worker_families",
            "TILEPILOT_TEST_MARKERS": str(markers), "TILEPILOT_TEST_SLOW_S": "0.25",
            "TILEPILOT_WORKER_RESOURCES": RESOURCES}
    subprocess.run([str(RAY), "get-auth-token", "--generate"], env=env, capture_output=True, check=True, timeout=60)
    port = _free_port()
    head = subprocess.Popen(
        [str(RAY), "start", "--head", f"--port={port}", "--num-cpus=2", "--num-gpus=0", f"--resources={RESOURCES}",
         "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={tmp / 'ray'}"],
        env=env | FAST_NODE_DEATH, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        out, _ = head.communicate(timeout=90)
        assert head.returncode == 0, out
        yield Cluster(f"127.0.0.1:{port}", env, tmp, markers)
    finally:
        head.kill()
        left = _kill_session(head.pid)
        shutil.rmtree(tmp, ignore_errors=True)
        assert not left, f"Ray processes left behind: {left}"


def campaign(path: Path, name: str, budget: int, problems: list[tuple[int, int, int]]) -> Path:
    rows = "".join(f'\n[[problems]]\nM = {m}\nN = {n}\nK = {k}\ndtype = "fp16"\n' for m, n, k in problems)
    path.write_text(f'[campaign]\nname = "{name}"\nkernel = "test_slow"\nproposer = "random"\nbudget = {budget}\n'
                    f"seed = 0\nhypothesis_share = 0\n{SPACE}{rows}")
    return path


def tune(c: Cluster, toml: Path, db: Path, workers: int) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "tilepilot", "tune", str(toml), "--backend", "interpret", "--address", c.address,
           "--workers", str(workers), "--db", str(db)]
    return subprocess.Popen(cmd, env=c.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop_workers(c: Cluster) -> str:
    """`tilepilot workers stop --address` on the cluster; what it printed."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tilepilot", "workers", "stop", "--address", c.address],
                          env=c.env, capture_output=True, text=True, timeout=120, check=False)
    print(f"workers stop: {time.monotonic() - t0:.1f} s: {proc.stdout.strip()}")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def finish(proc: subprocess.Popen[str], timeout_s: float = 120) -> None:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        proc.kill()
    assert proc.returncode == 0, f"{out}\n{err}"


def query(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def events(db: Path, kind: str) -> list[dict[str, Any]]:
    return [json.loads(d) for (d,) in query(db, "SELECT data FROM events WHERE kind = ? ORDER BY id", (kind,))]


def check_every_experiment_once(db: Path, budget: int, problems: int) -> list[str]:
    """The campaign finished with each experiment once, all ok; the workers that measured them."""
    assert query(db, "SELECT state FROM campaigns") == [("finished",)]
    rows = query(db, "SELECT t.experiment_key, r.status, r.worker FROM trials t "
                     "JOIN results r ON r.experiment_key = t.experiment_key")
    assert len(rows) == budget * problems and len({k for k, _, _ in rows}) == len(rows)
    assert {s for _, s, _ in rows} == {"ok"}
    assert query(db, "SELECT COUNT(*) FROM queue WHERE state NOT IN ('done', 'dropped')") == [(0,)]
    return [w for _, _, w in rows]


def spans(markers: Path) -> list[tuple[float, float, int, str]]:
    """(start, end, pid, problem) of each measurement in the log, in time order."""
    rows = [line.split("\t") for line in (markers / MEASURE_LOG).read_text().splitlines()]
    return sorted((float(a), float(b), int(pid), problem) for pid, a, b, problem, _ in rows)


def test_two_campaigns_share_one_gpu_in_turns_and_never_measure_at_once(cluster: Cluster) -> None:
    (cluster.markers / MEASURE_LOG).unlink(missing_ok=True)
    first = campaign(cluster.tmp / "a.toml", "share-a", 2, [(32, 32, 32), (32, 32, 64)])
    second = campaign(cluster.tmp / "b.toml", "share-b", 2, [(48, 32, 32), (48, 32, 64)])
    t0 = time.monotonic()
    procs = [tune(cluster, first, cluster.tmp / "a.db", 1), tune(cluster, second, cluster.tmp / "b.db", 1)]
    try:
        for proc in procs:
            finish(proc)
    finally:
        stop_workers(cluster)
    print(f"two campaigns sharing one worker: {time.monotonic() - t0:.1f} s")
    for db in ("a.db", "b.db"):
        check_every_experiment_once(cluster.tmp / db, 2, 2)
    measured = spans(cluster.markers)
    overlaps = [(x, y) for x, y in itertools.pairwise(measured) if y[0] < x[1]]
    assert not overlaps, f"two measurements at once on the one GPU: {overlaps}"
    owners = ["a" if problem.startswith("M=32 ") else "b" for _, _, _, problem in measured]
    turns = [o for i, o in enumerate(owners) if i == 0 or o != owners[i - 1]]
    assert len(turns) >= 4, f"the campaigns did not take turns: {turns}"  # a, b, a, b at least
    waited = events(cluster.tmp / "a.db", "waited") + events(cluster.tmp / "b.db", "waited")
    assert waited and all(w["worker"] == "interpret-0" and w["waited_s"] >= 1.0 for w in waited)


def test_node_killed_mid_campaign_its_batch_is_requeued_and_finished_on_the_other(cluster: Cluster) -> None:
    (cluster.markers / MEASURE_LOG).unlink(missing_ok=True)
    node = subprocess.Popen(
        [str(RAY), "start", f"--address={cluster.address}", "--num-cpus=1", "--num-gpus=0",
         f"--resources={RESOURCES}", "--disable-usage-stats"],
        env=cluster.env | {"RAY_AUTH_MODE": "token"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    db = cluster.tmp / "kill.db"
    try:
        out, _ = node.communicate(timeout=90)
        assert node.returncode == 0, out
        proc = tune(cluster, campaign(cluster.tmp / "kill.toml", "node-kill", 8, [(32, 32, 32)]), db, 2)
        victim = _wait_for_busy(cluster.markers, node.pid, proc)
        t0, killed_at = time.monotonic(), time.time()
        left = _kill_session(node.pid)  # the whole second node: raylet, workers, the child measuring
        assert not left, f"processes of the second node left: {left}"
        finish(proc)
        print(f"second node killed while its child {victim} measured; the campaign finished "
              f"{time.monotonic() - t0:.1f} s later")
    finally:
        _kill_session(node.pid)
        stop_workers(cluster)
    workers = check_every_experiment_once(db, 8, 1)
    started = {e["worker"]: e["node"] for e in events(db, "worker_started") if not e["replaces"]}
    everything = query(db, "SELECT kind, message FROM events WHERE kind NOT IN ('queued', 'started', 'finished')")
    losses = events(db, "worker_lost")
    assert len(losses) == 1, "\n".join(f"{k}: {m}" for k, m in everything)
    [lost] = losses
    [(lost_at,)] = query(db, "SELECT ts FROM events WHERE kind = 'worker_lost'")
    print(f"the driver saw the node's worker lost {lost_at - killed_at:.1f} s after the kill")
    dead_node = lost["node"]
    assert lost["worker"] in started and started[lost["worker"]] == dead_node
    assert "The actor died" in lost["reason"] or "is unavailable" in lost["reason"]  # Ray says which it saw first
    [requeued] = events(db, "requeued")
    assert requeued["worker"] == lost["worker"] and requeued["queue_ids"]
    marks = ", ".join("?" * len(requeued["queue_ids"]))
    redone = query(db, f"SELECT state, worker FROM queue WHERE id IN ({marks})", tuple(requeued["queue_ids"]))
    survivor = next(w for w, n in started.items() if n != dead_node)
    assert redone == [("done", survivor)] * len(requeued["queue_ids"])  # finished on the surviving node
    assert set(workers) <= {survivor, lost["worker"]} and workers.count(survivor) >= len(requeued["queue_ids"])


@pytest.mark.slow  # two campaigns and two `workers stop`: about 30 s on 2 cores
def test_the_campaign_that_started_a_shared_worker_ends_and_the_other_finishes_on_it_without_a_loss(
        cluster: Cluster) -> None:
    (cluster.markers / MEASURE_LOG).unlink(missing_ok=True)
    first = campaign(cluster.tmp / "first.toml", "starts-the-worker", 2, [(32, 32, 32)])
    second = campaign(cluster.tmp / "second.toml", "outlives-it", 4, [(48, 32, 32), (48, 32, 64)])
    try:
        starter = tune(cluster, first, cluster.tmp / "first.db", 1)
        _wait_for_a_measurement(cluster.markers, starter)  # its worker is up: this campaign started it
        other = tune(cluster, second, cluster.tmp / "second.db", 1)
        finish(starter)
        starter_ended = time.time()
        assert other.poll() is None, "the second campaign ended before the first: nothing to witness"
        finish(other)
    finally:
        stopped = stop_workers(cluster)
    check_every_experiment_once(cluster.tmp / "first.db", 2, 1)
    check_every_experiment_once(cluster.tmp / "second.db", 4, 2)
    db = cluster.tmp / "second.db"
    assert events(db, "worker_lost") == [] and events(db, "requeued") == []
    assert [e["replaces"] for e in events(db, "worker_started")] == [""]  # one worker, never started again
    measured = spans(cluster.markers)
    after = [s for s in measured if s[0] > starter_ended]
    assert after and all(problem.startswith("M=48 ") for *_, problem in after)
    children = {pid for _, _, pid, _ in measured}
    assert len(children) == 1, f"the worker's child changed: {children}"  # the worker A started, to the end
    print(f"{len(after)} measurement(s) of the second campaign after the first ended, on the worker it started")
    assert re.fullmatch(r"stopped 1 shared worker\(s\) on the cluster at \S+: tilepilot-interpret-0", stopped)
    [child] = children
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, "the stopped worker's child outlived it"
        time.sleep(0.1)
    assert stop_workers(cluster).startswith("no shared workers on the cluster at ")


def _wait_for_a_measurement(markers: Path, proc: subprocess.Popen[str], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not (markers / MEASURE_LOG).exists() and not list(markers.glob("*.busy")):
        assert proc.poll() is None, f"tune ended first: {proc.communicate()}"
        assert time.monotonic() < deadline, "the campaign never started to measure"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1][:1] != "Z"
    except OSError:
        return False


def _wait_for_busy(markers: Path, session: int, proc: subprocess.Popen[str], timeout_s: float = 90) -> int:
    """The pid of a process of the second node (of its Ray session) in the middle of a measurement."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"tune ended first: {proc.communicate()}"
        assert time.monotonic() < deadline, "the second node's worker never started a batch"
        for marker in markers.glob("*.busy"):
            pid = int(marker.name.split(".")[0])
            try:
                if os.getsid(pid) == session:
                    return pid
            except ProcessLookupError:
                continue
        time.sleep(0.02)
