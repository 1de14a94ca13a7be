"""Known-answer tests for the DS family (loader/emu/families/ds.py).

Every expected value is computed here in numpy/Python from the ISA definition (LDS as a
byte array, little-endian registers, the fact sheet's settled ds_read_b64_tr formulas, the
documented ds_bpermute/ds_permute/ds_swizzle lane rules) — never from the emulator's
output. Inputs are fresh seeded random values.
"""
import numpy as np
import pytest

from asm_harness import run_snippet
from gfxasm.emu.errors import HazardError, MemoryFault, UnsupportedInstruction

LDS = 4096
LANES = np.arange(64)


def rng(seed):
    return np.random.default_rng(seed)


def rand_u32(r, n=64):
    return r.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)


# -------------------------------------------------------------- LDS fill / dump
# v[2:17] hold 64 random bytes per lane; four ds_write_b128 put lane l's 16-byte chunk k
# at k*1024 + l*16, so the LDS image is known without trusting any DS read.
FILL = """
  v_lshlrev_b32 v1, 4, v0
  ds_write_b128 v1, v[2:5]
  ds_write_b128 v1, v[6:9] offset:1024
  ds_write_b128 v1, v[10:13] offset:2048
  ds_write_b128 v1, v[14:17] offset:3072
  s_waitcnt lgkmcnt(0)
"""
DUMP = """
  s_waitcnt lgkmcnt(0)
  v_lshlrev_b32 v1, 4, v0
  ds_read_b128 v[200:203], v1
  ds_read_b128 v[204:207], v1 offset:1024
  ds_read_b128 v[208:211], v1 offset:2048
  ds_read_b128 v[212:215], v1 offset:3072
  s_waitcnt lgkmcnt(0)
"""
DUMP_REGS = [f"v{200 + i}" for i in range(16)]


def fill_inputs(r):
    regs = {2 + i: rand_u32(r) for i in range(16)}
    image = np.zeros(LDS, np.uint8)
    for k in range(4):
        chunk = np.stack([regs[2 + 4 * k + d] for d in range(4)], axis=1)   # [64 lanes, 4 dwords]
        image[k * 1024:(k + 1) * 1024] = chunk.astype("<u4").view(np.uint8).reshape(-1)
    return regs, image


def image_from_dump(out):
    image = np.zeros(LDS, np.uint8)
    for k in range(4):
        chunk = np.stack([out[f"v{200 + 4 * k + d}"] for d in range(4)], axis=1)
        image[k * 1024:(k + 1) * 1024] = chunk.astype("<u4").view(np.uint8).reshape(-1)
    return image


def word(image, addr, nbytes):
    return int.from_bytes(bytes(image[addr:addr + nbytes]), "little")


def run(body, vgprs, outputs, **kw):
    kw.setdefault("lds_bytes", LDS)
    return run_snippet(body, vgprs=vgprs, outputs=outputs, **kw)


# ------------------------------------------------------------------- reads
READS = [("ds_read_u8", 1, False), ("ds_read_i8", 1, True), ("ds_read_u16", 2, False),
         ("ds_read_i16", 2, True), ("ds_read_b32", 4, False), ("ds_read_b64", 8, False),
         ("ds_read_b96", 12, False), ("ds_read_b128", 16, False)]


