r"""The pre-norm block in one function, and four modern variants of it.

:func:`block_forward` is the whole pre-norm decoder block of GPT-2 as one
short function, computed from the weights of a
:class:`~course_lib.model.block.DecoderBlock`:

$$x \leftarrow x + \mathrm{Attn}(\mathrm{Norm}_1(x)), \qquad
x \leftarrow x + \mathrm{FFN}(\mathrm{Norm}_2(x)).$$

Models since GPT-2 change this block in small ways, each with a reason
and a cost:

- **parallel** (GPT-J, PaLM): attention and FFN read the same normalised
  input and both add to the stream,
  $x \leftarrow x + \mathrm{Attn}(\mathrm{Norm}(x)) +
  \mathrm{FFN}(\mathrm{Norm}(x))$ (:class:`ParallelBlock`). One norm
  fewer, and the input projections of both sub-layers can run as one
  matmul (PaLM reports about 15 % faster training at large scale);
- **no biases** (PaLM, Llama): the linear layers and the LayerNorms lose
  their bias vectors (:func:`remove_biases`);
- **QK-norm** (Qwen3, Gemma 3): RMSNorm on each head's queries and keys
  before the scores, so that with unit gains every logit
  $\hat q \cdot \hat k / \sqrt{d_k}$ lies in $[-\sqrt{d_k}, \sqrt{d_k}]$
  (:class:`QKNormAttention`, :mod:`course_lib.model.qk_norm`);
- **sandwich norm** (Gemma 2): a second norm on each sub-layer's output,
  before it is added to the stream,
  $x \leftarrow x + \mathrm{Norm}'(\mathrm{Attn}(\mathrm{Norm}(x)))$
  (:class:`SandwichBlock`), which bounds what one sub-layer can add.

:func:`to_variant` turns a GPT-2-style ``DecoderLM`` into each variant
*from its own parts*, so that every variant starts from the same weights;
:func:`train_variant` trains one variant for one seed on chapter 7's
synthetic Markov language, and :func:`make_sweep` runs them all over
three seeds (``course_lib/data/experiments/block_variants.json``).

Shape letters: B batch, H heads, T length (S = T keys in self-attention),
D = ``d_model``, d_k = D / H head width, V vocabulary.
"""
from __future__ import annotations

import math
import statistics
import time

import torch
from torch import nn

from .._util.threads import small_ops
from .._util.validation import (check_bool, check_choice, check_divides,
                                check_int, check_real, check_sizes,
                                check_type)
from ..model import decoder_lm
from ..model.block import DecoderBlock, FeedForward, RMSNorm, make_norm
from ..model.masks import causal_mask
from ..model.mha import (MultiHeadAttention, mask_to_4d, merge_heads,
                         split_heads)
from ..model.qk_norm import qk_norm_attention
from ..tasks import markov
from ..training import next_token_loss, train
from . import sweeps

__all__ = ["VARIANTS", "block_forward", "ParallelBlock", "SandwichBlock",
           "QKNormAttention", "remove_biases", "variant_lm", "to_variant",
           "attention_logits", "max_attention_logit", "train_variant",
           "step_times", "make_sweep"]

# the baseline (GPT-2's pre-norm block) and the four variants
VARIANTS = ("pre_norm", "parallel", "no_bias", "qk_norm", "sandwich")


