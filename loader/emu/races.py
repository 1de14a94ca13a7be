"""Global memory across workgroups within one launch: who read, wrote and atomically
updated each byte, and (strict mode) the races among them.

Two workgroups of one launch may run in any order and at once on hardware, so within a
launch it is a race (HazardError in strict mode) for one workgroup to
  * store to bytes another workgroup stores to, or
  * read bytes another workgroup stores to (either order), or
  * touch with a plain load or store bytes another workgroup updates with an atomic,
unless the kernel's own synchronisation orders the two accesses. Atomics on the same
bytes from several workgroups are no race (that is what they are for).

Ordering, as modelled: every atomic releases (what its workgroup did before it is ordered
before whoever later acquires that location), and an atomic that returns a value
acquires (the workgroup has seen the value the location's last atomic left, so what that
atomic's workgroup had done is ordered before what this one does next). Vector clocks
per workgroup carry it: access A by workgroup a is ordered before access B by workgroup
b when b's clock holds a's epoch at A. Not modelled under the serial and parallel
schedules, so reported as races if a kernel relies on them: ordering through loads of a
flag (even with sc0/sc1/nt bits or buffer_wbl2/buffer_inv), and release sequences (a
non-returning atomic does not pass on the ordering the location's earlier atomics carried).
Under the concurrent schedule `sync` (concurrent.FlagOrdering) replaces these rules with
AMDGPUUsage's agent-scope release/acquire sequences: sc1 loads and stores are atomic
accesses, and what releases publish and when acquires take effect is decided there.

The per-byte record (which workgroup, which pc) is also the footprint that a launch over
several processes (parallel.py) checks and merges shard by shard: `Footprint` is a
shard's sparse copy, `GlobalAccesses.merge` takes one in.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import HazardError

READ, WRITE, ATOMIC, ATOMIC_RETURN, ATOMIC_LOAD, ATOMIC_STORE = range(6)
_VERB = {READ: "read", WRITE: "stored to", ATOMIC: "updated atomically", ATOMIC_RETURN: "updated atomically",
         ATOMIC_LOAD: "read atomically (sc1)", ATOMIC_STORE: "stored to atomically (sc1)"}
# ATOMIC_LOAD and ATOMIC_STORE (agent-coherent sc1 loads and stores) exist only under the
# concurrent schedule, whose memory model (concurrent.FlagOrdering, `GlobalAccesses.sync`)
# classifies accesses and decides what releases and acquires.
ATOMIC_KINDS = (ATOMIC, ATOMIC_RETURN, ATOMIC_LOAD, ATOMIC_STORE)
READING_KINDS = (READ, ATOMIC_RETURN, ATOMIC_LOAD)
_ATOMIC_READS = (ATOMIC_RETURN, ATOMIC_LOAD)
# Per byte: the record of the last plain store and of the last atomic. Per dword: the
# record of the first plain reader, and of the first reader of another workgroup than that
# one. Reads are kept per dword (a read of part of a dword counts as a read of all of it:
# a store by another workgroup into the rest of that dword is reported) because most of a
# launch's accesses are loads and a quarter of the bookkeeping makes strict mode's cost
# bearable; stores and atomics are kept per byte (neighbouring workgroups' outputs may
# meet inside a dword).
BYTE_FIELDS = ("writer", "atomic")
DWORD_FIELDS = ("reader", "other_reader")


def note(ex, w, addr: np.ndarray, ok: np.ndarray, nbytes: int, kind: int) -> None:
    """Record (and in strict mode check) an access of nbytes at addr[n, lanes] (uint64)
    for the lanes `ok` of the waves `w`, when the launch keeps a record."""
    accesses = ex.accesses
    if accesses is None:
        return
    flat = np.flatnonzero(ok)
    accesses.note(ex, w, flat // addr.shape[1], addr.reshape(-1)[flat], nbytes, kind)


def note_atomic(ex, w, addr: np.ndarray, ok: np.ndarray, values: np.ndarray, name: str, returns: bool) -> None:
    """note() for a 32-bit atomic; a parallel launch's shard also logs its operands."""
    accesses = ex.accesses
    if accesses is None:
        return
    note(ex, w, addr, ok, 4, ATOMIC_RETURN if returns else ATOMIC)
    if accesses.log_atomics:
        accesses.atomic_log.append((addr[ok], values[ok], name))


