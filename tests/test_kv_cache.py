"""Tests of the paged KV cache bookkeeping (engine/kv_cache.py).

Unit tests pin down each documented behaviour; the hypothesis state machine drives random
allocate / append / mark_computed / fork / truncate / free sequences against a fake KV store and
checks after every step that the bookkeeping is consistent and that every live sequence reads back
exactly its own tokens (which catches a prefix hit or copy-on-write serving wrong data).
"""
from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.kv_cache import (
    BlockManager,
    NoFreeBlocksError,
    hash_block,
    kv_bytes_per_token,
    num_blocks_for_budget,
)

BS = 4


def snapshot(bm: BlockManager):
    """Everything observable or internal that a failed operation must leave untouched."""
    return (
        copy.deepcopy(bm.block_tables),
        dict(bm.seq_lens),
        list(bm._refcounts),
        list(bm._free),
        list(bm._evictable),
        dict(bm._hash_to_block),
        list(bm._block_hash),
        copy.deepcopy(bm._seq_hashes),
        bm.stats(),
    )


def check_consistent(bm: BlockManager) -> None:
    bm.check_invariants()
    s = bm.stats()
    assert s["free"] + s["cached"] + s["used"] == bm.num_blocks
    assert bm.num_free_blocks == s["free"] + s["cached"]
    counts = [0] * bm.num_blocks
    for table in bm.block_tables.values():
        for b in table:
            counts[b] += 1
    assert counts == [bm.refcount(b) for b in range(bm.num_blocks)]
    assert s["shared"] == sum(c > 1 for c in counts)
    for st_ in bm.block_states():
        b = st_["id"]
        assert st_["refcount"] == counts[b]
        assert (st_["state"] == "used") == (counts[b] > 0)
        if st_["state"] == "cached":
            assert st_["hashed"]
        if st_["state"] == "free":
            assert not st_["hashed"]
        assert st_["owners"] == sorted(sid for sid, t in bm.block_tables.items() if b in t)


# ---------------------------------------------------------------------------- sizing and hashing


def test_kv_bytes_per_token():
    assert kv_bytes_per_token(30, 3, 64, 4) == 46080
    assert kv_bytes_per_token(1, 1, 1, 2) == 4


def test_num_blocks_for_budget_floors_and_rejects_tiny_budget():
    per_block = 16 * 46080
    assert num_blocks_for_budget(per_block * 10 + per_block - 1, 16, 46080) == 10
    assert num_blocks_for_budget(per_block, 16, 46080) == 1
    with pytest.raises(ValueError, match="kv_memory"):
        num_blocks_for_budget(per_block - 1, 16, 46080)


def test_hash_block_is_chained_and_deterministic():
    h0 = hash_block(None, [1, 2, 3, 4])
    assert isinstance(h0, bytes) and h0 == hash_block(None, (1, 2, 3, 4))
    assert h0 != hash_block(None, [1, 2, 4, 3])
    h1 = hash_block(h0, [5, 6, 7, 8])
    # Same block content after a different prefix is a different block.
    assert h1 != hash_block(hash_block(None, [0, 2, 3, 4]), [5, 6, 7, 8])
    assert h1 != hash_block(None, [5, 6, 7, 8])
    # Token ids are not truncated to a byte.
    assert hash_block(None, [1]) != hash_block(None, [257])


# ---------------------------------------------------------------------------- prefix caching


def test_prefix_hit_after_mark_computed():
    bm = BlockManager(8, BS)
    toks = list(range(10))
    assert bm.allocate(1, toks) == 0
    bm.mark_computed(1, toks)
    assert bm.allocate(2, toks) == 8
    assert bm.block_tables[2][:2] == bm.block_tables[1][:2]
    assert bm.block_tables[2][2] != bm.block_tables[1][2]
    assert [bm.refcount(b) for b in bm.block_tables[1]] == [2, 2, 1]
    s = bm.stats()
    assert (s["prefix_query_tokens"], s["prefix_hit_tokens"], s["hit_rate"]) == (20, 8, 0.4)
    check_consistent(bm)


