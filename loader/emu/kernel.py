"""Public emulator API: load a code object, pick a kernel, launch it on CPU buffers.

    import gfxasm.emu as emu
    mod = emu.load("build/x.co")          # a path or bytes; any gfx950 code object
    k = mod.kernel("symbol_name")
    res = k.launch(grid=(gx, gy, gz), block=(bx, by, bz), kernarg=kernarg_bytes,
                   buffers=[t0, t1])      # the kernarg holds their data_ptr() values
    res.wave_instructions

`schedule="adversarial", seed=N` runs a random legal order of waves and load landings
instead of lockstep (adversarial.py; its `check` compares outputs across seeds);
`schedule="timed"` the order of the timing model's per-CU cycle simulation
(gfxasm.perf.timed, which registers itself here: import gfxasm.perf first);
`schedule="concurrent"` keeps up to the grid's resident capacity of workgroups live at once,
interleaved, for kernels whose workgroups wait on each other (concurrent.py).
"""
from __future__ import annotations

import itertools
import math
import struct
from dataclasses import dataclass

import numpy as np

from ..codeobj import CodeObject, KernelInfo, load_code_object
from . import adversarial, concurrent, families, hazards, parallel, races  # noqa: F401  (families registers every handler)
from .decode import Program, decode
from .errors import EmulatorError, LaunchError
from .machine import Executor
from .memory import Memory
from .state import EXEC_LO, LANES, Waves, bits_to_mask

MAX_WORKGROUP_SIZE = 1024
LDS_LIMIT = 160 * 1024
HIDDEN_ARGS_BYTES = 256
# Waves resident at once in one emulated batch (memory: 128 KiB of registers per wave).
BATCH_WAVES = 512

# Schedules other layers provide, by name (the emulator imports none of them):
# factory(program, waves) -> an object with adversarial.Adversarial's methods.
_PLUGGED_SCHEDULES: dict = {}


def register_schedule(name: str, factory) -> None:
    """Make `launch(schedule=name)` run batches under factory(program, waves)'s order
    (gfxasm.perf.timed registers "timed")."""
    if name not in adversarial.SCHEDULES or name in ("lockstep", "adversarial"):
        raise ValueError(f"{name!r} is not a pluggable schedule name")
    _PLUGGED_SCHEDULES[name] = factory


@dataclass
class Run:
    """What every batch of one launch shares (a parallel launch's shards get a copy)."""
    grid: tuple
    block: tuple
    waves_per_group: int
    memory: Memory
    seg: np.ndarray
    kernarg_addr: int
    packet_addr: int
    strict: bool
    waived: frozenset
    trace: object
    schedule: str
    seed: int | None

    def group_id(self, group) -> int:
        """A workgroup's linear id: its position in the serial order (x fastest)."""
        x, y, z = group
        return (z * self.grid[1] + y) * self.grid[0] + x

    def group_name(self, group_id: int) -> str:
        gx, gy = self.grid[0], self.grid[1]
        return f"({group_id % gx},{group_id // gx % gy},{group_id // (gx * gy)})"


@dataclass
class LaunchResult:
    wave_instructions: int
    workgroups: int
    waves: int
    timeline: object = None     # schedule="concurrent": concurrent.Timeline


class Module:
    def __init__(self, code_object: CodeObject):
        self.code_object = code_object
        insts = decode(code_object.data)
        self._insts = insts

    def kernel(self, name: str | None = None) -> "Kernel":
        info = self.code_object.kernel(name)
        return Kernel(self, info)

    @property
    def kernel_names(self) -> list[str]:
        return list(self.code_object.kernels)


def load(src) -> Module:
    return Module(load_code_object(src))


def _dims(value, what: str) -> tuple[int, int, int]:
    dims = tuple(int(v) for v in (value if isinstance(value, (tuple, list)) else (value,)))
    if not 1 <= len(dims) <= 3 or any(d < 1 for d in dims):
        raise LaunchError(f"{what} must be 1 to 3 positive integers, got {value!r}")
    return dims + (1,) * (3 - len(dims))


