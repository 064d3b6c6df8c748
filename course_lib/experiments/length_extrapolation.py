r"""Length extrapolation, measured: five position schemes trained at one
length and tested at longer ones.

Every scheme gives a causal decoder its sense of order in another place:

- **NoPE**: nothing at all; only the causal mask (query $t$ sees keys
  $0..t$) carries order (Kazemnejad et al. 2023);
- **learned**: a trained vector $P_p$ per position added to the token
  embedding, $h^0_p = E[x_p] + P_p$ (GPT-2). It has no trained row past
  the training length $L$: at evaluation, positions beyond it are
  *clamped* to $L - 1$, the last row it has;
- **sinusoidal**: the fixed table of Vaswani et al. added the same way,
  $h^0_p = E[x_p] + c\,PE(p)$, scaled by $c = (D/2)^{-1/2}$ to norm 1
  per position (the raw table's norm $\sqrt{D/2}$ would swamp token
  embeddings initialised at 0.02; of the scales 0.028, 0.2 and 1 tried at
  seed 0, 0.028 never learned the task in 300 steps and 1 learned it
  worst);
- **RoPE**: queries and keys rotated by $p\,\theta_i$ in every layer (Su
  et al. 2021), as in Llama;
- **ALiBi**: no position vector; head $h$ subtracts $m_h\,(i - j)$ from
  the score of query $i$ for key $j$ (Press et al. 2022).

The task is chapter 7's synthetic language: a Markov chain of order 2
(:mod:`course_lib.tasks.markov`), whose next symbol depends on the last
two *in order*, by the same rule at every position and every length. Its
true conditional probabilities are known, so the loss of a model at
position $p$ is compared with the best possible one,

$$\Delta_p = \mathbb{E}\big[-\log q_\theta(x_{p+1} \mid x_{\le p})\big]
- \mathbb{E}\big[-\log P(x_{p+1} \mid x_{p-1}, x_p)\big] \;\ge\; 0
\quad\text{(nats)},$$

the *excess loss*, averaged over a fixed batch of held-out sequences. A
causal model's output at position $p$ depends on the first $p + 1$
tokens only, so one pass over sequences of length $4L$ gives the
evaluation at length $L$ (mean of $\Delta_p$ over $1 \le p < L$; input 0
has one symbol of context, too few for the rule), $2L$ and $4L$ at once.

The module ends with the closed forms that stretch a trained RoPE model
instead: the per-pair frequencies of Position Interpolation and of
NTK-aware scaling (YaRN's:
:func:`~course_lib.model.yarn.yarn_frequencies`).

Shape letters: B batch, T sequence length (L at training, up to 4L at
evaluation), D model width, H heads, d_k = D / H head width, d rotary
width, P = d/2 RoPE pairs.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .._util.threads import small_ops
from .._util.validation import (
    check_choice,
    check_divides,
    check_even,
    check_int,
    check_real,
    check_sizes,
    check_type,
)
from ..model.alibi import alibi_slopes
from ..model.decoder_lm import DecoderLM, DecoderLMConfig
from ..model.masks import causal_mask
from ..model.mha import MultiHeadAttention, merge_heads, split_heads
from ..model.sinusoidal import sinusoidal_encoding
from ..tasks.markov import (
    lm_batches,
    random_markov_source,
    sample_markov,
    token_nll,
)
from ..training import train
from .sweeps import Sweep, run_sweep

__all__ = ["SCHEMES", "ALiBiAttention", "build_model", "excess_loss",
           "run_length_extrapolation", "make_sweep", "pi_frequencies",
           "ntk_frequencies"]

#: The position schemes compared, in the order the chapter shows them.
SCHEMES = ("nope", "learned", "sinusoidal", "rope", "alibi")

# Chapter 7's language: 16 symbols, order 2, 3 successors per context.
_VOCAB, _ORDER = 16, 2
# The fixed held-out batch every model is evaluated on.
_EVAL_SEQUENCES, _EVAL_SEED = 256, 10_000


class ALiBiAttention(nn.Module):
    r"""Causal self-attention with ALiBi's linear distance penalty.

    $$\mathrm{head}_h = \mathrm{softmax}\Big(\frac{Q_h K_h^\top}
    {\sqrt{d_k}} - m_h\,(i - j)\Big) V_h, \qquad j \le i,$$

    with the fixed slopes $m_h$ of :func:`~course_lib.model.alibi.
    alibi_slopes` ($m_h = 2^{-8h/H}$): the projections and head layout of
    :class:`~course_lib.model.mha.MultiHeadAttention`, no position
    vector anywhere. Self-attention without a cache only.

    Args:
        d_model: model width $D$ (divisible by ``n_heads``).
        n_heads: heads $H$.
        bias: biases on the four projections.
    """

    def __init__(self, d_model: int, n_heads: int, *,
                 bias: bool = False) -> None:
        super().__init__()
        check_sizes(d_model=d_model, n_heads=n_heads)
        check_divides("d_model", d_model, "n_heads", n_heads)
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)   # W^Q
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)   # W^K
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)   # W^V
        self.o_proj = nn.Linear(d_model, d_model, bias=bias)   # W^O
        self.register_buffer("slopes", alibi_slopes(n_heads),
                             persistent=False)                 # (H,) m_h

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                *, context: torch.Tensor | None = None,
                positions: torch.Tensor | None = None,
                cache=None) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D); ``mask`` (T, T) bool, True = may
        attend (the causal mask is always applied as well)."""
        if context is not None or cache is not None:
            raise ValueError("ALiBiAttention is self-attention without a "
                             "cache: pass context=None and cache=None")
        B, T, D = x.shape
        q = split_heads(self.q_proj(x), self.n_heads)          # (B, H, T, d_k)
        k = split_heads(self.k_proj(x), self.n_heads)          # (B, H, T, d_k)
        v = split_heads(self.v_proj(x), self.n_heads)          # (B, H, T, d_k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        pos = torch.arange(T, device=x.device)
        dist = (pos[:, None] - pos[None, :]).to(scores.dtype)  # (T, T): i - j
        # ALiBi: s_ij - m_h (i - j), one slope per head
        scores = scores - self.slopes[:, None, None] * dist    # (B, H, T, T)
        allowed = causal_mask(T, T, device=x.device)           # (T, T)
        if mask is not None:
            allowed = allowed & mask
        scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores, dim=-1)                # (B, H, T, T)
        return self.o_proj(merge_heads(weights @ v))           # (B, T, D)


