"""bits_per_token and label_smoothed_loss (course_lib.training) against
PyTorch's cross-entropy and a loop over positions."""
import math

import pytest
import torch
import torch.nn.functional as F

from course_lib import training
from course_lib.training import IGNORE, bits_per_token, label_smoothed_loss


def batch(B, T, V, seed=0, scale=1.0, ignore=()):
    gen = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(B, T, V, generator=gen)
    targets = torch.randint(V, (B, T), generator=gen)
    for b, t in ignore:
        targets[b, t] = IGNORE
    return logits, targets


def loop_smoothed(logits, targets, eps):
    """-sum_v y'_v log q_v, position by position, y' = 1 - eps on the
    target and eps / (V - 1) on every other token."""
    V, total, n = logits.shape[-1], 0.0, 0
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            y = targets[b, t].item()
            if y == IGNORE:
                continue
            log_q = logits[b, t].double().log_softmax(-1).tolist()
            total -= sum(((1 - eps) if v == y else eps / (V - 1)) * log_q[v]
                         for v in range(V))
            n += 1
    return total / n


@pytest.mark.parametrize("case", [
    batch(1, 4, 5), batch(2, 5, 7, ignore=[(0, 0), (1, 4)]),
    batch(3, 8, 96, scale=3.0, seed=1), batch(2, 3, 4, ignore=[(1, 0),
                                                               (1, 1),
                                                               (1, 2)])])
def test_bits_per_token_is_cross_entropy_over_ln2(case):
    logits, targets = case
    nats = F.cross_entropy(logits.flatten(0, 1).double(), targets.flatten(),
                           ignore_index=IGNORE).item()
    assert bits_per_token(logits, targets) == pytest.approx(
        nats / math.log(2), rel=1e-12)


def test_bits_per_token_is_finite_for_huge_logits():
    logits = torch.tensor([[[500.0, 0.0, -500.0], [-100.0, 80.0, 0.0]]])
    got = bits_per_token(logits, torch.tensor([[0, 0]]))
    assert got == pytest.approx(180 / 2 / math.log(2), rel=1e-9)


@pytest.mark.parametrize("eps", [0.0, 0.05, 0.1, 0.3])
@pytest.mark.parametrize("case", [
    batch(1, 4, 5), batch(2, 5, 7, ignore=[(0, 0), (1, 4)]),
    batch(2, 3, 2, seed=3), batch(3, 6, 50, scale=4.0, seed=2)])
def test_label_smoothed_loss_matches_pytorch_with_rescaled_eps(case, eps):
    """y' = 1 - eps, eps/(V-1) is PyTorch's y' for eps' = eps V/(V-1)."""
    logits, targets = case
    V = logits.shape[-1]
    torch_eps = eps * V / (V - 1)
    if torch_eps > 1:
        pytest.skip("PyTorch accepts label_smoothing <= 1 only")
    expected = F.cross_entropy(logits.flatten(0, 1).double(),
                               targets.flatten(), ignore_index=IGNORE,
                               label_smoothing=torch_eps).item()
    got = label_smoothed_loss(logits, targets, eps)
    assert got == pytest.approx(expected, rel=1e-10)
    assert got == pytest.approx(loop_smoothed(logits, targets, eps),
                                rel=1e-10)


def test_label_smoothed_loss_eps_zero_and_one():
    logits, targets = batch(2, 4, 6, ignore=[(0, 1)])
    assert label_smoothed_loss(logits, targets, 0.0) == pytest.approx(
        bits_per_token(logits, targets) * math.log(2), rel=1e-12)
    # eps = 1: all mass on the other tokens
    assert label_smoothed_loss(logits, targets, 1.0) == pytest.approx(
        loop_smoothed(logits, targets, 1.0), rel=1e-12)


def test_label_smoothed_loss_is_finite_for_huge_logits():
    logits = torch.tensor([[[500.0, 0.0, -500.0]]])
    got = label_smoothed_loss(logits, torch.tensor([[0]]), 0.1)
    assert math.isfinite(got)
    assert got == pytest.approx(0.05 * 500 + 0.05 * 1000, rel=1e-9)


@pytest.mark.parametrize("fn", [bits_per_token, label_smoothed_loss])
def test_bad_inputs_name_the_argument(fn):
    logits, targets = batch(1, 3, 4)
    extra = (0.1,) if fn is label_smoothed_loss else ()
    with pytest.raises(ValueError, match="IGNORE"):
        fn(logits, torch.full((1, 3), IGNORE), *extra)
    with pytest.raises(ValueError, match="targets"):
        fn(logits, targets[:, :2], *extra)
    with pytest.raises(ValueError, match="targets"):
        fn(logits, torch.full((1, 3), 4), *extra)
    with pytest.raises(TypeError, match="logits"):
        fn(logits.tolist(), targets, *extra)
    with pytest.raises(ValueError, match="logits"):
        fn(logits[0], targets, *extra)


def test_label_smoothed_loss_checks_epsilon_and_vocabulary():
    logits, targets = batch(1, 3, 4)
    with pytest.raises(ValueError, match="epsilon"):
        label_smoothed_loss(logits, targets, 1.5)
    with pytest.raises(TypeError, match="epsilon"):
        label_smoothed_loss(logits, targets, "0.1")
    with pytest.raises(ValueError, match="V >= 2"):
        label_smoothed_loss(torch.zeros(1, 2, 1), torch.zeros(1, 2,
                                                              dtype=int),
                            0.1)


def test_public():
    assert {"bits_per_token", "label_smoothed_loss"} <= set(training.__all__)
