"""The time of a launch run under the emulator's concurrent schedule, whose workgroups wait
on each other's releases (gfxasm.emu.concurrent records a Timeline of them).

    res = kernel.launch(..., schedule="concurrent")
    t = gfxasm.perf.flagwait.launch_seconds(res.timeline, group_seconds)

`group_seconds` is each workgroup's modelled time as if it never waited (one float for all,
or a mapping from the linear workgroup id): the timing model's per-workgroup time, or the
caller's. The rule:

  * A workgroup's time is spread over its wave-instructions outside spin-waits in
    proportion (ASSUMED: the timeline has instruction counts, not cycles, so a workgroup
    that releases after a short prologue and then does heavy MFMA work is placed as if its
    time were uniform).
  * It starts at the launch, or when the workgroup whose slot it took ends (the schedule's
    order; the hardware dispatcher's may differ).
  * At each acquire it cannot go on before the releasing workgroup reached its release plus
    FLAG_LATENCY_S (the writeback, the flag's store reaching memory, the poll that sees it and
    the invalidate).
  * The launch ends when the last workgroup does (no launch overhead is added here).

Uncertainty: FLAG_LATENCY_S is ASSUMED (FLAG_LATENCY_BRACKET gives the range to quote); the
proportional split can misplace a release by up to the workgroup's whole time; the spin's
own cost on the CU (the polls compete for issue slots and memory) is not charged.
Measured against the model's own phase times on the one-launch MoE (bench/moe.py
--one-launch, docs/performance.md): the rule gave 19.72 us where the phases give 20.69,
optimistic on both counts: a waiting workgroup whose instructions mostly come before its
wait while its memory traffic comes after it is placed too early, and memory traffic a
waiting workgroup issues before its wait is charged to no one. So a change that moves
instructions or loads ahead of a wait can look like a gain under this rule and be none.
"""
from __future__ import annotations

from dataclasses import dataclass

# ASSUMED: about two HBM-latency round trips on MI355X (~0.7-1 us each, loaded): the flag
# store and the writeback reaching memory, then the first poll after it returning. Not
# measured; quote results over the bracket.
FLAG_LATENCY_S = 1.5e-6
FLAG_LATENCY_BRACKET = (0.5e-6, 4.0e-6)


@dataclass
class FlagTiming:
    seconds: float          # the launch: the last workgroup's end
    start: dict             # linear workgroup id -> seconds
    end: dict
    waited: dict            # seconds each workgroup stood at its acquires


def launch_seconds(timeline, group_seconds, latency_s: float = FLAG_LATENCY_S) -> FlagTiming:
    """The launch's time under the module docstring's rule."""
    lines = timeline.groups
    if latency_s < 0:
        raise ValueError(f"latency_s must be >= 0, got {latency_s}")
    seconds = {g: float(group_seconds if isinstance(group_seconds, (int, float)) else group_seconds[g])
               for g in lines}
    if any(s < 0 for s in seconds.values()):
        raise ValueError("group_seconds must be >= 0")
    rate = {g: seconds[g] / max(line.work, 1) for g, line in lines.items()}
    waits = {g: sorted(line.waits, key=lambda w: w.at) for g, line in lines.items()}
    # resumed[g][i]: when g goes on after its i-th wait (Jacobi passes until nothing moves:
    # the waits form no cycle in a run that finished, so the passes converge)
    resumed = {g: [0.0] * len(waits[g]) for g in lines}
    start = dict.fromkeys(lines, 0.0)
    for _ in range(len(lines) + 2):
        end = {g: _reach(g, lines[g].work, start, resumed, waits, rate) for g in lines}
        new_start = {g: end[line.started_after] if line.started_after is not None else 0.0
                     for g, line in lines.items()}
        new_resumed = {g: [on for _, on in _walk(new_start[g], rate[g], waits[g], lambda _, wait: _reach(
            wait.releaser, wait.released_at, start, resumed, waits, rate) + latency_s)] for g in lines}
        if new_start == start and new_resumed == resumed:
            break
        start, resumed = new_start, new_resumed
    else:
        raise RuntimeError("flag waits did not settle: the timeline has a cycle")
    waited = {g: sum(on - arrived for arrived, on in _walk(start[g], rate[g], waits[g], lambda i, _: resumed[g][i]))
              for g in lines}
    return FlagTiming(max(end.values(), default=0.0), start, end, waited)


def _walk(start: float, rate: float, waits: list, ready) -> list[tuple[float, float]]:
    """A workgroup's (arrival, resumption) at each of its waits, in order: it runs at `rate`
    seconds per wave-instruction from `start`, and goes on from the i-th wait at
    max(arrival, ready(i, wait))."""
    t, pos, times = start, 0, []
    for i, wait in enumerate(waits):
        t += rate * (wait.at - pos)
        pos = wait.at
        arrived, t = t, max(t, ready(i, wait))
        times.append((arrived, t))
    return times


def _reach(g, work: int, start, resumed, waits, rate) -> float:
    """When workgroup g had done `work` wave-instructions (outside spins)."""
    t, pos = start[g], 0
    for i, wait in enumerate(waits[g]):
        if wait.at > work:
            break
        t, pos = resumed[g][i], wait.at
    return t + rate[g] * (work - pos)
