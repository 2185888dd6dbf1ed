"""One-sentence reasons for the `rules` proposer, from the tile model's estimate."""

from __future__ import annotations

from tilepilot.agents.roofline import Device, Roofline
from tilepilot.agents.tile_model import Estimate

LIMITS = {
    "compute": "tensor-core bound",
    "feed": "operand-feed bound",
    "dram": "DRAM bound",
    "launch": "launch-overhead bound",
    "resources": "cannot launch",
}


def describe(est: Estimate, roofline: Roofline | None, device: Device) -> str:
    """E.g. '128×128×64 tiles, 4 warps: 1024 tiles = 7.8 waves on 132 SMs; 3 stages fit in 96 KiB ...'."""
    t = est.tile
    parts = [f"{t.label()} tiles, {t.warps} warps: {est.tiles} tiles = {est.waves:.1f} waves on "
             f"{device.sms} SMs ({est.blocks_per_sm} block{'s' if est.blocks_per_sm != 1 else ''}/SM)"]
    kib = est.shared_bytes / 1024
    fit = "fit in" if est.shared_bytes <= device.smem_per_block else "need"
    parts.append(f"{t.stages} stages {fit} {kib:.0f} KiB of {device.smem_per_block // 1024}")
    if est.spilled_regs > 0:
        parts.append(f"~{est.regs:.0f} regs/thread ({est.acc_regs:.0f} accumulator) spill "
                     f"~{est.spilled_regs:.0f} over {device.max_regs_per_thread}")
    elif est.regs > device.max_regs_per_thread:
        parts.append(f"~{est.regs:.0f} regs/thread ({est.acc_regs:.0f} accumulator): "
                     f"~{est.regs - device.max_regs_per_thread:.0f} load addresses spill and are reloaded")
    else:
        parts.append(f"{est.acc_regs:.0f} accumulator regs/thread, no spill")
    if est.scalar_operands:
        parts.append(f"row stride not a multiple of 16: loads of {est.scalar_operands} not vectorised")
    if est.waste >= 0.05:
        parts.append(f"padding wastes {100 * est.waste:.0f}% of the MMA work")
    if roofline is not None:
        parts.append(f"problem {roofline.bound}-bound ({roofline.intensity:.0f} FLOP/B vs ridge "
                     f"{roofline.ridge:.0f}), config {LIMITS[est.limit]}")
    return "; ".join(parts)
