r"""The pre-norm Transformer block, and the FFNs and norms inside it.

Besides attention, every Transformer layer holds a *position-wise
feed-forward network* (FFN): the same two-layer MLP applied to every token
independently. The paper's FFN (Vaswani et al. 2017, eq. 2) is

$$\mathrm{FFN}(x) = \max(0,\, xW_1 + b_1)\,W_2 + b_2, \qquad
W_1 \in \mathbb{R}^{D \times d_{ff}},\; W_2 \in \mathbb{R}^{d_{ff} \times D},$$

with $D = 512$, $d_{ff} = 2048$ in the base model. GPT-2 replaces ReLU by
GELU; Llama uses the gated SwiGLU (Shazeer 2020),
$\mathrm{down}(\mathrm{SiLU}(\mathrm{gate}(x)) \odot \mathrm{up}(x))$,
which has three matrices instead of two.

Normalisation: LayerNorm (Ba et al. 2016) centres and rescales each token
vector, $\gamma \odot (x - \mu)/\sqrt{\sigma^2 + \epsilon} + \beta$;
RMSNorm (Zhang & Sennrich 2019) skips the centring and the bias,
$\gamma \odot x / \sqrt{\mathrm{mean}(x^2) + \epsilon}$.

The block of GPT-2 and Llama (:class:`DecoderBlock`) wraps attention and
an FFN, each in a residual branch with the norm *inside* it (pre-norm),
$x + \mathrm{Sublayer}(\mathrm{Norm}(x))$, which keeps an identity path
from the output to the input. The paper's post-norm layers are in
:mod:`course_lib.model.transformer`.

Shape letters: B batch, T sequence length, D = ``d_model``,
F = ``d_ff`` (hidden width of the FFN); ... any leading dimensions.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .._util.validation import (
    MAX_ELEMENTS,
    check_alloc,
    check_bool,
    check_choice,
    check_dropout,
    check_int,
    check_real,
    check_shape,
    check_sizes,
    check_type,
)

if TYPE_CHECKING:  # annotations only: the cache is chapter 9's module
    from .kv_cache import LayerKVCache

__all__ = ["ffn_param_count", "swiglu_param_count", "llama_hidden_dim",
           "FeedForward", "SwiGLU", "RMSNorm", "rms_norm", "make_norm",
           "DecoderBlock"]

_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}



# ------------------------------------------------------- parameter counts
def ffn_param_count(*, d_model: int, d_ff: int, bias: bool = True) -> int:
    r"""Parameters of :class:`FeedForward`: $2Dd_{ff} + [\text{bias}]
    (d_{ff} + D)$; 2,099,712 for the paper's $D = 512$, $d_{ff} = 2048$.
    """
    check_sizes(d_model=d_model, d_ff=d_ff)
    check_bool("bias", bias)
    return 2 * d_model * d_ff + (d_ff + d_model if bias else 0)


def swiglu_param_count(*, d_model: int, d_ff: int,
                       bias: bool = False) -> int:
    r"""Parameters of :class:`SwiGLU`: three matrices, $3 D d_{ff}$, and
    with biases $2 d_{ff} + D$ more.
    """
    check_sizes(d_model=d_model, d_ff=d_ff)
    check_bool("bias", bias)
    return 3 * d_model * d_ff + (2 * d_ff + d_model if bias else 0)


def llama_hidden_dim(d_model: int, *, multiple_of: int = 256) -> int:
    r"""SwiGLU hidden width with the parameters of a $4D$ ReLU FFN.

    $3 D d_{ff} = 2 D (4D)$ gives $d_{ff} = \tfrac{8}{3} D$; Llama takes
    ``int`` of that and rounds up to a multiple of ``multiple_of``
    (hardware-friendly matrix shapes): $D = 4096 \to 11008$.
    """
    check_sizes(d_model=d_model, multiple_of=multiple_of)
    hidden = int(2 * (4 * d_model) / 3)                   # 8D/3, truncated
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


# ----------------------------------------------------------- the FFNs
class FeedForward(nn.Module):
    r"""Position-wise FFN: $\mathrm{act}(xW_1 + b_1)\,W_2 + b_2$.

    The same weights act on every position; no information moves between
    tokens here (that is attention's job). Submodule names ``linear1``,
    ``linear2`` and ``dropout`` are those of
    ``torch.nn.TransformerEncoderLayer``, so weights copy across by name.

    Args:
        d_model: model width $D$. d_ff: hidden width $d_{ff}$.
        activation: ``"relu"`` (the paper) or ``"gelu"`` (GPT-2, BERT).
        bias: biases $b_1$, $b_2$. dropout: on the hidden activations.
    """

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "relu",
                 bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        check_sizes(d_model=d_model, d_ff=d_ff)
        check_alloc("d_model * d_ff", d_model * d_ff)
        check_dropout("dropout", dropout)
        check_choice("activation", activation, sorted(_ACTIVATIONS))
        check_bool("bias", bias)
        self.d_model, self.d_ff, self.activation = d_model, d_ff, activation
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)     # W_1, b_1
        self.act = _ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)     # W_2, b_2

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D) -> (..., D), each position independently."""
        # FFN(x) = act(x W_1 + b_1) W_2 + b_2
        h = self.act(self.linear1(x))                          # (..., F)
        return self.linear2(self.dropout(h))                   # (..., D)


class SwiGLU(nn.Module):
    r"""Gated FFN of Llama: $(\mathrm{SiLU}(xW_g) \odot xW_u)\,W_d$.

    $\mathrm{SiLU}(z) = z\,\sigma(z)$. The *gate* branch decides, per
    hidden unit, how much of the *up* branch passes. Three $D \times
    d_{ff}$ matrices: $3Dd_{ff}$ parameters. Names follow the Llama
    checkpoints (``gate_proj``, ``up_proj``, ``down_proj``); Llama has no
    biases, and Hugging Face's ``mlp_bias`` adds one to each matrix.

    Args:
        d_model: model width $D$. d_ff: hidden width $d_{ff}$
            (see :func:`llama_hidden_dim`). bias: biases on the three
            projections.
    """

    def __init__(self, d_model: int, d_ff: int, *,
                 bias: bool = False) -> None:
        super().__init__()
        check_sizes(d_model=d_model, d_ff=d_ff)
        check_alloc("d_model * d_ff", d_model * d_ff)
        check_bool("bias", bias)
        self.d_model, self.d_ff = d_model, d_ff
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias)   # W_g
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)     # W_u
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)   # W_d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D) -> (..., D), each position independently."""
        gate = nn.functional.silu(self.gate_proj(x))           # (..., F)
        # SwiGLU(x) = (SiLU(x W_g) * x W_u) W_d
        return self.down_proj(gate * self.up_proj(x))          # (..., D)


