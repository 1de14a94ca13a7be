"""Compiled fast paths of strict mode's bookkeeping (numba, optional).

Each function here does what a numpy path in lds.py, hazards.py, machine.py or a family
module does. The checks do it for the common case where nothing is to be reported; when
something might be, they return False without touching any state and the numpy path runs
(and reports). Messages, state and results stay those of the numpy paths, bit for bit.

read_checks and mark_reads (read_dwords, lds.LdsTracker.settle): a lockstep DS read of
32 waves touches ~8,000 dwords; lds.py's numpy version of the checks and reader marks
costs about a dozen whole-array gathers and scatters per read, the largest single cost
of a strict FMHA run. read_dwords does the whole of such a read where every lane is ok
and dword-aligned: addresses to keys, read_checks (one compiled pass), the data; its
reader marks are deferred (lds.LdsTracker.defer) and mark_reads applies them, in read
order, only before something consults them, and not at all for a read that no later
access can race with any more (LdsTracker.settle says why that is exact).

write_marks (lds.write and lds.dma_reserve): the same for a DS write or an LDS DMA of
whole dwords with every lane active: lds._check_pending, lds._check_order(write=True) and
_in_flight's in-flight marks in three compiled passes (five where several waves of the
access write one dword) instead of some twenty numpy gathers and scatters.

release (lds._release): a write's in-flight counts taken down and its writes completed
when it retires, without the per-key wave and epoch gathers of the numpy path.

busy_add (Executor._busy_add): a load's in-flight counts per register, both files of
them in one pass instead of two fancy-indexed read-modify-writes.

record (Executor.record_write): a register write's clock and writer code into the
per-wave records, one pass instead of two fancy-indexed scatters.

flush_f32 (families/vop.py flush_denorms): f32 denormals to signed zero in place, one
pass instead of numpy's abs, compare, any (and where, cast when one is found).

reads_settled (hazards.check_read): whether every register read has had the wait states
its last writer needs; for an MFMA's srcC, with the exact-destination ("FullReg") rule
decided per wave as hazards._full_reg decides it, under the other tables a table that is
never below the exact need.

writes_settled (hazards.check_write): whether a register write leaves every WAW, srcC WAR
and wide-store WAR rule met, i.e. whether check_write's numpy path would report nothing
(that path gathers six per-wave records; it runs only when this says it might).

valu_f32 (families/vop.py valu, vop3p.py v_pk_mul/add_f32): v_add/sub/subrev/mul_f32,
v_fma/fmac_f32 and v_min/max/min3/max3_f32 (the ISA pseudocode's NaN, signaling-NaN and
signed-zero rules, as vop._select_f32) without DPP, SDWA or output modifiers, from VGPR, SGPR or constant
sources, and the packed f32 mul/add on VGPR pairs, in one pass per wave: the sources'
denormal flush (where MODE flushes) and neg/abs, the operation, the result's flush, the
EXEC-masked write. The arithmetic is numpy's, operation by operation (f32 ops in f32;
fma's product and sum in float64, then one rounding); NaNs as x86 gives them for numpy
(_nan_or).

pk_bf16 (families/cvt.py v_cvt_pk_bf16_f32): both sources' f32 bits rounded to bf16 by
cvt._bf16_rne_bits' integer RNE (flush, abs, neg on the bits) and packed, in one pass;
it declines where any lane holds a NaN (numerics' quiet-NaN rule then runs).

numba is imported, and the functions compiled (or loaded from numba's cache), on the
first launch that uses them: about 1 s of CPU once per process, so strict launches of
fewer than MIN_WAVES waves (unit tests, small kernels) keep to the numpy paths. Without
numba, or with GFXASM_EMU_NUMBA=0 in the environment, every launch does.
"""
from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import numpy as np

MIN_WAVES = 64
_loaded: list = []            # [namespace or None] once kernels() has run
_load_lock = threading.Lock()
read_checks = None            # the compiled _read_checks, which _read_dwords calls


