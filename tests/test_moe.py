"""Tests for course_lib.model.moe (chapter 11)."""
import math

import pytest
import torch

from course_lib.model.block import SwiGLU
from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig
from course_lib.model.moe import (MoE, MoEInfo, expected_fraction_touched,
                                  expert_capacity, moe_from_config,
                                  moe_infos)
from course_lib.model.routing import DeepSeekV3Router, TopKRouter

torch.manual_seed(123)


def _moe(**kw):
    torch.manual_seed(123)
    args = dict(n_experts=8, top_k=2, d_expert=12)
    args.update(kw)
    return MoE(16, **args)


def _v3_gate(**kw):
    return DeepSeekV3Router(16, 8, 2, n_group=4, topk_group=2,
                            routed_scaling_factor=2.5, **kw)


@pytest.mark.parametrize("shared, v3, cf", [
    (0, False, None), (2, False, None), (0, True, None), (2, True, 0.5),
    (0, False, 0.5), (2, False, 1.25)])
def test_vectorised_equals_loop(shared, v3, cf):
    torch.manual_seed(123)
    m = MoE(16, n_experts=8, top_k=2, d_expert=12, n_shared_experts=shared,
            gate=_v3_gate() if v3 else None, capacity_factor=cf)
    x = torch.randn(2, 5, 16)
    y, info = m.forward_with_info(x)
    y_loop, info_loop = m.forward_loop(x)
    assert y.shape == x.shape
    torch.testing.assert_close(y, y_loop, atol=1e-5, rtol=1e-5)
    assert info.dropped == info_loop.dropped
    assert torch.equal(info.load, info_loop.load)
    if cf == 0.5:
        assert info_loop.dropped > 0


def test_moe_by_hand_from_dense_gates():
    """Independent form: out = sum_e gate[t, e] * expert_e(x_t) + shared."""
    m = _moe(n_shared_experts=1)
    x = torch.randn(10, 16)
    y = m(x)
    gates = m.last_info.routing.dense_gates()                # (N, E)
    allout = torch.stack([e(x) for e in m.experts], 1)       # (N, E, D)
    expect = (gates[..., None] * allout).sum(1) + m.shared_experts(x)
    torch.testing.assert_close(y, expect, atol=1e-6, rtol=1e-5)


