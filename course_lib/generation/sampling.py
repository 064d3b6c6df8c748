r"""From logits to tokens: sampling, generation and scoring.

A language model ends in a linear layer, the ``lm_head``, that maps the last
hidden state $h_t \in \mathbb{R}^{D}$ to one score per vocabulary entry,
the **logits** $z = W_{\text{vocab}} h_t \in \mathbb{R}^{V}$. The softmax
$p_i = e^{z_i} / \sum_j e^{z_j}$ turns them into a distribution over the
next token. This module decides how a token is drawn from it:

* the logit filters :func:`apply_temperature` ($z / \tau$, temperature
  $\tau$),
  :func:`top_k_filter`, :func:`top_p_filter` (nucleus) and
  :func:`min_p_filter`;
* :func:`sampling_distribution` composes them in a fixed order and
  returns the distribution that is actually sampled;
* :func:`sample_next` draws one token per row (greedy argmax at
  $\tau = 0$);
* :func:`generate` runs a model autoregressively, recomputing the whole
  prefix at every step or (chapter 9) with a KV cache;
* :func:`sequence_log_prob` scores continuations under a model;
* beam search (:mod:`course_lib.generation.beam_search`) searches for
  likely sequences instead of sampling.

Shape letters: B batch, T sequence length, V vocabulary size,
``...`` any leading dimensions.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .._util.threads import small_ops
from .._util.validation import (check_bool, check_callable, check_ids,
                                check_int, check_real)

if TYPE_CHECKING:  # annotations only: the cache is chapter 9's module
    from ..model.kv_cache import KVCache

# (logits (B, V), ids so far (B, T)) -> new logits (B, V): the penalties of
# course_lib.generation.penalties, bound to their strength, have this shape.
LogitsProcessor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

__all__ = ["check_sampling_args", "sampling_distribution", "sample_next",
           "generate", "sequence_log_prob", "apply_temperature",
           "top_k_filter", "top_p_filter", "min_p_filter", "context_window",
           "model_logits"]


def check_sampling_args(temperature, top_k, top_p, min_p=None) -> None:
    """Validate a sampler's settings before any work is done with them
    (``top_k``, ``top_p`` and ``min_p`` may be None: off).
    """
    _check_temperature(temperature)
    if top_k is not None:
        _check_top_k(top_k)
    if top_p is not None:
        _check_top_p(top_p)
    if min_p is not None:
        _check_min_p(min_p)


def sampling_distribution(logits: torch.Tensor, *,
                          temperature: float = 1.0,
                          top_k: int | None = None,
                          top_p: float | None = None,
                          min_p: float | None = None) -> torch.Tensor:
    r"""The distribution :func:`sample_next` draws from.

    The steps are applied in this order, the order of Hugging Face's
    default logits warpers (temperature, top-k, top-p, min-p):

    1. temperature, $z \mapsto z / \tau$;
    2. top-k on the tempered logits;
    3. top-p on what survives, with the probabilities renormalised over
       the survivors;
    4. min-p on what survives: keep $z_i \ge \max_j z_j + \log p_{\min}$;
    5. softmax.

    Order matters for top-p and min-p. Temperature and top-k commute
    (dividing by $\tau > 0$ keeps the ranking). Top-p measures probability
    mass, which temperature and top-k both change. Min-p compares each
    logit with the largest, a test that renormalisation does not change,
    so it commutes with top-k, but not with temperature: on tempered
    logits the test reads $z_i \ge \max_j z_j + \tau \log p_{\min}$, more
    permissive as $\tau$ grows. Other implementations choose other orders:
    llama.cpp's default sampler chain, for instance, applies top-k, top-p
    and min-p first and temperature last.

    Args:
        logits: ``(..., V)`` floating tensor.
        temperature: $\tau \ge 0$; $\tau = 0$ gives a one-hot on the
            argmax.
        top_k: ``None`` (off) or an int $\ge 1$.
        top_p: ``None`` (off) or a number in $(0, 1]$.
        min_p: ``None`` (off) or a number in $[0, 1]$.

    Returns:
        ``(..., V)`` probabilities summing to 1 over the last axis.
    """
    _check_logits(logits)
    check_sampling_args(temperature, top_k, top_p, min_p)
    # 1) temperature
    z = apply_temperature(logits, temperature)
    # 2) top-k, 3) top-p, 4) min-p
    if top_k is not None:
        z = top_k_filter(z, top_k)
    if top_p is not None:
        z = top_p_filter(z, top_p)
    if min_p is not None:
        z = min_p_filter(z, min_p)
    # 5) softmax over the survivors
    return F.softmax(z, dim=-1)


def sample_next(logits: torch.Tensor, *, temperature: float = 1.0,
                top_k: int | None = None, top_p: float | None = None,
                min_p: float | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    r"""Draw the next token from logits (greedy argmax when $\tau = 0$).

    With $\tau > 0$ one token is drawn per row from
    :func:`sampling_distribution` (temperature, then top-k, top-p and
    min-p, then softmax) with ``torch.multinomial``. With $\tau = 0$ the
    result is ``logits.argmax(-1)`` (the lowest index among tied maxima);
    the filters cannot change it, since all of them keep the largest
    logit, and no random number is consumed.

    Args:
        logits: ``(V,)`` or ``(B, V)`` floating tensor.
        temperature: $\tau \ge 0$.
        top_k: ``None`` or an int $\ge 1$.
        top_p: ``None`` or a number in $(0, 1]$.
        min_p: ``None`` or a number in $[0, 1]$.
        generator: optional ``torch.Generator`` for reproducible draws.

    Returns:
        int64 token ids, shape ``()`` for ``(V,)`` logits, ``(B,)`` for
        ``(B, V)``.
    """
    _check_logits(logits)
    if logits.dim() > 2:
        raise ValueError(f"logits must have shape (V,) or (B, V), got "
                         f"{tuple(logits.shape)}")
    probs = sampling_distribution(logits, temperature=temperature,
                                  top_k=top_k, top_p=top_p, min_p=min_p)
    if temperature == 0:
        return logits.argmax(dim=-1)                          # (B,) or ()
    rows = probs.reshape(-1, probs.shape[-1])                 # (B, V)
    ids = torch.multinomial(rows, 1, generator=generator)     # (B, 1)
    return ids.reshape(logits.shape[:-1])                     # (B,) or ()


def context_window(model, max_len: int | None) -> int | None:
    """How many of the last tokens a decoding loop feeds the model:
    ``max_len`` if given, else the model's
    ``config.max_position_embeddings``, else all (``None``)."""
    if max_len is None:
        max_len = getattr(getattr(model, "config", None),
                          "max_position_embeddings", None)
    if max_len is not None:
        check_int("max_len", max_len, minimum=1)
    return max_len


def model_logits(model, context: torch.Tensor) -> torch.Tensor:
    """``model(context)``, checked to be next-token logits (B, T, V) for
    the context (B, T): the one model call of every decoding step."""
    logits = model(context)                                  # (B, T, V)
    if logits.dim() != 3 or logits.shape[:2] != context.shape:
        raise ValueError(
            f"model must return logits of shape (B, T, V) = "
            f"({context.shape[0]}, {context.shape[1]}, V), got "
            f"{tuple(logits.shape)}")
    return logits


@torch.no_grad()
@small_ops()  # one small forward per token: see course_lib._util.threads
def generate(model: torch.nn.Module, prompt_ids: torch.Tensor,
             max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None,
             min_p: float | None = None,
             generator: torch.Generator | None = None,
             max_len: int | None = None, use_cache: bool = False,
             cache: KVCache | None = None,
             logits_processor: LogitsProcessor | None = None
             ) -> torch.Tensor:
    r"""Extend a prompt token by token with :func:`sample_next`.

    The logits of the last position give the next token, which is
    appended to the sequence:

    $$x_{t+1} \sim \mathrm{sample}\big(\mathrm{model}(x_{\le t})_t\big).$$

    Without a cache (``use_cache=False``, chapter 8) every step runs the
    model on the whole sequence so far, cropped to its last ``max_len``
    tokens (the longest context it has positions for), so step $t$
    recomputes attention over all earlier tokens. With a KV cache
    (``use_cache=True``, chapter 9) a first call, the *prefill*, reads
    the prompt and stores every layer's keys and values; each later call
    feeds only the newest token, whose query attends to the cached keys.
    The two paths draw every token from the same logits (up to float
    rounding) in the same order. A cache cannot slide, so
    ``cache.seq_len + T0 + max_new_tokens`` must fit in the model's
    ``config.max_position_embeddings``; the last token is returned but
    never fed, so afterwards the cache holds every position but that one.

    Prefix reuse: pass a ``cache`` that already holds a prefix (e.g. a
    system prompt, prefilled with
    :func:`~course_lib.generation.decoding.prefill` and forked);
    ``prompt_ids`` are then the tokens after the prefix and the result
    does not repeat it. The cache is extended in place.

    The model is put in eval mode (no dropout) for the call and restored
    afterwards.

    Args:
        model: maps ``(B, T)`` token ids to ``(B, T, V)`` logits; with
            the cache it must accept ``cache=`` and ``logits_to_keep=``
            and have a ``config`` (a
            :class:`~course_lib.model.decoder_lm.DecoderLM`).
        prompt_ids: ``(T0,)`` or ``(B, T0)`` integer ids, ``T0 >= 1``.
        max_new_tokens: number of tokens to append, an int $\ge 0$.
        temperature, top_k, top_p, min_p, generator: as in
            :func:`sample_next`.
        max_len: context window without a cache; default the model's
            ``config.max_position_embeddings`` if it has one, else no
            cropping.
        use_cache: prefill, then one token per call (True), or the whole
            context at every step (False).
        cache: a :class:`~course_lib.model.kv_cache.KVCache` holding a
            prefix (``use_cache=True`` only); default a new empty one.
        logits_processor: None, or a function ``(logits (B, V), ids
            (B, T)) -> logits (B, V)`` applied to each step's logits,
            with the sequence so far (prompt included), before
            temperature and the filters: one of the penalties of
            :mod:`~course_lib.generation.penalties`.

    Returns:
        ``(T0 + max_new_tokens,)`` or ``(B, T0 + max_new_tokens)`` ids:
        the prompt followed by the generated tokens.
    """
    check_ids("prompt_ids", prompt_ids)
    check_int("max_new_tokens", max_new_tokens, minimum=0)
    check_sampling_args(temperature, top_k, top_p, min_p)
    check_bool("use_cache", use_cache)
    if logits_processor is not None:
        check_callable("logits_processor", logits_processor)
    idx = prompt_ids.reshape(-1, prompt_ids.shape[-1]).long()  # (B, T0)
    if use_cache:
        cache = _check_cache(model, idx, max_new_tokens, max_len, cache)
    elif cache is not None:
        raise ValueError("cache must be None when use_cache=False, got a "
                         f"{type(cache).__name__}")
    window = None if use_cache else context_window(model, max_len)
    if max_new_tokens == 0:
        return idx.reshape(*prompt_ids.shape[:-1], -1).clone()
    # eval mode (no dropout) for the call, restored afterwards
    was_training = getattr(model, "training", None)
    if isinstance(model, torch.nn.Module):
        model.eval()
    try:
        if use_cache:       # prefill: the whole prompt, keys/values cached;
            # only the last position's logits are used
            logits = model(idx, cache=cache, logits_to_keep=1)  # (B, 1, V)
        else:
            logits = model_logits(model, idx if window is None
                                  else idx[:, -window:])     # (B, T', V)
        for step in range(max_new_tokens):
            z = logits[:, -1, :]                             # (B, V)
            if logits_processor is not None:
                z = logits_processor(z, idx)                 # (B, V)
            nxt = sample_next(z, temperature=temperature,
                              top_k=top_k, top_p=top_p, min_p=min_p,
                              generator=generator)           # (B,)
            idx = torch.cat([idx, nxt[:, None]], dim=1)      # (B, T + 1)
            if step + 1 == max_new_tokens:
                break
            if use_cache:   # decode: only the newest token is fed
                logits = model(nxt[:, None], cache=cache)    # (B, 1, V)
            else:           # the whole (cropped) sequence again
                logits = model_logits(model, idx if window is None
                                      else idx[:, -window:])
    finally:
        if isinstance(model, torch.nn.Module):
            model.train(was_training)
    return idx.reshape(*prompt_ids.shape[:-1], -1)


def _check_cache(model, idx: torch.Tensor, max_new_tokens: int,
                 max_len, cache):
    """The cache generate(use_cache=True) extends: ``cache`` or a new one
    for the model's layers, checked to hold the whole sequence."""
    from ..model.kv_cache import KVCache     # chapter 9's module
    if max_len is not None:
        raise ValueError("max_len must be None when use_cache=True: a KV "
                         "cache cannot crop its window")
    config = getattr(model, "config", None)
    if not all(hasattr(config, a) for a in ("num_hidden_layers",
                                            "max_position_embeddings")):
        raise ValueError(
            f"model must have a config with num_hidden_layers and "
            f"max_position_embeddings (e.g. a DecoderLM) to use a cache, "
            f"got {type(model).__name__}")
    if cache is None:
        cache = KVCache(config.num_hidden_layers,
                        max_len=config.max_position_embeddings)
    elif not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache or None, got "
                        f"{type(cache).__name__}")
    past, (B, T0) = cache.seq_len, idx.shape
    total = past + T0 + max_new_tokens
    if total > config.max_position_embeddings:
        raise ValueError(
            f"the sequence would be {total} tokens ({past} cached + {T0} "
            f"prompt + max_new_tokens={max_new_tokens}), more than "
            f"max_position_embeddings={config.max_position_embeddings}; a "
            f"KV cache cannot slide its window (use use_cache=False to "
            f"crop the context)")
    if past and cache[0].batch_size != B:
        raise ValueError(f"prompt_ids has batch size {B} but the cache "
                         f"holds batch size {cache[0].batch_size}")
    return cache


