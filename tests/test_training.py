"""Tests for course_lib.training: schedule, optimizer, loop, checkpoints."""
import itertools
import math

import pytest
import torch
from torch import nn

from course_lib.tasks import markov, special_tokens, translation_task
from course_lib import training


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


class Bigram(nn.Module):
    """The smallest next-token model: a table of logits per token."""

    def __init__(self, V=8, d=16):
        super().__init__()
        self.emb = nn.Embedding(V, d)
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, V)

    def forward(self, idx):
        return self.out(self.norm(self.emb(idx)))         # (B, T, V)


def _source():
    return markov.random_markov_source(vocab_size=8, order=1, branching=3, seed=0)


# --------------------------------------------------------------- schedule
def test_warmup_values():
    f = [training.lr_multiplier(s, warmup_steps=4, total_steps=10) for s in range(10)]
    assert f == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert training.lr_multiplier(0, warmup_steps=0, total_steps=5) == 1.0


def test_cosine_values():
    def cos(s):
        return training.lr_multiplier(s, warmup_steps=2, total_steps=12,
                               schedule="cosine")
    assert cos(0) == 0.5 and cos(1) == 1.0 and cos(2) == 1.0
    # half way through the decay: (1 + cos(pi/2)) / 2 = 1/2
    assert math.isclose(cos(7), 0.5, abs_tol=1e-12)
    assert math.isclose(cos(12), 0.0, abs_tol=1e-12)
    values = [cos(s) for s in range(2, 13)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_schedule_bad_inputs():
    with pytest.raises(ValueError, match="schedule must be"):
        training.lr_multiplier(0, warmup_steps=1, total_steps=2, schedule="linear")
    with pytest.raises(ValueError, match="total_steps must be >= 5, got 3"):
        training.lr_multiplier(0, warmup_steps=5, total_steps=3)
    with pytest.raises(ValueError, match="step must be >= 0, got -1"):
        training.lr_multiplier(-1, warmup_steps=0, total_steps=3)


def test_train_applies_the_schedule():
    model = Bigram()
    batches = markov.lm_batches(_source(), batch_size=4, length=8)
    hist = training.train(model, batches, steps=6, lr=0.01, warmup_steps=3,
                   schedule="cosine", progress=False)
    expected = [0.01 * training.lr_multiplier(s, warmup_steps=3, total_steps=6,
                                       schedule="cosine") for s in range(6)]
    assert hist.lr == pytest.approx(expected, rel=1e-12)
    assert hist.step == list(range(6))


# -------------------------------------------------------------- optimizer
def test_weight_decay_only_on_matrices():
    model = Bigram()
    opt = training.make_optimizer(model, lr=1e-3, weight_decay=0.1)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {id(p) for p in decay["params"]} == \
        {id(model.emb.weight), id(model.out.weight)}
    assert len(no_decay["params"]) == 3     # norm weight/bias, out bias
    with pytest.raises(ValueError, match="lr must be > 0, got 0"):
        training.make_optimizer(model, lr=0.0)
    with pytest.raises(ValueError, match="weight_decay must be >= 0"):
        training.make_optimizer(model, lr=1e-3, weight_decay=-1.0)


def test_one_step_matches_adamw_formula():
    """First AdamW step: m_hat = g, v_hat = g^2, so the update is
    -lr * (g / (|g| + eps) + wd * w) for a decayed matrix."""
    model = Bigram()
    batch = next(markov.lm_batches(_source(), batch_size=4, length=8))
    w0 = model.out.weight.detach().clone()
    loss = training.next_token_loss(model, batch)
    g = torch.autograd.grad(loss, model.out.weight)[0]
    lr, wd = 0.01, 0.1
    training.train(model, iter([batch]), steps=1, lr=lr, weight_decay=wd,
            clip_norm=None, progress=False)
    expected = w0 - lr * (g / (g.abs() + 1e-9) + wd * w0)
    assert torch.allclose(model.out.weight, expected, atol=1e-6)


def test_make_optimizer_uses_the_papers_betas_and_eps():
    # Vaswani et al. 2017, sec. 5.3: beta1 = 0.9, beta2 = 0.98, eps = 1e-9
    opt = training.make_optimizer(Bigram(), lr=1e-3, weight_decay=0.1)
    assert len(opt.param_groups) == 2
    for group in opt.param_groups:
        assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9
        assert group["lr"] == 1e-3


def test_several_steps_match_adamw_written_by_hand():
    """Five steps with changing gradients, against AdamW written out:
    w <- w (1 - lr wd); m <- b1 m + (1 - b1) g; v <- b2 v + (1 - b2) g^2;
    w <- w - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
    From step 2 on the update depends on b1 and b2; the tiny gradients
    of the second parameter (about 1e-9) make eps matter."""
    lr, wd, b1, b2, eps = 0.01, 0.1, 0.9, 0.98, 1e-9
    model = nn.Linear(3, 2).double()         # a matrix (decayed), a bias
    opt = training.make_optimizer(model, lr=lr, weight_decay=wd)
    g = torch.Generator().manual_seed(0)
    grads = [(torch.randn(2, 3, generator=g, dtype=torch.float64),
              torch.randn(2, generator=g, dtype=torch.float64) * 1e-9)
             for _ in range(5)]
    params = [model.weight, model.bias]
    ref = [p.detach().clone() for p in params]
    m = [torch.zeros_like(p) for p in ref]
    v = [torch.zeros_like(p) for p in ref]
    for t, step_grads in enumerate(grads, start=1):
        for p, gr in zip(params, step_grads):
            p.grad = gr.clone()
        opt.step()
        for j, (w, gr) in enumerate(zip(ref, step_grads)):
            w.mul_(1 - lr * (wd if j == 0 else 0.0))   # decoupled decay
            m[j] = b1 * m[j] + (1 - b1) * gr
            v[j] = b2 * v[j] + (1 - b2) * gr * gr
            m_hat, v_hat = m[j] / (1 - b1 ** t), v[j] / (1 - b2 ** t)
            w.sub_(lr * m_hat / (v_hat.sqrt() + eps))
        for p, w in zip(params, ref):
            torch.testing.assert_close(p.detach(), w, atol=1e-14, rtol=1e-12)


# ------------------------------------------------------------------- loop
def test_loss_decreases_to_near_the_entropy_floor():
    src = _source()
    model = Bigram()
    val = next(markov.lm_batches(src, batch_size=64, length=32, seed=99))
    hist = training.train(model, markov.lm_batches(src, batch_size=16, length=32),
                   steps=150, lr=0.03, warmup_steps=10,
                   eval_fn=lambda m: training.next_token_loss(m, val).item(),
                   eval_every=50, progress=False)
    assert hist.val_step == [50, 100, 150]
    assert hist.val_loss[-1] < hist.val_loss[0] < math.log(8)
    assert sum(hist.loss[-10:]) / 10 < sum(hist.loss[:10]) / 10 - 0.5
    # a bigram table is the right model for an order-1 chain
    assert hist.val_loss[-1] < markov.entropy_rate(src) + 0.1
    assert hist.tokens == 150 * 16 * 32
    assert model.training                      # eval did not leave it off


def test_history_counts_only_targets_that_are_not_ignored():
    inputs, targets = next(markov.lm_batches(_source(), batch_size=4, length=8))
    targets = targets.clone()
    targets[0, :3] = training.IGNORE                 # 3 + 8 ignored targets
    targets[2] = training.IGNORE
    counted = sum(1 for b in range(4) for t in range(8)
                  if targets[b, t].item() != -100)
    assert counted == 32 - 11
    hist = training.train(Bigram(), iter([(inputs, targets)] * 3), steps=3,
                   lr=1e-3, progress=False)
    assert hist.tokens == 3 * counted


def test_clipping_bounds_the_gradient_norm():
    model = Bigram()
    batch = next(markov.lm_batches(_source(), batch_size=4, length=8))
    seen = []

    def loss_fn(m, b):
        return 1000.0 * training.next_token_loss(m, b)   # a huge gradient

    class Spy(torch.optim.SGD):
        def step(self, closure=None):
            grads = [p.grad for g in self.param_groups for p in g["params"]]
            seen.append(torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g) for g in grads])))
            return super().step(closure)

    opt = Spy(model.parameters(), lr=1e-3)
    hist = training.train(model, iter([batch] * 3), steps=3, lr=1e-3, clip_norm=0.5,
                   loss_fn=loss_fn, optimizer=opt, progress=False)
    assert all(n > 10 for n in hist.grad_norm)          # recorded pre-clip
    assert all(abs(n.item() - 0.5) < 1e-4 for n in seen)  # applied post-clip


