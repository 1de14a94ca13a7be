; swiglu_mxfp8_quant — SwiGLU-OAI (gpt-oss) on the split layout, fused with OCP MX-FP8
; quantisation per 32 elements:
;
;   g = min(x[r, i], limit)                       gate = x[:, :I]
;   u = min(max(x[r, I + i], -limit), limit)      up   = x[:, I:]
;   y = g * sigmoid(alpha * g) * (u + beta)       sigmoid(z) = 1 / (1 + 2^(-z log2 e))   (f32)
;   per block b of 32 along I: amax = max |y|; E = max(exponent field of amax - 8, 0), i.e.
;   the OCP shared exponent floor(log2 amax) - emax(e4m3) = floor(log2 amax) - 8, biased by
;   127 and clamped at 0 (2^-127: all-zero or tiny blocks); X = 2^(E - 127)
;   scale[r, b] = E (E8M0 byte); q[r, 32b + j] = e4m3_rne(clamp(y / X, -448, 448))
;
; gfx950, wave64, WORKGROUP_SIZE_X work-items, four per 32-block (8 elements each), so that a
; small M still spreads over many waves: work-item g = wg_x * WORKGROUP_SIZE_X + lane takes
; part p = g & 3 of block k = g >> 2, row r = k / NB (multiply-high by `magic` = ceil(2^32 / NB),
; exact for M * NB * NB < 2^32, which the op checks; magic = 0 means NB = 1), b = k - r * NB.
; Each work-item loads its 8 gate and 8 up values (one dwordx4 each), computes y in f32
; (v_exp_f32 and v_rcp_f32 for the sigmoid) and its amax; two DPP quad_perm maxes give the
; block's amax to its four lanes (a block is 4 aligned lanes of one wave); then the scale,
; the clamp to +-448 X (saturation by the clamp, whatever the mode), the conversion of pairs
; with v_cvt_scalef32_pk_fp8_f32 (which divides by X exactly and rounds to nearest even), an
; 8-byte store of q, and the scale byte from part 0.
; Defines: F16 (0: bf16 input, 1: fp16).
;
; Kernarg (k_* from kernels.yaml): x, q, scale; M, I, NB, magic (u32); neg_alpha_log2e, beta,
; limit (f32). LDS: none.

.include "mxfp8.inc"
.include "swiglu_mxfp8.inc"          ; swiglu_quant8 (one copy, shared with mxfp8_moe_gemm.s)