# ------------------------------------------------------- the whole block
def block_forward(block: DecoderBlock, x: torch.Tensor,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""A pre-norm block's forward pass written out: attention, FFN, norms.

    The computation of ``block(x, mask)`` for a :class:`DecoderBlock`
    with a :class:`~course_lib.model.mha.MultiHeadAttention` (no RoPE,
    $g = h$) and a :class:`FeedForward`, in evaluation mode (no dropout):
    $x \leftarrow x + W^O\,\mathrm{softmax}(QK^\top/\sqrt{d_k} + M)V$ on
    $\mathrm{Norm}_1(x)$, then $x \leftarrow x +
    \mathrm{FFN}(\mathrm{Norm}_2(x))$.

    Args:
        block: supplies the weights.
        x: (B, T, D) residual stream.
        mask: None or bool (T, T), True where query t may read key s.
    Returns:
        (B, T, D), the block's output.
    """
    check_type("block", block, DecoderBlock, "a DecoderBlock")
    check_type("x", x, torch.Tensor, "a torch.Tensor")
    attn, ffn = block.attention, block.ffn
    if not isinstance(attn, MultiHeadAttention) or attn.rope is not None \
            or attn.n_kv_heads != attn.n_heads \
            or not isinstance(ffn, FeedForward):
        raise ValueError("block must hold a MultiHeadAttention without "
                         "RoPE or GQA and a FeedForward")
    B, T, D = x.shape
    H, d_k = attn.n_heads, D // attn.n_heads        # attn.scale = 1/sqrt(d_k)
    h = block.norm1(x)                                     # (B, T, D)
    q, k, v = (p(h).view(B, T, H, d_k).transpose(1, 2)     # (B, H, T, d_k)
               for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    scores = (q * attn.scale) @ k.transpose(-2, -1)        # (B, H, T, T)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v                  # (B, H, T, d_k)
    x = x + attn.o_proj(y.transpose(1, 2).reshape(B, T, D))  # (B, T, D)
    h = block.norm2(x)                                     # (B, T, D)
    return x + ffn.linear2(ffn.act(ffn.linear1(h)))        # (B, T, D)


# ------------------------------------------------------------ variants
class ParallelBlock(nn.Module):
    r"""Attention and FFN side by side on one norm (GPT-J, PaLM):

    $$x \leftarrow x + \mathrm{Attn}(\mathrm{Norm}(x)) +
    \mathrm{FFN}(\mathrm{Norm}(x)).$$

    In the sequential block the FFN reads $x + \mathrm{Attn}(\dots)$; here
    it reads the block's input, so the two sub-layers are independent and
    their input matmuls can be fused. Same call as :class:`DecoderBlock`.

    Args:
        d_model: D. attention, ffn: the sub-layers.
        norm: ``"layer"`` or ``"rms"``. norm_bias: LayerNorm bias.
        eps: norm epsilon (default $10^{-5}$ layer, $10^{-6}$ rms).
    """

    def __init__(self, d_model: int, *, attention: nn.Module,
                 ffn: nn.Module, norm: str = "layer", norm_bias: bool = True,
                 eps: float | None = None) -> None:
        super().__init__()
        for name, m in (("attention", attention), ("ffn", ffn)):
            check_type(name, m, nn.Module, "an nn.Module")
        self.norm = make_norm(norm, d_model, eps=eps, bias=norm_bias)
        self.attention = attention
        self.ffn = ffn

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                *, positions: torch.Tensor | None = None,
                cache=None) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D)."""
        h = self.norm(x)                                   # (B, T, D)
        a = self.attention(h, mask, positions=positions, cache=cache)
        return x + a + self.ffn(h)                         # (B, T, D)


class SandwichBlock(DecoderBlock):
    r"""A pre-norm block with a second norm on each sub-layer's output
    (Gemma 2's "sandwich"):

    $$x \leftarrow x + \mathrm{Norm}'_1(\mathrm{Attn}(\mathrm{Norm}_1(x))),
    \qquad x \leftarrow x + \mathrm{Norm}'_2(\mathrm{FFN}(\mathrm{Norm}_2
    (x))).$$

    What a sub-layer adds then has RMS $\gamma'$ whatever its weights
    (its gain, 1 at init), so no single layer can swamp the stream; the
    identity path itself stays un-normalised. Arguments as
    :class:`DecoderBlock`; the new norms are named as in Gemma 2.
    """

    def __init__(self, d_model: int, *, attention: nn.Module,
                 ffn: nn.Module, norm: str = "layer", norm_bias: bool = True,
                 eps: float | None = None, dropout: float = 0.0) -> None:
        super().__init__(d_model, attention=attention, ffn=ffn, norm=norm,
                         norm_bias=norm_bias, eps=eps, dropout=dropout)
        self.post_attention_layernorm = make_norm(norm, d_model, eps=eps,
                                                  bias=norm_bias)
        self.post_feedforward_layernorm = make_norm(norm, d_model, eps=eps,
                                                    bias=norm_bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                *, positions: torch.Tensor | None = None,
                cache=None) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D)."""
        a = self.attention(self.norm1(x), mask, positions=positions,
                           cache=cache)                    # (B, T, D)
        x = x + self.dropout(self.post_attention_layernorm(a))
        f = self.ffn(self.norm2(x))                        # (B, T, D)
        return x + self.dropout(self.post_feedforward_layernorm(f))


class QKNormAttention(nn.Module):
    r"""Multi-head self-attention with QK-norm (Qwen3, Gemma 3).

    The four projections of :class:`MultiHeadAttention` (same names, so
    its weights load by name), then
    :func:`~course_lib.model.qk_norm.qk_norm_attention`:
    $\hat q = \gamma_Q \odot q/\mathrm{rms}(q)$, $\hat k = \gamma_K \odot
    k/\mathrm{rms}(k)$ per head, $\mathrm{softmax}(\hat Q\hat K^\top /
    \sqrt{d_k} + M)V$. The gains ``q_norm``, ``k_norm`` (RMSNorm over
    $d_k$, shared by the heads, Qwen3's names) start at 1. Positions
    enter at the input (no RoPE hook) and there is no KV cache.

    Args:
        d_model: D. n_heads: H (divides D). bias: biases in the four
            projections. eps: $\epsilon$ of the two norms.
    """

    def __init__(self, d_model: int, n_heads: int, *, bias: bool = True,
                 eps: float = 1e-6) -> None:
        super().__init__()
        check_sizes(d_model=d_model, n_heads=n_heads)
        check_divides("d_model", d_model, "n_heads", n_heads)
        check_bool("bias", bias)
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)        # 1 / sqrt(d_k)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)   # W^Q
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)   # W^K
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)   # W^V
        self.o_proj = nn.Linear(d_model, d_model, bias=bias)   # W^O
        self.q_norm = RMSNorm(self.head_dim, eps=eps)    # gamma_Q, (d_k,)
        self.k_norm = RMSNorm(self.head_dim, eps=eps)    # gamma_K, (d_k,)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                *, context=None, positions=None,
                cache=None) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D); ``mask`` as for
        :class:`MultiHeadAttention`. ``positions`` is ignored (no RoPE);
        ``context`` (cross-attention) and ``cache`` are not supported."""
        if context is not None or cache is not None:
            raise ValueError("QKNormAttention is self-attention without a "
                             "KV cache: pass context=None and cache=None")
        B, T, _ = x.shape
        H = self.n_heads
        q, k, v = (split_heads(p(x), H)                    # (B, H, T, d_k)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        mask = mask_to_4d(mask, B, H, T, T)                # (B|1, H|1, T, T)
        out = qk_norm_attention(q, k, v, self.q_norm.weight,
                                self.k_norm.weight, mask,
                                eps=self.q_norm.eps)       # (B, H, T, d_k)
        return self.o_proj(merge_heads(out))               # (B, T, D)


def remove_biases(model: nn.Module) -> nn.Module:
    r"""Drop the bias of every ``nn.Linear`` and ``nn.LayerNorm`` in
    ``model``, in place (PaLM: "no biases ... in any of the dense kernels
    or layer norms"). With zero biases, as at GPT-2's init, the function
    is unchanged; what changes is what training can learn, and the count.
    Returns ``model``."""
    check_type("model", model, nn.Module, "a torch.nn.Module")
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.LayerNorm)) and m.bias is not None:
            m.register_parameter("bias", None)
    return model


