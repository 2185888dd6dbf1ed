"""The real dashboard server, driven by Debian's headless Chromium.

Streamlit sends the page over a websocket after the HTML has loaded, and `--dump-dom` with
`--virtual-time-budget` does not wait for those messages (it returns the loading skeleton).
So Chromium is driven through the DevTools protocol over a pipe (`--remote-debugging-pipe`,
no port opened) and the rendered DOM is read in real time, in the same page, while the test
writes to the store as a campaign driver would: the page must follow without a reload. One test
runs a real campaign (`tilepilot tune` on the interpret backend), pauses it as a person would,
checks the page against the store (read through `storage.queries`), resumes it and follows it
to its end.

Without Chromium the browser tests skip, except under CI (CI=true), where they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import dashboard_fixture as fx
from tilepilot.dashboard import launch, text
from tilepilot.experiments import Campaign

START_TIMEOUT_S = 90
WAIT_S = 45  # a live change must show within this (refresh 2 s + cache TTL 2 s, on a slow CI box)
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--remote-debugging-pipe")


class Chromium:
    """Headless Chromium spoken to through the DevTools protocol on fds 3 (in) and 4 (out)."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_child, self._cmd_w = os.pipe()
        self._out_r, from_child = os.pipe()

        def onto_3_and_4() -> None:  # in the child: the pipe ends Chromium expects
            a, b = os.dup(to_child), os.dup(from_child)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            pass_fds=(3, 4), preexec_fn=onto_3_and_4, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child)
        os.close(from_child)
        self._buf = b""
        self._id = 0

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> Any:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        while True:  # skip events until our answer comes
            while b"\0" not in self._buf:
                chunk = os.read(self._out_r, 1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def open(self, url: str) -> str:
        """Open `url` in a new tab; returns the session id to talk to it."""
        target = self.send("Target.createTarget", {"url": url})["targetId"]
        return self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    def eval(self, session: str, expression: str) -> Any:
        reply = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        return reply["result"].get("value")

    def text(self, session: str) -> str:
        return self.eval(session, "document.body ? document.body.innerText : ''") or ""

    def wait_for(self, session: str, *needles: str, timeout: float = WAIT_S) -> str:
        """Poll the rendered text until it holds every needle; returns that text."""
        deadline = time.monotonic() + timeout
        seen = ""
        while time.monotonic() < deadline:
            seen = self.text(session)
            if all(n in seen for n in needles):
                return seen
            time.sleep(0.25)
        missing = [n for n in needles if n not in seen]
        raise AssertionError(f"page never showed {missing}; it shows:\n{seen}")

    def close(self) -> None:
        """Ask Chromium to quit, then end what is left of the process group it leads."""
        with contextlib.suppress(RuntimeError, OSError):
            self.send("Browser.close")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # helpers of this browser only: its own group
        os.close(self._cmd_w)
        os.close(self._out_r)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}:\n{log.read_text()}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read() == b"ok":
                    return
        time.sleep(0.2)
    raise AssertionError(f"no /_stcore/health == ok after {START_TIMEOUT_S} s:\n{log.read_text()}")


class Server:
    def __init__(self, live: fx.Live, url: str, port: int) -> None:
        self.live, self.url, self.port = live, url, port


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A fresh store and server per test: each test writes to its store."""
    folder = tmp_path
    live = fx.build(folder / "dash.db")
    port = free_port()
    log = folder / "server.log"
    with log.open("wb") as out:
        proc = launch.start(str(folder / "dash.db"), port=port, output=out)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield Server(live, url, port)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        live.store.close()


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def chromium_binary() -> str:
    """Debian's chromium; without it the test skips, or fails under CI (CI=true)."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        message = "Chromium is not installed (apt-get install -y chromium)"
        if under_ci():
            pytest.fail(message + ": the browser tests must run under CI")
        pytest.skip(message)
    return binary


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Chromium]:
    chromium = Chromium(chromium_binary(), tmp_path / "chromium-profile")
    try:
        yield chromium
    finally:
        chromium.close()


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc writes them) of the sockets listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.append(addr)
    return found


def test_server_listens_on_loopback_only_by_default(server: Server):
    if not Path("/proc/net/tcp").exists():
        pytest.skip("needs Linux /proc/net/tcp to list listening sockets")
    assert _listening(server.port) == ["0100007F"]  # 127.0.0.1, and no IPv6 or wildcard socket