def test_same_seed_same_run_and_dropout_uses_the_seed():
    def run(seed):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(8, 16), nn.Dropout(0.5),
                              nn.Linear(16, 8))
        hist = training.train(model, markov.lm_batches(_source(), batch_size=4,
                                           length=8),
                       steps=5, lr=1e-2, seed=seed, progress=False)
        return hist.loss
    assert run(1) == run(1)
    assert run(1) != run(2)


def test_train_bad_inputs():
    model = Bigram()
    batches = markov.lm_batches(_source(), batch_size=2, length=4)
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        training.train(model, batches, steps=0, lr=1e-3)
    with pytest.raises(ValueError, match="clip_norm must be > 0"):
        training.train(model, batches, steps=1, lr=1e-3, clip_norm=0.0)
    with pytest.raises(ValueError, match="schedule must be"):
        training.train(model, batches, steps=1, lr=1e-3, schedule="step")


# ------------------------------------------------------------ checkpoints
def test_checkpoint_round_trip_identical_outputs_and_resume(tmp_path):
    src = _source()
    batches = [next(markov.lm_batches(src, batch_size=4, length=8, seed=s))
               for s in range(10)]
    x = batches[0][0]

    torch.manual_seed(0)
    model = Bigram()
    opt = training.make_optimizer(model, lr=1e-2, weight_decay=0.1)
    training.train(model, batches[:5], steps=5, lr=1e-2, optimizer=opt,
            progress=False)
    path = tmp_path / "ckpt.pt"
    training.save_checkpoint(path, model, opt, 5, note="half way")

    torch.manual_seed(1)
    clone = Bigram()                               # different init
    assert not torch.equal(clone(x), model(x))
    opt2 = training.make_optimizer(clone, lr=1e-2, weight_decay=0.1)
    meta = training.load_checkpoint(path, clone, opt2)
    assert meta == {"step": 5, "note": "half way"}
    assert torch.equal(clone(x), model(x))         # identical outputs

    # resuming gives bit-identical parameters to the uninterrupted run
    training.train(model, batches[5:], steps=5, lr=1e-2, optimizer=opt,
            start_step=5, progress=False)
    training.train(clone, batches[5:], steps=5, lr=1e-2, optimizer=opt2,
            start_step=5, progress=False)
    for a, b in zip(model.parameters(), clone.parameters()):
        assert torch.equal(a, b)


