r"""What residual connections, the place of the norm and the initialisation
do to a deep stack of blocks (chapter 6), measured at initialisation and
in a short training run.

- :func:`ffn_stack_grads`: the gradient norm at the input of every layer
  of a stack of FFN sub-layers, plain or residual, with no norm, post-norm
  ($x \leftarrow \mathrm{LN}(x + f(x))$) or pre-norm
  ($x \leftarrow x + f(\mathrm{LN}(x))$); :func:`apply_sublayer` is one
  step of it. Without the residual the gradient shrinks by a constant
  factor per layer; with it the identity term of
  $\prod_l (I + J_l)$ keeps it of the same order at every depth.
- :func:`layer_stats`: the paper's post-norm encoder layers against
  pre-norm blocks (:func:`make_stack`): each layer's parameter-gradient
  norm and the RMS of the residual stream after it.
- :class:`StackLM` and :func:`train_stack`: a small language model with
  or without residuals, trained on a synthetic Markov language.
- :func:`gpt2_like` and :func:`stream_rms`: the residual stream's RMS
  after every block of a GPT-2-style model, with and without the
  $0.02/\sqrt{2N}$ initialisation of the projections that write into it.
- :func:`init_stats` and :func:`make_sweep`: the measurements at
  initialisation above for one seed, and over the seeds 0-4
  (``course_lib/data/experiments/block_stats.json``): an initialisation
  is one draw, and its numbers vary with the seed.

Shape letters: K copies of one batch (one per depth), B batch, T length,
D = ``d_model``, V vocabulary.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .._util.threads import small_ops
from .._util.validation import (check_batch, check_bool, check_choice,
                                check_int, check_type)
from . import sweeps
from ..model import block, decoder_lm, transformer
from ..model.masks import causal_mask
from ..model.mha import MultiHeadAttention
from ..tasks import markov
from ..training import History, next_token_loss, train

__all__ = ["NORMS", "apply_sublayer", "ffn_stack_grads", "make_stack",
           "layer_stats", "StackLM", "train_stack", "gpt2_like",
           "stream_rms", "INIT_KINDS", "INIT_DEPTHS", "init_stats",
           "make_sweep"]

NORMS = ("none", "post", "pre")   # where a stack of sub-layers puts its norm


def _check_depths(depths) -> list[int]:
    """``depths`` must be a non-empty sequence of distinct ints in
    [1, 1024] (a deeper stack is a typo, not an experiment)."""
    if not isinstance(depths, Sequence) or isinstance(depths, str):
        raise TypeError(f"depths must be a sequence of ints, got "
                        f"{type(depths).__name__}")
    if len(depths) == 0:
        raise ValueError("depths must not be empty")
    for n in depths:
        check_int("each of depths", n, minimum=1, maximum=1024)
    if len(set(depths)) != len(depths):
        raise ValueError(f"depths must be distinct, got {list(depths)}")
    return list(depths)


def apply_sublayer(h: torch.Tensor, f: nn.Module, *, residual: bool,
                   norm: str) -> torch.Tensor:
    r"""One sub-layer $f$ applied to the stream $h$ in one arrangement.

    Plain: $h \leftarrow f(h)$; residual: $h \leftarrow h + f(h)$.
    ``norm="post"`` normalises the result, $\mathrm{LN}(h + f(h))$ (the
    paper); ``norm="pre"`` normalises only the branch input,
    $h + f(\mathrm{LN}(h))$ (GPT-2, Llama). LayerNorm without gain or
    bias, over the last axis.

    Args:
        h: the stream (..., D); f: the sub-layer, (..., D) -> (..., D).
        residual: add the input back; norm: one of :data:`NORMS`.
    Returns:
        the new stream (..., D).
    """
    check_bool("residual", residual)
    check_choice("norm", norm, NORMS)
    D = h.shape[-1]
    y = f(F.layer_norm(h, (D,)) if norm == "pre" else h)         # (..., D)
    h = h + y if residual else y
    if norm == "post":
        h = F.layer_norm(h, (D,))
    return h


@small_ops()  # many small layers: one thread, see course_lib._util.threads
def ffn_stack_grads(depths: Sequence[int], *, residual: bool,
                    norm: str = "none", seed: int = 0,
                    d_model: int = 64) -> dict[int, list[float]]:
    r"""Gradient norms at the input of every layer of FFN stacks, at init.

    Seeds torch's global generator with ``seed`` and builds
    ``max(depths)`` ReLU FFNs ($D \to 4D \to D$, torch's default
    initialisation); the stack of depth $n$ is the first $n$ of them. The
    loss of the depth-$n$ stack is $\mathcal L_n = g \cdot x_n$ for one
    fixed random $g$ (32 rows), with a final LayerNorm for pre-norm. An
    FFN never mixes rows, so the depths run as K independent copies of
    one input batch: one forward and one backward pass serve them all.

    Args:
        depths: distinct stack depths $n \ge 1$.
        residual, norm: the arrangement (:func:`apply_sublayer`).
        seed: seed of the weights and of the input and $g$.
        d_model: D.
    Returns:
        {n: [$\lVert \partial \mathcal L_n / \partial x_l \rVert$ for the
        input $x_l$ of layers 1..n]}; entry 0 is the stack's input.
    """
    depths = _check_depths(depths)
    check_bool("residual", residual)
    check_choice("norm", norm, NORMS)
    check_int("seed", seed, minimum=0)
    check_int("d_model", d_model, minimum=1, maximum=4096)
    torch.manual_seed(seed)
    ffns = [block.FeedForward(d_model, 4 * d_model)
            for _ in range(max(depths))]
    g = torch.randn(32, d_model)                  # fixed upstream gradient
    x = torch.randn(32, d_model).repeat(len(depths), 1, 1)   # (K, 32, D)
    x.requires_grad_(True)
    h, inputs, loss = x, [], 0.0
    for l, f in enumerate(ffns, start=1):
        h.retain_grad()
        inputs.append(h)
        h = apply_sublayer(h, f, residual=residual, norm=norm)  # (K, 32, D)
        for k, n in enumerate(depths):
            if n == l:                            # copy k ends here
                out = F.layer_norm(h[k], (d_model,)) if norm == "pre" \
                    else h[k]
                loss = loss + (g * out).sum()     # L_k = g . x_n
    loss.backward()
    return {n: [inp.grad[k].norm().item() for inp in inputs[:n]]
            for k, n in enumerate(depths)}


def make_stack(kind: str, n_layers: int, *, d_model: int = 64,
               n_heads: int = 4) -> list[nn.Module]:
    r"""``n_layers`` freshly initialised layers of one arrangement.

    ``"post"``: the paper's ``transformer.EncoderLayer``,
    $x \leftarrow \mathrm{LN}(x + f(x))$ per sub-layer; ``"pre"``: the
    pre-norm ``block.DecoderBlock``, $x \leftarrow x + f(\mathrm{LN}(x))$.
    Both have the same multi-head attention ($h$ = ``n_heads``), the same
    ReLU FFN ($D \to 4D \to D$) and no dropout.

    Args:
        kind: "post" or "pre"; n_layers: N; d_model: D; n_heads: h.
    Returns:
        a list of N modules, each (B, T, D) -> (B, T, D).
    """
    check_choice("kind", kind, ("post", "pre"))
    check_int("n_layers", n_layers, minimum=1, maximum=1024)
    check_int("d_model", d_model, minimum=1, maximum=4096)
    check_int("n_heads", n_heads, minimum=1)
    if d_model % n_heads:
        raise ValueError(f"d_model must be divisible by n_heads, got "
                         f"d_model={d_model}, n_heads={n_heads}")
    if kind == "post":
        return [transformer.EncoderLayer(d_model, n_heads, 4 * d_model,
                                         dropout=0.0)
                for _ in range(n_layers)]
    return [block.DecoderBlock(
        d_model, attention=MultiHeadAttention(d_model, n_heads),
        ffn=block.FeedForward(d_model, 4 * d_model), norm="layer")
        for _ in range(n_layers)]


@small_ops()  # many small layers: one thread, see course_lib._util.threads
def layer_stats(kind: str, depths: Sequence[int] = (6, 12, 24), *,
                seed: int = 0, d_model: int = 64
                ) -> dict[int, tuple[list[float], list[float]]]:
    r"""Per-layer gradient norms and stream RMS of a stack at init.

    Seeds torch's global generator with ``seed``, builds
    ``max(depths)`` layers with :func:`make_stack` (4 heads) and feeds
    one random batch $x$ (B = 2, T = 16) with the loss
    $\mathcal L = g \cdot \text{output}$ (a final LayerNorm for
    pre-norm); $x$ and $g$ come from a generator seeded ``100 + seed``.
    The depth-$n$ stack is the first $n$ layers; the depths run as copies
    along the batch axis (attention never mixes batch elements), and one
    backward pass per depth gives its gradients.

    Args:
        kind: "post" or "pre"; depths: distinct depths $n \ge 1$.
        seed: seed of the weights; d_model: D.
    Returns:
        {n: (norm of the gradient of all parameters of each layer 1..n,
        RMS of the residual stream after each layer 1..n)}.
    """
    check_choice("kind", kind, ("post", "pre"))
    depths = _check_depths(depths)
    check_int("seed", seed, minimum=0)
    check_int("d_model", d_model, minimum=4, maximum=4096)
    torch.manual_seed(seed)
    layers = make_stack(kind, max(depths), d_model=d_model)
    B = 2
    gen = torch.Generator().manual_seed(100 + seed)
    x = torch.randn(B, 16, d_model, generator=gen)      # (B, T, D)
    g = torch.randn(B, 16, d_model, generator=gen)      # L = g . output
    h = x.repeat(len(depths), 1, 1)                     # (K*B, T, D)
    outs, rms = {}, []
    for l, layer in enumerate(layers, start=1):
        h = layer(h)                                    # (K*B, T, D)
        rms.append(h[:B].pow(2).mean().sqrt().item())
        if l in depths:
            k = depths.index(l)
            outs[l] = h[B * k: B * k + B]               # copy k, (B, T, D)
    result = {}
    for n in depths:
        out = F.layer_norm(outs[n], (d_model,)) if kind == "pre" \
            else outs[n]
        params = [list(layer.parameters()) for layer in layers[:n]]
        grads = torch.autograd.grad((g * out).sum(), sum(params, []),
                                    retain_graph=True)
        norms, i = [], 0
        for p in params:                     # regroup the grads per layer
            norms.append(torch.cat([t.flatten() for t in
                                    grads[i:i + len(p)]]).norm().item())
            i += len(p)
        result[n] = (norms, rms[:n])
    return result


class StackLM(nn.Module):
    r"""A decoder-only LM of ``n_layers`` (attention, FFN) pairs, with or
    without residual connections.

    ``residual=True``: $x \leftarrow x + f(\mathrm{LN}(x))$ for each
    sub-layer $f$ (pre-norm); ``residual=False``:
    $x \leftarrow \mathrm{LN}(f(x))$, a plain stack normalised after
    each sub-layer. Learned positions, causal 4-head attention, ReLU FFNs
    of width 4D, a final LayerNorm and a linear head; torch's default
    initialisation.

    Args:
        residual: with residual connections.
        n_layers: number of (attention, FFN) pairs.
        vocab_size: V; d_model: D; max_len: longest input T.
    """

    def __init__(self, residual: bool, n_layers: int = 8, *,
                 vocab_size: int = 16, d_model: int = 64,
                 max_len: int = 32):
        check_bool("residual", residual)
        check_int("n_layers", n_layers, minimum=1, maximum=1024)
        check_int("vocab_size", vocab_size, minimum=1)
        check_int("d_model", d_model, minimum=4, maximum=4096)
        if d_model % 4:
            raise ValueError(f"d_model must be divisible by the 4 heads, "
                             f"got {d_model}")
        check_int("max_len", max_len, minimum=1)
        super().__init__()
        D = d_model
        self.residual = residual
        self.embed = nn.Embedding(vocab_size, D)
        self.pos = nn.Embedding(max_len, D)            # learned positions
        self.attn = nn.ModuleList(MultiHeadAttention(D, 4)
                                  for _ in range(n_layers))
        self.ffn = nn.ModuleList(block.FeedForward(D, 4 * D)
                                 for _ in range(n_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(D)
                                   for _ in range(2 * n_layers + 1))
        self.head = nn.Linear(D, vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) token ids -> logits (B, T, V)."""
        T = idx.shape[1]
        h = self.embed(idx) + self.pos.weight[:T]      # (B, T, D)
        mask = causal_mask(T)
        norms = iter(self.norms)
        for attn, ffn in zip(self.attn, self.ffn):
            if self.residual:                  # x = x + f(LN(x))
                h = h + attn(next(norms)(h), mask)
                h = h + ffn(next(norms)(h))
            else:                              # x = LN(f(x))
                h = next(norms)(attn(h, mask))
                h = next(norms)(ffn(h))
        return self.head(next(norms)(h))               # (B, T, V)


