"""course_lib.model.mla against Hugging Face's DeepseekV3Attention (test-only
reference; transformers is never imported by course_lib).

Same state_dict keys (so released weights load by name), same outputs with
copied weights, also at positions > 0, through a cache, and with the
released YaRN rope_scaling at short and long positions."""
import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers.cache_utils import DynamicCache  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds  # noqa

from course_lib.model.masks import causal_mask  # noqa: E402
from course_lib.model.kv_cache import LayerKVCache  # noqa: E402
from course_lib.model.mla import (MLAConfig, MultiHeadLatentAttention,  # noqa: E402
                                  deepseek_yarn)
from course_lib.model.rope import rope_permutation  # noqa: E402
from course_lib.model.yarn import yarn_frequencies  # noqa: E402

ATOL = 1e-5
DIMS = dict(hidden_size=48, num_attention_heads=4, kv_lora_rank=32,
            qk_nope_head_dim=8, qk_rope_head_dim=6, v_head_dim=10)


def pair(q_lora_rank=24, ours_interleave=True, ref_interleave=True,
         rope_scaling=None, dims=DIMS, rope_theta=10000.0):
    """(ours, reference, rotary embedding) with identical weights."""
    torch.manual_seed(123)
    ours = MultiHeadLatentAttention(MLAConfig(
        **dims, q_lora_rank=q_lora_rank, rope_interleave=ours_interleave,
        rope_scaling=rope_scaling, rope_theta=rope_theta))
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if "layernorm" in name:
                p.uniform_(0.5, 1.5)
    extra = {} if rope_scaling is None else dict(
        rope_scaling=dict(rope_scaling),   # transformers' own copy
        max_position_embeddings=4096 * 40)
    hc = transformers.DeepseekV3Config(
        **dims, q_lora_rank=q_lora_rank, num_key_value_heads=4,
        head_dim=dims["qk_rope_head_dim"],  # RoPE acts on d_r dims
        rope_interleave=ref_interleave, rope_theta=rope_theta, **extra)
    hc._attn_implementation = "eager"
    ref = ds.DeepseekV3Attention(hc, layer_idx=0).eval()
    ref.load_state_dict(ours.state_dict())                # strict: same keys
    return ours, ref, ds.DeepseekV3RotaryEmbedding(hc)


def ref_forward(ref, rot, x, positions, cache=None, omega=None):
    """transformers' layer; cos/sin from its rotary embedding (float32
    angles), or from frequencies ``omega`` with float64 angles."""
    B, T, _ = x.shape
    if omega is None:
        cos, sin = rot(x, positions[None].expand(B, -1))
    else:
        angle = positions.double()[:, None] * omega       # (T, d_r/2)
        emb = torch.cat([angle, angle], -1)               # HF layout
        cos, sin = (f(emb).float()[None].expand(B, -1, -1)
                    * rot.attention_scaling for f in (torch.cos, torch.sin))
    S = T + (cache.get_seq_length() if cache is not None else 0)
    additive = torch.zeros(T, S).masked_fill(~causal_mask(T, S),
                                             float("-inf"))
    return ref(x, (cos, sin), additive[None, None], past_key_values=cache)[0]


@pytest.mark.parametrize("q_lora_rank", [24, None])
def test_state_dict_keys_and_shapes_match(q_lora_rank):
    ours, ref, _ = pair(q_lora_rank)
    a, b = ours.state_dict(), ref.state_dict()
    assert set(a) == set(b)
    assert all(a[k].shape == b[k].shape for k in a)
    if q_lora_rank is None:
        assert "q_proj.weight" in a and "q_a_proj.weight" not in a


@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("q_lora_rank", [24, None])
def test_equals_reference_at_offset_positions(absorb, q_lora_rank):
    ours, ref, rot = pair(q_lora_rank)
    torch.manual_seed(123)
    x = torch.randn(2, 7, 48)
    pos = torch.arange(7) + 11                            # positions > 0
    with torch.no_grad():
        want = ref_forward(ref, rot, x, pos)
        got = ours(x, causal_mask(7), positions=pos, absorb=absorb)
    assert torch.allclose(got, want, atol=ATOL)


def test_interleaved_pairs_are_what_the_released_layout_needs():
    # rope_interleave=True (DeepSeek's layout) pairs dims (2i, 2i+1), i.e.
    # apply_rope(..., interleave=True); rotate-half pairs do not match.
    torch.manual_seed(123)
    x = torch.randn(1, 6, 48)
    pos = torch.arange(6) + 3
    with torch.no_grad():
        ours, ref, rot = pair(ours_interleave=False, ref_interleave=True)
        assert not torch.allclose(ours(x, positions=pos),
                                  ref_forward(ref, rot, x, pos), atol=1e-3)
        ours, ref, rot = pair(ours_interleave=False, ref_interleave=False)
        assert torch.allclose(ours(x, causal_mask(6), positions=pos),
                              ref_forward(ref, rot, x, pos), atol=ATOL)