def build_model(scheme: str, *, max_length: int, hidden_size: int = 32,
                num_attention_heads: int = 4,
                num_hidden_layers: int = 2) -> DecoderLM:
    r"""A small Llama-style :class:`~course_lib.model.decoder_lm.DecoderLM`
    (RMSNorm, SwiGLU) whose positions come from ``scheme``.

    ``"rope"`` is the model's default and ``"learned"`` its GPT-2 option;
    ``"sinusoidal"`` is the learned table replaced by the fixed table,
    scaled to norm 1 per position, and frozen; ``"nope"`` and ``"alibi"``
    swap the attention of every layer (no rotation, or
    :class:`ALiBiAttention`).

    Args:
        scheme: one of :data:`SCHEMES`.
        max_length: the longest sequence it will read (rows of a table).
        hidden_size, num_attention_heads, num_hidden_layers: $D$, $H$, $N$.
    """
    check_choice("scheme", scheme, SCHEMES)
    check_int("max_length", max_length, minimum=1)
    D, H = hidden_size, num_attention_heads
    config = DecoderLMConfig(
        vocab_size=_VOCAB, hidden_size=D, num_attention_heads=H,
        num_hidden_layers=num_hidden_layers,
        max_position_embeddings=max_length,
        position="learned" if scheme in ("learned", "sinusoidal")
        else "rope")
    factory = {"nope": lambda i: MultiHeadAttention(D, H, bias=False),
               "alibi": lambda i: ALiBiAttention(D, H)}.get(scheme)
    model = DecoderLM(config, attention_factory=factory)
    if scheme == "sinusoidal":
        table = model.embed_positions.weight                   # (max_len, D)
        with torch.no_grad():
            # c PE(p), c = (D/2)^(-1/2): norm 1 at every position
            table.copy_(sinusoidal_encoding(max_length, D) / math.sqrt(D / 2))
        table.requires_grad_(False)           # fixed: the optimizer skips it
    return model