@torch.no_grad()
def sequence_log_prob(model: torch.nn.Module, ids: torch.Tensor, *,
                      prompt_len: int = 1) -> torch.Tensor:
    r"""Log-probability a model assigns to a continuation, in nats.

    $$\log p(x_{T_0}, \dots, x_{T-1} \mid x_{<T_0}) =
    \sum_{t = T_0}^{T-1} \log \mathrm{softmax}(\mathrm{model}(x)_{t-1})
    _{x_t},$$

    with $T_0$ = ``prompt_len``: the prompt is conditioned on, not scored.
    One forward pass scores every position, thanks to the causal mask.
    The whole sequence must fit in the model's context window.

    Args:
        model: maps ``(B, T)`` ids to ``(B, T, V)`` logits.
        ids: ``(T,)`` or ``(B, T)`` integer ids.
        prompt_len: $T_0$, an int with $1 \le T_0 \le T$.

    Returns:
        ``()`` or ``(B,)`` float tensor of summed log-probabilities.
    """
    check_ids("ids", ids)
    T = ids.shape[-1]
    if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) \
            or not 1 <= prompt_len <= T:
        raise ValueError(f"prompt_len must be an int in [1, {T}], got "
                         f"{prompt_len!r}")
    x = ids.reshape(-1, T).long()                             # (B, T)
    was_training = getattr(model, "training", None)
    if isinstance(model, torch.nn.Module):
        model.eval()
    try:
        logp = F.log_softmax(model(x).double(), dim=-1)      # (B, T, V)
    finally:
        if isinstance(model, torch.nn.Module):
            model.train(was_training)
    # position t - 1 predicts token t
    picked = logp[:, :-1, :].gather(-1, x[:, 1:, None])[..., 0]  # (B, T-1)
    total = picked[:, prompt_len - 1:].sum(dim=-1)           # (B,)
    return total.reshape(ids.shape[:-1])


