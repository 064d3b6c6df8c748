"""Tests for course_lib.model.kv_quant: symmetric int8 with shared scales."""
import pytest
import torch

from course_lib.model.kv_quant import (dequantize_int8, fake_quantize_int8,
                                       quantize_int8)


@pytest.mark.parametrize("dim", [-1, -2, (-2, -1)])
def test_round_trip_error_at_most_half_a_step(dim):
    x = torch.randn(2, 3, 17, 8) * torch.logspace(-3, 2, 8)
    q, s = quantize_int8(x, dim=dim)
    assert q.dtype == torch.int8 and q.shape == x.shape
    err = (dequantize_int8(q, s) - x).abs()
    assert (err <= s / 2 * (1 + 1e-6)).all()
    # the largest magnitude of each group lands on +-127 exactly
    assert (q.abs().amax(dim=dim) == 127).all()


def test_scale_shapes_and_reference_loop():
    x = torch.randn(2, 3, 5, 4)
    q, s = quantize_int8(x, dim=-1)                  # per token and head
    assert s.shape == (2, 3, 5, 1)
    for idx in [(0, 0, 0), (1, 2, 4), (0, 1, 3)]:
        row = x[idx]
        step = row.abs().max() / 127
        assert torch.equal(q[idx], torch.round(row / step).to(torch.int8))
    _, s_ch = quantize_int8(x, dim=-2)               # per channel
    assert s_ch.shape == (2, 3, 1, 4)
    torch.testing.assert_close(s_ch[0, 0, 0], x[0, 0].abs().amax(0) / 127)


def test_values_on_the_grid_are_exact():
    n = torch.randint(-127, 128, (4, 6, 16))
    n[..., 0] = 127                                  # fixes each row's max
    step = torch.rand(4, 6, 1) + 0.1
    x = n * step
    torch.testing.assert_close(fake_quantize_int8(x), x, rtol=1e-6, atol=0)
    # and quantising an already quantised tensor changes nothing
    y = fake_quantize_int8(torch.randn(3, 9, 8))
    torch.testing.assert_close(fake_quantize_int8(y), y, rtol=1e-6, atol=0)


def test_zeros_and_symmetry():
    x = torch.zeros(2, 5)
    q, s = quantize_int8(x)
    assert (q == 0).all() and (s == 1).all()
    y = torch.randn(3, 7)
    assert torch.equal(quantize_int8(-y)[0], -quantize_int8(y)[0])


def test_bad_input():
    with pytest.raises(TypeError, match="x"):
        quantize_int8([1.0, 2.0])
    with pytest.raises(TypeError, match="x must be a floating"):
        quantize_int8(torch.arange(4))
    with pytest.raises(ValueError, match="dim"):
        quantize_int8(torch.randn(2, 3), dim=2)
    with pytest.raises(ValueError, match="dim"):
        quantize_int8(torch.randn(2, 3), dim=())
    with pytest.raises(TypeError, match="dim"):
        quantize_int8(torch.randn(2, 3), dim=1.0)
    with pytest.raises(TypeError, match="q must be an int8"):
        dequantize_int8(torch.zeros(3), torch.ones(1))
    with pytest.raises(TypeError, match="scale"):
        dequantize_int8(torch.zeros(3, dtype=torch.int8), 1.0)
