"""course_lib's SmolLM2-135M against Hugging Face transformers, loading
the same GGUF file (test-only reference, skipped where transformers or
the weights are missing).

transformers dequantises the file to a dense float32 LlamaForCausalLM
(GgufConfig(dequantize=True)), un-permutes Q/K itself and builds its
tokenizer from the same metadata: an independent path to compare with.
"""
import pytest
import regex
import torch

from smollm2_support import needs_weights
from course_lib.generation.sampling import generate
from test_tokenizer import CORPUS

pytest.importorskip("transformers")
pytestmark = needs_weights

PROMPTS = [
    "Hello",
    "The capital of France is",
    "def add(a, b):\n    return",
    "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n"
    "<|im_start|>assistant\n",
    " ".join(["Once upon a time there was a little robot who loved to "
              "count the stars, one by one, every night."] * 6),
]


def test_same_weights_as_transformers(smollm2, hf_smollm2):
    model, _ = smollm2
    hf, _ = hf_smollm2
    ours, theirs = model.state_dict(), hf.state_dict()
    from course_lib.pretrained.smollm2 import NAME_TABLE
    for i in (0, 29):
        for _, name, hf_name in NAME_TABLE[1:-2]:
            assert torch.equal(ours[name.format(i=i)],
                               theirs[hf_name.format(i=i)])
    assert torch.equal(ours["embed_tokens.weight"],
                       theirs["model.embed_tokens.weight"])


@pytest.mark.parametrize("prompt", PROMPTS, ids=lambda p: f"{len(p)}ch")
def test_logits_equal_transformers(smollm2, hf_smollm2, prompt):
    model, tok = smollm2
    hf, _ = hf_smollm2
    ids = torch.tensor([tok.encode(prompt)])                  # (1, T)
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits            # (1, T, V)
    assert ours.shape == theirs.shape == (1, ids.shape[1], 49152)
    # float32 through 30 layers, in two orders of the same sums: the
    # logits (up to about 40) agree to 1e-5 of their scale (seen: 5e-6)
    scale = theirs.abs().max()
    diff = (ours - theirs).abs().max()
    assert diff < 1e-5 * scale, (diff, scale)


def test_greedy_generation_equals_transformers(smollm2, hf_smollm2):
    model, tok = smollm2
    hf, _ = hf_smollm2
    prompt = torch.tensor(tok.encode(PROMPTS[3]))
    ours = generate(model, prompt, 20, use_cache=True, temperature=0.0)
    with torch.no_grad():
        theirs = hf.generate(prompt[None], max_new_tokens=20,
                             min_new_tokens=20, do_sample=False)[0]
    assert torch.equal(ours, theirs)


def published_pre_tokenizer():
    """SmolLM2's tokenizer.json: Digits(individual) then ByteLevel."""
    from tokenizers import pre_tokenizers
    return pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])


@pytest.mark.parametrize("text", CORPUS)
def test_tokenizer_equals_transformers(smollm2, hf_smollm2, text):
    """transformers' vocabulary, merges and special tokens with SmolLM2's
    published pre-tokenizer. (Its GGUF loader maps tokenizer.ggml.pre =
    'smollm' to plain ByteLevel, which differs from the original only
    when two or more whitespace characters precede a digit.)"""
    _, tok = smollm2
    _, hf_tok = hf_smollm2
    backend = hf_tok.backend_tokenizer
    loaded = backend.pre_tokenizer
    if not regex.search(r"\s{2,}\p{N}", text):
        assert tok.encode(text) == hf_tok.encode(text,
                                                 add_special_tokens=False)
    try:
        backend.pre_tokenizer = published_pre_tokenizer()
        ids = hf_tok.encode(text, add_special_tokens=False)
    finally:
        backend.pre_tokenizer = loaded
    assert tok.encode(text) == ids
    assert tok.decode(ids) == hf_tok.decode(ids) == text


def test_chat_template_equals_transformers(smollm2, hf_smollm2):
    _, tok = smollm2
    _, hf_tok = hf_smollm2
    for msgs in ([{"role": "user", "content": "Hi there!"}],
                 [{"role": "system", "content": "Answer in French."},
                  {"role": "user", "content": "Where is Paris?"},
                  {"role": "assistant", "content": "En France."},
                  {"role": "user", "content": "Merci !"}]):
        for gen in (True, False):
            assert tok.apply_chat_template(msgs, add_generation_prompt=gen) \
                == hf_tok.apply_chat_template(msgs, tokenize=False,
                                              add_generation_prompt=gen)
