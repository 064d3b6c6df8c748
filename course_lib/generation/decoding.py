r"""Generation with a KV cache: prefill once, then decode one token a call.

Without a cache (:func:`course_lib.generation.sampling.generate`, chapter 8), step $t$
runs the model on the whole sequence $x_{1:t}$ again. With a
:class:`~course_lib.model.kv_cache.KVCache` generation has two phases:

* **prefill**: one call on the $T_0$ prompt tokens computes and stores
  their keys and values in every layer, and its last-position logits give
  the first new token;
* **decode**: each later call feeds only the newest token; its query
  attends to all cached keys and values, and its own $k_t, v_t$ are
  appended.

Both paths draw every token with :func:`course_lib.generation.sampling.sample_next`
from the same logits (up to float rounding) in the same order, so with the
same seeded ``torch.Generator`` they produce the same tokens.

A cache cannot slide: positions and keys are fixed once cached, so the
whole sequence must fit in the model's context window ``max_len``
(uncached generation instead crops the context to its last ``max_len``
tokens, which recomputes every key at a new position).

:func:`forward_cost` counts the matmul FLOPs and the bytes a forward
call moves, which shows why prefill is compute-bound and decode
memory-bound.

Shape letters: B batch, T0 prompt length, T new tokens in a call, S cached
+ new positions, V vocabulary size.
"""
from __future__ import annotations

import torch

from .._util.threads import small_ops
from .._util.timing import best_time
from .._util.validation import (
    check_alloc,
    check_bool,
    check_ids,
    check_int,
    check_real,
)
from ..model.kv_cache import KVCache
from ..sizing.kv_cache_size import kv_cache_bytes
from . import sampling

__all__ = ["prefill", "generate", "decode_throughput", "forward_cost"]


def _check_prompt(prompt_ids) -> torch.Tensor:
    """Validate ids (T0,) or (B, T0) as chapter 8's generate does; return
    them as (B, T0) int64."""
    check_ids("prompt_ids", prompt_ids)
    return prompt_ids.reshape(-1, prompt_ids.shape[-1]).long()  # (B, T0)


def _model_config(model):
    """The model's config; it must say how many layers and positions."""
    config = getattr(model, "config", None)
    if not all(hasattr(config, a) for a in ("n_layers", "max_len")):
        raise ValueError(f"model must have a config with n_layers and "
                         f"max_len (e.g. a DecoderLM) to use a cache, got "
                         f"{type(model).__name__}")
    return config


@torch.no_grad()
def prefill(model: torch.nn.Module, ids: torch.Tensor,
            cache: KVCache) -> torch.Tensor:
    r"""Run ``ids`` through the model, appending their keys and values to
    ``cache``; return the logits of the last position.

    $$z_{T} = \mathrm{model}(x_{1:T}; \text{cache})_{T}
    \in \mathbb{R}^{V}.$$

    Used for a prompt, and for a shared prefix (e.g. a system prompt) that
    is prefilled once and :meth:`~course_lib.model.kv_cache.KVCache.fork` ed for
    each continuation.

    Args:
        model: a model that accepts ``cache=`` (e.g. ``DecoderLM``).
        ids: ``(T,)`` or ``(B, T)`` integer ids, ``T >= 1``; they continue
            whatever ``cache`` already holds.
        cache: the :class:`~course_lib.model.kv_cache.KVCache` to fill.

    Returns:
        ``(B, V)`` logits of the last position (``(V,)`` for ``(T,)`` ids).
    """
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache, got "
                        f"{type(cache).__name__}")
    idx = _check_prompt(ids)                                 # (B, T)
    logits = model(idx, cache=cache)                         # (B, T, V)
    last = logits[:, -1, :]                                  # (B, V)
    return last.reshape(*ids.shape[:-1], -1)


