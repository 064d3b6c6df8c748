"""Tests for course_lib.experiments.block_stats (chapter 6): residuals,
norm placement and initialisation in deep stacks.

References used: the three arrangements written out by hand, a loop form
of each measurement (one stack per depth, its own forward and backward
pass, torch.autograd.grad per layer instead of the batched copies), the
closed form 0.02/sqrt(2N) of GPT-2's scaled init, and a model whose
sub-layers write zeros (the residual stack then is the embedding).
"""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.experiments import block_stats as bs
from course_lib.model.masks import causal_mask
from course_lib.tasks import markov


def _ln(h):
    return F.layer_norm(h, h.shape[-1:])


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("norm", bs.NORMS)
def test_apply_sublayer_matches_the_written_arrangements(residual, norm):
    torch.manual_seed(0)
    f = nn.Linear(8, 8)
    h = torch.randn(3, 5, 8)
    expected = {
        (False, "none"): f(h), (True, "none"): h + f(h),
        (False, "post"): _ln(f(h)), (True, "post"): _ln(h + f(h)),
        (False, "pre"): f(_ln(h)), (True, "pre"): h + f(_ln(h)),
    }[residual, norm]
    got = bs.apply_sublayer(h, f, residual=residual, norm=norm)
    torch.testing.assert_close(got, expected)


def _ffn_grads_loop(n, depths, *, residual, norm, seed, d_model):
    """One stack of depth n, alone: grads of g . x_n at each layer input."""
    torch.manual_seed(seed)
    from course_lib.model import block
    ffns = [block.FeedForward(d_model, 4 * d_model)
            for _ in range(max(depths))]
    g = torch.randn(32, d_model)
    h = torch.randn(32, d_model)
    inputs = []
    for f in ffns[:n]:
        h = h.detach().requires_grad_(True) if not inputs else h
        inputs.append(h)
        y = f(_ln(h) if norm == "pre" else h)
        h = h + y if residual else y
        if norm == "post":
            h = _ln(h)
    out = _ln(h) if norm == "pre" else h
    grads = torch.autograd.grad((g * out).sum(), inputs)
    return [t.norm().item() for t in grads]


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("norm", bs.NORMS)
def test_ffn_stack_grads_matches_one_stack_per_depth(residual, norm):
    depths = [1, 3, 5]
    got = bs.ffn_stack_grads(depths, residual=residual, norm=norm, seed=2,
                             d_model=8)
    assert list(got) == depths
    for n in depths:
        ref = _ffn_grads_loop(n, depths, residual=residual, norm=norm,
                              seed=2, d_model=8)
        assert len(got[n]) == n
        assert got[n] == pytest.approx(ref, rel=1e-4)


def test_ffn_stack_grads_plain_vanishes_and_residual_does_not():
    got_plain = bs.ffn_stack_grads([16], residual=False, d_model=16)[16]
    got_res = bs.ffn_stack_grads([16], residual=True, d_model=16)[16]
    assert got_plain[0] < 1e-4 * got_plain[-1]     # about 0.24 per layer
    assert got_res[0] > got_res[-1]                # identity term: no decay


@pytest.mark.parametrize("kind", ["post", "pre"])
def test_layer_stats_matches_one_stack_per_depth(kind):
    depths = (2, 3)
    got = bs.layer_stats(kind, depths, seed=1, d_model=16)
    torch.manual_seed(1)
    layers = bs.make_stack(kind, max(depths), d_model=16)
    gen = torch.Generator().manual_seed(101)
    x = torch.randn(2, 16, 16, generator=gen)
    g = torch.randn(2, 16, 16, generator=gen)
    for n in depths:
        h, rms = x, []
        for layer in layers[:n]:
            h = layer(h)
            rms.append(h.pow(2).mean().sqrt().item())
        out = _ln(h) if kind == "pre" else h
        norms = []
        for layer in layers[:n]:
            grads = torch.autograd.grad((g * out).sum(),
                                        list(layer.parameters()),
                                        retain_graph=True)
            norms.append(torch.cat([t.flatten() for t in grads])
                         .norm().item())
        got_norms, got_rms = got[n]
        assert got_norms == pytest.approx(norms, rel=1e-4)
        assert got_rms == pytest.approx(rms, rel=1e-5)
    if kind == "post":                  # LayerNorm last: RMS 1 exactly
        assert got[3][1] == pytest.approx([1.0] * 3, abs=1e-4)


def test_stack_lm_residual_with_silent_sublayers_is_the_embedding():
    torch.manual_seed(0)
    model = bs.StackLM(True, n_layers=3, vocab_size=11, d_model=16,
                       max_len=8)
    with torch.no_grad():
        for attn, ffn in zip(model.attn, model.ffn):
            attn.o_proj.weight.zero_()
            attn.o_proj.bias.zero_()
            ffn.linear2.weight.zero_()
            ffn.linear2.bias.zero_()
        idx = torch.randint(11, (2, 8))
        h = model.embed(idx) + model.pos.weight[:8]
        expected = model.head(model.norms[-1](h))
        torch.testing.assert_close(model(idx), expected)


