"""LDS (local data share) access for DS instructions and LDS DMA.

Every workgroup of a batch has its own LDS slot of the descriptor's
group_segment_fixed_size bytes. Accesses beyond the allocation are faults in strict
mode; otherwise they behave as the hardware does (reads return 0, writes are dropped).

In-flight writes are tracked so that strict mode can report races:
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
  * one exception: an LDS DMA write of whole dwords over another LDS DMA write of whole
    dwords that lands the same bytes there (pending or landed, no other write between) is
    not a race: whichever lands last, LDS ends the same. aiter's hardware-proven FMHA
    backward has two waves load the same LSE/D row into the same LDS bytes this way
    (docs/conformance.md F6). The bytes compared are those each DMA read at issue (the
    emulator's load semantics: a store racing with the DMA's source read is not
    modelled); different bytes, sub-dword DMAs and DS writes keep the rule.

The race bookkeeping is kept per dword of LDS (data moves byte-exactly): sub-dword
writes by two waves to different bytes of one dword without a barrier between them are
reported as a race, which is stricter than the hardware needs.
"""
from __future__ import annotations

import numpy as np

from .errors import MemoryFault


_PENDING = np.iinfo(np.int32).max      # w_epoch of a write whose counter has not retired
_SEVERAL = -2                            # reader mark: more than one wave read in that epoch


