"""Pins: the exact wording of error messages of
course_lib.experiments.score_scaling. They keep messages from changing by
accident; the behaviour itself is specified in tests/test_score_scaling.py.

Found by mutation testing (benchmarks/mutation.md, "On the current
layout"): a mutant that changes only a message is killed here, so
`make mutation` runs this file with the behaviour tests ([tool.mutmut]
in pyproject.toml).
"""
import pytest
import torch

from course_lib.experiments import score_scaling
from errors import whole_message


@pytest.mark.parametrize("z, got", [([1.0, 2.0], "list"),
                                    (torch.tensor([1, 2]), "torch.int64")])
def test_softmax_jacobian_type_message_names_what_it_got(z, got):
    with pytest.raises(TypeError, match=whole_message(
            f"z must be a floating tensor (..., n), got {got}")):
        score_scaling.softmax_jacobian(z)


def test_softmax_jacobian_shape_and_size_messages_in_full():
    with pytest.raises(ValueError, match=whole_message(
            "z must have shape (..., n), got a 0-d tensor")):
        score_scaling.softmax_jacobian(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"^z\.numel\(\) \* n asks for "
                       r"1,073,741,824 values "):
        score_scaling.softmax_jacobian(torch.zeros(2**10, 2**10))


def test_saturation_stats_flag_and_size_messages_in_full():
    with pytest.raises(TypeError, match=whole_message(
            "scaled must be a bool, got str 'no'")):
        score_scaling.saturation_stats(4, scaled="no")
    with pytest.raises(ValueError, match=r"^n_rows \* n_keys \* \(d_k \+ d_v "
                       r"\+ n_keys\) asks for 268,468,224 values "):
        score_scaling.saturation_stats(1, n_keys=2**14, n_rows=1, d_v=1)
