"""Adversarial schedules: random legal interleavings and load-landing times, seeded.

The default (lockstep) schedule runs the waves that stand at one pc together, always
advancing the lowest pc, and lands a load when the s_waitcnt covering it retires. A
kernel whose result depends on the schedule has a race that this one order may hide.
`launch(..., schedule="adversarial", seed=N)` draws, from numpy's PCG64 seeded with N
(and the batch), a different order that the ISA still allows:

* Which waves run next. Each wave has a random priority; the waves standing at the pc
  of the highest-priority ready wave run next, often only a random part of them (a
  lockstep group is split). At random change points the running wave drops to the
  lowest priority (as in PCT, Burckhardt et al., ASPLOS 2010); the rate of change
  points is itself drawn per seed, from about one per 2 steps (fine interleaving) to
  one per 500 (one wave runs far ahead of the others). s_barrier holds as always.
* When loads land. Before every step every outstanding memory op lands with a
  probability drawn per seed: 0 for one seed in four (every load lands as late as the
  ISA allows, at the s_waitcnt or s_endpgm that needs it), else from 1e-3 to 1. Order
  within a wave is the ISA's: VMEM ops (loads, stores, LDS DMA) return in issue order,
  and so do DS ops; scalar loads in any order. An LDS DMA writes LDS when it lands, so
  other waves may see it at any time before the wait. s_barrier waits for the waves,
  not for their counters (gfx9; LLVM puts no wait before it on gfx950, which supports
  back-off barriers), so a load may land after a barrier that does not wait for it.
* s_waitcnt lgkmcnt(N) over scalar loads lands a random choice of them.
* A register read while its load is in flight sees the value from before the load,
  which hardware returns when the load is late (lockstep mode outside strict mode
  lands it first instead): a missing s_waitcnt changes the answer.

Not varied: a DS or global access reads or writes memory at issue (for LDS that is the
CU's one global order of LDS operations, AMDGPUUsage's memory model for GFX940); lanes
apply in lane order. Workgroups of different batches (kernel.BATCH_WAVES) never interleave.

`check(run, seeds)` is the race detector by consequence: it runs `run()` under the
lockstep schedule and under each seed, every emulator launch inside forced outside
strict mode, and reports each output that changed, bit for bit, with the seed.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import numpy as np
import torch

from .errors import EmulatorError

SCHEDULES = ("lockstep", "adversarial", "timed")

# (schedule, seed, strict) forced on every Kernel.launch inside `override`.
_FORCED: contextvars.ContextVar = contextvars.ContextVar("gfxasm_emu_forced_schedule", default=None)


def check_schedule(schedule, seed, strict: bool) -> None:
    """Refuse a schedule name, seed or strictness that launch cannot run with."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if schedule != "adversarial" and seed is not None:
        raise ValueError("seed is only for schedule='adversarial'")
    if schedule == "lockstep":
        return
    if schedule == "adversarial":
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int for schedule='adversarial', got {seed!r}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
    if strict:
        raise ValueError(f"schedule={schedule!r} runs outside strict mode (pass strict=False): strict "
                         f"mode's rules are checked against loads landing at their s_waitcnt")


def forced():
    """(schedule, seed, strict) while inside `override`, else None."""
    return _FORCED.get()


@contextlib.contextmanager
def override(seed: int | None, *, strict: bool = False, schedule: str | None = None):
    """Run every gfxasm.emu launch inside under the adversarial schedule of `seed` (None:
    the lockstep schedule, or `schedule`) and with `strict`, whatever the caller passes:
    for ops such as gfxasm.fmha_fwd, whose backend launches the emulator itself."""
    if schedule is None:
        schedule = "lockstep" if seed is None else "adversarial"
    check_schedule(schedule, seed, strict)
    token = _FORCED.set((schedule, seed, bool(strict)))
    try:
        yield
    finally:
        _FORCED.reset(token)


class Adversarial:
    """The random choices of one batch of waves (see the module docstring)."""

    def __init__(self, seed: int, batch: int, count: int):
        self.rng = np.random.default_rng([seed, batch])
        rng = self.rng
        self.priority = rng.permutation(count).astype(np.float64)
        self.change = 10.0 ** -rng.uniform(0.3, 2.7)     # change points per step
        self.split = rng.uniform(0.0, 1.0)                # chance a group is split
        self.land = 0.0 if rng.random() < 0.25 else 10.0 ** -rng.uniform(0.0, 3.0)   # per op per step

    def pick(self, groups: dict) -> tuple[int, np.ndarray]:
        """Take the waves to run next out of `groups` (pc -> waves): (pc, waves)."""
        rng, priority = self.rng, self.priority
        pc, w = group_of(groups, np.argmax, priority)
        top = int(np.argmax(priority[w]))
        if rng.random() < self.change:
            priority[w[top]] = priority.min() - 1.0
        if len(w) > 1 and rng.random() < self.split:
            run = rng.random(len(w)) < 0.5
            run[top] = True
            if not run.all():
                groups[pc] = w[~run]
                return pc, w[run]
        del groups[pc]
        return pc, w

    def land_some(self, ex) -> None:
        """Land outstanding ops early, each with probability `land`, in an order the ISA
        allows (see `next_to_land`)."""
        if not self.land:
            return
        rng = self.rng
        for counter in ("vm", "lgkm"):
            queues = ex.waves.queues[counter]
            for wave in np.flatnonzero(rng.random(len(queues)) < self.land).tolist():
                queue = queues[wave]
                while queue:
                    ex.land_now(wave, counter, self.next_to_land(wave, queue))
                    if rng.random() >= self.land:
                        break

    def next_to_land(self, wave: int, queue) -> int:
        """Position in `wave`'s queue of the op to land next, drawn from `landable`.
        s_waitcnt lands through this too."""
        choices = landable(queue)
        return choices[int(self.rng.integers(len(choices)))] if len(choices) > 1 else choices[0]

    def stepped(self, ex, inst, w) -> None:
        """Nothing to do after a step (the timed schedule stamps the ops it queued here)."""