# ------------------------------------------------------------ the models
def variant_lm(*, seed: int, vocab_size: int = 16,
               n_layers: int = 4) -> decoder_lm.DecoderLM:
    """The baseline of the experiment: a small GPT-2-style ``DecoderLM``
    (D = 64, 4 heads, learned positions up to 32, LayerNorm with biases,
    GELU FFN of width 4D, biases everywhere, tied head, GPT-2's init),
    built after ``torch.manual_seed(seed)``."""
    check_int("seed", seed, minimum=0)
    check_int("vocab_size", vocab_size, minimum=2)
    check_int("n_layers", n_layers, minimum=1, maximum=64)
    torch.manual_seed(seed)
    return decoder_lm.DecoderLM(decoder_lm.DecoderLMConfig(
        vocab_size=vocab_size, hidden_size=64, num_attention_heads=4,
        num_hidden_layers=n_layers, max_position_embeddings=32,
        position="learned", norm="layer", hidden_act="gelu",
        attention_bias=True, mlp_bias=True))


def to_variant(model: decoder_lm.DecoderLM, variant: str
               ) -> decoder_lm.DecoderLM:
    """Rebuild the blocks of :func:`variant_lm`'s ``model`` as ``variant``
    (one of :data:`VARIANTS`), in place, reusing its modules and weights:
    every variant starts from the same weights, plus new norm gains at 1.
    Returns ``model``."""
    check_type("model", model, decoder_lm.DecoderLM, "a DecoderLM")
    check_choice("variant", variant, VARIANTS)
    D = model.config.hidden_size
    if variant == "no_bias":
        return remove_biases(model)
    for i, b in enumerate(model.layers):
        if variant == "parallel":                # norm2 is dropped
            new = ParallelBlock(D, attention=b.attention, ffn=b.ffn)
            new.norm = b.norm1
        elif variant == "sandwich":
            new = SandwichBlock(D, attention=b.attention, ffn=b.ffn)
            new.norm1, new.norm2 = b.norm1, b.norm2
        elif variant == "qk_norm":
            attn = QKNormAttention(D, b.attention.n_heads)
            attn.load_state_dict(b.attention.state_dict(), strict=False)
            # same projections; q_norm, k_norm start at 1
            new = b
            new.attention = attn
        else:                                    # "pre_norm": as built
            new = b
        model.layers[i] = new
    return model


