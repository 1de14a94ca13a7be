"""Concurrent workgroups (gfxasm.emu.concurrent) on the fixture kernel grid_flag
(tests/fixtures/grid_flag.s, manifest tests/fixtures/races.yaml): one workgroup publishes a
block through a grid-wide flag (buffer_wbl2 sc1, s_waitcnt, store sc1), the others spin on
it with s_sleep (load sc1, s_waitcnt, buffer_inv sc1) and then consume it. Fresh random
inputs, outputs poisoned; the reference is computed with torch (the f32 add the kernel
does, checked against float64 too). Also: a producer that never releases (deadlock), a
release without the writeback (race), a plain poll (race), the serial schedule (deadlock
reported, not a hang), resident capacity, and the timing of such a launch."""
from __future__ import annotations

import re
import struct

import pytest
import torch

import gfxasm.emu as emu
from gfxasm import launcher
from gfxasm.emu import concurrent
from gfxasm.perf import analyze, flagwait, params

from asm_harness import run_snippet
from test_races import race_manifest  # noqa: F401  (the fixture: tests/fixtures/races.yaml, built)


def grid_flag(manifest, variant: str, groups: int, producer: int, gen: torch.Generator, **launch):
    """Launch a variant of grid_flag (or grid_flag_wide, whose variants start so);
    returns (arguments, LaunchResult)."""
    kernel = manifest.kernel("grid_flag_wide" if variant.startswith("grid_flag_wide") else "grid_flag")
    threads = kernel.workgroup[0]
    args = dict(x=torch.randn(groups * threads, generator=gen), data=torch.full((threads,), float("nan")),
                out=torch.full((groups * threads,), float("nan")), flag=torch.zeros(1, dtype=torch.uint32),
                producer=producer, groups=groups)
    return args, launch_direct(kernel.variant(variant), args, **launch)


def launch_direct(chosen, args: dict, **launch):
    """Run a manifest variant on the emulator through Kernel.launch with its own arguments
    (`launch`: schedule, seed, resident, ...), the kernarg laid out by the manifest."""
    prepared = launcher.prepare(chosen, args)
    segment = bytearray(prepared.template)
    tensors = [args[a.name] for a in chosen.args if a.type.is_pointer]
    for (_, offset, _), tensor in zip(prepared.pointers, tensors):
        struct.pack_into("<Q", segment, offset, tensor.data_ptr())
    kernel = emu.load(prepared.co_path).kernel(prepared.symbol)
    return kernel.launch(prepared.grid, prepared.block, bytes(segment), tensors, **launch)


def check_published(args, groups: int, producer: int) -> None:
    x = args["x"].view(groups, -1)
    block = 2 * x[producer]                                        # doubling is exact in f32
    assert torch.equal(args["data"], block)
    assert int(args["flag"][0]) == 1
    assert torch.equal(args["out"].view(groups, -1), block + x)    # one f32 add, round to nearest even
    torch.testing.assert_close(args["out"].double().view(groups, -1), 2 * x[producer].double() + x.double(),
                               rtol=2.0 ** -24, atol=0.0)


@pytest.mark.parametrize("seed", [None, 0, 1, 2])
@pytest.mark.parametrize("groups,producer", [(2, 0), (5, 0), (5, 4), (7, 3)])
def test_waiting_workgroups_see_the_release(race_manifest, gen, groups, producer, seed):
    args, res = grid_flag(race_manifest, "grid_flag", groups, producer, gen, schedule="concurrent", seed=seed)
    check_published(args, groups, producer)
    lines = res.timeline.groups
    assert sorted(lines) == list(range(groups))
    assert lines[producer].waits == [] and lines[producer].spin == 0
    for g, line in lines.items():
        if g != producer:                      # every consumer acquired the producer's release
            assert [w.releaser for w in line.waits] == [producer]
            assert line.waits[0].released_at <= lines[producer].work


