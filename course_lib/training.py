r"""The training loop: forward, cross-entropy, backward, clip, AdamW, schedule.

One optimisation step on a batch of next-token targets $y_t$:

1. forward: logits $z_t = f_\theta(x)_t$;
2. loss: the mean cross-entropy $\mathcal{L} = -\frac{1}{n}\sum_t
   \log \mathrm{softmax}(z_t)_{y_t}$ over the $n$ targets that count;
3. backward: autograd fills $g = \partial\mathcal{L}/\partial\theta$ for
   every parameter at once ($W^Q, W^K, W^V, W^O$, embeddings, FFN, ...);
4. clip: if $\lVert g \rVert_2 > c$, rescale $g \leftarrow g\,c/\lVert g
   \rVert_2$ (one global norm over all parameters);
5. AdamW (Loshchilov and Hutter 2019) with learning rate $\eta_t$:
   $m \leftarrow \beta_1 m + (1-\beta_1) g$,
   $v \leftarrow \beta_2 v + (1-\beta_2) g^2$,
   $\theta \leftarrow \theta - \eta_t\big(\hat m / (\sqrt{\hat v} +
   \epsilon) + \lambda\,\theta\big)$ with bias-corrected $\hat m, \hat v$;
   weight decay $\lambda$ applies to matrices only, not to biases or
   norm gains.

The learning rate rises linearly during ``warmup_steps`` and then stays
constant or follows a half cosine to zero: :func:`lr_multiplier`.

Shape letters: B batch, T length, V vocabulary.

Introduced in chapter 7.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .data import (PAD, BOS, EOS, MarkovSource, TranslationTask,
                   collate_translation, entropy_rate, lm_batches,
                   make_translation_task, random_markov_source, token_nll,
                   translation_batches)
from .threads import small_ops
from .validation import check_int, check_real

__all__ = ["IGNORE", "lr_multiplier", "make_optimizer", "next_token_loss",
           "History", "train", "evaluate", "save_checkpoint",
           "load_checkpoint", "seq2seq_loss", "LMRun", "TranslationRun",
           "train_synthetic_lm", "train_toy_translation",
           "translation_model", "greedy_translate", "benchmark_chapter7"]

IGNORE = -100                      # targets with this id do not count


def lr_multiplier(step: int, *, warmup_steps: int, total_steps: int,
                  schedule: str = "constant") -> float:
    r"""Factor $\eta_t / \eta$ of the learning rate at (0-based) ``step``.

    Warmup: $\eta_t/\eta = (t + 1) / t_w$ for $t < t_w$, so the first
    step already moves and step $t_w - 1$ reaches the full rate. After
    warmup: 1 (``"constant"``) or $\tfrac12\big(1 + \cos(\pi\,
    \frac{t - t_w}{t_{\max} - t_w})\big)$ (``"cosine"``, 1 down to 0).

    Args:
        step: $t \ge 0$. warmup_steps: $t_w \ge 0$.
        total_steps: $t_{\max}$, the length of the run (for the cosine).
        schedule: ``"constant"`` or ``"cosine"``.

    Introduced in chapter 7.
    """
    check_int("step", step, minimum=0)
    check_int("warmup_steps", warmup_steps, minimum=0)
    check_int("total_steps", total_steps, minimum=max(warmup_steps, 1))
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"schedule must be 'constant' or 'cosine', got "
                         f"{schedule!r}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant" or total_steps == warmup_steps:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, *, lr: float, weight_decay: float = 0.0,
                   betas: tuple[float, float] = (0.9, 0.98),
                   eps: float = 1e-9) -> torch.optim.AdamW:
    r"""AdamW with weight decay on matrices (``dim >= 2``) only.

    Decaying a bias or a norm gain towards 0 has no regularising meaning
    (nanoGPT makes the same split). Defaults $\beta = (0.9, 0.98)$,
    $\epsilon = 10^{-9}$ are the paper's (sec. 5.3).

    Introduced in chapter 7.
    """
    check_real("lr", lr, positive=True)
    check_real("weight_decay", weight_decay)
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2],
         "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


def next_token_loss(model: nn.Module, batch) -> torch.Tensor:
    r"""Mean cross-entropy of ``model(inputs)`` against ``targets``.

    Args:
        batch: ``(inputs, targets)``, ``(B, T)`` long; targets equal to
            ``IGNORE`` do not count.

    Returns:
        Scalar loss in nats per counted token.

    Introduced in chapter 7.
    """
    inputs, targets = batch
    logits = model(inputs)                                   # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                           ignore_index=IGNORE)


@dataclass
class History:
    """What happened during :func:`train`, one entry per step or eval."""
    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)   # before clipping
    val_step: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    tokens: int = 0                  # counted target tokens seen
    seconds: float = 0.0             # wall time of the training steps


@small_ops()  # steps of small models: see course_lib.threads
def train(model: nn.Module, batches: Iterable, *, steps: int, lr: float,
          warmup_steps: int = 0, schedule: str = "constant",
          weight_decay: float = 0.0, clip_norm: float | None = 1.0,
          loss_fn: Callable = next_token_loss,
          eval_fn: Callable[[nn.Module], float] | None = None,
          eval_every: int = 0, optimizer: torch.optim.Optimizer | None = None,
          start_step: int = 0, seed: int = 0,
          progress: bool = True) -> History:
    r"""Train ``model`` in place for ``steps`` steps.

    Args:
        model: any module that ``loss_fn`` can call.
        batches: an iterable of batches (used ``steps`` times).
        steps: number of optimiser steps.
        lr: peak learning rate $\eta$.
        warmup_steps, schedule: see :func:`lr_multiplier`.
        weight_decay: AdamW's $\lambda$ (matrices only).
        clip_norm: max global gradient norm $c$; ``None`` = no clipping.
        loss_fn: ``loss_fn(model, batch) -> scalar``.
        eval_fn: ``eval_fn(model) -> float`` validation loss, called
            (in eval mode, without gradients) every ``eval_every`` steps
            and after the last step.
        optimizer: continue with this optimizer (e.g. from a checkpoint);
            default a new :func:`make_optimizer`.
        start_step: the step count so far (resuming: the schedule and
            the history continue from here).
        seed: seeds torch's global generator (dropout) before step one.
        progress: show a ``tqdm.auto`` progress bar.

    Returns:
        A :class:`History`.

    Introduced in chapter 7.
    """
    check_int("steps", steps, minimum=1)
    check_int("eval_every", eval_every, minimum=0)
    check_int("start_step", start_step, minimum=0)
    if clip_norm is not None:
        check_real("clip_norm", clip_norm, positive=True)
    total = start_step + steps
    lr_multiplier(0, warmup_steps=warmup_steps, total_steps=total,
                  schedule=schedule)                   # validates early
    if optimizer is None:
        optimizer = make_optimizer(model, lr=lr, weight_decay=weight_decay)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    torch.manual_seed(seed)
    history = History()
    from tqdm.auto import tqdm     # imported here: only train() needs it
    bar = tqdm(total=steps, disable=not progress, leave=False)
    batch_iter = iter(batches)
    start = time.perf_counter()

    def evaluate_now(step: int) -> None:
        nonlocal start
        paused = time.perf_counter()
        history.val_step.append(step)
        history.val_loss.append(evaluate(model, eval_fn))
        # evaluation time does not count as training time
        start += time.perf_counter() - paused

    for step in range(start_step, total):
        eta = lr * lr_multiplier(step, warmup_steps=warmup_steps,
                                 total_steps=total, schedule=schedule)
        for group in optimizer.param_groups:
            group["lr"] = eta
        batch = next(batch_iter)
        model.train()
        loss = loss_fn(model, batch)                 # 1) forward, 2) loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()                              # 3) backward
        # 4) g <- g * min(1, c / ||g||); returns ||g|| before clipping
        norm = nn.utils.clip_grad_norm_(
            params, clip_norm if clip_norm is not None else math.inf)
        optimizer.step()                             # 5) AdamW update
        history.step.append(step)
        history.loss.append(loss.item())
        history.lr.append(eta)
        history.grad_norm.append(norm.item())
        history.tokens += _count_targets(batch)
        if eval_fn is not None and eval_every and \
                (step + 1 - start_step) % eval_every == 0 and step + 1 < total:
            evaluate_now(step + 1)
        bar.update()
        bar.set_postfix(loss=f"{history.loss[-1]:.3f}", refresh=False)
    bar.close()
    if eval_fn is not None:
        evaluate_now(total)
    history.seconds = time.perf_counter() - start
    return history


def _count_targets(batch) -> int:
    """Tokens that count in the loss: the last tensor's non-IGNORE ids."""
    targets = batch[-1] if isinstance(batch, (tuple, list)) else batch
    return int((targets != IGNORE).sum()) if isinstance(
        targets, torch.Tensor) else 0


