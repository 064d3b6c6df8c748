"""The exercise contract shared by every exercise kind: a prompt, a Check
button, feedback that names the mistake, a hint and a reveal-solution
control (:class:`Exercise`), and the verdict on one answer
(:class:`Feedback`).

The checking logic is the pure method :meth:`Exercise.check`, which
returns a :class:`Feedback` and never raises for a wrong answer. The kinds
themselves live in :mod:`course_lib.exercises` (numeric, multiple choice)
and :mod:`course_lib.function_exercise` (write a function).

Introduced in chapter 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .i18n import tr
from .markdown import markdown_to_html
from .widgets import check_key, widget_bundle

__all__ = ["Feedback", "Exercise"]


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
    """

    kind = "exercise"

    def __init__(self, *, key: str, prompt: str, hint: str,
                 solution: str) -> None:
        self.key = check_key(key)
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
                widgets.HTMLMath(f"<b>{tr('Exercise.')}</b> "
                                 f"{markdown_to_html(tr(self.prompt))}"),
                self.input,
                widgets.HBox([self.check_button, self.hint_button,
                              self.solution_button]),
                self.feedback, self.hint_box, self.solution_box])
        return self._widget

    # -- static HTML -----------------------------------------------------------
    def static_html(self) -> str:
        """Self-contained HTML for pages with no kernel (in the current
        language, :mod:`course_lib.i18n`)."""
        dom = f"ti-ex-{self.key}"

        def md(text: str) -> str:
            return markdown_to_html(tr(text), tex_delimiters=True)
        return (
            f'<div class="ti-exercise mathjax_process" id="{dom}">\n'
            f'<div class="ti-prompt" id="{dom}-prompt"><strong>'
            f'{tr("Exercise.")}</strong> {md(self.prompt)}</div>\n'
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
