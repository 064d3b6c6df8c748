r"""The training loop: forward, cross-entropy, backward, clip, AdamW, schedule.

One optimisation step on a batch of next-token targets $y_t$:

1. forward: logits $z_t = f_\theta(x)_t$;
2. loss: the mean cross-entropy $\mathcal{L} = -\frac{1}{n}\sum_t
   \log \mathrm{softmax}(z_t)_{y_t}$ over the $n$ targets that count;
3. backward: autograd fills $g = \partial\mathcal{L}/\partial\theta$ for
   every parameter at once ($W^Q, W^K, W^V, W^O$, embeddings, FFN, ...);
4. clip: if $\lVert g \rVert_2 > c$, rescale $g \leftarrow g\,c/\lVert g
   \rVert_2$ (one global norm over all parameters);
5. AdamW (Loshchilov and Hutter 2019) with learning rate $\eta_t$:
   $m \leftarrow \beta_1 m + (1-\beta_1) g$,
   $v \leftarrow \beta_2 v + (1-\beta_2) g^2$,
   $\theta \leftarrow \theta - \eta_t\big(\hat m / (\sqrt{\hat v} +
   \epsilon) + \lambda\,\theta\big)$ with bias-corrected $\hat m, \hat v$;
   weight decay $\lambda$ applies to matrices only, not to biases or
   norm gains.

The learning rate rises linearly during ``warmup_steps`` and then stays
constant or follows a half cosine to zero: :func:`lr_multiplier`.

This is the course's one training loop. Chapter 7 explains it step by
step; the small experiments of chapters 1 and 5 (recall, induction heads)
already run on it with a constant rate and no clipping, and the recipes
of chapter 7 (:mod:`course_lib.tasks.markov`, :mod:`course_lib.tasks.translation_task`)
and chapter 11 call it with their settings.

Shape letters: B batch, T length, V vocabulary.
"""
from __future__ import annotations

import hashlib
import io
import math
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from ._util.threads import small_ops
from ._util.validation import check_batch, check_int, check_real, check_type

__all__ = ["lr_multiplier", "make_optimizer", "next_token_loss",
           "bits_per_token", "label_smoothed_loss", "History",
           "train", "evaluate", "save_checkpoint", "save_state_file",
           "read_state_file", "load_checkpoint", "IGNORE"]

# A target that no loss counts (padding, a prompt); also
# torch.nn.functional.cross_entropy's default ignore_index.
IGNORE = -100


def lr_multiplier(step: int, *, warmup_steps: int, total_steps: int,
                  schedule: str = "constant") -> float:
    r"""Factor $\eta_t / \eta$ of the learning rate at (0-based) ``step``.

    Warmup: $\eta_t/\eta = (t + 1) / t_w$ for $t < t_w$, so the first
    step already moves and step $t_w - 1$ reaches the full rate. After
    warmup: 1 (``"constant"``) or $\tfrac12\big(1 + \cos(\pi\,
    \frac{t - t_w}{t_{\max} - t_w})\big)$ (``"cosine"``, 1 down to 0).

    Args:
        step: $t \ge 0$. warmup_steps: $t_w \ge 0$.
        total_steps: $t_{\max}$, the length of the run (for the cosine).
        schedule: ``"constant"`` or ``"cosine"``.
    """
    check_int("step", step, minimum=0)
    check_int("warmup_steps", warmup_steps, minimum=0)
    check_int("total_steps", total_steps, minimum=max(warmup_steps, 1))
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"schedule must be 'constant' or 'cosine', got "
                         f"{schedule!r}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant" or total_steps == warmup_steps:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, *, lr: float, weight_decay: float = 0.0,
                   betas: tuple[float, float] = (0.9, 0.98),
                   eps: float = 1e-9) -> torch.optim.AdamW:
    r"""AdamW with weight decay on matrices (``dim >= 2``) only.

    Decaying a bias or a norm gain towards 0 has no regularising meaning
    (nanoGPT makes the same split). Defaults $\beta = (0.9, 0.98)$,
    $\epsilon = 10^{-9}$ are the paper's (sec. 5.3).
    """
    check_type("model", model, nn.Module, "a torch.nn.Module")
    check_real("lr", lr, positive=True)
    check_real("weight_decay", weight_decay)
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2],
         "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


