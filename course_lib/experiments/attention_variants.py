r"""MHA, GQA, MQA and MLA trained side by side at a matched KV cache.

The four attention layers of chapters 5 and 10 differ in what a token
leaves in the cache, per layer:

$$\text{MHA: } 2 h d_k, \qquad \text{GQA: } 2 g d_k, \qquad
\text{MQA: } 2 d_k, \qquad \text{MLA: } d_c + d_h^R .$$

DeepSeek-V2 chose $d_c = 4 d_h$ and $d_h^R = d_h / 2$, "GQA with only
2.25 groups", and reports MLA stronger than MHA in models of billions of
parameters. This experiment asks the small version of the question: in
one small decoder, trained on the same batches of the same text, what
does each layer buy at its cache size?

Every model is chapter 6's :class:`~course_lib.model.decoder_lm.DecoderLM`
(RoPE, RMSNorm, SwiGLU, tied embeddings) with $h = 4$ query heads of
width $d_k = D / h$; only the attention differs:

- ``"MHA"``: $g = h$ key/value heads, the full cache $2 h d_k$;
- ``"GQA"``: $g = 2$, cache $4 d_k$;
- ``"MQA"``: $g = 1$, cache $2 d_k$;
- ``"MLA"``: :class:`~course_lib.model.mla.MultiHeadLatentAttention` with
  DeepSeek's per-head widths ($d_h = d_v = d_k$, $d_h^R = d_k / 2$), a
  full-rank query (as DeepSeek-V2-Lite) and the latent sized to GQA's
  cache: $d_c = 4 d_k - d_h^R$, so $d_c + d_h^R = 4 d_k$ exactly;
- ``"MLA-wide-RoPE"``: GQA's cache again, with twice the rotated
  features, $d_h^R = d_k$ and $d_c = 3 d_k$ (a test of whether the
  position part is what MLA lacks at this size);
- ``"MLA-small"``: DeepSeek's widths with MQA's cache,
  $d_c + d_h^R = 2 d_k$.

The task is chapter 7's character text (the Python reference manual,
96 characters); the metric is the cross-entropy in nats per character of
one fixed batch of the validation topics, measured during training.
:func:`train_attention_variant` runs one variant for one seed; the seed
sets the initialisation and the order of the training windows, and every
variant with the same seed sees the same windows. :func:`make_sweep`
runs the six variants over three seeds (``make checkpoints``).

Shape letters: B batch, T length (characters), D width, V vocabulary.
"""
from __future__ import annotations

import math

import torch

from .._util.validation import check_choice, check_int, check_type
from ..model.decoder_lm import DecoderLM, DecoderLMConfig
from ..model.mla import MLAConfig, MultiHeadLatentAttention
from ..sizing.kv_cache_size import kv_values_per_token
from ..sizing.params import num_parameters
from ..tasks.text_corpus import CharVocab, char_batches, load_pydoc_corpus
from ..training import next_token_loss, train
from .sweeps import Sweep, run_sweep

__all__ = ["VARIANTS", "TRAIN_SETTINGS", "variant_configs",
           "build_variant", "train_attention_variant", "make_sweep"]

#: The attention layers compared, in the order of their cache size.
VARIANTS = ("MHA", "GQA", "MLA", "MLA-wide-RoPE", "MQA", "MLA-small")

#: The shared model and training recipe (AdamW, warmup, cosine, clip 1).
TRAIN_SETTINGS = dict(num_attention_heads=4, num_hidden_layers=2,
                      length=64, batch_size=8, steps=300, lr=3e-3,
                      warmup_steps=30, weight_decay=0.1, eval_every=30,
                      val_batch=64, val_seed=12345)

_SEEDS = (0, 1, 2)
_KV_GROUPS = {"MHA": None, "GQA": 2, "MQA": 1}     # None: g = h
# MLA: (m, r) with d_c + d_h^R = m d_k (the cache) and d_h^R = d_k / r
_MLA_SHAPE = {"MLA": (4, 2), "MLA-wide-RoPE": (4, 1), "MLA-small": (2, 2)}


