"""GPUs: one card per GPU of every node, from the NVML samples the workers store, with what each runs now.

What a GPU runs is read from the queue: the rows compiling or running with the GPU's worker
name (the worker a sample names). Where the queue names no worker, the sample's own note of
what it runs is shown instead; rows running on a worker no sample names are listed at the end.
"""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from tilepilot.dashboard import data, live
from tilepilot.dashboard.reads import QueueEntry
from tilepilot.dashboard.text import ago, md_escape, num, params
from tilepilot.storage.views import GpuSampleRow

NO_GPU = "No GPU visible"
NO_GPU_WHY = (f"no NVML sample in the last {data.GPU_WINDOW_S / 60:.0f} minutes. GPU workers store "
              "one every few seconds while a campaign runs on the gpu backend; the interpret "
              "and replay backends use no GPU and store none.")
PER_ROW = 2
READINGS_PER_ROW = 3
# label, unit, digits, how to read the value from a sample
READINGS: tuple[tuple[str, str, int, Callable[[GpuSampleRow], float | None]], ...] = (
    ("Utilisation", "%", 0, lambda s: s.util_pct),
    ("Memory", "GiB", 1, lambda s: None if s.mem_used_mb is None else s.mem_used_mb / 1024),
    ("SM clock", "MHz", 0, lambda s: s.sm_clock_mhz),
    ("Power", "W", 0, lambda s: s.power_w),
    ("Temperature", "°C", 0, lambda s: s.temp_c),
)


def _label(label: str, last: GpuSampleRow) -> str:
    if label == "Memory" and last.mem_total_mb is not None:
        return f"Memory (of {last.mem_total_mb / 1024:.0f} GiB)"
    return label


def throttling(samples: list[GpuSampleRow]) -> str:
    """'none', or the reasons now and how often the window saw any."""
    hit = [s for s in samples if s.throttle]
    last = samples[-1].throttle
    if not hit:
        return "throttle: none"
    now = f"throttle: {last}" if last else "throttle: none now"
    reasons = sorted({r.strip() for s in hit for r in s.throttle.split(",") if r.strip()})
    return f"{now} (throttled in {len(hit)} of {len(samples)} samples: {', '.join(reasons)})"


def doing(q: QueueEntry, campaigns: dict[int, str]) -> str:
    since = f", {q.state} for {ago(q.started_at).removesuffix(' ago')}" if q.started_at else f", {q.state}"
    return (f"now: {campaigns.get(q.campaign_id, str(q.campaign_id))} | {params(q.problem)} | {params(q.config)} "
            f"({q.proposer}{since})")


def card(samples: list[GpuSampleRow], running: list[QueueEntry], campaigns: dict[int, str]) -> None:
    last = samples[-1]
    with st.container(border=True):
        st.markdown(f"**GPU {last.gpu_index} · {md_escape(last.name)}** · node {md_escape(last.node)}")
        st.caption(f"{md_escape(last.gpu_uuid)} · last sample {ago(last.ts)} · {len(samples)} sample(s) drawn")
        for row in range(0, len(READINGS), READINGS_PER_ROW):  # rows of three: a half-width card fits them
            cols = st.columns(READINGS_PER_ROW)
            for col, (label, unit, digits, read) in zip(cols, READINGS[row:row + READINGS_PER_ROW], strict=False):
                values = [v for v in (read(s) for s in samples) if v is not None]
                col.metric(_label(label, last), num(read(last), unit, digits),
                           chart_data=values if len(values) > 1 else None, chart_type="line")
        st.text(throttling(samples))
        st.text(f"worker: {last.worker or '—'}")
        if running:
            for q in running:
                st.text(doing(q, campaigns))
        else:
            st.text(f"now: {last.running or 'idle'}")


def body() -> None:
    path = live.db()
    gpus, when = data.gpu_samples(path), "last"
    if not gpus:
        gpus, when = data.last_gpu_samples(path), "last recorded"
        if not gpus:
            st.info(f"{NO_GPU}: {NO_GPU_WHY}")
            return
        newest = max(samples[-1].ts for samples in gpus.values())
        st.info(f"{NO_GPU} now: {NO_GPU_WHY} Below: the last readings the store holds, up to "
                f"{ago(newest)}.")
    by_worker: dict[str, list[QueueEntry]] = {}
    for q in data.running(path):
        by_worker.setdefault(q.worker, []).append(q)
    campaigns = {c.id: c.name for c in data.campaigns(path)}
    nodes: dict[str, list[list[GpuSampleRow]]] = {}
    for samples in gpus.values():
        nodes.setdefault(samples[-1].node, []).append(samples)
    st.caption(f"{len(gpus)} GPU(s) on {len(nodes)} node(s) · NVML readings of the {when} "
               f"{data.GPU_WINDOW_S / 60:.0f} minutes, drawn under each reading")
    seen: set[str] = set()
    for node, cards in sorted(nodes.items()):
        st.subheader(f"Node {md_escape(node)} · {len(cards)} GPU(s)")
        cards.sort(key=lambda s: (s[-1].gpu_index, s[-1].gpu_uuid))
        for i in range(0, len(cards), PER_ROW):
            cols = st.columns(PER_ROW)
            for col, samples in zip(cols, cards[i:i + PER_ROW], strict=False):
                worker = samples[-1].worker
                seen.add(worker)
                with col:
                    card(samples, by_worker.get(worker, []) if worker else [], campaigns)
    elsewhere = [q for w, rows in by_worker.items() if w not in seen for q in rows]
    if elsewhere:
        st.subheader(f"Running on no GPU shown above ({len(elsewhere)})")
        st.caption("queue rows compiling or running whose worker (if any) stored no NVML sample in the window")
        for q in elsewhere:
            st.text(f"worker {q.worker or '(not recorded)'}: " + doing(q, campaigns).removeprefix("now: "))


def main() -> None:
    st.title("GPUs")
    live.live(body)


main()
