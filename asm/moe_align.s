; moe_align — vLLM's moe_align_block_size on the device, deterministic:
;
;   slot t = token * top_k + k of topk_ids (flattened, `slots` entries), expert e = topk_ids[t]
;   sorted_token_ids: the slots of expert 0, then expert 1, ..., each expert's run in slot
;       order and padded with the sentinel `slots` to a multiple of block_m; the rest of the
;       buffer (max_padded entries in all) holds the sentinel too
;   expert_ids[b]: the expert of block b (block_m entries of sorted_token_ids), mapped through
;       expert_map when has_map (-1 for an expert not on this rank); -1 for every block past
;       the last expert's
;   num_tokens_post_padded[0] = sum over experts of roundup(count[e], block_m)
;   An id outside [0, num_experts) (negative ones included: compared unsigned) is skipped:
;   its slot appears nowhere and counts for no expert.
;
; gfx950, wave64. One workgroup of WORKGROUP_SIZE_X work-items (4 waves); grid 1.
; 0. sorted_token_ids filled with the sentinel (first: the stores overlap steps 1-2).
; 1. counts[e] = 0 in LDS.                                                    barrier
; 2. ids to LDS (-1 for an invalid id and for slots past the end, up to a multiple of 64);
;    ds_add_u32 counts[id] += 1; the sentinel stores complete.                barrier
; 3. Wave 0: per chunk of 64 experts, padded counts, an inclusive scan across the lanes
;    (6 DPP adds) plus the previous chunks' total gives start[e] (written over
;    counts[e]); each lane writes its expert's expert_ids blocks; then the total
;    (num_tokens_post_padded) and -1 for the blocks past it.                  barrier
; 4. Every wave takes chunks of 64 slots (wave w: chunks w, w + 4, ...). Lane t's rank among
;    the slots of its expert is the number of slots j < t with the same id: all of the
;    previous chunks' ids (read 16 at a time from LDS with broadcast ds_read_b128) and, in
;    its own chunk, those of lower lanes. sorted_token_ids[start[e] + rank] = t.
; Step 4 costs O(slots^2 / 256) VALU work: meant for decode-sized routings (the op limits
; slots to MAX_SLOTS, the LDS it has for the ids). Nothing depends on the order in which
; lanes or waves run, so the result is the same on every run.
;
; Kernarg (k_* from kernels.yaml): topk_ids, expert_map, sorted_token_ids, expert_ids,
; num_tokens_post_padded (*i32); slots, num_experts, block_m_log2, max_padded, max_blocks,
; has_map (u32).
; LDS: [0, 4 * MAX_EXPERTS) counts[e], overwritten by start[e]; [LDS_IDS, +4 * roundup(slots, 64))
; the sanitised ids.

.include "mxfp8.inc"

.set MAX_EXPERTS, 1024
.set LDS_IDS, 4 * MAX_EXPERTS
.if LDS_BYTES <= LDS_IDS
    .error "moe_align: LDS must hold the counts and the ids"
.endif
.if WORKGROUP_SIZE_X != 256
    .error "moe_align: step 4 hands out chunks of 64 slots to 4 waves"
.endif

