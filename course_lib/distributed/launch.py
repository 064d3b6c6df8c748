r"""Running one function on several processes: the launcher of chapter
14's tensor and expert parallelism.

A model that no longer fits on one device is cut into pieces, one per
*rank* (a process, on a cluster one per GPU), and the ranks exchange
tensors with *collectives* of ``torch.distributed``. Here the ranks are
CPU processes of one machine talking through the gloo backend; on a
cluster the same code runs under ``torchrun`` with NCCL.

:func:`run` starts ``world_size`` processes, joins them into one process
group and calls ``worker(rank, world_size, *args)`` in each; a
:class:`Pool` starts the ranks once and reuses them across notebook
cells. The worker
must live in an importable module (here ``course_lib``): new processes
are *spawned* (a fresh interpreter, the only start method that is safe
with torch's threads), and a function defined in a notebook cell cannot
be found by name in them.

The collectives the parallel layers are built from (Megatron's $f$ and
$g$, a differentiable all-to-all) are in :mod:`course_lib.distributed.collectives`.

Shape letters: W ranks (``world_size``), ... any dimensions.
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import io
import os
import queue
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .._util.validation import check_int, check_real

__all__ = ["ParallelError", "run", "Pool"]

MASTER_ADDR = "127.0.0.1"


class ParallelError(RuntimeError):
    """A rank of :func:`run` failed, or the group did not finish in time.

    Attributes: ``rank`` (None for a timeout) and ``original``, the
    message of the rank's exception.
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


# A rank's own waits (joining the group, a collective) give up this much
# later than the caller's time-out, so that a slow start-up on a busy
# machine is reported by the caller as the group's time-out, and not as
# a gloo error of whichever rank gave up first ("connection closed by
# peer" when its partner stopped waiting).
RANK_TIMEOUT_MARGIN = 60.0


def _join_group(rank: int, world_size: int, port: int, timeout: float,
               threads: int) -> None:
    """In a spawned rank: set torch's threads and join the gloo process
    group through the master's TCP store on ``port``; the rank's own
    waits end ``RANK_TIMEOUT_MARGIN`` s after the caller's ``timeout``."""
    torch.set_num_threads(threads)
    wait = datetime.timedelta(seconds=timeout + RANK_TIMEOUT_MARGIN)
    store = dist.TCPStore(MASTER_ADDR, port, None, False, timeout=wait)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size,
        timeout=wait)


def _worker_main(rank, world_size, port, timeout, threads, results,
                 worker, args) -> None:
    """Body of each spawned process: join the group, run, report."""
    reported = False

    def report_error(exc: BaseException) -> None:
        results.put((rank, False, f"{type(exc).__name__}: {exc}",
                     traceback.format_exc()))

    try:
        _join_group(rank, world_size, port, timeout, threads)
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


def _main_file() -> str | None:
    """The file spawned processes re-run as ``__main__``, or None where
    there is none to run (a notebook, ``python -`` or ``-c``; started
    with ``-m`` the module is imported by name instead)."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None):
        return None
    path = getattr(main, "__file__", None)
    return path if path and os.path.isfile(path) else None


def _check_worker(worker) -> None:
    if not callable(worker):
        raise TypeError(f"worker must be a function, got {worker!r:.60}")
    main = sys.modules.get("__main__")
    if getattr(worker, "__module__", None) == "__main__" and \
            _main_file() is None and \
            not getattr(getattr(main, "__spec__", None), "name", None):
        raise ValueError(
            f"worker must live in an importable module (e.g. course_lib), "
            f"got {worker.__qualname__} defined in __main__ (a notebook "
            f"cell or stdin), which spawned processes cannot import")


@contextlib.contextmanager
def _spawnable_main():
    """Hide a ``__main__.__file__`` that names no file (``'<stdin>'``):
    spawn would try to re-run it in every child and fail."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or _main_file() is not None or \
            getattr(getattr(main, "__spec__", None), "name", None):
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


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
        with _spawnable_main():
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


