"""Pins: the exact wording of error messages of course_lib.model.masks
and course_lib.experiments.mask_probes. They keep messages from changing
by accident; the behaviour itself is specified in tests/test_masking.py.

Found by mutation testing (benchmarks/mutation.md, "Masking survivors
and why"): a mutant that changes only a message is killed here, so
`make mutation` runs this file with the behaviour tests ([tool.mutmut]
in pyproject.toml).
"""
import matplotlib
import pytest
import torch

from course_lib.model import masks
from course_lib.experiments import mask_probes

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402


# from test_combine_masks_none_and_bad_shapes
def test_combine_masks_message():
    c = masks.causal_mask(3)
    with pytest.raises(ValueError, match=r"^masks of shapes \[\(3, 3\), "
                       r"\(2, 2\)\] do not broadcast together$"):
        masks.combine_masks(c, masks.causal_mask(2))


# from test_next_token_pairs_1d_and_shortest
def test_next_token_pairs_messages():
    with pytest.raises(ValueError, match=r"^tokens must have shape \(\.\.\., "
                       r"T\) with T >= 2, got \(\)$"):
        mask_probes.next_token_pairs(torch.tensor(7))
    with pytest.raises(ValueError, match=r"^tokens must hold integer ids, "
                       r"got dtype torch.bool$"):
        mask_probes.next_token_pairs(torch.tensor([True, False]))


def test_bad_input_messages_in_full():
    with pytest.raises(TypeError, match=r"^mask must be a bool tensor \(True "
                       r"= may attend\), got list$"):
        masks.additive_mask([True])
    with pytest.raises(TypeError, match=r"^mask must be a bool tensor \(True "
                       r"= may attend\), got torch.float32$"):
        masks.additive_mask(torch.ones(2))
    with pytest.raises(ValueError, match=r"^dtype must be a floating dtype, "
                       r"got torch.int64$"):
        masks.additive_mask(torch.ones(2, dtype=torch.bool), dtype=torch.int64)


# from test_influence_matrix_checks_and_trials
def test_influence_matrix_messages():
    x = torch.zeros(3, 1, dtype=torch.float64)
    f = lambda z: z.cumsum(-2)                              # noqa: E731
    with pytest.raises(ValueError, match=r"^x must have shape \(\.\.\., T, D\)"
                       r", got \(3,\)$"):
        mask_probes.influence_matrix(f, torch.zeros(3))
    with pytest.raises(ValueError, match=r"^fn must return shape \(\.\.\., "
                       r"T=3, D_out\), got \(1,\)$"):
        mask_probes.influence_matrix(lambda z: z.sum((0, 1))[None], x)
    with pytest.raises(TypeError, match=r"^fn must be callable, got 3$"):
        mask_probes.influence_matrix(3, x)


def test_draw_mask_bad_input_messages():
    ax = Figure().add_subplot()
    with pytest.raises(TypeError, match=r"^mask must be a bool tensor"):
        mask_probes.draw_mask(ax, torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"^mask must have shape \(Lq, Lk\), "
                       r"got \(2,\)$"):
        mask_probes.draw_mask(ax, torch.ones(2, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"^weights must be a torch.Tensor, "
                       r"got list$"):
        mask_probes.draw_mask(ax, torch.ones(1, 1, dtype=torch.bool), weights=[[1.0]])
    with pytest.raises(ValueError, match=r"^weights must have shape \(2, 2\) "
                       r"like mask, got \(2, 3\)$"):
        mask_probes.draw_mask(ax, torch.ones(2, 2, dtype=torch.bool),
                    weights=torch.ones(2, 3))


def test_padding_mask_size_message_names_the_product():
    with pytest.raises(ValueError, match=r"^len\(lengths\) \* max_len asks "
                       r"for 536,870,912 values \(2\.0 GiB as float32\), more "
                       r"than the 268,435,456 one call may allocate$"):
        masks.padding_mask([1] * 4, 2**27)


def test_causal_mask_size_message_names_the_product():
    with pytest.raises(ValueError, match=r"^q_len \* k_len asks for "
                       r"536,870,912 values "):
        masks.causal_mask(2**15, 2**14)
