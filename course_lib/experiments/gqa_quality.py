r"""What sharing keys and values costs in quality, and what it saves in time.

Grouped-query attention (GQA) keeps $h$ query heads but only $g$ key/value
heads; multi-query attention (MQA) is $g = 1$. The KV cache shrinks by
$h/g$. Three measurements of the price and the gain:

1. **Quality, trained from scratch.** Chapter 5's head-count experiment
   (one attention layer of
   :class:`~course_lib.experiments.head_analysis.TinyAttentionModel`,
   $d_{\text{model}} = 32$, a 16-character context, ``STEPS`` AdamW steps
   at rate $2\times10^{-2}$ on the Python manual's characters) with
   $h = 4$ query heads and $g \in$ ``KV_HEADS``; validation loss on all
   non-overlapping 16-character windows of the validation topics. With
   $g = h$ it is exactly the chapter's four-head model.
2. **Conversion** (Ainslie et al. 2023, sec. 2.1). The trained multi-head
   model is turned into a GQA/MQA one by
   :func:`mean_pool_kv_heads` (each group's K and V
   projection heads averaged) and evaluated as it is, then after a few
   more steps of training ("uptraining"); the multi-head model trained
   for the same extra steps is the yardstick.
3. **Time** (:func:`time_kv_heads`). One decoding step reads every cached
   key and value once and does $2\,h\,S\,d_k$ multiply-adds per sequence
   whatever $g$ is; the bytes it reads, $2\,g\,S\,d_k$ numbers, fall with
   $g$. Where reading the cache limits the step (large batches, long
   contexts), decoding time follows the bytes, not the multiply-adds;
   a kernel that copies the shared heads (:func:`repeat_kv`) gives the
   saving back. The timing shows how much of it a CPU sees.

Shape letters: B batch, T length (new tokens), S cached positions, D =
``d_model``, H query heads, G key/value heads, d_k head width, V
vocabulary.
"""
from __future__ import annotations

import copy
import functools
import time
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from .._util.threads import small_ops
from .._util.validation import (check_alloc, check_divides, check_int,
                                check_sizes, check_type)
from ..model.attention import fused_attention
from ..model.mha import MultiHeadAttention, grouped_query_attention
from ..tasks.text_corpus import CharVocab, char_batches, load_pydoc_corpus
from ..training import train
from . import sweeps
from .head_analysis import TinyAttentionModel

__all__ = ["mean_pool_kv_heads", "N_HEADS", "KV_HEADS", "D_MODEL", "LENGTH", "STEPS", "SEEDS",
           "UPTRAIN_STEPS", "gqa_text_model", "text_val_loss", "gqa_run",
           "make_sweep", "HeadTiming", "time_kv_heads"]

#: Query heads $h$ (head width $d_k = 32 / 4 = 8$).
N_HEADS = 4
#: Key/value heads $g$ compared: MHA, GQA, MQA.
KV_HEADS = (4, 2, 1)
#: Model width and context of chapter 5's head-count experiment.
D_MODEL, LENGTH = 32, 16
#: AdamW steps of every run (batches of 64 windows, rate 2e-2).
STEPS = 150
#: Seeds of every setting (initialisation and order of the windows).
SEEDS = (0, 1, 2)
#: Extra steps of the converted models; their loss is recorded every
#: ``_UPTRAIN_EVERY`` steps.
UPTRAIN_STEPS = 30
_UPTRAIN_EVERY = 5
_LR, _BATCH = 2e-2, 64


@functools.lru_cache(maxsize=1)
def _text():
    """(training ids, validation inputs (N, T), validation targets (N, T))."""
    corpus, vocab = load_pydoc_corpus(), CharVocab()
    train_ids, val_ids = vocab.encode(corpus.train), vocab.encode(corpus.val)
    n_val = (len(val_ids) - 1) // LENGTH
    val_x = val_ids[:n_val * LENGTH].view(n_val, LENGTH)          # (N, T)
    val_y = val_ids[1:n_val * LENGTH + 1].view(n_val, LENGTH)     # (N, T)
    return train_ids, val_x, val_y


