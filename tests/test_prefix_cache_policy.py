"""The prefix cache's decisions, without a model."""

from __future__ import annotations

from host_runtime.engine.prefix_cache import Copy, Demote, DropDisk, DropRam, PrefixCache, Restore, Spill, Trim

C = 4
SYSTEM = list(range(100, 112))  # 12 tokens: three whole chunks


def prompt(*tail):
    return SYSTEM + list(tail)


def test_only_whole_chunks_leaving_a_token_to_compute_are_cacheable():
    cache = PrefixCache(2, C, 10**9, 0)
    assert cache.cacheable_length(list(range(12))) == 8  # 12 tokens: the last must still be computed
    assert cache.cacheable_length(list(range(13))) == 12
    assert cache.cacheable_length([1]) == 0


def test_first_request_misses_then_a_shared_prefix_hits_in_context():
    cache = PrefixCache(2, C, 10**9, 0)
    first = cache.admit(prompt(1, 2))
    assert first.source == "miss" and first.reuse == 0
    assert cache.release(first.slot_id, prompt(1, 2), cacheable=True) == Trim(first.slot_id, 12)
    second = cache.admit(prompt(7, 8, 9))
    assert (second.source, second.slot_id, second.reuse) == ("context", first.slot_id, 12)
    assert second.actions == [Trim(first.slot_id, 12)]
    assert cache.hits["context"] == 1 and cache.tokens_reused == 12


def test_where_a_row_is_computed_alike_in_any_call_a_prefix_ends_anywhere_and_keeps_the_answer():
    """any_position (a shape-blind model): no cut to keep, so a slot keeps every token in its KV (the prompt and
    the answer it generated) and a hit resumes where the prompts part."""
    cache = PrefixCache(1, C, 10**9, 0, any_position=True)
    assert cache.cacheable_length(list(range(13))) == 12 and cache.cacheable_length(list(range(14))) == 13
    a = cache.admit(prompt(1, 2, 3))
    answer = [50, 51, 52]
    assert cache.release(a.slot_id, prompt(1, 2, 3) + answer, cacheable=True) == Trim(a.slot_id, 18)
    b = cache.admit(prompt(1, 2, 3) + answer + [9, 9])  # the next turn quotes the answer
    assert (b.source, b.reuse) == ("context", 18)
    cache.release(b.slot_id, prompt(1, 2, 3) + answer + [9, 9], cacheable=True)
    c = cache.admit(SYSTEM[:10] + [0, 0, 0])  # shares 10 tokens, not a whole chunk: all 10 reused
    assert c.reuse == 10
    assert PrefixCache(1, C, 10**9, 0).aligned_match(tuple(SYSTEM), SYSTEM[:10] + [0, 0, 0]) == 8  # cut points


def test_a_partial_match_is_cut_to_the_chunk_boundary():
    cache = PrefixCache(1, C, 10**9, 0)
    a = cache.admit(prompt(1, 2, 3, 4, 5))
    cache.release(a.slot_id, prompt(1, 2, 3, 4, 5), cacheable=True)  # slot keeps 16 tokens
    b = cache.admit(SYSTEM[:10] + [0, 0, 0, 0, 0])  # shares 10 tokens: only 8 are whole chunks
    assert b.reuse == 8


def test_taking_a_slot_spills_its_prefix_to_ram_and_a_later_request_restores_it():
    cache = PrefixCache(1, C, 10**9, 0)
    a = cache.admit(prompt(1))
    cache.release(a.slot_id, prompt(1), cacheable=True)
    other = cache.admit([9] * 20)
    assert other.source == "miss"
    assert other.actions == [Spill(0, tuple(SYSTEM)), Trim(0, 0)]
    assert cache.stored_in_ram(tuple(SYSTEM), 1000) == []
    cache.release(other.slot_id, [9] * 20, cacheable=True)
    back = cache.admit(prompt(5))
    assert back.source == "ram" and back.reuse == 12
    assert back.actions == [Spill(0, tuple([9] * 20)), Trim(0, 0), Restore(0, "ram", tuple(SYSTEM)), Trim(0, 12)]