def next_token_loss(model: nn.Module, batch) -> torch.Tensor:
    r"""Mean cross-entropy of ``model(inputs)`` against ``targets``.

    Args:
        batch: ``(inputs, targets)``, ``(B, T)`` long; targets equal to
            ``IGNORE`` do not count.

    Returns:
        Scalar loss in nats per counted token.
    """
    check_batch("batch", batch, ("inputs", "targets"))
    inputs, targets = batch
    if not (targets != IGNORE).any():
        raise ValueError("targets must hold at least one target that is not "
                         "IGNORE (a mean over no tokens is NaN)")
    logits = model(inputs)                                   # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                           ignore_index=IGNORE)


def _check_logits_targets(logits, targets) -> None:
    """``logits`` (B, T, V) floating, ``targets`` (B, T) integer ids in
    ``[0, V)`` or ``IGNORE``, at least one of them counted."""
    check_type("logits", logits, torch.Tensor, "a torch.Tensor")
    check_type("targets", targets, torch.Tensor, "a torch.Tensor")
    if not logits.dtype.is_floating_point or logits.dim() != 3:
        raise ValueError(f"logits must be a floating (B, T, V) tensor, got "
                         f"{logits.dtype} of shape {tuple(logits.shape)}")
    if targets.dtype.is_floating_point or targets.dtype == torch.bool \
            or tuple(targets.shape) != tuple(logits.shape[:2]):
        raise ValueError(f"targets must be an integer (B, T) = "
                         f"{tuple(logits.shape[:2])} tensor, got "
                         f"{targets.dtype} of shape {tuple(targets.shape)}")
    keep = targets != IGNORE
    if not keep.any():
        raise ValueError("targets must hold at least one target that is not "
                         "IGNORE (a mean over no tokens is NaN)")
    if ((targets[keep] < 0) | (targets[keep] >= logits.shape[-1])).any():
        raise ValueError(f"targets must be IGNORE or ids in [0, "
                         f"{logits.shape[-1]})")


def _counted_log_probs(logits, targets):
    """``log q`` (n, V) in float64 at the n counted positions, and their
    targets (n,). ``log q = z - logsumexp(z)``: finite for any finite
    logits."""
    keep = targets != IGNORE                                 # (B, T)
    z = logits[keep].double()                                # (n, V)
    return z - torch.logsumexp(z, dim=-1, keepdim=True), targets[keep]


def bits_per_token(logits: torch.Tensor, targets: torch.Tensor) -> float:
    r"""Mean surprisal in bits of the counted targets.

    $$\frac{1}{n}\sum_{t:\,y_t \ne \text{IGNORE}}
    -\log_2 \mathrm{softmax}(z_t)_{y_t},$$

    the cross-entropy of :func:`next_token_loss` divided by $\ln 2$,
    computed in float64 with ``logsumexp`` (finite for logits of any
    size).

    Args:
        logits: ``(B, T, V)`` floating.
        targets: ``(B, T)`` integer ids, ``IGNORE`` where nothing counts
            (at least one must count).

    Returns:
        Bits per counted target, a Python float.
    """
    _check_logits_targets(logits, targets)
    log_q, y = _counted_log_probs(logits, targets)           # (n, V), (n,)
    nats = -log_q.gather(-1, y[:, None])[:, 0].mean()
    return (nats / math.log(2)).item()


def label_smoothed_loss(logits: torch.Tensor, targets: torch.Tensor,
                        epsilon: float) -> float:
    r"""Cross-entropy against a smoothed target that gives the observed
    token $1 - \epsilon$ and each of the $V - 1$ other tokens
    $\epsilon / (V - 1)$, averaged over the counted targets:

    $$y'_v = (1 - \epsilon)\,[v = y] + \frac{\epsilon}{V - 1}\,[v \ne y],
    \qquad \mathcal{L} = \frac{1}{n}\sum_t -\sum_v y'_{t,v}
    \log q_{t,v}.$$

    This is fairseq's ``label_smoothed_cross_entropy``. PyTorch's
    ``F.cross_entropy(label_smoothing=eps)`` spreads $\epsilon$ over all
    $V$ tokens, the observed one included ($y'_v = (1 - \epsilon)[v = y]
    + \epsilon / V$); the two agree when PyTorch is given
    $\epsilon V / (V - 1)$. $\epsilon = 0$ is the ordinary cross-entropy.

    Args:
        logits: ``(B, T, V)`` floating, $V \ge 2$.
        targets: ``(B, T)`` integer ids, ``IGNORE`` where nothing counts
            (at least one must count).
        epsilon: the smoothing mass, in ``[0, 1]``.

    Returns:
        Nats per counted target, a Python float.
    """
    _check_logits_targets(logits, targets)
    check_real("epsilon", epsilon, minimum=0, maximum=1)
    V = logits.shape[-1]
    if V < 2:
        raise ValueError(f"logits must have V >= 2 tokens to smooth over, "
                         f"got V = {V}")
    log_q, y = _counted_log_probs(logits, targets)           # (n, V), (n,)
    smooth = torch.full_like(log_q, epsilon / (V - 1))       # (n, V) = y'
    smooth.scatter_(-1, y[:, None], 1.0 - epsilon)
    return -(smooth * log_q).sum(-1).mean().item()