def kernels() -> SimpleNamespace | None:
    """The compiled functions (the module docstring's), or None.

    Set up exactly once per process, also when several threads make their first strict
    launch at the same time: _load rebinds module globals (the compiled functions that
    other compiled functions call by name), and two threads running it at once made the
    second jit an already jitted function (issue 26, crash 5). Double-checked: the lock
    is taken only until the namespace is there; _loaded is filled last, after every
    global it depends on is bound."""
    if not _loaded:
        with _load_lock:
            if not _loaded:
                _loaded.append(_load())
    return _loaded[0]


def for_launch(strict: bool, waves: int) -> SimpleNamespace | None:
    """kernels() for a strict launch of at least MIN_WAVES waves, else None."""
    return kernels() if strict and waves >= MIN_WAVES else None


def _load() -> SimpleNamespace | None:
    global read_checks, _full_reg, _reads_settled, _flush_f32, _nan_or, _pick    # called by other compiled functions
    if os.environ.get("GFXASM_EMU_NUMBA") == "0":
        return None
    try:
        from numba import njit
    except ImportError:          # optional: the numpy paths are complete on their own
        return None
    jit = njit(cache=True, nogil=True)
    _full_reg = jit(_full_reg)
    _reads_settled = jit(_reads_settled)
    _flush_f32 = jit(_flush_f32)
    _nan_or = jit(_nan_or)
    _pick = jit(_pick)
    read_checks = jit(_read_checks)
    return SimpleNamespace(read_checks=read_checks, mark_reads=jit(_mark_reads), key_bounds=jit(_key_bounds),
                           deferred_fate=jit(_deferred_fate), reads_settled=_reads_settled,
                           read_dwords=jit(_read_dwords),
                           writes_settled=jit(_writes_settled), write_marks=jit(_write_marks),
                           flush_f32=_flush_f32, record=jit(_record), release=jit(_release),
                           busy_add=jit(_busy_add), valu_f32=jit(_valu_f32),
                           pk_bf16=jit(_pk_bf16))


SEVERAL = -2                  # lds._SEVERAL
PENDING = np.iinfo(np.int32).max     # lds._PENDING


def _read_checks(keys2, me, mine, wave, dma_pending, ds_pending, ds_owner, w_epoch, writer):
    """The checks of lds._check_pending(same_wave_ok=True) and lds._check_order(write=False)
    over keys2[n, m] (row r: wave `wave[r]`, wave_in_group `me[r]`, epoch `mine[r]`):
    True where neither would report. Touches no state."""
    n, m = keys2.shape
    for r in range(n):
        for j in range(m):
            k = keys2[r, j]
            if dma_pending[k] > 0 or (ds_pending[k] > 0 and ds_owner[k] != wave[r]):
                return False
            if w_epoch[k] >= mine[r] and writer[k] != me[r]:
                return False
    return True


def _mark_reads(keys2, me, mine, reader, r_epoch, scratch, flag, last):
    """The reader marks of lds._check_order(write=False) for a read whose checks passed,
    exactly as the numpy path leaves them (duplicate keys: every element reads the state
    from before the access, the last one's write stays; a dword read by two waves of the
    access is marked SEVERAL). scratch, flag and last are scratch (flag all False after)."""
    n, m = keys2.shape
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


def _key_bounds(keys2, dwords, wlo, whi):
    """wlo[s], whi[s]: the lowest and highest of keys2's keys in slot s (key // dwords);
    slots with none keep what they held (an empty range: wlo > whi)."""
    n, m = keys2.shape
    for r in range(n):
        for j in range(m):
            k = keys2[r, j]
            s = k // dwords
            wlo[s] = min(wlo[s], k)
            whi[s] = max(whi[s], k)


