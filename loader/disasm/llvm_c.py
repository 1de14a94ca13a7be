"""In-process gfx950 disassembly through LLVM-C, from AMD's rocm-llvm-python wheel (the
LLVM library is bundled in it; no ROCm, no apt package), printing for the same bytes the
lines `llvm-objdump -d --mcpu=gfx950` prints.

LLVMDisasmInstruction decodes and prints one instruction with the same AMDGPU decoder and
printer llvm-objdump uses. What llvm-objdump does around them is done here too (read from
llvm-objdump's behaviour, checked against llvm-objdump-22 on every gfx950 corpus object by
tests/test_disasm_backends.py):

- every executable section is walked from its start, and decoding restarts at each symbol's
  address; an instruction that starts before a symbol may read past it (both are printed);
- a run of 8 or more zero bytes at an instruction boundary, up to the next symbol, is
  skipped in whole dwords (llvm-objdump prints "..." for it, not instructions);
- bytes that do not decode print as ".long 0x<8 hex digits>" and are stepped over by a dword;
- a branch's target operand is the name of the STT_NOTYPE symbol at the target address in
  that section (the first name in sorted order when several sit there: llvm-objdump-22 does
  so), else the printed number. LLVM-C's AMDGPU symbolizer takes its symbol list as a C++
  vector only llvm-objdump can build, so the name is put in here.

Only rocm-llvm-python's 7.2 line is accepted: its printed forms are the ones compared.
"""
from __future__ import annotations

import ctypes
import functools
import io
import struct
import threading

from elftools.elf.constants import SH_FLAGS
from elftools.elf.elffile import ELFFile

from .lines import MCPU, DisassemblyError, Line

TRIPLE = "amdgcn-amd-amdhsa"
TESTED_RELEASE = (7, 2)         # rocm-llvm-python (ROCm LLVM) release whose output is compared
ZERO_RUN = 8                    # llvm-objdump skips zero runs this long or longer
TEXT_LIMIT = 1024               # bytes for one printed instruction
# Instructions with a SOPP branch-target operand (their simm16, printed last): what LLVM 22
# assembles and llvm-objdump-22 prints with a label for gfx950 (tried with llvm-mc).
BRANCHES = frozenset({"s_branch", "s_cbranch_scc0", "s_cbranch_scc1", "s_cbranch_vccz", "s_cbranch_vccnz",
                      "s_cbranch_execz", "s_cbranch_execnz", "s_cbranch_cdbgsys", "s_cbranch_cdbguser",
                      "s_cbranch_cdbgsys_or_user", "s_cbranch_cdbgsys_and_user", "s_call_b64",
                      "s_cbranch_i_fork"})

_lock = threading.Lock()        # one LLVM disassembler context, used by one thread at a time


@functools.cache
def _disassembler():
    """rocm-llvm-python's LLVM-C disassembler for gfx950 and a buffer for its text."""
    try:
        import rocm.llvm
        from rocm.llvm.c import disassembler, target
    except ImportError as exc:
        raise DisassemblyError(f"the in-process disassembler needs rocm-llvm-python (`pip install "
                               f"'gfxasm[llvm]'`): {exc}") from None
    release = tuple(rocm.llvm.ROCM_VERSION_TUPLE[:2])
    if release != TESTED_RELEASE:
        raise DisassemblyError(f"rocm-llvm-python {rocm.llvm.ROCM_VERSION_NAME} is installed; gfxasm's decodes are "
                               f"checked with its {'.'.join(map(str, TESTED_RELEASE))} line only (`pip install "
                               f"'gfxasm[llvm]'`), or set GFXASM_DISASSEMBLER=llvm-objdump")
    for initialize in (target.LLVMInitializeAllTargetInfos, target.LLVMInitializeAllTargetMCs,
                       target.LLVMInitializeAllDisassemblers):
        initialize()
    context = disassembler.LLVMCreateDisasmCPU(TRIPLE.encode(), MCPU.encode(), None, 0, None, None)
    if context is None:
        raise DisassemblyError(f"rocm-llvm-python's LLVM has no {MCPU} disassembler for {TRIPLE}")
    return disassembler.LLVMDisasmInstruction, context, ctypes.create_string_buffer(TEXT_LIMIT)


def disassemble(code: bytes) -> list[Line]:
    """The lines of every executable section, in section and address order."""
    instruction = _disassembler()
    elf = ELFFile(io.BytesIO(code))
    lines: list[Line] = []
    with _lock:
        for index, section in enumerate(elf.iter_sections()):
            if section["sh_flags"] & SH_FLAGS.SHF_EXECINSTR and section["sh_type"] != "SHT_NOBITS":
                lines += _section_lines(instruction, section.data(), section["sh_addr"], _symbols_in(elf, index))
    return lines


def _symbols_in(elf: ELFFile, index: int) -> dict[int, list[tuple[str, str]]]:
    """address -> (type, name) of the symbols of section `index`, from .symtab and .dynsym."""
    found: dict[int, list[tuple[str, str]]] = {}
    for table in (elf.get_section_by_name(".symtab"), elf.get_section_by_name(".dynsym")):
        for symbol in table.iter_symbols() if table is not None else ():
            kind = symbol["st_info"]["type"]
            if symbol["st_shndx"] == index and symbol.name and kind not in ("STT_SECTION", "STT_FILE"):
                found.setdefault(symbol["st_value"], []).append((kind, symbol.name))
    return found


def _section_lines(instruction, data: bytes, base: int, symbols: dict[int, list[tuple[str, str]]]) -> list[Line]:
    disasm_instruction, context, text = instruction
    buffer = ctypes.create_string_buffer(data, len(data))
    address = ctypes.addressof(buffer)
    starts = sorted({0, *(a - base for a in symbols if base <= a < base + len(data))})
    labels = {a: min(name for kind, name in entries if kind == "STT_NOTYPE")
              for a, entries in symbols.items() if any(kind == "STT_NOTYPE" for kind, _ in entries)}
    lines = []
    for start, end in zip(starts, [*starts[1:], len(data)]):
        at = start
        while at < end:
            if data[at:at + ZERO_RUN] == bytes(ZERO_RUN) and at + ZERO_RUN <= end:
                rest = data[at:end]
                at += (len(rest) - len(rest.lstrip(b"\0"))) & ~3
                continue
            if len(data) - at < 4:
                raise DisassemblyError(f"{len(data) - at} bytes at {base + at:#x} are less than one instruction dword")
            size = disasm_instruction(context, address + at, len(data) - at, base + at, text, TEXT_LIMIT)
            if size == 0:
                word = struct.unpack_from("<I", data, at)[0]
                lines.append(Line(f".long {word:#010x}", base + at, (word,)))
                at += 4
                continue
            words = struct.unpack_from(f"<{size // 4}I", data, at)
            lines.append(Line(_with_label(text.value.decode().strip(), base + at, words, labels), base + at, words))
            at += size
    return lines


def _with_label(printed: str, pc: int, words: tuple[int, ...], labels: dict[int, str]) -> str:
    if printed.split(" ", 1)[0] not in BRANCHES:
        return printed
    offset = words[0] & 0xFFFF
    target = pc + 4 + 4 * struct.unpack("<h", struct.pack("<H", offset))[0]
    if target not in labels:
        return printed
    if not printed.endswith(f" {offset}"):
        raise DisassemblyError(f"{printed!r} at {pc:#x}: expected its branch offset {offset} printed last")
    return f"{printed[:-len(str(offset))]}{labels[target]}"