@dataclass
class History:
    """What happened during :func:`train`, one entry per step or eval."""
    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)   # before clipping
    val_step: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    tokens: int = 0                  # counted target tokens seen
    seconds: float = 0.0             # wall time of the training steps


@small_ops()  # steps of small models: see course_lib._util.threads
def train(model: nn.Module, batches: Iterable, *, steps: int, lr: float,
          warmup_steps: int = 0, schedule: str = "constant",
          weight_decay: float = 0.0, clip_norm: float | None = 1.0,
          loss_fn: Callable = next_token_loss,
          eval_fn: Callable[[nn.Module], float] | None = None,
          eval_every: int = 0, optimizer: torch.optim.Optimizer | None = None,
          start_step: int = 0, total_steps: int | None = None,
          seed: int | None = 0, progress: bool = True) -> History:
    r"""Train ``model`` in place for ``steps`` steps.

    Args:
        model: any module that ``loss_fn`` can call.
        batches: an iterable of batches (used ``steps`` times).
        steps: number of optimiser steps.
        lr: peak learning rate $\eta$.
        warmup_steps, schedule: see :func:`lr_multiplier`.
        weight_decay: AdamW's $\lambda$ (matrices only).
        clip_norm: max global gradient norm $c$; ``None`` = no clipping.
        loss_fn: ``loss_fn(model, batch) -> scalar``.
        eval_fn: ``eval_fn(model) -> float`` validation loss, called
            (in eval mode, without gradients) every ``eval_every`` steps
            and after the last step.
        optimizer: continue with this optimizer (e.g. from a checkpoint);
            default a new :func:`make_optimizer`.
        start_step: the step count so far (resuming: the schedule, the
            evaluation points and the history continue from here).
        total_steps: $t_{\max}$, the length of the whole run, which the
            cosine schedule decays over; default ``start_step + steps``.
            A run cut into pieces passes the same ``total_steps`` to
            every piece, so that each piece follows the one schedule.
        seed: seeds torch's global generator (dropout) before the first
            step of a fresh run; ``None`` leaves it as it is. A resumed
            call (``start_step > 0``) never reseeds: it continues the
            generator, which :func:`load_checkpoint` restores.
        progress: show a ``tqdm.auto`` progress bar.

    Resuming exactly: with the model, the optimizer and torch's generator
    restored by :func:`load_checkpoint`, the same ``total_steps``, and the
    batch stream positioned after the ``start_step`` batches already used
    (the step count is the data position: one batch per step), the resumed
    steps are those of an uninterrupted run, bit for bit.

    Returns:
        A :class:`History`.
    """
    check_int("steps", steps, minimum=1)
    check_int("eval_every", eval_every, minimum=0)
    check_int("start_step", start_step, minimum=0)
    if clip_norm is not None:
        check_real("clip_norm", clip_norm, positive=True)
    end = start_step + steps                 # this call stops here
    if total_steps is None:
        total_steps = end
    check_int("total_steps", total_steps, minimum=end)
    lr_multiplier(0, warmup_steps=warmup_steps, total_steps=total_steps,
                  schedule=schedule)                   # validates early
    if optimizer is None:
        optimizer = make_optimizer(model, lr=lr, weight_decay=weight_decay)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if seed is not None and start_step == 0:
        # A fresh run starts its dropout stream here; a resumed one goes
        # on with the generator state restored from the checkpoint.
        torch.manual_seed(seed)
    history = History()
    from tqdm.auto import tqdm  # imported here: only train() needs it
    bar = tqdm(total=steps, disable=not progress, leave=False)
    batch_iter = iter(batches)
    start = time.perf_counter()

    def evaluate_now(step: int) -> None:
        nonlocal start
        paused = time.perf_counter()
        history.val_step.append(step)
        history.val_loss.append(evaluate(model, eval_fn))
        # evaluation time does not count as training time
        start += time.perf_counter() - paused

    for step in range(start_step, end):
        eta = lr * lr_multiplier(step, warmup_steps=warmup_steps,
                                 total_steps=total_steps, schedule=schedule)
        for group in optimizer.param_groups:
            group["lr"] = eta
        batch = next(batch_iter)
        model.train()
        loss = loss_fn(model, batch)                 # 1) forward, 2) loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()                              # 3) backward
        # 4) g <- g * min(1, c / ||g||); returns ||g|| before clipping
        norm = nn.utils.clip_grad_norm_(
            params, clip_norm if clip_norm is not None else math.inf)
        optimizer.step()                             # 5) AdamW update
        history.step.append(step)
        history.loss.append(loss.item())
        history.lr.append(eta)
        history.grad_norm.append(norm.item())
        history.tokens += _count_targets(batch)
        if eval_fn is not None and eval_every and \
                (step + 1) % eval_every == 0 and step + 1 < end:
            evaluate_now(step + 1)
        bar.update()
        bar.set_postfix(loss=f"{history.loss[-1]:.3f}", refresh=False)
    bar.close()
    if eval_fn is not None:
        evaluate_now(end)
    history.seconds = time.perf_counter() - start
    return history