def test_worked_example_two_experts_mixed():
    """Router probabilities [0.6, 0.3, 0.1], experts returning [3, 0],
    [0, 6] and [9, 9]: top-2 output [2, 2]."""
    m = MoE(2, n_experts=3, top_k=2, d_expert=2)
    with torch.no_grad():
        # logits log p reproduce the probabilities exactly through softmax;
        # the input x = [1, 0] reads the first column of W
        m.gate.weight.zero_()
        m.gate.weight[:, 0] = torch.tensor([0.6, 0.3, 0.1]).log()
    consts = [torch.tensor([3.0, 0.0]), torch.tensor([0.0, 6.0]),
              torch.tensor([9.0, 9.0])]

    class Const(torch.nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c = c

        def forward(self, x):
            return self.c.expand(x.shape[0], 2)

    m.experts = torch.nn.ModuleList(Const(c) for c in consts)
    y, info = m.forward_with_info(torch.tensor([[1.0, 0.0]]))
    torch.testing.assert_close(info.probs, torch.tensor([[0.6, 0.3, 0.1]]))
    torch.testing.assert_close(info.weights, torch.tensor([[2 / 3, 1 / 3]]))
    torch.testing.assert_close(y, torch.tensor([[2.0, 2.0]]))


def test_gradients_reach_only_chosen_experts():
    m = _moe(n_experts=8, top_k=2)
    x = torch.randn(2, 16)                        # 2 tokens: <= 4 experts
    y = m(x)
    y.sum().backward()
    chosen = set(m.last_info.indices.flatten().tolist())
    assert len(chosen) < 8
    for e, expert in enumerate(m.experts):
        g = expert.gate_proj.weight.grad
        if e in chosen:
            assert g is not None and g.abs().sum() > 0
        else:
            assert g is None or g.abs().sum() == 0
    assert m.gate.weight.grad.abs().sum() > 0     # router learns via gates


def test_dropped_slots_contribute_nothing_in_token_order():
    m = _moe(n_experts=4, top_k=1, capacity_factor=1.6)  # C = 2 per expert
    with torch.no_grad():
        m.gate.weight.zero_()
        m.gate.weight[2, 0] = 10.0                # all tokens -> expert 2
    x = torch.randn(5, 16).abs()
    y, info = m.forward_with_info(x)
    assert info.capacity == expert_capacity(5, 4, 1, 1.6) == 2
    assert info.dropped == 3 and info.load.tolist() == [0, 0, 5, 0]
    # the first two tokens (token order) were processed, the rest dropped
    assert y[:2].abs().sum() > 0
    torch.testing.assert_close(y[2:], torch.zeros(3, 16))


def test_expert_capacity_formula():
    assert expert_capacity(4096, 8, 2, 1.0) == 1024
    assert expert_capacity(10, 3, 2, 1.25) == math.ceil(1.25 * 20 / 3)
    with pytest.raises(ValueError, match="capacity_factor must be > 0"):
        expert_capacity(10, 3, 2, 0.0)


def test_info_contents():
    m = _moe()
    y, info = m.forward_with_info(torch.randn(2, 5, 16))
    assert isinstance(info, MoEInfo)
    assert info.indices.shape == (10, 2) and info.weights.shape == (10, 2)
    assert info.probs.shape == (10, 8)
    assert info.load.sum().item() == 20
    assert info.aux_loss.requires_grad and info.aux_loss.item() >= 1 - 1e-6
    assert info.dropped == 0 and info.capacity is None


def test_v3_aux_loss_is_the_report_formula_by_hand():
    # DeepSeek-V3 report eqs. 17-20 for one sequence of T tokens:
    # s'_{i,t} = s_{i,t} / sum_j s_{j,t} (normalised sigmoid affinities),
    # P_i = mean_t s'_{i,t}, f_i = E / (k T) * #{t : i chosen at t},
    # L = sum_i f_i P_i. Raw sigmoid scores in place of s' would be about
    # E/2 times larger.
    torch.manual_seed(123)
    E, k, T = 8, 2, 9
    gate = DeepSeekV3Router(16, E, k)
    with torch.no_grad():
        gate.weight.normal_(0.0, 0.5)                    # varied affinities
    m = MoE(16, n_experts=E, top_k=k, d_expert=12, gate=gate)
    x = torch.randn(1, T, 16)
    m(x)
    info = m.last_info
    u = x[0].double()
    w = gate.weight.detach().double().requires_grad_()
    s = torch.sigmoid(u @ w.T)                           # (T, E) eq. 15
    chosen = s.topk(k, dim=-1).indices                   # bias b = 0
    counts = torch.zeros(E, dtype=torch.float64)
    for t in range(T):
        for i in chosen[t].tolist():
            counts[i] += 1
    f = E / (k * T) * counts                             # eq. 18
    P = (s / s.sum(-1, keepdim=True)).mean(0)            # eqs. 19, 20
    want = (f * P).sum()                                 # eq. 17 (alpha=1)
    assert torch.equal(info.indices.sort(-1).values,
                       chosen.sort(-1).values)
    assert info.aux_loss.item() == pytest.approx(want.item(), abs=1e-6)
    # the gradient flows through P only, and matches the formula's
    info.aux_loss.backward()
    want.backward()
    torch.testing.assert_close(gate.weight.grad.double(), w.grad,
                               atol=1e-6, rtol=1e-5)


def test_parameter_counts_and_names():
    m = MoE(16, n_experts=8, top_k=2, d_expert=12, n_shared_experts=2,
            gate=_v3_gate())
    D, E, F = 16, 8, 12
    total = sum(p.numel() for p in m.parameters())
    assert total == E * D + E * 3 * D * F + 3 * D * 2 * F
    assert m.active_parameters() == E * D + 2 * 3 * D * F + 3 * D * 2 * F
    keys = set(m.state_dict())
    assert {"gate.weight", "gate.e_score_correction_bias",
            "experts.7.down_proj.weight",
            "shared_experts.up_proj.weight"} <= keys
    assert m.shared_experts.up_proj.weight.shape == (2 * F, D)
    assert isinstance(m.experts[0], SwiGLU)


def test_expected_fraction_touched_matches_simulation():
    torch.manual_seed(123)
    E, k, n = 16, 2, 12
    touched = []
    for _ in range(2000):
        idx = torch.rand(n, E).argsort(-1)[:, :k]
        touched.append(idx.unique().numel() / E)
    sim = sum(touched) / len(touched)
    assert sim == pytest.approx(expected_fraction_touched(n, E, k), abs=0.01)
    assert expected_fraction_touched(0, E, k) == 0.0


def _dense_then_moe_lm(n_layers=3):
    """A DecoderLM with a dense first layer and MoE layers after, as
    DeepSeek-V3 (first_k_dense_replace)."""
    torch.manual_seed(123)
    cfg = DecoderLMConfig(vocab_size=11, hidden_size=16,
                          num_attention_heads=2, num_hidden_layers=n_layers,
                          max_position_embeddings=16)

    def ffn(i):
        if i == 0:
            return SwiGLU(16, 32)                 # dense first layer
        return MoE(16, n_experts=4, top_k=2, d_expert=8, n_shared_experts=1,
                   gate=DeepSeekV3Router(16, 4, 2))
    return DecoderLM(cfg, ffn_factory=ffn)


def test_inside_decoder_lm_infos_and_training():
    model = _dense_then_moe_lm()
    idx = torch.randint(0, 11, (2, 6))
    logits = model(idx)
    infos = moe_infos(model)
    assert logits.shape == (2, 6, 11) and len(infos) == 2
    assert all(i.indices.shape == (12, 2) for i in infos)
    loss = logits.logsumexp(-1).mean() + 0.01 * sum(i.aux_loss for i in infos)
    loss.backward()
    assert model.layers[1].ffn.gate.weight.grad is not None
    assert "layers.1.ffn.gate.e_score_correction_bias" in model.state_dict()


# ---- the call returns the output; the routing stays on the module
@pytest.mark.parametrize("cf", [None, 0.5])
def test_forward_returns_the_output_of_forward_with_info(cf):
    m = _moe(n_shared_experts=1, capacity_factor=cf)
    x = torch.randn(2, 5, 16)
    y = m(x)
    assert isinstance(y, torch.Tensor) and y.shape == x.shape
    assert torch.equal(y, m.forward_with_info(x)[0])


@pytest.mark.parametrize("cf", [None, 0.5])
def test_last_info_is_the_info_of_the_last_call(cf):
    m = _moe(capacity_factor=cf)
    assert m.last_info is None                    # before the first call
    x, x2 = torch.randn(2, 5, 16), torch.randn(3, 16)
    m(x2)
    m(x)                                          # the last call counts
    _, want = m.forward_with_info(x)
    got = m.last_info
    assert isinstance(got, MoEInfo)
    assert torch.equal(got.load, want.load)
    assert torch.equal(got.indices, want.indices)
    assert torch.equal(got.weights, want.weights)
    assert got.aux_loss.item() == want.aux_loss.item()
    assert got.aux_loss.requires_grad
    assert (got.dropped, got.capacity) == (want.dropped, want.capacity)
    # the siblings return their info and leave last_info alone
    m.forward_with_info(x2)
    m.forward_loop(x2)
    assert m.last_info is got


def test_moe_infos_one_per_moe_layer_in_module_order():
    model = _dense_then_moe_lm(n_layers=4).eval()
    inputs = {}                                   # layer -> its FFN input
    for i in (1, 2, 3):
        model.layers[i].ffn.register_forward_pre_hook(
            lambda mod, args, i=i: inputs.__setitem__(i, args[0]))
    with torch.no_grad():
        model(torch.randint(0, 11, (2, 6)))
        infos = moe_infos(model)
        assert len(infos) == 3                    # layers 1, 2, 3; not 0
        for j, i in enumerate((1, 2, 3)):
            ffn = model.layers[i].ffn
            assert infos[j] is ffn.last_info
            _, want = ffn.forward_with_info(inputs[i])
            assert torch.equal(infos[j].indices, want.indices)
            assert torch.equal(infos[j].load, want.load)
    dense = DecoderLM(DecoderLMConfig(
        vocab_size=11, hidden_size=16, num_attention_heads=2,
        num_hidden_layers=1, max_position_embeddings=16))
    assert moe_infos(dense) == []
    (alone,) = moe_infos(model.layers[1].ffn)     # an MoE is a model too
    assert alone is infos[0]


def test_aux_loss_from_moe_infos_reaches_the_router():
    model = _dense_then_moe_lm()
    model(torch.randint(0, 11, (2, 6)))
    aux = sum(i.aux_loss for i in moe_infos(model))
    aux.backward()                                # the auxiliary loss alone
    for i in (1, 2):
        g = model.layers[i].ffn.gate.weight.grad
        assert g is not None and g.abs().sum() > 0
    # the last layer's experts feed no router: the gradient came from the
    # auxiliary loss, not from an output
    assert all(p.grad is None for p in model.layers[2].ffn.experts
               .parameters())


def test_moe_infos_refuses_layers_that_have_not_run():
    model = _dense_then_moe_lm()
    with pytest.raises(ValueError, match=r"^the MoE layers layers\.1\.ffn, "
                       r"layers\.2\.ffn have not run a forward yet"):
        moe_infos(model)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        moe_infos([_moe()])


def test_a_copy_after_a_training_forward_starts_without_info():
    # last_info holds non-leaf tensors, which deepcopy refuses
    import copy
    import pickle
    m = _moe()
    m(torch.randn(4, 16))
    assert m.last_info.aux_loss.grad_fn is not None
    for twin in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert twin.last_info is None
        torch.testing.assert_close(twin.gate.weight, m.gate.weight)
    assert m.last_info is not None                # the original keeps it


def test_moe_from_config_reads_hf_names():
    class Cfg:
        hidden_size, n_routed_experts, num_experts_per_tok = 16, 8, 2
        moe_intermediate_size, n_shared_experts = 12, 1
        n_group, topk_group, routed_scaling_factor = 4, 2, 2.5
        norm_topk_prob = True

    m = moe_from_config(Cfg())
    assert isinstance(m.gate, DeepSeekV3Router)
    assert (m.gate.n_group, m.gate.topk_group) == (4, 2)
    assert m.gate.routed_scaling_factor == 2.5
    assert m.shared_experts.up_proj.weight.shape == (12, 16)

    class Mixtral:
        hidden_size, num_local_experts, num_experts_per_tok = 16, 8, 2
        intermediate_size = 20

    m2 = moe_from_config(Mixtral())
    assert isinstance(m2.gate, TopKRouter) and m2.shared_experts is None
    assert m2.experts[0].up_proj.weight.shape == (20, 16)
    with pytest.raises(ValueError, match="config must have one of"):
        moe_from_config(object())


def test_moe_bad_input():
    with pytest.raises(ValueError, match="gate must be a TopKRouter"):
        MoE(16, n_experts=8, top_k=2, d_expert=4,
            gate=TopKRouter(16, 8, 3))
    with pytest.raises(ValueError, match="top_k must be <= n_experts=4"):
        MoE(16, n_experts=4, top_k=5, d_expert=4)
    with pytest.raises(ValueError, match="capacity_factor must be > 0"):
        MoE(16, n_experts=4, top_k=2, d_expert=4, capacity_factor=-1.0)
    with pytest.raises(ValueError, match="n_shared_experts must be >= 0"):
        MoE(16, n_experts=4, top_k=2, d_expert=4, n_shared_experts=-1)
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, 16\)"):
        _moe()(torch.randn(3, 5, 15))
    with pytest.raises(ValueError, match="top_k must be <= n_experts"):
        expected_fraction_touched(3, 2, 3)


