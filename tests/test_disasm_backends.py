"""The emulator's two disassembly sources (gfxasm.disasm) print the same lines.

llvm-c (rocm-llvm-python's LLVM-C disassembler, in process) against llvm-objdump: on a
hand-assembled object holding what llvm-objdump treats specially (labels at branch targets,
two labels at one address, branches to no label or to a function symbol, an undecodable dword,
a zero run, an instruction cut by a symbol), on the fixture kernels and on one corpus object
per corpus family; `-m full` compares every gfx950 corpus object and every built kernel.
The llvm-c tests need rocm-llvm-python (`pip install '.[llvm]'`) and skip without it.
"""
import sys

import pytest

from gfxasm import corpus, disasm
from gfxasm.disasm import llvm_c
from gfxasm.build import build_manifest
from gfxasm.emu import decode
from gfxasm.manifest import default_manifest
from gfxasm.toolchain import ToolchainError, find_tool
from tests.kernel_source import assemble

HAVE_LLVM_C = disasm.llvm_c_installed()
needs_llvm_c = pytest.mark.skipif(not HAVE_LLVM_C, reason="rocm-llvm-python is not installed (pip install '.[llvm]')")

AWKWARD = """
.amdgcn_target "amdgcn-amd-amdhsa--gfx950"
.text
.globl k
.p2align 8
.type k,@function
k:
L_top:
L_same:
  s_cbranch_scc1 L_top
  s_branch L_fwd
  s_call_b64 s[0:1], L_fwd
  s_cbranch_i_fork s[0:1], L_top
  s_cbranch_execz 1
  s_branch k2
  v_add_f32 v1, 0x3fb8aa3b, v2
  .long 0xffffffff
  .long 0, 0, 0
L_fwd:
  .long 0
  s_cbranch_vccnz L_top
  .long 0xd3b00000
L_cut:
  s_endpgm
.size k, .-k
.p2align 8
.type k2,@function
k2:
  s_endpgm
.size k2, .-k2
"""


def lines_of_both(code: bytes) -> tuple[list, list]:
    return disasm.disassemble(code, disasm.LLVM_C), disasm.disassemble(code, disasm.OBJDUMP)


@needs_llvm_c
def test_the_awkward_cases_print_the_same_and_as_llvm_objdump_treats_them():
    code = assemble(AWKWARD)
    in_process, objdump = lines_of_both(code)
    assert in_process == objdump
    by_text = {line.text: line for line in objdump}
    # A label names a branch target; of two at one address the first in sorted order (L_same).
    assert {"s_cbranch_scc1 L_same", "s_branch L_fwd", "s_call_b64 s[0:1], L_fwd",
            "s_cbranch_i_fork s[0:1], L_same"} <= by_text.keys()
    # A target with no symbol, or only a function's, stays a number (llvm-objdump appends
    # "<k+0x18>" / "<k2>" to such lines, which the parser must take too).
    execz = by_text["s_cbranch_execz 1"]
    assert any(line.pc == execz.pc + 8 for line in objdump)
    [to_k2] = [line for line in objdump if line.text.startswith("s_branch ") and line.text.split()[1].isdigit()]
    assert to_k2.pc + 4 + 4 * int(to_k2.text.split()[1]) == objdump[-1].pc and objdump[-1].text == "s_endpgm"
    # An undecodable dword prints as data; the 12 zero bytes after it are skipped, the 4 at
    # L_fwd (fewer than 8) decode as one instruction.
    invalid = by_text[".long 0xffffffff"]
    assert invalid.words == (0xFFFFFFFF,)
    [after] = [line for line in objdump if invalid.pc < line.pc <= invalid.pc + 16]
    assert after.pc == invalid.pc + 16 and after.words == (0,)
    # A 64-bit instruction begun before L_cut reads past it; decoding restarts at L_cut too.
    [cut] = [line for line in objdump if line.words[0] == 0xD3B00000]
    assert len(cut.words) == 2 and any(line.pc == cut.pc + 4 and line.text == "s_endpgm" for line in objdump)


