"""Write-a-function exercises: the learner's function, run on test cases.

A :class:`FunctionExercise` calls the learner's function on each case and
compares the result with the reference solution's (:func:`compare_values`:
types, shapes, values within a tolerance). Whatever the learner's code does
(a wrong type, a wrong shape, NaN, an exception) becomes feedback that
names the case, never a traceback. Code typed in the widget (a string)
runs in a child process (:mod:`course_lib.notebook.sandbox`), which gets
only the code and the case inputs: it cannot patch the checker, read the
expected values or end the kernel, and a loop, ``exit()``, ``os._exit``
or a crash in it becomes feedback. A function object passed to
:meth:`FunctionExercise.check` (the learner's own, in their own kernel)
runs in the kernel under a time limit (:func:`time_limit`). A
:class:`DiagnosedFunctionExercise` also names the usual mistake a wrong
answer matches. In the HTML book, where no kernel runs,
the exercise shows its starter code, hint and solution and points to Colab.
The starter code's comments are the learner's instructions: both views
show them in the reader's language
(:func:`~course_lib.notebook.code_comments.translate_comments` with
:func:`~course_lib.notebook.i18n.tr`), the code itself unchanged.
"""
from __future__ import annotations

import contextlib
import copy
import html
import math
import numbers
import signal
import threading
import traceback
from typing import Any, Callable, Iterator, Sequence

from .._util.validation import check_real, check_type
from .code_comments import translate_comments
from .exercises import Exercise, Feedback, parse_number
from .i18n import tr

__all__ = ["LearnerTimeout", "time_limit", "compare_values",
           "FunctionExercise", "DiagnosedFunctionExercise"]

_NEEDS_PYTHON = ("Checking code needs Python: open this chapter in Colab "
                 "(button at the top) or Jupyter, write the function in the "
                 "box and press Check.")


class LearnerTimeout(BaseException):
    """Raised inside learner code that ran past its time limit.

    A ``BaseException``, like ``KeyboardInterrupt``, so that a learner's
    ``except Exception:`` cannot swallow it.
    """