def test_serve_stops_its_server_when_terminated(tmp_path: Path):
    fx.build(tmp_path / "dash.db").store.close()
    port, log = free_port(), tmp_path / "serve.log"
    code = ("import sys; from tilepilot.dashboard.launch import serve; "
            "sys.exit(serve(sys.argv[1], port=int(sys.argv[2])))")
    with log.open("wb") as out:
        parent = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "dash.db"), str(port)],
                                  env=launch.child_env(), stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", parent, log)
        parent.terminate()
        assert parent.wait(timeout=30) == 128 + signal.SIGTERM
        with pytest.raises(OSError):  # nothing listens any more: the server went with serve()
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)  # whatever of this test's group is left
        parent.wait()


def test_overview_shows_store_numbers_and_follows_the_campaign_live(server: Server, browser: Chromium):
    tab = browser.open(server.url + "/")
    shown = browser.wait_for(tab, "mm-live · running", "4/16", "best 0.4321 ms", "best 1.234 ms",
                             text.source("gpu", fx.DEVICE), "GPU time\n\n0.227 s",
                             "LLM cost\n\n$0.0270 (+1 unpriced)", "LLM tokens (in / out)\n\n8k / 1.3k",
                             "copy 2000 GB/s", "bf16 matmul 500 TFLOP/s")
    assert "Running\n\n2" in shown and "Queued\n\n2" in shown
    assert fx.HOSTILE in shown  # the campaign description, verbatim
    assert browser.eval(tab, "document.getElementById('injected') === null") is True
    wait_for_labels(browser, tab, "median_ms: 0.4321; TFLOP/s: 39.76",  # on the roofline
                    "trial: 2; median_ms: 0.4321; proposer: optuna",  # on the convergence chart
                    "param: num_warps; value: 4; n: 2;")  # the parameter effects
    browser.eval(tab, "window.__tilepilot_same_page = true")

    live = server.live
    live.store.add_llm_call(live.campaign_id, fx.LlmCall(time.time(), fx.P1.key(), "claude-sonnet-5-5", 1000, 200,
                                                         0, 0, 0.01, "end_turn", "req_2", "", 900.0))
    key = live.trial(fx.ok(fx.P1, fx.cfg(64, 256, 4, 4), 0.3999))
    live.store.set_queue_state(live.queue_ids["p1-next"], "done", worker="gpu-0", experiment_key=key)
    shown = browser.wait_for(tab, "5/16", "best 0.3999 ms", "GPU time\n\n0.267 s",  # + 100 × 0.3999 ms
                             "LLM cost\n\n$0.0370 (+1 unpriced)", "LLM tokens (in / out)\n\n9k / 1.5k")
    assert "Running\n\n1" in shown
    wait_for_labels(browser, tab, "median_ms: 0.3999; TFLOP/s: 42.96", "trial: 4; median_ms: 0.3999",
                    "param: num_warps; value: 4; n: 3;")  # the effects follow within data.EFFECTS_TTL_S
    live.store.set_campaign_state(live.campaign_id, "finished")
    browser.wait_for(tab, "mm-live · finished", "ETA\n\n—")
    assert browser.eval(tab, "window.__tilepilot_same_page === true") is True  # updated in place


def test_a_campaign_started_while_the_page_is_idle_appears(server: Server, browser: Chromium):
    store = server.live.store
    store.set_campaign_state(server.live.campaign_id, "finished")  # nothing runs: the slow pace
    tab = browser.open(server.url + "/")
    browser.wait_for(tab, "mm-live · finished")  # none runs: the one updated last
    browser.eval(tab, "window.__tilepilot_same_page = true")
    campaign = Campaign("mm-next", fx.KERNEL, "rules", 4, 0, (fx.P2,), "started later")
    store.create_campaign(campaign, backend="interpret", dataset="", device="cpu")
    browser.wait_for(tab, "mm-next · running", text.source("interpret", "cpu"))
    assert browser.eval(tab, "window.__tilepilot_same_page === true") is True


