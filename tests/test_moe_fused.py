"""The concurrent-schedule hook (issue 25 item 2's groundwork): a kernels.yaml kernel that
declares `schedule: concurrent` (its workgroups wait on each other through global memory) is
launched by the op path (manifest -> launcher.PreparedLaunch -> backends.emu) under the
emulator's concurrent schedule; every other kernel keeps the serial one. Checked end to end
on the grid_flag fixture (tests/fixtures/grid_flag.s): declared concurrent, its consumers see
the producer's release; declared serial (the default), the same launch is reported as a
deadlock, not run to a wrong answer."""
from __future__ import annotations

import pytest
import torch

import gfxasm
from gfxasm.emu.concurrent import DeadlockError
from gfxasm.manifest import Manifest, ManifestError

from conftest import FIXTURES
from emu.test_races import race_manifest  # noqa: F401  (tests/fixtures/races.yaml, built)

GROUPS, PRODUCER = 5, 3


def grid_flag_manifest(tmp_path, race_manifest, schedule: str | None) -> Manifest:
    """A manifest holding grid_flag (MODE 0) with `schedule` (None: the field left out),
    built objects taken from the race fixtures' build directory."""
    line = "" if schedule is None else f"    schedule: {schedule}\n"
    path = tmp_path / "flag.yaml"
    path.write_text(
        f"build_dir: {race_manifest.build_dir}\n"
        "kernels:\n"
        "  grid_flag:\n"
        f"    source: {FIXTURES / 'grid_flag.s'}\n"
        "    workgroup: [64]\n"
        "    grid: [groups]\n"
        f"{line}"
        "    args:\n"
        "      - {name: x, type: '*f32', dir: in, rank: 1}\n"
        "      - {name: data, type: '*f32', dir: inout, rank: 1}\n"
        "      - {name: out, type: '*f32', dir: out, rank: 1}\n"
        "      - {name: flag, type: '*u32', dir: inout, rank: 1}\n"
        "      - {name: producer, type: u32}\n"
        "      - {name: groups, type: u32}\n"
        "    variants:\n"
        "      grid_flag: {defines: {MODE: 0}}\n")
    return Manifest.load(path)


def flag_args(gen: torch.Generator) -> dict:
    return dict(x=torch.randn(GROUPS * 64, generator=gen), data=torch.full((64,), float("nan")),
                out=torch.full((GROUPS * 64,), float("nan")), flag=torch.zeros(1, dtype=torch.uint32),
                producer=PRODUCER, groups=GROUPS)


def test_a_kernel_declared_concurrent_runs_under_the_concurrent_schedule(tmp_path, race_manifest, gen):
    kernel = grid_flag_manifest(tmp_path, race_manifest, "concurrent").kernel("grid_flag")
    assert kernel.schedule == "concurrent"
    args = flag_args(gen)
    result = gfxasm.launch(kernel, **args)
    x = args["x"].view(GROUPS, -1)
    assert torch.equal(args["data"], 2 * x[PRODUCER])
    assert torch.equal(args["out"].view(GROUPS, -1), 2 * x[PRODUCER] + x)
    assert result.timeline is not None                  # the concurrent schedule's record of the waits


def test_a_kernel_declared_serial_keeps_the_serial_schedule(tmp_path, race_manifest, gen):
    kernel = grid_flag_manifest(tmp_path, race_manifest, None).kernel("grid_flag")
    assert kernel.schedule == "serial"
    with pytest.raises(DeadlockError, match="concurrent"):
        gfxasm.launch(kernel, **flag_args(gen))


def test_an_unknown_schedule_is_refused_by_name(tmp_path, race_manifest):
    with pytest.raises(ManifestError, match="schedule.*serial, concurrent"):
        grid_flag_manifest(tmp_path, race_manifest, "eager")