def cached_decode(ours, ref, rot):
    """Prefill 4 positions, then decode 2 one at a time, with the absorbed
    path and a course_lib cache against HF with its DynamicCache; each
    step's output must agree. Returns both caches."""
    torch.manual_seed(123)
    x = torch.randn(2, 6, 48)
    mine, theirs = LayerKVCache(), DynamicCache()
    with torch.no_grad():
        for lo, hi in ((0, 4), (4, 5), (5, 6)):           # prefill, decode
            pos = torch.arange(lo, hi)
            want = ref_forward(ref, rot, x[:, lo:hi], pos, cache=theirs)
            got = ours(x[:, lo:hi], causal_mask(hi - lo, hi), cache=mine,
                       absorb=True)
            assert torch.allclose(got, want, atol=ATOL)
    return mine, theirs


def test_cache_contents_and_decode_match_reference():
    ours, ref, rot = pair()
    mine, theirs = cached_decode(ours, ref, rot)
    kv_ref, rope_ref = theirs.layers[0].keys, theirs.layers[0].values
    c_kv, k_rope = mine.tensors
    assert torch.allclose(c_kv[:, None], kv_ref, atol=1e-6)  # same latent
    # Same rotated k^R; HF stores it de-interleaved (evens, then odds).
    perm = rope_permutation(6)
    assert torch.allclose(k_rope[..., perm], rope_ref, atol=1e-6)


# ------------------------------------------------------------------ YaRN
V3_YARN = deepseek_yarn(mscale=1.0)          # the released rope_scaling
# d_r = 16 (8 pairs) so that the YaRN ramp has pairs on both sides
YDIMS = dict(DIMS, qk_rope_head_dim=16)


K2_YARN = dict(V3_YARN, factor=32, beta_fast=1.0, beta_slow=1.0)  # Kimi K2


@pytest.mark.parametrize("d_r, rope_scaling, base", [
    (64, V3_YARN, 10000.0),                                # DeepSeek-V3
    (64, dict(V3_YARN, mscale=0.707, mscale_all_dim=0.707), 10000.0),  # V2
    (64, K2_YARN, 50000.0),                                # Kimi K2
    (16, V3_YARN, 10000.0),
    (16, dict(V3_YARN, original_max_position_embeddings=64, mscale=2.0),
     10000.0)])
def test_yarn_frequencies_and_scales_equal_reference(d_r, rope_scaling,
                                                     base):
    ours, ref, rot = pair(rope_scaling=rope_scaling, rope_theta=base,
                          dims=dict(DIMS, qk_rope_head_dim=d_r))
    w = yarn_frequencies(d_r, base=base, **rope_scaling)
    # transformers computes in float32: equal to float32 rounding
    assert torch.allclose(rot.inv_freq.double(), w, rtol=3e-7, atol=0)
    assert ref.scaling == pytest.approx(ours.scale, rel=1e-12)
    assert rot.attention_scaling == pytest.approx(ours.rope_factor,
                                                  rel=1e-12)


@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("start", [0, 11, 4090, 5000])
def test_yarn_equals_reference(absorb, start):
    # transformers' whole pipeline, its float32 rotary embedding included:
    # positions up to 5K (beyond the 4K of pretraining) agree to 1e-5.
    ours, ref, rot = pair(rope_scaling=V3_YARN, dims=YDIMS)
    torch.manual_seed(123)
    x = torch.randn(2, 7, 48)
    pos = torch.arange(7) + start
    with torch.no_grad():
        want = ref_forward(ref, rot, x, pos)
        got = ours(x, causal_mask(7), positions=pos, absorb=absorb)
        plain = pair(dims=YDIMS)[0](x, causal_mask(7), positions=pos)
    assert torch.allclose(got, want, atol=ATOL)
    assert not torch.allclose(plain, want, atol=1e-2)     # YaRN matters


@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("start", [40_000, 163_840 - 7, 1_000_000])
def test_yarn_equals_reference_at_long_positions(absorb, start):
    # At 1e5 positions float32 angles (transformers' rotary embedding and
    # DeepSeek's code alike) are off by up to ~1e-2 rad. The layer itself
    # is compared with float64 angles of frequencies that equal
    # transformers' own to float32 rounding (test above).
    ours, ref, rot = pair(rope_scaling=V3_YARN, dims=YDIMS)
    torch.manual_seed(123)
    x = torch.randn(2, 7, 48)
    pos = torch.arange(7) + start
    with torch.no_grad():
        want = ref_forward(ref, rot, x, pos, omega=ours.omega)
        got = ours(x, causal_mask(7), positions=pos, absorb=absorb)
        f32 = ref_forward(ref, rot, x, pos)               # float32 angles
    assert torch.allclose(got, want, atol=ATOL)
    assert (got - f32).abs().max() < 5e-3


def test_yarn_cache_decode_matches_reference():
    ours, ref, rot = pair(rope_scaling=V3_YARN, dims=YDIMS)
    mine, theirs = cached_decode(ours, ref, rot)
    perm = rope_permutation(16)                           # same rotated k^R
    assert torch.allclose(mine.tensors[1][..., perm],
                          theirs.layers[0].values, atol=1e-6)