def test_ram_over_budget_demotes_to_disk_and_disk_over_budget_drops_oldest():
    cache = PrefixCache(1, C, ram_budget=1500, disk_budget=2500)
    assert cache.stored_in_ram((1,), 1000) == []
    assert cache.stored_in_ram((2,), 1000) == [Demote((1,))]
    assert cache.stored_in_ram((3,), 1000) == [Demote((2,))]
    assert list(cache.disk) == [(1,), (2,)]
    assert cache.stored_in_ram((4,), 1000) == [Demote((3,)), DropDisk((1,))]
    assert list(cache.ram) == [(4,)] and list(cache.disk) == [(2,), (3,)]


def test_no_ram_budget_sends_spills_straight_to_disk_and_no_disk_drops_them():
    to_disk = PrefixCache(1, C, ram_budget=0, disk_budget=10**9)
    assert to_disk.stored_in_ram((1,), 1000) == [Demote((1,))]
    nowhere = PrefixCache(1, C, ram_budget=0, disk_budget=0)
    assert nowhere.stored_in_ram((1,), 1000) == [DropRam((1,))]


def test_longest_match_wins_and_ties_prefer_the_faster_tier():
    cache = PrefixCache(2, C, 10**9, 10**9)
    cache.stored_in_ram(tuple(SYSTEM[:8]), 10)
    cache.found_on_disk(tuple(SYSTEM), 10)
    assert cache.admit(prompt(1)).source == "disk"  # 12 on disk beats 8 in RAM
    cache2 = PrefixCache(2, C, 10**9, 10**9)
    cache2.stored_in_ram(tuple(SYSTEM), 10)
    cache2.found_on_disk(tuple(SYSTEM), 10)
    assert cache2.admit(prompt(1)).source == "ram"


def test_a_failed_restore_is_forgotten_and_not_counted_as_a_hit():
    cache = PrefixCache(1, C, 0, 10**9)
    cache.found_on_disk(tuple(SYSTEM), 10)
    adm = cache.admit(prompt(1))
    assert adm.source == "disk"
    cache.restore_failed("disk", tuple(SYSTEM))
    assert cache.hits["disk"] == 0 and not cache.disk


def test_requests_with_several_choices_do_not_use_the_cache_and_cancelled_keep_what_they_prefilled():
    cache = PrefixCache(2, C, 10**9, 0)
    a = cache.admit(prompt(1))
    cache.release(a.slot_id, SYSTEM[:9], cacheable=True)  # cancelled after 9 prompt tokens: keeps 8
    assert cache.slots[a.slot_id].prefix == tuple(SYSTEM[:8])
    n = cache.admit(None)
    assert n.source == "miss" and n.slot_id != a.slot_id  # the empty slot, not the cached one
    assert cache.lookups == 1


def test_a_shared_system_message_is_reused_up_to_its_end():
    END = 2
    system = [1, 50, 51, 52, 53, 54, END]  # 7 tokens: shorter than a chunk, ends a message
    cache = PrefixCache(1, chunk=64, ram_budget=10**9, disk_budget=0, boundary_tokens=frozenset({END}))
    a = cache.admit(system + [1, 60, 61, END])
    cache.release(a.slot_id, system + [1, 60, 61, END], cacheable=True)
    assert cache.slots[0].prefix == tuple(system + [1, 60, 61, END])
    b = cache.admit(system + [1, 70, 71, END])
    assert (b.source, b.reuse) == ("context", len(system))


def test_the_disk_tier_budget_keeps_the_file_systems_reserve():
    from host_runtime.engine.kv_store import disk_budget, free_space_reserve

    GiB = 1 << 30
    assert free_space_reserve(100 * GiB) == 10 * GiB
    assert free_space_reserve(4 * GiB) == GiB            # at least 1 GiB
    assert free_space_reserve(1000 * GiB) == 20 * GiB    # at most 20 GiB
    assert disk_budget(4 * GiB, free_bytes=50 * GiB, total_bytes=100 * GiB) == 4 * GiB
    # A nearly full disk shrinks the tier: 12 GiB free, 10 GiB reserve -> 2 GiB.
    assert disk_budget(4 * GiB, free_bytes=12 * GiB, total_bytes=100 * GiB) == 2 * GiB
    # Entries the tier already holds count as its own room.
    assert disk_budget(4 * GiB, free_bytes=12 * GiB, total_bytes=100 * GiB, already_cached=GiB) == 3 * GiB
    assert disk_budget(4 * GiB, free_bytes=5 * GiB, total_bytes=100 * GiB) == 0


