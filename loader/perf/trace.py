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
    run only — its numerical output is meaningless — and `Trace.stubbed` lists them;
  * vector ALU instructions whose results cannot reach what the trace records (an
    address, EXEC, a branch condition, a scalar operand) skip their arithmetic too, and
    DS reads whose results cannot reach it only compute and count their lane addresses
    (`dead_ops`): the softmax of an attention kernel or a GEMM's dequantisation never
    steers control flow, so the recorded streams, lanes, bytes and LDS addresses are
    those of the full run, at a fraction of its cost.

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
from ..emu.families import ds as emu_ds
from ..emu.registry import HANDLERS, Handler
from . import lds_banks
from .model import SGPR_BASE, _regs, register_roles
from .stats import branch_target, classify, lane_bytes

LINE = 128          # bytes: the L2 line size used to count distinct DRAM bytes (CDNA3 L2 line)

MEMORY_CLASSES = ("vmem", "lds_dma", "ds")


def _stub(ex, inst, w):
    """Timing-mode stand-in: no architectural effect."""
    return None


def _stub_end(ex, inst, w):
    ex.control = "end"


def _address_only_read(ex, inst, w):
    """Timing-mode DS read whose data nothing needs: the recorder (ex.trace) counts its lane
    addresses, as the emulator's handler computes them; no data moves."""
    addr = emu_ds.base_address(ex, inst, w, inst.ops[1]) + emu_ds.offset16(ex, inst)
    ex.trace.lds_access(addr, ex.exec_bits(w), _ADDRESS_ONLY[inst.name], write=False)


_VECTOR = ("valu", "trans")
_EXEC, _VCC, _M0 = SGPR_BASE + 126, SGPR_BASE + 106, SGPR_BASE + 124


def _memory_operands(inst, k: str, is_load: bool) -> tuple[set, set] | None:
    """(address registers, data registers) of a vector memory or DS instruction; None
    where the operand roles are not plain (atomics, LDS DMA, cross-lane DS ops): then every
    register counts as an address."""
    regs = [set(_regs(op) or ()) for op in inst.ops]
    if not regs:                                       # buffer_wbl2 / buffer_inv: no register operands
        return set(), set()
    name = inst.name
    if k == "vmem" and "atomic" not in name:
        if name.startswith("buffer_"):                 # vdata, vaddr, srsrc, soffset
            data_at = 0
        else:                                          # global/flat/scratch: load vdst, vaddr, saddr;
            data_at = 0 if is_load else 1              # store vaddr, vdata, saddr
    elif k == "ds" and re.match(r"^ds_(read|write)", name):
        if not is_load:                                # write vaddr, vdata...
            return regs[0], set().union(*regs[1:])
        data_at = 0                                    # read vdst, vaddr
    else:
        return None
    addr = set().union(*(r for n, r in enumerate(regs) if n != data_at))
    return addr, regs[data_at]


def _bits(regs) -> int:
    out = 0
    for r in regs:
        out |= 1 << r
    return out


_PARTIAL = re.compile(r"d16|writelane|permlane|_[fiub]16|_sdwa|_dpp")


def _successors(insts, n: int) -> list[int] | None:
    """Indices control can reach after insts[n]; None for an indirect jump."""
    inst = insts[n]
    k = classify(inst)
    if k == "end":
        return []
    nxt = [n + 1] if n + 1 < len(insts) else []
    if k != "branch":
        return nxt
    t = branch_target(inst)
    if t is None:
        return None
    n_t = next((m for m, i in enumerate(insts) if i.pc == t), None)
    if n_t is None:
        return None
    return [n_t] if inst.name.startswith("s_branch") else [n_t] + nxt


# DS reads a timing run can replace by their address computation (emu.families.ds)
_ADDRESS_ONLY = {**emu_ds.READS, **{name: 8 for name in emu_ds.TRANSPOSE}}   # bytes a lane


