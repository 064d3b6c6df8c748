r"""Training with and without the $1/\sqrt{d_k}$ scale: does it matter?

Chapter 3 argues from initialisation: if the components of $q$ and $k$
are independent with unit variance, the score $q\cdot k$ has variance
$d_k$, unscaled scores saturate the softmax as heads widen, and the
gradient reaching $W^Q$ and $W^K$ becomes tiny for most rows and huge
for a few. Whether that *training* actually suffers is a separate
question, which this experiment asks directly.

The model is chapter 5's two-layer attention-only
:class:`~course_lib.experiments.head_analysis.TinyAttentionModel` with
$h$ = ``N_HEADS`` heads per layer, trained with AdamW on the induction
task (``BOS s s s ...``: predict the next token of a repeated random
segment), which needs sharp lookups: an induction head must find the one
earlier position whose previous token equals the current one. Every
attention layer's score multiplier $c$ in
$\mathrm{softmax}(c\,QK^\top)$ is one of

* ``"sqrt_dk"``: $c = 1/\sqrt{d_k}$, the paper's scale;
* ``"none"``: $c = 1$, no scale;
* ``"sqrt_dmodel"``: $c = 1/\sqrt{d_{\text{model}}} = 1/\sqrt{h\,d_k}$,
  the bug of dividing by the model width (a softmax $\sqrt h$ times too
  hot in temperature).

The head width varies, $d_k \in$ ``HEAD_DIMS`` (so $d_{\text{model}} =
h\,d_k$). The variance argument assumes unit-variance queries and keys;
PyTorch's ``nn.Linear`` initialisation gives them variance $1/3$ (chapter
3 measures it), so $W^Q$ and $W^K$ are redrawn from
$\mathcal{N}(0, 1/d_{\text{model}})$: on the unit-variance output of a
LayerNorm, each entry of $q$ and $k$ then has variance 1 at the start,
the premise of the argument. Everything else (data, steps, learning
rate) is the same for every setting; ``seed`` fixes the initialisation
and the batches.

Shape letters: B batch, T length, V vocabulary, D = ``d_model``, H heads.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .._util.validation import check_choice, check_int
from .head_analysis import TinyAttentionModel, accuracy, induction_batch, \
    train_induction
from . import sweeps

__all__ = ["SCALES", "HEAD_DIMS", "N_HEADS", "STEPS", "SEEDS",
           "LOSS_THRESHOLD", "score_scale", "scale_run", "make_sweep"]

#: The score multipliers compared (see the module docstring).
SCALES = ("sqrt_dk", "none", "sqrt_dmodel")
#: Head widths $d_k$.
HEAD_DIMS = (8, 32, 64)
#: Heads per layer $h$ ($d_{\text{model}} = h\,d_k$).
N_HEADS = 4
#: AdamW steps of every run (learning rate 3e-3, batches of 64).
STEPS = 200
#: Seeds of every setting.
SEEDS = (0, 1, 2)
#: "Learned" once the 10-step running mean of the training loss is below
#: this (nats; the loss starts near ln 16 = 2.77).
LOSS_THRESHOLD = 0.5
_CURVE_EVERY = 5          # training loss averaged over 5 steps: 40 points
_EVAL_SEED = 12345        # the held-out batch, the same for every run


def score_scale(scale: str, *, head_dim: int, n_heads: int) -> float:
    r"""The multiplier $c$ of the scores for one of ``SCALES``.

    $1/\sqrt{d_k}$ for ``"sqrt_dk"``, $1$ for ``"none"``,
    $1/\sqrt{h\,d_k}$ for ``"sqrt_dmodel"``.
    """
    check_choice("scale", scale, SCALES)
    check_int("head_dim", head_dim, minimum=1)
    check_int("n_heads", n_heads, minimum=1)
    return {"sqrt_dk": 1 / math.sqrt(head_dim), "none": 1.0,
            "sqrt_dmodel": 1 / math.sqrt(n_heads * head_dim)}[scale]


def scale_run(*, scale: str, head_dim: int, seed: int,
              steps: int = STEPS) -> dict:
    r"""Train the two-layer induction model once with score scale ``scale``
    and head width ``head_dim``.

    Args:
        scale: one of ``SCALES``.
        head_dim: $d_k$; the model has ``N_HEADS`` heads per layer.
        seed: seeds the initialisation and the training batches.
        steps: AdamW steps.

    Returns:
        ``{"loss": the training loss averaged over each 5 steps,
        "final_loss": the mean training loss of the last 10 steps,
        "accuracy": next-token accuracy on a fixed held-out batch of 500
        sequences (predictable positions only), "steps_to_threshold": the
        first step at which the 10-step running mean of the training loss
        is below ``LOSS_THRESHOLD`` (nan if never), "init_score_std": the
        standard deviation of the first layer's scaled scores $c\,q\cdot
        k$ at initialisation}``.
    """
    check_choice("scale", scale, SCALES)
    check_int("head_dim", head_dim, minimum=1)
    check_int("seed", seed, minimum=0)
    check_int("steps", steps, minimum=10)
    d_model = N_HEADS * head_dim
    c = score_scale(scale, head_dim=head_dim, n_heads=N_HEADS)
    torch.manual_seed(seed)
    model = TinyAttentionModel(vocab_size=17, d_model=d_model,
                               n_heads=N_HEADS, n_layers=2, max_len=24)
    for mha in model.layers:
        # q, k entries of variance 1 on a LayerNorm's output (see above)
        nn.init.normal_(mha.q_proj.weight, std=d_model ** -0.5)
        nn.init.normal_(mha.k_proj.weight, std=d_model ** -0.5)
        mha.scale = c          # the one multiplier attend() applies
    gen = torch.Generator().manual_seed(_EVAL_SEED)
    x_val, y_val = induction_batch(500, generator=gen)       # (500, T) each
    init_std = _score_std(model, x_val[:64], c)
    loss = train_induction(model, steps=steps, seed=seed)
    running = [sum(loss[i - 9:i + 1]) / 10 for i in range(9, steps)]
    hit = [i + 9 for i, m in enumerate(running) if m < LOSS_THRESHOLD]
    return {
        "loss": [sum(loss[i:i + _CURVE_EVERY]) / _CURVE_EVERY
                 for i in range(0, steps - _CURVE_EVERY + 1, _CURVE_EVERY)],
        "final_loss": sum(loss[-10:]) / 10,
        "accuracy": accuracy(model, x_val, y_val),
        "steps_to_threshold": float(hit[0]) if hit else math.nan,
        "init_score_std": init_std,
    }


@torch.no_grad()
def _score_std(model: TinyAttentionModel, tokens: torch.Tensor,
               c: float) -> float:
    """Std of the first layer's scores c q.k (all heads, all pairs)."""
    mha = model.layers[0]
    T = tokens.shape[1]
    h = model.norms[0](model.tok_emb(tokens)
                       + model.pos_emb(torch.arange(T)))   # (B, T, D)
    B, H, d_k = tokens.shape[0], mha.n_heads, mha.head_dim
    q = mha.q_proj(h).view(B, T, H, d_k).transpose(1, 2)   # (B, H, T, d_k)
    k = mha.k_proj(h).view(B, T, H, d_k).transpose(1, 2)   # (B, H, T, d_k)
    return (c * q @ k.transpose(-2, -1)).std().item()


def make_sweep() -> sweeps.Sweep:
    """Every scale of ``SCALES`` at every width of ``HEAD_DIMS``, over
    ``SEEDS``."""
    settings = [{"scale": s, "head_dim": d}
                for d in HEAD_DIMS for s in SCALES]
    return sweeps.run_sweep(
        "scale_training", scale_run, settings, SEEDS,
        description=(f"two-layer attention-only model, {N_HEADS} heads, "
                     f"on the induction task, {STEPS} AdamW steps; score "
                     "scale 1/sqrt(d_k), 1 or 1/sqrt(d_model) at several "
                     "head widths"),
        meta={"steps": STEPS, "n_heads": N_HEADS, "lr": 3e-3, "batch": 64,
              "length": 24, "vocab_size": 17,
              "loss_threshold": LOSS_THRESHOLD,
              "curve_every": _CURVE_EVERY},
        progress=True)
