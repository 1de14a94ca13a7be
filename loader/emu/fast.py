"""Compiled fast paths of strict mode's bookkeeping (numba, optional).

Each function here does what a numpy path in lds.py or hazards.py does, for the common
case where nothing is to be reported; when something might be, it returns False without
touching any state and the numpy path runs (and reports). Messages and state stay those
of the numpy paths, bit for bit. Without numba installed every function here is None and
the numpy paths always run.

read_marks (lds.py, DS reads): a lockstep DS read of 32 waves touches ~8,000 dwords; lds.py's numpy version of the
checks and reader marks costs about a dozen whole-array gathers and scatters per read,
the largest single cost of a strict FMHA run. `read_marks` does the same in one compiled
pass, where every lane is ok and dword-aligned (Access.keys2 is [n, m]).

reads_settled (hazards.check_read): whether every register read has had the wait states
its last writer needs, under a table that is never below the exact need.
"""
from __future__ import annotations

try:
    from numba import njit
except ImportError:          # optional: the numpy path is complete on its own
    njit = None

SEVERAL = -2                  # lds._SEVERAL


def _read_marks(keys2, me, mine, wave, dma_pending, ds_pending, ds_owner, w_epoch, writer,
                reader, r_epoch, scratch, flag, last):
    """Checks of lds._check_pending(same_wave_ok=True) and lds._check_order(write=False)
    over keys2[n, m] (row r: wave `wave[r]`, wave_in_group `me[r]`, epoch `mine[r]`); if
    none fires, the reader marks exactly as the numpy path leaves them (duplicate keys:
    every element reads the state from before the access, the last one's write stays;
    a dword read by two waves of the access is marked SEVERAL). Returns whether it did."""
    n, m = keys2.shape
    for r in range(n):
        for j in range(m):
            k = keys2[r, j]
            if dma_pending[k] > 0 or (ds_pending[k] > 0 and ds_owner[k] != wave[r]):
                return False
            if w_epoch[k] >= mine[r] and writer[k] != me[r]:
                return False
    for r in range(n):
        for j in range(m):
            k = keys2[r, j]
            scratch[k] = me[r]
            last[k] = r * m + j
    if n > 1:
        for r in range(n):
            for j in range(m):
                k = keys2[r, j]
                if scratch[k] != me[r]:
                    flag[k] = True
    for r in range(n):
        for j in range(m):
            k = keys2[r, j]
            if last[k] != r * m + j:
                continue
            old_r, old_e = reader[k], r_epoch[k]
            if old_e <= mine[r]:
                if flag[k] or (old_e == mine[r] and old_r != -1 and old_r != me[r]):
                    reader[k] = SEVERAL
                else:
                    reader[k] = me[r]
                r_epoch[k] = mine[r]
            flag[k] = False
    return True


def _reads_settled(at, by, rows, index, count, clock, need):
    """hazards.check_read's test over the registers index..index+count-1 of the waves
    `rows` (clocks `clock`): no register is short of need[writer] wait states, or every
    writer is NONE (code 0). at/by: the written_at/written_by files of the kind."""
    any_writer = False
    short = False
    for i in range(rows.size):
        r = rows[i]
        for j in range(index, index + count):
            code = by[r, j]
            if code != 0:
                any_writer = True
            if clock[i] - at[r, j] - 1 < need[code]:
                short = True
    return not (any_writer and short)


def _compile(fn):
    return None if njit is None else njit(cache=True, nogil=True)(fn)


read_marks = _compile(_read_marks)
reads_settled = _compile(_reads_settled)
