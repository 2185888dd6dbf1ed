"""Screenshots of every dashboard page, taken in headless Chromium against the real server.

    .venv/bin/python bench/screenshots.py --db PATH [--out docs/img] [--width 1400] [--height 900]
                                          [--pages overview gpus queue experiments hypotheses graph log]

PATH (also accepted as the first argument) is any store `tilepilot tune` wrote (for the README:
a gpu campaign's store; a replay or interpret one works the same). It is copied to a
temporary folder first, so the original is never touched (it may lie in a read-only place),
and the copy is brought to the current schema (a store written by an older tilepilot).
The dashboard serves the copy on 127.0.0.1 at a free port; Chromium (Debian's `chromium`)
opens each page over the DevTools pipe (see tests/test_dashboard_browser.py), waits for the
page's own content (not the loading skeleton), lets the charts draw, on the knowledge graph
clicks a validated hypothesis to open its details, grows the window to the page's full height
and writes `OUT/dashboard-<page>.png`, optimised to stay under `MAX_BYTES`.

The GPUs page shows the NVML samples of the last 5 minutes; for a store older than that it says
no GPU is visible now and draws the last 5 minutes of samples the store holds.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_dashboard_browser import Chromium, free_port, wait_healthy  # noqa: E402
from tilepilot.dashboard import launch  # noqa: E402
from tilepilot.storage import Store  # noqa: E402

log = logging.getLogger("screenshots")

MAX_BYTES = 250_000
SETTLE_S = 3.0  # after the content shows: charts draw, fragments finish their first run
# url path, and text that only the rendered page shows (any one of each tuple is enough)
PAGES = {
    "overview": ("/", ("Best so far vs trials", "No campaign in this database")),
    "gpus": ("/gpus", ("NVML readings of the last", "No GPU visible")),
    "queue": ("/queue", ("Recently done",)),
    "experiments": ("/experiments", ("Details of", "No experiment matches")),
    "hypotheses": ("/hypotheses", ("Drill down", "No hypothesis yet")),
    "graph": ("/graph", ("Learnings (", "No campaign in this database")),
    "log": ("/log", ("newest first",)),
}
# pages shown with one node of their chart opened: (texts of a node's label, the first found opened;
# text its details show): a validated hypothesis, else any hypothesis
OPEN_NODE = {"graph": (("result: validated", "kind: hypothesis"), "Verdict history")}
NODE_JS = """(() => {
  const node = Array.from(document.querySelectorAll('[data-testid="stVegaLiteChart"] svg path[aria-label]'))
    .find(p => p.getAttribute('aria-label').includes(%s));
  if (!node) return null;
  node.scrollIntoView({block: 'center'});
  const r = node.getBoundingClientRect();
  return [r.x + r.width / 2, r.y + r.height / 2];
})()"""
TO_TOP_JS = ("window.scrollTo(0, 0); document.querySelectorAll('main, section, div')"
             ".forEach(e => { if (e.scrollTop) e.scrollTop = 0; })")
# the bottom of the page's lowest element (the block container itself ends in a tall padding)
MAIN_HEIGHT_JS = ("Math.ceil(Math.max(...Array.from(document.querySelectorAll("
                  "'[data-testid=\"stMainBlockContainer\"] [data-testid=\"stElementContainer\"]'))"
                  ".map(e => e.getBoundingClientRect().bottom)) + 40)")


def copy_db(db: Path, folder: Path) -> Path:
    """The database and its WAL side files, copied (writable) into `folder`."""
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{db}{suffix}")
        if src.exists():
            shutil.copyfile(src, folder / f"{db.name}{suffix}")
    return folder / db.name


def wait_any(browser: Chromium, tab: str, needles: tuple[str, ...], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = browser.text(tab)
        if any(n in shown for n in needles):
            return
        time.sleep(0.25)
    raise RuntimeError(f"page never showed any of {needles}; it shows:\n{browser.text(tab)}")


def viewport(browser: Chromium, tab: str, width: int, height: int) -> None:
    browser.send("Emulation.setDeviceMetricsOverride",
                 {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, tab)


def shrink(png: bytes, limit: int = MAX_BYTES) -> bytes:
    """The screenshot re-encoded with optimize=True; quantised to fewer colours if still too big."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    for colours in (None, 256, 128, 64):
        out = io.BytesIO()
        img = image if colours is None else image.quantize(colours, method=Image.Quantize.MEDIANCUT)
        img.save(out, format="PNG", optimize=True)
        if out.tell() <= limit:
            return out.getvalue()
    raise RuntimeError(f"screenshot is {out.tell()} bytes even at 64 colours (limit {limit})")