@torch.no_grad()
def excess_loss(model: nn.Module, seqs: torch.Tensor, floor: torch.Tensor,
                *, positions: torch.Tensor | None = None) -> torch.Tensor:
    r"""Per-position excess loss $\Delta_p$ of ``model`` on ``seqs``.

    Args:
        model: a :class:`~course_lib.model.decoder_lm.DecoderLM`.
        seqs: ``(B, T + 1)`` symbol ids; inputs are the first T.
        floor: ``(B, T - 1)`` true $-\log P$ of the targets of inputs
            $1..T-1$ (:func:`~course_lib.tasks.markov.token_nll`).
        positions: ``(T,)`` positions handed to the model (default
            $0..T-1$).

    Returns:
        ``(T - 1,)`` float64: $\Delta_p$ for $p = 1, \dots, T - 1$ (input
        0 has only one symbol of context).
    """
    check_type("model", model, nn.Module, "a torch.nn.Module")
    check_type("seqs", seqs, torch.Tensor, "a torch.Tensor")
    check_type("floor", floor, torch.Tensor, "a torch.Tensor")
    if seqs.dim() != 2 or tuple(floor.shape) != (seqs.shape[0],
                                                 seqs.shape[1] - 2):
        raise ValueError(f"seqs must be (B, T + 1) and floor (B, T - 1), "
                         f"got {tuple(seqs.shape)} and "
                         f"{tuple(floor.shape)}")
    model.eval()
    logits = model(seqs[:, :-1], positions)                    # (B, T, V)
    log_q = torch.log_softmax(logits.double(), dim=-1)         # (B, T, V)
    nll = -log_q.gather(-1, seqs[:, 1:, None])[..., 0]         # (B, T)
    return (nll[:, 1:] - floor).mean(0)                        # (T - 1,)


@small_ops()
def run_length_extrapolation(*, scheme: str, seed: int, length: int = 32,
                             steps: int = 300, batch_size: int = 32,
                             lr: float = 1e-2, factor: int = 4,
                             bins: int = 16) -> dict:
    r"""Train one scheme at ``length`` and evaluate it up to
    ``factor * length``: one cell of the sweep.

    Training is chapter 7's recipe (:func:`~course_lib.training.train`,
    AdamW, warmup then cosine, clipping at 1, weight decay 0.1) on fresh
    batches of the order-2 language. ``seed`` sets the initialisation,
    the training data and the dropout stream; the held-out batch (256
    sequences of length ``factor * length``) is the same for every seed.

    Returns:
        ``{"excess_L", "excess_2L", "excess_4L"}`` (mean $\Delta_p$ over
        the positions of a sequence of that length), ``"excess_beyond"``
        (over positions $L .. 4L - 1$ only), ``"train_loss"`` (mean of
        the last 20 steps, nats) and ``"curve"``: $\Delta_p$ averaged over
        ``bins`` equal blocks of positions $1 .. 4L - 1$.
    """
    check_choice("scheme", scheme, SCHEMES)
    check_int("seed", seed, minimum=0)
    check_int("length", length, minimum=4)
    check_int("steps", steps, minimum=1)
    check_int("batch_size", batch_size, minimum=1)
    check_real("lr", lr, positive=True)
    check_int("factor", factor, minimum=2, maximum=16)
    check_int("bins", bins, minimum=1, maximum=50)
    source = random_markov_source(vocab_size=_VOCAB, order=_ORDER, seed=0)
    T = factor * length
    torch.manual_seed(seed)
    model = build_model(scheme, max_length=T)
    history = train(model, lm_batches(source, batch_size=batch_size,
                                      length=length, seed=seed + 1),
                    steps=steps, lr=lr, warmup_steps=steps // 10,
                    schedule="cosine", weight_decay=0.1, clip_norm=1.0,
                    seed=seed, progress=False)
    g = torch.Generator().manual_seed(_EVAL_SEED)
    seqs = sample_markov(source, n_sequences=_EVAL_SEQUENCES, length=T + 1,
                         generator=g)                          # (B, T + 1)
    floor = token_nll(source, seqs)                            # (B, T - 1)
    # the learned table has no trained row at L or beyond: clamp
    positions = (torch.arange(T).clamp(max=length - 1)
                 if scheme == "learned" else None)
    delta = excess_loss(model, seqs, floor, positions=positions)  # (T - 1,)
    # delta[p - 1] is position p
    mean_to = {n: delta[: n * length - 1].mean().item()
               for n in (1, 2, factor)}
    curve = [c.mean().item() for c in delta.tensor_split(bins)]
    return {"excess_L": mean_to[1], "excess_2L": mean_to[2],
            f"excess_{factor}L": mean_to[factor],
            "excess_beyond": delta[length - 1:].mean().item(),
            "train_loss": sum(history.loss[-20:]) / len(history.loss[-20:]),
            "curve": curve}