def test_checkpoint_bad_inputs(tmp_path):
    model = Bigram()
    with pytest.raises(ValueError, match="existing checkpoint file"):
        training.load_checkpoint(tmp_path / "missing.pt", model)
    training.save_checkpoint(tmp_path / "m.pt", model, None, 0)
    opt = training.make_optimizer(model, lr=1e-3)
    with pytest.raises(ValueError, match="holds no optimizer state"):
        training.load_checkpoint(tmp_path / "m.pt", model, opt)
    with pytest.raises(ValueError, match="step must be >= 0"):
        training.save_checkpoint(tmp_path / "n.pt", model, None, -1)


# ------------------------------------------------------ chapter-7 recipes
def test_recipes_are_deterministic_and_wired():
    a = translation_task.train_toy_translation(steps=3, warmup_steps=1, eval_every=0)
    b = translation_task.train_toy_translation(steps=3, warmup_steps=1, eval_every=0)
    assert a.history.loss == b.history.loss and not a.model.training
    assert len(a.history.val_loss) == 1
    sentence = ["cat", "sees", "dog"]
    out = translation_task.greedy_translate(a.model, a.task, [sentence])
    # the same translation by a greedy loop written here: argmax of the
    # teacher-forced logits, one token at a time, until EOS
    src = torch.tensor([a.task.encode_src(sentence)])
    ys = [special_tokens.BOS]
    with torch.no_grad():
        for _ in range(src.shape[1] + 2):
            nxt = a.model(src, torch.tensor([ys]))[0, -1].argmax().item()
            if nxt == special_tokens.EOS:
                break
            ys.append(nxt)
    words = [a.task.tgt_vocab[i] for i in ys[1:]]
    assert words, "the untrained model's greedy output is empty"
    assert out == [words]
    lm = markov.train_synthetic_lm(steps=3, warmup_steps=1, eval_every=0)
    lm2 = markov.train_synthetic_lm(steps=3, warmup_steps=1, eval_every=0)
    assert lm.history.loss == lm2.history.loss
    assert lm.model.config.vocab_size == lm.source.vocab_size == 16
    assert abs(lm.entropy_rate - markov.entropy_rate(lm.source)) < 1e-12
    # the true model's loss on 128 x 63 validation tokens is close to h
    assert abs(lm.val_floor - lm.entropy_rate) < 0.03
    assert lm.history.val_loss[-1] > lm.entropy_rate   # untrained: above


