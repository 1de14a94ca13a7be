; mxfp8_gemm — MX-FP8 GEMM with v_mfma_scale_f32_16x16x128_f8f6f4 (any M; built for 3 .. 256)
;
;   out[m, n] = sum_k  a[m, k] * 2^(a_scale[m, k/32] - 127)  *  b[n, k] * 2^(b_scale[n, k/32] - 127)
;
; a [M, K] and b [N, K] are OCP fp8 e4m3 (row-major, K contiguous), a_scale [M, K/32] and
; b_scale [N, K/32] E8M0 bytes; K % 32 == 0, any M ≥ 1 and N ≥ 1. Output bf16 (OUT_F16 = 0)
; or f16 (OUT_F16 = 1) into out [M, N]; with splits > 1 split z writes f32 partials into
; ws[z, M, N] instead and mxfp8_splitk_reduce adds them up (a second pass: see below).
;
; gfx950, wave64, 256 work-items = 4 waves. Defines: MT (16-row M tiles per workgroup), NT
; (16-column N strips per workgroup), OUT_F16. Grid: x = cdiv(M, 16*MT) M blocks (fastest, so
; the workgroups that share a weight tile are dispatched together and meet in L2),
; y = cdiv(N, 16*NT) N tiles, z = splits.
;
; The MFMA. A operand = activations (row i = l%16), B operand = weights (column j = l%16 is
; weight row n0 + 16*strip + l%16). Per 128-K step lane l holds, for its row/column, the 32
; bytes k = 16*(l/16) + t%16 + 64*(t/16) (fact sheet §2): two 16-byte pieces, at 16*(l/16)
; and 64 + 16*(l/16) of the step — two buffer_load_dwordx4 straight into the operand
; registers, no shuffles. The E8M0 scale of row/column l%16 for block b = l/16 comes from lane
; l (§2: scale(i, b) from lane i + 16b), byte 0: one buffer_load_ubyte per lane,
; a_scale[m, 4*step + l/16], b_scale[n, 4*step + l/16]. The MFMA applies the scales to each
; 32-element block sum before accumulating in f32, exactly as MX defines the product.
; D (16x16 f32, 4 VGPRs): lane l, register r holds out[m0 + 16*t + 4*(l/16) + r, n0 + 16*j + l%16].
;
; K split. T = cdiv(K, 128) steps; worker q = 4*z + wave takes steps q, q + 4*splits, ... so
; the four waves of a workgroup stream four neighbouring 128-byte pieces of each row. A step
; is full (its data offsets come from soffset = 128*step, which the range check ignores, while
; voffset = row*K + 16*(l/16) keeps rows past M or N out of range) except the last one when
; K % 128 != 0: there each lane's piece that starts at or past K gets voffset OOB_OFFSET and
; reads 0 (scales too, so a NaN scale of the next row cannot leak in).
;
; Pipeline: two register sets X, Y. Loads of step s+stride go out before the MFMAs of step s
; (one step of loads in flight behind the one computed); s_waitcnt vmcnt(LOADS) waits for the
; older set only. Per step per wave: NT*(2 dwordx4 + 1 ubyte) + MT*(2 dwordx4 + 1 ubyte) loads
; and MT*NT MFMAs (8 passes = 32 cycles each).
;
; Reduction. The four waves' D tiles meet in LDS (ds_write_b128 per tile), s_barrier, then
; wave w adds up tiles w, w+4 (MT*NT/4 tiles each) and stores them: bf16/f16 with one
; buffer_store_short per element (the output is 2*M*N bytes, tiny next to N*K), or f32 into ws.
; Every store whose row ≥ M or column ≥ N gets voffset OOB_OFFSET and is dropped.
;
; Kernarg (k_* from kernels.yaml): a, a_scale, b, b_scale, out, ws; M, N, K, splits.
; LDS map: [0, 4 waves * MT*NT tiles * 1 KiB): wave w's tile q at (w*MT*NT + q) KiB, lane l's
; four f32 at 16*l.

.include "mxfp8.inc"

.if (MT != 1) && (MT != 2) && (MT != 4)
    .error "mxfp8_gemm: MT must be 1, 2 or 4"
.endif
.if (NT != 1) && (NT != 2) && (NT != 4)
    .error "mxfp8_gemm: NT must be 1, 2 or 4"
.endif
.set TILES, MT * NT                  ; D tiles per wave
.if (TILES != 4) && (TILES != 8)
    .error "mxfp8_gemm: the reduction hands TILES/4 tiles to each wave: MT*NT must be 4 or 8"
.endif
.if WORKGROUP_SIZE_X != 256
    .error "mxfp8_gemm: 4 waves of 64 split K"
.endif
.if LDS_BYTES < 4 * TILES * 1024
    .error "mxfp8_gemm: LDS_BYTES must hold 4 waves x TILES x 1 KiB"
.endif
set_log2 NT_SHIFT, NT
.set LOADS, 3 * (NT + MT)            ; vector memory loads per step per wave
.set STEP_SHIFT, 7                   ; 128 bytes of K per MFMA