def test_gpus_page_shows_every_gpu_of_every_node_and_what_it_runs_live(server: Server, browser: Chromium):
    tab = browser.open(server.url + "/gpus")
    browser.wait_for(tab, "Node node-a · 2 GPU(s)", "Node node-b · 2 GPU(s)", "GPU 0 · Synthetic GPU 80GB",
                     "GPU 1 · Synthetic GPU 80GB", "612 W", "1755 MHz", "40.0 GiB", "455 W", "1660 MHz",
                     "throttle: sw_power_cap (throttled in 5 of 5 samples: sw_power_cap)",
                     "throttle: none now (throttled in 2 of 5 samples: hw_slowdown)",
                     "now: mm-live | M=4096 N=4096 K=512 dtype=fp16 | BLOCK_SIZE_M=64",
                     "now: mm-live | M=64 N=8192 K=2048 dtype=bf16 | BLOCK_SIZE_M=64")
    browser.eval(tab, "window.__tilepilot_same_page = true")
    live = server.live
    now = time.time()
    live.store.add_gpu_samples([fx.GpuSample(now, "node-b", "GPU-synthetic-2", 0, fx.DEVICE, 97.0, 33792.0, 81559.0,
                                             1704.0, 641.0, 73.0, "", "gpu-2", "")])
    live.store.set_queue_state(live.queue_ids["p2-next"], "done", worker="gpu-2")
    live.store.set_queue_state(live.queue_ids["p1-llm"], "running", worker="gpu-2")
    browser.wait_for(tab, "641 W", "1704 MHz", "33.0 GiB", "97 %",
                     "now: mm-live | M=4096 N=4096 K=512 dtype=fp16 | BLOCK_SIZE_M=128 BLOCK_SIZE_N=64")
    assert "now: mm-live | M=64 N=8192" not in browser.text(tab)
    assert browser.eval(tab, "window.__tilepilot_same_page === true") is True


def test_queue_page_says_why_entries_moved_and_follows_the_queue(server: Server, browser: Chromium):
    live = server.live
    tab = browser.open(server.url + "/queue")
    wide(browser, tab)
    browser.wait_for(tab, "Running (2)", "Next (2 queued)", "Recently done (1 in all)", "Why the queue changed")
    wait_for_tables(browser, tab, f"deeper pipeline for a short K {fx.HOSTILE}",  # the model's rationale, verbatim
                    "moved up 3→1: moved up: tests H-0000beef", "pinned by a person", "H-0000beef",
                    "dropped: needs the same shared memory (160 KiB)")
    assert browser.eval(tab, "document.getElementById('injected') === null") is True
    browser.eval(tab, "window.__tilepilot_same_page = true")
    key = live.trial(fx.ok(fx.P1, fx.cfg(64, 256, 4, 4), 0.3999))
    live.store.set_queue_state(live.queue_ids["p1-next"], "done", worker="gpu-0", experiment_key=key)
    live.store.set_queue_state(live.queue_ids["p2-explore"], "running", worker="gpu-0")
    live.store.log_event("reordered", "queue of M=4096 re-scored, 1 moved", campaign_id=live.campaign_id, data={
        "problem": fx.P1.key(), "moves": [{"queue_id": live.queue_ids["p1-llm"], "config": {}, "from": 2, "to": 1,
                                           "reason": "moved up: predicted 0.3876 ms; 1st fastest of 1 predicted"}]})
    browser.wait_for(tab, "Running (2)", "Next (1 queued)", "Recently done (2 in all)")
    wait_for_tables(browser, tab, "moved up 2→1: moved up: predicted 0.3876 ms", "0.3999")
    assert browser.eval(tab, "window.__tilepilot_same_page === true") is True


def test_experiments_and_log_pages_list_the_store_and_follow_new_trials(server: Server, browser: Chromium):
    live = server.live
    tab = browser.open(server.url + "/experiments")
    wide(browser, tab)
    browser.wait_for(tab, "6 experiment(s), newest first", "Median\n\n0.6543 ms", "% of roofline",
                     "numbers: " + text.source("replay", fx.DEVICE))
    wait_for_tables(browser, tab, "0.4321", "0.5123", "largest tile that fits", "shared memory 262144 > 232448")
    live.trial(fx.ok(fx.P2, fx.cfg(128, 64, 8, 4), 0.9876), proposer="rules", rationale="a wider warp count")
    browser.wait_for(tab, "7 experiment(s), newest first")
    wait_for_tables(browser, tab, "0.9876", "a wider warp count")
    log = browser.open(server.url + "/log")  # (a tab in the background may not refresh: one at a time)
    wide(browser, log)
    browser.wait_for(log, "11 event(s), newest first")
    wait_for_tables(browser, log, "mm-replay finished: 1 winner", "queue entry", "M=64 N=8192 K=2048 bf16: ok")
    live.trial(fx.failed(fx.P2, fx.cfg(256, 64, 8, 5), fx.Status.COMPILE_ERROR, "PassManager::run failed"))
    browser.wait_for(log, "12 event(s), newest first")
    wait_for_tables(browser, log, "compile_error")


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("1", pytest.fail.Exception),
                                             ("", pytest.skip.Exception), ("false", pytest.skip.Exception)])
