"""The executor: launch state, the scheduler, operand access and the in-flight model.

Waves that stand at the same pc — across the waves of a workgroup and across
workgroups — execute each instruction as one numpy operation. The scheduler always
advances the group at the lowest pc, so waves that fell behind catch up and merge.

Under another `schedule` (adversarial.py: random legal orders; gfxasm.perf.timed: orders from cycle
clocks) waves run in its order, loads land when it says, and a register read while its
load is in flight sees the value from before the load.

Strict mode (the default) reports as `HazardError`:
  * reading or overwriting a register while a load into it is still in flight
    (results land only when the `s_waitcnt` that covers them retires);
  * LDS bytes touched by another wave (or read at all, for LDS DMA) while a write to
    them is still in flight;
  * the wait-state hazards of hazards.py;
  * two workgroups touching the same global bytes with nothing ordering them (races.py).
"""
from __future__ import annotations

from collections import deque
from itertools import repeat
from operator import is_, itemgetter

import numpy as np

from . import fast, hazards
from .decode import Inst, Operand, SGPR_FILE
from .errors import EmulatorError, HazardError, MemoryFault
from .lds import LdsTracker
from .memory import Memory, OutOfBounds
from .registry import lookup
from .state import EXEC_LO, LANES, Pending, Waves, copies as _copies, mask_to_bits

_first = itemgetter(0)
_F32_INLINE = {"0.5": 0x3F000000, "-0.5": 0xBF000000, "1.0": 0x3F800000, "-1.0": 0xBF800000,
               "2.0": 0x40000000, "-2.0": 0xC0000000, "4.0": 0x40800000, "-4.0": 0xC0800000,
               "0.15915494": 0x3E22F983}
_F16_INLINE = {"0.5": 0x3800, "-0.5": 0xB800, "1.0": 0x3C00, "-1.0": 0xBC00, "2.0": 0x4000,
               "-2.0": 0xC000, "4.0": 0x4400, "-4.0": 0xC400, "0.15915494": 0x3118}
_F64_INLINE = {"0.5": 0x3FE0000000000000, "-0.5": 0xBFE0000000000000, "1.0": 0x3FF0000000000000,
               "-1.0": 0xBFF0000000000000, "2.0": 0x4000000000000000, "-2.0": 0xC000000000000000,
               "4.0": 0x4010000000000000, "-4.0": 0xC010000000000000,
               "0.15915494": 0x3FC45F306DC9C882}


def imm_bits(op: Operand, width: int = 32, fp16: bool = False) -> int:
    """The bit pattern an immediate operand supplies to a `width`-bit operand."""
    text = op.text
    if text in _F32_INLINE:
        if fp16:
            return _F16_INLINE[text]
        return _F64_INLINE[text] if width == 64 else _F32_INLINE[text]
    value = int(text, 0)
    # Inline integers (-16..64) sign-extend; 32-bit literals zero-extend into 64 bits.
    if width == 64 and -16 <= value < 0:
        return value & 0xFFFFFFFFFFFFFFFF
    return value & 0xFFFFFFFF


