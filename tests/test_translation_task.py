"""Tests for course_lib.tasks.translation_task: the toy translation, its
batches and its loss (chapter 7)."""
import pytest
import torch

from course_lib.tasks import special_tokens, translation_task
from course_lib import training


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


def test_translate_reorders_and_translates():
    assert translation_task.translate("big cat sees small dog".split()) == \
        ["KATZE", "GROSS", "HUND", "KLEIN", "SIEHT"]
    assert translation_task.translate("cat chases old mouse".split()) == \
        ["KATZE", "MAUS", "ALT", "JAGT"]
    assert translation_task.translate("fast horse finds fish".split()) == \
        ["PFERD", "SCHNELL", "FISCH", "FINDET"]


@pytest.mark.parametrize("bad", ["cat dog sees", "big sees cat",
                                 "cat sees", "cat sees dog dog",
                                 "cat sees big", ""])
def test_translate_rejects_ungrammatical(bad):
    with pytest.raises(ValueError, match="words must read"):
        translation_task.translate(bad.split())


def test_task_split_is_complete_disjoint_and_seeded():
    task = translation_task.make_translation_task(held_out_fraction=0.2, seed=0)
    train = {" ".join(s) for s, _ in task.train}
    held = {" ".join(s) for s, _ in task.held_out}
    # 6 nouns x 6 adjective choices, twice, times 5 verbs
    assert len(train) + len(held) == 36 * 5 * 36 == 6480
    assert not train & held
    assert len(held) == round(0.2 * 6480)
    again = translation_task.make_translation_task(held_out_fraction=0.2, seed=0)
    assert again.held_out == task.held_out
    other = translation_task.make_translation_task(held_out_fraction=0.2, seed=1)
    assert other.held_out != task.held_out
    for s, t in task.train[:50]:
        assert t == translation_task.translate(s)


def test_vocab_specials_and_round_trip():
    task = translation_task.make_translation_task()
    for vocab in (task.src_vocab, task.tgt_vocab):
        assert vocab[special_tokens.PAD] == "<pad>" and vocab[special_tokens.BOS] == "<bos>"
        assert vocab[special_tokens.EOS] == "<eos>" and len(set(vocab)) == len(vocab)
    src, tgt = task.held_out[0]
    ids = task.encode_tgt(tgt)
    assert ids[0] == special_tokens.BOS and ids[-1] == special_tokens.EOS
    assert task.decode_tgt(ids) == tgt
    assert task.decode_tgt(torch.tensor(ids + [7, 7])) == tgt  # stops at EOS
    assert task.encode_src(src)[-1] == special_tokens.EOS


def test_collate_shifts_targets_by_one_and_pads():
    task = translation_task.make_translation_task()
    pairs = task.train[:16]
    src, tgt_in, tgt_out = translation_task.collate_translation(task, pairs)
    lengths = [len(s) + 1 for s, _ in pairs]
    assert src.shape == (16, max(lengths))
    for b, (s, t) in enumerate(pairs):
        n = len(t) + 1                     # BOS + words, or words + EOS
        assert src[b, :len(s) + 1].tolist() == task.encode_src(s)
        assert (src[b, len(s) + 1:] == special_tokens.PAD).all()
        assert tgt_in[b, 0] == special_tokens.BOS
        # teacher forcing: the input at t+1 is the target at t
        assert torch.equal(tgt_in[b, 1:n], tgt_out[b, :n - 1])
        assert tgt_out[b, n - 1] == special_tokens.EOS
        assert (tgt_out[b, n:] == training.IGNORE).all()
        assert (tgt_in[b, n:] == special_tokens.PAD).all()


def test_translation_batches_cover_an_epoch_without_repeats():
    task = translation_task.make_translation_task(held_out_fraction=0.5)
    n = len(task.train) // 40
    it = translation_task.translation_batches(task, batch_size=40, seed=3)
    seen = [tuple(r.tolist()) for _ in range(n) for r in next(it)[0]]
    assert len(seen) == len(set(seen)) == 40 * n
    first = next(translation_task.translation_batches(task, batch_size=4, seed=3))
    again = next(translation_task.translation_batches(task, batch_size=4, seed=3))
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_translation_bad_inputs():
    with pytest.raises(ValueError, match="held_out_fraction"):
        translation_task.make_translation_task(held_out_fraction=1.0)
    task = translation_task.make_translation_task()
    with pytest.raises(ValueError, match="pairs must be"):
        translation_task.collate_translation(task, [])
    # checked at the call, not at the first batch
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        translation_task.translation_batches(task, batch_size=0)
    # more than the training set: an epoch would yield no batch (it hung)
    n = len(task.train)
    with pytest.raises(ValueError, match=f"batch_size must be <= the {n} "
                       f"training pairs, got {n + 1}"):
        translation_task.translation_batches(task, batch_size=n + 1)
    full = next(translation_task.translation_batches(task, batch_size=n))
    assert full[0].shape[0] == n


# ----------------------------------------------------------- seq2seq loss
def test_seq2seq_loss_ignores_padding():
    from course_lib.model.transformer import Transformer, TransformerConfig
    task = translation_task.make_translation_task()
    model = Transformer(TransformerConfig(
        src_vocab_size=19, tgt_vocab_size=19, hidden_size=16,
        num_attention_heads=2, intermediate_size=32, num_hidden_layers=1,
        dropout=0.0, max_position_embeddings=16,
        share_src_tgt_embeddings=False)).eval()
    src, tgt_in, tgt_out = translation_task.collate_translation(task, task.train[:8])
    loss = translation_task.seq2seq_loss(model, (src, tgt_in, tgt_out))
    logits = model(src, tgt_in, src_lengths=(src != special_tokens.PAD).sum(1).tolist())
    keep = tgt_out != training.IGNORE
    manual = -logits.log_softmax(-1).gather(
        -1, tgt_out.clamp(min=0)[..., None])[..., 0][keep].mean()
    assert torch.allclose(loss, manual, atol=1e-6)
    # more padding on the source side changes nothing: it is masked
    wider = torch.cat([src, torch.full((8, 3), special_tokens.PAD)], dim=1)
    assert torch.allclose(translation_task.seq2seq_loss(model, (wider, tgt_in, tgt_out)),
                          loss, atol=1e-5)


def test_train_toy_translation_progress_must_be_a_bool():
    with pytest.raises(TypeError, match="progress"):
        translation_task.train_toy_translation(progress="False")
