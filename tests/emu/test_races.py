"""Cross-workgroup races on global memory in strict mode (gfxasm.emu.races), on the fixture
kernel column_sum (tests/fixtures/column_sum.s, manifest tests/fixtures/races.yaml): workgroups store column blocks, and one
sums them, ordered by a returning atomic (no race) or by nothing (a read race); or they
all store to one block (a store race); or they add into one output atomically (no race).
Fresh random inputs, outputs poisoned, float64 / in-order f32 references; grids of one
batch and of two (kernel.BATCH_WAVES waves: 512 one-wave workgroups), serial and over two
processes (jobs=2), which must report the same."""
from __future__ import annotations

import re

import pytest
import torch

import gfxasm
import gfxasm.emu as emu
from gfxasm.build import build_manifest
from gfxasm.emu import kernel as emu_kernel
from gfxasm.manifest import Manifest

from conftest import FIXTURES

ONE_BATCH = 5
TWO_BATCHES = emu_kernel.BATCH_WAVES + 3          # one wave per workgroup


@pytest.fixture(scope="session")
def race_manifest() -> Manifest:
    """tests/fixtures/races.yaml, built (incrementally) into build/fixtures."""
    manifest = Manifest.load(FIXTURES / "races.yaml")
    build_manifest(manifest)
    return manifest


def column_sum(manifest, variant: str, groups: int, gen: torch.Generator, jobs: int, monkeypatch):
    monkeypatch.setenv("GFXASM_EMU_JOBS", str(jobs))
    args = dict(x=torch.randn(groups * 64, generator=gen), partial=torch.full((groups * 64,), float("nan")),
                out=torch.zeros(64) if variant == "column_sum_atomic_add" else torch.full((64,), float("nan")),
                counter=torch.zeros(1, dtype=torch.uint32), groups=groups)
    gfxasm.launch(manifest.kernel("column_sum"), variant=variant, **args)
    return args


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("groups", [1, ONE_BATCH, TWO_BATCHES])
def test_stores_ordered_by_a_returning_atomic_are_no_race(race_manifest, gen, monkeypatch, groups, jobs):
    args = column_sum(race_manifest, "column_sum_ordered", groups, gen, jobs, monkeypatch)
    x2 = 2 * args["x"]
    assert torch.equal(args["partial"], x2)                         # doubling is exact in f32
    assert int(args["counter"][0]) == groups                        # every workgroup took one ticket
    reference = x2.double().view(groups, 64).sum(0)
    torch.testing.assert_close(args["out"].double(), reference, rtol=groups * 2.0 ** -24, atol=1e-6)


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("groups", [ONE_BATCH, TWO_BATCHES])
def test_atomic_adds_from_every_workgroup_are_no_race(race_manifest, gen, monkeypatch, groups, jobs):
    args = column_sum(race_manifest, "column_sum_atomic_add", groups, gen, jobs, monkeypatch)
    # the adds land in workgroup order (lockstep: lanes in wave order; batches in order)
    expected = torch.zeros(64)
    for block in (2 * args["x"]).view(groups, 64):
        expected = expected + block                                 # f32, one add at a time
    assert torch.equal(args["out"], expected)
    assert args["partial"].isnan().all()                            # this variant stores no blocks


RACE = re.compile(r"cross-workgroup race on global memory: (byte \d+) of buffers\[1\] is (stored to|read) by "
                  r"workgroup \((\d+),0,0\) at pc (0x[0-9a-f]+) and (stored to|read) by workgroup \((\d+),0,0\) "
                  r"at pc (0x[0-9a-f]+), and no atomic orders the two")


def race_report(manifest, variant, groups, gen, jobs, monkeypatch) -> str:
    with pytest.raises(emu.HazardError) as info:
        column_sum(manifest, variant, groups, gen, jobs, monkeypatch)
    return str(info.value)


@pytest.mark.parametrize("groups", [2, TWO_BATCHES])
def test_two_workgroups_storing_to_the_same_bytes_race(race_manifest, monkeypatch, groups):
    reports = {jobs: race_report(race_manifest, "column_sum_store_race", groups, torch.Generator().manual_seed(1),
                                 jobs, monkeypatch) for jobs in (1, 2)}
    assert reports[1] == reports[2]                                 # serial and parallel report the same
    found = RACE.search(reports[1])
    assert found, reports[1]
    _, verb0, g0, pc0, verb1, g1, pc1 = found.groups()
    assert (verb0, verb1) == ("stored to", "stored to") and g0 != g1 and pc0 == pc1


@pytest.mark.parametrize("groups", [2, TWO_BATCHES])
def test_reading_what_another_workgroup_stored_without_an_atomic_races(race_manifest, monkeypatch, groups):
    reports = {jobs: race_report(race_manifest, "column_sum_read_race", groups, torch.Generator().manual_seed(2),
                                 jobs, monkeypatch) for jobs in (1, 2)}
    assert reports[1] == reports[2]
    found = RACE.search(reports[1])
    assert found, reports[1]
    byte, verb0, g0, pc0, verb1, g1, pc1 = found.groups()
    # workgroup 0 sums: its load of block 1 meets workgroup 1's store
    assert (verb0, g0, verb1, g1) == ("stored to", "1", "read", "0") and byte == "byte 256" and pc0 != pc1
