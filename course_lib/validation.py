"""Argument checks shared by every course_lib module.

Public functions reject bad input with a ``ValueError`` that names the
argument, the value received and what was expected. These helpers write
those messages the same way everywhere.

Introduced in chapter 2.
"""
from __future__ import annotations

import math
from numbers import Integral, Real

__all__ = ["check_int", "check_real", "broadcasts_to"]


def check_int(name: str, value, *, minimum: int) -> None:
    """``value`` must be an int (not a bool) and at least ``minimum``."""
    # bool is an Integral in Python; a flag passed as a size is a bug.
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(
            f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_real(name: str, value, *, positive: bool = False) -> None:
    """``value`` must be a finite real number (and > 0 with ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(
            f"{name} must be a real number, got {type(value).__name__} "
            f"{value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def broadcasts_to(shape, target) -> bool:
    """True if a tensor of ``shape`` broadcasts to exactly ``target``:
    ``torch.broadcast_shapes(shape, target) == target`` without its cost
    (tens of microseconds a call, paid in every layer of a real model
    at every decoding step; chapter 13)."""
    if len(shape) > len(target):
        return False
    return all(s == 1 or s == t for s, t in
               zip(reversed(tuple(shape)), reversed(tuple(target))))
