"""Emulator backend: runs a built `.co` on CPU tensors through gfxasm.emu.

Strict mode is on: a register read while its load is still in flight, or a missing wait
state, is an error rather than a silently different answer.

GFXASM_EMU_JOBS=N in the environment runs each launch's workgroups in N processes (0: one
per core; unset: 1), with the serial run's results (gfxasm.emu.parallel). A kernel whose
workgroups wait on each other (kernels.yaml `schedule: concurrent`) runs under the emulator's
concurrent schedule (gfxasm.emu.concurrent) in one process whatever GFXASM_EMU_JOBS says: the
waiting workgroups need the ones they wait for live beside them.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Sequence

import torch


@functools.lru_cache(maxsize=64)
def _module(co_path: Path, mtime_ns: int, size: int):
    # Keyed by mtime and size as well, so a rebuilt .co is decoded afresh.
    from .. import emu   # imported on first use: a HIP-only process never pays for it
    return emu.load(co_path)


def launch(co_path: Path, symbol: str, grid: tuple[int, int, int], block: tuple[int, int, int],
           kernarg: bytes, tensors: Sequence[torch.Tensor], schedule: str = "serial"):
    """Run the kernel to completion; returns the emulator's LaunchResult. `schedule` is the
    manifest kernel's ("serial" or "concurrent")."""
    stat = co_path.stat()
    kernel = _module(co_path, stat.st_mtime_ns, stat.st_size).kernel(symbol)
    if schedule == "concurrent":
        return kernel.launch(grid=grid, block=block, kernarg=kernarg, buffers=list(tensors), strict=True,
                             schedule="concurrent")
    return kernel.launch(grid=grid, block=block, kernarg=kernarg, buffers=list(tensors), strict=True,
                         jobs=jobs())


def jobs() -> int:
    """GFXASM_EMU_JOBS as the launch's jobs argument (unset or empty: 1)."""
    value = os.environ.get("GFXASM_EMU_JOBS", "").strip()
    if not value:
        return 1
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"GFXASM_EMU_JOBS must be an integer (0: one process per core), got {value!r}") from None