def group_of(groups: dict, arg, key: np.ndarray) -> tuple[int, np.ndarray]:
    """(pc, waves) of the group holding the wave that `arg` (np.argmax, np.argmin) picks by
    `key` among all the waves of `groups` (ties: the first group in `groups`' order)."""
    pcs = list(groups)
    members = [groups[p] for p in pcs]
    best = int(arg(key[np.concatenate(members)]))
    n = int(np.searchsorted(np.cumsum([len(m) for m in members]), best, side="right"))
    return pcs[n], members[n]


def landable(queue) -> list[int]:
    """Positions in one wave's queue of the ops the ISA lets land first: the oldest op that
    returns in order (VMEM, DS) and any scalar load (scalar memory returns out of order)."""
    choices = [n for n, op in enumerate(queue) if op.smem]
    in_order = next((n for n, op in enumerate(queue) if not op.smem), None)
    if in_order is not None:
        choices.append(in_order)
    return choices


# ------------------------------------------------------------------ race detector
@dataclass(frozen=True)
class Divergence:
    """Output `name` under adversarial `seed` differs from the lockstep schedule's (or the
    run failed: `error`, e.g. a memory fault from an address computed from a stale register)."""
    seed: int
    name: str
    first: int = 0      # flat index of the first differing element
    count: int = 0      # elements that differ
    total: int = 0
    error: str = ""

    def __str__(self) -> str:
        if self.error:
            return f"seed {self.seed}: the run failed: {self.error}"
        return (f"seed {self.seed}: {self.name} differs from the lockstep schedule's in {self.count} "
                f"of {self.total} elements (first at flat index {self.first})")


def _outputs(result) -> dict[str, tuple[tuple, np.ndarray]]:
    """name -> ((shape, dtype), uint8[elements, element size]) of every tensor or array
    in `result` (bytes, so that NaNs and bf16 compare bit for bit)."""
    if isinstance(result, dict):
        items = list(result.items())
    elif isinstance(result, (list, tuple)):
        items = [(f"output[{n}]", v) for n, v in enumerate(result)]
    else:
        items = [("output", result)]
    out = {}
    for name, value in items:
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            raw = t.reshape(-1).view(torch.uint8).numpy().reshape(t.numel(), t.element_size())
            key = (tuple(t.shape), str(t.dtype))
        elif isinstance(value, np.ndarray):
            raw = np.ascontiguousarray(value).reshape(-1).view(np.uint8).reshape(value.size, value.itemsize)
            key = (value.shape, str(value.dtype))
        elif value is None:
            continue
        else:
            raise TypeError(f"run() returned {type(value).__name__} for {name}; expected tensors or arrays")
        out[str(name)] = (key, raw.copy())
    if not out:
        raise ValueError("run() returned no tensor or array to compare")
    return out


def _differ(seed: int, name: str, ref, got) -> Divergence | None:
    (ref_key, a), (got_key, b) = ref, got
    if ref_key != got_key:
        return Divergence(seed, name, 0, len(a), len(a))
    bad = (a != b).any(axis=1)
    if not bad.any():
        return None
    return Divergence(seed, name, int(np.flatnonzero(bad)[0]), int(bad.sum()), len(a))


def check(run, seeds=range(4)) -> list[Divergence]:
    """Run `run()` (a callable that launches the emulator and returns its outputs: a tensor
    or array, a sequence or a dict of them) under the lockstep schedule, then under the
    adversarial schedule of each seed, every launch outside strict mode. Returns every
    output that differs from the lockstep run bit for bit, and every seed under which the
    emulator raised; empty when none did."""
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds is empty")
    with override(None):
        reference = _outputs(run())
    found = []
    for seed in seeds:
        try:
            with override(seed):
                got = _outputs(run())
        except EmulatorError as exc:
            found.append(Divergence(seed, "run", error=f"{type(exc).__name__}: {exc}"))
            continue
        if got.keys() != reference.keys():
            raise ValueError(f"run() returned outputs {sorted(got)} under seed {seed} but "
                             f"{sorted(reference)} under the lockstep schedule")
        for name, ref in reference.items():
            d = _differ(seed, name, ref, got[name])
            if d is not None:
                found.append(d)
    return found


def check_launch(kernel, *, grid, block, kernarg: bytes, buffers, seeds=range(4)) -> list[Divergence]:
    """`check` for one Kernel.launch: every buffer is restored to its contents at the call
    before each run and compared after it (named buffers[i])."""
    buffers = list(buffers)
    start = [b.clone() for b in buffers]

    def run():
        for b, s in zip(buffers, start):
            b.copy_(s)
        kernel.launch(grid=grid, block=block, kernarg=kernarg, buffers=buffers)
        return {f"buffers[{n}]": b.clone() for n, b in enumerate(buffers)}
    return check(run, seeds)
