"""LDS bank conflicts of DS instructions, from the lane addresses the emulator computed.

gfx950's LDS serves a wave64 DS instruction in phases: the lanes of one phase are served
together, and lanes of a phase whose dwords fall in the same bank (different dwords;
the same dword is a broadcast) are served one after another. A phase therefore takes as
many LDS cycles as its busiest bank has distinct dwords; the conflict cycles of an
execution are the sum over its phases of (that count - 1).

Phase groups and bank counts measured on MI355X by HazyResearch/HipKittens
(`analysis/paper_experiments/phases/<op>/phase_results.txt` and `bank_results.txt`,
commit f09e968): ds_read_b128 — 4 phases of 16 non-consecutive lanes over 64 banks;
ds_read_b64 — 2 x 32 consecutive lanes, 64 banks; ds_read_b96 — 8 x 8 lanes, 32 banks;
ds_write_b64 — 4 x 16 consecutive lanes, 32 banks. Other DS ops are not measured: each
is counted under every one of HYPOTHESES, and the result is the bracket over them (the
first, DEFAULT, is the one a single figure uses):
  * "by bytes": a phase serves 256 bytes of consecutive lanes over 64 banks (reads) or
    128 bytes over 32 banks (writes); `ds_read_b64_tr_*` as ds_read_b64 (2 x 32);
  * "b128 groups": reads in ds_read_b128's measured groups (4 x 16 non-consecutive lanes),
    64 banks; writes as "by bytes";
  * "quarter waves": reads in 4 phases of 16 consecutive lanes, 64 banks; writes as "by bytes".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np


def _runs(*runs) -> list[int]:
    return [lane for a, b in runs for lane in range(a, b + 1)]


def _consecutive(size: int) -> list[list[int]]:
    return [list(range(s, s + size)) for s in range(0, 64, size)]


# op -> (lane groups, banks, measured?)
MEASURED = {
    "ds_read_b128": ([_runs((0, 3), (12, 15), (20, 27)), _runs((4, 11), (16, 19), (28, 31)),
                      _runs((32, 35), (44, 47), (52, 59)), _runs((36, 43), (48, 51), (60, 63))], 64),
    "ds_read_b64": (_consecutive(32), 64),
    "ds_read_b96": ([_runs((0, 3), (20, 23)), _runs((4, 7), (16, 19)), _runs((8, 11), (28, 31)),
                     _runs((12, 15), (24, 27)), _runs((32, 35), (52, 55)), _runs((36, 39), (48, 51)),
                     _runs((40, 43), (60, 63)), _runs((44, 47), (56, 59))], 32),
    "ds_write_b64": (_consecutive(16), 32),
}


HYPOTHESES = ("by bytes", "b128 groups", "quarter waves")
DEFAULT = HYPOTHESES[0]


@lru_cache(maxsize=None)
def phases(op: str, nbytes: int, write: bool, hypothesis: str = DEFAULT) -> tuple[tuple[tuple[int, ...], ...], int, bool]:
    """(lane groups, banks, measured) for one DS access of `nbytes` per lane; `hypothesis`
    (one of HYPOTHESES) decides the groups of an op HipKittens did not measure."""
    if hypothesis not in HYPOTHESES:
        raise ValueError(f"hypothesis must be one of {HYPOTHESES}, got {hypothesis!r}")
    if op in MEASURED:
        groups, banks = MEASURED[op]
        return tuple(tuple(g) for g in groups), banks, True
    base = op.split("_tr_")[0] if "_tr_" in op else op
    if write:
        groups, banks = _consecutive(max(1, min(64, 128 // nbytes))), 32
    elif hypothesis == "b128 groups":
        groups, banks = MEASURED["ds_read_b128"]
    elif hypothesis == "quarter waves":
        groups, banks = _consecutive(16), 64
    elif base in MEASURED:
        groups, banks = MEASURED[base]
    else:
        groups, banks = _consecutive(max(1, min(64, 256 // nbytes))), 64
    return tuple(tuple(g) for g in groups), banks, False


@dataclass
class Conflicts:
    """Per DS instruction (program index): executions and LDS cycles over the ideal, under
    each phase hypothesis (all alike for a measured op)."""
    executions: int = 0
    phases: dict = field(default_factory=dict)   # hypothesis -> phases with active lanes, summed
    cycles: dict = field(default_factory=dict)   # hypothesis -> LDS cycles, summed (>= phases)
    measured: bool = True        # phase groups measured (HipKittens), not a hypothesis

    def extra_per_execution(self, hypothesis: str = DEFAULT) -> float:
        if not self.executions:
            return 0.0
        return (self.cycles.get(hypothesis, 0) - self.phases.get(hypothesis, 0)) / self.executions

    def degree(self, hypothesis: str = DEFAULT) -> float:
        """Mean cycles per phase (1.0: conflict-free)."""
        ph = self.phases.get(hypothesis, 0)
        return self.cycles.get(hypothesis, 0) / ph if ph else 1.0

    def bracket(self) -> tuple[float, float]:
        """(least, most) conflict cycles per execution over the hypotheses."""
        extra = [self.extra_per_execution(h) for h in HYPOTHESES]
        return min(extra), max(extra)


def record(conflicts: dict, key, op: str, addr, mask, nbytes: int, write: bool) -> None:
    """Count one DS access into conflicts[key] under every hypothesis."""
    addr = np.asarray(addr, np.int64).reshape(-1, 64)
    mask = np.asarray(mask, bool).reshape(-1, 64)
    # the same lane pattern at a base shifted by whole 256-byte rows (a row of 64 banks, two
    # of 32) has the same conflicts: count each pattern once for all hypotheses
    shifted = np.where(mask, addr - (addr.min(axis=1, keepdims=True) // 256) * 256, -1)
    memo = (op, nbytes, write, shifted.tobytes())
    per = _RECORDED.get(memo)
    if per is None:
        per, seen = {}, {}
        for h in HYPOTHESES:
            groups, banks, measured = phases(op, nbytes, write, h)
            if (groups, banks) not in seen:
                seen[groups, banks] = _count(shifted, mask, nbytes, groups, banks)
            per[h] = seen[groups, banks]
        per["measured"] = measured
        _RECORDED[memo] = per
        if len(_RECORDED) > 4096:
            _RECORDED.pop(next(iter(_RECORDED)))
    c = conflicts.get(key)
    if c is None:
        c = conflicts[key] = Conflicts(measured=per["measured"])
    for h in HYPOTHESES:
        ph, cyc = per[h]
        c.phases[h] = c.phases.get(h, 0) + ph
        c.cycles[h] = c.cycles.get(h, 0) + cyc
    c.executions += addr.shape[0]


_RECORDED: dict = {}      # (op, bytes, write, lane pattern) -> per-hypothesis (phases, cycles)
def count(addr: np.ndarray, mask: np.ndarray, nbytes: int, groups, banks: int) -> tuple[int, int]:
    """(active phases, LDS cycles) of one DS access: addr, mask [waves, 64] byte addresses."""
    addr = np.asarray(addr, np.int64).reshape(-1, 64)
    mask = np.asarray(mask, bool).reshape(-1, 64)
    return _count(np.where(mask, addr, -1), mask, nbytes, groups, banks)


def _count(addr, mask, nbytes, groups, banks) -> tuple[int, int]:
    words = max(1, nbytes // 4)
    dwords = (addr // 4)[:, :, None] + np.arange(words)                   # [n, 64, words]
    phase_of = np.full(64, -1, np.int64)
    for p, lanes in enumerate(groups):
        phase_of[list(lanes)] = p
    n = addr.shape[0]
    row = np.broadcast_to(np.arange(n)[:, None, None], dwords.shape)
    ph = np.broadcast_to(phase_of[None, :, None], dwords.shape)
    sel = np.broadcast_to(mask[:, :, None], dwords.shape) & (ph >= 0)
    if not sel.any():
        return 0, 0
    d = dwords[sel]
    group = (row[sel] * len(groups) + ph[sel]) * banks + d % banks      # (row, phase, bank)
    pairs = np.unique(group * (1 << 20) + (d & ((1 << 20) - 1)))        # distinct dwords per bank
    bank_key, per_bank = np.unique(pairs >> 20, return_counts=True)
    phase_key, slot = np.unique(bank_key // banks, return_inverse=True)
    busiest = np.zeros(phase_key.size, np.int64)
    np.maximum.at(busiest, slot, per_bank)
    return int(phase_key.size), int(busiest.sum())
