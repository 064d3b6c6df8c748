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
           "check_int", "check_real", "check_dropout", "check_top_k",
           "check_lengths", "check_bool_mask", "check_ids", "check_token_ids",
           "config_field", "broadcasts_to", "check_even"]


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
    """``value`` must be a bool (a flag), not an int or a string."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")


def check_int(name: str, value, *, minimum: int) -> None:
    """``value`` must be an int (not a bool) and at least ``minimum``."""
    # bool is an Integral in Python; a flag passed as a size is a bug.
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(
            f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_real(name: str, value, *, positive: bool = False,
               minimum: float | None = None,
               maximum: float | None = None) -> None:
    """``value`` must be a finite real number, > 0 with ``positive``, and
    within ``[minimum, maximum]`` where those are given."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(
            f"{name} must be a real number, got {type(value).__name__} "
            f"{value!r}")
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


def check_lengths(lengths, *, minimum: int) -> list[int]:
    """``lengths`` must be a non-empty list or 1-D tensor/array of ints,
    each >= ``minimum``; returns it as a list."""
    # 1-D tensors and NumPy arrays become lists (`not array` is ambiguous).
    if getattr(lengths, "ndim", None) == 1 and hasattr(lengths, "tolist"):
        lengths = lengths.tolist()
    if isinstance(lengths, str) or hasattr(lengths, "ndim") or \
            not hasattr(lengths, "__len__") or len(lengths) == 0:
        raise ValueError(f"lengths must be a non-empty list or 1-D tensor "
                         f"of ints, got {lengths!r:.60}")
    for n in lengths:
        check_int("each of lengths", n, minimum=minimum)
    return list(lengths)


def check_bool_mask(name: str, mask) -> None:
    """``mask`` must be a bool tensor (True = may attend)."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask)
        raise ValueError(f"{name} must be a bool tensor (True = may attend)"
                         f", got {got}")


def check_ids(name: str, ids) -> None:
    """``ids`` must be an integer tensor of shape (T,) or (B, T), T >= 1."""
    if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point \
            or ids.dtype == torch.bool or ids.is_complex():
        raise ValueError(f"{name} must be an integer tensor, got "
                         f"{getattr(ids, 'dtype', type(ids).__name__)}")
    if ids.dim() not in (1, 2) or ids.shape[-1] < 1:
        raise ValueError(f"{name} must have shape (T,) or (B, T) with "
                         f"T >= 1, got {tuple(ids.shape)}")


def check_token_ids(name: str, ids, vocab: int, max_len: int) -> None:
    """``ids`` must be an integer tensor (B, T) of ids in [0, vocab) with
    T <= max_len."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 \
            or ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name} must be an int64 tensor (B, T), got "
                         f"{getattr(ids, 'dtype', type(ids).__name__)} "
                         f"{tuple(getattr(ids, 'shape', ()))}")
    if ids.shape[1] > max_len:
        raise ValueError(f"{name} has length {ids.shape[1]}, more than "
                         f"max_len={max_len}")
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
