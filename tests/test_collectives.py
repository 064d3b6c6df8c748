"""Chapter 14: the collectives (course_lib.distributed.collectives) on one process;
their distributed behaviour is tested through the parallel layers
(tests/test_tensor_parallel.py, tests/test_expert_parallel.py).
"""
import pytest
import torch
import torch.distributed as dist

from course_lib.distributed import collectives
from course_lib.distributed.collectives import all_to_all


def test_collectives_are_identities_on_one_process():
    assert not dist.is_initialized()
    x = torch.randn(3, 2)
    assert collectives.copy_to_parallel(x) is x
    assert collectives.reduce_from_parallel(x) is x
    assert all_to_all(x, [3], [3]) is x
    assert collectives.group_rank_and_size() == (0, 1)
    with pytest.raises(ValueError, match="in_splits and out_splits must "
                       "have world_size=1 entries"):
        all_to_all(x, [1, 2], [2, 1])


def test_require_group_needs_an_int_world_size():
    from course_lib.distributed.collectives import require_group
    with pytest.raises(TypeError, match="world_size"):
        require_group(None, 3.5)