def test_empty_and_degenerate_inputs_are_finite():
    # An input of 0 tokens gave aux_loss = nan; an all-zero score row
    # (valid input for select_top_k) gave NaN gates.
    from course_lib.model.routing import select_top_k
    torch.manual_seed(0)
    m = MoE(8, n_experts=4, top_k=2, d_expert=6)
    out, info = m.forward_with_info(torch.zeros(0, 8))
    assert out.shape == (0, 8) and info.aux_loss.item() == 0.0
    assert info.load.sum().item() == 0
    idx, gates = select_top_k(torch.zeros(2, 4), 2)
    torch.testing.assert_close(gates, torch.full((2, 2), 0.5))
    idx, gates = select_top_k(torch.tensor([[0.6, 0.3, 0.1, 0.0]]), 2)
    torch.testing.assert_close(gates, torch.tensor([[2 / 3, 1 / 3]]))


# ---- found by mutation testing: details a mutant could change unseen
# Tests added because a mutant of course_lib.model.moe survived the ones above
# (benchmarks/mutation.md, "MoE survivors and why").
# (The messages in full: tests/pins/test_moe_messages.py.)
def test_smallest_sizes_are_accepted():
    assert expert_capacity(0, 1, 1, 1.0) == 0           # no tokens, 1 expert
    assert expected_fraction_touched(3, 1, 1) == 1.0     # 1 - (1 - 1)^3
    tiny = MoE(1, n_experts=1, top_k=1, d_expert=1)      # D = E = k = F = 1
    # router E x D + k experts of 3 D F (gate, up, down): 1 + 3
    assert tiny.active_parameters() == 4
    out = tiny(torch.ones(2, 1))
    info = tiny.last_info
    assert out.shape == (2, 1) and info.load.tolist() == [2]


