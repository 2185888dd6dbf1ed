"""Starting or joining Ray: a running Ray is reused, no address starts a local one, and an address
that is malformed or where no cluster answers is one InputError line within seconds (Ray itself
would retry for minutes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tilepilot.orchestrator.ray_runtime import cluster_gpus, start_ray

REPO = Path(__file__).resolve().parents[1]

BAD_ADDRESSES = """
import json
from tilepilot.experiments import InputError
from tilepilot.orchestrator.ray_runtime import shutdown, start_ray

out = {}
for address in ("127.0.0.1:1", "ray://10.0.0.1:10001", "head-node", "auto"):
    try:
        start_ray(address)
        out[address] = "joined"
    except InputError as e:
        out[address] = str(e)
try:
    start_ray("127.0.0.1:1", num_gpus=1)
except InputError as e:
    out["num_gpus"] = str(e)
info = start_ray(None, num_cpus=1, num_gpus=0)
out["local"] = [info.started_here, info.cpus, info.gpus, len(info.nodes)]
shutdown()
print(json.dumps(out))
"""


def test_start_ray_uses_the_ray_already_running(ray_session: None) -> None:
    info = start_ray(None)
    assert not info.started_here and info.address
    assert info.cpus == 2 and len(info.nodes) == 1
    assert cluster_gpus() == {info.nodes[0].host: int(info.gpus)}


def test_bad_address_is_one_input_error_line_and_no_address_starts_a_local_ray() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": "127.0.0.1:2"}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(BAD_ADDRESSES)], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - t0 < 60
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out.pop("local") == [True, 1, 0, 1]
    assert all("\n" not in v for v in out.values())
    assert out["127.0.0.1:1"].startswith("no Ray cluster answers at '127.0.0.1:1'")
    assert "is not 'auto' or host:port" in out["ray://10.0.0.1:10001"]
    assert "is not 'auto' or host:port" in out["head-node"]
    assert "no Ray cluster answers at '127.0.0.1:2'" in out["auto"]  # "auto" follows RAY_ADDRESS
    assert "local Ray only" in out["num_gpus"]