@small_ops()  # small layers: one thread, see course_lib._util.threads
def train_stack(residual: bool, source: markov.MarkovSource,
                val_batch, *, seed: int = 0, steps: int = 200,
                lr: float = 3e-3) -> History:
    """Train a :class:`StackLM` on sequences of ``source``.

    Seeds torch's global generator with ``seed``, builds the model
    (8 blocks, D = 64, V = ``source.vocab_size``) and trains it with
    ``training.train``: batches of 16 sequences of length 32 from
    ``markov.lm_batches`` (seeded ``seed``), AdamW at ``lr`` with 30
    warmup steps and a cosine schedule, the loss on ``val_batch``
    evaluated every 20 steps.

    Args:
        residual: with residual connections (:class:`StackLM`).
        source: the Markov language.
        val_batch: (inputs, targets), (B, T) each, T <= 32.
        seed: seed of the weights and of the training batches.
        steps: training steps (>= 30, the warmup); lr: peak learning
            rate.
    Returns:
        the run's ``History`` (``val_step``, ``val_loss``, ...).
    """
    check_bool("residual", residual)
    check_type("source", source, markov.MarkovSource, "a MarkovSource")
    check_batch("val_batch", val_batch, ("inputs", "targets"))
    check_int("seed", seed, minimum=0)
    check_int("steps", steps, minimum=30)   # at least the 30 warmup steps
    torch.manual_seed(seed)
    model = StackLM(residual, vocab_size=source.vocab_size)
    return train(model, markov.lm_batches(source, batch_size=16, length=32,
                                          seed=seed),
                 steps=steps, lr=lr, warmup_steps=30, schedule="cosine",
                 eval_fn=lambda m: next_token_loss(m, val_batch).item(),
                 eval_every=20, progress=False)