@pytest.mark.parametrize("seed", [None, 4])
def test_a_workgroup_of_four_waves_releases_after_its_barrier(race_manifest, gen, seed):
    args, res = grid_flag(race_manifest, "grid_flag_wide", 3, 1, gen, schedule="concurrent", seed=seed)
    check_published(args, 3, 1)
    assert res.waves == 12
    assert all(line.waits for g, line in res.timeline.groups.items() if g != 1)


def test_a_writeback_before_the_other_waves_stores_complete_is_refused(race_manifest, gen):
    with pytest.raises(emu.HazardError, match=r"buffer_wbl2 while wave [123] of the workgroup still has a store "
                                              r"in flight \(`global_store_dword .*\): the writeback need not "
                                              r"cover it .*workgroup \(1,0,0\) wave 0"):
        grid_flag(race_manifest, "grid_flag_wide_unwaited", 3, 1, gen, schedule="concurrent")


@pytest.mark.parametrize("seed", [None, 2])
def test_read_modify_write_atomics_release_and_acquire(race_manifest, gen, seed):
    args, res = grid_flag(race_manifest, "grid_flag_rmw", 4, 1, gen, schedule="concurrent", seed=seed)
    check_published(args, 4, 1)
    assert all([w.releaser for w in line.waits] == [1] for g, line in res.timeline.groups.items() if g != 1)


def test_a_ticket_without_writeback_and_invalidate_orders_nothing_here(race_manifest, gen):
    """column_sum's ticket (a returning atomic add after plain stores, no buffer_wbl2 or
    buffer_inv) orders the blocks under the serial schedule's lenient rule (test_races);
    under this schedule's model it publishes nothing: the summing workgroup's loads race."""
    groups = 4
    args = dict(x=torch.randn(groups * 64, generator=gen), partial=torch.full((groups * 64,), float("nan")),
                out=torch.full((64,), float("nan")), counter=torch.zeros(1, dtype=torch.uint32), groups=groups)
    with pytest.raises(emu.HazardError) as info:
        launch_direct(race_manifest.kernel("column_sum").variant("column_sum_ordered"), args, schedule="concurrent")
    buffer, first, writer, then, reader = RACE.search(str(info.value)).groups()
    assert (buffer, first, then) == ("buffers[1]", "stored to", "read") and writer != reader


def test_atomic_adds_of_every_workgroup_are_no_race_here(race_manifest, gen):
    groups = 5
    args = dict(x=torch.randn(groups * 64, generator=gen), partial=torch.full((groups * 64,), float("nan")),
                out=torch.zeros(64), counter=torch.zeros(1, dtype=torch.uint32), groups=groups)
    launch_direct(race_manifest.kernel("column_sum").variant("column_sum_atomic_add"), args, schedule="concurrent",
                  seed=1)
    torch.testing.assert_close(args["out"].double(), 2 * args["x"].double().view(groups, 64).sum(0),
                               rtol=groups * 2.0 ** -24, atol=1e-6)       # f32 adds in the schedule's order


def test_a_seed_gives_one_order(race_manifest):
    runs = [grid_flag(race_manifest, "grid_flag", 6, 2, torch.Generator().manual_seed(7), schedule="concurrent",
                      seed=5) for _ in range(2)]
    assert runs[0][1].wave_instructions == runs[1][1].wave_instructions
    assert runs[0][1].timeline == runs[1][1].timeline
    assert torch.equal(runs[0][0]["out"], runs[1][0]["out"])


def test_workgroups_beyond_capacity_start_when_a_slot_frees(race_manifest, gen):
    args, res = grid_flag(race_manifest, "grid_flag", 5, 0, gen, schedule="concurrent", resident=2)
    check_published(args, 5, 0)
    started = {g: line.started_after for g, line in res.timeline.groups.items()}
    assert started[0] is None and started[1] is None            # the first two take the two slots
    assert all(started[g] is not None for g in range(2, 5))     # the rest wait for an end
    assert sorted(started[g] for g in range(2, 5)) == sorted(set(started[g] for g in range(2, 5)))


