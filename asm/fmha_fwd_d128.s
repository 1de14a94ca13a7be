; fmha_fwd_d128 — flash-attention forward, head dim 128, gfx950 (CDNA4), wave64
;
;   O[b, i, h, :] = sum_j softmax_j(scale * Q[b,i,h,:] . K[b,j,h/r,:]) * V[b,j,h/r,:]
;   LSE[b, h, i]  = ln sum_j exp(scale * Q[b,i,h,:] . K[b,j,h/r,:])         (optional)
;
; r = heads_q / heads_k (MHA r = 1, GQA, MQA). Causal (FMHA_CAUSAL = 1): key j is visible
; to query i iff j <= i + (seq_k - seq_q) (bottom-right aligned, as flash-attention 2.1+);
; a query that sees no key gets O = 0 and LSE = -inf. Variants: FMHA_F16 selects
; fp16 (else bf16) for Q, K, V, O and the MFMAs; FMHA_CAUSAL the mask.
;
; Grid (cdiv(seq_q, 256), heads_q, batch); workgroup 512 = 8 waves. Workgroup x owns the
; 256-row Q tile t (causal: t = tiles - 1 - x, the longest rows first, so the short tiles
; fill the tail of the dispatch); wave w owns rows 32w..32w+31 of it.
;
; Kernarg (offsets k_* generated from kernels.yaml): q k v o: *bf16|*f16, lse: *f32;
; seq_q, seq_k; byte strides {q,k,v,o}_{seq,head,batch}_stride, lse_{head,batch}_stride;
; kv_head_magic = ceil(2^32 / r) (0 when r = 1: kv head = h * magic >> 32, exact for
; h, r < 2^16); scale_log2 = softmax_scale * log2(e); store_lse (0: lse is not touched).
; Every (b, h) slice must satisfy: rows 16-byte aligned, seq stride >= 256 bytes, and
; (seq - 1) * seq_stride + 256 < 2^31 (the ops layer checks this).
;
; --- Math (per wave, per 64-key tile j) -------------------------------------------------
; Q is loaded once, pre-scaled by scale*log2(e) in f32 and rounded back to bf16/fp16, so
; scores are in the log2 domain. MFMA v_mfma_f32_32x32x16 (8 passes) with A = K, B = Q
; gives S^T: lane l holds query q = l%32 and, in register r of key block kb, the key
;   key(kb, r, l) = 32kb + 8(r/4) + 4(l/32) + r%4                  (fact sheet §2 C layout)
; so the row max and row sum are mostly in-lane, plus one v_permlane32_swap.
;   m_new = max(m, rowmax(S));  lazy rescale: only when some lane has m_new - m > 8
;   (factor 256) are O and l rescaled by exp2(m - m_new) and m = m_new; otherwise the old
;   m stays and P <= 2^8 (f32 O/l have the room).   P = exp2(S - m), l += rowsum(P).
; P converted to bf16 is, without any lane movement, the B operand of O^T += V^T P^T:
; the MFMA k index of (key block kb, half t) holds keys 32kb + 16t + 4(l/32) + e%4 + 8(e/4),
; and V^T is read with ds_read_b64_tr_b16 in exactly that key order (fact sheet §3).
; O^T lives in 4 blocks of 16 f32 (lane q = l%32, d = 32db + 8(r/4) + 4(l/32) + r%4).
; End: l summed over the lane halves, O /= l, LSE = (m + log2 l) * ln 2.
; Masking (tail keys >= seq_k, causal) is per element with v_cmp/v_cndmask -> -inf, only
; on the tiles that need it; tiles entirely above the causal diagonal are never loaded
; (workgroup) or computed (wave). m starts at -1e30 (finite), so masked rows stay NaN-free.
;
; --- LDS map (64 KiB) ------------------------------------------------------------------
;   [LDS_K0, +16K) K tile, buffer 0   [LDS_K1, +16K) K tile, buffer 1
;   [LDS_V0, +16K) V tile, buffer 0   [LDS_V1, +16K) V tile, buffer 1
; A tile is 64 rows x 256 bytes, row-major, each row's 16-byte chunks XOR-swizzled:
;   K: chunk c of row r at  r*256 + 16*(c ^ (r % 16))
;   V: chunk c of row r at  r*256 + 16*(c ^ (2 * (r % 8)))
; K's swizzle makes every 16 lanes of a ds_read_b128 (16 keys, same chunk) hit 16
; different 16-byte bank groups; V's makes the 16 lanes of a ds_read_b64_tr_b16 (4 rows x
; 32 bytes) hit 16 different 8-byte slots. Tiles arrive by LDS DMA (buffer_load_dwordx4
; ... lds): one instruction fills 1 KiB = 4 rows (lane i -> row i/16, slot i%16, loading
; global chunk slot ^ swizzle(row)), so the global side stays coalesced. Wave w fills
; lines w and w+8 of K and of V: 4 DMA instructions per wave per tile.
;
; --- Pipeline (this version) ------------------------------------------------------------
; One s_barrier per KV tile; K and V double-buffered:
;   prologue: Q -> VGPRs (pre-scaled), DMA tile 0 -> buffer 0
;   tile j:   s_waitcnt vmcnt(0)  (my DMA of tile j landed)
;             s_barrier           (everyone's landed; everyone is done with tile j-1)
;             DMA tile j+1 -> buffer (j+1)%2   (flies during the whole of tile j)
;             GEMM0 S = K Q^T (16 MFMA, ds_read_b128 streamed 8 ahead), V reads start,
;             mask, softmax, GEMM1 O += V P (16 MFMA, ds_read_b64_tr_b16 streamed 4 ahead)
;   s_setprio 1 around the MFMA clusters: a wave issuing MFMAs wins the SIMD's issue
;   arbitration over the other wave of its SIMD, which is in its softmax phase.
;
; Differences from the seed's pipeline (../shared/seeds/fmha-fwd-d128-mi355x.txt), and why:
; - No software pipelining across tiles inside a wave yet (the seed overlaps GEMM0 of
;   tile j+1 and GEMM1 of tile j-1 with the softmax of tile j, two tiles per iteration in 8
;   clusters). Correctness came first; overlap here comes only from the two waves that
;   share each SIMD drifting apart within a tile.
; - No stagger of the two wave groups (the seed phase-shifts waves 4-7 by an extra
;   s_barrier): all 8 waves meet at one barrier per tile, which keeps the LDS buffer
;   lifetimes simple. The two groups still exist: waves w and w+4 share a SIMD and own
;   different rows.
; - Causal balance by ordering (longest Q tiles dispatched first) instead of pairing a
;   head tile with a tail tile in one workgroup: with 256-row tiles and grids of thousands
;   of workgroups the dispatcher balances as well, and every workgroup stays one Q tile.
; - LSE of a row with no visible key is -inf (torch.logsumexp), where flash-attention
;   writes +inf.
;
; --- Registers -----------------------------------------------------------------------
; 256 VGPRs (no AGPRs): 2 waves per SIMD, one workgroup per CU.

.if FMHA_F16
    .macro mfma_32x32x16 args:vararg
        v_mfma_f32_32x32x16_f16 \args
    .endm
    .macro cvt_pk_f32 args:vararg                     ; two f32 -> packed fp16, round to nearest even
        v_cvt_pk_f16_f32 \args
    .endm
.else
    .macro mfma_32x32x16 args:vararg
        v_mfma_f32_32x32x16_bf16 \args
    .endm
    .macro cvt_pk_f32 args:vararg                     ; two f32 -> packed bf16, round to nearest even
        v_cvt_pk_bf16_f32 \args
    .endm
.endif

.include "buffer_rsrc.inc"

; --- constants ---
.set Q_TILE, 256
.set KV_TILE, 64
.set ROW_BYTES, 256                    ; 128 bf16/fp16
.set TILE_BYTES, KV_TILE * ROW_BYTES   ; 16 KiB
.set LDS_K0, 0
.set LDS_K1, LDS_K0 + TILE_BYTES
.set LDS_V0, LDS_K1 + TILE_BYTES
.set LDS_V1, LDS_V0 + TILE_BYTES
.set LDS_NEEDED, LDS_V1 + TILE_BYTES
.set LAZY_THRESHOLD, 0x41000000        ; 8.0f: rescale only when the max grows by more (log2 units)
.set M_INIT, 0xf149f2ca                ; -1e30f: finite, so (-inf) - m never makes NaN
.set NEG_INF, 0xff800000
.set L_FLOOR, 0x0da24260               ; 1e-30f: 1/max(l, floor) keeps O = 0 for rows with no key
.set LN2, 0x3f317218                   ; ln(2)
.set PF_K, 8                           ; GEMM0: K operand reads kept in flight ahead of the MFMAs
.set PF_V, 4                           ; GEMM1: MFMAs whose V reads are in flight ahead

.if LDS_BYTES < LDS_NEEDED
    .error "fmha_fwd_d128: the manifest must give lds_bytes >= 65536"
.endif
.if WORKGROUP_SIZE_X != 512
    .error "fmha_fwd_d128: workgroup must be 512 work-items (8 waves of 32 Q rows)"
.endif

; --- SGPRs (s[0:1] kernarg, s2 = Q tile slot, s3 = head h, s4 = batch b set by the hardware) ---
.set s_wave, 5              ; wave index 0..7 in the workgroup
.set s_qtile, 6             ; Q tile index
.set s_q0, 7                ; first Q row of the tile
.set s_rsrc_q, 8            ; [8:11]  Q rows of this tile, this (b, h)
.set s_rsrc_k, 12           ; [12:15] K rows from the current tile on, this (b, kv head)
.set s_rsrc_v, 16           ; [16:19] V likewise
.set s_rsrc_o, 20           ; [20:23] O rows of this tile
.set s_rsrc_lse, 24         ; [24:27] LSE entries of this tile
.set s_ptr_q, 28            ; [28:29]
.set s_ptr_k, 30            ; [30:31]
.set s_ptr_v, 32            ; [32:33]
.set s_ptr_o, 34            ; [34:35]
.set s_ptr_lse, 36          ; [36:37]
.set s_seq_q, 38
.set s_seq_k, 39
.set s_q_ss, 40             ; byte strides: seq, head, batch
.set s_q_hs, 41
.set s_q_bs, 42
.set s_k_ss, 43
.set s_k_hs, 44
.set s_k_bs, 45
.set s_v_ss, 46
.set s_v_hs, 47
.set s_v_bs, 48
.set s_o_ss, 49
.set s_o_hs, 50
.set s_o_bs, 51
.set s_lse_hs, 52
.set s_lse_bs, 53
.set s_kv_magic, 54
.set s_scale_log2, 55
.set s_store_lse, 56
.set s_hk, 57               ; kv head
.set s_ntiles, 58           ; KV tiles the workgroup loads
.set s_wtiles, 59           ; KV tiles this wave computes (a prefix of them)
.set s_maskfrom, 60         ; first KV tile this wave must mask (signed)
.set s_j, 61                ; current KV tile
.set s_tile_start, 62       ; 64 * j
.set s_kstep, 63            ; 64 * k seq stride: descriptor step per tile
.set s_vstep, 64
.set s_m0k, 65              ; 1024 * wave: this wave's first DMA line in a tile buffer
.set s_tmp64, 66            ; [66:67]
.set s_t0, 68
.set s_t1, 69
.set s_t2, 70
.set s_t3, 71
.set s_cmp0, 72             ; [72:73] three masks rotated by the causal/tail masking
.set s_cmp1, 74             ; [74:75]
.set s_cmp2, 76             ; [76:77]
.set s_exec_save, 78        ; [78:79]

; --- VGPRs ---
.set v_lane, 1              ; l = work-item % 64
.set v_t0, 2                ; [2:9] temporaries
.set v_t1, 3
.set v_t2, 4
.set v_t3, 5
.set v_t4, 6
.set v_t5, 7
.set v_t6, 8
.set v_t7, 9
.set v_kaddr, 10            ; [10:17] LDS byte address of K operand chunk 2s + l/32 of key l%32, s = 0..7
.set v_vaddr, 18            ; [18:21] LDS byte address of this lane's ds_read_b64_tr_b16 for d block 0..3
.set v_dma_k0, 22           ; DMA voffsets: K line w, K line w+8, V line w, V line w+8
.set v_dma_k1, 23
.set v_dma_v0, 24
.set v_dma_v1, 25
.set v_qoff, 26             ; byte offset of this lane's Q row (32w + l%32) and chunk l/32
.set v_lim4, 27             ; (first key this lane's query may not see) - 4 * (l/32)
.set v_m, 28                ; [28:29] running max (log2 units); v_m+1 = v_mnew (pair for pk ops)
.set v_mnew, 29
.set v_l, 30                ; [30:31] running row sum, two partial sums
.set v_corr, 32             ; [32:33] rescale factor (pk ops broadcast v_corr)
.set v_neginf, 34
.set v_mask_t, 35
.set v_diff, 36
.set v_lq, 37               ; l % 32
.set v_lh, 38               ; l / 32
.set v_p, 48                ; [48:63]   P (bf16/fp16 pairs): 4 k-steps x 4 VGPRs
.set v_op, 64               ; [64:127]  MFMA A operands: K (GEMM0) then V^T (GEMM1); O out (epilogue)
.set v_o, 128               ; [128:191] O^T accumulators: 4 d blocks x 16 f32
.set v_s, 192               ; [192:223] S^T / P f32: 2 key blocks x 16
.set v_q, 224               ; [224:255] Q (B operand of GEMM0): 8 d steps x 4 VGPRs

; ============================================================================ macros

; GEMM0 operand i (key block i/8, d step i%8) from K buffer \buf
.macro k_read i, buf
    ds_read_b128 v[v_op + 4*(\i) : v_op + 4*(\i) + 3], v[v_kaddr + (\i) % 8] offset: LDS_K0 + (\buf) * TILE_BYTES + 8192 * ((\i) / 8)
.endm

; GEMM0 MFMA i: S^T[key block i/8] += K[keys, d step i%8] * Q^T[d step i%8, queries]
.macro qk_mfma i
    .if (\i) % 8 == 0
        mfma_32x32x16 v[v_s + 16*((\i)/8) : v_s + 16*((\i)/8) + 15], v[v_op + 4*(\i) : v_op + 4*(\i) + 3], v[v_q + 4*((\i)%8) : v_q + 4*((\i)%8) + 3], 0
    .else
        mfma_32x32x16 v[v_s + 16*((\i)/8) : v_s + 16*((\i)/8) + 15], v[v_op + 4*(\i) : v_op + 4*(\i) + 3], v[v_q + 4*((\i)%8) : v_q + 4*((\i)%8) + 3], v[v_s + 16*((\i)/8) : v_s + 16*((\i)/8) + 15]
    .endif
.endm

; GEMM1 operand i (d block i/4, k step i%4): keys 16ks + 4(l/32) + {0..3} and +8 of column
; d = 32 db + l%32, by two transposing reads from V buffer \buf
.macro v_read i, buf
    ds_read_b64_tr_b16 v[v_op + 4*(\i) : v_op + 4*(\i) + 1], v[v_vaddr + (\i) / 4] offset: LDS_V0 + (\buf) * TILE_BYTES + 4096 * ((\i) % 4)
    ds_read_b64_tr_b16 v[v_op + 4*(\i) + 2 : v_op + 4*(\i) + 3], v[v_vaddr + (\i) / 4] offset: LDS_V0 + (\buf) * TILE_BYTES + 4096 * ((\i) % 4) + 2048
.endm

; GEMM1 MFMA i: O^T[d block i/4] += V^T[d block, k step i%4] * P^T[k step, queries]
.macro pv_mfma i
    mfma_32x32x16 v[v_o + 16*((\i)/4) : v_o + 16*((\i)/4) + 15], v[v_op + 4*(\i) : v_op + 4*(\i) + 3], v[v_p + 4*((\i)%4) : v_p + 4*((\i)%4) + 3], v[v_o + 16*((\i)/4) : v_o + 16*((\i)/4) + 15]
.endm

; LDS DMA of KV tile (descriptors at that tile) into buffer \buf: lines w and w+8 of K and V
.macro dma_tile buf
    s_add_u32 m0, s[s_m0k], LDS_K0 + (\buf) * TILE_BYTES
    buffer_load_dwordx4 v[v_dma_k0], s[s_rsrc_k:s_rsrc_k+3], 0 offen lds
    s_add_u32 m0, s[s_m0k], LDS_K0 + (\buf) * TILE_BYTES + 8192
    buffer_load_dwordx4 v[v_dma_k1], s[s_rsrc_k:s_rsrc_k+3], 0 offen lds
    s_add_u32 m0, s[s_m0k], LDS_V0 + (\buf) * TILE_BYTES
    buffer_load_dwordx4 v[v_dma_v0], s[s_rsrc_v:s_rsrc_v+3], 0 offen lds
    s_add_u32 m0, s[s_m0k], LDS_V0 + (\buf) * TILE_BYTES + 8192
    buffer_load_dwordx4 v[v_dma_v1], s[s_rsrc_v:s_rsrc_v+3], 0 offen lds
.endm

; mask element e of S^T (key block e/16, register e%16) against v_mask_t, writing -inf
; where the key is not visible; compare into mask pair \pair
.macro mask_cmp e, pair
    v_cmp_lt_i32_e64 s[\pair:\pair+1], 32*((\e)/16) + 8*(((\e)%16)/4) + (\e)%4, v[v_mask_t]
.endm
.macro mask_sel e, pair
    v_cndmask_b32_e64 v[v_s + (\e)], v[v_neginf], v[v_s + (\e)], s[\pair:\pair+1]
.endm

; One KV tile, the LDS buffers of parity \buf: see the pipeline in the header.
.macro kv_tile buf
    s_waitcnt vmcnt(0)                  ; in flight: my 4 DMA lines of tile j -> wait for them
    s_barrier                           ; every wave's lines of tile j landed; every wave finished tile j-1,
                                        ; so buffer 1-\buf (tile j-1) may be overwritten
    ; --- prefetch tile j+1 into the other buffer ---
    s_add_u32 s[s_t0], s[s_j], 1
    s_cmp_lt_u32 s[s_t0], s[s_ntiles]
    s_cbranch_scc0 L_no_prefetch_\buf
    rsrc_advance s_rsrc_k, s_kstep
    rsrc_advance s_rsrc_v, s_vstep
    dma_tile (1 - \buf)
L_no_prefetch_\buf:
    s_cmp_lt_u32 s[s_j], s[s_wtiles]
    s_cbranch_scc0 L_tile_done_\buf     ; above the causal diagonal (or no valid row): nothing to compute
    s_lshl_b32 s[s_tile_start], s[s_j], 6

    ; --- GEMM0: S^T = K Q^T, K reads streamed PF_K ahead ---
    .set _i, 0
    .rept PF_K
        k_read _i, \buf
        .set _i, _i + 1
    .endr
    s_setprio 1                         ; MFMA cluster: win issue over the SIMD's other wave (in softmax)
    .set _i, 0
    .rept 16
        .set _issued, _i + PF_K
        .if _issued > 16
            .set _issued, 16
        .endif
        s_waitcnt lgkmcnt(_issued - _i - 1)    ; in flight: K reads _i.._issued-1 -> wait for read _i
        qk_mfma _i
        .if _i + PF_K < 16
            k_read (_i + PF_K), \buf
        .endif
        .set _i, _i + 1
    .endr
    s_setprio 0
    ; the first PF_V V^T operands load while the softmax runs (K operands are consumed)
    .set _i, 0
    .rept PF_V
        v_read _i, \buf
        .set _i, _i + 1
    .endr
    s_nop 7                             ; S^T was written by the last MFMA: 12 wait states before a VALU reads it
    s_nop 1

    ; --- mask: tail keys and the causal diagonal ---
    s_cmp_ge_i32 s[s_j], s[s_maskfrom]
    s_cbranch_scc0 L_no_mask_\buf
    v_sub_u32 v[v_mask_t], v[v_lim4], s[s_tile_start]     ; key (in tile) < v_mask_t - (4(l/32) folded in) is visible
    ; compares rotate over 3 SGPR pairs so each v_cndmask reads its mask >= 2 wait states
    ; after the v_cmp wrote it (VALU SGPR write -> VALU read)
    mask_cmp 0, s_cmp0
    mask_cmp 1, s_cmp1
    mask_cmp 2, s_cmp2
    .set _e, 0
    .rept 32
        .if _e % 3 == 0
            mask_sel _e, s_cmp0
        .elseif _e % 3 == 1
            mask_sel _e, s_cmp1
        .else
            mask_sel _e, s_cmp2
        .endif
        .if _e + 3 < 32
            .if _e % 3 == 0
                mask_cmp (_e + 3), s_cmp0
            .elseif _e % 3 == 1
                mask_cmp (_e + 3), s_cmp1
            .else
                mask_cmp (_e + 3), s_cmp2
            .endif
        .endif
        .set _e, _e + 1
    .endr
L_no_mask_\buf:

    ; --- softmax: row max over the 32 in-lane keys, then across the lane halves ---
    v_max3_f32 v[v_t0], v[v_s + 0], v[v_s + 1], v[v_s + 2]
    .set _r, 3
    .rept 14
        v_max3_f32 v[v_t0], v[v_t0], v[v_s + _r], v[v_s + _r + 1]
        .set _r, _r + 2
    .endr
    v_max_f32 v[v_t0], v[v_t0], v[v_s + 31]
    v_mov_b32 v[v_t1], v[v_t0]
    s_nop 1                             ; VALU write -> v_permlane32_swap read: 2 wait states
    v_permlane32_swap_b32 v[v_t0], v[v_t1]  ; t0 = low half's max in both halves, t1 = high half's
    v_max_f32 v[v_t0], v[v_t0], v[v_t1]
    v_max_f32 v[v_mnew], v[v_m], v[v_t0]
    v_sub_f32 v[v_diff], v[v_mnew], v[v_m]
    v_cmp_lt_f32 vcc, LAZY_THRESHOLD, v[v_diff]
    s_cbranch_vccz L_no_rescale_\buf    ; every row's max grew by <= 8: keep m (P stays <= 256)
    ; rescale O and l by exp2(m - m_new); O was last written by GEMM1 of an earlier tile,
    ; far more than 12 wait states ago
    v_sub_f32 v[v_corr], v[v_m], v[v_mnew]
    v_exp_f32 v[v_corr], v[v_corr]
    v_mov_b32 v[v_m], v[v_mnew]
    s_nop 0                             ; transcendental result -> VALU read: 1 wait state
    v_pk_mul_f32 v[v_l:v_l+1], v[v_l:v_l+1], v[v_corr:v_corr+1] op_sel_hi:[1,0]
    .set _r, 0
    .rept 32
        v_pk_mul_f32 v[v_o + _r : v_o + _r + 1], v[v_o + _r : v_o + _r + 1], v[v_corr:v_corr+1] op_sel_hi:[1,0]
        .set _r, _r + 2
    .endr
L_no_rescale_\buf:
    ; P = exp2(S - m)
    .set _r, 0
    .rept 16
        v_pk_add_f32 v[v_s + _r : v_s + _r + 1], v[v_s + _r : v_s + _r + 1], v[v_m:v_m+1] op_sel_hi:[1,0] neg_lo:[0,1] neg_hi:[0,1]
        .set _r, _r + 2
    .endr
    .set _r, 0
    .rept 32
        v_exp_f32 v[v_s + _r], v[v_s + _r]
        .set _r, _r + 1
    .endr
    ; l += row sum (two partial sums per lane; the halves are combined once, at the end)
    .set _r, 0
    .rept 16
        v_pk_add_f32 v[v_l:v_l+1], v[v_l:v_l+1], v[v_s + _r : v_s + _r + 1]
        .set _r, _r + 2
    .endr
    ; P to bf16/fp16: register pairs of S^T are already the B operand layout of GEMM1
    .set _r, 0
    .rept 16
        cvt_pk_f32 v[v_p + _r], v[v_s + 2*_r], v[v_s + 2*_r + 1]
        .set _r, _r + 1
    .endr

    ; --- GEMM1: O^T += V^T P^T, V reads streamed PF_V MFMAs ahead ---
    s_setprio 1                         ; MFMA cluster
    .set _i, 0
    .rept 16
        .set _issued, _i + PF_V
        .if _issued > 16
            .set _issued, 16
        .endif
        s_waitcnt lgkmcnt(2 * (_issued - _i - 1))   ; in flight: V reads of MFMAs _i.._issued-1 -> wait for _i's two
        pv_mfma _i
        .if _i + PF_V < 16
            v_read (_i + PF_V), \buf
        .endif
        .set _i, _i + 1
    .endr
    s_setprio 0
L_tile_done_\buf:
.endm

; ============================================================================ prologue
    s_load_dwordx2 s[s_ptr_q:s_ptr_q+1], s[s_kernarg:s_kernarg+1], k_q
    s_load_dwordx2 s[s_ptr_k:s_ptr_k+1], s[s_kernarg:s_kernarg+1], k_k
    s_load_dwordx2 s[s_ptr_v:s_ptr_v+1], s[s_kernarg:s_kernarg+1], k_v
    s_load_dwordx2 s[s_ptr_o:s_ptr_o+1], s[s_kernarg:s_kernarg+1], k_o
    s_load_dwordx2 s[s_ptr_lse:s_ptr_lse+1], s[s_kernarg:s_kernarg+1], k_lse
    s_load_dword s[s_seq_q], s[s_kernarg:s_kernarg+1], k_seq_q
    s_load_dword s[s_seq_k], s[s_kernarg:s_kernarg+1], k_seq_k
    s_load_dword s[s_q_ss], s[s_kernarg:s_kernarg+1], k_q_seq_stride
    s_load_dword s[s_q_hs], s[s_kernarg:s_kernarg+1], k_q_head_stride
    s_load_dword s[s_q_bs], s[s_kernarg:s_kernarg+1], k_q_batch_stride
    s_load_dword s[s_k_ss], s[s_kernarg:s_kernarg+1], k_k_seq_stride
    s_load_dword s[s_k_hs], s[s_kernarg:s_kernarg+1], k_k_head_stride
    s_load_dword s[s_k_bs], s[s_kernarg:s_kernarg+1], k_k_batch_stride
    s_load_dword s[s_v_ss], s[s_kernarg:s_kernarg+1], k_v_seq_stride
    s_load_dword s[s_v_hs], s[s_kernarg:s_kernarg+1], k_v_head_stride
    s_load_dword s[s_v_bs], s[s_kernarg:s_kernarg+1], k_v_batch_stride
    s_load_dword s[s_o_ss], s[s_kernarg:s_kernarg+1], k_o_seq_stride
    s_load_dword s[s_o_hs], s[s_kernarg:s_kernarg+1], k_o_head_stride
    s_load_dword s[s_o_bs], s[s_kernarg:s_kernarg+1], k_o_batch_stride
    s_load_dword s[s_lse_hs], s[s_kernarg:s_kernarg+1], k_lse_head_stride
    s_load_dword s[s_lse_bs], s[s_kernarg:s_kernarg+1], k_lse_batch_stride
    s_load_dword s[s_kv_magic], s[s_kernarg:s_kernarg+1], k_kv_head_magic
    s_load_dword s[s_scale_log2], s[s_kernarg:s_kernarg+1], k_scale_log2
    s_load_dword s[s_store_lse], s[s_kernarg:s_kernarg+1], k_store_lse
    v_and_b32 v[v_lane], 63, v[v_workitem]
    v_bfe_u32 v[v_t0], v[v_workitem], 6, 4              ; wave index = work-item x / 64
    v_and_b32 v[v_lq], 31, v[v_lane]
    v_lshrrev_b32 v[v_lh], 5, v[v_lane]
    v_readfirstlane_b32 s[s_wave], v[v_t0]              ; (>= 1 wait state after v_t0 was written)
    s_waitcnt lgkmcnt(0)                                ; in flight: all kernarg loads -> wait for all

    ; --- this workgroup's Q tile and kv head ---
.if FMHA_CAUSAL
    s_add_u32 s[s_t0], s[s_seq_q], Q_TILE - 1
    s_lshr_b32 s[s_t0], s[s_t0], 8                      ; Q tiles
    s_sub_u32 s[s_t0], s[s_t0], 1
    s_sub_u32 s[s_qtile], s[s_t0], s[s_wg_x]            ; longest rows first
.else
    s_mov_b32 s[s_qtile], s[s_wg_x]
.endif
    s_lshl_b32 s[s_q0], s[s_qtile], 8
    s_mul_hi_u32 s[s_hk], s[s_wg_y], s[s_kv_magic]      ; h / r
    s_cmp_eq_u32 s[s_kv_magic], 0
    s_cselect_b32 s[s_hk], s[s_wg_y], s[s_hk]           ; r = 1

    ; --- buffer descriptors ---
    add_mul_u64 s_ptr_q, s_wg_z, s_q_bs, s_tmp64        ; Q + b*bs + h*hs + q0*ss
    add_mul_u64 s_ptr_q, s_wg_y, s_q_hs, s_tmp64
    add_mul_u64 s_ptr_q, s_q0, s_q_ss, s_tmp64
    s_sub_u32 s[s_t0], s[s_seq_q], s[s_q0]
    s_sub_u32 s[s_t0], s[s_t0], 1
    s_mul_i32 s[s_t0], s[s_t0], s[s_q_ss]
    s_add_u32 s[s_t1], s[s_t0], ROW_BYTES               ; (seq_q - q0 - 1) * ss + 256: rows >= seq_q read 0
    rsrc_raw s_rsrc_q, s_ptr_q, s_t1
    add_mul_u64 s_ptr_o, s_wg_z, s_o_bs, s_tmp64
    add_mul_u64 s_ptr_o, s_wg_y, s_o_hs, s_tmp64
    add_mul_u64 s_ptr_o, s_q0, s_o_ss, s_tmp64
    s_sub_u32 s[s_t0], s[s_seq_q], s[s_q0]
    s_sub_u32 s[s_t0], s[s_t0], 1
    s_mul_i32 s[s_t0], s[s_t0], s[s_o_ss]
    s_add_u32 s[s_t1], s[s_t0], ROW_BYTES               ; stores of rows >= seq_q are dropped
    rsrc_raw s_rsrc_o, s_ptr_o, s_t1
    add_mul_u64 s_ptr_lse, s_wg_z, s_lse_bs, s_tmp64
    add_mul_u64 s_ptr_lse, s_wg_y, s_lse_hs, s_tmp64
    s_lshl_b32 s[s_t0], s[s_q0], 2
    s_add_u32 s[s_ptr_lse], s[s_ptr_lse], s[s_t0]
    s_addc_u32 s[s_ptr_lse+1], s[s_ptr_lse+1], 0
    s_sub_u32 s[s_t0], s[s_seq_q], s[s_q0]
    s_lshl_b32 s[s_t1], s[s_t0], 2                      ; (seq_q - q0) * 4
    rsrc_raw s_rsrc_lse, s_ptr_lse, s_t1
    s_sub_u32 s[s_t2], s[s_seq_k], 1                    ; K, V: (seq_k - 1) * ss + 256: keys >= seq_k read 0
    add_mul_u64 s_ptr_k, s_wg_z, s_k_bs, s_tmp64
    add_mul_u64 s_ptr_k, s_hk, s_k_hs, s_tmp64
    s_mul_i32 s[s_t0], s[s_t2], s[s_k_ss]
    s_add_u32 s[s_t1], s[s_t0], ROW_BYTES
    rsrc_raw s_rsrc_k, s_ptr_k, s_t1
    add_mul_u64 s_ptr_v, s_wg_z, s_v_bs, s_tmp64
    add_mul_u64 s_ptr_v, s_hk, s_v_hs, s_tmp64
    s_mul_i32 s[s_t0], s[s_t2], s[s_v_ss]
    s_add_u32 s[s_t1], s[s_t0], ROW_BYTES
    rsrc_raw s_rsrc_v, s_ptr_v, s_t1
    s_lshl_b32 s[s_kstep], s[s_k_ss], 6
    s_lshl_b32 s[s_vstep], s[s_v_ss], 6
    s_lshl_b32 s[s_m0k], s[s_wave], 10

    ; --- Q: 8 loads of 16 bytes: row q0 + 32w + l%32, d chunk 2s + l/32 ---
    s_lshl_b32 s[s_t0], s[s_wave], 5                    ; 32w
    v_add_u32 v[v_t0], s[s_t0], v[v_lq]
    v_mul_lo_u32 v[v_t0], v[v_t0], s[s_q_ss]
    v_lshl_add_u32 v[v_qoff], v[v_lh], 4, v[v_t0]
    .set _s, 0
    .rept 8
        buffer_load_dwordx4 v[v_q + 4*_s : v_q + 4*_s + 3], v[v_qoff], s[s_rsrc_q:s_rsrc_q+3], 0 offen offset: 32*_s
        .set _s, _s + 1
    .endr

    ; --- tile counts (keys visible to query i: j < lim(i) = min(seq_k, i + seq_k - seq_q + 1) if causal) ---
    s_add_u32 s[s_t0], s[s_q0], s[s_t0]                 ; q_first = q0 + 32w
    s_add_u32 s[s_t1], s[s_q0], Q_TILE - 1
    s_sub_u32 s[s_t3], s[s_seq_q], 1
    s_min_u32 s[s_t1], s[s_t1], s[s_t3]                 ; last valid row of the tile
.if FMHA_CAUSAL
    s_sub_u32 s[s_t2], s[s_seq_k], s[s_seq_q]
    s_add_u32 s[s_t2], s[s_t2], 1                       ; off1 = seq_k - seq_q + 1 (signed)
    s_add_u32 s[s_t1], s[s_t1], s[s_t2]
    s_min_i32 s[s_t1], s[s_t1], s[s_seq_k]
    s_add_u32 s[s_t1], s[s_t1], KV_TILE - 1
    s_ashr_i32 s[s_t1], s[s_t1], 6
    s_max_i32 s[s_ntiles], s[s_t1], 0                   ; the workgroup's KV tiles
    s_add_u32 s[s_t1], s[s_t0], s[s_t2]
    s_min_i32 s[s_t1], s[s_t1], s[s_seq_k]              ; lim(q_first)
    s_ashr_i32 s[s_maskfrom], s[s_t1], 6                ; tiles from here on hold a key some row may not see
    s_add_u32 s[s_t1], s[s_t0], 31
    s_min_u32 s[s_t1], s[s_t1], s[s_t3]                 ; q_last of this wave
    s_add_u32 s[s_t1], s[s_t1], s[s_t2]
    s_min_i32 s[s_t1], s[s_t1], s[s_seq_k]              ; lim(q_last)
    s_add_u32 s[s_t1], s[s_t1], KV_TILE - 1
    s_ashr_i32 s[s_t1], s[s_t1], 6
    s_max_i32 s[s_wtiles], s[s_t1], 0
.else
    s_add_u32 s[s_t1], s[s_seq_k], KV_TILE - 1
    s_lshr_b32 s[s_ntiles], s[s_t1], 6
    s_mov_b32 s[s_wtiles], s[s_ntiles]
    s_lshr_b32 s[s_maskfrom], s[s_seq_k], 6             ; only a partial last tile is masked
.endif
    s_cmp_ge_u32 s[s_t0], s[s_seq_q]
    s_cselect_b32 s[s_wtiles], 0, s[s_wtiles]           ; a wave past the last row computes nothing

    ; --- per-lane mask limit: v_lim4 = lim(q) - 4(l/32) ---
    v_add_u32 v[v_t0], s[s_t0], v[v_lq]                 ; q = q0 + 32w + l%32
.if FMHA_CAUSAL
    v_add_u32 v[v_t0], s[s_t2], v[v_t0]
    v_min_i32 v[v_t0], s[s_seq_k], v[v_t0]
.else
    v_mov_b32 v[v_t0], s[s_seq_k]
.endif
    v_lshlrev_b32 v[v_t1], 2, v[v_lh]
    v_sub_u32 v[v_lim4], v[v_t0], v[v_t1]

    ; --- LDS read addresses ---
    ; K: key l%32 (+32 kb), chunk c = 2s + l/32 at key*256 + 16*(c ^ key%16)
    v_lshlrev_b32 v[v_t1], 8, v[v_lq]
    v_and_b32 v[v_t2], 15, v[v_lq]
    .set _s, 0
    .rept 8
        v_add_u32 v[v_t3], 2*_s, v[v_lh]
        v_xor_b32 v[v_t3], v[v_t3], v[v_t2]
        v_lshl_add_u32 v[v_kaddr + _s], v[v_t3], 4, v[v_t1]
        .set _s, _s + 1
    .endr
    ; V (ds_read_b64_tr_b16): lane 16bb + 4j + m reads 8 bytes of row rr = 4(bb/2) + j
    ; (+16ks +8x by offset) at d = 32db + 16(bb%2) + 4m: chunk c = 4db + 2(bb%2) + m/2,
    ; address rr*256 + 16*(c ^ 2rr) + 8(m%2)
    v_bfe_u32 v[v_t0], v[v_lane], 2, 2                  ; j
    v_lshl_add_u32 v[v_t0], v[v_lh], 2, v[v_t0]         ; rr = 4(bb/2) + j   (bb/2 = l/32)
    v_bfe_u32 v[v_t1], v[v_lane], 4, 1                  ; bb % 2
    v_bfe_u32 v[v_t2], v[v_lane], 1, 1                  ; m / 2
    v_lshl_add_u32 v[v_t1], v[v_t1], 1, v[v_t2]         ; 2(bb%2) + m/2
    v_lshlrev_b32 v[v_t2], 1, v[v_t0]                   ; 2rr
    v_and_b32 v[v_t3], 1, v[v_lane]                     ; m % 2
    v_lshlrev_b32 v[v_t3], 3, v[v_t3]
    v_lshl_add_u32 v[v_t3], v[v_t0], 8, v[v_t3]         ; rr*256 + 8(m%2)
    .set _d, 0
    .rept 4
        v_add_u32 v[v_t4], 4*_d, v[v_t1]
        v_xor_b32 v[v_t4], v[v_t4], v[v_t2]
        v_lshl_add_u32 v[v_vaddr + _d], v[v_t4], 4, v[v_t3]
        .set _d, _d + 1
    .endr

    ; --- DMA voffsets: lane i fills row 4L + i/16 (L = w, w+8), slot i%16 with chunk slot ^ swizzle(row) ---
    v_lshrrev_b32 v[v_t0], 4, v[v_lane]                 ; i/16
    v_and_b32 v[v_t1], 15, v[v_lane]                    ; slot
    s_lshl_b32 s[s_t1], s[s_wave], 2                    ; 4w: first row of line w
    v_add_u32 v[v_t2], s[s_t1], v[v_t0]                 ; row in tile (line w)
    s_and_b32 s[s_t3], s[s_t1], 15                      ; 4(w%4)
    v_add_u32 v[v_t3], s[s_t3], v[v_t0]                 ; row % 16 (same for line w+8)
    v_xor_b32 v[v_t3], v[v_t3], v[v_t1]                 ; K chunk
    v_mul_lo_u32 v[v_t4], v[v_t2], s[s_k_ss]
    v_lshl_add_u32 v[v_dma_k0], v[v_t3], 4, v[v_t4]
    s_lshl_b32 s[s_t3], s[s_k_ss], 5                    ; line w+8 is 32 rows further
    v_add_u32 v[v_dma_k1], s[s_t3], v[v_dma_k0]
    s_and_b32 s[s_t3], s[s_t1], 4                       ; 4(w%2)
    v_add_u32 v[v_t3], s[s_t3], v[v_t0]                 ; row % 8
    v_lshlrev_b32 v[v_t3], 1, v[v_t3]
    v_xor_b32 v[v_t3], v[v_t3], v[v_t1]                 ; V chunk
    v_mul_lo_u32 v[v_t4], v[v_t2], s[s_v_ss]
    v_lshl_add_u32 v[v_dma_v0], v[v_t3], 4, v[v_t4]
    s_lshl_b32 s[s_t3], s[s_v_ss], 5
    v_add_u32 v[v_dma_v1], s[s_t3], v[v_dma_v0]

    ; --- state: O = 0, m = -1e30, l = 0 ---
    .set _r, 0
    .rept 32
        v_mov_b64 v[v_o + _r : v_o + _r + 1], 0
        .set _r, _r + 2
    .endr
    v_mov_b32 v[v_m], M_INIT
    v_mov_b64 v[v_l:v_l+1], 0
    v_mov_b32 v[v_neginf], NEG_INF

    ; --- first KV tile in flight, then Q pre-scaled by scale*log2(e) ---
    s_mov_b32 s[s_j], 0
    s_cmp_eq_u32 s[s_ntiles], 0
    s_cbranch_scc1 L_q_scale
    dma_tile 0
L_q_scale:
    s_waitcnt vmcnt(0)                                  ; in flight: 8 Q loads (+ tile 0's 4 DMA lines) -> wait for all
    .set _r, 0
    .rept 32
.if FMHA_F16
        v_cvt_f32_f16 v[v_t0], v[v_q + _r]
        v_lshrrev_b32 v[v_t1], 16, v[v_q + _r]
        v_cvt_f32_f16 v[v_t1], v[v_t1]
.else
        v_lshlrev_b32 v[v_t0], 16, v[v_q + _r]
        v_and_b32 v[v_t1], 0xffff0000, v[v_q + _r]
.endif
        v_mul_f32 v[v_t0], s[s_scale_log2], v[v_t0]
        v_mul_f32 v[v_t1], s[s_scale_log2], v[v_t1]
        cvt_pk_f32 v[v_q + _r], v[v_t0], v[v_t1]
        .set _r, _r + 1
    .endr
    s_cmp_eq_u32 s[s_ntiles], 0
    s_cbranch_scc1 L_epilogue

; ============================================================================ main loop
L_loop:
    kv_tile 0
    s_add_u32 s[s_j], s[s_j], 1
    s_cmp_lt_u32 s[s_j], s[s_ntiles]
    s_cbranch_scc0 L_epilogue
    kv_tile 1
    s_add_u32 s[s_j], s[s_j], 1
    s_cmp_lt_u32 s[s_j], s[s_ntiles]
    s_cbranch_scc1 L_loop

; ============================================================================ epilogue
L_epilogue:
    s_nop 7                             ; O^T was written by the last MFMA: 12 wait states before VALU reads
    s_nop 3
    ; l: partial sums, then the two lane halves
    v_add_f32 v[v_t0], v[v_l], v[v_l + 1]
    v_mov_b32 v[v_t1], v[v_t0]
    s_nop 1                             ; VALU write -> v_permlane32_swap read: 2 wait states
    v_permlane32_swap_b32 v[v_t0], v[v_t1]
    v_add_f32 v[v_t0], v[v_t0], v[v_t1] ; l of the row, in both halves
    v_max_f32 v[v_t1], L_FLOOR, v[v_t0]
    v_rcp_f32 v[v_corr], v[v_t1]
    v_log_f32 v[v_t2], v[v_t0]          ; log2 l (-inf for a row that saw no key)
    s_nop 0                             ; transcendental result -> VALU read: 1 wait state
    .set _r, 0
    .rept 32
        v_pk_mul_f32 v[v_o + _r : v_o + _r + 1], v[v_o + _r : v_o + _r + 1], v[v_corr:v_corr+1] op_sel_hi:[1,0]
        .set _r, _r + 2
    .endr
    v_add_f32 v[v_t2], v[v_m], v[v_t2]
    v_mul_f32 v[v_t2], LN2, v[v_t2]     ; LSE = (m + log2 l) * ln 2
    ; O^T block db, register 4g + e holds d = 32db + 8g + 4(l/32) + e: 4 consecutive d -> 8 bytes
    s_lshl_b32 s[s_t0], s[s_wave], 5
    v_add_u32 v[v_t3], s[s_t0], v[v_lq]                 ; row in tile
    v_mul_lo_u32 v[v_t4], v[v_t3], s[s_o_ss]
    v_lshl_add_u32 v[v_t4], v[v_lh], 3, v[v_t4]         ; + 8 * (l/32)
    .set _g, 0
    .rept 16
        cvt_pk_f32 v[v_op + 2*_g], v[v_o + 4*_g], v[v_o + 4*_g + 1]
        cvt_pk_f32 v[v_op + 2*_g + 1], v[v_o + 4*_g + 2], v[v_o + 4*_g + 3]
        buffer_store_dwordx2 v[v_op + 2*_g : v_op + 2*_g + 1], v[v_t4], s[s_rsrc_o:s_rsrc_o+3], 0 offen offset: 64*(_g/4) + 16*(_g%4)
        .set _g, _g + 1
    .endr
    s_cmp_eq_u32 s[s_store_lse], 0
    s_cbranch_scc1 L_end
    v_lshlrev_b32 v[v_t3], 2, v[v_t3]
    s_mov_b64 s[s_exec_save:s_exec_save+1], exec
    s_mov_b32 exec_hi, 0                ; lanes 0..31 hold the 32 rows (lanes 32..63 repeat them)
    buffer_store_dword v[v_t2], v[v_t3], s[s_rsrc_lse:s_rsrc_lse+3], 0 offen
    s_mov_b64 exec, s[s_exec_save:s_exec_save+1]
L_end:
    s_endpgm