# ------------------------------------------------------ attention logits
def attention_logits(attention: MultiHeadAttention | QKNormAttention,
                     h: torch.Tensor) -> torch.Tensor:
    r"""The logits $q \cdot k / \sqrt{d_k}$ of every head, before mask and
    softmax, for self-attention on ``h`` (B, T, D): with
    :class:`QKNormAttention`, of the normalised $\hat q, \hat k$.

    Returns:
        (B, H, T, T).
    """
    check_type("attention", attention,
               (MultiHeadAttention, QKNormAttention),
               "a MultiHeadAttention or QKNormAttention")
    check_type("h", h, torch.Tensor, "a torch.Tensor")
    H = attention.n_heads
    q = split_heads(attention.q_proj(h), H)                # (B, H, T, d_k)
    k = split_heads(attention.k_proj(h), H)                # (B, H, T, d_k)
    if isinstance(attention, QKNormAttention):
        q, k = attention.q_norm(q), attention.k_norm(k)
    return (q * attention.scale) @ k.transpose(-2, -1)     # (B, H, T, T)


@torch.no_grad()
def max_attention_logit(model: decoder_lm.DecoderLM,
                        idx: torch.Tensor) -> float:
    """The largest $|$logit$|$ over the causal (query, key) pairs of every
    head of every layer of ``model`` on the tokens ``idx`` (B, T)."""
    check_type("model", model, decoder_lm.DecoderLM, "a DecoderLM")
    check_type("idx", idx, torch.Tensor, "a torch.Tensor")
    inputs = []                   # the normalised input of each attention
    hooks = [b.attention.register_forward_pre_hook(
        lambda mod, args: inputs.append((mod, args[0]))) for b in
        model.layers]
    try:
        model.eval()
        model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    allowed = causal_mask(idx.shape[1])                    # (T, T)
    return max(attention_logits(a, h).abs().masked_fill(~allowed, 0)
               .max().item() for a, h in inputs)


# ------------------------------------------------------------ training
_SOURCE = dict(vocab_size=16, order=2, branching=3, seed=0)  # chapter 6's