DEADLOCK = re.compile(r"every live workgroup spins \(s_sleep\) on global memory that none of them changes; live: "
                      r"((?:workgroup \(\d+,0,0\) at pc 0x[0-9a-f]+(?:; )?)+)")


def live_groups(message: str) -> list[int]:
    return [int(g) for g in re.findall(r"workgroup \((\d+),0,0\) at pc", DEADLOCK.search(message).group(1))]


@pytest.mark.parametrize("seed", [None, 3])
def test_a_producer_that_never_releases_is_a_deadlock(race_manifest, gen, seed):
    with pytest.raises(emu.DeadlockError) as info:
        grid_flag(race_manifest, "grid_flag_no_release", 4, 1, gen, schedule="concurrent", seed=seed)
    assert live_groups(str(info.value)) == [0, 2, 3]            # the producer ended; the rest spin


def test_a_producer_beyond_the_resident_capacity_is_a_deadlock(race_manifest, gen):
    with pytest.raises(emu.DeadlockError) as info:
        grid_flag(race_manifest, "grid_flag", 5, 4, gen, schedule="concurrent", resident=2)
    message = str(info.value)
    assert live_groups(message) == [0, 1]
    assert "3 workgroup(s) wait for a free slot (resident capacity 2), first (2,0,0)" in message


RACE = re.compile(r"cross-workgroup race on global memory: .* of (buffers\[\d\]) is ([a-z ()0-9]+) by workgroup "
                  r"\((\d+),0,0\) at pc 0x[0-9a-f]+ and ([a-z ()0-9]+) by workgroup \((\d+),0,0\) at pc 0x[0-9a-f]+, "
                  r"and no release \(buffer_wbl2 sc1, s_waitcnt\) / acquire \(s_waitcnt, buffer_inv sc1\) pair "
                  r"orders the two")


def race(manifest, variant: str, producer: int, gen) -> tuple:
    """(buffer, first verb, first workgroup, second verb, second workgroup) of the race that
    a concurrent launch of 3 workgroups reports."""
    with pytest.raises(emu.HazardError) as info:
        grid_flag(manifest, variant, 3, producer, gen, schedule="concurrent")
    return RACE.search(str(info.value)).groups()


def test_a_release_without_the_writeback_is_a_race(race_manifest, gen):
    buffer, first, producer, then, consumer = race(race_manifest, "grid_flag_no_fence", 0, gen)
    assert (buffer, first, producer, then) == ("buffers[1]", "stored to", "0", "read")     # data
    assert consumer in ("1", "2")
    # Outside strict mode nothing is reported, and the values are the model's (memory as it is).
    args, _ = grid_flag(race_manifest, "grid_flag_no_fence", 3, 0, gen, schedule="concurrent", strict=False)
    check_published(args, 3, 0)


def test_an_invalidate_before_the_poll_lands_acquires_nothing(race_manifest, gen):
    buffer, first, producer, then, consumer = race(race_manifest, "grid_flag_early_inv", 1, gen)
    assert (buffer, first, producer, then) == ("buffers[1]", "stored to", "1", "read")     # data
    assert consumer in ("0", "2")


def test_a_plain_poll_of_the_flag_is_a_race(race_manifest, gen):
    buffer, first, poller, then, producer = race(race_manifest, "grid_flag_plain_poll", 2, gen)
    assert (buffer, first, then, producer) == ("buffers[3]", "read", "stored to atomically (sc1)", "2")   # flag
    assert poller in ("0", "1")


def test_the_serial_schedule_reports_the_deadlock(race_manifest, gen):
    with pytest.raises(emu.DeadlockError) as info:
        grid_flag(race_manifest, "grid_flag", 3, 0, gen)
    message = str(info.value)
    assert re.search(r"workgroup\(s\) \(1,0,0\), \(2,0,0\) spin at s_sleep pc 0x[0-9a-f]+ \(64 times in the same "
                     r"state, global memory unchanged\): under the serial schedule", message), message
    assert "schedule='concurrent'" in message