def test_no_hit_before_computed_and_partial_computation():
    bm = BlockManager(8, BS)
    toks = list(range(10))
    bm.allocate(1, toks)
    assert bm.lookup_prefix(toks) == []
    assert bm.allocate(2, toks) == 0
    bm.mark_computed(1, toks[:5])  # only the first block is complete
    assert bm.lookup_prefix(toks) == [bm.block_tables[1][0]]
    assert bm.allocate(3, toks) == 4
    # A different first block breaks the chain even if the second block matches.
    bm.mark_computed(1, toks)
    assert bm.lookup_prefix([99] + toks[1:]) == []
    check_consistent(bm)


def test_hit_is_capped_below_last_token():
    bm = BlockManager(8, BS)
    toks = list(range(8))  # exactly two blocks
    bm.allocate(1, toks)
    bm.mark_computed(1, toks)
    assert len(bm.lookup_prefix(toks)) == 1
    assert bm.allocate(2, toks) == 4
    assert len(bm.lookup_prefix(toks + [8])) == 2
    assert bm.lookup_prefix([]) == [] and bm.lookup_prefix(toks[:4]) == []


def test_lookup_happens_before_allocation_on_a_full_pool():
    # Pool entirely cached; the LRU block is one the request hits. Allocating first would evict it.
    bm = BlockManager(3, BS)
    a, c = [1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9]
    bm.allocate(1, a)
    bm.allocate(2, c)
    bm.mark_computed(1, a)
    bm.mark_computed(2, c)
    a_blocks, c_block = list(bm.block_tables[1]), bm.block_tables[2][0]
    bm.free(1)  # LRU order now: a[1], a[0]
    bm.free(2)  # then c
    s = bm.stats()
    assert (s["free"], s["cached"], s["used"]) == (0, 3, 0)
    req = a + [10]
    assert bm.can_allocate(req)
    assert bm.allocate(3, req) == 8
    assert bm.block_tables[3] == a_blocks + [c_block]
    assert bm.stats()["evictions"] == 1
    assert bm.lookup_prefix(c + [0]) == []  # c's block was the one evicted
    check_consistent(bm)


def test_can_allocate_counts_revived_cached_blocks():
    bm = BlockManager(3, BS)
    a = list(range(8))
    bm.allocate(1, a)
    bm.mark_computed(1, a)
    bm.free(1)
    bm.allocate(2, [50, 51, 52])  # takes the last truly free block
    assert bm.num_free_blocks == 2
    # 3 blocks: 2 hits (both cached, so they consume the 2 allocatable) + 1 new -> does not fit.
    req = a + [8]
    assert not bm.can_allocate(req)
    before = snapshot(bm)
    with pytest.raises(NoFreeBlocksError):
        bm.allocate(3, req)
    assert snapshot(bm) == before
    # Once 2's block is back, the request fits exactly; a second copy then only needs its tail
    # block, because hits on blocks that are still referenced cost no capacity.
    bm.free(2)
    assert bm.allocate(3, req) == 8 and bm.num_free_blocks == 0
    bm.truncate(3, 8)  # hand back the tail block only
    assert bm.num_free_blocks == 1 and bm.can_allocate(req)
    assert bm.allocate(4, req) == 8 and bm.num_free_blocks == 0
    check_consistent(bm)


def test_lru_eviction_order():
    bm = BlockManager(4, BS)
    prompts = {1: [1] * 4, 2: [2] * 4, 3: [3] * 4}
    for sid, p in prompts.items():
        bm.allocate(sid, p)
        bm.mark_computed(sid, p)
    blocks = {sid: bm.block_tables[sid][0] for sid in prompts}
    for sid in (2, 1, 3):
        bm.free(sid)
    # Reviving and releasing 2 makes it most recently used: order is now 1, 3, 2.
    bm.allocate(9, prompts[2] + [0])
    bm.free(9)
    assert bm.stats()["cached"] == 3
    bm.allocate(4, [7] * 12)  # 3 blocks: the truly free one, then evict 1 and 3
    assert bm.stats()["evictions"] == 2
    assert blocks[1] in bm.block_tables[4] and blocks[3] in bm.block_tables[4]
    assert bm.lookup_prefix(prompts[2] + [0]) == [blocks[2]]
    assert bm.lookup_prefix(prompts[1] + [0]) == []
    check_consistent(bm)