# every way learner code can end without returning (KeyboardInterrupt,
# SystemExit, a learner's own BaseException too): reported, never raised
_STOPS = (BaseException,)


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`LearnerTimeout` in the block after ``seconds``.

    Uses a POSIX real-time timer (``SIGALRM``): the signal interrupts a
    Python loop at its next bytecode and a ``time.sleep`` at once (a single
    long C call, such as one huge matmul, finishes first). Where there is
    no such timer (Windows) or off the main thread, the block runs without
    a limit. Jupyter and Colab run cells and widget callbacks on the main
    thread of a Linux or macOS process, so the limit holds there.

    Args:
        seconds: the limit (> 0), or None for none.
    """
    if seconds is not None:
        check_real("seconds", seconds, positive=True)
    if seconds is None or not hasattr(signal, "setitimer") or \
            threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise LearnerTimeout(seconds)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _describe(value: Any) -> str:
    """Short description of a value for feedback messages."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        kind = type(value).__name__
        shape = tuple(value.shape)
        if getattr(value, "numel", lambda: value.size)() <= 12:
            flat = value.tolist()
            return tr("{kind} {values} (shape {shape}, dtype {dtype})",
                      kind=kind, values=flat, shape=shape, dtype=value.dtype)
        return tr("{kind} of shape {shape}, dtype {dtype}", kind=kind,
                  shape=shape, dtype=value.dtype)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def compare_values(expected: Any, got: Any, *, rtol: float = 1e-5,
                   atol: float = 1e-6) -> str | None:
    """None if ``got`` matches ``expected``, else what differs, in words.

    Tensors and arrays are compared by type family, shape, boolean-ness and
    values (``allclose``, NaN never equal); sequences element by element;
    everything else with ``==``.
    """
    import numpy as np
    import torch

    if isinstance(expected, (torch.Tensor, np.ndarray)):
        if not isinstance(got, (torch.Tensor, np.ndarray)):
            return tr("expected a {type}, got {got}",
                      type=type(expected).__name__, got=_describe(got))
        exp = torch.as_tensor(np.asarray(expected) if isinstance(
            expected, np.ndarray) else expected)
        out = torch.as_tensor(np.asarray(got) if isinstance(
            got, np.ndarray) else got)
        if tuple(exp.shape) != tuple(out.shape):
            return tr("expected shape {expected}, got shape {got}",
                      expected=tuple(exp.shape), got=tuple(out.shape))
        if (exp.dtype == torch.bool) != (out.dtype == torch.bool):
            return tr("expected dtype {expected}, got {got}",
                      expected=exp.dtype, got=out.dtype)
        if exp.dtype == torch.bool:
            bad = (exp != out)
            if bad.any():
                where = tuple(bad.nonzero()[0].tolist())
                return tr("entry {where} should be {expected}, got {got}",
                          where=where, expected=bool(exp[where]),
                          got=bool(out[where]))
            return None
        # .double() would drop an imaginary part (with only a warning)
        if exp.is_complex() != out.is_complex():
            return tr("expected dtype {expected}, got {got}",
                      expected=exp.dtype, got=out.dtype)
        exp, out = ((exp.to(torch.complex128), out.to(torch.complex128))
                    if exp.is_complex() else (exp.double(), out.double()))
        if torch.isnan(out).any() and not torch.isnan(exp).any():
            where = tuple(torch.isnan(out).nonzero()[0].tolist())
            return tr("your result contains NaN (first at index {where})",
                      where=where)
        if not torch.allclose(out, exp, rtol=rtol, atol=atol,
                              equal_nan=True):
            # Equal entries (including matching infinities, whose
            # difference is NaN) never count as the worst mismatch.
            diff = torch.where(out == exp, 0.0,
                               (out - exp).abs().nan_to_num(float("inf")))
            where = tuple(int(i) for i in torch.unravel_index(
                diff.argmax(), diff.shape)) if diff.ndim else ()
            return tr("values differ: at index {where} expected "
                      "{expected:.6g}, got {got:.6g}", where=where,
                      expected=exp[where].item(), got=out[where].item())
        return None
    if isinstance(expected, numbers.Real) and not isinstance(expected, bool):
        try:
            value = parse_number(got)
        except ValueError:
            return tr("expected a number, got {got}", got=_describe(got))
        if not math.isclose(value, float(expected), rel_tol=rtol,
                            abs_tol=atol):
            return tr("expected {expected:.6g}, got {got:.6g}",
                      expected=float(expected), got=value)
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return tr("expected a sequence of length {n}, got {got}",
                      n=len(expected), got=_describe(got))
        for i, (e, g) in enumerate(zip(expected, got)):
            problem = compare_values(e, g, rtol=rtol, atol=atol)
            if problem:
                return tr("element {i}: {problem}", i=i, problem=problem)
        return None
    return None if got == expected else tr(
        "expected {expected}, got {got}", expected=_describe(expected),
        got=_describe(got))