def test_the_serial_schedule_runs_a_producer_alone(race_manifest, gen):
    args, _ = grid_flag(race_manifest, "grid_flag", 1, 0, gen)             # nobody waits: no spin
    check_published(args, 1, 0)


@pytest.mark.parametrize("launch", [dict(schedule="concurrent"), dict(schedule="concurrent", seed=1),
                                    dict(schedule="concurrent", resident=3)])
def test_a_kernel_whose_workgroups_do_not_wait_gives_the_serial_result(fixture_manifest, gen, launch):
    """rowsum (four waves reducing through LDS across s_barrier) over 9 rows with a tail."""
    rows, cols = 9, 300
    x = torch.randn(rows, cols, generator=gen)
    outs = []
    for kw in (dict(), launch):
        args = dict(x=x, out=torch.full((rows,), float("nan")), cols=cols)
        res = launch_direct(fixture_manifest.kernel("rowsum").variant(None), args, **kw)
        outs.append((args["out"], res.wave_instructions))
    assert torch.equal(outs[0][0], outs[1][0]) and outs[0][1] == outs[1][1]
    torch.testing.assert_close(outs[1][0].double(), x.double().sum(1), rtol=1e-5, atol=1e-5)


def test_a_counted_sleep_loop_is_no_spin():
    """s_sleep in a loop that counts (a back-off) changes its state each time: the serial
    schedule runs it to the end, past SPIN_LIMIT sleeps with global memory unchanged."""
    count = concurrent.SPIN_LIMIT + 36
    out = run_snippet(f"  s_mov_b32 s20, {count}\n  s_mov_b32 s21, 0\nL_delay:\n  s_sleep 1\n"
                      f"  s_add_u32 s21, s21, 1\n  s_sub_u32 s20, s20, 1\n  s_cmp_lg_u32 s20, 0\n"
                      f"  s_cbranch_scc1 L_delay", outputs=["s20", "s21"])
    assert (int(out["s20"]), int(out["s21"])) == (0, count)


def test_resident_capacity_agrees_with_the_timing_model(race_manifest, fixture_manifest):
    """The emulator's capacity (it may not import gfxasm.perf) against the model's occupancy."""
    for variant in (race_manifest.kernel("grid_flag").variant("grid_flag"),):
        info = emu.load(variant.co_path).kernel(variant.kernel.symbol).info
        occupancy = analyze(variant.co_path).occupancy
        assert concurrent.resident_capacity(info, 1) == occupancy.workgroups_per_cu * params.NUM_CUS
    rowsum = fixture_manifest.kernel("rowsum").variant(None)          # 4 waves, LDS
    info = emu.load(rowsum.co_path).kernel(rowsum.kernel.symbol).info
    assert concurrent.resident_capacity(info, 4) == analyze(rowsum.co_path).occupancy.workgroups_per_cu * params.NUM_CUS


def test_refused_launches(race_manifest, gen):
    with pytest.raises(emu.LaunchError, match="jobs must be 1"):
        grid_flag(race_manifest, "grid_flag", 2, 0, gen, schedule="concurrent", jobs=2)
    with pytest.raises(emu.LaunchError, match="whole grid"):
        grid_flag(race_manifest, "grid_flag", 2, 0, gen, schedule="concurrent", workgroups=[(0, 0, 0)])
    with pytest.raises(emu.LaunchError, match="resident is only for"):
        grid_flag(race_manifest, "grid_flag", 1, 0, gen, resident=4)
    with pytest.raises(emu.LaunchError, match="takes no trace"):
        grid_flag(race_manifest, "grid_flag", 2, 0, gen, schedule="concurrent", trace=lambda inst, w: None)
    with pytest.raises(emu.LaunchError, match="resident must be"):
        grid_flag(race_manifest, "grid_flag", 2, 0, gen, schedule="concurrent", resident=0)