def test_free_puts_tail_blocks_first_in_lru():
    bm = BlockManager(3, BS)
    toks = list(range(12))
    bm.allocate(1, toks)
    bm.mark_computed(1, toks)
    t = list(bm.block_tables[1])
    bm.free(1)
    assert list(bm._evictable) == [t[2], t[1], t[0]]
    bm.allocate(2, [100])
    assert bm.block_tables[2] == [t[2]]
    assert bm.lookup_prefix(toks[:9]) == t[:2]


def test_duplicate_content_keeps_first_registration():
    bm = BlockManager(6, BS)
    toks = list(range(5))
    bm.allocate(1, toks)
    bm.allocate(2, toks)  # nothing computed yet: no sharing
    bm.mark_computed(1, toks)
    bm.mark_computed(2, toks)
    b1, b2 = bm.block_tables[1][0], bm.block_tables[2][0]
    assert bm.lookup_prefix(toks) == [b1]
    states = bm.block_states()
    assert states[b1]["hashed"] and not states[b2]["hashed"]
    bm.free(2)
    assert bm.block_states()[b2]["state"] == "free"
    bm.free(1)
    assert bm.block_states()[b1]["state"] == "cached"
    check_consistent(bm)


def test_prefix_caching_disabled():
    bm = BlockManager(6, BS, enable_prefix_caching=False)
    toks = list(range(9))
    bm.allocate(1, toks)
    bm.mark_computed(1, toks)
    assert bm.allocate(2, toks) == 0
    bm.free(1)
    assert bm.stats()["cached"] == 0


# ---------------------------------------------------------------------------- copy-on-write


def test_cow_after_fork_into_shared_partial_block():
    copies = []
    bm = BlockManager(8, BS, copy_block=lambda s, d: copies.append((s, d)))
    bm.allocate(1, list(range(6)))
    bm.fork(1, 2, 6)
    a0, a1 = bm.block_tables[1]
    assert bm.block_tables[2] == [a0, a1] and bm.refcount(a1) == 2
    new = bm.append(2, 7)
    assert len(new) == 1 and copies == [(a1, new[0])]
    assert bm.block_tables[2] == [a0, new[0]] and bm.block_tables[1] == [a0, a1]
    assert bm.refcount(a1) == 1 and bm.refcount(a0) == 2
    # The parent is now the only owner of an unhashed block: it writes in place.
    assert bm.append(1, 7) == [] and len(copies) == 1
    assert bm.stats()["cow_copies"] == 1
    check_consistent(bm)


def test_no_cow_when_new_tokens_start_a_fresh_block():
    copies = []
    bm = BlockManager(8, BS, copy_block=lambda s, d: copies.append((s, d)))
    bm.allocate(1, list(range(8)))
    bm.fork(1, 2, 8)
    new = bm.append(2, 9)
    assert copies == [] and len(new) == 1 and bm.block_tables[2][:2] == bm.block_tables[1]


def test_fork_mid_block_shares_partial_block():
    bm = BlockManager(8, BS)
    bm.allocate(1, list(range(10)))
    bm.fork(1, 2, 5)
    assert bm.block_tables[2] == bm.block_tables[1][:2] and bm.seq_lens[2] == 5
    assert bm.stats()["shared"] == 2


def test_cow_after_truncating_into_hashed_block():
    copies = []
    bm = BlockManager(8, BS, copy_block=lambda s, d: copies.append((s, d)))
    toks = list(range(8))
    bm.allocate(1, toks)
    bm.mark_computed(1, toks)
    b0, b1 = bm.block_tables[1]
    assert bm.truncate(1, 6) == []  # block 1 stays but is now partial (and still registered)
    new = bm.append(1, 7)
    assert copies == [(b1, new[0])] and bm.block_tables[1] == [b0, new[0]]
    # The registered original is untouched and still serves hits from the LRU.
    assert bm.block_states()[b1]["state"] == "cached"
    assert bm.lookup_prefix(toks + [0]) == [b0, b1]
    # Once refilled with different tokens and computed, the new block gets its own hash.
    bm.append(1, 8)
    bm.mark_computed(1, toks[:6] + [42, 43])
    assert bm.block_states()[new[0]]["hashed"]
    assert bm.lookup_prefix(toks[:6] + [42, 43, 0]) == [b0, new[0]]
    check_consistent(bm)