def _deferred_fate(lo, hi, mine, dwords, low, wlo, whi):
    """What lds.LdsTracker.settle does with a deferred read whose row r covers keys
    lo[r]..hi[r] at epoch mine[r]: 0 drop it (every row's epoch is below low[s], the
    lowest epoch of its workgroup s = lo[r] // dwords), 1 keep it deferred (live, but no
    row's range meets wlo[s]..whi[s]), 2 mark it now."""
    live = False
    for r in range(lo.size):
        s = lo[r] // dwords
        if mine[r] >= low[s]:
            live = True
            if lo[r] <= whi[s] and hi[r] >= wlo[s]:
                return 2
    return 1 if live else 0


MFMA_BASE = 16                # hazards.MFMA_BASE: codes from here on are MFMA writers


def _release(keys2, row_waves, counts, ordered, writer, w_epoch, wave_in_group, epoch):
    """lds._release of every row of a write whose keys are keys2[n, m] (row r: wave
    row_waves[r]): counts[key] = max(counts[key] - 1, 0) once per distinct key (all read
    before any is written, as numpy's assignment), then, where `ordered`, lds._complete:
    a dword still marked written by the row's wave completes in that wave's epoch."""
    n, m = keys2.shape
    dec = np.empty(n * m, counts.dtype)
    for r in range(n):
        for j in range(m):
            c = counts[keys2[r, j]] - 1
            dec[r * m + j] = c if c > 0 else 0
    for r in range(n):
        for j in range(m):
            counts[keys2[r, j]] = dec[r * m + j]
    if ordered:
        for r in range(n):
            me, ep = wave_in_group[row_waves[r]], epoch[row_waves[r]]
            for j in range(m):
                k = keys2[r, j]
                if writer[k] == me:
                    w_epoch[k] = ep


def _busy_add(busy, busy_in, rows, index, count, delta):
    """busy and busy_in [rows[i], index:index+count] += delta (rows distinct)."""
    for i in range(rows.size):
        r = rows[i]
        for j in range(index, index + count):
            busy[r, j] += delta
            busy_in[r, j] += delta


def _record(at, by, rows, index, count, clock, writer):
    """at[rows[i], index:index+count] = clock[i]; by[...] = writer (row order: the last
    of repeated rows wins, as numpy's assignment leaves it)."""
    for i in range(rows.size):
        r = rows[i]
        for j in range(index, index + count):
            at[r, j] = clock[i]
            by[r, j] = writer


def _flush_f32(bits):
    """bits: uint32 (flat) f32 patterns; denormals become the zero of their sign, in place:
    |x| < 2^-126 with x not zero is exactly a zero exponent field and a non-zero fraction."""
    for i in range(bits.size):
        b = bits[i]
        if b & 0x7F800000 == 0 and b & 0x7FFFFF != 0:
            bits[i] = b & 0x80000000


