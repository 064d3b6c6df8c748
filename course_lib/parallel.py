r"""Running one function on several processes, and the collectives that
tensor and expert parallelism are made of.

A model that no longer fits on one device is cut into pieces, one per
*rank* (a process, on a cluster one per GPU), and the ranks exchange
tensors with *collectives* of ``torch.distributed``. Here the ranks are
CPU processes of one machine talking through the gloo backend; on a
cluster the same code runs under ``torchrun`` with NCCL.

:func:`run` starts ``world_size`` processes, joins them into one process
group and calls ``worker(rank, world_size, *args)`` in each. The worker
must live in an importable module (here ``course_lib``): new processes
are *spawned* (a fresh interpreter, the only start method that is safe
with torch's threads), and a function defined in a notebook cell cannot
be found by name in them.

Two pairs of autograd-aware collectives follow (Megatron-LM, Shoeybi et
al. 2019, sec. 3, the conjugate operators $f$ and $g$):

- :func:`copy_to_parallel` ($f$): identity forward, all-reduce backward.
  Every rank holds the same input $X$ and uses it with its own shard
  $A_r$; the gradient $\partial L / \partial X = \sum_r
  (\partial L / \partial Y_r) A_r^\top$ needs every rank's term.
- :func:`reduce_from_parallel` ($g$): all-reduce forward, identity
  backward. $Y = \sum_r Y_r$; each rank already holds the full
  $\partial L / \partial Y$.

and :func:`all_to_all`, the exchange of expert parallelism: rank $r$
sends rows ``in_splits[s]`` to rank $s$ and receives ``out_splits[s]``
rows from it (uneven splits); its backward is the reverse exchange.

Shape letters: W ranks (``world_size``), ... any dimensions.

Introduced in chapter 14.
"""
from __future__ import annotations

import dataclasses
import datetime
import io
import queue
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .validation import check_int, check_real

__all__ = ["run", "ParallelError", "group_rank_and_size", "copy_to_parallel",
           "reduce_from_parallel", "all_to_all"]

MASTER_ADDR = "127.0.0.1"


class ParallelError(RuntimeError):
    """A rank of :func:`run` failed, or the group did not finish in time.

    Attributes: ``rank`` (None for a timeout) and ``original``, the
    message of the rank's exception.

    Introduced in chapter 14.
    """

    def __init__(self, message: str, *, rank: int | None = None,
                 original: str = "") -> None:
        super().__init__(message)
        self.rank, self.original = rank, original


