; moe_sum — the sum over top_k of an MoE layer's per-slot rows:
;
;   out[t, c] = bf16( sum over j < top_k, in j order, in f32, of y[t * top_k + j, c] )
;   where slot t * top_k + j counts only if its expert e = topk_ids[t, j] is in [0, num_experts)
;   and, with an expert map, expert_map[e] >= 0 (an expert not on this rank contributes
;   nothing here: its rows of y were never written).
;
; gfx950, wave64, WORKGROUP_SIZE_X work-items; grid (cdiv(H / 8, WORKGROUP_SIZE_X), T): one
; token per workgroup row, 8 columns (one dwordx4 of bf16) per work-item. The slot checks are
; scalar (s_buffer_load of the id and the map entry), so an absent slot is a skipped branch.
;
; Kernarg (k_* from kernels.yaml): y, topk_ids, expert_map, out; T, H, top_k, num_experts,
; has_map (u32). LDS: none.

.include "mxfp8.inc"

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
.set s_tmp, 29
.set s_slot, 30                      ; t * top_k + j
.set s_slot_end, 31
.set s_id, 32
.set s_local, 33
.set s_row, 34                       ; byte offset of y[slot, 0]
.set s_row_bytes, 35                 ; 2H
; --- VGPRs ---
.set v_c, 1                          ; column group (8 columns)
.set v_off, 2                        ; byte offset of the group in a row
.set v_yoff, 3
.set v_in, 4                         ; [4:7]   8 bf16 of a slot row
.set v_acc, 8                        ; [8:15]  8 f32 sums
.set v_out, 16                       ; [16:19] 8 bf16 results

    s_load_dwordx2 s[s_rsrc_y:s_rsrc_y+1], s[s_kernarg:s_kernarg+1], k_y
    s_load_dwordx2 s[s_rsrc_ids:s_rsrc_ids+1], s[s_kernarg:s_kernarg+1], k_topk_ids
    s_load_dwordx2 s[s_rsrc_map:s_rsrc_map+1], s[s_kernarg:s_kernarg+1], k_expert_map
    s_load_dwordx2 s[s_rsrc_out:s_rsrc_out+1], s[s_kernarg:s_kernarg+1], k_out
    s_load_dwordx4 s[s_T:s_T+3], s[s_kernarg:s_kernarg+1], k_T          ; T, H, top_k, num_experts
    s_load_dword s[s_has_map], s[s_kernarg:s_kernarg+1], k_has_map
    v_and_b32 v[v_c], 0x3ff, v[v_workitem]
    .irp i, 0, 1, 2, 3, 4, 5, 6, 7
        v_mov_b32 v[v_acc+\i], 0
    .endr
    s_waitcnt lgkmcnt(0)                                    ; in flight: 4 pointers, 5 scalars → wait for all
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
L_slot:
    s_lshl_b32 s[s_tmp], s[s_slot], 2
    s_buffer_load_dword s[s_id], s[s_rsrc_ids:s_rsrc_ids+3], s[s_tmp]
    s_waitcnt lgkmcnt(0)                                    ; in flight: topk_ids[slot] → wait for it
    s_cmp_lt_u32 s[s_id], s[s_E]                            ; 0 <= e < num_experts (unsigned)
    s_cbranch_scc0 L_next
    s_cmp_eq_u32 s[s_has_map], 0
    s_cbranch_scc1 L_add
    s_lshl_b32 s[s_tmp], s[s_id], 2
    s_buffer_load_dword s[s_local], s[s_rsrc_map:s_rsrc_map+3], s[s_tmp]
    s_waitcnt lgkmcnt(0)                                    ; in flight: expert_map[e] → wait for it
    s_cmp_lt_i32 s[s_local], 0                              ; not on this rank
    s_cbranch_scc1 L_next
L_add:
    v_add_u32 v[v_yoff], s[s_row], v[v_off]
    buffer_load_dwordx4 v[v_in:v_in+3], v[v_yoff], s[s_rsrc_y:s_rsrc_y+3], 0 offen
    s_waitcnt vmcnt(0)                                      ; in flight: the slot's 8 values → wait for them
    .irp i, 0, 1, 2, 3
        v_lshlrev_b32 v[v_out+\i], 16, v[v_in+\i]           ; low bf16 → f32
        v_and_b32 v[v_in+\i], 0xffff0000, v[v_in+\i]        ; high bf16 → f32
        v_add_f32 v[v_acc+2*\i], v[v_acc+2*\i], v[v_out+\i]
        v_add_f32 v[v_acc+2*\i+1], v[v_acc+2*\i+1], v[v_in+\i]
    .endr
L_next:
    s_add_u32 s[s_row], s[s_row], s[s_row_bytes]
    s_add_u32 s[s_slot], s[s_slot], 1
    s_cmp_lt_u32 s[s_slot], s[s_slot_end]
    s_cbranch_scc1 L_slot
    .irp i, 0, 1, 2, 3
        v_cvt_pk_bf16_f32 v[v_out+\i], v[v_acc+2*\i], v[v_acc+2*\i+1]   ; round to nearest even
    .endr
    s_mul_i32 s[s_tmp], s[s_wg_y], s[s_row_bytes]
    v_add_u32 v[v_off], s[s_tmp], v[v_off]
    buffer_store_dwordx4 v[v_out:v_out+3], v[v_off], s[s_rsrc_out:s_rsrc_out+3], 0 offen
L_end:
    s_endpgm
