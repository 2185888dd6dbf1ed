"""`tilepilot tune --address` joins a Ray cluster started with the Ray CLI instead of starting its
own, with Ray's token authentication on, as on a machine where a token exists.

A real head (`ray start --head`) runs in its own session with its own HOME (a fresh token in
the default place, `$HOME/.ray/auth_token`, which turns token mode on) and its own temp dir;
every tilepilot process runs in a subprocess with that HOME, so nothing here meets the test
session's local Ray. The head's GCS job table is the witness: a tune that started a local
Ray of its own would not be in it. The head is stopped by killing its session's processes by
id: `ray stop --force` kills every Ray process on the machine by name, this session's too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tilepilot.experiments import Status
from tilepilot.storage.store import Store

pytestmark = pytest.mark.slow  # a Ray head and two campaigns: about 25 s on 2 cores

REPO = Path(__file__).resolve().parents[1]
RAY = Path(sys.executable).parent / "ray"  # the Ray CLI of this venv
CAMPAIGN = REPO / "campaigns" / "interpret-small.toml"
RAY_ENV = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")

JOBS = """
import json, sys
from ray._raylet import GcsClient

jobs = GcsClient(address=sys.argv[1]).get_all_job_info(skip_submission_job_info_field=True,
                                                        skip_is_running_tasks_field=True)
print(json.dumps([[j.driver_pid, j.is_dead, j.entrypoint] for j in jobs.values()]))
"""


@dataclass(frozen=True)
class Head:
    address: str  # 127.0.0.1:port
    env: dict[str, str]  # HOME with the head's token, no RAY_* variables
    tmp: Path


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    tmp = Path(tempfile.mkdtemp(prefix="tp-ray-", dir="/tmp"))  # short: Ray's socket paths are limited
    env = {k: v for k, v in os.environ.items() if k not in RAY_ENV}
    env |= {"HOME": str(tmp / "home"), "PYTHONPATH": str(REPO)}
    subprocess.run([str(RAY), "get-auth-token", "--generate"], env=env, capture_output=True, check=True,
                   timeout=60)
    port = _free_port()
    start = subprocess.Popen(
        [str(RAY), "start", "--head", f"--port={port}", "--num-cpus=2", "--num-gpus=0",
         "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={tmp / 'ray'}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        t0 = time.monotonic()
        out, _ = start.communicate(timeout=90)
        assert start.returncode == 0, out
        assert "Token authentication is enabled" in out, out
        print(f"ray start --head: {time.monotonic() - t0:.1f} s")
        yield Head(f"127.0.0.1:{port}", env, tmp)
    finally:
        start.kill()
        left = _kill_session(start.pid)
        shutil.rmtree(tmp, ignore_errors=True)
        assert not left, f"Ray processes left behind: {left}"


def test_tune_with_the_head_address_runs_on_the_existing_cluster(head: Head) -> None:
    pid = _tune(head, "--address", head.address, db=head.tmp / "addr.db")
    _assert_campaign_done(head.tmp / "addr.db")
    _assert_ran_on_the_head(head, pid)


def test_tune_with_address_auto_follows_ray_address_to_the_existing_cluster(head: Head) -> None:
    pid = _tune(head, "--address", "auto", db=head.tmp / "auto.db", RAY_ADDRESS=head.address)
    _assert_campaign_done(head.tmp / "auto.db")
    _assert_ran_on_the_head(head, pid)


def test_a_wrong_token_is_one_input_error_line_within_seconds(head: Head) -> None:
    env = head.env | {"RAY_AUTH_TOKEN": "0" * 32}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tilepilot", "tune", str(CAMPAIGN), "--backend", "interpret",
                           "--address", head.address, "--db", str(head.tmp / "wrong.db")],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - t0 < 15  # ray.init alone retries for 20 s before it gives up
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"tilepilot: error: cannot join a Ray cluster at '{head.address}': "
                           "Authentication token is missing or incorrect (it uses token authentication")


def _tune(head: Head, *args: str, db: Path, **env: str) -> int:
    """Run `tilepilot tune` on the interpret backend; return its pid once it has finished with 0."""
    cmd = [sys.executable, "-m", "tilepilot", "tune", str(CAMPAIGN), "--backend", "interpret", *args,
           "--db", str(db)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=head.env | env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, f"{out}\n{err}"
    print(f"tune {' '.join(args)}: {time.monotonic() - t0:.1f} s\n{out}")
    return proc.pid


def _assert_campaign_done(db: Path) -> None:
    with Store.open_readonly(db) as store:
        campaign = store.get_campaign("interpret-small")
        assert campaign is not None and campaign.state == "finished"
        results = store.campaign_results(campaign.id)
    assert len(results) == campaign.budget
    assert any(r.status is Status.OK for _, r in results)


def _assert_ran_on_the_head(head: Head, pid: int) -> None:
    env = head.env | {"RAY_AUTH_MODE": "token"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(JOBS), head.address], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    jobs = json.loads(proc.stdout.strip().splitlines()[-1])
    mine = [j for j in jobs if j[0] == pid]
    assert len(mine) == 1, f"tune (pid {pid}) is not a driver of the head's cluster: {jobs}"
    assert mine[0][1] is True and "tilepilot tune" in mine[0][2]  # finished, and it was tune


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_session(sid: int) -> list[str]:
    """SIGKILL every process of session `sid` (the head's: `ray start` and all it spawned), wait
    for them to go, and return the command lines of any still there after 15 s."""
    for pid in _session(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 15
    while (left := _session(sid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [_cmdline(pid) for pid in left]


def _session(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`, from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) == sid and (entry / "stat").read_text().split(") ")[-1][0] != "Z":
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_text().replace("\0", " ").strip()
    except OSError:
        return f"pid {pid}"
