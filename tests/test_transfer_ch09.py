"""Chapter 9's transfer exercise, ch09-ring-write: the model solution
passes, the usual wrong solutions fail with the feedback that names their
mistake, and the reference (course_lib.model.rolling_kv_cache, tested in
tests/test_rolling_kv_cache.py) keeps the last W positions of what a
growing cache holds."""
import pytest
import torch

from course_lib.model import rolling_kv_cache
from course_lib.model.kv_cache import LayerKVCache
from course_lib.notebook.function_exercise import DiagnosedFunctionExercise

from notebook_support import exercise_cell, run_exercise_cell, model_solution

MARKER = "DiagnosedFunctionExercise(\n"


@pytest.fixture(scope="module")
def ring():
    source = exercise_cell("ch09_kv_cache.ipynb", "ch09-ring-write")
    assert source.count(MARKER) == 1
    ns = {"torch": torch, "rolling_kv_cache": rolling_kv_cache,
          "DiagnosedFunctionExercise": DiagnosedFunctionExercise}
    run_exercise_cell(source, ns)
    ex = ns["EXERCISE"]
    solution = model_solution(ex)
    return ex, solution


def test_reference_lives_in_the_library(ring):
    ex, _ = ring
    assert ex.reference is rolling_kv_cache.rolling_write
    assert ex.purpose == "transfer"
    assert 3 <= len(ex.cases) <= 6


def test_reference_keeps_the_window_of_the_chapters_cache():
    """Decode with the chapter's growing LayerKVCache and with the ring:
    the ring, read in order, is the last W positions of the full cache."""
    W, gen = 3, torch.Generator().manual_seed(0)
    full = LayerKVCache()
    k_ring = torch.zeros(1, 2, W, 4)
    v_ring = torch.zeros(1, 2, W, 4)
    start = 0
    for T in (4, 1, 1, 2, 1):
        k = torch.randn(1, 2, T, 4, generator=gen)
        v = torch.randn(1, 2, T, 4, generator=gen)
        k_all, v_all = full.update(k, v)
        k_ring = rolling_kv_cache.rolling_write(k_ring, k, start)
        v_ring = rolling_kv_cache.rolling_write(v_ring, v, start)
        start += T
        torch.testing.assert_close(
            rolling_kv_cache.rolling_window(k_ring, start),
            k_all[..., -W:, :])
        torch.testing.assert_close(
            rolling_kv_cache.rolling_window(v_ring, start),
            v_all[..., -W:, :])


def test_model_solution_passes(ring):
    ex, solution = ring
    assert ex.check(solution).correct


def wrong(body):
    """A wrong solution as a function object (checked in this process)."""
    ns = {"torch": torch}
    exec("def ring_write(buffer, new, start):\n"
         "    W, T = buffer.shape[-2], new.shape[-2]\n" + body, ns)
    return ns["ring_write"]


@pytest.mark.parametrize("body,needle", [
    ("    return torch.cat([buffer, new], dim=-2)[..., -W:, :]\n",
     "`torch.cat`"),
    ("    out = buffer.clone()\n"
     "    for i in range(T):\n"
     "        out[..., i % W, :] = new[..., i, :]\n"
     "    return out\n",
     "slot 0"),
    ("    out = buffer.clone()\n"
     "    k = min(T, W)\n"
     "    out[..., (start + torch.arange(k)) % W, :] = new[..., :k, :]\n"
     "    return out\n",
     "last $W$"),
])
def test_usual_mistakes_fail_with_feedback(ring, body, needle):
    ex, _ = ring
    feedback = ex.check(wrong(body))
    assert not feedback.correct
    assert "Traceback" not in feedback.message
    assert needle in feedback.message, feedback.message