def _watch_parent(parent_pid: int) -> None:
    """Exit this process as soon as its parent is gone (a killed kernel
    cannot close its pool). Runs in a daemon thread."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(1)
        time.sleep(0.5)


def _pool_main(rank, world_size, port, timeout, threads, tasks, results,
               parent_pid) -> None:
    """Body of each rank: join the group once, then run tasks until a
    ``None`` task (close) arrives."""
    threading.Thread(target=_watch_parent, args=(parent_pid,),
                     daemon=True).start()
    try:
        _join_group(rank, world_size, port, timeout, threads)
        results.put((rank, -1, True, b"", ""))           # ready
    except BaseException as exc:                         # noqa: BLE001
        results.put((rank, -1, False, f"{type(exc).__name__}: {exc}",
                     traceback.format_exc()))
        return
    try:
        while True:
            task = tasks.get()
            if task is None:
                break
            call, worker, args, kwargs = task
            try:
                out = _to_cpu(worker(rank, world_size, *args, **kwargs))
                buf = io.BytesIO()
                torch.save(out, buf)
                results.put((rank, call, True, buf.getvalue(), ""))
            except BaseException as exc:                 # noqa: BLE001
                results.put((rank, call, False,
                             f"{type(exc).__name__}: {exc}",
                             traceback.format_exc()))
                # the group may be broken (peers blocked in a collective):
                # the parent stops everyone
                return
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class Pool:
    r"""``world_size`` local ranks in one gloo process group, started once
    and reused by every :meth:`run`.

    ``pool.run(worker, *args)`` calls ``worker(rank, world_size, *args)``
    on every rank, in the pool's process group, and returns
    ``[result of rank 0, ..., result of rank W-1]``, exactly as
    :func:`course_lib.distributed.launch.run` does, without paying for process
    start-up again. Process groups a worker creates with
    ``torch.distributed.new_group`` stay alive for later calls.

    A rank that raises, or a call that exceeds its timeout, closes the
    pool (all ranks stopped) and raises
    :class:`~course_lib.distributed.launch.ParallelError`; the pool cannot be used
    afterwards.

    Args:
        world_size: number of ranks $W \ge 1$.
        timeout: default seconds for start-up and for each call.
        port: rendezvous port on 127.0.0.1; None picks a free one.
        threads: torch threads per rank (1: ranks share the cores).

    Use as ``with Pool(4) as pool: ...`` or call :meth:`close`.
    """

    def __init__(self, world_size: int, *, timeout: float = 120.0,
                 port: int | None = None, threads: int = 1) -> None:
        check_int("world_size", world_size, minimum=1)
        check_real("timeout", timeout, positive=True)
        check_int("threads", threads, minimum=1)
        if port is not None:
            check_int("port", port, minimum=1)
        self.world_size, self.timeout = world_size, float(timeout)
        self.closed, self._calls = True, 0
        self._procs: list = []
        self._store = _master_store(port)       # alive while the pool is
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        self._tasks = [ctx.SimpleQueue() for _ in range(world_size)]
        self._procs = [ctx.Process(
            target=_pool_main, daemon=True, name=f"course-pool-rank{r}",
            args=(r, world_size, self._store.port, self.timeout, threads,
                  self._tasks[r], self._results, os.getpid()))
            for r in range(world_size)]
        self.closed = False
        atexit.register(self.close)
        start = time.monotonic()
        try:
            with _spawnable_main():
                for p in self._procs:
                    p.start()
            self._collect(-1, self.timeout)
        except BaseException:
            self._stop()
            raise
        self.startup_seconds = time.monotonic() - start

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "running"
        return f"Pool(world_size={self.world_size}, {state})"

    @property
    def pids(self) -> list[int]:
        """Process ids of the ranks (rank order)."""
        return [p.pid for p in self._procs]

    def _collect(self, call: int, timeout: float) -> list:
        """Wait for every rank's answer to ``call``; close and raise on a
        failure, a rank that died, or the timeout."""
        done: dict[int, object] = {}
        deadline = time.monotonic() + timeout
        what = "start-up" if call < 0 else f"call {call}"
        while len(done) < self.world_size:
            try:
                rank, got, ok, payload, tb = self._results.get(timeout=0.2)
            except queue.Empty:
                dead = [r for r, p in enumerate(self._procs)
                        if r not in done and p.exitcode is not None]
                late = sorted(set(range(self.world_size)) - set(done))
                if dead:
                    self._stop()
                    raise ParallelError(
                        f"rank {dead[0]} exited with code "
                        f"{self._procs[dead[0]].exitcode} during {what} "
                        f"(pool closed: start a new Pool)", rank=dead[0])
                if time.monotonic() > deadline:
                    self._stop()
                    raise ParallelError(
                        f"ranks {late} did not finish {what} within "
                        f"timeout={timeout:g} s (pool closed: start a new "
                        f"Pool)")
                continue
            if got != call:                   # a stale answer: ignore
                continue
            if not ok:
                self._stop()
                raise ParallelError(
                    f"rank {rank} of {self.world_size} failed with "
                    f"{payload} (pool closed, all ranks stopped: start a "
                    f"new Pool)\n\n{tb}", rank=rank, original=payload)
            done[rank] = (None if call < 0 else
                          torch.load(io.BytesIO(payload), weights_only=False))
        return [done[r] for r in range(self.world_size)]

    def run(self, worker, *args, timeout: float | None = None,
            **kwargs) -> list:
        r"""Call ``worker(rank, world_size, *args, **kwargs)`` on every
        rank; return
        ``[result of rank 0, ..., result of rank W-1]`` (tensors detached,
        on the CPU).

        Args:
            worker: a function of an importable module (e.g.
                ``course_lib``); ``args`` and ``kwargs`` must be
                picklable.
            timeout: seconds for this call (default: the pool's).

        Raises:
            ParallelError: a rank raised or the call timed out; the pool
                is then closed (as it is after a KeyboardInterrupt).
        """
        if self.closed:
            raise ParallelError("this Pool is closed (after close(), an "
                                "error or a timeout): start a new Pool")
        _check_worker(worker)
        if timeout is None:
            timeout = self.timeout
        check_real("timeout", timeout, positive=True)
        self._calls += 1
        for q in self._tasks:
            q.put((self._calls, worker, args, kwargs))
        try:
            return self._collect(self._calls, timeout)
        except KeyboardInterrupt:
            # an interrupted cell: the ranks may be inside a collective
            # with no way back, so stop them rather than guess
            self._stop()
            raise

    def close(self, timeout: float = 10.0) -> None:
        """Stop every rank (ask it to leave its process group and exit,
        then terminate what is still running after ``timeout`` seconds)
        and free the rendezvous port. Safe to call twice."""
        self._stop(timeout)

    def _stop(self, timeout: float = 0.0) -> None:
        """close(); ``timeout=0`` (after an error: peers may be blocked
        in a collective) terminates at once."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        if timeout > 0:
            for q, p in zip(self._tasks, self._procs):
                if p.is_alive():
                    try:
                        q.put(None)
                    except (OSError, ValueError):
                        pass
        deadline = time.monotonic() + timeout
        for p in self._procs:
            if p.pid is not None:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        self._results.close()
        self._results.join_thread()
        self._store = None
