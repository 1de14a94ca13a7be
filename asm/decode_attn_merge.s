; decode_attn_merge — second pass of split-K decode attention: combine the splits' partial
; results, add the attention sinks, write O in q's dtype and the natural-log LSE.
;
;   A = ln 2 log2(sum_z 2^ws_lse[z, R])                              R = (b seq_q + s) heads_q + h
;   LSE[b, h, s] = ln(e^A + e^sink[h])      (A without has_sinks; with store_lse)
;   O[b, s, h, :] = e^(A - LSE) sum_z 2^ws_lse[z, R] ws_o[z, R, :] / sum_z 2^ws_lse[z, R]
;
; ws_o holds each split's normalised O (f32), ws_lse its log2-sum-exp (-inf: no key), as
; decode_attn writes them with partial = 1. The sum runs over the splits in order with an
; online max: deterministic, no atomics. The splits are read BATCH at a time, every load of
; a batch in flight together (the kernel is latency-bound); a split index past the last is
; clamped for the address and its term weighted 0 (lse -inf).
; The max starts at -FLT_MAX (at or below every finite log2-sum-exp; a row with no key gives
; 0 weights, not -inf - -inf). Each split weighs 2^-7 2^(lse - max) (the scale is exact and
; cancels in the division): with at most 128 splits (the ops layer's MAX_SPLITS is 64) the
; weights sum to at most 1, so the running sum of weighted O stays below the largest split's |O|
; and overflows only where that does. The sink is added after the splits, in natural-log
; units (sink * log2 e would overflow f32 for |sink| > 2.36e38); only the differences from
; the max, <= 0, are scaled by log2 e, and one past -FLT_MAX weighs 0 as -inf does.
; A split whose visible keys all scored -inf writes ws_lse = LSE_EMPTY (decode_attn): it
; weighs 0, and a row whose splits all weigh 0 and that has no sink gets O = NaN (0 / 0,
; the float64 softmax) if one of them was such a split, else O = 0 (no key seen); LSE -inf.
;
; gfx950, wave64; grid (heads_q, seq_q, batch), one wave per output row; lane l owns dims
; (D/64) l .. (D/64) l + D/64 - 1. Defines: D (64 | 128), F16 (0: bf16 out, 1: fp16).
; Kernarg: see kernels.yaml. LDS: none.

.include "buffer_rsrc.inc"

.if (D != 64) && (D != 128)
    .error "decode_attn_merge: D must be 64 or 128"
.endif
.set DPL, D / 64                       ; dims per lane
.set M_INIT, 0xff7fffff                ; -FLT_MAX
.set L_FLOOR, 0x0da24260               ; 1e-30f (a finite term weighs >= 2^-7)
.set SPLIT_SCALE, -7                   ; log2 of every split's weight scale
.set F32_NAN, 0x7fc00000
.set LSE_EMPTY, 0x7fc00001             ; decode_attn's ws_lse of a row whose visible keys all scored -inf
.set LN2, 0x3f317218
.set LOG2E, 0x3fb8aa3b
.set RECORDS_ALL, 0x7fffffff
.set OOB, 0x80000000
.set NEG_INF, 0xff800000
.set BATCH, 8

; --- SGPRs (s[0:1] kernarg, s2 = head h, s3 = token s, s4 = batch b) ---
.set s_ptr_wso, 6           ; [6:7]
.set s_ptr_wsl, 8           ; [8:9]   ws_lse + 4R
.set s_ptr_sink, 10         ; [10:11]
.set s_ptr_o, 12            ; [12:13]
.set s_ptr_lse, 14          ; [14:15]
.set s_rsrc_w, 16           ; [16:19] ws_o
.set s_rsrc_o, 20           ; [20:23]
.set s_rsrc_l, 24           ; [24:27]
.set s_tmp64, 28            ; [28:29]
.set s_splits, 30
.set s_seq_q, 31
.set s_heads_q, 32
.set s_ws_stride, 33
.set s_wsl_stride, 34
.set s_o_seq_stride, 35
.set s_o_head_stride, 36
.set s_o_batch_stride, 37
.set s_lse_head_stride, 38
.set s_lse_batch_stride, 39
.set s_has_sinks, 40
.set s_store_lse, 41
.set s_row, 42              ; R
.set s_z, 43                ; split
.set s_empty, 44            ; nonzero once a split wrote LSE_EMPTY
.set s_left, 45             ; splits - z
.set s_t, 46
.set s_u, 47
.set s_splits_m1, 48
.set s_x, 56                ; [56:64) the batch's log2-sum-exps (s_x: the sink)
; --- VGPRs ---
.set v_lane, 1
.set v_off, 2               ; ws_o offset of the lane's dims in row R
.set v_m, 3
.set v_l, 4
.set v_t0, 5
.set v_a, 6                 ; rescale of the running sums
.set v_w, 7                 ; weight of the split
.set v_acc, 8               ; [8:9]  sum of weighted O
.set v_part, 10             ; [10:26) the batch's O rows, split i at v_part + 2i

; running (m, l, acc) += the term 2^-7 2^x with O row v[\part]; \x an SGPR
.macro merge_term x, part
    v_max_f32 v[v_t0], \x, v[v_m]
    v_sub_f32 v[v_a], v[v_m], v[v_t0]
    v_sub_f32 v[v_w], \x, v[v_t0]
    v_mov_b32 v[v_m], v[v_t0]
    v_exp_f32 v[v_a], v[v_a]
    v_exp_f32 v[v_w], v[v_w]
    s_nop 0                                             ; transcendental result -> VALU read: 1 wait state
    v_ldexp_f32 v[v_w], v[v_w], SPLIT_SCALE
    v_mul_f32 v[v_l], v[v_l], v[v_a]
    v_add_f32 v[v_l], v[v_l], v[v_w]
    .irp i, 0, 1
        .if \i < DPL
            v_mul_f32 v[v_acc + \i], v[v_acc + \i], v[v_a]
            v_fma_f32 v[v_acc + \i], v[v_w], v[\part + \i], v[v_acc + \i]
        .endif
    .endr
.endm

    load_kernarg s_ptr_wso, ws_o
    load_kernarg s_ptr_wsl, ws_lse
    load_kernarg s_ptr_sink, sinks
    load_kernarg s_ptr_o, o
    load_kernarg s_ptr_lse, lse
    .irp name, splits, seq_q, heads_q, ws_stride, wsl_stride, o_seq_stride, o_head_stride, o_batch_stride, lse_head_stride, lse_batch_stride, has_sinks, store_lse
        load_kernarg s_\name, \name
    .endr
    v_and_b32 v[v_lane], 0x3ff, v[v_workitem]
    v_mov_b32 v[v_m], M_INIT
    v_mov_b32 v[v_l], 0
    v_mov_b32 v[v_acc], 0
    v_mov_b32 v[v_acc + 1], 0
    s_waitcnt lgkmcnt(0)                                ; in flight: the kernargs -> wait for all
    s_mul_i32 s[s_row], s[s_wg_z], s[s_seq_q]
    s_add_u32 s[s_row], s[s_row], s[s_wg_y]
    s_mul_i32 s[s_row], s[s_row], s[s_heads_q]
    s_add_u32 s[s_row], s[s_row], s[s_wg_x]             ; R
    s_lshl_b32 s[s_t], s[s_row], 2
    s_add_u32 s[s_ptr_wsl], s[s_ptr_wsl], s[s_t]
    s_addc_u32 s[s_ptr_wsl+1], s[s_ptr_wsl+1], 0
    s_mov_b32 s[s_t], RECORDS_ALL
    rsrc_raw s_rsrc_w, s_ptr_wso, s_t
    s_mul_i32 s[s_t], s[s_row], 4 * D                   ; row R of a split
    v_lshlrev_b32 v[v_off], 2 + DPL - 1, v[v_lane]      ; 4 DPL l bytes
    v_add_u32 v[v_off], s[s_t], v[v_off]
    s_add_u32 s[s_splits_m1], s[s_splits], -1
    s_mov_b32 s[s_z], 0
    s_mov_b32 s[s_empty], 0
L_batch:
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7
        s_add_u32 s[s_t], s[s_z], \i
        s_min_u32 s[s_t], s[s_t], s[s_splits_m1]          ; past the last split: read the last (weighted 0)
        s_mul_i32 s[s_u], s[s_t], s[s_wsl_stride]
        s_load_dword s[s_x + \i], s[s_ptr_wsl:s_ptr_wsl+1], s[s_u]
        s_mul_i32 s[s_u], s[s_t], s[s_ws_stride]          ; soffset: in range by the clamp
.if DPL == 2
        buffer_load_dwordx2 v[v_part + 2*\i : v_part + 2*\i + 1], v[v_off], s[s_rsrc_w:s_rsrc_w+3], s[s_u] offen
.else
        buffer_load_dword v[v_part + 2*\i], v[v_off], s[s_rsrc_w:s_rsrc_w+3], s[s_u] offen
.endif
    .endr
    s_waitcnt vmcnt(0) lgkmcnt(0)                       ; in flight: the batch's lse and O -> wait for all
    s_sub_u32 s[s_left], s[s_splits], s[s_z]            ; splits from z on
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7
        .if \i > 0                                     ; (split z itself exists: z < splits)
            s_cmp_gt_u32 s[s_left], \i
            s_cselect_b32 s[s_x + \i], s[s_x + \i], NEG_INF
        .endif
        s_cmp_eq_u32 s[s_x + \i], LSE_EMPTY                ; the split saw keys of the row, all scoring -inf:
        s_cselect_b32 s[s_x + \i], NEG_INF, s[s_x + \i]    ; it weighs 0, and is remembered
        s_cselect_b32 s[s_empty], 1, s[s_empty]
        merge_term s[s_x + \i], v_part + 2*\i
    .endr
    s_add_u32 s[s_z], s[s_z], BATCH
    s_cmp_lt_u32 s[s_z], s[s_splits]
    s_cbranch_scc1 L_batch

    ; the splits: O = acc / l, A = ln 2 (m + log2 l + 7)
    v_max_f32 v[v_t0], L_FLOOR, v[v_l]
    v_rcp_f32 v[v_t0], v[v_t0]                          ; 1 / l (O stays 0 for a row with no key)
    v_ldexp_f32 v[v_w], v[v_l], -SPLIT_SCALE            ; the sum of the weights 2^(lse - m), exactly
    v_log_f32 v[v_w], v[v_w]                            ; log2 of it: -inf for nothing
    s_nop 0                                             ; transcendental result -> VALU read: 1 wait state
    v_mul_f32 v[v_acc], v[v_acc], v[v_t0]
    v_mul_f32 v[v_acc + 1], v[v_acc + 1], v[v_t0]
    v_add_f32 v[v_w], v[v_m], v[v_w]
    v_mul_f32 v[v_w], LN2, v[v_w]                       ; A: LSE of the splits (natural log)
    s_cmp_eq_u32 s[s_has_sinks], 0
    s_cbranch_scc1 L_no_sink
    ; + the sink, in natural-log units: M = max(A, sink), LSE = M + ln(e^(A - M) + e^(sink - M)),
    ; O *= e^(A - M) / (e^(A - M) + e^(sink - M)). The larger term weighs 1, so the sum is >= 1.
    s_lshl_b32 s[s_t], s[s_wg_x], 2
    s_load_dword s[s_x], s[s_ptr_sink:s_ptr_sink+1], s[s_t]
    s_waitcnt lgkmcnt(0)                                ; in flight: sink[h] -> wait
    v_max_f32 v[v_t0], s[s_x], v[v_w]                   ; M (A = -inf: the sink)
    v_sub_f32 v[v_a], v[v_w], v[v_t0]                   ; A - M <= 0 (-inf for no key)
    v_sub_f32 v[v_l], s[s_x], v[v_t0]                   ; sink - M <= 0
    v_mul_f32 v[v_a], LOG2E, v[v_a]                     ; (x log2 e: -inf past -FLT_MAX, weight 0 either way)
    v_mul_f32 v[v_l], LOG2E, v[v_l]
    v_exp_f32 v[v_a], v[v_a]
    v_exp_f32 v[v_l], v[v_l]
    s_nop 0                                             ; transcendental result -> VALU read: 1 wait state
    v_add_f32 v[v_l], v[v_a], v[v_l]
    v_rcp_f32 v[v_w], v[v_l]
    v_log_f32 v[v_l], v[v_l]
    s_nop 0                                             ; transcendental result -> VALU read: 1 wait state
    v_mul_f32 v[v_a], v[v_a], v[v_w]                    ; the splits' share
    v_mul_f32 v[v_l], LN2, v[v_l]
    v_mul_f32 v[v_acc], v[v_acc], v[v_a]
    v_mul_f32 v[v_acc + 1], v[v_acc + 1], v[v_a]
    v_add_f32 v[v_w], v[v_t0], v[v_l]                   ; LSE (natural log)
    s_branch L_store
L_no_sink:
    s_cmp_eq_u32 s[s_empty], 0
    s_cbranch_scc1 L_store
    v_cmp_eq_f32 vcc, 0, v[v_l]                         ; no split weighs anything, one saw keys: 0 / 0
    v_mov_b32 v[v_t0], F32_NAN
    v_cndmask_b32 v[v_acc], v[v_acc], v[v_t0], vcc
    v_cndmask_b32 v[v_acc + 1], v[v_acc + 1], v[v_t0], vcc

L_store:
.if F16
    v_cvt_pk_f16_f32 v[v_acc], v[v_acc], v[v_acc + 1]   ; round to nearest even
.else
    v_cvt_pk_bf16_f32 v[v_acc], v[v_acc], v[v_acc + 1]  ; round to nearest even
.endif
    add_mul_u64 s_ptr_o, s_wg_z, s_o_batch_stride, s_tmp64
    add_mul_u64 s_ptr_o, s_wg_y, s_o_seq_stride, s_tmp64
    add_mul_u64 s_ptr_o, s_wg_x, s_o_head_stride, s_tmp64
    s_mov_b32 s[s_t], RECORDS_ALL
    rsrc_raw s_rsrc_o, s_ptr_o, s_t
    v_lshlrev_b32 v[v_off], DPL, v[v_lane]              ; 2 DPL l bytes
.if DPL == 2
    buffer_store_dword v[v_acc], v[v_off], s[s_rsrc_o:s_rsrc_o+3], 0 offen
.else
    buffer_store_short v[v_acc], v[v_off], s[s_rsrc_o:s_rsrc_o+3], 0 offen
.endif
    s_cmp_eq_u32 s[s_store_lse], 0
    s_cbranch_scc1 L_end
    add_mul_u64 s_ptr_lse, s_wg_z, s_lse_batch_stride, s_tmp64
    add_mul_u64 s_ptr_lse, s_wg_x, s_lse_head_stride, s_tmp64
    s_mov_b32 s[s_t], RECORDS_ALL
    rsrc_raw s_rsrc_l, s_ptr_lse, s_t
    v_lshlrev_b32 v[v_off], 2, v[v_lane]
    v_mov_b32 v[v_t0], OOB
    v_cmp_eq_u32 vcc, 0, v[v_lane]                      ; lane 0 writes LSE[b, h, s]
    v_cndmask_b32 v[v_off], v[v_t0], v[v_off], vcc
    s_lshl_b32 s[s_t], s[s_wg_y], 2
    buffer_store_dword v[v_w], v[v_off], s[s_rsrc_l:s_rsrc_l+3], s[s_t] offen
L_end:
    s_endpgm
