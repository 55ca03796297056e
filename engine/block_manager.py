"""The KV block pool: ref counts, per-sequence block tables, prefix caching (plain Python).

Prefix caching: every full block gets a chain hash (sha256 over the parent's hash and its
token ids, as vLLM does by default). A block whose ref count drops to zero goes to the tail of
the free queue but keeps its hash, so a later request with the same prefix can take it back;
blocks are evicted (hash dropped) only when popped from the head of the free queue for reuse —
LRU among free blocks.

A hash match alone never attaches a block: its token ids must equal the request's, and it must
have been computed after the very block the request matched just before it (each cached block
records its parent's content id, a number never reused). match_prefix looks blocks up by exactly
that, (parent's content id, token bytes) in ``by_content``; a hit block's hash is then the
request's own chain hash (the same function of the same chain) and is read, not recomputed:
only the blocks past the hit are hashed. Python's builtin ``hash()`` of a tuple
is the same in every process on Debian's Python, so colliding prompts could be searched for
offline and read another request's KV (the pattern of vLLM's GHSA-rm76-4mrf-v9r8).
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections import OrderedDict
from collections.abc import Sequence as Seq
from typing import Any

from zgtool.engine.sequence import Sequence

ROOT_HASH = b""     # the parent of a sequence's first block


_sha256 = hashlib.sha256
_pack = struct.pack


def token_bytes(token_ids: Seq[int]) -> bytes:
    """Token ids as int64 bytes: what a block's hash covers and what a cached block is checked against.
    (``array("q", token_ids).tobytes()``'s bytes; struct packs a list in half its time.)"""
    return _pack(f"{len(token_ids)}q", *token_ids)


def chain_digest(parent: bytes, data: bytes) -> bytes:
    """sha256(parent hash || a block's token bytes) (the hook tests replace with a weak hash)."""
    return _sha256(parent + data).digest()


def chain_hash(parent: bytes | None, token_ids: Seq[int]) -> bytes:
    """sha256(parent hash || token ids as int64): a block's identity with everything before it."""
    return chain_digest(parent or ROOT_HASH, token_bytes(token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        # what a cached block holds, checked on every hit: its token ids (token_bytes), a content
        # id never reused, and the content id of the block before it (None for a first block)
        self.block_tokens: list[bytes | None] = [None] * num_blocks
        self.block_cid: list[int | None] = [None] * num_blocks
        self.block_parent_cid: list[int | None] = [None] * num_blocks
        self._cids = itertools.count()
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[bytes, int] = {}
        # the same cached blocks by exact content: (parent's content id, token bytes) -> block.
        # match_prefix walks a prompt's chain here, so a hit block's hash is read, not recomputed
        self.by_content: dict[tuple[int | None, bytes], int] = {}
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
        step = bs * 8   # int64 bytes per block
        end = (num_tokens // bs) * step
        # the full blocks' token bytes, converted once; a block's hash and its hit check read slices
        buf = token_bytes(ids) if end else b""
        hashes: list[bytes] = []
        hits: list[int] = []
        off = 0
        parent = ROOT_HASH
        if self.enable_prefix_caching:
            self.prefix_queries += num_tokens
            # a hit is the cached block holding exactly these tokens, computed after the very block
            # matched before it (its content id): the chain from the first block is this prompt's,
            # so the block's hash (a function of that chain) is this prompt's too and is not recomputed
            find = self.by_content.get
            block_hash = self.block_hash
            cids = self.block_cid
            parent_cid: int | None = None
            hit_end = ((num_tokens - 1) // bs) * step   # at least one token is left to compute
            while off < hit_end:
                b = find((parent_cid, buf[off:off + step]))
                if b is None:
                    break
                h = block_hash[b]
                assert h is not None
                hits.append(b)
                hashes.append(h)
                parent_cid = cids[b]
                off += step
            if hashes:
                parent = hashes[-1]
        digest = chain_digest
        for o in range(off, end, step):
            parent = digest(parent, buf[o:o + step])
            hashes.append(parent)
        seq.block_hashes = hashes
        if not self.enable_prefix_caching:
            return 0
        num_hit_tokens = len(hits) * bs
        if align_tokens > bs:
            num_hit_tokens -= num_hit_tokens % align_tokens
            hits = hits[: num_hit_tokens // bs]
        ref, free = self.ref_cnt, self.free
        for b in hits:
            n = ref[b]
            if n == 0:
                del free[b]
            ref[b] = n + 1
        seq.block_table = hits
        seq.num_computed_tokens = num_hit_tokens
        seq.num_cached_blocks = len(hits)
        usage = seq.usage
        if num_hit_tokens > usage.cached_tokens:
            usage.cached_tokens = num_hit_tokens
        self.prefix_hits += num_hit_tokens
        return num_hit_tokens

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register blocks that became full (and computed) in the prefix cache."""
        bs = self.block_size
        ids = seq.token_ids
        hashes = seq.block_hashes
        if len(hashes) < len(ids) // bs:    # a block became full: its hash (once per block, not per token)
            parent = hashes[-1] if hashes else ROOT_HASH
            for i in range(len(hashes), len(ids) // bs):
                parent = chain_digest(parent, token_bytes(ids[i * bs:(i + 1) * bs]))
                hashes.append(parent)
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // bs
        first = seq.num_cached_blocks
        if first >= num_full:
            return
        table = seq.block_table
        for i in range(first, num_full):
            b = table[i]
            h = hashes[i]
            parent_cid = self.block_cid[table[i - 1]] if i else None
            if self.block_hash[b] is None and h not in self.hash_to_block and (i == 0 or parent_cid is not None):
                self.block_hash[b] = h
                self.hash_to_block[h] = b
                self.block_tokens[b] = token_bytes(ids[i * bs:(i + 1) * bs])
                self.block_cid[b] = next(self._cids)
                self.block_parent_cid[b] = parent_cid
                self.by_content[(parent_cid, self.block_tokens[b])] = b  # type: ignore[index]
        seq.num_cached_blocks = num_full

    # -- allocation -------------------------------------------------------
    def _pop_free(self) -> int:
        b, _ = self.free.popitem(last=False)
        h = self.block_hash[b]
        if h is not None:  # evict the cached prefix this block held
            self._forget(b)
        self.ref_cnt[b] = 1
        return b

    def _forget(self, b: int) -> None:
        h = self.block_hash[b]
        if h is not None and self.hash_to_block.get(h) == b:
            del self.hash_to_block[h]
        key = (self.block_parent_cid[b], self.block_tokens[b])
        if self.by_content.get(key) == b:   # type: ignore[arg-type]
            del self.by_content[key]        # type: ignore[arg-type]
        self.block_hash[b] = self.block_tokens[b] = self.block_cid[b] = self.block_parent_cid[b] = None

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Reserve blocks so num_new_tokens more tokens fit; False (nothing changed) if the pool is short."""
        table = seq.block_table
        need = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size) - len(table)
        if need <= 0:   # a decode inside its last block: nothing to take (most steps)
            return True
        if need > len(self.free):
            return False
        for _ in range(need):
            table.append(self._pop_free())
        return True

    def free_seq(self, seq: Sequence) -> None:
        ref, free = self.ref_cnt, self.free
        # reversed: a sequence's tail blocks are the least likely to be shared, evict them first
        for b in reversed(seq.block_table):
            left = ref[b] - 1
            ref[b] = left
            if left == 0:
                free[b] = None
            assert left >= 0, "block ref count went negative"
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_cached_blocks = 0

    def drop_cached(self) -> int:
        """Forget every evictable prefix (free blocks holding hashes). Returns how many."""
        n = 0
        for b in self.free:
            if self.block_hash[b] is not None:
                self._forget(b)
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
        content: list[list[Any]] = [list(self.block_hash), list(self.block_tokens), list(self.block_cid),
                                    list(self.block_parent_cid)]
        tables: list[list[Any]] = [self.block_hash, self.block_tokens, self.block_cid, self.block_parent_cid]
        perm = {**{n: o for o, n in mapping.items()}}
        # every id either keeps its content or receives content from perm[new] (content ids
        # travel with the content: a moved block's children still find their parent)
        moved_out = set(mapping) - set(mapping.values())
        for new, old in perm.items():
            self.ref_cnt[new] = ref[old]
            for table, before in zip(tables, content, strict=True):
                table[new] = before[old]
        for old in moved_out:
            self.ref_cnt[old] = 0
            for table in tables:
                table[old] = None
        self.hash_to_block = {h: b for b, h in enumerate(self.block_hash) if h is not None}
        self.by_content = {(self.block_parent_cid[b], t): b for b, t in enumerate(self.block_tokens) if t is not None}
        used = {b for b in range(self.num_blocks) if self.ref_cnt[b] > 0}
        self.free = OrderedDict((b, None) for b in range(self.num_blocks) if b not in used)
        for seq in seqs:
            seq.block_table = [mapping.get(b, b) for b in seq.block_table]