@torch.no_grad()
def evaluate(model: nn.Module, eval_fn: Callable[[nn.Module], float]
             ) -> float:
    """Run ``eval_fn(model)`` in eval mode without gradients; restore the
    training mode afterwards.

    Introduced in chapter 7.
    """
    was_training = model.training
    model.eval()
    try:
        return float(eval_fn(model))
    finally:
        model.train(was_training)


def save_checkpoint(path, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None, step: int,
                    **extra) -> None:
    """Save model and optimizer state (AdamW's $m$, $v$) and the step.

    Resuming needs the optimizer state too: without $m$ and $v$ the next
    AdamW steps differ from those of an uninterrupted run.

    Introduced in chapter 7.
    """
    check_int("step", step, minimum=0)
    torch.save({"model": model.state_dict(),
                "optimizer": None if optimizer is None
                else optimizer.state_dict(),
                "step": step, "extra": extra}, Path(path))


def load_checkpoint(path, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Load a :func:`save_checkpoint` file into ``model`` (and optimizer).

    Returns:
        ``{"step": int, **extra}``.

    Introduced in chapter 7.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path must be an existing checkpoint file, got "
                         f"{str(path)!r}")
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    if optimizer is not None:
        if state["optimizer"] is None:
            raise ValueError(f"optimizer given, but {str(path)!r} holds no "
                             f"optimizer state")
        optimizer.load_state_dict(state["optimizer"])
    return {"step": state["step"], **state["extra"]}