def test_next_token_loss_matches_a_loop_and_skips_ignore():
    model = Bigram()
    inputs, targets = next(markov.lm_batches(_source(), batch_size=3, length=5))
    targets[1, 2] = training.IGNORE
    logp = model(inputs).log_softmax(-1)
    terms = [-logp[b, t, targets[b, t]] for b in range(3) for t in range(5)
             if targets[b, t] != training.IGNORE]
    expected = torch.stack(terms).mean()
    assert torch.allclose(training.next_token_loss(model, (inputs, targets)),
                          expected, atol=1e-6)


def test_evaluate_runs_without_grad_in_eval_mode_and_restores():
    model = Bigram().train()
    seen = {}

    def probe(m):
        seen["training"] = m.training
        seen["grad"] = torch.is_grad_enabled()
        return torch.tensor(1.5)

    assert training.evaluate(model, probe) == 1.5
    assert seen == {"training": False, "grad": False}
    assert model.training


@pytest.mark.parametrize("extra", [
    {"best": __import__("numpy").float64(0.5)},
    {"where": __import__("pathlib").Path("/tmp")},
    {"hist": training.History()},
    {"nested": [1, {"a": __import__("numpy").int64(2)}]},
])
def test_checkpoint_extras_that_cannot_be_loaded_are_refused(tmp_path,
                                                             extra):
    # These were saved, then load_checkpoint failed with
    # an UnpicklingError.
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="cannot be loaded back safely"):
        training.save_checkpoint(tmp_path / "c.pt", model, None, 1, **extra)
    assert not (tmp_path / "c.pt").exists()


def test_checkpoint_extras_round_trip(tmp_path):
    model = nn.Linear(2, 2)
    extra = dict(note="x", best=0.5, steps=[1, 2], cfg={"d": 4, "t": (1, 2)},
                 mask=torch.ones(2, dtype=torch.bool), nothing=None)
    training.save_checkpoint(tmp_path / "c.pt", model, None, 3, **extra)
    meta = training.load_checkpoint(tmp_path / "c.pt", model)
    assert meta["step"] == 3 and meta["cfg"] == {"d": 4, "t": (1, 2)}
    assert meta["note"] == "x" and meta["steps"] == [1, 2]
    assert meta["nothing"] is None and torch.equal(meta["mask"], extra["mask"])


def test_loss_over_no_counted_target_is_an_error():
    # With every target IGNORE, the loss was NaN.
    model = nn.Embedding(5, 5)
    inputs = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="at least one target that is not "
                       "IGNORE"):
        training.next_token_loss(model, (inputs, torch.full((2, 3), training.IGNORE)))


# ------------------------------------------------------- exact resumption
def _resume_setup():
    """A model with dropout 0.1 on chapter 7's language, and its data."""
    from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig
    src = markov.random_markov_source(vocab_size=16, order=2, branching=3,
                                  seed=0)

    def new_model(init_seed):
        torch.manual_seed(init_seed)
        return DecoderLM(DecoderLMConfig(vocab_size=16, hidden_size=32,
                                         num_attention_heads=4,
                                         num_hidden_layers=2,
                                         max_position_embeddings=16,
                                         dropout=0.1))

    def data():
        return markov.lm_batches(src, batch_size=4, length=16, seed=3)
    return new_model, data


