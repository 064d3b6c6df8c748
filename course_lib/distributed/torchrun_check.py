r"""Chapter 14's parallel layers checked the way a cluster runs them:
under ``torchrun``.

Chapter 14 starts its ranks with
:class:`~course_lib.distributed.launch.Pool`, which spawns processes from
the notebook. On a cluster the launcher is ``torchrun``: it starts one
process per GPU (or per CPU slot), gives each its ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous address
(``MASTER_ADDR``, ``MASTER_PORT``) in the environment, and
``init_process_group(init_method="env://")`` reads them. This module is
such a program::

    torchrun --standalone --nproc-per-node=2 \
        -m course_lib.distributed.torchrun_check

Each rank picks its device *before* it joins the group: GPU
``LOCAL_RANK`` with the NCCL backend when CUDA is present, the CPU with
gloo otherwise. It then runs
:func:`~course_lib.distributed.scaling_experiments.tensor_parallel_run`
(a SwiGLU FFN and a GQA attention block split by heads, forward and
backward) and
:func:`~course_lib.distributed.scaling_experiments.expert_parallel_run`
(an MoE layer split by experts) on that device, and compares each rank's
part with the single-process module built from the same seed. The
largest difference over all ranks (an all-reduce with MAX) is printed by
rank 0; the exit status is 0 when every difference is below ``--tol``.

What was run where: ``tests/test_torchrun.py`` runs it on this course's
CPU machines with gloo on 2 processes. The NCCL path is the same code
with a CUDA device; its test runs only where a GPU exists, so it has not
been run by the course's CI.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

from .scaling_experiments import expert_parallel_run, tensor_parallel_run

__all__ = ["pick_device", "main"]


def pick_device(local_rank: int) -> tuple[torch.device, str]:
    """(device, backend) for the process with this ``LOCAL_RANK``:
    ``cuda:local_rank`` and NCCL when CUDA is present, else the CPU and
    gloo."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count()
                            ), "nccl"
    return torch.device("cpu"), "gloo"


def _environment() -> tuple[int, int, int]:
    try:
        return (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
    except KeyError as exc:
        raise SystemExit(f"{exc.args[0]} is not set: start this program "
                         f"with torchrun (see the module docstring)")


def main(argv: list[str] | None = None) -> int:
    """Run the checks on this rank; 0 when every difference is below
    ``--tol`` on every rank."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tol", type=float, default=1e-4)
    args = parser.parse_args(argv)
    rank, world_size, local_rank = _environment()
    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)        # before the group is made
    dist.init_process_group(backend, init_method="env://")
    try:
        tp = tensor_parallel_run(rank, world_size, world_size,
                                 seed=args.seed, device=device)
        ep = expert_parallel_run(rank, world_size, world_size,
                                 seed=args.seed, device=device)
        diffs = {
            "tensor-parallel SwiGLU, output": tp["ffn"]["out_diff"],
            "tensor-parallel SwiGLU, input gradient":
                tp["ffn"]["grad_diff"],
            "tensor-parallel attention, output":
                tp["attention"]["out_diff"],
            "tensor-parallel attention, input gradient":
                tp["attention"]["grad_diff"],
            "expert-parallel MoE, output": ep["max_diff"]}
        worst = torch.tensor(list(diffs.values()), dtype=torch.float64,
                             device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        ok = bool((worst < args.tol).all())
        if rank == 0:
            print(f"torchrun: {world_size} processes, backend {backend}, "
                  f"device {device.type}")
            for name, value in zip(diffs, worst.tolist()):
                print(f"  {name}: max |parallel - one process| = "
                      f"{value:.1e}")
            print("all checks passed" if ok else
                  f"FAILED: a difference is >= {args.tol:g}")
        return 0 if ok else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
