"""The KV block pool: ref counts, per-sequence block tables, prefix caching (plain Python).

Prefix caching: every full block gets a chain hash (parent hash + its token ids). A block
whose ref count drops to zero goes to the tail of the free queue but keeps its hash, so a
later request with the same prefix can take it back; blocks are evicted (hash dropped)
only when popped from the head of the free queue for reuse — LRU among free blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Seq

from zgtool.engine.sequence import Sequence


def chain_hash(parent: int | None, token_ids: Seq[int]) -> int:
    return hash((parent, tuple(token_ids)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.prefix_queries = 0   # prompt tokens looked up
        self.prefix_hits = 0      # prompt tokens found

    # -- accounting -------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks still holding a reusable prefix."""
        return sum(1 for b in self.free if self.block_hash[b] is not None)

    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        total = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(0, total - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= len(self.free)

    # -- prefix cache -----------------------------------------------------
    def match_prefix(self, seq: Sequence, align_tokens: int = 1) -> int:
        """Attach cached blocks for the longest cached prefix of a new sequence.

        At least one token is left to compute (its logits are needed). `align_tokens`
        rounds the hit down (deterministic mode aligns it to the prefill chunk).
        Returns the number of tokens served from the cache.
        """
        assert not seq.block_table and seq.num_computed_tokens == 0
        bs = self.block_size
        ids = seq.token_ids
        num_tokens = len(ids)
        max_full = (num_tokens - 1) // bs
        hashes: list[int] = []
        parent: int | None = None
        for i in range(0, num_tokens - bs + 1, bs):
            parent = hash((parent, tuple(ids[i:i + bs])))    # chain_hash, inlined: the per-request hot path
            hashes.append(parent)
        seq.block_hashes = hashes
        if not self.enable_prefix_caching:
            return 0
        self.prefix_queries += num_tokens
        hits: list[int] = []
        lookup = self.hash_to_block.get
        for h in hashes[:max_full]:
            b = lookup(h)
            if b is None:
                break
            hits.append(b)
        num_hit_tokens = len(hits) * bs
        num_hit_tokens -= num_hit_tokens % max(align_tokens, bs) if align_tokens > bs else 0
        hits = hits[: num_hit_tokens // bs]
        for b in hits:
            if self.ref_cnt[b] == 0:
                del self.free[b]
            self.ref_cnt[b] += 1
        seq.block_table = hits
        seq.num_computed_tokens = len(hits) * bs
        seq.num_cached_blocks = len(hits)
        seq.usage.cached_tokens = max(seq.usage.cached_tokens, len(hits) * bs)
        self.prefix_hits += len(hits) * bs
        return len(hits) * bs

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register blocks that became full (and computed) in the prefix cache."""
        bs = self.block_size
        num_full = seq.num_computed_tokens // bs
        while len(seq.block_hashes) < seq.num_tokens // bs:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            seq.block_hashes.append(chain_hash(parent, seq.token_ids[i * bs:(i + 1) * bs]))
        if not self.enable_prefix_caching:
            return
        for i in range(seq.num_cached_blocks, num_full):
            b = seq.block_table[i]
            h = seq.block_hashes[i]
            if self.block_hash[b] is None and h not in self.hash_to_block:
                self.block_hash[b] = h
                self.hash_to_block[h] = b
        seq.num_cached_blocks = max(seq.num_cached_blocks, num_full)

    # -- allocation -------------------------------------------------------
    def _pop_free(self) -> int:
        b, _ = self.free.popitem(last=False)
        h = self.block_hash[b]
        if h is not None:  # evict the cached prefix this block held
            self.block_hash[b] = None
            if self.hash_to_block.get(h) == b:
                del self.hash_to_block[h]
        self.ref_cnt[b] = 1
        return b

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Reserve blocks so num_new_tokens more tokens fit; False (nothing changed) if the pool is short."""
        need = self.blocks_needed(seq, num_new_tokens)
        if need > len(self.free):
            return False
        for _ in range(need):
            seq.block_table.append(self._pop_free())
        return True

    def free_seq(self, seq: Sequence) -> None:
        # reversed: a sequence's tail blocks are the least likely to be shared, evict them first
        for b in reversed(seq.block_table):
            self.ref_cnt[b] -= 1
            assert self.ref_cnt[b] >= 0, "block ref count went negative"
            if self.ref_cnt[b] == 0:
                self.free[b] = None
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_cached_blocks = 0

    def drop_cached(self) -> int:
        """Forget every evictable prefix (free blocks holding hashes). Returns how many."""
        n = 0
        for b in self.free:
            h = self.block_hash[b]
            if h is not None:
                self.block_hash[b] = None
                self.hash_to_block.pop(h, None)
                n += 1
        return n

    # -- defrag support ---------------------------------------------------
    def fragmentation(self) -> float:
        """1 - largest contiguous run of free block ids / free blocks (0 when nothing is free)."""
        free = sorted(self.free)
        if not free:
            return 0.0
        best = run = 1
        for a, b in zip(free, free[1:], strict=False):
            run = run + 1 if b == a + 1 else 1
            best = max(best, run)
        return 1.0 - best / len(free)

    def compaction_plan(self) -> dict[int, int]:
        """old block id -> new block id moving every used block into the lowest ids."""
        used = sorted(b for b in range(self.num_blocks) if self.ref_cnt[b] > 0)
        return {old: new for new, old in enumerate(used) if old != new}

    def apply_compaction(self, mapping: dict[int, int], seqs: list[Sequence]) -> None:
        """Rewrite bookkeeping after the runner copied KV per `mapping`."""
        if not mapping:
            return
        ref = list(self.ref_cnt)
        hsh = list(self.block_hash)
        perm = {**{n: o for o, n in mapping.items()}}
        # every id either keeps its content or receives content from perm[new]
        moved_out = set(mapping) - set(mapping.values())
        for new, old in perm.items():
            self.ref_cnt[new] = ref[old]
            self.block_hash[new] = hsh[old]
        for old in moved_out:
            self.ref_cnt[old] = 0
            self.block_hash[old] = None
        self.hash_to_block = {h: b for b, h in enumerate(self.block_hash) if h is not None}
        used = {b for b in range(self.num_blocks) if self.ref_cnt[b] > 0}
        self.free = OrderedDict((b, None) for b in range(self.num_blocks) if b not in used)
        for seq in seqs:
            seq.block_table = [mapping.get(b, b) for b in seq.block_table]