def mean_pool_kv_heads(mha: MultiHeadAttention,
                       n_kv_heads: int) -> MultiHeadAttention:
    r"""Convert attention with $g$ K/V heads to $g' < g$ by mean-pooling.

    Ainslie et al. (2023, sec. 2.1) turn a multi-head checkpoint into a
    grouped-query one this way: the key and value projection heads of each
    group are averaged into one head,

    $$W^K_{j} \leftarrow \frac{1}{r}\sum_{i = jr}^{(j+1)r - 1} W^K_i,
    \qquad W^V_{j} \leftarrow \frac{1}{r}\sum_{i = jr}^{(j+1)r - 1}
    W^V_i, \qquad r = g / g',$$

    (biases alike), so that query head $i$, which read K/V head
    $\lfloor i g / h \rfloor$, now reads its group's average
    $\lfloor i g' / h \rfloor$ (the Llama layout of :func:`repeat_kv`).
    $W^Q$, $W^O$ and the score scale are copied. With $g' = g$ it is the
    same function; otherwise it is an approximation that the paper repairs
    by a short continued training ("uptraining").

    Args:
        mha: the module to convert (left unchanged).
        n_kv_heads: $g'$, dividing ``mha.n_kv_heads``.

    Returns:
        A new :class:`MultiHeadAttention` with ``n_kv_heads`` K/V heads.
    """
    check_type("mha", mha, MultiHeadAttention, "a MultiHeadAttention")
    check_sizes(n_kv_heads=n_kv_heads)
    check_divides("mha.n_kv_heads", mha.n_kv_heads, "n_kv_heads",
                  n_kv_heads)
    G, d_k, D = mha.n_kv_heads, mha.head_dim, mha.d_model
    r = G // n_kv_heads                               # K/V heads per group
    out = MultiHeadAttention(D, mha.n_heads, n_kv_heads=n_kv_heads,
                             bias=mha.q_proj.bias is not None,
                             rope=mha.rope, fused=mha.fused)
    out.scale = mha.scale
    out.to(mha.q_proj.weight)                         # dtype and device
    with torch.no_grad():
        for name in ("q_proj", "o_proj"):
            getattr(out, name).load_state_dict(
                getattr(mha, name).state_dict())
        for name in ("k_proj", "v_proj"):
            src, dst = getattr(mha, name), getattr(out, name)
            # rows of the (out, in) weight: head j owns rows j d_k ...
            w = src.weight.view(n_kv_heads, r, d_k, D)   # (g', r, d_k, D)
            dst.weight.copy_(w.mean(dim=1).reshape(n_kv_heads * d_k, D))
            if src.bias is not None:
                b = src.bias.view(n_kv_heads, r, d_k)    # (g', r, d_k)
                dst.bias.copy_(b.mean(dim=1).reshape(n_kv_heads * d_k))
    return out


def gqa_text_model(n_kv_heads: int, *, seed: int) -> TinyAttentionModel:
    r"""The untrained one-layer model with $h$ = ``N_HEADS`` query heads
    and ``n_kv_heads`` key/value heads, initialised from ``seed``.

    The multi-head model is the one chapter 5 trains; for $g < h$ its
    attention layer is replaced by a freshly initialised
    ``MultiHeadAttention(D_MODEL, N_HEADS, n_kv_heads=g)``.
    """
    check_int("n_kv_heads", n_kv_heads, minimum=1)
    if n_kv_heads not in KV_HEADS:
        raise ValueError(f"n_kv_heads must be one of {KV_HEADS}, got "
                         f"{n_kv_heads}")
    check_int("seed", seed, minimum=0)
    torch.manual_seed(seed)
    model = TinyAttentionModel(vocab_size=CharVocab().size, d_model=D_MODEL,
                               n_heads=N_HEADS, n_layers=1, max_len=LENGTH)
    if n_kv_heads != N_HEADS:
        model.layers[0] = MultiHeadAttention(D_MODEL, N_HEADS,
                                             n_kv_heads=n_kv_heads)
    return model


@torch.no_grad()
@small_ops()                      # a small model: one thread (chapter 1)
def text_val_loss(model: TinyAttentionModel) -> float:
    """Nats per character on every 16-character validation window."""
    check_type("model", model, TinyAttentionModel, "a TinyAttentionModel")
    _, val_x, val_y = _text()
    was_training = model.training
    model.eval()
    loss = F.cross_entropy(model(val_x).transpose(1, 2), val_y).item()
    model.train(was_training)
    return loss


def _train(model, steps, data_seed, eval_every=0):
    """AdamW at ``_LR`` on windows drawn with ``data_seed``; returns the
    validation losses recorded every ``eval_every`` steps."""
    train_ids, _, _ = _text()
    history = train(model, char_batches(train_ids, batch_size=_BATCH,
                                        length=LENGTH, seed=data_seed),
                    steps=steps, lr=_LR, clip_norm=None, seed=None,
                    eval_fn=text_val_loss if eval_every else None,
                    eval_every=eval_every, progress=False)
    return history.val_loss


def gqa_run(*, n_kv_heads: int, seed: int, steps: int = STEPS) -> dict:
    r"""Train the model with ``n_kv_heads`` K/V heads once; for $g = h$
    also convert it and uptrain the conversions.

    Args:
        n_kv_heads: $g$, one of ``KV_HEADS``.
        seed: seeds the initialisation and the training windows.
        steps: AdamW steps.

    Returns:
        ``{"val_loss": nats per character}``; for ``n_kv_heads ==
        N_HEADS`` also, for each smaller $g'$ of ``KV_HEADS`` and for
        $g' = h$ (the multi-head model itself, trained on), ``"uptrain_g"
        + str(g')``: the validation loss after 0, 5, ..., ``UPTRAIN_STEPS``
        further steps of the mean-pooled model (the same windows for
        every $g'$).
    """
    model = gqa_text_model(n_kv_heads, seed=seed)
    check_int("steps", steps, minimum=1)
    _train(model, steps, seed)
    metrics = {"val_loss": text_val_loss(model)}
    if n_kv_heads == N_HEADS:
        for g in KV_HEADS:
            pooled = copy.deepcopy(model)
            pooled.layers[0] = mean_pool_kv_heads(model.layers[0], g)
            metrics[f"uptrain_g{g}"] = [text_val_loss(pooled)] + _train(
                pooled, UPTRAIN_STEPS, seed + 1000, _UPTRAIN_EVERY)
    return metrics