def _count_targets(batch) -> int:
    """Tokens that count in the loss: the last tensor's non-IGNORE ids."""
    targets = batch[-1] if isinstance(batch, (tuple, list)) else batch
    return int((targets != IGNORE).sum()) if isinstance(
        targets, torch.Tensor) else 0


@torch.no_grad()
def evaluate(model: nn.Module, eval_fn: Callable[[nn.Module], float]
             ) -> float:
    """Run ``eval_fn(model)`` in eval mode without gradients; restore the
    training mode afterwards.
    """
    check_type("model", model, nn.Module, "a torch.nn.Module")
    was_training = model.training
    model.eval()
    try:
        return float(eval_fn(model))
    finally:
        model.train(was_training)


def save_checkpoint(path, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None, step: int,
                    **extra) -> None:
    """Save the model, the optimizer state (AdamW's $m$, $v$ and step
    counts), the step and the state of torch's global generator.

    Resuming needs all of them: without $m$ and $v$ the next AdamW steps
    differ from those of an uninterrupted run, and without the generator
    state the dropout masks do. The step is also the data position (one
    batch per step); put what recreates the batch stream, such as its
    seed, into ``extra``. ``extra``
    values must be what :func:`load_checkpoint`'s safe loader
    (``weights_only=True``) reads back: None, bool, int, float, str,
    tensors, and lists, tuples and dicts of those; anything else (a NumPy
    scalar, a dataclass, a path) is rejected here rather than saved
    unreadable.

    The file is what ``torch.save`` writes (``torch.load`` reads it as
    usual) with the sha256 of its bytes in the zip archive's comment at
    the end: :func:`load_checkpoint` refuses a file whose bytes changed
    after saving instead of loading silently changed weights.
    """
    check_int("step", step, minimum=0)
    for key, value in extra.items():
        if not _loadable(value):
            raise ValueError(
                f"extra {key}={value!r:.60} cannot be loaded back safely: "
                f"use None, bool, int, float, str, a tensor, or a list, "
                f"tuple or dict of those (e.g. float(x), str(path))")
    save_state_file(path, {
        "model": model.state_dict(),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "rng": torch.get_rng_state(),                  # dropout stream
        "step": step, "extra": extra})


def save_state_file(path, state: dict) -> None:
    """``torch.save(state, path)``, with the sha256 of the file's bytes
    recorded at its end, so that :func:`read_state_file` (and every
    loader of the course built on it) refuses the file if a byte changes
    later. ``torch.load`` still reads it as usual."""
    check_type("state", state, dict, "a dict")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    Path(path).write_bytes(_with_sha256(buffer.getvalue()))


# A file torch.save wrote is a zip archive; it ends with the 22-byte "end
# of central directory" record (signature PK\x05\x06), whose last two
# bytes give the length of the archive's comment, which follows it. Zip
# readers, torch.load among them, skip the comment. save_checkpoint puts
# _SHA256_TAG and the sha256 (64 hex digits) of every byte before those
# digits there.
_SHA256_TAG = b"course_lib checkpoint sha256 "
_END_RECORD = b"PK\x05\x06"


