"""The ring-buffer KV cache against a cache that keeps everything and
slices the last W positions."""
import pytest
import torch

from course_lib.model.rolling_kv_cache import rolling_window, rolling_write


@pytest.mark.parametrize("W", [1, 3, 4])
@pytest.mark.parametrize("chunks", [[1] * 11, [5, 1, 1, 6, 2], [9, 2],
                                    [2, 2, 2, 2]])
def test_window_equals_last_W_of_full_history(W, chunks):
    gen = torch.Generator().manual_seed(W)
    buffer = torch.zeros(2, 3, W, 4)
    history = []
    start = 0
    for T in chunks:
        new = torch.randn(2, 3, T, 4, generator=gen)
        before = buffer.clone()
        buffer = rolling_write(buffer, new, start)
        assert torch.equal(rolling_write(before, new, start), buffer)
        history.append(new)
        start += T
        full = torch.cat(history, dim=-2)                 # (2, 3, start, 4)
        torch.testing.assert_close(rolling_window(buffer, start),
                                   full[..., max(0, start - W):, :],
                                   rtol=0, atol=0)


def test_write_does_not_modify_its_input_and_uses_t_mod_W():
    buffer = torch.zeros(4, 1)
    out = rolling_write(buffer, torch.tensor([[7.0]]), 9)
    assert buffer.abs().sum() == 0
    assert out[:, 0].tolist() == [0.0, 7.0, 0.0, 0.0]       # 9 mod 4 = 1


def test_window_before_the_first_wrap_is_the_prefix():
    buffer = torch.arange(5.0).view(5, 1)
    assert rolling_window(buffer, 3)[:, 0].tolist() == [0.0, 1.0, 2.0]
    assert rolling_window(buffer, 0).shape == (0, 1)


def test_bad_inputs():
    buffer = torch.zeros(2, 4, 3)
    with pytest.raises(TypeError, match="buffer"):
        rolling_write([0.0], torch.zeros(2, 1, 3), 0)
    with pytest.raises(ValueError, match="new"):
        rolling_write(buffer, torch.zeros(2, 1, 5), 0)
    with pytest.raises(ValueError, match="new"):
        rolling_write(buffer, torch.zeros(2, 0, 3), 0)
    with pytest.raises(ValueError, match="start"):
        rolling_write(buffer, torch.zeros(2, 1, 3), -1)
    with pytest.raises(TypeError, match="n_seen"):
        rolling_window(buffer, 2.0)
    with pytest.raises(ValueError, match="buffer"):
        rolling_window(torch.zeros(3), 1)