def open_node(browser: Chromium, tab: str, labels: tuple[str, ...], shows: str) -> None:
    """Click the first chart node whose label holds the first of `labels` any node's label holds,
    as a user would, and wait for `shows`."""
    xy = next((found for label in labels if (found := browser.eval(tab, NODE_JS % json.dumps(label))) is not None),
              None)
    if xy is None:
        log.warning("no node labelled any of %r to open: the page is taken as it is", labels)
        return
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
        browser.send("Input.dispatchMouseEvent", {"type": kind, "x": xy[0], "y": xy[1], "clickCount": 1,
                                                  "button": "none" if kind == "mouseMoved" else "left"}, tab)
    wait_any(browser, tab, (shows,))
    browser.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": 1, "y": 1}, tab)  # the tooltip goes
    browser.eval(tab, TO_TOP_JS)


def capture(browser: Chromium, url: str, needles: tuple[str, ...], width: int, height: int,
            full: bool, node: tuple[tuple[str, ...], str] | None = None) -> bytes:
    tab = browser.open(url)
    viewport(browser, tab, width, height)
    wait_any(browser, tab, needles)
    time.sleep(SETTLE_S)
    if node is not None:
        open_node(browser, tab, *node)
        time.sleep(SETTLE_S)
    if full:
        tall = max(height, int(browser.eval(tab, MAIN_HEIGHT_JS) or height))
        if tall > height:
            viewport(browser, tab, width, tall)
            time.sleep(SETTLE_S)
    shot = browser.send("Page.captureScreenshot", {"format": "png"}, tab)
    target = browser.send("Target.getTargetInfo", {}, tab)["targetInfo"]["targetId"]
    browser.send("Target.closeTarget", {"targetId": target})  # its live refresh stops too
    return base64.b64decode(shot["data"])


def run(db: Path, out: Path, pages: list[str], width: int, height: int, full: bool) -> None:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        raise SystemExit("Chromium is not installed (apt-get install -y chromium)")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tilepilot-shots-") as tmp:
        folder = Path(tmp)
        store = copy_db(db, folder)
        Store(store).close()  # migrates the copy; the dashboard itself only reads
        port, server_log = free_port(), folder / "server.log"
        with server_log.open("wb") as sink:
            proc = launch.start(str(store), port=port, output=sink)
        browser = None
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, proc, server_log)
            browser = Chromium(binary, folder / "chromium-profile")
            for page in pages:
                path, needles = PAGES[page]
                png = shrink(capture(browser, url + path, needles, width, height, full, OPEN_NODE.get(page)))
                target = out / f"dashboard-{page}.png"
                target.write_bytes(png)
                log.info("%s: %d bytes", target, len(png))
        finally:
            if browser is not None:
                browser.close()
            launch.stop(proc)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("db_arg", nargs="?", type=Path, metavar="DB", help="the same as --db")
    parser.add_argument("--db", type=Path, help="the store to take the pages of (it is copied, never changed)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=900)
    parser.add_argument("--pages", nargs="+", choices=list(PAGES), default=list(PAGES))
    parser.add_argument("--viewport-only", action="store_true", help="no full-page capture")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    db = args.db or args.db_arg
    if db is None:
        parser.error("give the store: --db PATH")
    if not db.is_file():
        raise SystemExit(f"database {db} does not exist")
    run(db, args.out, args.pages, args.width, args.height, not args.viewport_only)


if __name__ == "__main__":
    main()
