"""One launch's workgroups over several processes (jobs=N) or Ray tasks (engine="ray"),
with the outputs, strict reports and wave_instructions of the serial run.

A serial launch runs its workgroups in batches (kernel.BATCH_WAVES waves each), one batch
after another; a batch's workgroups run in lockstep. In parallel, each batch is cut into
pieces (whole batches when there are at least as many batches as jobs; always whole
batches under the adversarial and timed schedules, whose order depends on the batch), and
the pieces run in worker processes, each starting from the memory the launch started
with. Where the time goes: a lockstep step costs a fixed part per instruction whatever the
number of waves, so a piece of a batch costs more than its share of the batch (on the
build machine one fmha batch of 256 waves: 3.4 s of CPU whole, 4.1 s in 2 pieces, 5.7 s
in 4); and strict mode's compiled bookkeeping (fast.py) runs only for at least
fast.MIN_WAVES waves, below which a piece takes the slower numpy paths (8 pieces of 32
waves: 13.8 s), so a batch is never cut finer than that. A launch of at least as many
batches as jobs (a production prefill) runs whole batches and loses neither. RunStats
records where a launch's time went (docs/emulator-scale.md has measurements).

A piece returns its footprint (races.Footprint: who read, wrote and atomically
updated every global byte it touched, and where), the final values of the bytes it stored
to or updated, and its atomics' operands. The parent then takes the pieces in serial
order, batch by batch:

  * A piece's run is the serial run's for its workgroups exactly when nothing it did
    depended on an earlier piece: it touched no byte an earlier piece (earlier batch, or
    earlier in its batch) stored to; it neither read nor stored to a byte an earlier
    piece updated atomically; it neither stored to nor updated atomically a byte an
    earlier piece read; and no byte was updated atomically by it and by an earlier piece
    of the same batch (in one batch the serial run interleaves the atomics of its
    workgroups instruction by instruction). Workgroups interact through global memory
    only, and only through those bytes.
  * When every piece of a batch passes, the parent merges their footprints into the
    launch's record (so later pieces are checked against them) and writes their bytes
    into memory in piece order. Where an earlier batch also updated a dword atomically
    (both non-returning: a returning atomic is a read), the parent applies the piece's
    atomics to that dword again, in the piece's order, on the memory as it is: serial
    order, batch after batch, and within the piece as it ran.
  * When a piece fails the test, or raised (a HazardError, a fault, the wave-instruction
    budget), the parent runs that whole batch itself on the merged state, as the serial
    run would have: same memory, same record, so the same result or the same report.
    Kernels whose workgroups talk through global memory (atomic counters that hand out
    work, split-K accumulation across workgroups of one batch) therefore gain nothing, but
    stay exact.

Races (races.py) need the same record either way: a race within a piece is reported by
the piece (and the parent's re-run reports it as the serial run does); one between pieces
fails the test above, and the re-run finds it.

Processes are forked (the workers see the launch's buffers at their addresses without a
copy). Ray tasks get one copy of every registered buffer through the object store and
address it at the original addresses (Memory.register(base=...)); the cluster is the one
the caller initialised with ray.init, and ray is imported only then.
"""
from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import os
import resource
import time
from dataclasses import dataclass

import numpy as np

from ..codeobj import load_code_object
from . import fast
from .errors import EmulatorError, LaunchError
from .families.mem import ATOMICS, BUFFER_ATOMICS
from .memory import Memory
from .state import occurrence_rank
from .races import BYTE_FIELDS, DWORD_FIELDS, Footprint, GlobalAccesses

ENGINES = ("processes", "ray")


def check_jobs(jobs, engine: str, trace) -> int:
    """The number of pieces `jobs` asks for at least (0: one per core; for Ray, resolved in
    run() as the cluster's CPUs); refuses what a parallel launch cannot do."""
    if isinstance(jobs, bool) or not isinstance(jobs, (int, np.integer)) or jobs < 0:
        raise LaunchError(f"jobs must be an int >= 0 (0: one per core), got {jobs!r}")
    if engine not in ENGINES:
        raise LaunchError(f"engine must be one of {ENGINES}, got {engine!r}")
    jobs = int(jobs)
    if engine == "processes":
        jobs = jobs or (os.cpu_count() or 1)
    if (jobs != 1 or engine == "ray") and trace is not None:
        raise LaunchError("trace is called in the launching process: it needs jobs=1 and engine='processes'")
    return jobs