def make_sweep() -> sweeps.Sweep:
    """Every $g$ of ``KV_HEADS`` over ``SEEDS``."""
    return sweeps.run_sweep(
        "gqa_quality", gqa_run, [{"n_kv_heads": g} for g in KV_HEADS],
        SEEDS,
        description=(f"one attention layer (d_model {D_MODEL}, {N_HEADS} "
                     f"query heads) on the Python manual's characters, "
                     f"{STEPS} steps, with 4, 2 and 1 key/value heads; the "
                     "multi-head model mean-pooled to fewer K/V heads and "
                     f"uptrained for {UPTRAIN_STEPS} steps"),
        meta={"steps": STEPS, "n_heads": N_HEADS, "d_model": D_MODEL,
              "length": LENGTH, "lr": _LR, "batch": _BATCH,
              "uptrain_steps": UPTRAIN_STEPS,
              "uptrain_every": _UPTRAIN_EVERY},
        progress=True)


# --------------------------------------------------------------- timing
@dataclass(frozen=True)
class HeadTiming:
    """One row of :func:`time_kv_heads` (seconds: the fastest call)."""
    n_kv_heads: int
    kv_bytes: int            # bytes of the cached K and V one step reads
    attention_macs: int      # multiply-adds of one decoding step's attention
    decode_seconds: float    # fused kernel, K/V heads shared in the kernel
    decode_copy_seconds: float   # explicit path: repeat_kv copies first
    prefill_seconds: float   # the whole layer on a prompt of T tokens


def time_kv_heads(kv_heads: Sequence[int] = (8, 2, 1), *, d_model: int = 512,
                  n_heads: int = 8, batch: int = 4, cached: int = 4096,
                  prompt: int = 256, repeats: int = 5,
                  seed: int = 0) -> list[HeadTiming]:
    r"""Time attention with $h$ query heads and each $g$ of ``kv_heads``.

    * decode: one new query per sequence, q ``(B, H, 1, d_k)``, against
      ``cached`` positions of K and V ``(B, G, S, d_k)``: torch's fused
      kernel (``enable_gqa``, no copies), and the explicit path of
      :func:`~course_lib.model.mha.grouped_query_attention`, which first
      copies each K/V head to its $h/g$ query heads (:func:`repeat_kv`);
    * prefill: a ``fused`` :class:`MultiHeadAttention` layer on ``prompt``
      tokens, projections included.

    The calls are interleaved (one call of every setting per round, the
    fastest of ``repeats`` rounds kept), so a busy machine slows all
    settings alike.

    Returns:
        One :class:`HeadTiming` per $g$, in order.
    """
    for name, value in (("d_model", d_model), ("n_heads", n_heads),
                        ("batch", batch), ("cached", cached),
                        ("prompt", prompt), ("repeats", repeats)):
        check_int(name, value, minimum=1)
    kv_heads = list(kv_heads)
    for g in kv_heads:
        check_int("kv_heads", g, minimum=1)
        if n_heads % g or d_model % n_heads:
            raise ValueError(f"kv_heads must divide n_heads={n_heads} "
                             f"(and n_heads d_model), got {g}")
    d_k = d_model // n_heads
    check_alloc("the cached keys and values, 2 batch g cached d_k",
                2 * batch * max(kv_heads, default=1) * cached * d_k)
    check_alloc("the prompt, batch prompt d_model", batch * prompt * d_model)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n_heads, 1, d_k, generator=gen)   # (B, H, 1, d_k)
    x = torch.randn(batch, prompt, d_model, generator=gen)   # (B, T, D)
    calls = []
    for g in kv_heads:
        k, v = torch.randn(2, batch, g, cached, d_k,
                           generator=gen).unbind(0)          # (B, G, S, d_k)
        layer = MultiHeadAttention(d_model, n_heads, n_kv_heads=g,
                                   fused=True)
        calls.append([
            lambda k=k, v=v, g=g: fused_attention(q, k, v,
                                                  enable_gqa=g != n_heads),
            lambda k=k, v=v: grouped_query_attention(q, k, v),
            lambda layer=layer: layer(x)])
    best = [[float("inf")] * 3 for _ in kv_heads]
    with torch.inference_mode():
        for fns in calls:                                   # warm-up
            for fn in fns:
                fn()
        for _ in range(repeats):
            for i, fns in enumerate(calls):
                for j, fn in enumerate(fns):
                    start = time.perf_counter()
                    fn()
                    best[i][j] = min(best[i][j], time.perf_counter() - start)
    return [HeadTiming(g, 2 * batch * g * cached * d_k * 4,
                       2 * batch * n_heads * cached * d_k, *best[i])
            for i, g in enumerate(kv_heads)]
