r"""The fixed-vector bottleneck: a tiny translator with and without attention.

An RNN encoder-decoder (Sutskever et al., 2014; Cho et al., 2014) reads the
source $x_1 \dots x_n$ into encoder states $h_1 \dots h_n$ and hands the
decoder only the last one, $c = h_n$: $d_h$ numbers, whatever $n$. The
decoder starts from $s_0 = c$ and updates $s_i = \mathrm{GRU}(s_{i-1},
y_{i-1})$. Attention (Bahdanau et al., 2015; here the dot-product form of
Luong et al., 2015) lets every decoder step read all encoder states:

$$\alpha_{ij} = \mathrm{softmax}_j\Big(\frac{s_i^\top h_j}{\sqrt{d_h}}
\Big),\qquad a_i = \sum_j \alpha_{ij} h_j,\qquad
\tilde s_i = \tanh(W_c [s_i; a_i]),$$

and the logits are $W_{out}\tilde s_i$ (without attention, $W_{out} s_i$).

The task is to *copy* a random sequence of $n$ symbols from an alphabet of
$V$: the target is the source. Nothing about it is hard except holding $n$
symbols at once, $n \log_2 V$ bits, which is exactly what the context
vector must do without attention. :func:`run_bottleneck` trains one model
at one source length and reports its greedy-decoding accuracy;
:func:`make_sweep` runs lengths 5, 10 and 20, with and without
attention, over three seeds.

Shape letters: B batch, S source length ($n$), T target length (here
$T = S$), d_h hidden width, V symbols (the decoder also reads ``<bos>``,
id V).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .._util.threads import small_ops
from .._util.validation import (check_alloc, check_bool,
                                check_int, check_type)
from ..training import train
from .sweeps import Sweep, run_sweep

__all__ = ["make_copy_batch", "GRUSeq2Seq", "greedy_copy", "run_bottleneck",
           "make_sweep"]


def make_copy_batch(batch: int, length: int, *, vocab_size: int,
                    generator: torch.Generator | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Sample the copy task: the target is the source.

    ``src`` holds $n$ = ``length`` i.i.d. uniform symbols from
    $\{0, \dots, V-1\}$; the decoder reads ``tgt_in`` = ``<bos>``
    $x_1 \dots x_{n-1}$ (teacher forcing, ``<bos>`` = V) and must predict
    ``tgt_out`` = $x_1 \dots x_n$. Chance accuracy is $1/V$ per symbol.

    Returns:
        ``(src, tgt_in, tgt_out)``, int64, each (B, n).
    """
    check_int("batch", batch, minimum=1)
    check_int("length", length, minimum=1)
    check_int("vocab_size", vocab_size, minimum=2)
    check_alloc("batch * length", batch * length)
    src = torch.randint(vocab_size, (batch, length),
                        generator=generator)                 # (B, S)
    bos = torch.full((batch, 1), vocab_size)                 # (B, 1)
    return src, torch.cat([bos, src[:, :-1]], dim=1), src.clone()


