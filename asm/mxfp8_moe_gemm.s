; mxfp8_moe_gemm — MX-FP8 grouped GEMM over sorted tokens (MoE), v_mfma_scale_f32_16x16x128_f8f6f4
;
;   out[t, n] = tw[t] * sum_k  a[t / a_div, k] 2^(a_scale[t / a_div, k/32] - 127)
;                            * w[e, n, k] 2^(w_scale[e, n, k/32] - 127)
;
; for every slot t in a block of sorted_token_ids whose expert e = expert_ids[block] is in
; [0, E), with block * BM < num_tokens_post_padded[0] and t < valid (= M * a_div; larger
; ids are the padding sentinel); tw[t] = topk_weights[t] when has_weights, else 1. Every
; other output row is left untouched. a [M, K], w [E, N, K] e4m3 (K contiguous), scales
; E8M0 bytes [.., K/32]; K % 32 == 0. Output bf16 (OUT_F16 = 0) or f16 into out [valid, N].
;
; gfx950, wave64, 256 work-items = 4 waves. Defines: MT (16-row tiles per block: BM = 16*MT
; = block_m), NT (16-column weight strips per workgroup), OUT_F16, SWIGLU (0 unless defined;
; below). Grid: x = cdiv(N, 16*NT) column tiles, y = blocks (one block of BM sorted slots each).
;
; 64-bit expert addressing: the block's expert base w + e*N*K (and w_scale + e*N*K/32) is
; formed in 64-bit scalar arithmetic (s_mul_i32 / s_mul_hi_u32, s_add_u32 / s_addc_u32) and
; put in the V#s of b and b_scale with num_records = N*K (N*K/32): only one expert's bytes
; (< 2^31, host-checked) are addressed with 32-bit offsets, so the weight tensor may be any
; size. a, a_scale, out, sorted ids and topk weights are < 2^31 bytes (host-checked).
;
; Rows. Lane i of tile t (A operand row 16t + i) reads slot id sorted_token_ids[block*BM +
; 16t + i]; its activation row is slot / a_div (v_mul_hi_u32 by a_div_magic = ceil(2^32 /
; a_div), exact for slot < 2^24 and a_div <= 64; a_div = 1 passes magic 0 and takes the slot
; itself). A sentinel slot gets voffset OOB_OFFSET: its A bytes and scales read 0 and its
; result is never stored. The MFMA, operand layout, K split over the waves and tail step are
; mxfp8_gemm.s's (macros weight_offsets / mfma_k_loop in mxfp8.inc): B operand = 16 weight
; rows of the expert, per 128-K step two 16-byte pieces per lane and one scale byte per lane.
; The K loop is K_DEPTH register sets deep: 3 (two steps' loads in flight per wave) at
; block_m 16 except the plain 64-column tile, else 2. At small T a workgroup is alone on its
; CU and the steps wait on loaded DRAM latency; the third set costs VGPRs (occupancy), which
; the timing model finds a loss for the plain m16_n64 tile and block_m 32/64 are not measured
; (bench/moe_gemm.py, bench/moe.py). The first step's weight loads go out before the slot ids
; are waited for (a_rows, between them and the step's activation loads).
;
; Skips, decided once per workgroup from two scalar loads: block*BM >= num_tokens_post_padded
; (signed) or expert id outside [0, E) (unsigned compare: -1 is 0xffffffff) ends the
; workgroup before any weight load.
;
; Reduction and store. The 4 waves' D tiles meet in LDS (as in mxfp8_gemm), and wave 0 puts
; the block's BM slot ids and row weights there too (before the barrier). Wave w finishes
; tiles w, w+4: for D register r of lane l (row 16t + 4(l/16) + r, column n0 + 16j + l%16)
; it reads the row's slot and weight (ds_read_b128 of 4 rows), sums the 4 copies, multiplies
; by the weight in f32, rounds once to bf16/f16 and stores at out[slot, n]; a sentinel slot
; or n >= N gets voffset OOB_OFFSET and is dropped. With MT * NT = 16 (block_m 64 x 64
; columns, the prefill tile) the row table starts at 64 KiB, past the DS offset field: its
; reads take the base in the address.
;
; SWIGLU = 1 (the MoE layer's gate_up GEMM fused with swiglu_mxfp8_quant; NT = 4, no topk
; weights): w holds [gate rows 0..I-1 | up rows I..2I-1] per expert (N = 2I, I % 32 == 0) and
; workgroup x takes gate columns n0 = 32x .. n0+31 (strips 0, 1) and the matching up columns
; I + n0 .. (strips 2, 3: their weight offsets moved by (I - 32) rows), grid x = I/32. The
; epilogue rounds each summed value to bf16 (as the unfused layer's h) and leaves it in LDS,
; tile q's [16 rows][16 columns] bf16 in its wave-0 copy's slot (read only by the wave that
; finished q, before it writes); after a barrier, work-item 4R + p (R < BM) takes row R's
; gate columns 8p..8p+7 and up columns likewise and runs swiglu_quant8 (swiglu_mxfp8.inc,
; the standalone op's sequence), storing 8 e4m3 bytes at q[slot, n0 + 8p] and, from p = 0,
; the E8M0 byte at scale[slot, x]; sentinel slots store nothing, skipped blocks nothing.
;
; DIRECT = 1 (the MoE layer's decode form; MT = 1): no moe_align; the routing is read straight
; from topk_ids [valid] (global expert ids) through expert_map (has_map) as moe_align would
; (an id outside [0, num_experts), a map entry -1 or any local id outside [0, E): skipped).
;   with SWIGLU: workgroup y = slot t (grid y = valid), one row (tile row 0 = slot t, the
;     others sentinels), its expert from two scalar loads (topk_ids[t], expert_map), skipped
;     as a whole when t's expert is; the epilogue (row_swiglu) reduces that row only and
;     quantises it on 16 lanes: the same bytes as SWIGLU's epilogue, fewer steps.
;   without: workgroup y = token (grid y = tokens) and tile row j < top_k (<= 16) = slot
;     y*top_k + j with its own expert; out [tokens, N] bf16 (the down GEMM and moe_sum in one):
;     out[y, n] = bf16(sum over j in order, f32, of bf16(topk_weights[slot] * row j)), rows of
;     skipped slots adding nothing (+0: weight 0, no loads), a row of only skipped slots 0
;     (the sum runs over all 16 tile rows, unrolled: rows past top_k hold +0).
; The rows' experts are looked up once per workgroup by lanes 0..rows-1 (v_e, -1 when
; skipped), row 0's also by scalar loads, so the first weight loads do not wait for a vector
; round trip (without SWIGLU the vector lookups are waited for at the first row past 0: see
; direct_rows_issue). FLAT_STEPS: the K steps of every row form one flat sequence, row-major (rows x
; cdiv(K, 128)), dealt to the waves as one K is otherwise, so the 3-deep load pipeline runs
; across rows without a restart; flat_step_select points the weight V#s at the step's row's
; expert (num_records 0 when skipped: no bytes read) and the activation offsets at that row
; only (every other row OOB_OFFSET, reading 0), so each row's D gets its own expert's product.
;
; FUSED (defined: the MoE layer's one-launch decode form; DIRECT, MT = 1, NT = 4, K_DEPTH 3):
; both DIRECT kernels in one 1-D grid, producers first: workgroups 0 .. producers-1 are the
; SWIGLU role (producers = up_tiles * valid: workgroup p is slot p / up_tiles, gate columns
; 32 (p % up_tiles)), the rest the sum role (workgroup d = id - producers is token d /
; down_tiles, columns 32 (d % down_tiles)); divisions by the kernargs' magic ceil(2^32 /
; tiles) (0 for one tile; exact while id * tiles < 2^32, host-checked). The same code runs
; both roles: SWIGLU's compile-time choices become branches on s_role, and the sum role reads
; its arguments from the kernarg's second block (d_*, laid out as the first: the kernarg
; pointer is moved by k_d_a, so load_kernarg's names serve both). Every workgroup loads the
; first block with the role's kernargs; a sum workgroup then loads its own block again
; (fused_ids), so a producer pays one kernarg round trip, as swiglu_direct does. Every SWIGLU workgroup,
; skipped or not, adds 1 to the counter `flag` with an agent-scope release of its q and
; scale stores (wave 0: buffer_wbl2 sc1, s_waitcnt vmcnt(0), global_atomic_add: LLVM's
; sequence, fused_release); each wave of a sum workgroup issues its first step's weight loads, then
; polls the counter (global_load sc1, s_sleep between polls) until it reads producers and
; acquires (buffer_inv sc1 after the poll landed) before its first activation load. The
; counter must be 0 at launch (the op allocates it zeroed per call). A producer never waits,
; and the producers have the lowest ids, so they are dispatched before any waiting workgroup
; and cannot be held out by one: the wait is safe whatever the device's resident capacity.
; FUSED_PROBE (never set in kernels.yaml: bench/moe.py --one-launch builds these two objects
; aside to time the launch's phases with the timing model): 1 ends a sum-role wave right after
; its acquire (the role's time up to the wait), 2 where it would start polling, once its
; first step's weight loads landed (the whole grid then charges the producers for the HBM
; those loads take).
; The sum role stores 32 columns (SUM_STRIPS = 2 of the NT = 4 strips the SWIGLU role's 32
; gate + 32 up columns need): its strips 2 and 3 get voffset OOB_OFFSET (their loads move no
; bytes, their MFMAs add zeros to D tiles nobody stores) and the tile epilogue stores tiles
; 0 and 1 only. Each wave still takes flat steps w, w + 4, ... and sums as direct_sum_n32
; does, so the out bytes are the two-launch form's. Why 32: at T = 1 a 64-column sum
; workgroup streams 5 x 64 x 768 weight bytes through one CU's in-flight window after the
; wait, twice a 32-column one's (bench/moe.py --one-launch: 6.7 us alone against 7.6); 16
; columns gains nothing (two workgroups per CU share that window).
;
; Kernarg (k_* from kernels.yaml): a, a_scale, w, w_scale, sorted_token_ids, expert_ids,
; num_tokens_post_padded, topk_weights, out (SWIGLU: q [valid, I] e4m3 and scale [valid, I/32]);
; M, N, K, E, valid, blocks, block_m, a_div_magic, has_weights (SWIGLU: and neg_alpha_log2e,
; beta, limit f32). DIRECT: topk_ids and expert_map in place of the three routing arrays,
; top_k, num_experts, has_map and tokens in place of blocks and block_m.
; LDS map: [0, 4*TILES KiB) the waves' D tiles (wave w's tile q at (w*TILES + q) KiB, lane l
; at 16*l); LDS_SLOTS: BM i32 slot ids; LDS_WEIGHTS: BM f32 row weights.

.ifndef SWIGLU
    .set SWIGLU, 0
.endif
.ifndef DIRECT
    .set DIRECT, 0
.endif
.set FLAT_STEPS, DIRECT
.include "mxfp8.inc"
.include "swiglu_mxfp8.inc"
.ifdef FUSED                         ; .ifdef: no FUSED symbol in the other variants' objects
    .if (!DIRECT) || SWIGLU || (NT != 4) || OUT_F16 || (K_DEPTH != 3)
        .error "mxfp8_moe_gemm: FUSED takes DIRECT, NT = 4, K_DEPTH = 3, OUT_F16 = 0 and SWIGLU undefined (a runtime role)"
    .endif
    .set F16, 0                      ; the SWIGLU role's swiglu_mxfp8.inc reads the bf16-rounded h
.endif
.if DIRECT && (MT != 1)
    .error "mxfp8_moe_gemm: DIRECT takes MT = 1 (at most 16 rows per workgroup)"
.endif
.if SWIGLU
    .if (NT != 4) || OUT_F16
        .error "mxfp8_moe_gemm: SWIGLU takes NT = 4 (32 gate + 32 up columns) and OUT_F16 = 0"
    .endif
    .set F16, 0                      ; swiglu_mxfp8.inc reads the bf16-rounded h
.endif

.if (MT != 1) && (MT != 2) && (MT != 4)
    .error "mxfp8_moe_gemm: MT must be 1, 2 or 4 (block_m 16, 32, 64)"
.endif
.if (NT != 1) && (NT != 2) && (NT != 4)
    .error "mxfp8_moe_gemm: NT must be 1, 2 or 4"
.endif
.if WORKGROUP_SIZE_X != 256
    .error "mxfp8_moe_gemm: 4 waves of 64 split K"
.endif
.set TILES, MT * NT                  ; D tiles per wave
.ifdef FUSED                         ; (inside: the other variants' symbol tables stay as they were)
    .set SUM_STRIPS, 2               ; the sum role's 16-column strips: 32 columns (FUSED header)
.endif
.set BM, 16 * MT                     ; slots per block
.set LDS_SLOTS, 4 * TILES * 1024
.set LDS_WEIGHTS, LDS_SLOTS + 4 * BM
.if LDS_BYTES < LDS_WEIGHTS + 4 * BM
    .error "mxfp8_moe_gemm: LDS_BYTES must hold 4 waves x TILES x 1 KiB, BM slot ids and BM weights"
.endif
set_log2 NT_SHIFT, NT
.set LOADS, 3 * (NT + MT)            ; vector memory loads per step per wave
.set STEP_SHIFT, 7                   ; 128 bytes of K per MFMA

; --- SGPRs (s[0:1] kernarg, s2/s3 workgroup x/y come from the hardware) ---
.set s_rsrc_a, 8                     ; [8:11]  V# a            (M*K bytes)
.set s_rsrc_as, 12                   ; [12:15] V# a_scale      (M*K/32)
.set s_rsrc_b, 16                    ; [16:19] V# w[e]         (N*K, 64-bit base)
.set s_rsrc_bs, 20                   ; [20:23] V# w_scale[e]   (N*K/32)
.set s_rsrc_out, 24                  ; [24:27] V# out          (valid*N*2)
.set s_rsrc_ids, 28                  ; [28:31] V# sorted_token_ids (blocks*BM*4)
.set s_rsrc_tw, 32                   ; [32:35] V# topk_weights (has_weights*valid*4)
.set s_eptr, 36                      ; [36:37] &expert_ids[block]
.set s_nptr, 38                      ; [38:39] num_tokens_post_padded
.set s_M, 40
.set s_N, 41
.set s_K, 42
.set s_E, 43
.set s_valid, 44
.set s_blocks, 45
.set s_magic, 46                     ; ceil(2^32 / a_div); 0 for a_div = 1
.set s_has_w, 47
.set s_KB, 48                        ; K/32
.set s_wave, 49
.set s_step, 50                      ; step whose MFMAs come next
.set s_step_ld, 51                   ; step whose loads go out
.set s_nsteps, 52                    ; cdiv(K, 128)
.set s_full, 53                      ; K / 128: index of the partial step
.set s_stride, 54                    ; 4: steps between a wave's steps
.set s_k0, 55                        ; 128*step: soffset of data loads
.set s_kb0, 56                       ; 4*step: soffset of scale loads
.set s_krem, 57                      ; K % 128
.set s_n0, 58                        ; first output column of the workgroup
.set s_expert, 59
.set s_ntpp, 60                      ; num_tokens_post_padded[0]
.set s_row0, 61                      ; block*BM: the block's first entry of sorted_token_ids
.set s_q, 62                         ; tile a wave finishes
.set s_block_m, 63                   ; = BM (the op picks the variant by it)
.set s_tmp, 64                       ; [64:67] scratch
.set s_colmask, 68                   ; [68:69] lanes whose column is < N
.set s_rsrc_sc, 72                   ; [72:75] SWIGLU: V# scale  (valid*I/32)
.set s_nal, 76                       ; SWIGLU: -alpha * log2(e)
.set s_beta, 77
.set s_limit, 78
.set s_I, 79                         ; SWIGLU: N / 2
.set s_NB, 80                        ; SWIGLU: I / 32
; DIRECT: the routing arrays' SGPRs take the lookup's, s_rsrc_ids topk_ids' V#
.set s_rsrc_map, 36                  ; [36:39] V# expert_map (has_map*num_experts*4)
.set s_topk, 45
.set s_Eg, 60                        ; num_experts (global ids)
.set s_has_map, 61
.set s_tokens, 63
.set s_kstep, 81                     ; K step of s_step_ld (FLAT_STEPS)
.set s_ksteps, 82                    ; cdiv(K, 128)
.set s_jrow, 83                      ; row of s_step_ld
.set s_jcur, 84                      ; row the operands point at (-1: none yet)
.set s_rows, 85                      ; rows of the workgroup
.set s_wbase, 86                     ; [86:87] w
.set s_wsbase, 88                    ; [88:89] w_scale
.set s_rowok, 90                     ; [90:91] all lanes when the current row's expert is here, else 0
.set s_slot0, 92                     ; slot of row 0
.set s_e0, 93                        ; DIRECT without SWIGLU: row 0's local expert (scalar lookup)
.set s_pend, 94                      ; ... 1 while the rows' vector lookups are not mapped yet
.ifdef FUSED                         ; (inside: the other variants' symbol tables stay as they were)
    .set s_flag, 96                  ; [96:97] the counter of released producers
    .set s_prod, 98                  ; producers (SWIGLU-role workgroups)
    .set s_role, 99                  ; 1 in a SWIGLU-role workgroup, 0 in a sum-role one
.endif

; --- VGPRs (v0 holds the packed work-item ids) ---
.set v_tid, 1
.set v_lane, 2
.set v_g, 3                          ; lane / 16
.set v_i, 4                          ; lane % 16
.set v_oob, 5                        ; OOB_OFFSET
.set v_tmp, 8                        ; [8:11] scratch
.set v_off_b, 12                     ; [NT] (n0 + 16j + i)*K + 16g within the expert
.set v_off_bs, v_off_b + NT          ; [NT] (n0 + 16j + i)*K/32 + g
.set v_off_a, v_off_bs + NT          ; [MT] (slot/a_div)*K + 16g, or OOB_OFFSET
.set v_off_as, v_off_a + MT          ; [MT] (slot/a_div)*K/32 + g, or OOB_OFFSET
.set v_slot, v_off_as + MT           ; [MT] slot id of row 16t + i
.set v_tw, v_slot + MT               ; [MT] its weight (1.0 without topk_weights)
.set v_e, v_tw + MT                  ; DIRECT: local expert of row i (-1: skipped)
.set SET_B, 0                        ; register set layout: [NT][8] b, [MT][8] a, [NT] b scale, [MT] a scale
.set SET_A, 8 * NT
.set SET_SB, 8 * (NT + MT)
.set SET_SA, SET_SB + NT
.set SET_SIZE, ((SET_SA + MT + 7) / 8) * 8
.set v_set_x, ((v_tw + MT + DIRECT + 7) / 8) * 8 ; K_DEPTH register sets, SET_SIZE apart (after v_e)
.ifndef K_DEPTH                      ; the header says why
    .set K_DEPTH, 2
    .if (MT == 1) && (SWIGLU || (NT <= 2))
        .set K_DEPTH, 3
    .endif
.endif
.set v_acc, v_set_x + K_DEPTH * SET_SIZE ; [MT][NT][4] f32 D tiles, tile q = NT*t + j
.set v_end, v_acc + 4 * TILES
.if v_end > 256
    .error "mxfp8_moe_gemm: VGPR budget exceeded"
.endif
; reduction-phase names (the register sets are free by then)
.set v_lds, v_tmp                    ; LDS byte address
.set v_col, v_tmp + 1                ; n
.set v_rows, v_tmp + 2               ; LDS byte offset of the lane's 4 rows' slot ids
.set v_red, v_set_x                  ; [4 waves][4] one tile from every wave
.set v_rslot, v_set_x + 16           ; [4] slot ids of the lane's rows 16t + 4g + r
.set v_rw, v_set_x + 20              ; [4] their weights
.set v_out, v_set_x + 24             ; [2] converted value, store offset
.if 2 * SET_SIZE < 26
    .error "mxfp8_moe_gemm: the reduction's registers must fit in the two register sets"
.endif
; SWIGLU epilogue names (swiglu_mxfp8.inc's), in the register sets too
.set v_gate, v_set_x                 ; [4] packed bf16 gate values
.set v_upv, v_set_x + 4              ; [4] up values
.set v_y, v_set_x + 8                ; [8]
.set v_q, v_set_x + 16               ; [2]
.set v_t, v_set_x + 18               ; [2]
.set v_am, v_set_x + 20
.set v_sc, v_set_x + 21
.set v_cl, v_set_x + 22
.set v_lim, v_set_x + 23
.set v_qslot, v_set_x + 24           ; slot id of the work-item's row
.set v_qoff, v_set_x + 25
.set v_soff, v_set_x + 26
.if SWIGLU && (2 * SET_SIZE < 27)
    .error "mxfp8_moe_gemm: the SWIGLU epilogue's registers must fit in the two register sets"
.endif

; D register \r of the tile being finished: the sum of the four waves' copies
.macro sum_copies r
    v_add_f32 v[v_red+\r], v[v_red+\r], v[v_red+4+\r]
    v_add_f32 v[v_red+\r], v[v_red+\r], v[v_red+8+\r]
    v_add_f32 v[v_red+\r], v[v_red+\r], v[v_red+12+\r]
.endm

; ... times the row's weight, stored at out[slot, n] (dropped for a sentinel slot or n >= N)
.macro store_row r
    sum_copies \r
    v_mul_f32 v[v_red+\r], v[v_red+\r], v[v_rw+\r]
    v_cmp_gt_u32 vcc, s[s_valid], v[v_rslot+\r]             ; slot < valid
    s_and_b64 vcc, vcc, s[s_colmask:s_colmask+1]            ; and n < N
    v_mul_lo_u32 v[v_out+1], v[v_rslot+\r], s[s_N]
    v_add_u32 v[v_out+1], v[v_out+1], v[v_col]              ; slot*N + n
    v_lshlrev_b32 v[v_out+1], 1, v[v_out+1]
    v_cndmask_b32 v[v_out+1], v[v_oob], v[v_out+1], vcc
.if OUT_F16
    v_cvt_f16_f32 v[v_out], v[v_red+\r]                     ; round to nearest even
.else
    v_cvt_pk_bf16_f32 v[v_out], v[v_red+\r], 0              ; round to nearest even; high half unused
.endif
    buffer_store_short v[v_out], v[v_out+1], s[s_rsrc_out:s_rsrc_out+3], 0 offen
.endm

; SWIGLU: ... rounded to bf16 into LDS at row 4g + \r, column i of the tile's [16][16] (v_rows)
.macro stage_row r
    sum_copies \r
    v_cvt_pk_bf16_f32 v[v_out], v[v_red+\r], 0                     ; round to nearest even, as h
    ds_write_b16 v[v_rows], v[v_out] offset:32*\r
.endm

; The block's rows, once its slot ids land: activation rows slot / a_div (sentinels:
; OOB_OFFSET) as the A offsets, and the row weights (loads). mfma_k_loop runs it with the
; first step's 3*NT weight loads in flight after the slot-id loads.
.macro a_rows
    v_lshlrev_b32 v[v_tmp+1], 4, v[v_g]                     ; 16g
    s_cmp_eq_u32 s[s_magic], 0
    s_cselect_b64 s[s_tmp:s_tmp+1], exec, 0                 ; lanes taking the slot itself (a_div = 1)
    s_waitcnt vmcnt(3 * NT)                                 ; in flight: MT slot ids, then 3*NT weight loads → ids landed
    .set t_, 0
    .rept MT
        v_mul_hi_u32 v[v_tmp], v[v_slot+t_], s[s_magic]     ; slot / a_div
        v_cndmask_b32_e64 v[v_tmp], v[v_tmp], v[v_slot+t_], s[s_tmp:s_tmp+1]
        v_cmp_gt_u32 vcc, s[s_valid], v[v_slot+t_]          ; slot < valid: a real row
        v_mul_lo_u32 v[v_off_a+t_], v[v_tmp], s[s_K]
        v_add_u32 v[v_off_a+t_], v[v_off_a+t_], v[v_tmp+1]
        v_cndmask_b32 v[v_off_a+t_], v[v_oob], v[v_off_a+t_], vcc
        v_mul_lo_u32 v[v_off_as+t_], v[v_tmp], s[s_KB]
        v_add_u32 v[v_off_as+t_], v[v_off_as+t_], v[v_g]
        v_cndmask_b32 v[v_off_as+t_], v[v_oob], v[v_off_as+t_], vcc
        .set t_, t_ + 1
    .endr
    s_cmp_eq_u32 s[s_has_w], 0
    s_cbranch_scc1 L_weights_done_\@
    .set t_, 0
    .rept MT
        v_cmp_gt_u32 vcc, s[s_valid], v[v_slot+t_]
        v_lshlrev_b32 v[v_tmp], 2, v[v_slot+t_]
        v_cndmask_b32 v[v_tmp], v[v_oob], v[v_tmp], vcc     ; a sentinel's weight reads 0 (never used)
        buffer_load_dword v[v_tw+t_], v[v_tmp], s[s_rsrc_tw:s_rsrc_tw+3], 0 offen
        .set t_, t_ + 1
    .endr
L_weights_done_\@:
.endm

; SWIGLU: strips 2, 3 read up rows I + n0 + 16(j - 2) + i, (I - 32) rows past the rows
; n0 + 16j + i that weight_offsets addressed: move their weight and scale offsets there
.macro up_strip_offsets
    s_sub_u32 s[s_tmp+2], s[s_I], 32
    s_mul_i32 s[s_tmp], s[s_tmp+2], s[s_K]
    s_mul_i32 s[s_tmp+1], s[s_tmp+2], s[s_KB]
    .irp j, 2, 3
        v_add_u32 v[v_off_b+\j], s[s_tmp], v[v_off_b+\j]
        v_add_u32 v[v_off_bs+\j], s[s_tmp+1], v[v_off_bs+\j]
    .endr
.endm

; V# \s_rsrc of expert s_expert's part of the tensor at the pointer s[\base:\base+1]: base +
; s_expert * s[s_tmp] bytes (s[s_tmp]: bytes per expert) in 64 bits, num_records \records
.macro expert_rsrc s_rsrc, base, records
    s_mul_i32 s[s_tmp+1], s[s_expert], s[s_tmp]
    s_mul_hi_u32 s[s_tmp+2], s[s_expert], s[s_tmp]
    s_add_u32 s[\s_rsrc], s[\base], s[s_tmp+1]
    s_addc_u32 s[\s_rsrc+1], s[\base+1], s[s_tmp+2]
    buffer_rsrc \s_rsrc, \records
.endm

; DIRECT: the workgroup's rows (s_rows, s_slot0) and, by lanes i < rows, slot s_slot0 + i's
; local expert v_e (-1: id outside [0, num_experts), map entry -1 or local id outside [0, E)),
; v_slot (the sentinel valid for a skipped row) and, without SWIGLU, v_tw (0 for a skipped row:
; it adds +0). Row 0's expert is also looked up by scalar loads (s_expert with SWIGLU, which
; has only that row: v_e = s_expert in every lane, a skipped slot ends the workgroup here and
; v_slot is not used; s_e0 without), so the first weight loads wait for no vector-memory round
; trip. Without SWIGLU the rows' vector lookups (ids and weights) stay in flight under the
; first steps' loads: flat_step_select waits for them at the first row past 0 (rows_landed),
; L_reduce at the latest, and direct_rows_map then maps them (s_pend 1 until then).
; direct_rows_issue (needs the V# of topk_weights) issues the loads, direct_rows_finish, after
; other setup has run under them, waits for the scalar ones.
.macro direct_rows_issue
  .if SWIGLU
    s_mov_b32 s[s_rows], 1
  .else
    s_mov_b32 s[s_rows], s[s_topk]
  .endif
  .ifdef FUSED
    s_cmp_eq_u32 s[s_role], 0
    s_cselect_b32 s[s_rows], s[s_topk], 1                  ; the SWIGLU role: one row
  .endif
    s_mul_i32 s[s_slot0], s[s_wg_y], s[s_rows]
    s_lshl_b32 s[s_tmp], s[s_valid], 2
    buffer_rsrc s_rsrc_ids, s[s_tmp]                        ; topk_ids: valid int32
    s_mul_i32 s[s_tmp], s[s_Eg], s[s_has_map]
    s_lshl_b32 s[s_tmp], s[s_tmp], 2
    buffer_rsrc s_rsrc_map, s[s_tmp]
    s_lshl_b32 s[s_tmp], s[s_slot0], 2
    s_buffer_load_dword s[s_e0], s[s_rsrc_ids:s_rsrc_ids+3], s[s_tmp]   ; slot < valid: in range
  .if !SWIGLU
  .ifdef FUSED
    s_mov_b32 s[s_pend], 0
    s_cmp_eq_u32 s[s_role], 1
    s_cbranch_scc1 L_dr_weights_\@                         ; the SWIGLU role: row 0's scalar lookup only
  .endif
    s_mov_b32 s[s_pend], 1
    v_cmp_gt_u32 s[s_rowok:s_rowok+1], s[s_rows], v[v_i]   ; lanes of a row: i < rows
    v_add_u32 v[v_slot], s[s_slot0], v[v_i]
    v_lshlrev_b32 v[v_tmp], 2, v[v_slot]
    v_cndmask_b32_e64 v[v_tmp], v[v_oob], v[v_tmp], s[s_rowok:s_rowok+1]
    buffer_load_dword v[v_e], v[v_tmp], s[s_rsrc_ids:s_rsrc_ids+3], 0 offen
    s_cmp_eq_u32 s[s_has_w], 0
    s_cbranch_scc1 L_dr_weights_\@                         ; v_tw stays 1.0
    buffer_load_dword v[v_tw], v[v_tmp], s[s_rsrc_tw:s_rsrc_tw+3], 0 offen
L_dr_weights_\@:
  .endif
.endm

.macro direct_rows_finish
    s_waitcnt lgkmcnt(0)                                    ; in flight: row 0's global id → landed
    s_cmp_lt_u32 s[s_e0], s[s_Eg]
    s_cbranch_scc0 L_dr_none_\@                             ; id outside [0, num_experts)
    s_cmp_eq_u32 s[s_has_map], 0
    s_cbranch_scc1 L_dr_mapped_\@
    s_lshl_b32 s[s_tmp], s[s_e0], 2
    s_buffer_load_dword s[s_e0], s[s_rsrc_map:s_rsrc_map+3], s[s_tmp]   ; id < num_experts: in range
    s_waitcnt lgkmcnt(0)                                    ; in flight: the local id → landed
    s_branch L_dr_mapped_\@
L_dr_none_\@:
    s_mov_b32 s[s_e0], -1
L_dr_mapped_\@:
  .if SWIGLU
    s_mov_b32 s[s_expert], s[s_e0]
    s_cmp_ge_u32 s[s_expert], s[s_E]
    s_cbranch_scc1 L_skip                                   ; not here (-1) or out of range
    v_mov_b32 v[v_e], s[s_expert]
  .endif
  .ifdef FUSED                                              ; the SWIGLU role's skip, as above
    s_cmp_eq_u32 s[s_role], 0
    s_cbranch_scc1 L_dr_sum_role_\@
    s_cmp_ge_u32 s[s_e0], s[s_E]
    s_cbranch_scc1 L_skip
L_dr_sum_role_\@:
  .endif
.endm

; Without SWIGLU, the rows' vector lookups landed: v_e mapped to local experts (-1 skipped),
; skipped rows' v_slot to the sentinel and v_tw to 0 (a map entry costs one more round trip)
.macro direct_rows_map
    v_cmp_gt_u32 vcc, s[s_Eg], v[v_e]                       ; a global id in range
    v_cmp_gt_u32 s[s_tmp:s_tmp+1], s[s_rows], v[v_i]        ; of a row
    s_and_b64 vcc, vcc, s[s_tmp:s_tmp+1]
    s_cmp_eq_u32 s[s_has_map], 0
    s_cbranch_scc1 L_dm_mapped_\@
    v_lshlrev_b32 v[v_tmp], 2, v[v_e]
    v_cndmask_b32 v[v_tmp], v[v_oob], v[v_tmp], vcc
    buffer_load_dword v[v_e], v[v_tmp], s[s_rsrc_map:s_rsrc_map+3], 0 offen
    s_waitcnt vmcnt(0)                                      ; in flight: the local ids (and weight loads) → landed
L_dm_mapped_\@:
    v_cndmask_b32 v[v_e], -1, v[v_e], vcc
    v_cmp_gt_u32 vcc, s[s_E], v[v_e]                        ; a local expert here (-1 is not)
    v_cndmask_b32 v[v_e], -1, v[v_e], vcc
    v_mov_b32 v[v_tmp], s[s_valid]
    v_cndmask_b32 v[v_slot], v[v_tmp], v[v_slot], vcc       ; skipped: the sentinel
    v_cndmask_b32 v[v_tw], 0, v[v_tw], vcc                  ; skipped: weight 0
    s_mov_b32 s[s_pend], 0
.endm

; ... their wait inside the K loop: older than every weight load, so at most the weight loads
; of the steps this wave has issued (0, 1, or 2 and more: two sets in flight at most) may stay
.macro rows_landed
    s_sub_u32 s[s_tmp], s[s_step_ld], s[s_step]             ; stride x steps issued
    s_cmp_eq_u32 s[s_tmp], 0
    s_cbranch_scc0 L_rl_one_\@
    s_waitcnt vmcnt(0)                                      ; in flight: the lookups → landed
    s_branch L_rl_done_\@
L_rl_one_\@:
    s_cmp_eq_u32 s[s_tmp], s[s_stride]
    s_cbranch_scc0 L_rl_two_\@
    s_waitcnt vmcnt(LOADS)                                  ; in flight: the lookups, one step → lookups landed
    s_branch L_rl_done_\@
L_rl_two_\@:
    s_waitcnt vmcnt(2 * LOADS)                              ; in flight: the lookups (if not yet), two steps → landed
L_rl_done_\@:
.endm

; DIRECT SWIGLU: the slot is tile row 0, D register 0 of lanes 0..15 in each of the 4 tiles, so
; only that row meets in LDS (wave w, tile q, column i at 256w + 64q + 4i: 1 KiB in all, one
; barrier, against the 16 KiB of tiles, a bf16 staging pass and a second barrier of the
; general epilogue). Lane l < 16 of wave 0 reads gate columns 2l, 2l+1 (at 8l) and the
; matching up columns (+128) of every wave, sums the copies in wave order as sum_copies does,
; rounds to bf16 as stage_row does (the same h, so the same bytes) and runs swiglu_quant 1
; (the 32-block's amax over the 16 lanes: a max, so the same scale); the slot s_slot0 is real
; (a skipped one ended at L_skip).
.set v_hw, v_set_x + 32              ; [4 waves][gate 2, up 2] f32 copies of the row
.if SWIGLU && DIRECT && (K_DEPTH * SET_SIZE < 48)   ; FUSED: NT 4 at K_DEPTH 3 holds them
    .error "mxfp8_moe_gemm: the row epilogue's copies must fit in the register sets"
.endif
.macro row_swiglu
    v_cmp_gt_u32 vcc, 16, v[v_lane]                         ; lanes of row 0
    s_and_saveexec_b64 s[s_tmp:s_tmp+1], vcc
    s_lshl_b32 s[s_tmp+2], s[s_wave], 8
    v_lshl_add_u32 v[v_lds], v[v_i], 2, s[s_tmp+2]
    .irp q, 0, 1, 2, 3
        ds_write_b32 v[v_lds], v[v_acc+4*\q] offset:64*\q
    .endr
    s_waitcnt lgkmcnt(0)                                    ; in flight: this wave's row → written before the barrier
    s_barrier                                               ; every wave's row in LDS
    s_cmp_eq_u32 s[s_wave], 0
    s_cbranch_scc0 L_end
    v_lshlrev_b32 v[v_lds], 3, v[v_lane]                    ; 8l: gate tile l/8, column 2(l%8)
    .irp w, 0, 1, 2, 3
        ds_read_b64 v[v_hw+4*\w:v_hw+4*\w+1], v[v_lds] offset:256*\w
        ds_read_b64 v[v_hw+4*\w+2:v_hw+4*\w+3], v[v_lds] offset:256*\w+128
    .endr
    v_mov_b32 v[v_lim], s[s_limit]
    v_mov_b32 v[v_am], 0
    s_waitcnt lgkmcnt(0)                                    ; in flight: 4 copies of the row → all
    .irp e, 0, 1, 2, 3                                      ; gate 2l, 2l+1, up 2l, 2l+1: ((w0 + w1) + w2) + w3
        v_add_f32 v[v_hw+\e], v[v_hw+\e], v[v_hw+4+\e]
        v_add_f32 v[v_hw+\e], v[v_hw+\e], v[v_hw+8+\e]
        v_add_f32 v[v_hw+\e], v[v_hw+\e], v[v_hw+12+\e]
    .endr
    v_cvt_pk_bf16_f32 v[v_gate], v[v_hw], v[v_hw+1]         ; round to nearest even, as h
    v_cvt_pk_bf16_f32 v[v_upv], v[v_hw+2], v[v_hw+3]
    swiglu_quant 1                                          ; y, block amax, scale E in v_am, q bytes
    s_mul_i32 s[s_tmp+2], s[s_slot0], s[s_I]
    s_add_u32 s[s_tmp+2], s[s_tmp+2], s[s_n0]
    v_lshl_add_u32 v[v_qoff], v[v_lane], 1, s[s_tmp+2]      ; slot*I + n0 + 2l
    buffer_store_short v[v_q], v[v_qoff], s[s_rsrc_out:s_rsrc_out+3], 0 offen
    s_mul_i32 s[s_tmp+2], s[s_slot0], s[s_NB]
    s_add_u32 s[s_tmp+2], s[s_tmp+2], s[s_wg_x]             ; slot*I/32 + x
    v_mov_b32 v[v_soff], s[s_tmp+2]
    v_cmp_eq_u32 vcc, 0, v[v_lane]                          ; the block's scale from lane 0
    s_and_b64 exec, exec, vcc
    buffer_store_byte v[v_am], v[v_soff], s[s_rsrc_sc:s_rsrc_sc+3], 0 offen
  .ifdef FUSED
    fused_release
  .endif
    s_endpgm
.endm

; FLAT_STEPS (mxfp8.inc's load_step): s_kstep, s_jrow = K step and row of the flat step
; s_step_ld (s_kstep has been advanced by the stride: carry whole rows into s_jrow); at a new
; row, the weight V#s at its expert (num_records 0 when skipped: its loads read 0, touch
; nothing) and the activation offsets at its row for lanes i = row only (the other rows
; read 0 and their D rows keep what their own steps add).
.macro flat_step_select
L_fs_carry_\@:
    s_cmp_lt_u32 s[s_kstep], s[s_ksteps]
    s_cbranch_scc1 L_fs_row_\@
    s_sub_u32 s[s_kstep], s[s_kstep], s[s_ksteps]
    s_add_u32 s[s_jrow], s[s_jrow], 1
    s_branch L_fs_carry_\@
L_fs_row_\@:
    s_cmp_eq_u32 s[s_jrow], s[s_jcur]
    s_cbranch_scc1 L_fs_done_\@
    s_mov_b32 s[s_jcur], s[s_jrow]
  .if !SWIGLU
    s_mov_b32 s[s_expert], s[s_e0]
    s_cmp_eq_u32 s[s_jrow], 0
    s_cbranch_scc1 L_fs_expert_\@                         ; row 0: the scalar lookup
    s_cmp_eq_u32 s[s_pend], 0
    s_cbranch_scc1 L_fs_lane_\@
    rows_landed
    direct_rows_map
L_fs_lane_\@:
  .endif
    v_readlane_b32 s[s_expert], v[v_e], s[s_jrow]
    s_nop 0
L_fs_expert_\@:
    s_cmp_lt_u32 s[s_expert], s[s_E]
    s_cselect_b64 s[s_rowok:s_rowok+1], -1, 0
    s_cselect_b32 s[s_expert], s[s_expert], 0              ; skipped: expert 0's base, no records
    s_mul_i32 s[s_tmp], s[s_N], s[s_K]                      ; N*K < 2^31
    s_and_b32 s[s_tmp+3], s[s_tmp], s[s_rowok]
    expert_rsrc s_rsrc_b, s_wbase, s[s_tmp+3]
    s_mul_i32 s[s_tmp], s[s_N], s[s_KB]
    s_and_b32 s[s_tmp+3], s[s_tmp], s[s_rowok]
    expert_rsrc s_rsrc_bs, s_wsbase, s[s_tmp+3]
    s_add_u32 s[s_tmp], s[s_slot0], s[s_jrow]               ; the row's slot
    s_mul_hi_u32 s[s_tmp+1], s[s_tmp], s[s_magic]
    s_cmp_eq_u32 s[s_magic], 0
    s_cselect_b32 s[s_tmp], s[s_tmp], s[s_tmp+1]            ; its activation row, slot / a_div
    s_mul_i32 s[s_tmp+1], s[s_tmp], s[s_K]
    s_mul_i32 s[s_tmp+2], s[s_tmp], s[s_KB]
    v_cmp_eq_u32 vcc, s[s_jrow], v[v_i]
    s_and_b64 vcc, vcc, s[s_rowok:s_rowok+1]
    v_lshlrev_b32 v[v_tmp], 4, v[v_g]
    v_add_u32 v[v_tmp], s[s_tmp+1], v[v_tmp]
    v_cndmask_b32 v[v_off_a], v[v_oob], v[v_tmp], vcc
    v_add_u32 v[v_tmp], s[s_tmp+2], v[v_g]
    v_cndmask_b32 v[v_off_as], v[v_oob], v[v_tmp], vcc
L_fs_done_\@:
.endm

; FUSED: the counter, the producer count and both roles' tiles and magics, issued with the
; first block's arguments (every workgroup reads the first block at first: a producer, the
; grid's first workgroups, waits for one kernarg round trip only)
.macro fused_role
    load_kernarg s_flag, flag
    load_kernarg s_prod, producers
    load_kernarg s_tmp, up_tiles, 4                         ; up_tiles, up_magic, down_tiles, down_magic
    s_mov_b32 s[s_role], 1
.endm

; FUSED, once the arguments landed: a workgroup past the producers becomes the sum role,
; moves the kernarg pointer to its block (k_d_a) and loads its arguments again (its wait for
; the producers hides the round trip); then each role's ids from the 1-D id (header): the
; SWIGLU role's (slot, gate tile) or the sum role's (token, column tile) as s_wg_y, s_wg_x
.macro fused_ids
    s_cmp_eq_u32 s[s_role], 0
    s_cbranch_scc1 L_fi_divide_\@                           ; the sum role, its block loaded
    s_cmp_lt_u32 s[s_wg_x], s[s_prod]
    s_cbranch_scc1 L_fi_divide_\@                           ; a producer: the first block is its own
    s_mov_b32 s[s_role], 0
    s_sub_u32 s[s_wg_x], s[s_wg_x], s[s_prod]
    s_mov_b64 s[s_tmp:s_tmp+1], s[s_tmp+2:s_tmp+3]          ; down_tiles, down_magic
    s_add_u32 s[s_kernarg], s[s_kernarg], k_d_a
    s_addc_u32 s[s_kernarg+1], s[s_kernarg+1], 0
    s_branch L_fused_kernargs
L_fi_divide_\@:
    s_mul_hi_u32 s[s_tmp+2], s[s_wg_x], s[s_tmp+1]
    s_cmp_eq_u32 s[s_tmp+1], 0
    s_cselect_b32 s[s_wg_y], s[s_wg_x], s[s_tmp+2]          ; id / tiles (magic 0: one tile)
    s_mul_i32 s[s_tmp+2], s[s_wg_y], s[s_tmp]
    s_sub_u32 s[s_wg_x], s[s_wg_x], s[s_tmp+2]              ; id % tiles
.endm

; FUSED, run by mfma_k_loop between the first step's weight and activation loads: a sum-role
; wave polls the counter until every producer has released (it reads producers), then
; acquires (buffer_inv sc1 once the poll that saw it landed); q and scale are read after it
.macro fused_acquire
    s_cmp_eq_u32 s[s_role], 1
    s_cbranch_scc1 L_fa_done_\@                             ; a producer waits for nobody
  .ifdef FUSED_PROBE                                        ; bench/moe.py's phase probes (header)
    .if FUSED_PROBE == 2
    s_waitcnt vmcnt(0)                                      ; in flight: the first step's weight loads → landed
    s_endpgm
    .endif
  .endif
    v_mov_b32 v[v_tmp], 0
L_fa_poll_\@:
    global_load_dword v[v_tmp+1], v[v_tmp], s[s_flag:s_flag+1] sc1
    s_waitcnt vmcnt(0)                                      ; in flight: the first weight loads, the poll → landed
    v_readfirstlane_b32 s[s_tmp], v[v_tmp+1]
    s_cmp_ge_u32 s[s_tmp], s[s_prod]
    s_cbranch_scc1 L_fa_seen_\@
    s_sleep 1
    s_branch L_fa_poll_\@
L_fa_seen_\@:
    buffer_inv sc1
  .ifdef FUSED_PROBE
    .if FUSED_PROBE == 1
    s_endpgm
    .endif
  .endif
L_fa_done_\@:
.endm

; FUSED, wave 0 of a SWIGLU-role workgroup at its end (its q and scale stores issued; none
; when skipped): counter += 1 with an agent-scope release of what the workgroup stored. The
; sequence is LLVM's for an agent-scope release atomic on gfx942/gfx950 (AMDGPUUsage, Memory
; Model GFX942: buffer_wbl2 sc1, then s_waitcnt vmcnt(0), then the atomic): the writeback
; covers the wave's earlier stores without waiting for them first, and the one s_waitcnt
; retires both before the atomic, so the release costs one memory round trip, not two. The
; other waves stored nothing (row_swiglu: wave 0 alone stores).
.macro fused_release
    buffer_wbl2 sc1
    s_waitcnt vmcnt(0)                                      ; in flight: the q, scale stores, the writeback → all retired
    s_mov_b64 exec, 1                                       ; one lane adds
    v_mov_b32 v[v_tmp], 0
    v_mov_b32 v[v_tmp+1], 1
    global_atomic_add v[v_tmp], v[v_tmp+1], s[s_flag:s_flag+1]
.endm

; --- prologue ---
.ifdef FUSED
    fused_role
L_fused_kernargs:
.endif
    load_kernarg s_rsrc_a, a
    load_kernarg s_rsrc_as, a_scale
    load_kernarg s_rsrc_b, w
    load_kernarg s_rsrc_bs, w_scale
.if SWIGLU
    load_kernarg s_rsrc_out, q
    load_kernarg s_rsrc_sc, scale
    load_kernarg s_nal, neg_alpha_log2e, 2   ; and beta
    load_kernarg s_limit, limit
.else
  .ifdef FUSED
    load_kernarg s_rsrc_out, q                              ; the sum role: its block's out
    s_cmp_eq_u32 s[s_role], 0
    s_cbranch_scc1 L_fused_args
    load_kernarg s_rsrc_sc, scale
    load_kernarg s_nal, neg_alpha_log2e, 2                  ; and beta
    load_kernarg s_limit, limit
L_fused_args:
  .else
    load_kernarg s_rsrc_out, out
  .endif
.endif
.if DIRECT
    load_kernarg s_rsrc_ids, topk_ids
    load_kernarg s_rsrc_map, expert_map
.else
    load_kernarg s_rsrc_ids, sorted_token_ids
.endif
    load_kernarg s_rsrc_tw, topk_weights
.if !DIRECT
    load_kernarg s_eptr, expert_ids
    load_kernarg s_nptr, num_tokens_post_padded
.endif
    load_kernarg s_M, M
    load_kernarg s_N, N
    load_kernarg s_K, K
    load_kernarg s_E, E
    load_kernarg s_valid, valid
.if DIRECT
    load_kernarg s_topk, top_k
    load_kernarg s_Eg, num_experts
    load_kernarg s_has_map, has_map
    load_kernarg s_tokens, tokens
.else
    load_kernarg s_blocks, blocks
    load_kernarg s_block_m, block_m
.endif
    load_kernarg s_magic, a_div_magic
    load_kernarg s_has_w, has_weights
    mfma_lanes
    .set t_, 0
    .rept MT
        v_mov_b32 v[v_tw+t_], 1.0                           ; the row weight without topk_weights
        .set t_, t_ + 1
    .endr
    s_waitcnt lgkmcnt(0)                                    ; in flight: 9 (10) pointers, 9 (12) scalars → wait for all
.ifdef FUSED
    fused_ids
.endif
.if !DIRECT
    ; the block's expert id and num_tokens_post_padded (scalar), its slot ids (vector), at once
    s_lshl_b32 s[s_tmp], s[s_wg_y], 2
    s_add_u32 s[s_eptr], s[s_eptr], s[s_tmp]
    s_addc_u32 s[s_eptr+1], s[s_eptr+1], 0                  ; &expert_ids[block]
    s_load_dword s[s_expert], s[s_eptr:s_eptr+1], 0
    s_load_dword s[s_ntpp], s[s_nptr:s_nptr+1], 0
    s_mul_i32 s[s_row0], s[s_wg_y], s[s_block_m]
    s_mul_i32 s[s_tmp], s[s_blocks], s[s_block_m]
    s_lshl_b32 s[s_tmp], s[s_tmp], 2                        ; bytes of sorted_token_ids
    buffer_rsrc s_rsrc_ids, s[s_tmp]
    s_lshl_b32 s[s_tmp], s[s_row0], 2                       ; soffset: the block's first id
    v_lshlrev_b32 v[v_tmp+3], 2, v[v_i]                     ; 4i
    .set t_, 0
    .rept MT
        buffer_load_dword v[v_slot+t_], v[v_tmp+3], s[s_rsrc_ids:s_rsrc_ids+3], s[s_tmp] offen offset:64*t_
        .set t_, t_ + 1
    .endr
.endif

    activation_rsrcs
.if SWIGLU
    s_lshr_b32 s[s_I], s[s_N], 1
    s_lshr_b32 s[s_NB], s[s_N], 6
    s_mul_i32 s[s_tmp], s[s_valid], s[s_I]
    buffer_rsrc s_rsrc_out, s[s_tmp]                        ; q: valid*I bytes
    s_mul_i32 s[s_tmp], s[s_valid], s[s_NB]
    buffer_rsrc s_rsrc_sc, s[s_tmp]
    s_mul_i32 s[s_n0], s[s_wg_x], 32                        ; gate column n0 (up: I + n0)
.else
  .ifdef FUSED                                              ; the SWIGLU role: as above
    s_cmp_eq_u32 s[s_role], 0
    s_cbranch_scc1 L_fused_sum_out
    s_lshr_b32 s[s_I], s[s_N], 1
    s_lshr_b32 s[s_NB], s[s_N], 6
    s_mul_i32 s[s_tmp], s[s_valid], s[s_I]
    buffer_rsrc s_rsrc_out, s[s_tmp]
    s_mul_i32 s[s_tmp], s[s_valid], s[s_NB]
    buffer_rsrc s_rsrc_sc, s[s_tmp]
    s_mul_i32 s[s_n0], s[s_wg_x], 32
    s_branch L_fused_out_done
L_fused_sum_out:
  .endif
    s_mul_i32 s[s_tmp], s[s_valid], s[s_N]
  .if DIRECT
    s_mul_i32 s[s_tmp], s[s_tokens], s[s_N]                 ; out [tokens, N]
  .endif
    s_lshl_b32 s[s_tmp], s[s_tmp], 1
    buffer_rsrc s_rsrc_out, s[s_tmp]
  .ifdef FUSED
    s_mul_i32 s[s_n0], s[s_wg_x], 16 * SUM_STRIPS
L_fused_out_done:
  .else
    s_mul_i32 s[s_n0], s[s_wg_x], 16 * NT
  .endif
.endif
    s_mul_i32 s[s_tmp], s[s_valid], s[s_has_w]
    s_lshl_b32 s[s_tmp], s[s_tmp], 2
    buffer_rsrc s_rsrc_tw, s[s_tmp]
.if DIRECT
    direct_rows_issue                                       ; the routing loads, under the setup below
.endif
    weight_offsets
.if SWIGLU
    up_strip_offsets
.endif
.ifdef FUSED
    s_cmp_eq_u32 s[s_role], 0
    s_cbranch_scc1 L_fused_sum_strips
    up_strip_offsets                                        ; the SWIGLU role: as above
    s_branch L_fused_strips
L_fused_sum_strips:                                         ; the sum role: strips SUM_STRIPS.. read nothing
    .set j_, SUM_STRIPS
    .rept NT - SUM_STRIPS
        v_mov_b32 v[v_off_b+j_], v[v_oob]
        v_mov_b32 v[v_off_bs+j_], v[v_oob]
        .set j_, j_ + 1
    .endr
L_fused_strips:
.endif
    ; steps: T = cdiv(K, 128), full K/128; wave w takes steps w, w + 4, ...
    mfma_step_bounds
    s_mov_b32 s[s_stride], 4
    s_mov_b32 s[s_step], s[s_wave]

.if DIRECT
    direct_rows_finish
    s_mov_b64 s[s_wbase:s_wbase+1], s[s_rsrc_b:s_rsrc_b+1]  ; the weights' pointers, for flat_step_select
    s_mov_b64 s[s_wsbase:s_wsbase+1], s[s_rsrc_bs:s_rsrc_bs+1]
    s_mov_b32 s[s_ksteps], s[s_nsteps]
    s_mul_i32 s[s_nsteps], s[s_nsteps], s[s_rows]           ; the flat steps: rows x K steps
    s_mov_b32 s[s_kstep], s[s_step]
    s_mov_b32 s[s_jrow], 0
    s_mov_b32 s[s_jcur], -1
.else
    s_waitcnt lgkmcnt(0)                                    ; in flight: expert id, num_tokens_post_padded → both landed
    s_cmp_ge_i32 s[s_row0], s[s_ntpp]
    s_cbranch_scc1 L_skip                                   ; a block past the used ones
    s_cmp_ge_u32 s[s_expert], s[s_E]
    s_cbranch_scc1 L_skip                                   ; expert not here (-1) or out of range
    ; V#s of the expert's weights and scales: base + e * bytes per expert, in 64 bits
    s_mul_i32 s[s_tmp], s[s_N], s[s_K]                      ; N*K < 2^31
    expert_rsrc s_rsrc_b, s_rsrc_b, s[s_tmp]
    s_mul_i32 s[s_tmp], s[s_N], s[s_KB]
    expert_rsrc s_rsrc_bs, s_rsrc_bs, s[s_tmp]
.endif

    s_cmp_ge_u32 s[s_step], s[s_nsteps]
    s_cbranch_scc1 L_reduce                                 ; no step for this wave: its tiles stay 0 (only wave 0,
                                                            ; which always has one, needs the rows for the row table)

; --- main loop (mxfp8.inc): the first step's weight loads go out before the slot ids are
; waited for (a_rows runs behind them); the row-weight loads are older than every later
; step's loads, so each step's s_waitcnt covers them too ---
.ifdef FUSED
    mfma_k_loop K_DEPTH, fused_acquire
.elseif DIRECT
    mfma_k_loop K_DEPTH
.else
    mfma_k_loop K_DEPTH, a_rows
.endif

; --- reduction: the 4 waves' tiles, the block's slot ids and weights through LDS ---
L_reduce:
.if SWIGLU && DIRECT
    row_swiglu
.else
  .ifdef FUSED
    s_cmp_eq_u32 s[s_role], 0
    s_cbranch_scc1 L_fused_sum_reduce
    row_swiglu
L_fused_sum_reduce:
  .endif
    s_waitcnt vmcnt(0)                                      ; in flight: slot-id loads (a wave without steps) → landed
  .if DIRECT
    s_cmp_eq_u32 s[s_pend], 0
    s_cbranch_scc1 L_rows_mapped
    direct_rows_map                                         ; no step of this wave past row 0
L_rows_mapped:
  .endif
    tiles_to_lds
    s_cmp_eq_u32 s[s_wave], 0
    s_cbranch_scc0 L_rows_written
    v_cmp_gt_u32 vcc, 16, v[v_lane]                         ; lanes 0..15 of wave 0: row 16t + i
    s_and_saveexec_b64 s[s_tmp:s_tmp+1], vcc
    s_mov_b32 s[s_tmp+2], LDS_SLOTS                         ; (in a register: past 16-bit DS offsets for SWIGLU m64)
    v_lshl_add_u32 v[v_lds], v[v_i], 2, s[s_tmp+2]
    .set t_, 0
    .rept MT
        ds_write_b32 v[v_lds], v[v_slot+t_] offset:64*t_
        ds_write_b32 v[v_lds], v[v_tw+t_] offset:4*BM+64*t_
        .set t_, t_ + 1
    .endr
    s_mov_b64 exec, s[s_tmp:s_tmp+1]
L_rows_written:
    s_waitcnt lgkmcnt(0)                                    ; in flight: this wave's ds_writes → done before the barrier
    s_barrier                                               ; every wave's tiles and the row table are in LDS
    s_mov_b32 s[s_q], s[s_wave]
.if SWIGLU
L_stage:
    ; tile q = 4t + j (TILES = 4 MT: every wave has one) to bf16 in its wave-0 copy's KiB
    tile_from_lds
    s_lshl_b32 s[s_tmp+1], s[s_q], 10
    v_lshlrev_b32 v[v_rows], 7, v[v_g]
    v_lshl_add_u32 v[v_rows], v[v_i], 1, v[v_rows]
    v_add_u32 v[v_rows], s[s_tmp+1], v[v_rows]              ; q KiB + 32*(4g) + 2i
    s_waitcnt lgkmcnt(0)                                    ; in flight: 4 copies of the tile → all (then overwritten)
    .irp r, 0, 1, 2, 3
        stage_row \r
    .endr
    s_add_u32 s[s_q], s[s_q], 4
    s_cmp_lt_u32 s[s_q], TILES
    s_cbranch_scc1 L_stage
    s_waitcnt lgkmcnt(0)                                    ; in flight: this wave's bf16 writes → done before barrier
    s_barrier                                               ; every tile's h in LDS
    ; work-item 4R + p: row R (tile row R/16), gate tile 4(R/16) + p/2, up tile + 2, columns 8(p%2)..
    v_cmp_gt_u32 vcc, 4 * BM, v[v_tid]
    s_and_b64 exec, exec, vcc
    s_cbranch_execz L_end
    v_lshrrev_b32 v[v_tmp], 6, v[v_tid]
    v_lshlrev_b32 v[v_tmp], 12, v[v_tmp]                    ; (R/16) * 4 KiB
    v_and_b32 v[v_tmp+1], 0x3c, v[v_tid]
    v_lshl_add_u32 v[v_tmp], v[v_tmp+1], 3, v[v_tmp]        ; + 32 (R%16)
    v_and_b32 v[v_tmp+1], 2, v[v_tid]
    v_lshl_add_u32 v[v_tmp], v[v_tmp+1], 9, v[v_tmp]        ; + (p/2) KiB
    v_and_b32 v[v_tmp+1], 1, v[v_tid]
    v_lshl_add_u32 v[v_tmp], v[v_tmp+1], 4, v[v_tmp]        ; + 16 (p%2)
    ds_read_b128 v[v_gate:v_gate+3], v[v_tmp]
    ds_read_b128 v[v_upv:v_upv+3], v[v_tmp] offset:2048
    s_mov_b32 s[s_tmp], LDS_SLOTS
    v_and_b32 v[v_tmp+2], -4, v[v_tid]                      ; 4R
    v_add_u32 v[v_tmp+2], s[s_tmp], v[v_tmp+2]
    ds_read_b32 v[v_qslot], v[v_tmp+2]
    v_mov_b32 v[v_lim], s[s_limit]
    v_mov_b32 v[v_am], 0
    v_and_b32 v[v_tmp+3], 3, v[v_tid]                       ; p
    s_waitcnt lgkmcnt(0)                                    ; in flight: gate, up, slot id → all
    swiglu_quant8                                           ; y, block amax, scale E in v_am, q bytes
    v_cmp_gt_u32 vcc, s[s_valid], v[v_qslot]                ; a real row
    v_mul_lo_u32 v[v_qoff], v[v_qslot], s[s_I]
    v_add_u32 v[v_qoff], s[s_n0], v[v_qoff]
    v_lshl_add_u32 v[v_qoff], v[v_tmp+3], 3, v[v_qoff]      ; slot*I + n0 + 8p
    v_cndmask_b32 v[v_qoff], v[v_oob], v[v_qoff], vcc
    buffer_store_dwordx2 v[v_q:v_q+1], v[v_qoff], s[s_rsrc_out:s_rsrc_out+3], 0 offen
    v_cmp_eq_u32 s[s_tmp:s_tmp+1], 0, v[v_tmp+3]
    s_and_b64 vcc, vcc, s[s_tmp:s_tmp+1]                    ; the block's scale from part 0
    v_mul_lo_u32 v[v_soff], v[v_qslot], s[s_NB]
    v_add_u32 v[v_soff], s[s_wg_x], v[v_soff]               ; slot*I/32 + x
    v_cndmask_b32 v[v_soff], v[v_oob], v[v_soff], vcc
    buffer_store_byte v[v_am], v[v_soff], s[s_rsrc_sc:s_rsrc_sc+3], 0 offen
    s_endpgm
.elseif DIRECT
    ; out[token, n] = sum over rows j < top_k of bf16(weight_j * D[j, n]), f32 in row order
  .ifdef FUSED
    s_cmp_ge_u32 s[s_q], SUM_STRIPS
  .else
    s_cmp_ge_u32 s[s_q], TILES
  .endif
    s_cbranch_scc1 L_end                                    ; fewer stored tiles than waves
L_tsum:
    tile_from_lds
    v_lshlrev_b32 v[v_rows], 4, v[v_g]                      ; 4*(4g): the lane's 4 rows in the row table
    ds_read_b128 v[v_rw:v_rw+3], v[v_rows] offset:LDS_WEIGHTS
    s_lshl_b32 s[s_tmp+1], s[s_q], 4
    s_add_u32 s[s_tmp+1], s[s_tmp+1], s[s_n0]               ; n0 + 16q
    v_add_u32 v[v_col], s[s_tmp+1], v[v_i]                  ; n
    s_lshl_b32 s[s_tmp], s[s_q], 10                         ; the tile's wave-0 copy, free once read
    v_lshlrev_b32 v[v_lds], 6, v[v_i]
    v_lshl_add_u32 v[v_lds], v[v_g], 4, v[v_lds]
    v_add_u32 v[v_lds], s[s_tmp], v[v_lds]                  ; column i, rows 4g..4g+3: 64i + 16g (columns of rows)
    s_waitcnt lgkmcnt(0)                                    ; in flight: 4 copies of the tile, weights → all
    .irp r, 0, 1, 2, 3
        sum_copies \r
        v_mul_f32 v[v_red+\r], v[v_red+\r], v[v_rw+\r]
        v_cvt_pk_bf16_f32 v[v_red+\r], v[v_red+\r], 0     ; round to nearest even, as moe_sum's input
        v_lshlrev_b32 v[v_red+\r], 16, v[v_red+\r]        ; ... back to f32
    .endr
    ds_write_b128 v[v_lds], v[v_red:v_red+3]
    v_lshl_add_u32 v[v_lds], v[v_i], 6, s[s_tmp]            ; column i's 16 rows
    s_waitcnt lgkmcnt(0)                                    ; in flight: the weighted rows → written
    .irp p, 0, 1, 2, 3
        ds_read_b128 v[v_red+4*\p:v_red+4*\p+3], v[v_lds] offset:16*\p
    .endr
    s_waitcnt lgkmcnt(0)                                    ; in flight: the 16 rows → landed
    ; rows in slot order from +0, as moe_sum; rows past top_k hold +0 (no activation, weight
    ; 0 or 1): adding them changes nothing, and summing all 16 needs no loop
    v_add_f32 v[v_red], 0, v[v_red]
    .irp j, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15
        v_add_f32 v[v_red], v[v_red], v[v_red+\j]
    .endr
    v_cvt_pk_bf16_f32 v[v_red], v[v_red], 0
    v_cmp_eq_u32 vcc, 0, v[v_g]                             ; lanes 0..15 store
    v_cmp_gt_u32 s[s_colmask:s_colmask+1], s[s_N], v[v_col]
    s_and_b64 vcc, vcc, s[s_colmask:s_colmask+1]
    s_mul_i32 s[s_tmp+3], s[s_wg_y], s[s_N]
    v_add_u32 v[v_out+1], s[s_tmp+3], v[v_col]
    v_lshlrev_b32 v[v_out+1], 1, v[v_out+1]                 ; (token*N + n) * 2
    v_cndmask_b32 v[v_out+1], v[v_oob], v[v_out+1], vcc
    buffer_store_short v[v_red], v[v_out+1], s[s_rsrc_out:s_rsrc_out+3], 0 offen
    s_add_u32 s[s_q], s[s_q], 4
  .ifdef FUSED
    s_cmp_lt_u32 s[s_q], SUM_STRIPS
  .else
    s_cmp_lt_u32 s[s_q], TILES
  .endif
    s_cbranch_scc1 L_tsum
.else
    s_cmp_ge_u32 s[s_q], TILES
    s_cbranch_scc1 L_end                                    ; fewer tiles than waves
L_tile:
    ; tile q = NT*t + j: rows 16t + 4g + r, column n0 + 16j + i
    tile_from_lds
    s_lshr_b32 s[s_tmp], s[s_q], NT_SHIFT                   ; t
    s_lshl_b32 s[s_tmp], s[s_tmp], 6                        ; 64t: byte offset of row 16t
    v_lshlrev_b32 v[v_rows], 4, v[v_g]
  .if LDS_WEIGHTS > 0xffff                                  ; MT*NT = 16: the row table is past the 16-bit DS
    s_add_u32 s[s_tmp], s[s_tmp], LDS_SLOTS                 ; offset (64 KiB), so the address carries it
    v_add_u32 v[v_rows], s[s_tmp], v[v_rows]                ; 4*(16t + 4g) + LDS_SLOTS
    ds_read_b128 v[v_rslot:v_rslot+3], v[v_rows]
    ds_read_b128 v[v_rw:v_rw+3], v[v_rows] offset:4*BM
  .else
    v_add_u32 v[v_rows], s[s_tmp], v[v_rows]                ; 4*(16t + 4g)
    ds_read_b128 v[v_rslot:v_rslot+3], v[v_rows] offset:LDS_SLOTS
    ds_read_b128 v[v_rw:v_rw+3], v[v_rows] offset:LDS_WEIGHTS
  .endif
    s_and_b32 s[s_tmp+1], s[s_q], NT - 1                    ; j
    s_lshl_b32 s[s_tmp+1], s[s_tmp+1], 4
    s_add_u32 s[s_tmp+1], s[s_tmp+1], s[s_n0]               ; n0 + 16j
    v_add_u32 v[v_col], s[s_tmp+1], v[v_i]                  ; n
    v_cmp_gt_u32 s[s_colmask:s_colmask+1], s[s_N], v[v_col] ; n < N
    s_waitcnt lgkmcnt(0)                                    ; in flight: 4 copies of the tile, slot ids, weights → wait for all
    .set r_, 0
    .rept 4
        store_row r_
        .set r_, r_ + 1
    .endr
    s_add_u32 s[s_q], s[s_q], 4
    s_cmp_lt_u32 s[s_q], TILES
    s_cbranch_scc1 L_tile
.endif
.endif
L_end:
    s_endpgm
L_skip:
    s_waitcnt vmcnt(0)                                      ; in flight: the slot-id loads → landed before the end
.ifdef FUSED
    s_cmp_eq_u32 s[s_wave], 0
    s_cbranch_scc0 L_fused_skip_end
    fused_release                                           ; a skipped producer counts too
L_fused_skip_end:
.endif
    s_endpgm
