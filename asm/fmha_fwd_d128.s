; fmha_fwd_d128 — flash-attention forward, head dim 128 (HEAD_DIM = 64: fmha_fwd_d64,
; batch_prefill_d64), gfx950 (CDNA4), wave64
;
;   O[b, i, h, :] = sum_j softmax_j(scale * Q[b,i,h,:] . K[b,j,h/r,:]) * V[b,j,h/r,:]
;   LSE[b, h, i]  = ln sum_j exp(scale * Q[b,i,h,:] . K[b,j,h/r,:])         (optional)
;
; r = heads_q / heads_k (MHA r = 1, GQA, MQA). Causal (FMHA_CAUSAL = 1): key j is visible
; to query i iff j <= i + (seq_k - seq_q) (bottom-right aligned, as flash-attention 2.1+);
; a query that sees no key gets O = 0 and LSE = -inf. Elsewhere IEEE arithmetic stands, as
; in the float64 softmax: a query whose visible scores are all -inf (+-inf in q or K) gets
; O = NaN (0 / 0) and LSE = -inf; a +inf or NaN score makes O and LSE NaN.
; Design notes (layouts, schedule, history, batch prefill): docs/fmha_fwd_d128.md.
;
; --- Variants (defines, from kernels.yaml) ----------------------------------------------
;   HEAD_DIM     128 (default) or 64 (16-bit only): 128-byte rows, 4 GEMM0 k steps and 2 O^T
;                blocks, 8 MFMAs per GEMM per tile, one DMA line per wave and tile
;   F16          fp16 (else bf16) Q, K, V, O and MFMAs
;   FMHA_CAUSAL  the causal mask
;   PAGED        batch_prefill_d128: varlen Q, K/V gathered from a paged cache (fmha_paged.inc)
;   FP8          (PAGED) e4m3 Q/K/V with per-tensor descales, bf16 O (fmha_fp8.inc)
;   BLK, BLKS    (FP8) K/V scales per page and KV head: one pair per 64-key tile
;                (page_size >= 64), or per key (any page size) (fmha_block_scale.inc)
;   WINDOW       sliding window (window_left, window_right): tiles outside every row's
;                window are skipped, per workgroup and per wave (fmha_window.inc)
;   SOFTCAP      (16-bit) scores softcap tanh(x / softcap) before masking (fmha_softcap.inc)
; Attention sinks (has_sinks, sinks [heads_q] f32) are in every variant: the epilogue's
; out-of-line sinks_row, once per wave.
; The dense kernel reads top-down; the batch-prefill pieces are macros in asm/include/,
; invoked where this file has `.if PAGED` / `.if FP8` / `.if BLK`.
;
; --- Launch and arguments ---------------------------------------------------------------
; Grid (cdiv(seq_q, 256), heads_q, batch); workgroup 512 = 8 waves. Workgroup x owns the
; 256-row Q tile t (causal: t = tiles - 1 - x, the longest rows first, so the short tiles
; fill the tail of the dispatch); wave w owns rows 32w..32w+31 of it.
; Kernarg (offsets k_* generated from kernels.yaml): q k v o: *bf16|*f16, lse: *f32;
; seq_q, seq_k; byte strides {q,k,v,o}_{seq,head,batch}_stride, lse_{head,batch}_stride;
; kv_head_magic = ceil(2^32 / r) (0 when r = 1: kv head = h * magic >> 32, exact for
; h, r < 2^16); scale_log2 = softmax_scale * log2(e); store_lse (0: lse is not touched);
; sinks, has_sinks (0: sinks is not touched); window_left, window_right (WINDOW; 2^30: unbounded);
; softcap_log2 (SOFTCAP: softcap log2(e); scale_log2 is then 2 softmax_scale log2(e) / softcap).
; Every (b, h) slice must satisfy: rows 16-byte aligned, seq stride >= 256 bytes, and
; (seq - 1) * seq_stride + 256 < 2^31 (the ops layer checks this).
;
; --- Math (per wave, per 64-key tile j) -------------------------------------------------
; Q is pre-scaled by scale*log2(e), so scores are in the log2 domain. GEMM0:
; v_mfma_f32_32x32x16 with A = K, B = Q gives S^T - m (srcC = -m, v_negm): lane l holds
; query l%32 and, in register r of key block kb, key 32kb + 8(r/4) + 4(l/32) + r%4, so the
; row max and sum are in-lane plus one v_permlane32_swap. P = exp2(S - m) with a lazy
; rescale (O, l, m change only when some row's max grows by more than 8: P <= 2^8).
; (FP8 and BLK without a window, POSTHOC: no row max first; P against the running m, and a
; tile whose row sums exceed 2^8 in some lane is formed again out of line: fmha_fp8.inc.)
; GEMM1: O^T += V^T P^T, P's registers as they lie are the B operand, V^T comes by
; ds_read_b64_tr_b16 in the same key order. End: O /= max(l, 1), LSE = (m + log2 l) * ln 2:
; m starts at -FLT_MAX (at or below every finite score), so the key that sets m weighs
; exactly 1 and l >= 1 once a row saw a finite score; l = 0 only where every score was -inf.
; (bf16/fp16: a row whose first tile scored all -inf is fresh, m = -m = 0 with lazy
; threshold -inf, until a tile gives it a score: fresh_rows_first.)
; Masking (tail keys, causal) is per element, only on the tiles that need it.
;
; --- Budget -----------------------------------------------------------------------------
; VGPRs 256, no AGPRs (FP8 240, BLK 242): 2 waves per SIMD, one workgroup per CU. Q 32,
;   O^T 64, S double buffer 2 x 32, P 16, MFMA operand ring 32, -m 16, the rest addresses
;   and softmax state (map below). SGPRs 86 (BLK, BLKS: 97). HEAD_DIM 64: the same map, Q
;   and O^T use their first halves (240 VGPRs allocated).
; LDS 80 KiB: V tiles in 2 buffers, K tiles in 3 (POSTHOC: 4), 16 KiB each (64 rows x 256
;   bytes, chunks XOR-swizzled; FP8 rows are 128 bytes); BLKS adds 3 scale tables of 512 bytes.
;   HEAD_DIM 64: 40 KiB (rows of 128 bytes, 8 chunks: K's swizzle (row/2) % 8, V's
;   4((row/2) % 2) | 2((row/4) % 2)).
; Head dim 256 does not fit this pipeline: Q 64 + O^T 128 VGPRs beside the 160 the rest
;   needs is 352 per wave, over the 256 (AGPRs included) each of two waves per SIMD gets.
;
; --- Pipeline (per wave; iteration j) ---------------------------------------------------
;   phase A: GEMM1(j-1)  O += V(j-1) P(j-1)  || softmax(j) part 1: row max, lazy test,
;            exp2 of key block 0
;   phase B: GEMM0(j+1)  S(j+1) = K(j+1) Q^T - m  || softmax(j) part 2: exp2 of key
;            block 1, row sums, P(j) to bf16/fp16
; Operands of both GEMMs stream through one ring of VGPRs, PF operands ahead. Waves 0-3
; (group 1) and 4-7 (group 2) run half an iteration apart, so the two waves of a SIMD run
; opposite phases; after each barrier every wave issues its LDS DMA lines of K(j+2) (K
; triple-buffered; POSTHOC quadruple) and V(j) (double-buffered). Barrier accounting: before `main_loop`.

; --- Defines of the batch-prefill variants (0: the dense kernel) ------------------------
.ifndef PAGED
    .set PAGED, 0                      ; batch_prefill_d128 (PAGED = 1): varlen Q, paged K/V
.endif
.ifndef FP8
    .set FP8, 0                        ; (PAGED only) FP8 e4m3 Q/K/V, bf16 O
.endif
.if FP8 && !PAGED
    .error "fmha_fwd_d128: FP8 is a batch_prefill (PAGED) variant"
.endif
.ifndef BLK
    .set BLK, 0                        ; (FP8 only) per-page K/V scales: one pair per tile, page_size >= 64
.endif
.if BLK && !FP8
    .error "fmha_fwd_d128: BLK is an FP8 variant"
.endif
.ifndef BLKS
    .set BLKS, 0                       ; (BLK only) per-key block scales: any page size
.endif
.if BLKS && !BLK
    .error "fmha_fwd_d128: BLKS is a BLK variant"
.endif
.ifndef WINDOW
    .set WINDOW, 0                     ; sliding window (window_left, window_right kernargs; fmha_window.inc)
.endif
.ifndef SOFTCAP
    .set SOFTCAP, 0                    ; logit soft-capping (softcap_log2 kernarg; fmha_softcap.inc)
.endif
.if SOFTCAP && FP8
    .error "fmha_fwd_d128: SOFTCAP is a 16-bit variant"
.endif
.ifndef HEAD_DIM
    .set HEAD_DIM, 128                 ; 64: fmha_fwd_d64, batch_prefill_d64 (16-bit only); 128
.endif
.if HEAD_DIM != 64 && HEAD_DIM != 128
    .error "fmha_fwd_d128: HEAD_DIM must be 64 or 128"
.endif
.if HEAD_DIM == 64 && FP8
    .error "fmha_fwd_d128: HEAD_DIM 64 is a 16-bit variant (no FP8)"
.endif
.if FP8 && !BLKS && !WINDOW
    .set POSTHOC, 1                    ; (defined only here) FP8, BLK: the lazy test after the exp2s, on the tile's row sums (fmha_fp8.inc)
    .set K_BUFS, 4                     ; K tiles in LDS: K(j) stays until barrier j+2's DMA, for rare_redo
.endif
.if BLK || SOFTCAP
    .set NEGM_SRCC, 0                  ; GEMM0 starts from 0 (v_negm stays 0): S - m is formed per element
.else
    .set NEGM_SRCC, 1                  ; GEMM0's first MFMA of a key block takes srcC = -m (v_negm)
.endif

.include "float16.inc"

.include "buffer_rsrc.inc"

; Batch-prefill pieces (PAGED, FP8, BLK/BLKS): macros only, invoked below where the dense
; code has `.if PAGED` / `.if FP8` / `.if BLK`.
.include "fmha_paged.inc"

.include "fmha_fp8.inc"

.include "fmha_block_scale.inc"

.include "fmha_window.inc"

.include "fmha_softcap.inc"

; --- constants ---
.set Q_TILE, 256
.set KV_TILE, 64
.set D_STEPS, HEAD_DIM / 16            ; GEMM0's k steps of 16 d (Q: 4 VGPRs each)
.set D_BLOCKS, HEAD_DIM / 32           ; GEMM1's 32-wide d blocks (O^T: 16 f32 each)
.set MFMAS, HEAD_DIM / 8               ; 16-bit MFMAs of each GEMM per tile: 2 key blocks x D_STEPS = 4 k steps x D_BLOCKS
.if FP8
.set ROW_BYTES, 128                    ; 128 e4m3 (Q, K, V rows)
.else
.set ROW_BYTES, 2 * HEAD_DIM           ; bf16/fp16 (Q, K, V rows)
.endif
.set O_ROW_BYTES, 2 * HEAD_DIM         ; bf16/fp16 (O rows)
.set TILE_BYTES, KV_TILE * ROW_BYTES   ; 16 KiB (HEAD_DIM 64: 8 KiB)
.set DMA_LINES, HEAD_DIM / 64          ; 16-bit LDS DMA lines (1 KiB each) per wave per tile: lines w (and w + 8)
.set LDS_V0, 0                         ; V[0..1] at LDS_V0 + buf * TILE_BYTES (DS offsets: 16 bits)
.set LDS_K0, 2 * TILE_BYTES            ; K[0..2] at LDS_K0 + buf * TILE_BYTES (buffer part in v_kaddr)
.set LDS_NEEDED, 5 * TILE_BYTES
.ifdef POSTHOC
.set LDS_NEEDED, (2 + K_BUFS) * TILE_BYTES
.endif
.set LAZY_THRESHOLD, 0x41000000        ; 8.0f: rescale only when the max grows by more (log2 units)
.set M_INIT, 0xff7fffff                ; -FLT_MAX: finite floor of m, at or below every finite score
.set NEG_INF, 0xff800000
.set F32_MAX, 0x7f7fffff
.set F32_NAN, 0x7fc00000
.set LN2, 0x3f317218                   ; ln(2)
.set LOG2E, 0x3fb8aa3b                 ; log2(e)
.if PAGED
    paged_constants                    ; fmha_paged.inc
.else
.set RING, 8                           ; MFMA operand ring: 8 slots of 4 VGPRs
.set PF, 6                             ; operands read ahead of their MFMA (< RING; <= 7 x 2 DS reads in flight)
.set DMA_OPS, 4 * DMA_LINES + 8         ; ops of one iteration's DMA (dma_op): K and V, 2 per line and 4 descriptor ops each
.endif
.if DMA_OPS < 16
.set A_PAIRS, DMA_OPS                  ; phase A: exp2 and DMA ops alternate for this many pairs
.else
.set A_PAIRS, 16
.endif
.set PRIO_A, 1                         ; s_setprio of phase A's MFMA stream (see `iteration`)
.set PRIO_B, 2                         ; ... of phase B's

.if LDS_BYTES < LDS_NEEDED
    .error "fmha_fwd_d128: the manifest must give lds_bytes >= LDS_NEEDED (5 K/V tiles)"
.endif
.if BLKS
    blks_lds_tables                    ; fmha_block_scale.inc: 3 scale tables past the K/V buffers
.endif
.if WORKGROUP_SIZE_X != 512
    .error "fmha_fwd_d128: workgroup must be 512 work-items (8 waves of 32 Q rows)"
.endif

; --- SGPRs (s[0:1] kernarg, s2 = Q tile slot, s3 = head h, s4 = batch b set by the hardware) ---
.set s_wave, 5              ; wave index 0..7 in the workgroup
.set s_qtile, 6             ; Q tile index
.set s_q0, 7                ; first Q row of the tile
.set s_rsrc_q, 8            ; [8:11]  Q rows of this tile, this (b, h)
.set s_rsrc_k, 12           ; [12:15] K rows from the next tile to load on, this (b, kv head)
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
.set s_ntiles, 58           ; KV tiles the workgroup loads (n)
.set s_wtiles, 59           ; KV tiles this wave computes (a prefix of them, w <= n)
.set s_maskfrom, 60         ; first KV tile this wave must mask (signed)
.set s_j, 61                ; iteration = KV tile whose softmax runs
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
.set s_resc, 80             ; 1 between a lazy-rescale decision and the O rescale
.set s_wm2, 81              ; max(w, 2) - 2: iterations 1 .. w-2 run the full body
.set s_kb_next, 82          ; byte offset of K[(j+1) % 3], read by this iteration's GEMM0
.set s_kd_off, 83           ; byte offset of the K buffer this iteration's DMA fills
.set s_kd_line, 84          ; m0 of that DMA's first line: s_m0k + s_kd_off
.set s_kbuf_cur, 85         ; K buffer offset the v_kaddr addresses hold now
; epilogue only (the masks' SGPRs are free there): the attention sink of head h
.set s_has_sinks, s_cmp2    ; kernarg has_sinks
.set s_sink, s_cmp2 + 1     ; sinks[h] (natural log units)
.set s_ptr_sinks, s_cmp1    ; [74:75]

; --- VGPRs ---
.set v_lane, 1              ; l = work-item % 64 (v0 holds the packed work-item ids at entry)
.set v_t0, 2                ; temporaries
.set v_t1, 3
.set v_t2, 4                ; [4:5] (a pair: broadcast operand of packed ops)
.set v_kaddr, 6             ; [6:13]  LDS byte address of K chunk 2s + l/32 of key l%32, s = 0..7 (FP8 [6:9]: chunk 4s + 2h + l/32)
.set v_vaddr, 14            ; [14:17] LDS byte address of this lane's ds_read_b64_tr_b16, d block 0..3
.set v_dma_k0, 18           ; DMA voffsets: K line w, K line w+8, V line w, V line w+8
.set v_dma_k1, 19
.set v_dma_v0, 20
.set v_dma_v1, 21
.set v_lim4, 22             ; (first key this lane's query may not see) - 4 * (l/32)
.set v_mask_t, 23
.set v_m, 24                ; [24:25] running max m (log2 units); pk ops read the pair's v_m only
.set v_thr, 25              ; (16-bit) lazy threshold of the row: 8, or -inf while it is fresh (fresh_rows_first)
.set v_l, 26                ; [26:27] running row sum, two partial sums
.set v_corr, 28             ; [28:29] rescale factor (pk ops broadcast v_corr)
.set v_neginf, 30
.set v_diff, 31             ; row max of S - m
.set v_negm, 32             ; [32:47]  -m in all 16 registers: srcC of a key block's first MFMA
.set v_p, 48                ; [48:63]  P (bf16/fp16 pairs): 4 k-steps x 4 VGPRs (FP8 [48:55]: 32 e4m3 bytes)
.set v_op, 64               ; [64:95]  MFMA A operand ring: RING slots of 4 VGPRs (FP8: of 8)
.set v_s0, 96               ; [96:127]  S - m / P f32, even tiles: 2 key blocks x 16
.set v_s1, 128              ; [128:159] odd tiles
.set v_o, 160               ; [160:223] O^T accumulators: 4 d blocks x 16 f32
.set v_q, 224               ; [224:255] Q (B operand of GEMM0): 8 d steps x 4 VGPRs (FP8 [224:239]: 2 x 8)
; prologue/epilogue temporaries in the O region (O is zeroed after them)
.set v_u_lq, 160
.set v_u_lh, 161
.set v_u_qoff, 162
.set v_u3, 163
.set v_u4, 164
.if PAGED
    paged_registers                    ; fmha_paged.inc: page gather (cbase, rows, page entries)
    fp8_registers                      ; fmha_fp8.inc: c, -c, v_descale, lazy threshold
    block_scale_registers              ; fmha_block_scale.inc: scale pairs, tables, v_ref
.endif
.if WINDOW
    window_registers                   ; fmha_window.inc: the wave's first tile, low mask bound, t_lo
.endif
.if SOFTCAP
    softcap_registers                  ; fmha_softcap.inc: C = softcap log2(e)
.endif

; ============================================================================ macros

; GEMM1 operand i (k step i/D_BLOCKS, d block i%D_BLOCKS) into ring slot \slot: keys 16ks + 4(l/32) +
; {0..3} and +8 of column d = 32 db + l%32, by two transposing reads of V buffer \buf
.macro v_read_op slot, i, buf
.if FP8
    v_read_op8 \slot, \i, \buf
.else
    ds_read_b64_tr_b16 v[v_op + 4*(\slot) : v_op + 4*(\slot) + 1], v[v_vaddr + (\i) % D_BLOCKS] offset: LDS_V0 + (\buf) * TILE_BYTES + 16 * ROW_BYTES * ((\i) / D_BLOCKS)
    ds_read_b64_tr_b16 v[v_op + 4*(\slot) + 2 : v_op + 4*(\slot) + 3], v[v_vaddr + (\i) % D_BLOCKS] offset: LDS_V0 + (\buf) * TILE_BYTES + 16 * ROW_BYTES * ((\i) / D_BLOCKS) + 8 * ROW_BYTES
.endif
.endm

; GEMM0 operand i (key block i%2, d step i/2) into ring slot \slot; the K buffer's offset
; is part of the v_kaddr addresses (kaddr_op moves them)
.macro k_read_op slot, i, buf
.if FP8
    k_read_op8 \slot, \i, \buf
.else
    ds_read_b128 v[v_op + 4*(\slot) : v_op + 4*(\slot) + 3], v[v_kaddr + (\i) / 2] offset: LDS_K0 + 32 * ROW_BYTES * ((\i) % 2)
.endif
.endm

; GEMM1 MFMA i: O^T[d block i%D_BLOCKS] += V^T[d block, k step i/D_BLOCKS] * P^T[k step]  (D_BLOCKS accumulators rotate)
.macro pv_mfma slot, i
.if FP8
    pv_mfma8 \slot, \i
.else
    mfma_32x32x16 v[v_o + 16*((\i)%D_BLOCKS) : v_o + 16*((\i)%D_BLOCKS) + 15], v[v_op + 4*(\slot) : v_op + 4*(\slot) + 3], v[v_p + 4*((\i)/D_BLOCKS) : v_p + 4*((\i)/D_BLOCKS) + 3], v[v_o + 16*((\i)%D_BLOCKS) : v_o + 16*((\i)%D_BLOCKS) + 15]
.endif
.endm

; GEMM0 MFMA i: S^T[key block i%2] (+)= K[keys, d step i/2] * Q^T[d step, queries], into S
; buffer \sbuf; a block's first MFMA starts from -m, so S - m comes out
.macro qk_mfma slot, i, sbuf
    .set _sd, v_s0 + 32*(\sbuf) + 16*((\i)%2)
    .if FP8
        qk_mfma8 \slot, \i
    .elseif (\i) / 2 == 0
        mfma_32x32x16 v[_sd : _sd + 15], v[v_op + 4*(\slot) : v_op + 4*(\slot) + 3], v[v_q + 4*((\i)/2) : v_q + 4*((\i)/2) + 3], v[v_negm : v_negm + 15]
    .else
        mfma_32x32x16 v[_sd : _sd + 15], v[v_op + 4*(\slot) : v_op + 4*(\slot) + 3], v[v_q + 4*((\i)/2) : v_q + 4*((\i)/2) + 3], v[_sd : _sd + 15]
    .endif
.endm

; Operand g of an iteration's MFMA stream: with \gemm1 the first MFMAS (FP8: 4) are GEMM1's
; (V^T), the rest GEMM0's (K). Read into ring slot g % RING.
.macro op_read g, gemm1, kbuf, vbuf
    .if (\gemm1) && ((\g) < MFMAS / (1 + 3 * FP8))
        v_read_op ((\g) % RING), (\g), \vbuf
    .else
        k_read_op ((\g) % RING), ((\g) - MFMAS*(\gemm1) / (1 + 3 * FP8)), \kbuf
    .endif
.endm

; Wait for the reads of operands g and g+1 (g even): those of operands g+2 .. g+PF-1 (< n)
; may stay in flight (2 DS reads per GEMM1 operand, 1 per GEMM0 operand).
.macro op_wait g, gemm1, n
    .set _w, 0
    .set _o, (\g) + 2
    .rept PF - 2
        .if _o < (\n)
            .if (\gemm1) && (_o < MFMAS)
                .set _w, _w + 2
            .else
                .set _w, _w + 1
            .endif
        .endif
        .set _o, _o + 1
    .endr
    s_waitcnt lgkmcnt(_w)               ; in flight: operands g..g+PF-1 -> wait for g's and g+1's
.endm

; One MFMA of the stream: (every second one) wait for operands, issue it, read operand g + PF
.macro mfma_step g, gemm1, n, parity
    .if FP8
        mfma_step8 \g, \gemm1, \n, \parity
    .else
        .if (\g) % 2 == 0
            op_wait \g, \gemm1, \n
        .endif
        mfma_issue \g, \gemm1, \n, \parity, MFMAS
    .endif
.endm

; MFMA g of n in an iteration's stream (\na of GEMM1 first when \gemm1), then the read of
; operand g + PF
.macro mfma_issue g, gemm1, n, parity, na
    .if (\gemm1) && ((\g) < (\na))
        pv_mfma ((\g) % RING), (\g)
    .else
        qk_mfma ((\g) % RING), ((\g) - (\na)*(\gemm1)), (1 - (\parity))
    .endif
    .if (\g) + PF < (\n)
        op_read ((\g) + PF), \gemm1, (1 - (\parity)), (1 - (\parity))
    .endif
.endm

; DMA op i (0..15) of an iteration: K(k+2) -> K[(k+2) % 3] (its first line at s_kd_line),
; V(k) -> V[\vpar], for the barrier k the body passed (tiles past the workgroup's last
; read zeros: their descriptors are empty); the descriptors move on. Descriptor ops 0 -> 1
; and 2 -> 3 of each (d128: ops 4 -> 5, 6 -> 7, 12 -> 13, 14 -> 15; d64: 2 -> 3, 4 -> 5,
; 8 -> 9, 10 -> 11) pass SCC: the schedules that spread these ops between MFMAs
; put only VALU, DS, MFMA and s_waitcnt between them, none of which writes SCC.
.macro dma_op i, vpar
    .if PAGED
        pdma_op (\i), \vpar
    .elseif (\i) < DMA_OPS / 2
        dma_op1 (\i), s_rsrc_k, s_kstep, v_dma_k0, v_dma_k1, s_kd_line, LDS_K0
    .else
        dma_op1 ((\i) - DMA_OPS / 2), s_rsrc_v, s_vstep, v_dma_v0, v_dma_v1, s_m0k, LDS_V0 + (\vpar) * TILE_BYTES
    .endif
.endm
.macro dma_op1 i, rsrc, step, voff0, voff1, s_line, region
    .set _dd, (\i) - 2 * DMA_LINES                      ; descriptor op 0..3 (after the lines' ops)
    .if (\i) == 0
        s_add_u32 m0, s[\s_line], \region               ; line w
    .elseif (\i) == 1
        buffer_load_dwordx4 v[\voff0], s[\rsrc:\rsrc+3], 0 offen lds
    .elseif (\i) == 2 && DMA_LINES == 2
        s_add_u32 m0, s[\s_line], \region + 8192        ; line w + 8
    .elseif (\i) == 3 && DMA_LINES == 2
        buffer_load_dwordx4 v[\voff1], s[\rsrc:\rsrc+3], 0 offen lds
    .elseif _dd == 0
        s_add_u32 s[\rsrc], s[\rsrc], s[\step]          ; descriptor to the next tile
    .elseif _dd == 1
        s_addc_u32 s[\rsrc+1], s[\rsrc+1], 0
    .elseif _dd == 2
        s_sub_u32 s[\rsrc+2], s[\rsrc+2], s[\step]
    .else
        s_cselect_b32 s[\rsrc+2], 0, s[\rsrc+2]         ; SCC = borrow: past the end, empty
    .endif
.endm

; kaddr op i (0..9): point the K read addresses at K[(j+1) % 3] (s_kb_next)
.macro kaddr_op i
    .if (\i) == 0
        s_sub_u32 s[s_t3], s[s_kb_next], s[s_kbuf_cur]
    .elseif (\i) == 1
        s_mov_b32 s[s_kbuf_cur], s[s_kb_next]
    .else
        v_add_u32 v[v_kaddr + (\i) - 2], s[s_t3], v[v_kaddr + (\i) - 2]
    .endif
.endm

; Phase B softmax op i of S(j) (in _sj): even i = 2p: l += (P[2p], P[2p+1]); odd: P pair p
; to bf16/fp16 (register pairs of S^T are already GEMM1's B operand layout)
.macro smB_op i
.ifdef POSTHOC
    smB_op_posthoc \i                  ; fmha_fp8.inc: the tile's own sums (for the lazy test), P to e4m3
.else
    .if (\i) % 2 == 0                  ; (two plain adds, not v_pk_add_f32: packed FP32 never issues in an MFMA's shadow)
        v_add_f32 v[v_l], v[v_l], v[_sj + (\i)]
        v_add_f32 v[v_l + 1], v[v_l + 1], v[_sj + (\i) + 1]
    .elseif FP8
        smB_cvt8 \i
    .else
        cvt_pk_f32 v[v_p + (\i)/2], v[_sj + (\i) - 1], v[_sj + (\i)]
    .endif
.endif
.endm

; Row max of S(j) - m over the 32 in-lane keys: the chain to key 30, then row_max_op 0..6
; (key 31, the two lane halves -> v_diff, and with \test the lazy-rescale test)
.macro row_max_head
    v_max3_f32 v[v_t0], v[_sj + 0], v[_sj + 1], v[_sj + 2]
    .set _r, 3
    .rept 14
        v_max3_f32 v[v_t0], v[v_t0], v[_sj + _r], v[_sj + _r + 1]
        .set _r, _r + 2
    .endr
.endm
.macro row_max_op i, tag, test
    .if FP8 && (\test) && ((\i) < 5)
        row_max_half8 \i                    ; (FP8: this lane half's max, fmha_fp8.inc)
    .elseif (\i) == 0
        v_max_f32 v[v_t0], v[v_t0], v[_sj + 31]
    .elseif (\i) == 1
        v_mov_b32 v[v_t1], v[v_t0]
    .elseif (\i) == 2
        s_nop 1                             ; VALU write -> v_permlane32_swap read: 2 wait states
    .elseif (\i) == 3
        v_permlane32_swap_b32 v[v_t0], v[v_t1]  ; t0 = low half's max in both halves, t1 = high half's
    .elseif (\i) == 4
        v_max_f32 v[v_diff], v[v_t0], v[v_t1]
    .elseif (\i) == 5
        .if \test
        .if FP8 && !BLK && !WINDOW
            v_cmp_lt_f32 vcc, s[s_lazy], v[v_diff]          ; ... by more than 8 / c (raw score units)
        .elseif FP8 && !WINDOW
            v_cmp_lt_f32 vcc, LAZY_THRESHOLD, v[v_diff]     ; some row's max grew by more than 8
        .else
            v_cmp_lt_f32 vcc, v[v_thr], v[v_diff]           ; ... by more than 8, or a fresh row has a score
        .endif
        .endif
    .else
        .if \test
            s_cmp_lg_u64 vcc, 0
            s_cbranch_scc1 L_prep_\tag      ; rare: out of line
L_prep_back_\tag:
        .endif
    .endif
.endm

; Softmax lead of the first tile: m = max(row max, -FLT_MAX); S -= m; -m into v_negm
.macro lead_first
    row_max_head
    .set _i, 0
    .rept 7
        row_max_op _i, first, 0
        .set _i, _i + 1
    .endr
    v_max_f32 v[v_m], M_INIT, v[v_diff]
    .if !FP8 || WINDOW
        fresh_rows_first                                ; (rows without a score yet: m = 0)
    .endif
    v_sub_f32 v[v_t2], 0, v[v_m]
    .set _r, 0
    .rept 16
        v_pk_add_f32 v[_sj + _r : _sj + _r + 1], v[_sj + _r : _sj + _r + 1], v[v_m:v_m+1] op_sel_hi:[1,0] neg_lo:[0,1] neg_hi:[0,1]
        .set _r, _r + 2
    .endr
    .set _r, 0
    .rept 8 * NEGM_SRCC                     ; (BLK, SOFTCAP: GEMM0 starts from 0; S - m is formed per element)
        v_pk_mov_b32 v[v_negm + _r : v_negm + _r + 1], v[v_t2:v_t2+1], v[v_t2:v_t2+1] op_sel:[0,0]
        .set _r, _r + 2
    .endr
.endm

; Phase A op i of a body: the row max's tail ops (steady tiles), the K address move
; (when GEMM0 follows), then exp2 of key block 0 alternating with the 16 DMA ops (group 1).
; _lt, _ka, _ex, _dm (set by `iteration`) say which are there.
.macro a_op i, tag, parity
    .if (\i) < _lt
        row_max_op (\i), \tag, 1
    .elseif (\i) < _lt + _ka
        kaddr_op ((\i) - _lt)
    .else
        .set _ai, (\i) - _lt - _ka         ; index among the exp2 and DMA ops
        .if _ex && _dm && (_ai >= 2 * A_PAIRS) && (DMA_OPS > 16)
            dma_op (_ai - 16), \parity        ; (DMA_OPS > 16) the rest after the exp2s
        .elseif _ex && _dm && (_ai >= 2 * A_PAIRS)
            exp2_op (_sj + _ai - DMA_OPS)     ; (DMA_OPS < 16) the rest of the exp2s after the DMA
        .elseif _ex && _dm
            .if _ai % 2 == 0
                exp2_op (_sj + _ai/2)
            .else
                dma_op (_ai/2), \parity
            .endif
        .elseif _ex
            exp2_op (_sj + _ai)
        .else
            dma_op _ai, \parity
        .endif
    .endif
.endm

; P = exp2 of S - m (FP8: of c (S - m), S in raw units: Q is not pre-scaled)
.macro exp2_op r
    .if FP8
        exp2_scale8 \r
    .endif
    v_exp_f32 v[\r], v[\r]
.endm

; Phase B ops of slot k (0..15, 16 = the tail): exp2 of key block 1, row sums, P to
; bf16/fp16 (_ex), and for group 2 one DMA op per slot (_dmb, V buffer \vpar).
.macro b_ops k, vpar
    .if (\k) < 16
        .if _ex
            exp2_op (_sj + 16 + (\k))
            .if (\k) >= 1
                smB_op (2*(\k) - 2)         ; pairs p <= k-1 were exponentiated >= 2 ops ago
                smB_op (2*(\k) - 1)
            .endif
        .endif
        .if _dmb
            .set _di, ((\k) * DMA_OPS) / 16   ; first DMA op of this slot (DMA_OPS spread over 16)
            .rept (((\k) + 1) * DMA_OPS) / 16 - _di
                dma_op _di, \vpar
                .set _di, _di + 1
            .endr
        .endif
    .elseif _ex
        smB_op 30
        smB_op 31
    .endif
.endm

; ---------------------------------------------------------------- the iteration body
; One iteration body j of a wave (the pipeline sketch is in the header, the barrier
; accounting before main_loop). Named arguments, all 0/1 but tag and group:
;   tag      suffix of this body's labels (L_mask_<tag>, L_prep_<tag>, L_orescale_<tag>)
;   parity   j % 2: S(j) = v_s[parity], S(j+1) = v_s[1-parity], V(j-1) = V[1-parity];
;            K(j+1) = K[(j+1) % 3] through v_kaddr
;   gemm1    phase A runs GEMM1(j-1): O += V(j-1) P(j-1)
;   softmax  softmax(j) runs: row max, lazy-rescale test, exp2, row sums, P(j)
;   gemm0    phase B runs GEMM0(j+1): S(j+1) = K(j+1) Q^T - m
;   first    j = 0: softmax(0) sets m (lead_first) and has no lazy test
;   group    1: barrier before the body, DMA in phase A; 2: barrier between the phases,
;            DMA in phase B; 0: neither (the pre-loop GEMM0(0))
; The body is four clusters; the assembler symbols below size them (comparisons evaluate
; to -1 in the assembler, so 0/1 flags are set with .if).
.macro iteration tag, parity, gemm1, softmax, gemm0, first, group
    .set _n, MFMAS*((\gemm1) + (\gemm0))    ; MFMA slots of the stream, GEMM1's MFMAS first (FP8: one MFMA per 4 slots)
    .set _sj, v_s0 + 32*(\parity)           ; first VGPR of S(j), the tile the softmax works on
    .set _lt, 7 * ((\softmax) && !(\first)) ; row-max tail ops (row_max_op 0..6) riding on phase A (tile 0: in lead_first)
.ifdef POSTHOC
    .set _lt, 0                             ; (no row max before the exp2s)
.endif
    .set _ex, (\softmax)                    ; 1: S(j)'s exp2s ride on both phases (key block 0 on A, 1 on B)
    .set _dm, 0                             ; 1: the DMA's DMA_OPS ops ride on phase A (group 1)
    .set _dmb, 0                            ; 1: they ride on phase B (group 2)
    .if (\group) == 1
        .set _dm, 1
    .elseif (\group) == 2
        .set _dmb, 1
    .endif
    .set _ka, 0                             ; K-address ops (kaddr_op) riding on phase A, ahead of its first K read
    .if (\gemm0) && (\gemm1) && ((\group) != 0)
        .set _ka, 2 + (D_STEPS - 4 * FP8)
    .elseif (\gemm0) && ((\group) != 0)
        .set _i, 0
        .rept 2 + (D_STEPS - 4 * FP8)       ; (no GEMM1: the prefetch reads K, so the move runs now)
            kaddr_op _i
            .set _i, _i + 1
        .endr
    .endif
    .set _na, _lt + _ka + 16*_ex + DMA_OPS*_dm   ; all ops spread over phase A's MFMAS MFMA slots

    ; Cluster 1: softmax(j) lead: mask check (out of line), the row max's head (tile 0: m, S - m, -m)
    ;            loads: the stream's first PF operands (V^T(j-1) with GEMM1, else K(j+1)); BLKS: k scales first
    cluster_lead \tag, \parity, \gemm1, \softmax, \first
    ; Phase B (GEMM0 with the heavier softmax half) wins issue over phase A: at equal
    ; priority the older wave of a SIMD would win everything and the other finish alone
    ; (gfxasm.perf model: B over A 1665, equal 1534, A over B 1534 TFLOP/s at B4 H64/8 S8192).
    s_setprio PRIO_A                        ; phase A yields to the other wave's phase B
    ; Cluster 2: GEMM1(j-1) O += V P  ||  row max tail, lazy test, exp2 of key block 0, K address move
    ;            loads: the rest of V^T(j-1), the first K(j+1) operands; group 1: DMA K(j+2), V(j)
    cluster_a \tag, \parity, \gemm1
    ; Cluster 3: O *= corr when a lazy rescale is due (out of line; BLK: also a new v scale);
    ;            group 2: barrier j+1 (waits for its DMA lines of barrier j)
    cluster_between \tag, \gemm1, \softmax, \group
    s_setprio PRIO_B                        ; phase B wins issue
    ; Cluster 4: GEMM0(j+1) S(j+1) = K Q^T - m  ||  exp2 of key block 1, row sums, P(j) to bf16/fp16
    ;            loads: the rest of K(j+1); group 2: DMA K(j+3), V(j+1)
    cluster_b \parity, \gemm1, \gemm0
.ifdef POSTHOC
    .if \softmax
        posthoc_test \tag, \first         ; fmha_fp8.inc: the tile's row sums decide; l += them
    .endif
.endif
    s_setprio 0                             ; barriers and loop control at priority 0
.endm

; Cluster 1 of `iteration`
.macro cluster_lead tag, parity, gemm1, softmax, first
    .if BLKS && (\softmax)
        blks_read 0                         ; the k scales, ahead of the operand prefetch
    .endif
    .set _g, 0                              ; operand of the stream to prefetch
    .rept PF
        .if _g < _n / (1 + 3 * FP8)         ; (FP8: one 32x32x64 MFMA, one operand, per 4 slots)
            op_read _g, \gemm1, 0, (1 - (\parity))
        .endif
        .set _g, _g + 1
    .endr
    .if \softmax
        .if SOFTCAP
            softcap_scores \first           ; fmha_softcap.inc: C tanh - m, before the mask
        .endif
        s_cmp_ge_i32 s[s_j], s[s_maskfrom]
        s_cbranch_scc1 L_mask_\tag          ; tail keys or causal diagonal in this tile: out of line
        .if WINDOW
            s_cmp_lt_i32 s[s_j], s[s_masklo]
            s_cbranch_scc1 L_mask_lo_\tag   ; keys below some row's window (and none past a lim)
        .endif
L_mask_back_\tag:
        .if BLK
            blk_lead \first, \gemm1         ; fmha_block_scale.inc: the tile's k scales into S
        .endif
        .if \first
            lead_first
        .else
.ifndef POSTHOC                             ; (POSTHOC: no row max, posthoc_test)
            row_max_head                    ; while the first operands load
.endif
        .endif
        .if BLKS
            blks_vref \gemm1                ; fmha_block_scale.inc: U(j), the tile's v scale
        .endif
    .endif
.endm

; Cluster 2 of `iteration`: phase A, _na ops spread evenly over its MFMAS MFMAs (a_op)
.macro cluster_a tag, parity, gemm1
    .if \gemm1
        .set _k, 0                          ; MFMA slot 0..MFMAS-1
        .set _done, 0                       ; a_op ops issued so far
        .rept MFMAS
            .if (_k + PF >= MFMAS) && (_done < _lt + _ka)
                .rept _lt + _ka - _done     ; the K reads start after this MFMA: the K address move first
                    a_op _done, \tag, \parity   ; (HEAD_DIM 64: its 8 slots spread them too thin)
                    .set _done, _done + 1
                .endr
            .endif
            mfma_step _k, \gemm1, _n, \parity
            .set _upto, ((_k + 1) * _na) / MFMAS    ; ops due by the end of this slot
            .if _upto > _done
            .rept _upto - _done
                a_op _done, \tag, \parity
                .set _done, _done + 1
            .endr
            .endif
            .set _k, _k + 1
        .endr
    .else
        .set _done, 0
        .rept _na
            a_op _done, \tag, \parity
            .set _done, _done + 1
        .endr
    .endif
.endm

; Cluster 3 of `iteration`
.macro cluster_between tag, gemm1, softmax, group
    .if (\gemm1) && (\softmax) && BLK
        s_cmp_lg_u32 s[s_vratio], 0x3f800000
        s_cbranch_scc1 L_orescale_\tag      ; the v scale changes (a new page): O *= v_scale(j-1) / v_scale(j)
    .endif
    .if (\gemm1) && (\softmax)
.ifndef POSTHOC                             ; (POSTHOC: rare_redo rescales O itself)
        s_cmp_lg_u32 s[s_resc], 0
        s_cbranch_scc1 L_orescale_\tag      ; rare: O *= corr now that GEMM1(j-1) is in
.endif
L_orescale_back_\tag:
    .endif
    .if (\group) == 2
        s_setprio 0                         ; (at the barrier)
        .if BLKS
            blks_barrier_wait \softmax, \gemm1  ; (and the scale-table write of the last barrier)
        .else
        s_waitcnt vmcnt(0)                  ; in flight: my DMA lines of barrier j -> wait for them
        .endif
        s_barrier                           ; barrier j+1: group 1 finished iteration j, group 2 phase A(j)
        blk_shift
    .endif
.endm

; Cluster 4 of `iteration`: phase B, 16 b_ops slots (and the tail slot 16), an MFMA in every
; (HEAD_DIM 64: every second) one
.macro cluster_b parity, gemm1, gemm0
    .set _k, 0                              ; b_ops slot 0..15, 16 = the tail
    .rept 17
        .if (\gemm0) && (_k < 16) && ((_k % (16 / MFMAS)) == 0)
            mfma_step (MFMAS*(\gemm1) + _k / (16 / MFMAS)), \gemm1, _n, \parity
        .endif
        b_ops _k, (1 - (\parity))
        .set _k, _k + 1
    .endr
.endm

; 16-bit variants, first tile: a row whose scores were all -inf (it sees no key, or -inf
; from the data) is fresh: m = 0 instead of -FLT_MAX, so -m = 0 and the next tiles' S come
; out of GEMM0 raw and exact (S + FLT_MAX would round every score of a tile to one value, and
; its keys would weigh 1 each), and its lazy threshold is -inf, so the first tile that gives
; it a score above -inf rescales it (fresh_rows_prep). (FP8 scores are -inf only where masked:
; a row without a score in the first tile sees no key.)
.macro fresh_rows_first
    v_cmp_eq_f32 vcc, v[v_neginf], v[v_diff]
    v_cndmask_b32_e64 v[v_m], v[v_m], 0, vcc
    lazy_threshold v_thr
    v_cndmask_b32 v[v_thr], v[v_thr], v[v_neginf], vcc
.endm

; v[r] = the lazy threshold of a row that has a score: 8 (log2 units), FP8 per-tensor 8 / c
; (raw score units)
.macro lazy_threshold r
.if FP8 && !BLK
    v_mov_b32 v[\r], s[s_lazy]
.else
    v_mov_b32 v[\r], LAZY_THRESHOLD
.endif
.endm

; rare_prep, 16-bit (and FP8 window variants): a fresh row (threshold -inf) whose tile has a score above -inf takes
; delta = its raw max v_diff (m = 0 + delta; v_diff < 0 is fine: S - delta <= 0) and
; threshold 8. v_corr, from max(v_diff, 0), stays finite: its l and O are 0.
.macro fresh_rows_prep
    v_cmp_eq_f32 s[s_tmp64:s_tmp64+1], v[v_neginf], v[v_thr]
    v_cmp_lt_f32 vcc, v[v_neginf], v[v_diff]
    s_and_b64 vcc, vcc, s[s_tmp64:s_tmp64+1]
    v_cndmask_b32 v[v_t2], v[v_t2], v[v_diff], vcc
    lazy_threshold v_t1
    v_cndmask_b32 v[v_thr], v[v_thr], v[v_t1], vcc
.endm

; Epilogue, v_t0 = l of the row: v_corr (1 / max(l, 1)) = NaN for a row that sees keys
; (lim(q) = v_lim4 + 4(l/32) > 0) but whose l is 0: every visible score was -inf (+-inf in
; q or K), the softmax is 0 / 0, O = NaN as the float64 reference gives (LSE: -inf). A row
; that sees no key (causal, seq_q > seq_k) keeps O = 0.
.macro empty_rows_nan
.if WINDOW
    v_cmp_lt_i32 vcc, v[v_lo4], v[v_lim4]               ; lo(q) < lim(q): the row's window holds keys
.else
    v_lshrrev_b32 v[v_t1], 5, v[v_lane]
    v_lshl_add_u32 v[v_t1], v[v_t1], 2, v[v_lim4]      ; lim(q): the keys the row sees
    v_cmp_lt_i32 vcc, 0, v[v_t1]
.endif
    v_cmp_eq_f32 s[s_tmp64:s_tmp64+1], 0, v[v_t0]
    s_and_b64 vcc, vcc, s[s_tmp64:s_tmp64+1]
    v_mov_b32 v[v_t1], F32_NAN
    v_cndmask_b32 v[v_corr], v[v_corr], v[v_t1], vcc
.endm

; Epilogue with attention sinks (has_sinks; v_t0 = l of the row, v_m its m): the sink
; sigma = sinks[h] (natural log units, finite) joins the denominator only. In natural units,
; with mn = m ln 2 (-inf for a row without a finite score: l = 0, its m is no score) and
; M = max(mn, sigma) (finite): l' = l e^(mn - M) + e^(sigma - M) >= 1 (the term at M weighs
; exactly 1: the key that set m, or the sink), O factor e^(mn - M) / l', LSE = M + ln l'.
; (Natural units: sigma log2(e) would overflow f32 for |sigma| > 2.36e38.) A row that sees
; no key, or whose visible scores are all -inf, gets O = 0 and LSE = sigma (P = 0 for every
; key, the sink's weight 1): empty_rows_nan does not apply. Out of line, once per wave.
.macro sinks_row
L_sinks:
    load_kernarg s_ptr_sinks, sinks
    s_lshl_b32 s[s_t0], s[s_wg_y], 2
.if FP8 && !BLK
    v_mul_f32 v[v_t1], s[s_c], v[v_m]                   ; (m in raw score units: c m in log2 units)
    v_mul_f32 v[v_t1], LN2, v[v_t1]
.else
    v_mul_f32 v[v_t1], LN2, v[v_m]                      ; mn = m ln 2
.endif
    v_cmp_eq_f32 vcc, 0, v[v_t0]
    v_cndmask_b32 v[v_t1], v[v_t1], v[v_neginf], vcc    ; l = 0: no finite score, mn = -inf
    s_waitcnt lgkmcnt(0)                                ; in flight: the sinks pointer -> wait for it
    s_load_dword s[s_sink], s[s_ptr_sinks:s_ptr_sinks+1], s[s_t0]
    s_waitcnt lgkmcnt(0)                                ; in flight: sinks[h] -> wait for it
    v_max_f32 v[v_t2], s[s_sink], v[v_t1]               ; M
    v_sub_f32 v[v_t1], v[v_t1], v[v_t2]                 ; mn - M <= 0
    v_mul_f32 v[v_t1], LOG2E, v[v_t1]
    v_exp_f32 v[v_t1], v[v_t1]                          ; a = e^(mn - M)
    v_sub_f32 v[v_corr], s[s_sink], v[v_t2]             ; sigma - M <= 0
    v_mul_f32 v[v_corr], LOG2E, v[v_corr]
    v_exp_f32 v[v_corr], v[v_corr]                      ; e^(sigma - M)
    s_nop 0                                             ; (a transcendental result: 1 wait state before a VALU reads it)
    v_fma_f32 v[v_t0], v[v_t0], v[v_t1], v[v_corr]      ; l' = l a + e^(sigma - M) >= 1
    v_rcp_f32 v[v_corr], v[v_t0]
    v_log_f32 v[v_t0], v[v_t0]
    v_mul_f32 v[v_corr], v[v_corr], v[v_t1]             ; a / l'
    v_mul_f32 v[v_t0], LN2, v[v_t0]
    v_add_f32 v[v_t2], v[v_t2], v[v_t0]                 ; LSE = M + ln 2 log2 l'
    s_branch L_sinks_back
.endm

; --- rare paths (placed after s_endpgm) ---

; mask S(j) (-inf where the key is not visible): element e = key block e/16, register e%16
; _key: the key (0..63 in the tile) that element e of S(j) holds
.macro mask_key e
    .set _key, 32*((\e)/16) + 8*(((\e)%16)/4) + (\e)%4
.endm
.macro mask_cmp e, pair, form=0
    mask_key \e
.if WINDOW
    window_mask_cmp \pair, \form
.else
    v_cmp_lt_i32_e64 s[\pair:\pair+1], _key, v[v_mask_t]
.endif
.endm
.macro mask_sel e, pair, form=0
.if WINDOW
    window_mask_sel \e, \pair, \form
.else
    v_cndmask_b32_e64 v[_sj + (\e)], v[v_neginf], v[_sj + (\e)], s[\pair:\pair+1]
.endif
.endm
; the 32 elements of S(j): compares (mask_cmp's form) rotate over 3 SGPR pairs so each
; v_cndmask reads its mask >= 2 wait states after the v_cmp wrote it (VALU SGPR write ->
; VALU read)
.macro mask_elements form=0
    mask_cmp 0, s_cmp0, \form
    mask_cmp 1, s_cmp1, \form
    mask_cmp 2, s_cmp2, \form
    .set _e, 0
    .rept 32
        .if _e % 3 == 0
            mask_sel _e, s_cmp0, \form
        .elseif _e % 3 == 1
            mask_sel _e, s_cmp1, \form
        .else
            mask_sel _e, s_cmp2, \form
        .endif
        .if _e + 3 < 32
            .if _e % 3 == 0
                mask_cmp (_e + 3), s_cmp0, \form
            .elseif _e % 3 == 1
                mask_cmp (_e + 3), s_cmp1, \form
            .else
                mask_cmp (_e + 3), s_cmp2, \form
            .endif
        .endif
        .set _e, _e + 1
    .endr
.endm
.macro rare_mask tag, parity
L_mask_\tag:
    .set _sj, v_s0 + 32*(\parity)
.if WINDOW
    window_mask_both_test \tag                            ; (keys past a lim here; below a lo too: both bounds)
.endif
    v_sub_u32 v[v_mask_t], v[v_lim4], s[s_tile_start]     ; key (in tile) < v_mask_t (4(l/32) folded in) is visible
.if WINDOW
    mask_elements WINDOW_MASK_LIM
.else
    mask_elements
.endif
    s_branch L_mask_back_\tag
.if WINDOW
    window_mask_forms \tag                                ; the lo-only and two-sided forms (fmha_window.inc)
.endif
.endm

; The lazy rescale's new m, from the row max of S(j) - m in v_diff: delta = max(it, 0) into
; v_t2 (rows whose max did not grow keep their m; a fresh row with a score: its max), corr =
; 2^(-c delta) (2^-delta where scores are in log2 units), m += delta, S(j) -= delta, -m -=
; delta. l and O are the callers' (rare_prep, FP8's rare_redo)
.macro lazy_new_m parity
    .set _sj, v_s0 + 32*(\parity)
    v_max_f32 v[v_t2], 0, v[v_diff]
.if FP8 && !BLK
    v_mul_f32 v[v_corr], s[s_negc], v[v_t2]
.else
    v_sub_f32 v[v_corr], 0, v[v_t2]
.endif
    v_exp_f32 v[v_corr], v[v_corr]
.if !FP8 || WINDOW
    fresh_rows_prep                     ; (a fresh row with a score: delta = its max, corr stays finite)
.endif
    v_add_f32 v[v_m], v[v_m], v[v_t2]
    .set _r, 0
    .rept 16
        v_pk_add_f32 v[_sj + _r : _sj + _r + 1], v[_sj + _r : _sj + _r + 1], v[v_t2:v_t2+1] op_sel_hi:[1,0] neg_lo:[0,1] neg_hi:[0,1]
        .set _r, _r + 2
    .endr
    .set _r, 0
    .rept 8 * NEGM_SRCC
        v_pk_add_f32 v[v_negm + _r : v_negm + _r + 1], v[v_negm + _r : v_negm + _r + 1], v[v_t2:v_t2+1] op_sel_hi:[1,0] neg_lo:[0,1] neg_hi:[0,1]
        .set _r, _r + 2
    .endr
.endm

; lazy rescale, at the test: lazy_new_m, l *= corr; O waits for GEMM1(j-1)
; (FP8: v_diff holds the lane half's max; the row's comes from both halves first)
.macro rare_prep tag, parity
L_prep_\tag:
.if FP8
    row_max_halves8                     ; (FP8: v_diff held this lane half's max)
.endif
    lazy_new_m \parity
    v_pk_mul_f32 v[v_l:v_l+1], v[v_l:v_l+1], v[v_corr:v_corr+1] op_sel_hi:[1,0]
    s_mov_b32 s[s_resc], 1
    s_branch L_prep_back_\tag
.endm

; O *= v[f] (f's value in every lane's rows)
.macro o_scale f
    .set _r, 0
    .rept HEAD_DIM / 4
        v_pk_mul_f32 v[v_o + _r : v_o + _r + 1], v[v_o + _r : v_o + _r + 1], v[\f:\f+1] op_sel_hi:[1,0]
        .set _r, _r + 2
    .endr
.endm

; lazy rescale, end of phase A: O *= corr
.macro rare_orescale tag
L_orescale_\tag:
    s_nop 7                             ; the last GEMM1 MFMA wrote O: 12 wait states before VALU touches it
    s_nop 2                             ; (8 + 3, and the s_cmp and branch that led here)
.if FP8
    s_nop 7                             ; (FP8: 16 passes, 20 wait states)
.endif
.if BLK
    blk_orescale_factor \tag            ; (_f = v_t2: the v scale ratio, with corr when due)
.else
    .set _f, v_corr
.endif
    o_scale _f
    s_mov_b32 s[s_resc], 0
    s_branch L_orescale_back_\tag
.endm

; LDS DMA of one tile of K (\rsrc = s_rsrc_k) or V into the buffer whose line w is at s[\s_line]
.macro dma_tile rsrc, voff0, voff1, s_line, region
    s_add_u32 m0, s[\s_line], \region
    buffer_load_dwordx4 v[\voff0], s[\rsrc:\rsrc+3], 0 offen lds
.if DMA_LINES == 2
    s_add_u32 m0, s[\s_line], \region + 8192
    buffer_load_dwordx4 v[\voff1], s[\rsrc:\rsrc+3], 0 offen lds
.endif
.endm

; ============================================================================ prologue
.if PAGED
    paged_load_args                                     ; fmha_paged.inc: kernargs, this sequence's rows and pages
.else
    load_kernarg s_ptr_q, q
    load_kernarg s_ptr_k, k
    load_kernarg s_ptr_v, v
    load_kernarg s_ptr_o, o
    load_kernarg s_ptr_lse, lse
    load_kernarg s_seq_q, seq_q
    load_kernarg s_seq_k, seq_k
    load_kernarg s_q_ss, q_seq_stride
    load_kernarg s_q_hs, q_head_stride
    load_kernarg s_q_bs, q_batch_stride
    load_kernarg s_k_ss, k_seq_stride
    load_kernarg s_k_hs, k_head_stride
    load_kernarg s_k_bs, k_batch_stride
    load_kernarg s_v_ss, v_seq_stride
    load_kernarg s_v_hs, v_head_stride
    load_kernarg s_v_bs, v_batch_stride
    load_kernarg s_o_ss, o_seq_stride
    load_kernarg s_o_hs, o_head_stride
    load_kernarg s_o_bs, o_batch_stride
    load_kernarg s_lse_hs, lse_head_stride
    load_kernarg s_lse_bs, lse_batch_stride
    load_kernarg s_kv_magic, kv_head_magic
    load_kernarg s_scale_log2, scale_log2
    load_kernarg s_store_lse, store_lse
.if WINDOW
    window_load_args
.endif
.if SOFTCAP
    softcap_load_args
.endif
.endif
    v_and_b32 v[v_lane], 63, v[v_workitem]
    v_bfe_u32 v[v_t0], v[v_workitem], 6, 4              ; wave index = work-item x / 64
    v_and_b32 v[v_u_lq], 31, v[v_lane]
    v_lshrrev_b32 v[v_u_lh], 5, v[v_lane]
    v_readfirstlane_b32 s[s_wave], v[v_t0]              ; (>= 1 wait state after v_t0 was written)
.if !PAGED
    s_waitcnt lgkmcnt(0)                                ; in flight: all kernarg loads -> wait for all
.endif

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
.if PAGED
    add_mul_u64 s_ptr_q, s_qstart, s_q_ss, s_tmp64      ; Q + qstart*ss + h*hs + q0*ss
.else
    add_mul_u64 s_ptr_q, s_wg_z, s_q_bs, s_tmp64        ; Q + b*bs + h*hs + q0*ss
.endif
    add_mul_u64 s_ptr_q, s_wg_y, s_q_hs, s_tmp64
    add_mul_u64 s_ptr_q, s_q0, s_q_ss, s_tmp64
    s_sub_u32 s[s_t0], s[s_seq_q], s[s_q0]
    s_sub_u32 s[s_t0], s[s_t0], 1
    s_mul_i32 s[s_t0], s[s_t0], s[s_q_ss]
    s_add_u32 s[s_t1], s[s_t0], ROW_BYTES               ; (seq_q - q0 - 1) * ss + 256: rows >= seq_q read 0
    rsrc_raw s_rsrc_q, s_ptr_q, s_t1
.if PAGED
    add_mul_u64 s_ptr_o, s_qstart, s_o_ss, s_tmp64
.else
    add_mul_u64 s_ptr_o, s_wg_z, s_o_bs, s_tmp64
.endif
    add_mul_u64 s_ptr_o, s_wg_y, s_o_hs, s_tmp64
    add_mul_u64 s_ptr_o, s_q0, s_o_ss, s_tmp64
    s_sub_u32 s[s_t0], s[s_seq_q], s[s_q0]
    s_sub_u32 s[s_t0], s[s_t0], 1
    s_mul_i32 s[s_t0], s[s_t0], s[s_o_ss]
    s_add_u32 s[s_t1], s[s_t0], O_ROW_BYTES             ; stores of rows >= seq_q are dropped
    rsrc_raw s_rsrc_o, s_ptr_o, s_t1
.if PAGED
    add_mul_u64 s_ptr_lse, s_wg_y, s_lse_hs, s_tmp64    ; LSE [heads_q, total_q]
    s_add_u32 s[s_t0], s[s_qstart], s[s_q0]
    s_lshr_b32 s[s_t1], s[s_t0], 30
    s_lshl_b32 s[s_t0], s[s_t0], 2
    s_add_u32 s[s_ptr_lse], s[s_ptr_lse], s[s_t0]
    s_addc_u32 s[s_ptr_lse+1], s[s_ptr_lse+1], s[s_t1]
.else
    add_mul_u64 s_ptr_lse, s_wg_z, s_lse_bs, s_tmp64
    add_mul_u64 s_ptr_lse, s_wg_y, s_lse_hs, s_tmp64
    s_lshl_b32 s[s_t0], s[s_q0], 2
    s_add_u32 s[s_ptr_lse], s[s_ptr_lse], s[s_t0]
    s_addc_u32 s[s_ptr_lse+1], s[s_ptr_lse+1], 0
.endif
    s_sub_u32 s[s_t0], s[s_seq_q], s[s_q0]
    s_lshl_b32 s[s_t1], s[s_t0], 2                      ; (seq_q - q0) * 4
    rsrc_raw s_rsrc_lse, s_ptr_lse, s_t1
.if PAGED
    add_mul_u64 s_ptr_k, s_hk, s_k_hs, s_tmp64          ; the kv head's first row of page 0
    add_mul_u64 s_ptr_v, s_hk, s_v_hs, s_tmp64
.else
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
.endif
    s_lshl_b32 s[s_m0k], s[s_wave], 10

    ; --- Q: 8 loads of 16 bytes: row q0 + 32w + l%32, d chunk 2s + l/32 ---
    s_lshl_b32 s[s_t0], s[s_wave], 5                    ; 32w
    v_add_u32 v[v_t0], s[s_t0], v[v_u_lq]
    v_mul_lo_u32 v[v_t0], v[v_t0], s[s_q_ss]
.if FP8
    fp8_load_q                                          ; fmha_fp8.inc: 4 loads
.else
    v_lshl_add_u32 v[v_u_qoff], v[v_u_lh], 4, v[v_t0]
    .set _s, 0
    .rept D_STEPS
        buffer_load_dwordx4 v[v_q + 4*_s : v_q + 4*_s + 3], v[v_u_qoff], s[s_rsrc_q:s_rsrc_q+3], 0 offen offset: 32*_s
        .set _s, _s + 1
    .endr
.endif

    ; --- tile counts (keys visible to query i: j < lim(i) = min(seq_k, i + seq_k - seq_q + 1) if causal) ---
    s_add_u32 s[s_t0], s[s_q0], s[s_t0]                 ; q_first = q0 + 32w
    s_add_u32 s[s_t1], s[s_q0], Q_TILE - 1
    s_sub_u32 s[s_t3], s[s_seq_q], 1
    s_min_u32 s[s_t1], s[s_t1], s[s_t3]                 ; last valid row of the tile
.if WINDOW
    window_tile_counts                                  ; fmha_window.inc: tiles from t_lo, the wave's ws .. w
.elseif FMHA_CAUSAL
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
    s_max_u32 s[s_wm2], s[s_wtiles], 2
    s_sub_u32 s[s_wm2], s[s_wm2], 2
.if WINDOW
    window_wave_counts
.endif
.if WINDOW && !PAGED
    window_descriptors                                  ; fmha_window.inc: from row 64 t_lo to the last tile
.elseif FMHA_CAUSAL && !PAGED
    ; K/V descriptors end at the workgroup's last tile (when that is before seq_k): the
    ; unconditional DMA of the last iterations then reads zeros, not memory
    s_lshl_b32 s[s_t1], s[s_ntiles], 6
    s_cmp_lt_u32 s[s_t1], s[s_seq_k]
    s_cbranch_scc0 L_no_clamp
    s_mul_i32 s[s_rsrc_k+2], s[s_t1], s[s_k_ss]         ; 64 n * ss < (seq_k - 1) * ss: no overflow
    s_mul_i32 s[s_rsrc_v+2], s[s_t1], s[s_v_ss]
L_no_clamp:
.endif

    ; --- per-lane mask limit: v_lim4 = lim(q) - 4(l/32) ---
    v_add_u32 v[v_t0], s[s_t0], v[v_u_lq]                 ; q = q0 + 32w + l%32
.if FMHA_CAUSAL || WINDOW
    v_add_u32 v[v_t0], s[s_t2], v[v_t0]
    v_min_i32 v[v_t0], s[s_seq_k], v[v_t0]
.else
    v_mov_b32 v[v_t0], s[s_seq_k]
.endif
    v_lshlrev_b32 v[v_t1], 2, v[v_u_lh]
    v_sub_u32 v[v_lim4], v[v_t0], v[v_t1]
.if WINDOW
    v_subrev_u32 v[v_lim4], s[s_tlo], v[v_lim4]         ; (in t_lo's frame, as v_lo4)
.endif

    ; --- LDS read addresses ---
.if FP8
    fp8_lds_addresses                                   ; fmha_fp8.inc
.else
    ; K: key l%32 (+32 kb), chunk c = 2s + l/32 at key*ROW_BYTES + 16*(c ^ kswz(key)),
    ; kswz(key) = key%16 (HEAD_DIM 64: (key/2)%8, 8 chunks a row)
.if HEAD_DIM == 64
    v_lshlrev_b32 v[v_t1], 7, v[v_u_lq]
    v_bfe_u32 v[v_t2], v[v_u_lq], 1, 3
.else
    v_lshlrev_b32 v[v_t1], 8, v[v_u_lq]
    v_and_b32 v[v_t2], 15, v[v_u_lq]
.endif
    .set _s, 0
    .rept D_STEPS
        v_add_u32 v[v_u3], 2*_s, v[v_u_lh]
        v_xor_b32 v[v_u3], v[v_u3], v[v_t2]
        v_lshl_add_u32 v[v_kaddr + _s], v[v_u3], 4, v[v_t1]
        .set _s, _s + 1
    .endr
    ; V (ds_read_b64_tr_b16): lane 16bb + 4j + m reads 8 bytes of row rr = 4(bb/2) + j
    ; (+16ks +8x by offset) at d = 32db + 16(bb%2) + 4m: chunk c = 4db + 2(bb%2) + m/2,
    ; address rr*ROW_BYTES + 16*(c ^ swizzle(rr)) + 8(m%2), swizzle(rr) = 4(rr%4) | 2((rr/4)%2) = 4j + 2(l/32)
    ; (HEAD_DIM 64: 4((rr/2)%2) | 2((rr/4)%2) = 4(j/2) + 2(l/32), within a row's 8 chunks)
    ; (the offsets' 8x + 16ks rows leave it unchanged)
    v_bfe_u32 v[v_t0], v[v_lane], 2, 2                  ; j
    v_lshl_add_u32 v[v_t0], v[v_u_lh], 2, v[v_t0]         ; rr = 4(bb/2) + j   (bb/2 = l/32)
    v_bfe_u32 v[v_t1], v[v_lane], 4, 1                  ; bb % 2
    v_bfe_u32 v[v_t2], v[v_lane], 1, 1                  ; m / 2
    v_lshl_add_u32 v[v_t1], v[v_t1], 1, v[v_t2]         ; 2(bb%2) + m/2
.if HEAD_DIM == 64
    v_bfe_u32 v[v_t2], v[v_t0], 1, 1                    ; j/2 = (rr/2) % 2
.else
    v_and_b32 v[v_t2], 3, v[v_t0]                       ; j = rr % 4
.endif
    v_lshlrev_b32 v[v_t2], 2, v[v_t2]
    v_lshl_add_u32 v[v_t2], v[v_u_lh], 1, v[v_t2]        ; swizzle(rr)
    v_and_b32 v[v_u3], 1, v[v_lane]                     ; m % 2
    v_lshlrev_b32 v[v_u3], 3, v[v_u3]
.if HEAD_DIM == 64
    v_lshl_add_u32 v[v_u3], v[v_t0], 7, v[v_u3]         ; rr*128 + 8(m%2)
.else
    v_lshl_add_u32 v[v_u3], v[v_t0], 8, v[v_u3]         ; rr*256 + 8(m%2)
.endif
    .set _d, 0
    .rept D_BLOCKS
        v_add_u32 v[v_u4], 4*_d, v[v_t1]
        v_xor_b32 v[v_u4], v[v_u4], v[v_t2]
        v_lshl_add_u32 v[v_vaddr + _d], v[v_u4], 4, v[v_u3]
        .set _d, _d + 1
    .endr

.endif

.if FP8
    fp8_dma_setup                                       ; fmha_fp8.inc: one line of 8 rows per wave
.elseif PAGED
    paged_dma_setup                                     ; fmha_paged.inc: cbase of K and V
.elseif HEAD_DIM == 64
    ; --- DMA voffsets: lane i fills row r = 8w + i/8 (line w, 128-byte rows), slot i%8 with
    ; chunk slot ^ swizzle(r): K's (r/2)%8, V's 4((r/2)%2) | 2((r/4)%2) (the read addresses' swizzles)
    v_lshrrev_b32 v[v_t0], 3, v[v_lane]                 ; i/8
    v_and_b32 v[v_t1], 7, v[v_lane]                     ; slot
    s_lshl_b32 s[s_t1], s[s_wave], 3                    ; 8w: first row of line w
    v_add_u32 v[v_t2], s[s_t1], v[v_t0]                 ; r
    v_bfe_u32 v[v_u3], v[v_t2], 1, 3                    ; (r/2) % 8
    v_xor_b32 v[v_u3], v[v_u3], v[v_t1]                 ; K chunk
    v_mul_lo_u32 v[v_u4], v[v_t2], s[s_k_ss]
    v_lshl_add_u32 v[v_dma_k0], v[v_u3], 4, v[v_u4]
    v_bfe_u32 v[v_u3], v[v_t2], 1, 1                    ; (r/2) % 2
    v_bfe_u32 v[v_u4], v[v_t2], 2, 1                    ; (r/4) % 2
    v_lshlrev_b32 v[v_u3], 2, v[v_u3]
    v_lshl_or_b32 v[v_u3], v[v_u4], 1, v[v_u3]          ; V's swizzle(r)
    v_xor_b32 v[v_u3], v[v_u3], v[v_t1]                 ; V chunk
    v_mul_lo_u32 v[v_u4], v[v_t2], s[s_v_ss]
    v_lshl_add_u32 v[v_dma_v0], v[v_u3], 4, v[v_u4]
.else
    ; --- DMA voffsets: lane i fills row 4L + i/16 (L = w, w+8), slot i%16 with chunk slot ^ swizzle(row) ---
    v_lshrrev_b32 v[v_t0], 4, v[v_lane]                 ; i/16
    v_and_b32 v[v_t1], 15, v[v_lane]                    ; slot
    s_lshl_b32 s[s_t1], s[s_wave], 2                    ; 4w: first row of line w
    v_add_u32 v[v_t2], s[s_t1], v[v_t0]                 ; row in tile (line w)
    s_and_b32 s[s_t3], s[s_t1], 15                      ; 4(w%4)
    v_add_u32 v[v_u3], s[s_t3], v[v_t0]                 ; row % 16 (same for line w+8)
    v_xor_b32 v[v_u3], v[v_u3], v[v_t1]                 ; K chunk
    v_mul_lo_u32 v[v_u4], v[v_t2], s[s_k_ss]
    v_lshl_add_u32 v[v_dma_k0], v[v_u3], 4, v[v_u4]
    s_lshl_b32 s[s_t3], s[s_k_ss], 5                    ; line w+8 is 32 rows further
    v_add_u32 v[v_dma_k1], s[s_t3], v[v_dma_k0]
    s_and_b32 s[s_t3], s[s_wave], 1
    s_lshl_b32 s[s_t3], s[s_t3], 1                      ; 2(w%2) = 2((row/4) % 2) (same for line w+8)
    v_lshl_add_u32 v[v_u3], v[v_t0], 2, s[s_t3]         ; V's swizzle(row) = 4(row%4) | 2((row/4)%2) = 4(i/16) | 2(w%2)
    v_xor_b32 v[v_u3], v[v_u3], v[v_t1]                 ; V chunk
    v_mul_lo_u32 v[v_u4], v[v_t2], s[s_v_ss]
    v_lshl_add_u32 v[v_dma_v0], v[v_u3], 4, v[v_u4]
    s_lshl_b32 s[s_t3], s[s_v_ss], 5
    v_add_u32 v[v_dma_v1], s[s_t3], v[v_dma_v0]


.endif

    ; --- state: O = 0, m = -FLT_MAX (its -m starts at 0: the first GEMM0 gives plain S), l = 0 ---
    .set _r, 0
    .rept HEAD_DIM / 4
        v_mov_b64 v[v_o + _r : v_o + _r + 1], 0
        .set _r, _r + 2
    .endr
    .set _r, 0
    .rept 8
        v_mov_b64 v[v_negm + _r : v_negm + _r + 1], 0
        .set _r, _r + 2
    .endr
    v_mov_b32 v[v_m], M_INIT
    v_mov_b64 v[v_l:v_l+1], 0
    v_mov_b32 v[v_neginf], NEG_INF
    s_mov_b32 s[s_resc], 0
    s_mov_b32 s[s_kb_next], TILE_BYTES                  ; iteration 0's GEMM0 reads K(1) in K[1]
    s_mov_b32 s[s_kbuf_cur], 0                          ; v_kaddr point at K[0] (GEMM0(0))

    ; --- K(0), K(1) in flight; Q pre-scaled by scale*log2(e) meanwhile ---
    s_mov_b32 s[s_j], 0
    s_cmp_eq_u32 s[s_ntiles], 0
    s_cbranch_scc1 L_wait_q0
.if PAGED
    paged_first_dma                                     ; fmha_paged.inc: K(0), K(1) gathered from pages
    s_branch L_q_scale
.endif
    dma_tile s_rsrc_k, v_dma_k0, v_dma_k1, s_m0k, LDS_K0
    rsrc_advance s_rsrc_k, s_kstep
    s_cmp_lt_u32 s[s_ntiles], 2
    s_cbranch_scc1 L_wait_q2
    dma_tile s_rsrc_k, v_dma_k0, v_dma_k1, s_m0k, LDS_K0 + TILE_BYTES
    rsrc_advance s_rsrc_k, s_kstep
    s_waitcnt vmcnt(2 * DMA_LINES)                      ; in flight: D_STEPS Q loads, K(0), K(1) -> wait for Q
    s_branch L_q_scale
L_wait_q2:
    s_waitcnt vmcnt(DMA_LINES)                          ; in flight: D_STEPS Q loads, K(0) -> wait for Q
    s_branch L_q_scale
L_wait_q0:
    s_waitcnt vmcnt(0)                                  ; in flight: 8 Q loads -> wait for them
L_q_scale:
.if !FP8                                                ; (FP8 scales the scores, not Q: exp2_op)
    v_mov_b32 v[v_corr], s[s_scale_log2]
    .set _r, 0
    .rept 4 * D_STEPS
.if F16
        v_cvt_f32_f16 v[v_t0], v[v_q + _r]
        v_lshrrev_b32 v[v_t1], 16, v[v_q + _r]
        v_cvt_f32_f16 v[v_t1], v[v_t1]
.else
        v_lshlrev_b32 v[v_t0], 16, v[v_q + _r]
        v_and_b32 v[v_t1], 0xffff0000, v[v_q + _r]
.endif
        v_pk_mul_f32 v[v_t0:v_t1], v[v_t0:v_t1], v[v_corr:v_corr+1] op_sel_hi:[1,0]
        cvt_pk_f32 v[v_q + _r], v[v_t0], v[v_t1]
        .set _r, _r + 1
    .endr
.endif
    s_waitcnt vmcnt(0)                                  ; in flight: K(0), K(1) -> wait for them
    s_cmp_eq_u32 s[s_ntiles], 0
    s_cbranch_scc1 L_epilogue
    s_barrier                                           ; every wave's lines of K(0) landed
    s_cmp_eq_u32 s[s_wtiles], 0
    s_cbranch_scc1 L_loops
.if WINDOW
    s_cmp_lg_u32 s[s_wfirst], 0
    s_cbranch_scc1 L_loops                              ; (GEMM0(ws) in the loop's g0only body)
.endif
    ; GEMM0(0) only: S(0) into v_s0 from K[0]
    iteration tag=pre, parity=1, gemm1=0, softmax=0, gemm0=1, first=0, group=0
    s_nop 7                                             ; S(0) was written by the last MFMA: 12 wait states
    s_nop 3                                             ; before the first softmax reads it
.if FP8
    s_nop 7                                             ; (FP8: 16 passes, 20 wait states)
.endif
L_loops:

; ============================================================================ main loop
; Group 1 (waves 0-3) passes barrier j at the top of iteration j; group 2 (waves 4-7)
; between phase A and phase B of iteration j-1: each SIMD runs one wave of each, half an
; iteration apart:
;   group 1:  | barrier j, DMA j || A(j)   B(j)              | barrier j+1 ...
;   group 2:  | barrier j, DMA j || B(j-1) | A(j)             | barrier j+1 ...
; Barrier k: every wave waited (vmcnt) for its own DMA lines of barrier k-1, so K(k+1) and
; V(k-1) are complete; group 1 finished A/B(k-1), group 2 finished A(k-1) and B(k-2).
; DMA k (each wave, after barrier k): K(k+2) -> K[(k+2) % 3], whose K(k-1) was last read
; by B(k-2), and V(k) -> V[k % 2], whose V(k-2) was last read by A(k-1). Group 2 passes
; one extra barrier first (barrier 0, before its loop) and group 1 one last (n+1), so the
; counts match.
; Each loop runs j = 0 .. n, choosing per iteration the body this wave runs (w = its tile
; count): full (1 <= j <= w-2), first (j = 0), last (j = w-1), A only (j = w), DMA only
; (j > w or w = 0). Every body passes the same barriers and issues its DMA: a tile past
; the workgroup's last reads zeros (empty descriptor; PAGED: K rows clamped to seq_k - 1,
; V zeros: pdma_vload).
.macro main_loop g
L\g\()_iter:
    .if \g == 1
        .if BLKS
        s_waitcnt vmcnt(0) lgkmcnt(0)   ; in flight: my DMA lines of barrier j-1, the scale-table write -> wait for them
        .else
        s_waitcnt vmcnt(0)              ; in flight: my DMA lines of barrier j-1 -> wait for them
        .endif
        s_barrier                       ; barrier j: everyone's landed; group 1 finished iteration j-1,
                                        ; group 2 its phase A
        blk_shift
    .endif
    s_add_u32 s[s_kd_line], s[s_m0k], s[s_kd_off]
    s_lshl_b32 s[s_tile_start], s[s_j], 6
    .if WINDOW
        s_add_u32 s[s_t0], s[s_wfirst], 1
        s_sub_u32 s[s_t0], s[s_j], s[s_t0]
    .else
        s_sub_u32 s[s_t0], s[s_j], 1
    .endif
    s_cmp_lt_u32 s[s_t0], s[s_wm2]      ; 1 <= j <= w-2 (WINDOW: ws + 1 <= j <= w - 2): the full body
    s_cbranch_scc0 L\g\()_dispatch_rare
    s_bitcmp1_b32 s[s_j], 0
    s_cbranch_scc1 L\g\()_full_1
    ; full body, even j: GEMM1(j-1), softmax(j), GEMM0(j+1)
    iteration tag=g\g\()_full_0, parity=0, gemm1=1, softmax=1, gemm0=1, first=0, group=\g
L\g\()_next:
    s_add_u32 s[s_j], s[s_j], 1
    .if BLKS
        blks_next_table                 ; scale tables rotate mod 3
    .endif
    s_add_u32 s[s_kb_next], s[s_kb_next], TILE_BYTES    ; K buffers rotate mod 3 (POSTHOC: mod K_BUFS)
.ifdef POSTHOC
    s_cmp_ge_u32 s[s_kb_next], K_BUFS * TILE_BYTES
.else
    s_cmp_ge_u32 s[s_kb_next], 3 * TILE_BYTES
.endif
    s_cselect_b32 s[s_kb_next], 0, s[s_kb_next]
    s_add_u32 s[s_kd_off], s[s_kd_off], TILE_BYTES
.ifdef POSTHOC
    s_cmp_ge_u32 s[s_kd_off], K_BUFS * TILE_BYTES
.else
    s_cmp_ge_u32 s[s_kd_off], 3 * TILE_BYTES
.endif
    s_cselect_b32 s[s_kd_off], 0, s[s_kd_off]
    s_cmp_le_u32 s[s_j], s[s_ntiles]
    s_cbranch_scc1 L\g\()_iter
    .if \g == 1
        s_waitcnt vmcnt(0)              ; in flight: my DMA lines of barrier n -> wait for them, as at every barrier
        s_barrier                       ; barrier n+1: group 2 passes it in its last iteration
    .endif
    s_branch L_epilogue
L\g\()_full_1:
    ; full body, odd j
    iteration tag=g\g\()_full_1, parity=1, gemm1=1, softmax=1, gemm0=1, first=0, group=\g
    s_branch L\g\()_next
    main_loop_rare \g
.endm

; The reduced bodies of main_loop \g: the first, the last, A only and DMA only
.macro main_loop_rare g
L\g\()_dispatch_rare:
    s_cmp_eq_u32 s[s_wtiles], 0
    s_cbranch_scc1 L\g\()_dma_only
    s_cmp_gt_u32 s[s_j], s[s_wtiles]
    s_cbranch_scc1 L\g\()_dma_only
    .if WINDOW
        s_add_u32 s[s_t0], s[s_j], 1
        s_cmp_eq_u32 s[s_t0], s[s_wfirst]
        s_cbranch_scc1 L\g\()_g0only         ; j = ws - 1: GEMM0(ws) alone
        s_cmp_lt_u32 s[s_j], s[s_wfirst]
        s_cbranch_scc1 L\g\()_dma_only       ; j < ws - 1: before this wave's tiles
    .endif
    s_bitcmp1_b32 s[s_j], 0
    s_cbranch_scc1 L\g\()_dispatch_odd
    s_cmp_eq_u32 s[s_j], s[s_wtiles]
    s_cbranch_scc1 L\g\()_aonly_0
    .if WINDOW
        s_cmp_eq_u32 s[s_j], s[s_wfirst]
    .else
        s_cmp_eq_u32 s[s_j], 0
    .endif
    s_cbranch_scc1 L\g\()_dispatch_first
    ; last body (j = w-1): GEMM1(j-1), softmax(j), no GEMM0
    iteration tag=g\g\()_last_0, parity=0, gemm1=1, softmax=1, gemm0=0, first=0, group=\g
    s_branch L\g\()_next
L\g\()_dispatch_odd:
    s_cmp_eq_u32 s[s_j], s[s_wtiles]
    s_cbranch_scc1 L\g\()_aonly_1
    .if WINDOW
        s_cmp_eq_u32 s[s_j], s[s_wfirst]
        s_cbranch_scc1 L\g\()_dispatch_first_1
    .endif
    iteration tag=g\g\()_last_1, parity=1, gemm1=1, softmax=1, gemm0=0, first=0, group=\g
    s_branch L\g\()_next
L\g\()_dispatch_first:
    .if WINDOW
        s_add_u32 s[s_t0], s[s_wfirst], 1
        s_cmp_eq_u32 s[s_wtiles], s[s_t0]
    .else
        s_cmp_eq_u32 s[s_wtiles], 1
    .endif
    s_cbranch_scc1 L\g\()_first_only
    ; first body (j = 0): softmax(0), GEMM0(1)
    iteration tag=g\g\()_first, parity=0, gemm1=0, softmax=1, gemm0=1, first=1, group=\g
    s_branch L\g\()_next
L\g\()_first_only:
    ; j = 0 = w-1: softmax(0) only
    iteration tag=g\g\()_first_only, parity=0, gemm1=0, softmax=1, gemm0=0, first=1, group=\g
    s_branch L\g\()_next
L\g\()_aonly_0:
    ; A only (j = w): GEMM1(w-1)
    iteration tag=g\g\()_aonly_0, parity=0, gemm1=1, softmax=0, gemm0=0, first=0, group=\g
    s_branch L\g\()_next
L\g\()_aonly_1:
    iteration tag=g\g\()_aonly_1, parity=1, gemm1=1, softmax=0, gemm0=0, first=0, group=\g
    s_branch L\g\()_next
L\g\()_dma_only:
    s_bitcmp1_b32 s[s_j], 0
    s_cbranch_scc1 L\g\()_dma_only_1
    ; DMA only (j > w or w = 0): this wave computes nothing but passes the barrier and loads its lines
    iteration tag=g\g\()_dma_0, parity=0, gemm1=0, softmax=0, gemm0=0, first=0, group=\g
    s_branch L\g\()_next
L\g\()_dma_only_1:
    iteration tag=g\g\()_dma_1, parity=1, gemm1=0, softmax=0, gemm0=0, first=0, group=\g
    s_branch L\g\()_next
    .if WINDOW
        window_bodies \g
    .endif
.endm

; WINDOW: the bodies of a wave whose first tile ws may be odd or past 0: the first
; (softmax(ws), GEMM0(ws+1)) and first-only bodies at odd j, and GEMM0(ws) alone at
; j = ws - 1 (the pre-loop GEMM0(0)'s place)
.macro window_bodies g
L\g\()_dispatch_first_1:
    s_add_u32 s[s_t0], s[s_wfirst], 1
    s_cmp_eq_u32 s[s_wtiles], s[s_t0]
    s_cbranch_scc1 L\g\()_first_only_1
    iteration tag=g\g\()_first_1, parity=1, gemm1=0, softmax=1, gemm0=1, first=1, group=\g
    s_branch L\g\()_next
L\g\()_first_only_1:
    iteration tag=g\g\()_first_only_1, parity=1, gemm1=0, softmax=1, gemm0=0, first=1, group=\g
    s_branch L\g\()_next
L\g\()_g0only:
    s_bitcmp1_b32 s[s_j], 0
    s_cbranch_scc1 L\g\()_g0only_1
    iteration tag=g\g\()_g0only_0, parity=0, gemm1=0, softmax=0, gemm0=1, first=0, group=\g
    g0only_wait
    s_branch L\g\()_next
L\g\()_g0only_1:
    iteration tag=g\g\()_g0only_1, parity=1, gemm1=0, softmax=0, gemm0=1, first=0, group=\g
    g0only_wait
    s_branch L\g\()_next
.endm

; After GEMM0 alone: S was written by the last MFMA, 12 wait states (FP8 20) before the next
; body's softmax reads it (as after the pre-loop GEMM0(0))
.macro g0only_wait
    s_nop 7
    s_nop 3
.if FP8
    s_nop 7
.endif
.endm

    s_cmp_ge_u32 s[s_wave], 4
    s_cbranch_scc1 L_group2
    s_mov_b32 s[s_kd_off], 2 * TILE_BYTES       ; group 1's iteration j fills K[(j+2) % 3]
    main_loop 1
L_group2:
    ; group 2 passes barrier 0 and issues its DMA here, then runs half an iteration behind
    s_waitcnt vmcnt(0)                          ; in flight: none (the prologue waited for K(0), K(1)); as at every barrier
    s_barrier                                   ; barrier 0
    blk_shift
    s_mov_b32 s[s_kd_off], 2 * TILE_BYTES
    s_add_u32 s[s_kd_line], s[s_m0k], s[s_kd_off]
    .set _i, 0
    .rept DMA_OPS
        dma_op _i, 0                            ; K(2) -> K[2], V(0) -> V[0]
        .set _i, _i + 1
    .endr
.ifdef POSTHOC
    s_mov_b32 s[s_kd_off], 3 * TILE_BYTES       ; group 2's iteration j fills K[(j+3) % 4] (barrier j+1)
.else
    s_mov_b32 s[s_kd_off], 0                    ; group 2's iteration j fills K[j % 3] (barrier j+1)
.endif
    main_loop 2

; ============================================================================ epilogue
L_epilogue:
    load_kernarg s_has_sinks, has_sinks
.if PAGED
    s_waitcnt vmcnt(0)                  ; in flight: the last DMA's page entries (v_g_* in the O staging below)
.endif
    s_nop 7                             ; O^T was written by the last MFMA: 12 wait states before VALU reads
    s_nop 3                             ; (8 + 4)
.if FP8
    s_nop 7                             ; (FP8: 16 passes, 20 wait states)
.endif
    ; l: partial sums, then the two lane halves
    v_add_f32 v[v_t0], v[v_l], v[v_l + 1]
    v_mov_b32 v[v_t1], v[v_t0]
    s_nop 1                             ; VALU write -> v_permlane32_swap read: 2 wait states
    v_permlane32_swap_b32 v[v_t0], v[v_t1]
    v_add_f32 v[v_t0], v[v_t0], v[v_t1] ; l of the row, in both halves
    s_waitcnt lgkmcnt(0)                ; in flight: has_sinks -> wait for it
    s_cmp_lg_u32 s[s_has_sinks], 0
    s_cbranch_scc1 L_sinks              ; attention sinks: 1 / l and the LSE out of line (sinks_row)
    v_max_f32 v[v_t1], 1.0, v[v_t0]
    v_rcp_f32 v[v_corr], v[v_t1]        ; 1 / l (l >= 1 once the row saw a finite score; O = 0 x 1 without)
    v_log_f32 v[v_t2], v[v_t0]          ; log2 l (-inf for a row whose scores were all -inf)
    empty_rows_nan                      ; (its VALU ops give the rcp's 1 wait state)
.if FP8
    .if BLK
    v_add_f32 v[v_t2], v[v_m], v[v_t2]                  ; (BLK: m is in log2 units)
    .else
    v_fma_f32 v[v_t2], v[v_m], s[s_c], v[v_t2]          ; (m is in raw score units)
    .endif
.else
    v_add_f32 v[v_t2], v[v_m], v[v_t2]
.endif
    v_mul_f32 v[v_t2], LN2, v[v_t2]     ; LSE = (m + log2 l) * ln 2
L_sinks_back:
.if FP8
    v_mul_f32 v[v_corr], s[s_vd], v[v_corr]             ; O = v_descale * P V / l (the factor <= v_descale)
.endif
.if BLK
    v_mul_f32 v[v_corr], s[s_vd_cur], v[v_corr]         ; ... * v_scale of the last tile (O_acc is in its units)
.endif
    o_scale v_corr
    ; O^T block db, register 4g + e holds d = 32db + 8g + 4(l/32) + e (4 consecutive d, 8
    ; bytes). Pair q = 2db + p of groups g0 = 2p, g1 = 2p+1: X = lane's 8 bytes of g0,
    ; Y = of g1; one v_permlane32_swap per VGPR trades the low half's Y for the high half's
    ; X, so lanes 0-31 hold d 32db + 16p + 0..7 and lanes 32-63 d + 8..15: 16 contiguous
    ; bytes per lane, one buffer_store_dwordx4 per pair.
    v_and_b32 v[v_t0], 31, v[v_lane]
    s_lshl_b32 s[s_t0], s[s_wave], 5
    v_add_u32 v[v_t0], s[s_t0], v[v_t0]                 ; row in tile: 32w + l%32
    v_mul_lo_u32 v[v_t1], v[v_t0], s[s_o_ss]
    v_lshrrev_b32 v[v_kaddr], 5, v[v_lane]              ; (K addresses are done with)
    v_lshl_add_u32 v[v_t1], v[v_kaddr], 4, v[v_t1]      ; + 16 * (l/32)
    .set _q, 0
    .rept D_STEPS
        .set _o0, v_o + 16*(_q/2) + 8*(_q%2)            ; group g0 = 2p of block db = q/2, p = q%2
        cvt_pk_f32 v[v_op + 4*_q], v[_o0], v[_o0 + 1]
        cvt_pk_f32 v[v_op + 4*_q + 1], v[_o0 + 2], v[_o0 + 3]
        cvt_pk_f32 v[v_op + 4*_q + 2], v[_o0 + 4], v[_o0 + 5]
        cvt_pk_f32 v[v_op + 4*_q + 3], v[_o0 + 6], v[_o0 + 7]
        .set _q, _q + 1
    .endr
    .set _q, 0                                          ; (VALU write -> permlane read: >= 2 ops apart)
    .rept D_STEPS
        v_permlane32_swap_b32 v[v_op + 4*_q], v[v_op + 4*_q + 2]
        v_permlane32_swap_b32 v[v_op + 4*_q + 1], v[v_op + 4*_q + 3]
        .set _q, _q + 1
    .endr
    .set _q, 0
    .rept D_STEPS
        buffer_store_dwordx4 v[v_op + 4*_q : v_op + 4*_q + 3], v[v_t1], s[s_rsrc_o:s_rsrc_o+3], 0 offen offset: 64*(_q/2) + 32*(_q%2)
        .set _q, _q + 1
    .endr
    s_cmp_eq_u32 s[s_store_lse], 0
    s_cbranch_scc1 L_end
    v_lshlrev_b32 v[v_t0], 2, v[v_t0]
    s_mov_b64 s[s_exec_save:s_exec_save+1], exec
    s_mov_b32 exec_hi, 0                ; lanes 0..31 hold the 32 rows (lanes 32..63 repeat them)
    buffer_store_dword v[v_t2], v[v_t0], s[s_rsrc_lse:s_rsrc_lse+3], 0 offen
    s_mov_b64 exec, s[s_exec_save:s_exec_save+1]
L_end:
    s_endpgm

; ============================================================================ rare paths
.irp g, 1, 2
    rare_mask g\g\()_first, 0
    rare_mask g\g\()_first_only, 0
    rare_mask g\g\()_full_0, 0
    rare_mask g\g\()_full_1, 1
    rare_mask g\g\()_last_0, 0
    rare_mask g\g\()_last_1, 1
.ifdef POSTHOC
    rare_redo g\g\()_full_0, 0, 1     ; fmha_fp8.inc
    rare_redo g\g\()_full_1, 1, 1
    rare_redo g\g\()_last_0, 0, 0
    rare_redo g\g\()_last_1, 1, 0
    .if BLK                             ; (the O rescale of a new v scale)
        .irp t, full_0, full_1, last_0, last_1
            rare_orescale g\g\()_\t
        .endr
    .endif
.else
    rare_prep g\g\()_full_0, 0
    rare_prep g\g\()_full_1, 1
    rare_prep g\g\()_last_0, 0
    rare_prep g\g\()_last_1, 1
    rare_orescale g\g\()_full_0
    rare_orescale g\g\()_full_1
    rare_orescale g\g\()_last_0
    rare_orescale g\g\()_last_1
.endif
.if WINDOW
    rare_mask g\g\()_first_1, 1
    rare_mask g\g\()_first_only_1, 1
.endif
.endr
    sinks_row