class LdsTracker:
    def __init__(self, slots: int, size: int, waves: int = 0, strict: bool = True):
        self.size = size
        self.dwords = max((size + 3) // 4, 1)     # tracked units per slot
        n = slots * self.dwords
        self.ds_pending = np.zeros(n, np.int16)
        self.ds_owner = np.full(n, -1, np.int32)
        self.dma_pending = np.zeros(n, np.int16)
        # Cross-wave ordering (strict mode only): barrier epochs per wave; per dword the
        # last writer (wave in its workgroup) and the epoch its write completed in, the last
        # reader and its epoch.
        self.ordered = strict
        self.epoch = np.zeros(max(waves, 1), np.int32)
        if strict:
            self.writer = np.full(n, -1, np.int8)
            self.w_epoch = np.full(n, -1, np.int32)
            self.reader = np.full(n, -1, np.int8)
            self.r_epoch = np.full(n, -1, np.int32)
            self._scratch = np.zeros(n, np.int8)
            self._flag = np.zeros(n, bool)
            self._last = None      # int32[n] scratch of the fast marks, made on first use
            self.reads = []        # deferred reader marks (defer, settle)
            # per dword: the last write was a whole-dword LDS DMA, and the value the last
            # such DMA reserved (what it lands)
            self.by_dma = np.zeros(n, bool)
            self.dma_value = np.zeros(n, np.uint32)
            self._values = np.zeros(n, np.uint32)

    # Deferred reader marks: at most this many reads wait in self.reads before all settle.
    MAX_DEFERRED = 32

    def defer(self, fast, addr: np.ndarray, slots: np.ndarray, per: int, lo: np.ndarray, hi: np.ndarray,
              me: np.ndarray, mine: np.ndarray, slot_of: np.ndarray) -> None:
        """Keep the reader marks of a read whose checks passed (fast.read_dwords: row r, in
        slot slots[r], read `per` dwords from each byte address addr[r, l], keys lo[r]..hi[r],
        as wave_in_group me[r] at epoch mine[r]) for settle().
        A read's marks join one (epoch, reader) pair into each dword's (r_epoch, reader):
        the later epoch wins, at equal epochs two different readers make SEVERAL (for the
        pair: the access's last element on the dword, SEVERAL where two of its waves read
        it). Joins commute, so settle() may mark deferred reads in any order."""
        self._fast = fast
        self.reads.append((addr, slots, per, lo, hi, me, mine, int(mine.max())))
        if len(self.reads) > self.MAX_DEFERRED:
            self.settle(slot_of)

    def settle(self, slot_of: np.ndarray, keys2: np.ndarray | None = None) -> None:
        """Apply the deferred reader marks (fast.mark_reads) that an access to keys2 [n, m]
        (None: to any dword) may consult; call before anything consults reader or r_epoch.
        A read none of whose rows' key ranges meets the access's range in that workgroup
        stays deferred. A read whose every row is at an epoch below S, the lowest epoch of
        the waves of its workgroup now (slot_of: the slot of each wave), is dropped: its
        join leaves a dword as it was or at an r_epoch below S, and all such states are
        alike to every later access (a write's test, r_epoch >= its epoch >= S, cannot
        fire on them; a later read's join, at an epoch >= S, replaces them)."""
        if not self.reads:
            return
        n_slots = int(slot_of.max()) + 1
        low = np.full(n_slots, _PENDING, np.int32)
        np.minimum.at(low, slot_of, self.epoch)
        wlo, whi = np.zeros(n_slots, np.int64), np.full(n_slots, np.iinfo(np.int64).max)
        if keys2 is not None:
            wlo[:], whi[:] = whi, 0
            self._fast.key_bounds(keys2, self.dwords, wlo, whi)
        keep, lowest = [], int(low.min())
        for rec in self.reads:
            addr, slots, per, lo, hi, me, mine, top = rec
            if top < lowest:
                continue                    # dropped: below every workgroup's lowest epoch
            fate = self._fast.deferred_fate(lo, hi, mine, self.dwords, low, wlo, whi)
            if fate == 2:
                keys = ((slots * self.dwords)[:, None] + addr // 4)[:, :, None] + np.arange(per)
                self._fast.mark_reads(keys.reshape(len(slots), -1), me, mine, self.reader, self.r_epoch,
                                      self._scratch, self._flag, self._last)
            elif fate == 1:
                keep.append(rec)
        self.reads = keep

    def arrive(self, waves: np.ndarray) -> None:
        """s_barrier: the waves enter their next epoch."""
        self.epoch[waves] += 1

    def several(self, keys, waves) -> np.ndarray:
        """bool per element: its dword is also touched by another wave in this access."""
        self._scratch[keys] = waves
        other = self._scratch[keys] != waves
        if not other.any():
            return other
        self._flag[keys[other]] = True
        out = self._flag[keys]
        self._flag[keys] = False
        return out


class Access:
    """One DS/DMA access of the waves `w`: byte indices for the data, dword keys for the
    bookkeeping (flattened over the active, in-range lanes).

    slot [n,1,1] LDS slot of each wave; ok [n,64] active and in range; keys [m] tracked
    dword keys (slot * dwords + dword), rows [m] / lanes [m] the wave row and lane of each
    key (made on first use where every lane is ok: only error reports and partial
    releases need them); index [n,64,nbytes] byte index into the slot (0 where not ok,
    made on first use); dword_index [n,64,nbytes/4] (None unless every ok lane is
    dword-aligned and nbytes a multiple of 4): the same bytes as whole dwords.
    keys2: the keys as [n, m/n] where every row has the same count (every lane ok), else
    keys itself; per_row(v) spreads a per-wave v[n] over keys2 (a broadcast, not a copy,
    in the first case)."""

    __slots__ = ("slot", "ok", "keys", "keys2", "_rows", "_lanes", "dword_index", "_okaddr", "_nbytes", "_index")

    def __init__(self, slot, ok, keys, rows, lanes, dword_index, okaddr, nbytes):
        """rows and lanes None: every lane of every row is ok and touches nbytes / 4 dwords."""
        self.slot, self.ok, self.keys, self._rows, self._lanes = slot, ok, keys, rows, lanes
        self.keys2 = keys.reshape(ok.shape[0], -1) if rows is None else keys
        self.dword_index = dword_index
        self._okaddr, self._nbytes, self._index = okaddr, nbytes, None

    @property
    def rows(self) -> np.ndarray:
        if self._rows is None:
            self._rows = np.repeat(np.arange(self.ok.shape[0]), self.keys2.shape[1])
        return self._rows

    def per_row(self, v: np.ndarray) -> np.ndarray:
        return v[:, None] if self._rows is None else v[self._rows]

    @property
    def lanes(self) -> np.ndarray:
        if self._lanes is None:
            self._lanes = (np.arange(self.keys.size) // (self._nbytes // 4)) % self.ok.shape[1]
        return self._lanes

    @property
    def index(self) -> np.ndarray:
        if self._index is None:
            self._index = np.where(self.ok[:, :, None], self._okaddr[:, :, None] + np.arange(self._nbytes), 0)
        return self._index


def access(ex, w, addr: np.ndarray, nbytes: int, mask: np.ndarray, what: str) -> Access:
    """Validate [n,64] byte addresses of `nbytes`-wide accesses."""
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
    okaddr = np.where(ok, addr, 0)
    slot = ex.waves.slot[waves][:, None, None]
    first = okaddr // 4
    if nbytes % 4 == 0 and size % 4 == 0 and size > 0 and not (okaddr & 3).any():
        # Dword-aligned: every ok lane touches nbytes / 4 whole dwords.
        k = np.arange(nbytes // 4)
        dword_index = first[:, :, None] + k
        full = slot * ex.lds.dwords + dword_index
        if ok.all():
            keys = full.ravel()
            rows = lanes = None
        else:
            rows, lanes, _ = np.nonzero(np.broadcast_to(ok[:, :, None], full.shape))
            keys = full[ok]
            keys = keys.ravel()
        return Access(slot, ok, keys, rows, lanes, dword_index, okaddr, nbytes)
    span = (okaddr % 4 + nbytes + 3) // 4          # dwords each lane touches
    k = np.arange(int(span.max()) if span.size else 1)
    sel = ok[:, :, None] & (k < span[:, :, None])
    rows, lanes, _ = np.nonzero(sel)
    keys = (slot * ex.lds.dwords + first[:, :, None] + k)[sel]
    return Access(slot, ok, keys, rows, lanes, None, okaddr, nbytes)


def _report(ex, w, acc: Access, flags: np.ndarray, message: str):
    """HazardError for the first flagged key; `message` gets the address and lane."""
    flags = flags.reshape(-1)
    j = int(np.flatnonzero(flags)[0])
    rows = np.zeros(acc.ok.shape[0], bool)
    rows[acc.rows[flags]] = True
    addr = int(acc.keys[j] % ex.lds.dwords) * 4
    ex.hazard(w, rows, message.format(addr=f"{addr:#x}", lane=int(acc.lanes[j])))


def _same_dma(ex, acc: Access, values) -> np.ndarray | bool:
    """bool per key: a whole-dword DMA of `values` (uint32 shaped as acc.keys2, None for other writes)
    lands what the last write there leaves (see the module docstring)."""
    if values is None:
        return False
    lds = ex.lds
    keys = acc.keys2
    left = np.where(lds.dma_pending[keys] > 0, lds.dma_value[keys], ex.waves.lds.view(np.uint32).reshape(-1)[keys])
    return lds.by_dma[keys] & (left == values)


def _check_pending(ex, w, acc: Access, what: str, same_wave_ok: bool, values=None):
    lds = ex.lds
    if not ex.strict:
        return
    dma = lds.dma_pending[acc.keys2] > 0
    if dma.any() and values is not None and lds.ordered:
        dma &= ~_same_dma(ex, acc, values)
    if dma.any():
        _report(ex, w, acc, dma, f"{what} touches LDS address {{addr}} (lane {{lane}}) before the LDS DMA "
                                 f"load writing it has landed (missing s_waitcnt vmcnt)")
    pend = lds.ds_pending[acc.keys2] > 0
    if same_wave_ok and pend.any():
        pend &= lds.ds_owner[acc.keys2] != acc.per_row(ex.wave_ids(w))
    if pend.any():
        _report(ex, w, acc, pend, f"{what} touches LDS address {{addr}} (lane {{lane}}) that another wave "
                                  f"wrote without s_waitcnt lgkmcnt(0) + s_barrier in between")


def _check_order(ex, w, acc: Access, what: str, write: bool, values=None):
    """Cross-wave ordering through s_barrier (see the module docstring); marks reads.
    `values`: uint32 shaped as acc.keys2 of a whole-dword LDS DMA write, None otherwise."""
    lds = ex.lds
    if not (ex.strict and lds.ordered):
        return
    lds.settle(ex.waves.slot)
    waves = ex.wave_ids(w)
    keys = acc.keys2
    me = acc.per_row(ex.waves.wave_in_group[waves].astype(np.int8))
    mine = acc.per_row(lds.epoch[waves])
    verb = "writes" if write else "reads"
    # w_epoch is -1 exactly where no wave wrote (writer -1), and epochs are >= 0: a
    # dword written in or after the reader's epoch has a writer.
    raw = lds.w_epoch[keys] >= mine
    if raw.any():
        wr = lds.writer[keys]
        raw &= wr != me
    if raw.any() and values is not None:
        raw &= ~_same_dma(ex, acc, values)
    if raw.any():
        _report(ex, w, acc, raw, f"{what} {verb} LDS address {{addr}} (lane {{lane}}), which wave "
                                 f"{int(wr[raw][0])} of the workgroup wrote, with no "
                                 f"s_waitcnt lgkmcnt(0) + s_barrier in between (LDS race)")
    several = lds.several(keys, me) if len(waves) > 1 else None
    if write and several is not None and several.any() and values is not None:
        # DMA writes of this access: waves landing the same bytes on a dword do not race
        lds._values[keys] = values
        several &= lds._values[keys] != values
    if write and several is not None and several.any():
        _report(ex, w, acc, several, f"{what}: several waves write LDS address {{addr}} (lane {{lane}}) "
                                     f"with no s_barrier between them (LDS race)")
    if write:
        rd = lds.reader[keys]
        war = (rd != -1) & (rd != me) & (lds.r_epoch[keys] >= mine)
        if war.any():
            r = int(rd[war][0])
            who = "other waves" if r < 0 else f"wave {r}"
            _report(ex, w, acc, war, f"{what} overwrites LDS address {{addr}} (lane {{lane}}), which "
                                     f"{who} of the workgroup read, with no s_barrier in between (LDS race)")
        lds.writer[keys] = me
        lds.w_epoch[keys] = _PENDING
        lds.by_dma[keys] = values is not None
        if values is not None:
            lds.dma_value[keys] = values
    else:
        old_r, old_e = lds.reader[keys], lds.r_epoch[keys]
        new_r = np.where((old_e == mine) & (old_r != -1) & (old_r != me), _SEVERAL, me)
        if several is not None:
            new_r = np.where(several, _SEVERAL, new_r)
        lds.reader[keys] = np.where(old_e > mine, old_r, new_r)
        lds.r_epoch[keys] = np.maximum(old_e, mine)


def _complete(ex, waves: np.ndarray, keys: np.ndarray):
    """The writes of `waves` (one per key) to `keys` are now complete."""
    lds = ex.lds
    if not (ex.strict and lds.ordered):
        return
    still = lds.writer[keys] == ex.waves.wave_in_group[waves]
    lds.w_epoch[keys[still]] = lds.epoch[waves[still]]


_NO_VALUES = np.zeros((1, 1), np.uint32)


def _write_checked(ex, w, acc: Access, what: str, counts: np.ndarray, owner: bool, same_wave_ok: bool,
                   values=None):
    """A write's checks and marks: _check_pending, _check_order(write=True), then
    _in_flight(counts, owner); returns release(rows). Where every lane writes whole dwords
    (acc.keys2 is [n, m]), fast.write_marks does all three unless a check may fire."""
    lds, fast = ex.lds, ex.fast
    if fast is not None and ex.strict and lds.ordered and acc.keys2.ndim == 2:
        if lds._last is None:
            lds._last = np.zeros(lds.writer.size, np.int32)
        waves = ex.wave_ids(w)
        lds.settle(ex.waves.slot, acc.keys2)
        if fast.write_marks(acc.keys2, ex.waves.wave_in_group[waves].astype(np.int8), lds.epoch[waves], waves,
                            _NO_VALUES if values is None else values, values is not None, same_wave_ok, owner,
                            counts, ex.waves.lds.view(np.uint32).reshape(-1), lds.dma_pending, lds.ds_pending,
                            lds.ds_owner, lds.w_epoch, lds.writer, lds.reader, lds.r_epoch, lds.by_dma,
                            lds.dma_value, lds._flag, lds._last):
            return _release(ex, w, acc, counts)
    _check_pending(ex, w, acc, what, same_wave_ok=same_wave_ok, values=values)
    _check_order(ex, w, acc, what, write=True, values=values)
    return _in_flight(ex, w, acc, counts, owner)


def _in_flight(ex, w, acc: Access, counts: np.ndarray, owner: bool):
    """Mark the access's dwords in flight in `counts`; returns release(rows).

    A dword two lanes of one access touch is counted once and released once, so the
    counts stay balanced without np.add.at."""
    counts[acc.keys] += 1
    if owner:
        ex.lds.ds_owner[acc.keys] = ex.wave_ids(w)[acc.rows]
    return _release(ex, w, acc, counts)


def _release(ex, w, acc: Access, counts: np.ndarray):
    """release(rows) of a write _in_flight marked: its dwords' counts go down, its writes
    complete (fast.release where every row retires and every lane wrote)."""
    row_waves = ex.wave_ids(w)
    n = acc.ok.shape[0]
    key_waves = []                          # the wave of every key, made on first use

    def release(rows):
        lds, fast = ex.lds, ex.fast
        if fast is not None and len(rows) == n and acc.keys2.ndim == 2:
            fast.release(acc.keys2, row_waves, counts, ex.strict and lds.ordered, lds.writer, lds.w_epoch,
                         ex.waves.wave_in_group, lds.epoch)
            return
        if not key_waves:
            key_waves.append(row_waves[acc.rows])
        if len(rows) == n:                  # distinct positions 0..n-1: every row
            keys, done = acc.keys, key_waves[0]
        else:
            pick = np.isin(acc.rows, rows)
            keys, done = acc.keys[pick], key_waves[0][pick]
        counts[keys] = np.maximum(counts[keys] - 1, 0)   # waves may retire separately
        _complete(ex, done, keys)
    return release


def _read_dwords_fast(ex, w, addr: np.ndarray, nbytes: int, mask: np.ndarray, align: int):
    """fast.read_dwords where it may apply (ex.fast set, whole dwords, every address
    aligned to `align`): the data uint8[n,64,nbytes], or None where the numpy path must run."""
    lds, fast = ex.lds, ex.fast
    if fast is None or not lds.ordered or nbytes % 4 or lds.size % 4 or not lds.size:
        return None
    if lds._last is None:
        lds._last = np.zeros(lds.writer.size, np.int32)
    waves = ex.wave_ids(w)
    out = np.empty(mask.shape + (nbytes // 4,), np.uint32)
    n = mask.shape[0]
    lo, hi = np.empty(n, np.int64), np.empty(n, np.int64)
    me, mine = ex.waves.wave_in_group[waves].astype(np.int8), lds.epoch[waves]
    addr, slots = addr.astype(np.int64), ex.waves.slot[waves].astype(np.int64)      # copies: kept by defer
    if not fast.read_dwords(addr, mask, slots, lds.dwords, lds.size, ex.waves.lds.view(np.uint32).reshape(-1), out,
                            lo, hi, me, mine, waves, lds.dma_pending, lds.ds_pending, lds.ds_owner, lds.w_epoch,
                            lds.writer, max(align, 4)):
        return None
    lds.defer(fast, addr, slots, nbytes // 4, lo, hi, me, mine, ex.waves.slot)
    return out.view(np.uint8)


def read(ex, w, addr: np.ndarray, nbytes: int, mask: np.ndarray, what: str, check=None,
         align: int = 4) -> np.ndarray:
    """uint8[n,64,nbytes] read at issue; inactive or (non-strict) out-of-range lanes read 0.
    `check()` (ds.py: the alignment fault) runs first where the compiled read does not
    apply; it does only where every address is a multiple of `align`."""
    data = _read_dwords_fast(ex, w, addr, nbytes, mask, align)
    if data is not None:
        return data
    if check is not None:
        check()
    acc = access(ex, w, addr, nbytes, mask, what)
    _check_pending(ex, w, acc, what, same_wave_ok=True)
    _check_order(ex, w, acc, what, write=False)
    if acc.dword_index is not None:
        lds32 = ex.waves.lds.view(np.uint32)
        data = lds32[acc.slot, acc.dword_index].view(np.uint8).reshape(acc.ok.shape + (nbytes,))
    else:
        data = ex.waves.lds[acc.slot, acc.index]
    if acc.ok.all():
        return data             # a fresh array (fancy indexing copies)
    return np.where(acc.ok[:, :, None], data, 0).astype(np.uint8)


def write(ex, w, addr: np.ndarray, data: np.ndarray, mask: np.ndarray, what: str):
    """Write uint8[n,64,nbytes] now and mark it in flight until the lgkmcnt retires.

    Returns a `release(rows)` callable for the pending op. Lanes are applied in lane
    order, so the highest active lane wins where addresses collide.
    """
    acc = access(ex, w, addr, data.shape[2], mask, what)
    release = _write_checked(ex, w, acc, what, ex.lds.ds_pending, owner=True, same_wave_ok=True)
    if acc.dword_index is not None:
        # Whole aligned dwords: lanes still apply in lane order (the last one wins).
        ok = acc.ok
        data32 = np.ascontiguousarray(data, dtype=np.uint8).view(np.uint32)      # [n,64,nbytes/4]
        if ok.all():
            ex.waves.lds.view(np.uint32)[acc.slot, acc.dword_index] = data32
        else:
            slots = np.broadcast_to(acc.slot[:, :, 0], ok.shape)
            ex.waves.lds.view(np.uint32)[slots[ok][:, None], acc.dword_index[ok]] = data32[ok]
    else:
        sel = np.broadcast_to(acc.ok[:, :, None], acc.index.shape)
        slots = np.broadcast_to(acc.slot, acc.index.shape)
        ex.waves.lds[slots[sel], acc.index[sel]] = data[sel]
    return release


def atomic_access(ex, w, addr: np.ndarray, mask: np.ndarray, what: str) -> tuple[Access, object]:
    """A 4-byte LDS atomic: no cross-wave ordering check among atomics, but the dwords are
    marked written by this wave (a plain access by another wave needs s_waitcnt +
    s_barrier). Returns the access and its release(rows)."""
    acc = access(ex, w, addr, 4, mask, what)
    lds = ex.lds
    if ex.strict and (lds.dma_pending[acc.keys] > 0).any():
        _report(ex, w, acc, lds.dma_pending[acc.keys] > 0,
                f"{what} touches LDS address {{addr}} (lane {{lane}}) before the LDS DMA load writing it "
                f"has landed (missing s_waitcnt vmcnt)")
    if ex.strict and lds.ordered:
        lds.writer[acc.keys] = ex.waves.wave_in_group[ex.wave_ids(w)[acc.rows]].astype(np.int8)
        lds.w_epoch[acc.keys] = _PENDING
        lds.by_dma[acc.keys] = False
    return acc, _in_flight(ex, w, acc, lds.ds_pending, owner=True)


def dma_reserve(ex, w, addr: np.ndarray, nbytes: int, mask: np.ndarray, what: str, data=None):
    """Mark LDS DMA destination bytes in flight; returns land(rows, data). `data`
    (uint8[n,64,nbytes], what will land) lets strict mode accept another wave's DMA of the
    same bytes (module docstring); without it every overlap is a race."""
    acc = access(ex, w, addr, nbytes, mask, what)
    values = None
    if data is not None and acc.dword_index is not None and ex.strict and ex.lds.ordered:
        data32 = np.ascontiguousarray(data, dtype=np.uint8).view(np.uint32)   # [n,64,nbytes/4]
        values = data32.reshape(acc.keys2.shape) if acc.ok.all() else data32[acc.ok].reshape(-1)
    release = _write_checked(ex, w, acc, what, ex.lds.dma_pending, owner=False, same_wave_ok=False,
                             values=values)
    whole = acc.dword_index is not None and bool(acc.ok.all())
    n = acc.ok.shape[0]

    def land(rows, data):
        if whole and len(rows) == n and data.dtype == np.uint8:
            # Every lane, whole aligned dwords, every row (rows are sorted positions):
            # the same bytes in the same lane order as below.
            data32 = np.ascontiguousarray(data).view(np.uint32)      # [n,64,nbytes/4]
            ex.waves.lds.view(np.uint32)[acc.slot, acc.dword_index] = data32
        else:
            sel = np.broadcast_to(acc.ok[:, :, None], acc.index.shape)
            slots = np.broadcast_to(acc.slot, acc.index.shape)
            s, i, m = slots[rows], acc.index[rows], sel[rows]
            ex.waves.lds[s[m], i[m]] = data[rows][m]
        release(rows)
    return land
