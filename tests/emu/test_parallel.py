"""A launch over several processes (Kernel.launch(jobs=N), GFXASM_EMU_JOBS for the ops) or
Ray tasks (engine="ray") gives the serial run's outputs, LSE and wave_instructions bit for
bit: an attention (MQA, ragged tails), the MoE layer (every kernel of it), and a kernel
whose workgroups meet in atomics (tests/fixtures/column_sum.s, races.yaml: a ticket taken with a
returning atomic, so the pieces' runs are refused and the batch re-run; f32 atomic adds
from every workgroup, applied again in serial order across batches). Fresh random inputs,
outputs poisoned. The Ray test starts a local cluster bound to 127.0.0.1 and stops it."""
from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

import gfxasm
import gfxasm.emu as emu
from gfxasm import build
from gfxasm.backends import emu as emu_backend
from gfxasm.build import build_manifest
from gfxasm.emu import kernel as emu_kernel
from gfxasm.emu import parallel
from gfxasm.manifest import default_manifest
from gfxasm.ops import fmha, moe_layer, mxfp8_moe_gemm
from gfxasm.ops import swiglu_quant as sq

from test_moe import layer_operands, routing   # the MoE tests' operand makers
from test_races import race_manifest  # noqa: F401  (the fixture)


@pytest.fixture
def launches(monkeypatch):
    """(kernel name, jobs, wave_instructions) of every emulator launch, in order."""
    seen = []
    real = emu.Kernel.launch

    def spy(self, *args, **kwargs):
        result = real(self, *args, **kwargs)
        seen.append((self.name, kwargs.get("jobs", 1), result.wave_instructions))
        return result
    monkeypatch.setattr(emu.Kernel, "launch", spy)
    return seen


def serial_and_parallel(run, launches, monkeypatch, jobs: int = 2):
    """run() once serially and once with GFXASM_EMU_JOBS=jobs; both runs' results, and the
    two launch lists with the jobs column dropped."""
    results = []
    for n in (1, jobs):
        monkeypatch.setenv("GFXASM_EMU_JOBS", str(n))
        launches.clear()
        results.append((run(), [(name, count) for name, _, count in launches]))
        assert {j for _, j, _ in launches} == {n}
    return results


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_attention_is_bit_identical(launches, monkeypatch):
    build_manifest(default_manifest())
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 130, 2, fmha.HEAD_DIM, generator=g).to(torch.bfloat16)      # tails in q and k
    k = torch.randn(1, 150, 1, fmha.HEAD_DIM, generator=g).to(torch.bfloat16)      # MQA
    v = torch.randn(1, 150, 1, fmha.HEAD_DIM, generator=g).to(torch.bfloat16)

    def run():
        out = torch.full_like(q, float("nan"))
        _, lse = gfxasm.fmha_fwd(q, k, v, causal=True, out=out, return_lse=True)
        return out, lse
    (serial, serial_launches), (par, par_launches) = serial_and_parallel(run, launches, monkeypatch)
    assert not serial[0].isnan().any()
    assert same_bits(serial[0], par[0]) and same_bits(serial[1], par[1])
    assert serial_launches == par_launches and len(serial_launches) == 1


def test_moe_layer_is_bit_identical(launches, monkeypatch):
    build.build_kernels(moe_layer.kernel_names() + [sq.OP])
    mxfp8_moe_gemm.build_kernels()
    T, top_k, E, H, I = 9, 4, 8, 64, 64
    gen = torch.Generator().manual_seed(11)
    x, xs, w1, w1s, w2, w2s = layer_operands(T, H, I, E, gen)
    ids = routing("random", T, top_k, E, gen)
    tw = torch.rand(T, top_k, generator=gen) + 0.1

    def run():
        out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
        moe_layer.mxfp8_moe(x, xs, w1, w1s, w2, w2s, tw, ids, block_m=16, out=out)
        return out
    (serial, serial_launches), (par, par_launches) = serial_and_parallel(run, launches, monkeypatch)
    assert serial.isfinite().all()
    assert same_bits(serial, par)
    assert serial_launches == par_launches and len(serial_launches) >= 3     # align, GEMMs, ...


