"""Tests for course_lib.model.mla (multi-head latent attention, chapter 10).

The comparison with Hugging Face's DeepseekV3Attention is in
test_mla_reference.py (it imports transformers, which is slow); the
configuration and its parameter count (course_lib.model.mla) are tested
in test_mla_config.py."""
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from course_lib.model.masks import causal_mask
from course_lib.generation.sampling import generate
from course_lib.model.kv_cache import KVCache, LayerKVCache
from course_lib.sizing.kv_cache_size import kv_cache_bytes
from course_lib.model.mla import MLAConfig, MultiHeadLatentAttention
from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig
from course_lib.model.rope import apply_rope
from course_lib.model import attention, mha, mla as mla_module
from mla_support import tiny

ATOL = 1e-5


def make(cfg=None, seed=123, **kw) -> MultiHeadLatentAttention:
    torch.manual_seed(seed)
    m = MultiHeadLatentAttention(cfg or tiny(), **kw)
    # Non-trivial norm weights, so a missing or misplaced norm shows up.
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "layernorm" in name:
                p.uniform_(0.5, 1.5)
    return m


# ------------------------------------------------------------------ config
def test_yarn_scale_and_plain_default():
    v3 = MLAConfig.deepseek_v3()
    with torch.device("meta"):
        m = MultiHeadLatentAttention(v3)
        plain = MultiHeadLatentAttention(replace(v3, rope_scaling=None))
    assert plain.scale == 192 ** -0.5 and plain.omega is None
    assert m.scale == pytest.approx(192 ** -0.5 * (1 + 0.1 * math.log(40))
                                    ** 2, rel=1e-14)
    assert m.omega.dtype == torch.float64 and m.omega.shape == (32,)


def test_module_rejects_non_config():
    with pytest.raises(TypeError, match="config must be an MLAConfig"):
        MultiHeadLatentAttention({"hidden_size": 8})


# --------------------------------------------------- explicit vs absorbed
def _masks(B, T):
    pad = torch.ones(B, 1, T, dtype=torch.bool)
    pad[0, 0, -2:] = False                                 # pad 2 keys
    return [None, causal_mask(T), pad,
            causal_mask(T)[None].expand(B, T, T) & pad]


@pytest.mark.parametrize("q_lora_rank", [24, None])
@pytest.mark.parametrize("mask_idx", range(4))
def test_absorbed_equals_explicit(q_lora_rank, mask_idx):
    m = make(tiny(q_lora_rank=q_lora_rank))
    torch.manual_seed(123)
    x = torch.randn(2, 7, 48)
    mask = _masks(2, 7)[mask_idx]
    pos = torch.arange(5, 12)
    explicit = m(x, mask, positions=pos, absorb=False)
    absorbed = m(x, mask, positions=pos, absorb=True)
    assert explicit.shape == (2, 7, 48)
    assert torch.allclose(explicit, absorbed, atol=ATOL)
    # the constructor flag picks the default path
    m.absorb = True
    assert torch.equal(m(x, mask, positions=pos), absorbed)


@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("q_lora_rank", [24, None])
def test_cached_decode_equals_full_forward(absorb, q_lora_rank):
    m = make(tiny(q_lora_rank=q_lora_rank), absorb=absorb)
    torch.manual_seed(123)
    x = torch.randn(2, 9, 48)
    full = m(x, causal_mask(9), absorb=False)             # reference
    cache = LayerKVCache()
    out = [m(x[:, :4], causal_mask(4), cache=cache)]      # prefill 4
    for t in range(4, 9):                                 # then 1 by 1
        out.append(m(x[:, t:t + 1], causal_mask(1, t + 1), cache=cache))
    assert torch.allclose(torch.cat(out, 1), full, atol=ATOL)
    # the cache holds only c^KV (B, S, d_c) and k^R (B, 1, S, d_r)
    c_kv, k_rope = cache.tensors
    assert c_kv.shape == (2, 9, 32) and k_rope.shape == (2, 1, 9, 6)
    assert cache.nbytes() == 2 * 9 * (32 + 6) * 4


def test_cache_holds_normalised_latent_and_rotated_key():
    m = make()
    torch.manual_seed(123)
    x = torch.randn(1, 5, 48)
    cache = LayerKVCache()
    m(x, causal_mask(5), cache=cache)
    kv, k_rope = m.kv_a_proj_with_mqa(x).split([32, 6], dim=-1)
    want_kv = m.kv_a_layernorm(kv)
    want_rope = apply_rope(k_rope[:, None], torch.arange(5),
                           interleave=True)
    assert torch.allclose(cache.tensors[0], want_kv, atol=1e-6)
    assert torch.allclose(cache.tensors[1], want_rope, atol=1e-6)


