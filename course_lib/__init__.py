"""course_lib: the tested library behind the Transformer Internals course.

One module per concept; each chapter imports its module and shows its code.

- ``widgets``: explorers (live ipywidgets + static HTML frame players)
- ``exercises``: widget-checked numeric, multiple-choice, function exercises
- ``rnn``: recurrent networks and their limits (chapter 1)
- ``positional``: sinusoidal encodings and RoPE (chapter 2)
"""

__version__ = "0.1.0"
