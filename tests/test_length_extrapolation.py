"""course_lib.experiments.length_extrapolation: the stored sweep is what the
recipe makes; ALiBi attention against torch's fused attention with the
bias as a float mask; each position scheme is wired as it claims; the
excess loss of the true chain is zero; the NTK-aware and PI frequencies
against their closed forms; bad input is named."""

import pytest
import torch
import torch.nn.functional as F

from course_lib.experiments import length_extrapolation as le
from course_lib.experiments.sweeps import load_sweep
from course_lib.model.alibi import alibi_bias
from course_lib.model.mha import MultiHeadAttention
from course_lib.model.rope import RotaryEmbedding
from course_lib.model.sinusoidal import frequencies, sinusoidal_encoding
from course_lib.model.yarn import yarn_frequencies
from course_lib.tasks.markov import (
    random_markov_source,
    sample_markov,
    token_nll,
)


def test_stored_sweep_is_what_the_recipe_makes():
    sweep = load_sweep("length_extrapolation")
    assert sweep.seeds == [0, 1, 2]
    assert [s["scheme"] for s in sweep.settings()] == list(le.SCHEMES)
    assert sweep.meta["steps"] == 300 and sweep.meta["length"] == 32
    # every cell costs the same; ALiBi's has the fewest ops
    fresh = le.run_length_extrapolation(scheme="alibi", seed=0)
    stored = sweep.cell(0, scheme="alibi")
    assert set(fresh) == set(stored)
    for key, value in fresh.items():
        assert value == pytest.approx(stored[key], rel=1e-3, abs=1e-4), key