# ------------------------------------------------------- normalisation
class RMSNorm(nn.Module):
    r"""Root-mean-square normalisation, $\gamma \odot x /
    \sqrt{\frac1D \sum_i x_i^2 + \epsilon}$.

    LayerNorm without the mean subtraction and without $\beta$: one
    reduction instead of two, $D$ parameters instead of $2D$. On a
    zero-mean vector it equals LayerNorm with $\beta = 0$. Same result
    as ``torch.nn.RMSNorm(d_model, eps=eps)``; the statistic is computed
    in float32 at least, as Llama does, so half-precision inputs are safe.

    Args:
        d_model: feature width $D$. eps: $\epsilon$ inside the square
            root.
    """

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        check_int("d_model", d_model, minimum=1, maximum=MAX_ELEMENTS)
        # finite and > 0: eps = 0 divides by 0 on a constant input
        check_real("eps", eps, positive=True)
        self.d_model, self.eps = d_model, eps
        self.weight = nn.Parameter(torch.ones(d_model))        # gamma

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D) -> (..., D)."""
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        # x / sqrt(mean(x^2) + eps)
        inv_rms = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * inv_rms).to(x.dtype) * self.weight        # (..., D)


def rms_norm(x: torch.Tensor, weight: torch.Tensor,
             eps: float = 1e-6) -> torch.Tensor:
    r"""RMSNorm as a function: $\gamma \odot x /
    \sqrt{\frac1D \sum_i x_i^2 + \epsilon}$ over the last axis.

    The computation of :meth:`RMSNorm.forward` with the gain passed in:
    half-precision inputs (float16, bfloat16) are upcast to float32 for
    the statistic, as Llama does ($x^2$ of a float16 entry of 300 is
    beyond float16's largest value 65504), the normalised vector is cast
    back to ``x``'s dtype, then multiplied by the gain.

    Args:
        x: (..., D) floating-point tensor, one vector per token.
        weight: (D,) gain $\gamma$.
        eps: $\epsilon > 0$ inside the square root (keeps a zero vector
            finite).
    Returns:
        (..., D), in the dtype of ``x * weight``.
    """
    check_type("x", x, torch.Tensor, "a torch.Tensor")
    d = tuple(x.shape[-1:])                                     # (D,)
    check_shape("weight", weight, d, f"(D,) = {d}")
    check_real("eps", eps, positive=True)
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    # x / sqrt(mean(x^2) + eps), statistic over the last axis: (..., 1)
    inv_rms = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * inv_rms).to(x.dtype) * weight                 # (..., D)


def make_norm(norm: str, d_model: int, *, eps: float | None = None,
              bias: bool = True) -> nn.Module:
    r"""``"layer"`` -> ``nn.LayerNorm`` (eps $10^{-5}$, bias optional),
    ``"rms"`` -> :class:`RMSNorm` (eps $10^{-6}$, never a bias).
    """
    check_choice("norm", norm, ("layer", "rms"))
    check_int("d_model", d_model, minimum=1, maximum=MAX_ELEMENTS)
    if eps is not None:
        check_real("eps", eps, positive=True)
    check_bool("bias", bias)
    if norm == "layer":
        return nn.LayerNorm(d_model, eps=1e-5 if eps is None else eps,
                            bias=bias)
    return RMSNorm(d_model, eps=1e-6 if eps is None else eps)


class DecoderBlock(nn.Module):
    r"""Pre-norm block with injected attention and FFN:

    $$x \leftarrow x + \mathrm{Drop}(\mathrm{Attn}(\mathrm{Norm}_1(x))),
    \qquad x \leftarrow x + \mathrm{Drop}(\mathrm{FFN}(\mathrm{Norm}_2(x))).$$

    The attention module is called as ``attention(h, mask,
    positions=positions, cache=cache)`` (a
    :class:`~course_lib.model.mha.MultiHeadAttention`, with or without its RoPE
    hook; later MLA) and the FFN as ``ffn(h)`` (:class:`FeedForward`,
    :class:`SwiGLU`, later a mixture of experts); each returns a tensor of
    the shape of ``h``. The block returns ``x`` (B, T, D). What an FFN
    reports besides its output stays on the FFN module (an MoE's routing
    is its ``last_info``, chapter 11).

    Args:
        d_model: $D$. attention, ffn: the two sub-layers.
        norm: ``"rms"`` (Llama) or ``"layer"`` (GPT-2).
        norm_bias: LayerNorm bias (ignored for RMSNorm).
        eps: norm epsilon (default $10^{-6}$ rms, $10^{-5}$ layer).
        dropout: residual dropout on each sub-layer output.
    """

    def __init__(self, d_model: int, *, attention: nn.Module,
                 ffn: nn.Module, norm: str = "rms", norm_bias: bool = True,
                 eps: float | None = None, dropout: float = 0.0) -> None:
        super().__init__()
        for name, m in (("attention", attention), ("ffn", ffn)):
            check_type(name, m, nn.Module, "an nn.Module")
        check_dropout("dropout", dropout)
        self.norm1 = make_norm(norm, d_model, eps=eps, bias=norm_bias)
        self.attention = attention
        self.norm2 = make_norm(norm, d_model, eps=eps, bias=norm_bias)
        self.ffn = ffn
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                *, positions: torch.Tensor | None = None,
                cache: LayerKVCache | None = None) -> torch.Tensor:
        """x (B, T, D) -> x (B, T, D). ``mask``, ``positions``, ``cache``:
        passed to the attention."""
        # x = x + Attn(Norm1(x)): the identity path is never normalised.
        a = self.attention(self.norm1(x), mask, positions=positions,
                           cache=cache)
        x = x + self.dropout(a)                              # (B, T, D)
        # x = x + FFN(Norm2(x))
        f = self.ffn(self.norm2(x))                          # (B, T, D)
        return x + self.dropout(f)                           # (B, T, D)
