"""Tests for course_lib.generation.ragged and the ``attention_mask`` /
per-row ``positions`` of DecoderLM: a left-padded batch computes what each
prompt computes alone."""
import pytest
import torch

from course_lib.generation import sampling
from course_lib.generation.ragged import generate_ragged, left_pad
from course_lib.model.kv_cache import KVCache
from tiny_lm_support import MODELS, tiny_lm

LENGTHS = (3, 9, 1, 6)


def prompts_of(lengths=LENGTHS, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(23, (n,), generator=g) for n in lengths]


@pytest.mark.parametrize("name", MODELS)
def test_ragged_equals_per_prompt_generate(name):
    lm = tiny_lm(**MODELS[name])
    prompts = prompts_of()
    got = generate_ragged(lm, prompts, 15)
    for p, g in zip(prompts, got):
        want = sampling.generate(lm, p, 15, use_cache=True, temperature=0.0)
        assert torch.equal(g, want)


@pytest.mark.parametrize("name", MODELS)
def test_padded_logits_equal_single_prompt_logits(name):
    """Prefill and every decode step: each row's logits equal the logits
    of its prompt run alone, without a cache (independent reference)."""
    lm = tiny_lm(**MODELS[name])
    prompts = prompts_of()
    ids, mask = left_pad(prompts, 0)
    T0 = ids.shape[1]
    extra = torch.randint(23, (len(prompts), 4))            # 4 decode steps
    cache = KVCache(2, max_len=40)
    with torch.no_grad():
        steps = [lm(ids, cache=cache, attention_mask=mask)[:, -1]]
        for t in range(4):
            mask = torch.cat([mask, torch.ones(len(prompts), 1,
                                               dtype=torch.bool)], 1)
            steps.append(lm(extra[:, t:t + 1], cache=cache,
                            attention_mask=mask)[:, -1])
        for b, p in enumerate(prompts):
            seq = torch.cat([p, extra[b]])[None]             # (1, T0_b + 4)
            full = lm(seq)[0, len(p) - 1:]                    # (5, V)
            got = torch.stack([s[b] for s in steps])          # (5, V)
            torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)
    assert cache.seq_len == T0 + 4


@pytest.mark.parametrize("name", MODELS)
def test_pad_ids_never_attended(name):
    lm = tiny_lm(**MODELS[name])
    prompts = prompts_of()
    outs = [generate_ragged(lm, prompts, 8, pad_token_id=pad)
            for pad in (0, 7, 22)]
    for other in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], other))
    ids, mask = left_pad(prompts, 0)
    noisy = torch.where(mask, ids, torch.randint(23, ids.shape))
    with torch.no_grad():
        a = lm(ids, attention_mask=mask)
        b = lm(noisy, attention_mask=mask)
    assert torch.equal(a[mask], b[mask])    # only real positions compared


def test_shared_positions_shift_learned_but_not_rope():
    """Column positions shift a padded row: a learned table then adds
    other rows of P; RoPE sees the same offsets (rounding only)."""
    prompts = prompts_of((2, 8))
    ids, mask = left_pad(prompts, 0)
    for name, moved in (("mha-learned", True), ("mha-rope", False)):
        lm = tiny_lm(**MODELS[name])
        with torch.no_grad():
            right = lm(ids, attention_mask=mask)[:, -1]
            wrong = lm(ids, torch.arange(8), attention_mask=mask)[:, -1]
        diff = (right - wrong).abs().amax(-1)                # (B,)
        assert diff[1] == 0                                   # no padding
        assert (diff[0] > 1e-3) == moved


def test_unpadded_batch_is_bit_identical():
    """An all-True mask changes nothing: the default path is untouched."""
    lm = tiny_lm()
    ids = torch.randint(23, (2, 7))
    with torch.no_grad():
        assert torch.equal(lm(ids), lm(ids, attention_mask=torch.ones(
            2, 7, dtype=torch.bool)))


def test_model_argument_errors():
    lm = tiny_lm()
    ids = torch.randint(23, (2, 5))
    with pytest.raises(TypeError, match="attention_mask"):
        lm(ids, attention_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="attention_mask"):
        lm(ids, attention_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="positions"):
        lm(ids, torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="attention_mask"):
        lm(ids, attention_mask=[[True] * 5] * 2)


def test_generate_ragged_errors():
    lm = tiny_lm()
    p = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="prompts"):
        generate_ragged(lm, [], 3)
    with pytest.raises(TypeError, match="prompts"):
        generate_ragged(lm, p, 3)
    with pytest.raises(ValueError, match=r"prompts\[1\]"):
        generate_ragged(lm, [p, p[None]], 3)
    with pytest.raises(TypeError, match=r"prompts\[0\]"):
        generate_ragged(lm, [p.float()], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_ragged(lm, [p], 0)
    with pytest.raises(ValueError, match="pad_token_id"):
        generate_ragged(lm, [p], 3, pad_token_id=23)
    with pytest.raises(ValueError, match="longest prompt"):
        generate_ragged(lm, [p], 38)
    with pytest.raises(TypeError, match="per_row_positions"):
        generate_ragged(lm, [p], 3, per_row_positions=1)


def test_left_pad_and_model_errors():
    with pytest.raises(ValueError, match="pad_token_id"):
        left_pad([torch.tensor([1])], -1)
    with pytest.raises(TypeError, match="model"):
        generate_ragged(torch.nn.Linear(2, 2), [torch.tensor([1])], 2)
    ids, mask = left_pad([torch.tensor([4, 5]), torch.tensor([6])], 9)
    assert ids.tolist() == [[4, 5], [9, 6]]
    assert mask.tolist() == [[True, True], [False, True]]
