"""Read any gfx950 code object (.co): kernel symbols, kernel descriptors, metadata.

The 64-byte kernel descriptor layout follows LLVM's AMDHSAKernelDescriptor.h (see
../shared/docs/gfx950-isa-facts.md §1). The metadata note is msgpack (NT_AMDGPU_METADATA).
Third-party objects are accepted: the metadata version pair is not checked, and a
descriptor kernarg_size of 0 falls back to the metadata's .kernarg_segment_size.
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
from elftools.elf.elffile import ELFFile

EM_AMDGPU = 224
EF_AMDGPU_MACH = 0xFF
EF_AMDGPU_MACH_GFX950 = 0x4F
NT_AMDGPU_METADATA = 32
KD_SIZE = 64


class CodeObjectError(ValueError):
    pass


def _bits(value: int, lo: int, width: int) -> int:
    return (value >> lo) & ((1 << width) - 1)


@dataclass(frozen=True)
class KernelDescriptor:
    group_segment_fixed_size: int
    private_segment_fixed_size: int
    kernarg_size: int
    entry_offset: int          # kernel_code_entry_byte_offset, relative to the descriptor
    rsrc3: int
    rsrc1: int
    rsrc2: int
    properties: int
    kernarg_preload: int

    @classmethod
    def unpack(cls, raw: bytes) -> "KernelDescriptor":
        if len(raw) != KD_SIZE:
            raise CodeObjectError(f"kernel descriptor is {len(raw)} bytes, expected {KD_SIZE}")
        gs, ps, ka = struct.unpack_from("<III", raw, 0)
        (entry,) = struct.unpack_from("<q", raw, 16)
        rsrc3, rsrc1, rsrc2 = struct.unpack_from("<III", raw, 44)
        props, preload = struct.unpack_from("<HH", raw, 56)
        return cls(gs, ps, ka, entry, rsrc3, rsrc1, rsrc2, props, preload)

    # compute_pgm_rsrc1
    @property
    def granulated_vgprs(self) -> int:
        return _bits(self.rsrc1, 0, 6)

    @property
    def float_round_mode_32(self) -> int:
        return _bits(self.rsrc1, 12, 2)

    @property
    def float_round_mode_16_64(self) -> int:
        return _bits(self.rsrc1, 14, 2)

    @property
    def float_denorm_mode_32(self) -> int:
        """0 flushes f32 denormals on input and output; 3 keeps them."""
        return _bits(self.rsrc1, 16, 2)

    @property
    def float_denorm_mode_16_64(self) -> int:
        return _bits(self.rsrc1, 18, 2)

    @property
    def dx10_clamp(self) -> bool:
        return bool(_bits(self.rsrc1, 21, 1))

    @property
    def ieee_mode(self) -> bool:
        return bool(_bits(self.rsrc1, 23, 1))

    @property
    def fp16_overflow(self) -> bool:
        """MODE.FP16_OVFL at launch: f32->fp8/bf8 conversions saturate instead of NaN/Inf."""
        return bool(_bits(self.rsrc1, 26, 1))

    # compute_pgm_rsrc2
    @property
    def private_segment_enabled(self) -> bool:
        return bool(_bits(self.rsrc2, 0, 1))

    @property
    def user_sgpr_count(self) -> int:
        return _bits(self.rsrc2, 1, 5)

    @property
    def workgroup_id_enabled(self) -> tuple[bool, bool, bool]:
        return tuple(bool(_bits(self.rsrc2, 7 + i, 1)) for i in range(3))

    @property
    def workgroup_info_enabled(self) -> bool:
        return bool(_bits(self.rsrc2, 10, 1))

    @property
    def workitem_id_dims(self) -> int:
        """How many work-item id dimensions the launch provides in v0 (1..3)."""
        return _bits(self.rsrc2, 11, 2) + 1

    # compute_pgm_rsrc3 (gfx90a+)
    @property
    def accum_offset(self) -> int:
        return (_bits(self.rsrc3, 0, 6) + 1) * 4

    @property
    def tg_split(self) -> bool:
        return bool(_bits(self.rsrc3, 16, 1))

    # kernel_code_properties: which user SGPRs are set up, in hardware order
    USER_SGPRS = (("private_segment_buffer", 4), ("dispatch_ptr", 2), ("queue_ptr", 2),
                  ("kernarg_segment_ptr", 2), ("dispatch_id", 2), ("flat_scratch_init", 2),
                  ("private_segment_size", 1))

    def user_sgpr_enabled(self, name: str) -> bool:
        for bit, (known, _) in enumerate(self.USER_SGPRS):
            if known == name:
                return bool(_bits(self.properties, bit, 1))
        raise KeyError(name)

    @property
    def wavefront_size32(self) -> bool:
        return bool(_bits(self.properties, 10, 1))


@dataclass
class KernelInfo:
    name: str
    descriptor: KernelDescriptor
    entry: int                 # virtual address of the first instruction
    metadata: dict = field(default_factory=dict)   # this kernel's amdhsa.kernels entry

    @property
    def kernarg_size(self) -> int:
        return self.descriptor.kernarg_size or int(self.metadata.get(".kernarg_segment_size", 0))

    @property
    def lds_bytes(self) -> int:
        return self.descriptor.group_segment_fixed_size

    @property
    def max_workgroup_size(self) -> int | None:
        value = self.metadata.get(".max_flat_workgroup_size")
        return int(value) if value is not None else None


@dataclass
class CodeObject:
    data: bytes
    kernels: dict[str, KernelInfo]
    metadata: dict
    text_addr: int
    text: bytes
    source: str = "<bytes>"

    def kernel(self, name: str | None = None) -> KernelInfo:
        if name is None:
            if len(self.kernels) != 1:
                raise CodeObjectError(f"{self.source} holds {len(self.kernels)} kernels "
                                      f"({', '.join(self.kernels)}): name one")
            return next(iter(self.kernels.values()))
        try:
            return self.kernels[name]
        except KeyError:
            raise CodeObjectError(f"{self.source} has no kernel {name!r}; it has: "
                                  f"{', '.join(self.kernels) or 'none'}") from None


def _read_metadata(elf: ELFFile) -> dict:
    for section in elf.iter_sections():
        if section["sh_type"] != "SHT_NOTE":
            continue
        for note in section.iter_notes():
            if note["n_name"] == "AMDGPU" and note["n_type"] == NT_AMDGPU_METADATA:
                desc = note["n_desc"]
                raw = desc if isinstance(desc, bytes) else desc.encode("latin-1")
                return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    return {}


def _bytes_at(elf: ELFFile, addr: int, size: int) -> bytes:
    for section in elf.iter_sections():
        start = section["sh_addr"]
        if section["sh_type"] != "SHT_NOBITS" and start <= addr and addr + size <= start + section["sh_size"]:
            return section.data()[addr - start: addr - start + size]
    raise CodeObjectError(f"address {addr:#x} (+{size}) is in no loaded section")


def load_code_object(src: str | Path | bytes) -> CodeObject:
    """Parse a gfx950 code object from a path or its bytes."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        data, source = bytes(src), "<bytes>"
    else:
        path = Path(src)
        if not path.is_file():
            raise CodeObjectError(f"code object {path} does not exist")
        data, source = path.read_bytes(), str(path)
    try:
        elf = ELFFile(io.BytesIO(data))
    except Exception as exc:  # pyelftools raises several types for junk input
        raise CodeObjectError(f"{source} is not an ELF file: {exc}") from None
    if elf["e_machine"] != "EM_AMDGPU" and elf["e_machine"] != EM_AMDGPU:
        raise CodeObjectError(f"{source} is not an AMDGPU code object (e_machine {elf['e_machine']})")
    mach = elf["e_flags"] & EF_AMDGPU_MACH
    if mach != EF_AMDGPU_MACH_GFX950:
        raise CodeObjectError(f"{source} targets EF_AMDGPU_MACH {mach:#x}, not gfx950 ({EF_AMDGPU_MACH_GFX950:#x})")

    metadata = _read_metadata(elf)
    meta_by_symbol = {k.get(".symbol"): k for k in metadata.get("amdhsa.kernels", [])}
    text = elf.get_section_by_name(".text")
    if text is None:
        raise CodeObjectError(f"{source} has no .text section")

    kernels: dict[str, KernelInfo] = {}
    symtab = elf.get_section_by_name(".symtab") or elf.get_section_by_name(".dynsym")
    for sym in symtab.iter_symbols() if symtab else ():
        if not sym.name.endswith(".kd") or sym["st_info"]["type"] != "STT_OBJECT":
            continue
        kd_addr = sym["st_value"]
        kd = KernelDescriptor.unpack(_bytes_at(elf, kd_addr, KD_SIZE))
        name = sym.name[:-3]
        kernels[name] = KernelInfo(name, kd, kd_addr + kd.entry_offset, meta_by_symbol.get(sym.name, {}))
    if not kernels:
        raise CodeObjectError(f"{source} defines no kernel descriptor (<name>.kd) symbols")
    return CodeObject(data, kernels, metadata, text["sh_addr"], text.data(), source)