def gpt2_like(n_layers: int, *, seed: int = 0) -> decoder_lm.DecoderLM:
    """A small GPT-2-style ``DecoderLM`` (V = 100, D = 64, 4 heads, learned
    positions up to 32, LayerNorm, GELU) with ``n_layers`` blocks, built
    after seeding torch's global generator with ``seed``; GPT-2's
    initialisation, as ``DecoderLM`` always does."""
    check_int("n_layers", n_layers, minimum=1, maximum=1024)
    check_int("seed", seed, minimum=0)
    torch.manual_seed(seed)
    return decoder_lm.DecoderLM(decoder_lm.DecoderLMConfig(
        vocab_size=100, hidden_size=64, num_attention_heads=4,
        num_hidden_layers=n_layers, max_position_embeddings=32,
        position="learned", norm="layer", hidden_act="gelu"))


def stream_rms(n_layers: int = 24, *, scaled: bool,
               seed: int = 0) -> list[float]:
    r"""RMS of the residual stream after each block of :func:`gpt2_like`,
    at initialisation, on one batch of random tokens (B = 8, T = 32, from
    a generator seeded 0).

    ``scaled=True`` keeps GPT-2's init, in which the projections that
    write into the stream (``o_proj``, ``linear2``) have standard
    deviation $0.02/\sqrt{2N}$; ``scaled=False`` redraws them at 0.02
    like every other weight.

    Args:
        n_layers: N; scaled: keep the $1/\sqrt{2N}$; seed: model seed.
    Returns:
        N floats: the stream's RMS after blocks 1..N.
    """
    check_int("n_layers", n_layers, minimum=1, maximum=1024)
    check_bool("scaled", scaled)
    m = gpt2_like(n_layers, seed=seed)
    if not scaled:                  # undo the 1/sqrt(2N): all at 0.02
        for name, p in m.named_parameters():
            if name.endswith(("o_proj.weight", "linear2.weight")):
                nn.init.normal_(p, std=0.02)
    rms = []
    hooks = [b.register_forward_hook(
        lambda mod, inp, out: rms.append(out.pow(2).mean().sqrt().item()))
        for b in m.layers]
    with torch.no_grad():
        m(torch.randint(100, (8, 32), generator=torch.Generator()
                        .manual_seed(0)))
    for hook in hooks:
        hook.remove()
    return rms