RECIPE = dict(lr=1e-2, warmup_steps=2, schedule="cosine", weight_decay=0.1,
              clip_norm=1.0, progress=False)


def _run_in_two_pieces(tmp_path, *, horizon=10, restore_rng=True):
    """5 steps, checkpoint, a new process's worth of state, 5 more."""
    new_model, data = _resume_setup()
    model = new_model(0)
    opt = training.make_optimizer(model, lr=1e-2, weight_decay=0.1)
    h1 = training.train(model, data(), steps=5, total_steps=horizon, optimizer=opt,
                 seed=5, **RECIPE)
    training.save_checkpoint(tmp_path / "c.pt", model, opt, 5, data_seed=3)
    del model, opt
    torch.manual_seed(12345)              # whatever happened in between
    model = new_model(1)                  # a different initialisation
    opt = training.make_optimizer(model, lr=1e-2, weight_decay=0.1)
    meta = training.load_checkpoint(tmp_path / "c.pt", model, opt,
                             restore_rng=restore_rng)
    assert meta == {"step": 5, "data_seed": 3}
    rest = itertools.islice(data(), meta["step"], None)   # data position
    h2 = training.train(model, rest, steps=5, start_step=5, total_steps=10,
                 optimizer=opt, seed=5, **RECIPE)
    return model, h1, h2


def _uninterrupted():
    new_model, data = _resume_setup()
    model = new_model(0)
    opt = training.make_optimizer(model, lr=1e-2, weight_decay=0.1)
    hist = training.train(model, data(), steps=10, optimizer=opt, seed=5, **RECIPE)
    return model, hist


def test_resumed_run_equals_uninterrupted_run_bit_for_bit(tmp_path):
    # Cosine schedule with warmup, dropout 0.1, AdamW with weight decay,
    # clipping: 5 steps + checkpoint + 5 resumed steps must end exactly
    # where 10 uninterrupted steps end.
    ref, hist = _uninterrupted()
    model, h1, h2 = _run_in_two_pieces(tmp_path)
    assert h1.step + h2.step == hist.step == list(range(10))
    assert h1.lr + h2.lr == hist.lr               # one schedule, not two
    assert h1.loss + h2.loss == hist.loss         # same dropout masks
    for (name, a), b in zip(ref.named_parameters(), model.parameters()):
        assert torch.equal(a, b), name
    # the schedule is the whole run's: it reaches 0 only at step 10
    assert hist.lr[4] > 0.5 * RECIPE["lr"] and hist.lr[-1] < 0.05 * 1e-2


@pytest.mark.parametrize("control", ["generator not restored",
                                     "first piece on its own horizon"])
def test_resumption_without_generator_or_horizon_differs(tmp_path,
                                                         control):
    # The controls that make the test above meaningful: dropout really
    # draws from the generator, and the horizon really changes the steps
    # (the old train() decayed the first piece's cosine over 5 steps).
    ref, hist = _uninterrupted()
    if control == "generator not restored":
        model, h1, h2 = _run_in_two_pieces(tmp_path, restore_rng=False)
    else:
        model, h1, h2 = _run_in_two_pieces(tmp_path, horizon=5)
    assert h1.loss + h2.loss != hist.loss
    assert not all(torch.equal(a, b) for a, b in
                   zip(ref.parameters(), model.parameters()))


def test_resumed_call_does_not_reseed():
    # A call with start_step > 0 continues the generator it finds.
    batch = next(markov.lm_batches(_source(), batch_size=4, length=8))

    def loss(generator_seed, seed):
        torch.manual_seed(1)
        model = nn.Sequential(nn.Embedding(8, 16), nn.Dropout(0.5),
                              nn.Linear(16, 8))
        torch.manual_seed(generator_seed)
        return training.train(model, iter([batch]), steps=1, lr=1e-3,
                       start_step=3, seed=seed, progress=False).loss
    assert loss(7, seed=0) == loss(7, seed=None)
    assert loss(7, seed=0) != loss(0, seed=None)