def _to_cpu(obj):
    """Results leave their process: tensors detached and on the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_to_cpu(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{
            f.name: _to_cpu(getattr(obj, f.name))
            for f in dataclasses.fields(obj) if f.init})
    return obj


def _worker_main(rank, world_size, port, timeout, threads, results,
                 worker, args) -> None:
    """Body of each spawned process: join the group, run, report."""
    reported = False

    def report_error(exc: BaseException) -> None:
        results.put((rank, False, f"{type(exc).__name__}: {exc}",
                     traceback.format_exc()))

    try:
        torch.set_num_threads(threads)
        store = dist.TCPStore(MASTER_ADDR, port, None, False,
                              timeout=datetime.timedelta(seconds=timeout))
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout))
        try:
            out = _to_cpu(worker(rank, world_size, *args))
        except BaseException as exc:
            # report before the group goes down: closing it makes the
            # other ranks fail too ("connection closed by peer"), and the
            # caller must hear about the cause first
            report_error(exc)
            reported = True
            raise
        finally:
            dist.destroy_process_group()       # also when worker raised
        # torch.save: tensors travel as bytes, not as shared memory that
        # would vanish with this process
        buf = io.BytesIO()
        torch.save(out, buf)
        results.put((rank, True, buf.getvalue(), ""))
    except BaseException as exc:               # noqa: BLE001 (reported)
        if not reported:
            report_error(exc)


def _check_worker(worker) -> None:
    if not callable(worker):
        raise TypeError(f"worker must be a function, got {worker!r:.60}")
    main = sys.modules.get("__main__")
    if getattr(worker, "__module__", None) == "__main__" and \
            not hasattr(main, "__file__"):
        raise ValueError(
            f"worker must live in an importable module (e.g. course_lib), "
            f"got {worker.__qualname__} defined in __main__ (a notebook "
            f"cell or stdin), which spawned processes cannot import")


def _master_store(port: int | None) -> dist.TCPStore:
    """The rendezvous server, in the calling process. Port 0 lets the
    operating system pick a free port while the server already holds it,
    so no other program can take it between choice and use."""
    try:
        return dist.TCPStore(MASTER_ADDR, port or 0, None, True,
                             wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=30))
    except RuntimeError as exc:                # DistNetworkError
        raise ValueError(f"port {port} on {MASTER_ADDR} is in use or "
                         f"unavailable (pass port=None to pick a free "
                         f"one): {exc}") from None


def run(worker, world_size: int, *args, timeout: float = 120.0,
        port: int | None = None, threads: int = 1) -> list:
    r"""Run ``worker(rank, world_size, *args)`` on ``world_size`` local
    processes joined in one gloo process group; return each rank's result.

    Each process joins the group before the call and destroys it after,
    also when the worker raises. If a rank raises, the others are
    terminated (they may be waiting in a collective for the failed rank)
    and :class:`ParallelError` names the rank and its exception; if the
    group has not finished after ``timeout`` seconds, every rank is
    terminated and :class:`ParallelError` says which ranks were late.

    Args:
        worker: a function of an importable module, called with
            ``(rank, world_size, *args)``; ``args`` must be picklable.
        world_size: number of processes $W \ge 1$.
        timeout: seconds for the whole group (start-up included).
        port: rendezvous port on 127.0.0.1; None picks a free one.
        threads: torch threads per process (1: processes share cores).

    Returns:
        ``[result of rank 0, ..., result of rank W-1]``, tensors detached
        and on the CPU.

    Introduced in chapter 14.
    """
    _check_worker(worker)
    check_int("world_size", world_size, minimum=1)
    check_real("timeout", timeout, positive=True)
    check_int("threads", threads, minimum=1)
    if port is not None:
        check_int("port", port, minimum=1)
    store = _master_store(port)               # keep alive until the end
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    procs = [ctx.Process(target=_worker_main, daemon=True, args=(
        r, world_size, store.port, timeout, threads, results, worker, args))
        for r in range(world_size)]
    done: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.start()
        while len(done) < world_size:
            if results.empty():
                if time.monotonic() > deadline:
                    late = sorted(set(range(world_size)) - set(done))
                    raise ParallelError(
                        f"ranks {late} did not finish within timeout="
                        f"{timeout} s (all ranks stopped)")
                dead = [r for r, p in enumerate(procs) if r not in done
                        and p.exitcode is not None]
                if dead and results.empty():
                    time.sleep(0.2)           # a last message in flight?
                    if results.empty():
                        raise ParallelError(
                            f"rank {dead[0]} exited with code "
                            f"{procs[dead[0]].exitcode} without a result",
                            rank=dead[0])
                time.sleep(0.01)
                continue
            rank, ok, payload, tb = results.get()
            if not ok:
                raise ParallelError(
                    f"rank {rank} of {world_size} failed with {payload} "
                    f"(the other ranks were stopped)\n\n{tb}",
                    rank=rank, original=payload)
            done[rank] = torch.load(io.BytesIO(payload), weights_only=False)
    finally:
        for p in procs:                       # stop whoever is still busy
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        del store
    return [done[r] for r in range(world_size)]


# ------------------------------------------------------------ collectives
def group_rank_and_size(group=None) -> tuple[int, int]:
    """``(rank, world_size)`` of this process in ``group`` (default: the
    whole world); ``(0, 1)`` when no process group is initialised.

    Introduced in chapter 14.
    """
    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _need_group(group, world_size: int) -> None:
    if world_size > 1 and not dist.is_initialized():
        raise RuntimeError(
            f"this module was built for world_size={world_size} but no "
            f"process group is initialised: run it inside a worker of "
            f"course_lib.parallel.run (or torchrun)")


class _CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)  # sum_r dL/dY_r A_r^T
        return grad, None


class _ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)       # Y = sum_r Y_r
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_parallel(x: torch.Tensor, group=None) -> torch.Tensor:
    """Megatron's $f$: ``x`` unchanged; in backward the gradient is
    all-reduced (summed over the ranks). ``x`` any shape.

    Introduced in chapter 14.
    """
    if group_rank_and_size(group)[1] == 1:
        return x
    return _CopyToParallel.apply(x, group)


def reduce_from_parallel(x: torch.Tensor, group=None) -> torch.Tensor:
    """Megatron's $g$: the sum of ``x`` over the ranks, one all-reduce;
    the gradient passes unchanged. ``x`` any shape, the same on every rank.

    Introduced in chapter 14.
    """
    if group_rank_and_size(group)[1] == 1:
        return x
    return _ReduceFromParallel.apply(x, group)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group, ctx.rows = (out_splits, in_splits), group, \
            x.shape[0]
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits,
                               group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        # the reverse exchange: what came from rank s goes back to s
        back = grad.new_empty((ctx.rows,) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits,
                               out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(x: torch.Tensor, out_splits: list[int],
               in_splits: list[int], group=None) -> torch.Tensor:
    r"""Exchange rows between ranks: rows ``in_splits[0]`` of ``x`` go to
    rank 0, the next ``in_splits[1]`` to rank 1, ...; the result holds
    ``out_splits[s]`` rows from each rank $s$, in rank order.

    Differentiable: the backward sends the gradient rows back where they
    came from. Every rank must take part (forward and backward).

    Args:
        x: ``(sum(in_splits), ...)``.
        out_splits, in_splits: W row counts each (``out_splits`` of this
            rank is ``in_splits`` of the others, entry for this rank).

    Returns:
        ``(sum(out_splits), ...)``.

    Introduced in chapter 14.
    """
    W = group_rank_and_size(group)[1]
    if len(out_splits) != W or len(in_splits) != W \
            or sum(in_splits) != x.shape[0]:
        raise ValueError(
            f"in_splits and out_splits must have world_size={W} entries "
            f"and sum(in_splits) must be x.shape[0]={x.shape[0]}, got "
            f"in_splits={in_splits}, out_splits={out_splits}")
    if W == 1:
        return x
    return _AllToAll.apply(x, list(out_splits), list(in_splits), group)