class FunctionExercise(Exercise):
    """Write a function; it is run on test cases against a reference.

    The learner types code in the widget (or calls ``check`` with a function
    or a source string). Each case ``(args, kwargs)`` is run through both the
    learner's function and ``reference``; the first case that fails is
    reported with expected vs got. Inputs are deep-copied per call, so a
    function that modifies its arguments cannot corrupt later cases.

    The learner's code (its top level, then each call) runs under
    ``time_limit`` seconds (:func:`time_limit`); a call that does not
    return in time, ``exit()``/``SystemExit`` and ``KeyboardInterrupt``
    become feedback instead of a hung or dead kernel.
    """

    kind = "function"

    def __init__(self, *, key: str, prompt: str, func_name: str,
                 starter_code: str, reference: Callable[..., Any],
                 cases: Sequence[tuple[tuple, dict]], hint: str,
                 solution: str, rtol: float = 1e-5,
                 atol: float = 1e-6, time_limit: float = 5.0,
                 purpose: str) -> None:
        super().__init__(key=key, prompt=prompt, hint=hint,
                         solution=solution, purpose=purpose)
        if not func_name.isidentifier():
            raise ValueError(f"func_name must be an identifier, got "
                             f"{func_name!r}")
        if not callable(reference):
            raise ValueError(f"reference must be callable, got {reference!r}")
        cases = list(cases)
        if not cases:
            raise ValueError("cases must hold at least one (args, kwargs)")
        for i, case in enumerate(cases):
            if (not isinstance(case, tuple) or len(case) != 2
                    or not isinstance(case[0], tuple)
                    or not isinstance(case[1], dict)):
                raise ValueError(f"cases[{i}] must be (args_tuple, "
                                 f"kwargs_dict), got {case!r}")
        check_type("starter_code", starter_code, str, "a str")
        self.func_name, self.starter_code = func_name, starter_code
        self.reference, self.cases = reference, cases
        self.rtol, self.atol = rtol, atol
        check_real("time_limit", time_limit, positive=True)
        self.time_limit = float(time_limit)

    def _load(self, answer: Any) -> Callable[..., Any] | Feedback:
        """The learner's function from a callable or source code."""
        if callable(answer):
            return answer
        if not isinstance(answer, str):
            return Feedback(False, tr(
                "Give a function or its source code, not a {type}.",
                type=type(answer).__name__))
        import numpy as np
        import torch
        namespace = {"torch": torch, "np": np, "numpy": np, "math": math}
        try:
            code = compile(answer, f"<your {self.func_name}>", "exec")
        except SyntaxError as exc:
            return Feedback(False, tr("Syntax error on line {line}: "
                                      "{message}.", line=exc.lineno,
                                      message=exc.msg))
        try:
            with time_limit(self.time_limit):
                exec(code, namespace)
        except _STOPS as exc:
            return Feedback(False, tr("Running your code {what}",
                                      what=_what_happened(exc,
                                                          self.time_limit)))
        func = namespace.get(self.func_name)
        if not callable(func):
            return Feedback(False, tr("Define a function named `{name}`.",
                                      name=self.func_name))
        return func

    def check(self, answer: Any) -> Feedback:
        from . import sandbox
        if isinstance(answer, str) and sandbox.AVAILABLE:
            return self._check_in_child(answer)
        func = self._load(answer)
        if isinstance(func, Feedback):
            return func
        return self._judge(self._run_here(func))

    def _run_here(self, func: Callable[..., Any]) -> Iterator[tuple]:
        """``(got, error, line)`` for each case, ``func`` run in this
        process under the time limit (stops after the first error)."""
        for args, kwargs in self.cases:
            try:
                with time_limit(self.time_limit):
                    got = func(*copy.deepcopy(args), **copy.deepcopy(kwargs))
            except _STOPS as exc:
                yield None, exc, learner_line_number(exc)
                return
            yield got, None, None

    def _check_in_child(self, source: str) -> Feedback:
        """Run ``source`` in a child process; judge what it returned."""
        from . import sandbox
        if len(source) > sandbox.MAX_SOURCE_CHARS:
            return Feedback(False, tr(
                "Your code is {n:,} characters long; the checker reads at "
                "most {limit:,}.", n=len(source),
                limit=sandbox.MAX_SOURCE_CHARS))
        outcome = sandbox.run_source(source, self.func_name, self.cases,
                                     time_limit=self.time_limit)
        printed = _printed(outcome.printed)
        if outcome.setup is not None:
            return Feedback(False, self._setup_message(outcome.setup)
                            + printed)

        def results() -> Iterator[tuple]:
            for i in range(len(self.cases)):
                got = (outcome.results[i] if i < len(outcome.results)
                       else sandbox.Failure("crash", message="no result"))
                if isinstance(got, sandbox.Failure):
                    yield None, got.exception(), got.line
                else:
                    yield got, None, None
        return self._judge(results(), printed)

    def _judge(self, results: Iterator[tuple], printed: str = "") -> Feedback:
        """Compare each case's ``(got, error, line)`` from ``results`` with
        the reference's value; the first failed case is the feedback."""
        for i, (args, kwargs) in enumerate(self.cases, start=1):
            call = self._call_text(args, kwargs)
            expected = self.reference(*copy.deepcopy(args),
                                      **copy.deepcopy(kwargs))
            got, error, line = next(results)
            if error is not None:
                return Feedback(False, tr(
                    "Case {i}, `{call}`: your function {what}", i=i,
                    call=call, what=_what_happened(error, self.time_limit))
                                + _line_text(line)
                                + self._hint(args, kwargs, expected,
                                             error=error) + printed)
            problem = self._problem(expected, got)
            if problem:
                return Feedback(False, tr("Case {i}, `{call}`: {problem}.",
                                          i=i, call=call, problem=problem)
                                + self._hint(args, kwargs, expected,
                                             got=got) + printed)
        return Feedback(True, tr("All {n} cases pass.", n=len(self.cases))
                        + printed)

    def _setup_message(self, failure: Any) -> str:
        """Feedback for code that failed before any case ran, or that ended
        the process running it."""
        kind = failure.kind
        if kind == "syntax":
            return tr("Syntax error on line {line}: {message}.",
                      line=failure.line, message=failure.message)
        if kind == "missing":
            return tr("Define a function named `{name}`.",
                      name=self.func_name)
        if kind == "crash":
            return tr("Your code ended the process that runs it ({how}) "
                      "before it returned (os._exit, a signal or a "
                      "crash?): return a value instead.",
                      how=failure.message)
        if kind == "killed":
            return tr("Your code did not finish within {seconds:g} s and "
                      "kept running past its time limit (a loop that "
                      "catches every exception, or turns the timer off?).",
                      seconds=self.time_limit)
        if kind == "unreadable":
            return tr("Your function returned something the checker cannot "
                      "read back ({error}): return a tensor or a number.",
                      error=f"{failure.type}: {failure.message}")
        if kind == "start":
            return tr("Could not start the process that runs your code "
                      "({error}).", error=failure.message[-300:])
        return tr("Running your code {what}", what=_what_happened(
            failure.exception(), self.time_limit)) + _line_text(failure.line)

    def _problem(self, expected: Any, got: Any) -> str | None:
        """What is wrong with ``got`` on a case (None if it is right)."""
        return compare_values(expected, got, rtol=self.rtol, atol=self.atol)

    def _hint(self, args: tuple, kwargs: dict, expected: Any, *,
              got: Any = None, error: BaseException | None = None) -> str:
        """Text added to the feedback of a failed case (a subclass names
        the likely mistake; here nothing)."""
        return ""

    def _call_text(self, args: tuple, kwargs: dict) -> str:
        parts = [_short(a) for a in args]
        parts += [f"{k}={_short(v)}" for k, v in kwargs.items()]
        return f"{self.func_name}({', '.join(parts)})"

    def widget(self) -> Any:
        """The live widget; also starts the process that will run the
        learner's code, so that it has imported torch by the first Check."""
        from . import sandbox
        sandbox.warm_up()
        return super().widget()

    def shown_starter_code(self) -> str:
        """The starter code as the reader sees it: its comments in the
        current language (:func:`~course_lib.notebook.i18n.tr`), the code
        unchanged."""
        return translate_comments(self.starter_code, tr)

    def _make_input(self) -> Any:
        import ipywidgets as widgets
        code = self.shown_starter_code()
        lines = max(6, code.count("\n") + 2)
        return widgets.Textarea(value=code, rows=lines,
                                layout=widgets.Layout(width="100%"))

    def _read_input(self) -> Any:
        return self.input.value

    def _static_body(self) -> str:
        return (f'<pre class="ti-code"><code>'
                f'{html.escape(self.shown_starter_code())}</code></pre>\n'
                f'<p class="ti-note"><em>{tr(_NEEDS_PYTHON)}</em></p>')