def test_a_missing_chromium_fails_under_ci_and_skips_elsewhere(monkeypatch, ci, outcome):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="Chromium is not installed"):
        chromium_binary()


def test_wait_for_reports_what_the_page_showed(browser: Chromium):
    tab = browser.open("about:blank")
    with pytest.raises(AssertionError, match="never showed"):
        browser.wait_for(tab, "not on a blank page", timeout=0.5)


# -- Hypotheses and knowledge graph ----------------------------------------------------------------

# Streamlit draws tables on a canvas; the rows in view are also written to an accessible <table>.
TABLES_JS = ("Array.from(document.querySelectorAll('[data-testid=\"stDataFrame\"] table'))"
             ".map(t => t.textContent).join('\\n')")
# Charts are SVGs: each mark carries an aria-label with its fields and values.
LABELS_JS = ("Array.from(document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] svg [aria-label]'))"
             ".map(p => p.getAttribute('aria-label'))")
# The graph is an SVG: each node is a path whose aria-label lists its fields, its id last.
NODES_JS = ("Array.from(document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] svg path[aria-label]'))"
            ".map(p => p.getAttribute('aria-label')).filter(a => a.includes('; id: '))")
NODE_CENTRE_JS = """(() => {
  const node = Array.from(document.querySelectorAll('[data-testid="stVegaLiteChart"] svg path[aria-label]'))
    .find(p => p.getAttribute('aria-label').endsWith('; id: %s'));
  if (!node) return null;
  if (%s) node.scrollIntoView({block: 'center'});
  const r = node.getBoundingClientRect();
  return [r.x + r.width / 2, r.y + r.height / 2];
})()"""


def wide(browser: Chromium, tab: str) -> None:
    """A wide window: tables write only the columns in view to their accessible <table>."""
    browser.send("Emulation.setDeviceMetricsOverride",
                 {"width": 2560, "height": 1400, "deviceScaleFactor": 1, "mobile": False}, tab)


def wait_for_labels(browser: Chromium, tab: str, *needles: str, timeout: float = WAIT_S) -> str:
    """Poll the charts' marks (their aria-labels: each mark's fields and values) until they hold every needle."""
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        seen = "\n".join(browser.eval(tab, LABELS_JS) or [])
        if all(n in seen for n in needles):
            return seen
        time.sleep(0.25)
    raise AssertionError(f"charts never showed {[n for n in needles if n not in seen]}; they show:\n{seen[:4000]}")


def wait_for_tables(browser: Chromium, tab: str, *needles: str, timeout: float = WAIT_S) -> str:
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        seen = browser.eval(tab, TABLES_JS) or ""
        if all(n in seen for n in needles):
            return seen
        time.sleep(0.25)
    raise AssertionError(f"tables never showed {[n for n in needles if n not in seen]}; they show:\n{seen}")


def node_centre(browser: Chromium, tab: str, node: str, *, scroll: bool = True) -> tuple[float, float]:
    """Where `node` is drawn, in the tab's viewport (scrolled into the middle of it first)."""
    xy = browser.eval(tab, NODE_CENTRE_JS % (node, "true" if scroll else "false"))
    assert xy, f"node {node} is not drawn"
    return float(xy[0]), float(xy[1])


def mouse(browser: Chromium, tab: str, xy: tuple[float, float], *events: str) -> None:
    for kind in events:
        browser.send("Input.dispatchMouseEvent", {"type": kind, "x": xy[0], "y": xy[1], "clickCount": 1,
                                                  "button": "none" if kind == "mouseMoved" else "left"}, tab)


@pytest.fixture
def ledger_server(tmp_path: Path) -> Iterator[tuple[Server, fx.Ledger]]:
    """A server on the ledger store; the test may write to the store while the page is open."""
    ledger = fx.build_ledger(tmp_path / "dash.db")
    port, log = free_port(), tmp_path / "server.log"
    with log.open("wb") as out:
        proc = launch.start(str(tmp_path / "dash.db"), port=port, output=out)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield Server(ledger.live, url, port), ledger
    finally:
        launch.stop(proc, timeout_s=15)
        ledger.live.store.close()


