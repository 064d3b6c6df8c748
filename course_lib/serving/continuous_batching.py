r"""Continuous batching: a scheduler that admits and retires requests
between decoding steps (Orca, Yu et al. 2022; vLLM).

A decoding step of a batch of $B$ sequences reads every weight of the
model once, whatever $B$: on a CPU or a GPU that reading, not the
arithmetic, bounds a small batch, so $B$ sequences cost little more per
step than one and tokens/s grows almost $B$-fold until the arithmetic or
the cache's memory runs out. Chapter 9's batch
(:func:`~course_lib.generation.ragged.generate_ragged`) starts all its
prompts together and runs until the longest is done: rows that finished
early idle, and a request that arrives meanwhile waits for the whole
batch. **Iteration-level scheduling** decides the batch again at every
step. A :class:`Scheduler` keeps a *waiting* queue and a *running* set;
each :meth:`~Scheduler.step`

1. **admits** waiting requests, first come first served, while fewer than
   ``max_batch`` run and the paged cache has free blocks for the prompt
   (shared prefix blocks are referenced, not recomputed), and **prefills**
   each one: its prompt's keys and values go into its blocks and the last
   position's logits give its first token;
2. if a running sequence needs a block that is not free, **preempts** the
   most recently admitted one: frees its blocks and puts it back at the
   head of the queue, to be prefilled again later with its prompt and the
   tokens it has so far (vLLM's preemption by recomputation);
3. runs one **decode** step for all running sequences: one ``model(...)``
   call with $T = 1$, each row with its own position
   $L_b$ and a key mask over the paged cache's padded gather
   (:class:`~course_lib.serving.paged_kv_cache.PagedStepCache`);
4. appends each sequence's token and **retires** those that reached
   ``max_new_tokens`` or produced ``eos_token_id``, freeing their blocks
   for the requests that wait.

Nothing changes the tokens: a row attends to its own keys only, at its
own positions, so greedy :func:`batch_generate` equals one-at-a-time
:func:`~course_lib.generation.sampling.generate` token for token. (The
batched computation rounds differently in the last bits, other matmul
shapes and a masked, padded attention, so two logits tied to within
rounding could in principle be ordered differently; the tests check exact
equality on SmolLM2 and on small random models.) With sampling, each
request draws from its own generator, one draw per token in the order
``generate`` draws, so a request seeded as a ``generate`` call gets the
same tokens.

Prefix sharing is automatic, as vLLM's automatic prefix caching: at
admission the cache looks up the prompt's full blocks by their token
prefix (:meth:`~course_lib.serving.paged_kv_cache.PagedKVCache.
add_sequence`), rather than asking the caller to declare a shared
prefix. Requests need not know what they share (a system prompt, the
earlier turns of a chat, a few-shot header), any common run of full
blocks is found, and the tokens are the same either way; the price is a
dictionary lookup per full block of each prompt. A finished request's
cached blocks stay findable on the free list until the allocator hands
them out again, least recently freed first, so a request that arrives
after the others with its system prompt have finished still skips it.

A request that can never run (its prompt and new tokens beyond the
model's context, or more blocks than the pool has) is rejected when it is
submitted; one that fits alone always runs eventually, since the oldest
running request is never preempted.

Shape letters: B running sequences, T0 prompt length, V vocabulary size.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from .._util.threads import small_ops
from .._util.validation import (
    check_bool,
    check_ids,
    check_int,
    check_prompts,
    check_type,
)
from ..generation.sampling import check_sampling_args, sample_next
from ..model.decoder_lm import DecoderLM
from ..model.mha import MultiHeadAttention
from .paged_kv_cache import PagedKVCache, PagedStepCache

__all__ = ["Request", "StepOutput", "Scheduler", "batch_generate"]


@dataclass
class Request:
    """One generation request and its state in a :class:`Scheduler`."""
    request_id: int
    prompt_ids: torch.Tensor             # (T0,) int64
    max_new_tokens: int
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)   # new tokens
    num_preemptions: int = 0

    def token_ids(self) -> torch.Tensor:
        """The prompt followed by the tokens generated so far."""
        return torch.cat([self.prompt_ids,
                          torch.tensor(self.output_ids, dtype=torch.long)])


@dataclass
class StepOutput:
    """What one :meth:`Scheduler.step` did (request ids), and the cache's
    blocks in use after it."""
    step: int
    admitted: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    decoded: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    num_used_blocks: int = 0


def _check_model(model) -> None:
    """A DecoderLM whose every attention layer is MHA/GQA (MLA caches a
    latent, which the paged cache does not hold)."""
    check_type("model", model, DecoderLM, "a DecoderLM")
    if not all(isinstance(layer.attention, MultiHeadAttention)
               for layer in model.layers):
        raise ValueError("model must use MultiHeadAttention (MHA/GQA) in "
                         "every layer: a paged cache of latents (MLA) is "
                         "out of scope")


class Scheduler:
    r"""Iteration-level scheduling over a paged KV cache.

    Submit requests with :meth:`add_request` at any time, call
    :meth:`step` until :meth:`has_unfinished` is False, read each
    request's tokens with :meth:`output`. ``waiting``, ``running`` and
    ``finished`` hold the :class:`Request` objects; ``cache`` is the
    :class:`~course_lib.serving.paged_kv_cache.PagedKVCache` (its
    ``block_tables`` show where each running sequence lives).

    Args:
        model: a :class:`~course_lib.model.decoder_lm.DecoderLM` with
            MHA/GQA attention.
        num_blocks: blocks in the cache's pool, an int >= 1.
        block_size: positions per block, an int >= 1.
        max_batch: most sequences running at once, an int >= 1.
        eos_token_id: a request ends after producing it (None: only
            ``max_new_tokens`` ends it).
        temperature, top_k, top_p, min_p: chapter 8's sampler
            (:func:`~course_lib.generation.sampling.sample_next`);
            temperature 0 (default) is greedy.
        prefix_caching: reuse cached full blocks of a common prompt prefix
            (:meth:`~course_lib.serving.paged_kv_cache.PagedKVCache.
            add_sequence`).
    """

    def __init__(self, model: DecoderLM, *, num_blocks: int,
                 block_size: int = 16, max_batch: int = 8,
                 eos_token_id: int | None = None,
                 temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, min_p: float | None = None,
                 prefix_caching: bool = True) -> None:
        _check_model(model)
        check_int("num_blocks", num_blocks, minimum=1)
        check_int("block_size", block_size, minimum=1)
        check_int("max_batch", max_batch, minimum=1)
        if eos_token_id is not None:
            check_int("eos_token_id", eos_token_id, minimum=0,
                      maximum=model.config.vocab_size - 1)
        check_sampling_args(temperature, top_k, top_p, min_p)
        check_bool("prefix_caching", prefix_caching)
        self.model, self.max_batch = model, max_batch
        self.eos_token_id, self.prefix_caching = eos_token_id, prefix_caching
        self.sampling = dict(temperature=temperature, top_k=top_k,
                             top_p=top_p, min_p=min_p)
        dtype = next(model.parameters()).dtype
        self.cache = PagedKVCache(model.config, num_blocks, block_size,
                                  dtype=dtype)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: dict[int, Request] = {}
        self.num_steps = 0
        self.peak_used_blocks = 0
        self._next_id = 0

    # ------------------------------------------------------- submission
    def add_request(self, prompt_ids: torch.Tensor, max_new_tokens: int, *,
                    generator: torch.Generator | None = None) -> int:
        """Queue a request; returns its id (0, 1, ... in submission order).

        Rejected with a ValueError if it can never run: more positions
        than the model's context, or more blocks than the pool holds.

        Args:
            prompt_ids: ``(T0,)`` integer ids, ``T0 >= 1``.
            max_new_tokens: tokens to generate at most, an int >= 1.
            generator: the request's own ``torch.Generator`` for sampling.
        """
        self._check_request(prompt_ids, max_new_tokens, generator)
        rid = self._next_id
        self._next_id += 1
        self.waiting.append(Request(rid, prompt_ids.long(), max_new_tokens,
                                    generator))
        return rid

    def _check_request(self, prompt_ids, max_new_tokens, generator) -> None:
        """The checks of :meth:`add_request`."""
        check_ids("prompt_ids", prompt_ids)
        if prompt_ids.dim() != 1:
            raise ValueError(f"prompt_ids must be 1-D (T0,), got shape "
                             f"{tuple(prompt_ids.shape)}")
        c = self.model.config
        if prompt_ids.min() < 0 or prompt_ids.max() >= c.vocab_size:
            raise ValueError(f"prompt_ids must hold ids in [0, "
                             f"{c.vocab_size})")
        check_int("max_new_tokens", max_new_tokens, minimum=1)
        if generator is not None:
            check_type("generator", generator, torch.Generator,
                       "a torch.Generator")
        T0 = prompt_ids.numel()
        if T0 + max_new_tokens > c.max_position_embeddings:
            raise ValueError(
                f"prompt_ids ({T0} tokens) + max_new_tokens="
                f"{max_new_tokens} is more than the model's context, "
                f"max_position_embeddings={c.max_position_embeddings}")
        blocks = -(-(T0 + max_new_tokens - 1) // self.cache.block_size)
        if blocks > self.cache.num_blocks:
            raise ValueError(
                f"the request needs {blocks} blocks (prompt_ids of {T0} "
                f"tokens + max_new_tokens={max_new_tokens} - 1 positions, "
                f"block_size={self.cache.block_size}) but num_blocks is "
                f"{self.cache.num_blocks}: it could never run")

    def has_unfinished(self) -> bool:
        """Whether any request waits or runs."""
        return bool(self.waiting or self.running)

    def output(self, request_id: int) -> torch.Tensor:
        """A finished request's prompt followed by its new tokens."""
        return self.finished[request_id].token_ids()

    # ------------------------------------------------------------ a step
    @small_ops()  # small forward passes: see course_lib._util.threads
    @torch.no_grad()
    def step(self) -> StepOutput:
        """Admit and prefill, preempt if out of blocks, decode one token
        for every running sequence, retire the finished ones."""
        out = StepOutput(self.num_steps)
        was_training = self.model.training
        self.model.eval()
        try:
            # 1) admit (first come, first served) and prefill
            while (self.waiting and len(self.running) < self.max_batch
                   and self._can_admit(self.waiting[0])):
                req = self.waiting.popleft()
                self._prefill(req)
                out.admitted.append(req.request_id)
                self.running.append(req)
            self._retire(out)
            if self.running:
                # 2) every running sequence needs a slot for its token
                while self.running and self._blocks_for_next_token() > \
                        self.cache.num_free_blocks:
                    self._preempt(self.running.pop(), out)
                # 3) one batched decode step
                self._decode()
                out.decoded = [r.request_id for r in self.running]
                # 4) retire
                self._retire(out)
        finally:
            self.model.train(was_training)
        out.num_used_blocks = self.cache.num_used_blocks
        self.num_steps += 1
        return out

    def _blocks_for_next_token(self) -> int:
        """New blocks the running sequences need for one more position."""
        return sum(self.cache.blocks_needed(r.request_id, 1)
                   for r in self.running)

    def _can_admit(self, req: Request) -> bool:
        """Free blocks for the request's tokens so far and its next one
        (shared prefix blocks excepted), after the running sequences'
        next tokens."""
        ids = req.token_ids()
        stored = min(ids.numel() + 1,
                     req.prompt_ids.numel() + req.max_new_tokens - 1)
        shared, revived = ((self.cache.num_cached_blocks(ids),
                            self.cache.num_cached_blocks(ids, free_only=True))
                           if self.prefix_caching else (0, 0))
        # new blocks, and the cached ones taken back off the free list
        need = -(-stored // self.cache.block_size) - shared + revived
        return need + self._blocks_for_next_token() <= \
            self.cache.num_free_blocks

    def _prefill(self, req: Request) -> None:
        """Cache the request's tokens (after any shared prefix) and draw
        its next token from the last position's logits."""
        ids = req.token_ids()                                # (L,)
        rid = req.request_id
        done = self.cache.add_sequence(
            rid, ids if self.prefix_caching else None)
        new = ids[done:]                                     # (T,)
        step = PagedStepCache(self.cache, [rid], new.numel())
        logits = self.model(new[None], step.positions, cache=step,
                            attention_mask=step.attention_mask,
                            logits_to_keep=1)                # (1, 1, V)
        if self.prefix_caching:
            self.cache.cache_blocks(rid, ids)
        self._sample(logits[:, -1], [req])
        self.peak_used_blocks = max(self.peak_used_blocks,
                                    self.cache.num_used_blocks)

    def _decode(self) -> None:
        """One model call, T = 1, for every running sequence."""
        reqs = self.running
        step = PagedStepCache(self.cache, [r.request_id for r in reqs], 1)
        ids = torch.tensor([[r.output_ids[-1]] for r in reqs])   # (B, 1)
        logits = self.model(ids, step.positions, cache=step,
                            attention_mask=step.attention_mask)  # (B, 1, V)
        self._sample(logits[:, -1], reqs)
        self.peak_used_blocks = max(self.peak_used_blocks,
                                    self.cache.num_used_blocks)

    def _sample(self, logits: torch.Tensor, reqs: list[Request]) -> None:
        """Append one token per request: argmax of each row (greedy), or
        one draw from the row's distribution with the request's own
        generator, as ``generate`` draws."""
        if self.sampling["temperature"] == 0:
            nxt = logits.argmax(dim=-1).tolist()             # (B,)
        else:
            nxt = [int(sample_next(logits[i:i + 1], **self.sampling,
                                   generator=r.generator))
                   for i, r in enumerate(reqs)]
        for r, t in zip(reqs, nxt):
            r.output_ids.append(t)

    def _retire(self, out: StepOutput) -> None:
        """Move the finished running requests out; free their blocks."""
        still = []
        for r in self.running:
            if len(r.output_ids) == r.max_new_tokens or \
                    r.output_ids[-1] == self.eos_token_id:
                self.cache.free_sequence(r.request_id)
                self.finished[r.request_id] = r
                out.finished.append(r.request_id)
            else:
                still.append(r)
        self.running = still

    def _preempt(self, req: Request, out: StepOutput) -> None:
        """Free a running request's blocks and queue it first again."""
        self.cache.free_sequence(req.request_id)
        req.num_preemptions += 1
        self.waiting.appendleft(req)
        out.preempted.append(req.request_id)


@small_ops()  # many small forward passes: see course_lib._util.threads
@torch.no_grad()
def batch_generate(model: DecoderLM, prompts: list[torch.Tensor],
                   max_new_tokens: int, *, block_size: int = 16,
                   max_batch: int = 8, num_blocks: int | None = None,
                   eos_token_id: int | None = None,
                   temperature: float = 0.0, top_k: int | None = None,
                   top_p: float | None = None, min_p: float | None = None,
                   generator: torch.Generator | list | None = None,
                   arrival: list[int] | None = None,
                   prefix_caching: bool = True) -> list[torch.Tensor]:
    r"""Generate for many prompts at once with continuous batching over a
    paged KV cache (a :class:`Scheduler` run to the end).

    Greedy by default: equal token for token to
    ``generate(model, prompt, max_new_tokens, temperature=0.0,
    use_cache=True)`` for every prompt (cut after ``eos_token_id``).

    Args:
        model: a :class:`~course_lib.model.decoder_lm.DecoderLM` with
            MHA/GQA attention.
        prompts: a non-empty list of 1-D integer tensors ``(T0_i,)``.
        max_new_tokens: tokens to generate per prompt (fewer if
            ``eos_token_id`` comes first), an int >= 1.
        block_size: positions per cache block, an int >= 1.
        max_batch: most sequences decoded together, an int >= 1.
        num_blocks: blocks in the pool; default enough for the
            ``max_batch`` largest requests at once (no preemption).
        eos_token_id: ends a request when produced (kept in its output).
        temperature, top_k, top_p, min_p: chapter 8's sampler; 0 = greedy.
        generator: one ``torch.Generator`` for all requests, or a list
            with one per prompt (each then draws as a ``generate`` call
            with that generator would).
        arrival: the step at which each request is submitted (ints >= 0;
            default all at step 0), to model requests that arrive while
            others run.
        prefix_caching: share the cached full blocks of a common prompt
            prefix.

    Returns:
        One int64 tensor per prompt, in input order: the prompt followed
        by its new tokens.
    """
    check_prompts(prompts)
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    check_int("block_size", block_size, minimum=1)
    check_int("max_batch", max_batch, minimum=1)
    n = len(prompts)
    if num_blocks is None:
        needs = sorted((-(-(p.numel() + max_new_tokens - 1) // block_size)
                        for p in prompts), reverse=True)
        num_blocks = sum(needs[:max_batch])
    if isinstance(generator, (list, tuple)):
        if len(generator) != n:
            raise ValueError(f"generator must be one torch.Generator or "
                             f"a list of {n} (one per prompt), got a list "
                             f"of {len(generator)}")
        generators = list(generator)
    else:
        generators = [generator] * n
    if arrival is None:
        arrival = [0] * n
    check_type("arrival", arrival, (list, tuple), "a list of ints")
    if len(arrival) != n:
        raise ValueError(f"arrival must have one step per prompt ({n}), "
                         f"got {len(arrival)}")
    for a in arrival:
        check_int("each of arrival", a, minimum=0)
    scheduler = Scheduler(model, num_blocks=num_blocks,
                          block_size=block_size, max_batch=max_batch,
                          eos_token_id=eos_token_id, temperature=temperature,
                          top_k=top_k, top_p=top_p, min_p=min_p,
                          prefix_caching=prefix_caching)
    for i in range(n):      # every request checked before any work
        scheduler._check_request(prompts[i], max_new_tokens, generators[i])
    order = sorted(range(n), key=arrival.__getitem__)       # stable
    ids: dict[int, int] = {}                # prompt index -> request id
    while len(ids) < n or scheduler.has_unfinished():
        while len(ids) < n and arrival[order[len(ids)]] <= \
                scheduler.num_steps:
            i = order[len(ids)]
            ids[i] = scheduler.add_request(prompts[i], max_new_tokens,
                                           generator=generators[i])
        scheduler.step()
    return [scheduler.output(ids[i]) for i in range(n)]