# ====================================================== chapter-7 recipes
# The two models of chapter 7, trained by one call each: the notebook,
# chapter 8 (which samples from the language model) and the benchmark
# all use these, so they agree on every setting.

class LMRun(NamedTuple):
    """Result of :func:`train_synthetic_lm`."""
    model: nn.Module                 # a trained DecoderLM, in eval mode
    history: History
    source: MarkovSource           # the language it was trained on
    val_batch: tuple                 # (inputs, targets) of the val loss
    entropy_rate: float              # exact floor, nats per token
    val_floor: float                 # true -log p on val_batch's targets


class TranslationRun(NamedTuple):
    """Result of :func:`train_toy_translation`."""
    model: nn.Module                 # a trained Transformer, in eval mode
    history: History
    task: TranslationTask


def seq2seq_loss(model: nn.Module, batch) -> torch.Tensor:
    """Teacher-forced cross-entropy of an encoder-decoder on
    ``(src, tgt_in, tgt_out)``; padded source keys are masked.

    Introduced in chapter 7.
    """
    src, tgt_in, tgt_out = batch
    logits = model(src, tgt_in,
                   src_lengths=(src != PAD).sum(1).tolist())  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(),
                           ignore_index=IGNORE)


def train_synthetic_lm(*, seed: int = 0, steps: int = 300,
                       batch_size: int = 32, length: int = 64,
                       lr: float = 1e-2, warmup_steps: int = 30,
                       schedule: str = "cosine", eval_every: int = 25,
                       progress: bool = False) -> LMRun:
    r"""Train chapter 7's decoder-only LM on its synthetic language.

    Language: :func:`~course_lib.data.random_markov_source` with 16
    symbols, order 2, 3 successors per context (seed 0, whatever ``seed``
    is). Model: a Llama-style :class:`~course_lib.models.DecoderLM`
    (RoPE, RMSNorm, SwiGLU), 2 layers, $D = 64$, 4 heads, context 64.
    ``seed`` sets the initialisation, the dropout stream and the data.

    Introduced in chapter 7.
    """
    from .models import DecoderLM, DecoderLMConfig
    source = random_markov_source(vocab_size=16, order=2, branching=3,
                                  seed=0)
    val = next(lm_batches(source, batch_size=128, length=length,
                          seed=10_000))
    full = torch.cat([val[0], val[1][:, -1:]], dim=1)     # (B, T + 1)
    val_floor = token_nll(source, full).mean().item()
    torch.manual_seed(seed)
    model = DecoderLM(DecoderLMConfig(
        vocab_size=16, d_model=64, n_heads=4, n_layers=2, max_len=length))
    history = train(model, lm_batches(source, batch_size=batch_size,
                                      length=length, seed=seed + 1),
                    steps=steps, lr=lr, warmup_steps=warmup_steps,
                    schedule=schedule, weight_decay=0.1, clip_norm=1.0,
                    eval_fn=lambda m: next_token_loss(m, val).item(),
                    eval_every=eval_every, seed=seed, progress=progress)
    return LMRun(model.eval(), history, source, val,
                 entropy_rate(source), val_floor)


