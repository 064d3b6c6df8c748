"""The exercise contract shared by every exercise kind: a prompt, a Check
button, feedback that names the mistake, a hint and a reveal-solution
control (:class:`Exercise`), and the verdict on one answer
(:class:`Feedback`).

The checking logic is the pure method :meth:`Exercise.check`, which
returns a :class:`Feedback` and never raises for a wrong answer. Two kinds
follow: :class:`NumericExercise` (a number within a tolerance, read by
:func:`parse_number`) and :class:`ChoiceExercise` (multiple choice);
:mod:`course_lib.notebook.function_exercise` has the third (write a
function).
"""
from __future__ import annotations

import html
import json
import math
import numbers
import re
from dataclasses import dataclass
from typing import Any, Sequence

from .._util.validation import check_real
from .i18n import tr
from .markdown import markdown_to_html
from .widgets import check_key, widget_bundle

__all__ = ["Feedback", "Exercise", "PURPOSES", "parse_number",
           "NumericExercise", "ChoiceExercise"]

#: What an exercise asks of the learner. ``recall``: a fact the chapter
#: states. ``application``: the chapter's method on new numbers or code the
#: chapter has shown. ``prediction``: the result of the experiment in the
#: next cell, committed to before running it. ``transfer``: a case the
#: chapter never showed, worked out from what it taught.
PURPOSES = ("recall", "application", "prediction", "transfer")


@dataclass(frozen=True)
class Feedback:
    """The verdict on one answer: ``correct`` and a message for the learner."""
    correct: bool
    message: str

    def _repr_html_(self) -> str:
        colour = "#1b7f3b" if self.correct else "#b3261e"
        mark = "&#10003;" if self.correct else "&#10007;"
        return (f'<div style="color:{colour}">{mark} '
                f'{markdown_to_html(self.message)}</div>')