def test_output_depends_on_relative_positions_only():
    m = make()
    torch.manual_seed(123)
    x = torch.randn(2, 6, 48)
    mask = causal_mask(6)
    a = m(x, mask, positions=torch.arange(6))
    b = m(x, mask, positions=torch.arange(6) + 1000)      # shift all
    c = m(x, mask, positions=torch.tensor([0, 1, 2, 3, 4, 50]))
    assert torch.allclose(a, b, atol=1e-4)
    assert not torch.allclose(a[:, -1], c[:, -1], atol=1e-3)
    assert torch.allclose(a[:, :-1], c[:, :-1], atol=1e-6)  # causal


def test_rope_layout_matters():
    m = make()
    m2 = make(tiny(rope_interleave=False))
    m2.load_state_dict(m.state_dict())
    torch.manual_seed(123)
    x = torch.randn(1, 6, 48)
    pos = torch.arange(6)
    assert not torch.allclose(m(x, positions=pos), m2(x, positions=pos),
                              atol=1e-4)


# ------------------------------------------ by hand, from the weights
# An independent reference for the forward pass: the paper's equations
# written out with plain matmuls for one head at a time, in float64, with
# RMSNorm and RoPE (complex numbers) written here, not taken from
# course_lib. It pins what the self-consistency tests above cannot: the
# softmax scale 1/sqrt(d_n + d_r) and the query-latent norm.
def _rms_by_hand(x, w, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope_by_hand(x, positions, base):
    """Pairs (2i, 2i+1) as complex numbers times e^{i m theta_i}."""
    d = x.shape[-1]
    theta = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)],
                         dtype=torch.float64)
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2)
                              .contiguous())
    rot = torch.polar(torch.ones_like(theta),
                      positions.double()[:, None] * theta)   # (T, d/2)
    return torch.view_as_real(z * rot).flatten(-2)


def _mla_by_hand(m, x, positions):
    """Per-head outputs o_i (T, d_v) for one sequence x (T, D), causal."""
    c = m.config
    H, dn, dr, dc = (c.num_attention_heads, c.qk_nope_head_dim,
                     c.qk_rope_head_dim, c.kv_lora_rank)
    eps, base = c.rms_norm_eps, c.rope_theta
    T = x.shape[0]
    if c.q_lora_rank is None:
        q_all = x @ m.q_proj.weight.T                     # (T, H*dqk)
    else:
        c_q = x @ m.q_a_proj.weight.T                     # W^DQ x
        if m.q_a_proj.bias is not None:
            c_q = c_q + m.q_a_proj.bias
        c_q = _rms_by_hand(c_q, m.q_a_layernorm.weight, eps)
        q_all = c_q @ m.q_b_proj.weight.T                 # (T, H*dqk)
    kv_a = x @ m.kv_a_proj_with_mqa.weight.T              # (T, dc+dr)
    if m.kv_a_proj_with_mqa.bias is not None:
        kv_a = kv_a + m.kv_a_proj_with_mqa.bias
    c_kv = _rms_by_hand(kv_a[:, :dc], m.kv_a_layernorm.weight, eps)
    k_r = _rope_by_hand(kv_a[:, dc:], positions, base)    # (T, dr) shared
    w_b = m.kv_b_proj.weight.view(H, dn + c.v_head_dim, dc)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    heads, weights = [], []
    for i in range(H):
        q_i = q_all.view(T, H, dn + dr)[:, i]             # (T, dn+dr)
        q_c, q_r = q_i[:, :dn], _rope_by_hand(q_i[:, dn:], positions, base)
        k_c = c_kv @ w_b[i, :dn].T                        # W^UK_i c^KV
        v_c = c_kv @ w_b[i, dn:].T                        # W^UV_i c^KV
        scores = (q_c @ k_c.T + q_r @ k_r.T) / math.sqrt(dn + dr)
        a = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        heads.append(a @ v_c)                             # (T, dv)
        weights.append(a)
    return heads, weights


@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("q_lora_rank, bias", [(24, False), (24, True),
                                               (None, False)])
