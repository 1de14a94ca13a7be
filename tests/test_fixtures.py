"""The fixture kernels end to end: manifest → build → gfxasm.launch → emulator (strict) →
compared with torch references (tests/fixtures/cases.py) on fresh random inputs, outputs
poisoned with NaN first, at sizes with ragged tails."""
import pytest
import torch

import gfxasm
import gfxasm.emu as emu
from gfxasm.build import build_manifest
from gfxasm.cli import RUN_CASES
from gfxasm.manifest import Manifest

from conftest import FIXTURES, write_manifest


def run(manifest, kernel, variant, gen, **sizes):
    chosen = manifest.kernel(kernel).variant(variant)
    case = RUN_CASES[kernel](chosen, gen, **sizes)
    result = gfxasm.launch(chosen.kernel, variant=chosen.name, **case.args)
    for name, expected in case.expected.items():
        torch.testing.assert_close(case.args[name], expected, atol=case.atol, rtol=case.rtol, equal_nan=True)
    return case, result


@pytest.mark.parametrize("variant", ["axpb", "axmb"])
@pytest.mark.parametrize("n", [1, 63, 255, 256, 257, 1000, 4099])
def test_axpb(fixture_manifest, gen, variant, n):
    case, result = run(fixture_manifest, "axpb", variant, gen, n=n)
    assert not case.args["out"].isnan().any()
    assert result.workgroups == -(-n // 256) and result.waves == 4 * result.workgroups


@pytest.mark.parametrize("n, slack", [(1, 5), (64, 1), (255, 300), (256, 64), (1000, 37), (1025, 2)])
def test_buffer_loads_out_of_range_read_zero_and_stores_are_dropped(fixture_manifest, gen, n, slack):
    case, _ = run(fixture_manifest, "buffer_diff", None, gen, n=n, slack=slack)
    out, a = case.args["out"], case.args["a"]
    assert torch.equal(out[n - 1], -a[n - 1])              # a[n] lies outside the range: it read 0
    assert out[n:].isnan().all()                           # the tail lanes' stores were dropped


@pytest.mark.parametrize("rows, cols", [(1, 1), (3, 255), (2, 256), (4, 1000), (1, 4097), (2, 0)])
def test_rowsum_reduces_four_waves_through_lds(fixture_manifest, gen, rows, cols):
    case, result = run(fixture_manifest, "rowsum", None, gen, rows=rows, cols=cols)
    assert result.workgroups == rows and result.waves == 4 * rows


def test_a_missing_wait_is_caught_in_strict_mode(tmp_path, gen, fixture_manifest):
    """gfxasm.launch runs the emulator strictly: axpb without its vmcnt wait reads a loading register."""
    source = (FIXTURES / "axpb.s").read_text()
    wait = "    s_waitcnt vmcnt(0)"
    assert source.count(wait) == 1
    (tmp_path / "axpb.s").write_text(source.replace(wait, "    s_nop 0"))
    spec = {"source": "axpb.s", "workgroup": [256], "grid": ["cdiv(n, 256)"],
            "args": [{"name": "a", "type": "*f32", "dir": "in", "shape": ["n"]},
                     {"name": "b", "type": "*f32", "dir": "in", "shape": ["n"]},
                     {"name": "out", "type": "*f32", "dir": "out", "shape": ["n"]},
                     {"name": "alpha", "type": "f32"}, {"name": "n", "type": "u32"}],
            "variants": {"axpb_no_wait": {"defines": {"SUBTRACT_B": 0}}}}
    broken = Manifest.load(write_manifest(tmp_path, {"axpb": spec}))
    build_manifest(broken)
    case = RUN_CASES["axpb"](broken.kernel("axpb").variant(), gen, n=300)
    with pytest.raises(emu.HazardError):
        gfxasm.launch(broken.kernel("axpb"), **case.args)


@pytest.mark.parametrize("n", [1, 257])
def test_a_carved_buffer_is_addressable_only_within_its_span(fixture_manifest, gen, n):
    # An op's scratch buffers are carved from one allocation (PreparedLaunch.spans): the
    # kernarg gets the allocation's address plus the span's offset, and the emulator can
    # address only the span's bytes, as it could only a buffer of the buffer's own
    from dataclasses import replace
    from gfxasm.launcher import prepare
    a, b = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    args = dict(a=a, b=b, out=torch.empty(n), alpha=0.5, n=n)
    launch = prepare(fixture_manifest.kernel("axpb").variant("axpb"), args)
    block = torch.full((1024 + 4 * n + 512,), 0x7F, dtype=torch.uint8)       # poison around the span
    replace(launch, spans=(None, None, (1024, 4 * n)))(a, b, block)
    torch.testing.assert_close(block[1024:1024 + 4 * n].view(torch.float32), a * 0.5 + b)
    assert (block[:1024] == 0x7F).all() and (block[1024 + 4 * n:] == 0x7F).all()
    with pytest.raises(emu.MemoryFault):                                       # the last store lands past the span
        replace(launch, spans=(None, None, (1024, 4 * n - 4)))(a, b, block)