class Exercise:
    """Base class: prompt, Check, feedback, hint and solution.

    Subclasses implement :meth:`check`, :meth:`_make_input`,
    :meth:`_read_input` and :meth:`_static_body`.

    Args:
        key: unique lowercase slug (``"ch01-decay"``), used for HTML ids.
        prompt: the question, Markdown with ``$math$``.
        hint: a nudge that does not give the answer away.
        solution: the worked answer (Markdown, may contain code fences).
        purpose: one of :data:`PURPOSES`. A prediction is headed
            "Prediction." instead of "Exercise." and its feedback tells the
            learner what the experiment measures.
    """

    kind = "exercise"

    def __init__(self, *, key: str, prompt: str, hint: str,
                 solution: str, purpose: str) -> None:
        self.key = check_key(key)
        if purpose not in PURPOSES:
            raise ValueError(f"purpose must be one of {PURPOSES}, got "
                             f"{purpose!r}")
        self.purpose = purpose
        for name, value in (("prompt", prompt), ("hint", hint),
                            ("solution", solution)):
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name} must be a non-empty str, "
                                 f"got {value!r}")
        self.prompt, self.hint, self.solution = prompt, hint, solution
        self._widget = None

    # -- to implement --------------------------------------------------------
    def check(self, answer: Any) -> Feedback:  # pragma: no cover - abstract
        raise NotImplementedError

    def _make_input(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _read_input(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _static_body(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- live widget ---------------------------------------------------------
    def safe_check(self, answer: Any) -> Feedback:
        """:meth:`check`, with any unexpected error turned into feedback."""
        try:
            return self.check(answer)
        except Exception as exc:  # a checker must never show a traceback
            return Feedback(False, tr(
                "Could not check this answer ({error}).",
                error=f"{type(exc).__name__}: {exc}"))

    def widget(self) -> Any:
        """The live ipywidget (built once)."""
        if self._widget is None:
            import ipywidgets as widgets

            self.input = self._make_input()
            self.check_button = widgets.Button(
                description=tr("Check"), button_style="primary")
            self.hint_button = widgets.Button(description=tr("Hint"))
            self.solution_button = widgets.Button(
                description=tr("Solution"))
            self.feedback = widgets.HTMLMath("")
            self.hint_box = widgets.HTMLMath("")
            self.solution_box = widgets.HTMLMath("")

            def on_check(_: Any) -> None:
                fb = self.safe_check(self._read_input())
                self.last_feedback = fb
                self.feedback.value = fb._repr_html_()

            def on_hint(_: Any) -> None:
                self.hint_box.value = ("" if self.hint_box.value else
                                       f"<b>{tr('Hint.')}</b> "
                                       + markdown_to_html(tr(self.hint)))

            def on_solution(_: Any) -> None:
                self.solution_box.value = (
                    "" if self.solution_box.value else
                    f"<b>{tr('Solution.')}</b> "
                    + markdown_to_html(tr(self.solution)))

            self.check_button.on_click(on_check)
            self.hint_button.on_click(on_hint)
            self.solution_button.on_click(on_solution)
            self._widget = widgets.VBox([
                widgets.HTMLMath(f"<b>{self._heading}</b> "
                                 f"{markdown_to_html(tr(self.prompt))}"),
                self.input,
                widgets.HBox([self.check_button, self.hint_button,
                              self.solution_button]),
                self.feedback, self.hint_box, self.solution_box])
        return self._widget

    # -- static HTML -----------------------------------------------------------
    def static_html(self) -> str:
        """Self-contained HTML for pages with no kernel (in the current
        language, :mod:`course_lib.notebook.i18n`)."""
        dom = f"ti-ex-{self.key}"

        def md(text: str) -> str:
            return markdown_to_html(tr(text), tex_delimiters=True)
        return (
            f'<div class="ti-exercise mathjax_process" id="{dom}" '
            f'data-purpose="{self.purpose}">\n'
            f'<div class="ti-prompt" id="{dom}-prompt"><strong>'
            f'{self._heading}</strong> {md(self.prompt)}</div>\n'
            f'{self._static_body()}\n'
            f'<details class="ti-hint"><summary>{tr("Hint")}</summary>'
            f'{md(self.hint)}</details>\n'
            f'<details class="ti-solution"><summary>{tr("Solution")}'
            f'</summary>{md(self.solution)}</details>\n</div>')

    def _repr_mimebundle_(self, include: Any = None,
                          exclude: Any = None) -> dict:
        return widget_bundle(self.widget(), self.static_html(), repr(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.key!r})"

    @property
    def _heading(self) -> str:
        return tr("Prediction." if self.purpose == "prediction"
                  else "Exercise.")

    @property
    def _name(self) -> str:
        """How assistive technology names this exercise's controls."""
        return tr("exercise {key}", key=self.key)


def _inline_html(text: str) -> str:
    """One feedback message or option label (translated, :func:`tr`),
    Markdown rendered to HTML."""
    return markdown_to_html(tr(text), tex_delimiters=True, inline=True)


# The page's JavaScript shows feedback through this one function: the
# message is HTML that course_lib rendered from Markdown (escaped, so safe
# to insert); the maths in it is typeset by MathJax when the page has it.
# Colours come from the classes ti-correct / ti-wrong (the book's
# stylesheet sets them for light and dark mode).
_SHOW_JS = """  // a message template with {field} replaced (a function, so that the
  // "$" of maths in the text is never read as a replacement pattern)
  function fill(template, field, text) {
    return template.replace("{" + field + "}", function () { return text; });
  }
  function show(out, ok, html) {
    out.innerHTML = html;
    out.classList.toggle("ti-correct", ok === true);
    out.classList.toggle("ti-wrong", ok === false);
    var mj = window.MathJax;
    if (mj && mj.typesetPromise) {
      if (mj.typesetClear) mj.typesetClear([out]);
      mj.typesetPromise([out]).catch(function () {});
    }
  }
"""

# ----------------------------------------------------------------------------
# Numeric answers
# ----------------------------------------------------------------------------
# One grammar for the Python checker and the page's JavaScript checker
# (NumericExercise._static_body writes the same rules in JS): ASCII digits,
# an optional decimal point and exponent, or a fraction a/b. A comma is a
# thousands separator when it groups digits by three (2,362,368 or
# 1,234.5), and a decimal comma otherwise (0,6652 or 1,5).
# (``\d+(?:\.\d*)?``, not ``\d+\.?\d*``: two adjacent runs of digits make a
# failing match backtrack quadratically, 8.5 s for 20,000 digits.)
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
#: Longer text is refused before any regular expression reads it.
MAX_ANSWER_CHARS = 100
_NUMBER_RE = re.compile(rf"^({_NUM})$", re.ASCII)
_FRACTION_RE = re.compile(rf"^({_NUM})\s*/\s*({_NUM})$", re.ASCII)
_THOUSANDS_RE = re.compile(r"^[-+]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d*)?$",
                           re.ASCII)
_DECIMAL_COMMA_RE = re.compile(r"^[-+]?\d+,\d+$", re.ASCII)


def _normalise_commas(text: str) -> str:
    if "," not in text:
        return text
    if _THOUSANDS_RE.match(text):
        return text.replace(",", "")         # 2,362,368 -> 2362368
    if _DECIMAL_COMMA_RE.match(text):
        return text.replace(",", ".")        # 0,6652 -> 0.6652
    return text                              # left for the error below


def parse_number(answer: Any) -> float:
    """A finite float from a number, 0-d array/tensor or text like ``2/3``.

    Text follows one grammar, shared with the page's JavaScript checker:
    ``0.25``, ``-2.5e-3``, ``1/4``, thousands separators grouping by three
    (``2,362,368``) and a decimal comma (``0,6652``, ``1,5``).

    Raises ValueError with a learner-readable message otherwise.
    """
    if isinstance(answer, bool):
        raise ValueError(tr("a number is expected, not True/False"))
    if hasattr(answer, "item") and getattr(answer, "ndim", 0) == 0 or \
            hasattr(answer, "numel") and getattr(answer, "ndim", 0) == 1 \
            and answer.numel() == 1:              # tensor(2.5), tensor([2.5])
        try:
            answer = answer.item()
        except (RuntimeError, ValueError):         # e.g. a meta tensor
            raise ValueError(tr("this tensor holds no value to read")) \
                from None
    if isinstance(answer, numbers.Real):
        try:
            value = float(answer)
        except OverflowError:                      # e.g. 10**400
            raise ValueError(tr("the number is too large to be an "
                                "answer")) from None
    elif isinstance(answer, str):
        if len(answer) > MAX_ANSWER_CHARS and \
                len(answer.strip()) > MAX_ANSWER_CHARS:
            raise ValueError(tr(
                "the answer is {n:,} characters long; a number needs at "
                "most {limit}", n=len(answer.strip()),
                limit=MAX_ANSWER_CHARS))
        text = _normalise_commas(answer.strip())
        if not text:
            raise ValueError(tr("the answer is empty: type a number"))
        whole, frac = _NUMBER_RE.match(text), _FRACTION_RE.match(text)
        try:
            if not (whole or frac):
                raise ValueError
            value = (float(frac.group(1)) / float(frac.group(2)) if frac
                     else float(text))
        except (ValueError, ZeroDivisionError):
            raise ValueError(tr(
                "{answer} is not a number (write e.g. 0.25, 2.5e-3 or 1/4)",
                answer=f"{answer.strip()!r:.40}")) from None
    else:
        raise ValueError(tr("a number is expected, got a {type}",
                            type=type(answer).__name__))
    if not math.isfinite(value):
        raise ValueError(tr("{answer} is not a finite number",
                            answer=f"{str(answer).strip()!r:.40}"))
    return value


def _exact(value: float) -> str:
    """A number as the learner gave it: 2362368, not 2.36237e+06."""
    return str(int(value)) if value.is_integer() and abs(value) < 1e16 \
        else repr(value)

# Messages that are also shown by the pages' JavaScript (same templates).
_PLACEHOLDER = "your answer, e.g. 0.25 or 1/4"
_TYPE_A_NUMBER = "type a number (e.g. 0.25, 2.5e-3 or 1/4)"
_TOO_LARGE = "Not correct: {value} is too large. Try the hint."
_TOO_SMALL = "Not correct: {value} is too small. Try the hint."
_MEASURED = "The experiment in the next cell measures {answer}."


# ----------------------------------------------------------------------------
# Numeric answers (the grammar: course_lib.notebook.exercises)
# ----------------------------------------------------------------------------
class NumericExercise(Exercise):
    """Answer with a number, accepted within a tolerance.

    ``|given - answer| <= atol + rtol * |answer|`` counts as correct.
    ``mistakes`` lists recognised wrong answers ``(value, message)``, matched
    with the same tolerance, so the feedback can name the mistake.
    """

    kind = "numeric"

    def __init__(self, *, key: str, prompt: str, answer: float,
                 hint: str, solution: str, rtol: float = 1e-2,
                 atol: float = 0.0,
                 mistakes: Sequence[tuple[float, str]] = (),
                 purpose: str) -> None:
        super().__init__(key=key, prompt=prompt, hint=hint,
                         solution=solution, purpose=purpose)
        self.answer = parse_number(answer)
        if rtol < 0 or atol < 0 or (rtol == 0 and atol == 0):
            raise ValueError(f"tolerances must be >= 0 and not both 0, got "
                             f"rtol={rtol}, atol={atol}")
        check_real("rtol", rtol, minimum=0)
        check_real("atol", atol, minimum=0)
        self.rtol, self.atol = float(rtol), float(atol)
        self.mistakes = [(parse_number(v), str(msg)) for v, msg in mistakes]

    def _close(self, value: float, target: float) -> bool:
        return abs(value - target) <= self.atol + self.rtol * abs(target)

    def check(self, answer: Any) -> Feedback:
        try:
            value = parse_number(answer)
        except ValueError as exc:
            return Feedback(False, tr("Not a usable answer: {error}.",
                                      error=exc))
        if self._close(value, self.answer):
            return Feedback(True, tr("Correct: {value}.",
                                     value=_exact(value)) + self._measured)
        for target, message in self.mistakes:
            if self._close(value, target):
                return Feedback(False, tr("Not quite. {message}",
                                          message=tr(message))
                                + self._measured)
        return Feedback(False, tr(_TOO_LARGE if value > self.answer
                                  else _TOO_SMALL, value=_exact(value))
                        + self._measured)

    @property
    def _measured(self) -> str:
        """For a prediction, what the experiment measures (after a check,
        the learner may see it: the next cell shows it anyway)."""
        if self.purpose != "prediction":
            return ""
        return " " + tr(_MEASURED, answer=f"{self.answer:.4g}")

    def _make_input(self) -> Any:
        import ipywidgets as widgets
        return widgets.Text(placeholder=tr(_PLACEHOLDER),
                            description=tr("Answer:"))

    def _read_input(self) -> Any:
        return self.input.value

    def _static_body(self) -> str:
        dom = f"ti-ex-{self.key}"
        # the messages, translated here; JavaScript fills in {value} and
        # {message} (the same templates as check())
        t = {"unusable": tr("Not a usable answer: {error}.",
                            error=tr(_TYPE_A_NUMBER)),
             "correct": tr("Correct: {value}."),
             "quite": tr("Not quite. {message}"),
             "large": tr(_TOO_LARGE), "small": tr(_TOO_SMALL)}
        data = json.dumps({"answer": self.answer, "rtol": self.rtol,
                           "atol": self.atol, "t": t,
                           "measured": self._measured,
                           "mistakes": [[v, _inline_html(m)]
                                        for v, m in self.mistakes]},
                          ensure_ascii=False)
        data = data.replace("</", "<\\/")    # never close the <script>
        return f"""<p><input type="text" class="ti-answer" id="{dom}-answer"
aria-label="{html.escape(tr('Answer to {name}', name=self._name))}"
aria-describedby="{dom}-prompt"
placeholder="{html.escape(tr(_PLACEHOLDER))}" enterkeyhint="done">
<button type="button" class="ti-check" aria-label="{html.escape(tr(
    'Check the answer to {name}', name=self._name))}">{tr("Check")}</button></p>
<p class="ti-feedback" role="status"></p>
<script>
(function () {{
  var root = document.getElementById("{dom}"), d = {data};
  if (!root) return;
{_SHOW_JS}  // the grammar of course_lib.notebook.exercises.parse_number
  var NUM = /[-+]?(?:\\d+(?:\\.\\d*)?|\\.\\d+)(?:[eE][-+]?\\d+)?/.source;
  var WHOLE = new RegExp("^" + NUM + "$");
  var FRACTION = new RegExp("^(" + NUM + ")" + /\\s*\\/\\s*/.source +
                            "(" + NUM + ")$");
  function parse(t) {{
    t = t.trim();
    if (t.length > {MAX_ANSWER_CHARS}) return null;
    if (/^[-+]?[1-9]\\d{{0,2}}(?:,\\d{{3}})+(?:\\.\\d*)?$/.test(t)) t = t.replace(/,/g, "");
    else if (/^[-+]?\\d+,\\d+$/.test(t)) t = t.replace(",", ".");
    var f = t.match(FRACTION);
    var v = f ? Number(f[1]) / Number(f[2]) : (WHOLE.test(t) ? Number(t) : NaN);
    return isFinite(v) ? v : null;
  }}
  function exact(v) {{ return Number.isInteger(v) && Math.abs(v) < 1e16 ? v.toFixed(0) : String(v); }}
  function close(v, t) {{ return Math.abs(v - t) <= d.atol + d.rtol * Math.abs(t); }}
  var input = root.querySelector(".ti-answer");
  function check() {{
    var out = root.querySelector(".ti-feedback");
    var v = parse(input.value);
    if (v === null) return show(out, false, "\\u2717 " + d.t.unusable);
    if (close(v, d.answer))
      return show(out, true, "\\u2713 " + fill(d.t.correct, "value", exact(v))
                  + d.measured);
    var hit = d.mistakes.filter(function (m) {{ return close(v, m[0]); }})[0];
    show(out, false, "\\u2717 " + (hit ? fill(d.t.quite, "message", hit[1])
         : fill(d.t[v > d.answer ? "large" : "small"], "value", exact(v)))
         + d.measured);
  }}
  root.querySelector(".ti-check").addEventListener("click", check);
  input.addEventListener("keydown", function (e) {{
    if (e.key === "Enter") {{ e.preventDefault(); check(); }}
  }});
}})();
</script>"""


# ----------------------------------------------------------------------------
# Multiple choice
# ----------------------------------------------------------------------------
class ChoiceExercise(Exercise):
    """Pick one of ``options``; ``answer`` is the index of the right one.

    ``explanations`` (one per option) says why each option is right or
    wrong; it is shown as the feedback for that choice.
    """

    kind = "choice"

    def __init__(self, *, key: str, prompt: str, options: Sequence[str],
                 answer: int, hint: str, solution: str,
                 explanations: Sequence[str] | None = None,
                 purpose: str) -> None:
        super().__init__(key=key, prompt=prompt, hint=hint,
                         solution=solution, purpose=purpose)
        options = [str(o) for o in options]
        if len(options) < 2 or len(set(options)) != len(options):
            raise ValueError(f"options must be >= 2 distinct strings, "
                             f"got {options!r}")
        if not isinstance(answer, int) or not 0 <= answer < len(options):
            raise ValueError(f"answer must be an index in "
                             f"[0, {len(options) - 1}], got {answer!r}")
        if explanations is not None and len(explanations) != len(options):
            raise ValueError(f"explanations must have one entry per option "
                             f"({len(options)}), got {len(explanations)}")
        self.options, self.answer = options, answer
        self.explanations = list(explanations or [""] * len(options))

    def check(self, answer: Any) -> Feedback:
        if answer is None:
            return Feedback(False, tr("Pick an option first."))
        if isinstance(answer, str):
            # a plain copy: a str subclass could answer == with True
            answer = str.__getitem__(answer, slice(None))
            if answer not in self.options:
                return Feedback(False, tr("{answer} is not one of the "
                                          "options.", answer=repr(answer)))
            index = self.options.index(answer)
        elif isinstance(answer, numbers.Integral) and not isinstance(
                answer, bool):
            index = int(answer)
            if not 0 <= index < len(self.options):
                return Feedback(False, tr(
                    "There is no option {index}: pick 0 to {last}.",
                    index=index, last=len(self.options) - 1))
        else:
            return Feedback(False, tr(
                "Answer with an option's text or index, not a {type}.",
                type=type(answer).__name__))
        why = tr(self.explanations[index])
        if index == self.answer:
            return Feedback(True, tr("Correct. {explanation}",
                                     explanation=why))
        return Feedback(False, tr("Not this one. {explanation}",
                                  explanation=why or tr("Try the hint.")))

    def _make_input(self) -> Any:
        import ipywidgets as widgets
        # shown translated; the value read back is the option itself
        return widgets.RadioButtons(options=[(tr(o), o) for o in
                                             self.options], value=None,
                                    layout=widgets.Layout(width="auto"))

    def _read_input(self) -> Any:
        return self.input.value

    def _static_body(self) -> str:
        dom = f"ti-ex-{self.key}"
        radios = "\n".join(
            f'<label class="ti-option"><input type="radio" name="{dom}-opt" '
            f'value="{i}"> {_inline_html(o)}</label><br>'
            for i, o in enumerate(self.options))
        t = {"first": tr("Pick an option first."),
             "correct": tr("Correct. {explanation}"),
             "wrong": tr("Not this one. {explanation}"),
             "hint": tr("Try the hint.")}
        data = json.dumps({"answer": self.answer, "t": t,
                           "explanations": [_inline_html(e)
                                            for e in self.explanations]},
                          ensure_ascii=False)
        data = data.replace("</", "<\\/")    # never close the <script>
        return f"""<div class="ti-options" role="radiogroup"
aria-label="{html.escape(tr('Options for {name}', name=self._name))}"
aria-describedby="{dom}-prompt">
{radios}
</div>
<p><button type="button" class="ti-check" aria-label="{html.escape(tr(
    'Check the answer to {name}', name=self._name))}">{tr("Check")}</button></p>
<p class="ti-feedback" role="status"></p>
<script>
(function () {{
  var root = document.getElementById("{dom}"), d = {data};
  if (!root) return;
{_SHOW_JS}  function check() {{
    var out = root.querySelector(".ti-feedback");
    var picked = root.querySelector("input[type=radio]:checked");
    if (!picked) return show(out, null, d.t.first);
    var i = Number(picked.value), ok = i === d.answer;
    var why = d.explanations[i] || (ok ? "" : d.t.hint);
    show(out, ok, (ok ? "\\u2713 " : "\\u2717 ") +
         fill(d.t[ok ? "correct" : "wrong"], "explanation", why));
  }}
  root.querySelector(".ti-check").addEventListener("click", check);
  root.querySelector(".ti-options").addEventListener("keydown", function (e) {{
    if (e.key === "Enter") {{ e.preventDefault(); check(); }}
  }});
}})();
</script>"""