def _write_marks(keys2, me, mine, wave, values, has_values, same_wave_ok, owner, counts, lds32, dma_pending,
                 ds_pending, ds_owner, w_epoch, writer, reader, r_epoch, by_dma, dma_value, flag, last):
    """Checks of lds._check_pending and lds._check_order(write=True) over keys2[n, m]
    (row r: wave `wave[r]`, wave_in_group `me[r]`, epoch `mine[r]`; `values` [n, m] the
    dwords an LDS DMA lands where has_values); if none fires, the write marks of
    _check_order and the in-flight marks of lds._in_flight into `counts` (ds_owner too
    where `owner`) exactly as the numpy paths leave them: duplicate keys count once, the
    last element's marks stay. Returns whether it did; flag and last are scratch."""
    n, m = keys2.shape
    for r in range(n):
        for j in range(m):
            last[keys2[r, j]] = r * m + j
    ok = True
    several = False
    for r in range(n):
        for j in range(m):
            k = keys2[r, j]
            # _same_dma: a whole-dword DMA landing what the last write there leaves
            left = dma_value[k] if dma_pending[k] > 0 else lds32[k]
            same = has_values and by_dma[k] and values[r, j] == left
            if dma_pending[k] > 0 and not same:
                ok = False
            elif ds_pending[k] > 0 and (not same_wave_ok or ds_owner[k] != wave[r]):
                ok = False
            elif w_epoch[k] >= mine[r] and writer[k] != me[r] and not same:
                ok = False
            elif reader[k] != -1 and reader[k] != me[r] and r_epoch[k] >= mine[r]:
                ok = False
            else:
                e = last[k]
                if me[e // m] != me[r]:
                    flag[k] = True        # several waves write this dword (lds.several)
                    several = True
            if not ok:
                break
        if not ok:
            break
    if several:                           # flags set: test them, then clear them
        for r in range(n):
            for j in range(m):
                k = keys2[r, j]
                e = last[k]
                if flag[k] and (not has_values or values[r, j] != values[e // m, e % m]):
                    ok = False
        for r in range(n):
            for j in range(m):
                flag[keys2[r, j]] = False
    if not ok:
        return False
    for r in range(n):
        for j in range(m):
            k = keys2[r, j]
            writer[k] = me[r]
            w_epoch[k] = PENDING
            by_dma[k] = has_values
            if has_values:
                dma_value[k] = values[r, j]
            if last[k] == r * m + j:
                counts[k] += 1
                if owner:
                    ds_owner[k] = wave[r]
    return True


def _reads_settled(at, by, rows, index, count, clock, need, full_need, srcc):
    """hazards.check_read's test over the registers index..index+count-1 of the waves
    `rows` (clocks `clock`): no register is short of need[writer] wait states, or every
    writer is NONE (code 0). at/by: the written_at/written_by files of the kind. srcc (an
    MFMA's srcC): a wave whose registers are exactly one MFMA's destination (hazards._full_reg)
    is held to full_need[writer] instead."""
    any_writer = False
    short = False
    nregs = by.shape[1]
    for i in range(rows.size):
        r = rows[i]
        table = need
        if srcc and _full_reg(at, by, r, index, count, nregs):
            table = full_need
        for j in range(index, index + count):
            code = by[r, j]
            if code != 0:
                any_writer = True
            if clock[i] - at[r, j] - 1 < table[code]:
                short = True
    return not (any_writer and short)


def _full_reg(at, by, r, index, count, nregs):
    """hazards._full_reg for wave row r: every register written by one MFMA (same writer
    code, same clock), and neither neighbour written by it too."""
    at0, by0 = at[r, index], by[r, index]
    for j in range(index, index + count):
        if by[r, j] < MFMA_BASE or at[r, j] != at0 or by[r, j] != by0:
            return False
    for nb in (index - 1, index + count):
        if 0 <= nb < nregs and at[r, nb] == at0 and by[r, nb] == by0:
            return False
    return True


def _writes_settled(at, by, need, srcc_at, srcc_passes, store_at, store_window, side, valu, rows, index,
                    count, clock):
    """hazards.check_write's three tests over the registers index..index+count-1 of the
    waves `rows` (clocks `clock`), each as its numpy path decides whether to report: the
    WAW test (need[writer]) where some writer code is not 0, the srcC WAR test (passes-1)
    where some srcC passes are not 0, the wide-store test (window) where some window is not
    0 and `valu`; the last two only with `side` (hazards._Side exists). True: none reports."""
    if not _reads_settled(at, by, rows, index, count, clock, need, need, False):
        return False                      # the WAW test is check_read's
    if not side:
        return True
    any_p = any_s = False
    short_p = short_s = False
    for i in range(rows.size):
        r = rows[i]
        for j in range(index, index + count):
            p = srcc_passes[r, j]
            if p != 0:
                any_p = True
            if clock[i] - srcc_at[r, j] - 1 < (p - 1 if p > 0 else 0):
                short_p = True
            s = store_window[r, j]
            if s != 0:
                any_s = True
            if clock[i] - store_at[r, j] - 1 < s:
                short_s = True
    return not ((any_p and short_p) or (valu and any_s and short_s))


def _read_dwords(addr, mask, slot, dwords, size, lds32, out, lo, hi, me, mine, wave, dma_pending, ds_pending,
                 ds_owner, w_epoch, writer, align):
    """lds.read of whole dwords for waves whose lanes are all active, in range and
    aligned to `align` (a multiple of 4): lds.access's keys (lane l of row r: nbytes/4
    keys from slot[r] * dwords + addr[r, l] // 4; each row's lowest and highest into lo[n],
    hi[n]), read_checks on them, and the data into out[n, 64, nbytes/4] (uint32); the
    reader marks are left to the caller (lds.LdsTracker.defer). Returns False, with no
    state touched, where any of that does not hold or a check would fire (lds.py then
    runs its numpy path)."""
    n, lanes, per = out.shape
    nbytes = 4 * per
    for r in range(n):
        for lane in range(lanes):
            a = addr[r, lane]
            if not mask[r, lane] or a < 0 or a + nbytes > size or a % align != 0:
                return False
    keys2 = np.empty((n, lanes * per), np.int64)
    for r in range(n):
        base = slot[r] * dwords
        lo[r] = hi[r] = base + addr[r, 0] // 4
        for lane in range(lanes):
            first = base + addr[r, lane] // 4
            lo[r] = min(lo[r], first)
            hi[r] = max(hi[r], first + per - 1)
            for d in range(per):
                keys2[r, lane * per + d] = first + d
    if not read_checks(keys2, me, mine, wave, dma_pending, ds_pending, ds_owner, w_epoch, writer):
        return False
    for r in range(n):
        for lane in range(lanes):
            for d in range(per):
                out[r, lane, d] = lds32[keys2[r, lane * per + d]]
    return True


VALU_F32 = {"v_add_f32": 0, "v_sub_f32": 1, "v_subrev_f32": 2, "v_mul_f32": 3, "v_fma_f32": 4, "v_fmac_f32": 4,
            "v_max_f32": 5, "v_min_f32": 6, "v_max3_f32": 7, "v_min3_f32": 8}
VALU_F32_THREE = (4, 7, 8)        # codes with three sources
_QUIET = 0x00400000


def _valu_f32(code, file32, rows, regs, scalars, neg, absolute, flush, ieee, dst, exec_bits, every):
    """The VALU_F32 operation `code` (min/max/min3/max3: by _pick, under MODE.IEEE where
    `ieee`) for the waves rows[i] and their lanes where exec_bits[i] (every: all), into
    file32[rows[i], dst + h] for each half h (the VGPR file
    as float32; two halves: a packed f32 op, v_pk_*_f32). Source s of half h: VGPR
    regs[h, s] of the same wave and lane, or where regs[h, s] < 0 the per-wave value
    scalars[h, s, i] (SGPR or constant as f32 bits, viewed as float32); then, as vop._read:
    flushed where `flush`, abs, neg. Every source of every half is read before any result
    is written. One wave at a time, each step a loop over the lanes (compiled to vector
    instructions)."""
    lanes = file32.shape[2]
    halves = regs.shape[0]
    nsrc = 3 if code in VALU_F32_THREE else 2
    t = np.empty((halves, 3, lanes), np.float32)
    y = np.empty((halves, lanes), np.float32)
    first, second = (1, 0) if code == 2 else (0, 1)
    for i in range(rows.size):
        r = rows[i]
        for h in range(halves):
            for s in range(nsrc):
                src = t[h, s]
                if regs[h, s] >= 0:
                    src[:] = file32[r, regs[h, s]]
                else:
                    src[:] = scalars[h, s, i]
                if flush:
                    _flush_f32(src.view(np.uint32))
                if absolute[h, s]:
                    for lane in range(lanes):
                        src[lane] = abs(src[lane])
                if neg[h, s]:
                    for lane in range(lanes):
                        src[lane] = -src[lane]
        for h in range(halves):
            a, b, out = t[h, first], t[h, second], y[h]
            if code == 4:
                c = t[h, 2]
                for lane in range(lanes):
                    pa, pb, pc = np.float64(a[lane]), np.float64(b[lane]), np.float64(c[lane])
                    p = _nan_or(pa, pb, pa * pb)
                    out[lane] = np.float32(_nan_or(p, pc, p + pc))
            elif code >= 5:
                bits, is_max = out.view(np.uint32), code % 2 == 1
                ab, bb = a.view(np.uint32), b.view(np.uint32)
                for lane in range(lanes):
                    bits[lane] = _pick(ieee, is_max, a[lane], b[lane], ab[lane], bb[lane])
                if code >= 7:                 # min3/max3: the first pick's result against S2
                    c = t[h, 2]
                    cb = c.view(np.uint32)
                    for lane in range(lanes):
                        bits[lane] = _pick(ieee, is_max, out[lane], c[lane], bits[lane], cb[lane])
            elif code == 3:
                for lane in range(lanes):
                    out[lane] = _nan_or(a[lane], b[lane], a[lane] * b[lane])
            elif code == 0:
                for lane in range(lanes):
                    out[lane] = _nan_or(a[lane], b[lane], a[lane] + b[lane])
            else:
                for lane in range(lanes):
                    out[lane] = _nan_or(a[lane], b[lane], a[lane] - b[lane])
            if flush:
                _flush_f32(out.view(np.uint32))
        for h in range(halves):
            reg = file32[r, dst + h]
            for lane in range(lanes):
                if every or exec_bits[i, lane]:
                    reg[lane] = y[h, lane]


def _pick(ieee, is_max, a, b, abits, bbits):
    """The bits of v_max_f32 (is_max) or v_min_f32 of a and b (float32 values, abits and
    bbits their patterns) as vop._select_f32 gives them (the ISA pseudocode): under
    MODE.IEEE a signaling NaN a, else b, quieted; a NaN a gives b, a NaN b gives a; else
    the larger (smaller) with -0 < +0, of equal values b."""
    a_nan, b_nan = a != a, b != b
    if ieee and a_nan and (abits & _QUIET) == 0:
        return abits | _QUIET
    if ieee and b_nan and (bbits & _QUIET) == 0:
        return bbits | _QUIET
    if a_nan:
        return bbits
    if b_nan:
        return abits
    zeros = a == 0 and b == 0 and (abits >> 31) != (bbits >> 31)     # -0 against +0
    if is_max:
        take_a = a > b or (zeros and (abits >> 31) == 0)
    else:
        take_a = a < b or (zeros and (abits >> 31) == 1)
    return abits if take_a else bbits


def _nan_or(a, b, y):
    """y = a op b as x86 gives it for numpy: a NaN a quieted, else a NaN b quieted (both
    explicit: LLVM may commute an operation or fold a - b into a + -b, which would move
    or negate a NaN), else y."""
    if a != a:
        return a + a
    if b != b:
        return b + b
    return y


def _pk_bf16(file, rows, regs, flush, absolute, neg, out):
    """out[i, lane] = bf16(VGPR regs[0]) | bf16(VGPR regs[1]) << 16 of wave rows[i] (file:
    the VGPR file as uint32), each by integer RNE on the f32 bits after the denormal flush
    (where `flush`), abs and neg of its source. Returns False, out partly written, where a
    lane of either source is a NaN."""
    for i in range(rows.size):
        r = rows[i]
        for lane in range(file.shape[2]):
            packed = 0
            for s in range(2):
                bits = np.int64(file[r, regs[s], lane])
                if bits & 0x7FFFFFFF > 0x7F800000:
                    return False
                if flush and bits & 0x7F800000 == 0:
                    bits &= 0x80000000
                if absolute[s]:
                    bits &= 0x7FFFFFFF
                if neg[s]:
                    bits ^= 0x80000000
                packed |= ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << (16 * s)
            out[i, lane] = packed
    return True
