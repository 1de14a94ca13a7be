"""Architectural state of a set of waves, as numpy arrays indexed by wave.

Every array's first axis is the wave. Instruction handlers receive `w` — an index array
or a slice selecting the waves that stand at the same pc — and operate on all of them
in one numpy operation.

Register files (per wave): 128 SGPRs (vcc = s106:107, m0 = s124, exec = s126:127 as
the encodings number them), 256 VGPRs and 256 AGPRs of 64 lanes each. VGPRs and AGPRs
are modelled as two separate files: shipped kernels declare accum_offset 160 yet use
v160..v255 with no AGPRs (../shared/conformance/CASES.md §0).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from .decode import SGPR_FILE

NUM_VGPRS = 256
LANES = 64
EXEC_LO, VCC_LO, M0 = 126, 106, 124

# Register contents at launch that the ABI leaves undefined: a pattern that is a NaN as
# f32 and a wild pointer as an address, so a kernel that forgets to initialise fails.
UNDEFINED = 0xFFBADBAD

# What last wrote a register, for the wait-state hazard checks (see hazards.py).
W_NONE, W_VALU, W_TRANS, W_SALU, W_MFMA, W_CVT_SCALE_HI, W_ACCW = range(7)

_LANE_BITS = np.arange(32, dtype=np.uint32)
_FILES = {"s": "sgpr", "v": "vgpr", "a": "agpr"}


def copies(w) -> bool:
    """Indexing the wave axis with `w` makes a copy (a 1-D index or bool array does; a
    slice or an integer gives a view)."""
    return isinstance(w, np.ndarray) and w.ndim == 1


def mask_to_bits(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """bool[n, 64] lane mask from the low and high 32-bit halves of a 64-bit mask."""
    lo_bits = (lo[:, None] >> _LANE_BITS) & 1
    hi_bits = (hi[:, None] >> _LANE_BITS) & 1
    return np.concatenate([lo_bits, hi_bits], axis=1).astype(bool)


def bits_to_mask(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of mask_to_bits: (lo, hi) uint32 halves from bool[n, 64]."""
    weights = np.left_shift(np.uint64(1), np.arange(64, dtype=np.uint64))
    packed = (bits.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
    return (packed & np.uint64(0xFFFFFFFF)).astype(np.uint32), (packed >> np.uint64(32)).astype(np.uint32)


def occurrence_rank(keys: np.ndarray) -> np.ndarray:
    """For each element, how many earlier elements have the same key (0 for the first):
    atomics apply in rounds, round r doing the r-th operation on every address, which keeps
    each address's operations in order while different addresses go at once."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    first = np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]
    start = np.maximum.accumulate(np.where(first, np.arange(keys.size), 0))
    rank = np.empty(keys.size, np.int64)
    rank[order] = np.arange(keys.size) - start
    return rank


@dataclass
class Pending:
    """A memory operation issued but not yet retired by s_waitcnt.

    `land(rows)` makes its results architecturally visible for the given rows (positions
    into `waves`); `release(rows)` clears its in-flight marks. Ops are shared by all the
    waves of the group that issued them.
    """
    waves: np.ndarray
    counter: str            # 'vm' or 'lgkm'
    smem: bool
    pc: int
    text: str
    land: object            # callable(rows) -> None


class Waves:
    def __init__(self, count: int, lds_slots: int, lds_bytes: int):
        self.count = count
        self.sgpr = np.full((count, SGPR_FILE), UNDEFINED, dtype=np.uint32)
        self.vgpr = np.full((count, NUM_VGPRS, LANES), UNDEFINED, dtype=np.uint32)
        self.agpr = np.full((count, NUM_VGPRS, LANES), UNDEFINED, dtype=np.uint32)
        self.scc = np.zeros(count, dtype=bool)
        self.pc = np.zeros(count, dtype=np.int64)
        self.slot = np.zeros(count, dtype=np.int64)       # workgroup slot (LDS, barrier)
        self.wave_in_group = np.zeros(count, dtype=np.int64)
        self.done = np.zeros(count, dtype=bool)
        # In-flight tracking for strict waitcnt checking: count of pending writes per register.
        self.busy = {"s": np.zeros((count, SGPR_FILE), np.int16),
                     "v": np.zeros((count, NUM_VGPRS), np.int16),
                     "a": np.zeros((count, NUM_VGPRS), np.int16)}
        # The same counts split by the queue the load sits in: VMEM and DS return in
        # issue order, scalar loads ('smem') may not.
        self.busy_in = {q: {k: np.zeros_like(v) for k, v in self.busy.items()} for q in ("vm", "lgkm", "smem")}
        # busy summed over the waves, per register, as Python lists: the common "nothing in
        # flight here" answer without a numpy gather (machine.py keeps it in step with busy).
        self.busy_col = {k: [0] * v.shape[1] for k, v in self.busy.items()}
        self.queues = {"vm": [deque() for _ in range(count)], "lgkm": [deque() for _ in range(count)]}
        # Wait-state clock and last writer per register, for hazard checks.
        self.clock = np.zeros(count, dtype=np.int64)
        self.written_at = {k: np.full(v.shape, -(1 << 40), np.int64) for k, v in self.busy.items()}
        self.written_by = {k: np.zeros(v.shape, np.int16) for k, v in self.busy.items()}
        # Per register, the latest clock (over all waves) at which hazards.py recorded a
        # write, an MFMA srcC read or a wide-store data read: a register whose entry is more
        # than hazards.MAX_WAIT_STATES behind every reader's clock needs no rule lookup.
        self.recent = {k: [-(1 << 40)] * v.shape[1] for k, v in self.busy.items()}
        self.exec_written_at = np.full(count, -(1 << 40), np.int64)
        self.exec_valu_written = False      # exec_written_at set for any wave yet
        # Mode bits set by s_setvskip and s_set_gpr_idx_on/off (families/modes.py).
        self.vskip = np.zeros(count, dtype=bool)
        self.gpr_idx_on = np.zeros(count, dtype=bool)
        self.lds = np.zeros((lds_slots, max(lds_bytes, 1)), dtype=np.uint8)
        self.lds_bytes = lds_bytes
        self._exec_stale = True
        self._exec = None
        self._exec_full = None

    def file(self, kind: str) -> np.ndarray:
        return getattr(self, _FILES[kind])

    def exec_bits(self, w) -> np.ndarray:
        """bool[n, 64] EXEC of the waves `w`, cached until EXEC is written (invalidate_exec)."""
        if self._exec_stale:
            self._exec = mask_to_bits(self.sgpr[:, EXEC_LO], self.sgpr[:, EXEC_LO + 1])
            self._exec_full = None
            self._exec_stale = False
        bits = self._exec[w]          # callers may narrow their mask in place: a copy
        return bits if copies(w) else bits.copy()

    def exec_all(self, w) -> bool:
        """True when EXEC of every wave in `w` is all ones."""
        if self._exec_stale:
            self.exec_bits(slice(0, 0))
        full = self._exec_full
        if full is None:
            full = self._exec_full = self._exec.all(axis=1)
        return bool(full[w].all())

    def invalidate_exec(self, index: int, count: int) -> None:
        if index <= EXEC_LO + 1 and index + count > EXEC_LO:
            self._exec_stale = True
