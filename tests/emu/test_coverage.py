"""gfxasm.emu.coverage: a code object is covered only when it decodes, every mnemonic has a
handler, and every handler's static field check passes — each of the three can fail it."""
from __future__ import annotations

from gfxasm.emu import registry
from gfxasm.emu.coverage import coverage, object_coverage

from kernel_source import assemble, kernel_source

MFMA_FP8 = "v_mfma_scale_f32_16x16x128_f8f6f4 v[0:3], v[4:11], v[12:19], v[0:3], v20, v21 op_sel_hi:[0,0,0]"
MFMA_FP6 = ("v_mfma_scale_f32_16x16x128_f8f6f4 v[0:3], v[4:9], v[12:17], v[0:3], v20, v21 "
            "op_sel_hi:[0,0,0] cbsz:2 blgp:2")


def code_object(tmp_path, name: str, body: str):
    path = tmp_path / f"{name}.co"
    path.write_bytes(assemble(kernel_source(name, body + "\n  s_endpgm")))
    return path


def test_implemented_kernel_is_covered(tmp_path):
    result = object_coverage(code_object(tmp_path, "fp8", f"  v_mov_b32 v1, 1.0\n  {MFMA_FP8}"))
    assert result.covered and not (result.missing or result.rejected or result.decode_error)


def test_unmodelled_operand_format_blocks_coverage(tmp_path):
    result = object_coverage(code_object(tmp_path, "fp6", f"  {MFMA_FP6}"))
    assert not result.covered
    assert "FP6/BF6" in result.rejected["v_mfma_scale_f32_16x16x128_f8f6f4"]


def test_missing_handler_blocks_coverage(tmp_path, monkeypatch):
    monkeypatch.delitem(registry.HANDLERS, "v_mov_b32")
    report = coverage([code_object(tmp_path, "mov", "  v_mov_b32 v1, 1.0"),
                       code_object(tmp_path, "nop", "  s_nop 0")])
    assert report.covered == 1
    assert report.blockers() == {"missing: v_mov_b32": 1}


def test_unreadable_object_is_reported_not_raised(tmp_path):
    junk = tmp_path / "junk.co"
    junk.write_bytes(b"not an ELF file")
    result = object_coverage(junk)
    assert not result.covered and "not an ELF file" in result.decode_error