def variant_configs(variant: str, *, hidden_size: int = 64
                    ) -> tuple[DecoderLMConfig, MLAConfig | None]:
    r"""The decoder's config and, for an MLA variant, its layer's config.

    With $h$ = ``TRAIN_SETTINGS["num_attention_heads"]`` and $d_k =
    D / h$: MHA, GQA and MQA set ``num_key_value_heads`` to $h$, 2, 1.
    MLA keeps the per-head widths, $d_h = d_v = d_k$, rotates
    $d_h^R = d_k / 2$ features (``"MLA-wide-RoPE"``: $d_k$), and takes the
    rest of the matched cache $m\,d_k$ for the latent: $d_c = m\,d_k -
    d_h^R$ ($m = 4$, GQA's cache; $m = 2$ for ``"MLA-small"``, MQA's).

    Args:
        variant: one of :data:`VARIANTS`.
        hidden_size: $D$, a multiple of $2h$.

    Returns:
        ``(DecoderLMConfig, MLAConfig or None)``.
    """
    check_type("variant", variant, str, "a str")
    check_choice("variant", variant, VARIANTS)
    H = TRAIN_SETTINGS["num_attention_heads"]
    check_int("hidden_size", hidden_size, minimum=2 * H, maximum=1024)
    if hidden_size % (2 * H):
        raise ValueError(f"hidden_size must be a multiple of 2 * heads = "
                         f"{2 * H} (d_h^R = d_k / 2), got {hidden_size}")
    d_k = hidden_size // H
    lm = DecoderLMConfig(
        vocab_size=CharVocab().size, hidden_size=hidden_size,
        num_attention_heads=H, num_key_value_heads=_KV_GROUPS.get(variant),
        num_hidden_layers=TRAIN_SETTINGS["num_hidden_layers"],
        max_position_embeddings=TRAIN_SETTINGS["length"])
    if variant not in _MLA_SHAPE:
        return lm, None
    m, r = _MLA_SHAPE[variant]
    d_rope = d_k // r                                # DeepSeek: 128 / 2
    mla = MLAConfig(hidden_size=hidden_size, num_attention_heads=H,
                    q_lora_rank=None,                # full-rank W^Q
                    kv_lora_rank=m * d_k - d_rope,   # d_c
                    qk_nope_head_dim=d_k, qk_rope_head_dim=d_rope,
                    v_head_dim=d_k)
    return lm, mla


def build_variant(variant: str, *, hidden_size: int = 64) -> DecoderLM:
    """A freshly initialised :class:`DecoderLM` with ``variant``'s
    attention in every layer (:func:`variant_configs`); the caller seeds
    torch's generator first."""
    lm, mla = variant_configs(variant, hidden_size=hidden_size)
    if mla is None:
        return DecoderLM(lm)
    return DecoderLM(lm, attention_factory=lambda i:
                     MultiHeadLatentAttention(mla))


def train_attention_variant(*, variant: str, hidden_size: int = 64,
                            seed: int = 0) -> dict:
    r"""Train one variant with one seed; return its metrics.

    :data:`TRAIN_SETTINGS`: ``steps`` AdamW steps on ``batch_size``
    random windows of ``length`` characters of the training topics
    (windows seeded by ``seed``), linear warmup, then a cosine to zero.
    Every ``eval_every`` steps (and at the end) the mean cross-entropy
    on one fixed batch of ``val_batch`` windows of the validation
    topics, the same batch for every run.

    Args:
        variant: one of :data:`VARIANTS`.
        hidden_size: $D$.
        seed: seeds the initialisation and the training windows.

    Returns:
        ``{"val_loss": final validation loss (nats per character),
        "val_curve": the loss at every evaluation, "val_steps": their
        steps, "train_loss": mean training loss of the last 10 % of the
        steps, "cache_per_token": cached values per token and layer,
        "params": parameters of the model}``.
    """
    check_int("seed", seed, minimum=0)
    s = TRAIN_SETTINGS
    lm, mla = variant_configs(variant, hidden_size=hidden_size)
    corpus = load_pydoc_corpus()
    vocab = CharVocab()
    val = next(char_batches(vocab.encode(corpus.val),
                            batch_size=s["val_batch"], length=s["length"],
                            seed=s["val_seed"]))     # (B_val, T) each
    torch.manual_seed(seed)
    model = build_variant(variant, hidden_size=hidden_size)
    history = train(
        model, char_batches(vocab.encode(corpus.train),
                            batch_size=s["batch_size"], length=s["length"],
                            seed=seed),
        steps=s["steps"], lr=s["lr"], warmup_steps=s["warmup_steps"],
        schedule="cosine", weight_decay=s["weight_decay"], clip_norm=1.0,
        eval_fn=lambda m: next_token_loss(m, val).item(),
        eval_every=s["eval_every"], seed=seed, progress=False)
    tail = history.loss[-max(1, s["steps"] // 10):]
    return {"val_loss": history.val_loss[-1],
            "val_curve": history.val_loss,
            "val_steps": [float(t) for t in history.val_step],
            "train_loss": math.fsum(tail) / len(tail),
            "cache_per_token": float(kv_values_per_token(
                mla if mla is not None else lm, n_layers=1)),
            "params": float(num_parameters(model))}


def make_sweep() -> Sweep:
    """Every variant of :data:`VARIANTS` at $D = 64$, seeds 0, 1, 2."""
    return run_sweep(
        "attention_variants", train_attention_variant,
        [{"variant": v, "hidden_size": 64} for v in VARIANTS], _SEEDS,
        description="A 2-layer character decoder (D = 64, 4 query heads) "
                    "with MHA, GQA-2, MQA, and MLA at GQA-2's and at "
                    "MQA's cache, trained on the same windows of the "
                    "Python manual; validation cross-entropy per "
                    "character.",
        meta=dict(TRAIN_SETTINGS), progress=True)
