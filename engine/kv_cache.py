"""Bookkeeping of the paged KV cache: which physical block holds which tokens of which sequence.

The KV tensors themselves live elsewhere (the model runner owns them); this module only decides
*where* every token's K/V goes. The layout is the one vLLM / nano-vllm use:

* The cache is ``num_blocks`` physical blocks of ``block_size`` token slots each. Slot
  ``block_id * block_size + offset`` is one row of the flattened K/V cache.
* Every sequence has a *block table*: the physical blocks that hold its tokens, in logical order.
  Blocks are reference counted so several sequences can share one (prefix hits, forks).
* Prefix caching: once a full block's KV has been computed, it gets a hash chained over every token
  before it and is registered in a hash -> block table. A later request whose leading full blocks
  hash the same reuses those blocks instead of recomputing them.
* When the last reference to a hashed block goes away the block is not wiped: it becomes
  "cached" (evictable) and stays reusable until the pool runs out of truly free blocks, at which
  point the least recently used cached block is evicted.
* A block that is shared, or registered in the prefix table, is immutable. Writing new tokens into
  one goes through copy-on-write: a fresh block gets a copy of the data (via ``copy_block``) and
  replaces it in the writer's table.

Every physical block is in exactly one of three places at any time:

    referenced (refcount > 0)  |  cached (refcount 0, hashed, in the LRU)  |  free (free list)

Pure Python, no torch: the engine calls this on every scheduler step, and the teaching UI reads
``stats()`` / ``block_states()`` to draw the pool.
"""
from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable, Sequence

from .records import Record

__all__ = [
    "NoFreeBlocksError",
    "BlockCheckpoint",
    "kv_block_preserver",
    "kv_bytes_per_token",
    "num_blocks_for_budget",
    "hash_block",
    "BlockManager",
    "KVStats",
    "KVFormula",
]


@dataclass
class KVFormula(Record):
    """The terms of kv_bytes_per_token, for the KV memory chart's formula line."""

    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_elem: int


@dataclass
class KVStats(Record):
    """The KV pool after a step, as the charts show it: BlockManager.stats() (blocks, prefix hits, evictions,
    copy-on-write), their bytes, and what a naive allocator reserving max_len per sequence would waste."""

    num_blocks: int
    block_size: int
    used: int  # blocks with refcount > 0
    cached: int  # refcount 0, hashed: reusable until evicted
    free: int
    shared: int  # refcount > 1
    prefix_query_tokens: int
    prefix_hit_tokens: int
    hit_rate: float
    evictions: int
    cow_copies: int
    bytes_per_token: int
    block_bytes: int
    pool_bytes: int
    used_bytes: int
    cached_bytes: int
    free_bytes: int
    paged_waste_tokens: int  # slots held in running sequences' last blocks but not filled
    naive_reserved_tokens: int  # what reserving min(max_len, context) per running sequence would hold
    naive_waste_tokens: int
    preemptions: int
    formula: KVFormula


class NoFreeBlocksError(RuntimeError):
    """The pool cannot supply the blocks an operation needs; the manager's state is unchanged."""


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, bytes_per_elem: int) -> int:
    """Bytes of KV cache one token occupies: a K and a V vector per layer per KV head."""
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_elem


def num_blocks_for_budget(budget_bytes: int, block_size: int, bytes_per_token: int) -> int:
    """How many whole blocks fit in ``budget_bytes`` (rounded down: a partial block is unusable)."""
    if block_size < 1 or bytes_per_token < 1:
        raise ValueError("block_size and bytes_per_token must be positive")
    block_bytes = block_size * bytes_per_token
    n = int(budget_bytes) // block_bytes
    if n < 1:
        raise ValueError(
            f"kv_memory budget of {budget_bytes} bytes is smaller than one KV block "
            f"({block_bytes} bytes = {block_size} tokens x {bytes_per_token} bytes/token)"
        )
    return n


# Marks "no parent" distinctly from any real digest so the first block's hash cannot collide with
# a chained one by construction.
_ROOT_MARKER = b"\x00inferlab-kv-root"


