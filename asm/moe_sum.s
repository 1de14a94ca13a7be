; moe_sum — the sum over top_k of an MoE layer's per-slot rows:
;
;   out[t, c] = bf16( sum over j < top_k, in j order, in f32, of y[t * top_k + j, c] )
;   where slot t * top_k + j counts only if its expert e = topk_ids[t, j] is in [0, num_experts)
;   and its local expert (expert_map[e] with a map, else e) is in [0, num_local): the GEMMs skip
;   every other slot (an expert not on this rank: expert_map -1), so its rows of y were never
;   written.
;
; gfx950, wave64, WORKGROUP_SIZE_X work-items; grid (cdiv(H / 8, WORKGROUP_SIZE_X), T): one
; token per workgroup row, 8 columns (one dwordx4 of bf16) per work-item. Slots go in batches of
; BATCH: the batch's ids (scalar loads) and rows (one dwordx4 each) are all issued before one
; wait, then, with a map, the map entries of the valid ids (a second scalar round); the adds
; follow in slot order, a skipped branch for an invalid or absent slot. So a token costs about
; two memory latencies per batch, not two per slot.
;
; Kernarg (k_* from kernels.yaml): y, topk_ids, expert_map, out; T, H, top_k, num_experts,
; has_map, num_local (u32). LDS: none.

.include "mxfp8.inc"

.set BATCH, 8

