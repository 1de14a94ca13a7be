"""Timing mode of the emulator: run chosen workgroups for real, record what each wave did.

The timing model (model.py) needs, for every wave of one compute unit's share of a
launch, the sequence of instructions it executed — real control flow, from the real
emulator — plus the lanes active at each memory instruction and the global-memory bytes
the workgroups touched (to estimate DRAM traffic). `record()` gets them by running
`Kernel.launch(..., workgroups=..., trace=Recorder)` on a private copy of the decoded
program in which:

  * MFMA instructions skip their arithmetic (the result registers keep their values):
    MFMA results never feed addresses or branches in the kernels we model, and skipping
    them makes a long run fast;
  * the bytes each global memory instruction really moved are counted: lanes outside a
    buffer's range (buffer instructions' range check) read zeros and fetch nothing, as
    when a tile overhangs the matrix, so the model charges only the bytes moved;
  * every DS access's lane addresses are counted into LDS bank conflicts (lds_banks.py);
  * instructions the emulator does not implement yet are stubs of the same class (a
    VALU stub writes nothing; a DS/VMEM stub moves no data). The run is then a timing
    run only — its numerical output is meaningless — and `Trace.stubbed` lists them.

Strict hazard checking is off in timing mode (the functional tests own it).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

import numpy as np

from ..emu import kernel as emu_kernel
from ..emu import lds as emu_lds
from ..emu.decode import Program
from ..emu.registry import HANDLERS, Handler
from . import lds_banks
from .stats import classify, lane_bytes

LINE = 128          # bytes: the L2 line size used to count distinct DRAM bytes (CDNA3 L2 line)

MEMORY_CLASSES = ("vmem", "lds_dma", "ds")


def _stub(ex, inst, w):
    """Timing-mode stand-in: no architectural effect."""
    return None


def _stub_end(ex, inst, w):
    ex.control = "end"


def timing_program(program: Program, skip_mfma: bool = True) -> tuple[Program, list[str]]:
    """A private copy of `program` whose MFMAs (and unimplemented instructions) are stubs."""
    stubbed: set[str] = set()
    insts = []
    for inst in program.insts:
        copy = dataclasses.replace(inst, handler=None)
        handler = HANDLERS.get(inst.name)
        klass = classify(inst)
        if handler is None:
            if klass == "branch":
                raise NotImplementedError(f"branch {inst.name} at {inst.pc:#x} is not implemented; "
                                          f"timing mode needs real control flow")
            stubbed.add(inst.name)
            copy.handler = Handler(_stub_end if klass == "end" else _stub, klass, inst.name)
        elif klass == "mfma" and skip_mfma:
            copy.handler = Handler(_stub, "mfma", inst.name)
        insts.append(copy)
    return Program(insts, dict(program.by_pc), program.entry), sorted(stubbed)


@dataclass
class Trace:
    """What one timed run executed."""
    insts: list                          # the decoded program (index space of `streams`)
    waves: list                          # per wave: dict(group=(x,y,z), wave=i, stream=int32[])
    mem_lanes: list                      # per wave: int16[] active lanes of each memory op, in order
    touched: dict = field(default_factory=dict)    # buffer name -> distinct LINE-byte lines read/written
    requested: dict = field(default_factory=dict)  # buffer name -> bytes requested by all accesses
    inst_buffers: dict = field(default_factory=dict)  # instruction index -> buffer names it accessed
    # instruction index -> bytes its accesses moved / bytes its active lanes would move: below
    # 1 where lanes fall outside a buffer's range (those read 0 and fetch nothing)
    in_range: dict = field(default_factory=dict)
    lds_conflicts: dict = field(default_factory=dict)  # instruction index -> lds_banks.Conflicts
    stubbed: list = field(default_factory=list)
    wave_instructions: int = 0


class Recorder:
    """The `trace` hook: appends the executed instruction index to each executing wave."""

    def __init__(self, program: Program):
        self.index = {inst.pc: n for n, inst in enumerate(program.insts)}
        self.mem = np.array([classify(i) in MEMORY_CLASSES for i in program.insts])
        self.batches = []                 # (executor, per-wave lists, per-wave lane lists)
        self.lines: dict[str, list] = {}
        self.requested: dict[str, int] = {}
        self.inst_buffers: dict[int, set] = {}
        self.lds_conflicts: dict = {}
        self.moved = np.zeros(len(program.insts))         # global bytes moved, per instruction
        self.slots = np.zeros(len(program.insts))         # active lanes x executions, per instruction

    def attach(self, ex):
        # executed (instruction, waves) events and (waves, active lanes) of memory ones, in
        # order; split into per-wave streams once the run is over (streams())
        events, lanes = ([], []), ([], [])
        self.batches.append((ex, events, lanes))
        self._cur = (ex, events, lanes)
        self._all = np.arange(ex.waves.count)
        self._wrap_memory(ex.memory)

    @staticmethod
    def streams(events, count: int, dtype) -> list:
        """Per wave, the values of the (values, waves) events it took part in, in order."""
        values, waves = events
        if not values:
            return [np.zeros(0, dtype) for _ in range(count)]
        sizes = [len(w) for w in waves]
        vals = np.repeat(np.asarray(values, dtype), sizes) if np.ndim(values[0]) == 0 else \
            np.concatenate(values).astype(dtype)
        who = np.concatenate(waves)
        order = np.argsort(who, kind="stable")
        bounds = np.searchsorted(who[order], np.arange(count + 1))
        vals = vals[order]
        return [vals[bounds[n]:bounds[n + 1]] for n in range(count)]

    def _wrap_memory(self, memory):
        if getattr(memory, "_perf_wrapped", False):
            return
        read, write = memory.read, memory.write
        lines, requested, inst_buffers, index = self.lines, self.requested, self.inst_buffers, self.index
        rec = self

        def note(addr, nbytes):
            addr = np.asarray(addr, dtype=np.uint64).reshape(-1)
            if addr.size == 0 or memory._bases.size == 0:
                return
            region = np.searchsorted(memory._bases, addr, side="right").astype(np.int64) - 1
            ok = region >= 0
            for r in np.unique(region[ok]):
                name = memory.names[r]
                if not name.startswith("buffers["):
                    continue
                off = (addr[region == r] - memory._bases[r]).astype(np.int64)
                requested[name] = requested.get(name, 0) + int(off.size) * int(nbytes)
                inst = rec._cur[0].inst
                if inst is not None:
                    inst_buffers.setdefault(index[inst.pc], set()).add(name)
                    rec.moved[index[inst.pc]] += off.size * nbytes
                first = off // LINE
                last = (off + nbytes - 1) // LINE
                ids = np.unique(np.concatenate([first, last]))
                lines.setdefault(name, []).append(ids)

        def traced_read(addr, nbytes):
            note(addr, nbytes)
            return read(addr, nbytes)

        def traced_write(addr, data):
            note(addr, data.shape[1])
            return write(addr, data)

        memory.read, memory.write = traced_read, traced_write
        memory._perf_wrapped = True

    def lds_access(self, addr, mask, nbytes, write: bool):
        """Bank-conflict count of one DS access (the emulator's lane addresses)."""
        inst = self._cur[0].inst
        if inst is None or classify(inst) != "ds":
            return
        lds_banks.record(self.lds_conflicts, self.index[inst.pc], inst.name, addr, mask, nbytes, write)

    def __call__(self, inst, w):
        ex, events, lanes = self._cur
        idx = self.index[inst.pc]
        waves = self._all[w]
        events[0].append(idx)
        events[1].append(waves)
        if self.mem[idx]:
            active = ex.waves.exec_bits(w).sum(axis=1)
            self.slots[idx] += active.sum()
            lanes[0].append(active)
            lanes[1].append(waves)


def record(kernel, grid, block, kernarg=b"", buffers=(), workgroups=None, *,
           skip_mfma: bool = True, max_wave_instructions: int = 200_000_000) -> Trace:
    """Run `workgroups` of a launch in timing mode and return their Trace."""
    program, stubbed = timing_program(kernel.program, skip_mfma)
    saved = kernel.program
    kernel.program = program
    rec = Recorder(program)
    lds_read, lds_write = emu_lds.read, emu_lds.write

    def traced_read(ex, w, addr, nbytes, mask, what):
        rec.lds_access(addr, mask, nbytes, write=False)
        return lds_read(ex, w, addr, nbytes, mask, what)

    def traced_write(ex, w, addr, data, mask, what):
        rec.lds_access(addr, mask, data.shape[2], write=True)
        return lds_write(ex, w, addr, data, mask, what)

    emu_lds.read, emu_lds.write = traced_read, traced_write
    try:
        with np.errstate(all="ignore"):
            res = kernel.launch(grid, block, kernarg, buffers, strict=False, trace=rec,
                                workgroups=workgroups, max_wave_instructions=max_wave_instructions)
    finally:
        kernel.program = saved
        emu_lds.read, emu_lds.write = lds_read, lds_write
    waves, mem_lanes = [], []
    for ex, events, lanes in rec.batches:
        names = ex.wave_names
        count = ex.waves.count
        lane_streams = Recorder.streams(lanes, count, np.int16)
        for n, stream in enumerate(Recorder.streams(events, count, np.int32)):
            m = re.match(r"workgroup \((\d+),(\d+),(\d+)\) wave (\d+)", names(n))
            group = tuple(int(v) for v in m.groups()[:3]) if m else (0, 0, 0)
            waves.append({"group": group, "wave": int(m.group(4)) if m else n, "stream": stream})
            mem_lanes.append(lane_streams[n])
    touched = {name: int(np.unique(np.concatenate(parts)).size) for name, parts in rec.lines.items()}
    in_range = {}
    for n, inst in enumerate(program.insts):
        per_lane = sum(lane_bytes(inst)[:2])
        if rec.slots[n] and per_lane and classify(inst) in ("vmem", "lds_dma"):
            in_range[n] = min(1.0, rec.moved[n] / (rec.slots[n] * per_lane))
    return Trace(program.insts, waves, mem_lanes, touched, dict(rec.requested),
                 {k: sorted(v) for k, v in rec.inst_buffers.items()}, in_range=in_range,
                 lds_conflicts=rec.lds_conflicts, stubbed=stubbed,
                 wave_instructions=res.wave_instructions)