; --- SGPRs (s[0:1] kernarg, s2 workgroup x come from the hardware) ---
.set s_rsrc_x, 8                     ; [8:11]  V# x      (M * 2I * 2 bytes)
.set s_rsrc_q, 12                    ; [12:15] V# q      (M * I)
.set s_rsrc_s, 16                    ; [16:19] V# scale  (M * NB)
.set s_M, 20
.set s_I, 21
.set s_NB, 22
.set s_magic, 23
.set s_nal, 24                       ; -alpha * log2(e)
.set s_beta, 25
.set s_limit, 26
.set s_tmp, 27
.set s_blocks, 28                    ; M * NB
.set s_up, 29                        ; 2I: bytes from a gate element to its up element
; --- VGPRs ---
.set v_g, 1                          ; work-item index g, then the block index k = g >> 2
.set v_r, 2                          ; row
.set v_b, 3                          ; block in the row
.set v_xoff, 4                       ; byte offset of the work-item's first gate element
.set v_qoff, 5
.set v_soff, 6
.set v_lim, 7                        ; limit (a VGPR: v_med3 takes it twice, once negated)
.set v_am, 8                         ; amax, then the scale exponent E
.set v_sc, 9                         ; X as an f32 scale operand (exponent field E)
.set v_cl, 10                        ; 448 X
.set v_t, 12                         ; [12:13] temporaries of an element pair
.set v_part, 14                      ; g & 3
.set v_gate, 16                      ; [16:19] 8 packed 16-bit gate values
.set v_upv, 20                       ; [20:23] 8 packed 16-bit up values
.set v_y, 24                         ; [24:31] 8 f32 results
.set v_q, 32                         ; [32:33] 8 e4m3 bytes

    load_kernarg s_rsrc_x, x
    load_kernarg s_rsrc_q, q
    load_kernarg s_rsrc_s, scale
    load_kernarg s_M, M, 4                              ; M, I, NB, magic
    load_kernarg s_nal, neg_alpha_log2e, 2                ; and beta
    load_kernarg s_limit, limit
    v_and_b32 v[v_g], 0x3ff, v[v_workitem]
    s_waitcnt lgkmcnt(0)                                    ; in flight: 3 pointers, 7 scalars → wait for all
    s_mul_i32 s[s_blocks], s[s_M], s[s_NB]
    s_lshl_b32 s[s_up], s[s_I], 1
    s_mul_i32 s[s_tmp], s[s_blocks], 128                    ; M * 2I * 2 = M * NB * 128
    buffer_rsrc s_rsrc_x, s[s_tmp]
    s_lshl_b32 s[s_tmp], s[s_blocks], 5                     ; M * I
    buffer_rsrc s_rsrc_q, s[s_tmp]
    buffer_rsrc s_rsrc_s, s[s_blocks]
    s_mul_i32 s[s_tmp], s[s_wg_x], WORKGROUP_SIZE_X
    v_add_u32 v[v_g], s[s_tmp], v[v_g]
    v_and_b32 v[v_part], 3, v[v_g]
    v_lshrrev_b32 v[v_g], 2, v[v_g]                         ; block k
    v_cmp_gt_u32 vcc, s[s_blocks], v[v_g]                   ; k < M * NB (whole blocks: all 4 lanes or none)
    s_and_b64 exec, exec, vcc
    s_cbranch_execz L_end
    v_mul_hi_u32 v[v_r], v[v_g], s[s_magic]                 ; r = k / NB
    v_cmp_eq_u32 vcc, 0, s[s_magic]                         ; magic 0 stands for NB = 1 (2^32 does not fit)
    v_cndmask_b32 v[v_r], v[v_r], v[v_g], vcc
    v_mul_lo_u32 v[v_b], v[v_r], s[s_NB]
    v_sub_u32 v[v_b], v[v_g], v[v_b]                        ; b = k - r * NB
    v_mul_lo_u32 v[v_xoff], v[v_r], s[s_I]                  ; r * I
    v_lshlrev_b32 v[v_qoff], 5, v[v_b]
    v_lshl_add_u32 v[v_qoff], v[v_part], 3, v[v_qoff]
    v_add_u32 v[v_qoff], v[v_xoff], v[v_qoff]               ; q offset r * I + 32 b + 8 p
    v_add_u32 v[v_xoff], v[v_xoff], v[v_qoff]
    v_lshlrev_b32 v[v_xoff], 1, v[v_xoff]                   ; gate offset (r * 2I + 32 b + 8 p) * 2
    buffer_load_dwordx4 v[v_gate:v_gate+3], v[v_xoff], s[s_rsrc_x:s_rsrc_x+3], 0 offen
    v_add_u32 v[v_xoff], s[s_up], v[v_xoff]                 ; up: I elements further
    buffer_load_dwordx4 v[v_upv:v_upv+3], v[v_xoff], s[s_rsrc_x:s_rsrc_x+3], 0 offen
    v_mov_b32 v[v_soff], v[v_g]                             ; scale offset r * NB + b = k
    v_mov_b32 v[v_lim], s[s_limit]
    v_mov_b32 v[v_am], 0
    s_waitcnt vmcnt(0)                                      ; in flight: gate, up → wait for both
    swiglu_quant8                                           ; y, block amax, scale E in v_am, q bytes
    buffer_store_dwordx2 v[v_q:v_q+1], v[v_qoff], s[s_rsrc_q:s_rsrc_q+3], 0 offen
    v_cmp_eq_u32 vcc, 0, v[v_part]                          ; the block's scale from part 0
    s_and_b64 exec, exec, vcc
    buffer_store_byte v[v_am], v[v_soff], s[s_rsrc_s:s_rsrc_s+3], 0 offen
L_end:
    s_endpgm