def test_read_every_width():
    """All widths in one kernel: read k lands in v[30+4k..]."""
    r = rng(100)
    regs, image = fill_inputs(r)
    body, outs, plan = FILL, [], []
    for k, (name, nbytes, signed) in enumerate(READS):
        align = 16 if nbytes >= 12 else nbytes
        offset = int(r.integers(0, 64)) * align
        addr = (r.integers(0, (LDS - offset - 16) // align, 64) * align).astype(np.uint32)
        regs[20 + k] = addr
        count = max(1, nbytes // 4)
        base = 30 + 4 * k
        dst = f"v{base}" if count == 1 else f"v[{base}:{base + count - 1}]"
        body += f"  {name} {dst}, v{20 + k} offset:{offset}\n"
        outs += [f"v{base + i}" for i in range(count)]
        plan.append((name, nbytes, signed, addr, offset, base, count))
    out = run(body + "  s_waitcnt lgkmcnt(0)\n", regs, outs)
    for name, nbytes, signed, addr, offset, base, count in plan:
        for lane in range(64):
            a = int(addr[lane]) + offset
            if nbytes < 4:
                v = word(image, a, nbytes)
                if signed and v >> (8 * nbytes - 1):
                    v -= 1 << (8 * nbytes)
                assert int(out[f"v{base}"][lane]) == v & 0xFFFFFFFF, (name, lane)
            else:
                for d in range(count):
                    assert int(out[f"v{base + d}"][lane]) == word(image, a + 4 * d, 4), (name, lane, d)


# ------------------------------------------------------------------ writes
WRITES = [("ds_write_b8", 1), ("ds_write_b16", 2), ("ds_write_b32", 4), ("ds_write_b64", 8),
          ("ds_write_b96", 12), ("ds_write_b128", 16)]


def test_write_every_width():
    """All widths in one kernel, in program order (later writes win where they overlap)."""
    r = rng(200)
    regs, image = fill_inputs(r)
    data = {30 + i: rand_u32(r) for i in range(4)}
    regs.update(data)
    expect = image.copy()
    body = FILL
    for k, (name, nbytes) in enumerate(WRITES):
        align = 16 if nbytes >= 12 else nbytes
        offset = int(r.integers(0, 16)) * align
        slots = r.permutation((LDS - offset) // 16)[:64]           # distinct 16-byte slots per write
        addr = (slots * 16 + (r.integers(0, 16 // align, 64) * align if align < 16 else 0)).astype(np.uint32)
        regs[20 + k] = addr
        count = max(1, nbytes // 4)
        src = "v30" if count == 1 else f"v[30:{29 + count}]"
        body += f"  {name} v{20 + k}, {src} offset:{offset}\n"
        for lane in range(64):
            raw = b"".join(int(data[30 + d][lane]).to_bytes(4, "little") for d in range(4))
            a = int(addr[lane]) + offset
            expect[a:a + nbytes] = np.frombuffer(raw[:nbytes], np.uint8)
    out = run(body + DUMP, regs, DUMP_REGS)
    np.testing.assert_array_equal(image_from_dump(out), expect)


def test_write_respects_exec():
    r = rng(300)
    regs, image = fill_inputs(r)
    regs[30] = rand_u32(r)
    mask = int(r.integers(0, 2**64, dtype=np.uint64))
    body = FILL + "  s_mov_b64 exec, s[10:11]\n  v_lshlrev_b32 v20, 2, v0\n  ds_write_b32 v20, v30\n" \
        "  s_mov_b64 exec, -1\n" + DUMP
    out = run_snippet(body, vgprs=regs, sgprs={10: mask & 0xFFFFFFFF, 11: mask >> 32}, outputs=DUMP_REGS,
                      lds_bytes=LDS)
    expect = image.copy()
    for lane in range(64):
        if (mask >> lane) & 1:
            expect[4 * lane:4 * lane + 4] = np.frombuffer(int(regs[30][lane]).to_bytes(4, "little"), np.uint8)
    np.testing.assert_array_equal(image_from_dump(out), expect)


# ----------------------------------------------------------- read2 / write2
@pytest.mark.parametrize("name,size,st64", [("ds_read2_b32", 4, False), ("ds_read2_b64", 8, False),
                                            ("ds_read2st64_b32", 4, True), ("ds_read2st64_b64", 8, True)])
def test_read2(name, size, st64):
    r = rng(400 + size + st64)
    regs, image = fill_inputs(r)
    scale = size * (64 if st64 else 1)
    o0, o1 = (int(x) for x in r.integers(0, 4 if st64 else 64, 2))
    top = LDS - scale * max(o0, o1) - size
    addr = (r.integers(0, top // size, 64) * size).astype(np.uint32)
    regs[20] = addr
    k = size // 4
    body = FILL + f"  {name} v[30:{29 + 2 * k}], v20 offset0:{o0} offset1:{o1}\n  s_waitcnt lgkmcnt(0)\n"
    out = run(body, regs, [f"v{30 + i}" for i in range(2 * k)])
    for lane in range(64):
        for half, o in enumerate((o0, o1)):
            a = int(addr[lane]) + scale * o
            for d in range(k):
                assert int(out[f"v{30 + half * k + d}"][lane]) == word(image, a + 4 * d, 4), (lane, half, d)


@pytest.mark.parametrize("name,size,st64", [("ds_write2_b32", 4, False), ("ds_write2_b64", 8, False),
                                            ("ds_write2st64_b32", 4, True), ("ds_write2st64_b64", 8, True)])
def test_write2(name, size, st64):
    r = rng(500 + size + st64)
    regs, image = fill_inputs(r)
    scale = size * (64 if st64 else 1)
    base = int(r.integers(0, 8)) * 16
    if st64:   # lane l writes elements l and l + 64 (offset1:1 = 64 elements further)
        addr, o0, o1 = (base + LANES * size).astype(np.uint32), 0, 1
    else:      # lane l writes elements 2l + 3 and 2l + 4 (offset0:3 offset1:4)
        addr, o0, o1 = (base + LANES * 2 * size).astype(np.uint32), 3, 4
    regs[20] = addr
    k = size // 4
    d0 = {30 + i: rand_u32(r) for i in range(k)}
    d1 = {40 + i: rand_u32(r) for i in range(k)}
    regs.update(d0)
    regs.update(d1)
    s0 = "v30" if k == 1 else "v[30:31]"
    s1 = "v40" if k == 1 else "v[40:41]"
    out = run(FILL + f"  {name} v20, {s0}, {s1} offset0:{o0} offset1:{o1}\n" + DUMP, regs, DUMP_REGS)
    expect = image.copy()
    for lane in range(64):
        for o, dd, first in ((o0, d0, 30), (o1, d1, 40)):
            a = int(addr[lane]) + scale * o
            raw = b"".join(int(dd[first + i][lane]).to_bytes(4, "little") for i in range(k))
            expect[a:a + size] = np.frombuffer(raw, np.uint8)
    if not st64:   # pairs of neighbouring lanes overlap (2l+4 == 2(l+1)+2 ... no: 2l+4 vs 2(l+1)+3)
        pass
    np.testing.assert_array_equal(image_from_dump(out), expect)


def test_read2st64_offset1_at_maximum():
    """offset1:255 with st64 reaches 255*64*4 = 0xff00 bytes past the base address."""
    r = rng(600)
    vals = rand_u32(r)
    body = ("  v_lshlrev_b32 v1, 2, v0\n  v_add_u32 v2, 0xff00, v1\n  ds_write_b32 v2, v3\n"
            "  s_waitcnt lgkmcnt(0)\n  ds_read2st64_b32 v[4:5], v1 offset0:0 offset1:255\n"
            "  s_waitcnt lgkmcnt(0)\n")
    out = run_snippet(body, vgprs={3: vals}, outputs=["v5"], lds_bytes=0xff00 + 256)
    np.testing.assert_array_equal(out["v5"], vals)


# --------------------------------------------------------------- transposes
def tr_expected(image, addr, esize):
    """The fact sheet's settled formula, lane by lane in plain Python."""
    per = 8 // esize
    inp = [[word(image, int(addr[l]) + esize * e, esize) for e in range(per)] for l in range(64)]
    out = []
    for l in range(64):
        b, n = divmod(l, 16)
        if esize == 2:
            elems = [inp[16 * b + 4 * j + n // 4][n % 4] for j in range(4)]
        else:
            elems = [inp[16 * b + 2 * j + n // 8][n % 8] for j in range(8)]
        value = sum(e << (8 * esize * j) for j, e in enumerate(elems))
        out.append((value & 0xFFFFFFFF, value >> 32))
    return out


@pytest.mark.parametrize("name,esize", [("ds_read_b64_tr_b16", 2), ("ds_read_b64_tr_b8", 1)])
@pytest.mark.parametrize("seed", [1, 2])
def test_read_tr_formula(name, esize, seed):
    r = rng(700 + 10 * esize + seed)
    regs, image = fill_inputs(r)
    offset = int(r.integers(0, 32)) * 8
    addr = (r.integers(0, (LDS - offset) // 8, 64) * 8).astype(np.uint32)
    regs[20] = addr
    out = run(FILL + f"  {name} v[30:31], v20 offset:{offset}\n  s_waitcnt lgkmcnt(0)\n", regs, ["v30", "v31"])
    expect = tr_expected(image, addr + offset, esize)
    for lane in range(64):
        assert (int(out["v30"][lane]), int(out["v31"][lane])) == expect[lane], lane


def test_read_tr_b16_tile_is_transposed():
    """Lanes 4k..4k+3 of a block point at row k of a 4x16 bf16 tile stored row-major; lane n
    must end up with column n (the fact sheet's reading of the formula)."""
    r = rng(710)
    regs, image = fill_inputs(r)
    tile_base = 512
    addr = np.array([tile_base + 128 * (l // 16) + 8 * (l % 16) for l in range(64)], np.uint32)
    regs[20] = addr
    out = run(FILL + "  ds_read_b64_tr_b16 v[30:31], v20\n  s_waitcnt lgkmcnt(0)\n", regs, ["v30", "v31"])
    for l in range(64):
        b, n = divmod(l, 16)
        base = tile_base + 128 * b                     # 4 rows x 16 halves = 128 bytes
        col = [word(image, base + 32 * k + 2 * n, 2) for k in range(4)]
        got = int(out["v30"][l]) | (int(out["v31"][l]) << 32)
        assert got == sum(c << (16 * k) for k, c in enumerate(col)), l


def test_read_tr_misaligned_is_a_fault():
    regs = {20: (LANES * 8 + 4).astype(np.uint32)}
    with pytest.raises(MemoryFault, match="8-byte aligned"):
        run("  ds_read_b64_tr_b16 v[30:31], v20\n  s_waitcnt lgkmcnt(0)\n", regs, [])


def test_read_tr_partial_block_rejected_full_block_inactive_ok():
    r = rng(720)
    regs, image = fill_inputs(r)
    addr = (r.integers(0, LDS // 8, 64) * 8).astype(np.uint32)
    regs[20] = addr
    regs[30], regs[31] = rand_u32(r), rand_u32(r)
    body = FILL + "  s_mov_b64 exec, s[10:11]\n  ds_read_b64_tr_b8 v[30:31], v20\n  s_mov_b64 exec, -1\n" \
        "  s_waitcnt lgkmcnt(0)\n"

    def sg(m):
        return {10: m & 0xFFFFFFFF, 11: m >> 32}
    with pytest.raises(UnsupportedInstruction, match="16-lane block"):
        run(body, regs, ["v30"], sgprs=sg((1 << 64) - 1 - (1 << 20)))
    mask = 0xFFFF_0000_FFFF_FFFF            # block 2 (lanes 32-47) fully inactive
    out = run(body, regs, ["v30", "v31"], sgprs=sg(mask))
    expect = tr_expected(image, addr, 1)
    for lane in range(64):
        if 32 <= lane < 48:
            assert (out["v30"][lane], out["v31"][lane]) == (regs[30][lane], regs[31][lane])
        else:
            assert (int(out["v30"][lane]), int(out["v31"][lane])) == expect[lane]


# ------------------------------------------------------------ lane permutes
@pytest.mark.parametrize("offset", [0, 4, 200])
def test_bpermute(offset):
    r = rng(800 + offset)
    addr, data, old = rand_u32(r), rand_u32(r), rand_u32(r)
    mask = int(r.integers(0, 2**64, dtype=np.uint64))
    out = run_snippet(f"  ds_bpermute_b32 v3, v1, v2 offset:{offset}\n  s_waitcnt lgkmcnt(0)\n",
                      vgprs={1: addr, 2: data, 3: old}, outputs=["v3"], exec_mask=mask)
    for lane in range(64):
        src = ((int(addr[lane]) + offset) // 4) % 64
        if (mask >> lane) & 1:
            want = int(data[src]) if (mask >> src) & 1 else 0
        else:
            want = int(old[lane])
        assert int(out["v3"][lane]) == want, lane


def test_bpermute_full_exec_is_a_gather():
    r = rng(810)
    perm = r.permutation(64)
    data = rand_u32(r)
    out = run_snippet("  ds_bpermute_b32 v3, v1, v2\n  s_waitcnt lgkmcnt(0)\n",
                      vgprs={1: (perm * 4 + (r.integers(0, 2**20, 64) << 8)).astype(np.uint32), 2: data, 3: data},
                      outputs=["v3"])
    np.testing.assert_array_equal(out["v3"], data[perm])


def test_permute_forward_highest_lane_wins():
    r = rng(820)
    addr = (r.integers(0, 16, 64) * 4).astype(np.uint32)       # collisions onto lanes 0..15
    data, old = rand_u32(r), rand_u32(r)
    mask = int(r.integers(0, 2**64, dtype=np.uint64)) | 1
    out = run_snippet("  ds_permute_b32 v3, v1, v2 offset:8\n  s_waitcnt lgkmcnt(0)\n",
                      vgprs={1: addr, 2: data, 3: old}, outputs=["v3"], exec_mask=mask)
    tmp = [0] * 64
    for lane in range(64):                     # ISA pseudocode: in lane order, later lanes overwrite
        if (mask >> lane) & 1:
            tmp[((int(addr[lane]) + 8) // 4) % 64] = int(data[lane])
    for lane in range(64):
        want = tmp[lane] if (mask >> lane) & 1 else int(old[lane])
        assert int(out["v3"][lane]) == want, lane


def _bitmask_src(lane, pattern):
    """LLVM BITMASK_PERM string: 5 chars for lane-id bits 4..0: 0, 1, p(reserve), i(nvert)."""
    out = lane & 32
    for k, ch in enumerate(pattern):
        bit = 4 - k
        b = (lane >> bit) & 1
        out |= {"0": 0, "1": 1, "p": b, "i": 1 - b}[ch] << bit
    return out


SWIZZLES = [
    ("swizzle(QUAD_PERM,1,0,3,2)", lambda l: (l & ~3) | [1, 0, 3, 2][l & 3]),
    ("swizzle(QUAD_PERM,3,3,0,2)", lambda l: (l & ~3) | [3, 3, 0, 2][l & 3]),
    ('swizzle(BITMASK_PERM,"01pip")', lambda l: _bitmask_src(l, "01pip")),
    ('swizzle(BITMASK_PERM,"ii1p0")', lambda l: _bitmask_src(l, "ii1p0")),
    ("swizzle(SWAP,16)", lambda l: l ^ 16),
    ("swizzle(SWAP,2)", lambda l: l ^ 2),
    ("swizzle(REVERSE,8)", lambda l: (l & ~7) | (7 - (l & 7))),
    ("swizzle(REVERSE,32)", lambda l: (l & 32) | (31 - (l & 31))),
    ("swizzle(BROADCAST,8,3)", lambda l: (l & ~7) | 3),
    ("swizzle(BROADCAST,32,17)", lambda l: (l & 32) | 17),
]


@pytest.mark.parametrize("pattern,src", SWIZZLES, ids=[p for p, _ in SWIZZLES])
def test_swizzle(pattern, src):
    r = rng(hash(pattern) % 1000)
    data, old = rand_u32(r), rand_u32(r)
    mask = int(r.integers(0, 2**64, dtype=np.uint64))
    out = run_snippet(f"  ds_swizzle_b32 v3, v2 offset:{pattern}\n  s_waitcnt lgkmcnt(0)\n",
                      vgprs={2: data, 3: old}, outputs=["v3"], exec_mask=mask)
    for lane in range(64):
        s = src(lane)
        if (mask >> lane) & 1:
            want = int(data[s]) if (mask >> s) & 1 else 0
        else:
            want = int(old[lane])
        assert int(out["v3"][lane]) == want, lane


@pytest.mark.parametrize("pattern", ["swizzle(FFT,5)", "swizzle(ROTATE,0,5)"])
def test_swizzle_rotate_and_fft_rejected(pattern):
    with pytest.raises(UnsupportedInstruction, match="swizzle"):
        run_snippet(f"  ds_swizzle_b32 v3, v2 offset:{pattern}\n  s_waitcnt lgkmcnt(0)\n",
                    vgprs={2: np.arange(64, dtype=np.uint32)}, outputs=[])


def test_permute_results_wait_for_lgkmcnt():
    with pytest.raises(HazardError, match="in flight"):
        run_snippet("  ds_bpermute_b32 v3, v1, v2\n  v_mov_b32 v4, v3\n  s_waitcnt lgkmcnt(0)\n",
                    vgprs={1: np.zeros(64, np.uint32), 2: np.arange(64, dtype=np.uint32)}, outputs=[])


# ------------------------------------------------------------------ atomics
def _atomic_ref(op, m, d):
    M = 0xFFFFFFFF
    s = lambda x: x - (1 << 32) if x >> 31 else x    # noqa: E731
    return {"add_u32": (m + d) & M, "sub_u32": (m - d) & M, "rsub_u32": (d - m) & M,
            "inc_u32": 0 if m >= d else m + 1, "dec_u32": d if (m == 0 or m > d) else m - 1,
            "min_i32": d if s(d) < s(m) else m, "max_i32": d if s(d) > s(m) else m,
            "min_u32": min(m, d), "max_u32": max(m, d), "and_b32": m & d, "or_b32": m | d,
            "xor_b32": m ^ d}[op]


ATOMIC_OPS = ["add_u32", "sub_u32", "rsub_u32", "inc_u32", "dec_u32", "min_i32", "max_i32",
              "min_u32", "max_u32", "and_b32", "or_b32", "xor_b32"]


def test_atomic_rtn_in_lane_order():
    """Every op in one kernel, each on its own six LDS words (many lanes collide), under one
    random EXEC mask; returns and final memory follow (lane order) sequential application."""
    r = rng(900)
    regs, image = fill_inputs(r)
    data, small = rand_u32(r), r.integers(0, 5, 64).astype(np.uint32)
    mask = int(r.integers(0, 2**64, dtype=np.uint64))
    addr = (r.integers(0, 6, 64) * 4).astype(np.uint32)
    regs.update({20: addr, 21: data, 23: small})
    # inc/dec regions start from small values (written by lanes 0..5 before the atomics)
    seeds = r.integers(0, 4, 64).astype(np.uint32)
    regs[24] = seeds
    base = {op: 256 + 64 * k for k, op in enumerate(ATOMIC_OPS)}
    body = FILL + "  v_lshlrev_b32 v25, 2, v0\n  v_cmp_gt_u32 vcc, 6, v0\n  s_and_saveexec_b64 s[12:13], vcc\n"
    for op in ("inc_u32", "dec_u32"):
        body += f"  ds_write_b32 v25, v24 offset:{base[op]}\n"
    body += "  s_mov_b64 exec, s[12:13]\n  s_waitcnt lgkmcnt(0)\n  s_mov_b64 exec, s[10:11]\n"
    for k, op in enumerate(ATOMIC_OPS):
        kind, ty = op.split("_")
        src = "v23" if op in ("inc_u32", "dec_u32") else "v21"
        regs[40 + k] = rand_u32(r)
        body += f"  ds_{kind}_rtn_{ty} v{40 + k}, v20, {src} offset:{base[op]}\n"
    body += "  s_mov_b64 exec, -1\n" + DUMP
    out = run_snippet(body, vgprs=regs, sgprs={10: mask & 0xFFFFFFFF, 11: mask >> 32},
                      outputs=DUMP_REGS + [f"v{40 + k}" for k in range(len(ATOMIC_OPS))], lds_bytes=LDS)
    mem = image.copy()
    for op in ("inc_u32", "dec_u32"):
        for lane in range(6):
            a = base[op] + 4 * lane
            mem[a:a + 4] = np.frombuffer(int(seeds[lane]).to_bytes(4, "little"), np.uint8)
    for k, op in enumerate(ATOMIC_OPS):
        d = small if op in ("inc_u32", "dec_u32") else data
        for lane in range(64):
            a = int(addr[lane]) + base[op]
            if (mask >> lane) & 1:
                m = word(mem, a, 4)
                assert int(out[f"v{40 + k}"][lane]) == m, (op, lane)
                mem[a:a + 4] = np.frombuffer(_atomic_ref(op, m, int(d[lane])).to_bytes(4, "little"), np.uint8)
            else:
                assert out[f"v{40 + k}"][lane] == regs[40 + k][lane], (op, lane)
    np.testing.assert_array_equal(image_from_dump(out), mem)


def test_atomic_add_no_return_and_offset():
    r = rng(950)
    regs, image = fill_inputs(r)
    addr = (r.integers(0, 4, 64) * 4).astype(np.uint32)
    data = rand_u32(r)
    regs.update({20: addr, 21: data})
    out = run(FILL + "  ds_add_u32 v20, v21 offset:256\n" + DUMP, regs, DUMP_REGS)
    mem = image.copy()
    for lane in range(64):
        a = int(addr[lane]) + 256
        mem[a:a + 4] = np.frombuffer(((word(mem, a, 4) + int(data[lane])) & 0xFFFFFFFF).to_bytes(4, "little"),
                                     np.uint8)
    np.testing.assert_array_equal(image_from_dump(out), mem)


def test_atomic_add_f32_rounds_in_lane_order():
    r = rng(960)
    init = r.standard_normal(4).astype(np.float32)
    vals = (r.standard_normal(64) * 10.0 ** r.integers(-3, 4, 64)).astype(np.float32)
    addr = (r.integers(0, 4, 64) * 4).astype(np.uint32)
    init_lanes = np.tile(init, 16).view(np.uint32)
    body = ("  v_lshlrev_b32 v5, 2, v0\n  v_cmp_gt_u32 vcc, 4, v0\n  s_and_saveexec_b64 s[12:13], vcc\n"
            "  ds_write_b32 v5, v4\n  s_mov_b64 exec, s[12:13]\n  s_waitcnt lgkmcnt(0)\n"
            "  ds_add_rtn_f32 v3, v1, v2\n  s_waitcnt lgkmcnt(0)\n  ds_read_b32 v6, v5\n  s_waitcnt lgkmcnt(0)\n")
    out = run_snippet(body, vgprs={1: addr, 2: vals.view(np.uint32), 4: init_lanes}, outputs=["v3", "v6"],
                      lds_bytes=256)
    acc = list(init)
    for lane in range(64):
        k = int(addr[lane]) // 4
        assert out["v3"][lane] == np.float32(acc[k]).view(np.uint32), lane
        acc[k] = np.float32(np.float32(acc[k]) + vals[lane])
    np.testing.assert_array_equal(out["v6"][:4], np.array(acc, np.float32).view(np.uint32))


def test_atomic_add_f32_nan_rejected():
    nan = np.full(64, 0x7FC00001, np.uint32)
    with pytest.raises(UnsupportedInstruction, match="NaN"):
        run_snippet("  v_mov_b32 v1, 0\n  ds_add_f32 v1, v2\n  s_waitcnt lgkmcnt(0)\n", vgprs={2: nan},
                    outputs=[], lds_bytes=64)


def test_atomic_misaligned_is_a_fault():
    with pytest.raises(MemoryFault, match="4-byte aligned"):
        run_snippet("  v_mov_b32 v1, 2\n  ds_add_u32 v1, v2\n  s_waitcnt lgkmcnt(0)\n",
                    vgprs={2: np.ones(64, np.uint32)}, outputs=[], lds_bytes=64)


# ------------------------------------------------------ bounds and alignment
def test_read_out_of_range_strict_fault_nonstrict_zero():
    r = rng(1000)
    regs, image = fill_inputs(r)
    addr = (LANES * 64).astype(np.uint32)          # lanes >= 64*64/4096 ... lane 63 reads 4032+... in range
    addr[5] = LDS - 2                              # straddles the end
    addr[9] = LDS + 100                            # fully outside
    regs[20] = addr
    body = FILL + "  ds_read_b32 v30, v20\n  s_waitcnt lgkmcnt(0)\n"
    with pytest.raises(MemoryFault, match="outside the workgroup"):
        run(body, regs, ["v30"])
    out = run(body, regs, ["v30"], strict=False)
    for lane in range(64):
        a = int(addr[lane])
        want = word(image, a, 4) if a + 4 <= LDS else 0
        assert int(out["v30"][lane]) == want, lane


def test_write_out_of_range_strict_fault_nonstrict_dropped():
    r = rng(1010)
    regs, image = fill_inputs(r)
    addr = (LANES * 4).astype(np.uint32)
    addr[7] = LDS                                  # outside: dropped
    regs[20] = addr
    regs[30] = rand_u32(r)
    body = FILL + "  ds_write_b32 v20, v30\n" + DUMP
    with pytest.raises(MemoryFault, match="outside the workgroup"):
        run(body, regs, DUMP_REGS)
    out = run(body, regs, DUMP_REGS, strict=False)
    expect = image.copy()
    for lane in range(64):
        if lane != 7:
            expect[4 * lane:4 * lane + 4] = np.frombuffer(int(regs[30][lane]).to_bytes(4, "little"), np.uint8)
    np.testing.assert_array_equal(image_from_dump(out), expect)


def test_read_b128_misaligned_is_a_fault():
    with pytest.raises(MemoryFault, match="16-byte aligned"):
        run("  v_lshlrev_b32 v1, 3, v0\n  ds_read_b128 v[4:7], v1\n  s_waitcnt lgkmcnt(0)\n", {}, [])


def test_read_before_waitcnt_is_a_hazard():
    with pytest.raises(HazardError, match="in flight"):
        run("  v_lshlrev_b32 v1, 2, v0\n  ds_read_b32 v4, v1\n  v_mov_b32 v5, v4\n  s_waitcnt lgkmcnt(0)\n", {}, [])


# ------------------------------------------------------- atomics across waves
TWO_WAVES = """
  v_and_b32 v1, 0x3ff, v0
  v_and_b32 v2, 3, v1
  v_lshlrev_b32 v2, 2, v2                   // word tid % 4
  v_mul_u32_u24 v3, 0x9e3779b1 & 0xffffff, v1
  v_add_u32 v3, s2, v3                      // data: a per-thread value (s2 = workgroup id)
  v_mov_b32 v6, 0
  v_cmp_gt_u32 vcc, 4, v1
  s_and_saveexec_b64 s[12:13], vcc
  ds_write_b32 v2, v6                       // zero the four words
  s_mov_b64 exec, s[12:13]
  s_waitcnt lgkmcnt(0)
  s_barrier
  ds_add_u32 v2, v3                         // both waves, no barrier between their atomics
  s_waitcnt lgkmcnt(0)
{sync}
  ds_read_b32 v4, v2
  s_waitcnt lgkmcnt(0)
  global_store_dword v255, v4, s[90:91]
"""


def _two_wave_kernel(sync):
    import struct as _struct

    import torch

    import gfxasm.emu as emu
    from asm_harness import snippet_source
    from kernel_source import assemble
    src = snippet_source(TWO_WAVES.format(sync=sync), lds=64)
    src = src.replace(".max_flat_workgroup_size: 64", ".max_flat_workgroup_size: 128")
    out = torch.full((128,), -1, dtype=torch.int32)
    dummy = torch.zeros(64, dtype=torch.int32)
    emu.load(assemble(src)).kernel("snippet").launch(
        grid=(1, 1, 1), block=(128, 1, 1), kernarg=_struct.pack("<QQ", dummy.data_ptr(), out.data_ptr()),
        buffers=[dummy, out])
    return out.numpy().view(np.uint32)


def test_atomics_from_two_waves_need_no_barrier_between_them():
    got = _two_wave_kernel("  s_barrier")
    data = [(((0x9e3779b1 & 0xFFFFFF) * t) & 0xFFFFFFFF) for t in range(128)]
    sums = [sum(data[t] for t in range(128) if t % 4 == k) & 0xFFFFFFFF for k in range(4)]
    assert [int(v) for v in got] == [sums[t % 4] for t in range(128)]


def test_plain_read_of_another_waves_atomic_without_barrier_is_a_race():
    with pytest.raises(HazardError, match="LDS race|another wave"):
        _two_wave_kernel("")


@pytest.mark.parametrize("asm,name", [("ds_read_addtid_b32 v1 offset:4", "ds_read_addtid_b32"),
                                      ("ds_read_b64_tr_b4 v[2:3], v1", "ds_read_b64_tr_b4"),
                                      ("ds_max_f32 v1, v2", "ds_max_f32")])
def test_unimplemented_ds_forms_name_themselves(asm, name):
    with pytest.raises(UnsupportedInstruction, match=name):
        run_snippet(f"  v_mov_b32 v1, 0\n  v_mov_b32 v2, 0\n  {asm}\n  s_waitcnt lgkmcnt(0)\n", outputs=[],
                    lds_bytes=64)
