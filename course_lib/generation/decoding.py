r"""Generation with a KV cache: prefill once, then decode one token a call.

Without a cache, chapter 8's :func:`~course_lib.generation.sampling.generate`
runs the model on the whole sequence $x_{1:t}$ at every step $t$. With
``use_cache=True`` and a :class:`~course_lib.model.kv_cache.KVCache`,
generation has two phases:

* **prefill** (:func:`prefill`): one call on the $T_0$ prompt tokens
  computes and stores their keys and values in every layer, and its
  last-position logits give the first new token;
* **decode**: each later call feeds only the newest token; its query
  attends to all cached keys and values, and its own $k_t, v_t$ are
  appended.

A cache cannot slide: positions and keys are fixed once cached, so the
whole sequence must fit in the model's context window
``config.max_position_embeddings`` (uncached generation instead crops the
context to its last tokens, which recomputes every key at a new
position).

:func:`decode_throughput` times generation with and without the cache;
:func:`forward_cost` counts the matmul FLOPs and the bytes a forward call
moves, which shows why prefill is compute-bound and decode memory-bound.

Shape letters: B batch, T0 prompt length, T new tokens in a call, S cached
+ new positions, V vocabulary size.
"""
from __future__ import annotations

import torch

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

__all__ = ["prefill", "decode_throughput", "forward_cost"]


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
    check_ids("ids", ids)
    idx = ids.reshape(-1, ids.shape[-1]).long()              # (B, T)
    logits = model(idx, cache=cache)                         # (B, T, V)
    last = logits[:, -1, :]                                  # (B, V)
    return last.reshape(*ids.shape[:-1], -1)


def decode_throughput(model: torch.nn.Module, *, prompt_len: int,
                      new_tokens: int, use_cache: bool,
                      repeats: int = 1, batch_size: int = 1,
                      seed: int = 0) -> float:
    r"""Generated tokens per second of greedy
    :func:`~course_lib.generation.sampling.generate`.

    $$\text{throughput} = \frac{B \cdot n_{\text{new}}}
    {\text{seconds of the fastest of } r \text{ runs}}.$$

    A short generation first warms up kernels and allocations; then the
    whole generation is timed ``repeats`` times and the fastest run kept
    (other processes can only slow a run down). Greedy decoding
    ($T = 0$) keeps random sampling out of the measurement. Like all
    generation here it runs on one thread (``generate`` is wrapped
    in :func:`~course_lib._util.threads.small_ops`).

    Args:
        model: as in ``generate``.
        prompt_len: prompt tokens $T_0 \ge 1$ (random ids, seeded).
        new_tokens: tokens to generate, $\ge 1$.
        use_cache: as in ``generate``.
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
        sampling.generate(model, prompt, n, use_cache=use_cache,
                          temperature=0.0)

    best = best_time(lambda: run(new_tokens), repeats,
                     warmup=lambda: run(min(new_tokens, 4)))
    return batch_size * new_tokens / best


def forward_cost(config, *, new_tokens: int, cached_tokens: int = 0,
                 batch_size: int = 1, bytes_per_value: float = 2) -> dict:
    r"""Matmul FLOPs and bytes moved by one ``DecoderLM`` forward call.

    The call feeds $T$ new tokens per sequence that attend to
    $S = S_{\text{cached}} + T$ positions. A matmul of an $m \times k$ by
    a $k \times n$ matrix costs $2mkn$ FLOPs. Per layer, with
    $D$ = ``hidden_size``, $H$ heads, $G$ K/V heads, head width $d_h$:

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
        config: a ``DecoderLMConfig`` (fields ``vocab_size``,
            ``hidden_size``, ``num_attention_heads``,
            ``num_key_value_heads``, ``num_hidden_layers``,
            ``intermediate_size``, ``hidden_act``, ``tie_word_embeddings``).
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
    H = c.num_attention_heads
    G = c.num_key_value_heads or H
    d_h = c.hidden_size // H
    D, V, F = c.hidden_size, c.vocab_size, c.intermediate_size
    n_ffn = 3 if c.hidden_act == "silu" else 2   # matrices in the FFN
    # weights of one layer: W^Q, W^O (D x H d_h), W^K, W^V (D x G d_h), FFN
    layer_weights = 2 * D * H * d_h + 2 * D * G * d_h + n_ffn * D * F
    # F_layer = 2 T (weights) + 4 T S H d_h
    layer_flops = 2 * T * layer_weights + 4 * T * S * H * d_h
    N = c.num_hidden_layers
    flops = batch_size * (N * layer_flops + 2 * T * D * V)
    embed = V * D if c.tie_word_embeddings else 2 * V * D
    weight_bytes = (N * layer_weights + embed) * bytes_per_value
    kv_bytes = batch_size * (
        kv_cache_bytes(c, cached_tokens, bytes_per_value=bytes_per_value)
        + kv_cache_bytes(c, T, bytes_per_value=bytes_per_value))
    total = weight_bytes + kv_bytes
    return {"flops": flops, "weight_bytes": weight_bytes,
            "kv_bytes": kv_bytes, "bytes": total,
            "intensity": flops / total}
