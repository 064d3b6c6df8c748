r"""YaRN: the RoPE frequency correction that gives DeepSeek-V3 its 128K
context (Peng et al. 2023), with the keys of the released ``config.json``.

RoPE pair $i$ of a $d$-wide rotary part turns by $\omega_i = b^{-2i/d}$
per position, so it completes $L \omega_i / 2\pi$ turns over the $L$
positions of pretraining. YaRN leaves the *fast* pairs alone (many turns:
they already saw every angle), divides the *slow* pairs' frequencies by
the extension ``factor`` $s$ (less than one turn: their angles beyond
$L$ were never seen, so positions are interpolated), and ramps linearly
in between. The pair that makes $r$ turns over $L$ positions is

$$i(r) = \frac{d \,\ln\!\big(L / (2\pi r)\big)}{2 \ln b};$$

with ``low`` $= \lfloor i(\beta_\text{fast}) \rfloor$, ``high`` $=
\lceil i(\beta_\text{slow}) \rceil$ (clamped to $[0, d-1]$), the ramp
$\rho_i = \mathrm{clamp}\big((i - \text{low}) / (\text{high} -
\text{low}), 0, 1\big)$ and $\gamma_i = 1 - \rho_i$,

$$\omega'_i = \omega_i \Big(\gamma_i + \frac{1 - \gamma_i}{s}\Big).$$

Stretching the slow pairs flattens the attention; YaRN sharpens it again
with $m(s, a) = 0.1\, a \ln s + 1$. As in ``transformers``' DeepSeek-V3,
the softmax scale is multiplied by $m(s, a_\text{all})^2$
(``mscale_all_dim``) and cos and sin by $m(s, a) / m(s, a_\text{all})$
(``mscale``); DeepSeek's ``inference/model.py`` multiplies the softmax
scale by $m(s, a)^2$ and leaves cos and sin alone. With the released
$a = a_\text{all}$ the two agree.

Shape letters: T positions, d rotary width, P = d/2 pairs.
"""
from __future__ import annotations

import math

import torch

from .._util.validation import check_bool, check_int, check_real, check_type

__all__ = ["YARN_KEYS", "check_rope_scaling", "yarn_correction_range",
           "yarn_frequencies", "yarn_mscale", "yarn_scales", "yarn_rope"]

# The keys of DeepSeek-V3's config.json "rope_scaling", all required.
YARN_KEYS = ("type", "factor", "original_max_position_embeddings",
             "beta_fast", "beta_slow", "mscale", "mscale_all_dim")