class _Shadow:
    """The fields of one registered buffer, and the byte range touched so far (a
    footprint scans only that)."""

    def __init__(self, size: int):
        # np.zeros maps untouched pages lazily: a big buffer costs what the launch touches
        self.bytes = {f: np.zeros(size, np.int32) for f in BYTE_FIELDS}
        self.dwords = {f: np.zeros(-(-size // 4), np.int32) for f in DWORD_FIELDS}
        self.stored = self.updated = self.read = False     # any such mark yet
        self.lo, self.hi = size, 0

    def touch(self, lo: int, hi: int) -> None:
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)


@dataclass
class Footprint:
    """One shard's accesses, sparse: per buffer (region index) the touched byte offsets
    with their byte fields and the touched dword indices with their dword fields; the
    shard's records; its vector clocks and atomic snapshots."""
    regions: dict          # region -> (byte offsets, {field: records}, dword indices, {field: records})
    records: np.ndarray    # [n, 4] int64: workgroup, pc, epoch, kind (row 0 unused)
    clocks: dict
    snapshots: dict


class GlobalAccesses:
    """The launch's (or one shard's) record of global memory accesses by workgroup.
    `strict`: raise HazardError at the first race; else only record."""

    def __init__(self, memory, strict: bool, name_of):
        self.memory = memory
        self.strict = strict
        self.name_of = name_of            # linear workgroup id -> "(x,y,z)"
        self.shadows: dict[int, _Shadow] = {}
        self.records = np.zeros((1024, 4), np.int64)
        self.count = 1                    # record 0 means "none"
        self.clocks: dict[int, dict[int, int]] = {}      # workgroup -> vector clock
        self.snapshots: dict[int, dict[int, int]] = {}   # atomic record -> clock it released
        # A parallel launch's shard logs its atomics' lanes (dword addresses, operands, op
        # name; in the order applied) for the parent to apply again where other shards
        # updated the same dwords.
        self.log_atomics = False
        self.atomic_log: list = []
        self._acquired: dict[int, set[int]] = {}         # returning atomic -> records it saw
        self.sync = None                  # the concurrent schedule's memory model, or None

    # ------------------------------------------------------------------ recording
    def note(self, ex, w, rows: np.ndarray, addr: np.ndarray, nbytes: int, kind: int) -> None:
        """Workgroups of the waves `ex.wave_ids(w)[rows]` accessed nbytes at each address
        (uint64, in lane order), by the instruction ex.inst."""
        if addr.size == 0:
            return
        if self.sync is not None:
            kind = self.sync.classify(ex, kind)
        groups = ex.group_ids[ex.wave_ids(w)[rows]]
        # waves (hence rows) come in workgroup order: records per run of one workgroup
        starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
        rec = self._new_records(groups[starts], ex.inst.pc, kind)
        lane_rec = np.repeat(rec, np.diff(np.r_[starts, groups.size]))
        for region, sel in self.memory._regions(addr, nbytes):
            off = (addr[sel] - self.memory._bases[region]).astype(np.int64)
            shadow = self.shadow(region)
            shadow.touch(int(off.min()), int(off.max()) + nbytes)
            self._apply(region, shadow, _Lanes(off, lane_rec[sel], nbytes, self.records[:, 0]), kind)
        if self.sync is not None and kind in ATOMIC_KINDS:
            self.sync.synchronise(self, ex, w, rec, kind)
        elif kind in (ATOMIC, ATOMIC_RETURN):
            self._synchronise(rec, kind)

    def shadow(self, region: int) -> _Shadow:
        """The fields of a registered buffer (made on first use)."""
        shadow = self.shadows.get(region)
        if shadow is None:
            shadow = self.shadows[region] = _Shadow(self.memory._views[region].size)
        return shadow

    def reserve(self, n: int) -> None:
        """Room for n more records."""
        while self.count + n > len(self.records):
            self.records = np.concatenate([self.records, np.zeros_like(self.records)])

    def _new_records(self, groups: np.ndarray, pc: int, kind: int) -> np.ndarray:
        n = groups.size
        self.reserve(n)
        rec = np.arange(self.count, self.count + n)
        block = self.records[self.count:self.count + n]
        block[:, 0] = groups
        block[:, 1] = pc
        block[:, 2] = [self.clocks.get(g, {}).get(g, 0) for g in groups.tolist()]
        block[:, 3] = kind
        self.count += n
        return rec

    def _apply(self, region, shadow: _Shadow, lanes: "_Lanes", kind: int) -> None:
        by, dw = shadow.bytes, shadow.dwords
        atomic = kind in ATOMIC_KINDS
        if self.strict:
            if shadow.stored or kind != READ:
                b = lanes.bytes()
                self._check(region, b, by["writer"][b.off])
                if shadow.updated and not atomic:
                    self._check(region, b, by["atomic"][b.off])
            if shadow.read and kind not in (READ, ATOMIC_LOAD):     # stores and atomics after plain reads
                d = lanes.dwords()
                for field in DWORD_FIELDS:
                    self._check(region, d, dw[field][d.off], skip_atomic=atomic)
        if kind in READING_KINDS:                   # a returning atomic reads, for the footprint
            d = lanes.dwords()
            first = dw["reader"][d.off]
            fresh = first == 0
            if fresh.any():
                dw["reader"][d.off[fresh]] = d.rec[fresh]
                first = dw["reader"][d.off]
            other = (self.records[first, 0] != d.group) & (dw["other_reader"][d.off] == 0)
            if other.any():
                dw["other_reader"][d.off[other]] = d.rec[other]
            shadow.read = True
        if kind == WRITE:
            b = lanes.bytes()
            by["writer"][b.off] = b.rec
            if self.strict:                         # two workgroups storing to one byte in one instruction
                self._check(region, b, by["writer"][b.off])
            shadow.stored = True
        elif atomic:
            b = lanes.bytes()
            if kind in _ATOMIC_READS or (kind == ATOMIC and self.sync is not None):   # sync: RMWs read too
                self._note_acquires(b.off, b.rec, by["atomic"][b.off])
            if kind != ATOMIC_LOAD:
                by["atomic"][b.off] = b.rec
                shadow.updated = True

    def _note_acquires(self, off, rec, prior) -> None:
        """A returning atomic's lanes see the value the previous atomic on their bytes left:
        the one before in this instruction (lanes apply in order), else the last one
        recorded. _synchronise acquires those records' snapshots."""
        order = np.argsort(off, kind="stable")
        at, by = off[order], rec[order]
        same = np.r_[False, at[1:] == at[:-1]]
        before = np.where(same, np.r_[0, by[:-1]], prior[order])
        seen = (before != 0) & (before != by)
        for r, p in set(zip(by[seen].tolist(), before[seen].tolist())):
            self._acquired.setdefault(r, set()).add(p)

    def _check(self, region, at: "_At", prior: np.ndarray, skip_atomic: bool = False) -> None:
        """Race where `prior` (a record per element of `at`) is another workgroup's access
        that nothing orders before this one (skip_atomic: a returning atomic's read is no
        race with an atomic)."""
        suspect = (prior != 0) & (self.records[prior, 0] != at.group)
        if skip_atomic and suspect.any():
            kinds = self.records[prior, 3]
            suspect &= (kinds != ATOMIC_RETURN) & (kinds != ATOMIC_LOAD)
        if not suspect.any():
            return
        for i in np.flatnonzero(suspect).tolist():
            before, now = int(prior[i]), int(at.rec[i])
            if not self._ordered(before, int(at.group[i])):
                self._report(region, at.describe(int(at.off[i])), before, now)

    def _ordered(self, before: int, group: int) -> bool:
        other, _, epoch, _ = self.records[before].tolist()
        return self.clocks.get(group, {}).get(other, -1) >= epoch

    def _report(self, region, where: str, before, now) -> None:
        g0, pc0, _, k0 = self.records[before].tolist()
        g1, pc1, _, k1 = self.records[now].tolist()
        name = self.memory.names[region]
        raise HazardError(
            f"cross-workgroup race on global memory: {where} of {name} is {_VERB[k0]} by workgroup "
            f"{self.name_of(g0)} at pc {pc0:#x} and {_VERB[k1]} by workgroup {self.name_of(g1)} at pc "
            f"{pc1:#x}, and {self.sync.orders if self.sync is not None else 'no atomic orders the two'} "
            f"(workgroups of a launch may run in any order)")

    def _synchronise(self, rec: np.ndarray, kind: int) -> None:
        """Atomics of this step: a returning one acquires what the location's previous
        atomic released (its snapshot), every one releases its workgroup's clock."""
        for r in rec.tolist():
            g = int(self.records[r, 0])
            clock = self.clocks.setdefault(g, {g: 0})
            if kind == ATOMIC_RETURN:
                for prior in self.prior_atomics(r):
                    for other, epoch in self.snapshots.get(prior, {}).items():
                        if clock.get(other, -1) < epoch:
                            clock[other] = epoch
            self.snapshots[r] = dict(clock)
            clock[g] += 1

    def prior_atomics(self, r: int) -> set[int]:
        """The atomic records whose value atomic record r returned (set by _apply)."""
        return self._acquired.pop(r, set())

    # ------------------------------------------------------------------ footprint
    def footprint(self) -> Footprint:
        regions = {}
        for region, shadow in self.shadows.items():
            if shadow.hi <= shadow.lo:
                continue
            off = _touched(shadow.bytes, shadow.lo, shadow.hi)
            doff = _touched(shadow.dwords, shadow.lo // 4, -(-shadow.hi // 4))
            regions[region] = (off, {f: a[off] for f, a in shadow.bytes.items()},
                               doff, {f: a[doff] for f, a in shadow.dwords.items()})
        return Footprint(regions, self.records[:self.count].copy(), self.clocks, self.snapshots)


def _touched(fields: dict, lo: int, hi: int) -> np.ndarray:
    """Indices in [lo, hi) where any of the arrays `fields` is nonzero."""
    touched = np.zeros(hi - lo, bool)
    for a in fields.values():
        touched |= a[lo:hi] != 0
    return np.flatnonzero(touched) + lo


@dataclass
class _At:
    """Elements (bytes or dwords) of one access: index, record and workgroup of each."""
    off: np.ndarray
    rec: np.ndarray
    group: np.ndarray
    unit: str

    def describe(self, off: int) -> str:
        return f"byte {off}" if self.unit == "byte" else f"the dword at byte {4 * off}"


class _Lanes:
    """One access's lanes in one buffer (byte offsets, records), expanded to the bytes or
    the dwords they touch on first use."""

    def __init__(self, off: np.ndarray, rec: np.ndarray, nbytes: int, record_groups: np.ndarray):
        self.off, self.rec, self.nbytes, self.record_groups = off, rec, nbytes, record_groups
        self._bytes = self._dwords = None

    def bytes(self) -> _At:
        if self._bytes is None:
            n = self.nbytes
            off = (self.off[:, None] + np.arange(n)).reshape(-1)
            rec = np.repeat(self.rec, n)
            self._bytes = _At(off, rec, self.record_groups[rec], "byte")
        return self._bytes

    def dwords(self) -> _At:
        if self._dwords is None:
            first, n = self.off >> 2, self.nbytes
            if n % 4 == 0 and not (self.off & 3).any():
                off = (first[:, None] + np.arange(n // 4)).reshape(-1)
                per = n // 4
            else:                               # unaligned: repeats of the last dword are harmless
                per = n // 4 + 2
                last = (self.off + n - 1) >> 2
                off = np.minimum(first[:, None] + np.arange(per), last[:, None]).reshape(-1)
            rec = np.repeat(self.rec, per)
            self._dwords = _At(off, rec, self.record_groups[rec], "dword")
        return self._dwords
