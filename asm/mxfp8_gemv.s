; mxfp8_gemv — MX-FP8 GEMV for the decode regime (M ≤ M_T ≤ 16), VALU packed FMA
;
;   out[m, n] = sum_k  a[m, k] * 2^(a_scale[m, k/32] - 127)  *  b[n, k] * 2^(b_scale[n, k/32] - 127)
;
; a [M, K] and b [N, K] are OCP fp8 e4m3 (row-major, K contiguous), a_scale [M, K/32] and
; b_scale [N, K/32] E8M0 bytes; K % 32 == 0, any M ≤ M_T and N ≥ 1. Output bf16 (OUT_F16 = 0)
; or f16 (OUT_F16 = 1) into out [M, N]; with splits > 1 each split writes f32 partial sums
; into ws [splits, M, N] instead and mxfp8_splitk_reduce adds them up.
;
; gfx950, wave64. Defines: M_T (1, 2, 4, 8 or 16: activation rows the registers hold), R (b
; rows per workgroup), OUT_F16. Grid: x = cdiv(N, R) row tiles, z = splits; 256 work-items.
;
; Work split. Workgroup (x, z) owns rows n0 .. n0+R-1 (n0 = R*x). Its 4 waves and the grid's
; z split the K axis into 1 KiB chunks (one 16-byte dwordx4 per lane): worker q = 4*z + wave
; takes chunks c = q, q + 4*splits, q + 8*splits, ... < cdiv(K, 1024), so neighbouring waves
; stream neighbouring kilobytes of each weight row. In chunk c lane l holds
;   k = 1024*c + 16*l .. +15, the first or second half of 32-block (1024*c + 16*l) / 32,
; for each of the R weight rows and each of the M_T activation rows. Lanes whose k passes K
; (the last, partial chunk) are switched off in EXEC; rows n ≥ N and m ≥ M lie past the end
; of their buffer and read 0 (their results are never stored).
;
; Scales, applied by exponent arithmetic: a scale byte e shifted left by 23 is an f32 whose
; exponent field is e, and v_cvt_scalef32_pk_f32_fp8 takes its E8M0 scale from exactly that
; field (ISA: scale = exponent(S2.f32)), so the conversion itself multiplies by 2^(e-127):
;   B'[r][k] = b * 2^(sb - 127),  A'[m][k] = a * 2^(sa - 127)   (f32, exact)
; and the accumulators simply add A'·B' with v_pk_fma_f32 (two k per instruction). Exact
; while the scaled elements stay inside the f32 range: |a| ≤ 448 = 2^8.8, so scale bytes in
; [10, 246] (2^-117 .. 2^119) can never overflow or lose bits; MX scales of real tensors sit
; far inside that. Per lane the even and odd k accumulate in the two halves of a pair.
;
; Pipeline per chunk (one chunk of loads in flight while the previous one is computed), in
; one of two orders, whichever keeps fewer f32 operands live (VGPRs decide the occupancy):
;   A_RESIDENT (M_T <= 4):  wait A → 8*M_T cvt (all A') → issue next A
;                           for r: wait B[r] → 8 cvt (B'[r]) → issue next B[r] → 8*M_T pk_fma
;   B_RESIDENT (M_T >= 8):  wait B → 8R cvt (all B') → issue next B
;                           for m: wait A[m] → 8 cvt (A'[m]) → issue next A[m] → 8R pk_fma
; A register is reloaded as soon as it has been converted, so every load of the next chunk is
; in flight during this chunk's FMAs. Loads are issued in a fixed order (the resident operand
; first, then the other one row by row, data before scale), so each wait is a fixed count
; (see the chunk_* macros); the last chunk runs the same body without issuing.
;
; Reduction. Each lane adds its pair, writes its M_T*R partials to LDS (one f32 per output
; per work-item), s_barrier, then work-item t adds the V = M_T*R floats at LDS[t*V ..] — the
; partials of output t/P from P = 256/V consecutive work-items — and a DPP row_shr chain adds
; the P work-items' sums; the last lane of each P-group stores its output.
;
; Kernarg (offsets k_* from kernels.yaml): a, a_scale, b, b_scale, out, ws; M, N, K, splits.
; LDS map: [0, 4*256*V) f32 partials, output o's 256 values at 1024*o (written only at the end).
; SGPR/VGPR map below. Every buffer is < 2^31 bytes (the op checks), so offsets are u32.

.include "mxfp8.inc"

.ifndef M_T
    .error "mxfp8_gemv: define M_T"
.endif
.if (M_T != 1) && (M_T != 2) && (M_T != 4) && (M_T != 8) && (M_T != 16)
    .error "mxfp8_gemv: M_T must be 1, 2, 4, 8 or 16"
.endif
.if (R != 2) && (R != 4) && (R != 8)
    .error "mxfp8_gemv: R must be 2, 4 or 8"
.endif
.if WORKGROUP_SIZE_X != 256
    .error "mxfp8_gemv: the K split assumes 4 waves of 64"
.endif
.set V_OUT, M_T * R                  ; outputs per workgroup
.if V_OUT < 4 || V_OUT > 64
    .error "mxfp8_gemv: M_T * R must be in [4, 64]"
.endif
.set P_LANES, 256 / V_OUT            ; work-items that finish one output
set_log2 P_SHIFT, P_LANES
set_log2 R_SHIFT, R
.if LDS_BYTES < 1024 * V_OUT
    .error "mxfp8_gemv: LDS_BYTES must hold 256 f32 partials per output"
.endif
.set CHUNK_SHIFT, 10                 ; 1 KiB of K per wave per row: 64 lanes x 16 bytes

; --- SGPRs (s[0:1] kernarg, s2/s4 workgroup x/z come from the hardware) ---
.set s_rsrc_a, 8                     ; [8:11]  V# a        (M*K bytes)
.set s_rsrc_as, 12                   ; [12:15] V# a_scale  (M*K/32)
.set s_rsrc_b, 16                    ; [16:19] V# b        (N*K)
.set s_rsrc_bs, 20                   ; [20:23] V# b_scale  (N*K/32)
.set s_rsrc_out, 24                  ; [24:27] V# out      (M*N*2)
.set s_rsrc_ws, 28                   ; [28:31] V# ws       (splits*M*N*4)
.set s_M, 32
.set s_N, 33
.set s_K, 34
.set s_splits, 35
.set s_KB, 36                        ; K/32: scale bytes per row
.set s_wave, 37                      ; wave in the workgroup, 0..3
.set s_chunk, 38                     ; chunk being computed
.set s_chunk_next, 39
.set s_nchunks, 40                   ; cdiv(K, 1024)
.set s_stride, 41                    ; workers on one row: 4*splits
.set s_k0, 42                        ; 1024*chunk: soffset of this chunk's data loads (not range-checked)
.set s_kb0, 43                       ; 32*chunk: soffset of its scale loads
.set s_k0_next, 44
.set s_kb0_next, 45
.set s_exec_cur, 46                  ; [46:47] lanes with data in this chunk
.set s_exec_next, 48                 ; [48:49] ... in the next chunk
.set s_n0, 50                        ; first b row of the workgroup
.set s_tmp, 52                       ; [52:55] scratch
.set s_exec_save, 56                 ; [56:57]

; --- VGPRs (v0 holds the packed work-item ids). 64-bit and wider tuples start 4-aligned. ---
.set v_tid, 1
.set v_lane, 2
.set v_tmp, 4                        ; [4:7] scratch
.set v_off_b, 8                      ; [R]    (n0+r)*K + 16*lane
.set v_off_bs, v_off_b + R           ; [R]    (n0+r)*K/32 + lane/2
.set v_off_a, v_off_bs + R           ; [M_T]  m*K + 16*lane
.set v_off_as, v_off_a + M_T         ; [M_T]  m*K/32 + lane/2
.set v_sb, v_off_as + M_T            ; [R]    b scale byte, then (byte << 23)
.set v_sa, v_sb + R                  ; [M_T]  a scale byte, then (byte << 23)
.set v_rb, ((v_sa + M_T + 3) / 4) * 4 ; [R][4]   raw b bytes of the chunk (16 per row)
.set v_ra, v_rb + 4 * R              ; [M_T][4] raw a bytes
.if M_T <= 4
    .set A_RESIDENT, 1               ; all A' live, one B' row at a time
    .set BF_REGS, 16
    .set AF_REGS, 16 * M_T
.else
    .set A_RESIDENT, 0               ; all B' live, one A' row at a time
    .set BF_REGS, 16 * R
    .set AF_REGS, 16
.endif
.set v_bf, v_ra + 4 * M_T            ; B' f32 (k order): [R][16] or one row [16]; reused by the reduction
.set v_af, v_bf + BF_REGS            ; A' f32: [M_T][16] or one row [16]
.set v_acc, v_af + AF_REGS           ; [M_T][R][2] f32 partials: even k, odd k
.set v_end, v_acc + 2 * M_T * R
.if v_end > 256
    .error "mxfp8_gemv: VGPR budget exceeded"
.endif
; reduction-phase names (registers of the main loop, free by then)
.set v_lds, v_tmp                    ; LDS byte address
.set v_sum, v_tmp + 1                ; this work-item's sum, then the output
.set v_o, v_tmp + 2                  ; output index o = t / P
.set v_m, v_tmp + 3                  ; activation row m = o / R
.set v_n, v_off_b                    ; weight row n = n0 + o % R
.set v_off_out, v_off_b + 1          ; byte offset of out[m, n] / ws[z, m, n]
.set v_flag, v_off_b + 2             ; t % P
.set v_red, v_bf                     ; [V_OUT] partials read back from LDS
.if V_OUT > BF_REGS + AF_REGS
    .error "mxfp8_gemv: the reduction reads V_OUT floats into the B'/A' registers"
.endif

; --- macros ---
; exec-style lane mask of the chunk whose data soffset is s[\s_k]: lanes with 16*l + k0 < K
.macro chunk_lanes s_mask, s_k
    s_sub_u32 s[s_tmp], s[s_K], s[\s_k]                     ; bytes of the row from k0 on (≥ 32)
    s_lshr_b32 s[s_tmp], s[s_tmp], 4                        ; lanes that have 16 of them
    lane_mask_b64 \s_mask, s_tmp
.endm

; weight row \r: its 16 bytes and scale byte of the chunk at soffsets s[\s_k], s[\s_kb]
.macro issue_b_row r, s_k, s_kb
    buffer_load_dwordx4 v[v_rb+4*\r:v_rb+4*\r+3], v[v_off_b+\r], s[s_rsrc_b:s_rsrc_b+3], s[\s_k] offen
    buffer_load_ubyte v[v_sb+\r], v[v_off_bs+\r], s[s_rsrc_bs:s_rsrc_bs+3], s[\s_kb] offen
.endm

; activation row \m: 16 bytes and its scale byte
.macro issue_a m, s_k, s_kb
    buffer_load_dwordx4 v[v_ra+4*\m:v_ra+4*\m+3], v[v_off_a+\m], s[s_rsrc_a:s_rsrc_a+3], s[\s_k] offen
    buffer_load_ubyte v[v_sa+\m], v[v_off_as+\m], s[s_rsrc_as:s_rsrc_as+3], s[\s_kb] offen
.endm

; 16 fp8 bytes in v[\v_src:+3] times 2^(scale-127) → 16 f32 in v[\v_dst:+15], k order
; (byte 2i, 2i+1 → v_dst + 2i, +1). \v_scale holds the scale byte << 23.
.macro cvt16 v_dst, v_src, v_scale
    .set i_, 0
    .rept 4
        v_cvt_scalef32_pk_f32_fp8 v[\v_dst+4*i_:\v_dst+4*i_+1], v[\v_src+i_], v[\v_scale]
        v_cvt_scalef32_pk_f32_fp8 v[\v_dst+4*i_+2:\v_dst+4*i_+3], v[\v_src+i_], v[\v_scale] op_sel:[1,0,0]
        .set i_, i_ + 1
    .endr
.endm

; 8 packed FMAs: acc(m, r) += A'[m] * B'[r] over the lane's 16 k (even k low, odd k high)
.macro fma16 m, r, v_a, v_b
    .set i_, 0
    .rept 8
        v_pk_fma_f32 v[v_acc+2*(R*\m+\r):v_acc+2*(R*\m+\r)+1], v[\v_a+2*i_:\v_a+2*i_+1], v[\v_b+2*i_:\v_b+2*i_+1], v[v_acc+2*(R*\m+\r):v_acc+2*(R*\m+\r)+1]
        .set i_, i_ + 1
    .endr
.endm

; issue every load of the chunk at s[\s_k], s[\s_kb] in the order the chunk body expects
.macro issue_chunk s_k, s_kb
    .if A_RESIDENT
        .set m_, 0
        .rept M_T
            issue_a m_, \s_k, \s_kb
            .set m_, m_ + 1
        .endr
    .endif
    .set r_, 0
    .rept R
        issue_b_row r_, \s_k, \s_kb
        .set r_, r_ + 1
    .endr
    .if !A_RESIDENT
        .set m_, 0
        .rept M_T
            issue_a m_, \s_k, \s_kb
            .set m_, m_ + 1
        .endr
    .endif
.endm

; One chunk, A' resident. In flight at entry (issue order): A (a, a_scale) per row m, then
; (b, b_scale) per row r.
.macro chunk_a_resident issue_next
    s_mov_b64 exec, s[s_exec_cur:s_exec_cur+1]              ; lanes with data in this chunk
    s_waitcnt vmcnt(2*R)                                    ; in flight: A (2M_T) then B (2R) → A landed
    .set m_, 0
    .rept M_T
        v_lshlrev_b32 v[v_sa+m_], 23, v[v_sa+m_]            ; scale byte → f32 exponent field
        cvt16 v_af+16*m_, v_ra+4*m_, v_sa+m_
        .set m_, m_ + 1
    .endr
    .if \issue_next
        s_mov_b64 exec, s[s_exec_next:s_exec_next+1]
        .set m_, 0
        .rept M_T
            issue_a m_, s_k0_next, s_kb0_next               ; raw A is converted: reload it for the next chunk
            .set m_, m_ + 1
        .endr
        s_mov_b64 exec, s[s_exec_cur:s_exec_cur+1]
    .endif
    .set r_, 0
    .rept R
        .if \issue_next
            s_waitcnt vmcnt(2*(R-1) + 2*M_T)                ; in flight: B rows r.. of this chunk, next A, next B rows <r → B[r] landed
        .else
            s_waitcnt vmcnt(2*(R-1-r_))                     ; in flight: B rows r.. of this chunk → B[r] landed
        .endif
        v_lshlrev_b32 v[v_sb+r_], 23, v[v_sb+r_]
        cvt16 v_bf, v_rb+4*r_, v_sb+r_
        .if \issue_next
            s_mov_b64 exec, s[s_exec_next:s_exec_next+1]
            issue_b_row r_, s_k0_next, s_kb0_next           ; raw B[r] is converted: reload it
            s_mov_b64 exec, s[s_exec_cur:s_exec_cur+1]
        .endif
        .set m_, 0
        .rept M_T
            fma16 m_, r_, v_af+16*m_, v_bf
            .set m_, m_ + 1
        .endr
        .set r_, r_ + 1
    .endr
.endm

; One chunk, B' resident. In flight at entry (issue order): (b, b_scale) per row r, then
; (a, a_scale) per row m.
.macro chunk_b_resident issue_next
    s_mov_b64 exec, s[s_exec_cur:s_exec_cur+1]              ; lanes with data in this chunk
    s_waitcnt vmcnt(2*M_T)                                  ; in flight: B (2R) then A (2M_T) → B landed
    .set r_, 0
    .rept R
        v_lshlrev_b32 v[v_sb+r_], 23, v[v_sb+r_]            ; scale byte → f32 exponent field
        cvt16 v_bf+16*r_, v_rb+4*r_, v_sb+r_
        .set r_, r_ + 1
    .endr
    .if \issue_next
        s_mov_b64 exec, s[s_exec_next:s_exec_next+1]
        .set r_, 0
        .rept R
            issue_b_row r_, s_k0_next, s_kb0_next           ; raw B is converted: reload it for the next chunk
            .set r_, r_ + 1
        .endr
        s_mov_b64 exec, s[s_exec_cur:s_exec_cur+1]
    .endif
    .set m_, 0
    .rept M_T
        .if \issue_next
            s_waitcnt vmcnt(2*(M_T-1) + 2*R)                ; in flight: A rows m.. of this chunk, next B, next A rows <m → A[m] landed
        .else
            s_waitcnt vmcnt(2*(M_T-1-m_))                   ; in flight: A rows m.. of this chunk → A[m] landed
        .endif
        v_lshlrev_b32 v[v_sa+m_], 23, v[v_sa+m_]
        cvt16 v_af, v_ra+4*m_, v_sa+m_
        .if \issue_next
            s_mov_b64 exec, s[s_exec_next:s_exec_next+1]
            issue_a m_, s_k0_next, s_kb0_next               ; raw A[m] is converted: reload it
            s_mov_b64 exec, s[s_exec_cur:s_exec_cur+1]
        .endif
        .set r_, 0
        .rept R
            fma16 m_, r_, v_af, v_bf+16*r_
            .set r_, r_ + 1
        .endr
        .set m_, m_ + 1
    .endr
.endm

.macro chunk_body issue_next
    .if A_RESIDENT
        chunk_a_resident \issue_next
    .else
        chunk_b_resident \issue_next
    .endif
.endm

; --- prologue: arguments, buffer descriptors, per-lane offsets ---
    load_mxfp8_gemm_args
    v_and_b32 v[v_tid], 0x3ff, v[v_workitem]                ; work-item id x
    v_and_b32 v[v_lane], 63, v[v_tid]
    v_lshrrev_b32 v[v_tmp], 6, v[v_tid]                     ; wave index (uniform in the wave)
    v_lshlrev_b32 v[v_tmp+1], 4, v[v_lane]                  ; 16*lane
    v_lshrrev_b32 v[v_tmp+2], 1, v[v_lane]                  ; lane/2: the lane's 32-block in the chunk
    v_readfirstlane_b32 s[s_wave], v[v_tmp]                 ; 3 VALU ops since v_tmp was written (1 wait state needed)
    .set o_, 0
    .rept 2 * M_T * R
        v_mov_b32 v[v_acc+o_], 0
        .set o_, o_ + 1
    .endr
    ; Lanes switched off in a partial chunk never load: give their scale and data registers
    ; finite contents (0), so nothing undefined ever reaches a conversion, even in a lane
    ; whose result EXEC discards.
    .set o_, 0
    .rept v_bf - v_sb
        v_mov_b32 v[v_sb+o_], 0
        .set o_, o_ + 1
    .endr
    s_waitcnt lgkmcnt(0)                                    ; in flight: 6 pointers, M, N, K, splits → wait for all
    s_lshr_b32 s[s_KB], s[s_K], 5
    s_mul_i32 s[s_tmp], s[s_M], s[s_K]
    buffer_rsrc s_rsrc_a, s[s_tmp]
    s_mul_i32 s[s_tmp], s[s_M], s[s_KB]
    buffer_rsrc s_rsrc_as, s[s_tmp]
    s_mul_i32 s[s_tmp], s[s_N], s[s_K]
    buffer_rsrc s_rsrc_b, s[s_tmp]
    s_mul_i32 s[s_tmp], s[s_N], s[s_KB]
    buffer_rsrc s_rsrc_bs, s[s_tmp]
    s_mul_i32 s[s_tmp], s[s_M], s[s_N]                      ; M*N elements
    s_lshl_b32 s[s_tmp+1], s[s_tmp], 1
    buffer_rsrc s_rsrc_out, s[s_tmp+1]
    s_mul_i32 s[s_tmp+1], s[s_tmp], s[s_splits]
    s_lshl_b32 s[s_tmp+1], s[s_tmp+1], 2
    buffer_rsrc s_rsrc_ws, s[s_tmp+1]

    ; b rows n0+r: data at (n0+r)*K + 16*lane, scales at (n0+r)*K/32 + lane/2
    s_mul_i32 s[s_n0], s[s_wg_x], R
    s_mul_i32 s[s_tmp], s[s_n0], s[s_K]
    s_mul_i32 s[s_tmp+1], s[s_n0], s[s_KB]
    .set r_, 0
    .rept R
        v_add_u32 v[v_off_b+r_], s[s_tmp], v[v_tmp+1]
        v_add_u32 v[v_off_bs+r_], s[s_tmp+1], v[v_tmp+2]
        s_add_u32 s[s_tmp], s[s_tmp], s[s_K]
        s_add_u32 s[s_tmp+1], s[s_tmp+1], s[s_KB]
        .set r_, r_ + 1
    .endr
    ; a rows m: data at m*K + 16*lane, scales at m*K/32 + lane/2
    s_mov_b32 s[s_tmp], 0
    s_mov_b32 s[s_tmp+1], 0
    .set m_, 0
    .rept M_T
        v_add_u32 v[v_off_a+m_], s[s_tmp], v[v_tmp+1]
        v_add_u32 v[v_off_as+m_], s[s_tmp+1], v[v_tmp+2]
        s_add_u32 s[s_tmp], s[s_tmp], s[s_K]
        s_add_u32 s[s_tmp+1], s[s_tmp+1], s[s_KB]
        .set m_, m_ + 1
    .endr

    ; worker q = 4*z + wave takes chunks q, q + 4*splits, ...
    s_lshl_b32 s[s_stride], s[s_splits], 2
    s_lshl_b32 s[s_chunk], s[s_wg_z], 2
    s_add_u32 s[s_chunk], s[s_chunk], s[s_wave]
    s_add_u32 s[s_nchunks], s[s_K], (1 << CHUNK_SHIFT) - 1
    s_lshr_b32 s[s_nchunks], s[s_nchunks], CHUNK_SHIFT
    s_cmp_ge_u32 s[s_chunk], s[s_nchunks]
    s_cbranch_scc1 L_reduce                                 ; no chunk for this worker: its partials stay 0

; --- main loop: one chunk in flight while the previous one is computed ---
    s_lshl_b32 s[s_k0], s[s_chunk], CHUNK_SHIFT
    s_lshl_b32 s[s_kb0], s[s_chunk], CHUNK_SHIFT - 5
    chunk_lanes s_exec_cur, s_k0
    s_mov_b64 exec, s[s_exec_cur:s_exec_cur+1]
    issue_chunk s_k0, s_kb0
L_chunk_loop:
    s_add_u32 s[s_chunk_next], s[s_chunk], s[s_stride]
    s_cmp_ge_u32 s[s_chunk_next], s[s_nchunks]
    s_cbranch_scc1 L_last_chunk
    s_lshl_b32 s[s_k0_next], s[s_chunk_next], CHUNK_SHIFT
    s_lshl_b32 s[s_kb0_next], s[s_chunk_next], CHUNK_SHIFT - 5
    chunk_lanes s_exec_next, s_k0_next
    chunk_body 1
    s_mov_b32 s[s_chunk], s[s_chunk_next]
    s_mov_b64 s[s_exec_cur:s_exec_cur+1], s[s_exec_next:s_exec_next+1]
    s_branch L_chunk_loop
L_last_chunk:
    chunk_body 0

; --- reduction: lane pairs, then 256 work-items per output through LDS ---
L_reduce:
    s_mov_b64 exec, -1
    v_lshlrev_b32 v[v_lds], 2, v[v_tid]
    .set o_, 0
    .rept V_OUT
        v_add_f32 v[v_acc+2*o_], v[v_acc+2*o_], v[v_acc+2*o_+1]   ; even k + odd k
        ds_write_b32 v[v_lds], v[v_acc+2*o_] offset:1024*o_      ; LDS[256*o + tid]
        .set o_, o_ + 1
    .endr
    s_waitcnt lgkmcnt(0)                                    ; in flight: this wave's ds_writes → done before the barrier
    s_barrier                                               ; all four waves' partials are in LDS
    v_mul_u32_u24 v[v_lds], 4 * V_OUT, v[v_tid]             ; work-item t reads LDS floats [t*V, t*V + V)
    .set i_, 0
    .rept V_OUT / 4
        ds_read_b128 v[v_red+4*i_:v_red+4*i_+3], v[v_lds] offset:16*i_
        .set i_, i_ + 1
    .endr
    v_lshrrev_b32 v[v_o], P_SHIFT, v[v_tid]                 ; output o = t / P: m = o / R, r = o % R
    v_lshrrev_b32 v[v_m], R_SHIFT, v[v_o]
    v_and_b32 v[v_n], R - 1, v[v_o]
    v_add_u32 v[v_n], s[s_n0], v[v_n]                       ; n = n0 + r
    s_waitcnt lgkmcnt(0)                                    ; in flight: the V/4 ds_read_b128 → wait for all
    v_add_f32 v[v_sum], v[v_red], v[v_red+1]
    .set i_, 2
    .rept V_OUT - 2
        v_add_f32 v[v_sum], v[v_sum], v[v_red+i_]
        .set i_, i_ + 1
    .endr
    ; P consecutive lanes hold output o's partials; row_shr steps leave their sum in the last one
    s_nop 1                                                 ; VALU wrote v_sum → DPP reads it: 2 wait states
    v_add_f32_dpp v[v_sum], v[v_sum], v[v_sum] row_shr:1
    s_nop 1                                                 ; VALU → DPP: 2 wait states
    v_add_f32_dpp v[v_sum], v[v_sum], v[v_sum] row_shr:2
    .if P_LANES >= 8
        s_nop 1                                             ; VALU → DPP: 2 wait states
        v_add_f32_dpp v[v_sum], v[v_sum], v[v_sum] row_shr:4
    .endif
    .if P_LANES >= 16
        s_nop 1                                             ; VALU → DPP: 2 wait states
        v_add_f32_dpp v[v_sum], v[v_sum], v[v_sum] row_shr:8
    .endif
    .if P_LANES >= 32
        s_nop 1                                             ; VALU → DPP: 2 wait states
        v_add_f32_dpp v[v_sum], v[v_sum], v[v_sum] row_bcast:15 row_mask:0xa  ; rows 1, 3 += lane 15 of rows 0, 2
    .endif
    .if P_LANES >= 64
        s_nop 1                                             ; VALU → DPP: 2 wait states
        v_add_f32_dpp v[v_sum], v[v_sum], v[v_sum] row_bcast:31 row_mask:0x8  ; row 3 += lane 31
    .endif

    ; store from the last lane of each P-group, for m < M and n < N only
    v_and_b32 v[v_flag], P_LANES - 1, v[v_tid]
    v_cmp_eq_u32 s[s_tmp:s_tmp+1], P_LANES - 1, v[v_flag]   ; last lane of its group holds the sum
    v_cmp_gt_u32 vcc, s[s_N], v[v_n]                        ; n < N
    s_and_b64 s[s_tmp:s_tmp+1], s[s_tmp:s_tmp+1], vcc
    v_cmp_gt_u32 vcc, s[s_M], v[v_m]                        ; m < M
    s_and_b64 exec, s[s_tmp:s_tmp+1], vcc
    s_cbranch_execz L_end
    v_mul_lo_u32 v[v_off_out], v[v_m], s[s_N]
    v_add_u32 v[v_off_out], v[v_off_out], v[v_n]            ; m*N + n
    s_cmp_gt_u32 s[s_splits], 1
    s_cbranch_scc1 L_store_ws
    v_lshlrev_b32 v[v_off_out], 1, v[v_off_out]
.if OUT_F16
    v_cvt_f16_f32 v[v_sum], v[v_sum]                        ; round to nearest even
.else
    v_cvt_pk_bf16_f32 v[v_sum], v[v_sum], 0                 ; round to nearest even; high half unused
.endif
    buffer_store_short v[v_sum], v[v_off_out], s[s_rsrc_out:s_rsrc_out+3], 0 offen
    s_endpgm
L_store_ws:
    ; split z's f32 partial: ws[z, m, n] at 4*(z*M*N + m*N + n)
    s_mul_i32 s[s_tmp], s[s_M], s[s_N]
    s_mul_i32 s[s_tmp], s[s_tmp], s[s_wg_z]
    v_add_u32 v[v_off_out], s[s_tmp], v[v_off_out]
    v_lshlrev_b32 v[v_off_out], 2, v[v_off_out]
    buffer_store_dword v[v_sum], v[v_off_out], s[s_rsrc_ws:s_rsrc_ws+3], 0 offen
L_end:
    s_endpgm