class GRUSeq2Seq(nn.Module):
    r"""GRU encoder-decoder, with or without dot-product attention.

    Encoder: $h_j = \mathrm{GRU}(h_{j-1}, E_{src}[x_j])$; decoder:
    $s_0 = h_n$ (the context vector $c$), $s_i = \mathrm{GRU}(s_{i-1},
    E_{tgt}[y_{i-1}])$. With ``attention`` the readout is
    $W_{out}\tanh(W_c[s_i; a_i])$ with $a_i$ the attention read of the
    module docstring; without it, $W_{out} s_i$. Luong's form (the score
    uses the *current* state $s_i$) keeps the decoder recurrence free of
    $a_i$, so teacher forcing runs the decoder GRU over all steps at once.

    Args:
        vocab_size: V source/target symbols (the decoder adds ``<bos>``).
        hidden_size: $d_h$, the width of every state and of $c$.
        attention: read all encoder states at every decoder step.
    """

    def __init__(self, *, vocab_size: int, hidden_size: int = 64,
                 attention: bool) -> None:
        super().__init__()
        check_int("vocab_size", vocab_size, minimum=2)
        check_int("hidden_size", hidden_size, minimum=1)
        check_bool("attention", attention)
        self.vocab_size, self.attention = vocab_size, attention
        self.src_embed = nn.Embedding(vocab_size, hidden_size)
        self.tgt_embed = nn.Embedding(vocab_size + 1, hidden_size)  # +<bos>
        self.encoder = nn.GRU(hidden_size, hidden_size, batch_first=True)
        self.decoder = nn.GRU(hidden_size, hidden_size, batch_first=True)
        # W_c [s; a]: only with attention
        self.combine = (nn.Linear(2 * hidden_size, hidden_size)
                        if attention else None)
        self.lm_head = nn.Linear(hidden_size, vocab_size)    # W_out

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder states (B, S, d_h) and the context $c = h_n$ (1, B, d_h)
        for source ids (B, S)."""
        return self.encoder(self.src_embed(src))

    def readout(self, s: torch.Tensor, enc: torch.Tensor) -> torch.Tensor:
        r"""Logits (B, T, V) from decoder states ``s`` (B, T, d_h) and
        encoder states ``enc`` (B, S, d_h)."""
        if not self.attention:
            return self.lm_head(s)                           # (B, T, V)
        # alpha_ij = softmax_j(s_i . h_j / sqrt(d_h))
        scores = s @ enc.transpose(1, 2) / math.sqrt(s.shape[-1])  # (B,T,S)
        a = torch.softmax(scores, dim=-1) @ enc              # (B, T, d_h)
        s_tilde = torch.tanh(self.combine(torch.cat([s, a], dim=-1)))
        return self.lm_head(s_tilde)                         # (B, T, V)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor
                ) -> torch.Tensor:
        """Teacher-forced logits (B, T, V) for source ids (B, S) and
        decoder inputs (B, T) (``<bos>`` then the target shifted by one).
        """
        enc, c = self.encode(src)                 # (B, S, d_h), (1, B, d_h)
        s, _ = self.decoder(self.tgt_embed(tgt_in), c)       # (B, T, d_h)
        return self.readout(s, enc)


@torch.no_grad()
def greedy_copy(model: GRUSeq2Seq, src: torch.Tensor) -> torch.Tensor:
    r"""Greedy decoding of ``src`` (B, S) for S steps: each step feeds the
    argmax of the previous one back in, as at test time (no teacher
    forcing). Returns the predicted ids (B, S)."""
    check_type("model", model, GRUSeq2Seq, "a GRUSeq2Seq")
    check_type("src", src, torch.Tensor, "a torch.Tensor")
    if src.dim() != 2 or src.dtype != torch.long:
        raise ValueError(f"src must be an int64 (B, S) tensor, got "
                         f"{src.dtype} of shape {tuple(src.shape)}")
    was_training = model.training
    model.eval()
    enc, state = model.encode(src)            # (B, S, d_h), (1, B, d_h)
    y = torch.full((src.shape[0], 1), model.vocab_size)      # <bos>, (B, 1)
    out = []
    for _ in range(src.shape[1]):
        s, state = model.decoder(model.tgt_embed(y), state)  # (B, 1, d_h)
        y = model.readout(s, enc).argmax(-1)                 # (B, 1)
        out.append(y)
    model.train(was_training)
    return torch.cat(out, dim=1)                             # (B, S)


def _copy_loss(model: nn.Module, batch) -> torch.Tensor:
    src, tgt_in, tgt_out = batch
    logits = model(src, tgt_in)                              # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten())


@small_ops()  # a tiny model: one thread (see course_lib._util.threads)
def run_bottleneck(*, length: int, attention: bool, seed: int,
                   vocab_size: int = 8, hidden_size: int = 64,
                   steps: int = 600, batch: int = 64, lr: float = 3e-3,
                   eval_batch: int = 500) -> dict:
    r"""Train one :class:`GRUSeq2Seq` to copy sequences of ``length``
    symbols and measure it on fresh ones.

    ``torch.manual_seed(seed)`` fixes the initial weights; the training
    batches come from a generator seeded with ``seed``, the test batch
    from one seeded with ``10_000 + seed``. Training: AdamW at ``lr``,
    gradients clipped at norm 1 (the course's :func:`~course_lib.training.
    train`).

    Returns:
        ``{"token_accuracy", "sequence_accuracy", "final_loss",
        "loss_curve"}``: the share of symbols and of whole sequences that
        greedy decoding gets right on ``eval_batch`` test sequences, the
        mean training loss (nats) of the last 50 steps, and the loss at 20
        points of training.
    """
    check_int("length", length, minimum=1)
    check_bool("attention", attention)
    check_int("seed", seed, minimum=0)
    check_int("steps", steps, minimum=1)
    check_int("eval_batch", eval_batch, minimum=1)
    torch.manual_seed(seed)
    model = GRUSeq2Seq(vocab_size=vocab_size, hidden_size=hidden_size,
                       attention=attention)
    g = torch.Generator().manual_seed(seed)
    batches = (make_copy_batch(batch, length, vocab_size=vocab_size,
                               generator=g) for _ in range(steps))
    history = train(model, batches, steps=steps, lr=lr, clip_norm=1.0,
                    loss_fn=_copy_loss, seed=None, progress=False)
    src, _, _ = make_copy_batch(
        eval_batch, length, vocab_size=vocab_size,
        generator=torch.Generator().manual_seed(10_000 + seed))
    right = greedy_copy(model, src) == src                   # (B, S)
    every = max(1, steps // 20)
    return {"token_accuracy": right.float().mean().item(),
            "sequence_accuracy": right.all(1).float().mean().item(),
            "final_loss": sum(history.loss[-50:]) / len(history.loss[-50:]),
            "loss_curve": history.loss[every - 1::every]}


LENGTHS = [5, 10, 20]
SEEDS = [0, 1, 2]


def make_sweep() -> Sweep:
    """Copy lengths 5, 10 and 20, with and without attention, seeds 0, 1,
    2."""
    settings = [{"length": n, "attention": a}
                for a in (False, True) for n in LENGTHS]
    return run_sweep(
        "seq2seq_bottleneck", run_bottleneck, settings, SEEDS,
        description="GRU encoder-decoder (d_h = 64) trained to copy "
                    "random sequences of 8 symbols, with and without "
                    "dot-product attention; greedy accuracy on 500 test "
                    "sequences",
        meta={"vocab_size": 8, "hidden_size": 64, "steps": 600,
              "batch": 64, "lr": 3e-3, "eval_batch": 500},
        progress=True)