@small_ops()  # training steps of a small model: one thread
def train_variant(variant: str, *, seed: int = 0, lr: float = 3e-3,
                  steps: int = 250, stop_at: int | None = None) -> dict:
    r"""Train one variant for one seed on the Markov language of chapter 6.

    :func:`variant_lm` (seed ``seed``) turned into ``variant`` by
    :func:`to_variant`, trained with ``training.train``: batches of 16
    sequences of length 32 from ``markov.lm_batches`` (seeded ``seed``,
    so every variant sees the same batches), AdamW at peak ``lr``, 30
    warmup steps, cosine decay to 0 at ``steps``, gradients clipped at
    1. Every 25 steps: the loss on a fixed validation batch (128
    sequences, seed 10000) and the largest attention logit on it
    (:func:`max_attention_logit`).

    Args:
        variant: one of :data:`VARIANTS`. seed: weights and batches.
        lr: peak learning rate. steps: length of the schedule (>= 30).
        stop_at: stop after this many steps of the same schedule (a
            prefix of the full run, to check a stored one cheaply);
            default ``steps``.
    Returns:
        ``{"params", "val_loss" (last), "val_curve", "max_logit_init",
        "max_logit" (last), "max_logit_curve"}``; the curves hold one
        value per evaluation (steps 25, 50, ...).
    """
    check_choice("variant", variant, VARIANTS)
    check_int("seed", seed, minimum=0)
    check_real("lr", lr, positive=True, maximum=1.0)
    check_int("steps", steps, minimum=30)
    stop_at = steps if stop_at is None else stop_at
    check_int("stop_at", stop_at, minimum=1, maximum=steps)
    source = markov.random_markov_source(**_SOURCE)
    val = next(markov.lm_batches(source, batch_size=128, length=32,
                                 seed=10_000))
    model = to_variant(variant_lm(seed=seed), variant)
    logits = [max_attention_logit(model, val[0])]   # at init, then evals

    def evaluate(m):
        logits.append(max_attention_logit(m, val[0]))
        return next_token_loss(m, val).item()

    hist = train(model, markov.lm_batches(source, batch_size=16, length=32,
                                          seed=seed),
                 steps=stop_at, total_steps=steps, lr=lr, warmup_steps=30,
                 schedule="cosine", eval_fn=evaluate, eval_every=25,
                 seed=seed, progress=False)
    return {"params": sum(p.numel() for p in model.parameters()),
            "val_loss": hist.val_loss[-1], "val_curve": hist.val_loss,
            "max_logit_init": logits[0], "max_logit": logits[-1],
            "max_logit_curve": logits[1:]}


@small_ops()  # small models: one thread
def step_times(variants=VARIANTS, *, rounds: int = 7,
               steps_per_round: int = 3) -> dict[str, float]:
    """Seconds per training step (forward, backward, AdamW) of each
    variant (seed 0), measured interleaved: in every round each variant
    runs ``steps_per_round`` steps in turn, so a load change on the
    machine hits all of them alike. Returns the median over rounds."""
    variants = list(variants)
    for v in variants:
        check_choice("each of variants", v, VARIANTS)
    check_int("rounds", rounds, minimum=1)
    check_int("steps_per_round", steps_per_round, minimum=1)
    source = markov.random_markov_source(**_SOURCE)
    batch = next(markov.lm_batches(source, batch_size=16, length=32))
    models = {v: to_variant(variant_lm(seed=0), v) for v in variants}
    opts = {v: torch.optim.AdamW(m.parameters(), lr=1e-3)
            for v, m in models.items()}

    def step(v):
        loss = next_token_loss(models[v], batch)
        opts[v].zero_grad(set_to_none=True)
        loss.backward()
        opts[v].step()

    times = {v: [] for v in variants}
    for v in variants:                                   # warm-up
        step(v)
    for _ in range(rounds):
        for v in variants:
            start = time.perf_counter()
            for _ in range(steps_per_round):
                step(v)
            times[v].append((time.perf_counter() - start) / steps_per_round)
    return {v: statistics.median(t) for v, t in times.items()}


def make_sweep() -> sweeps.Sweep:
    """Every variant at two peak learning rates, three seeds (0, 1, 2)."""
    settings = [{"variant": v, "lr": lr} for lr in (3e-3, 1e-2)
                for v in VARIANTS]
    return sweeps.run_sweep(
        "block_variants", train_variant, settings, seeds=(0, 1, 2),
        description="A 4-block GPT-2-style LM (D = 64) and four variants "
                    "of its block, trained 250 steps on a Markov language "
                    "(V = 16) with the same batches: validation loss and "
                    "the largest attention logit.",
        meta={"steps": 250, "eval_every": 25, "batch": 16, "length": 32,
              "n_layers": 4, "d_model": 64, "warmup_steps": 30,
              "schedule": "cosine",
              "entropy_rate": markov.entropy_rate(
                  markov.random_markov_source(**_SOURCE))},
        progress=True)
