"""A chat box in front of a chat function, for Jupyter and Colab.

Chapter 13 turns SmolLM2 into a small assistant: ``ask(question)`` adds
the question to the conversation, decodes the model's reply and prints
it. A :class:`ChatBox` puts a text field and a Send button in front of
``ask``; each question and its reply are printed below the box, as a
transcript.

Like an explorer (:mod:`course_lib.notebook.widgets`), the box is two
views of one output: the live widget where a kernel runs, and, for the
HTML book, which has no kernel, a note in its place (a widget saved into
a static page would be a control with no model behind it). Every text of
both views goes through :func:`~course_lib.notebook.i18n.tr`, so the
Chinese edition shows it in Chinese.
"""
from __future__ import annotations

from typing import Any, Callable

from .._util.validation import check_callable, check_type
from .i18n import tr
from .widgets import widget_bundle

__all__ = ["ChatBox"]

_NEEDS_KERNEL = ("The chat box needs a running Python kernel: open this "
                 "chapter in Colab (button at the top) or Jupyter.")


class ChatBox:
    """A text field and a Send button that call ``ask(question)``.

    Args:
        ask: called with the question (a non-empty, stripped string) when
            the reader presses Send; it prints the reply, which shows
            below the box.
        name: the model's name, shown in the placeholder and the
            transcript (``"SmolLM2"``).

    Display it by ending a cell with it. :meth:`send` is what the button
    does, callable from code.
    """

    def __init__(self, ask: Callable[[str], Any], *,
                 name: str = "SmolLM2") -> None:
        check_callable("ask", ask)
        check_type("name", name, str, "a str")
        self.ask, self.name = ask, name
        self._widget = None

    def send(self, question: str) -> None:
        """Print ``question`` and the model's reply (``ask``'s output)
        into the transcript; a blank question does nothing."""
        check_type("question", question, str, "a str")
        question = question.strip()
        if not question:
            return
        with self.widget().children[1]:               # the transcript
            print(tr("you: {question}\n{name}: ", question=question,
                     name=self.name), end="")
            self.ask(question)

    def widget(self) -> Any:
        """The live ipywidget (built once): field and button, transcript."""
        if self._widget is None:
            import ipywidgets as widgets

            self.text = widgets.Text(
                placeholder=tr("Ask {name} something", name=self.name),
                layout=widgets.Layout(width="70%"))
            self.button = widgets.Button(description=tr("Send"))
            transcript = widgets.Output()

            def on_send(_: Any = None) -> None:
                question, self.text.value = self.text.value, ""
                self.send(question)

            self.button.on_click(on_send)
            self._widget = widgets.VBox(
                [widgets.HBox([self.text, self.button]), transcript])
        return self._widget

    def static_html(self) -> str:
        """What the HTML book shows in the box's place: a note."""
        return f'<p class="ti-chat-note"><em>{tr(_NEEDS_KERNEL)}</em></p>'

    def _repr_mimebundle_(self, include: Any = None,
                          exclude: Any = None) -> dict:
        return widget_bundle(self.widget(), self.static_html(), repr(self))

    def __repr__(self) -> str:
        return f"{self.name} chat box"
