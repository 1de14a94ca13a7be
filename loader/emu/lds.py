"""LDS (local data share) access for DS instructions and LDS DMA.

Every workgroup of a batch has its own LDS slot of the descriptor's
group_segment_fixed_size bytes. Accesses beyond the allocation are faults in strict
mode; otherwise they behave as the hardware does (reads return 0, writes are dropped).

In-flight writes are tracked per byte so that strict mode can report races:
  * a DS write is visible to its own wave at once (DS ops of one wave execute in
    order) but to other waves only after its lgkmcnt retires;
  * an LDS DMA write (buffer/global load ... lds) lands when its vmcnt retires, and
    nobody may touch those bytes before that;
  * across waves, an access is ordered after another wave's only through s_barrier.
    Each wave counts the barriers it has reached (its epoch, advanced by hazards.py at
    s_barrier). A write is complete when its lgkmcnt (DS) or vmcnt (DMA) retires, at the
    writer's epoch then; another wave may read or overwrite those bytes only from a later
    epoch, i.e. after `s_waitcnt lgkmcnt(0)` then `s_barrier` on the writer's side. A wave
    may overwrite bytes another wave read only from an epoch after that read (the read is
    taken at issue, so a reader need not wait for its own lgkmcnt before the barrier).
    Accesses by waves that run in lockstep here are checked the same way, so a missing
    barrier is caught whatever order the scheduler happens to pick.
"""
from __future__ import annotations

import numpy as np

from .errors import MemoryFault


_PENDING = np.iinfo(np.int32).max      # w_epoch of a write whose counter has not retired
_SEVERAL = -2                            # reader mark: more than one wave read in that epoch


class LdsTracker:
    def __init__(self, slots: int, size: int, waves: int = 0, strict: bool = True):
        self.size = size
        n = max(size, 1)
        self.ds_pending = np.zeros((slots, n), np.int16)
        self.ds_owner = np.full((slots, n), -1, np.int32)
        self.dma_pending = np.zeros((slots, n), np.int16)
        # Cross-wave ordering (strict mode only): barrier epochs per wave; per byte the
        # last writer (wave in its workgroup) and the epoch its write completed in, the last
        # reader and its epoch.
        self.ordered = strict
        self.epoch = np.zeros(max(waves, 1), np.int32)
        if strict:
            self.writer = np.full((slots, n), -1, np.int8)
            self.w_epoch = np.full((slots, n), -1, np.int32)
            self.reader = np.full((slots, n), -1, np.int8)
            self.r_epoch = np.full((slots, n), -1, np.int32)
            self._scratch = np.zeros(slots * n, np.int8)
            self._flag = np.zeros(slots * n, bool)

    def arrive(self, waves: np.ndarray) -> None:
        """s_barrier: the waves enter their next epoch."""
        self.epoch[waves] += 1

    def several(self, slots, index, waves) -> np.ndarray:
        """bool per element: its byte is also touched by another wave in this access."""
        key = slots * self.ds_pending.shape[1] + index
        self._scratch[key] = waves
        other = self._scratch[key] != waves
        if not other.any():
            return other
        self._flag[key[other]] = True
        out = self._flag[key]
        self._flag[key] = False
        return out


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


def _first(flags, index):
    """(row, lane, LDS address) of the first set element of bool[n,64,nbytes] `flags`."""
    row, lane, b = np.argwhere(flags)[0]
    return int(row), int(lane), int(index[row, lane, b])


def _check_pending(ex, w, slot, index, ok, what: str, same_wave_ok: bool):
    lds = ex.lds
    if not ex.strict:
        return
    waves = ex.wave_ids(w)
    dma = (lds.dma_pending[slot, index] > 0) & ok[:, :, None]
    if dma.any():
        row, lane, addr = _first(dma, index)
        ex.hazard(w, dma.any(axis=(1, 2)), f"{what} touches LDS address {addr:#x} (lane {lane}) before "
                                           f"the LDS DMA load writing it has landed (missing s_waitcnt vmcnt)")
    pend = (lds.ds_pending[slot, index] > 0) & ok[:, :, None]
    if same_wave_ok:
        pend &= lds.ds_owner[slot, index] != waves[:, None, None]
    if pend.any():
        row, lane, addr = _first(pend, index)
        ex.hazard(w, pend.any(axis=(1, 2)), f"{what} touches LDS address {addr:#x} (lane {lane}) that another "
                                            f"wave wrote without s_waitcnt lgkmcnt(0) + s_barrier in between")