def make_sweep(seeds=(0, 1, 2)) -> Sweep:
    """Every scheme of :data:`SCHEMES` over ``seeds`` (defaults)."""
    return run_sweep(
        "length_extrapolation", run_length_extrapolation,
        [{"scheme": s} for s in SCHEMES], seeds,
        description="A 2-layer decoder (D = 32, 4 heads) trained on the "
                    "order-2 Markov language at length 32, excess loss "
                    "over the true conditional entropy at lengths 32, 64 "
                    "and 128, per position scheme.",
        meta={"length": 32, "steps": 300, "batch_size": 32, "factor": 4,
              "hidden_size": 32, "num_attention_heads": 4,
              "num_hidden_layers": 2, "eval_sequences": _EVAL_SEQUENCES,
              "bins": 16, "learned_beyond_L": "positions clamped to L - 1",
              "sinusoidal_scale": "1 / sqrt(hidden_size / 2)"},
        progress=True)


# ------------------------------------------- stretching RoPE: per-pair factors
def pi_frequencies(d: int, *, base: float, factor: float) -> torch.Tensor:
    r"""Position Interpolation (Chen et al. 2023): positions divided by
    $s$, i.e. every frequency, $\theta'_i = \theta_i / s$.

    Returns:
        float64 ``(d/2,)``.
    """
    check_even("d", d)
    check_real("base", base, minimum=1.0000001)
    check_real("factor", factor, minimum=1)
    i = torch.arange(d // 2, dtype=torch.float64)              # (P,)
    return base ** (-2 * i / d) / factor                       # (P,)


def ntk_frequencies(d: int, *, base: float, factor: float) -> torch.Tensor:
    r"""NTK-aware scaling (bloc97 2023): the base raised to
    $b' = b\,s^{d/(d-2)}$, so

    $$\frac{\theta'_i}{\theta_i} = s^{-\frac{d}{d-2}\cdot\frac{2i}{d}}
    = s^{-2i/(d-2)}:$$

    pair 0 (fastest) keeps its frequency, the last pair $i = d/2 - 1$ is
    divided by exactly $s$, as under Position Interpolation.

    Returns:
        float64 ``(d/2,)``.
    """
    check_even("d", d)
    check_int("d", d, minimum=4)
    check_real("base", base, minimum=1.0000001)
    check_real("factor", factor, minimum=1)
    new_base = base * factor ** (d / (d - 2))
    i = torch.arange(d // 2, dtype=torch.float64)              # (P,)
    return new_base ** (-2 * i / d)                            # (P,)