@pytest.fixture
def merges(monkeypatch):
    """How the parent took the pieces: batches re-run, pieces merged, bytes whose atomics
    it applied again."""
    seen = {"rerun": 0, "merged": 0, "replayed": 0}
    rollback, write = parallel._rollback, parallel._write

    def counted_rollback(*args):
        seen["rerun"] += 1
        return rollback(*args)

    def counted_write(memory, result, replay):
        seen["merged"] += 1
        seen["replayed"] += sum(len(v) for v in replay.values())
        return write(memory, result, replay)
    monkeypatch.setattr(parallel, "_rollback", counted_rollback)
    monkeypatch.setattr(parallel, "_write", counted_write)
    return seen


TWO_BATCHES = emu_kernel.BATCH_WAVES + 9          # one-wave workgroups


@pytest.mark.parametrize("variant, groups, jobs, how", [
    # one batch cut in three: the pieces meet in the counter (and in out) -> the batch re-runs
    ("column_sum_ordered", 7, 3, dict(rerun=1, merged=0)),
    ("column_sum_atomic_add", 7, 3, dict(rerun=1, merged=0)),
    # two batches: the second draws a ticket the first's atomics changed -> it re-runs
    ("column_sum_ordered", TWO_BATCHES, 2, dict(rerun=1, merged=1)),
    # two batches adding into out: both merge, the second's adds applied again on the first's sums
    ("column_sum_atomic_add", TWO_BATCHES, 2, dict(rerun=0, merged=2)),
])
def test_atomics_across_workgroups_are_bit_identical(race_manifest, launches, merges, monkeypatch, variant, groups,
                                                     jobs, how):
    x = torch.randn(groups * 64, generator=torch.Generator().manual_seed(groups))

    def run():
        args = dict(x=x, partial=torch.full((groups * 64,), float("nan")), out=torch.zeros(64),
                    counter=torch.zeros(1, dtype=torch.uint32), groups=groups)
        gfxasm.launch(race_manifest.kernel("column_sum"), variant=variant, **args)
        return args
    (serial, serial_launches), (par, par_launches) = serial_and_parallel(run, launches, monkeypatch, jobs)
    for name in ("partial", "out", "counter"):
        assert same_bits(serial[name], par[name]), name
    assert not serial["out"].isnan().any()
    assert serial_launches == par_launches
    assert {k: merges[k] for k in how} == how
    assert (merges["replayed"] > 0) == (how["merged"] == 2)
    # the launch's stats (bench/emu_parallel.py): every workgroup in one piece, the re-runs counted
    stats = parallel.last_run
    assert sum(p[1] for p in stats.pieces) == groups and stats.reruns == how["rerun"]
    assert all(p[2] is not None and p[4] > 0 for p in stats.pieces) and stats.seconds >= stats.take_seconds > 0


def test_pieces_cover_every_workgroup_once_in_order():
    batches = [(0, [(i, 0, 0) for i in range(5)]), (5, [(i, 0, 0) for i in range(5, 7)])]
    pieces = parallel.plan(batches, 4, "lockstep")
    assert [g for p in pieces for g in p.groups] == [(i, 0, 0) for i in range(7)]
    assert [p.batch for p in pieces] == [0, 0, 1, 1] and all(p.groups for p in pieces)
    assert [p.start for p in pieces] == [0, 0, 5, 5]
    # other schedules depend on the batch: whole batches only
    assert [len(p.groups) for p in parallel.plan(batches, 4, "timed")] == [5, 2]
    # no piece smaller than min_groups (strict mode's compiled paths need fast.MIN_WAVES
    # waves), unless its batch is
    assert [len(p.groups) for p in parallel.plan(batches, 4, "lockstep", min_groups=2)] == [2, 3, 2]
    assert [len(p.groups) for p in parallel.plan(batches, 4, "lockstep", min_groups=3)] == [5, 2]