def _printed(text: str) -> str:
    """What the learner's code printed, as a block after the feedback."""
    if not text.strip():
        return ""
    return ("\n\n" + tr("Your code printed:") + "\n\n```\n"
            + text.replace("```", "'''") + "\n```")


def _short(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"<{type(value).__name__} shape {tuple(value.shape)}>"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _what_happened(exc: BaseException, seconds: float) -> str:
    """How learner code ended, as the end of a feedback sentence."""
    if isinstance(exc, LearnerTimeout):
        return tr("did not finish within {seconds:g} s (an endless loop, "
                  "or a sleep?)", seconds=seconds)
    if isinstance(exc, SystemExit):
        return tr("called exit() (or raised SystemExit), which would end "
                  "the notebook's kernel: return a value instead")
    if isinstance(exc, KeyboardInterrupt):
        return tr("was interrupted (KeyboardInterrupt) before it finished")
    return tr("raised {error}", error=f"{type(exc).__name__}: {exc}")


def learner_line_number(exc: BaseException) -> int | None:
    """The line of the learner's code the error came from, if it did."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename.startswith("<your "):
            return frame.lineno
    return None


def _line_text(line: int | None) -> str:
    """' (line N of your code)', or nothing when the line is unknown."""
    return "" if line is None else tr(" (line {line} of your code)",
                                      line=line)


class DiagnosedFunctionExercise(FunctionExercise):
    """A :class:`~course_lib.notebook.function_exercise.FunctionExercise` whose
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
