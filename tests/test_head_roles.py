"""head_roles: every score against a loop over queries, the text targets
against a second, independent scan (regular expressions, brute force)."""
import re

import pytest
import torch

from course_lib.experiments import head_roles


def random_weights(B=3, H=2, T=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(B, H, T, T, generator=g)
    s = s.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)),
                      float("-inf"))
    return s.softmax(-1)


def test_offset_profile_equals_loop():
    w = random_weights()
    B, H, T, _ = w.shape
    prof = head_roles.offset_profile(w, 4)
    assert prof.shape == (H, 5)
    for h in range(H):
        for k in range(5):
            vals = [w[b, h, t, t - k].item() for b in range(B)
                    for t in range(k, T)]
            assert prof[h, k].item() == pytest.approx(sum(vals) / len(vals))


def test_offset_profile_of_a_pure_previous_token_head():
    T = 6
    w = torch.zeros(1, 1, T, T)
    w[0, 0, 0, 0] = 1
    w[0, 0, torch.arange(1, T), torch.arange(T - 1)] = 1
    prof = head_roles.offset_profile(w, 2)[0]
    assert prof.tolist() == [pytest.approx(1 / T), 1.0, 0.0]


def test_target_weight_equals_loop():
    w = random_weights()
    B, H, T, _ = w.shape
    g = torch.Generator().manual_seed(1)
    targets = torch.stack([torch.tensor(
        [int(torch.randint(-1, t + 1, (1,), generator=g)) for t in range(T)])
        for _ in range(B)])
    targets[0, 3] = 2                      # at least one real target
    got = head_roles.target_weight(w, targets)
    for h in range(H):
        vals = [w[b, h, t, targets[b, t]].item() for b in range(B)
                for t in range(T) if targets[b, t] >= 0]
        assert got[h].item() == pytest.approx(sum(vals) / len(vals))


def test_uniform_weights_and_their_scores():
    u = head_roles.uniform_weights(2, 1, 5)
    assert torch.allclose(u.sum(-1), torch.ones(2, 1, 5))
    assert u[0, 0, 3].tolist() == [0.25] * 4 + [0.0]
    targets = torch.tensor([[-1, 0, 0, 1, 4]] * 2)
    assert head_roles.target_weight(u, targets).item() == pytest.approx(
        (1 / 2 + 1 / 3 + 1 / 4 + 1 / 5) / 4)


def test_distance_baseline_equals_loop():
    w = random_weights(T=6)
    B, H, T, _ = w.shape
    targets = torch.tensor([[-1, 0, 1, 0, 2, 5]] * B)
    prof = head_roles.offset_profile(w, T - 1)
    got = head_roles.distance_baseline(w, targets)
    for h in range(H):
        vals = [prof[h, t - targets[b, t]].item() for b in range(B)
                for t in range(T) if targets[b, t] >= 0]
        assert got[h].item() == pytest.approx(sum(vals) / len(vals))


def test_distance_baseline_of_a_head_blind_to_content_is_its_score():
    # A head whose weights depend on the distance only (the same in every
    # row, where defined) scores exactly its distance baseline.
    T = 8
    d = torch.tensor([0.5, 0.3, 0.2])
    w = torch.zeros(1, 1, T, T)
    for t in range(T):
        for k in range(min(t + 1, 3)):
            w[0, 0, t, t - k] = d[k]
    targets = torch.tensor([[-1, -1, 1, 1, 3, 4, 4, 6]])
    assert head_roles.distance_baseline(w, targets).item() == pytest.approx(
        head_roles.target_weight(w, targets).item())
    # ... and a head that finds its targets by content beats it
    w = torch.zeros(1, 1, T, T)
    w[0, 0, torch.arange(T), targets.clamp(min=0)[0]] = 1.0
    assert head_roles.target_weight(w, targets).item() == 1.0
    assert head_roles.distance_baseline(w, targets).item() < 0.7


def test_head_disagreement_equals_loop():
    w = random_weights(H=3)
    B, H, T, _ = w.shape
    d = head_roles.head_disagreement(w)
    for a in range(H):
        for b in range(H):
            tv = [0.5 * (w[i, a, t] - w[i, b, t]).abs().sum().item()
                  for i in range(B) for t in range(T)]
            assert d[a, b].item() == pytest.approx(sum(tv) / len(tv),
                                                   abs=1e-6)
    assert torch.equal(d.diagonal(), torch.zeros(H))


def word_starts_by_regex(text):
    out = [-1] * len(text)
    for m in re.finditer(r"[^ \n]+", text):
        for t in range(m.start() + 1, m.end()):
            out[t] = m.start()
    return out


@pytest.mark.parametrize("text", ["", "a", "ab cd\n  efg h", "  x  yy ",
                                  'print("hi")\nif x: y'])
