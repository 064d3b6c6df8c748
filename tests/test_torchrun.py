"""Chapter 14's parallel layers under ``torchrun``
(:mod:`course_lib.distributed.torchrun_check`): the launcher a cluster
uses, with env:// rendezvous, instead of the notebook's spawned pool.

On this CPU machine it runs with gloo on 2 processes. The same program
picks NCCL and one GPU per process where CUDA exists; that test is
skipped here.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from course_lib.distributed import torchrun_check

TORCHRUN = Path(sys.executable).with_name("torchrun")


def _torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess:
    command = ([str(TORCHRUN)] if TORCHRUN.exists()
               else [sys.executable, "-m", "torch.distributed.run"])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        command + ["--standalone", f"--nproc-per-node={nproc}", "-m",
                   "course_lib.distributed.torchrun_check", *args],
        capture_output=True, text=True, timeout=180, env=env)


@pytest.mark.distributed
def test_tensor_and_expert_parallel_agree_under_torchrun_with_gloo():
    done = _torchrun(2)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "torchrun: 2 processes, backend gloo, device cpu"
    assert len([x for x in lines if "max |parallel - one process|" in x]) == 5
    assert lines[-1] == "all checks passed"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_same_program_runs_with_nccl_on_gpus():
    n = torch.cuda.device_count()
    done = _torchrun(n)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.splitlines()[0] == (
        f"torchrun: {n} processes, backend nccl, device cuda")


def test_without_torchrun_it_says_how_to_start_it(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit, match="RANK is not set: start this "
                                         "program with torchrun"):
        torchrun_check.main([])


def test_the_device_follows_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert torchrun_check.pick_device(1) == (torch.device("cpu"), "gloo")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert torchrun_check.pick_device(3) == (torch.device("cuda", 1),
                                             "nccl")