def test_entries_past_a_smaller_budget_are_not_adopted():
    cache = PrefixCache(n_slots=1, chunk=4, ram_budget=0, disk_budget=100)
    assert cache.found_on_disk((1, 2, 3, 4), 80)
    assert not cache.found_on_disk((5, 6, 7, 8), 80)


def test_a_scope_finds_only_its_own_prefixes():
    """The third hardening review: cached_tokens and the time to first token told one client whether another had
    recently sent a system prompt. Scoped (by API key, by default), a hit needs the same scope."""
    from host_runtime.engine.prefix_cache import scope_marker, split_scope

    alice, bob = scope_marker("alice"), scope_marker("bob")
    assert alice < 0 and bob < 0 and alice != bob and scope_marker("alice") == alice
    cache = PrefixCache(1, C, 10**9, 10**9)
    a = cache.admit(prompt(1), alice)
    cache.release(a.slot_id, prompt(1), cacheable=True, scope=alice)
    b = cache.admit(prompt(2), bob)               # the same system prompt, another key: a miss
    assert b.source == "miss" and b.reuse == 0
    assert b.actions[0] == Spill(0, (alice, *SYSTEM))  # alice's prefix kept, under her scope
    cache.stored_in_ram((alice, *SYSTEM), 100)
    cache.release(b.slot_id, prompt(2), cacheable=True, scope=bob)
    shared = cache.admit(prompt(3))               # the shared scope sees neither
    assert shared.source == "miss"
    cache.release(shared.slot_id, [], cacheable=False)
    again = cache.admit(prompt(4), alice)         # alice finds her own in RAM
    assert (again.source, again.reuse) == ("ram", 12)
    assert split_scope((alice, *SYSTEM)) == (alice, tuple(SYSTEM)) and split_scope(tuple(SYSTEM)) == (None, tuple(SYSTEM))


def test_a_request_waits_for_a_running_sequence_to_prefill_the_prefix_it_shares_then_copies_it():
    from host_runtime.engine.prefix_cache import Copy, Running

    cache = PrefixCache(2, C, 10**9, 0)
    leader_prompt = tuple(prompt(1, 2, 3, 4, 5))     # 17 tokens
    lead = cache.admit(list(leader_prompt))
    follower = prompt(9, 9, 9, 9, 9)                # shares the 12-token system prompt
    halfway = [Running(lead.slot_id, leader_prompt, 4)]
    assert cache.worth_waiting(follower, None, halfway), "12 shared, 4 computed: wait for the rest"
    assert not cache.worth_waiting(follower, 7, halfway), "another scope's prompt is never shared"
    done = [Running(lead.slot_id, leader_prompt, 12)]
    assert not cache.worth_waiting(follower, None, done), "all of it is there: no reason to wait"
    got = cache.admit(follower, None, done)
    assert (got.source, got.reuse) == ("running", 12) and got.slot_id != lead.slot_id
    assert got.actions[-2:] == [Copy(lead.slot_id, got.slot_id), Trim(got.slot_id, 12)]
    assert cache.hits["running"] == 1


def test_a_short_shared_prefix_or_a_disabled_cache_never_makes_a_request_wait():
    from host_runtime.engine.prefix_cache import Running

    cache = PrefixCache(2, C, 10**9, 0)
    leader_prompt = tuple(SYSTEM[:5] + [1, 2, 3, 4, 5, 6])
    lead = cache.admit(list(leader_prompt))
    # 5 shared tokens: one whole chunk, less than the two that make waiting worth it
    assert not cache.worth_waiting(SYSTEM[:5] + [7] * 8, None, [Running(lead.slot_id, leader_prompt, 0)])
    off = PrefixCache(2, C, 10**9, 0, enabled=False)
    assert not off.worth_waiting(prompt(9, 9), None, [Running(0, tuple(prompt(1, 2, 3)), 0)])