def dead_ops(insts, writes_nothing=frozenset()) -> set[int]:
    """Indices of the vector ALU instructions, and of the plain DS reads (_ADDRESS_ONLY),
    whose results never reach anything the timing trace depends on: memory addresses,
    EXEC, branch conditions, scalar operands.

    A backward liveness of "needed" register values over the control-flow graph. Roots:
    the address operands of vector memory and DS instructions; every register read by
    any other instruction that is neither a vector ALU op nor an MFMA (whence branches);
    EXEC, M0 (LDS DMA reads it implicitly) and VCC where a branch or v_div_fmas reads it
    implicitly. A vector op is needed where it writes a register needed after it (or
    EXEC, as v_cmpx does); its sources are then needed before it. A full write ends a
    value's need (it is not needed above the write); a write that may leave part of a
    register (16-bit, DPP/SDWA, lane writes) or some lanes (a program that changes EXEC)
    does not. Instructions in `writes_nothing` (timing-mode stubs: skipped MFMAs,
    unimplemented instructions) neither need nor end anything. Data stored to memory is
    a root when a load from the same memory (global or LDS) returns a needed register
    (the value could come back as an address). Programs with indirect jumps or register
    indexing (s_set_gpr_idx, movrel) get no dead ops."""
    if any("gpr_idx" in i.name or "movrel" in i.name for i in insts):
        return set()
    count = len(insts)
    succ = [_successors(insts, n) for n in range(count)]
    if any(s is None for s in succ):
        return set()
    vcc, exec_ = _bits((_VCC, _VCC + 1)), _bits((_EXEC, _EXEC + 1))
    roles = []              # per instruction: (kind, roots or reads, writes, kills, store data, memory)
    exec_written = False
    for n, inst in enumerate(insts):
        k = classify(inst)
        srcs, dsts, _, is_load = register_roles(inst, k)
        name = inst.name
        writes = _bits(dsts)
        if name.startswith("v_cmpx"):
            writes |= exec_
        if name.startswith("v_swap"):
            writes |= _bits(srcs)
        exec_written |= bool(writes & exec_)
        full = not _PARTIAL.search(name) and inst.enc not in ("sdwa", "dpp")
        kills = writes if full else 0
        if n in writes_nothing or k == "mfma":
            roles.append(("none", 0, 0, 0, 0, None))
        elif k in _VECTOR:
            reads = _bits(srcs) | (vcc if name.startswith("v_div_fmas") else 0)
            roles.append(("vector", reads, writes, kills, 0, None))
        else:
            mem = _memory_operands(inst, k, is_load) if k in ("vmem", "ds") else None
            if mem is None:
                roots, data = _bits(srcs), 0
            else:
                roots, data = _bits(mem[0]), _bits(mem[1])
            if name.startswith(("s_cbranch_vcc", "s_cbranch_cdbg")):
                roots |= vcc
            space = k if mem is not None else None
            kind = "ds read" if name in _ADDRESS_ONLY else "load" if is_load else "other"
            roles.append((kind, roots, writes, kills, 0 if is_load else data, space))
    if exec_written:
        roles = [(kind, r, w, 0, d, m) for kind, r, w, _, d, m in roles]
    always = exec_ | _bits((_M0,))
    stores_are_roots = {"vmem": False, "ds": False}
    while True:
        needed_in = [0] * count
        live = set()
        changed = True
        while changed:
            changed = False
            for n in range(count - 1, -1, -1):
                out = always
                for m in succ[n]:
                    out |= needed_in[m]
                kind, reads, writes, kills, data, mem = roles[n]
                if kind == "none":
                    val = out
                elif kind in ("vector", "ds read") and (not writes or writes & out):
                    live.add(n)
                    val = (out & ~kills) | reads
                elif kind == "vector":              # skipped: reads and writes nothing
                    val = out
                elif kind == "ds read":             # address only: reads its address, writes nothing
                    val = out | reads
                else:
                    val = (out & ~kills) | reads
                    if mem and stores_are_roots[mem]:
                        val |= data
                if val != needed_in[n]:
                    needed_in[n] = val
                    changed = True
        grown = False
        for n, (kind, _, writes, _, _, mem) in enumerate(roles):
            if kind in ("load", "ds read") and mem and not stores_are_roots[mem]:
                out = always
                for m in succ[n]:
                    out |= needed_in[m]
                if writes & out:
                    stores_are_roots[mem] = grown = True
        if not grown:
            return {n for n, r in enumerate(roles) if r[0] in ("vector", "ds read")} - live


def timing_program(program: Program, skip_mfma: bool = True, skip_dead: bool = True,
                   count_lds: bool = True) -> tuple[Program, list[str]]:
    """A private copy of `program` whose MFMAs, dead ops (dead_ops) and unimplemented
    instructions are stubs (a dead DS read only counts its lane addresses, or with
    count_lds=False does nothing)."""
    stubbed: set[str] = set()
    insts = []
    unimplemented = {n for n, i in enumerate(program.insts) if HANDLERS.get(i.name) is None}
    skipped = {n for n, i in enumerate(program.insts) if classify(i) == "mfma"} | unimplemented
    dead = dead_ops(program.insts, skipped) if skip_mfma and skip_dead else set()
    for n, inst in enumerate(program.insts):
        copy = dataclasses.replace(inst, handler=None)
        handler = HANDLERS.get(inst.name)
        klass = classify(inst)
        if handler is None:
            if klass == "branch":
                raise NotImplementedError(f"branch {inst.name} at {inst.pc:#x} is not implemented; "
                                          f"timing mode needs real control flow")
            stubbed.add(inst.name)
            copy.handler = Handler(_stub_end if klass == "end" else _stub, klass, inst.name)
        elif n in dead and klass == "ds" and count_lds:
            copy.handler = Handler(_address_only_read, klass, inst.name)
        elif (klass == "mfma" and skip_mfma) or n in dead:
            copy.handler = Handler(_stub, klass, inst.name)
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

    def __init__(self, program: Program, memory: bool = True):
        self.memory = memory              # track global memory lines and bytes (attach)
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
        if self.memory:
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
           skip_mfma: bool = True, skip_dead: bool = True, detail: bool = True,
           max_wave_instructions: int = 200_000_000) -> Trace:
    """Run `workgroups` of a launch in timing mode and return their Trace (skip_dead=False
    runs the dead vector ops too: the same trace, slower). detail=False records the wave
    streams and the memory instructions' active lanes only, as gfxasm.perf.grid's probes
    need: no global-memory lines, bytes or in-range shares, no LDS conflicts."""
    program, stubbed = timing_program(kernel.program, skip_mfma, skip_dead, count_lds=detail)
    saved = kernel.program
    kernel.program = program
    rec = Recorder(program, memory=detail)
    lds_read, lds_write = emu_lds.read, emu_lds.write

    def traced_read(ex, w, addr, nbytes, mask, what, **options):
        rec.lds_access(addr, mask, nbytes, write=False)
        return lds_read(ex, w, addr, nbytes, mask, what, **options)

    def traced_write(ex, w, addr, data, mask, what, **options):
        rec.lds_access(addr, mask, data.shape[2], write=True)
        return lds_write(ex, w, addr, data, mask, what, **options)

    if detail:
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