; --- SGPRs (s[0:1] kernarg, s2..s4 workgroup x/y/z come from the hardware) ---
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
.set s_KB, 36                        ; K/32
.set s_wave, 37
.set s_step, 38                      ; step whose MFMAs come next
.set s_step_ld, 39                   ; step whose loads go out
.set s_nsteps, 40                    ; T = cdiv(K, 128)
.set s_full, 41                      ; K / 128: index of the partial step (never reached if K % 128 == 0)
.set s_stride, 42                    ; 4*splits
.set s_k0, 43                        ; 128*step: soffset of data loads
.set s_kb0, 44                       ; 4*step: soffset of scale loads
.set s_krem, 45                      ; K % 128: bytes of the partial step
.set s_m0, 46
.set s_n0, 47
.set s_tmp, 48                       ; [48:51] scratch
.set s_colmask, 52                   ; [52:53] lanes whose column is < N
.set s_q, 54                         ; tile a wave reduces

; --- VGPRs (v0 holds the packed work-item ids) ---
.set v_tid, 1
.set v_lane, 2
.set v_g, 3                          ; lane / 16: K piece (data) and block (scales) of the lane
.set v_i, 4                          ; lane % 16: row / column of the lane
.set v_oob, 5                        ; OOB_OFFSET
.set v_tmp, 8                        ; [8:11] scratch (tail offsets, store offsets)
.set v_off_b, 12                     ; [NT] (n0 + 16j + i)*K + 16g
.set v_off_bs, v_off_b + NT          ; [NT] (n0 + 16j + i)*K/32 + g
.set v_off_a, v_off_bs + NT          ; [MT] (m0 + 16t + i)*K + 16g
.set v_off_as, v_off_a + MT          ; [MT] (m0 + 16t + i)*K/32 + g
.set SET_B, 0                        ; register set layout: [NT][8] b, [MT][8] a, [NT] b scale, [MT] a scale
.set SET_A, 8 * NT
.set SET_SB, 8 * (NT + MT)
.set SET_SA, SET_SB + NT
.set SET_SIZE, ((SET_SA + MT + 7) / 8) * 8
.set v_set_x, ((v_off_as + MT + 7) / 8) * 8
.set v_set_y, v_set_x + SET_SIZE
.set v_acc, v_set_y + SET_SIZE       ; [MT][NT][4] f32 D tiles, tile q = NT*t + j
.set v_end, v_acc + 4 * TILES
.if v_end > 256
    .error "mxfp8_gemm: VGPR budget exceeded"
.endif
; reduction-phase names
.set v_lds, v_tmp                    ; LDS byte address
.set v_row, v_tmp + 1                ; m of register r = 0
.set v_col, v_tmp + 2                ; n
.set v_base, v_tmp + 3               ; element index m*N + n of register r
.set v_red, v_set_x                  ; [4 waves][4] one tile from every wave, then the sum in [0:3]
.set v_out, v_set_x + 16             ; converted value / store offset scratch [0:1]

; D register \r of the tile being finished: sum the four waves' copies, store element
; (v_row, v_col) (or drop it: row >= M or column >= N), then step to row + 1
.macro store_element r
    v_add_f32 v[v_red+\r], v[v_red+\r], v[v_red+4+\r]
    v_add_f32 v[v_red+\r], v[v_red+\r], v[v_red+8+\r]
    v_add_f32 v[v_red+\r], v[v_red+\r], v[v_red+12+\r]
    v_cmp_gt_u32 vcc, s[s_M], v[v_row]                      ; m < M
    s_and_b64 vcc, vcc, s[s_colmask:s_colmask+1]            ; and n < N
    s_cmp_gt_u32 s[s_splits], 1
    s_cbranch_scc1 L_store_ws_\@
    v_lshlrev_b32 v[v_out+1], 1, v[v_base]
    v_cndmask_b32 v[v_out+1], v[v_oob], v[v_out+1], vcc
.if OUT_F16
    v_cvt_f16_f32 v[v_out], v[v_red+\r]                     ; round to nearest even
.else
    v_cvt_pk_bf16_f32 v[v_out], v[v_red+\r], 0              ; round to nearest even; high half unused
.endif
    buffer_store_short v[v_out], v[v_out+1], s[s_rsrc_out:s_rsrc_out+3], 0 offen
    s_branch L_stored_\@
L_store_ws_\@:
    v_lshlrev_b32 v[v_out+1], 2, v[v_base]
    v_cndmask_b32 v[v_out+1], v[v_oob], v[v_out+1], vcc
    buffer_store_dword v[v_red+\r], v[v_out+1], s[s_rsrc_ws:s_rsrc_ws+3], 0 offen
L_stored_\@:
    v_add_u32 v[v_row], 1, v[v_row]
    v_add_u32 v[v_base], s[s_N], v[v_base]
.endm

