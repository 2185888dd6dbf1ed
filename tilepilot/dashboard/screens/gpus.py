"""GPUs: one card per GPU of every node, from the NVML samples the workers store."""

from __future__ import annotations

import streamlit as st

from tilepilot.dashboard import charts, data, live
from tilepilot.dashboard.text import ago, md_escape, num, params
from tilepilot.storage.rows import QueueRow
from tilepilot.storage.views import GpuSampleRow

NO_GPU = "No GPU visible"
NO_GPU_WHY = (f"no NVML sample in the last {data.GPU_WINDOW_S / 60:.0f} minutes. GPU workers store "
              "one every few seconds while a campaign runs on the gpu backend; the interpret "
              "and replay backends use no GPU and store none.")


def _mem_label(s: GpuSampleRow) -> str:
    return "Memory" if s.mem_total_mb is None else f"Memory (of {s.mem_total_mb / 1024:.0f} GiB)"


def card(samples: list[GpuSampleRow], running: list[QueueRow]) -> None:
    last = samples[-1]
    with st.container(border=True):
        st.markdown(f"**GPU {last.gpu_index} · {md_escape(last.name)}** · node {md_escape(last.node)}")
        st.caption(f"{md_escape(last.gpu_uuid)} · last sample {ago(last.ts)}")
        cols = st.columns(5)
        cols[0].metric("Utilisation", num(last.util_pct, "%"))
        cols[1].metric(_mem_label(last), num(None if last.mem_used_mb is None else last.mem_used_mb / 1024,
                                             "GiB", 1))
        cols[2].metric("SM clock", num(last.sm_clock_mhz, "MHz"))
        cols[3].metric("Power", num(last.power_w, "W"))
        cols[4].metric("Temperature", num(last.temp_c, "°C"))
        left, right = st.columns([3, 2])
        with left:
            st.text(f"throttle: {last.throttle or 'none'}")
            st.text(f"worker: {last.worker or '—'}   now: {last.running or 'idle'}")
            for q in running:
                st.text(f"queue: {params(q.problem)} | {params(q.config)} ({q.state}, {q.proposer})")
        if len(samples) > 1:
            right.line_chart(charts.gpu_frame(samples), height=160)


def body() -> None:
    path = live.db()
    gpus = data.gpu_samples(path)
    if not gpus:
        st.info(f"{NO_GPU}: {NO_GPU_WHY}")
        return
    by_worker: dict[str, list[QueueRow]] = {}
    for q in data.queue_view(path, None).running:
        by_worker.setdefault(q.worker, []).append(q)
    st.caption(f"{len(gpus)} GPU(s) · NVML readings of the last {data.GPU_WINDOW_S / 60:.0f} minutes")
    for samples in gpus.values():
        worker = samples[-1].worker
        card(samples, by_worker.get(worker, []) if worker else [])


def main() -> None:
    st.title("GPUs")
    live.live(body)


main()
