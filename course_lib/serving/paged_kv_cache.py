r"""A paged KV cache: vLLM's PagedAttention memory layout, made plain.

Chapter 9's :class:`~course_lib.model.kv_cache.KVCache` keeps each
sequence's keys and values in one contiguous tensor per layer. A server
that batches many requests cannot grow those tensors cheaply, so a
contiguous design preallocates every sequence for its longest possible
length: a batch of $B$ slots of $T_0^{\max} + n$ positions each, however
short the actual prompts and answers. Memory that is reserved but never
written is the waste that limits how many requests fit at once.

PagedAttention (Kwon et al. 2023, the vLLM paper) borrows the answer of
an operating system's virtual memory: cut the cache into **blocks** of
$b$ positions (``block_size``), keep one pool of blocks per layer, and give
each sequence a **block table** that maps its logical block $i$ (positions
$ib \dots ib + b - 1$) to a physical block anywhere in the pool. Position
$p$ of a sequence lives in the **slot**

$$\text{slot}(p) = \text{table}[\lfloor p / b \rfloor] \cdot b
+ (p \bmod b)$$

of the pool seen as one long array of slots (:meth:`PagedKVCache.
slot_mapping`). A sequence of $n$ cached positions holds
$\lceil n / b \rceil$ blocks, so it wastes less than one block, and a
block is taken only when the sequence reaches it: nothing is reserved for
tokens that may never come.

Blocks are handed out by a :class:`BlockAllocator`: a free list and a
reference count per block. Several sequences may reference one block:

* **prefix caching**: a full block's keys and values depend only on the
  tokens up to its end (causal attention), so two prompts that start with
  the same tokens (a shared system prompt) can use the same physical
  blocks. :meth:`PagedKVCache.add_sequence` finds the longest run of full
  blocks already cached for the same token prefix, as vLLM's automatic
  prefix caching does, and only the rest of the prompt is computed;
* **fork** (:meth:`PagedKVCache.fork`, as vLLM does for parallel
  sampling): a child sequence references all its parent's blocks. A full
  block never changes again, but the last, partially filled one will
  receive the next token of each: it is **copied on write**, when one of
  them first appends to it while another still references it.

A block returns to the free list when its count drops to 0. A cached
prefix block keeps its keys, values and entry in the prefix table there:
until the allocator hands it out again, a later prompt with the same
prefix takes it back from the free list (a request that arrives after
the ones that shared its system prompt have finished still finds it).
The free list is a queue: blocks are handed out oldest-freed first, so
the cached block evicted is the least recently used (vLLM's evictor).

The attention kernel of vLLM reads the blocks in place. Here
:class:`PagedStepCache` presents the paged cache to the course's
:class:`~course_lib.model.decoder_lm.DecoderLM` as an ordinary
:class:`~course_lib.model.kv_cache.KVCache`: each layer's ``update(k, v)``
writes the new rows into their slots, then **gathers** every sequence's
slots into a padded ``(B, G, S, d_k)`` tensor, each row right-aligned as
in chapter 9's left-padded batches, with a key mask that is False on the
padding. The model is unchanged; the gather is the price of using it.

Multi-head and grouped-query attention only (SmolLM2 is GQA): a layer
caches $K$ and $V$ for its $G$ key/value heads. Multi-head latent
attention (chapter 10), which caches a latent instead, is out of scope.

Shape letters: B batch (sequences in a step), T new tokens per sequence,
S cached + new slots of the padded gather, G key/value heads, d_k head
width, N physical blocks, b = ``block_size``.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from .._util.validation import (
    check_alloc,
    check_attrs,
    check_float_dtype,
    check_ids,
    check_int,
    check_lengths,
    check_real,
    check_type,
)
from ..model.kv_cache import KVCache
from ..sizing.kv_cache_size import kv_cache_bytes

__all__ = ["BlockAllocator", "PagedKVCache", "PagedStepCache",
           "PagedMemory", "paged_memory"]


def _num_blocks(n_positions: int, block_size: int) -> int:
    """Blocks that hold ``n_positions`` positions: ceil(n / b)."""
    return -(-n_positions // block_size)


class BlockAllocator:
    r"""The physical blocks of a pool: a free list and reference counts.

    :meth:`allocate` takes the block at the head of the free list with
    count 1; :meth:`fork` adds a reference to a block in use; :meth:`free`
    drops one, and a block whose count reaches 0 goes back to the end of
    the free list; :meth:`reuse` takes one particular block off the free
    list (a cached prefix block, still holding its keys and values). At
    all times

    $$\text{num\_free} + \text{num\_used} = N, \qquad
    \text{num\_used} = |\{j : \text{ref}_j > 0\}|.$$

    Args:
        num_blocks: $N$, the blocks in the pool, an int >= 1.
    """

    def __init__(self, num_blocks: int) -> None:
        check_int("num_blocks", num_blocks, minimum=1)
        self.num_blocks = num_blocks
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks

    @property
    def num_free(self) -> int:
        """Blocks on the free list."""
        return len(self.free_blocks)

    @property
    def num_used(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self.num_blocks - len(self.free_blocks)

    def allocate(self) -> int:
        """Take a free block (reference count 1); ValueError if none is
        left (the scheduler checks the free count before it asks)."""
        if not self.free_blocks:
            raise ValueError(f"out of blocks: all {self.num_blocks} are "
                             f"in use")
        block = self.free_blocks.popleft()
        self.ref_counts[block] = 1
        return block

    def fork(self, block: int) -> int:
        """One more sequence references ``block`` (in use); returns it."""
        self.ref_counts[block] += 1
        return block

    def reuse(self, block: int) -> int:
        """Take ``block``, a free one, off the free list (count 1)."""
        self.free_blocks.remove(block)
        self.ref_counts[block] = 1
        return block

    def free(self, block: int) -> bool:
        """Drop one reference to ``block``; True if that freed it."""
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_blocks.append(block)
            return True
        return False


class PagedKVCache:
    r"""The block pools of every layer, and each sequence's block table.

    Layer $l$ owns ``key_caches[l]`` and ``value_caches[l]``, each
    ``(N, b, G, d_k)``: block $j$ holds $b$ consecutive positions of some
    sequence, each with $G$ heads of width $d_k$. Seen as
    ``(N * b, G, d_k)``, the pool is one array of slots, and a
    sequence's position $p$ is slot
    $\text{table}[\lfloor p/b \rfloor]\,b + (p \bmod b)$ (vLLM's layout;
    the slot axis first makes the write of new tokens and the gather one
    indexing op each).

    Per sequence (an int id): ``block_tables[seq_id]``, its physical
    blocks in logical order, and ``seq_lens[seq_id]``, its positions
    (cached, or reserved for this step's new tokens).

    Args:
        config: the model's config (a
            :class:`~course_lib.model.decoder_lm.DecoderLMConfig`): layers,
            heads, key/value heads and width give $G$ and
            $d_k = D / H$.
        num_blocks: $N$, blocks per layer, an int >= 1.
        block_size: $b$, positions per block, an int >= 1.
        dtype: of the pools (the model's dtype).
    """

    def __init__(self, config, num_blocks: int, block_size: int = 16, *,
                 dtype: torch.dtype = torch.float32) -> None:
        check_attrs("config", config, ("num_hidden_layers",
                                       "num_attention_heads",
                                       "num_key_value_heads",
                                       "hidden_size"), "a DecoderLMConfig")
        check_int("num_blocks", num_blocks, minimum=1)
        check_int("block_size", block_size, minimum=1)
        check_float_dtype("dtype", dtype)
        self.config = config
        self.num_layers = config.num_hidden_layers
        H = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads or H     # G
        self.head_dim = config.hidden_size // H                 # d_k
        self.block_size = block_size
        shape = (num_blocks, block_size, self.num_kv_heads,
                 self.head_dim)                              # (N, b, G, d_k)
        check_alloc("the paged KV cache",
                    2 * self.num_layers * num_blocks * block_size
                    * self.num_kv_heads * self.head_dim)
        self.key_caches = [torch.zeros(shape, dtype=dtype)
                           for _ in range(self.num_layers)]
        self.value_caches = [torch.zeros(shape, dtype=dtype)
                             for _ in range(self.num_layers)]
        self.allocator = BlockAllocator(num_blocks)
        self.block_tables: dict[int, list[int]] = {}
        self.seq_lens: dict[int, int] = {}
        # prefix caching: the token prefix ending a full block -> that
        # block, and back (a freed block stays in the table until it is
        # allocated again)
        self.cached_blocks: dict[tuple[int, ...], int] = {}
        self._prefix_of: dict[int, tuple[int, ...]] = {}

    # ------------------------------------------------------ memory figures
    @property
    def num_blocks(self) -> int:
        """$N$, blocks per layer."""
        return self.allocator.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.allocator.num_used

    def block_nbytes(self) -> int:
        r"""Bytes of one block in all layers, keys and values:
        $b \cdot l \cdot 2 G d_k \cdot$ bytes per value."""
        per_value = self.key_caches[0].element_size()
        return kv_cache_bytes(self.config, self.block_size,
                              bytes_per_value=per_value)

    def nbytes(self) -> int:
        """Bytes held by the blocks in use (the pool itself is
        ``num_blocks * block_nbytes()``)."""
        return self.num_used_blocks * self.block_nbytes()

    def block_table(self, seq_id: int) -> list[int]:
        """A copy of the sequence's block table (logical -> physical)."""
        return list(self.block_tables[seq_id])

    # --------------------------------------------------------- sequences
    def add_sequence(self, seq_id: int,
                     token_ids: torch.Tensor | None = None) -> int:
        r"""Start an empty sequence; with its ``token_ids``, first
        reference the cached blocks of its longest cached prefix.

        Full block $i$ of the prompt is looked up by the prompt's first
        $(i + 1)\,b$ tokens (vLLM hashes the same chain; a tuple key is
        compared exactly, so two prefixes never share by a hash
        collision). At most $\lfloor (T_0 - 1) / b \rfloor$ blocks are
        reused, so at least the last prompt token is computed: its logits
        give the first new token.

        Returns:
            The positions already cached (a multiple of $b$): the caller
            computes ``token_ids[returned:]``.
        """
        check_int("seq_id", seq_id, minimum=0)
        if seq_id in self.block_tables:
            raise ValueError(f"seq_id {seq_id} is already in the cache")
        table: list[int] = []
        if token_ids is not None:
            check_ids("token_ids", token_ids)
            ids = tuple(token_ids.reshape(-1).tolist())
            for i in range(self.num_cached_blocks(token_ids)):
                block = self.cached_blocks[ids[:(i + 1) * self.block_size]]
                table.append(self.allocator.fork(block)
                             if self.allocator.ref_counts[block]
                             else self.allocator.reuse(block))
        self.block_tables[seq_id] = table
        self.seq_lens[seq_id] = len(table) * self.block_size
        return self.seq_lens[seq_id]

    def num_cached_blocks(self, token_ids: torch.Tensor, *,
                          free_only: bool = False) -> int:
        """How many leading full blocks of a prompt ``token_ids`` are
        cached (at most ``(T0 - 1) // block_size``): what
        :meth:`add_sequence` would reuse. ``free_only``: count only those
        no sequence references, which reusing takes off the free list."""
        ids = tuple(token_ids.reshape(-1).tolist())
        b, n, free = self.block_size, 0, 0
        while n < (len(ids) - 1) // b and \
                ids[:(n + 1) * b] in self.cached_blocks:
            free += not self.allocator.ref_counts[
                self.cached_blocks[ids[:(n + 1) * b]]]
            n += 1
        return free if free_only else n

    def cache_blocks(self, seq_id: int, token_ids: torch.Tensor) -> None:
        """Register the sequence's full blocks, whose keys and values are
        those of ``token_ids`` (its first tokens, already written), so
        that later prompts with the same prefix reference them."""
        ids = tuple(token_ids.reshape(-1).tolist())
        b = self.block_size
        for i, block in enumerate(self.block_tables[seq_id][:len(ids) // b]):
            key = ids[:(i + 1) * b]
            if key not in self.cached_blocks and block not in self._prefix_of:
                self.cached_blocks[key] = block
                self._prefix_of[block] = key

    def fork(self, parent_id: int, child_id: int) -> None:
        """A new sequence ``child_id`` that shares every block of
        ``parent_id`` (counts + 1): no copy until one of them appends to
        the last, partially filled block (:meth:`append_slots`)."""
        if child_id in self.block_tables:
            raise ValueError(f"seq_id {child_id} is already in the cache")
        self.block_tables[child_id] = [self.allocator.fork(j) for j in
                                       self.block_tables[parent_id]]
        self.seq_lens[child_id] = self.seq_lens[parent_id]

    def free_sequence(self, seq_id: int) -> None:
        """Drop the sequence's references; blocks no one references go
        back to the free list. Cached prefix blocks stay in the prefix
        table until they are allocated again (:meth:`_allocate`)."""
        for block in self.block_tables.pop(seq_id):
            self.allocator.free(block)
        del self.seq_lens[seq_id]

    def _allocate(self) -> int:
        """A block from the free list, evicted from the prefix table if
        it was a cached one (its keys and values will be overwritten)."""
        block = self.allocator.allocate()
        if block in self._prefix_of:
            del self.cached_blocks[self._prefix_of.pop(block)]
        return block

    def blocks_needed(self, seq_id: int, n: int) -> int:
        """New blocks that appending ``n`` positions to the sequence takes:
        the blocks past its table, plus one if its last block is partial
        and shared (copy on write)."""
        length, table = self.seq_lens[seq_id], self.block_tables[seq_id]
        needed = _num_blocks(length + n, self.block_size) - len(table)
        if n and length % self.block_size and \
                self.allocator.ref_counts[table[-1]] > 1:
            needed += 1
        return needed

    def append_slots(self, seq_id: int, n: int) -> torch.Tensor:
        r"""Reserve the slots of the sequence's next ``n`` positions.

        Takes a new block each time a position starts one
        ($p \bmod b = 0$); if the last block is partially filled and
        shared, first copies it to a new block of this sequence's own
        (copy on write), so the other sequences keep theirs unchanged.

        Returns:
            ``(n,)`` int64 slots of positions ``len .. len + n - 1``.
        """
        table, start = self.block_tables[seq_id], self.seq_lens[seq_id]
        b = self.block_size
        if n and start % b and self.allocator.ref_counts[table[-1]] > 1:
            old, new = table[-1], self._allocate()
            for pool in self.key_caches + self.value_caches:
                pool[new] = pool[old]                        # (b, G, d_k)
            self.allocator.free(old)
            table[-1] = new
        while len(table) < _num_blocks(start + n, b):
            table.append(self._allocate())
        self.seq_lens[seq_id] = start + n
        p = torch.arange(start, start + n)                   # (n,)
        blocks = torch.tensor(table, dtype=torch.long)[p // b]
        return blocks * b + p % b                            # (n,)

    def slot_mapping(self, seq_id: int) -> torch.Tensor:
        r"""``(L,)`` slots of the sequence's positions $p = 0 \dots L-1$:
        $\text{table}[\lfloor p/b \rfloor]\,b + (p \bmod b)$."""
        p = torch.arange(self.seq_lens[seq_id])              # (L,)
        table = torch.tensor(self.block_tables[seq_id], dtype=torch.long)
        return table[p // self.block_size] * self.block_size \
            + p % self.block_size                            # (L,)

    def padded_slots(self, seq_ids: list[int]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""The slots of a batch of sequences, right-aligned and padded
        to the longest, $S = \max_b L_b$.

        Row $b$'s position $p$ sits in column $S - L_b + p$, so every
        row's newest position is in the last column (chapter 9's left
        padding); pad columns point at slot 0, which the mask hides.

        Returns:
            ``(slots, key_mask)``: ``(B, S)`` int64 and ``(B, S)`` bool,
            True on real positions.
        """
        b = self.block_size
        lens = torch.tensor([self.seq_lens[s] for s in seq_ids])  # (B,)
        S = int(lens.max())
        width = max(len(self.block_tables[s]) for s in seq_ids)
        tables = torch.zeros(len(seq_ids), width, dtype=torch.long)
        for row, s in enumerate(seq_ids):
            tables[row, :len(self.block_tables[s])] = torch.tensor(
                self.block_tables[s], dtype=torch.long)     # (B, width)
        p = torch.arange(S) - (S - lens)[:, None]            # (B, S)
        key_mask = p >= 0                                    # (B, S)
        p = p.clamp(min=0)
        slots = tables.gather(1, p // b) * b + p % b         # (B, S)
        return slots.masked_fill(~key_mask, 0), key_mask

    def gather(self, seq_ids: list[int], layer: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One layer's cached keys and values of a batch of sequences,
        padded as :meth:`padded_slots` lays them out.

        Returns:
            ``(k, v, key_mask)``: ``(B, G, S, d_k)`` twice and ``(B, S)``
            bool.
        """
        slots, key_mask = self.padded_slots(seq_ids)         # (B, S)
        k = _gather(self.key_caches[layer], slots)           # (B, G, S, d_k)
        v = _gather(self.value_caches[layer], slots)         # (B, G, S, d_k)
        return k, v, key_mask


def _gather(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows ``slots`` (B, S) of a pool (N, b, G, d_k) seen as slots:
    (B, G, S, d_k)."""
    N, b, G, d_k = pool.shape
    B, S = slots.shape
    rows = pool.view(N * b, G, d_k).index_select(0, slots.reshape(-1))
    return rows.view(B, S, G, d_k).transpose(1, 2)           # (B, G, S, d_k)


class _PagedLayer:
    """One layer of a :class:`PagedStepCache`: what an attention layer
    calls ``cache.update(k, v)`` on."""

    def __init__(self, step: "PagedStepCache", layer: int) -> None:
        self.step, self.layer = step, layer

    def __len__(self) -> int:
        return self.step.seq_len

    def update(self, k: torch.Tensor,
               v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new ``(B, G, T, d_k)`` keys and values into their
        slots; return every sequence's keys and values, ``(B, G, S,
        d_k)``, gathered from the pool (new ones included)."""
        cache, step = self.step.cache, self.step
        B, G, T, d_k = k.shape
        new = step.slot_mapping.reshape(-1)                  # (B*T,)
        out = []
        for pool, x in ((cache.key_caches[self.layer], k),
                        (cache.value_caches[self.layer], v)):
            flat = pool.view(-1, G, d_k)                     # (N*b, G, d_k)
            # x (B, G, T, d_k) -> one row per new token (B*T, G, d_k)
            flat.index_copy_(0, new, x.transpose(1, 2).reshape(B * T, G,
                                                                d_k))
            out.append(_gather(pool, step.slots))            # (B, G, S, d_k)
        return out[0], out[1]


class PagedStepCache(KVCache):
    r"""The paged cache as one forward pass of a batch sees it: a
    :class:`~course_lib.model.kv_cache.KVCache` whose layers write into
    the pool and read from it.

    Built for sequences ``seq_ids`` that each receive ``num_new`` tokens
    ($T$) in this pass: it reserves their slots
    (:meth:`PagedKVCache.append_slots`), so a sequence of $L_b$ cached
    positions now has $L_b + T$, and lays the batch out as
    :meth:`PagedKVCache.padded_slots` does ($S = \max_b L_b + T$).
    Pass its ``positions`` and ``attention_mask`` with it::

        step = PagedStepCache(paged, seq_ids, 1)
        logits = model(ids, step.positions, cache=step,
                       attention_mask=step.attention_mask)

    Row $b$'s new tokens get positions $L_b, \dots, L_b + T - 1$ (per-row
    positions: RoPE rotates them, or the learned table adds them, as if
    the sequence ran alone), and the key mask hides the padding; the
    model's causal mask covers the new tokens, which sit in the last $T$
    columns of every row.

    Args:
        cache: the :class:`PagedKVCache`.
        seq_ids: the sequences of the batch, a non-empty list of ids in
            the cache.
        num_new: $T$, new tokens per sequence in this pass, an int >= 1.

    Attributes:
        positions: ``(B, T)`` int64; attention_mask: ``(B, S)`` bool;
        slots: ``(B, S)`` the gather's slots; slot_mapping: ``(B, T)``
        the new tokens' slots.
    """

    def __init__(self, cache: PagedKVCache, seq_ids: list[int],
                 num_new: int) -> None:
        check_type("cache", cache, PagedKVCache, "a PagedKVCache")
        check_type("seq_ids", seq_ids, (list, tuple), "a list of ints")
        if not seq_ids or any(s not in cache.block_tables for s in seq_ids):
            raise ValueError(f"seq_ids must be a non-empty list of "
                             f"sequences in the cache, got {seq_ids!r:.60}")
        check_int("num_new", num_new, minimum=1)
        super().__init__(cache.num_layers)
        self.cache = cache
        past = torch.tensor([cache.seq_lens[s] for s in seq_ids])  # (B,)
        for s in seq_ids:
            cache.append_slots(s, num_new)
        self.positions = past[:, None] + torch.arange(num_new)   # (B, T)
        self.slots, self.attention_mask = cache.padded_slots(
            list(seq_ids))                                       # (B, S)
        self.slot_mapping = self.slots[:, -num_new:]             # (B, T)
        self._past = self.slots.shape[1] - num_new               # S - T
        self.layers = [_PagedLayer(self, i)
                       for i in range(cache.num_layers)]

    @property
    def seq_len(self) -> int:
        """$S - T$: the padded columns before this pass's tokens (what
        the model reads as the cached length)."""
        return self._past


@dataclass(frozen=True)
class PagedMemory:
    """KV-cache bytes of a mix of requests (:func:`paged_memory`)."""
    paged_bytes: int          # blocks held by the paged cache
    paged_blocks: int
    contiguous_bytes: int     # max_batch x (longest prompt + n) positions
    token_bytes: int          # the positions the requests cache, unpadded
    shared_blocks: int        # prefix blocks counted once instead of once
    #                           per request


def paged_memory(config, prompt_lens, max_new_tokens: int, *,
                 block_size: int = 16, max_batch: int | None = None,
                 shared_prefix_len: int = 0,
                 bytes_per_value: float = 4) -> PagedMemory:
    r"""KV-cache bytes a mix of requests needs, paged against contiguous.

    A request with a prompt of $T_0^{(i)}$ tokens that generates $n$
    caches $L_i = T_0^{(i)} + n - 1$ positions (the last token is never
    fed back). With $\beta$ bytes per position
    (:func:`~course_lib.sizing.kv_cache_size.kv_cache_bytes`):

    * contiguous, preallocated for the longest request in each of
      ``max_batch`` slots: $B_{\max} (\max_i T_0^{(i)} + n)\,\beta$;
    * paged, all requests at their longest: $\sum_i \lceil L_i / b
      \rceil$ blocks of $b\beta$ bytes, less a block per request for each
      full block of a prefix they share, which is held once: request $i$
      shares $s_i = \lfloor \min(P, T_0^{(i)} - 1) / b \rfloor$ blocks of
      a prefix of $P$ tokens (:meth:`PagedKVCache.add_sequence`), and the
      total is $\sum_i (\lceil L_i / b \rceil - s_i) + \max_i s_i$;
    * tokens: $\sum_i L_i\,\beta$, what an allocator with no padding and
      no sharing would hold.

    Args:
        config: the model's config (:func:`~course_lib.sizing.
            kv_cache_size.kv_values_per_token`).
        prompt_lens: the prompts' lengths, ints >= 1.
        max_new_tokens: $n$, an int >= 1.
        block_size: $b$.
        max_batch: $B_{\max}$, default the number of requests.
        shared_prefix_len: $P$, tokens every prompt starts with.
        bytes_per_value: 4 for float32 (the course's models), 2 for
            fp16/bf16.

    Returns:
        A :class:`PagedMemory`.
    """
    lens = check_lengths(prompt_lens, minimum=1)
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    check_int("block_size", block_size, minimum=1)
    if max_batch is None:
        max_batch = len(lens)
    check_int("max_batch", max_batch, minimum=1)
    check_int("shared_prefix_len", shared_prefix_len, minimum=0)
    check_real("bytes_per_value", bytes_per_value, positive=True)
    positions = [t + max_new_tokens - 1 for t in lens]          # L_i
    shared = [min(shared_prefix_len, t - 1) // block_size for t in lens]
    blocks = sum(_num_blocks(L, block_size) - s
                 for L, s in zip(positions, shared)) + max(shared)
    per_position = kv_cache_bytes(config, 1,
                                  bytes_per_value=bytes_per_value)
    return PagedMemory(
        paged_bytes=int(blocks * block_size * per_position),
        paged_blocks=blocks,
        contiguous_bytes=int(max_batch * (max(lens) + max_new_tokens)
                             * per_position),
        token_bytes=int(sum(positions) * per_position),
        shared_blocks=max(shared))