def check_rope_scaling(name: str, value) -> dict | None:
    """``value`` must be None or a dict with exactly :data:`YARN_KEYS`,
    ``type`` "yarn", ``factor`` >= 1, ``beta_fast`` >= ``beta_slow`` > 0
    (Kimi K2 sets both to 1) and positive ``mscale``, ``mscale_all_dim``.
    Returns a copy."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be None or a dict with keys "
                         f"{YARN_KEYS}, got {type(value).__name__}")
    missing = [k for k in YARN_KEYS if k not in value]
    unknown = sorted(set(value) - set(YARN_KEYS))
    if missing or unknown:
        raise ValueError(f"{name} must have exactly the keys {YARN_KEYS}; "
                         f"missing {missing}, unknown {unknown}")
    if value["type"] != "yarn":
        raise ValueError(f"{name}['type'] must be 'yarn' (the only scaling "
                         f"implemented), got {value['type']!r}")
    check_real(f"{name}['factor']", value["factor"], minimum=1)
    check_int(f"{name}['original_max_position_embeddings']",
              value["original_max_position_embeddings"], minimum=1)
    for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        check_real(f"{name}[{key!r}]", value[key], positive=True)
    if value["beta_fast"] < value["beta_slow"]:
        raise ValueError(f"{name}['beta_fast'] must be >= beta_slow="
                         f"{value['beta_slow']} (turns of the fastest "
                         f"corrected pair), got {value['beta_fast']}")
    return dict(value)


def yarn_correction_range(d: int, *, base: float, beta_fast: float,
                          beta_slow: float,
                          original_max_position_embeddings: int
                          ) -> tuple[int, int]:
    r"""``(low, high)``: pairs up to ``low`` keep their frequency, pairs
    from ``high`` on are divided by the factor.

    $i(r) = d \ln(L / 2\pi r) / (2 \ln b)$ is the (fractional) pair that
    turns $r$ times over $L$ positions; ``low`` $= \lfloor
    i(\beta_\text{fast}) \rfloor$, ``high`` $= \lceil
    i(\beta_\text{slow}) \rceil$, clamped to $[0, d - 1]$ as in the
    reference code. DeepSeek-V3 ($d = 64$): (10, 23).
    """
    check_int("d", d, minimum=2)
    check_real("base", base, minimum=1.0000001)
    for name, v in (("beta_fast", beta_fast), ("beta_slow", beta_slow),
                    ("original_max_position_embeddings",
                     original_max_position_embeddings)):
        check_real(name, v, positive=True)
    L = original_max_position_embeddings

    def pair(turns: float) -> float:
        # L w_i / (2 pi) = turns, w_i = b^(-2i/d)  =>  i = ...
        return d * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = math.floor(pair(beta_fast))
    high = math.ceil(pair(beta_slow))
    return max(low, 0), min(high, d - 1)


def yarn_frequencies(d: int, *, base: float, factor: float,
                     original_max_position_embeddings: int,
                     beta_fast: float, beta_slow: float,
                     **_unused) -> torch.Tensor:
    r"""YaRN-corrected frequencies $\omega'_i = \omega_i (\gamma_i + (1 -
    \gamma_i)/s)$, float64 ``(P,)``.

    Accepts a whole ``rope_scaling`` dict as keywords (``type``,
    ``mscale`` and ``mscale_all_dim`` are ignored here).
    """
    check_int("d", d, minimum=2)
    if d % 2:
        raise ValueError(f"d must be even (RoPE rotates pairs), got {d}")
    check_real("factor", factor, minimum=1)
    low, high = yarn_correction_range(
        d, base=base, beta_fast=beta_fast, beta_slow=beta_slow,
        original_max_position_embeddings=original_max_position_embeddings)
    i = torch.arange(d // 2, dtype=torch.float64)              # (P,)
    omega = base ** (-2 * i / d)                               # (P,)
    # rho_i: 0 up to `low`, 1 from `high`; +0.001 avoids 0/0 if equal
    rho = ((i - low) / max(high - low, 0.001)).clamp(0, 1)      # (P,)
    gamma = 1 - rho                      # share kept at the old frequency
    return omega * (gamma + (1 - gamma) / factor)              # (P,)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    r"""$m(s, a) = 0.1\, a \ln s + 1$ for $s > 1$, else 1
    (DeepSeek-V3: $m(40, 1) = 1.3689$)."""
    check_real("factor", factor, positive=True)
    check_real("mscale", mscale, minimum=0)
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_scales(rope_scaling: dict) -> tuple[float, float]:
    r"""``(rope_factor, softmax_factor)`` of a validated ``rope_scaling``:
    cos and sin are multiplied by $m(s, a) / m(s, a_\text{all})$, the
    softmax scale by $m(s, a_\text{all})^2$ (``transformers``' rule)."""
    rs = check_rope_scaling("rope_scaling", rope_scaling)
    if rs is None:
        raise ValueError("rope_scaling must be a dict, got None")
    m_all = yarn_mscale(rs["factor"], rs["mscale_all_dim"])
    return yarn_mscale(rs["factor"], rs["mscale"]) / m_all, m_all ** 2


def yarn_rope(x: torch.Tensor, positions: torch.Tensor,
              omega: torch.Tensor, *, interleave: bool = False,
              rope_factor: float = 1.0) -> torch.Tensor:
    r"""Rotate pair $i$ of ``x`` at position $m$ by $m \omega_i$ (any
    frequencies, e.g. :func:`yarn_frequencies`) and scale by
    ``rope_factor``; the arithmetic of
    :func:`~course_lib.model.rope.apply_rope`.

    Args:
        x: floating tensor (..., T, d); positions: (T,) or broadcastable
            to ``x.shape[:-1]``; omega: (d/2,) frequencies.
        interleave: pairs $(2i, 2i+1)$ (DeepSeek), else $(i, i + d/2)$.
        rope_factor: the magnitude of cos and sin, $m(s, a) / m(s,
            a_\text{all})$ of :func:`yarn_scales`; finite and $> 0$. It
            is not the extension factor $s$ (which must be $\ge 1$,
            see :func:`check_rope_scaling`): with ``mscale`` below
            ``mscale_all_dim`` it is below 1, so only its sign and
            finiteness are checked (0 would zero the rotated features, a
            negative value flip them).
    Returns:
        tensor of the shape and dtype of ``x``.
    """
    if not isinstance(omega, torch.Tensor) or omega.dim() != 1:
        raise ValueError(f"omega must be a 1-D tensor of frequencies, got "
                         f"{getattr(omega, 'shape', type(omega).__name__)}")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating tensor (..., T, d), got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() < 2 or x.shape[-1] != 2 * omega.shape[0]:
        raise ValueError(f"x must have shape (..., T, d) with d = 2 * "
                         f"len(omega) = {2 * omega.shape[0]}, got "
                         f"{tuple(x.shape)}")
    check_type("positions", positions, torch.Tensor, "a torch.Tensor")
    check_bool("interleave", interleave)
    check_real("rope_factor", rope_factor, positive=True)
    d = x.shape[-1]
    # Angles m * w'_i in float64 (positions reach 1e5: float32 would lose
    # the third decimal of the angle), then cast.
    angle = positions.to(torch.float64)[..., None] * omega.to(
        positions.device, torch.float64)                       # (..., P)
    cos = (angle.cos() * rope_factor).to(x.dtype)              # (..., P)
    sin = (angle.sin() * rope_factor).to(x.dtype)              # (..., P)
    xa, xb = ((x[..., 0::2], x[..., 1::2]) if interleave       # (..., T, P)
              else (x[..., : d // 2], x[..., d // 2:]))        # (..., T, P)
    # (xa + i xb) e^{i m w} = (xa cos - xb sin) + i (xa sin + xb cos)
    ya, yb = xa * cos - xb * sin, xa * sin + xb * cos          # (..., T, P)
    if interleave:
        return torch.stack([ya, yb], dim=-1).flatten(-2)       # (..., T, d)
    return torch.cat([ya, yb], dim=-1)                         # (..., T, d)