def test_forward_equals_the_equations_by_hand(absorb, q_lora_rank, bias):
    m = make(tiny(q_lora_rank=q_lora_rank, attention_bias=bias)).double()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.uniform_(-0.5, 0.5)
    torch.manual_seed(123)
    x = torch.randn(2, 7, 48, dtype=torch.float64) * 3    # rms far from 1
    pos = torch.arange(7) + 5
    seen = []                                             # input of W^O
    hook = m.o_proj.register_forward_pre_hook(
        lambda mod, args: seen.append(args[0]))
    with torch.no_grad():
        out = m(x, causal_mask(7), positions=pos, absorb=absorb)
    hook.remove()
    concat = seen[0].view(2, 7, 4, 10)                    # (B, T, H, dv)
    for b in range(2):
        heads, _ = _mla_by_hand(m, x[b], pos)
        for i, o_i in enumerate(heads):                   # every head
            assert torch.allclose(concat[b, :, i], o_i, atol=1e-12)
        want = torch.cat(heads, -1) @ m.o_proj.weight.T   # u = W^O [o_i]
        if bias:
            want = want + m.o_proj.bias
        assert torch.allclose(out[b], want, atol=1e-12)


# ---------------------------------------------- why RoPE blocks absorption
def _head_scores(m, x, pos_q, pos_k, rope_on_content):
    """Head-0 content scores q^C . k^C, explicitly and via one fixed
    absorbed matrix M = W^{UQ,T} W^{UK} (d_c' x d_c)."""
    c = m.config
    cq = m.q_a_layernorm(m.q_a_proj(x))                   # (T, r_q)
    ckv = m.kv_a_layernorm(m.kv_a_proj_with_mqa(x)[:, :c.kv_lora_rank])
    w_uq = m.q_b_proj.weight.view(c.num_attention_heads, c.qk_head_dim,
                                  -1)[0, :c.qk_nope_head_dim]  # (dn, r_q)
    w_uk = m.up_weights()[0][0]                           # (dn, dc)
    q, k = cq @ w_uq.T, ckv @ w_uk.T                      # (T, dn)
    if rope_on_content:
        q, k = apply_rope(q, pos_q), apply_rope(k, pos_k)
    explicit = q @ k.T                                    # (T, T)
    absorbed = cq @ (w_uq.T @ w_uk) @ ckv.T               # (T, T)
    return explicit, absorbed


def test_fixed_absorbed_matrix_fails_with_rope_on_content_keys():
    m = make()
    torch.manual_seed(123)
    x = torch.randn(5, 48)
    pos = torch.arange(5) + 3
    e, a = _head_scores(m, x, pos, pos, rope_on_content=False)
    assert torch.allclose(e, a, atol=ATOL)                # identity holds
    e, a = _head_scores(m, x, pos, pos, rope_on_content=True)
    off_diag = ~torch.eye(5, dtype=torch.bool)
    # m = n: rotations cancel; m != n: no fixed matrix reproduces it
    assert torch.allclose(e.diagonal(), a.diagonal(), atol=ATOL)
    assert (e - a)[off_diag].abs().min() > 1e-4


# ------------------------------------------------------------- DecoderLM
def mla_lm(**kw):
    cfg = DecoderLMConfig(vocab_size=37, hidden_size=48, num_attention_heads=4,
                          num_hidden_layers=2, max_position_embeddings=64)
    mla = tiny(**kw)
    torch.manual_seed(123)
    model = DecoderLM(cfg, attention_factory=lambda i:
                      MultiHeadLatentAttention(mla)).eval()
    return model, cfg, mla


@pytest.mark.parametrize("absorb", [False, True])
def test_decoder_lm_cached_equals_uncached(absorb):
    model, cfg, mla = mla_lm()
    for layer in model.layers:
        layer.attention.absorb = absorb
    torch.manual_seed(123)
    ids = torch.randint(0, 37, (2, 30))
    with torch.no_grad():
        full = model(ids)                                 # (2, 30, V)
        cache = KVCache(cfg.num_hidden_layers,
                        max_len=cfg.max_position_embeddings)
        steps = [model(ids[:, :1], cache=cache)]          # prompt length 1
        for t in range(1, 30):
            steps.append(model(ids[:, t:t + 1], cache=cache))
    assert torch.allclose(torch.cat(steps, 1), full, atol=ATOL)
    # cache size == kv_cache_bytes for this MLA model (fp32: 4 bytes)
    spec = SimpleNamespace(num_hidden_layers=cfg.num_hidden_layers,
                           **vars(mla))
    assert cache.nbytes() == 2 * kv_cache_bytes(spec, 30, bytes_per_value=4)


@pytest.mark.parametrize("prompt_len", [1, 5])
def test_decoder_lm_greedy_generation_with_cache(prompt_len):
    model, _, _ = mla_lm()
    torch.manual_seed(7)
    prompt = torch.randint(0, 37, (1, prompt_len))
    a = generate(model, prompt, 30, use_cache=True, temperature=0.0)
    b = generate(model, prompt, 30, use_cache=False, temperature=0.0)
    assert a.shape == (1, prompt_len + 30)
    assert torch.equal(a, b)