def test_active_parameters_without_shared_experts_closed_form():
    m = _moe()                                      # E 8, k 2, D 16, F 12
    assert m.shared_experts is None
    assert m.active_parameters() == 8 * 16 + 2 * 3 * 16 * 12


def test_sizes_below_the_smallest_are_refused():
    # the other side of test_smallest_sizes_are_accepted (the messages in
    # full: tests/pins/test_moe_messages.py)
    for call, name in (
            (lambda: expert_capacity(-1, 4, 2, 1.0), "n_tokens"),
            (lambda: expert_capacity(4, 0, 2, 1.0), "n_experts"),
            (lambda: expert_capacity(4, 4, 0, 1.0), "top_k"),
            (lambda: expected_fraction_touched(-1, 4, 2), "n_tokens"),
            (lambda: expected_fraction_touched(4, 0, 1), "n_experts"),
            (lambda: MoE(0, n_experts=4, top_k=2, d_expert=4), "d_model"),
            (lambda: MoE(16, n_experts=4, top_k=2, d_expert=0), "d_expert")):
        with pytest.raises(ValueError, match=name):
            call()


def test_x_that_is_not_tokens_of_width_d_model_is_refused():
    # not a tensor, no token axis, wrong width
    for x in ([1.0, 2.0], torch.randn(16), torch.randn(3, 5, 15)):
        with pytest.raises(ValueError, match=r"^x must have shape"):
            _moe()(x)