def _check_logits(logits) -> None:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got "
                        f"{type(logits).__name__}")
    if not logits.dtype.is_floating_point:
        raise TypeError(f"logits must be a floating tensor, got dtype "
                        f"{logits.dtype}")
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must have shape (..., V) with V >= 1, got "
                         f"{tuple(logits.shape)}")
    if torch.isnan(logits).any():
        raise ValueError("logits must not contain NaN")
    # +inf has no probability (inf / inf): an overflowed model output
    if (logits == float("inf")).any():
        raise ValueError("logits must not contain +inf (an overflow, e.g. "
                         "a float16 model: run it in float32)")
    # a row of -inf has no distribution: softmax would return NaN
    if (logits == float("-inf")).all(dim=-1).any():
        raise ValueError("every row of logits needs at least one entry "
                         "above -inf")


def _check_temperature(temperature) -> float:
    check_real("temperature", temperature, minimum=0)
    return float(temperature)


def _check_top_k(top_k) -> int:
    check_int("top_k", top_k, minimum=1)
    return top_k


def _check_top_p(top_p) -> float:
    check_real("top_p", top_p, positive=True, maximum=1)
    return float(top_p)


def _check_min_p(min_p) -> float:
    check_real("min_p", min_p, minimum=0, maximum=1)
    return float(min_p)


