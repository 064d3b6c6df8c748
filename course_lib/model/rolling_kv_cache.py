r"""A rolling (sliding-window) KV cache kept as a ring buffer (chapter 9's
transfer exercise).

A model trained with an attention window of $W$ positions, such as
Mistral 7B v0.1, never reads a key or value older than $W$ positions, so
its cache needs only $W$ slots per layer. Position $t$ is stored in slot

$$s(t) = t \bmod W,$$

overwriting position $t - W$, which has just left the window. Writing
costs the same at every step and the buffer never grows. The slots are
in position order only until the first wrap: :func:`rolling_window` reads
them back oldest first.

Shape letters: ``...`` any leading axes (batch B, K/V heads G), W window
slots, T new positions, d_h head width.
"""
from __future__ import annotations

import torch

from .._util.validation import check_int, check_type

__all__ = ["rolling_write", "rolling_window"]


def _check_buffer(buffer) -> None:
    check_type("buffer", buffer, torch.Tensor, "a torch.Tensor")
    if buffer.dim() < 2 or buffer.shape[-2] < 1:
        raise ValueError(f"buffer must have shape (..., W, d_h) with W >= 1,"
                         f" got {tuple(buffer.shape)}")


def rolling_write(buffer: torch.Tensor, new: torch.Tensor,
                  start: int) -> torch.Tensor:
    r"""The ring buffer after writing the keys (or values) of positions
    ``start, ..., start + T - 1``: position $t$ goes to slot $t \bmod W$.

    When $T > W$ only the last $W$ new positions survive, as if they had
    been written one at a time.

    Args:
        buffer: ``(..., W, d_h)`` the ring (not modified).
        new: ``(..., T, d_h)`` with the same leading axes and ``d_h``,
            ``T >= 1``, the new positions in order.
        start: the position of ``new[..., 0, :]``, an int >= 0.

    Returns:
        A new ``(..., W, d_h)`` tensor.
    """
    _check_buffer(buffer)
    check_type("new", new, torch.Tensor, "a torch.Tensor")
    check_int("start", start, minimum=0)
    if new.dim() != buffer.dim() or new.shape[:-2] != buffer.shape[:-2] \
            or new.shape[-1] != buffer.shape[-1] or new.shape[-2] < 1 \
            or new.dtype != buffer.dtype:
        raise ValueError(f"new must have shape (..., T, d_h) matching "
                         f"buffer {tuple(buffer.shape)} and its dtype, got "
                         f"{new.dtype} {tuple(new.shape)}")
    W, T = buffer.shape[-2], new.shape[-2]
    keep = min(T, W)                       # older new positions are evicted
    positions = torch.arange(start + T - keep, start + T)    # (keep,)
    out = buffer.clone()
    out[..., positions % W, :] = new[..., T - keep:, :]      # distinct slots
    return out


def rolling_window(buffer: torch.Tensor, n_seen: int) -> torch.Tensor:
    r"""The cached positions oldest first, after ``n_seen`` positions
    ``0, ..., n_seen - 1`` were written: positions
    $\max(0, n - W), \dots, n - 1$.

    Args:
        buffer: ``(..., W, d_h)`` the ring.
        n_seen: positions written so far, an int >= 0.

    Returns:
        ``(..., min(n_seen, W), d_h)``.
    """
    _check_buffer(buffer)
    check_int("n_seen", n_seen, minimum=0)
    W = buffer.shape[-2]
    positions = torch.arange(max(0, n_seen - W), n_seen)     # (<= W,)
    return buffer[..., positions % W, :]
