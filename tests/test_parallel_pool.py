"""Chapter 14: the persistent pool, course_lib.distributed.launch.Pool.

Each distributed test starts its own pool (marked ``distributed``) with a
timeout, so a bug fails the test instead of hanging it. Start-up gets a
generous timeout (STARTUP, a busy machine imports torch slowly); the
calls under test get short ones. No rank may outlive its pool: checked
through /proc (a zombie counts as gone).
"""
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import workers
from course_lib.distributed.launch import ParallelError, run
from course_lib.distributed.launch import Pool

STARTUP = 90                                    # seconds, start-up only


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone(pids, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.distributed
def test_pool_results_equal_run_and_the_ranks_are_reused():
    expected = run(workers.check_expert_parallel, 2, 0,
                   timeout=STARTUP)
    with Pool(2, timeout=STARTUP) as pool:
        pids = pool.pids
        first = pool.run(workers.check_expert_parallel, 0)
        # a second experiment in the same processes and process group
        again = pool.run(workers.check_expert_parallel, 0)
        assert pool.run(workers.sleep_on_rank, 0.0) == [0, 1]
        assert pool.pids == pids and all(_alive(p) for p in pids)
        # an interrupted cell (Ctrl-C while waiting) stops the ranks

        def interrupted(*_):
            raise KeyboardInterrupt
        pool._collect = interrupted
        with pytest.raises(KeyboardInterrupt):
            pool.run(workers.sleep_on_rank, 0.0)
        assert pool.closed
    for got in (first, again):
        for rank in range(2):
            for case, r in expected[rank].items():
                g = got[rank][case]
                assert g["stats"].send_splits == r["stats"].send_splits
                assert g["stats"].recv_splits == r["stats"].recv_splits
                for name in ("out", "grad_x", "grad_experts"):
                    assert g[name] == r[name] and g[name] < 1e-5, \
                        (rank, case, name)
    assert pool.closed and _gone(pids)
    assert not multiprocessing.active_children()


@pytest.mark.distributed
def test_a_failing_rank_closes_the_pool_with_its_traceback():
    pool = Pool(2, timeout=STARTUP)
    pids = pool.pids
    start = time.monotonic()
    with pytest.raises(ParallelError, match=r"rank 1 of 2 failed with "
                       r"ValueError: deliberate failure on rank 1 \(pool "
                       r"closed") as exc:
        # rank 0 waits in an all-reduce for rank 1, which raises
        pool.run(workers.fail_on_rank, 1, timeout=20)
    assert time.monotonic() - start < 15          # stopped, not timed out
    assert exc.value.rank == 1
    assert "Traceback" in str(exc.value) and "fail_on_rank" in str(exc.value)
    assert pool.closed and _gone(pids)
    with pytest.raises(ParallelError, match="this Pool is closed"):
        pool.run(workers.sleep_on_rank, 0.0)


@pytest.mark.distributed
def test_a_hung_call_times_out_and_closes_the_pool():
    with Pool(2, timeout=STARTUP) as pool:
        pids = pool.pids
        start = time.monotonic()
        with pytest.raises(ParallelError, match=r"ranks \[0\] did not "
                           r"finish call 1 within timeout=2 s"):
            pool.run(workers.sleep_on_rank, 3600.0, timeout=2)
        assert time.monotonic() - start < 10
        assert pool.closed and _gone(pids)


@pytest.mark.distributed
def test_ranks_exit_when_the_parent_is_killed(tmp_path):
    """A kernel that dies cannot close its pool: the ranks watch their
    parent and exit on their own."""
    script = textwrap.dedent("""
        import os, sys, time
        from course_lib.distributed.launch import Pool
        pool = Pool(2, timeout=90)
        print(*pool.pids, flush=True)
        time.sleep(3600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script],
                            stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
    finally:
        os.kill(proc.pid, signal.SIGKILL)         # no atexit, no close()
        proc.wait()
    assert _gone(pids, within=10), "ranks outlived their killed parent"


def test_pool_rejects_bad_arguments():
    with pytest.raises(ValueError, match="world_size must be >= 1, got 0"):
        Pool(0)
    with pytest.raises(ValueError, match="timeout must be > 0, got 0"):
        Pool(2, timeout=0)