@pytest.mark.parametrize("form", ["buffer_wbl2", "buffer_wbl2 sc0", "buffer_inv"])
def test_cache_control_of_unsettled_scope_is_refused(form):
    with pytest.raises(emu.UnsupportedInstruction, match="scope is not settled"):
        run_snippet(f"  {form}\n  s_waitcnt vmcnt(0)")


@pytest.mark.parametrize("form", ["buffer_wbl2 sc1", "buffer_wbl2 sc0 sc1", "buffer_inv sc1", "buffer_inv sc0",
                                  "buffer_inv sc0 sc1"])
def test_cache_control_changes_no_register(form):
    values = torch.randint(0, 2 ** 31, (64,), generator=torch.Generator().manual_seed(3)).numpy()
    out = run_snippet(f"  {form}\n  s_waitcnt vmcnt(0)", vgprs={3: values}, outputs=["v3"])
    assert (out["v3"] == values).all()


# ---------------------------------------------------------------------- timing
def test_a_waiting_workgroup_is_timed_after_the_release(race_manifest, gen):
    groups, producer, per_group, latency = 4, 2, 3e-6, 1e-6
    _, res = grid_flag(race_manifest, "grid_flag", groups, producer, gen, schedule="concurrent")
    t = flagwait.launch_seconds(res.timeline, per_group, latency_s=latency)
    lines = res.timeline.groups
    assert t.end[producer] == pytest.approx(per_group) and t.waited[producer] == 0.0
    for g, line in lines.items():
        assert t.start[g] == 0.0
        if g == producer:
            continue
        wait = line.waits[0]
        release = per_group * wait.released_at / lines[producer].work     # the producer never waits
        reached = per_group * wait.at / line.work                           # when the consumer began to wait
        assert t.waited[g] == pytest.approx(release + latency - reached)
        assert t.end[g] == pytest.approx(release + latency + per_group * (line.work - wait.at) / line.work)
    assert t.seconds == pytest.approx(max(t.end.values()))
    assert t.seconds > per_group                   # the consumers' wait shows in the launch's time


def test_workgroups_that_take_a_freed_slot_start_at_its_end(race_manifest, gen):
    _, res = grid_flag(race_manifest, "grid_flag", 5, 0, gen, schedule="concurrent", resident=2)
    seconds = {g: 1e-6 * (g + 1) for g in range(5)}                # different per workgroup
    t = flagwait.launch_seconds(res.timeline, seconds, latency_s=0.0)
    for g, line in res.timeline.groups.items():
        if line.started_after is not None:
            assert t.start[g] == pytest.approx(t.end[line.started_after])
        assert t.end[g] >= t.start[g] + seconds[g] - 1e-15


def test_flag_timing_by_hand():
    """A producer releasing at 90 % of its work, a consumer waiting at 10 % of its own, and a
    third workgroup in the producer's slot; each workgroup 1 s alone."""
    tl = concurrent.Timeline(2, {
        0: concurrent.GroupTimeline(0, None, 100),
        1: concurrent.GroupTimeline(1, None, 100, 5, [concurrent.Wait(10, 0, 90)]),
        2: concurrent.GroupTimeline(2, 0, 50)})
    lat = 0.25
    t = flagwait.launch_seconds(tl, 1.0, latency_s=lat)
    assert t.end[0] == pytest.approx(1.0) and t.start[2] == pytest.approx(t.end[0])
    assert t.waited[1] == pytest.approx(0.9 + lat - 0.1)
    assert t.end[1] == pytest.approx(0.9 + lat + 0.9)
    assert t.seconds == pytest.approx(max(t.end[1], t.end[2]))
    with pytest.raises(ValueError, match="latency_s"):
        flagwait.launch_seconds(tl, 1.0, latency_s=-1.0)