def test_what_a_tier_already_holds_is_not_waited_for():
    from host_runtime.engine.prefix_cache import Running

    cache = PrefixCache(2, C, 10**9, 0)
    a = cache.admit(prompt(1, 2))
    cache.release(a.slot_id, prompt(1, 2), cacheable=True)  # the idle slot keeps the 12-token system prompt
    leader_prompt = tuple(prompt(1, 2, 3, 4, 5))
    lead = cache.admit([7] * 14)  # shares nothing with the idle slot, so takes the other (empty) one
    assert not cache.worth_waiting(prompt(9, 9, 9), None, [Running(lead.slot_id, leader_prompt, 0)])


def test_sessions_on_one_system_prompt_each_keep_their_own_conversation():
    """Agents' sessions share a system prompt: a new session's request copies it from an idle slot that holds
    another session's conversation rather than trimming that conversation away, so each session's next turn still
    finds all of its own (seen: every later turn of four agents computed its whole conversation again)."""
    cache = PrefixCache(3, C, 10**9, 0)
    a1 = prompt(1, 1, 1, 1, 2)  # session a's first turn: 16 tokens in whole chunks
    a = cache.admit(a1)
    cache.release(a.slot_id, a1, cacheable=True)
    b = cache.admit(prompt(5, 5, 5, 5, 6))
    assert (b.source, b.reuse) == ("context", 12) and b.slot_id != a.slot_id
    assert b.actions == [Trim(b.slot_id, 0), Copy(a.slot_id, b.slot_id), Trim(b.slot_id, 12)]
    a2 = cache.admit(a1 + [3, 3, 3, 4])  # session a's next turn: its whole first turn is still in its slot
    assert (a2.source, a2.slot_id, a2.reuse) == ("context", a.slot_id, 16)
    assert a2.actions == [Trim(a.slot_id, 16)]


def test_a_slot_trimmed_for_a_shorter_match_saves_what_it_cuts_off():
    cache = PrefixCache(1, C, 10**9, 0)
    a1 = prompt(1, 1, 1, 1, 2)
    a = cache.admit(a1)
    cache.release(a.slot_id, a1, cacheable=True)
    b = cache.admit(prompt(5, 5, 5, 5, 6))  # the only slot: it is trimmed, and its conversation goes to RAM first
    assert b.actions == [Spill(0, tuple(a1[:16])), Trim(0, 12)]
    assert cache.stored_in_ram(tuple(a1[:16]), 1000) == []
    cache.release(b.slot_id, prompt(5, 5, 5, 5, 6), cacheable=True)
    back = cache.admit(a1 + [3, 3, 3, 4])
    assert (back.source, back.reuse) == ("ram", 16)


def test_with_every_other_slot_holding_more_the_least_recent_is_saved_and_takes_the_copy():
    cache = PrefixCache(2, C, 10**9, 0)
    a1, c1 = prompt(1, 1, 1, 1, 2), [9] * 9
    a = cache.admit(a1)
    c = cache.admit(c1)
    cache.release(c.slot_id, c1, cacheable=True)  # released first: the least recent
    cache.release(a.slot_id, a1, cacheable=True)
    b = cache.admit(prompt(5, 5, 5, 5, 6))
    assert b.slot_id == c.slot_id and b.reuse == 12
    assert b.actions == [Spill(c.slot_id, tuple(c1[:8])), Trim(c.slot_id, 0), Copy(a.slot_id, c.slot_id),
                         Trim(c.slot_id, 12)]


def test_while_others_run_a_new_sequence_takes_a_slot_beside_a_running_one():
    # Running slots in few runs of consecutive ids: llama.cpp computes a call over per-sequence KV streams in a
    # pass per run (step_plan._by_length). Slots 0-4 each held a conversation; 2 runs, 0 and 4 least recent.
    cache = PrefixCache(5, C, 10**9, 0)
    slots = [cache.admit([50 + i] * 9).slot_id for i in range(5)]
    assert slots == [0, 1, 2, 3, 4]
    for i in (0, 4, 1, 3):
        cache.release(i, [50 + i] * 9, cacheable=True)
    # with slot 2 running, a miss goes beside it (1, the less recent of 1 and 3), not to 0, the least recent;
    # what 1 held is saved first
    b = cache.admit([7] * 9)
    assert b.slot_id == 1 and b.actions[0] == Spill(1, tuple([51] * 8))
    # with nothing running, the least recent as before
    for i in (1, 2):
        cache.release(i, [60 + i] * 9, cacheable=True)
    assert cache.admit([8] * 9).slot_id == 0