@needs_llvm_c
def test_the_decoded_instructions_are_identical(monkeypatch, fixture_manifest):
    code = fixture_manifest.kernel("axpb").variant("axpb").co_path.read_bytes()
    decoded = {}
    for source in (disasm.LLVM_C, disasm.OBJDUMP):
        monkeypatch.setenv(disasm.SOURCE_ENV, source)
        decode._decode_cached.cache_clear()
        decoded[source] = decode.decode(code)
    decode._decode_cached.cache_clear()
    assert decoded[disasm.LLVM_C] == decoded[disasm.OBJDUMP] and len(decoded[disasm.OBJDUMP]) > 10


@needs_llvm_c
def test_fixture_kernels_print_the_same(fixture_manifest):
    for variant in fixture_manifest.variants():
        in_process, objdump = lines_of_both(variant.co_path.read_bytes())
        assert in_process == objdump, variant.co_path


def one_object_per_family() -> list:
    root = corpus.root() / corpus.GFX950_DIR
    first: dict[str, object] = {}
    for path in sorted(root.rglob("*.co")):
        first.setdefault(path.relative_to(root).parts[0] if path.parent != root else "", path)
    return list(first.values())


@needs_llvm_c
def test_one_corpus_object_per_family_prints_the_same():
    objects = one_object_per_family()
    assert len(objects) >= 8
    for path in objects:
        in_process, objdump = lines_of_both(path.read_bytes())
        assert in_process == objdump, path


@pytest.mark.full
@needs_llvm_c
def test_every_corpus_object_and_built_kernel_prints_the_same():
    manifest = default_manifest()
    build_manifest(manifest)
    paths = sorted((corpus.root() / corpus.GFX950_DIR).rglob("*.co")) + [v.co_path for v in manifest.variants()]
    differing = []
    for path in paths:
        in_process, objdump = lines_of_both(path.read_bytes())
        if in_process != objdump:
            differing.append(path)
    assert differing == [], differing


def test_the_source_is_chosen_by_the_environment_then_by_what_is_installed(monkeypatch, tmp_path):
    monkeypatch.setenv(disasm.SOURCE_ENV, "objdump")
    with pytest.raises(disasm.DisassemblyError, match="GFXASM_DISASSEMBLER='objdump': the disassemblers are "
                                                      "'llvm-c' .* and 'llvm-objdump'"):
        disasm.disassemble(b"")
    monkeypatch.setenv(disasm.SOURCE_ENV, disasm.OBJDUMP)
    assert disasm.source_name() == disasm.OBJDUMP
    monkeypatch.delenv(disasm.SOURCE_ENV)
    assert disasm.source_name() == (disasm.OBJDUMP if disasm.objdump_found() or not HAVE_LLVM_C else disasm.LLVM_C)
    monkeypatch.setenv("LLVM_BIN", str(tmp_path))                       # no llvm-objdump there
    find_tool.cache_clear()
    try:
        assert disasm.source_name() == (disasm.LLVM_C if HAVE_LLVM_C else disasm.OBJDUMP)
    finally:
        find_tool.cache_clear()


def test_llvm_c_named_without_rocm_llvm_python_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "rocm.llvm", None)        # as if rocm-llvm-python were not installed
    llvm_c._disassembler.cache_clear()
    try:
        with pytest.raises(disasm.DisassemblyError, match=r"^the in-process disassembler needs rocm-llvm-python "
                                                          r"\(`pip install 'gfxasm\[llvm\]'`\)"):
            disasm.disassemble(b"", disasm.LLVM_C)
    finally:
        llvm_c._disassembler.cache_clear()              # set up afresh by the next use


def test_llvm_objdump_missing_names_both_ways_to_get_a_disassembler(monkeypatch, tmp_path):
    monkeypatch.setenv("LLVM_BIN", str(tmp_path))                # holds no llvm-objdump
    find_tool.cache_clear()
    try:
        with pytest.raises(ToolchainError, match=rf"llvm-objdump not found in LLVM_BIN={tmp_path}; or `pip install "
                                                 rf"'gfxasm\[llvm\]'` to disassemble in process"):
            disasm.disassemble(b"", disasm.OBJDUMP)
    finally:
        find_tool.cache_clear()