def test_moe_from_config_fallback_names_defaults_and_capacity():
    class MixtralNames:                            # Mixtral's field names
        hidden_size, num_local_experts, num_experts_per_tok = 16, 4, 2
        intermediate_size = 8

    m = moe_from_config(MixtralNames(), capacity_factor=1.25)
    assert (m.d_model, m.n_experts, m.top_k, m.d_expert) == (16, 4, 2, 8)
    assert m.capacity_factor == 1.25
    m(torch.randn(5, 16))
    assert m.last_info.capacity == math.ceil(1.25 * 5 * 2 / 4) == 4
    _, info = m.forward_loop(torch.randn(5, 16))
    assert info.capacity == 4

    class V3Minimal:                               # only n_group is set
        hidden_size, n_routed_experts, num_experts_per_tok = 16, 8, 2
        moe_intermediate_size, n_group = 12, 2

    gate = moe_from_config(V3Minimal()).gate
    assert isinstance(gate, DeepSeekV3Router)
    assert gate.topk_group == 1 and gate.routed_scaling_factor == 1.0
    assert gate.norm_topk_prob is True

    class V3Nones(V3Minimal):                      # set, but to None
        topk_group = routed_scaling_factor = n_shared_experts = None

    m = moe_from_config(V3Nones())
    assert m.gate.topk_group == 1 and m.gate.routed_scaling_factor == 1.0
    assert m.shared_experts is None

    class V3Unnormalised(V3Minimal):
        norm_topk_prob, topk_group, routed_scaling_factor = False, 2, 2.5

    gate = moe_from_config(V3Unnormalised()).gate
    assert gate.norm_topk_prob is False and gate.topk_group == 2
    assert gate.routed_scaling_factor == 2.5

    class SigmoidOnly:                             # scoring_func, no groups
        hidden_size, n_routed_experts, num_experts_per_tok = 16, 8, 2
        moe_intermediate_size, scoring_func = 12, "sigmoid"

    gate = moe_from_config(SigmoidOnly()).gate
    assert isinstance(gate, DeepSeekV3Router)
    assert (gate.n_group, gate.topk_group) == (1, 1)

    class SoftmaxUnnormalised:                     # Qwen-MoE style
        hidden_size, n_routed_experts, num_experts_per_tok = 16, 8, 2
        moe_intermediate_size, norm_topk_prob = 12, False

    gate = moe_from_config(SoftmaxUnnormalised()).gate
    assert isinstance(gate, TopKRouter) and gate.normalize is False


