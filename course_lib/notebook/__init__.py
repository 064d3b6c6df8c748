"""Course machinery, not Transformer code: widget exercises and their
checks, explorers, legible figure frames, Markdown for prompts and
feedback, ``show_source``, and the language of the Chinese edition
(``i18n`` with its ``locale/`` files).
"""
