r"""An MoE against dense models of its active and of its total width.

The promise of a mixture of experts is quality at equal compute: a token
runs through $k$ of $E$ expert FFNs, so its FLOPs are those of a dense
FFN of width $k F$ (the *active* width), while the layer stores $E F$
(the *total* width) of them. Whether that buys anything is an
experiment: train three decoders that differ only in their FFN,

- **dense, active width**: one SwiGLU of width $k F$, the MoE's compute;
- **MoE**: $E$ SwiGLU experts of width $F$, top-$k$ softmax router
  (Mixtral's), the Switch auxiliary loss $\alpha\,E \sum_i f_i P_i$
  (:func:`~course_lib.model.load_balancing.load_balancing_loss`) added
  per layer;
- **dense, total width**: one SwiGLU of width $E F$, the MoE's
  parameters, with $E/k$ times its FFN compute;

with the same attention, the same initialisation seed and the same
batches of the character text of :mod:`course_lib.tasks.text_corpus`,
and compare their validation loss in nats per character. If the MoE
lands below the dense model of its active width, the extra (idle)
parameters bought quality without compute; the dense model of its
total width is the ceiling a router could at best reach.

Compute is counted as the forward FLOPs per token of the matrix
products, $2$ per multiply-add: every weight a token touches (the
router, its $k$ experts, attention projections, the output head) plus
the attention scores $QK^\top$ and the sum $AV$ at the mean causal
context $(T + 1)/2$; embedding lookups and norms are not matmuls.

The learning rate warms up and then stays constant (no decay to a
horizon), so the first $n$ steps of a long run are exactly an $n$-step
run: the unit test reruns a prefix of the cheapest cell and compares it
with the stored curve. The stored results,
``course_lib/data/experiments/moe_vs_dense.json``, are remade by
``python scripts/run_experiments.py moe_vs_dense`` (part of
``make checkpoints``; nine runs, a few minutes on one thread).

Shape letters: B batch, T length (characters), D = ``hidden_size``,
V vocabulary (96 characters), E experts, k experts per token,
F = ``d_expert``.
"""
from __future__ import annotations

import torch
from torch import nn

from .._util.threads import small_ops
from .._util.validation import check_choice, check_int, check_type
from ..model.block import SwiGLU
from ..model.decoder_lm import DecoderLM, DecoderLMConfig
from ..model.moe import MoE, moe_infos
from ..sizing.params import num_parameters
from ..tasks.text_corpus import CharVocab, char_batches, load_pydoc_corpus
from ..training import next_token_loss, train
from .sweeps import Sweep, run_sweep

__all__ = ["FFN_VARIANTS", "MODEL", "TRAIN", "SEEDS", "ffn_variant_model",
           "active_parameters", "forward_flops_per_token",
           "train_ffn_variant", "make_sweep"]

#: The three FFNs compared, in the order of their compute and size.
FFN_VARIANTS = ("dense_active", "moe", "dense_total")
#: The shared architecture: 2 pre-norm layers of width 64, RoPE, and
#: for the MoE 8 experts of width 64, top-2 (Mixtral's E = 8, k = 2).
MODEL = dict(vocab_size=96, hidden_size=64, num_attention_heads=4,
             num_hidden_layers=2, n_experts=8, top_k=2, d_expert=64)
#: Training: same batches for every variant of a seed; AdamW with
#: warmup then a constant rate; Switch's aux coefficient for the MoE.
TRAIN = dict(steps=600, batch_size=16, length=64, lr=3e-3,
             warmup_steps=50, weight_decay=0.1, clip_norm=1.0,
             aux_coef=0.01, eval_every=30, val_windows=64)
#: The seeds of the stored sweep.
SEEDS = (0, 1, 2)


def _ffn_width(ffn: str) -> int | None:
    """Dense FFN width of a variant (None: the MoE)."""
    E, k, F = MODEL["n_experts"], MODEL["top_k"], MODEL["d_expert"]
    return {"dense_active": k * F, "dense_total": E * F, "moe": None}[ffn]


