r"""Learning rates with and without warmup, trained to the end of a budget.

Warmup raises the learning rate linearly over the first $t_w$ steps,
$\eta_t = \eta\,(t + 1)/t_w$ (:func:`course_lib.training.lr_multiplier`).
Its classic benefit is not a faster start but a larger usable rate: Adam's
first steps divide by a second-moment estimate $\sqrt{\hat v_t}$ built
from a handful of gradients, so each weight moves by about $\eta$ whatever
its gradient, and a rate that works later can throw the model, at the
first steps, into a region it does not leave (Liu et al. 2020). The
experiment measures that claim directly:

* chapter 7's pre-norm language model (a Llama-style
  :class:`~course_lib.model.decoder_lm.DecoderLM`: 2 layers, $D = 64$, 4
  heads) on chapter 7's order-2 Markov language (16 symbols, exact entropy
  rate $h = 0.804$ nats), batches of 16 fresh sequences of 32 symbols;
* peak rates $\eta$ on a log grid, each with no warmup and with
  ``WARMUP`` warmup steps, then a cosine decay to 0 at the end of the
  budget (``STEPS`` steps, where the good rates have levelled off), AdamW
  with weight decay 0.1 and clipping at $\lVert g \rVert_2 \le 1$, as in
  the chapter;
* three seeds; within a seed the initialisation, the batches and the
  validation set (128 sequences) are the same for every rate and warmup.

The result is the final validation loss against $\eta$, two curves. The
*largest stable rate* of each is the largest $\eta$ whose mean final loss
stays within ``STABLE_MARGIN`` nats of the best mean of the whole grid
(:func:`largest_stable_rate`). One traced run per setting of
``TRACED`` records the training loss and the global gradient norm (before
clipping) of each of its first ``TRACE_STEPS`` steps: the spike of a
rate that is too large for a cold start.

Shape letters: B batch, T length, V vocabulary.
"""
from __future__ import annotations

import torch

from .._util.validation import check_int, check_real, check_type
from ..model.decoder_lm import DecoderLM, DecoderLMConfig
from ..tasks import markov
from ..training import next_token_loss, train
from . import sweeps

__all__ = ["LEARNING_RATES", "WARMUP", "STEPS", "SEEDS", "STABLE_MARGIN",
           "TRACED", "TRACE_STEPS", "warmup_run", "grid_summary",
           "largest_stable_rate",
           "make_sweep"]