# -------------------------------------------------------------- bad input
def test_bad_inputs():
    m = make()
    x = torch.randn(2, 5, 48)
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, "
                       r"hidden_size=48\), got \(2, 5, 47\)"):
        m(torch.randn(2, 5, 47))
    with pytest.raises(ValueError, match=r"positions must have shape "
                       r"\(T,\) = \(5,\)"):
        m(x, positions=torch.arange(4))
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        m(x, torch.ones(5, 5))
    with pytest.raises(ValueError, match=r"mask of shape \(4, 5\) does not"
                       r" broadcast to \(2, 1, 5, 5\)"):
        m(x, torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="cache must be a LayerKVCache"):
        m(x, cache=KVCache(1))
    cache = LayerKVCache(max_len=6)
    m(x, cache=cache)
    with pytest.raises(ValueError, match="cache overflow"):
        m(x[:, :2], cache=cache)
    with pytest.raises(ValueError, match="the batch size must be 2, got 1"):
        m(x[:1, :1], cache=cache)


# ----------------------------------------------------------------- YaRN
YARN = dict(MLAConfig.deepseek_v3().rope_scaling,
            original_max_position_embeddings=64)  # ramp inside d_r = 6


@pytest.mark.parametrize("absorb", [False, True])
def test_yarn_paths_agree_and_cache_decodes(absorb):
    m = make(tiny(rope_scaling=YARN), absorb=absorb)
    torch.manual_seed(123)
    x = torch.randn(2, 9, 48)
    pos = torch.arange(9) + 150_000                       # far beyond 64
    full = m(x, causal_mask(9), positions=pos, absorb=False)
    assert torch.allclose(m(x, causal_mask(9), positions=pos, absorb=True),
                          full, atol=ATOL)
    # a cache starts at position 0 (YaRN changes the slow pairs there too)
    full0 = m(x, causal_mask(9), absorb=False)
    cache = LayerKVCache()
    out = [m(x[:, :4], causal_mask(4), cache=cache)]
    for t in range(4, 9):
        out.append(m(x[:, t:t + 1], causal_mask(1, t + 1), cache=cache))
    assert torch.allclose(torch.cat(out, 1), full0, atol=ATOL)
    # YaRN changes the output; shifting every position still does not
    plain = make(tiny(), absorb=absorb)
    assert not torch.allclose(plain(x, causal_mask(9), positions=pos), full,
                              atol=1e-3)
    shifted = m(x, causal_mask(9), positions=pos - 149_990)
    assert torch.allclose(shifted, full, atol=1e-4)


# ---- found by mutation testing: details a mutant could change unseen
# Tests added because a mutant of course_lib.model.mla survived the ones above
# (benchmarks/mutation.md, "MLA survivors and why").
# (The messages in full: tests/pins/test_mla_messages.py.)
def _spy_values_width(monkeypatch):
    """Record the width of the values each attention call gets: d_v on
    the explicit path (per-head values W^UV c), d_c on the absorbed one
    (the latents themselves)."""
    widths = []
    real = attention.scaled_dot_product_attention

    def spy(q, k, v, *args, **kw):
        widths.append(v.shape[-1])
        return real(q, k, v, *args, **kw)
    monkeypatch.setattr(mla_module, "scaled_dot_product_attention", spy)
    return widths


def test_absorb_flag_and_argument_pick_the_path(monkeypatch):
    widths = _spy_values_width(monkeypatch)
    x = torch.randn(1, 3, 48)
    default = MultiHeadLatentAttention(tiny())
    assert default.absorb is False and "absorb=False" in repr(default)
    default(x)                                   # default: explicit
    default(x, absorb=True)                      # the argument wins
    absorbing = MultiHeadLatentAttention(tiny(), absorb=True)
    assert absorbing.absorb is True and "absorb=True" in repr(absorbing)
    absorbing(x)                                 # the flag: absorbed
    absorbing(x, absorb=False)                   # the argument wins
    assert widths == [10, 32, 32, 10]            # d_v = 10, d_c = 32


