"""Tests for course_lib._util.validation's broadcasts_to against
torch.broadcast_shapes (the reference it replaces in hot paths)."""
import itertools

import pytest
import torch

from course_lib._util.validation import broadcasts_to


def reference(shape, target) -> bool:
    try:
        return torch.broadcast_shapes(shape, target) == torch.Size(target)
    except RuntimeError:
        return False


def test_broadcasts_to_equals_torch():
    dims = (0, 1, 2, 3)
    shapes = [s for n in range(4) for s in itertools.product(dims, repeat=n)]
    targets = [s for n in range(4) for s in itertools.product(dims, repeat=n)]
    for shape in shapes:
        for target in targets:
            assert broadcasts_to(shape, target) == reference(shape, target), \
                (shape, target)
    assert broadcasts_to(torch.Size([1, 1, 5, 7]), (2, 9, 5, 7))
    assert not broadcasts_to(torch.Size([2, 1, 5, 7]), (1, 9, 5, 7))


def test_check_alloc_refuses_huge_requests_but_not_on_the_meta_device():
    from course_lib._util.validation import MAX_ELEMENTS, check_alloc
    check_alloc("n", MAX_ELEMENTS)
    with pytest.raises(ValueError, match="^n asks for"):
        check_alloc("n", MAX_ELEMENTS + 1)
    with torch.device("meta"):           # shapes only: nothing allocated
        check_alloc("n", 10 * MAX_ELEMENTS)
