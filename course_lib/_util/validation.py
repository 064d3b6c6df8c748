"""Argument checks shared by every course_lib module.

Public functions reject bad input with a ``ValueError`` that names the
argument, the value received and what was expected, and an argument of
the wrong type with a ``TypeError`` (:func:`check_type`). These helpers
write those messages the same way everywhere.
"""
from __future__ import annotations

import math
from numbers import Integral, Real

import torch

__all__ = ["check_type", "check_attrs", "check_batch", "check_bool",
           "check_int", "check_sizes", "check_real", "check_dropout", "check_top_k",
           "check_lengths", "check_bool_mask", "check_ids", "check_token_ids",
           "config_field", "broadcasts_to", "check_even", "check_choice",
           "check_divides", "check_shape", "check_attention_inputs",
           "check_callable", "check_float_dtype", "check_broadcasts",
           "check_fits", "check_continues", "check_equal", "MAX_ELEMENTS",
           "check_alloc", "check_prompts"]


def check_type(name: str, value, expected, what: str) -> None:
    """``value`` must be an instance of ``expected`` (a type or a tuple of
    types), else a ``TypeError`` naming the argument: a wrong type fails
    at the call, not as an ``AttributeError`` deep inside. ``what``
    describes the expected type for the message ("a torch.Tensor")."""
    if not isinstance(value, expected):
        raise TypeError(f"{name} must be {what}, got "
                        f"{type(value).__name__}")


def check_attrs(name: str, value, attrs, what: str) -> None:
    """``value`` must have every attribute in ``attrs`` (a duck-typed
    configuration), else a ``TypeError`` naming the argument and the
    missing attributes."""
    missing = [a for a in attrs if not hasattr(value, a)]
    if missing:
        raise TypeError(f"{name} must be {what}, got "
                        f"{type(value).__name__} without "
                        f"{', '.join(missing)}")


def check_batch(name: str, batch, parts: tuple[str, ...]) -> None:
    """``batch`` must be a tuple or list of ``len(parts)`` tensors, named
    ``parts`` in the message (``("inputs", "targets")``)."""
    what = f"a tuple ({', '.join(parts)}) of tensors"
    if not isinstance(batch, (tuple, list)) or len(batch) != len(parts):
        raise TypeError(f"{name} must be {what}, got "
                        f"{type(batch).__name__}")
    for part, value in zip(parts, batch):
        check_type(f"{name}'s {part}", value, torch.Tensor,
                   "a torch.Tensor")


def check_bool(name: str, value) -> None:
    """``value`` must be a bool (a flag), not an int or a string: the
    string ``'False'`` is truthy and would act as True."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got "
                        f"{type(value).__name__} {value!r:.40}")


def check_int(name: str, value, *, minimum: int,
              maximum: int | None = None) -> None:
    """``value`` must be an int (not a bool), at least ``minimum`` and at
    most ``maximum`` (if given)."""
    # bool is an Integral in Python; a flag passed as a size is a bug.
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(
            f"{name} must be an int, got {type(value).__name__} "
            f"{value!r:.40}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum:,}, got {value:,}")


def check_sizes(**sizes) -> None:
    """Every keyword argument must be a size: an int (not a bool) >= 1,
    e.g. ``check_sizes(d_model=d_model, d_ff=d_ff)``; the error names the
    first one that is not."""
    for name, value in sizes.items():
        check_int(name, value, minimum=1)


def check_real(name: str, value, *, positive: bool = False,
               minimum: float | None = None,
               maximum: float | None = None) -> None:
    """``value`` must be a finite real number, > 0 with ``positive``, and
    within ``[minimum, maximum]`` where those are given."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(
            f"{name} must be a real number, got {type(value).__name__} "
            f"{value!r:.40}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")


def check_dropout(name: str, value) -> None:
    """A dropout probability: a real number in ``[0, 1)``."""
    check_real(name, value, minimum=0)
    if value >= 1:
        raise ValueError(f"{name} must be < 1 (1 drops everything), got "
                         f"{value}")