def wanted(jobs: int, engine: str) -> bool:
    """Whether the launch runs through this module (check_jobs' jobs)."""
    return jobs != 1 or engine == "ray"


@dataclass
class Piece:
    batch: int              # index of its batch
    start: int              # the launch's group index of the batch's first workgroup
    groups: list            # (x, y, z) of its workgroups, in serial order


@dataclass
class PieceResult:
    executed: int
    footprint: Footprint | None
    values: dict            # region -> bytes at the footprint's stored/updated offsets
    atomic_log: list
    error: str | None       # what the piece raised (the parent re-runs its batch)
    timing: tuple = ()      # (process id, start, wall s, CPU s, system CPU s, minor page faults) of
                            # the piece's run; start on time.perf_counter's clock (system-wide on Linux)


@dataclass
class RunStats:
    """Where one parallel launch's time went (bench/emu_parallel.py reports it)."""
    started: float          # time.perf_counter() when run() began
    pieces: list            # (batch, workgroups, *PieceResult.timing, footprint bytes) per piece
    take_seconds: float     # the parent's checking, merging and writing back, in all
    reruns: int             # batches the parent ran itself
    seconds: float          # the whole of run()


last_run: RunStats | None = None     # the last parallel launch's in this process


def plan(batches, jobs: int, schedule: str, min_groups: int = 1) -> list[Piece]:
    """Cut the batches into pieces: contiguous runs of workgroups, at least `jobs` pieces
    in all where the batches allow it, none of fewer than `min_groups` workgroups unless
    its batch is smaller."""
    parts = 1 if schedule != "lockstep" else -(-jobs // len(batches))
    pieces = []
    for b, (start, groups) in enumerate(batches):
        cuts = np.linspace(0, len(groups), max(1, min(parts, len(groups) // min_groups)) + 1).round().astype(int)
        pieces += [Piece(b, start, groups[lo:hi]) for lo, hi in zip(cuts[:-1], cuts[1:])]
    return pieces


def run_piece(kernel, run_, piece: Piece, budget: int) -> PieceResult:
    """Run one piece on `run_.memory` (a worker's own copy) with a fresh record."""
    started, cpu, faults = time.perf_counter(), os.times(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    accesses = GlobalAccesses(run_.memory, run_.strict, run_.group_name)
    accesses.log_atomics = True
    try:
        executed = kernel.run_batch(run_, piece.start, piece.groups, accesses, budget)
    except EmulatorError as exc:
        return PieceResult(0, None, {}, [], f"{type(exc).__name__}: {exc}")
    footprint = accesses.footprint()
    views = run_.memory._views
    values = {}
    for region, (off, fields, _, _) in footprint.regions.items():
        values[region] = views[region][_changed(off, fields)]
    now = os.times()
    timing = (os.getpid(), started, time.perf_counter() - started, now.user + now.system - cpu.user - cpu.system,
              now.system - cpu.system, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
    return PieceResult(executed, footprint, values, accesses.atomic_log, None, timing)


def _changed(off: np.ndarray, fields: dict) -> np.ndarray:
    """The footprint's byte offsets `off` that were stored to or updated atomically (for an
    output buffer, all of them: then no selection)."""
    changed = (fields["writer"] != 0) | (fields["atomic"] != 0)
    return off if changed.all() else off[changed]


def _footprint_bytes(result: PieceResult) -> int:
    """What a piece's result holds in arrays (most of what it ships to the parent)."""
    if result.footprint is None:
        return 0
    arrays = [result.footprint.records, *result.values.values()]
    for off, kb, doff, kd in result.footprint.regions.values():
        arrays += [off, doff, *kb.values(), *kd.values()]
    return sum(a.nbytes for a in arrays)


# ---------------------------------------------------------------------- engines
_FORKED = None      # in a worker: (kernel, run_, pieces, budget), what it runs pieces of


def _forked_init(state) -> None:
    global _FORKED
    _FORKED = state


def _forked_piece(index: int) -> PieceResult:
    kernel, run_, pieces, budget = _FORKED
    return run_piece(kernel, run_, pieces[index], budget)


def _in_processes(kernel, run_, pieces, budget, jobs):
    # Each worker gets the launch's state through the pool's initializer (inherited by the
    # fork, not pickled). A module global set here and cleared in a `finally` raced: a launch
    # that raised (a race report) left this generator suspended, and its `finally` ran when
    # it was collected, which could fall between the next launch setting the global and its
    # pool forking, so those workers found None.
    state = (kernel, run_, pieces, budget)
    with multiprocessing.get_context("fork").Pool(min(jobs, len(pieces)), initializer=_forked_init,
                                                  initargs=(state,)) as pool:
        yield from pool.imap(_forked_piece, range(len(pieces)))


@functools.lru_cache(maxsize=4)
def _ray_kernel(module_class, co_bytes: bytes, name: str):
    """The kernel decoded once per Ray worker process (its tasks of one launch, and of
    later launches of the same code object, reuse it)."""
    return module_class(load_code_object(co_bytes)).kernel(name)


def _ray_piece(module_class, co_bytes: bytes, name: str, run_, regions, piece: Piece, budget: int) -> PieceResult:
    """A Ray task: the kernel loaded again (module_class: kernel.Module, passed in so that
    this module need not import kernel.py, which imports it) and the launch's memory
    rebuilt from the object store's copy at the original addresses, then run_piece."""
    kernel = _ray_kernel(module_class, co_bytes, name)
    memory = Memory()
    seg = None
    for base, data, region_name in regions:
        view = np.array(data, dtype=np.uint8)                  # writable copy
        memory.register(view, name=region_name, base=base)
        if base == run_.kernarg_addr:
            seg = view
    return run_piece(kernel, dataclasses.replace(run_, memory=memory, seg=seg), piece, budget)


def _ray():
    """The ray module, on a cluster the caller initialised."""
    try:
        import ray
    except ImportError as exc:
        raise LaunchError("engine='ray' needs ray (pip install 'gfxasm[cluster]')") from exc
    if not ray.is_initialized():
        raise LaunchError("engine='ray' runs on the Ray cluster the caller initialised: call ray.init() first")
    return ray


def _in_ray(kernel, run_, pieces, budget):
    ray = _ray()
    regions = ray.put([(base, np.asarray(view), name) for base, view, name in run_.memory.regions()])
    shipped = dataclasses.replace(run_, memory=None, seg=None, trace=None)
    task = ray.remote(num_cpus=1)(_ray_piece)
    co = ray.put(kernel.module.code_object.data)
    refs = [task.remote(type(kernel.module), co, kernel.name, shipped, regions, piece, budget) for piece in pieces]
    for ref in refs:
        yield ray.get(ref)


# ---------------------------------------------------------------------- the parent
def run(kernel, run_, batches, accesses: GlobalAccesses, budget: int, jobs: int, engine: str) -> int:
    global last_run
    started = time.perf_counter()
    if engine == "ray" and jobs == 0:
        jobs = max(1, int(_ray().cluster_resources().get("CPU", 1)))
    # Strict batches of fast.MIN_WAVES waves or more run fast.py's compiled bookkeeping:
    # numba is imported here, once, before the workers fork, and no piece is cut so small
    # that it would fall back to the numpy paths (module docstring).
    min_groups = 1
    largest = max(len(groups) for _, groups in batches) * run_.waves_per_group
    if fast.for_launch(run_.strict, largest) is not None:
        min_groups = -(-fast.MIN_WAVES // run_.waves_per_group)
    pieces = plan(batches, jobs, run_.schedule, min_groups)
    results = (_in_ray(kernel, run_, pieces, budget) if engine == "ray"
               else _in_processes(kernel, run_, pieces, budget, jobs))
    stats = RunStats(started, [], 0.0, 0, 0.0)
    total = 0
    done = []                                       # (piece, result) of the current batch
    for n, (piece, result) in enumerate(zip(pieces, results)):
        done.append((piece, result))
        stats.pieces.append((piece.batch, len(piece.groups), *(result.timing or (None,) * 6),
                             _footprint_bytes(result)))
        if n + 1 < len(pieces) and pieces[n + 1].batch == piece.batch:
            continue
        start, groups = batches[piece.batch]
        took = time.perf_counter()
        executed, rerun = _take_batch(kernel, run_, accesses, done, start, groups, budget - total)
        stats.take_seconds += time.perf_counter() - took
        stats.reruns += rerun
        total += executed
        done = []
    stats.seconds = time.perf_counter() - started
    last_run = stats
    return total


def _take_batch(kernel, run_, accesses, done, start, groups, budget) -> tuple[int, bool]:
    """Merge one batch's pieces, or run the batch here when one of them cannot stand;
    (wave-instructions, whether it ran here)."""
    mark = accesses.count
    undo: list = []
    replays = []
    executed = 0
    for n, (piece, result) in enumerate(done):
        executed += result.executed
        replay = None
        if result.error is None and executed <= budget:
            replay = _check(accesses, result.footprint, mark)
        if replay is None:
            _rollback(accesses, mark, undo)
            return kernel.run_batch(run_, start, groups, accesses, budget), True
        # the batch's last piece is never rolled back: no undo to keep (a whole batch's piece)
        _merge(accesses, result.footprint, undo if n + 1 < len(done) else None)
        replays.append(replay)
    for (piece, result), replay in zip(done, replays):
        _write(run_.memory, result, replay)
    return executed, False


def _check(accesses: GlobalAccesses, fp: Footprint, batch_mark: int):
    """None if the piece's footprint meets an earlier piece's (module docstring), else per
    region the byte offsets whose atomics must be applied again (an earlier batch updated
    them atomically too)."""
    replay = {}
    for region, (off, kb, doff, kd) in fp.regions.items():
        shadow = accesses.shadows.get(region)
        if shadow is None:
            replay[region] = off[:0]
            continue
        k_write, k_atomic, k_read = kb["writer"] != 0, kb["atomic"] != 0, kd["reader"] != 0
        changed = shadow.stored or shadow.updated         # else the earlier pieces only read it
        if changed and k_read.any():
            # the bytes of the dwords the piece read, as earlier pieces left them
            quads = np.minimum(4 * doff[k_read, None] + np.arange(4), len(shadow.bytes["writer"]) - 1)
            if (shadow.bytes["writer"][quads].any() or shadow.bytes["atomic"][quads].any()):
                return None
        if not off.size:
            replay[region] = off
            continue
        p_write, p_atomic = shadow.bytes["writer"][off], shadow.bytes["atomic"][off]
        if (((k_write | k_atomic) & (p_write != 0)).any() or (k_write & (p_atomic != 0)).any()
                or (k_atomic & (p_atomic >= batch_mark)).any()):
            return None
        if shadow.read and (shadow.dwords["reader"][off >> 2] != 0).any():   # stores/atomics after reads
            return None
        replay[region] = off[k_atomic & (p_atomic != 0)]
    return replay


def _merge(accesses: GlobalAccesses, fp: Footprint, undo: list | None) -> None:
    """Take a checked piece's footprint into the launch's record, as if its workgroups
    had run here after everything merged so far (races.py's field rules; the check made
    sure no byte the piece stored to or read had an earlier store); what it overwrites is
    appended to `undo` for _rollback, unless that is None."""
    shift = accesses.count - 1
    records = fp.records[1:]
    accesses.reserve(len(records))
    accesses.records[accesses.count:accesses.count + len(records)] = records
    accesses.count += len(records)
    for region, (off, kb, doff, kd) in fp.regions.items():
        shadow = accesses.shadow(region)
        if undo is not None:
            undo.append((shadow, (shadow.lo, shadow.hi, shadow.stored, shadow.updated, shadow.read),
                         off, {f: shadow.bytes[f][off] for f in BYTE_FIELDS},
                         doff, {f: shadow.dwords[f][doff] for f in DWORD_FIELDS}))
        shadow.touch(int(off.min()) if off.size else 4 * int(doff.min()),
                     int(off.max()) + 1 if off.size else 4 * int(doff.max()) + 4)
        for name in BYTE_FIELDS:
            ours = kb[name] != 0
            if ours.all():                  # a region only stored to (or only updated): no selection
                shadow.bytes[name][off] = kb[name] + shift
            elif ours.any():
                shadow.bytes[name][off[ours]] = kb[name][ours] + shift
        shadow.stored |= bool((kb["writer"] != 0).any())
        shadow.updated |= bool((kb["atomic"] != 0).any())
        dw = shadow.dwords
        first, other = dw["reader"][doff], dw["other_reader"][doff]
        read = kd["reader"] != 0
        moved = {f: np.where(kd[f] != 0, kd[f] + shift, 0).astype(np.int32) for f in DWORD_FIELDS}
        fresh = read & (first == 0)
        dw["reader"][doff[fresh]] = moved["reader"][fresh]
        dw["other_reader"][doff[fresh]] = moved["other_reader"][fresh]
        second = read & (first != 0) & (other == 0)       # the piece's workgroups differ from theirs
        dw["other_reader"][doff[second]] = moved["reader"][second]
        shadow.read |= bool(read.any())
    accesses.clocks.update(fp.clocks)
    accesses.snapshots.update({r + shift: clock for r, clock in fp.snapshots.items()})


def _rollback(accesses: GlobalAccesses, mark: int, undo: list) -> None:
    """Forget what _merge took in since the record held `mark` records."""
    for shadow, state, off, old_bytes, doff, old_dwords in reversed(undo):
        shadow.lo, shadow.hi, shadow.stored, shadow.updated, shadow.read = state
        for name, values in old_bytes.items():
            shadow.bytes[name][off] = values
        for name, values in old_dwords.items():
            shadow.dwords[name][doff] = values
    for g in set(accesses.records[mark:accesses.count, 0].tolist()):
        accesses.clocks.pop(g, None)
    for r in [r for r in accesses.snapshots if r >= mark]:
        del accesses.snapshots[r]
    accesses.count = mark


def _write(memory: Memory, result: PieceResult, replay: dict) -> None:
    """A merged piece's stores and atomics into the launch's memory."""
    views = memory._views
    dwords = []
    for region, (off, k, _, _) in result.footprint.regions.items():
        changed = _changed(off, k)
        if not replay[region].size:
            views[region][changed] = result.values[region]
            continue
        again = np.isin(changed, replay[region])
        views[region][changed[~again]] = result.values[region][~again]
        dwords.append(memory._bases[region] + replay[region][replay[region] % 4 == 0].astype(np.uint64))
    again = np.concatenate(dwords) if dwords else np.zeros(0, np.uint64)
    if not again.size:
        return
    ops = {**ATOMICS, **BUFFER_ATOMICS}
    for addr, values, name in result.atomic_log:
        sel = np.isin(addr, again)
        if sel.any():
            _apply_in_order(memory, addr[sel], values[sel], ops[name])


def _apply_in_order(memory: Memory, addr: np.ndarray, values: np.ndarray, fn) -> None:
    """fn(old, value) on the dword at each address, one lane after another (in rounds)."""
    rank = occurrence_rank(addr)
    for r in range(int(rank.max()) + 1):
        sel = rank == r
        old = memory.read(addr[sel], 4).view(np.uint32).reshape(-1)
        memory.write(addr[sel], np.asarray(fn(old.copy(), values[sel]), np.uint32).view(np.uint8).reshape(-1, 4))
