"""Chapter 14: the launcher, course_lib.distributed.launch.run.

The distributed tests spawn processes (marked ``distributed``) and give
each group a timeout, so a bug fails them instead of hanging.
"""
import socket
import sys
import time
import types

import pytest
import torch

from course_lib.distributed import launch
import workers
from course_lib.distributed.launch import ParallelError, run
from errors import error_for


# ------------------------------------------------------------- launcher
@pytest.mark.distributed
def test_a_failing_rank_stops_the_group_with_its_error():
    start = time.monotonic()
    with pytest.raises(ParallelError, match="rank 1 of 2 failed with "
                       "ValueError: deliberate failure on rank 1") as exc:
        # rank 0 waits for rank 1 in an all-reduce that never completes
        run(workers.fail_on_rank, 2, 1, timeout=120)
    assert exc.value.rank == 1
    assert exc.value.original == "ValueError: deliberate failure on rank 1"
    # stopped, not timed out (a wide margin: start-up of two processes
    # that import torch took 25 s on a machine at load average 22)
    assert time.monotonic() - start < 100


@pytest.mark.distributed
def test_a_hung_rank_is_stopped_at_the_timeout():
    start = time.monotonic()
    # rank 1 returns at once, unless start-up on a busy machine took
    # longer than the timeout too
    with pytest.raises(ParallelError, match=r"ranks \[0(, 1)?\] did not "
                       r"finish within timeout=6 s \(all ranks stopped\)"):
        run(workers.sleep_on_rank, 2, 3600.0, timeout=6)
    assert time.monotonic() - start < 60          # not the 3600 s sleep


def test_a_port_in_use_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ValueError, match=f"port {port} on 127.0.0.1 "
                           "is in use"):
            run(workers.sleep_on_rank, 2, 0.0, port=port)


@pytest.mark.parametrize("kwargs, match", [
    ({"world_size": 0}, "world_size must be >= 1, got 0"),
    ({"world_size": 2.0}, "world_size must be an int, got float"),
    ({"world_size": 2, "timeout": 0}, "timeout must be > 0, got 0"),
    ({"world_size": 2, "threads": 0}, "threads must be >= 1, got 0"),
])
def test_run_rejects_bad_arguments(kwargs, match):
    with pytest.raises(error_for(match), match=match):
        run(workers.sleep_on_rank, **kwargs)


def test_run_rejects_a_worker_it_cannot_spawn(monkeypatch):
    with pytest.raises(TypeError, match="worker must be a function"):
        run(42, 2)
    # a notebook cell or stdin: __main__ without a file
    monkeypatch.setitem(sys.modules, "__main__",
                        types.ModuleType("__main__"))

    def cell_worker(rank, world_size):
        return rank
    cell_worker.__module__ = "__main__"
    with pytest.raises(ValueError, match="worker must live in an "
                       "importable module.*cell_worker"):
        run(cell_worker, 2)


def test_results_are_detached_cpu_copies():
    w = torch.ones(2, requires_grad=True)
    out = launch._to_cpu({"a": [w * 2, (w,)], "n": 3})
    assert not out["a"][0].requires_grad and out["a"][0].grad_fn is None
    assert isinstance(out["a"][1], tuple) and out["n"] == 3


def test_a_main_without_a_real_file_is_hidden_from_spawn(monkeypatch):
    """``python -`` sets ``__main__.__file__ = '<stdin>'``, which spawned
    children would try to re-run; it is hidden while they start."""
    main = types.ModuleType("__main__")
    main.__file__ = "<stdin>"
    monkeypatch.setitem(sys.modules, "__main__", main)
    with launch._spawnable_main():
        assert not hasattr(main, "__file__")
    assert main.__file__ == "<stdin>"
    main.__file__ = __file__                      # a real script: kept
    with launch._spawnable_main():
        assert main.__file__ == __file__