def check_top_k(top_k, n_experts: int) -> None:
    """``top_k`` must be an int in ``[1, n_experts]`` (experts per token)."""
    check_int("top_k", top_k, minimum=1)
    if top_k > n_experts:
        raise ValueError(f"top_k must be <= n_experts={n_experts}, "
                         f"got {top_k}")


def check_lengths(lengths, *, minimum: int,
                  maximum: int | None = None) -> list[int]:
    """``lengths`` must be a non-empty list or 1-D tensor/array of ints,
    each >= ``minimum`` (and <= ``maximum``); returns it as a list."""
    # 1-D tensors and NumPy arrays become lists (`not array` is ambiguous).
    if getattr(lengths, "ndim", None) == 1 and hasattr(lengths, "tolist"):
        lengths = lengths.tolist()
    if isinstance(lengths, str) or hasattr(lengths, "ndim") or \
            not hasattr(lengths, "__len__") or len(lengths) == 0:
        raise ValueError(f"lengths must be a non-empty list or 1-D tensor "
                         f"of ints, got {lengths!r:.60}")
    for n in lengths:
        check_int("each of lengths", n, minimum=minimum, maximum=maximum)
    return list(lengths)


def check_bool_mask(name: str, mask) -> None:
    """``mask`` must be a bool tensor (True = may attend)."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else \
            type(mask).__name__
        raise TypeError(f"{name} must be a bool tensor (True = may attend)"
                        f", got {got}")


def check_key_mask(name: str, mask, B: int, S: int) -> None:
    """``mask`` must be a bool tensor (B, S), one flag per key slot of
    each sequence: True = a real token that queries may attend, False =
    padding."""
    check_bool_mask(name, mask)
    check_shape(name, mask, (B, S), f"(B, S) = ({B}, {S})")


def check_ids(name: str, ids) -> None:
    """``ids`` must be an integer tensor of shape (T,) or (B, T), T >= 1."""
    if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point \
            or ids.dtype == torch.bool or ids.is_complex():
        raise TypeError(f"{name} must be an integer tensor, got "
                        f"{getattr(ids, 'dtype', type(ids).__name__)}")
    if ids.dim() not in (1, 2) or ids.shape[-1] < 1:
        raise ValueError(f"{name} must have shape (T,) or (B, T) with "
                         f"T >= 1, got {tuple(ids.shape)}")


def check_prompts(prompts) -> None:
    """``prompts`` must be a non-empty list (or tuple) of 1-D integer
    tensors ``(T0_b,)``, each with at least one id."""
    check_type("prompts", prompts, (list, tuple), "a list of 1-D tensors")
    if not prompts:
        raise ValueError("prompts must hold at least one prompt, got an "
                         "empty list")
    for b, p in enumerate(prompts):
        check_ids(f"prompts[{b}]", p)
        if p.dim() != 1:
            raise ValueError(f"prompts[{b}] must be 1-D (T0,), got shape "
                             f"{tuple(p.shape)}")


def check_token_ids(name: str, ids, vocab: int,
                    max_position_embeddings: int) -> None:
    """``ids`` must be an integer tensor (B, T) of ids in [0, vocab) with
    T <= the config's ``max_position_embeddings``."""
    if not isinstance(ids, torch.Tensor) \
            or ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be an int64 tensor (B, T), got "
                        f"{getattr(ids, 'dtype', type(ids).__name__)}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape (B, T), got "
                         f"{tuple(ids.shape)}")
    if ids.shape[1] > max_position_embeddings:
        raise ValueError(f"{name} has length {ids.shape[1]}, more than "
                         f"max_position_embeddings="
                         f"{max_position_embeddings}")
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"{name} must hold ids in [0, {vocab}), got "
                         f"[{ids.min().item()}, {ids.max().item()}]")


_REQUIRED = object()