#: The peak rates $\eta$: a log grid, half a decade apart.
LEARNING_RATES = (3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
#: Warmup steps $t_w$ of the warmed-up runs (the others use 0).
WARMUP = 30
#: Steps per run (the cosine schedule ends here).
STEPS = 250
#: Seeds of every setting.
SEEDS = (0, 1, 2)
#: A rate is stable if its mean final loss is within this many nats of the
#: best mean of the grid. Runs that train end within about 0.15 nats of
#: the best, runs that fail near the 2.34 nats of a model that sees only
#: the previous symbol: any margin between the two gives the same rates.
STABLE_MARGIN = 0.5
#: (rate, warmup steps) of the runs traced step by step (seed 0).
TRACED = ((3e-2, 0), (3e-2, WARMUP), (3e-1, 0))
#: Steps recorded by a trace.
TRACE_STEPS = 50
_EVAL_EVERY = 25
_LENGTH, _BATCH = 32, 16


def warmup_run(*, lr: float, warmup_steps: int, seed: int,
               steps: int = STEPS, trace: bool = False) -> dict:
    r"""Train chapter 7's pre-norm LM once: peak rate ``lr``,
    ``warmup_steps`` of linear warmup, cosine decay to 0 at ``steps``.

    Args:
        lr: the peak learning rate $\eta > 0$.
        warmup_steps: $t_w \ge 0$ (0: the full rate from the first step).
        seed: seeds the initialisation, the dropout stream and the batches.
        steps: the length of the run.
        trace: also return the per-step training loss and gradient norm
            of the first ``TRACE_STEPS`` steps.

    Returns:
        ``{"final_val_loss": nats on the 128 validation sequences after
        the last step (nan if the loss became nan), "val_loss": the
        validation curve every 25 steps, "loss": the training loss
        averaged over each 25 steps, "max_grad_norm": the largest global
        gradient norm before clipping}``; with ``trace``, also
        ``"step_loss"`` and ``"step_grad_norm"`` (one value per step).
    """
    check_real("lr", lr, positive=True)
    check_int("warmup_steps", warmup_steps, minimum=0)
    check_int("seed", seed, minimum=0)
    check_int("steps", steps, minimum=max(warmup_steps, 1))
    source = markov.random_markov_source(vocab_size=16, order=2,
                                         branching=3, seed=0)
    val = next(markov.lm_batches(source, batch_size=128, length=_LENGTH,
                                 seed=10_000))               # (128, T) each
    torch.manual_seed(seed)
    model = DecoderLM(DecoderLMConfig(vocab_size=16, hidden_size=64,
                                      num_attention_heads=4,
                                      num_hidden_layers=2,
                                      max_position_embeddings=_LENGTH))
    history = train(model, markov.lm_batches(source, batch_size=_BATCH,
                                             length=_LENGTH, seed=seed + 1),
                    steps=steps, lr=lr, warmup_steps=warmup_steps,
                    schedule="cosine", weight_decay=0.1, clip_norm=1.0,
                    eval_fn=lambda m: next_token_loss(m, val).item(),
                    eval_every=_EVAL_EVERY, seed=seed, progress=False)
    loss = history.loss
    metrics = {
        "final_val_loss": history.val_loss[-1],
        "val_loss": history.val_loss,
        "loss": [sum(loss[i:i + _EVAL_EVERY]) / len(loss[i:i + _EVAL_EVERY])
                 for i in range(0, len(loss), _EVAL_EVERY)],
        "max_grad_norm": max(history.grad_norm),
    }
    if trace:
        metrics["step_loss"] = loss[:TRACE_STEPS]
        metrics["step_grad_norm"] = history.grad_norm[:TRACE_STEPS]
    return metrics


def grid_summary(sweep: sweeps.Sweep, metric: str, *, lr: float,
                 warmup_steps: int) -> sweeps.SeedSummary:
    """Mean and range over ``SEEDS`` of a scalar ``metric`` of one grid
    setting (the traced rerun of seed 0 left out)."""
    check_type("sweep", sweep, sweeps.Sweep, "a Sweep")
    values = [r["metrics"][metric] for r in sweep.runs
              if r["setting"] == {"lr": lr, "warmup_steps": warmup_steps}]
    if not values:
        raise ValueError(f"no run of {sweep.name} has lr={lr} and "
                         f"warmup_steps={warmup_steps}")
    return sweeps.seed_summary(values)


def largest_stable_rate(sweep: sweeps.Sweep, warmup_steps: int) -> float:
    r"""The largest $\eta$ of the grid whose mean final validation loss
    (over seeds) is within ``STABLE_MARGIN`` of the best mean of all
    settings of ``sweep`` (a :func:`make_sweep` result); a mean that is
    nan (a run that became nan) is not stable."""
    check_type("sweep", sweep, sweeps.Sweep, "a Sweep")
    check_int("warmup_steps", warmup_steps, minimum=0)
    means = {(s["lr"], s["warmup_steps"]): grid_summary(
        sweep, "final_val_loss", **s).mean
        for s in sweep.settings() if "trace" not in s}
    best = min(m for m in means.values() if m == m)
    stable = [lr for (lr, w), m in means.items()
              if w == warmup_steps and m <= best + STABLE_MARGIN]
    if not stable:
        raise ValueError(f"no rate with warmup_steps={warmup_steps} is "
                         f"stable in {sweep.name}")
    return max(stable)


def make_sweep() -> sweeps.Sweep:
    """Every rate of ``LEARNING_RATES`` with and without warmup over
    ``SEEDS``, and the ``TRACED`` runs (seed 0)."""
    settings = [{"lr": lr, "warmup_steps": w}
                for w in (0, WARMUP) for lr in LEARNING_RATES]
    sweep = sweeps.run_sweep(
        "warmup_sweep", warmup_run, settings, SEEDS,
        description=("chapter 7's pre-norm LM on the Markov language, "
                     f"{STEPS} steps with cosine decay, peak rates "
                     "3e-3 to 3e-1, with and without warmup"),
        meta={"steps": STEPS, "warmup": WARMUP, "batch": _BATCH,
              "length": _LENGTH, "eval_every": _EVAL_EVERY,
              "stable_margin": STABLE_MARGIN,
              "entropy_rate": markov.entropy_rate(
                  markov.random_markov_source(vocab_size=16, order=2,
                                              branching=3, seed=0))},
        progress=True)
    traced = sweeps.run_sweep(
        "warmup_sweep", warmup_run,
        [{"lr": lr, "warmup_steps": w, "trace": True} for lr, w in TRACED],
        [0], description="", progress=True)
    sweep.runs.extend(traced.runs)
    return sweep