def translation_model(task: TranslationTask, *, seed: int = 0
                      ) -> nn.Module:
    r"""Chapter 7's encoder-decoder, freshly initialised from ``seed``.

    The paper's post-norm :class:`~course_lib.models.Transformer` shrunk
    to $N = 2$, $D = 64$, 4 heads, $d_{ff} = 128$, dropout 0.1; separate
    source and target embeddings (the two languages share no words), the
    output projection tied to the target embedding.

    Introduced in chapter 7.
    """
    from .models import Transformer, TransformerConfig
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig(
        src_vocab_size=len(task.src_vocab),
        tgt_vocab_size=len(task.tgt_vocab), d_model=64, n_heads=4,
        d_ff=128, n_layers=2, dropout=0.1, max_len=16,
        share_src_tgt_embeddings=False))
    # Redraw the embeddings (same law). Transformer.__init__ once drew them
    # in a varying order; the redraw keeps the run recorded in chapter 7.
    for emb in (model.src_embed, model.tgt_embed):
        nn.init.normal_(emb.weight, std=model.config.d_model ** -0.5)
    return model


def train_toy_translation(*, seed: int = 0, steps: int = 200,
                          batch_size: int = 64, lr: float = 3e-3,
                          warmup_steps: int = 40, eval_every: int = 50,
                          progress: bool = False) -> TranslationRun:
    r"""Train chapter 7's encoder-decoder on the toy translation task.

    Model: :func:`translation_model`. The validation loss is measured on
    256 held-out sentences.

    Introduced in chapter 7.
    """
    task = make_translation_task(held_out_fraction=0.2, seed=0)
    val = collate_translation(task, task.held_out[:256])
    model = translation_model(task, seed=seed)
    history = train(model, translation_batches(task, batch_size=batch_size,
                                               seed=seed),
                    steps=steps, lr=lr, warmup_steps=warmup_steps,
                    schedule="cosine", weight_decay=0.01, clip_norm=1.0,
                    loss_fn=seq2seq_loss,
                    eval_fn=lambda m: seq2seq_loss(m, val).item(),
                    eval_every=eval_every, seed=seed, progress=progress)
    return TranslationRun(model.eval(), history, task)


def greedy_translate(model: nn.Module, task: TranslationTask,
                     sentences: list[list[str]]) -> list[list[str]]:
    """Translate source sentences with :func:`~course_lib.models.
    greedy_decode`; returns target word lists (EOS and after dropped).

    Introduced in chapter 7.
    """
    from .models import greedy_decode
    src = collate_translation(task, [(s, []) for s in sentences])[0]
    ids = greedy_decode(model, src, max_len=src.shape[1] + 2, bos_id=BOS,
                        eos_id=EOS, src_lengths=(src != PAD).sum(1).tolist())
    return [task.decode_tgt(row[1:]) for row in ids]        # drop BOS


def benchmark_chapter7() -> dict[str, float]:
    """Train both chapter-7 models once with their defaults and report
    training throughput (counted target tokens per second of training
    steps, evaluation excluded) and the language model's final gap.

    Returns:
        ``lm_tokens_per_s``, ``translation_tokens_per_s``,
        ``lm_val_loss``, ``entropy_rate``, ``lm_gap_nats`` (val loss minus
        entropy rate), ``lm_gap_to_val_floor`` (minus the true model's
        loss on the same tokens), ``translation_exact_match`` (held out).

    Introduced in chapter 7.
    """
    lm = train_synthetic_lm()
    tr = train_toy_translation()
    held = tr.task.held_out
    pred = greedy_translate(tr.model, tr.task, [s for s, _ in held])
    val = lm.history.val_loss[-1]
    return {
        "lm_tokens_per_s": lm.history.tokens / lm.history.seconds,
        "translation_tokens_per_s": tr.history.tokens / tr.history.seconds,
        "lm_val_loss": val, "entropy_rate": lm.entropy_rate,
        "lm_gap_nats": val - lm.entropy_rate,
        "lm_gap_to_val_floor": val - lm.val_floor,
        "translation_exact_match":
            sum(p == t for p, (_, t) in zip(pred, held)) / len(held),
    }