@pytest.mark.parametrize("residual", [False, True])
def test_stack_lm_shapes_plain_form_and_causality(residual):
    torch.manual_seed(0)
    model = bs.StackLM(residual, n_layers=2, vocab_size=11, d_model=16,
                       max_len=8).eval()
    idx = torch.randint(11, (2, 6))
    with torch.no_grad():
        logits = model(idx)
        assert logits.shape == (2, 6, 11)
        idx2 = idx.clone()
        idx2[:, 4:] = (idx2[:, 4:] + 1) % 11
        diff = (model(idx2) - logits).abs().amax(dim=(0, 2))
    assert diff[:4].max() == 0 and diff[4:].min() > 0
    if not residual:                    # x = LN(f(x)), written out
        with torch.no_grad():
            h = model.embed(idx) + model.pos.weight[:6]
            n = iter(model.norms)
            for attn, ffn in zip(model.attn, model.ffn):
                h = next(n)(attn(h, causal_mask(6)))
                h = next(n)(ffn(h))
            torch.testing.assert_close(logits, model.head(next(n)(h)))


def test_train_stack_is_reproducible_and_evaluates_every_20_steps():
    source = markov.random_markov_source(vocab_size=6, order=1,
                                         branching=2, seed=0)
    val = next(markov.lm_batches(source, batch_size=8, length=16, seed=9))
    a = bs.train_stack(True, source, val, steps=40)
    b = bs.train_stack(True, source, val, steps=40)
    assert list(a.val_step) == [20, 40] and a.val_loss == b.val_loss
    assert all(math.isfinite(v) for v in a.val_loss)


def test_gpt2_like_scales_the_residual_projections():
    m = bs.gpt2_like(8)
    for name, p in m.named_parameters():
        if name.endswith(("o_proj.weight", "linear2.weight")):
            assert p.std().item() == pytest.approx(0.02 / math.sqrt(16),
                                                   rel=0.1)
        elif name.endswith("q_proj.weight"):
            assert p.std().item() == pytest.approx(0.02, rel=0.1)


def test_stream_rms_matches_a_loop_over_the_blocks():
    got = bs.stream_rms(3, scaled=True)
    m = bs.gpt2_like(3)
    idx = torch.randint(100, (8, 32),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        h = m.embed_tokens(idx) + m.embed_positions(torch.arange(32))
        ref = []
        for layer in m.layers:
            h = layer(h, causal_mask(32))
            ref.append(h.pow(2).mean().sqrt().item())
    assert got == pytest.approx(ref, rel=1e-5)
    unscaled = bs.stream_rms(3, scaled=False)
    assert unscaled[-1] > got[-1]       # 0.02 everywhere grows faster


def _val():
    source = markov.random_markov_source(vocab_size=6, order=1,
                                         branching=2, seed=0)
    return source, next(markov.lm_batches(source, batch_size=2, length=8,
                                          seed=0))


@pytest.mark.parametrize("call, error, match", [
    (lambda: bs.ffn_stack_grads([], residual=True), ValueError, "depths"),
    (lambda: bs.ffn_stack_grads("12", residual=True), TypeError, "depths"),
    (lambda: bs.ffn_stack_grads([0], residual=True), ValueError, "depths"),
    (lambda: bs.ffn_stack_grads([2, 2], residual=True), ValueError,
     "distinct"),
    (lambda: bs.ffn_stack_grads([2.0], residual=True), TypeError,
     "depths"),
    (lambda: bs.ffn_stack_grads([2], residual=1), TypeError, "residual"),
    (lambda: bs.ffn_stack_grads([2], residual=True, norm="mid"),
     ValueError, "norm"),
    (lambda: bs.ffn_stack_grads([2], residual=True, d_model=0),
     ValueError, "d_model"),
    (lambda: bs.apply_sublayer(torch.zeros(2, 4), nn.Identity(),
                               residual="yes", norm="none"),
     TypeError, "residual"),
    (lambda: bs.apply_sublayer(torch.zeros(2, 4), nn.Identity(),
                               residual=True, norm="Pre"),
     ValueError, "norm"),
    (lambda: bs.make_stack("mid", 2), ValueError, "kind"),
    (lambda: bs.make_stack("pre", 0), ValueError, "n_layers"),
    (lambda: bs.make_stack("pre", 2, d_model=30), ValueError, "n_heads"),
    (lambda: bs.layer_stats("sandwich"), ValueError, "kind"),
    (lambda: bs.layer_stats("pre", (3, 3)), ValueError, "distinct"),
    (lambda: bs.layer_stats("pre", seed=-1), ValueError, "seed"),
    (lambda: bs.StackLM(None), TypeError, "residual"),
    (lambda: bs.StackLM(True, n_layers=0), ValueError, "n_layers"),
    (lambda: bs.StackLM(True, d_model=18), ValueError, "d_model"),
    (lambda: bs.train_stack(True, "markov", _val()[1]), TypeError,
     "source"),
    (lambda: bs.train_stack(True, _val()[0], torch.zeros(2, 8)),
     TypeError, "val_batch"),
    (lambda: bs.train_stack(True, *_val(), steps=29), ValueError,
     "steps"),
    (lambda: bs.gpt2_like(0), ValueError, "n_layers"),
    (lambda: bs.gpt2_like("2"), TypeError, "n_layers"),
    (lambda: bs.stream_rms(2, scaled="no"), TypeError, "scaled"),
])
def test_bad_input_is_rejected_naming_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