def test_alibi_attention_matches_torch_with_the_bias_as_float_mask():
    torch.manual_seed(0)
    B, T, D, H = 2, 7, 16, 4
    attn = le.ALiBiAttention(D, H, bias=True)
    x = torch.randn(B, T, D)

    def heads(t):                                      # (B, H, T, d_k)
        return t.view(B, T, H, D // H).transpose(1, 2)

    q, k, v = (heads(p(x)) for p in (attn.q_proj, attn.k_proj,
                                     attn.v_proj))
    # torch's kernel adds a float mask to Q K^T / sqrt(d_k): ALiBi's bias
    # with -inf above the diagonal is exactly that mask
    ref = F.scaled_dot_product_attention(q, k, v,
                                         attn_mask=alibi_bias(H, T))
    ref = attn.o_proj(ref.transpose(1, 2).reshape(B, T, D))
    assert torch.allclose(attn(x), ref, atol=1e-6)
    # the causal mask a DecoderLM hands in changes nothing
    from course_lib.model.masks import causal_mask
    assert torch.allclose(attn(x, causal_mask(T, T)), ref, atol=1e-6)


def test_alibi_without_slopes_is_causal_multi_head_attention():
    torch.manual_seed(1)
    D, H, T = 16, 4, 6
    attn = le.ALiBiAttention(D, H)
    mha = MultiHeadAttention(D, H, bias=False)
    mha.load_state_dict(attn.state_dict())
    attn.slopes.zero_()
    x = torch.randn(3, T, D)
    from course_lib.model.masks import causal_mask
    assert torch.allclose(attn(x), mha(x, causal_mask(T, T)), atol=1e-6)


def test_each_scheme_is_wired_as_it_claims():
    T = 12
    models = {s: le.build_model(s, max_length=T) for s in le.SCHEMES}
    # sinusoidal: the scaled fixed table, frozen (no optimizer sees it)
    table = models["sinusoidal"].embed_positions.weight
    assert not table.requires_grad
    assert torch.allclose(table, sinusoidal_encoding(T, 32) / 4)
    assert torch.allclose(table.norm(dim=-1), torch.ones(T))
    assert models["learned"].embed_positions.weight.requires_grad
    for s in ("nope", "rope", "alibi"):
        assert models[s].embed_positions is None
    assert isinstance(models["rope"].layers[0].attention.rope, RotaryEmbedding)
    assert models["nope"].layers[0].attention.rope is None
    # NoPE sees order only through the causal mask: with one layer, the
    # last position's logits ignore how the tokens before it are ordered
    # (a second layer reads the first one's causal prefixes, which do
    # depend on it); every other scheme notices
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(16, (1, T), generator=g)
    perm = torch.cat([torch.randperm(T - 1, generator=g),
                      torch.tensor([T - 1])])
    for s in le.SCHEMES:
        model = le.build_model(s, max_length=T, num_hidden_layers=1)
        model.eval()
        with torch.no_grad():
            gap = (model(idx)[0, -1] - model(idx[:, perm])[0, -1]).abs()
        assert (gap.max() < 1e-5) == (s == "nope"), s


def test_excess_loss_of_the_true_chain_is_zero():
    source = random_markov_source(vocab_size=16, order=2, seed=0)
    seqs = sample_markov(source, n_sequences=8, length=11,
                         generator=torch.Generator().manual_seed(0))

    class Oracle(torch.nn.Module):
        """Logits log P(x | previous two); position 0 gets uniform."""

        def forward(self, idx, positions=None):
            B, T = idx.shape
            ctx = idx[:, :-1] * 16 + idx[:, 1:]                # (B, T - 1)
            logp = source.probs[ctx].clamp(min=1e-300).log()   # (B, T-1, V)
            return torch.cat([torch.zeros(B, 1, 16, dtype=logp.dtype),
                              logp], 1)

    delta = le.excess_loss(Oracle(), seqs, token_nll(source, seqs))
    assert delta.shape == (9,)
    assert delta.abs().max() < 1e-9


def test_ntk_and_pi_frequencies_closed_forms():
    d, base, s = 128, 10000.0, 4.0
    theta = frequencies(d, base)
    ntk = le.ntk_frequencies(d, base=base, factor=s)
    # the highest frequency is unchanged, the lowest divided by exactly s
    assert ntk[0].item() == pytest.approx(theta[0].item(), rel=1e-12)
    assert (theta[-1] / ntk[-1]).item() == pytest.approx(s, rel=1e-12)
    # theta'_i / theta_i = s^(-2i/(d-2)), the base raised to b s^(d/(d-2))
    i = torch.arange(d // 2, dtype=torch.float64)
    assert torch.allclose(ntk / theta, s ** (-2 * i / (d - 2)))
    assert torch.allclose(ntk, frequencies(d, base * s ** (d / (d - 2))))
    assert torch.allclose(le.pi_frequencies(d, base=base, factor=s),
                          theta / s)
    # YaRN lies between: pairs untouched (ratio 1) down to PI's 1 / s
    yarn = yarn_frequencies(d, base=base, factor=s,
                            original_max_position_embeddings=4096,
                            beta_fast=32, beta_slow=1) / theta
    assert yarn[0] == 1 and yarn[-1].item() == pytest.approx(1 / s)
    assert (yarn[1:] <= yarn[:-1] + 1e-12).all()


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="scheme"):
        le.run_length_extrapolation(scheme="xpos", seed=0)
    with pytest.raises(ValueError, match="seed"):
        le.run_length_extrapolation(scheme="rope", seed=-1)
    with pytest.raises(TypeError, match="steps"):
        le.run_length_extrapolation(scheme="rope", seed=0, steps=2.5)
    with pytest.raises(ValueError, match="scheme"):
        le.build_model("t5", max_length=8)
    with pytest.raises(ValueError, match="d_model"):
        le.ALiBiAttention(30, 4)
    with pytest.raises(ValueError, match="context"):
        le.ALiBiAttention(8, 2)(torch.zeros(1, 3, 8),
                                context=torch.zeros(1, 3, 8))
    with pytest.raises(ValueError, match="d"):
        le.ntk_frequencies(7, base=1e4, factor=2)
    with pytest.raises(ValueError, match="factor"):
        le.pi_frequencies(8, base=1e4, factor=0.5)
    with pytest.raises(TypeError, match="seqs"):
        le.excess_loss(torch.nn.Identity(), [1, 2], torch.zeros(1))
    with pytest.raises(ValueError, match="floor"):
        le.excess_loss(torch.nn.Identity(), torch.zeros(2, 5,
                                                        dtype=torch.long),
                       torch.zeros(2, 4))
