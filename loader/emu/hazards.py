"""Wait-state hazards software must cover on gfx950 (fact sheet §4, LLVM 22's
GCNHazardRecognizer), checked in strict mode.

Each wave has a wait-state clock: every issued instruction advances it by 1 and
`s_nop N` by N+1. Every register remembers the clock value and the kind of the
instruction that last wrote it. A consumer reading (or overwriting) the register then
needs `clock_now - written_at - 1 >= required(writer, consumer)`.

These counts are the compiler's model, not silicon measurements (the fact sheet says
so); an emulator that ignored them would pass kernels that read stale MFMA results.
"""
from __future__ import annotations

import numpy as np

# Writer codes stored per register. MFMA writers store MFMA_BASE + passes.
NONE, VALU, TRANS, SALU, CVT_SCALE_HI, ACCVGPR_WRITE = range(6)
MFMA_BASE = 16

VMEM_CLASSES = ("vmem", "lds_dma")


def wait_states(inst) -> int:
    if inst.name == "s_nop":
        return int(inst.ops[0].text, 0) + 1 if inst.ops else 1
    return 1


def _required_for_read(ex, kind: str, writer: np.ndarray) -> np.ndarray:
    """Wait states the current instruction needs after each register's last writer."""
    klass, role = ex.klass, getattr(ex, "role", None)
    need = np.zeros(writer.shape, np.int64)
    mfma = writer >= MFMA_BASE
    passes = writer - MFMA_BASE
    if kind in ("v", "a"):
        if klass == "mfma":
            if role == "c":
                # Accumulating in place into the exact registers an MFMA wrote needs none;
                # other overlaps need passes + 2 (6 for 4-pass, per the fact sheet).
                same = getattr(ex, "srcc_is_dst", False)
                need = np.where(mfma, 0 if same else passes + 2, need)
                need = np.where((writer == VALU) | (writer == TRANS) | (writer == ACCVGPR_WRITE), 2, need)
            else:
                need = np.where(mfma, passes + 4, need)
                need = np.where((writer == VALU) | (writer == TRANS), 2, need)
        else:
            # VALU, accvgpr reads, VMEM/DS store data: an XDL result needs passes + 4.
            need = np.where(mfma, passes + 4, need)
            if klass == "valu":
                need = np.where((writer == TRANS) | (writer == CVT_SCALE_HI), 1, need)
            if role == "dpp" or role == "permlane":
                need = np.where(writer == VALU, 2, need)
            if role == "readlane":
                need = np.where(writer == VALU, np.maximum(need, 1), need)
    else:  # SGPRs
        if klass in VMEM_CLASSES:
            need = np.where(writer == VALU, 5, need)
        elif klass in ("valu", "trans"):
            need = np.where(writer == VALU, 4 if role == "lane_select" else 2, need)
        if role == "m0_dma":
            need = np.where(writer == SALU, 1, need)
    return need


def check_read(ex, kind: str, w, index: int, count: int) -> None:
    if not ex.strict:
        return
    waves = ex.waves
    writer = waves.written_by[kind][w, index:index + count]
    if not writer.any():
        return
    need = _required_for_read(ex, kind, writer)
    gap = waves.clock[w][:, None] - waves.written_at[kind][w, index:index + count] - 1
    short = gap < need
    if short.any():
        row, col = np.argwhere(short)[0]
        ex.hazard(w, short.any(axis=1),
                  f"{kind}{index + col} read {int(gap[row, col])} wait states after "
                  f"{_writer_name(int(writer[row, col]))} wrote it; {int(need[row, col])} are required "
                  f"(insert s_nop)")


def check_write(ex, kind: str, w, index: int, count: int) -> None:
    """WAW: overwriting an MFMA result before the MFMA has finished writing it."""
    if not ex.strict or kind == "s" or ex.klass == "mfma" or ex.klass in VMEM_CLASSES + ("ds", "smem"):
        return
    waves = ex.waves
    writer = waves.written_by[kind][w, index:index + count]
    mfma = writer >= MFMA_BASE
    if not mfma.any():
        return
    gap = waves.clock[w][:, None] - waves.written_at[kind][w, index:index + count] - 1
    short = mfma & (gap < writer - MFMA_BASE + 4)
    if short.any():
        row, col = np.argwhere(short)[0]
        ex.hazard(w, short.any(axis=1),
                  f"{kind}{index + col} overwritten {int(gap[row, col])} wait states after an MFMA "
                  f"wrote it; {int(writer[row, col]) - MFMA_BASE + 4} are required")


def before_issue(ex, w) -> None:
    """Hazards on EXEC: a VALU write of EXEC needs 5 wait states before DPP, 4 before MFMA."""
    if not ex.strict:
        return
    need = 5 if getattr(ex.inst, "enc", "") == "dpp" else 4 if ex.klass == "mfma" else 0
    if need:
        gap = ex.waves.clock[w] - ex.waves.exec_written_at[w] - 1
        short = gap < need
        if short.any():
            ex.hazard(w, short, f"EXEC written by VALU {int(gap[short][0])} wait states earlier; "
                                f"{need} are required before {'DPP' if need == 5 else 'MFMA'}")


def _writer_name(code: int) -> str:
    if code >= MFMA_BASE:
        return f"a {code - MFMA_BASE}-pass MFMA"
    return {VALU: "a VALU op", TRANS: "a transcendental op", SALU: "a SALU op",
            CVT_SCALE_HI: "v_cvt_scalef32 (high half)", ACCVGPR_WRITE: "v_accvgpr_write"}.get(code, "?")