def test_no_piece_falls_below_the_compiled_paths(monkeypatch):
    """A strict launch cuts its batches no finer than fast.MIN_WAVES waves a piece (else the
    piece would run the numpy paths, several times slower); without numba, as fine as jobs asks."""
    from gfxasm.emu import fast
    seen = []
    real = parallel.plan
    monkeypatch.setattr(parallel, "plan", lambda *args: seen.append(args[3]) or real(*args))
    monkeypatch.setattr(parallel, "_in_processes", lambda kernel, run_, pieces, budget, jobs: iter(()))
    run_ = emu_kernel.Run(grid=(32, 1, 1), block=(256, 1, 1), waves_per_group=4, memory=None, seg=None,
                          kernarg_addr=0, packet_addr=0, strict=True, waived=frozenset(), trace=None,
                          schedule="lockstep", seed=None)
    batch = [(0, [(i, 0, 0) for i in range(32)])]              # 128 waves
    monkeypatch.setattr(fast, "MIN_WAVES", 64)
    parallel.run(None, run_, batch, None, 0, 8, "processes")
    assert seen == [16 if fast.kernels() is not None else 1]
    parallel.run(None, dataclasses.replace(run_, strict=False), batch, None, 0, 8, "processes")
    monkeypatch.setattr(fast, "MIN_WAVES", 256)                 # a batch too small for the compiled paths
    parallel.run(None, run_, batch, None, 0, 8, "processes")
    assert seen[1:] == [1, 1]


@pytest.mark.parametrize("jobs, engine, trace, match", [
    (-1, "processes", None, "jobs must be an int >= 0"),
    (2.0, "processes", None, "jobs must be an int >= 0"),
    (2, "threads", None, "engine must be one of"),
    (2, "processes", print, "trace is called in the launching process"),
    (1, "ray", print, "trace is called in the launching process"),
])
def test_bad_parallel_arguments_are_refused(jobs, engine, trace, match):
    with pytest.raises(emu.LaunchError, match=match):
        parallel.check_jobs(jobs, engine, trace)


def test_jobs_zero_means_every_core(monkeypatch):
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 6)
    assert parallel.check_jobs(0, "processes", None) == 6


def test_a_bad_jobs_variable_is_refused(monkeypatch):
    monkeypatch.setenv("GFXASM_EMU_JOBS", "many")
    with pytest.raises(ValueError, match="GFXASM_EMU_JOBS must be an integer"):
        emu_backend.jobs()


@pytest.fixture
def local_ray(monkeypatch):
    """A Ray cluster of this machine alone, its node on the loopback address; stopped after.
    Ray turns a node address of 127.0.0.1 into the machine's routable one unless clusters
    are off (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, read when ray is imported)."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install 'gfxasm[cluster]')")
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=2,
             log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def test_ray_tasks_are_bit_identical(race_manifest, launches, local_ray, monkeypatch):
    assert {node["NodeManagerAddress"] for node in local_ray.nodes()} == {"127.0.0.1"}
    groups = TWO_BATCHES
    x = torch.randn(groups * 64, generator=torch.Generator().manual_seed(3))

    def run():
        args = dict(x=x, partial=torch.full((groups * 64,), float("nan")), out=torch.zeros(64),
                    counter=torch.zeros(1, dtype=torch.uint32), groups=groups)
        gfxasm.launch(race_manifest.kernel("column_sum"), variant="column_sum_atomic_add", **args)
        return args
    monkeypatch.setenv("GFXASM_EMU_JOBS", "1")
    serial = run()
    serial_launches = list(launches)
    launches.clear()
    real = emu.Kernel.launch          # the spy: every launch now goes to the cluster
    monkeypatch.setattr(emu.Kernel, "launch", lambda self, *a, **kw: real(self, *a, **{**kw, "engine": "ray"}))
    on_ray = run()
    assert same_bits(serial["out"], on_ray["out"]) and not serial["out"].isnan().any()
    assert [c for _, _, c in serial_launches] == [c for _, _, c in launches]