def test_truncate_returns_dropped_and_private_block_is_written_in_place():
    copies = []
    bm = BlockManager(8, BS, copy_block=lambda s, d: copies.append((s, d)))
    bm.allocate(1, list(range(11)))
    t = list(bm.block_tables[1])
    assert bm.truncate(1, 3) == t[1:]
    assert bm.block_tables[1] == t[:1] and bm.seq_lens[1] == 3
    new = bm.append(1, 6)  # block 0 is private and unhashed: written in place, one fresh block
    assert len(new) == 1 and bm.block_tables[1] == [t[0], new[0]]
    assert copies == []
    check_consistent(bm)


# ---------------------------------------------------------------------------- lifecycle and errors


def test_free_returns_blocks():
    bm = BlockManager(5, BS)
    bm.allocate(1, list(range(13)))
    assert bm.num_free_blocks == 1
    bm.mark_computed(1, list(range(13)))
    bm.free(1)
    s = bm.stats()
    assert (s["used"], s["cached"], s["free"]) == (0, 3, 2)
    assert bm.num_free_blocks == 5 and 1 not in bm.block_tables and 1 not in bm.seq_lens
    with pytest.raises(KeyError):
        bm.free(1)
    check_consistent(bm)


def test_no_free_blocks_leaves_state_unchanged():
    copies = []
    bm = BlockManager(3, BS, copy_block=lambda s, d: copies.append((s, d)))
    bm.allocate(1, list(range(6)))
    bm.fork(1, 2, 6)
    before = snapshot(bm)
    with pytest.raises(NoFreeBlocksError):
        bm.allocate(3, list(range(100, 109)))
    assert snapshot(bm) == before
    # Growing seq 2 to 9 needs a COW block plus a new block: 2 > 1 allocatable.
    assert not bm.can_append(2, 9)
    with pytest.raises(NoFreeBlocksError):
        bm.append(2, 9)
    assert snapshot(bm) == before and copies == []
    assert bm.can_append(2, 8)
    bm.append(2, 8)
    assert len(copies) == 1
    check_consistent(bm)


def test_argument_errors():
    bm = BlockManager(4, BS)
    bm.allocate(1, [1, 2, 3])
    with pytest.raises(ValueError):
        bm.allocate(1, [1])
    with pytest.raises(ValueError):
        bm.append(1, 2)
    with pytest.raises(ValueError):
        bm.truncate(1, 4)
    with pytest.raises(ValueError):
        bm.fork(1, 1, 1)
    with pytest.raises(ValueError):
        bm.mark_computed(1, [1, 2, 3, 4])
    with pytest.raises(KeyError):
        bm.append(7, 3)
    with pytest.raises(IndexError):
        bm.slot(1, 3)


def test_slots_and_block_states():
    bm = BlockManager(6, BS)
    bm.allocate(1, list(range(6)))
    bm.fork(1, 2, 5)
    t = bm.block_tables[1]
    assert bm.slot(1, 5) == t[1] * BS + 1
    assert bm.slots(1, 2, 6) == [t[0] * BS + 2, t[0] * BS + 3, t[1] * BS, t[1] * BS + 1]
    states = bm.block_states()
    assert len(states) == 6
    assert states[t[0]] == {"id": t[0], "refcount": 2, "state": "used", "hashed": False, "owners": [1, 2]}
    assert sum(s["state"] == "free" for s in states) == 4


def test_stats_numbers():
    bm = BlockManager(10, BS)
    p = list(range(9))
    bm.allocate(1, p)
    bm.mark_computed(1, p)
    bm.allocate(2, p)  # 2 hits + 1 new
    bm.fork(2, 3, 9)
    bm.append(3, 10)  # COW of the partial third block
    s = bm.stats()
    assert s == {
        "num_blocks": 10,
        "block_size": BS,
        "used": 5,
        "cached": 0,
        "free": 5,
        "shared": 2,
        "prefix_query_tokens": 18,
        "prefix_hit_tokens": 8,
        "hit_rate": 8 / 18,
        "evictions": 0,
        "cow_copies": 1,
    }
    for sid in (1, 2, 3):
        bm.free(sid)
    s = bm.stats()
    assert (s["used"], s["cached"], s["free"], s["shared"]) == (0, 2, 8, 0)