# the measurements at initialisation that init_stats runs for one seed
INIT_KINDS = ("plain_ffn", "residual_ffn", "post", "pre", "scaled",
              "unscaled")
INIT_DEPTHS = (1, 2, 4, 8, 16, 32)       # depths of the FFN stacks


def init_stats(kind: str, *, seed: int) -> dict:
    r"""One measurement at initialisation, for one seed.

    - ``"plain_ffn"``, ``"residual_ffn"``: :func:`ffn_stack_grads` at the
      depths :data:`INIT_DEPTHS` without norm; ``"input_grad"``: the
      gradient norm at each stack's input.
    - ``"post"``, ``"pre"``: :func:`layer_stats` at depths 6, 12, 24;
      ``"grad_24"`` and ``"rms_24"``: each layer's parameter-gradient
      norm and stream RMS in the 24-layer stack; ``"last_grad"``: the
      last layer's gradient norm at each depth; ``"shrink"``: its ratio,
      depth 24 over depth 6.
    - ``"scaled"``, ``"unscaled"``: :func:`stream_rms` of 24 and 48
      blocks with and without the $0.02/\sqrt{2N}$ init; ``"rms_24"``,
      and ``"growth_24"``, ``"growth_48"``: RMS after the last block over
      RMS after the first.

    Args:
        kind: one of :data:`INIT_KINDS`. seed: seed of the weights.
    Returns:
        a dict of floats and lists of floats.
    """
    check_choice("kind", kind, INIT_KINDS)
    check_int("seed", seed, minimum=0)
    if kind.endswith("_ffn"):
        grads = ffn_stack_grads(INIT_DEPTHS, residual=kind == "residual_ffn",
                                seed=seed)
        return {"input_grad": [grads[n][0] for n in INIT_DEPTHS]}
    if kind in ("post", "pre"):
        stats = layer_stats(kind, (6, 12, 24), seed=seed)
        last = [stats[n][0][-1] for n in (6, 12, 24)]
        return {"grad_24": stats[24][0], "rms_24": stats[24][1],
                "last_grad": last, "shrink": last[2] / last[0]}
    r24 = stream_rms(24, scaled=kind == "scaled", seed=seed)
    r48 = stream_rms(48, scaled=kind == "scaled", seed=seed)
    return {"rms_24": r24, "growth_24": r24[-1] / r24[0],
            "growth_48": r48[-1] / r48[0]}


def make_sweep() -> sweeps.Sweep:
    """:func:`init_stats` for every kind and the seeds 0-4."""
    return sweeps.run_sweep(
        "block_stats", init_stats, [{"kind": k} for k in INIT_KINDS],
        seeds=range(5),
        description="Gradients and residual-stream RMS at initialisation: "
                    "FFN stacks with and without residuals, post- against "
                    "pre-norm stacks, GPT-2's scaled init against all "
                    "weights at 0.02; five initialisations each.",
        meta={"ffn_depths": list(INIT_DEPTHS), "layer_depths": [6, 12, 24],
              "d_model": 64})
