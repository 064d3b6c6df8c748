"""course_lib.model.moe against Hugging Face's DeepSeek-V3 and Mixtral MoE blocks
(test-only reference; skipped without transformers)."""
import fnmatch

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.conversion_mapping import (  # noqa: E402
    get_checkpoint_conversion_mapping)
from transformers.models.deepseek_v3 import (  # noqa: E402
    modeling_deepseek_v3 as hf_v3)
from transformers.models.mixtral import (  # noqa: E402
    modeling_mixtral as hf_mixtral)

from course_lib.model.moe import MoE, moe_from_config  # noqa: E402
from course_lib.model.load_balancing import load_balancing_loss  # noqa: E402

torch.manual_seed(123)


def _to_hf(sd: dict, names=("gate_proj", "up_proj", "down_proj")) -> dict:
    """Our per-expert weights -> HF's stacked tensors, with the operations
    of HF's own checkpoint converter (stack over experts, then concatenate
    gate and up along dim 1). Every other key is copied unchanged."""
    E = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("experts."))
    stack = {n: torch.stack([sd[f"experts.{i}.{n}.weight"]
                             for i in range(E)]) for n in names}
    out = {k: v for k, v in sd.items() if not k.startswith("experts.")}
    out["experts.gate_up_proj"] = torch.cat([stack[names[0]],
                                             stack[names[1]]], dim=1)
    out["experts.down_proj"] = stack[names[2]]
    return out


def _v3_config(**kw):
    args = dict(hidden_size=16, moe_intermediate_size=12, n_routed_experts=8,
                num_experts_per_tok=2, n_group=4, topk_group=2,
                n_shared_experts=1, routed_scaling_factor=2.5)
    args.update(kw)
    return transformers.DeepseekV3Config(**args)


@pytest.mark.parametrize("shared", [1, 2])
def test_equals_deepseek_v3_moe(shared):
    torch.manual_seed(123)
    cfg = _v3_config(n_shared_experts=shared)
    ours = moe_from_config(cfg)
    with torch.no_grad():
        ours.gate.weight.normal_(0, 0.5)
        ours.gate.e_score_correction_bias.normal_(0, 0.1)
    ref = hf_v3.DeepseekV3MoE(cfg)
    ref.load_state_dict(_to_hf(ours.state_dict()), strict=True)
    x = torch.randn(3, 7, 16)
    with torch.no_grad():
        y = ours(x)
        info = ours.last_info
        y_ref = ref(x)
        logits, w_ref, idx_ref = ref.gate(x)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    # same experts and gates (HF does not sort the top-k)
    assert torch.equal(info.indices.sort(-1).values, idx_ref.sort(-1).values)
    dense_ref = torch.zeros(21, 8).scatter(1, idx_ref, w_ref)
    torch.testing.assert_close(info.routing.dense_gates(), dense_ref)


def test_deepseek_v3_state_dict_maps_by_renaming_only():
    cfg = _v3_config()
    ours = moe_from_config(cfg).state_dict()
    ref = hf_v3.DeepseekV3MoE(cfg).state_dict()
    converted = {t for w in get_checkpoint_conversion_mapping("deepseek_v3")
                 for t in w.target_patterns}
    sources = [s for w in get_checkpoint_conversion_mapping("deepseek_v3")
               for s in w.source_patterns]
    # keys HF does not convert are identical in both (gate, bias, shared)
    plain = {k for k in ref if "mlp." + k not in converted}
    assert plain == {k for k in ours if not k.startswith("experts.")}
    # our expert keys are exactly the released checkpoint's per-expert keys
    for k in ours:
        if k.startswith("experts."):
            assert any(fnmatch.fnmatch("mlp." + k, s) for s in sources), k
    hf_ours = _to_hf(ours)
    assert set(hf_ours) == set(ref)
    for k in ref:
        assert hf_ours[k].shape == ref[k].shape


def test_equals_mixtral_sparse_block_and_checkpoint_names():
    torch.manual_seed(123)
    cfg = transformers.MixtralConfig(hidden_size=16, intermediate_size=12,
                                     num_local_experts=8,
                                     num_experts_per_tok=2)
    ours = moe_from_config(cfg)
    with torch.no_grad():
        ours.gate.weight.normal_(0, 0.5)
    ref = hf_mixtral.MixtralSparseMoeBlock(cfg).eval()
    ref.load_state_dict(_to_hf(ours.state_dict()), strict=True)
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        y = ours(x)
        y_ref = ref(x)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    # released Mixtral keys: experts.{i}.w1 (gate), w3 (up), w2 (down)
    renamed = {k.replace("gate_proj", "w1").replace("up_proj", "w3")
               .replace("down_proj", "w2") for k in ours.state_dict()}
    sources = [s for w in get_checkpoint_conversion_mapping("mixtral")
               for s in w.source_patterns if "experts" in s]
    for k in renamed - {"gate.weight"}:
        assert any(fnmatch.fnmatch("." + k, s) for s in sources), k


def test_load_balancing_loss_is_hf_value_over_k():
    torch.manual_seed(123)
    E = 8
    for k in (1, 2, 3):
        logits = torch.randn(40, E)
        probs = logits.softmax(-1)
        idx = probs.topk(k, -1).indices
        hf = hf_mixtral.load_balancing_loss_func((logits,), E, k)
        ours = load_balancing_loss(probs, idx, E)
        torch.testing.assert_close(ours * k, hf)


def test_moe_layer_aux_loss_matches_hf_for_mixtral_router():
    torch.manual_seed(123)
    m = MoE(16, n_experts=4, top_k=2, d_expert=8)
    x = torch.randn(30, 16)
    m(x)
    info = m.last_info
    hf = hf_mixtral.load_balancing_loss_func((info.routing.logits,), 4, 2)
    torch.testing.assert_close(info.aux_loss * 2, hf)