@torch.no_grad()
@small_ops()  # one small forward per token: see course_lib._util.threads
def generate(model: torch.nn.Module, prompt_ids: torch.Tensor,
             max_new_tokens: int, *, use_cache: bool = True,
             temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, min_p: float | None = None,
             generator: torch.Generator | None = None,
             cache: KVCache | None = None) -> torch.Tensor:
    r"""Extend a prompt token by token, with or without a KV cache.

    With ``use_cache=False`` this is :func:`course_lib.generation.sampling.generate`
    (each step recomputes the whole context). With the cache, one prefill
    call reads the prompt, then each call reads only the newest token:

    $$x_{t+1} \sim \mathrm{sample}\big(\mathrm{model}(x_t;\
    K_{1:t-1}, V_{1:t-1})\big).$$

    The cache cannot slide, so ``cache.seq_len + T0 + max_new_tokens``
    must not exceed ``model.config.max_len``. The last generated token is
    returned but never fed to the model, so afterwards the cache holds
    all positions but that one.

    Prefix reuse: pass a ``cache`` that already holds a prefix (e.g.
    prefilled with :func:`prefill`, then forked); ``prompt_ids`` are then
    the tokens that follow the prefix (at least one) and the result does
    not repeat the prefix. The cache is extended in place: pass
    ``cache.fork()`` to keep the prefix for other continuations.

    Args:
        model: a model mapping ``(B, T)`` ids to ``(B, T, V)`` logits;
            with the cache it must accept ``cache=`` and have
            ``config.n_layers`` and ``config.max_len`` (a ``DecoderLM``).
        prompt_ids: ``(T0,)`` or ``(B, T0)`` integer ids, ``T0 >= 1``.
        max_new_tokens: tokens to append, an int $\ge 0$.
        use_cache: prefill + one-token decode steps (True) or full
            recomputation at every step (False).
        temperature, top_k, top_p, min_p, generator: as in
            :func:`course_lib.generation.sampling.sample_next`.
        cache: a :class:`~course_lib.model.kv_cache.KVCache` holding a prefix
            (only with ``use_cache=True``); default a new empty one.

    Returns:
        ``(T0 + max_new_tokens,)`` or ``(B, T0 + max_new_tokens)`` ids:
        ``prompt_ids`` followed by the generated tokens.
    """
    # every argument is checked before the caller's cache is touched
    sampling.check_sampling_args(temperature, top_k, top_p, min_p)
    check_bool("use_cache", use_cache)
    if not use_cache:
        if cache is not None:
            raise ValueError("cache must be None when use_cache=False, "
                             "got a KVCache")
        return sampling.generate(model, prompt_ids, max_new_tokens,
                                 temperature=temperature, top_k=top_k,
                                 top_p=top_p, min_p=min_p,
                                 generator=generator)
    idx = _check_prompt(prompt_ids)                          # (B, T0)
    check_int("max_new_tokens", max_new_tokens, minimum=0)
    config = _model_config(model)
    if cache is None:
        cache = KVCache(config.n_layers, max_len=config.max_len)
    elif not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache or None, got "
                        f"{type(cache).__name__}")
    past = cache.seq_len
    total = past + idx.shape[1] + max_new_tokens
    if total > config.max_len:
        raise ValueError(
            f"the sequence would be {total} tokens ({past} cached + "
            f"{idx.shape[1]} prompt + max_new_tokens={max_new_tokens}), "
            f"more than max_len={config.max_len}; a KV cache cannot slide "
            f"its window (use use_cache=False to crop the context)")
    if past and cache[0].batch_size != idx.shape[0]:
        raise ValueError(f"prompt_ids has batch size {idx.shape[0]} but the "
                         f"cache holds batch size {cache[0].batch_size}")
    if max_new_tokens == 0:
        return prompt_ids.clone()
    was_training = model.training
    model.eval()                                   # no dropout
    try:
        # 1) prefill: the whole prompt in one call
        logits = prefill(model, idx, cache)                  # (B, V)
        new = []
        for step in range(max_new_tokens):
            nxt = sampling.sample_next(
                logits, temperature=temperature, top_k=top_k, top_p=top_p,
                min_p=min_p, generator=generator)            # (B,)
            new.append(nxt)
            if step + 1 < max_new_tokens:
                # 2) decode: only the newest token; its k, v get cached
                logits = model(nxt[:, None], cache=cache)[:, -1]  # (B, V)
    finally:
        model.train(was_training)
    out = torch.cat([idx, torch.stack(new, dim=1)], dim=1)   # (B, T0 + n)
    return out.reshape(*prompt_ids.shape[:-1], -1)


def decode_throughput(model: torch.nn.Module, *, prompt_len: int,
                      new_tokens: int, use_cache: bool,
                      repeats: int = 1, batch_size: int = 1,
                      seed: int = 0) -> float:
    r"""Generated tokens per second of greedy :func:`generate`.

    $$\text{throughput} = \frac{B \cdot n_{\text{new}}}
    {\text{seconds of the fastest of } r \text{ runs}}.$$

    A short generation first warms up kernels and allocations; then the
    whole generation is timed ``repeats`` times and the fastest run kept
    (other processes can only slow a run down). Greedy decoding
    ($T = 0$) keeps random sampling out of the measurement. Like all
    generation here it runs on one thread (:func:`generate` is wrapped
    in :func:`~course_lib._util.threads.small_ops`).

    Args:
        model: as in :func:`generate`.
        prompt_len: prompt tokens $T_0 \ge 1$ (random ids, seeded).
        new_tokens: tokens to generate, $\ge 1$.
        use_cache: as in :func:`generate`.
        repeats: timed runs, $\ge 1$.
        batch_size: sequences generated together, $\ge 1$.
        seed: seed of the random prompt.

    Returns:
        Tokens per second (float).
    """
    for name, value in (("prompt_len", prompt_len),
                        ("new_tokens", new_tokens), ("repeats", repeats),
                        ("batch_size", batch_size)):
        check_int(name, value, minimum=1)
    check_bool("use_cache", use_cache)
    check_alloc("batch_size * (prompt_len + new_tokens) * vocab_size",
                batch_size * (prompt_len + new_tokens)
                * model.config.vocab_size)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(vocab, (batch_size, prompt_len),
                           generator=gen)                    # (B, T0)

    def run(n: int) -> None:
        generate(model, prompt, n, use_cache=use_cache, temperature=0.0)

    best = best_time(lambda: run(new_tokens), repeats,
                     warmup=lambda: run(min(new_tokens, 4)))
    return batch_size * new_tokens / best