def hash_block(parent_hash: bytes | None, token_ids: Sequence[int]) -> bytes:
    """Chained content hash of one block: identifies the block *and everything before it*.

    A cryptographic hash (not Python's ``hash()``, which is salted per process and collides easily)
    so equal digests can safely be treated as equal KV content.
    """
    h = hashlib.blake2b(digest_size=32)
    if parent_hash is None:
        h.update(_ROOT_MARKER)
    else:
        h.update(b"\x01")
        h.update(parent_hash)
    # Fixed-width little-endian encoding: unambiguous (no separator tricks) and platform independent.
    h.update(struct.pack(f"<I{len(token_ids)}q", len(token_ids), *token_ids))
    return h.digest()


class BlockCheckpoint:
    """Everything ``BlockManager.restore`` needs to put the manager back as it was at ``checkpoint()``.

    ``undo`` holds, for blocks whose KV data was worth keeping at checkpoint time but which were handed out
    again since (an evicted cached block, a preempted sequence's block), closures that write the old data back.
    """

    __slots__ = ("block_tables", "seq_lens", "refcounts", "free", "evictable", "hash_to_block", "block_hash",
                 "seq_hashes", "counters", "undo", "preserved")

    def __init__(self, bm: "BlockManager") -> None:
        # Plain copies: a pool of a few thousand blocks copies in tens of microseconds, cheaper and simpler
        # than an undo log threaded through every mutation.
        self.block_tables = {s: list(t) for s, t in bm.block_tables.items()}
        self.seq_lens = dict(bm.seq_lens)
        self.refcounts = list(bm._refcounts)
        self.free = deque(bm._free)
        self.evictable = OrderedDict(bm._evictable)
        self.hash_to_block = dict(bm._hash_to_block)
        self.block_hash = list(bm._block_hash)
        self.seq_hashes = {s: list(h) for s, h in bm._seq_hashes.items()}
        self.counters = (bm._prefix_query_tokens, bm._prefix_hit_tokens, bm._evictions, bm._cow_copies)
        self.undo: list[Callable[[], None]] = []
        self.preserved: set[int] = set()


def kv_block_preserver(kv) -> Callable[[int], Callable[[], None]]:
    """A ``preserve_block`` hook for a KV store with ``k``/``v`` tensors of [layers, slots, ...] rows and a
    ``block_size``: copies one block's rows aside and returns the closure that writes them back."""
    bs = kv.block_size

    def preserve(block: int) -> Callable[[], None]:
        rows = slice(block * bs, (block + 1) * bs)
        k, v = kv.k[:, rows].clone(), kv.v[:, rows].clone()

        def undo() -> None:
            kv.k[:, rows] = k
            kv.v[:, rows] = v

        return undo

    return preserve