class Kernel:
    def __init__(self, module: Module, info: KernelInfo):
        self.module = module
        self.info = info
        self.name = info.name
        insts = [i for i in module._insts if i.pc >= info.entry]
        self.program = Program(insts, {i.pc: n for n, i in enumerate(insts)}, info.entry)

    # ------------------------------------------------------------------ checks
    def _check_launch(self, grid, block):
        kd = self.info.descriptor
        threads = block[0] * block[1] * block[2]
        limit = self.info.max_workgroup_size or MAX_WORKGROUP_SIZE
        if threads > min(limit, MAX_WORKGROUP_SIZE):
            raise LaunchError(f"block {block} has {threads} threads; kernel {self.name} allows {limit}")
        if kd.wavefront_size32:
            raise LaunchError(f"kernel {self.name} is wave32; gfx950 runs wave64 only")
        dims = kd.workitem_id_dims
        if (dims < 2 and block[1] > 1) or (dims < 3 and block[2] > 1):
            raise LaunchError(f"kernel {self.name} receives work-item ids for {dims} dimension(s) "
                              f"but block is {block}")
        if kd.private_segment_fixed_size or kd.user_sgpr_enabled("flat_scratch_init"):
            raise LaunchError(f"kernel {self.name} uses scratch memory, which the emulator does not model")
        if kd.user_sgpr_enabled("queue_ptr"):
            raise LaunchError(f"kernel {self.name} asks for the queue pointer, which the emulator does not model")
        if kd.workgroup_info_enabled:
            raise LaunchError(f"kernel {self.name} asks for workgroup info SGPR, which the emulator does not model")
        if kd.float_denorm_mode_32 in (1, 2) or kd.float_denorm_mode_16_64 in (1, 2):
            raise LaunchError(f"kernel {self.name}: denormal modes that flush only inputs or only "
                              f"outputs are not modelled (use 0 or 3)")
        if kd.float_round_mode_32 or kd.float_round_mode_16_64:
            raise LaunchError(f"kernel {self.name}: only round-to-nearest-even is modelled")
        if self.info.lds_bytes > LDS_LIMIT:
            raise LaunchError(f"kernel {self.name} needs {self.info.lds_bytes} B of LDS; gfx950 has {LDS_LIMIT}")

    def _kernarg_segment(self, kernarg: bytes, grid, block) -> np.ndarray:
        size = max(self.info.kernarg_size, len(kernarg))
        if len(kernarg) > size:
            raise LaunchError(f"kernarg is {len(kernarg)} B; kernel {self.name} takes {size}")
        raw = np.zeros(size + HIDDEN_ARGS_BYTES + 64, dtype=np.uint8)
        start = (-raw.__array_interface__["data"][0]) % 64     # 64-byte aligned like HIP's
        seg = raw[start:start + size + HIDDEN_ARGS_BYTES]
        seg[:len(kernarg)] = np.frombuffer(bytes(kernarg), dtype=np.uint8)
        self._fill_hidden_args(seg, grid, block)
        return seg

    def _fill_hidden_args(self, seg: np.ndarray, grid, block) -> None:
        values = {}
        for i, axis in enumerate("xyz"):
            values[f"hidden_block_count_{axis}"] = ("<I", grid[i])
            values[f"hidden_group_size_{axis}"] = ("<H", block[i])
            values[f"hidden_remainder_{axis}"] = ("<H", 0)
            values[f"hidden_global_offset_{axis}"] = ("<Q", 0)
        values["hidden_grid_dims"] = ("<H", sum(1 for g, b in zip(grid, block) if g * b > 1) or 1)
        for arg in self.info.metadata.get(".args", []):
            kind = arg.get(".value_kind", "")
            if not kind.startswith("hidden_"):
                continue
            if kind not in values:
                raise LaunchError(f"kernel {self.name} declares hidden argument {kind}, "
                                  f"which the emulator does not model")
            fmt, value = values[kind]
            struct.pack_into(fmt, seg, int(arg[".offset"]), value)

    def _dispatch_packet(self, grid, block, kernarg_addr: int) -> np.ndarray:
        packet = np.zeros(64, dtype=np.uint8)
        struct.pack_into("<HHHH", packet, 2, 0, *block)  # setup, workgroup_size_x/y/z
        struct.pack_into("<III", packet, 12, *(g * b for g, b in zip(grid, block)))
        struct.pack_into("<II", packet, 24, 0, self.info.lds_bytes)
        struct.pack_into("<Q", packet, 40, kernarg_addr)
        return packet

    # ------------------------------------------------------------------ launch
    def launch(self, grid, block, kernarg: bytes = b"", buffers=(), *, strict: bool = True,
               max_wave_instructions: int = 2_000_000_000, trace=None, workgroups=None, waive=(),
               schedule: str = "lockstep", seed: int | None = None, jobs: int = 1,
               engine: str = "processes", resident: int | None = None) -> LaunchResult:
        """Run the kernel. `trace(inst, w)` is called after every executed instruction; if
        it has an `attach(executor)` method, that is called first for every batch.
        `workgroups` (an iterable of (x, y, z)) runs only those workgroups of `grid` — the
        timing model (gfxasm.perf) runs one compute unit's share of a large grid.
        `waive` names strict-mode hazard rules (hazards.WAIVABLE) not to enforce: only for
        third-party code objects whose silicon behaviour contradicts the rule.
        `schedule` "adversarial" with an int `seed` and strict=False draws a random legal
        interleaving and load-landing times (adversarial.py); "timed" (strict=False) orders
        waves and landings by cycle clocks (gfxasm.perf.timed). Inside adversarial.override, its
        schedule, seed and strictness replace these arguments.
        `jobs` > 1 runs the workgroups in that many processes (0: one per core); with
        engine="ray" they run as tasks of the Ray cluster the caller initialised (ray.init),
        cut into at least `jobs` pieces (0: the cluster's CPUs). The outputs, the strict
        reports and wave_instructions are those of a serial run (parallel.py says how).
        `schedule="concurrent"` runs up to `resident` workgroups (default: the device's
        capacity for this kernel, concurrent.resident_capacity) interleaved, round-robin, or
        in a random order drawn from `seed`; a workgroup may wait on another's release
        (concurrent.py states the memory model); jobs must be 1. The result's `timeline`
        records the waits (gfxasm.perf.flagwait times them)."""
        if adversarial.forced() is not None:
            schedule, seed, strict = adversarial.forced()
        if schedule == "concurrent":
            concurrent.check_launch(seed, jobs, engine, workgroups, resident, trace)
        else:
            adversarial.check_schedule(schedule, seed, strict)
            if resident is not None:
                raise LaunchError("resident is only for schedule='concurrent'")
        jobs = parallel.check_jobs(jobs, engine, trace)
        grid, block = _dims(grid, "grid"), _dims(block, "block")
        self._check_launch(grid, block)
        waived = hazards.check_waivers(waive)
        memory = Memory()
        for n, buf in enumerate(buffers):
            memory.register(buf, name=f"buffers[{n}]")
        seg = self._kernarg_segment(kernarg, grid, block)
        kernarg_addr = memory.register(seg, name="kernarg segment")
        packet = self._dispatch_packet(grid, block, kernarg_addr)
        packet_addr = memory.register(packet, name="dispatch packet")

        threads = block[0] * block[1] * block[2]
        waves_per_group = math.ceil(threads / LANES)
        groups = list(itertools.product(range(grid[2]), range(grid[1]), range(grid[0])))
        if workgroups is not None:
            chosen = [tuple(int(v) for v in g) for g in workgroups]
            for g in chosen:
                if len(g) != 3 or not all(0 <= v < n for v, n in zip(g, grid)):
                    raise LaunchError(f"workgroup {g} is outside grid {grid}")
            groups = [(z, y, x) for x, y, z in chosen]
        run_ = Run(grid, block, waves_per_group, memory, seg, kernarg_addr, packet_addr, strict, waived,
                   trace, schedule, seed)
        if schedule == "concurrent":
            capacity = resident or concurrent.resident_capacity(self.info, waves_per_group)
            order = [(x, y, z) for z, y, x in groups]
            total, timeline = concurrent.run(self, run_, order, max_wave_instructions, seed, capacity, steps)
            return LaunchResult(total, len(groups), len(groups) * waves_per_group, timeline)
        per_batch = max(1, BATCH_WAVES // waves_per_group)
        batches = [(start, [(x, y, z) for z, y, x in groups[start:start + per_batch]])
                   for start in range(0, len(groups), per_batch)]
        # The record of global accesses across workgroups: strict mode's race checks, and a
        # parallel launch's footprints (which it needs in either mode).
        spread = parallel.wanted(jobs, engine)
        accesses = races.GlobalAccesses(memory, strict, run_.group_name) if strict or spread else None
        if spread:
            total = parallel.run(self, run_, batches, accesses, max_wave_instructions, jobs, engine)
        else:
            total = 0
            for start, batch in batches:
                total += self.run_batch(run_, start, batch, accesses, max_wave_instructions - total)
        return LaunchResult(total, len(groups), len(groups) * waves_per_group)

    def _init_waves(self, batch, block, waves_per_group, seg, kernarg_addr, packet_addr) -> Waves:
        kd = self.info.descriptor
        waves = Waves(len(batch) * waves_per_group, len(batch), self.info.lds_bytes)
        threads = block[0] * block[1] * block[2]
        tid = np.arange(waves_per_group * LANES)
        x, y, z = tid % block[0], (tid // block[0]) % block[1], tid // (block[0] * block[1])
        packed = (x | (y << 10) | (z << 20)).astype(np.uint32).reshape(waves_per_group, LANES)
        active = (tid < threads).reshape(waves_per_group, LANES)
        exec_lo, exec_hi = bits_to_mask(active)

        user = []
        if kd.user_sgpr_enabled("private_segment_buffer"):
            user += [0, 0, 0, 0]
        if kd.user_sgpr_enabled("dispatch_ptr"):
            user += [packet_addr & 0xFFFFFFFF, packet_addr >> 32]
        if kd.user_sgpr_enabled("kernarg_segment_ptr"):
            user += [kernarg_addr & 0xFFFFFFFF, kernarg_addr >> 32]
        if kd.user_sgpr_enabled("dispatch_id"):
            user += [0, 0]
        if kd.user_sgpr_enabled("private_segment_size"):
            user += [0]
        preload = kd.kernarg_preload & 0x7F
        if preload:
            offset = (kd.kernarg_preload >> 7) * 4
            dwords = seg[:len(seg) // 4 * 4].view(np.uint32)
            user += [int(v) for v in dwords[offset // 4: offset // 4 + preload]]
        if len(user) > kd.user_sgpr_count:
            raise LaunchError(f"kernel {self.name}: enabled user SGPRs need {len(user)} registers but "
                              f"USER_SGPR_COUNT is {kd.user_sgpr_count}")
        for n, (gx, gy, gz) in enumerate(batch):
            rows = slice(n * waves_per_group, (n + 1) * waves_per_group)
            waves.slot[rows] = n
            waves.wave_in_group[rows] = np.arange(waves_per_group)
            waves.sgpr[rows, :len(user)] = np.array(user, dtype=np.uint32)
            sys_index = kd.user_sgpr_count
            for enabled, gid in zip(kd.workgroup_id_enabled, (gx, gy, gz)):
                if enabled:
                    waves.sgpr[rows, sys_index] = gid
                    sys_index += 1
            if kd.private_segment_enabled:
                waves.sgpr[rows, sys_index] = 0
            waves.vgpr[rows, 0] = packed
            waves.sgpr[rows, EXEC_LO] = exec_lo
            waves.sgpr[rows, EXEC_LO + 1] = exec_hi
        waves.pc[:] = self.program.entry
        return waves

    def run_batch(self, run_: "Run", start: int, batch, accesses, budget: int) -> int:
        """Run the workgroups `batch` ((x, y, z) each; the launch's groups from index
        `start` on) as one lockstep batch; returns the wave-instructions executed."""
        return run(self.executor(run_, start, batch, accesses), budget)

    def executor(self, run_: "Run", start: int, batch, accesses) -> Executor:
        """The Executor of the workgroups `batch` (the launch's groups from index `start` on),
        at their first instruction."""
        waves = self._init_waves(batch, run_.block, run_.waves_per_group, run_.seg, run_.kernarg_addr,
                                 run_.packet_addr)
        kd = self.info.descriptor

        def wave_name(i: int) -> str:
            gx, gy, gz = batch[int(waves.slot[i])]
            return f"workgroup ({gx},{gy},{gz}) wave {int(waves.wave_in_group[i])}"

        ex = Executor(self.program, self.name, waves, run_.memory, strict=run_.strict,
                      denorm_f32=kd.float_denorm_mode_32 == 3, denorm_f16=kd.float_denorm_mode_16_64 == 3,
                      ieee_mode=kd.ieee_mode, wave_names=wave_name, fp16_ovfl=kd.fp16_overflow)
        ex.trace = run_.trace
        ex.waived = run_.waived
        ex.accesses = accesses
        ex.group_ids = np.array([run_.group_id(g) for g in batch], np.int64)[waves.slot]
        if run_.trace is not None and hasattr(run_.trace, "attach"):
            run_.trace.attach(ex)
        ex.schedule = self._schedule(run_.schedule, run_.seed, start, waves)
        return ex

    def _schedule(self, name: str, seed, batch_start: int, waves: Waves):
        """The order a batch runs in: None (lockstep) or an adversarial/timed schedule."""
        if name == "adversarial":
            return adversarial.Adversarial(seed, batch_start, waves.count)
        if name in ("lockstep", "concurrent"):     # concurrent: lockstep within a workgroup
            return None
        if name not in _PLUGGED_SCHEDULES:
            raise LaunchError(f"schedule {name!r} is the timing model's: import gfxasm.perf (it registers "
                              f"gfxasm.perf.timed with the emulator)")
        return _PLUGGED_SCHEDULES[name](self.program, waves)


def run(ex: Executor, budget: int) -> int:
    """Schedule the waves of `ex` to completion; returns the wave-instructions executed.
    Lockstep (lowest pc first) unless `ex.schedule` picks the waves and lands loads.
    A wave that spins on memory no one can change here (concurrent.SpinWatch) is a
    DeadlockError, not a hang."""
    executed = 0
    watch = concurrent.SpinWatch(ex)
    for pc, w in steps(ex):
        executed += len(w)
        if executed > budget:
            raise EmulatorError(f"kernel {ex.kernel_name} exceeded {budget} wave-instructions "
                                f"(runaway loop?) at pc {pc:#x}")
        if ex.control == "sleep":
            watch.slept(pc, w)
    ex.wave_instructions = executed
    return executed


def steps(ex: Executor):
    """Run the waves of `ex` one instruction at a time (see run); yields (pc, the waves
    that executed it: an index array) after each. ex.control then says what the instruction did
    ("sleep" for s_sleep: a spin-wait's yield)."""
    waves = ex.waves
    schedule = ex.schedule
    all_waves = np.arange(waves.count)
    groups: dict[int, np.ndarray] = {int(ex.program.entry): all_waves}
    at_barrier = np.zeros(waves.count, dtype=bool)
    while groups:
        if schedule is None:
            pc = min(groups)
            w = groups.pop(pc)
        else:
            pc, w = schedule.pick(groups)
            schedule.land_some(ex)
        sel = slice(None) if len(w) == waves.count else w
        inst = ex.program.at(pc)
        ex.next_pc = None
        ex.control = None
        ex.role = None
        ex.srcc_is_dst = False
        try:
            ex.step(sel, inst)
        except EmulatorError as exc:
            if f"pc {inst.pc:#x}" in str(exc):
                raise
            raise type(exc)(f"{exc} ({ex.where()})") from exc   # say where, once
        except (ValueError, IndexError, TypeError, OverflowError) as exc:
            raise EmulatorError(f"internal error executing `{inst.text}` at pc {inst.pc:#x}: {exc}") from exc
        if schedule is not None:
            schedule.stepped(ex, inst, w)
        if ex.control == "end":
            ex.drain(sel)
            waves.done[w] = True
        elif ex.control == "barrier":
            at_barrier[w] = True
            waves.pc[w] = pc + inst.size
        else:
            new_pc = ex.next_pc
            if new_pc is None or (new_pc.size and (new_pc == new_pc[0]).all()):
                # The whole group goes to one pc (the common case).
                t = pc + inst.size if new_pc is None else int(new_pc[0])
                waves.pc[w] = t
                groups[t] = np.union1d(groups[t], w) if t in groups else w
            else:
                waves.pc[w] = new_pc
                for target in np.unique(new_pc):
                    members = w[new_pc == target]
                    t = int(target)
                    groups[t] = np.union1d(groups[t], members) if t in groups else members
        if ex.control in ("end", "barrier"):
            _release_barriers(waves, at_barrier, groups)
        if not groups and at_barrier.any():
            raise EmulatorError(f"kernel {ex.kernel_name}: waves wait at s_barrier forever "
                                f"(the other waves of their workgroup ended)")
        yield pc, w


def _release_barriers(waves: Waves, at_barrier: np.ndarray, groups: dict) -> None:
    """Release every workgroup whose live waves all wait at s_barrier (all workgroups at
    once: per-slot counts of live waves and of live waves waiting)."""
    live = ~waves.done
    n = int(waves.slot.max()) + 1
    waiting = np.bincount(waves.slot[live & at_barrier], minlength=n)
    full = (waiting > 0) & (waiting == np.bincount(waves.slot[live], minlength=n))
    released = np.flatnonzero(live & at_barrier & full[waves.slot])
    if not released.size:
        return
    at_barrier[released] = False
    pcs = waves.pc[released]
    for target in np.unique(pcs):
        sel = released[pcs == target]
        t = int(target)
        groups[t] = np.union1d(groups[t], sel) if t in groups else sel
