"""Chapter 14's transfer exercise, checked from outside the notebook.

``ch14-ep-bytes`` asks for the bytes each rank sends in an expert-parallel
MoE layer, for a routing table and any placement of the experts. The cell
is read from the notebook and run; the model solution must pass, the
usual mistakes must fail with feedback that names them, and the
reference (``expert_parallel.bytes_sent_per_rank``) must agree with the
byte counters of ``ExpertParallelStats`` that the chapter measures.
"""
import pytest
import torch

from course_lib.distributed import expert_parallel
from course_lib.distributed.expert_parallel import ExpertParallelStats
from course_lib.notebook.function_exercise import DiagnosedFunctionExercise

from notebook_support import (
    assert_mistake_caught, exercise_cell, learner_function, model_solution,
    run_exercise_cell)



@pytest.fixture(scope="module")
def ep_exercise():
    ns = {"torch": torch, "expert_parallel": expert_parallel,
          "DiagnosedFunctionExercise": DiagnosedFunctionExercise}
    source = exercise_cell("ch14_scaling_out.ipynb", "ch14-ep-bytes")
    run_exercise_cell(source, ns)
    exercise = ns["EXERCISE"]
    solution = model_solution(exercise)
    return exercise, solution


def test_exercise_is_a_transfer_with_a_library_reference(ep_exercise):
    exercise, _ = ep_exercise
    assert exercise.purpose == "transfer"
    assert exercise.reference is expert_parallel.bytes_sent_per_rank
    shapes = {tuple(args[0].shape) for args, _ in exercise.cases}
    assert (1, 4) in shapes and len(shapes) == len(exercise.cases)


def test_solution_passes(ep_exercise):
    exercise, solution = ep_exercise
    assert exercise.check(solution).correct              # in the sandbox


@pytest.mark.parametrize("old,new,named", [
    ("    slots.fill_diagonal_(0)                  # local: copied\n", "",
     "copied in memory"),
    ("dispatch_size * slots.sum(1)", "(dispatch_size + combine_size) "
     "* slots.sum(1)) + 0 * (", "charged to the rank that owns"),
    ("slots.index_add_(1, placement, counts)",
     "slots.index_add_(1, torch.arange(counts.shape[1]) * W "
     "// counts.shape[1], counts)", "contiguous blocks"),
    ("dispatch_size * slots.sum(1)", "dispatch_size * slots.sum(0)",
     None),
])
def test_usual_mistakes_fail_with_feedback(ep_exercise, old, new, named):
    exercise, solution = ep_exercise
    assert old in solution
    wrong = learner_function(exercise, solution.replace(old, new))
    assert_mistake_caught(exercise, wrong, named)


def test_reference_agrees_with_the_moe_layers_byte_counters():
    """Contiguous placement and one element size: the remote bytes each
    rank's ExpertParallelStats reports for the same splits."""
    W, E, D, b = 4, 8, 32, 4
    counts = torch.randint(0, 30, (W, E),
                           generator=torch.Generator().manual_seed(5))
    placement = torch.arange(E) // (E // W)
    slots = counts.reshape(W, W, E // W).sum(-1)                # (W, W)
    got = expert_parallel.bytes_sent_per_rank(counts, placement, D, b, b)
    for r in range(W):
        stats = ExpertParallelStats(rank=r, row_bytes=D * b,
                                    send_splits=slots[r].tolist(),
                                    recv_splits=slots[:, r].tolist())
        assert got[r].item() == stats.remote_bytes_sent