def _rotate_by_hand(x, positions, theta, factor, interleave):
    """Pairs as complex numbers times factor * e^{i m theta_i}; pairs
    (2i, 2i+1) if interleave, else (i, i + d/2)."""
    d = x.shape[-1]
    if interleave:
        z = torch.complex(x[..., 0::2], x[..., 1::2])
    else:
        z = torch.complex(x[..., :d // 2], x[..., d // 2:])
    z = z * factor * torch.polar(torch.ones_like(theta),
                                 positions.double()[:, None] * theta)
    if interleave:
        return torch.stack([z.real, z.imag], -1).flatten(-2)
    return torch.cat([z.real, z.imag], -1)


def _mla_output_by_hand(m, x, positions, theta, factor, scale):
    """u (T, D) for one sequence x (T, D), causal, from the weights: the
    equations with the given RoPE frequencies theta, cos/sin factor and
    softmax scale (q_lora_rank set, no bias)."""
    c = m.config
    H, dn, dc = c.num_attention_heads, c.qk_nope_head_dim, c.kv_lora_rank
    T, eps, inter = x.shape[0], c.rms_norm_eps, c.rope_interleave
    c_q = _rms_by_hand(x @ m.q_a_proj.weight.T, m.q_a_layernorm.weight, eps)
    q_all = (c_q @ m.q_b_proj.weight.T).view(T, H, -1)
    kv_a = x @ m.kv_a_proj_with_mqa.weight.T
    c_kv = _rms_by_hand(kv_a[:, :dc], m.kv_a_layernorm.weight, eps)
    k_r = _rotate_by_hand(kv_a[:, dc:], positions, theta, factor, inter)
    w_b = m.kv_b_proj.weight.view(H, dn + c.v_head_dim, dc)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    heads = []
    for i in range(H):
        q_r = _rotate_by_hand(q_all[:, i, dn:], positions, theta, factor,
                              inter)
        scores = (q_all[:, i, :dn] @ (c_kv @ w_b[i, :dn].T).T
                  + q_r @ k_r.T) * scale
        a = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        heads.append(a @ (c_kv @ w_b[i, dn:].T))
    return torch.cat(heads, -1) @ m.o_proj.weight.T


@pytest.mark.parametrize("yarn", [False, True])
@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("absorb", [False, True])
def test_forward_by_hand_with_own_eps_base_and_yarn_factors(yarn, interleave,
                                                            absorb):
    # Not the defaults: eps 0.3 (both latent norms), base 50, both RoPE
    # layouts, and YaRN with mscale != mscale_all_dim, so that the cos/sin
    # factor m(s, 1) / m(s, 0.5) is not 1 (it is 1 in every released
    # config). YaRN's frequencies come from course_lib.model.yarn (checked
    # against transformers in test_yarn.py); factor and scale by hand.
    rs = dict(YARN, mscale=1.0, mscale_all_dim=0.5) if yarn else None
    cfg = tiny(rms_norm_eps=0.3, rope_theta=50.0, rope_interleave=interleave,
               rope_scaling=rs)
    m = make(cfg).double()
    torch.manual_seed(123)
    x = torch.randn(2, 6, 48, dtype=torch.float64) * 0.5  # eps matters
    pos = torch.arange(6) + (200 if yarn else 3)
    d_r, s = 6, 40.0
    if yarn:
        from course_lib.model.yarn import yarn_frequencies
        theta = yarn_frequencies(d_r, base=50.0, **rs)
        m_rope, m_all = 0.1 * math.log(s) + 1, 0.05 * math.log(s) + 1
        factor, scale = m_rope / m_all, m_all ** 2 / math.sqrt(14)
    else:
        theta = torch.tensor([50.0 ** (-2 * i / d_r) for i in range(3)],
                             dtype=torch.float64)
        factor, scale = 1.0, 1 / math.sqrt(14)
    with torch.no_grad():
        out = m(x, causal_mask(6), positions=pos, absorb=absorb)
        for b in range(2):
            want = _mla_output_by_hand(m, x[b], pos, theta, factor, scale)
            assert torch.allclose(out[b], want, atol=1e-12)


def test_default_positions_are_made_on_the_inputs_device(monkeypatch):
    # Only a CPU here, so a wrong device changes no value: a spy on
    # query_positions checks what forward asks for.
    seen = []
    real = mha.query_positions

    def spy(positions, T, cache, device):
        seen.append(device)
        return real(positions, T, cache, device)
    monkeypatch.setattr(mla_module, "query_positions", spy)
    x = torch.randn(1, 3, 48)
    make()(x)
    assert seen == [x.device]


def test_x_that_is_not_a_batch_of_sequences_is_refused():
    # (this and the other messages in full: tests/pins/test_mla_messages.py)
    m = make()
    with pytest.raises(ValueError, match=r"^x must have shape"):
        m([1.0, 2.0])
    with pytest.raises(ValueError, match=r"^x must have shape"):
        m(torch.randn(5, 48))                    # no batch axis
