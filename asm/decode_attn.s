; decode_attn — attention of a few new query tokens over a KV cache (decode / speculative
; verification): q bf16/fp16, cache in q's dtype or FP8 e4m3 (per-tensor descales or
; per-token scale/shift), head dim D = 64 or 128, contiguous or paged cache, split-K.
; gfx950 (CDNA4), wave64, W = WORKGROUP_SIZE_X / 64 waves per workgroup (kernels.yaml: 8).
;
;   O[b, s, h, :] = sum_j softmax_j(scale * Q[b,s,h,:] . K[j, h/G, :]) * V[j, h/G, :]
;
; over the keys j this query sees: cache_leftpad[b] <= j < seqlen[b]; j <= qpos + future
; (future = 0: causal; 2^30: unbounded), where qpos = seqlen - seq_q + s (bottom-right
; aligned: positions counted after the left padding give the same bound); sliding window:
; j >= qpos - window (2^30 for none). With SOFTCAP = 1 each score becomes
; softcap tanh(scale q.k / softcap) before the mask. G = heads_q / heads_kv query heads share a KV
; head. Key j of batch b lives in page block_table[b, j >> page_shift], slot j & (2^page_shift - 1);
; a contiguous cache is handed in as one page per batch (page_shift 31, block_table [b]).
;
; Grid (num_splits, heads_kv * row_tiles, batch). A workgroup owns one KV head, one tile of
; 16 query rows of its group (row m = s*G + g: query token s, head hkv*G + g; rows = seq_q*G)
; and one split of the keys, [split*chunk, split*chunk + chunk). Its W waves take the
; split's 32-key tiles round robin (wave w: tiles w, w + W, ...) and combine their results
; through LDS at the end (wave 0 finishes: an in-workgroup split-K, so most shapes need no
; second pass). The rows of one KV head share every K/V load (GQA); with rows > 16, row
; tiles re-read the same K/V (through L2).
;
; --- LDS (W > 1) ---
;   [0, W*256)             each wave's log2-sum-exp, lane l of wave w at 4(64w + l)
;   [LDS_O, + W*64*D)      each wave's normalised O, lane l of wave w at LDS_O + (64w + l) D
;                          (its 8NC f32 in register order; DS offsets stay below 2^16)
;
; Why MFMA and this shape: decode reads each key once per (batch, KV head) and does 2*rows
; FLOP per byte, so the kernel is memory-bound and must keep VGPRs low and loads wide. A
; 16x16x32 MFMA covers up to 16 rows at the cost of one issue slot per 32 keys x 32 dims;
; the VALU dot products of a lane-per-key design would cost rows x D/2 ops per key.
;
; --- Math, per 32-key tile (two 16-key blocks kb = 0, 1; a block never crosses a page) ---
; S^T = K Q^T with v_mfma_f32_16x16x32 (A = K: row = key l%16; B = Q^T: column = query
; row l%16). Within each 32-wide k step c, lane group g = l/16 holds dims
; d = (D/4) g + 8c + e (e = 0..7): the same permutation for A and B, and each lane's K bytes
; are D/2 contiguous bytes of its key row (dwordx4 loads straight into the A operand).
; C layout: lane l holds query row n = l%16 and keys 16kb + 4g + r (r = 0..3) — 8 scores per
; lane per tile. Scores are scaled by scale*log2(e) in f32 and masked (-inf) per element;
; the running max m is reduced over the 4 lane groups with v_permlane32_swap /
; v_permlane16_swap; P = exp2(S - m); each lane keeps a partial row sum l (summed over the
; groups at the end); O is rescaled by exp2(m_old - m) only when some row's max grew. m
; starts at -FLT_MAX, not -inf (a row with no key stays NaN-free: exp2(m_old - m) never
; meets -inf - -inf) nor a larger floor (at or below every finite score, so the key that
; set m weighs exactly 1: l >= 1 once a row saw a finite score, and l = 0 only when all its
; scores were -inf, masked or from the data).
; O^T += V^T P^T (A = V^T: row = dim, B = P^T: column = query row). The B operand's k index
; 8g + e is key 16(e/4) + 4g + e%4 — exactly the lane's own P values, packed to bf16/fp16,
; no lane movement. A must hold 8 keys of one dim per lane: each lane loads one dword (2
; dims) of each of its 8 keys per 32-dim block and v_perm_b32 splits the even and odd dims
; into two A operands (O^T rows i = dims 32 dblk + 2i and 2i + 1). Lane l then holds dims
; 32 dblk + 8g + (0..7) of query row l%16: 16 contiguous bytes of O per 32-dim block.
;
; --- Memory safety ---
; Each 16-key block gets its own K and V descriptors: base = cache + page * page_stride
; (64-bit product: pools over 4 GiB, page ids >= 65536) + slot * seq_stride + head offset,
; num_records = (valid keys of the block) * seq_stride, so keys past min(seqlen, split end)
; read zeros and never touch memory; keys before the range's start (cache_leftpad, the
; first query's window start, the split start) in its first 16-key block are loaded through
; an out-of-range offset (read as zeros, memory untouched): the only block that holds such
; keys is the first of wave 0's first tile, whose loads the prologue issues (seq_stride must be at least a row's bytes, also for a
; cache of one key, whose seq axis is never stepped along). Page-table entries are read only
; for keys below that end (the entry index is clamped to the last valid key's). Page ids are clamped to
; num_pages - 1 (unsigned: negative ids too), so a bad id reads a wrong page of the pool,
; never outside it. Query rows past `rows` load and store through an out-of-range offset.
;
; --- Output ---
; partial = 0: O (q's dtype) and, with store_lse, LSE [b, h, s] (natural log).
; partial = 1: this split's normalised O in f32 to ws_o[split, (b*seq_q + s)*heads_q + h, :]
; and its log2-sum-exp to ws_lse[split, same row] (-inf for no key); decode_attn_merge
; combines the splits.
; O is the sum of P V divided by l only at the end (1 / max(l, 1): l >= 1 for a row with a
; finite score, and 0 x 1 keeps O = 0 for one without), times v_descale (FP8 = 1) after the
; division, and the waves' results are combined with weights normalised first: no
; intermediate exceeds the largest |dequantised V| (none overflows where that fits f32).
; A row that sees keys of the split but whose every visible score is -inf (+-inf in q or K)
; has the softmax 0 / 0: partial = 0 writes O = NaN (LSE -inf, as the float64 reference
; gives); partial = 1 writes O = 0 and log2-sum-exp LSE_EMPTY, a NaN that no NaN of the
; data can be (an f32 NaN widened from bf16, fp16 or e4m3 has its low 13 bits 0, a NaN made
; by arithmetic is 0x7fc00000 or 0xffc00000), so that the merge gives NaN only if no split
; and no sink weighs anything. A row that sees no key: O = 0, LSE = -inf.
;
;
; --- FP8 caches (FP8 = 1) ---
; K and V are OCP e4m3 with per-tensor f32 descales (read from k_descale[0], v_descale[0]):
; k_descale is folded into the score scale, v_descale into O's final 1 / max(l, 1) (<= 1).
; Each lane loads its K slice as D/4 bytes and widens it to bf16/fp16 (v_cvt_pk_f32_fp8,
; exact) into the same A operand as above; for V it loads 2 bytes (2 dims) per key with
; buffer_load_ushort where the 16-bit path loads a dword, and the widening packs the even
; and odd dims of key pairs directly (no v_perm). Everything else is the 16-bit path.
;
;
; --- FP8 caches with per-token scale/shift (FP8 = 2) ---
; k = fp8 * scale + shift per (token, KV head), the fp16 pairs in k_scale_shift /
; v_scale_shift [..., Hkv, 2] laid out like the cache's token dims (same pages). The dequant
; stays out of the dot products: q.(s k + b) = s (q.k) + b sum(q) — the MFMA runs on the raw
; widened fp8, sum(q) per query row comes from one extra MFMA chain (A = ones) in the
; prologue, and each of a lane's 8 scores takes two v_fma_mix_f32 (the fp16 halves read in
; place) with its key's (s, b). For V,
; sum_j p_j (s'_j v_j + b'_j) = sum_j (p_j s'_j) v_j + sum_j p_j b'_j: P is scaled by s'
; before it is packed, and a per-row c = sum p b' (rescaled with l) is added to O at the
; end. Each block's 16 pairs per tensor are loaded once (lanes 0-15, one dword each) through a
; descriptor built like the cache's (valid keys only) and handed to the lanes that need them
; with ds_bpermute_b32 (lane (g, n) takes keys 4g + r from lanes 4g + r).
;
; Defines: D (64 | 128), F16 (0: bf16, 1: fp16 q/o), FP8 (0: cache in q's dtype, 1: e4m3
; with per-tensor descales, 2: e4m3 with per-token scale/shift), SOFTCAP (0 | 1).
;
; --- Soft-capping (SOFTCAP = 1; Gemma-2) ---
; scale_log2 is then 2 scale log2(e) / softcap and softcap_log2 = softcap log2(e): with
; t = scale_log2 q.k (= 2y log2(e), y = scale q.k / softcap), tanh y = 1 - 2 / (2^t + 1)
; (v_exp_f32, v_rcp_f32), and the score in log2 units is softcap_log2 (1 - 2 / (2^t + 1)).
; 2^t = inf gives tanh 1, 2^t = 0 gives -1 (scores of +-inf cap to +-softcap, as tanh does).
; Error: |tanh - exact| <= ~2^-21 absolute (v_exp_f32 and v_rcp_f32 ~1 ulp each, the rounding
; of t, 2^t + 1 and 1 - 2r; cancellation near y = 0 makes it absolute, not relative), so a
; score is within ~softcap 2^-21 of softcap tanh y; tests/test_decode_softcap.py measures it.
; Cost: 6 VALU ops per score (2 of them transcendental) on top of the scale.
; Kernarg: see kernels.yaml.
;
; --- Pipeline (per wave; tiles in two register buffers, parity = tile index % 2) ---
; Tile i: descriptors of tile i+1 from its page ids (fetched one tile earlier), K(i+1) loads
; (D/16 dwordx4; FP8 D/32), page ids of tile i+2 fetched; wait for K(i); widen (FP8); 2 x D/32
; S MFMAs; softmax; wait for V(i); V(i+1) loads (8 x D/32 dword; FP8 ushort); v_perm (FP8:
; widen) + D/16 PV MFMAs. So the next tile's bytes stream while this one computes, with at
; most 40 loads in flight (vmcnt < 64). A wave's last tile has a variant that loads nothing
; for a next one (modelled: waiting on loads of a tile past the end cost ~1,600 cycles). Registers: D 128: 212 VGPRs (16-bit, FP8), 241
; (scale/shift): 2 waves/SIMD, one 8-wave workgroup per CU; D 64: 124 (4 waves/SIMD), 153.

.include "buffer_rsrc.inc"

.include "float16.inc"

.if (D != 64) && (D != 128)
    .error "decode_attn: D must be 64 or 128"
.endif
.set W, WORKGROUP_SIZE_X / 64
.if (W * 64 != WORKGROUP_SIZE_X) || (W > 8)
    .error "decode_attn: the workgroup must be 1 to 8 whole waves"
.endif
.set LDS_LSE, 0
.set LDS_O, W * 256
.if (W > 1) && (LDS_BYTES < LDS_O + W * 64 * D)
    .error "decode_attn: lds_bytes must hold W * 64 * (D + 4) bytes"
.endif

; --- constants ---
.set NC, D / 32                        ; 32-dim k steps of S = K Q^T; 32-dim blocks of O
.set KRAW, D / 16                      ; FP8: dwords of one lane's K slice (D/4 bytes) per block
.set FP8_TENSOR, 0                     ; FP8 = 1
.set FP8_TOKEN, 0                      ; FP8 = 2
.if FP8 == 1
    .set FP8_TENSOR, 1
.endif
.if FP8 == 2
    .set FP8_TOKEN, 1
.endif
.set FP8_ANY, FP8_TENSOR + FP8_TOKEN
.if F16
    .set ONES, 0x3c003c00              ; two fp16 1.0
.else
    .set ONES, 0x3f803f80              ; two bf16 1.0
.endif
.if D == 128
    .set D_LOG2, 7
.else
    .set D_LOG2, 6
.endif
.set KV_BLOCK, 16                      ; keys per descriptor (page sizes are powers of two >= 16)
.set TILE, 32                          ; keys per iteration
.set ROW_BYTES, 2 * D
.set OOB, 0x80000000                   ; an offset every descriptor here rejects
.set RECORDS_ALL, 0x7fffffff           ; num_records of Q/O/LSE/ws (the ops layer keeps offsets below)
.set M_INIT, 0xff7fffff                ; -FLT_MAX: finite floor of m, at or below every finite score
.set NEG_INF, 0xff800000
.set F32_NAN, 0x7fc00000
.set LSE_EMPTY, 0x7fc00001             ; ws_lse of a row whose visible keys all scored -inf (decode_attn_merge)
.set LN2, 0x3f317218
.set SEL_LO, 0x05040100                ; v_perm_b32: low halves of (src1, src0) -> one dword
.set SEL_HI, 0x07060302                ; high halves

; --- SGPRs (s[0:1] kernarg, s2 = split, s3 = kv head * row_tiles + row tile, s4 = batch) ---
.set s_wave, 5              ; wave index in the workgroup
.set s_ptr_q, 6             ; [6:7]
.set s_ptr_k, 8             ; [8:9]   K cache + kv head offset
.set s_ptr_v, 10            ; [10:11]
.set s_ptr_sl, 12           ; [12:13] cache_seqlens
.set s_ptr_bt, 14           ; [14:15] block table row of this batch
.set s_ptr_o, 16            ; [16:17]
.set s_ptr_lse, 18          ; [18:19]
.set s_ptr_wso, 20          ; [20:21]
.set s_ptr_wsl, 22          ; [22:23]
.set s_rsrc_q, 24           ; [24:27]
.set s_rsrc_k0, 28          ; [28:31] K block 0 of the tile
.set s_rsrc_k1, 32          ; [32:35] K block 1
.set s_rsrc_v0, 36          ; [36:39]
.set s_rsrc_v1, 40          ; [40:43]
.set s_rsrc_o, 44           ; [44:47] O / ws_o
.set s_rsrc_l, 48           ; [48:51] LSE / ws_lse
.set s_tmp64, 52            ; [52:53]
.set s_seq_q, 54
.set s_heads_q, 55
.set s_group, 56
.set s_group_magic, 57
.set s_tiles_magic, 58
.set s_row_tiles, 59
.set s_rows, 60
.set s_max_pages, 61
.set s_pages_m1, 62
.set s_page_shift, 63
.set s_page_mask, 64
.set s_k_page_stride, 65             ; byte strides: page, seq (slot), head
.set s_k_seq_stride, 66
.set s_k_head_stride, 67
.set s_v_page_stride, 68
.set s_v_seq_stride, 69
.set s_v_head_stride, 70
.set s_q_seq_stride, 71
.set s_q_head_stride, 72
.set s_q_batch_stride, 73
.set s_o_seq_stride, 74
.set s_o_head_stride, 75
.set s_o_batch_stride, 76
.set s_lse_head_stride, 77
.set s_lse_batch_stride, 78
.set s_ws_stride, 79        ; bytes of ws_o per split
.set s_wsl_stride, 80       ; bytes of ws_lse per split
.set s_chunk, 81            ; keys per split
.set s_window, 82           ; window_left (2^30: none)
.set s_future, 83           ; keys past the diagonal a query sees (0: causal, 2^30: not)
.set s_scale_log2, 84
.set s_partial, 85
.set s_store_lse, 86
.set s_hkv, 87
.set s_tile, 88             ; query row tile
.set s_seqlen, 89
.set s_klo, 90              ; first key of the wave's range (multiple of 16)
.set s_khi, 91              ; end of the wave's range: min(split end, seqlen)
.set s_t0, 92               ; first key of the current tile
.set s_pg0, 93              ; page ids of the current tile's blocks (fetched a tile ahead)
.set s_pg1, 94
.set s_tn, s_chunk          ; loop: first key of the tile being issued (the chunk is used only before)
.set s_t, 95                ; temporaries
.set s_u, 96
.set s_w, 97
.set s_sel_lo, 100         ; v_perm_b32 selectors (SEL_LO, SEL_HI)
.set s_sel_hi, 101
.set s_ptr_kd, s_rsrc_o     ; FP8 prologue: k_descale (the O/LSE descriptors are set only at the end)
.set s_ptr_vd, s_rsrc_l     ; FP8 prologue: v_descale
.set s_kdesc, s_rsrc_o + 2  ; FP8 prologue: k_descale[0]
.set s_vdesc, s_sel_lo      ; FP8: v_descale[0] (the v_perm selectors serve the 16-bit path only)
; FP8 = 2 (set at the end of the prologue over registers only the prologue used)
.set s_ptr_ks, s_ptr_q      ; [6:7] k_scale_shift + kv head offset
.set s_rsrc_s, s_rsrc_q     ; [24:27] the scale/shift descriptor of one block (rebuilt per block)
.set s_ptr_vs, s_group      ; [56:57] v_scale_shift + kv head offset
.set s_k_scale_shift_page_stride, s_tiles_magic ; byte strides of the pairs: page, seq
.set s_k_scale_shift_seq_stride, s_row_tiles
.set s_v_scale_shift_page_stride, s_q_seq_stride
.set s_v_scale_shift_seq_stride, s_q_head_stride
.set s_rowmask, 98          ; [98:99] epilogue: lanes whose row exists
.set s_ptr_lp, s_rowmask    ; [98:99] prologue: cache_leftpad
.set s_leftpad, s_pg0       ; prologue: cache_leftpad[b] (the page ids are fetched only after)
.set s_start, s_pg1         ; prologue: first key of the range (unaligned)
.set s_softcap, s_max_pages ; SOFTCAP: softcap log2(e) (loaded once the block table row is set)
.set s_empty, s_tmp64       ; [52:53] epilogue: lanes whose row saw keys, every score -inf

; --- VGPRs ---
.set v_lane, 1              ; l = work-item % 64: lane in the wave
.set v_n, 2                 ; l % 16: query row in the tile (B/C column), key in a block (A row)
.set v_g, 3                 ; l / 16: lane group
.set v_koff, 4              ; K voffset: n * k_seq_stride + (D/2) g
.set v_voff, 5              ; [5:8] V voffsets: (4g + r) * v_seq_stride + 4n, r = 0..3
.set v_span, 9              ; keys this row sees in the wave's range: [lo, lo + span)
.set v_klo, 10              ; 4g - lo: (key - lo) = t0 + 16kb + r + v_klo
.set v_m, 11                ; running max (log2 units)
.set v_l, 12                ; this lane's partial row sum
.set v_srow, 13             ; query token s of the lane's row
.set v_hq, 14               ; query head of the lane's row
.set v_t0, 15               ; temporaries
.set v_t1, 16
.set v_t2, 17
.set v_t3, 18
.set v_alpha, 19
.set v_key, 20
.set v_neginf, 21
.set v_s, 24                ; [24:31] scores / P (f32): block kb at v_s + 4kb
.set v_p, 32                ; [32:35] P packed: the B operand of O^T += V^T P^T
; sized by D (NC = D/32) and the cache kind; two tile buffers (parity p = tile index % 2)
.set KBUFS, 2 - FP8_ANY      ; 16-bit: K lands in its operand (two buffers); FP8: widened into one
.set v_q, 36                ; [4NC] Q^T: the B operand of S^T = K Q^T, k step c at v_q + 4c
.set v_k, v_q + 4*NC        ; [KBUFS 8NC] K: block kb, k step c at v_k + 8NC p + 4(kb NC + c)
.set v_v, v_k + KBUFS*8*NC  ; [2 8NC] V dwords: 32-dim block db, key e at v_v + 8NC p + 8 db + e
.set v_o, v_v + 16*NC       ; [8NC] O^T: block db, parity p at v_o + 4(2 db + p)
.set v_ost, v_k             ; epilogue: O packed for the stores (over K, once no load is in flight)
.set v_kraw, v_o + 8*NC     ; FP8: [2 2KRAW] raw K bytes, block kb at v_kraw + 2KRAW p + KRAW kb
.set v_ksoff, v_kraw + 4*KRAW   ; FP8 = 2: pair voffset of key l of a block: l * k_scale_shift_seq_stride (lanes 0-15; others OOB)
.set v_vsoff, v_ksoff + 1   ; l * v_scale_shift_seq_stride likewise
.set v_pgat, v_vsoff + 1    ; 16g: ds_bpermute address of lane 4g (+ 4r in the offset field: lane 4g + r)
.set v_kpr, v_pgat + 1      ; [2 2] K pairs as loaded: block kb at v_kpr + 2p + kb, key l in lane l < 16
.set v_vpr, v_kpr + 4       ; [2 2] V pairs likewise
.set v_ks, v_vpr + 4        ; [8] K (scale, shift) of the lane's 8 keys (kb, r) at v_ks + 4kb + r
.set v_vs, v_ks + 8         ; [8] V (scale, shift) likewise
.set v_sumq, v_vs + 8       ; sum of the lane's query row
.set v_c, v_sumq + 1        ; partial sum p b' of the lane

; ============================================================================ macros

; s[\dst] = (s[\a] * s[\magic]) >> 31 = s[\a] / divisor, for magic = ceil(2^31 / divisor)
; (exact while a * divisor < 2^31)
.macro sdiv_magic dst, a, magic
    s_mul_i32 s[s_t], s[\a], s[\magic]
    s_mul_hi_u32 s[s_u], s[\a], s[\magic]
    s_lshr_b32 s[s_t], s[s_t], 31
    s_lshl_b32 s[s_u], s[s_u], 1
    s_or_b32 s[\dst], s[s_t], s[s_u]
.endm

; v[\dst] = v[\a] / divisor likewise (v_t2, v_t3 clobbered)
.macro vdiv_magic dst, a, magic
    v_mul_lo_u32 v[v_t2], v[\a], s[\magic]
    v_mul_hi_u32 v[v_t3], v[\a], s[\magic]
    v_alignbit_b32 v[\dst], v[v_t3], v[v_t2], 31
.endm

; Fetch the page id of key s[\key] (index clamped to the wave's last key: entries past the
; sequence's end are never read) into s[\dst]. Lands at the next lgkmcnt(0).
.macro fetch_page dst, key
    s_add_u32 s[s_t], s[s_khi], -1
    s_min_u32 s[s_t], s[\key], s[s_t]
    s_lshr_b32 s[s_t], s[s_t], s[s_page_shift]
    s_lshl_b32 s[s_t], s[s_t], 2
    s_load_dword s[\dst], s[s_ptr_bt:s_ptr_bt+1], s[s_t]
.endm

; K and V descriptors of block \kb of the tile at s_tn, page id s[\pg] (clamped here)
.macro block_rsrc kb, pg, ksoff=v_ksoff, vsoff=v_vsoff
    s_min_u32 s[\pg], s[\pg], s[s_pages_m1]             ; out-of-range page ids (negative too): the last page
    s_add_u32 s[s_w], s[s_tn], KV_BLOCK * \kb           ; first key of the block
    s_and_b32 s[s_u], s[s_w], s[s_page_mask]            ; its slot in the page
    s_sub_i32 s[s_w], s[s_khi], s[s_w]                  ; keys left in the range
    s_max_i32 s[s_w], s[s_w], 0
    s_min_u32 s[s_w], s[s_w], KV_BLOCK
    block_rsrc1 s_rsrc_k\kb, s_ptr_k, \pg, s_k_page_stride, s_k_seq_stride
    block_rsrc1 s_rsrc_v\kb, s_ptr_v, \pg, s_v_page_stride, s_v_seq_stride
.if FP8_TOKEN
    block_rsrc1 s_rsrc_s, s_ptr_ks, \pg, s_k_scale_shift_page_stride, s_k_scale_shift_seq_stride
    buffer_load_dword v[_kpr + \kb], v[\ksoff], s[s_rsrc_s:s_rsrc_s+3], 0 offen   ; the block's 16 pairs, once
    block_rsrc1 s_rsrc_s, s_ptr_vs, \pg, s_v_scale_shift_page_stride, s_v_scale_shift_seq_stride          ; (the load above read it at issue)
    buffer_load_dword v[_vpr + \kb], v[\vsoff], s[s_rsrc_s:s_rsrc_s+3], 0 offen
.endif
.endm

.macro block_rsrc1 rsrc, ptr, pg, ps, ss
    s_mov_b32 s[\rsrc], s[\ptr]
    s_mov_b32 s[\rsrc+1], s[\ptr+1]
    add_mul_u64 \rsrc, \pg, \ps, s_tmp64                ; + page * page_stride (64-bit)
    s_mul_i32 s[s_t], s[s_u], s[\ss]                    ; + slot * seq_stride (< page_stride < 2^32)
    s_add_u32 s[\rsrc], s[\rsrc], s[s_t]
    s_addc_u32 s[\rsrc+1], s[\rsrc+1], 0
    s_and_b32 s[\rsrc+1], s[\rsrc+1], 0xffff
    s_mul_i32 s[\rsrc+2], s[s_w], s[\ss]                ; valid keys * seq_stride
    s_mov_b32 s[\rsrc+3], RSRC_DW3_RAW
.endm

; Every O^T register: v_o[r] = v_o[r] \op v[\x] (\op v_mul_f32 / v_add_f32), or 0 (o_zero)
.macro o_each op, x
    .set _r, 0
    .rept 8 * NC
        \op v[v_o + _r], v[v_o + _r], v[\x]
        .set _r, _r + 1
    .endr
.endm
.macro o_zero
    .set _r, 0
    .rept 8 * NC
        v_mov_b32 v[v_o + _r], 0
        .set _r, _r + 1
    .endr
.endm

; Reduce v[\x] over the 4 lane groups with \op (v_max_f32 / v_add_f32); v_t1 clobbered
.macro group_reduce op, x
    v_mov_b32 v[v_t1], v[\x]
    s_nop 1                                             ; VALU write -> v_permlane32_swap read: 2 wait states
    v_permlane32_swap_b32 v[\x], v[v_t1]                    ; x = lanes 0-31 twice, t1 = lanes 32-63 twice
    \op v[\x], v[\x], v[v_t1]
    v_mov_b32 v[v_t1], v[\x]
    s_nop 1                                             ; VALU write -> v_permlane16_swap read: 2 wait states
    v_permlane16_swap_b32 v[\x], v[v_t1]                    ; x = even rows twice, t1 = odd rows twice
    \op v[\x], v[\x], v[v_t1]
.endm

; FP8: widen K of block \kb, k step \c (raw dwords 2c, 2c+1: dims 8c..8c+7 of the lane's
; slice) into its A operand; v_s..v_s+3 are temporaries (S is written after)
.macro widen_k kb, c
    .irp h, 0, 1
        v_cvt_pk_f32_fp8 v[v_s : v_s + 1], v[_kld + KRAW*\kb + 2*\c + \h]
        v_cvt_pk_f32_fp8_sdwa v[v_s + 2 : v_s + 3], v[_kld + KRAW*\kb + 2*\c + \h] src0_sel:WORD_1
        cvt_pk_f32 v[v_k + 4*(\kb*NC + \c) + 2*\h], v[v_s], v[v_s + 1]
        cvt_pk_f32 v[v_k + 4*(\kb*NC + \c) + 2*\h + 1], v[v_s + 2], v[v_s + 3]
    .endr
.endm

; FP8: widen V keys 4h..4h+3 of 32-dim block \db (2 dims each) into A operands \a (even
; dims) and \a + 4 (odd), entries 2h, 2h+1 (keys 2k, 2k+1 in the low, high half); v_s..v_s+7
; are temporaries (P is packed in v_p by now)
.macro widen_v db, h, a
    .irp e, 0, 1, 2, 3
        v_cvt_pk_f32_fp8 v[v_s + 2*\e : v_s + 2*\e + 1], v[_vld + 8*\db + 4*\h + \e]   ; (even, odd) dim of key 4h + e
    .endr
    .irp k, 0, 1
        cvt_pk_f32 v[\a + 2*\h + \k], v[v_s + 4*\k], v[v_s + 4*\k + 2]
        cvt_pk_f32 v[\a + 4 + 2*\h + \k], v[v_s + 4*\k + 1], v[v_s + 4*\k + 3]
    .endr
.endm

; Wave w's normalised O from LDS into buffer w % 2 (v_k, v_v: the tile buffers, free now)
.set WAVE_O_BUF0, v_k
.set WAVE_O_BUF1, v_v
.macro read_wave_o w
    .if (\w) % 2
        .set _ob, WAVE_O_BUF1
    .else
        .set _ob, WAVE_O_BUF0
    .endif
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7
        .if \i < 2 * NC
            ds_read_b128 v[_ob + 4*\i : _ob + 4*\i + 3], v[v_t0] offset: LDS_O + 64*D*(\w) + 16*\i
        .endif
    .endr
.endm

; W > 1: every wave puts its normalised O (v_o) and log2-sum-exp (v_t1) in LDS; after the
; barrier the other waves end and wave 0 replaces v_o and v_t1 by the combination:
; weights 2^(lse_w - max) / sum_w 2^(lse_w - max), O = sum_w weight_w O_w. The weights are
; normalised before the sum, so it never exceeds the largest |O_w| (summing first and
; dividing after could overflow where O fits). Max floored at -FLT_MAX: a row no wave saw
; gives O = 0, -inf (and empty_rows applies).
.macro combine_waves
    s_lshl_b32 s[s_t], s[s_wave], 6
    v_add_u32 v[v_t2], s[s_t], v[v_lane]                ; 64 wave + l
    v_lshlrev_b32 v[v_t0], D_LOG2, v[v_t2]              ; its O slot: D bytes
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7
        .if \i < 2 * NC
            ds_write_b128 v[v_t0], v[v_o + 4*\i : v_o + 4*\i + 3] offset: LDS_O + 16*\i
        .endif
    .endr
    v_lshlrev_b32 v[v_t2], 2, v[v_t2]
    ds_write_b32 v[v_t2], v[v_t1] offset: LDS_LSE
    s_waitcnt lgkmcnt(0)                                ; in flight: this wave's LDS writes -> wait
    s_barrier                                           ; every wave's partial result is in LDS
    s_cmp_eq_u32 s[s_wave], 0
    s_cbranch_scc0 L_end                                ; wave 0 goes on alone
    v_lshlrev_b32 v[v_t2], 2, v[v_lane]
    .irp w, 0, 1, 2, 3, 4, 5, 6, 7
        .if \w < W
            ds_read_b32 v[v_s + \w], v[v_t2] offset: LDS_LSE + 256*\w
        .endif
    .endr
    v_lshlrev_b32 v[v_t0], D_LOG2, v[v_lane]            ; wave 0's O slot; wave w's is w * 64 * D further
    read_wave_o 0
    o_zero
    v_mov_b32 v[v_t1], M_INIT
    s_waitcnt lgkmcnt(2 * NC)                           ; in flight: wave 0's O -> wait for the W log2-sum-exps
    .irp w, 0, 1, 2, 3, 4, 5, 6, 7
        .if \w < W
            v_max_f32 v[v_t1], v[v_t1], v[v_s + \w]
        .endif
    .endr
    v_mov_b32 v[v_l], 0
    .irp w, 0, 1, 2, 3, 4, 5, 6, 7
        .if \w < W
            v_sub_f32 v[v_s + \w], v[v_s + \w], v[v_t1]
            v_exp_f32 v[v_s + \w], v[v_s + \w]           ; weight of wave w (the max's: exactly 1)
        .endif
    .endr
    s_nop 0                                             ; transcendental result -> VALU read: 1 wait state
    .irp w, 0, 1, 2, 3, 4, 5, 6, 7
        .if \w < W
            v_add_f32 v[v_l], v[v_l], v[v_s + \w]
        .endif
    .endr
    v_max_f32 v[v_t2], 1.0, v[v_l]                      ; (the LSE reads' address is free)
    v_rcp_f32 v[v_t2], v[v_t2]                          ; 1 / sum of weights (>= 1 when any wave saw a score)
    empty_rows_mask                                     ; (its VALU ops give the rcp's 1 wait state)
    empty_rows_nan v_t2
    .irp w, 0, 1, 2, 3, 4, 5, 6, 7
        .if \w < W
            v_mul_f32 v[v_s + \w], v[v_s + \w], v[v_t2]    ; normalised weight of wave w
        .endif
    .endr
    ; wave w's O is read one wave ahead, into the buffer the wave before it used
    .irp w, 0, 1, 2, 3, 4, 5, 6, 7
        .if \w < W
            .if \w + 1 < W
                read_wave_o \w + 1
            .endif
            .if \w + 1 < W
                s_waitcnt lgkmcnt(2 * NC)               ; in flight: wave w+1's O -> wait for wave w's
            .else
                s_waitcnt lgkmcnt(0)                    ; in flight: wave w's O -> wait
            .endif
            .set _r, 0
            .rept 8 * NC
                v_fma_f32 v[v_o + _r], v[v_s + \w], v[WAVE_O_BUF0 + (WAVE_O_BUF1 - WAVE_O_BUF0) * (\w % 2) + _r], v[v_o + _r]
                .set _r, _r + 1
            .endr
        .endif
    .endr
    v_log_f32 v[v_l], v[v_l]
    s_nop 0                                             ; transcendental result -> VALU read: 1 wait state
    v_add_f32 v[v_t1], v[v_t1], v[v_l]                  ; log2-sum-exp of the workgroup
.endm

; The rows the workgroup saw keys of (span > 0) but whose sum of weights v_l is 0: every
; visible score -inf, softmax 0 / 0. s_empty = their lanes.
.macro empty_rows_mask
    v_cmp_eq_f32 s[s_empty:s_empty+1], 0, v[v_l]
    v_cmp_lt_i32 vcc, 0, v[v_span]
    s_and_b64 s[s_empty:s_empty+1], vcc, s[s_empty:s_empty+1]
.endm

; partial = 0: v[\inv] (the 1 / l that O is multiplied by, 0 x NaN) = NaN in the s_empty lanes
.macro empty_rows_nan inv
    s_cmp_eq_u32 s[s_partial], 0
    s_cselect_b64 vcc, s[s_empty:s_empty+1], 0
    v_mov_b32 v[v_t3], F32_NAN
    v_cndmask_b32 v[\inv], v[\inv], v[v_t3], vcc
.endm

; partial = 1: the log2-sum-exp v_t1 = LSE_EMPTY in the s_empty lanes (O stays 0), for the merge
.macro empty_rows_lse
    s_cmp_eq_u32 s[s_partial], 0
    s_cselect_b64 vcc, 0, s[s_empty:s_empty+1]
    v_mov_b32 v[v_t3], LSE_EMPTY
    v_cndmask_b32 v[v_t1], v[v_t1], v[v_t3], vcc
.endm

; The registers of tile buffer \p: _kld (where K loads land), _kop (the MFMA's K operand),
; _vld (V), _kpr/_vpr (scale/shift pairs as loaded)
.macro tile_regs p
    .if FP8_ANY
        .set _kld, v_kraw + 2*KRAW*(\p)
        .set _kop, v_k
    .else
        .set _kld, v_k + 8*NC*(\p)
        .set _kop, _kld
    .endif
    .set _vld, v_v + 8*NC*(\p)
    .set _kpr, v_kpr + 2*(\p)
    .set _vpr, v_vpr + 2*(\p)
.endm
.set KLOADS, 2 * NC / (1 + FP8_ANY)    ; K loads per tile
.set SLOADS, 4 * FP8_TOKEN             ; scale/shift loads per tile
.set VLOADS, 8 * NC                    ; V loads per tile
.set KBLOCK_REGS, 4 * NC / (1 + FP8_ANY)   ; VGPRs of one block's K as loaded

; Tile at s_tn into buffer \p: page ids (fetched a tile ahead) -> descriptors (+ the
; scale/shift loads), the K loads, and the page ids of the tile after it. first = 1: block 0
; loads through first_block_offsets' offsets.
.macro issue_k p, first=0
    tile_regs \p
    s_waitcnt lgkmcnt(0)                                ; in flight: the tile's page ids -> wait
.if \first
    block_rsrc 0, s_pg0, v_ksfirst, v_vsfirst
.else
    block_rsrc 0, s_pg0
.endif
    block_rsrc 1, s_pg1
    .irp kb, 0, 1
        .set _koff, v_koff
        .if \first && (\kb == 0)
            .set _koff, v_kfirst
        .endif
        .irp c, 0, 1, 2, 3
            .if \c < KLOADS / 2
                buffer_load_dwordx4 v[_kld + KBLOCK_REGS*\kb + 4*\c : _kld + KBLOCK_REGS*\kb + 4*\c + 3], v[_koff], s[s_rsrc_k\kb:s_rsrc_k\kb+3], 0 offen offset: 16*\c
            .endif
        .endr
    .endr
    s_add_u32 s[s_w], s[s_tn], TILE * W                 ; page ids of this wave's tile after it
    fetch_page s_pg0, s_w
    s_add_u32 s[s_w], s[s_tn], TILE * W + KV_BLOCK
    fetch_page s_pg1, s_w
.endm

; V of the tile whose descriptors issue_k built last, into buffer \p (first = 1: block 0
; through first_block_offsets' offsets)
.macro issue_v p, first=0
    tile_regs \p
    .irp db, 0, 1, 2, 3
        .if \db < NC
            .irp e, 0, 1, 2, 3, 4, 5, 6, 7
                .set _voff, v_voff
                .if \first && (\e < 4)
                    .set _voff, v_vfirst
                .endif
.if FP8_ANY
                buffer_load_ushort v[_vld + 8*\db + \e], v[_voff + \e % 4], s[s_rsrc_v0 + 4*(\e / 4):s_rsrc_v0 + 4*(\e / 4) + 3], 0 offen offset: 32*\db
.else
                buffer_load_dword v[_vld + 8*\db + \e], v[_voff + \e % 4], s[s_rsrc_v0 + 4*(\e / 4):s_rsrc_v0 + 4*(\e / 4) + 3], 0 offen offset: 64*\db
.endif
            .endr
        .endif
    .endr
.endm

; The load offsets of the first 16-key block of wave 0's first tile (the only block that
; can hold keys below the range's start s_start, at most 15 of them, from klo on): those
; keys' lanes get OOB, so they read zeros and touch no memory (a key before cache_leftpad
; or a window is never read). Other waves' first tiles start at or past s_start (none).
.set v_kfirst, v_s          ; K voffset (v_s is free until the first tile's scores)
.set v_vfirst, v_s + 1      ; [4] V voffsets
.set v_ksfirst, v_s + 5     ; FP8 = 2: pair voffsets
.set v_vsfirst, v_s + 6
.macro first_block_offsets
    s_sub_u32 s[s_u], s[s_start], s[s_klo]              ; keys of the block before the start
    s_cmp_eq_u32 s[s_wave], 0
    s_cselect_b32 s[s_u], s[s_u], 0
    v_mov_b32 v[v_t3], OOB
    v_cmp_gt_u32 vcc, s[s_u], v[v_n]                    ; K: lane's key n
    v_cndmask_b32 v[v_kfirst], v[v_koff], v[v_t3], vcc
.if FP8_TOKEN
    v_cmp_gt_u32 vcc, s[s_u], v[v_lane]                 ; pairs: key l (lanes >= 16 are OOB already)
    v_cndmask_b32 v[v_ksfirst], v[v_ksoff], v[v_t3], vcc
    v_cndmask_b32 v[v_vsfirst], v[v_vsoff], v[v_t3], vcc
.endif
    v_lshlrev_b32 v[v_t2], 2, v[v_g]                    ; V: keys 4g + r
    .irp r, 0, 1, 2, 3
        v_add_u32 v[v_t1], \r, v[v_t2]
        v_cmp_gt_u32 vcc, s[s_u], v[v_t1]
        v_cndmask_b32 v[v_vfirst + \r], v[v_voff + \r], v[v_t3], vcc
    .endr
.endm

; SOFTCAP: the scores v_s become softcap_log2 tanh y, where scale_log2 v_s = 2y log2(e)
; (header): tanh y = 1 - 2 / (2^(2y log2 e) + 1)
.macro softcap_scores
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7
        v_mul_f32 v[v_s + \i], s[s_scale_log2], v[v_s + \i]
    .endr
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7
        v_exp_f32 v[v_s + \i], v[v_s + \i]
    .endr
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7
        v_add_f32 v[v_s + \i], 1.0, v[v_s + \i]          ; (each exp's result is 7 ops old)
    .endr
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7
        v_rcp_f32 v[v_s + \i], v[v_s + \i]
    .endr
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7
        v_fma_f32 v[v_s + \i], v[v_s + \i], -2.0, 1.0     ; tanh y (each rcp's result is 7 ops old)
    .endr
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7
        v_mul_f32 v[v_s + \i], s[s_softcap], v[v_s + \i]
    .endr
.endm

; ============================================================================ prologue

    load_kernarg s_ptr_q, q
    load_kernarg s_ptr_k, k_cache
    load_kernarg s_ptr_v, v_cache
    load_kernarg s_ptr_sl, cache_seqlens
    load_kernarg s_ptr_bt, block_table
    load_kernarg s_ptr_lp, cache_leftpad
    load_kernarg s_ptr_o, o
    load_kernarg s_ptr_lse, lse
    load_kernarg s_ptr_wso, ws_o
    load_kernarg s_ptr_wsl, ws_lse
.if FP8_TENSOR
    load_kernarg s_ptr_kd, k_descale
    load_kernarg s_ptr_vd, v_descale
.endif
    .irp name, seq_q, heads_q, group, group_magic, tiles_magic, row_tiles, rows, max_pages, pages_m1, page_shift
        load_kernarg s_\name, \name
    .endr
    .irp name, k_page_stride, k_seq_stride, k_head_stride, v_page_stride, v_seq_stride, v_head_stride, q_seq_stride, q_head_stride, q_batch_stride, o_seq_stride, o_head_stride, o_batch_stride, lse_head_stride, lse_batch_stride
        load_kernarg s_\name, \name
    .endr
    .irp name, ws_stride, wsl_stride, chunk, window, future, scale_log2, partial, store_lse
        load_kernarg s_\name, \name
    .endr
    v_and_b32 v[v_lane], 63, v[v_workitem]
    v_bfe_u32 v[v_t0], v[v_workitem], 6, 4              ; wave = work-item x / 64
    s_nop 0                                             ; VALU write -> v_readfirstlane read: 1 wait state
    v_readfirstlane_b32 s[s_wave], v[v_t0]
    v_and_b32 v[v_n], 15, v[v_lane]
    v_lshrrev_b32 v[v_g], 4, v[v_lane]
    v_mov_b32 v[v_m], M_INIT
    v_mov_b32 v[v_l], 0
    v_mov_b32 v[v_neginf], NEG_INF
.if FP8 == 0
    s_mov_b32 s[s_sel_lo], SEL_LO
    s_mov_b32 s[s_sel_hi], SEL_HI
.endif
    o_zero
    s_waitcnt lgkmcnt(0)                                ; in flight: the kernargs -> wait for all
    s_lshl_b32 s[s_t], s[s_wg_z], 2
    s_load_dword s[s_seqlen], s[s_ptr_sl:s_ptr_sl+1], s[s_t]
    s_load_dword s[s_leftpad], s[s_ptr_lp:s_ptr_lp+1], s[s_t]
.if FP8_TENSOR
    s_load_dword s[s_kdesc], s[s_ptr_kd:s_ptr_kd+1], 0
    s_load_dword s[s_vdesc], s[s_ptr_vd:s_ptr_vd+1], 0
.endif
    sdiv_magic s_hkv, s_wg_y, s_tiles_magic             ; kv head = y / row_tiles
    s_mul_i32 s[s_t], s[s_hkv], s[s_row_tiles]
    s_sub_u32 s[s_tile], s[s_wg_y], s[s_t]
    s_lshl_b32 s[s_page_mask], 1, s[s_page_shift]
    s_add_u32 s[s_page_mask], s[s_page_mask], -1
    s_mul_i32 s[s_t], s[s_wg_z], s[s_max_pages]         ; block table row of batch b
    s_lshl_b32 s[s_t], s[s_t], 2
    s_add_u32 s[s_ptr_bt], s[s_ptr_bt], s[s_t]
    s_addc_u32 s[s_ptr_bt+1], s[s_ptr_bt+1], 0
.if SOFTCAP
    load_kernarg s_softcap, softcap_log2
.endif
    s_mul_i32 s[s_t], s[s_hkv], s[s_k_head_stride]               ; caches: + kv head offset
    s_add_u32 s[s_ptr_k], s[s_ptr_k], s[s_t]
    s_addc_u32 s[s_ptr_k+1], s[s_ptr_k+1], 0
    s_mul_i32 s[s_t], s[s_hkv], s[s_v_head_stride]
    s_add_u32 s[s_ptr_v], s[s_ptr_v], s[s_t]
    s_addc_u32 s[s_ptr_v+1], s[s_ptr_v+1], 0
    add_mul_u64 s_ptr_q, s_wg_z, s_q_batch_stride, s_tmp64        ; Q: this batch
    s_mov_b32 s[s_t], RECORDS_ALL
    rsrc_raw s_rsrc_q, s_ptr_q, s_t

    ; --- the lane's query row m = 16 tile + n: token s = m / G, head hkv*G + m % G ---
    s_lshl_b32 s[s_t], s[s_tile], 4
    v_add_u32 v[v_t0], s[s_t], v[v_n]                   ; m
    vdiv_magic v_srow, v_t0, s_group_magic
    v_mul_lo_u32 v[v_t1], v[v_srow], s[s_group]
    v_sub_u32 v[v_t1], v[v_t0], v[v_t1]                 ; m % G
    s_mul_i32 s[s_t], s[s_hkv], s[s_group]
    v_add_u32 v[v_hq], s[s_t], v[v_t1]
    v_cmp_gt_u32 vcc, s[s_rows], v[v_t0]                ; row exists
    v_mul_lo_u32 v[v_t1], v[v_srow], s[s_q_seq_stride]
    v_mul_lo_u32 v[v_t2], v[v_hq], s[s_q_head_stride]
    v_add_u32 v[v_t1], v[v_t1], v[v_t2]
    v_lshl_add_u32 v[v_t1], v[v_g], D_LOG2 - 1, v[v_t1]     ; + (D/2) g bytes
    v_mov_b32 v[v_t2], OOB
    v_cndmask_b32 v[v_t1], v[v_t2], v[v_t1], vcc        ; rows past `rows` read zeros
    .irp c, 0, 1, 2, 3
        .if \c < NC
            buffer_load_dwordx4 v[v_q + 4*\c : v_q + 4*\c + 3], v[v_t1], s[s_rsrc_q:s_rsrc_q+3], 0 offen offset: 16*\c
        .endif
    .endr
    ; lane offsets into K and V blocks
    v_mul_lo_u32 v[v_koff], v[v_n], s[s_k_seq_stride]
.if FP8
    v_lshl_add_u32 v[v_koff], v[v_g], D_LOG2 - 2, v[v_koff]         ; + (D/4) g bytes
.else
    v_lshl_add_u32 v[v_koff], v[v_g], D_LOG2 - 1, v[v_koff]         ; + (D/2) g bytes
.endif
    v_lshlrev_b32 v[v_t1], 2, v[v_g]                    ; 4g
    v_mul_lo_u32 v[v_t1], v[v_t1], s[s_v_seq_stride]
    v_lshl_add_u32 v[v_voff], v[v_n], 2 - FP8_ANY, v[v_t1]          ; + 2 dims of n
    v_add_u32 v[v_voff + 1], s[s_v_seq_stride], v[v_voff]
    v_add_u32 v[v_voff + 2], s[s_v_seq_stride], v[v_voff + 1]
    v_add_u32 v[v_voff + 3], s[s_v_seq_stride], v[v_voff + 2]

    s_waitcnt lgkmcnt(0)                                ; in flight: seqlen, leftpad (FP8: descales; SOFTCAP: softcap) -> wait
.if FP8_TENSOR
    v_mov_b32 v[v_t0], s[s_scale_log2]
    v_mul_f32 v[v_t0], s[s_kdesc], v[v_t0]              ; k_descale folded into the score scale
    s_nop 0                                             ; VALU write -> v_readfirstlane read: 1 wait state
    v_readfirstlane_b32 s[s_scale_log2], v[v_t0]        ; (read by VALU again only in the loop, far later)
.endif
    ; --- key ranges: the splits cut [first, seqlen), first = max(leftpad, the first query's
    ; window start) (the host sizes the splits to it); split's [lo, lo + chunk); the wave's [klo, khi) ---
    s_sub_i32 s[s_t], s[s_seqlen], s[s_seq_q]           ; qpos of token 0
    s_sub_i32 s[s_t], s[s_t], s[s_window]               ; its window start (negative: none)
    s_max_i32 s[s_t], s[s_t], s[s_leftpad]              ; first
    s_max_i32 s[s_t], s[s_t], 0                         ; within [0, seqlen] (leftpad is unchecked on a GPU)
    s_min_i32 s[s_t], s[s_t], s[s_seqlen]
    s_mul_i32 s[s_w], s[s_wg_x], s[s_chunk]
    s_add_u32 s[s_w], s[s_w], s[s_t]                    ; split start
    s_add_u32 s[s_khi], s[s_w], s[s_chunk]
    s_min_i32 s[s_khi], s[s_khi], s[s_seqlen]
    s_mov_b32 s[s_start], s[s_w]
    s_and_b32 s[s_klo], s[s_start], -KV_BLOCK
    ; per lane: lo = max(qpos - window, split start), hi = min(qpos + 1 + future, khi)
    s_sub_i32 s[s_t], s[s_seqlen], s[s_seq_q]
    v_add_u32 v[v_t0], s[s_t], v[v_srow]                ; qpos
    v_subrev_u32 v[v_t1], s[s_window], v[v_t0]
    v_max_i32 v[v_t1], s[s_w], v[v_t1]                  ; lo
    v_add3_u32 v[v_t2], v[v_t0], 1, s[s_future]
    v_min_i32 v[v_t2], s[s_khi], v[v_t2]                ; hi
    v_sub_u32 v[v_span], v[v_t2], v[v_t1]
    v_max_i32 v[v_span], 0, v[v_span]
    v_mov_b32 v[v_t2], 0
    v_cndmask_b32 v[v_span], v[v_t2], v[v_span], vcc    ; rows past `rows` see nothing
    v_lshlrev_b32 v[v_klo], 2, v[v_g]
    v_sub_u32 v[v_klo], v[v_klo], v[v_t1]               ; 4g - lo
.if FP8_TOKEN
    ; the pairs' pointers and strides, over registers the prologue is done with
    load_kernarg s_ptr_ks, k_scale_shift
    load_kernarg s_ptr_vs, v_scale_shift
    load_kernarg s_k_scale_shift_page_stride, k_scale_shift_page_stride
    load_kernarg s_k_scale_shift_seq_stride, k_scale_shift_seq_stride
    load_kernarg s_v_scale_shift_page_stride, v_scale_shift_page_stride
    load_kernarg s_v_scale_shift_seq_stride, v_scale_shift_seq_stride
    load_kernarg s_t, k_scale_shift_head_stride
    load_kernarg s_u, v_scale_shift_head_stride
    .irp i, 0, 1, 2, 3
        v_mov_b32 v[v_k + \i], ONES
    .endr
    v_mov_b32 v[v_c], 0
    s_waitcnt vmcnt(0) lgkmcnt(0)                       ; in flight: Q; the pairs' kernargs -> wait for all
    s_mul_i32 s[s_t], s[s_hkv], s[s_t]                  ; + kv head offsets
    s_add_u32 s[s_ptr_ks], s[s_ptr_ks], s[s_t]
    s_addc_u32 s[s_ptr_ks+1], s[s_ptr_ks+1], 0
    s_mul_i32 s[s_u], s[s_hkv], s[s_u]
    s_add_u32 s[s_ptr_vs], s[s_ptr_vs], s[s_u]
    s_addc_u32 s[s_ptr_vs+1], s[s_ptr_vs+1], 0
    v_mul_lo_u32 v[v_ksoff], v[v_lane], s[s_k_scale_shift_seq_stride]      ; lane l loads key l's pair (l < 16) ...
    v_mul_lo_u32 v[v_vsoff], v[v_lane], s[s_v_scale_shift_seq_stride]
    v_mov_b32 v[v_t1], OOB
    v_cmp_gt_u32 vcc, 16, v[v_lane]
    v_cndmask_b32 v[v_ksoff], v[v_t1], v[v_ksoff], vcc  ; ... the other lanes request nothing
    v_cndmask_b32 v[v_vsoff], v[v_t1], v[v_vsoff], vcc
    v_lshlrev_b32 v[v_pgat], 4, v[v_g]                  ; 4 * (4g): the source lane of key 4g + r, r in the offset
    ; sum(q) of the lane's row: S^T with A = ones (every key row sees the same sum)
    .irp c, 0, 1, 2, 3
        .if \c == 0
            mfma_16x16x32 v[v_s : v_s + 3], v[v_k : v_k + 3], v[v_q : v_q + 3], 0
        .elseif \c < NC
            mfma_16x16x32 v[v_s : v_s + 3], v[v_k : v_k + 3], v[v_q + 4*\c : v_q + 4*\c + 3], v[v_s : v_s + 3]
        .endif
    .endr
    s_nop 7                                             ; MFMA (4 passes) result -> VALU read: 8 wait states
    v_mov_b32 v[v_sumq], v[v_s]
.endif
    first_block_offsets
    s_lshl_b32 s[s_t0], s[s_wave], 5                    ; this wave's first tile: klo + 32 wave
    s_add_u32 s[s_t0], s[s_klo], s[s_t0]
    s_cmp_lt_i32 s[s_t0], s[s_khi]
    s_cbranch_scc0 L_epilogue
    fetch_page s_pg0, s_t0
    s_add_u32 s[s_w], s[s_t0], KV_BLOCK
    fetch_page s_pg1, s_w

; ============================================================================ main loop
; Tile i (buffer i % 2) is computed while tile i+1's K (issued at the top) and V (after the
; softmax) stream into the other buffer: at most KLOADS + SLOADS + VLOADS loads in flight
; (<= 56 < 64). A tile past the end gets empty descriptors (its loads read zeros and touch
; no memory) and page ids of the last valid key.
.macro tile_body p, last
.if \last == 0
    s_add_u32 s[s_tn], s[s_t0], TILE * W
    issue_k 1 - \p                                      ; the next tile's K (and pairs) stream meanwhile
    tile_regs \p
    s_waitcnt vmcnt(VLOADS + SLOADS + KLOADS)           ; in flight: V(i), pairs and K of i+1 -> wait for K(i), pairs(i)
.else
    tile_regs \p
    s_waitcnt vmcnt(VLOADS)                             ; in flight: V(i) (no next tile) -> wait for K(i), pairs(i)
.endif
.if FP8_TOKEN
    .irp kb, 0, 1                                       ; each lane's 8 keys' pairs, from the lanes that loaded them
        .irp r, 0, 1, 2, 3
            ds_bpermute_b32 v[v_ks + 4*\kb + \r], v[v_pgat], v[_kpr + \kb] offset: 4*\r
            ds_bpermute_b32 v[v_vs + 4*\kb + \r], v[v_pgat], v[_vpr + \kb] offset: 4*\r
        .endr
    .endr
.endif
.if FP8
    .irp kb, 0, 1
        .irp c, 0, 1, 2, 3
            .if \c < NC
                widen_k \kb, \c
            .endif
        .endr
    .endr
.endif
    .irp kb, 0, 1
        .irp c, 0, 1, 2, 3
            .if \c == 0
                mfma_16x16x32 v[v_s + 4*\kb : v_s + 4*\kb + 3], v[_kop + 4*\kb*NC : _kop + 4*\kb*NC + 3], v[v_q : v_q + 3], 0
            .elseif \c < NC
                mfma_16x16x32 v[v_s + 4*\kb : v_s + 4*\kb + 3], v[_kop + 4*(\kb*NC + \c) : _kop + 4*(\kb*NC + \c) + 3], v[v_q + 4*\c : v_q + 4*\c + 3], v[v_s + 4*\kb : v_s + 4*\kb + 3]
            .endif
        .endr
    .endr
    v_add_u32 v[v_key], s[s_t0], v[v_klo]               ; key(kb 0, r 0) - lo
    s_nop 6                                             ; MFMA (4 passes) result -> VALU read: 8 wait states

.if FP8_TOKEN
    s_waitcnt lgkmcnt(0)                                ; in flight: the pair permutes (and page ids of i+2) -> wait
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7                      ; S = s (q.k) + b sum(q); (s, b) = fp16 (low, high) half
        v_fma_mix_f32 v[v_t0], v[v_ks + \i], v[v_sumq], 0 op_sel:[1,0,0] op_sel_hi:[1,0,0]
        v_fma_mix_f32 v[v_s + \i], v[v_s + \i], v[v_ks + \i], v[v_t0] op_sel:[0,0,0] op_sel_hi:[0,1,0]
    .endr
.endif
    ; --- softmax: scale (SOFTCAP: and cap), mask, max over the 4 lane groups, P = exp2(S - m), l ---
.if SOFTCAP
    softcap_scores
.endif
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7
.if SOFTCAP == 0
        v_mul_f32 v[v_s + \i], s[s_scale_log2], v[v_s + \i]
.endif
        v_add_u32 v[v_t0], 16*(\i / 4) + \i % 4, v[v_key]
        v_cmp_gt_u32 vcc, v[v_span], v[v_t0]            ; lo <= key < lo + span
        v_cndmask_b32 v[v_s + \i], v[v_neginf], v[v_s + \i], vcc
    .endr
    v_max3_f32 v[v_t0], v[v_s], v[v_s + 1], v[v_s + 2]
    v_max3_f32 v[v_t0], v[v_t0], v[v_s + 3], v[v_s + 4]
    v_max3_f32 v[v_t0], v[v_t0], v[v_s + 5], v[v_s + 6]
    v_max3_f32 v[v_t0], v[v_t0], v[v_s + 7], v[v_m]
    group_reduce v_max_f32, v_t0
    v_sub_f32 v[v_t1], v[v_m], v[v_t0]
    v_mov_b32 v[v_m], v[v_t0]
    v_exp_f32 v[v_alpha], v[v_t1]                       ; exp2(m_old - m_new)
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7
        v_sub_f32 v[v_s + \i], v[v_s + \i], v[v_m]
    .endr
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7
        v_exp_f32 v[v_s + \i], v[v_s + \i]
    .endr
    v_mul_f32 v[v_l], v[v_l], v[v_alpha]
    s_nop 0                                             ; v_exp result -> VALU read: 1 wait state
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7
        v_add_f32 v[v_l], v[v_l], v[v_s + \i]
    .endr
.if FP8_TOKEN
    v_mul_f32 v[v_c], v[v_c], v[v_alpha]
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7                      ; c += p b', P = p s'
        v_fma_mix_f32 v[v_c], v[v_s + \i], v[v_vs + \i], v[v_c] op_sel:[0,1,0] op_sel_hi:[0,1,0]
        v_fma_mix_f32 v[v_s + \i], v[v_s + \i], v[v_vs + \i], 0 op_sel:[0,0,0] op_sel_hi:[0,1,0]
    .endr
.endif
    cvt_pk_f32 v[v_p], v[v_s], v[v_s + 1]
    cvt_pk_f32 v[v_p + 1], v[v_s + 2], v[v_s + 3]
    cvt_pk_f32 v[v_p + 2], v[v_s + 4], v[v_s + 5]
    cvt_pk_f32 v[v_p + 3], v[v_s + 6], v[v_s + 7]
    v_cmp_gt_f32 vcc, 1.0, v[v_alpha]                   ; some row's max grew: rescale O
    s_cbranch_vccz L_no_rescale\p\()_\last
    o_each v_mul_f32, v_alpha
L_no_rescale\p\()_\last:
.if \last == 0
    s_waitcnt vmcnt(SLOADS + KLOADS)                    ; in flight: V(i), pairs and K of i+1 -> wait for V(i)
    issue_v 1 - \p                                      ; the next tile's V streams during P.V
    tile_regs \p
.else
    s_waitcnt vmcnt(0)                                  ; in flight: V(i) -> wait
.endif

    ; --- O^T += V^T P^T: per 32-dim block, even and odd dims ---
    .irp db, 0, 1, 2, 3
        .if \db < NC
            .set _a, _kop + 8 * (\db % 2)             ; A operands over this tile's K (dead by now)
.if FP8
            widen_v \db, 0, _a
            widen_v \db, 1, _a
            s_nop 1                                     ; VALU write -> MFMA read (even A): 2 wait states
.else
            .irp k, 0, 1, 2, 3
                v_perm_b32 v[_a + \k], v[_vld + 8*\db + 2*\k + 1], v[_vld + 8*\db + 2*\k], s[s_sel_lo]
            .endr
            .irp k, 0, 1, 2, 3
                v_perm_b32 v[_a + 4 + \k], v[_vld + 8*\db + 2*\k + 1], v[_vld + 8*\db + 2*\k], s[s_sel_hi]
            .endr
.endif
            mfma_16x16x32 v[v_o + 8*\db : v_o + 8*\db + 3], v[_a : _a + 3], v[v_p : v_p + 3], v[v_o + 8*\db : v_o + 8*\db + 3]
            s_nop 0                                     ; VALU write -> MFMA read (odd A): 2 wait states
            mfma_16x16x32 v[v_o + 8*\db + 4 : v_o + 8*\db + 7], v[_a + 4 : _a + 7], v[v_p : v_p + 3], v[v_o + 8*\db + 4 : v_o + 8*\db + 7]
        .endif
    .endr
.endm

    s_mov_b32 s[s_tn], s[s_t0]
    issue_k 0, 1
    issue_v 0, 1
; The wave's last tile (no tile of its after it below khi) issues no loads for a next one:
; its own variant of the body, so no wave waits on loads of a tile past the end.
L_tile_even:
    s_add_u32 s[s_w], s[s_t0], TILE * W
    s_cmp_lt_i32 s[s_w], s[s_khi]
    s_cbranch_scc0 L_last_even
    tile_body 0, 0
    s_add_u32 s[s_t0], s[s_t0], TILE * W
    s_add_u32 s[s_w], s[s_t0], TILE * W
    s_cmp_lt_i32 s[s_w], s[s_khi]
    s_cbranch_scc0 L_last_odd
    tile_body 1, 0
    s_add_u32 s[s_t0], s[s_t0], TILE * W
    s_branch L_tile_even
L_last_even:
    tile_body 0, 1
    s_branch L_epilogue
L_last_odd:
    tile_body 1, 1

; ============================================================================ epilogue
L_epilogue:
    s_waitcnt vmcnt(0) lgkmcnt(0)                       ; in flight: page ids fetched past the end (a wave with no tile: Q) -> settle
    group_reduce v_add_f32, v_l
.if FP8_TOKEN
    group_reduce v_add_f32, v_c
.endif
    v_max_f32 v[v_t0], 1.0, v[v_l]
    v_rcp_f32 v[v_t0], v[v_t0]                          ; 1 / l (l >= 1 for a row with a score; O stays 0 without)
.if FP8_TENSOR
    s_nop 0                                             ; transcendental result -> VALU read: 1 wait state
    v_mul_f32 v[v_t0], s[s_vdesc], v[v_t0]              ; v_descale folded into 1 / l (<= v_descale)
.endif
    v_log_f32 v[v_t1], v[v_l]                           ; log2 l: -inf for a row with no key
    s_lshl_b32 s[s_t], s[s_tile], 4
    v_add_u32 v[v_t2], s[s_t], v[v_n]
    v_cmp_gt_u32 s[s_rowmask:s_rowmask+1], s[s_rows], v[v_t2]   ; row exists
    s_nop 0                                             ; transcendental result -> VALU read: 1 wait state
    v_add_f32 v[v_t1], v[v_m], v[v_t1]                  ; log2-sum-exp of the row (this split)
.if W == 1
    empty_rows_mask
    empty_rows_nan v_t0
.endif
    s_nop 4                                             ; last PV MFMA (4 passes) result -> VALU read
.if FP8_TOKEN
    o_each v_add_f32, v_c                               ; + sum p b' (every dim)
.endif
    o_each v_mul_f32, v_t0
.if W > 1
    combine_waves
.endif
    empty_rows_lse
    v_mov_b32 v[v_t3], OOB
    v_cmp_eq_u32 vcc, 0, v[v_g]                         ; one lane per row writes the LSE
    s_and_b64 vcc, vcc, s[s_rowmask:s_rowmask+1]
    s_cmp_eq_u32 s[s_partial], 0
    s_cbranch_scc1 L_final

    ; --- partial: ws_o[split, R, :] (f32) and ws_lse[split, R] (log2), R = (b seq_q + s) heads_q + h ---
    s_mul_i32 s[s_t], s[s_wg_z], s[s_seq_q]
    v_add_u32 v[v_t2], s[s_t], v[v_srow]
    v_mul_lo_u32 v[v_t2], v[v_t2], s[s_heads_q]
    v_add_u32 v[v_t2], v[v_t2], v[v_hq]                 ; R
    v_lshlrev_b32 v[v_t0], 2, v[v_t2]                   ; ws_lse offset
    v_cndmask_b32 v[v_t0], v[v_t3], v[v_t0], vcc
    v_lshlrev_b32 v[v_t2], D_LOG2 + 2, v[v_t2]  ; R * D * 4
    v_lshl_add_u32 v[v_t2], v[v_g], 5, v[v_t2]          ; + 32 g
    v_cndmask_b32 v[v_t2], v[v_t3], v[v_t2], s[s_rowmask:s_rowmask+1]
    add_mul_u64 s_ptr_wso, s_wg_x, s_ws_stride, s_tmp64
    add_mul_u64 s_ptr_wsl, s_wg_x, s_wsl_stride, s_tmp64
    s_mov_b32 s[s_t], RECORDS_ALL
    rsrc_raw s_rsrc_o, s_ptr_wso, s_t
    rsrc_raw s_rsrc_l, s_ptr_wsl, s_t
    .irp db, 0, 1, 2, 3
        .if \db < NC
            .irp r, 0, 1, 2, 3
                v_mov_b32 v[v_ost + 8*\db + 2*\r], v[v_o + 8*\db + \r]            ; dim 32db + 8g + 2r
                v_mov_b32 v[v_ost + 8*\db + 2*\r + 1], v[v_o + 8*\db + 4 + \r]    ; dim 32db + 8g + 2r + 1
            .endr
        .endif
    .endr
    .irp db, 0, 1, 2, 3
        .if \db < NC
            buffer_store_dwordx4 v[v_ost + 8*\db : v_ost + 8*\db + 3], v[v_t2], s[s_rsrc_o:s_rsrc_o+3], 0 offen offset: 128*\db
            buffer_store_dwordx4 v[v_ost + 8*\db + 4 : v_ost + 8*\db + 7], v[v_t2], s[s_rsrc_o:s_rsrc_o+3], 0 offen offset: 128*\db + 16
        .endif
    .endr
    buffer_store_dword v[v_t1], v[v_t0], s[s_rsrc_l:s_rsrc_l+3], 0 offen
    s_endpgm

    ; --- final: O[b, s, h, :] in q's dtype, LSE[b, h, s] (natural log) with store_lse ---
L_final:
    v_mul_lo_u32 v[v_t2], v[v_srow], s[s_o_seq_stride]
    v_mul_lo_u32 v[v_t0], v[v_hq], s[s_o_head_stride]
    v_add_u32 v[v_t2], v[v_t2], v[v_t0]
    v_lshl_add_u32 v[v_t2], v[v_g], 4, v[v_t2]          ; + 16 g bytes
    v_cndmask_b32 v[v_t2], v[v_t3], v[v_t2], s[s_rowmask:s_rowmask+1]
    v_mul_lo_u32 v[v_t0], v[v_hq], s[s_lse_head_stride]
    v_lshl_add_u32 v[v_t0], v[v_srow], 2, v[v_t0]
    v_cndmask_b32 v[v_t0], v[v_t3], v[v_t0], vcc
    add_mul_u64 s_ptr_o, s_wg_z, s_o_batch_stride, s_tmp64
    add_mul_u64 s_ptr_lse, s_wg_z, s_lse_batch_stride, s_tmp64
    s_mov_b32 s[s_t], RECORDS_ALL
    rsrc_raw s_rsrc_o, s_ptr_o, s_t
    rsrc_raw s_rsrc_l, s_ptr_lse, s_t
    .irp db, 0, 1, 2, 3
        .if \db < NC
            .irp r, 0, 1, 2, 3
                cvt_pk_f32 v[v_ost + 4*\db + \r], v[v_o + 8*\db + \r], v[v_o + 8*\db + 4 + \r]
            .endr
        .endif
    .endr
    .irp db, 0, 1, 2, 3
        .if \db < NC
            buffer_store_dwordx4 v[v_ost + 4*\db : v_ost + 4*\db + 3], v[v_t2], s[s_rsrc_o:s_rsrc_o+3], 0 offen offset: 64*\db
        .endif
    .endr
    s_cmp_eq_u32 s[s_store_lse], 0
    s_cbranch_scc1 L_end
    v_mul_f32 v[v_t1], LN2, v[v_t1]
    buffer_store_dword v[v_t1], v[v_t0], s[s_rsrc_l:s_rsrc_l+3], 0 offen
L_end:
    s_endpgm
