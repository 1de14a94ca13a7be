"""LDS (local data share) access for DS instructions and LDS DMA.

Every workgroup of a batch has its own LDS slot of the descriptor's
group_segment_fixed_size bytes. Accesses beyond the allocation are faults in strict
mode; otherwise they behave as the hardware does (reads return 0, writes are dropped).

In-flight writes are tracked per byte so that strict mode can report races:
  * a DS write is visible to its own wave at once (DS ops of one wave execute in
    order) but to other waves only after its lgkmcnt retires;
  * an LDS DMA write (buffer/global load ... lds) lands when its vmcnt retires, and
    nobody may touch those bytes before that.
"""
from __future__ import annotations

import numpy as np

from .errors import MemoryFault


class LdsTracker:
    def __init__(self, slots: int, size: int):
        self.size = size
        n = max(size, 1)
        self.ds_pending = np.zeros((slots, n), np.int16)
        self.ds_owner = np.full((slots, n), -1, np.int32)
        self.dma_pending = np.zeros((slots, n), np.int16)


def _flat(ex, w, addr: np.ndarray, nbytes: int, mask: np.ndarray, what: str):
    """Validate [n,64] byte addresses of `nbytes`-wide accesses; returns (slot, index, ok).

    index: [n,64,nbytes] byte indices into the slot (0 where not ok); ok: [n,64] lanes
    that are active and in range.
    """
    waves = ex.wave_ids(w)
    size = ex.waves.lds_bytes
    addr = addr.astype(np.int64)
    in_range = (addr >= 0) & (addr + nbytes <= size)
    bad = mask & ~in_range
    if bad.any() and ex.strict:
        row, lane = np.argwhere(bad)[0]
        raise MemoryFault(f"{what} of {nbytes} B at LDS address {int(addr[row, lane]):#x} (lane {lane}) is "
                          f"outside the workgroup's {size} B allocation ({ex.where(int(waves[row]))})")
    ok = mask & in_range
    index = np.where(ok[:, :, None], addr[:, :, None] + np.arange(nbytes), 0)
    slot = ex.waves.slot[waves][:, None, None]
    return slot, index, ok


def _check_pending(ex, w, slot, index, ok, what: str, same_wave_ok: bool):
    lds = ex.lds
    if not ex.strict:
        return
    waves = ex.wave_ids(w)
    dma = (lds.dma_pending[slot, index] > 0) & ok[:, :, None]
    if dma.any():
        row = int(np.argwhere(dma)[0][0])
        ex.hazard(w, dma.any(axis=(1, 2)), f"{what} touches LDS bytes an LDS DMA load has not yet "
                                           f"written (missing s_waitcnt vmcnt)")
    pend = (lds.ds_pending[slot, index] > 0) & ok[:, :, None]
    if same_wave_ok:
        pend &= lds.ds_owner[slot, index] != waves[:, None, None]
    if pend.any():
        ex.hazard(w, pend.any(axis=(1, 2)), f"{what} touches LDS bytes another wave wrote without "
                                            f"s_waitcnt lgkmcnt(0) + s_barrier in between")


def read(ex, w, addr: np.ndarray, nbytes: int, mask: np.ndarray, what: str) -> np.ndarray:
    """uint8[n,64,nbytes] read at issue; inactive or (non-strict) out-of-range lanes read 0."""
    slot, index, ok = _flat(ex, w, addr, nbytes, mask, what)
    _check_pending(ex, w, slot, index, ok, what, same_wave_ok=True)
    data = ex.waves.lds[slot, index]
    return np.where(ok[:, :, None], data, 0).astype(np.uint8)


def write(ex, w, addr: np.ndarray, data: np.ndarray, mask: np.ndarray, what: str):
    """Write uint8[n,64,nbytes] now and mark it in flight until the lgkmcnt retires.

    Returns a `release(rows)` callable for the pending op. Lanes are applied in lane
    order, so the highest active lane wins where addresses collide.
    """
    nbytes = data.shape[2]
    slot, index, ok = _flat(ex, w, addr, nbytes, mask, what)
    _check_pending(ex, w, slot, index, ok, what, same_wave_ok=True)
    sel = np.broadcast_to(ok[:, :, None], index.shape)
    slots = np.broadcast_to(slot, index.shape)
    ex.waves.lds[slots[sel], index[sel]] = data[sel]
    waves = np.broadcast_to(ex.wave_ids(w)[:, None, None], index.shape)
    lds = ex.lds
    np.add.at(lds.ds_pending, (slots[sel], index[sel]), 1)
    lds.ds_owner[slots[sel], index[sel]] = waves[sel]
    marks = (slots, index, sel)

    def release(rows):
        s, i, m = (a[rows] for a in marks)
        np.add.at(lds.ds_pending, (s[m], i[m]), -1)
    return release


def dma_reserve(ex, w, addr: np.ndarray, nbytes: int, mask: np.ndarray, what: str):
    """Mark LDS DMA destination bytes in flight; returns (land(rows, data), valid lanes)."""
    slot, index, ok = _flat(ex, w, addr, nbytes, mask, what)
    _check_pending(ex, w, slot, index, ok, what, same_wave_ok=False)
    sel = np.broadcast_to(ok[:, :, None], index.shape)
    slots = np.broadcast_to(slot, index.shape)
    lds = ex.lds
    np.add.at(lds.dma_pending, (slots[sel], index[sel]), 1)

    def land(rows, data):
        s, i, m = slots[rows], index[rows], sel[rows]
        ex.waves.lds[s[m], i[m]] = data[rows][m]
        np.add.at(lds.dma_pending, (s[m], i[m]), -1)
    return land
