"""Pins: the exact wording of error messages of
course_lib.generation.penalties. They keep messages from changing by
accident; the behaviour itself is specified in tests/test_penalties.py.

Found by mutation testing (benchmarks/mutation.md): a mutant that changes
only a message is killed here, so `make mutation` runs this file with the
behaviour tests ([tool.mutmut] in pyproject.toml).
"""
import pytest
import torch

from course_lib.generation.penalties import (frequency_presence_penalty,
                                             repetition_penalty)

Z, IDS = torch.zeros(2, 5), torch.zeros(2, 3, dtype=torch.long)


@pytest.mark.parametrize("call, error, message", [
    (lambda: repetition_penalty([0.0], IDS, 2.0), TypeError,
     r"^logits must be a floating tensor, got list$"),
    (lambda: repetition_penalty(Z.long(), IDS, 2.0), TypeError,
     r"^logits must be a floating tensor, got torch.int64$"),
    (lambda: repetition_penalty(Z, [[0]], 2.0), TypeError,
     r"^ids must be a torch.long tensor, got list$"),
    (lambda: repetition_penalty(Z, IDS.int(), 2.0), TypeError,
     r"^ids must be a torch.long tensor, got torch.int32$"),
    (lambda: repetition_penalty(Z, IDS, 0), ValueError,
     r"^penalty must be > 0, got 0$"),
    (lambda: frequency_presence_penalty(Z, IDS, frequency="1"), TypeError,
     r"^frequency must be a real number, got str '1'$"),
    (lambda: frequency_presence_penalty(Z, IDS, presence="1"), TypeError,
     r"^presence must be a real number, got str '1'$"),
])
def test_messages_in_full(call, error, message):
    with pytest.raises(error, match=message):
        call()