def test_word_starts_matches_a_regex(text):
    assert head_roles.word_starts(text).tolist() == word_starts_by_regex(text)


def open_by_brute_force(text, t):
    """Innermost span open before t: re-scan the prefix text[:t]."""
    stack = []
    for j, ch in enumerate(text[:t]):
        if ch in "\"'":
            apostrophe = (ch == "'" and 0 < j < len(text) - 1
                          and text[j - 1].isalpha() and text[j + 1].isalpha())
            if stack and text[stack[-1]] == ch:
                stack.pop()
            elif not apostrophe:
                stack.append(j)
        elif ch in "([{":
            stack.append(j)
        elif ch in ")]}":
            if stack and text[stack[-1]] == "([{"[")]}".index(ch)]:
                stack.pop()
    return stack[-1] if stack else -1


@pytest.mark.parametrize("text", [
    'f(a, [b, "c(d"], e)', "don't (x)", "'a' + (b]", '{"k": [1, (2)]}', ""])
def test_open_delimiters_matches_brute_force(text):
    got = head_roles.open_delimiters(text).tolist()
    assert got == [open_by_brute_force(text, t) for t in range(len(text))]


def test_open_delimiters_by_hand():
    text = 'f(a"b")'
    #       0123456
    assert head_roles.open_delimiters(text).tolist() == [-1, -1, 1, 1, 3, 3, 1]


@pytest.mark.parametrize("call", [
    lambda: head_roles.offset_profile(torch.rand(2, 3, 4), 1),
    lambda: head_roles.offset_profile(torch.rand(1, 1, 4, 4), 4),
    lambda: head_roles.target_weight(torch.rand(1, 1, 3, 3),
                             torch.tensor([[0, 2, 3]])),
    lambda: head_roles.target_weight(torch.rand(1, 1, 3, 3),
                             torch.tensor([[-1, -1, -1]])),
    lambda: head_roles.target_weight(torch.rand(1, 1, 3, 3), torch.zeros(1, 2).long()),
    lambda: head_roles.uniform_weights(0, 1, 3),
])
def test_bad_input_is_a_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_committed_char_model_has_no_induction_heads():
    """Chapter 5's claim about the shipped character model: a random string
    written twice is no easier the second time, and no head attends to the
    induction target more than a uniform head. (If the checkpoint is ever
    retrained long enough to grow induction heads, this fails and the
    chapter's prose must change with it.)"""
    import torch.nn.functional as F
    from course_lib.tasks.char_lm import load_char_lm
    from course_lib.experiments.interpret import attention_maps
    lm, vocab = load_char_lm()
    L = 60
    g = torch.Generator().manual_seed(0)
    letters = vocab.encode("abcdefghijklmnopqrstuvwxyz")
    half = letters[torch.randint(0, 26, (8, L), generator=g)]
    rep = torch.cat([half, half], dim=1)                       # (8, 2L)
    maps, logits = attention_maps(lm, rep)
    nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), rep[:, 1:],
                          reduction="none")
    assert nll[:, L:].mean() > nll[:, :L - 1].mean() - 0.1
    t = torch.arange(2 * L)
    target = torch.where(t >= L, t - L + 1, -1).expand(8, -1)
    uniform = head_roles.target_weight(head_roles.uniform_weights(8, 1, 2 * L), target)
    for m in maps:                                             # each layer
        assert (head_roles.target_weight(m, target) < 2 * uniform).all()


def test_repeated_windows_are_periodic_slices_of_the_text():
    ids = torch.arange(100, 400)                  # id = 100 + position
    batches = head_roles.repeated_windows(ids, batch_size=16, length=30,
                                  min_period=4, max_period=9, seed=3)
    periods = set()
    for _ in range(3):
        x, y = next(batches)
        assert x.shape == y.shape == (16, 30)
        assert torch.equal(x[:, 1:], y[:, :-1])
        for row, tgt in zip(x.tolist(), y.tolist()):
            full = row + [tgt[-1]]
            # the period: smallest n with full[j] == full[j - n] for all j
            n = next(n for n in range(1, 31)
                     if all(full[j] == full[j - n] for j in range(n, 31)))
            assert 4 <= n <= 9
            periods.add(n)
            # the first n ids are consecutive positions of the text
            assert full[:n] == list(range(full[0], full[0] + n))
    assert len(periods) > 1                       # the period varies


def test_repeated_windows_rejects_bad_input():
    with pytest.raises(ValueError):
        head_roles.repeated_windows(torch.arange(5), batch_size=2, length=8,
                            min_period=2, max_period=6)
    with pytest.raises(ValueError):
        head_roles.repeated_windows(torch.arange(50), batch_size=2, length=8,
                            min_period=5, max_period=3)
