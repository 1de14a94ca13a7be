; mxfp8_splitk_reduce — second pass of a split-K MX-FP8 GEMM/GEMV:
;
;   out[e] = round(sum over z < splits of ws[z*MN + e])      e < MN = M*N, out bf16 or f16
;
; gfx950, wave64, 256 work-items, one element per work-item, grid cdiv(M*N, 256).
; ws [splits, M, N] f32 holds each split's partial sums (mxfp8_gemv / mxfp8_gemm with
; splits > 1). The splits are read SPLIT_BATCH at a time, all loads of a batch in flight
; together; a split index past `splits` has a voffset past the end of ws and reads 0, so the
; batch needs no mask. The sum runs in split order, in f32.
; Defines: OUT_F16 (0: bf16, 1: f16).
;
; Kernarg (k_* from kernels.yaml): ws, out; M, N, splits. LDS: none.

.include "mxfp8.inc"

.set SPLIT_BATCH, 8

; --- SGPRs (s[0:1] kernarg, s2 workgroup x come from the hardware) ---
.set s_rsrc_ws, 8                    ; [8:11]  V# ws   (splits*M*N*4 bytes)
.set s_rsrc_out, 12                  ; [12:15] V# out  (M*N*2)
.set s_M, 16
.set s_N, 17
.set s_splits, 18
.set s_mn, 19                        ; M*N
.set s_slice, 20                     ; 4*M*N: bytes between splits
.set s_z, 21                         ; first split of the batch
.set s_tmp, 22
; --- VGPRs ---
.set v_e, 1                          ; element index
.set v_off, 2                        ; byte offset of ws[z, e] for the batch's first split
.set v_sum, 3
.set v_out, 4
.set v_out_off, 5
.set v_part, 8                       ; [SPLIT_BATCH] partials of one batch

    load_kernarg s_rsrc_ws, ws
    load_kernarg s_rsrc_out, out
    load_kernarg s_M, M
    load_kernarg s_N, N
    load_kernarg s_splits, splits
    v_and_b32 v[v_e], 0x3ff, v[v_workitem]
    v_mov_b32 v[v_sum], 0
    s_waitcnt lgkmcnt(0)                                    ; in flight: ws, out, M, N, splits → wait for all
    s_mul_i32 s[s_mn], s[s_M], s[s_N]
    s_lshl_b32 s[s_slice], s[s_mn], 2
    s_mul_i32 s[s_tmp], s[s_slice], s[s_splits]
    buffer_rsrc s_rsrc_ws, s[s_tmp]
    s_lshl_b32 s[s_tmp], s[s_mn], 1
    buffer_rsrc s_rsrc_out, s[s_tmp]
    s_mul_i32 s[s_tmp], s[s_wg_x], WORKGROUP_SIZE_X
    v_add_u32 v[v_e], s[s_tmp], v[v_e]
    v_cmp_gt_u32 vcc, s[s_mn], v[v_e]                       ; e < M*N
    s_and_b64 exec, exec, vcc
    s_cbranch_execz L_end
    v_lshlrev_b32 v[v_off], 2, v[v_e]
    s_mov_b32 s[s_z], 0
L_batch:
    .set z_, 0
    .rept SPLIT_BATCH
        buffer_load_dword v[v_part+z_], v[v_off], s[s_rsrc_ws:s_rsrc_ws+3], 0 offen
        .if z_ < SPLIT_BATCH - 1
            v_add_u32 v[v_off], s[s_slice], v[v_off]        ; next split (past the last one: out of range, reads 0)
        .endif
        .set z_, z_ + 1
    .endr
    v_add_u32 v[v_off], s[s_slice], v[v_off]
    s_waitcnt vmcnt(0)                                      ; in flight: the batch's SPLIT_BATCH partials → wait for all
    .set z_, 0
    .rept SPLIT_BATCH
        v_add_f32 v[v_sum], v[v_sum], v[v_part+z_]
        .set z_, z_ + 1
    .endr
    s_add_u32 s[s_z], s[s_z], SPLIT_BATCH
    s_cmp_lt_u32 s[s_z], s[s_splits]
    s_cbranch_scc1 L_batch
    v_lshlrev_b32 v[v_out_off], 1, v[v_e]
.if OUT_F16
    v_cvt_f16_f32 v[v_out], v[v_sum]                        ; round to nearest even
.else
    v_cvt_pk_bf16_f32 v[v_out], v[v_sum], 0                 ; round to nearest even; high half unused
.endif
    buffer_store_short v[v_out], v[v_out_off], s[s_rsrc_out:s_rsrc_out+3], 0 offen
L_end:
    s_endpgm