def config_field(config, *names: str, default=_REQUIRED):
    """The first attribute of ``config`` among ``names`` that exists and is
    not None (list the Hugging Face name first, then the course's).

    Raises a ValueError naming the attributes if none is set and no
    ``default`` is given.
    """
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    if default is _REQUIRED:
        raise ValueError(f"config must have one of the attributes {names}, "
                         f"got {type(config).__name__} without them")
    return default


def broadcasts_to(shape, target) -> bool:
    """True if a tensor of ``shape`` broadcasts to exactly ``target``:
    ``torch.broadcast_shapes(shape, target) == target`` without its cost
    (tens of microseconds a call, paid in every layer of a real model
    at every decoding step; chapter 13)."""
    if len(shape) > len(target):
        return False
    return all(s == 1 or s == t for s, t in
               zip(reversed(tuple(shape)), reversed(tuple(target))))


def check_even(name: str, value) -> None:
    """``value`` must be an even int >= 2: a width whose features come in
    pairs (sinusoidal encoding, RoPE)."""
    check_int(name, value, minimum=2)
    if value % 2:
        raise ValueError(
            f"{name} must be even, got {value} (features come in pairs)")


def check_choice(name: str, value, options) -> None:
    """``value`` must be one of ``options`` (e.g. the names of a norm)."""
    if value not in options:
        raise ValueError(f"{name} must be one of {tuple(options)}, got "
                         f"{value!r:.40}")


def check_divides(name: str, value: int, by_name: str, by: int) -> None:
    """``value`` (already checked to be an int) must be a multiple of
    ``by``: e.g. ``d_model`` of ``n_heads``, so every head is as wide."""
    if value % by:
        raise ValueError(f"{name} must be divisible by {by_name}, got "
                         f"{name}={value}, {by_name}={by}")


def check_shape(name: str, t, shape: tuple, what: str) -> None:
    """``t`` must be a tensor whose shape matches ``shape`` (an int fixes
    that axis, None accepts any size); ``what`` spells the expected shape
    for the message, e.g. ``"(B, T, d_model=64)"``."""
    check_type(name, t, torch.Tensor, "a torch.Tensor")
    if t.dim() != len(shape) or any(
            s is not None and s != n for s, n in zip(shape, t.shape)):
        raise ValueError(f"{name} must have shape {what}, got "
                         f"{tuple(t.shape)}")


# The most values one call may ask torch to allocate: 2^28 float32 values
# are 1 GiB. The course's largest model (GPT-2 small) has 124 million
# parameters and its largest tensor 39 million; a size beyond this is a
# typo (10**9 for 10**3) that would otherwise take the machine's memory
# or hang before failing.
MAX_ELEMENTS = 1 << 28


def check_alloc(name: str, n_elements: int) -> None:
    """A request for ``n_elements`` values (computed from the sizes the
    caller was given, named ``name`` in the message) must stay within
    :data:`MAX_ELEMENTS`, so a wrong size fails at once instead of
    allocating gigabytes."""
    if n_elements > MAX_ELEMENTS and \
            torch.get_default_device().type != "meta":
        # (under ``with torch.device("meta")`` nothing is allocated: a
        # chapter builds DeepSeek-V3's layers that way to count them)
        raise ValueError(
            f"{name} asks for {n_elements:,} values "
            f"({4 * n_elements / 2**30:,.1f} GiB as float32), more than "
            f"the {MAX_ELEMENTS:,} one call may allocate")