; --- SGPRs (s[0:1] kernarg, s2/s3 workgroup x/y come from the hardware) ---
.set s_rsrc_y, 8                     ; [8:11]  V# y          (T * top_k * H * 2 bytes)
.set s_rsrc_ids, 12                  ; [12:15] V# topk_ids   (T * top_k * 4)
.set s_rsrc_map, 16                  ; [16:19] V# expert_map (num_experts * 4, with a map)
.set s_rsrc_out, 20                  ; [20:23] V# out        (T * H * 2)
.set s_T, 24
.set s_H, 25
.set s_topk, 26
.set s_E, 27
.set s_has_map, 28
.set s_nloc, 29                      ; local experts (w1/w2's E)
.set s_tmp, 52
.set s_slot, 30                      ; first slot of the batch
.set s_slot_end, 31
.set s_left, 32                      ; slots from s_slot to the token's end
.set s_row, 33                       ; byte offset of y[slot, 0]
.set s_row_bytes, 34                 ; 2H
.set s_ids, 36                       ; [36:43] the batch's expert ids
.set s_local, 44                     ; [44:51] their expert_map entries (-1: skip)
; --- VGPRs ---
.set v_c, 1                          ; column group (8 columns)
.set v_off, 2                        ; byte offset of the group in a row
.set v_yoff, 3
.set v_acc, 8                        ; [8:15]  8 f32 sums
.set v_lo, 16                        ; [16:19] low halves as f32; then the 8 bf16 results
.set v_in, 20                        ; [20:20+4*BATCH) the batch's rows, 8 bf16 each

    load_kernarg s_rsrc_y, y
    load_kernarg s_rsrc_ids, topk_ids
    load_kernarg s_rsrc_map, expert_map
    load_kernarg s_rsrc_out, out
    load_kernarg s_T, T, 4          ; T, H, top_k, num_experts
    load_kernarg s_has_map, has_map, 2   ; and num_local
    v_and_b32 v[v_c], 0x3ff, v[v_workitem]
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7
        v_mov_b32 v[v_acc+\i], 0
    .endr
    s_waitcnt lgkmcnt(0)                                    ; in flight: 4 pointers, 6 scalars → wait for all
    s_mul_i32 s[s_slot], s[s_T], s[s_topk]                  ; slots
    s_lshl_b32 s[s_tmp], s[s_slot], 2
    buffer_rsrc s_rsrc_ids, s[s_tmp]
    s_lshl_b32 s[s_row_bytes], s[s_H], 1
    s_mul_i32 s[s_tmp], s[s_slot], s[s_row_bytes]
    buffer_rsrc s_rsrc_y, s[s_tmp]
    s_mul_i32 s[s_tmp], s[s_E], s[s_has_map]
    s_lshl_b32 s[s_tmp], s[s_tmp], 2
    buffer_rsrc s_rsrc_map, s[s_tmp]
    s_mul_i32 s[s_tmp], s[s_T], s[s_row_bytes]
    buffer_rsrc s_rsrc_out, s[s_tmp]
    s_mul_i32 s[s_tmp], s[s_wg_x], WORKGROUP_SIZE_X
    v_add_u32 v[v_c], s[s_tmp], v[v_c]
    s_lshr_b32 s[s_tmp], s[s_H], 3
    v_cmp_gt_u32 vcc, s[s_tmp], v[v_c]                      ; c < H / 8
    s_and_b64 exec, exec, vcc
    s_cbranch_execz L_end
    v_lshlrev_b32 v[v_off], 4, v[v_c]                       ; 16 bytes per group
    s_mul_i32 s[s_slot], s[s_wg_y], s[s_topk]               ; first slot of token t
    s_add_u32 s[s_slot_end], s[s_slot], s[s_topk]
    s_mul_i32 s[s_row], s[s_slot], s[s_row_bytes]

L_batch:
    s_sub_u32 s[s_left], s[s_slot_end], s[s_slot]
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7                          ; issue: id and row of each slot of the batch
        s_cmp_le_u32 s[s_left], \i
        s_cbranch_scc1 L_issued
        s_add_u32 s[s_tmp], s[s_slot], \i
        s_lshl_b32 s[s_tmp], s[s_tmp], 2
        s_buffer_load_dword s[s_ids+\i], s[s_rsrc_ids:s_rsrc_ids+3], s[s_tmp]
        v_add_u32 v[v_yoff], s[s_row], v[v_off]
        buffer_load_dwordx4 v[v_in+4*\i:v_in+4*\i+3], v[v_yoff], s[s_rsrc_y:s_rsrc_y+3], 0 offen
        s_add_u32 s[s_row], s[s_row], s[s_row_bytes]
    .endr
L_issued:
    s_waitcnt lgkmcnt(0)                                    ; in flight: the batch's ids (rows may still be loading)
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7                          ; s_local[i]: slot i's local expert, -1 if invalid
        s_cmp_le_u32 s[s_left], \i
        s_cbranch_scc1 L_mapped
        s_mov_b32 s[s_local+\i], -1
        s_cmp_lt_u32 s[s_ids+\i], s[s_E]                    ; 0 <= e < num_experts (unsigned)
        s_cbranch_scc0 L_map_\i
        s_mov_b32 s[s_local+\i], s[s_ids+\i]
        s_cmp_eq_u32 s[s_has_map], 0
        s_cbranch_scc1 L_map_\i
        s_lshl_b32 s[s_tmp], s[s_ids+\i], 2
        s_buffer_load_dword s[s_local+\i], s[s_rsrc_map:s_rsrc_map+3], s[s_tmp]   ; expert_map[e] (-1: absent)
L_map_\i:
    .endr
L_mapped:
    s_waitcnt vmcnt(0) lgkmcnt(0)                           ; in flight: the batch's rows and map entries → wait for all
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7                          ; add in slot order
        s_cmp_le_u32 s[s_left], \i
        s_cbranch_scc1 L_added
        s_cmp_lt_u32 s[s_local+\i], s[s_nloc]              ; 0 <= local < num_local (unsigned)
        s_cbranch_scc0 L_add_\i
        .irp p, 0, 1, 2, 3
            v_lshlrev_b32 v[v_lo+\p], 16, v[v_in+4*\i+\p]  ; low bf16 → f32
            v_and_b32 v[v_in+4*\i+\p], 0xffff0000, v[v_in+4*\i+\p]   ; high bf16 → f32
            v_add_f32 v[v_acc+2*\p], v[v_acc+2*\p], v[v_lo+\p]
            v_add_f32 v[v_acc+2*\p+1], v[v_acc+2*\p+1], v[v_in+4*\i+\p]
        .endr
L_add_\i:
    .endr
L_added:
    s_add_u32 s[s_slot], s[s_slot], BATCH
    s_cmp_lt_u32 s[s_slot], s[s_slot_end]
    s_cbranch_scc1 L_batch
    .irp p, 0, 1, 2, 3
        v_cvt_pk_bf16_f32 v[v_lo+\p], v[v_acc+2*\p], v[v_acc+2*\p+1]   ; round to nearest even
    .endr
    s_mul_i32 s[s_tmp], s[s_wg_y], s[s_row_bytes]
    v_add_u32 v[v_off], s[s_tmp], v[v_off]
    buffer_store_dwordx4 v[v_lo:v_lo+3], v[v_off], s[s_rsrc_out:s_rsrc_out+3], 0 offen
L_end:
    s_endpgm
