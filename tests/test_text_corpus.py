"""Chapter 7's real text: the pydoc corpus, its split and the char vocab."""
import pytest
import torch

from course_lib.tasks import text_corpus
from course_lib.tasks.markov import lm_batches, random_markov_source


@pytest.fixture(scope="module")
def corpus():
    return text_corpus.load_pydoc_corpus()


def test_split_is_by_topic_deterministic_and_complete(corpus):
    from pydoc_data.topics import topics
    names = sorted(topics)
    assert corpus.n_topics_train + corpus.n_topics_val == len(names)
    assert corpus.val_topics == tuple(names[::10])
    assert text_corpus.load_pydoc_corpus() == corpus                 # deterministic
    val_names = [n for n in names if n in corpus.val_topics]
    train_names = [n for n in names if n not in corpus.val_topics]
    assert len(val_names) == corpus.n_topics_val == 8
    assert len(train_names) == corpus.n_topics_train
    # each side is exactly its own topics, whole, in sorted order
    for side, keys in ((corpus.val, val_names), (corpus.train, train_names)):
        assert side == "\n\n".join(
            text_corpus.normalize_text(topics[k]).strip("\n") for k in keys) + "\n"
    # a topic's text appears where it belongs (titles are unique lines)
    for name in val_names:
        title = text_corpus.normalize_text(topics[name]).split("\n")[0]
        assert title + "\n***" in corpus.val, name
    assert len(corpus.train) + len(corpus.val) > 0.95 * sum(
        len(t) for t in topics.values())


def test_text_is_normalised_to_the_printable_alphabet(corpus):
    assert set(corpus.train + corpus.val) <= set(text_corpus.PRINTABLE)
    assert len(text_corpus.PRINTABLE) == 96
    assert text_corpus.normalize_text("\u201cit\u2019s\u201d \u2014 a\u2026 \u00df") \
        == "\"it's\" -- a... ?"
    import platform
    assert corpus.python_version == platform.python_version()


def test_char_vocab_round_trip_and_errors(corpus):
    vocab = text_corpus.CharVocab()
    assert vocab.size == len(vocab) == 96 and vocab.chars == text_corpus.PRINTABLE
    ids = vocab.encode(corpus.val)
    assert ids.dtype == torch.long and ids.shape == (len(corpus.val),)
    assert vocab.decode(ids) == corpus.val
    assert vocab.decode(ids[:5].tolist()) == corpus.val[:5]
    small = text_corpus.CharVocab.from_text("banana")
    assert small.chars == "abn" and small.encode("nab").tolist() == [2, 0, 1]
    with pytest.raises(ValueError, match="'x'.*not in the vocabulary"):
        small.encode("xa")
    with pytest.raises(ValueError, match=r"ids must be ints in \[0, 3\)"):
        small.decode([0, 3])
    with pytest.raises(ValueError, match="1-d integer tensor"):
        small.decode(torch.zeros(2))
    with pytest.raises(ValueError, match="distinct"):
        text_corpus.CharVocab("aa")
    with pytest.raises(ValueError, match="must not be empty"):
        text_corpus.CharVocab.from_text("")


def test_char_batches_are_shifted_windows_like_lm_batches():
    ids = torch.arange(1000)
    inputs, targets = next(text_corpus.char_batches(ids, batch_size=4, length=16,
                                           seed=3))
    ref_in, ref_tg = next(lm_batches(random_markov_source(
        vocab_size=4, order=1, branching=2), batch_size=4, length=16))
    assert inputs.shape == targets.shape == ref_in.shape == ref_tg.shape
    assert inputs.dtype == targets.dtype == torch.long
    assert torch.equal(targets[:, :-1], inputs[:, 1:])      # shifted by one
    assert torch.equal(inputs[:, 1:] - inputs[:, :-1],
                       torch.ones(4, 15, dtype=torch.long))  # windows
    again = next(text_corpus.char_batches(ids, batch_size=4, length=16, seed=3))
    assert torch.equal(again[0], inputs)                    # seeded
    starts = torch.cat([b[0][:, 0] for b, _ in zip(
        text_corpus.char_batches(ids[:40], batch_size=64, length=8), range(20))])
    assert starts.min() == 0 and starts.max() == 40 - 8 - 1  # every start
    with pytest.raises(ValueError, match="longer than length=16"):
        next(text_corpus.char_batches(ids[:16], batch_size=2, length=16))
    with pytest.raises(ValueError, match="1-d long"):
        next(text_corpus.char_batches(ids.float(), batch_size=2, length=4))


def test_char_batches_checks_the_batch_size_at_the_call():
    ids = torch.arange(100)
    with pytest.raises(ValueError, match="batch_size"):
        text_corpus.char_batches(ids, batch_size=10**9, length=8)
