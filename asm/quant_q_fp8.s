; quant_q_fp8 — bf16 queries to FP8 e4m3 with one per-tensor power-of-two scale found on the
; device, in two launches (PHASE 1, 2: kernels quant_q_fp8_amax, quant_q_fp8), so that
; batch_prefill's FP8 kernel can take bf16 queries over an FP8 KV cache without a host sync
; (loader/ops/fp8_query.py):
;
;   q [total_q, heads_q, 128] bf16, row (t, h) at t * q_seq_stride + h * q_head_stride bytes;
;   a row is 16 chunks of 8 elements (16 bytes): chunk c = (t * heads_q + h) * 16 + p, and
;   `chunks` of them in all
;   amax = max |q| over the finite elements (0 when there is none)
;   X = 2^(max(E, 72) - 7 - 127), E the exponent field of amax as f32: 2^(floor(log2 amax) - 7)
;       for amax >= 2^-55, else 2^-62 (the smallest per-tensor descale batch_prefill takes)
;   q8[t, h, i] = e4m3_rne(q[t, h, i] / X) for a finite element (|q / X| < 2^8 <= 448: no
;       element overflows, so no saturation is needed); the e4m3 NaN for +-Inf and NaN
;   q_descale[0] = X (f32), so that q = q_descale * q8 up to the e4m3 rounding
;
; X is a power of two so that q / X is exact and v_cvt_scalef32_pk_fp8_f32 (which divides by
; its scale operand's power of two and rounds to nearest even once; docs/fp8-conversion-evidence.md)
; gives the result bit for bit, with no f32 division or reciprocal in it. Infinities become
; NaN before the conversion (fma(x, 0, x): x for finite x, NaN for +-Inf and NaN), so the
; result does not depend on MODE.FP16_OVFL.
;
; The magnitude of a bf16 x is kept as m(x) = (bits(x) & 0x7fff) + 0x80 in a signed 16-bit
; lane (v_pk_*_i16, two elements per dword): finite values give 0x80 .. 0x7fff in the order of
; their magnitudes, +-Inf and NaN (0x7f80 .. 0x7fff) wrap to negative values, so a max that
; starts at 0 skips them. amax's bf16 bits are max(m, 0x80) - 0x80 and E = those >> 7.
;
; 1. amax (grid `parts` x WORKGROUP_SIZE_X, parts <= 256): work-item g takes chunks g + k S
;    (S = parts * WORKGROUP_SIZE_X), UNROLL = 8 of them per trip, `trips` trips (the op's
;    cdiv(chunks, 8 S)); a chunk index past the end is clamped to chunks - 1 (re-reading
;    the last chunk leaves a max unchanged, and no address past q is formed). Each wave
;    reduces its lanes (DPP within rows of 16, then v_readlane of the four rows), the waves
;    meet in LDS and partial[wg] = the workgroup's max m.
; 2. quantise (grid cdiv(chunks, UNROLL * WORKGROUP_SIZE_X), UNROLL = 4): every wave reduces
;    partial[0 .. parts) by itself (one dwordx4 per lane, dwords 4 lane .. 4 lane + 3; the
;    buffer's range gives 0 past `parts`) while its Q loads are in flight; work-item `lane` of
;    workgroup w takes chunks w * UNROLL * WG + i * WG + lane, i < UNROLL (loads clamped as
;    above, stores only for chunks < `chunks`), and writes q8's 8 bytes of each at 8 c.
;    Workgroup 0's work-item 0 writes X.
; Integer maxima only: the result is the same on every run and any schedule.
;
; Kernarg (k_* from kernels.yaml): q (*bf16), partial (*u32), q8 (*fp8e4m3), q_descale (*f32);
; chunks, parts, trips, heads_q, q_seq_stride, q_head_stride, head_magic (ceil(2^32 / heads_q),
; 0 for heads_q = 1: t = r / heads_q by multiply-high, exact for chunks / 16 * heads_q <= 2^32,
; which the op checks), q_bytes (q's byte span) (u32).
; LDS (phase 1): one dword per wave, its max.

.include "mxfp8.inc"                 ; buffer_rsrc
.include "buffer_array.inc"          ; buffer_rsrc_array

.if PHASE == 1
    .set UNROLL, 8                   ; chunks (16-byte loads) in flight per work-item: amax has
.else                                ; few workgroups (<= 256), so each keeps more in flight
    .set UNROLL, 4
.endif
.set WAVES, WORKGROUP_SIZE_X / 64
.if PHASE == 1
    .if LDS_BYTES < 4 * WAVES
        .error "quant_q_fp8: LDS too small for the waves' maxima"
    .endif
.endif

; --- SGPRs (s[0:1] kernarg, s2 workgroup x come from the hardware) ---
.set s_rsrc_q, 8                     ; [8:11]  V# q         (q_bytes)
.set s_rsrc_p, 12                    ; [12:15] V# partial   (parts * 4)
.set s_rsrc_o, 16                    ; [16:19] V# q8        (chunks * 8)
.set s_rsrc_d, 20                    ; [20:23] V# q_descale (4)
.set s_chunks, 24                    ; [24:31] the eight u32 arguments, one s_load_dwordx8
.set s_parts, 25
.set s_trips, 26
.set s_heads, 27
.set s_seq_stride, 28
.set s_head_stride, 29
.set s_magic, 30
.set s_q_bytes, 31
.set s_one_head, 32                  ; [32:33] all lanes where heads_q = 1 (magic 0), else none
.set s_last, 34                      ; chunks - 1: the clamp of every load's chunk
.set s_step, 35                      ; chunks between a work-item's consecutive ones
.set s_max, 36                       ; a wave's max m, then (phase 2) E and X's exponent field
.set s_tmp, 37
.set s_bias, 38                      ; 0x00800080: + 0x80 in both 16-bit lanes
.set s_exec, 40                      ; [40:41] saved EXEC
.set s_scale, 42                     ; phase 2: X (f32)
.set s_first, 43                     ; phase 2: the workgroup's first chunk
; --- VGPRs ---
.set v_lane, 1                       ; work-item id in the workgroup
.set v_c, 2                          ; the work-item's next chunk
.set v_r, 3                          ; chunk_offset's temporaries
.set v_t, 4
.set v_h, 5
.set v_acc, 6                        ; running max m, two 16-bit lanes, then one u32
.set v_tmp, 7
.set v_sc, 8                         ; phase 2: X, the conversions' scale operand
.set v_part, 12                      ; [12:15] phase 2: four partial maxima
.set v_off, 16                       ; [16:16+UNROLL) byte offsets of the chunks in q
.set v_data, 24                      ; [24:24+4 UNROLL) the chunks' 8 bf16 each
.set v_f, v_data + 4 * UNROLL        ; [8] phase 2: one chunk's 8 elements as f32
.set v_q8, v_f + 8                   ; [2] phase 2: its 8 e4m3 bytes

; v[\off] = byte offset in q of chunk min(v[v_c], chunks - 1): row r = c >> 4,
; t = r / heads_q (multiply-high; r itself for one head), h = r - t heads_q, part p = c & 15.
.macro chunk_offset off
    v_min_u32 v[v_r], s[s_last], v[v_c]
    v_and_b32 v[v_h], 15, v[v_r]
    v_lshlrev_b32 v[\off], 4, v[v_h]                        ; 16 p
    v_lshrrev_b32 v[v_r], 4, v[v_r]                         ; r
    v_mul_hi_u32 v[v_t], v[v_r], s[s_magic]
    v_cndmask_b32 v[v_t], v[v_t], v[v_r], s[s_one_head:s_one_head+1]   ; t
    v_mul_lo_u32 v[v_h], v[v_t], s[s_heads]
    v_sub_u32 v[v_h], v[v_r], v[v_h]                        ; h
    v_mul_lo_u32 v[v_t], v[v_t], s[s_seq_stride]
    v_mul_lo_u32 v[v_h], v[v_h], s[s_head_stride]
    v_add3_u32 v[\off], v[v_t], v[v_h], v[\off]             ; t q_seq_stride + h q_head_stride + 16 p
.endm

; UNROLL loads in flight: chunk v[v_c] into v_data[0:4], v[v_c] + s[s_step] into v_data[4:8], ...;
; v[v_c] moves past them
.macro load_chunks
    .set i_, 0
    .rept UNROLL
        chunk_offset v_off+i_
        buffer_load_dwordx4 v[v_data+4*i_:v_data+4*i_+3], v[v_off+i_], s[s_rsrc_q:s_rsrc_q+3], 0 offen
        v_add_u32 v[v_c], s[s_step], v[v_c]
        .set i_, i_ + 1
    .endr
.endm

; s[\s_dst] = the max of v[\v_x] over the wave (all 64 lanes active); clobbers v[\v_x], v[v_tmp], s[s_tmp].
.macro wave_max_u32 s_dst, v_x
    s_nop 1                                                 ; VALU wrote v[\v_x] → 2 wait states before a DPP read
    v_max_u32_dpp v[v_tmp], v[\v_x], v[\v_x] quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf
    s_nop 1                                                 ; VALU wrote v_tmp → 2 wait states before a DPP read
    v_max_u32_dpp v[\v_x], v[v_tmp], v[v_tmp] quad_perm:[2,3,0,1] row_mask:0xf bank_mask:0xf   ; quads
    s_nop 1                                                 ; VALU wrote v[\v_x] → 2 wait states before a DPP read
    v_max_u32_dpp v[v_tmp], v[\v_x], v[\v_x] row_half_mirror row_mask:0xf bank_mask:0xf     ; 8 lanes
    s_nop 1                                                 ; VALU wrote v_tmp → 2 wait states before a DPP read
    v_max_u32_dpp v[\v_x], v[v_tmp], v[v_tmp] row_mirror row_mask:0xf bank_mask:0xf         ; each row's 16
    s_nop 0                                                 ; VALU write → v_readlane read: 1 wait state
    v_readlane_b32 s[\s_dst], v[\v_x], 0
    v_readlane_b32 s[s_tmp], v[\v_x], 16
    s_max_u32 s[\s_dst], s[\s_dst], s[s_tmp]
    v_readlane_b32 s[s_tmp], v[\v_x], 32
    s_max_u32 s[\s_dst], s[\s_dst], s[s_tmp]
    v_readlane_b32 s[s_tmp], v[\v_x], 48
    s_max_u32 s[\s_dst], s[\s_dst], s[s_tmp]
.endm

    load_kernarg s_rsrc_q, q
    load_kernarg s_rsrc_p, partial
    load_kernarg s_rsrc_o, q8
    load_kernarg s_rsrc_d, q_descale
    load_kernarg s_chunks, chunks, 8                        ; chunks .. q_bytes
    v_and_b32 v[v_lane], 0x3ff, v[v_workitem]
    s_mov_b32 s[s_bias], 0x00800080
    s_waitcnt lgkmcnt(0)                                    ; in flight: 4 pointers, 8 scalars → wait for all
    buffer_rsrc s_rsrc_q, s[s_q_bytes]
    buffer_rsrc_array s_rsrc_p, s_parts, 4, s_tmp           ; u32 per part
    buffer_rsrc_array s_rsrc_o, s_chunks, 8, s_tmp          ; 8 e4m3 bytes per chunk
    buffer_rsrc s_rsrc_d, 4
    s_sub_u32 s[s_last], s[s_chunks], 1
    s_cmp_eq_u32 s[s_magic], 0
    s_cselect_b64 s[s_one_head:s_one_head+1], -1, 0

.if PHASE == 1
    ; --- amax: UNROLL chunks per trip, a grid stride apart ---
    s_mul_i32 s[s_tmp], s[s_wg_x], WORKGROUP_SIZE_X
    v_add_u32 v[v_c], s[s_tmp], v[v_lane]                   ; g
    s_mul_i32 s[s_step], s[s_parts], WORKGROUP_SIZE_X       ; S
    v_mov_b32 v[v_acc], 0                                   ; m of nothing (below every finite value's)
L_trip:
    load_chunks
    s_waitcnt vmcnt(0)                                      ; in flight: the trip's UNROLL chunks → wait for all
    .set j_, 0
    .rept 4 * UNROLL
        v_and_b32 v[v_tmp], 0x7fff7fff, v[v_data+j_]        ; |x| of both elements
        v_pk_add_u16 v[v_tmp], v[v_tmp], s[s_bias]          ; m(x): non-finite ones wrap negative
        v_pk_max_i16 v[v_acc], v[v_acc], v[v_tmp]
        .set j_, j_ + 1
    .endr
    s_sub_u32 s[s_trips], s[s_trips], 1                     ; (the op sends trips >= 1)
    s_cmp_lg_u32 s[s_trips], 0
    s_cbranch_scc1 L_trip
    v_lshrrev_b32 v[v_tmp], 16, v[v_acc]
    v_and_b32 v[v_acc], 0xffff, v[v_acc]                    ; (both lanes >= 0: max from 0)
    v_max_u32 v[v_acc], v[v_acc], v[v_tmp]
    wave_max_u32 s_max, v_acc
    ; the waves meet in LDS: dword `wave` from its lane 0, then wave 0 reduces them
    v_readfirstlane_b32 s[s_tmp], v[v_lane]
    s_lshr_b32 s[s_tmp], s[s_tmp], 6                        ; wave
    s_lshl_b32 s[s_tmp], s[s_tmp], 2
    v_mov_b32 v[v_t], s[s_tmp]
    v_mov_b32 v[v_acc], s[s_max]
    s_mov_b64 exec, 1                                       ; lane 0
    ds_write_b32 v[v_t], v[v_acc]
    s_waitcnt lgkmcnt(0)                                    ; in flight: the LDS write → it lands before the barrier
    s_barrier                                               ; every wave's max in LDS
    s_cmp_eq_u32 s[s_tmp], 0
    s_cbranch_scc0 L_end                                    ; waves other than 0 are done
    s_mov_b64 exec, -1                                      ; wave 0: lane l reads wave min(l, WAVES - 1)'s max
    v_min_u32 v[v_t], WAVES - 1, v[v_lane]
    v_lshlrev_b32 v[v_t], 2, v[v_t]
    ds_read_b32 v[v_acc], v[v_t]
    s_waitcnt lgkmcnt(0)                                    ; in flight: the waves' maxima → wait
    wave_max_u32 s_max, v_acc
    v_mov_b32 v[v_acc], s[s_max]
    v_mov_b32 v[v_off], s[s_wg_x]
    v_lshlrev_b32 v[v_off], 2, v[v_off]                     ; partial[wg]
    s_mov_b64 exec, 1                                       ; lane 0 stores
    buffer_store_dword v[v_acc], v[v_off], s[s_rsrc_p:s_rsrc_p+3], 0 offen

.elseif PHASE == 2
    ; --- quantise: the partials first, then this work-item's UNROLL chunks in flight ---
    v_and_b32 v[v_t], 63, v[v_lane]
    v_lshlrev_b32 v[v_t], 4, v[v_t]
    buffer_load_dwordx4 v[v_part:v_part+3], v[v_t], s[s_rsrc_p:s_rsrc_p+3], 0 offen
    s_mul_i32 s[s_first], s[s_wg_x], UNROLL * WORKGROUP_SIZE_X
    v_add_u32 v[v_c], s[s_first], v[v_lane]
    s_mov_b32 s[s_step], WORKGROUP_SIZE_X
    load_chunks
    s_waitcnt vmcnt(UNROLL)                                 ; in flight: partials, UNROLL chunks → the partials
    v_max3_u32 v[v_acc], v[v_part], v[v_part+1], v[v_part+2]
    v_max_u32 v[v_acc], v[v_acc], v[v_part+3]
    wave_max_u32 s_max, v_acc                               ; m of all of q
    s_max_u32 s[s_max], s[s_max], 0x80
    s_sub_u32 s[s_max], s[s_max], 0x80                      ; amax's bf16 bits
    s_lshr_b32 s[s_max], s[s_max], 7                        ; E
    s_max_u32 s[s_max], s[s_max], 72
    s_sub_u32 s[s_max], s[s_max], 7                         ; X's exponent field, >= 65 (2^-62)
    s_lshl_b32 s[s_scale], s[s_max], 23                     ; X
    v_mov_b32 v[v_sc], s[s_scale]
    ; workgroup 0's work-item 0 writes X
    s_cmp_eq_u32 s[s_wg_x], 0
    s_cbranch_scc0 L_descale_done
    v_cmp_eq_u32 vcc, 0, v[v_lane]
    s_and_saveexec_b64 s[s_exec:s_exec+1], vcc
    v_mov_b32 v[v_t], 0
    buffer_store_dword v[v_sc], v[v_t], s[s_rsrc_d:s_rsrc_d+3], 0 offen
    s_mov_b64 exec, s[s_exec:s_exec+1]
L_descale_done:
    v_add_u32 v[v_c], s[s_first], v[v_lane]                 ; the work-item's first chunk again
    s_waitcnt vmcnt(0)                                      ; in flight: UNROLL chunks (and the X store) → wait for all
    .set i_, 0
    .rept UNROLL
        .irp k, 0, 1, 2, 3                                  ; dword k: elements 2k (low half), 2k + 1
            v_lshlrev_b32 v[v_f+2*\k], 16, v[v_data+4*i_+\k]
            v_and_b32 v[v_f+2*\k+1], 0xffff0000, v[v_data+4*i_+\k]
        .endr
        .set j_, 0
        .rept 8
            v_fma_f32 v[v_f+j_], v[v_f+j_], 0, v[v_f+j_]       ; x for finite x, NaN for +-Inf and NaN
            .set j_, j_ + 1
        .endr
        .irp d, 0, 1                                        ; low words: elements 4d, 4d + 1
            v_cvt_scalef32_pk_fp8_f32 v[v_q8+\d], v[v_f+4*\d], v[v_f+4*\d+1], v[v_sc]
        .endr
        .irp d, 0, 1                                        ; high words: elements 4d + 2, 4d + 3
            v_cvt_scalef32_pk_fp8_f32 v[v_q8+\d], v[v_f+4*\d+2], v[v_f+4*\d+3], v[v_sc] op_sel:[0,0,0,1]
        .endr
        v_lshlrev_b32 v[v_t], 3, v[v_c]                     ; q8 offset 8 c
        v_cmp_gt_u32 vcc, s[s_chunks], v[v_c]               ; only chunks < `chunks` are stored
        s_and_saveexec_b64 s[s_exec:s_exec+1], vcc
        buffer_store_dwordx2 v[v_q8:v_q8+1], v[v_t], s[s_rsrc_o:s_rsrc_o+3], 0 offen
        s_mov_b64 exec, s[s_exec:s_exec+1]
        v_add_u32 v[v_c], s[s_step], v[v_c]
        .set i_, i_ + 1
    .endr
.else
    .error "quant_q_fp8: PHASE is 1 or 2"
.endif
L_end:
    s_endpgm