class BlockManager:
    """Allocates, shares, caches and evicts KV blocks for sequences.

    ``copy_block(src, dst)`` is called whenever copy-on-write needs the KV data of physical block
    ``src`` duplicated into ``dst``; it must copy synchronously (``src`` may be reused afterwards).

    ``checkpoint()`` / ``restore()`` undo everything done in between (the engine wraps every step in them).
    The KV data needs no undo for blocks that were free at the checkpoint: whatever was written into them
    belongs to blocks the restore gives back. A block that held data worth keeping (cached, or owned by a
    sequence) and is handed out again before the restore would come back overwritten, so ``preserve_block(b)``
    (when given) is called as it is taken and returns a closure that ``restore`` runs to write the data back.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        copy_block: Callable[[int, int], None] | None = None,
        preserve_block: Callable[[int], Callable[[], None]] | None = None,
    ) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.copy_block = copy_block
        self.preserve_block = preserve_block
        self._open: BlockCheckpoint | None = None  # the checkpoint taken blocks are preserved for

        self.block_tables: dict[int, list[int]] = {}
        self.seq_lens: dict[int, int] = {}

        self._refcounts: list[int] = [0] * num_blocks
        # Unhashed, unreferenced blocks. FIFO so the pool hands out blocks in a stable order.
        self._free: deque[int] = deque(range(num_blocks))
        # Hashed, unreferenced blocks; first = least recently used = next to evict.
        self._evictable: OrderedDict[int, None] = OrderedDict()
        # Prefix table. A block has at most one registered hash and vice versa.
        self._hash_to_block: dict[bytes, int] = {}
        self._block_hash: list[bytes | None] = [None] * num_blocks
        # Per sequence: chain hashes of its leading full, computed blocks (index i = block i), so
        # mark_computed only hashes the new blocks. Not every hashed block is registered (another
        # block may already own the same hash).
        self._seq_hashes: dict[int, list[bytes]] = {}

        self._prefix_query_tokens = 0
        self._prefix_hit_tokens = 0
        self._evictions = 0
        self._cow_copies = 0
        self._states: tuple[tuple, list[dict]] | None = None  # block_states' last answer and what it was of

    # ------------------------------------------------------------------ queries

    def refcount(self, block_id: int) -> int:
        return self._refcounts[block_id]

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take right now: truly free plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _match_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], list[bytes]]:
        """Longest run of registered blocks matching token_ids' leading full blocks, with hashes."""
        if not self.enable_prefix_caching:
            return [], []
        bs = self.block_size
        # Never hit the block holding the last token: the engine must run at least one token through
        # the model to get logits for the next one.
        max_blocks = max(0, (len(token_ids) - 1) // bs)
        blocks: list[int] = []
        hashes: list[bytes] = []
        parent: bytes | None = None
        for i in range(max_blocks):
            h = hash_block(parent, token_ids[i * bs:(i + 1) * bs])
            block = self._hash_to_block.get(h)
            if block is None:
                break
            blocks.append(block)
            hashes.append(h)
            parent = h
        return blocks, hashes

    def lookup_prefix(self, token_ids: Sequence[int]) -> list[int]:
        """Physical blocks of the longest cached prefix of ``token_ids`` (no state change)."""
        return self._match_prefix(token_ids)[0]

    def _new_blocks_for(self, token_ids: Sequence[int], hits: list[int]) -> int:
        """Capacity an allocation would consume: new blocks plus hits revived from the LRU."""
        revived = sum(1 for b in hits if self._refcounts[b] == 0)
        return self.blocks_needed(len(token_ids)) - len(hits) + revived

    def can_allocate(self, token_ids: Sequence[int], read_cache: bool = True) -> bool:
        hits = self.lookup_prefix(token_ids) if read_cache else []
        return self._new_blocks_for(token_ids, hits) <= self.num_free_blocks

    def _cow_needed(self, seq_id: int, new_len: int) -> bool:
        """Would growing seq_id to new_len write into an existing, immutable block?"""
        old_len = self.seq_lens[seq_id]
        if new_len <= old_len or old_len % self.block_size == 0:
            return False  # nothing written, or new tokens start in a fresh block
        block = self.block_tables[seq_id][old_len // self.block_size]
        return self._refcounts[block] > 1 or self._block_hash[block] is not None

    def _append_cost(self, seq_id: int, new_len: int) -> int:
        table = self.block_tables[seq_id]
        return max(0, self.blocks_needed(new_len) - len(table)) + int(self._cow_needed(seq_id, new_len))

    def can_append(self, seq_id: int, new_len: int) -> bool:
        self._require_seq(seq_id)
        return self._append_cost(seq_id, new_len) <= self.num_free_blocks

    def slot(self, seq_id: int, position: int) -> int:
        self._require_seq(seq_id)
        if not 0 <= position < self.seq_lens[seq_id]:
            raise IndexError(f"position {position} outside sequence {seq_id} (len {self.seq_lens[seq_id]})")
        block = self.block_tables[seq_id][position // self.block_size]
        return block * self.block_size + position % self.block_size

    def slots(self, seq_id: int, start: int, end: int) -> list[int]:
        return [self.slot(seq_id, p) for p in range(start, end)]

    # ------------------------------------------------------------------ block pool primitives

    def _take_block(self) -> int:
        """One block with refcount 1. Free list first so cached prefixes survive as long as possible."""
        if self._free:
            block = self._free.popleft()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            del self._hash_to_block[self._block_hash[block]]
            self._block_hash[block] = None
            self._evictions += 1
        else:  # callers check capacity first; reaching this is a bookkeeping bug
            raise NoFreeBlocksError("KV cache pool exhausted")
        ck = self._open
        if ck is not None and block not in ck.preserved and (ck.refcounts[block] or ck.block_hash[block] is not None):
            # its data was live at the checkpoint and the new owner is about to overwrite it
            ck.preserved.add(block)
            if self.preserve_block is not None:
                ck.undo.append(self.preserve_block(block))
        self._refcounts[block] = 1
        return block

    def _incref(self, block: int) -> None:
        if self._refcounts[block] == 0:
            # Reviving a cached block: it is referenced again, so it must leave the LRU.
            del self._evictable[block]
        self._refcounts[block] += 1

    def _decref(self, block: int) -> None:
        self._refcounts[block] -= 1
        if self._refcounts[block] == 0:
            if self._block_hash[block] is not None:
                self._evictable[block] = None  # most recently used end
            else:
                self._free.append(block)

    def _require_seq(self, seq_id: int) -> None:
        if seq_id not in self.block_tables:
            raise KeyError(f"unknown sequence {seq_id}")

    # ------------------------------------------------------------------ sequence operations

    def allocate(self, seq_id: int, token_ids: Sequence[int], read_cache: bool = True) -> int:
        """Give seq_id a table covering len(token_ids) slots; returns the number of cached tokens.

        The prefix is looked up *before* any block is taken so that taking new blocks cannot evict
        the very cached blocks this request is about to hit. read_cache=False: no prefix hit (the sequence
        needs every position computed); its blocks are still registered for others once computed.
        """
        if seq_id in self.block_tables:
            raise ValueError(f"sequence {seq_id} already has a block table")
        hits, hashes = self._match_prefix(token_ids) if read_cache else ([], [])
        need = self._new_blocks_for(token_ids, hits)
        if need > self.num_free_blocks:
            raise NoFreeBlocksError(
                f"sequence {seq_id} needs {need} blocks, {self.num_free_blocks} allocatable"
            )
        for block in hits:
            self._incref(block)
        table = list(hits)
        for _ in range(self.blocks_needed(len(token_ids)) - len(hits)):
            table.append(self._take_block())
        self.block_tables[seq_id] = table
        self.seq_lens[seq_id] = len(token_ids)
        self._seq_hashes[seq_id] = hashes
        cached = len(hits) * self.block_size
        self._prefix_query_tokens += len(token_ids)
        self._prefix_hit_tokens += cached
        return cached

    def append(self, seq_id: int, new_len: int) -> list[int]:
        """Grow seq_id to cover new_len slots; returns the blocks newly placed in its table."""
        self._require_seq(seq_id)
        old_len = self.seq_lens[seq_id]
        if new_len < old_len:
            raise ValueError(f"append cannot shrink sequence {seq_id} ({old_len} -> {new_len}); use truncate")
        cost = self._append_cost(seq_id, new_len)
        if cost > self.num_free_blocks:
            raise NoFreeBlocksError(
                f"sequence {seq_id} needs {cost} blocks to grow to {new_len}, {self.num_free_blocks} allocatable"
            )
        table = self.block_tables[seq_id]
        new_blocks: list[int] = []
        cow_src: int | None = None
        if self._cow_needed(seq_id, new_len):
            idx = old_len // self.block_size
            cow_src = table[idx]
            dst = self._take_block()
            table[idx] = dst
            new_blocks.append(dst)
        for _ in range(self.blocks_needed(new_len) - len(table)):
            block = self._take_block()
            table.append(block)
            new_blocks.append(block)
        if cow_src is not None:
            # Copy, then drop our reference: doing it last guarantees that src could not have been
            # recycled as one of this call's new blocks before its data was copied.
            if self.copy_block is not None:
                self.copy_block(cow_src, new_blocks[0])
            self._cow_copies += 1
            self._decref(cow_src)
        self.seq_lens[seq_id] = new_len
        return new_blocks

    def mark_computed(self, seq_id: int, token_ids: Sequence[int]) -> None:
        """Record that the KV of token_ids (a prefix of seq_id) is written; register its full blocks."""
        self._require_seq(seq_id)
        if len(token_ids) > self.seq_lens[seq_id]:
            raise ValueError(
                f"{len(token_ids)} computed tokens exceed sequence {seq_id}'s {self.seq_lens[seq_id]} slots"
            )
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        hashes = self._seq_hashes[seq_id]
        table = self.block_tables[seq_id]
        parent = hashes[-1] if hashes else None
        for i in range(len(hashes), len(token_ids) // bs):
            h = hash_block(parent, token_ids[i * bs:(i + 1) * bs])
            hashes.append(h)
            parent = h
            block = table[i]
            # First writer wins: an equal hash already registered keeps serving hits, and this
            # duplicate stays a private, unregistered block (freed to the free list, not the LRU).
            if h not in self._hash_to_block and self._block_hash[block] is None:
                self._hash_to_block[h] = block
                self._block_hash[block] = h

    def fork(self, parent_id: int, child_id: int, num_tokens: int) -> None:
        """Make child_id share parent_id's blocks covering its first num_tokens tokens."""
        self._require_seq(parent_id)
        if child_id in self.block_tables:
            raise ValueError(f"sequence {child_id} already has a block table")
        if not 0 <= num_tokens <= self.seq_lens[parent_id]:
            raise ValueError(f"cannot fork {num_tokens} tokens from a sequence of {self.seq_lens[parent_id]}")
        shared = self.block_tables[parent_id][: self.blocks_needed(num_tokens)]
        for block in shared:
            self._incref(block)
        self.block_tables[child_id] = list(shared)
        self.seq_lens[child_id] = num_tokens
        self._seq_hashes[child_id] = self._seq_hashes[parent_id][: num_tokens // self.block_size]

    def truncate(self, seq_id: int, num_tokens: int) -> list[int]:
        """Rewind seq_id to num_tokens slots; returns the blocks dropped from its table."""
        self._require_seq(seq_id)
        if not 0 <= num_tokens <= self.seq_lens[seq_id]:
            raise ValueError(f"cannot truncate sequence of {self.seq_lens[seq_id]} to {num_tokens}")
        table = self.block_tables[seq_id]
        keep = self.blocks_needed(num_tokens)
        dropped = table[keep:]
        del table[keep:]
        for block in reversed(dropped):
            self._decref(block)
        self.seq_lens[seq_id] = num_tokens
        # Only blocks still full keep their hash; a now-partial one will be rewritten (via COW if
        # it is registered or shared), so its old hash no longer describes this sequence.
        del self._seq_hashes[seq_id][num_tokens // self.block_size:]
        return dropped

    def lookahead_capacity(self, seq_id: int, want: int) -> int:
        """How many slots (at most ``want``) past seq_id's length can be reserved from truly free blocks.

        Speculative decoding reserves slots for drafts that may be rejected; taking them from the LRU would
        evict cached prefixes a plain run keeps, so only the free list (and the last block's spare slots) count.
        """
        self._require_seq(seq_id)
        length, free = self.seq_lens[seq_id], len(self._free)
        k = max(0, want)
        while k > 0 and self._append_cost(seq_id, length + k) > free:
            k -= 1
        return k

    def rollback(self, seq_id: int, num_tokens: int) -> list[int]:
        """Shrink seq_id to num_tokens after a speculative round; returns the blocks released.

        Like ``truncate``, but a released block that nobody else holds goes back to the *front* of the free
        list, in the order it was taken, so the pool is exactly as if the reservation had never been made:
        block tables, refcounts and the next blocks handed out equal those of a plain run at this length.
        """
        self._require_seq(seq_id)
        if not 0 <= num_tokens <= self.seq_lens[seq_id]:
            raise ValueError(f"cannot roll sequence of {self.seq_lens[seq_id]} back to {num_tokens}")
        table = self.block_tables[seq_id]
        keep = self.blocks_needed(num_tokens)
        dropped = table[keep:]
        del table[keep:]
        for block in reversed(dropped):  # last taken goes back first, so the first taken ends up in front
            self._refcounts[block] -= 1
            if self._refcounts[block] == 0:
                if self._block_hash[block] is not None:
                    self._evictable[block] = None
                else:
                    self._free.appendleft(block)
        self.seq_lens[seq_id] = num_tokens
        del self._seq_hashes[seq_id][num_tokens // self.block_size:]
        return dropped

    def free(self, seq_id: int) -> None:
        """Release every block of seq_id and forget the sequence."""
        self._require_seq(seq_id)
        # Tail first: the tail enters the LRU earliest and is evicted first, keeping the shared
        # leading blocks (the ones most likely to be hit again) cached longest.
        for block in reversed(self.block_tables[seq_id]):
            self._decref(block)
        del self.block_tables[seq_id]
        del self.seq_lens[seq_id]
        del self._seq_hashes[seq_id]

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self) -> BlockCheckpoint:
        """Remember the whole state; blocks taken from now on are preserved (see the class docstring)."""
        self._open = BlockCheckpoint(self)
        return self._open

    def commit(self) -> None:
        """The work since the checkpoint stands: stop preserving."""
        self._open = None

    def restore(self, ck: BlockCheckpoint) -> None:
        """Put everything back as it was at ``checkpoint()``, KV data of re-used live blocks included."""
        for undo in reversed(ck.undo):
            undo()
        self.block_tables = {s: list(t) for s, t in ck.block_tables.items()}
        self.seq_lens = dict(ck.seq_lens)
        self._refcounts = list(ck.refcounts)
        self._free = deque(ck.free)
        self._evictable = OrderedDict(ck.evictable)
        self._hash_to_block = dict(ck.hash_to_block)
        self._block_hash = list(ck.block_hash)
        self._seq_hashes = {s: list(h) for s, h in ck.seq_hashes.items()}
        (self._prefix_query_tokens, self._prefix_hit_tokens, self._evictions, self._cow_copies) = ck.counters
        self._open = None

    # ------------------------------------------------------------------ introspection

    def stats(self) -> dict:
        used = sum(1 for rc in self._refcounts if rc > 0)
        queried = self._prefix_query_tokens
        return {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "used": used,
            "cached": len(self._evictable),
            "free": len(self._free),
            "shared": sum(1 for rc in self._refcounts if rc > 1),
            "prefix_query_tokens": queried,
            "prefix_hit_tokens": self._prefix_hit_tokens,
            "hit_rate": self._prefix_hit_tokens / queried if queried else 0.0,
            "evictions": self._evictions,
            "cow_copies": self._cow_copies,
        }

    def block_states(self) -> list[dict]:
        """Every block's id, refcount, state (used, cached or free), whether it is hashed, and its owners. Built
        again only when one of those changed since the last call (most decode steps change none: a block fills
        every block_size tokens; building 364 blocks' dicts took ~0.2 ms of every step at the default pool). The
        dicts are shared between calls: read them, do not modify them."""
        key = (tuple(self._refcounts), tuple(self._block_hash), tuple(self._evictable),
               tuple((seq_id, tuple(table)) for seq_id, table in self.block_tables.items()))
        if self._states is None or self._states[0] != key:
            self._states = (key, self._build_states())
        return list(self._states[1])

    def _build_states(self) -> list[dict]:
        owners: list[set[int]] = [set() for _ in range(self.num_blocks)]
        for seq_id, table in self.block_tables.items():
            for block in table:
                owners[block].add(seq_id)
        states = []
        for b in range(self.num_blocks):
            rc = self._refcounts[b]
            state = "used" if rc > 0 else ("cached" if b in self._evictable else "free")
            states.append({
                "id": b,
                "refcount": rc,
                "state": state,
                "hashed": self._block_hash[b] is not None,
                "owners": sorted(owners[b]),
            })
        return states

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (used by tests and debugging)."""
        counted = [0] * self.num_blocks
        for seq_id, table in self.block_tables.items():
            assert len(table) == self.blocks_needed(self.seq_lens[seq_id]), f"seq {seq_id} table size"
            hashes = self._seq_hashes[seq_id]
            assert len(hashes) <= self.seq_lens[seq_id] // self.block_size, f"seq {seq_id} over-hashed"
            for block, h in zip(table, hashes):
                registered = self._block_hash[block]
                assert registered is None or registered == h, f"seq {seq_id} block {block} hash mismatch"
            for block in table:
                counted[block] += 1
        assert counted == self._refcounts, "refcounts disagree with block tables"
        assert set(self.block_tables) == set(self.seq_lens) == set(self._seq_hashes)
        free, evictable = set(self._free), set(self._evictable)
        assert len(free) == len(self._free), "duplicate in free list"
        assert not (free & evictable), "block both free and cached"
        for b in range(self.num_blocks):
            places = (self._refcounts[b] > 0) + (b in free) + (b in evictable)
            assert places == 1, f"block {b} is in {places} places"
        for b in evictable:
            assert self._block_hash[b] is not None, f"cached block {b} has no hash"
        for b in free:
            assert self._block_hash[b] is None, f"free block {b} still hashed"
        assert len(self._hash_to_block) == sum(h is not None for h in self._block_hash)
        for h, b in self._hash_to_block.items():
            assert self._block_hash[b] == h, "prefix table and block hashes disagree"
