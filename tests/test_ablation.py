"""Tests for course_lib.experiments.ablation (chapter 13): zero ablation
of attention heads in a DecoderLM.

Reference: the head's output zeroed by a forward pre-hook on o_proj (the
concatenated head outputs [o_1; ...; o_H] are o_proj's input), and, for
one attention layer, the identity MHA(x) - MHA_without_i(x) = o_i W^O_i
with o_i captured from that input.
"""
import pytest
import torch

from course_lib.experiments.ablation import ablate_heads
from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig


def tiny() -> DecoderLM:
    torch.manual_seed(0)
    return DecoderLM(DecoderLMConfig(
        vocab_size=40, hidden_size=32, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=3,
        max_position_embeddings=32)).eval()


def idx():
    return torch.randint(0, 40, (2, 12), generator=torch.Generator()
                         .manual_seed(1))


def logits_with_hook(model, heads):
    """Logits with each head's slice of o_proj's input set to zero."""
    hooks = []
    for layer in {l for l, _ in heads}:
        attn = model.layers[layer].attention
        d_h = attn.head_dim
        mine = [h for l, h in heads if l == layer]

        def zero(mod, args, mine=mine, d_h=d_h):
            x = args[0].clone()                              # (B, T, H*d_h)
            for h in mine:
                x[..., h * d_h:(h + 1) * d_h] = 0
            return (x,)
        hooks.append(attn.o_proj.register_forward_pre_hook(zero))
    with torch.no_grad():
        out = model(idx())
    for h in hooks:
        h.remove()
    return out


def test_no_heads_changes_nothing():
    model = tiny()
    with torch.no_grad():
        before = model(idx())
        with ablate_heads(model, []):
            during = model(idx())
    assert torch.equal(before, during)


@pytest.mark.parametrize("heads", [[(0, 1)], [(2, 3)],
                                   [(0, 0), (1, 2), (1, 3), (2, 1)]])
def test_equals_zeroed_head_output(heads):
    model = tiny()
    expected = logits_with_hook(model, heads)
    with torch.no_grad(), ablate_heads(model, heads):
        got = model(idx())
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        assert not torch.allclose(got, model(idx()))


def test_removes_exactly_one_heads_term():
    model = tiny()
    attn = model.layers[1].attention
    x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(2))
    seen = []
    hook = attn.o_proj.register_forward_pre_hook(
        lambda mod, args: seen.append(args[0]))
    with torch.no_grad():
        full = attn(x)
        hook.remove()
        with ablate_heads(model, [(1, 2)]):
            without = attn(x)
    d_h = attn.head_dim
    cols = slice(2 * d_h, 3 * d_h)
    o_i = seen[0][..., cols]                                 # (B, T, d_h)
    term = o_i @ attn.o_proj.weight[:, cols].T               # (B, T, D)
    torch.testing.assert_close(full - without, term, rtol=1e-4, atol=1e-5)


def test_restores_weights_even_after_an_error():
    model = tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError):
        with ablate_heads(model, [(0, 1), (0, 1), (2, 0)]):
            assert model.layers[0].attention.o_proj.weight[:, 8:16].eq(
                0).all()
            raise RuntimeError("inside")
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("heads, error", [
    ((0, 1), TypeError),          # one pair, not a list of pairs
    ([(0,)], TypeError),
    ([(0, 1.0)], TypeError),
    ([(True, 1)], TypeError),
    ("01", TypeError),
    ([(3, 0)], ValueError),
    ([(0, 4)], ValueError),
    ([(-1, 0)], ValueError)])
def test_rejects_bad_heads(heads, error):
    model = tiny()
    with pytest.raises(error, match="heads"):
        with ablate_heads(model, heads):
            pass


def test_rejects_a_non_decoder():
    with pytest.raises(TypeError, match="model"):
        with ablate_heads(torch.nn.Linear(2, 2), []):
            pass
