"""Widget-checked exercises: numeric and multiple choice; the
write-a-function exercise builds on them in :mod:`course_lib.function_exercise`.

Every exercise has a prompt, a Check button, feedback that names the
mistake, a hint and a reveal-solution control. The checking logic is the
pure method :meth:`Exercise.check`, which returns a :class:`Feedback` and
never raises for a wrong answer: wrong types, wrong shapes, NaN and
exceptions raised inside the learner's own code all become feedback. The
widget only reads its input and shows what ``check`` says, which is what
the tests drive headlessly.

Displayed in a notebook, an exercise offers the live widget and, for the
HTML book where no kernel runs, a self-contained HTML version: numeric and
multiple-choice exercises keep a working JavaScript checker; a function
exercise shows its starter code, hint and solution and points to Colab.

Introduced in chapter 1.
"""
from __future__ import annotations

import html
import json
import numbers
from typing import Any, Sequence

from .answers import _exact, parse_number
from .exercise_base import _SHOW_JS, Exercise, Feedback, _inline_html
from .i18n import tr
from .validation import check_real

# Messages that are also shown by the pages' JavaScript (same templates).
_PLACEHOLDER = "your answer, e.g. 0.25 or 1/4"
_TYPE_A_NUMBER = "type a number (e.g. 0.25, 2.5e-3 or 1/4)"
_TOO_LARGE = "Not correct: {value} is too large. Try the hint."
_TOO_SMALL = "Not correct: {value} is too small. Try the hint."

__all__ = ["Feedback", "Exercise", "NumericExercise", "ChoiceExercise",
           "parse_number"]


# ----------------------------------------------------------------------------
# Numeric answers (the grammar: course_lib.answers)
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
                 mistakes: Sequence[tuple[float, str]] = ()) -> None:
        super().__init__(key=key, prompt=prompt, hint=hint,
                         solution=solution)
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
                                     value=_exact(value)))
        for target, message in self.mistakes:
            if self._close(value, target):
                return Feedback(False, tr("Not quite. {message}",
                                          message=tr(message)))
        return Feedback(False, tr(_TOO_LARGE if value > self.answer
                                  else _TOO_SMALL, value=_exact(value)))

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
                           "mistakes": [[v, _inline_html(m)]
                                        for v, m in self.mistakes]},
                          ensure_ascii=False)
        data = data.replace("</", "<\\/")    # never close the <script>
        name = html.escape(self._name)
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
{_SHOW_JS}  // the grammar of course_lib.exercises.parse_number
  var NUM = /[-+]?(?:\\d+\\.?\\d*|\\.\\d+)(?:[eE][-+]?\\d+)?/.source;
  var WHOLE = new RegExp("^" + NUM + "$");
  var FRACTION = new RegExp("^(" + NUM + ")" + /\\s*\\/\\s*/.source +
                            "(" + NUM + ")$");
  function parse(t) {{
    t = t.trim();
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
      return show(out, true, "\\u2713 " + fill(d.t.correct, "value", exact(v)));
    var hit = d.mistakes.filter(function (m) {{ return close(v, m[0]); }})[0];
    show(out, false, "\\u2717 " + (hit ? fill(d.t.quite, "message", hit[1])
         : fill(d.t[v > d.answer ? "large" : "small"], "value", exact(v))));
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
                 explanations: Sequence[str] | None = None) -> None:
        super().__init__(key=key, prompt=prompt, hint=hint,
                         solution=solution)
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
        name = html.escape(self._name)
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