def _with_sha256(data: bytes) -> bytes:
    """``data`` (a ``torch.save`` zip archive without a comment) with the
    comment ``_SHA256_TAG`` + the sha256 of everything before the digits.
    """
    if data[-22:-18] != _END_RECORD or data[-2:] != b"\0\0":
        raise RuntimeError("torch.save wrote no zip archive without a "
                           "comment; cannot record the checkpoint's sha256")
    head = data[:-2] + struct.pack("<H", len(_SHA256_TAG) + 64) + _SHA256_TAG
    return head + hashlib.sha256(head).hexdigest().encode("ascii")


def _verified_bytes(path: Path) -> bytes:
    """The bytes of ``path``, after checking the sha256 that
    :func:`save_checkpoint` put at their end.

    A file without one (written by ``torch.save`` itself: its archive
    comment is empty, so it ends in two zero bytes) is returned as it is;
    any other file must end in ``_SHA256_TAG`` and the sha256 of the
    bytes before the digits. One changed byte cannot make a recorded file
    pass for one without a digest (its last two bytes are hex digits,
    never zero bytes), so any single changed byte of a saved checkpoint
    is caught.
    """
    data = path.read_bytes()
    if data[-22:-18] == _END_RECORD and data[-2:] == b"\0\0":
        return data                        # plain torch.save: nothing to check
    head, digits = data[:-64], data[-64:]
    if not head.endswith(_SHA256_TAG) or \
            hashlib.sha256(head).hexdigest().encode("ascii") != digits:
        raise ValueError(
            f"{str(path)!r} is damaged or was changed after it was saved: "
            f"its bytes do not match the sha256 recorded in it (or it is "
            f"not a torch.save file)")
    return data


def _loadable(value) -> bool:
    """True if ``torch.load(weights_only=True)`` can read ``value`` back."""
    if value is None or type(value) in (bool, int, float, str) or \
            isinstance(value, torch.Tensor):
        return True
    if type(value) in (list, tuple):
        return all(_loadable(v) for v in value)
    if type(value) is dict:
        return all(_loadable(k) and _loadable(v) for k, v in value.items())
    return False


def read_state_file(path, what: str, hint: str = "") -> dict:
    """The dict that ``torch.save`` wrote to ``path`` (tensors on the CPU,
    ``weights_only``), or a ``ValueError`` naming ``what`` was expected
    there (``hint``: what to do about it, appended to the message). Used
    by every checkpoint loader of the course.

    A file written by :func:`save_checkpoint` carries the sha256 of its
    bytes; it is checked before anything is loaded, and a mismatch (the
    file was damaged or changed) is a ``ValueError`` naming the path. A
    plain ``torch.save`` file has no digest to check; if ``torch.load``
    cannot read it, that is also a ``ValueError`` naming the path.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path must be an existing {what}, got "
                         f"{str(path)!r}{hint}")
    data = _verified_bytes(path)
    try:
        return torch.load(io.BytesIO(data), map_location="cpu",
                          weights_only=True)
    except (RuntimeError, EOFError) as err:     # a damaged zip or pickle
        raise ValueError(f"{str(path)!r} is not a readable {what} (damaged "
                         f"or not a torch.save file): {err}") from err


def load_checkpoint(path, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, *,
                    restore_rng: bool = True) -> dict:
    """Load a :func:`save_checkpoint` file into ``model`` (and optimizer).

    The file's sha256 is checked first (:func:`read_state_file`): a
    damaged or changed file raises a ``ValueError`` naming the path, and
    nothing is loaded.

    Args:
        restore_rng: also set torch's global generator to the saved state,
            so that a resumed run draws the dropout masks an uninterrupted
            run would have drawn. ``False`` leaves the generator alone
            (loading a model only to use it).

    Returns:
        ``{"step": int, **extra}``.
    """
    state = read_state_file(path, "checkpoint file")
    model.load_state_dict(state["model"])
    if optimizer is not None:
        if state["optimizer"] is None:
            raise ValueError(f"optimizer given, but {str(path)!r} holds no "
                             f"optimizer state")
        optimizer.load_state_dict(state["optimizer"])
    if restore_rng and state.get("rng") is not None:
        torch.set_rng_state(state["rng"])
    return {"step": state["step"], **state["extra"]}
