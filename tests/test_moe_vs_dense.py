"""course_lib.experiments.moe_vs_dense (chapter 11) and the router z-loss
of course_lib.model.load_balancing: the stored sweep is what the recipe
makes now, the counts it reports equal independent counts, and the
z-loss equals its loop form and its closed-form gradient."""
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from course_lib.experiments import moe_vs_dense as mvd
from course_lib.experiments.sweeps import load_sweep
from course_lib.model.load_balancing import router_z_loss


# ---------------------------------------------------------------- z-loss

def _z_loss_loop(logits):
    """(1/N) sum_t (log sum_i exp x_{t,i})^2, token by token in floats."""
    rows = logits.reshape(-1, logits.shape[-1]).tolist()
    return sum(math.log(sum(math.exp(v) for v in row)) ** 2
               for row in rows) / len(rows)


def test_router_z_loss_equals_loop_form():
    gen = torch.Generator().manual_seed(0)
    for shape, scale in (((7, 5), 1.0), ((2, 3, 8), 4.0), ((1, 1), 0.5)):
        x = scale * torch.randn(*shape, generator=gen, dtype=torch.float64)
        assert router_z_loss(x).item() == pytest.approx(_z_loss_loop(x),
                                                        rel=1e-6)


def test_router_z_loss_gradient_and_shift():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 4, generator=gen, dtype=torch.float64,
                    requires_grad=True)
    router_z_loss(x).backward()
    z = torch.logsumexp(x.detach(), -1, keepdim=True)        # (N, 1)
    expected = 2 / 6 * z * x.detach().softmax(-1)            # closed form
    torch.testing.assert_close(x.grad.double(), expected)
    # a common shift c leaves the softmax alone and moves z by c
    c = 3.0
    shifted = router_z_loss(x.detach() + c).item()
    assert shifted == pytest.approx(((z + c) ** 2).mean().item(), rel=1e-6)
    # z = 0 (logits that are log-probabilities) gives 0
    logp = torch.randn(5, 3, generator=gen).log_softmax(-1)
    assert router_z_loss(logp).item() == pytest.approx(0.0, abs=1e-10)


def test_router_z_loss_float32_and_empty():
    x = torch.randn(4, 8) * 10
    out = router_z_loss(x.bfloat16())
    assert out.dtype == torch.float32
    assert out.item() == pytest.approx(
        router_z_loss(x.bfloat16().float()).item())
    assert router_z_loss(torch.zeros(0, 8)).item() == 0.0


def test_router_z_loss_bad_input():
    with pytest.raises(TypeError, match="logits"):
        router_z_loss([[1.0, 2.0]])
    with pytest.raises(TypeError, match="logits"):
        router_z_loss(torch.ones(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="logits"):
        router_z_loss(torch.tensor(1.0))
    with pytest.raises(ValueError, match="logits"):
        router_z_loss(torch.zeros(3, 0))


# ------------------------------------------------------ the three models

@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return {f: mvd.ffn_variant_model(f) for f in mvd.FFN_VARIANTS}


def test_active_parameters_are_those_one_token_touches(models):
    """Independent count: backpropagate from one token's logits and add
    up the parameter tensors the forward pass used, those that get a
    gradient tensor (an unchosen expert never runs and gets none; at
    T = 1 the query and key projections run but their gradient is 0,
    since a single key gets weight 1 whatever its score)."""
    D, L = mvd.MODEL["hidden_size"], mvd.MODEL["num_hidden_layers"]
    E = mvd.MODEL["n_experts"]
    total = {f: sum(p.numel() for p in m.parameters())
             for f, m in models.items()}
    for f, model in models.items():
        model.zero_grad(set_to_none=True)
        model(torch.tensor([[7]])).sum().backward()       # one token
        touched = sum(p.numel() for p in model.parameters()
                      if p.grad is not None)
        model.zero_grad(set_to_none=True)
        assert mvd.active_parameters(model) == touched, f
    router = E * D * L
    # same compute as dense_active, same parameters as dense_total, up to
    # the router's E x D matrix per layer
    moe = mvd.active_parameters(models["moe"])
    assert moe - router == total["dense_active"]
    assert total["moe"] - router == total["dense_total"]
    assert total["moe"] - moe == L * (E - mvd.MODEL["top_k"]) * 3 * D * \
        mvd.MODEL["d_expert"]


def test_flops_per_token_match_torchs_flop_counter(models):
    """torch's FlopCounterMode counts every matmul of one forward; it
    charges attention the full T x T, which the closed form replaces by
    the causal mean (T + 1) / 2."""
    T, D = mvd.TRAIN["length"], mvd.MODEL["hidden_size"]
    L = mvd.MODEL["num_hidden_layers"]
    x = torch.randint(0, mvd.MODEL["vocab_size"], (1, T))
    for f, model in models.items():
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(x)
        per_token = counter.get_total_flops() / T
        causal = per_token - L * 4 * D * T + L * 4 * D * (T + 1) / 2
        assert mvd.forward_flops_per_token(model, T) == \
            pytest.approx(causal, rel=1e-9), f


def test_bad_input_is_named(models):
    with pytest.raises(ValueError, match="ffn"):
        mvd.ffn_variant_model("sparse")
    with pytest.raises(ValueError, match="ffn"):
        mvd.train_ffn_variant("sparse", seed=0)
    with pytest.raises(TypeError, match="seed"):
        mvd.train_ffn_variant("moe", seed=0.5)
    with pytest.raises(ValueError, match="steps"):
        mvd.train_ffn_variant("moe", seed=0, steps=0)
    with pytest.raises(TypeError, match="model"):
        mvd.active_parameters(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="length"):
        mvd.forward_flops_per_token(models["moe"], 0)


# ------------------------------------------------------- the stored file

def test_stored_sweep_is_what_the_recipe_makes():
    """Rerun the cheapest cell (dense_active, seed 0) for its first two
    evaluation points: the rate is constant after warmup, so a short
    run is a prefix of the stored one. Counts are compared in full."""
    sweep = load_sweep("moe_vs_dense")
    assert sweep.meta["train"] == mvd.TRAIN
    assert sweep.meta["model"] == mvd.MODEL
    assert sweep.seeds == list(mvd.SEEDS)
    assert [s["ffn"] for s in sweep.settings()] == list(mvd.FFN_VARIANTS)
    every = mvd.TRAIN["eval_every"]
    n_eval = len(range(every, mvd.TRAIN["steps"], every)) + 1
    assert sweep.meta["val_steps"][-1] == mvd.TRAIN["steps"]
    stored = sweep.cell(0, ffn="dense_active")
    assert len(stored["val_loss"]) == n_eval
    assert stored["final_val_loss"] == stored["val_loss"][-1]
    fresh = mvd.train_ffn_variant("dense_active", seed=0, steps=2 * every)
    assert fresh["val_loss"] == pytest.approx(stored["val_loss"][:2],
                                              rel=1e-3)
    assert set(fresh) == set(stored)
    for key in ("params_total", "params_active", "flops_per_token"):
        assert fresh[key] == pytest.approx(stored[key], rel=1e-6), key
