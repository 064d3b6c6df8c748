"""Tests for course_lib.serving.continuous_batching: batch_generate and
the Scheduler against one-at-a-time cached generation
(``sampling.generate``) on small random models and on SmolLM2; the
scheduler's steps, preemption and prefix sharing; no block leaks; the
memory formula against the blocks the scheduler actually held."""
import pytest
import torch

from course_lib.generation.sampling import generate
from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig
from course_lib.serving.continuous_batching import Scheduler, batch_generate
from course_lib.serving.paged_kv_cache import paged_memory
from smollm2_support import needs_weights
from tiny_lm_support import MODELS, tiny_lm


def prompts_of(lengths, seed=0, prefix=()):
    g = torch.Generator().manual_seed(seed)
    return [torch.cat([torch.tensor(prefix, dtype=torch.long),
                       torch.randint(23, (n,), generator=g)])
            for n in lengths]


def reference(lm, prompts, n, **kw):
    return [generate(lm, p, n, use_cache=True, **{"temperature": 0.0, **kw})
            for p in prompts]


def run(scheduler):
    """Step to the end; return the StepOutputs."""
    log = []
    while scheduler.has_unfinished():
        log.append(scheduler.step())
    return log


# Lengths 6 and 3 fill blocks of 3 exactly, 16 fills a block of 16.
LENGTHS = (6, 1, 11, 3, 16, 8)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_greedy_equals_one_at_a_time(name, block_size):
    """6 prompts, at most 2 running (the others wait and are admitted as
    the first finish), two of them arriving late."""
    lm = tiny_lm(**MODELS[name])
    prompts = prompts_of(LENGTHS)
    got = batch_generate(lm, prompts, 10, block_size=block_size,
                         max_batch=2, arrival=[0, 0, 0, 4, 0, 13])
    for g, w in zip(got, reference(lm, prompts, 10)):
        assert torch.equal(g, w)


def test_eos_ends_a_request_early():
    lm = tiny_lm(**MODELS["gqa-rope"])
    prompts = prompts_of(LENGTHS)
    want = reference(lm, prompts, 12)
    eos = int(want[2][len(prompts[2]) + 4])      # prompt 2's 5th new token
    got = batch_generate(lm, prompts, 12, block_size=3, max_batch=3,
                         eos_token_id=eos)
    cut = 0
    for p, g, w in zip(prompts, got, want):
        new = w[len(p):].tolist()
        stop = new.index(eos) + 1 if eos in new else len(new)
        cut += stop < len(new)
        assert g.tolist() == p.tolist() + new[:stop]
    assert cut >= 1 and len(got[2]) <= len(prompts[2]) + 5


def test_scheduler_steps_admit_while_others_decode():
    """max_batch 2, three requests of 3, 5 and 4 new tokens: the third
    waits until the first retires, then decodes beside the second."""
    lm = tiny_lm()
    s = Scheduler(lm, num_blocks=20, block_size=4, max_batch=2)
    prompts = prompts_of((5, 2, 7))
    ids = [s.add_request(p, n) for p, n in zip(prompts, (3, 5, 4))]
    log = run(s)
    # a prefill gives a request its first token, each decode one more
    assert [o.admitted for o in log] == [[0, 1], [], [2], [], []]
    assert [o.decoded for o in log] == [[0, 1], [0, 1], [1, 2], [1, 2],
                                        [2]]
    assert [o.finished for o in log] == [[], [0], [], [1], [2]]
    assert log[-1].num_used_blocks == 0 and s.cache.num_free_blocks == 20
    for i, p, n in zip(ids, prompts, (3, 5, 4)):
        assert torch.equal(s.output(i), reference(lm, [p], n)[0])


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_preemption_in_a_small_pool(prefix_caching):
    """A pool too small for all running sequences: the newest is preempted
    and recomputed later; outputs unchanged, every block returned."""
    lm = tiny_lm(**MODELS["mha-rope"])
    prompts = prompts_of((9, 4, 12, 6), prefix=(5, 6, 7, 8, 9, 10))
    s = Scheduler(lm, num_blocks=10, block_size=4, max_batch=4,
                  prefix_caching=prefix_caching)
    ids = [s.add_request(p, 14) for p in prompts]
    log = run(s)
    assert sum(len(o.preempted) for o in log) >= 1
    assert max(o.num_used_blocks for o in log) <= 10
    for i, w in zip(ids, reference(lm, prompts, 14)):
        assert torch.equal(s.output(i), w)
    assert s.cache.num_free_blocks == 10 and not s.cache.block_tables


def test_shared_prefix_held_once_matches_memory_formula():
    """A 10-token system prompt with blocks of 4: its 2 full blocks are
    prefilled once and referenced by all 4 requests. The blocks the
    scheduler held at its peak equal paged_memory's count, with and
    without sharing."""
    lm = tiny_lm(**MODELS["gqa-rope"])
    system = tuple(range(1, 11))
    prompts = prompts_of((1, 4, 7, 2), prefix=system)
    lens = [len(p) for p in prompts]
    for caching, shared_len in ((True, 10), (False, 0)):
        s = Scheduler(lm, num_blocks=40, block_size=4, max_batch=4,
                      prefix_caching=caching)
        ids = [s.add_request(p, 9) for p in prompts]
        log = run(s)
        assert log[0].admitted == ids                   # all run together
        m = paged_memory(lm.config, lens, 9, block_size=4,
                         shared_prefix_len=shared_len)
        assert s.peak_used_blocks == m.paged_blocks
        for i, w in zip(ids, reference(lm, prompts, 9)):
            assert torch.equal(s.output(i), w)
    assert m.paged_blocks - paged_memory(
        lm.config, lens, 9, block_size=4,
        shared_prefix_len=10).paged_blocks == 3 * 2