class Executor:
    def __init__(self, program, kernel_name: str, waves: Waves, memory: Memory, *,
                 strict: bool, denorm_f32: bool, denorm_f16: bool, ieee_mode: bool, wave_names,
                 fp16_ovfl: bool = False):
        self.program = program
        self.kernel_name = kernel_name
        self.waves = waves
        self.memory = memory
        self.strict = strict
        self.denorm_f32 = denorm_f32          # True: f32 denormals kept; False: flushed
        self.denorm_f16 = denorm_f16
        self.fp16_ovfl = fp16_ovfl            # MODE.FP16_OVFL: fp8 conversions saturate
        self.ieee_mode = ieee_mode            # MODE.IEEE: v_min/max/med3_f32 quiet signaling NaNs
        self.wave_names = wave_names          # callable(wave index) -> "workgroup (x,y,z) wave i"
        self.lds = LdsTracker(waves.lds.shape[0], waves.lds_bytes, waves.count, strict)
        self.fast = fast.for_launch(strict, waves.count)    # compiled bookkeeping, or None
        self.inst: Inst | None = None
        self.klass = ""
        self.wave_instructions = 0
        self.trace = None                     # optional callable(inst, w) for the timing model
        self.waived: frozenset[str] = frozenset()   # hazard rules not enforced (hazards.WAIVABLE)
        self.srcc_noted: list = []
        self.mode_split = None                # set while a wave has VSKIP or GPR index mode on
        self.schedule = None                  # adversarial.Adversarial, perf.timed.Timed; None: lockstep
        self._clock_w = None                  # clocks()'s cache: the `w` it was computed for
        self._clocks = (None, 0, 0)
        self._ids = np.arange(waves.count)   # wave_ids' source, made once per launch
        self._ids.flags.writeable = False
        # Global memory across workgroups (races.py): the launch's record, or None; and the
        # linear workgroup id (serial order) of each wave, which the kernel sets per batch.
        self.accesses = None
        self.group_ids: np.ndarray | None = None

    # ----------------------------------------------------------------- errors
    def where(self, wave: int | None = None) -> str:
        inst = self.inst
        at = f"kernel {self.kernel_name}"
        if wave is not None:
            at += f", {self.wave_names(wave)}"
        if inst is not None:
            at += f", pc {inst.pc:#x} `{inst.text}`"
        return at

    def hazard(self, w, rows: np.ndarray, message: str):
        if not self.strict:
            return
        waves = self.wave_ids(w)
        first = int(waves[int(np.flatnonzero(rows)[0])]) if rows.any() else None
        raise HazardError(f"{message} ({self.where(first)})")

    def wave_ids(self, w) -> np.ndarray:
        """The wave indices `w` selects (read-only: a view when w is a slice)."""
        return self._ids[w]

    def fault(self, w, err: OutOfBounds, what: str, lanes: int = LANES):
        waves = self.wave_ids(w)
        row, lane = divmod(err.position, lanes)
        raise MemoryFault(f"{what} at address {err.address:#x} ({err.nbytes} bytes, lane {lane}) "
                          f"is outside every registered buffer ({self.where(int(waves[row]))})")

    # ------------------------------------------------------------ exec / masks
    def exec_bits(self, w) -> np.ndarray:
        return self.waves.exec_bits(w)

    def exec_mask(self, w) -> np.ndarray | None:
        """set_v's mask for an EXEC-masked write: None (every lane, no per-lane test) when
        EXEC is all ones in every wave of `w`, else exec_bits(w)."""
        return None if self.waves.exec_all(w) else self.waves.exec_bits(w)

    def lane_mask(self, op: Operand, w) -> np.ndarray:
        """bool[n,64] from a 64-bit SGPR-pair operand (vcc, s[2:3], or an inline constant)."""
        if op.kind == "imm":
            v = imm_bits(op, 64)
            lo = np.full(self._n(w), v & 0xFFFFFFFF, np.uint32)
            hi = np.full(self._n(w), v >> 32, np.uint32)
            return mask_to_bits(lo, hi)
        self.check_read("s", w, op.index, 2)
        return mask_to_bits(self.waves.sgpr[w, op.index], self.waves.sgpr[w, op.index + 1])

    def _n(self, w) -> int:
        return len(self.wave_ids(w))

    # ------------------------------------------------------------ scalar access
    def s32(self, op: Operand, w, fp16: bool = False) -> np.ndarray:
        if op.kind == "s":
            self.check_read("s", w, op.index, 1)
            return self.waves.sgpr[w, op.index].copy()
        if op.kind == "imm":
            return np.full(self._n(w), imm_bits(op, 32, fp16), np.uint32)
        if op.kind == "scc":
            return self.waves.scc[w].astype(np.uint32)
        raise EmulatorError(f"operand {op.text} is not a scalar source ({self.where()})")

    def s64(self, op: Operand, w) -> np.ndarray:
        if op.kind == "s":
            self.check_read("s", w, op.index, 2)
            lo = self.waves.sgpr[w, op.index].astype(np.uint64)
            hi = self.waves.sgpr[w, op.index + 1].astype(np.uint64)
            return lo | (hi << np.uint64(32))
        if op.kind == "imm":
            return np.full(self._n(w), imm_bits(op, 64), np.uint64)
        if op.kind == "scc":
            return self.waves.scc[w].astype(np.uint64)
        raise EmulatorError(f"operand {op.text} is not a scalar source ({self.where()})")

    def sregs(self, op: Operand, w, count: int) -> np.ndarray:
        """uint32[n, count]: consecutive SGPRs (buffer descriptors, address pairs)."""
        if op.kind != "s" or op.count < count:
            raise EmulatorError(f"operand {op.text} is not {count} SGPRs ({self.where()})")
        self.check_read("s", w, op.index, count)
        return self.waves.sgpr[w, op.index:op.index + count].copy()

    def set_s32(self, op: Operand, w, value: np.ndarray, writer: int = hazards.SALU):
        self.write_regs("s", w, op.index, 1)
        self.waves.sgpr[w, op.index] = value
        self.record_write("s", w, op.index, 1, writer)

    def set_s64(self, op: Operand, w, value: np.ndarray, writer: int = hazards.SALU):
        value = np.asarray(value, dtype=np.uint64)
        self.write_regs("s", w, op.index, 2)
        self.waves.sgpr[w, op.index] = (value & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        self.waves.sgpr[w, op.index + 1] = (value >> np.uint64(32)).astype(np.uint32)
        self.record_write("s", w, op.index, 2, writer)
        if op.index == EXEC_LO and writer == hazards.VALU:
            self.waves.exec_written_at[w] = self.waves.clock[w]
            self.waves.exec_valu_written = True

    # ------------------------------------------------------------ vector access
    def v32(self, op: Operand, w, fp16: bool = False) -> np.ndarray:
        """uint32[n, 64] from a VGPR/AGPR, or an SGPR/constant broadcast to all lanes."""
        if op.kind in ("v", "a"):
            self.check_read(op.kind, w, op.index, 1)
            bits = self.waves.file(op.kind)[w, op.index]
            return bits if _copies(w) else bits.copy()
        return np.repeat(self.s32(op, w, fp16)[:, None], LANES, axis=1)

    def v64(self, op: Operand, w) -> np.ndarray:
        """uint64[n, 64] from a register pair or a 64-bit scalar/constant."""
        if op.kind in ("v", "a"):
            self.check_read(op.kind, w, op.index, 2)
            f = self.waves.file(op.kind)
            lo = f[w, op.index].astype(np.uint64)
            hi = f[w, op.index + 1].astype(np.uint64)
            return lo | (hi << np.uint64(32))
        return np.repeat(self.s64(op, w)[:, None], LANES, axis=1)

    def vregs(self, op: Operand, w, count: int) -> np.ndarray:
        """uint32[n, count, 64]: consecutive VGPRs or AGPRs (MFMA operands, store data)."""
        if op.kind not in ("v", "a") or op.count != count:
            raise EmulatorError(f"operand {op.text} is not {count} vector registers ({self.where()})")
        self.check_read(op.kind, w, op.index, count)
        return self.waves.file(op.kind)[w, op.index:op.index + count].copy()

    def set_v(self, op: Operand, w, value: np.ndarray, mask: np.ndarray, writer: int = hazards.VALU):
        """Write uint32[n,64] (one register) or [n,k,64] (k registers) where mask[n,64]
        (mask None: all lanes)."""
        if op.kind not in ("v", "a"):
            raise EmulatorError(f"operand {op.text} is not a vector register ({self.where()})")
        value = np.asarray(value, dtype=np.uint32)
        k = 1 if value.ndim == 2 else value.shape[1]
        self.write_regs(op.kind, w, op.index, k)
        f = self.waves.file(op.kind)
        if mask is not None and mask.all():
            mask = None
        if mask is None:                    # every lane
            if value.ndim == 2:
                f[w, op.index] = value
            else:
                f[w, op.index:op.index + k] = value
        elif value.ndim == 2:
            f[w, op.index] = np.where(mask, value, f[w, op.index])
        else:
            cur = f[w, op.index:op.index + k]
            f[w, op.index:op.index + k] = np.where(mask[:, None, :], value, cur)
        self.record_write(op.kind, w, op.index, k, writer)

    def set_v_f32(self, op: Operand, w, value: np.ndarray, writer: int):
        """Write float64[n,k,64] rounded to f32 (RNE, numpy's cast) into k registers, every
        lane: set_v(op, w, value.astype(np.float32).view(np.uint32), None, writer), with the
        rounding done straight into the register file."""
        if op.kind not in ("v", "a"):
            raise EmulatorError(f"operand {op.text} is not a vector register ({self.where()})")
        k = value.shape[1]
        self.write_regs(op.kind, w, op.index, k)
        f = self.waves.file(op.kind)
        if isinstance(w, slice):
            np.copyto(f[w, op.index:op.index + k].view(np.float32), value, casting="same_kind")
        else:                               # the same cast, scattered without a float32 copy
            f.view(np.float32)[w, op.index:op.index + k] = value
        self.record_write(op.kind, w, op.index, k, writer)

    def set_v64(self, op: Operand, w, value: np.ndarray, mask: np.ndarray, writer: int = hazards.VALU):
        value = np.asarray(value, dtype=np.uint64)
        parts = np.stack([(value & np.uint64(0xFFFFFFFF)).astype(np.uint32),
                          (value >> np.uint64(32)).astype(np.uint32)], axis=1)
        self.set_v(op, w, parts, mask, writer)

    # ------------------------------------------------------ in-flight tracking
    def _in_flight(self, kind: str, w, index: int, count: int):
        """(rows, first register) of the waves with a load still landing in the registers,
        or None; also refuses registers that do not exist."""
        col = self.waves.busy_col[kind]
        if index + count > len(col):
            raise EmulatorError(f"register {kind}{index + count - 1} does not exist ({self.where()})")
        if not any(col[index:index + count]):
            return None
        busy = self.waves.busy[kind][w, index:index + count]
        if not busy.any():
            return None
        rows = busy.any(axis=1)
        return rows, index + int(np.flatnonzero(busy[np.flatnonzero(rows)[0]])[0])

    def check_read(self, kind: str, w, index: int, count: int):
        pending = self._in_flight(kind, w, index, count)
        if pending is not None:
            rows, reg = pending
            self.hazard(w, rows, f"{kind}{reg} read while a load into it is still in flight "
                                 f"(missing s_waitcnt)")
            if self.schedule is None:         # else the read sees the old value
                self._land_early(w, kind, index, count)
        hazards.check_read(self, kind, w, index, count)

    def _land_early(self, w, kind: str, index: int, count: int):
        """Outside strict mode, a read of a register whose load is still in flight sees
        the loaded value, as it almost always does on hardware (the load was issued
        long before): retire that wave's queues in order until the register is free."""
        for wave in self.wave_ids(w):
            for counter in ("vm", "lgkm"):
                queue = self.waves.queues[counter][wave]
                while queue and self.waves.busy[kind][wave, index:index + count].any():
                    self.retire(np.array([wave]), counter, len(queue) - 1)

    def write_regs(self, kind: str, w, index: int, count: int):
        """Check a register write: it may not race a load still landing in it."""
        pending = self._in_flight(kind, w, index, count)
        if pending is not None:
            rows, reg = pending
            self.hazard(w, rows, f"{kind}{reg} overwritten while a load into it is still in flight")
        hazards.check_write(self, kind, w, index, count)

    def record_write(self, kind: str, w, index: int, count: int, writer: int):
        if kind == "s":
            self.waves.invalidate_exec(index, count)
        writer = hazards.note_write(self, kind, w, index, count, writer)
        clock, _, hi = self.clocks(w)
        if self.fast is not None:
            waves = self.waves
            self.fast.record(waves.written_at[kind], waves.written_by[kind], self.wave_ids(w), index, count,
                             clock, writer)
        else:
            self.waves.written_at[kind][w, index:index + count] = clock[:, None]
            self.waves.written_by[kind][w, index:index + count] = writer
        hazards.note_recent(self.waves, kind, index, count, hi)

    def issue(self, w, counter: str, land, *, dest: tuple[str, int, int] | None = None,
              smem: bool = False) -> Pending:
        """Queue a memory op for the waves `w`; `land(rows)` runs when it retires."""
        waves = self.wave_ids(w)
        op = Pending(waves, counter, smem, self.inst.pc, self.inst.text, land)
        queues = self.waves.queues[counter]
        qs = queues[w] if isinstance(w, slice) else list(map(queues.__getitem__, waves.tolist()))
        list(map(deque.append, qs, repeat(op, len(qs))))      # C loops: 128+ waves per op
        if dest is not None:
            kind, index, count = dest
            queue = "smem" if smem else counter
            self._check_load_dest(w, kind, index, count, queue)
            self._busy_add(w, kind, queue, index, count, 1)

            def land_and_release(rows, _land=land):
                _land(rows)
                landed = waves[rows]
                self._busy_add(landed, kind, queue, index, count, -1)
                self.record_write(kind, landed, index, count, hazards.NONE)
            op.land = land_and_release
        return op

    def _busy_add(self, w, kind: str, queue: str, index: int, count: int, delta: int):
        """Registers index..index+count-1 of the waves `w` gain `delta` loads in flight
        (in `queue`); busy_col keeps the sums over the waves."""
        busy, busy_in = self.waves.busy[kind], self.waves.busy_in[queue][kind]
        if self.fast is not None:
            self.fast.busy_add(busy, busy_in, self.wave_ids(w), index, count, delta)
        else:
            busy[w, index:index + count] += delta
            busy_in[w, index:index + count] += delta
        col, n = self.waves.busy_col[kind], delta * len(self.wave_ids(w))
        for i in range(index, index + count):
            col[i] += n

    def _check_load_dest(self, w, kind: str, index: int, count: int, queue: str):
        """A load may target registers that earlier loads of the same in-order queue
        (VMEM, or DS) still fill: they land in issue order, so the last one wins as on
        hardware. Any other pending writer (the other queue, or an out-of-order scalar
        load) makes the final value unpredictable."""
        if not any(self.waves.busy_col[kind][index:index + count]):
            self.write_regs(kind, w, index, count)
            return
        busy = self.waves.busy[kind][w, index:index + count]
        if busy.any() and queue != "smem":
            same = self.waves.busy_in[queue][kind][w, index:index + count]
            if (busy == same).all():
                hazards.check_write(self, kind, w, index, count)
                return
        self.write_regs(kind, w, index, count)

    def issue_load(self, w, counter: str, dst: Operand, regs: np.ndarray, mask: np.ndarray, after=None):
        """Queue uint32[n,k,64] to land in the k registers from `dst` where mask[n,64] when
        the op retires; `after(rows)` runs then too."""
        count = regs.shape[1]
        waves = self.wave_ids(w)
        file = self.waves.file(dst.kind)
        every_lane = bool(mask.all())
        sel = w if isinstance(w, slice) else waves

        def land(rows):
            regs_ = file[:, dst.index:dst.index + count]
            if len(rows) == len(waves):     # rows: every position (in any order)
                if every_lane:
                    regs_[sel] = regs
                else:
                    regs_[sel] = np.where(mask[:, None, :], regs, regs_[sel])
            else:
                r = waves[rows]
                regs_[r] = np.where(mask[rows][:, None, :], regs[rows], regs_[r])
            if after is not None:
                after(rows)
        self.issue(w, counter, land, dest=(dst.kind, dst.index, count))

    def retire(self, w, counter: str, keep: int):
        """s_waitcnt: retire the oldest ops of each wave until at most `keep` remain."""
        queues = self.waves.queues[counter]
        waves = self.wave_ids(w)
        if counter == "lgkm" and keep > 0 and self.strict:
            for wave in waves:
                if any(op.smem for op in queues[wave]) and len(queues[wave]) > keep:
                    self.hazard([wave], np.array([True]),
                                f"s_waitcnt lgkmcnt({keep}) with scalar loads in flight: scalar "
                                f"memory returns out of order, only lgkmcnt(0) is safe")
        if self.schedule is not None:
            for wave in waves:                # one wave at a time, in the schedule's order
                while len(queues[wave]) > keep:
                    self.land_now(wave, counter, self.schedule.next_to_land(wave, queues[wave]))
            return
        qs = queues[w] if isinstance(w, slice) else list(map(queues.__getitem__, waves.tolist()))
        while qs:
            # The common case: every wave's queue is above `keep` and starts with the same
            # op, which exactly these waves issued: it lands for all of them at once.
            # (map/all over C functions: this runs per op for 128+ waves.)
            q0 = qs[0]
            if len(q0) <= keep:
                break
            op = q0[0]
            if (len(op.waves) != len(qs) or min(map(len, qs)) <= keep
                    or not all(map(is_, map(_first, qs), repeat(op)))):
                break
            list(map(deque.popleft, qs))
            op.land(np.arange(len(op.waves)))
        while True:
            # Retire one op per wave per round; ops shared by several waves land together.
            due: dict[int, tuple[Pending, list[int]]] = {}
            for wave in waves:
                q = queues[wave]
                if len(q) > keep:
                    op = q.popleft()
                    due.setdefault(id(op), (op, []))[1].append(wave)
            if not due:
                return
            for op, members in due.values():
                # members are a subset of op.waves; all of them is the common case
                rows = (np.arange(len(op.waves)) if len(members) == len(op.waves)
                        else np.flatnonzero(np.isin(op.waves, members)))
                op.land(rows)

    def land_now(self, wave: int, counter: str, position: int):
        """Land the op at `position` of `wave`'s queue for that wave alone, before any
        s_waitcnt asks for it (a schedule picks one the ISA lets land now)."""
        queue = self.waves.queues[counter][wave]
        op = queue[position]
        del queue[position]
        op.land(np.flatnonzero(op.waves == wave))

    def drain(self, w):
        for counter in ("vm", "lgkm"):
            self.retire(w, counter, 0)

    # ---------------------------------------------------------------- running
    def step(self, w, inst: Inst) -> None:
        if self.mode_split is not None:       # VSKIP / GPR index mode (families/modes.py)
            for sub_w, sub_inst in self.mode_split(self, w, inst):
                self._step(sub_w, sub_inst)
            return
        self._step(w, inst)

    def clocks(self, w) -> tuple[np.ndarray, int, int]:
        """(wait-state clocks of the waves `w`, lowest, highest), cached while `w` is the
        last one asked about and the clocks do not move (within one step). Read-only."""
        if w is not self._clock_w:
            clock = self.waves.clock[w]
            if clock.size:
                self._clocks = (clock, int(clock.min()), int(clock.max()))
            else:
                self._clocks = (clock, 1 << 62, -(1 << 62))
            self._clock_w = w
        return self._clocks

    def _step(self, w, inst: Inst) -> None:
        self._clock_w = None                  # clocks change between steps
        self.inst = inst
        if inst.handler is None:
            inst.handler = lookup(inst)
        self.klass = inst.handler.klass
        self.srcc_noted = []                  # MFMA srcC reads of this step (hazards.py)
        hazards.before_issue(self, w)
        inst.handler.fn(self, inst, w)
        self.waves.clock[w] += hazards.wait_states(inst)
        self._clock_w = None
        if self.trace is not None:
            self.trace(inst, w)