def test_bfloat16_layer_with_float32_router_keeps_its_dtype():
    # DeepSeekV3Router computes its gates in float32 whatever the input;
    # the layer must still return bfloat16, in both forms, and equal the
    # dense-gate sum computed here in float32 from the same weights.
    import copy
    torch.manual_seed(123)
    m = MoE(16, n_experts=8, top_k=2, d_expert=12, gate=_v3_gate(),
            n_shared_experts=1).to(torch.bfloat16)
    x = torch.randn(6, 16).to(torch.bfloat16)
    y, info = m.forward_with_info(x)
    y_loop, _ = m.forward_loop(x)
    assert y.dtype == y_loop.dtype == m(x).dtype == torch.bfloat16
    ref = copy.deepcopy(m).float()
    gates = info.routing.dense_gates().float()               # (N, E)
    xf = x.float()
    want = sum(gates[:, e, None] * ref.experts[e](xf) for e in range(8)) \
        + ref.shared_experts(xf)
    torch.testing.assert_close(y.float(), want, atol=0.05, rtol=0.05)
    torch.testing.assert_close(y_loop.float(), want, atol=0.05, rtol=0.05)


def test_new_tensors_are_made_on_the_inputs_device(monkeypatch):
    # Only a CPU here, so a wrong device changes no value: a spy on the
    # tensor factories records the device of every tensor moe.py makes.
    import sys
    seen = []

    def spy(real):
        def factory(*args, **kw):
            if sys._getframe(1).f_globals.get("__name__") == "course_lib.model.moe":
                seen.append((real.__name__, kw.get("device")))
            return real(*args, **kw)
        return factory
    for name in ("arange", "zeros"):
        monkeypatch.setattr(torch, name, spy(getattr(torch, name)))
    m = _moe(capacity_factor=1.0)
    x = torch.randn(4, 16)
    m(x)
    m.forward_loop(x)
    assert ("arange", x.device) in seen and ("zeros", x.device) in seen
    assert all(device == x.device for _, device in seen), seen