def ffn_variant_model(ffn: str) -> DecoderLM:
    """The decoder of one variant (initialised from torch's global
    generator: seed it first).

    Args:
        ffn: ``"dense_active"`` (SwiGLU of width $kF$), ``"moe"`` ($E$
            experts of width $F$, top-$k$ softmax router) or
            ``"dense_total"`` (SwiGLU of width $EF$).

    Returns:
        A :class:`~course_lib.model.decoder_lm.DecoderLM` with
        :data:`MODEL`'s shape and context ``TRAIN["length"]``.
    """
    check_choice("ffn", ffn, FFN_VARIANTS)
    D, width = MODEL["hidden_size"], _ffn_width(ffn)
    config = DecoderLMConfig(
        vocab_size=MODEL["vocab_size"], hidden_size=D,
        num_attention_heads=MODEL["num_attention_heads"],
        num_hidden_layers=MODEL["num_hidden_layers"],
        max_position_embeddings=TRAIN["length"])
    if width is None:
        def make_ffn(i: int) -> nn.Module:
            return MoE(D, n_experts=MODEL["n_experts"],
                       top_k=MODEL["top_k"], d_expert=MODEL["d_expert"])
    else:
        def make_ffn(i: int) -> nn.Module:
            return SwiGLU(D, width)
    return DecoderLM(config, ffn_factory=make_ffn)


def active_parameters(model: DecoderLM) -> int:
    """Parameters one token uses: all of them
    (:func:`~course_lib.sizing.params.num_parameters`), minus, in every
    MoE layer, the $E - k$ experts the token does not run
    (:meth:`~course_lib.model.moe.MoE.active_parameters` counts the
    rest)."""
    check_type("model", model, DecoderLM, "a DecoderLM")
    n = num_parameters(model)
    for m in model.modules():
        if isinstance(m, MoE):
            n -= num_parameters(m) - m.active_parameters()
    return n


def forward_flops_per_token(model: DecoderLM, length: int) -> int:
    r"""Forward matmul FLOPs per token, $2 \times$ the multiply-adds.

    $2\,(P_{\text{active}} - VD - P_{\text{norms}}) + 2VD$ for the
    weights (the embedding lookup is no matmul, the tied output head
    is) plus $4 D \frac{T+1}{2}$ per layer for $QK^\top$ and $AV$ at the
    mean causal context of a length-$T$ sequence.
    """
    check_type("model", model, DecoderLM, "a DecoderLM")
    check_int("length", length, minimum=1)
    c = model.config
    D, V = c.hidden_size, c.vocab_size
    norms = sum(p.numel() for name, p in model.named_parameters()
                if p.dim() == 1)                             # norm gains
    weights = active_parameters(model) - V * D - norms       # matmuls
    head = V * D                                             # lm_head
    attention = c.num_hidden_layers * 4 * D * (length + 1) / 2
    return int(2 * (weights + head) + attention)