; --- SGPRs (s[0:1] kernarg, s2 workgroup x come from the hardware) ---
.set s_rsrc_ids, 8                   ; [8:11]  V# topk_ids (4 * slots bytes)
.set s_rsrc_map, 12                  ; [12:15] V# expert_map (4 * num_experts * has_map)
.set s_rsrc_sorted, 16               ; [16:19] V# sorted_token_ids (4 * max_padded)
.set s_rsrc_eids, 20                 ; [20:23] V# expert_ids (4 * max_blocks)
.set s_rsrc_post, 24                 ; [24:27] V# num_tokens_post_padded (4)
.set s_slots, 28
.set s_E, 29
.set s_bm_log2, 30
.set s_max_padded, 31
.set s_max_blocks, 32
.set s_has_map, 33
.set s_tmp, 34
.set s_wave, 35                      ; wave index in the workgroup
.set s_base, 36                      ; loop base: slot, expert or block index
.set s_carry, 37                     ; step 3: padded tokens of the chunks before
.set s_bm_m1, 38                     ; block_m - 1
.set s_slots64, 39                   ; slots rounded up to 64
.set s_j, 40                         ; step 4: LDS byte address of the next 16 ids
.set s_jend, 41
.set s_saved, 42                     ; [42:43] EXEC
.set s_mask, 44                      ; [44:45]
.set s_left, 46                      ; step 4: slots from this chunk's first to the end
; --- VGPRs ---
.set v_tid, 1
.set v_lane, 2
.set v_t, 3                          ; slot / expert / block index of the lane
.set v_addr, 4                       ; byte offset
.set v_id, 5
.set v_one, 6
.set v_cnt, 7
.set v_pad, 8                        ; padded count of the lane's expert
.set v_nblk, 9                       ; its blocks still to write
.set v_incl, 10                      ; inclusive scan of v_pad
.set v_start, 13
.set v_val, 14                       ; expert_ids value of the lane's expert
.set v_rank, 15
.set v_jaddr, 16
.set v_sent, 17
.set v_ids, 20                       ; [20:35] 16 ids of a batch (4-aligned for ds_read_b128)

    s_load_dwordx2 s[s_rsrc_ids:s_rsrc_ids+1], s[s_kernarg:s_kernarg+1], k_topk_ids
    s_load_dwordx2 s[s_rsrc_map:s_rsrc_map+1], s[s_kernarg:s_kernarg+1], k_expert_map
    s_load_dwordx2 s[s_rsrc_sorted:s_rsrc_sorted+1], s[s_kernarg:s_kernarg+1], k_sorted_token_ids
    s_load_dwordx2 s[s_rsrc_eids:s_rsrc_eids+1], s[s_kernarg:s_kernarg+1], k_expert_ids
    s_load_dwordx2 s[s_rsrc_post:s_rsrc_post+1], s[s_kernarg:s_kernarg+1], k_num_tokens_post_padded
    s_load_dword s[s_slots], s[s_kernarg:s_kernarg+1], k_slots
    s_load_dword s[s_E], s[s_kernarg:s_kernarg+1], k_num_experts
    s_load_dword s[s_bm_log2], s[s_kernarg:s_kernarg+1], k_block_m_log2
    s_load_dword s[s_max_padded], s[s_kernarg:s_kernarg+1], k_max_padded
    s_load_dword s[s_max_blocks], s[s_kernarg:s_kernarg+1], k_max_blocks
    s_load_dword s[s_has_map], s[s_kernarg:s_kernarg+1], k_has_map
    v_and_b32 v[v_tid], 0x3ff, v[v_workitem]
    v_and_b32 v[v_lane], 63, v[v_tid]
    v_mov_b32 v[v_one], 1
    s_nop 0                                                 ; VALU wrote v_tid → v_readfirstlane needs 1 wait state
    v_readfirstlane_b32 s[s_wave], v[v_tid]                 ; 64 * wave (lane 0's id)
    s_lshr_b32 s[s_wave], s[s_wave], 6
    s_waitcnt lgkmcnt(0)                                    ; in flight: 5 pointers, 6 scalars → wait for all
    s_lshl_b32 s[s_tmp], s[s_slots], 2
    buffer_rsrc s_rsrc_ids, s[s_tmp]
    s_mul_i32 s[s_tmp], s[s_E], s[s_has_map]
    s_lshl_b32 s[s_tmp], s[s_tmp], 2
    buffer_rsrc s_rsrc_map, s[s_tmp]
    s_lshl_b32 s[s_tmp], s[s_max_padded], 2
    buffer_rsrc s_rsrc_sorted, s[s_tmp]
    s_lshl_b32 s[s_tmp], s[s_max_blocks], 2
    buffer_rsrc s_rsrc_eids, s[s_tmp]
    buffer_rsrc s_rsrc_post, 4
    s_lshl_b32 s[s_bm_m1], 1, s[s_bm_log2]
    s_sub_u32 s[s_bm_m1], s[s_bm_m1], 1
    s_add_u32 s[s_slots64], s[s_slots], 63
    s_and_b32 s[s_slots64], s[s_slots64], 0xffffffc0
    v_mov_b32 v[v_sent], s[s_slots]

; --- 0. sorted_token_ids = the sentinel everywhere (step 4 overwrites the slots' entries) ---
    s_mov_b32 s[s_base], 0                                  ; first, so that the stores' latency overlaps steps 1-2
L_fill:
    v_add_u32 v[v_t], s[s_base], v[v_tid]
    v_lshlrev_b32 v[v_addr], 2, v[v_t]
    buffer_store_dword v[v_sent], v[v_addr], s[s_rsrc_sorted:s_rsrc_sorted+3], 0 offen  ; past max_padded: dropped
    s_add_u32 s[s_base], s[s_base], WORKGROUP_SIZE_X
    s_cmp_lt_u32 s[s_base], s[s_max_padded]
    s_cbranch_scc1 L_fill

; --- 1. counts[e] = 0 ---
    s_mov_b32 s[s_base], 0
L_zero:
    v_add_u32 v[v_t], s[s_base], v[v_tid]
    v_cmp_gt_u32 vcc, s[s_E], v[v_t]                        ; e < num_experts
    s_and_saveexec_b64 s[s_saved:s_saved+1], vcc
    v_lshlrev_b32 v[v_addr], 2, v[v_t]
    v_mov_b32 v[v_cnt], 0
    ds_write_b32 v[v_addr], v[v_cnt]
    s_mov_b64 exec, s[s_saved:s_saved+1]
    s_add_u32 s[s_base], s[s_base], WORKGROUP_SIZE_X
    s_cmp_lt_u32 s[s_base], s[s_E]
    s_cbranch_scc1 L_zero
    s_waitcnt lgkmcnt(0)                                    ; in flight: this wave's zeroing → done before the barrier
    s_barrier                                               ; every count is 0 before any wave adds to it

; --- 2. ids to LDS, histogram, sentinel fill ---
    s_mov_b32 s[s_base], 0
L_ids:
    v_add_u32 v[v_t], s[s_base], v[v_tid]
    v_lshlrev_b32 v[v_addr], 2, v[v_t]
    buffer_load_dword v[v_id], v[v_addr], s[s_rsrc_ids:s_rsrc_ids+3], 0 offen   ; past slots: reads 0
    s_waitcnt vmcnt(0)                                      ; in flight: topk_ids[t] (after the sentinel stores) → wait
    v_cmp_gt_u32 vcc, s[s_slots], v[v_t]                    ; t < slots
    v_cmp_gt_u32 s[s_mask:s_mask+1], s[s_E], v[v_id]        ; 0 <= id < num_experts (unsigned)
    s_and_b64 vcc, vcc, s[s_mask:s_mask+1]
    v_cndmask_b32 v[v_id], -1, v[v_id], vcc
    v_cmp_gt_u32 s[s_mask:s_mask+1], s[s_slots64], v[v_t]   ; t < roundup(slots, 64): the LDS id array
    s_and_saveexec_b64 s[s_saved:s_saved+1], s[s_mask:s_mask+1]
    ds_write_b32 v[v_addr], v[v_id] offset:LDS_IDS
    s_and_b64 exec, exec, vcc                               ; valid slots count for their expert
    v_lshlrev_b32 v[v_cnt], 2, v[v_id]
    ds_add_u32 v[v_cnt], v[v_one]
    s_mov_b64 exec, s[s_saved:s_saved+1]
    s_add_u32 s[s_base], s[s_base], WORKGROUP_SIZE_X
    s_cmp_lt_u32 s[s_base], s[s_slots64]
    s_cbranch_scc1 L_ids
    s_waitcnt vmcnt(0) lgkmcnt(0)                           ; in flight: sentinel stores, ids, count adds → all done
    s_barrier                                               ; counts, ids complete; sentinels before step 4's stores

; --- 3. wave 0: padded prefix sum, expert_ids, the total ---
    s_cmp_eq_u32 s[s_wave], 0
    s_cbranch_scc0 L_scan_done
    s_mov_b32 s[s_carry], 0
    s_mov_b32 s[s_base], 0
L_scan:
    v_add_u32 v[v_t], s[s_base], v[v_lane]                  ; expert e of the lane
    v_lshlrev_b32 v[v_addr], 2, v[v_t]
    v_mov_b32 v[v_cnt], 0
    v_cmp_gt_u32 vcc, s[s_E], v[v_t]
    s_and_saveexec_b64 s[s_saved:s_saved+1], vcc
    ds_read_b32 v[v_cnt], v[v_addr]
    s_cmp_eq_u32 s[s_has_map], 0
    s_cbranch_scc1 L_no_map                                 ; no map: no load (its latency would be wasted)
    buffer_load_dword v[v_val], v[v_addr], s[s_rsrc_map:s_rsrc_map+3], 0 offen  ; expert_map[e]
    s_waitcnt vmcnt(0)                                      ; in flight: expert_map[e] (and earlier stores) → wait
L_no_map:
    s_mov_b64 exec, s[s_saved:s_saved+1]
    s_waitcnt lgkmcnt(0)                                    ; in flight: counts[e] → wait (stores: nothing reads them)
    v_cmp_ne_u32 vcc, 0, s[s_has_map]
    v_cndmask_b32 v[v_val], v[v_t], v[v_val], vcc           ; the block value: expert_map[e] or e
    v_add_u32 v[v_pad], s[s_bm_m1], v[v_cnt]
    v_lshrrev_b32 v[v_nblk], s[s_bm_log2], v[v_pad]         ; blocks of expert e
    v_lshlrev_b32 v[v_pad], s[s_bm_log2], v[v_nblk]
    ; inclusive scan of v_pad over the 64 lanes with DPP (no LDS round trips): Hillis-Steele
    ; within each row of 16 (a lane whose source lies outside its row is not written: it keeps
    ; its sum), then row 0's total into row 1 and row 2's into row 3 (row_bcast:15, rows 1 and
    ; 3), then lane 31's (rows 0-1) into rows 2 and 3 (row_bcast:31).
    v_mov_b32 v[v_incl], v[v_pad]
    .irp ctrl, row_shr:1, row_shr:2, row_shr:4, row_shr:8
        s_nop 1                                             ; VALU wrote v_incl → 2 wait states before a DPP read
        v_add_u32_dpp v[v_incl], v[v_incl], v[v_incl] \ctrl row_mask:0xf bank_mask:0xf
    .endr
    s_nop 1                                                 ; VALU wrote v_incl → 2 wait states before a DPP read
    v_add_u32_dpp v[v_incl], v[v_incl], v[v_incl] row_bcast:15 row_mask:0xa bank_mask:0xf
    s_nop 1                                                 ; VALU wrote v_incl → 2 wait states before a DPP read
    v_add_u32_dpp v[v_incl], v[v_incl], v[v_incl] row_bcast:31 row_mask:0xc bank_mask:0xf
    v_sub_u32 v[v_start], v[v_incl], v[v_pad]
    v_add_u32 v[v_start], s[s_carry], v[v_start]            ; start[e], exclusive over all experts before e
    v_cmp_gt_u32 vcc, s[s_E], v[v_t]
    s_and_saveexec_b64 s[s_saved:s_saved+1], vcc
    ds_write_b32 v[v_addr], v[v_start]                      ; counts[e] becomes start[e]
    v_lshrrev_b32 v[v_addr], s[s_bm_log2], v[v_start]
    v_lshlrev_b32 v[v_addr], 2, v[v_addr]                   ; expert_ids offset of e's first block
L_blocks:
    v_cmp_lt_u32 vcc, 0, v[v_nblk]
    s_and_b64 exec, exec, vcc
    s_cbranch_execz L_blocks_done
    buffer_store_dword v[v_val], v[v_addr], s[s_rsrc_eids:s_rsrc_eids+3], 0 offen
    v_add_u32 v[v_addr], 4, v[v_addr]
    v_subrev_u32 v[v_nblk], 1, v[v_nblk]
    s_branch L_blocks
L_blocks_done:
    s_mov_b64 exec, s[s_saved:s_saved+1]
    v_readlane_b32 s[s_tmp], v[v_incl], 63                  ; the chunk's padded total
    s_add_u32 s[s_carry], s[s_carry], s[s_tmp]
    s_add_u32 s[s_base], s[s_base], 64
    s_cmp_lt_u32 s[s_base], s[s_E]
    s_cbranch_scc1 L_scan
    ; num_tokens_post_padded, from lane 0 (stores past the 4-byte buffer are dropped)
    v_mov_b32 v[v_cnt], s[s_carry]
    v_lshlrev_b32 v[v_addr], 2, v[v_lane]
    buffer_store_dword v[v_cnt], v[v_addr], s[s_rsrc_post:s_rsrc_post+3], 0 offen
    ; -1 for the blocks from carry / block_m on
    s_lshr_b32 s[s_base], s[s_carry], s[s_bm_log2]
    v_mov_b32 v[v_val], -1
L_tail:
    s_cmp_lt_u32 s[s_base], s[s_max_blocks]
    s_cbranch_scc0 L_tail_done
    v_add_u32 v[v_t], s[s_base], v[v_lane]
    v_lshlrev_b32 v[v_addr], 2, v[v_t]
    buffer_store_dword v[v_val], v[v_addr], s[s_rsrc_eids:s_rsrc_eids+3], 0 offen  ; past max_blocks: dropped
    s_add_u32 s[s_base], s[s_base], 64
    s_branch L_tail
L_tail_done:
L_scan_done:
    s_waitcnt lgkmcnt(0)                                    ; in flight: wave 0's start[] writes → done first
    s_barrier                                               ; start[e] ready for every wave

; --- 4. stable scatter, 64 slots per wave and round ---
    s_lshl_b32 s[s_base], s[s_wave], 6
L_chunk:
    s_cmp_lt_u32 s[s_base], s[s_slots]
    s_cbranch_scc0 L_end
    v_add_u32 v[v_t], s[s_base], v[v_lane]
    v_lshlrev_b32 v[v_addr], 2, v[v_t]
    ds_read_b32 v[v_id], v[v_addr] offset:LDS_IDS
    v_mov_b32 v[v_rank], 0
    s_lshl_b32 s[s_jend], s[s_base], 2
    s_add_u32 s[s_jend], s[s_jend], LDS_IDS                 ; this chunk's first id
    s_mov_b32 s[s_j], LDS_IDS
    s_waitcnt lgkmcnt(0)                                    ; in flight: the lane's own id → wait for it
L_prior:                                                    ; every slot of the chunks before this one
    s_cmp_lt_u32 s[s_j], s[s_jend]
    s_cbranch_scc0 L_prior_done
    v_mov_b32 v[v_jaddr], s[s_j]
    .irp q, 0, 1, 2, 3
        ds_read_b128 v[v_ids+4*\q:v_ids+4*\q+3], v[v_jaddr] offset:16*\q   ; same address in every lane
    .endr
    s_add_u32 s[s_j], s[s_j], 64
    s_waitcnt lgkmcnt(0)                                    ; in flight: 16 ids → wait for all
    .irp k, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15
        v_cmp_eq_u32 vcc, v[v_ids+\k], v[v_id]
        v_addc_co_u32 v[v_rank], vcc, 0, v[v_rank], vcc     ; + (id[j] == id)
    .endr
    s_branch L_prior
L_prior_done:
    v_mov_b32 v[v_jaddr], s[s_jend]
    s_sub_u32 s[s_left], s[s_slots], s[s_base]              ; 64 or more in all chunks but the last
    .irp q, 0, 1, 2, 3                                      ; the own chunk: only lanes below count
        s_cmp_le_u32 s[s_left], 16*\q                       ; groups past the last slot hold no lower slot
        s_cbranch_scc1 L_own_done
        .irp r, 0, 1, 2, 3
            ds_read_b128 v[v_ids+4*\r:v_ids+4*\r+3], v[v_jaddr] offset:64*\q+16*\r
        .endr
        s_waitcnt lgkmcnt(0)                                ; in flight: 16 ids → wait for all
        .irp k, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15
            v_cmp_eq_u32 vcc, v[v_ids+\k], v[v_id]
            v_cmp_lt_u32 s[s_mask:s_mask+1], 16*\q+\k, v[v_lane]   ; slot j = base + 16q + k below the lane's
            s_and_b64 vcc, vcc, s[s_mask:s_mask+1]
            v_addc_co_u32 v[v_rank], vcc, 0, v[v_rank], vcc
        .endr
    .endr
L_own_done:
    v_cmp_gt_u32 vcc, s[s_E], v[v_id]                       ; a valid slot (invalid ids and the tail are -1)
    s_and_saveexec_b64 s[s_saved:s_saved+1], vcc
    v_lshlrev_b32 v[v_addr], 2, v[v_id]
    ds_read_b32 v[v_start], v[v_addr]
    s_waitcnt lgkmcnt(0)                                    ; in flight: start[id] → wait for it
    v_add_u32 v[v_addr], v[v_start], v[v_rank]
    v_lshlrev_b32 v[v_addr], 2, v[v_addr]
    buffer_store_dword v[v_t], v[v_addr], s[s_rsrc_sorted:s_rsrc_sorted+3], 0 offen
    s_mov_b64 exec, s[s_saved:s_saved+1]
    s_add_u32 s[s_base], s[s_base], WORKGROUP_SIZE_X
    s_branch L_chunk
L_end:
    s_endpgm