def test_moe_checks_its_size_before_building_the_experts():
    with pytest.raises(ValueError, match="d_expert"):
        MoE(8, n_experts=4, top_k=2, d_expert=10**7)


def test_moe_from_config_refuses_a_released_model_layer():
    from course_lib.sizing.configs import DEEPSEEK_V3
    with pytest.raises(ValueError, match="config"):
        moe_from_config(DEEPSEEK_V3)


def test_moe_size_guard_counts_exactly_the_parameters_it_builds(
        monkeypatch):
    # The guard runs before any expert exists. With the limit set to the
    # parameter count of the layer it would build, that layer is allowed
    # and one value fewer is refused: the guard counts every weight once
    # (E routed and N_s shared SwiGLUs of 3 D F each, the router's E D).
    from course_lib._util import validation
    kw = dict(n_experts=3, top_k=2, d_expert=5, n_shared_experts=2)
    n = sum(p.numel() for p in MoE(4, **kw).parameters())
    assert n == (3 + 2) * 3 * 4 * 5 + 3 * 4
    monkeypatch.setattr(validation, "MAX_ELEMENTS", n)
    MoE(4, **kw)
    monkeypatch.setattr(validation, "MAX_ELEMENTS", n - 1)
    with pytest.raises(ValueError, match="n_shared_experts"):
        MoE(4, **kw)


class _TinyV3:
    hidden_size, n_routed_experts, num_experts_per_tok = 4, 3, 2
    moe_intermediate_size, n_shared_experts = 5, 2


def test_moe_from_config_limit_counts_exactly_the_layer(monkeypatch):
    from course_lib.model import moe as moe_module
    n = sum(p.numel() for p in moe_from_config(_TinyV3()).parameters())
    monkeypatch.setattr(moe_module, "MAX_ELEMENTS", n)
    moe_from_config(_TinyV3())
    monkeypatch.setattr(moe_module, "MAX_ELEMENTS", n - 1)
    with pytest.raises(ValueError, match=f"of {n:,} parameters"):
        moe_from_config(_TinyV3())


def test_moe_from_config_builds_the_smallest_layer():
    # one expert of width 1 on a width-1 model is a legal (if useless) MoE
    class One:
        hidden_size = n_routed_experts = num_experts_per_tok = 1
        moe_intermediate_size = 1

    m = moe_from_config(One())
    assert (m.d_model, m.n_experts, m.d_expert, m.n_shared) == (1, 1, 1, 0)
    assert m(torch.randn(3, 1)).shape == (3, 1)


@pytest.mark.parametrize("field, value", [
    ("hidden_size", 0), ("n_routed_experts", 0),
    ("moe_intermediate_size", 0), ("n_shared_experts", -1)])
def test_moe_from_config_names_the_bad_field(field, value):
    class Bad(_TinyV3):
        pass

    setattr(Bad, field, value)
    with pytest.raises(ValueError, match=f"config.{field} must be >= "):
        moe_from_config(Bad())


def test_moe_infos_counts_any_layer_that_records_last_info():
    # the expert-parallel layer is not an MoE but records last_info the
    # same way; moe_infos must collect it (and name it while idle)
    class Recorder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.last_info = None

    model = torch.nn.Sequential(_moe(), Recorder())
    with pytest.raises(ValueError, match=r"layers 0, 1 have not"):
        moe_infos(model)
    model[0](torch.randn(4, 16))
    model[1].last_info = "info of layer 1"
    assert moe_infos(model) == [model[0].last_info, "info of layer 1"]
