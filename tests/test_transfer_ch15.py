"""Chapter 15's transfer exercise, checked from outside the notebook.

``ch15-prompt-lookup`` asks for the prompt-lookup proposal, the drafter
the chapter only used: the tokens that followed the most recent earlier
occurrence of the context's last 3 (then 2, then 1) tokens. The cell is
read from the notebook and run; the model solution must pass, the usual
mistakes must fail with feedback that names them, each mistake the cell
diagnoses must differ from the reference on some case (or it could never
be named), and the reference (``PromptLookup(max_ngram=3).propose``)
must agree with a brute-force search written here on the cases and on
random contexts.
"""
import pytest
import torch

from course_lib.notebook.function_exercise import DiagnosedFunctionExercise
from course_lib.serving.speculative_decoding import PromptLookup

from notebook_support import (
    assert_mistake_caught, exercise_cell, learner_function, model_solution,
    run_exercise_cell)



def brute_force(ids, k, max_ngram=3):
    """The proposal by a plain loop over every earlier window, newest
    first: an independent statement of the rule."""
    seq = ids.tolist()
    L = len(seq)
    for n in range(min(max_ngram, L - 1), 0, -1):
        suffix = seq[L - n:]
        for s in range(L - n - 1, -1, -1):          # windows with a successor
            if seq[s:s + n] == suffix:
                return torch.tensor(seq[s + n:s + n + k], dtype=torch.long)
    return torch.zeros(0, dtype=torch.long)


@pytest.fixture(scope="module")
def lookup_exercise():
    ns = {"torch": torch, "PromptLookup": PromptLookup,
          "DiagnosedFunctionExercise": DiagnosedFunctionExercise}
    source = exercise_cell("ch15_serving.ipynb", "ch15-prompt-lookup")
    run_exercise_cell(source, ns)
    exercise = ns["EXERCISE"]
    return exercise, model_solution(exercise)


def test_exercise_is_a_transfer_with_a_library_reference(lookup_exercise):
    exercise, _ = lookup_exercise
    assert exercise.purpose == "transfer"
    ref = exercise.reference
    assert ref.__func__ is PromptLookup.propose
    assert isinstance(ref.__self__, PromptLookup)
    assert ref.__self__.max_ngram == 3
    outputs = [exercise.reference(*args, **kw) for args, kw in
               exercise.cases]
    assert any(len(o) == 0 for o in outputs)        # a case with no match
    assert any(0 < len(o) < args[1] for o, (args, _) in
               zip(outputs, exercise.cases))        # fewer than k after it


def test_reference_equals_a_brute_force_search(lookup_exercise):
    exercise, _ = lookup_exercise
    for args, _ in exercise.cases:
        assert torch.equal(exercise.reference(*args), brute_force(*args))
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):                 # small vocabularies: many repeats
        L = int(torch.randint(1, 12, (1,), generator=gen))
        ids = torch.randint(0, 3, (L,), generator=gen)
        k = int(torch.randint(1, 5, (1,), generator=gen))
        assert torch.equal(exercise.reference(ids, k), brute_force(ids, k))


def test_solution_passes(lookup_exercise):
    exercise, solution = lookup_exercise
    assert exercise.check(solution).correct              # in the sandbox


def test_every_diagnosed_mistake_shows_on_some_case(lookup_exercise):
    exercise, _ = lookup_exercise
    for wrong, hint in exercise.mistakes:
        assert any(not torch.equal(wrong(*args), exercise.reference(*args))
                   for args, _ in exercise.cases), hint


@pytest.mark.parametrize("old,new,named", [
    ("hits[-1]", "hits[0]", "earliest"),
    ("range(min(3, L - 1), 0, -1)", "range(1, min(3, L - 1) + 1)",
     "1-gram first"),
    ("ids[:L - 1].unfold", "ids.unfold", "matched themselves"),
    ("start = int(hits[-1]) + n", "start = int(hits[-1])",
     "returned the matched n-gram"),
    ("return ids[start:start + k]", "return ids[start:start + k - 1]",
     None),
    ("    return ids[:0]", "    return None", None),
])
def test_usual_mistakes_fail_with_feedback(lookup_exercise, old, new, named):
    exercise, solution = lookup_exercise
    assert old in solution
    wrong = learner_function(exercise, solution.replace(old, new))
    assert_mistake_caught(exercise, wrong, named)