# ---------------------------------------------------------------------------- randomized model check

TOKENS = st.lists(st.integers(0, 2), max_size=14)  # tiny alphabet: prefixes collide often


class KVCacheMachine(RuleBasedStateMachine):
    """Random operations against a fake KV store (slot -> token) the test itself writes."""

    def __init__(self):
        super().__init__()
        self.bm: BlockManager | None = None

    @initialize(
        block_size=st.sampled_from([1, 2, 4]),
        num_blocks=st.integers(3, 16),
        caching=st.sampled_from([True, True, True, False]),
    )
    def setup(self, block_size, num_blocks, caching):
        self.bs = block_size
        self.store: dict[int, int] = {}
        self.tokens: dict[int, list[int]] = {}
        self.computed: dict[int, int] = {}
        self.ever_computed: set[tuple[int, ...]] = set()  # full-block prefixes ever marked computed
        self.history: list[list[int]] = []  # every prompt tried, to build colliding prompts from
        self.next_id = 0
        self.copies: list[tuple[int, int]] = []
        self.bm = BlockManager(num_blocks, block_size, caching, copy_block=self._copy_block)

    def _copy_block(self, src, dst):
        # The copy target belongs to the writer alone; the source is still held until after the copy.
        assert self.bm.refcount(dst) == 1 and self.bm.refcount(src) >= 1
        self.copies.append((src, dst))
        for off in range(self.bs):
            s, d = src * self.bs + off, dst * self.bs + off
            if s in self.store:
                self.store[d] = self.store[s]
            else:
                self.store.pop(d, None)

    def _write(self, sid, start, end):
        toks = self.tokens[sid]
        for p in range(start, end):
            slot = self.bm.slot(sid, p)
            block = slot // self.bs
            # Writing into a shared or registered block would corrupt someone else's KV.
            assert self.bm.refcount(block) == 1, "write into a shared block"
            assert not self.bm.block_states()[block]["hashed"], "write into an immutable hashed block"
            self.store[slot] = toks[p]

    def _pick(self, data):
        return data.draw(st.sampled_from(sorted(self.tokens)), label="seq")

    def _has_seqs(self):
        return self.bm is not None and bool(self.tokens)

    @precondition(lambda self: self.bm is not None)
    @rule(data=st.data(), toks=TOKENS)
    def allocate(self, data, toks):
        if self.history and data.draw(st.booleans(), label="reuse_prefix"):
            # Most real prefix hits come from a shared system prompt: reuse a seen prompt's head.
            base = data.draw(st.sampled_from(self.history), label="base")
            toks = base[: data.draw(st.integers(0, len(base)), label="cut")] + toks[:3]
        self.history.append(list(toks))
        bm, sid = self.bm, self.next_id
        self.next_id += 1
        hits = bm.lookup_prefix(toks)
        if not bm.can_allocate(toks):
            before = snapshot(bm)
            with pytest.raises(NoFreeBlocksError):
                bm.allocate(sid, toks)
            assert snapshot(bm) == before
            return
        cached = bm.allocate(sid, toks)
        assert cached == len(hits) * self.bs
        assert cached <= max(0, len(toks) - 1)
        assert bm.block_tables[sid][: len(hits)] == hits
        for i in range(len(hits)):
            assert tuple(toks[: (i + 1) * self.bs]) in self.ever_computed, "hit on uncomputed block"
        self.tokens[sid] = list(toks)
        self.computed[sid] = cached
        self._write(sid, cached, len(toks))
        if data.draw(st.booleans(), label="compute_now"):  # the engine's usual prefill
            self._mark(sid, len(toks))

    @precondition(_has_seqs)
    @rule(data=st.data(), extra=st.lists(st.integers(0, 2), max_size=6))
    def append(self, data, extra):
        bm, sid = self.bm, self._pick(data)
        old_len = len(self.tokens[sid])
        new_len = old_len + len(extra)
        old_table = list(bm.block_tables[sid])
        if not bm.can_append(sid, new_len):
            before = snapshot(bm)
            with pytest.raises(NoFreeBlocksError):
                bm.append(sid, new_len)
            assert snapshot(bm) == before
            return
        idx = old_len // self.bs
        expect_cow = (
            new_len > old_len
            and old_len % self.bs != 0
            and (bm.refcount(old_table[idx]) > 1 or bm.block_states()[old_table[idx]]["hashed"])
        )
        n_copies = len(self.copies)
        new = bm.append(sid, new_len)
        table = bm.block_tables[sid]
        if expect_cow:
            assert self.copies[n_copies:] == [(old_table[idx], table[idx])]
            assert new[0] == table[idx]
        else:
            assert len(self.copies) == n_copies
            assert table[: len(old_table)] == old_table
        assert set(new) <= set(table) and all(bm.refcount(b) == 1 for b in new)
        self.tokens[sid] += extra
        self._write(sid, old_len, new_len)
        if data.draw(st.booleans(), label="compute_now"):  # the engine's usual decode step
            self._mark(sid, new_len)

    @precondition(_has_seqs)
    @rule(data=st.data())
    def mark_computed(self, data):
        sid = self._pick(data)
        toks = self.tokens[sid]
        # Usually everything written gets computed (as in the engine); sometimes only part of it.
        k = data.draw(st.one_of(st.just(len(toks)), st.integers(self.computed[sid], len(toks))), label="computed")
        self._mark(sid, k)

    def _mark(self, sid, k):
        toks = self.tokens[sid]
        self.bm.mark_computed(sid, toks[:k])
        self.computed[sid] = max(self.computed[sid], k)
        for i in range(k // self.bs):
            self.ever_computed.add(tuple(toks[: (i + 1) * self.bs]))

    @precondition(_has_seqs)
    @rule(data=st.data())
    def fork(self, data):
        parent = self._pick(data)
        n = data.draw(st.integers(0, len(self.tokens[parent])), label="fork_len")
        child = self.next_id
        self.next_id += 1
        self.bm.fork(parent, child, n)
        assert self.bm.block_tables[child] == self.bm.block_tables[parent][: self.bm.blocks_needed(n)]
        self.tokens[child] = self.tokens[parent][:n]
        self.computed[child] = min(self.computed[parent], n)

    @precondition(_has_seqs)
    @rule(data=st.data())
    def truncate(self, data):
        sid = self._pick(data)
        length = len(self.tokens[sid])
        # Rewinding by a few tokens (speculative-decoding rejection) lands inside full, hashed blocks.
        n = data.draw(
            st.one_of(st.integers(max(0, length - 3), length), st.integers(0, length)), label="truncate_to"
        )
        old_table = list(self.bm.block_tables[sid])
        dropped = self.bm.truncate(sid, n)
        keep = self.bm.blocks_needed(n)
        assert dropped == old_table[keep:] and self.bm.block_tables[sid] == old_table[:keep]
        del self.tokens[sid][n:]
        self.computed[sid] = min(self.computed[sid], n)

    @precondition(_has_seqs)
    @rule(data=st.data())
    def free(self, data):
        sid = self._pick(data)
        self.bm.free(sid)
        del self.tokens[sid], self.computed[sid]

    @invariant()
    def bookkeeping_is_consistent(self):
        if self.bm is None:
            return
        check_consistent(self.bm)
        assert set(self.bm.block_tables) == set(self.tokens)

    @invariant()
    def block_states_are_never_stale(self):
        # block_states answers from its last build unless something it reports changed: after every random
        # operation the answer equals a fresh build
        if self.bm is None:
            return
        assert self.bm.block_states() == self.bm._build_states()

    @invariant()
    def every_sequence_reads_its_own_tokens(self):
        if self.bm is None:
            return
        for sid, toks in self.tokens.items():
            assert self.bm.seq_lens[sid] == len(toks)
            got = [self.store.get(s) for s in self.bm.slots(sid, 0, len(toks))]
            assert got == toks, f"seq {sid} reads {got}, expected {toks}"

    def teardown(self):
        if self.bm is None:
            return
        for sid in list(self.tokens):
            self.bm.free(sid)
        s = self.bm.stats()
        assert s["used"] == 0 and s["shared"] == 0
        assert self.bm.num_free_blocks == self.bm.num_blocks
        check_consistent(self.bm)


KVCacheMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestKVCacheMachine = KVCacheMachine.TestCase