def apply_temperature(logits: torch.Tensor,
                      temperature: float) -> torch.Tensor:
    r"""Divide the logits by a temperature $\tau$: $z \mapsto z / \tau$.

    $$p_i(\tau) = \frac{e^{z_i / \tau}}{\sum_j e^{z_j / \tau}}.$$

    $\tau < 1$ sharpens the distribution, $\tau > 1$ flattens it, and the
    order of the logits never changes. As $\tau \to \infty$ every
    $z_i / \tau \to 0$ and $p$ tends to the uniform distribution over the
    tokens with finite logits. As $\tau \to 0$ it tends to a one-hot vector
    on the largest logit (uniform over the maxima if several tie).
    $\tau = 0$ is accepted and
    returns that limit with ties broken towards the lowest index, like
    ``torch.argmax``: the first maximum keeps logit 0 and all others get
    $-\infty$, so sampling at $\tau = 0$ is exactly greedy decoding.

    A small $\tau$ can overflow $z / \tau$ (float16 logits of 12 at
    $\tau = 10^{-4}$ exceed 65504): the division is done in float32 at least,
    and where it would still overflow, on $z - \max_j z_j$ instead, which
    changes no probability (softmax ignores a shift of every logit).

    Args:
        logits: ``(..., V)`` floating tensor.
        temperature: a finite number $\tau \ge 0$.

    Returns:
        ``(..., V)`` tensor of tempered logits (float32 for half-precision
        input).
    """
    _check_logits(logits)
    tau = _check_temperature(temperature)
    if tau == 0:
        first_max = logits.argmax(dim=-1, keepdim=True)       # (..., 1)
        out = torch.full_like(logits, float("-inf"))
        return out.scatter(-1, first_max, 0.0)                # (..., V)
    z = logits.float() if logits.element_size() < 4 else logits
    out = z / tau                                             # z / tau
    if (torch.isinf(out) & torch.isfinite(z)).any():          # overflowed
        out = (z - z.amax(dim=-1, keepdim=True)) / tau
    return out


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    r"""Keep the $k$ largest logits of each row; set the rest to $-\infty$.

    A token survives if fewer than $k$ tokens have a strictly larger logit,
    that is if $z_i \ge z_{(k)}$, the $k$-th largest value. Tokens tied with
    $z_{(k)}$ are all kept, so a row may keep more than $k$ tokens; this
    makes the result independent of the order of the vocabulary, and is
    what Hugging Face's ``TopKLogitsWarper`` does. $k \ge V$ keeps every
    token.

    Args:
        logits: ``(..., V)`` floating tensor.
        k: an int $\ge 1$.

    Returns:
        ``(..., V)`` tensor, equal to ``logits`` on the kept tokens and
        $-\infty$ elsewhere.
    """
    _check_logits(logits)
    k = min(_check_top_k(k), logits.shape[-1])
    # z_(k): the k-th largest logit of each row
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]      # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))    # (..., V)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    r"""Nucleus filter: keep the smallest head of the distribution with mass $\ge p$.

    Sort the probabilities $p_{(1)} \ge p_{(2)} \ge \dots$ and find the
    first $m$ with $\sum_{i \le m} p_{(i)} \ge p$. Tokens $(1), \dots, (m)$
    are kept, including the token $(m)$ whose probability carries the sum
    across $p$; the rest get $-\infty$. Equivalently, token $i$ is kept iff
    the mass of the tokens strictly more likely than it is below $p$:

    $$\text{keep}_i \iff \sum_{j:\, z_j > z_i} p_j < p.$$

    The first token always survives (the mass before it is $0 < p$).
    Tokens tied with token $(m)$ are all kept, so the result does not
    depend on how the sort orders ties. $p = 1$ keeps every token (it is
    the identity, as in Hugging Face, where ``top_p=1.0`` disables the
    filter), even those whose probability underflows to 0.

    Args:
        logits: ``(..., V)`` floating tensor (may already hold $-\infty$).
        p: a number in $(0, 1]$.

    Returns:
        ``(..., V)`` tensor, equal to ``logits`` on the kept tokens and
        $-\infty$ elsewhere.
    """
    _check_logits(logits)
    p = _check_top_p(p)
    if p == 1.0:
        return logits.clone()
    sorted_logits, _ = torch.sort(logits, dim=-1, descending=True)
    # cumulative sums in float64: fewer rounding surprises right at p
    probs = F.softmax(sorted_logits.double(), dim=-1)         # (..., V)
    # mass strictly before each sorted position: sum_{i < m} p_(i)
    before = probs.cumsum(dim=-1) - probs                     # (..., V)
    keep_sorted = before < p                                  # (..., V)
    keep_sorted[..., 0] = True
    # the last kept logit in sorted order; keeping z >= it also keeps ties
    n_kept = keep_sorted.sum(dim=-1, keepdim=True)            # (..., 1)
    threshold = sorted_logits.gather(-1, n_kept - 1)          # (..., 1)
    return logits.masked_fill(logits < threshold, float("-inf"))


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    r"""Min-p filter: keep tokens at least ``min_p`` times as likely as the top one.

    With $p_{\max} = \max_j p_j$, token $i$ survives iff

    $$p_i \ge p_{\text{min}} \cdot p_{\max}
    \iff z_i \ge \max_j z_j + \log p_{\text{min}},$$

    the rule of min-p sampling (Nguyen et al., 2024). The threshold
    scales with the model's confidence: a peaked distribution
    ($p_{\max}$ near 1) keeps few tokens, a flat one keeps many, which is
    what top-p also aims at, but min-p never adds a token of tiny
    probability just to fill the mass $p$ of a flat tail. The test needs no
    sort and no normalisation: it compares each logit with the row's
    largest. The top token always survives; $p_{\text{min}} = 0$ keeps
    every token, and $p_{\text{min}} = 1$ keeps the maxima only (greedy,
    ties kept).

    Args:
        logits: ``(..., V)`` floating tensor (may already hold $-\infty$).
        min_p: a number in $[0, 1]$.

    Returns:
        ``(..., V)`` tensor, equal to ``logits`` on the kept tokens and
        $-\infty$ elsewhere.
    """
    _check_logits(logits)
    min_p = _check_min_p(min_p)
    if min_p == 0.0:
        return logits.clone()
    # log(p_i / p_max) = z_i - max_j z_j, computed without a softmax
    z_max = logits.amax(dim=-1, keepdim=True)                 # (..., 1)
    keep = logits - z_max >= math.log(min_p)                  # (..., V)
    return logits.masked_fill(~keep, float("-inf"))