def test_later_requests_reuse_freed_prefix_blocks():
    """max_batch 1: each request runs after the previous one finished and
    freed its blocks. Requests 0 and 2 start with an 8-token system
    prompt, request 1 does not. In a pool of 12 blocks, request 2 takes
    the system prompt's 2 blocks back off the free list; in a pool of 5,
    request 1 (5 blocks) evicts them and request 2 computes the prefix
    again. Outputs equal generate's."""
    lm = tiny_lm(**MODELS["gqa-rope"])
    system = tuple(range(1, 9))
    prompts = prompts_of((3, 5, 2), prefix=system)
    prompts[1] = prompts_of((12,), seed=1)[0]
    for num_blocks, hits in ((12, [0, 0, 2]), (5, [0, 0, 0])):
        s = Scheduler(lm, num_blocks=num_blocks, block_size=4, max_batch=1)
        ids = [s.add_request(p, 6) for p in prompts]
        seen = []
        while s.has_unfinished():
            waiting = [r.token_ids() for r in s.waiting]
            cached = s.cache.num_cached_blocks(waiting[0]) if waiting else 0
            if s.step().admitted:
                seen.append(cached)
        assert seen == hits, num_blocks
        for i, w in zip(ids, reference(lm, prompts, 6)):
            assert torch.equal(s.output(i), w)
        assert s.cache.num_free_blocks == num_blocks


def test_sampling_with_one_generator_per_request():
    """Each request draws once per token from its own generator, in the
    order generate draws: equal to generate seeded the same."""
    lm = tiny_lm(**MODELS["mha-learned"])
    prompts = prompts_of((4, 9, 2))
    kw = dict(temperature=0.8, top_k=12, top_p=0.9)
    got = batch_generate(lm, prompts, 10, max_batch=2, block_size=3,
                         generator=[torch.Generator().manual_seed(s)
                                    for s in (7, 8, 9)], **kw)
    for s, p, g in zip((7, 8, 9), prompts, got):
        want = generate(lm, p, 10, use_cache=True,
                        generator=torch.Generator().manual_seed(s), **kw)
        assert torch.equal(g, want)
    assert not torch.equal(got[0][4:], reference(lm, prompts[:1], 10)[0][4:])


@needs_weights
def test_smollm2_greedy_equals_one_at_a_time(smollm2):
    model, tok = smollm2
    texts = ["The three primary colours are",
             "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci "
             "number.\"\"\"\n",
             "Once upon a time, in a small village at the edge of a "
             "great forest, there lived"]
    prompts = [torch.tensor(tok.encode(t)) for t in texts]
    assert sorted(len(p) for p in prompts) == [5, 18, 19]
    got = batch_generate(model, prompts, 16, max_batch=2, arrival=[0, 0, 3])
    for g, w in zip(got, reference(model, prompts, 16)):
        assert torch.equal(g, w)


def test_bad_input():
    lm = tiny_lm()
    p = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="block_size"):
        batch_generate(lm, [p], 2, block_size=0)
    with pytest.raises(ValueError, match="max_batch"):
        batch_generate(lm, [p], 2, max_batch=0)
    with pytest.raises(ValueError, match="prompts"):
        batch_generate(lm, [], 2)
    with pytest.raises(TypeError, match="prompts"):
        batch_generate(lm, p, 2)
    with pytest.raises(ValueError, match=r"prompts\[1\]"):
        batch_generate(lm, [p, p[None]], 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        batch_generate(lm, [p], 0)
    with pytest.raises(ValueError, match="max_position_embeddings=40"):
        batch_generate(lm, [p, torch.ones(35).long()], 6)      # context is 40
    with pytest.raises(ValueError, match="num_blocks is 2: it could never"):
        batch_generate(lm, [p], 6, block_size=2, num_blocks=2)
    with pytest.raises(ValueError, match="prompt_ids must hold ids"):
        batch_generate(lm, [torch.tensor([1, 23])], 2)
    with pytest.raises(ValueError, match="arrival"):
        batch_generate(lm, [p, p], 2, arrival=[0])
    with pytest.raises(ValueError, match="generator"):
        batch_generate(lm, [p, p], 2, temperature=1.0,
                       generator=[torch.Generator()])
    with pytest.raises(TypeError, match="generator"):
        batch_generate(lm, [p], 2, temperature=1.0, generator=[3])
    with pytest.raises(ValueError, match="eos_token_id"):
        batch_generate(lm, [p], 2, eos_token_id=23)
    with pytest.raises(TypeError, match="model must be a DecoderLM"):
        batch_generate(torch.nn.Linear(2, 2), [p], 2)
    with pytest.raises(ValueError, match="top_p"):
        Scheduler(lm, num_blocks=4, top_p=0.0)


def test_mla_is_out_of_scope():
    from course_lib.model.mla import MLAConfig, MultiHeadLatentAttention
    cfg = DecoderLMConfig(vocab_size=23, hidden_size=48,
                          num_attention_heads=4, num_hidden_layers=1)
    mla = MLAConfig(hidden_size=48, num_attention_heads=4, q_lora_rank=24,
                    kv_lora_rank=32, qk_nope_head_dim=8, qk_rope_head_dim=6,
                    v_head_dim=10)
    lm = DecoderLM(cfg, attention_factory=lambda i:
                   MultiHeadLatentAttention(mla))
    with pytest.raises(ValueError, match="MLA"):
        batch_generate(lm, [torch.tensor([1, 2])], 2)