def test_total_steps_bad_inputs():
    model = Bigram()
    batches = markov.lm_batches(_source(), batch_size=2, length=4)
    with pytest.raises(ValueError, match="total_steps must be >= 8, got 7"):
        training.train(model, batches, steps=5, start_step=3, total_steps=7,
                lr=1e-3, progress=False)


def test_cosine_piece_follows_the_whole_schedule():
    model = Bigram()
    batches = markov.lm_batches(_source(), batch_size=4, length=8)
    hist = training.train(model, batches, steps=3, start_step=4, total_steps=12,
                   lr=0.01, warmup_steps=2, schedule="cosine",
                   progress=False)
    assert hist.step == [4, 5, 6]
    assert hist.lr == pytest.approx(
        [0.01 * training.lr_multiplier(s, warmup_steps=2, total_steps=12,
                                schedule="cosine") for s in (4, 5, 6)],
        rel=1e-12)


def test_checkpoint_stores_and_restores_the_generator(tmp_path):
    model = nn.Linear(2, 2)
    torch.manual_seed(3)
    training.save_checkpoint(tmp_path / "g.pt", model, None, 1)
    expected = torch.rand(5)
    torch.manual_seed(99)
    training.load_checkpoint(tmp_path / "g.pt", model)
    assert torch.equal(torch.rand(5), expected)
    torch.manual_seed(99)
    untouched = torch.get_rng_state()
    training.load_checkpoint(tmp_path / "g.pt", model, restore_rng=False)
    assert torch.equal(torch.get_rng_state(), untouched)


@pytest.mark.parametrize("first, total", [(6, 12), (10, 20)])
def test_chapter7_translation_recipe_resumes_bit_for_bit(tmp_path, first,
                                                         total):
    # Exactly the configuration of chapter 7's stop-and-resume cell: the
    # toy-translation model (post-norm, dropout 0.1), seq2seq_loss, AdamW
    # with weight decay 0.01, lr 3e-3, 4 warmup steps, cosine over 12
    # steps, clipping at 1, batches of 64 pairs; 6 + checkpoint + 6. Also
    # 10 + 10 over 20 steps (the cell's earlier length): a longer resumed
    # piece, more steps in which a difference could appear.
    task = translation_task.make_translation_task(held_out_fraction=0.2, seed=0)
    recipe = dict(lr=3e-3, warmup_steps=4, schedule="cosine", clip_norm=1.0,
                  loss_fn=translation_task.seq2seq_loss, progress=False)

    def session(model_seed):
        model = translation_task.translation_model(task, seed=model_seed)
        return model, training.make_optimizer(model, lr=3e-3, weight_decay=0.01)

    assert any(isinstance(m, nn.Dropout) and m.p == 0.1
               for m in translation_task.translation_model(task, seed=0).modules())
    straight, opt = session(0)
    h_all = training.train(straight, translation_task.translation_batches(task, batch_size=64,
                                                     seed=0),
                    steps=total, optimizer=opt, seed=0, **recipe)
    model, opt = session(0)
    h_1 = training.train(model, translation_task.translation_batches(task, batch_size=64, seed=0),
                  steps=first, total_steps=total, optimizer=opt, seed=0,
                  **recipe)
    training.save_checkpoint(tmp_path / "run.pt", model, opt, first, data_seed=0)
    resumed, opt = session(123)
    meta = training.load_checkpoint(tmp_path / "run.pt", resumed, opt)
    batches = itertools.islice(
        translation_task.translation_batches(task, batch_size=64, seed=meta["data_seed"]),
        meta["step"], None)
    h_2 = training.train(resumed, batches, steps=total - first,
                  start_step=meta["step"], total_steps=total, optimizer=opt,
                  **recipe)
    assert len(h_1.lr + h_2.lr) == total
    assert h_1.lr + h_2.lr == h_all.lr
    assert h_1.loss + h_2.loss == h_all.loss
    for (name, a), b in zip(straight.named_parameters(),
                            resumed.parameters()):
        assert torch.equal(a, b), name


