r"""A few steps of fine-tuning SmolLM2-135M on the Python manual.

Chapter 7's training loop (:func:`course_lib.training.train`) does not
care how large the model is: the same forward pass, cross-entropy,
backward pass, clipping and AdamW step that teach a 100,000-parameter
model a toy language also adapt a pretrained 135-million-parameter Llama
to a new kind of text. Here the text is the training topics of Python's
reference manual (:func:`course_lib.tasks.text_corpus.load_pydoc_corpus`)
and the model SmolLM2-135M-Instruct (:mod:`course_lib.pretrained.smollm2`,
float32 weights dequantised from its 4-bit file).

**Bits per character across tokenizers.** SmolLM2 reads BPE tokens of
about 4.5 characters, so its loss per token cannot be compared with a
character model's loss per character. Both can be turned into the number
of bits needed to encode the same text: for a held-out text of $N_c$
characters, encoded as tokens $u_1, \dots, u_M$,

$$\text{bits per character} = \frac{1}{N_c - |u_1|}\sum_{j=2}^{M}
-\log_2 q(u_j \mid u_{<j}),$$

where $|u_1|$ is the number of characters of the first token, which has
no context and is not scored (:func:`token_bits_per_char`). The tokens'
total bits are a code length for the characters they spell, so the ratio
is a per-character figure whatever the tokenizer.

**Training batches** (:func:`manual_token_batches`): each row starts at
a line of the training text chosen at random, is encoded by the model's
own tokenizer and cut to $T + 1$ tokens (inputs the first $T$, targets
the last $T$). The held-out text is the start of the validation topics,
which the model is never trained on.

Shape letters: B batch, T length (tokens), V vocabulary (49,152).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .._util.validation import check_int, check_type
from ..tasks import text_corpus
from ..training import History, train
from . import sweeps

__all__ = ["STEPS", "LR", "WARMUP", "BATCH", "LENGTH", "HELD_OUT_CHARS",
           "SEEDS", "manual_token_batches", "token_bits_per_char",
           "finetune", "finetune_smollm2", "make_sweep"]

#: Optimiser steps of the fine-tuning run.
STEPS = 40
#: Peak learning rate (after linear warmup; cosine decay to 0 at STEPS).
LR = 1e-4
#: Warmup steps.
WARMUP = 5
#: Rows per batch and tokens per row: 128 target tokens per step.
BATCH, LENGTH = 2, 64
#: Characters of held-out text (the start of the validation topics).
HELD_OUT_CHARS = 4000
#: One seed: a run costs minutes of CPU time.
SEEDS = (0,)


def manual_token_batches(tokenizer, text: str, *, batch_size: int,
                         length: int, seed: int):
    r"""Endless batches of ``length + 1`` consecutive tokens from ``text``.

    Each row starts at the beginning of a line drawn at random (a
    ``torch.Generator`` seeded with ``seed``); the characters from there
    are encoded with ``tokenizer`` and the first ``length + 1`` tokens
    kept. Rows too close to the end of the text are drawn again.

    Args:
        tokenizer: has ``encode(str) -> list[int]`` (SmolLM2's BPE).
        text: the training text.
        batch_size: $B$. length: $T$.
        seed: seeds the choice of lines.

    Yields:
        ``(inputs, targets)``, both ``(B, T)`` long.
    """
    if not callable(getattr(tokenizer, "encode", None)):
        raise TypeError(f"tokenizer must have an encode method, got "
                        f"{type(tokenizer).__name__}")
    check_type("text", text, str, "a str")
    check_int("batch_size", batch_size, minimum=1)
    check_int("length", length, minimum=1)
    check_int("seed", seed, minimum=0)
    starts = [0] + [i + 1 for i, c in enumerate(text[:-1]) if c == "\n"]
    chars = 16 * (length + 1)          # enough characters for length + 1
    return _token_batches(tokenizer, text, starts, chars, batch_size,
                          length, seed)


def _token_batches(tokenizer, text, starts, chars, batch_size, length,
                   seed):
    gen = torch.Generator().manual_seed(seed)
    while True:
        rows = []
        while len(rows) < batch_size:
            i = starts[torch.randint(len(starts), (1,), generator=gen).item()]
            ids = tokenizer.encode(text[i:i + chars])[:length + 1]
            if len(ids) == length + 1:
                rows.append(ids)
        rows = torch.tensor(rows)                            # (B, T + 1)
        yield rows[:, :-1], rows[:, 1:]


@torch.no_grad()
def token_bits_per_char(model: nn.Module, tokenizer, text: str, *,
                        context: int = 512) -> float:
    r"""Bits per character of ``text`` under a token-level model.

    $\sum_{j \ge 2} -\log_2 q(u_j \mid u_{<j})$ over the tokens of
    ``text`` divided by the characters they spell (all but those of the
    first token). Windows of ``context`` tokens start every
    ``context // 2`` tokens, and each scores the targets no earlier
    window scored, so every token is predicted from at least half a
    window of preceding tokens (all of them if the text fits in one).

    Args:
        model: ``(B, T) -> (B, T, V)`` logits.
        tokenizer: ``encode``/``decode``, with ``decode(encode(text)) ==
            text``.
        text: at least two tokens long.
        context: the window length in tokens, at least 2.

    Returns:
        Bits per character, a Python float.
    """
    check_type("model", model, nn.Module, "a torch.nn.Module")
    check_type("text", text, str, "a str")
    check_int("context", context, minimum=2)
    ids = torch.tensor(tokenizer.encode(text))                   # (M,)
    if ids.numel() < 2:
        raise ValueError("text must encode to at least 2 tokens")
    if tokenizer.decode(ids.tolist()) != text:
        raise ValueError("text must survive encode and decode unchanged")
    scored_chars = len(text) - len(tokenizer.decode(ids[:1].tolist()))
    was_training = model.training
    model.eval()
    total, done, b, M = 0.0, 0, 0, ids.numel()   # done: targets scored
    try:
        while done < M - 1:
            window = ids[b:b + context + 1]                    # (T + 1,)
            logits = model(window[None, :-1])[0]               # (T, V)
            nll = F.cross_entropy(logits.double(), window[1:],
                                  reduction="none")            # (T,)
            total += nll[done - b:].sum().item()   # targets b+1.. new ones
            done = b + window.numel() - 1
            b += context // 2
    finally:
        model.train(was_training)
    return total / math.log(2) / scored_chars


def finetune(model: nn.Module, tokenizer, text: str, *, steps: int,
             seed: int, total_steps: int | None = None) -> History:
    r"""Fine-tune ``model`` in place on ``text`` with chapter 7's loop.

    AdamW at peak rate ``LR`` (no weight decay), ``WARMUP`` steps of
    warmup, cosine decay to 0 at ``total_steps`` (default ``steps``),
    clipping at $\lVert g \rVert_2 \le 1$, batches of ``BATCH`` rows of
    ``LENGTH`` tokens from :func:`manual_token_batches`.

    Returns:
        The :class:`~course_lib.training.History` (loss and gradient norm
        of every step).
    """
    check_type("model", model, nn.Module, "a torch.nn.Module")
    batches = manual_token_batches(tokenizer, text, batch_size=BATCH,
                                   length=LENGTH, seed=seed)
    return train(model, batches, steps=steps, lr=LR, warmup_steps=WARMUP,
                 schedule="cosine", weight_decay=0.0, clip_norm=1.0,
                 total_steps=total_steps, seed=seed, progress=False)


def finetune_smollm2(*, seed: int, steps: int = STEPS) -> dict:
    r"""Load SmolLM2-135M, measure its bits per character on the held-out
    text, fine-tune it for ``steps`` steps on the manual's training
    topics, and measure again.

    Returns:
        ``{"bpc_before", "bpc_after": bits per character on the first
        HELD_OUT_CHARS characters of the validation topics, "loss",
        "grad_norm": one value per step (nats per token; global norm
        before clipping), "train_tokens": target tokens seen}``.
    """
    check_int("seed", seed, minimum=0)
    check_int("steps", steps, minimum=1)
    from ..pretrained.smollm2 import load_smollm2
    model, tokenizer = load_smollm2()
    corpus = text_corpus.load_pydoc_corpus()
    held_out = corpus.val[:HELD_OUT_CHARS]
    before = token_bits_per_char(model, tokenizer, held_out)
    history = finetune(model, tokenizer, corpus.train, steps=steps,
                       seed=seed)
    after = token_bits_per_char(model, tokenizer, held_out)
    return {"bpc_before": before, "bpc_after": after,
            "loss": history.loss, "grad_norm": history.grad_norm,
            "train_tokens": float(history.tokens)}


def make_sweep() -> sweeps.Sweep:
    """The fine-tuning run for every seed of ``SEEDS``."""
    return sweeps.run_sweep(
        "smollm2_finetune", finetune_smollm2, [{"steps": STEPS}], SEEDS,
        description=(f"SmolLM2-135M fine-tuned {STEPS} steps on the Python "
                     f"manual's training topics; bits per character on the "
                     f"first {HELD_OUT_CHARS} validation characters"),
        meta={"lr": LR, "warmup": WARMUP, "batch": BATCH, "length": LENGTH,
              "held_out_chars": HELD_OUT_CHARS},
        progress=True)
