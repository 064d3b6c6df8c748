"""Chapter 7's character model: bits/char and the committed checkpoint."""
import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.tasks import char_lm
from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig
from course_lib.tasks.text_corpus import CharVocab, load_pydoc_corpus


def tiny_model():
    torch.manual_seed(0)
    return DecoderLM(DecoderLMConfig(vocab_size=7, hidden_size=16,
                                     num_attention_heads=2,
                                     num_hidden_layers=1,
                                     max_position_embeddings=8)).eval()


def test_bits_per_char_within_one_window_is_the_mean_cross_entropy():
    model = tiny_model()
    ids = torch.randint(0, 7, (9,), generator=torch.Generator().manual_seed(1))
    nats = F.cross_entropy(model(ids[None, :-1])[0], ids[1:]).item()
    assert char_lm.bits_per_char(model, ids, context=8) == pytest.approx(
        nats / math.log(2), rel=1e-6)


@pytest.mark.parametrize("n", [2, 10, 23, 40])
def test_bits_per_char_equals_a_loop_over_targets(n):
    """Target t is predicted from the window that starts at the largest
    multiple of context/2 that leaves it at least context/2 predecessors
    (or from position 0), one forward pass per target."""
    model, context = tiny_model(), 8
    ids = torch.randint(0, 7, (n,), generator=torch.Generator().manual_seed(n))
    total = 0.0
    for t in range(1, n):
        begin = max(0, (t - context - 1) // 4 * 4 + 4) if t > context else 0
        assert context // 2 <= t - begin <= context or begin == 0
        logits = model(ids[None, begin:t])[0, -1]
        total -= F.log_softmax(logits, -1)[ids[t]].item()
    got = char_lm.bits_per_char(model, ids, context=context)
    assert got == pytest.approx(total / (n - 1) / math.log(2), rel=1e-5)
    if n > 3:                       # score only t >= 3, same contexts
        first = sum(-F.log_softmax(model(ids[None, :t])[0, -1], -1)[ids[t]]
                    .item() for t in (1, 2))
        got = char_lm.bits_per_char(model, ids, context=context, start=3)
        assert got == pytest.approx((total - first) / (n - 3) / math.log(2),
                                    rel=1e-5)


def test_bits_per_char_errors_and_mode():
    model = tiny_model().train()
    with pytest.raises(ValueError, match="at least 2 ids"):
        char_lm.bits_per_char(model, torch.tensor([1]), context=4)
    with pytest.raises(ValueError, match="context must be >= 2"):
        char_lm.bits_per_char(model, torch.tensor([1, 2]), context=1)
    with pytest.raises(ValueError, match="start must be < len"):
        char_lm.bits_per_char(model, torch.tensor([1, 2]), context=4, start=2)
    char_lm.bits_per_char(model, torch.tensor([1, 2, 3]), context=4)
    assert model.training                               # mode restored


def test_committed_checkpoint_loads_and_matches_its_metadata():
    assert char_lm.CHECKPOINT_PATH.is_file()
    assert char_lm.CHECKPOINT_PATH.stat().st_size <= 5_000_000
    model, vocab = char_lm.load_char_lm()
    info = char_lm.load_char_lm_info()
    assert not model.training and isinstance(vocab, CharVocab)
    assert vocab.size == model.config.vocab_size == 96
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.lm_head.weight is model.embed_tokens.weight
    assert info["config"] == char_lm.MODEL_CONFIG
    assert info["parameters"] == sum(p.numel() for p in model.parameters())
    for key in ("steps", "train_seconds", "load_average_start",
                "python_version", "val_bits_per_char"):
        assert key in info
    # the recorded validation bits/char is a fresh evaluation's
    corpus = load_pydoc_corpus()
    if corpus.python_version == info["python_version"]:
        fresh = char_lm.bits_per_char(model, vocab.encode(corpus.val),
                                 context=model.config.max_position_embeddings)
        assert fresh == pytest.approx(info["val_bits_per_char"], abs=2e-4)


def test_save_and_load_round_trip(tmp_path):
    torch.manual_seed(0)
    model = DecoderLM(char_lm.char_lm_config(hidden_size=32,
                                             num_attention_heads=2,
                                             num_hidden_layers=1))
    path = tmp_path / "m.pt"
    char_lm.save_char_lm(path, model, {"steps": 0})
    loaded, _ = char_lm.load_char_lm(path)
    assert char_lm.load_char_lm_info(path)["steps"] == 0
    for (name, a), b in zip(model.state_dict().items(),
                            loaded.state_dict().values()):
        assert torch.equal(a.half().float(), b), name    # float16 storage
    with pytest.raises(ValueError, match="make checkpoints"):
        char_lm.load_char_lm(tmp_path / "missing.pt")


@pytest.mark.parametrize("V,eps", [(96, 0.1), (16, 0.1), (5, 0.3)])
def test_label_smoothing_minimum_closed_form(V, eps):
    """Chapter 7: the smoothed loss -sum_v y'_v log q_v has its minimum
    H(y') at q = y', with y' = (1 - eps) one-hot + eps / V."""
    p_top = 1 - eps + eps / V
    closed = -(p_top * math.log(p_top)
               + (V - 1) * eps / V * math.log(eps / V))
    y = torch.tensor([2])
    target = torch.full((V,), eps / V)
    target[2] = p_top
    at_target = F.cross_entropy(target.log()[None], y, label_smoothing=eps)
    assert at_target.item() == pytest.approx(closed, rel=1e-5)
    # independent minimisation from random logits reaches the same value
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(0),
                         dtype=torch.float64).requires_grad_()
    opt = torch.optim.LBFGS([logits], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(logits, y, label_smoothing=eps)
        loss.backward()
        return loss
    opt.step(closure)
    reached = F.cross_entropy(logits, y, label_smoothing=eps).item()
    assert reached == pytest.approx(closed, rel=1e-6)
    assert logits.softmax(-1)[0, 2].item() == pytest.approx(p_top, rel=1e-4)
    # and it is not zero: any other distribution scores more
    for scale in (0.5, 2.0):
        assert F.cross_entropy(target.log()[None] * scale, y,
                               label_smoothing=eps).item() > closed


def test_train_char_lm_progress_must_be_a_bool():
    with pytest.raises(TypeError, match="progress"):
        char_lm.train_char_lm(steps=1, batch_size=1, length=8, lr=1e-3,
                              warmup_steps=0, weight_decay=0.0, seed=0,
                              data_seed=0, progress="False")