; --- prologue ---
    load_mxfp8_gemm_args
    mfma_lanes
    s_waitcnt lgkmcnt(0)                                    ; in flight: 6 pointers, M, N, K, splits → wait for all
    activation_rsrcs
    s_mul_i32 s[s_tmp], s[s_N], s[s_K]
    buffer_rsrc s_rsrc_b, s[s_tmp]
    s_mul_i32 s[s_tmp], s[s_N], s[s_KB]
    buffer_rsrc s_rsrc_bs, s[s_tmp]
    s_mul_i32 s[s_tmp], s[s_M], s[s_N]
    s_lshl_b32 s[s_tmp+1], s[s_tmp], 1
    buffer_rsrc s_rsrc_out, s[s_tmp+1]
    s_mul_i32 s[s_tmp+1], s[s_tmp], s[s_splits]
    s_lshl_b32 s[s_tmp+1], s[s_tmp+1], 2
    buffer_rsrc s_rsrc_ws, s[s_tmp+1]

    ; per-lane row offsets: weight column n = n0 + 16j + i, activation row m = m0 + 16t + i
    s_mul_i32 s[s_m0], s[s_wg_x], 16 * MT
    s_mul_i32 s[s_n0], s[s_wg_y], 16 * NT
    weight_offsets
    .set t_, 0
    .rept MT
        v_add_u32 v[v_tmp], s[s_m0], v[v_i]
        v_add_u32 v[v_tmp], 16 * t_, v[v_tmp]               ; m
        v_mul_lo_u32 v[v_off_a+t_], v[v_tmp], s[s_K]
        v_add_u32 v[v_off_a+t_], v[v_off_a+t_], v[v_tmp+1]
        v_mul_lo_u32 v[v_off_as+t_], v[v_tmp], s[s_KB]
        v_add_u32 v[v_off_as+t_], v[v_off_as+t_], v[v_g]
        .set t_, t_ + 1
    .endr

    ; steps: T = cdiv(K, 128), full K/128, worker q = 4z + wave, stride 4*splits
    mfma_step_bounds
    s_lshl_b32 s[s_stride], s[s_splits], 2
    s_lshl_b32 s[s_step], s[s_wg_z], 2
    s_add_u32 s[s_step], s[s_step], s[s_wave]
    s_cmp_ge_u32 s[s_step], s[s_nsteps]
    s_cbranch_scc1 L_reduce                                 ; no step for this worker: its tiles stay 0

; --- main loop: loads of the next step in flight while this step's MFMAs run ---
    mfma_k_loop

; --- reduction: the 4 waves' tiles through LDS; wave w finishes tiles w, w+4 ---
L_reduce:
    tiles_to_lds
    s_waitcnt lgkmcnt(0)                                    ; in flight: this wave's ds_writes → done before the barrier
    s_barrier                                               ; every wave's tiles are in LDS
    s_mov_b32 s[s_q], s[s_wave]
L_tile:
    ; tile q = NT*t + j: rows m0 + 16t + 4g + r, column n0 + 16j + i
    tile_from_lds
    s_lshr_b32 s[s_tmp], s[s_q], NT_SHIFT                   ; t
    s_lshl_b32 s[s_tmp], s[s_tmp], 4
    s_add_u32 s[s_tmp], s[s_tmp], s[s_m0]                   ; m0 + 16t
    s_and_b32 s[s_tmp+1], s[s_q], NT - 1                    ; j
    s_lshl_b32 s[s_tmp+1], s[s_tmp+1], 4
    s_add_u32 s[s_tmp+1], s[s_tmp+1], s[s_n0]               ; n0 + 16j
    v_lshlrev_b32 v[v_row], 2, v[v_g]
    v_add_u32 v[v_row], s[s_tmp], v[v_row]                  ; m for r = 0
    v_add_u32 v[v_col], s[s_tmp+1], v[v_i]                  ; n
    v_cmp_gt_u32 s[s_colmask:s_colmask+1], s[s_N], v[v_col] ; n < N
    v_mul_lo_u32 v[v_base], v[v_row], s[s_N]
    v_add_u32 v[v_base], v[v_base], v[v_col]                ; m*N + n
    s_cmp_gt_u32 s[s_splits], 1
    s_cbranch_scc0 L_no_ws_base
    s_mul_i32 s[s_tmp+2], s[s_M], s[s_N]
    s_mul_i32 s[s_tmp+2], s[s_tmp+2], s[s_wg_z]
    v_add_u32 v[v_base], s[s_tmp+2], v[v_base]              ; + z*M*N: split z's slice of ws
L_no_ws_base:
    s_waitcnt lgkmcnt(0)                                    ; in flight: the 4 waves' copies of the tile → wait for all
    .set r_, 0
    .rept 4
        store_element r_
        .set r_, r_ + 1
    .endr
    s_add_u32 s[s_q], s[s_q], 4
    s_cmp_lt_u32 s[s_q], TILES
    s_cbranch_scc1 L_tile
    s_endpgm
