"""Write-a-function exercises that recognise the usual mistakes.

A :class:`DiagnosedFunctionExercise` checks the learner's function case by
case against a reference, exactly as
:class:`~course_lib.function_exercise.FunctionExercise` does (same time
limit, same comparison, feedback instead of tracebacks). In addition it
carries the *usual wrong versions* of the function, each with a hint:
when the learner's function fails a case, every wrong version is run on
that case, and if one of them gives what the learner's gave (the same
value, or the same kind of exception), its hint is added to the feedback.
So a learner who computed in nats instead of bits reads "that is in
nats" rather than only "expected 1.53, got 1.06".

A wrong version counts as recognised only where it differs from the
reference on that case, so a case on which the mistake happens to be
harmless never blames it. Unlike the plain exercise, a floating tensor
must also come back in the reference's dtype (a float16 input asks for a
float16 result).

Introduced in chapter 6.
"""
from __future__ import annotations

import copy
import math
from typing import Any, Callable, Sequence

from .i18n import tr
from .function_exercise import (_STOPS, FunctionExercise, compare_values,
                                time_limit)

__all__ = ["DiagnosedFunctionExercise"]


class DiagnosedFunctionExercise(FunctionExercise):
    """A :class:`~course_lib.function_exercise.FunctionExercise` whose
    feedback names the usual mistake behind a wrong result.

    Args:
        mistakes: ``(wrong_function, hint)`` pairs. ``wrong_function``
            takes the same arguments as the reference and implements one
            usual mistake (it may raise, as the mistake would). When the
            learner's function fails a case, the first mistake that
            reproduces the learner's result on that case (a value equal
            within the exercise's tolerance, or an exception of the same
            type) adds its ``hint`` to the feedback.
        Everything else: as :class:`FunctionExercise`.

    Introduced in chapter 6.
    """

    kind = "function"

    def __init__(self, *, mistakes: Sequence[tuple[Callable[..., Any], str]]
                 = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(mistakes, (str, bytes)) or \
                not isinstance(mistakes, (list, tuple)):
            raise ValueError(f"mistakes must be a list of (function, hint) "
                             f"pairs, got {mistakes!r:.60}")
        for i, pair in enumerate(mistakes):
            if (not isinstance(pair, tuple) or len(pair) != 2
                    or not callable(pair[0]) or not isinstance(pair[1], str)
                    or not pair[1].strip()):
                raise ValueError(f"mistakes[{i}] must be (callable, "
                                 f"non-empty str), got {pair!r:.60}")
        self.mistakes = list(mistakes)

    def _problem(self, expected: Any, got: Any) -> str | None:
        return _dtype_problem(expected, got) or super()._problem(expected,
                                                                 got)

    def diagnose(self, args: tuple, kwargs: dict, got: Any) -> str | None:
        """The hint of the first mistake that gives ``got`` on this case
        (None if none does). For tests and for readers of the code."""
        expected = self.reference(*copy.deepcopy(args),
                                  **copy.deepcopy(kwargs))
        return self._likely_mistake(args, kwargs, expected, got=got)

    def _hint(self, args: tuple, kwargs: dict, expected: Any, *,
              got: Any = None, error: BaseException | None = None) -> str:
        hint = self._likely_mistake(args, kwargs, expected, got=got,
                                    error=error)
        return "" if hint is None else tr(" Likely mistake: {hint}",
                                          hint=tr(hint))

    def _likely_mistake(self, args: tuple, kwargs: dict, expected: Any, *,
                        got: Any = None,
                        error: BaseException | None = None) -> str | None:
        """The hint of the first mistake that behaves like the learner's
        code on this case: raises the same exception, or returns ``got``
        where the reference returns something else."""
        for wrong, hint in self.mistakes:
            try:
                with time_limit(self.time_limit):
                    out = wrong(*copy.deepcopy(args), **copy.deepcopy(kwargs))
            except _STOPS as exc:
                if error is not None and type(exc) is type(error):
                    return hint
                continue
            if error is not None:
                continue
            if _same(expected, out, self.rtol, self.atol):
                continue                 # harmless on this case
            if _same(out, got, self.rtol, self.atol):
                return hint
        return None


def _dtype_problem(expected: Any, got: Any) -> str | None:
    """What differs if both are tensors of different floating dtypes
    (e.g. float32 returned for a float16 input)."""
    import torch
    if isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor) \
            and expected.dtype.is_floating_point and expected.dtype != got.dtype:
        return tr("expected dtype {expected}, got {got}",
                  expected=expected.dtype, got=got.dtype)
    return None


def _same(a: Any, b: Any, rtol: float, atol: float) -> bool:
    """True if ``b`` equals ``a`` within tolerance; a non-finite number
    (NaN, an infinity, as a float or a 0-d tensor) equals the same one."""
    def scalar(v: Any) -> float | None:
        if isinstance(v, bool):
            return None
        if hasattr(v, "item") and getattr(v, "ndim", None) == 0:
            try:
                v = v.item()
            except (RuntimeError, ValueError):
                return None
        return float(v) if isinstance(v, (int, float)) else None

    if _dtype_problem(a, b):
        return False
    x, y = scalar(a), scalar(b)
    if x is not None and y is not None and not math.isfinite(x):
        return math.isnan(x) and math.isnan(y) or x == y
    return compare_values(a, b, rtol=rtol, atol=atol) is None
