"""An argument of the wrong type fails at the call with a TypeError (or
ValueError) that names the argument, never with an AttributeError from
deep inside (the bad-input probe's "wrong types" finding).
"""
import pytest
import torch

from course_lib.validation import check_bool, check_type

def test_check_type_names_argument_and_types():
    check_type("x", torch.zeros(1), torch.Tensor, "a torch.Tensor")
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got str"):
        check_type("x", "abc", torch.Tensor, "a torch.Tensor")
    check_type("n", 3, (int, float), "a number")
    with pytest.raises(TypeError, match="n must be a number, got NoneType"):
        check_type("n", None, (int, float), "a number")


def test_check_bool_rejects_ints_and_strings():
    check_bool("flag", True)
    for bad in (1, 0, "yes", None):
        with pytest.raises(ValueError, match="flag must be a bool"):
            check_bool("flag", bad)


def test_examples_name_the_argument():
    from course_lib.decoder_lm import DecoderLM, decoder_lm_param_count
    from course_lib.layers import num_parameters
    from course_lib.mha import merge_heads
    with pytest.raises(TypeError, match="config must be a DecoderLMConfig"):
        DecoderLM({"vocab_size": 10})
    with pytest.raises(TypeError, match="config must be a DecoderLMConfig"):
        decoder_lm_param_count(None)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        num_parameters([torch.zeros(2)])
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        merge_heads([[1.0]])
