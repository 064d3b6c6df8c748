"""small_ops: one torch thread inside the block, the old count restored."""
import pytest
import torch

from course_lib._util.threads import small_ops
from errors import error_for


@pytest.fixture
def two_threads():
    """Start every test from 2 threads; restore the session's count."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_block_runs_on_one_thread_and_restores_the_count(two_threads):
    with small_ops():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_count_is_restored_when_the_block_raises(two_threads):
    with pytest.raises(RuntimeError, match="boom"):
        with small_ops():
            raise RuntimeError("boom")
    assert torch.get_num_threads() == 2


def test_decorator_sets_and_restores_also_on_exception(two_threads):
    @small_ops()
    def inside():
        return torch.get_num_threads()

    @small_ops()
    def fails():
        raise KeyError("x")

    assert inside() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(KeyError):
        fails()
    assert torch.get_num_threads() == 2


def test_nested_blocks_restore_in_order(two_threads):
    outer = small_ops()
    with outer:
        with small_ops(num_threads=2):
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 1
        with outer:                      # the same object, re-entered
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_recursive_decorated_function_restores_the_count(two_threads):
    @small_ops()
    def depth(n):
        return torch.get_num_threads() if n == 0 else depth(n - 1)

    assert depth(3) == 1
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("bad, message", [
    (0, "num_threads must be >= 1, got 0"),
    (-2, "num_threads must be >= 1, got -2"),
    (1.0, "num_threads must be an int, got float 1.0"),
    (True, "num_threads must be an int, got bool True"),
    ("1", "num_threads must be an int, got str '1'"),
])
def test_bad_num_threads_raises_value_error_naming_it(bad, message):
    with pytest.raises(error_for(message), match=message):
        small_ops(bad)


def test_more_threads_than_cpus_are_rejected(two_threads):
    with pytest.raises(ValueError, match="num_threads"):
        small_ops(10**6)
    assert torch.get_num_threads() == 2
