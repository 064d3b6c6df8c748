"""The book refers to its own sections by MyST label, never by number.

Jupyter Book numbers sections when it builds the book, so a number typed
into the prose ("see section 2.7", "§5.5") goes stale as soon as a
section is added or moved; several in this book already had.
A reference written as {ref}`label` is resolved, and checked, by the
strict build. This test fails on any hard-coded section number in a
chapter's markdown or in the strings of its code cells (exercise
feedback), except where the sentence is about a paper or report, whose
sections are fixed ("the DeepSeek-V3 report, section 2.1.2").
"""
import re

import pytest

from notebook_support import book_texts

SECTION_NUMBER = re.compile(
    r"(?:\b[Ss]ections?|\b[Ss]ecs?\.|§)\s*\d+(?:\.\d+)*"
    r"|\b[Cc]hapters?\s+\d+\.\d+")
# a sentence that cites an outside document may name its sections
OUTSIDE = re.compile(r"report|paper|\{cite|appendix|README|et al\.|"
                     r"arXiv|spec", re.IGNORECASE)


def hard_coded_refs(text: str) -> list[str]:
    """The hard-coded section numbers in ``text`` that refer to the book:
    matches whose sentence (back to the previous full stop, at most 200
    characters) does not mention an outside document."""
    found = []
    for m in SECTION_NUMBER.finditer(text):
        start = max(text.rfind(". ", 0, m.start()), m.start() - 200, 0)
        if not OUTSIDE.search(text[start:m.end() + 40]):
            found.append(text[max(m.start() - 40, 0):m.end() + 10]
                         .replace("\n", " "))
    return found


def test_checker_catches_book_sections_and_spares_papers():
    assert hard_coded_refs("as section 2.7 showed") != []
    assert hard_coded_refs("(see §5.5)") != []
    assert hard_coded_refs("Section 3 derives it.") != []
    assert hard_coded_refs("as in chapter 6.3") != []
    assert hard_coded_refs("the report (section 2.1.2) says") == []
    assert hard_coded_refs("{cite:t}`x` prove it in section 4") == []
    assert hard_coded_refs("chapter 6 explains it") == []
    assert hard_coded_refs("see {ref}`ch05-symmetry`") == []


@pytest.mark.parametrize("where,text", list(book_texts()),
                         ids=lambda v: v if isinstance(v, str)
                         and len(v) < 60 else "")
def test_no_hard_coded_section_numbers(where, text):
    found = hard_coded_refs(text)
    assert not found, (f"{where}: hard-coded section number(s) {found}; "
                       f"put a MyST label above the heading and write "
                       f"{{ref}}`label` instead")