def forward_cost(config, *, new_tokens: int, cached_tokens: int = 0,
                 batch_size: int = 1, bytes_per_value: float = 2) -> dict:
    r"""Matmul FLOPs and bytes moved by one ``DecoderLM`` forward call.

    The call feeds $T$ new tokens per sequence that attend to
    $S = S_{\text{cached}} + T$ positions. A matmul of an $m \times k$ by
    a $k \times n$ matrix costs $2mkn$ FLOPs. Per layer, with
    $D$ = ``d_model``, $H$ heads, $G$ K/V heads, head width $d_h$:

    $$F_{\text{layer}} = 2T D (2 H d_h + 2 G d_h)
    + 4 T S H d_h + c_{\text{ffn}} T D d_{ff},$$

    projections (Q, O, K, V), scores $QK^\top$ and weights times $V$
    (the course's explicit attention computes all $T \times S$ scores,
    masked or not), and the FFN ($c = 6$ for SwiGLU's three matrices, 4
    otherwise); plus $2 T D V$ for the ``lm_head``. Norms, softmax, RoPE
    and embedding lookups are left out (few FLOPs per byte).

    Bytes: every weight is read once per call (a tied embedding counts
    once; the small norm vectors and learned position table are left
    out), the cached K, V are read and the new ones written. Activations
    are ignored; they are small next to these when $T$ is small. So

    $$\text{intensity} = \frac{B F}{\text{bytes}(\text{weights})
    + B\,\text{bytes}(\text{KV}_{S_{\text{cached}}}) +
    B\,\text{bytes}(\text{KV}_T)}$$

    grows with $B T$ in prefill and is about 1 FLOP/byte (fp16) when
    decoding one token.

    Args:
        config: a ``DecoderLMConfig`` (fields ``vocab_size``, ``d_model``,
            ``n_heads``, ``n_kv_heads``, ``n_layers``, ``d_ff``, ``ffn``,
            ``tie_embeddings``).
        new_tokens: $T \ge 1$. cached_tokens: $S_{\text{cached}} \ge 0$.
        batch_size: $B \ge 1$ sequences, each with its own cache.
        bytes_per_value: bytes per weight and per cached value (2: fp16).

    Returns:
        dict with ``flops``, ``weight_bytes``, ``kv_bytes`` (read +
        written), ``bytes`` (their sum) and ``intensity`` (FLOPs / byte).
    """
    check_int("new_tokens", new_tokens, minimum=1)
    check_int("cached_tokens", cached_tokens, minimum=0)
    check_int("batch_size", batch_size, minimum=1)
    check_real("bytes_per_value", bytes_per_value, positive=True)
    c = config
    T, S = new_tokens, cached_tokens + new_tokens
    H = c.n_heads
    G = c.n_kv_heads or H
    d_h = c.d_model // H
    D, V, F = c.d_model, c.vocab_size, c.d_ff
    n_ffn = 3 if c.ffn == "swiglu" else 2        # weight matrices in the FFN
    # weights of one layer: W^Q, W^O (D x H d_h), W^K, W^V (D x G d_h), FFN
    layer_weights = 2 * D * H * d_h + 2 * D * G * d_h + n_ffn * D * F
    # F_layer = 2 T (weights) + 4 T S H d_h
    layer_flops = 2 * T * layer_weights + 4 * T * S * H * d_h
    flops = batch_size * (c.n_layers * layer_flops + 2 * T * D * V)
    embed = V * D if c.tie_embeddings else 2 * V * D
    weight_bytes = (c.n_layers * layer_weights + embed) * bytes_per_value
    kv_bytes = batch_size * (
        kv_cache_bytes(c, cached_tokens, bytes_per_value=bytes_per_value)
        + kv_cache_bytes(c, T, bytes_per_value=bytes_per_value))
    total = weight_bytes + kv_bytes
    return {"flops": flops, "weight_bytes": weight_bytes,
            "kv_bytes": kv_bytes, "bytes": total,
            "intensity": flops / total}