def test_hypotheses_page_shows_the_ledger_and_follows_a_new_verdict(ledger_server, browser: Chromium):
    server, ledger = ledger_server
    tab = browser.open(server.url + "/hypotheses")
    h = ledger.hypotheses["testing"]  # the one the drill-down opens first
    browser.wait_for(tab, "Active (2)", "Validated (1)", "Ruled out (1)", "Inconclusive (1)",
                     f"{h.id} · testing", h.text, "testing: 1 of 5 pairs measured",
                     "Effect (×)\n\n1.100", "Pairs (a faster)\n\n1 (1)", "Noise\n\n2.0 %",
                     "numbers: " + text.source("gpu", fx.DEVICE))
    wait_for_tables(browser, tab, *(x.text for x in ledger.hypotheses.values()))  # every statement, verbatim
    assert browser.eval(tab, "document.getElementById('injected') === null") is True
    browser.eval(tab, "window.__tilepilot_same_page = true")
    ledger.live.store.record_verdict(fx.Verdict(h.id, fx.HypothesisState.VALIDATED, 5, 5, 0, 1.1234, 1.0512, 1.2046,
                                                0.02, "validated: effect beyond the noise"))
    browser.wait_for(tab, "Active (1)", "Validated (2)", f"{h.id} · validated", "Effect (×)\n\n1.123",
                     "95% CI\n\n1.05–1.20", "Pairs (a faster)\n\n5 (5)")
    assert browser.eval(tab, "window.__tilepilot_same_page === true") is True


def test_graph_page_draws_the_store_zooms_and_opens_a_clicked_node(ledger_server, browser: Chromium):
    server, ledger = ledger_server
    tab = browser.open(server.url + "/graph")
    browser.send("Emulation.setDeviceMetricsOverride",
                 {"width": 1400, "height": 1200, "deviceScaleFactor": 1, "mobile": False}, tab)
    browser.wait_for(tab, "Learnings (1)", ledger.learning.id, *(h.id for h in ledger.hypotheses.values()))
    drawn = {label.rpartition("; id: ")[2] for label in browser.eval(tab, NODES_JS)}
    assert {f"hypothesis:{h.id}" for h in ledger.hypotheses.values()} | {f"learning:{ledger.learning.id}"} <= drawn
    assert {f"experiment:{k}" for pair in ledger.pairs["validated"] for k in pair[:2]} <= drawn

    hostile = node_centre(browser, tab, f"hypothesis:{ledger.hypotheses['proposed'].id}")
    mouse(browser, tab, hostile, "mouseMoved")
    tip = "(document.getElementById('vg-tooltip-element') || {}).textContent || ''"
    deadline = time.monotonic() + 10
    while fx.HOSTILE not in browser.eval(tab, tip) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fx.HOSTILE in browser.eval(tab, tip)  # the model's text, verbatim, as text
    mouse(browser, tab, hostile, "mousePressed", "mouseReleased")
    browser.wait_for(tab, f"model says {fx.HOSTILE}", "Evidence (0 pair(s): 0 support, 0 refute)")
    assert browser.eval(tab, "document.getElementById('injected') === null") is True

    target = f"hypothesis:{ledger.hypotheses['ruled_out'].id}"
    before = node_centre(browser, tab, target)
    browser.send("Input.dispatchMouseEvent", {"type": "mouseWheel", "x": before[0] + 60, "y": before[1] + 60,
                                              "deltaX": 0, "deltaY": -400}, tab)
    deadline = time.monotonic() + 10
    while node_centre(browser, tab, target, scroll=False) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    after = node_centre(browser, tab, target, scroll=False)
    assert after[0] < before[0] and after[1] < before[1]  # zoomed in about the pointer: the node moved away

    mouse(browser, tab, node_centre(browser, tab, target), "mouseMoved", "mousePressed", "mouseReleased")
    browser.wait_for(tab, ledger.hypotheses["ruled_out"].text, "Evidence (2 pair(s): 0 support, 2 refute)",
                     "ruled out: BLOCK_SIZE_M=128 is faster in every pair")


# -- a real campaign -------------------------------------------------------------------------------

# 12 configs per problem, in batches of 4: when the pause comes, the worker holds at most two
# batches (the one it runs and the next), and the rest is taken back, so the pause holds work back.
LIVE_RUN = """[campaign]
name = "live-run"
kernel = "matmul"
proposer = "random"
budget = 12
seed = 3

[[problems]]
M = 64
N = 48
K = 80
dtype = "fp16"

[[problems]]
M = 32
N = 64
K = 64
dtype = "fp16"
"""
RUN_TIMEOUT_S = 240