def check_attention_inputs(q, k, v, mask, scale, *,
                           gqa: bool = False) -> float:
    """Validate the arguments of scaled dot-product attention and return
    the scale to use (default $1/\\sqrt{d_k}$).

    ``q`` (..., Lq, d_k), ``k`` (..., Lk, d_k), ``v`` (..., Lk, d_v):
    floating-point tensors whose leading dims broadcast; ``mask`` None or
    a bool tensor that broadcasts *to* the scores (..., Lq, Lk) without
    enlarging them (that would apply the wrong mask per batch element);
    ``scale`` None or a finite real > 0. With ``gqa``, q is (B, H, Lq,
    d_k) and k, v are (B, G, Lk, d) with H a multiple of G.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_type(name, t, torch.Tensor, "a torch.Tensor")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {t.dtype}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., L, d), got "
                             f"{tuple(t.shape)}")
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if gqa:
        if not (q.dim() == k.dim() == v.dim() == 4 and k.shape[1] >= 1
                and q.shape[1] % k.shape[1] == 0):
            raise ValueError(f"enable_gqa=True needs q (B, H, Lq, d_k) and "
                             f"k, v (B, G, Lk, d) with H a multiple of G, "
                             f"got {shapes}")
        # check the rest as for k, v repeated to H heads (views, no copy)
        H = q.shape[1]
        k = k[:, :1].expand(-1, H, -1, -1)
        v = v[:, :1].expand(-1, H, -1, -1)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share d_k, got {shapes}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must share the length Lk, got {shapes}")
    batch = q.shape[:-2]
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        try:
            batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2],
                                           v.shape[:-2])
        except RuntimeError:
            raise ValueError(f"leading dims do not broadcast: "
                             f"{shapes}") from None
    if mask is not None:
        check_bool_mask("mask", mask)
        scores = torch.Size((*batch, q.shape[-2], k.shape[-2]))
        if not broadcasts_to(mask.shape, scores):
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not "
                             f"broadcast to the scores (..., Lq, Lk) = "
                             f"{tuple(scores)}")
    if scale is None:
        return 1.0 / math.sqrt(q.shape[-1])
    check_real("scale", scale, positive=True)
    return scale


def check_equal(name: str, value, expected) -> None:
    """``value`` must equal ``expected`` (a size that must match another
    object's: a cache's layer count and the model's)."""
    if value != expected:
        raise ValueError(f"{name} must be {expected}, got {value}")


def check_callable(name: str, value) -> None:
    """``value`` must be callable (a factory, a loss function ...)."""
    if not callable(value):
        raise TypeError(f"{name} must be callable, got "
                        f"{type(value).__name__}")


def check_float_dtype(name: str, dtype) -> None:
    """``dtype`` must be a floating-point ``torch.dtype``."""
    check_type(name, dtype, torch.dtype, "a torch.dtype")
    if not dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating dtype, got {dtype}")


def check_broadcasts(name: str, shape, target, expected: str, *,
                     given=None) -> None:
    """A tensor of ``shape`` named ``name`` must broadcast to exactly
    ``target`` (never enlarge it); ``expected`` lists the accepted shapes
    and ``given`` the shape the caller passed (default ``shape``) for the
    message."""
    if not broadcasts_to(shape, target):
        raise ValueError(f"{name} of shape {tuple(given or shape)} does not "
                         f"broadcast to {tuple(target)}; expected {expected}")


def check_fits(cached: int, new: int, max_len: int | None) -> None:
    """A cache holding ``cached`` positions can take ``new`` more only
    within ``max_len`` (None: no limit)."""
    if max_len is not None and cached + new > max_len:
        raise ValueError(f"cache overflow: {cached} cached + {new} new "
                         f"positions exceeds max_len={max_len}")


def check_continues(positions, start: int, max_len: int | None) -> None:
    """``positions`` (T,) must be the run ``start, start + 1, ...`` that
    continues a cache of ``start`` positions (a gap or a repeat would pair
    new queries with the wrong keys), within ``max_len``."""
    check_type("positions", positions, torch.Tensor, "a torch.Tensor")
    if positions.dim() != 1:
        raise ValueError(f"positions must be a 1-D tensor (T,), got "
                         f"{tuple(positions.shape)}")
    expected = torch.arange(start, start + positions.numel(),
                            device=positions.device)
    if not torch.equal(positions.long(), expected):
        shown = positions.tolist()
        shown = shown if len(shown) <= 8 else shown[:8] + ["..."]
        raise ValueError(f"positions must continue the cache, i.e. start "
                         f"at {start} and increase by 1, got {shown}")
    check_fits(start, positions.numel(), max_len)
