r"""A pool of ranks that stays up across notebook cells.

:func:`course_lib.parallel.run` starts ``world_size`` fresh processes for
every call: each imports torch and joins a new process group, a few
seconds per call on a laptop. A chapter that runs a dozen experiments
would spend most of its time starting processes. :class:`Pool` starts
the ranks and their gloo process group **once**; each
:meth:`Pool.run` sends a worker function to every rank, which calls it
in the same process group and sends the result back.

Lifetime. The ranks are stopped by :meth:`Pool.close` (also at the end
of a ``with`` block and, if forgotten, when the interpreter exits), and
each rank watches its parent: if the notebook's kernel dies without
closing the pool, the ranks notice within a second and exit, so no
orphaned process keeps a port or a core.

Errors. If a rank raises, the other ranks may be blocked in a collective
that will never complete, and the process group cannot be repaired from
outside. The pool therefore **closes itself** (every rank is stopped)
and raises :class:`~course_lib.parallel.ParallelError` with the rank's
traceback; further calls say that the pool is closed, and a new
:class:`Pool` must be started. The same happens when a call does not
finish within its timeout.

Shape letters: W ranks (``world_size``).

Introduced in chapter 14.
"""
from __future__ import annotations

import atexit
import io
import os
import queue
import threading
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .parallel import (ParallelError, _check_worker, _master_store,
                       _spawnable_main, _to_cpu, _join_group)
from .validation import check_int, check_real

__all__ = ["Pool"]


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
    :func:`course_lib.parallel.run` does, without paying for process
    start-up again. Process groups a worker creates with
    ``torch.distributed.new_group`` stay alive for later calls.

    A rank that raises, or a call that exceeds its timeout, closes the
    pool (all ranks stopped) and raises
    :class:`~course_lib.parallel.ParallelError`; the pool cannot be used
    afterwards.

    Args:
        world_size: number of ranks $W \ge 1$.
        timeout: default seconds for start-up and for each call.
        port: rendezvous port on 127.0.0.1; None picks a free one.
        threads: torch threads per rank (1: ranks share the cores).

    Use as ``with Pool(4) as pool: ...`` or call :meth:`close`.

    Introduced in chapter 14.
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

        Introduced in chapter 14.
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