def poll(what: str, check: Any, timeout: float = RUN_TIMEOUT_S, proc: subprocess.Popen[bytes] | None = None,
         log: Path | None = None) -> Any:
    """Call `check` until it returns something true; fail naming `what` (and the campaign's output)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if proc is not None and proc.poll() is not None and not check():
            raise AssertionError(f"tilepilot tune exited with {proc.returncode} before {what}:\n"
                                 f"{log.read_text() if log else ''}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def store_figures(db: Path) -> tuple[str, str, list[str]] | None:
    """What the store says, through `storage.queries` (not the dashboard's own reads): the campaign's
    state, its trials done over its budget, and each problem's best so far as the page writes it."""
    from tilepilot.experiments import InputError
    from tilepilot.storage import queries
    try:
        with queries.open_db(db) as ro:
            found = [c for c in queries.campaigns(ro) if c.name == "live-run"]
    except InputError:  # not created (or not migrated) yet
        return None
    if not found:
        return None
    c = found[0]
    done = sum(min(p.counted, c.budget) for p in c.problems)
    best = [f"best {text.ms(p.best_ms)}" for p in c.problems if p.best_ms is not None]
    return c.state, f"{done}/{c.budget * len(c.problems)}", best


def in_flight(db: Path) -> int:
    from tilepilot.storage import queries
    with queries.open_db(db) as ro:
        return int(ro.rows("SELECT COUNT(*) AS n FROM queue WHERE state IN ('compiling', 'running')")[0]["n"])


def settled(db: Path, quiet_s: float = 1.5) -> bool:
    """Nothing compiles or runs, and the figures stay the same for `quiet_s`: the pause holds."""
    before = store_figures(db)
    if before is None or in_flight(db):
        return False
    time.sleep(quiet_s)
    return store_figures(db) == before and not in_flight(db)


@pytest.mark.slow  # Ray, the interpreter and a browser: about a minute on 2 cores
def test_overview_follows_a_campaign_that_tilepilot_tune_runs(tmp_path: Path, browser: Chromium):
    from tilepilot.storage import Store
    toml, db, tune_log = tmp_path / "live.toml", tmp_path / "live.db", tmp_path / "tune.log"
    toml.write_text(LIVE_RUN)
    with tune_log.open("wb") as out:
        tune = subprocess.Popen([sys.executable, "-m", "tilepilot", "tune", str(toml), "--backend", "interpret",
                                 "--db", str(db)], env=launch.child_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = None
    try:
        poll("the first two trials", lambda: (f := store_figures(db)) and int(f[1].split("/")[0]) >= 2,
             proc=tune, log=tune_log)
        with Store(db) as person:  # a person pauses it, as `tilepilot pause` does: the page must match the store
            person.set_control(person.get_campaign("live-run").id, "pause")  # type: ignore[union-attr]
        poll("the pause to hold", lambda: settled(db), proc=tune, log=tune_log)
        state, paused_at, best = store_figures(db)  # type: ignore[misc]
        port, server_log = free_port(), tmp_path / "server.log"
        with server_log.open("wb") as out:
            server = launch.start(str(db), port=port, output=out)
        wait_healthy(f"http://127.0.0.1:{port}", server, server_log)
        tab = browser.open(f"http://127.0.0.1:{port}/")
        browser.wait_for(tab, "live-run · running", f"Trials (done / budget)\n\n{paused_at}", *best,
                         text.source("interpret", "cpu"))
        browser.eval(tab, "window.__tilepilot_same_page = true")
        with Store(db) as person:
            person.set_control(person.get_campaign("live-run").id, "")  # type: ignore[union-attr]
        assert tune.wait(timeout=RUN_TIMEOUT_S) == 0, tune_log.read_text()
        state, finished_at, best = store_figures(db)  # type: ignore[misc]
        assert state == "finished" and finished_at == "24/24" and finished_at != paused_at
        browser.wait_for(tab, "live-run · finished", f"Trials (done / budget)\n\n{finished_at}", *best)
        assert browser.eval(tab, "window.__tilepilot_same_page === true") is True  # followed in place
    finally:
        if server is not None:
            launch.stop(server, timeout_s=15)
        if tune.poll() is None:
            os.killpg(tune.pid, signal.SIGTERM)
            tune.wait(timeout=60)
