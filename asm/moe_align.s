; moe_align — vLLM's moe_align_block_size on the device, deterministic, O(slots) work, in
; three launches (PHASE 1, 2, 3: kernels moe_align_count, moe_align_scan, moe_align_scatter),
; or for few slots in one (PHASE 0: moe_align_one, the same three phases in one workgroup):
;
;   slot t = token * top_k + k of topk_ids (flattened, `slots` entries); its key is the
;       expert e = topk_ids[t] (map_mode 0, 1) or the local expert expert_map[e] (map_mode 2:
;       vLLM's ignore_invalid_experts, experts the map marks -1 are left out); a slot whose
;       e or key is outside [0, num_experts) (compared unsigned) is skipped: it appears
;       nowhere and counts for no key
;   sorted_token_ids: the slots of key 0, then key 1, ..., each key's run in slot order and
;       padded with the sentinel `slots` to a multiple of block_m; every other entry (up to
;       max_padded) holds the sentinel too
;   expert_ids[b]: the key of block b, through expert_map in map_mode 1 (expert_map[e]: -1
;       for an expert not on this rank); past the last run: 0 (map_mode 1: expert_map[0])
;   num_tokens_post_padded[0] = sum over keys of roundup(count[key], block_m)
;
; The slots are cut into `chunks` chunks of `chunk` slots (a multiple of 64); one wave owns a
; chunk in phases 1 and 3. counts [chunks, num_experts] (int32, the op's workspace) links them.
;
; 1. count (grid cdiv(chunks, 4) x 256 work-items): every workgroup first fills its share of
;    sorted_token_ids with the sentinel (grid-stride, so all of it is filled before phase 3
;    starts); then each wave counts its chunk's keys in its own LDS table (ds_add) and writes
;    the table to its row counts[chunk, :].
; 2. scan (grid 1 x 1024 work-items, 16 waves): work-item k owns key k. A: it sums its column
;    counts[:, k] (BATCH rows per wait, coalesced across the lanes) into the padded total;
;    B: wave 0 scans the padded totals over the keys (DPP, 64 keys at a time) into start[k],
;    writes expert_ids and the total; C: each work-item rewrites its column as absolute
;    offsets, counts[c, k] = start[k] + the counts of chunks before c.
; 3. scatter (grid as phase 1): each wave loads its chunk's row of offsets into its own LDS
;    table and takes its chunk 64 slots at a time, in order: a lane's rank is the number of
;    lower lanes with its key (all 64 keys from LDS, broadcast reads); it stores its slot at
;    offset[key] + rank, and ds_max_u32 moves offset[key] past the round's last such slot.
; 0. one launch (grid 1 x 1024 work-items, 16 waves, at most 16 chunks): phases 1, 2, 3 in
;    turn, each wave a chunk in 1 and 3 and 64 keys in 2, an s_barrier between them; counts
;    live in LDS (LDS_COUNTS: row c is wave c's table, so phase 3 finds its offsets in place)
;    and there is no workspace. The sentinel fill runs after the count, its stores overlapping
;    phase 2 (no wait on them until the barrier before phase 3). The same phase code as the
;    three launches, so the same output.
; Every count and offset is an integer sum or maximum, so no order of lanes, waves or
; workgroups changes a result: the output is the same on every run. Work: phases 1 and 3
; O(slots) (phase 3 ~3 instructions per slot and lane below it, i.e. per slot x 64), phase 2
; O(chunks) per work-item (num_experts * chunks in all).
;
; Kernarg (k_* from kernels.yaml): topk_ids, expert_map, sorted_token_ids, expert_ids,
; num_tokens_post_padded, counts (*i32; not in moe_align_one's); slots, num_experts,
; block_m_log2, max_padded, max_blocks, map_mode, chunk, chunks (u32).
; LDS: phases 1, 3: per wave [LDS_TABLES + LDS_WAVE * wave, +4 * MAX_EXPERTS) its table
; (counts or offsets by key), then (phase 3) its round's 64 keys. Phase 2: [0, 4 * MAX_EXPERTS)
; the padded totals, overwritten by start[key]. LDS_TABLES: 0, or in one launch 4 * MAX_EXPERTS
; (the tables follow phase 2's totals).

.include "mxfp8.inc"                 ; buffer_rsrc
.include "buffer_array.inc"          ; buffer_rsrc_array

.set MAX_EXPERTS, 1024
.set BATCH, 16                        ; phase 2: rows of counts loaded before one wait
.set LDS_KEYS, 4 * MAX_EXPERTS       ; phase 3: the round's keys, after the wave's table
.set LDS_WAVE, LDS_KEYS + 4 * 64
.if PHASE == 0                        ; one launch: counts in LDS, after phase 2's totals
    .set WAVES_LOG2, 4
    .set LDS_COUNTS, 1
    .set LDS_TABLES, 4 * MAX_EXPERTS
    .set LDS_NEED, LDS_TABLES + 16 * LDS_WAVE
.elseif PHASE == 2
    .set WAVES_LOG2, 4
    .set LDS_COUNTS, 0
    .set LDS_TABLES, 0
    .set LDS_NEED, 4 * MAX_EXPERTS
.else
    .set WAVES_LOG2, 2
    .set LDS_COUNTS, 0
    .set LDS_TABLES, 0
    .set LDS_NEED, 4 * LDS_WAVE
.endif
.set WAVES, 1 << WAVES_LOG2
.if LDS_BYTES < LDS_NEED
    .error "moe_align: LDS too small for the phase's tables"
.endif
.if WORKGROUP_SIZE_X != 64 * WAVES
    .error "moe_align: phases 1 and 3 take 4 waves (one chunk each), phase 2 and one launch 16"
.endif

; --- SGPRs (s[0:1] kernarg, s2 workgroup x come from the hardware) ---
.set s_rsrc_ids, 8                   ; [8:11]  V# topk_ids (4 * slots bytes)
.set s_rsrc_map, 12                  ; [12:15] V# expert_map (4 * num_experts, or 0 without a map)
.set s_rsrc_sorted, 16               ; [16:19] V# sorted_token_ids (4 * max_padded)
.set s_rsrc_eids, 20                 ; [20:23] V# expert_ids (4 * max_blocks)
.set s_rsrc_post, 24                 ; [24:27] V# num_tokens_post_padded (4)
.set s_rsrc_counts, 28               ; [28:31] V# counts (4 * num_experts * chunks)
.set s_slots, 32
.set s_E, 33
.set s_bm_log2, 34
.set s_max_padded, 35
.set s_max_blocks, 36
.set s_map_mode, 37
.set s_chunk, 38
.set s_chunks, 39
.set s_tmp, 40
.set s_wave, 41                      ; wave index in the workgroup
.set s_base, 42                      ; loop base: slot, key or block index
.set s_end, 43                       ; end of the wave's chunk (phases 1, 3); phase 2: row start
.set s_lds, 44                       ; the wave's LDS table (phases 1, 3)
.set s_c, 45                         ; the wave's chunk (phases 1, 3)
.set s_carry, 46                     ; phase 2: running start / padded total
.set s_bm_m1, 47                     ; block_m - 1
.set s_saved, 48                     ; [48:49] EXEC
.set s_mask, 50                      ; [50:51]
.set s_valid, 52                     ; [52:53] phase 3: the round's valid lanes
.set s_row_bytes, 54                 ; phase 2: 4 num_experts, one row of counts
.set s_table, 56                     ; phase 2: 4 num_experts chunks
.set s_off, 57                       ; phase 2: byte offset of a row
.set s_active, 58                    ; phase 2: the wave holds a key (64 wave < num_experts)
.set s_row, 59                       ; phases 1, 3: the chunk's row of counts (chunk * num_experts)
.set s_key_map, 55                   ; map_mode == 2
; --- VGPRs ---
.set v_tid, 1
.set v_lane, 2
.set v_t, 3                          ; slot / key / block index of the lane
.set v_addr, 4                       ; byte offset
.set v_id, 5
.set v_one, 6
.set v_cnt, 7
.set v_key, 8                        ; the slot's key, -1 when skipped; phase 2: byte offset of
                                     ; the lane's key in a row (OOB_OFFSET past num_experts)
.set v_rank, 9
.set v_sent, 10
.set v_incl, 11                      ; inclusive scan
.set v_pad, 12
.set v_val, 13                       ; expert_ids value of the lane's key
.set v_nblk, 14
.set v_start, 15
.set v_seg, 16                       ; [16:31] phase 2: BATCH rows' counts of the lane's key
.set v_ids, 20                       ; [20:35] phase 3: 16 keys of the round
.set v_oob, 36                       ; phase 2: OOB_OFFSET

; v_incl = inclusive sum of \v_src over the 64 lanes, DPP only: Hillis-Steele within each
; row of 16 (a lane whose source lies outside its row is not written: it keeps its sum),
; then row 0's total into row 1 and row 2's into row 3 (row_bcast:15, rows 1 and 3), then
; lane 31's (rows 0-1) into rows 2 and 3 (row_bcast:31). Needs every lane active.
.macro scan64 v_dst, v_src
    v_mov_b32 v[\v_dst], v[\v_src]
    .irp ctrl, row_shr:1, row_shr:2, row_shr:4, row_shr:8
        s_nop 1                                             ; VALU wrote \v_dst → 2 wait states before a DPP read
        v_add_u32_dpp v[\v_dst], v[\v_dst], v[\v_dst] \ctrl row_mask:0xf bank_mask:0xf
    .endr
    s_nop 1                                                 ; VALU wrote \v_dst → 2 wait states before a DPP read
    v_add_u32_dpp v[\v_dst], v[\v_dst], v[\v_dst] row_bcast:15 row_mask:0xa bank_mask:0xf
    s_nop 1                                                 ; VALU wrote \v_dst → 2 wait states before a DPP read
    v_add_u32_dpp v[\v_dst], v[\v_dst], v[\v_dst] row_bcast:31 row_mask:0xc bank_mask:0xf
.endm

; v_key = the key of slot v_t (-1 if skipped: past s_end, id or key outside [0, E)); vcc = the
; lanes whose key is valid. Uses v_addr, v_id, s_mask, s_saved.
.macro slot_key
    v_lshlrev_b32 v[v_addr], 2, v[v_t]
    buffer_load_dword v[v_id], v[v_addr], s[s_rsrc_ids:s_rsrc_ids+3], 0 offen   ; past slots: reads 0
    s_waitcnt vmcnt(0)                                      ; in flight: topk_ids[t] (and earlier stores) → wait
    v_cmp_gt_u32 vcc, s[s_end], v[v_t]                      ; t in the chunk
    v_cmp_gt_u32 s[s_mask:s_mask+1], s[s_E], v[v_id]        ; 0 <= e < num_experts (unsigned)
    s_and_b64 vcc, vcc, s[s_mask:s_mask+1]
    s_cmp_eq_u32 s[s_key_map], 0
    s_cbranch_scc1 L_key_done\@                             ; keys are the experts themselves
    s_and_saveexec_b64 s[s_saved:s_saved+1], vcc            ; the map is read at valid e only
    v_lshlrev_b32 v[v_addr], 2, v[v_id]
    buffer_load_dword v[v_id], v[v_addr], s[s_rsrc_map:s_rsrc_map+3], 0 offen   ; key = expert_map[e]
    s_mov_b64 exec, s[s_saved:s_saved+1]
    s_waitcnt vmcnt(0)                                      ; in flight: expert_map[e] → wait
    v_cmp_gt_u32 s[s_mask:s_mask+1], s[s_E], v[v_id]        ; -1 (absent) and keys past num_experts: skipped
    s_and_b64 vcc, vcc, s[s_mask:s_mask+1]
L_key_done\@:
    v_cndmask_b32 v[v_key], -1, v[v_id], vcc
.endm

    load_kernarg s_rsrc_ids, topk_ids
    load_kernarg s_rsrc_map, expert_map
    load_kernarg s_rsrc_sorted, sorted_token_ids
    load_kernarg s_rsrc_eids, expert_ids
    load_kernarg s_rsrc_post, num_tokens_post_padded
.if LDS_COUNTS == 0
    load_kernarg s_rsrc_counts, counts
.endif
    load_kernarg s_slots, slots, 8   ; slots .. chunks, in kernarg order
    v_and_b32 v[v_tid], 0x3ff, v[v_workitem]
    v_and_b32 v[v_lane], 63, v[v_tid]
    v_mov_b32 v[v_one], 1
    s_nop 0                                                 ; VALU wrote v_tid → v_readfirstlane needs 1 wait state
    v_readfirstlane_b32 s[s_wave], v[v_tid]                 ; 64 * wave (lane 0's id)
    s_lshr_b32 s[s_wave], s[s_wave], 6
    s_waitcnt lgkmcnt(0)                                    ; in flight: 6 (one launch 5) pointers, 8 scalars → wait
    buffer_rsrc_array s_rsrc_ids, s_slots, 4, s_tmp
    s_cmp_lg_u32 s[s_map_mode], 0
    s_cselect_b32 s[s_tmp], s[s_E], 0                       ; the map's entries (none without one)
    buffer_rsrc_array s_rsrc_map, s_tmp, 4, s_tmp
    buffer_rsrc_array s_rsrc_sorted, s_max_padded, 4, s_tmp
    buffer_rsrc_array s_rsrc_eids, s_max_blocks, 4, s_tmp
    buffer_rsrc s_rsrc_post, 4
.if LDS_COUNTS == 0
    s_mul_i32 s[s_tmp], s[s_E], s[s_chunks]
    buffer_rsrc_array s_rsrc_counts, s_tmp, 4, s_tmp
.endif
    s_cmp_eq_u32 s[s_map_mode], 2
    s_cselect_b32 s[s_key_map], 1, 0
    s_lshl_b32 s[s_bm_m1], 1, s[s_bm_log2]
    s_sub_u32 s[s_bm_m1], s[s_bm_m1], 1

; The wave's chunk s_c, its first slot s_base and end s_end, its LDS table s_lds (phases 1, 3).
.macro wave_chunk
    s_lshl_b32 s[s_c], s[s_wg_x], WAVES_LOG2
    s_add_u32 s[s_c], s[s_c], s[s_wave]                     ; chunk = WAVES * workgroup + wave
    s_mul_i32 s[s_lds], s[s_wave], LDS_WAVE
    .if LDS_TABLES
        s_add_u32 s[s_lds], s[s_lds], LDS_TABLES
    .endif
    s_mul_i32 s[s_base], s[s_c], s[s_chunk]                 ; the chunk's first slot
    s_add_u32 s[s_end], s[s_base], s[s_chunk]
    s_min_u32 s[s_end], s[s_end], s[s_slots]
.endm

; Branch to \target for a wave past the last chunk (phases 1, 3).
.macro skip_past_chunks target
    s_cmp_lt_u32 s[s_c], s[s_chunks]
    s_cbranch_scc0 \target
.endm

; sorted_token_ids = the sentinel: workgroup g stores entries 64 WAVES g + tid, stepping by
; 64 WAVES workgroups.
.macro sentinel_fill
    v_mov_b32 v[v_sent], s[s_slots]
    s_lshl_b32 s[s_carry], s[s_wg_x], WAVES_LOG2 + 6
    s_add_u32 s[s_tmp], s[s_chunks], WAVES - 1
    s_lshr_b32 s[s_tmp], s[s_tmp], WAVES_LOG2               ; workgroups in the grid
    s_lshl_b32 s[s_tmp], s[s_tmp], WAVES_LOG2 + 6           ; the stride: 64 WAVES per workgroup
L_fill:
    s_cmp_lt_u32 s[s_carry], s[s_max_padded]
    s_cbranch_scc0 L_fill_done
    v_add_u32 v[v_t], s[s_carry], v[v_tid]
    v_lshlrev_b32 v[v_addr], 2, v[v_t]
    buffer_store_dword v[v_sent], v[v_addr], s[s_rsrc_sorted:s_rsrc_sorted+3], 0 offen  ; past max_padded: dropped
    s_add_u32 s[s_carry], s[s_carry], s[s_tmp]
    s_branch L_fill
L_fill_done:
.endm

; Phase 1 (after wave_chunk): the chunk's count of each key in the wave's table. Three
; launches: the sentinel fill first (its stores' latency overlaps the id loads) and the table
; to counts[chunk, :] last; one launch: the fill follows phase 1 (module header).
.macro phase_count
    .if LDS_COUNTS == 0
        sentinel_fill
        skip_past_chunks L_end
    .endif
; --- the wave's table: counts[key] = 0 (one launch: every wave's, the rows phase 2 reads) ---
    v_mov_b32 v[v_cnt], 0
    s_mov_b32 s[s_carry], 0
L_zero:
    v_add_u32 v[v_t], s[s_carry], v[v_lane]
    v_lshl_add_u32 v[v_addr], v[v_t], 2, s[s_lds]
    ds_write_b32 v[v_addr], v[v_cnt]                        ; past num_experts: still the wave's table
    s_add_u32 s[s_carry], s[s_carry], 64
    s_cmp_lt_u32 s[s_carry], s[s_E]
    s_cbranch_scc1 L_zero
    .if LDS_COUNTS
        skip_past_chunks L_counted
    .endif
; --- count the chunk's keys, 64 slots a round ---
L_count:
    v_add_u32 v[v_t], s[s_base], v[v_lane]
    slot_key
    s_and_saveexec_b64 s[s_saved:s_saved+1], vcc
    v_lshl_add_u32 v[v_addr], v[v_key], 2, s[s_lds]
    ds_add_u32 v[v_addr], v[v_one]                          ; one wave's LDS ops run in order
    s_mov_b64 exec, s[s_saved:s_saved+1]
    s_add_u32 s[s_base], s[s_base], 64
    s_cmp_lt_u32 s[s_base], s[s_end]
    s_cbranch_scc1 L_count
.if LDS_COUNTS == 0
; --- counts[chunk, key] = the table ---
    s_mul_i32 s[s_row], s[s_c], s[s_E]                      ; the chunk's row
    s_mov_b32 s[s_carry], 0
L_write:
    v_add_u32 v[v_t], s[s_carry], v[v_lane]
    v_cmp_gt_u32 vcc, s[s_E], v[v_t]
    s_and_saveexec_b64 s[s_saved:s_saved+1], vcc
    v_lshl_add_u32 v[v_addr], v[v_t], 2, s[s_lds]
    ds_read_b32 v[v_cnt], v[v_addr]
    v_add_lshl_u32 v[v_addr], v[v_t], s[s_row], 2           ; 4 (chunk * num_experts + key)
    s_waitcnt lgkmcnt(0)                                    ; in flight: the table entry → wait
    buffer_store_dword v[v_cnt], v[v_addr], s[s_rsrc_counts:s_rsrc_counts+3], 0 offen
    s_mov_b64 exec, s[s_saved:s_saved+1]
    s_add_u32 s[s_carry], s[s_carry], 64
    s_cmp_lt_u32 s[s_carry], s[s_E]
    s_cbranch_scc1 L_write
.endif
L_counted:
.endm

; v[v_seg + j] = counts[chunk c + j, key] for j < BATCH (0 past the table or for a lane past
; num_experts: no buffer holds those offsets; one launch: rows past the last chunk were zeroed,
; and a lane past num_experts reads its table's zeroed tail); s_end = the byte offset of row c.
.macro load_rows
    s_mov_b32 s[s_off], s[s_end]
    .irp j, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15
        v_add_u32 v[v_addr], s[s_off], v[v_key]
        .if LDS_COUNTS
            ds_read_b32 v[v_seg+\j], v[v_addr]
        .else
            buffer_load_dword v[v_seg+\j], v[v_addr], s[s_rsrc_counts:s_rsrc_counts+3], 0 offen
        .endif
        s_add_u32 s[s_off], s[s_off], s[s_row_bytes]
    .endr
.endm

; Phase 2: the padded totals, start[key], expert_ids, the total, and counts as offsets.
.macro phase_scan
    .if LDS_COUNTS
        v_lshlrev_b32 v[v_key], 2, v[v_tid]                 ; the lane's key, its work-item id: its byte offset in a row
        s_mov_b32 s[s_row_bytes], LDS_WAVE                  ; row c: wave c's table
        s_mul_i32 s[s_table], s[s_row_bytes], s[s_chunks]
        s_add_u32 s[s_table], s[s_table], LDS_TABLES        ; the end of the rows
    .else
        v_mov_b32 v[v_oob], OOB_OFFSET
        v_cmp_gt_u32 vcc, s[s_E], v[v_tid]                  ; the lane's key: its work-item id
        v_lshlrev_b32 v[v_key], 2, v[v_tid]
        v_cndmask_b32 v[v_key], v[v_oob], v[v_key], vcc     ; its byte offset in a row (none past num_experts)
        s_lshl_b32 s[s_row_bytes], s[s_E], 2
        s_mul_i32 s[s_table], s[s_row_bytes], s[s_chunks]
    .endif
    s_lshl_b32 s[s_tmp], s[s_wave], 6
    s_cmp_lt_u32 s[s_tmp], s[s_E]
    s_cselect_b32 s[s_active], 1, 0                         ; the wave holds a key
; --- A. padded totals: pad[key] = roundup(sum over the chunks of counts[c, key], block_m) ---
    s_cmp_eq_u32 s[s_active], 0
    s_cbranch_scc1 L_totals_done
    v_mov_b32 v[v_cnt], 0
    s_mov_b32 s[s_end], LDS_TABLES                          ; row 0
L_totals:
    load_rows
    .if LDS_COUNTS
        s_waitcnt lgkmcnt(0)                                ; in flight: BATCH rows → wait for all
    .else
        s_waitcnt vmcnt(0)                                  ; in flight: BATCH rows → wait for all
    .endif
    .irp j, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15
        v_add_u32 v[v_cnt], v[v_cnt], v[v_seg+\j]
    .endr
    s_mov_b32 s[s_end], s[s_off]
    s_cmp_lt_u32 s[s_end], s[s_table]
    s_cbranch_scc1 L_totals
    v_add_u32 v[v_pad], s[s_bm_m1], v[v_cnt]
    v_lshrrev_b32 v[v_pad], s[s_bm_log2], v[v_pad]
    v_lshlrev_b32 v[v_pad], s[s_bm_log2], v[v_pad]
    v_lshlrev_b32 v[v_addr], 2, v[v_tid]
    ds_write_b32 v[v_addr], v[v_pad]                        ; past num_experts: 0, never read as a key's
L_totals_done:
    s_waitcnt lgkmcnt(0)                                    ; in flight: this wave's pad[] writes → done first
    s_barrier                                               ; every padded total ready for wave 0

; --- B. wave 0: start[key] over the keys, expert_ids, the total ---
    s_cmp_eq_u32 s[s_wave], 0
    s_cbranch_scc0 L_scan_done
    s_mov_b32 s[s_carry], 0
    s_mov_b32 s[s_base], 0
L_scan:
    v_add_u32 v[v_t], s[s_base], v[v_lane]                  ; key of the lane
    v_lshlrev_b32 v[v_addr], 2, v[v_t]
    v_mov_b32 v[v_pad], 0
    v_mov_b32 v[v_val], v[v_t]                              ; the block value: the key itself ...
    v_cmp_gt_u32 vcc, s[s_E], v[v_t]
    s_and_saveexec_b64 s[s_saved:s_saved+1], vcc
    ds_read_b32 v[v_pad], v[v_addr]
    s_cmp_eq_u32 s[s_map_mode], 1
    s_cbranch_scc0 L_no_values                              ; ... or, map_mode 1, expert_map[key]
    buffer_load_dword v[v_val], v[v_addr], s[s_rsrc_map:s_rsrc_map+3], 0 offen
    s_waitcnt vmcnt(0)                                      ; in flight: expert_map[key] (and earlier stores) → wait
L_no_values:
    s_mov_b64 exec, s[s_saved:s_saved+1]
    s_waitcnt lgkmcnt(0)                                    ; in flight: pad[key] → wait
    v_lshrrev_b32 v[v_nblk], s[s_bm_log2], v[v_pad]         ; blocks of the key
    scan64 v_incl, v_pad
    v_sub_u32 v[v_start], v[v_incl], v[v_pad]
    v_add_u32 v[v_start], s[s_carry], v[v_start]            ; start[key], exclusive over all keys before
    v_cmp_gt_u32 vcc, s[s_E], v[v_t]
    s_and_saveexec_b64 s[s_saved:s_saved+1], vcc
    ds_write_b32 v[v_addr], v[v_start]                      ; pad[key] becomes start[key]
    v_lshrrev_b32 v[v_addr], s[s_bm_log2], v[v_start]
    v_lshlrev_b32 v[v_addr], 2, v[v_addr]                   ; expert_ids offset of the key's first block
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
    v_readlane_b32 s[s_tmp], v[v_incl], 63                  ; the 64 keys' padded total
    s_add_u32 s[s_carry], s[s_carry], s[s_tmp]
    s_add_u32 s[s_base], s[s_base], 64
    s_cmp_lt_u32 s[s_base], s[s_E]
    s_cbranch_scc1 L_scan
    ; num_tokens_post_padded, from lane 0 (stores past the 4-byte buffer are dropped)
    v_mov_b32 v[v_cnt], s[s_carry]
    v_lshlrev_b32 v[v_addr], 2, v[v_lane]
    buffer_store_dword v[v_cnt], v[v_addr], s[s_rsrc_post:s_rsrc_post+3], 0 offen
    ; the blocks from carry / block_m on: 0, through the map in map_mode 1 (expert_map[0])
    v_mov_b32 v[v_val], 0
    s_cmp_eq_u32 s[s_map_mode], 1
    s_cbranch_scc0 L_tail_value
    v_mov_b32 v[v_addr], 0
    buffer_load_dword v[v_val], v[v_addr], s[s_rsrc_map:s_rsrc_map+3], 0 offen
    s_waitcnt vmcnt(0)                                      ; in flight: expert_map[0] (and earlier stores) → wait
L_tail_value:
    s_lshr_b32 s[s_base], s[s_carry], s[s_bm_log2]
L_tail:
    s_cmp_lt_u32 s[s_base], s[s_max_blocks]
    s_cbranch_scc0 L_scan_done
    v_add_u32 v[v_t], s[s_base], v[v_lane]
    v_lshlrev_b32 v[v_addr], 2, v[v_t]
    buffer_store_dword v[v_val], v[v_addr], s[s_rsrc_eids:s_rsrc_eids+3], 0 offen  ; past max_blocks: dropped
    s_add_u32 s[s_base], s[s_base], 64
    s_branch L_tail
L_scan_done:
    s_waitcnt lgkmcnt(0)                                    ; in flight: wave 0's start[] writes → done first
    s_barrier                                               ; start[key] ready for every wave

; --- C. the table to offsets: counts[c, key] = start[key] + sum of counts[c' < c, key] ---
    s_cmp_eq_u32 s[s_active], 0
    s_cbranch_scc1 L_scanned
    v_lshlrev_b32 v[v_addr], 2, v[v_tid]
    ds_read_b32 v[v_start], v[v_addr]                       ; start[key] (past num_experts: 0, stores dropped)
    s_mov_b32 s[s_end], LDS_TABLES                          ; row 0
L_rows:
    load_rows
    s_waitcnt vmcnt(0) lgkmcnt(0)                           ; in flight: BATCH rows (and start[key]) → wait for all
    s_mov_b32 s[s_off], s[s_end]
    .irp j, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15
        v_add_u32 v[v_addr], s[s_off], v[v_key]
        .if LDS_COUNTS
            ds_write_b32 v[v_addr], v[v_start]              ; rows past the last chunk: never read
        .else
            buffer_store_dword v[v_start], v[v_addr], s[s_rsrc_counts:s_rsrc_counts+3], 0 offen   ; past it: dropped
        .endif
        v_add_u32 v[v_start], v[v_start], v[v_seg+\j]
        s_add_u32 s[s_off], s[s_off], s[s_row_bytes]
    .endr
    s_mov_b32 s[s_end], s[s_off]
    s_cmp_lt_u32 s[s_end], s[s_table]
    s_cbranch_scc1 L_rows
L_scanned:
.endm

; Phase 3 (after wave_chunk): the chunk's slots to their places (three launches: the chunk's
; offsets loaded into the wave's table first; one launch: phase 2 left them there).
.macro phase_scatter
    skip_past_chunks L_end
.if LDS_COUNTS == 0
; --- the wave's table: offset[key] = counts[chunk, key] ---
    s_mul_i32 s[s_row], s[s_c], s[s_E]                      ; the chunk's row
    s_mov_b32 s[s_carry], 0
L_offsets:
    v_add_u32 v[v_t], s[s_carry], v[v_lane]
    v_cmp_gt_u32 vcc, s[s_E], v[v_t]
    s_and_saveexec_b64 s[s_saved:s_saved+1], vcc
    v_add_lshl_u32 v[v_addr], v[v_t], s[s_row], 2           ; 4 (chunk * num_experts + key)
    buffer_load_dword v[v_cnt], v[v_addr], s[s_rsrc_counts:s_rsrc_counts+3], 0 offen
    v_lshl_add_u32 v[v_addr], v[v_t], 2, s[s_lds]
    s_waitcnt vmcnt(0)                                      ; in flight: counts[key, chunk] → wait
    ds_write_b32 v[v_addr], v[v_cnt]
    s_mov_b64 exec, s[s_saved:s_saved+1]
    s_add_u32 s[s_carry], s[s_carry], 64
    s_cmp_lt_u32 s[s_carry], s[s_E]
    s_cbranch_scc1 L_offsets
.endif
    s_add_u32 s[s_tmp], s[s_lds], LDS_KEYS
    v_mov_b32 v[v_start], s[s_tmp]                          ; the round's keys (broadcast reads)
    v_lshl_add_u32 v[v_pad], v[v_lane], 2, s[s_tmp]         ; the lane's key
; --- the chunk, 64 slots a round, in slot order ---
L_round:
    v_add_u32 v[v_t], s[s_base], v[v_lane]
    slot_key
    s_mov_b64 s[s_valid:s_valid+1], vcc
    ds_write_b32 v[v_pad], v[v_key]
    v_mov_b32 v[v_rank], 0
    .irp q, 0, 1, 2, 3                                      ; rank = lower lanes with the same key
        .irp r, 0, 1, 2, 3
            ds_read_b128 v[v_ids+4*\r:v_ids+4*\r+3], v[v_start] offset:64*\q+16*\r   ; same address in every lane
        .endr
        s_waitcnt lgkmcnt(0)                                ; in flight: 16 keys → wait for all
        .irp k, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15
            .if 16*\q+\k < 63                               ; lane 63 is below none
                s_lshl_b64 exec, -1, 16*\q+\k+1             ; the lanes above lane j = 16q + k
                v_cmp_eq_u32 vcc, v[v_ids+\k], v[v_key]     ; inactive lanes: 0
                v_addc_co_u32 v[v_rank], vcc, 0, v[v_rank], vcc     ; + (key[j] == key)
            .endif
        .endr
    .endr
    s_mov_b64 exec, s[s_valid:s_valid+1]
    s_cbranch_execz L_round_next
    v_lshl_add_u32 v[v_addr], v[v_key], 2, s[s_lds]
    ds_read_b32 v[v_cnt], v[v_addr]                         ; offset[key]
    s_waitcnt lgkmcnt(0)                                    ; in flight: offset[key] → wait
    v_add_u32 v[v_cnt], v[v_cnt], v[v_rank]                 ; the slot's place
    v_lshlrev_b32 v[v_id], 2, v[v_cnt]
    buffer_store_dword v[v_t], v[v_id], s[s_rsrc_sorted:s_rsrc_sorted+3], 0 offen
    v_add_u32 v[v_cnt], 1, v[v_cnt]
    ds_max_u32 v[v_addr], v[v_cnt]                          ; offset[key] past the key's last slot of the round
L_round_next:
    s_mov_b64 exec, -1
    s_add_u32 s[s_base], s[s_base], 64
    s_cmp_lt_u32 s[s_base], s[s_end]
    s_cbranch_scc1 L_round
.endm

.if PHASE == 1
    wave_chunk
    phase_count
.elseif PHASE == 2
    phase_scan
.elseif PHASE == 3
    wave_chunk
    phase_scatter
.else
    wave_chunk
    phase_count
    s_waitcnt lgkmcnt(0)                                    ; in flight: this wave's counts → written first
    s_barrier                                               ; every row counted
    sentinel_fill                                           ; after the counts: its stores overlap phase 2
    phase_scan
    s_waitcnt vmcnt(0) lgkmcnt(0)                           ; in flight: sentinels (phase 3 stores over them), offsets
    s_barrier                                               ; every sentinel stored, every row's offsets ready
    wave_chunk                                              ; phase 2 took s_base, s_end
    phase_scatter
.endif
L_end:
    s_endpgm
