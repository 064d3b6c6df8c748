"""An argument of the wrong type fails at the call with a TypeError (or
ValueError) that names the argument, never with an AttributeError from
deep inside. Inner helpers (``INNER``) trust their callers.

``test_public_api_rejects_wrong_types`` calls every public function and
class of course_lib with junk in all its required arguments and accepts
only a TypeError or a ValueError (or no error at all, for plain data
containers and functions that accept anything).
"""
import dataclasses
import importlib
import inspect
import pkgutil
import signal

import pytest
import torch

import course_lib
from course_lib._util.validation import check_bool, check_type

JUNK = [object(), "abc", None, [1, 2], 3.5]
SLOW = {"time_recurrence_vs_attention"}     # accepts lists, then times

# Inner helpers trust their callers: each runs inside a layer that
# validated the input already, at every layer of every decoding step, so
# it does not check again. They are public (chapters and other modules
# use them) but not entry points.
INNER = {"split_heads", "merge_heads", "repeat_kv", "apply_rope",
         "rope_cos_sin", "attend", "fused_attend", "tiled_attend"}


def public_callables():
    """Every function and class in a course_lib module's ``__all__``."""
    for info in pkgutil.walk_packages(course_lib.__path__, "course_lib."):
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if (name in SLOW or name in INNER
                    or not (inspect.isfunction(obj) or inspect.isclass(obj))
                    or dataclasses.is_dataclass(obj)):
                continue
            try:
                params = inspect.signature(obj).parameters.values()
            except (TypeError, ValueError):
                continue
            required = [p.name for p in params
                        if p.default is p.empty and p.name != "self"
                        and p.kind in (p.POSITIONAL_OR_KEYWORD,
                                       p.KEYWORD_ONLY)]
            if required:
                yield f"{info.name[len('course_lib.'):]}.{name}", obj, \
                    required


def test_the_scan_covers_the_library():
    """The scan walks the subpackages (a flat iter_modules would see only
    the folders and test nothing)."""
    names = {q for q, _, _ in public_callables()}
    assert len(names) > 150
    assert {"model.decoder_lm.DecoderLM", "generation.sampling.generate",
            "model.masks.causal_mask"} <= names
    assert not any(q.rsplit(".", 1)[1] in INNER for q in names)


def _alarm(*_):
    raise TimeoutError


@pytest.mark.parametrize("qualname,obj,required",
                         list(public_callables()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_public_api_rejects_wrong_types(qualname, obj, required):
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for junk in JUNK:
            signal.alarm(10)
            try:
                obj(**{name: junk for name in required})
            except (TypeError, ValueError):
                pass
            except TimeoutError:
                pytest.fail(f"{qualname} with {junk!r}: no answer in 10 s")
            except Exception as exc:  # noqa: BLE001 - the point of the test
                pytest.fail(f"{qualname}({', '.join(required)} = "
                            f"{junk!r}) raised {type(exc).__name__}: {exc}")
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, old)


def test_check_type_names_argument_and_types():
    check_type("x", torch.zeros(1), torch.Tensor, "a torch.Tensor")
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got str"):
        check_type("x", "abc", torch.Tensor, "a torch.Tensor")
    check_type("n", 3, (int, float), "a number")
    with pytest.raises(TypeError, match="n must be a number, got NoneType"):
        check_type("n", None, (int, float), "a number")


def test_check_bool_rejects_ints_and_strings():
    check_bool("flag", True)
    for bad in (1, 0, "yes", "False", None):
        with pytest.raises(TypeError, match="flag must be a bool"):
            check_bool("flag", bad)


def test_examples_name_the_argument():
    from course_lib.model.decoder_lm import DecoderLM, decoder_lm_param_count
    from course_lib.sizing.params import num_parameters
    from course_lib.model.mha import MultiHeadAttention
    with pytest.raises(TypeError, match="config must be a DecoderLMConfig"):
        DecoderLM({"vocab_size": 10})
    with pytest.raises(TypeError, match="config must be a DecoderLMConfig"):
        decoder_lm_param_count(None)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        num_parameters([torch.zeros(2)])
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        MultiHeadAttention(8, 2)([[1.0]])
