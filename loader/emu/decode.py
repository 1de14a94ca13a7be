"""Decode a gfx950 kernel from the code object's bytes.

LLVM's disassembler is the decoder: it reads the bytes of `.text` and prints each
instruction with its address and raw dwords (gfxasm.disasm obtains those lines, in process
through rocm-llvm-python or from `llvm-objdump -d --mcpu=gfx950`; both print the same).
This module parses that text into `Inst` records — mnemonic, encoding, operands and
modifiers — once per code object. Fields the printed form leaves ambiguous (waitcnt
counters, branch offsets) are taken from the raw dwords instead.
"""
from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass, field
from functools import lru_cache

from ..disasm import DisassemblyError, disassemble
from .errors import DecodeError

# SGPR-file indices of the named scalar registers on gfx9 (wave64).
SPECIAL_SGPRS = {
    "flat_scratch": (102, 2), "flat_scratch_lo": (102, 1), "flat_scratch_hi": (103, 1),
    "xnack_mask": (104, 2), "xnack_mask_lo": (104, 1), "xnack_mask_hi": (105, 1),
    "vcc": (106, 2), "vcc_lo": (106, 1), "vcc_hi": (107, 1),
    "m0": (124, 1),
    "exec": (126, 2), "exec_lo": (126, 1), "exec_hi": (127, 1),
}
SGPR_FILE = 128

# Inline float constants as the disassembler prints them.
INLINE_FLOATS = {"0.5", "-0.5", "1.0", "-1.0", "2.0", "-2.0", "4.0", "-4.0", "0.15915494"}

ENCODING_SUFFIXES = ("_e32", "_e64", "_dpp", "_sdwa")

_REG = re.compile(r"^(?P<kind>[sva])(?:(?P<one>\d+)|\[(?P<lo>\d+):(?P<hi>\d+)\])$")
_TTMP = re.compile(r"^ttmp(?:(?P<one>\d+)|\[(?P<lo>\d+):(?P<hi>\d+)\])$")
_MOD = re.compile(r"^(?P<key>[a-z_0-9]+)(?::(?P<val>.*))?$")
_LIST = re.compile(r"^\[([-\d, ]+)\]$")


@dataclass(frozen=True)
class Operand:
    """One source or destination operand as printed.

    kind: 's' (SGPR file, incl. vcc/exec/m0), 'v', 'a', 'imm' (an integer or inline
    float constant; `text` keeps the printed form), 'scc' (src_scc), 'off', 'label',
    'gpr_idx' (s_set_gpr_idx_on's mode list; handlers read the bits from the raw word).
    """
    kind: str
    index: int = 0
    count: int = 1
    neg: bool = False
    abs: bool = False
    text: str = ""

    @property
    def is_reg(self) -> bool:
        return self.kind in ("s", "v", "a")

    def regs(self) -> range:
        return range(self.index, self.index + self.count)


@dataclass
class Inst:
    pc: int
    size: int
    name: str            # mnemonic without the encoding suffix, e.g. 'v_add_f32'
    enc: str             # '', 'e32', 'e64', 'dpp' or 'sdwa'
    ops: tuple[Operand, ...]
    mods: dict[str, object]
    words: tuple[int, ...]
    text: str
    handler: object = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        return self.text


@dataclass
class Program:
    insts: list[Inst]
    by_pc: dict[int, int]    # pc -> index into insts
    entry: int

    def at(self, pc: int) -> Inst:
        try:
            return self.insts[self.by_pc[pc]]
        except KeyError:
            raise DecodeError(f"pc {pc:#x} is not the start of a decoded instruction") from None


def _parse_int(text: str) -> int:
    return int(text, 0)


def _parse_operand(text: str) -> Operand:
    neg = absolute = False
    t = text
    if t.startswith("-") and not re.match(r"^-\d", t):
        neg, t = True, t[1:]
    if t.startswith("|") and t.endswith("|"):
        absolute, t = True, t[1:-1]
    if t.startswith("neg(") and t.endswith(")"):
        neg, t = True, t[4:-1]
    if t.startswith("abs(") and t.endswith(")"):
        absolute, t = True, t[4:-1]
    m = _REG.match(t)
    if m:
        lo = int(m["one"] if m["one"] is not None else m["lo"])
        hi = lo if m["one"] is not None else int(m["hi"])
        return Operand(m["kind"], lo, hi - lo + 1, neg, absolute, text)
    if t in SPECIAL_SGPRS:
        index, count = SPECIAL_SGPRS[t]
        return Operand("s", index, count, neg, absolute, text)
    m = _TTMP.match(t)
    if m:
        lo = int(m["one"] if m["one"] is not None else m["lo"])
        hi = lo if m["one"] is not None else int(m["hi"])
        return Operand("s", 108 + lo, hi - lo + 1, neg, absolute, text)
    if t.startswith("gpr_idx(") and t.endswith(")"):   # s_set_gpr_idx_on's mode field
        return Operand("gpr_idx", text=t)
    if t == "src_scc":
        return Operand("scc", text=text, neg=neg, abs=absolute)
    if t == "off":
        return Operand("off", text=text)
    if t in INLINE_FLOATS or re.match(r"^-?(0x[0-9a-fA-F]+|\d+)$", t):
        return Operand("imm", neg=neg, abs=absolute, text=t)
    if re.match(r"^[A-Za-z_.$][\w.$+]*$", t):
        return Operand("label", text=t)
    raise DecodeError(f"cannot parse operand {text!r}")