def _check_order(ex, w, slot, index, ok, what: str, write: bool):
    """Cross-wave ordering through s_barrier (see the module docstring); marks reads."""
    lds = ex.lds
    if not (ex.strict and lds.ordered):
        return
    waves = ex.wave_ids(w)
    me = ex.waves.wave_in_group[waves].astype(np.int8)[:, None, None]
    mine = lds.epoch[waves][:, None, None]
    sel = np.broadcast_to(ok[:, :, None], index.shape)
    slots = np.broadcast_to(slot, index.shape)
    verb = "writes" if write else "reads"
    wr = lds.writer[slot, index]
    raw = sel & (wr >= 0) & (wr != me) & (lds.w_epoch[slot, index] >= mine)
    if raw.any():
        row, lane, addr = _first(raw, index)
        ex.hazard(w, raw.any(axis=(1, 2)),
                  f"{what} {verb} LDS address {addr:#x} (lane {lane}), which wave "
                  f"{int(wr[raw][0])} of the workgroup wrote, with no "
                  f"s_waitcnt lgkmcnt(0) + s_barrier in between (LDS race)")
    several = None
    if len(waves) > 1:
        several = lds.several(slots[sel], index[sel], np.broadcast_to(me, index.shape)[sel])
        if write and several.any():
            flags = np.zeros(index.shape, bool)
            flags[sel] = several
            row, lane, addr = _first(flags, index)
            ex.hazard(w, flags.any(axis=(1, 2)),
                      f"{what}: several waves write LDS address {addr:#x} (lane {lane}) with no "
                      f"s_barrier between them (LDS race)")
    s, i = slots[sel], index[sel]
    me_e = np.broadcast_to(me, index.shape)[sel]
    ep = np.broadcast_to(mine, index.shape)[sel]
    if write:
        rd = lds.reader[slot, index]
        war = sel & (rd != -1) & (rd != me) & (lds.r_epoch[slot, index] >= mine)
        if war.any():
            row, lane, addr = _first(war, index)
            r = int(rd[war][0])
            who = "other waves" if r < 0 else f"wave {r}"
            ex.hazard(w, war.any(axis=(1, 2)),
                      f"{what} overwrites LDS address {addr:#x} (lane {lane}), which {who} of the "
                      f"workgroup read, with no s_barrier in between (LDS race)")
        lds.writer[s, i] = me_e
        lds.w_epoch[s, i] = _PENDING
    else:
        old_r, old_e = lds.reader[s, i], lds.r_epoch[s, i]
        new_r = np.where((old_e == ep) & (old_r != -1) & (old_r != me_e), _SEVERAL, me_e)
        if several is not None:
            new_r = np.where(several, _SEVERAL, new_r)
        lds.reader[s, i] = np.where(old_e > ep, old_r, new_r)
        lds.r_epoch[s, i] = np.maximum(old_e, ep)


def _complete(ex, waves, s, i):
    """The writes of `waves` (one per element) to bytes (s, i) are now complete."""
    lds = ex.lds
    if not (ex.strict and lds.ordered):
        return
    still = lds.writer[s, i] == ex.waves.wave_in_group[waves]
    lds.w_epoch[s[still], i[still]] = lds.epoch[waves[still]]


def read(ex, w, addr: np.ndarray, nbytes: int, mask: np.ndarray, what: str) -> np.ndarray:
    """uint8[n,64,nbytes] read at issue; inactive or (non-strict) out-of-range lanes read 0."""
    slot, index, ok = _flat(ex, w, addr, nbytes, mask, what)
    _check_pending(ex, w, slot, index, ok, what, same_wave_ok=True)
    _check_order(ex, w, slot, index, ok, what, write=False)
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
    _check_order(ex, w, slot, index, ok, what, write=True)
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
        _complete(ex, waves[rows][m], s[m], i[m])
    return release


def dma_reserve(ex, w, addr: np.ndarray, nbytes: int, mask: np.ndarray, what: str):
    """Mark LDS DMA destination bytes in flight; returns (land(rows, data), valid lanes)."""
    slot, index, ok = _flat(ex, w, addr, nbytes, mask, what)
    _check_pending(ex, w, slot, index, ok, what, same_wave_ok=False)
    _check_order(ex, w, slot, index, ok, what, write=True)
    sel = np.broadcast_to(ok[:, :, None], index.shape)
    slots = np.broadcast_to(slot, index.shape)
    waves = np.broadcast_to(ex.wave_ids(w)[:, None, None], index.shape)
    lds = ex.lds
    np.add.at(lds.dma_pending, (slots[sel], index[sel]), 1)

    def land(rows, data):
        s, i, m = slots[rows], index[rows], sel[rows]
        ex.waves.lds[s[m], i[m]] = data[rows][m]
        np.add.at(lds.dma_pending, (s[m], i[m]), -1)
        _complete(ex, waves[rows][m], s[m], i[m])
    return land
