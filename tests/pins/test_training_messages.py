"""Pins: the exact wording of error messages of course_lib.training.
They keep messages from changing by accident; the behaviour itself is
specified in tests/test_training.py.

Found by mutation testing (benchmarks/mutation.md, "training survivors
and why"): a mutant that changes only a message is killed here, so
`make mutation` runs this file with the behaviour tests ([tool.mutmut]
in pyproject.toml).
"""
import pytest
import torch

from course_lib import training
from test_training import Bigram


def test_training_messages_in_full(tmp_path):
    import re
    model = Bigram()
    missing = tmp_path / "missing.pt"
    with pytest.raises(ValueError, match=r"^path must be an existing "
                       r"checkpoint file, got '" + re.escape(str(missing)) + "'$"):
        training.read_state_file(missing, "checkpoint file")
    training.save_checkpoint(tmp_path / "m.pt", model, None, 0)
    with pytest.raises(ValueError, match=r"^optimizer given, but '"
                       + re.escape(str(tmp_path / "m.pt")) + r"' holds no "
                       r"optimizer state$"):
        training.load_checkpoint(tmp_path / "m.pt", model,
                          training.make_optimizer(model, lr=1e-3))
    with pytest.raises(ValueError, match=r"^warmup_steps must be >= 0, got "
                       r"-1$"):
        training.lr_multiplier(0, warmup_steps=-1, total_steps=3)
    with pytest.raises(TypeError, match=r"^model must be a torch.nn.Module,"
                       r" got str$"):
        training.make_optimizer("model", lr=1e-3)
    with pytest.raises(TypeError, match=r"^weight_decay must be a real "
                       r"number, got str '0.1'$"):
        training.make_optimizer(model, lr=1e-3, weight_decay="0.1")
    with pytest.raises(TypeError, match=r"^batch must be a tuple \(inputs, "
                       r"targets\) of tensors, got str$"):
        training.next_token_loss(model, "batch")
    with pytest.raises(TypeError, match=r"^batch's targets must be a "
                       r"torch.Tensor, got list$"):
        training.next_token_loss(model, (torch.zeros(1, 2, dtype=torch.long),
                                  [1, 2]))
    with pytest.raises(TypeError, match=r"^batch's inputs must be a "
                       r"torch.Tensor, got list$"):
        training.next_token_loss(model, ([1, 2], torch.zeros(1, 2)))
    with pytest.raises(ValueError, match=r"^targets must hold at least one "
                       r"target that is not IGNORE \(a mean over no tokens "
                       r"is NaN\)$"):
        training.next_token_loss(model, (torch.zeros(1, 2, dtype=torch.long),
                                  torch.full((1, 2), training.IGNORE)))


def test_checkpoint_file_messages_in_full(tmp_path):
    import re
    with pytest.raises(TypeError, match=r"^state must be a dict, got "
                       r"list$"):
        training.save_state_file(tmp_path / "s.pt", [1])
    with pytest.raises(RuntimeError, match=r"^torch.save wrote no zip "
                       r"archive without a comment; cannot record the "
                       r"checkpoint's sha256$"):
        training._with_sha256(b"\0" * 30)
    training.save_state_file(tmp_path / "s.pt", {"a": torch.ones(2)})
    data = bytearray((tmp_path / "s.pt").read_bytes())
    data[len(data) // 2] ^= 1
    (tmp_path / "s.pt").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="^" + re.escape(
            f"{str(tmp_path / 's.pt')!r} is damaged or was changed after "
            f"it was saved: its bytes do not match the sha256 recorded in "
            f"it (or it is not a torch.save file)") + "$"):
        training.read_state_file(tmp_path / "s.pt", "state file")
    torch.save({"a": torch.ones(3)}, tmp_path / "plain.pt")
    raw = (tmp_path / "plain.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(raw[:len(raw) // 2] + raw[-22:])
    with pytest.raises(ValueError, match="^" + re.escape(
            f"{str(tmp_path / 'cut.pt')!r} is not a readable state file "
            f"(damaged or not a torch.save file): ")):
        training.read_state_file(tmp_path / "cut.pt", "state file")