# ---- found by mutation testing: details a mutant could change unseen
# Tests added because a mutant of course_lib.training survived the ones
# above (benchmarks/mutation.md, "training survivors and why").
# (The messages in full: tests/pins/test_training_messages.py.)
def test_history_counts_the_last_tensor_of_any_batch():
    # Counted by hand: the last element of a tuple batch if it is a
    # tensor (3 of 4 targets of tgt_out count; tgt_in has none ignored),
    # nothing for a dict batch or a tuple ending in something else.
    src = torch.zeros(1, 4, dtype=torch.long)
    tgt_in = torch.ones(1, 4, dtype=torch.long)
    tgt_out = torch.tensor([[5, 6, training.IGNORE, 7]])
    batches = [(src, tgt_in, tgt_out), {"ids": tgt_in}, (tgt_in, "label")]
    model = nn.Linear(2, 1)
    hist = training.train(model, iter(batches), steps=3, lr=1e-3,
                   loss_fn=lambda m, b: m.weight.sum(), progress=False)
    assert hist.tokens == 3


def test_cosine_stays_at_zero_after_total_steps():
    # 1/2 (1 + cos(pi * min(1, progress))): past t_max the rate is 0, not
    # rising again along the cosine.
    for step in (12, 13, 17, 22):
        assert training.lr_multiplier(step, warmup_steps=2, total_steps=12,
                               schedule="cosine") == 0.0


def test_make_optimizer_defaults_to_no_weight_decay():
    opt = training.make_optimizer(Bigram(), lr=1e-3)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.0, 0.0]


def test_checkpoint_extras_with_a_key_that_cannot_be_loaded(tmp_path):
    from pathlib import Path
    import pickle
    # torch's safe loader itself refuses such a dict key ...
    torch.save({Path("/tmp"): 1}, tmp_path / "raw.pt")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "raw.pt", weights_only=True)
    # ... so save_checkpoint must refuse it before writing
    with pytest.raises(ValueError, match="cannot be loaded back safely"):
        training.save_checkpoint(tmp_path / "c.pt", nn.Linear(2, 2), None, 1,
                          cfg={Path("/tmp"): 1})
    assert not (tmp_path / "c.pt").exists()


def test_read_state_file_loads_safely_on_the_cpu(tmp_path, monkeypatch):
    from pathlib import Path
    import pickle
    # a file holding an object the safe loader does not allow is refused
    torch.save({"where": Path("/tmp")}, tmp_path / "unsafe.pt")
    with pytest.raises(pickle.UnpicklingError, match="Weights only load"):
        training.read_state_file(tmp_path / "unsafe.pt", "state file")
    # the call itself: on the CPU, weights_only=True explicitly (its
    # default only since torch 2.6; pyproject.toml allows torch >= 2.0,
    # and a CUDA checkpoint must load on a CPU-only machine)
    calls = []
    real = torch.load

    def spy(*args, **kw):
        calls.append(kw)
        return real(*args, **kw)
    monkeypatch.setattr(torch, "load", spy)
    torch.save({"a": torch.ones(2)}, tmp_path / "ok.pt")
    assert torch.equal(training.read_state_file(tmp_path / "ok.pt", "x")["a"],
                       torch.ones(2))
    assert calls == [{"map_location": "cpu", "weights_only": True}]


def test_training_functions_refuse_bad_arguments(tmp_path):
    # (the messages in full: tests/pins/test_training_messages.py)
    model = Bigram()
    with pytest.raises(ValueError, match="existing checkpoint file"):
        training.read_state_file(tmp_path / "missing.pt", "checkpoint file")
    with pytest.raises(ValueError, match="warmup_steps"):
        training.lr_multiplier(0, warmup_steps=-1, total_steps=3)
    with pytest.raises(TypeError, match="model"):
        training.make_optimizer("model", lr=1e-3)
    with pytest.raises(TypeError, match="weight_decay"):
        training.make_optimizer(model, lr=1e-3, weight_decay="0.1")
    with pytest.raises(TypeError, match="batch"):
        training.next_token_loss(model, "batch")
    with pytest.raises(TypeError, match="batch's targets"):
        training.next_token_loss(model, (torch.zeros(1, 2, dtype=torch.long),
                                  [1, 2]))
    with pytest.raises(TypeError, match="batch's inputs"):
        training.next_token_loss(model, ([1, 2], torch.zeros(1, 2)))