def _split_operands(rest: str) -> tuple[list[str], list[str]]:
    """Split '<ops> <mods>' into operand texts and modifier texts.

    Operands are comma-separated and come first; modifiers are space-separated words
    after the last operand (e.g. 'offen', 'offset:16', 'op_sel:[0,1]').
    """
    tokens: list[str] = []
    depth = 0
    cur = ""
    for ch in rest:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == " " and depth == 0:
            if cur:
                tokens.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        tokens.append(cur)
    ops: list[str] = []
    mods: list[str] = []
    expecting_operand = True
    for tok in tokens:
        if expecting_operand and not mods:
            # The last operand has no trailing comma; modifiers follow it.
            if tok.endswith(","):
                ops.append(tok[:-1])
                continue
            if _looks_like_modifier(tok):
                mods.append(tok)
                expecting_operand = False
                continue
            ops.append(tok)
            expecting_operand = False
        else:
            mods.append(tok)
    return ops, mods


_BARE_MODIFIERS = {"offen", "idxen", "lds", "glc", "slc", "nt", "sc0", "sc1", "nv", "clamp",
                   "gds", "tfe", "lwe", "addr64"}


def _looks_like_modifier(tok: str) -> bool:
    return tok in _BARE_MODIFIERS or (":" in tok and not tok.startswith(("s[", "v[", "a[", "ttmp[")))


def _parse_modifier(tok: str, mods: dict[str, object]) -> None:
    if tok in _BARE_MODIFIERS:
        mods[tok] = True
        return
    m = _MOD.match(tok)
    if not m:
        raise DecodeError(f"cannot parse modifier {tok!r}")
    key, val = m["key"], m["val"]
    if val is None:
        mods[key] = True
    elif _LIST.match(val):
        mods[key] = tuple(int(x) for x in _LIST.match(val)[1].split(","))
    elif re.match(r"^-?(0x[0-9a-fA-F]+|\d+)$", val):
        mods[key] = _parse_int(val)
    else:
        mods[key] = val     # e.g. dst_sel:WORD_1, offset:swizzle(...)


def _split_encoding(mnemonic: str) -> tuple[str, str]:
    for suffix in ENCODING_SUFFIXES:
        if mnemonic.endswith(suffix):
            return mnemonic[: -len(suffix)], suffix[1:]
    return mnemonic, ""


def parse_line(asm: str, pc: int, words: tuple[int, ...]) -> Inst:
    mnemonic, _, rest = asm.strip().partition(" ")
    name, enc = _split_encoding(mnemonic)
    if name == "s_waitcnt":     # counters come from simm16, whatever the printed form
        return Inst(pc, 4 * len(words), name, enc, (), {}, words, asm.strip())
    op_texts, mod_texts = _split_operands(rest.strip())
    ops = tuple(_parse_operand(t) for t in op_texts)
    mods: dict[str, object] = {}
    for tok in mod_texts:
        _parse_modifier(tok, mods)
    return Inst(pc, 4 * len(words), name, enc, ops, mods, words, asm.strip())


@lru_cache(maxsize=64)
def _decode_cached(digest: str, code: bytes) -> tuple[Inst, ...]:
    try:
        lines = disassemble(code)
    except DisassemblyError as exc:
        raise DecodeError(str(exc)) from None
    return tuple(parse_line(line.text, line.pc, line.words) for line in lines)


def decode(code: bytes) -> list[Inst]:
    """All instructions of a code object's .text, decoded once per distinct object."""
    return list(_decode_cached(hashlib.sha256(code).hexdigest(), code))


def branch_target(inst: Inst) -> int:
    """SOPP branches: target = pc + 4 + simm16 * 4 (from the raw dword)."""
    (simm16,) = struct.unpack("<h", struct.pack("<H", inst.words[0] & 0xFFFF))
    return inst.pc + 4 + 4 * simm16


def waitcnt_fields(inst: Inst) -> tuple[int, int, int]:
    """(vmcnt, expcnt, lgkmcnt) of s_waitcnt's simm16 (gfx9 layout)."""
    s = inst.words[0] & 0xFFFF
    vmcnt = (s & 0xF) | ((s >> 14) & 0x3) << 4
    return vmcnt, (s >> 4) & 0x7, (s >> 8) & 0xF
