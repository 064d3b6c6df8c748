r"""From logits to tokens: sampling, generation and scoring.

A language model ends in a linear layer, the ``lm_head``, that maps the last
hidden state $h_t \in \mathbb{R}^{D}$ to one score per vocabulary entry,
the **logits** $z = W_{\text{vocab}} h_t \in \mathbb{R}^{V}$. The softmax
$p_i = e^{z_i} / \sum_j e^{z_j}$ turns them into a distribution over the
next token. This module decides how a token is drawn from it:

* the filters of :mod:`course_lib.logit_filters`, re-exported here:
  :func:`apply_temperature` ($z / \tau$, temperature $\tau$),
  :func:`top_k_filter`, :func:`top_p_filter` (nucleus) and
  :func:`min_p_filter`;
* :func:`sampling_distribution` composes them in a fixed order and
  returns the distribution that is actually sampled;
* :func:`sample_next` draws one token per row (greedy argmax at
  $\tau = 0$);
* :func:`generate` runs a model autoregressively, recomputing the whole
  prefix at every step (chapter 9 adds the KV cache);
* :func:`sequence_log_prob` scores continuations under a model;
* :func:`beam_search` (from :mod:`course_lib.beam_search`) searches for
  likely sequences instead of sampling.

Shape letters: B batch, T sequence length, V vocabulary size,
``...`` any leading dimensions.

Introduced in chapter 8.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .beam_search import Beam, _model_max_len, beam_search
from .logit_filters import (_check_logits, _check_min_p, _check_temperature,
                            _check_top_k, _check_top_p, apply_temperature,
                            min_p_filter, top_k_filter, top_p_filter)
from .threads import small_ops
from .validation import check_ids, check_int

__all__ = ["apply_temperature", "top_k_filter", "top_p_filter",
           "min_p_filter", "sampling_distribution", "check_sampling_args",
           "sample_next", "generate", "sequence_log_prob", "beam_search",
           "Beam"]


def check_sampling_args(temperature, top_k, top_p, min_p=None) -> None:
    """Validate a sampler's settings before any work is done with them
    (``top_k``, ``top_p`` and ``min_p`` may be None: off).

    Introduced in chapter 8.
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

    Introduced in chapter 8.
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

    Introduced in chapter 8.
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


@torch.no_grad()
@small_ops()  # one small forward per token: see course_lib.threads
def generate(model: torch.nn.Module, prompt_ids: torch.Tensor,
             max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None,
             min_p: float | None = None,
             generator: torch.Generator | None = None,
             max_len: int | None = None) -> torch.Tensor:
    r"""Extend a prompt token by token with :func:`sample_next`.

    At every step the model reads the whole sequence so far (cropped to its
    last ``max_len`` tokens, the longest context it has positions for) and
    the logits of the last position give the next token:

    $$x_{t+1} \sim \mathrm{sample}\big(\mathrm{model}(x_{\le t})_t\big).$$

    Nothing is cached, so step $t$ recomputes attention over all earlier
    tokens; chapter 9 keeps their keys and values instead. The model is put
    in eval mode (no dropout) for the call and restored afterwards.

    Args:
        model: maps ``(B, T)`` token ids to ``(B, T, V)`` logits.
        prompt_ids: ``(T0,)`` or ``(B, T0)`` integer ids, ``T0 >= 1``.
        max_new_tokens: number of tokens to append, an int $\ge 0$.
        temperature, top_k, top_p, min_p, generator: as in
            :func:`sample_next`.
        max_len: context window; default ``model.config.max_len`` if the
            model has one, else no cropping.

    Returns:
        ``(T0 + max_new_tokens,)`` or ``(B, T0 + max_new_tokens)`` ids:
        the prompt followed by the generated tokens.

    Introduced in chapter 8.
    """
    check_ids("prompt_ids", prompt_ids)
    check_int("max_new_tokens", max_new_tokens, minimum=0)
    check_sampling_args(temperature, top_k, top_p, min_p)
    window = _model_max_len(model, max_len)
    idx = prompt_ids.reshape(-1, prompt_ids.shape[-1]).long()  # (B, T0)
    # eval mode (no dropout) for the call, restored afterwards
    was_training = getattr(model, "training", None)
    if isinstance(model, torch.nn.Module):
        model.eval()
    try:
        for _ in range(max_new_tokens):
            context = idx if window is None else idx[:, -window:]  # (B, T')
            logits = model(context)                          # (B, T', V)
            if logits.dim() != 3 or logits.shape[:2] != context.shape:
                raise ValueError(
                    f"model must return logits of shape (B, T, V) = "
                    f"({context.shape[0]}, {context.shape[1]}, V), got "
                    f"{tuple(logits.shape)}")
            nxt = sample_next(logits[:, -1, :], temperature=temperature,
                              top_k=top_k, top_p=top_p, min_p=min_p,
                              generator=generator)           # (B,)
            idx = torch.cat([idx, nxt[:, None]], dim=1)      # (B, T + 1)
    finally:
        if isinstance(model, torch.nn.Module):
            model.train(was_training)
    return idx.reshape(*prompt_ids.shape[:-1], -1)


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

    Introduced in chapter 8.
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