def _validation_batch(vocab: CharVocab, text: str, windows: int,
                      length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``windows`` evenly spaced windows of the validation text:
    inputs and targets, (windows, length) each."""
    ids = vocab.encode(text)
    starts = torch.linspace(0, ids.numel() - length - 1,
                            windows).long()                  # (W,)
    rows = ids[starts[:, None] + torch.arange(length + 1)]   # (W, T + 1)
    return rows[:, :-1], rows[:, 1:]


@small_ops()
def train_ffn_variant(ffn: str, *, seed: int,
                      steps: int = TRAIN["steps"]) -> dict:
    r"""Train one variant for one seed and measure it.

    ``seed`` sets the initialisation (``torch.manual_seed``) and the
    batch stream (:func:`~course_lib.tasks.text_corpus.char_batches` of
    the training topics), so the three variants of a seed see the same
    batches. The loss is the next-character cross-entropy, plus for the
    MoE $\alpha \sum_{\text{layers}} E \sum_i f_i P_i$ with $\alpha$ =
    ``TRAIN["aux_coef"]``. Validation: the mean cross-entropy (nats per
    character) over :data:`TRAIN` ``["val_windows"]`` fixed windows of
    the validation topics, every ``eval_every`` steps and at the end.

    Args:
        ffn: one of :data:`FFN_VARIANTS`.
        seed: the run's seed (>= 0).
        steps: optimiser steps (default :data:`TRAIN`'s); a shorter run
            is a prefix of a longer one (constant rate after warmup).

    Returns:
        ``{"val_loss": [...], "final_val_loss", "params_total",
        "params_active", "flops_per_token"}``: the validation curve
        (one value per evaluation, nats per character), its last value,
        the parameter counts and the forward FLOPs per token; for the
        MoE also ``"max_load"``, the busiest expert's share of the
        validation token-slots as a multiple of the fair share $1/E$,
        and ``"router_lse"``, the mean log-sum-exp of the router logits
        on the validation tokens (both averaged over layers).
    """
    check_choice("ffn", ffn, FFN_VARIANTS)
    check_int("seed", seed, minimum=0)
    check_int("steps", steps, minimum=1)
    t = TRAIN
    corpus = load_pydoc_corpus()
    vocab = CharVocab()
    train_ids = vocab.encode(corpus.train)
    x_val, y_val = _validation_batch(vocab, corpus.val, t["val_windows"],
                                     t["length"])
    torch.manual_seed(seed)
    model = ffn_variant_model(ffn)

    def loss_fn(m: nn.Module, batch) -> torch.Tensor:
        loss = next_token_loss(m, batch)
        if ffn == "moe":              # + alpha * L_aux of every MoE layer
            loss = loss + t["aux_coef"] * sum(
                info.aux_loss for info in moe_infos(m))
        return loss

    def val_loss(m: nn.Module) -> float:
        return next_token_loss(m, (x_val, y_val)).item()

    history = train(
        model, char_batches(train_ids, batch_size=t["batch_size"],
                            length=t["length"], seed=seed),
        steps=steps, lr=t["lr"], warmup_steps=t["warmup_steps"],
        schedule="constant", weight_decay=t["weight_decay"],
        clip_norm=t["clip_norm"], loss_fn=loss_fn, eval_fn=val_loss,
        eval_every=t["eval_every"], seed=seed, progress=False)
    metrics = {"val_loss": history.val_loss,
               "final_val_loss": history.val_loss[-1],
               "params_total": num_parameters(model),
               "params_active": active_parameters(model),
               "flops_per_token": forward_flops_per_token(model,
                                                          t["length"])}
    if ffn == "moe":
        with torch.no_grad():
            model.eval()
            model(x_val)
        infos = moe_infos(model)
        # busiest expert's share of the slots, in units of the fair 1/E
        metrics["max_load"] = sum(
            (i.load.max() / i.load.sum()).item() * MODEL["n_experts"]
            for i in infos) / len(infos)
        # mean log-sum-exp of the router logits (log E at a zero init)
        metrics["router_lse"] = sum(
            torch.logsumexp(i.routing.logits, -1).mean().item()
            for i in infos) / len(infos)
    return metrics


def make_sweep() -> Sweep:
    """The three variants over :data:`SEEDS` (``make checkpoints``)."""
    steps = list(range(TRAIN["eval_every"], TRAIN["steps"],
                       TRAIN["eval_every"])) + [TRAIN["steps"]]
    return run_sweep(
        "moe_vs_dense", train_ffn_variant,
        [{"ffn": f} for f in FFN_VARIANTS], SEEDS,
        description="Character LMs on the Python manual with a dense FFN "
                    "of the MoE's active width, the MoE (8 experts, "
                    "top-2, aux loss) and a dense FFN of its total width, "
                    "trained on the same batches; validation loss in "
                    "nats per character.",
        meta={"model": MODEL, "train": TRAIN, "val_steps": steps,
              "tokens_per_step": TRAIN["batch_size"] * TRAIN["length"]},
        progress=True)
