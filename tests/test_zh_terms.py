"""One Chinese term per concept, with the glossary as the authority.

``book/glossary.md`` gives every term its Chinese form in the first words
of the definition, before the first ". "::

    masked
      屏蔽（不用：遮挡、掩蔽）. Said of a key that the mask forbids ...

The *preferred* form is that column without its parentheses (``屏蔽``),
the part before " / " unless the English term itself pairs two terms with
" / " (``post-norm / pre-norm`` -> ``后归一化 / 前归一化``: both). The forms
in ``（不用：A、B）`` are the ones the Chinese edition does not use.

The Chinese glossary page (``locale/zh/glossary.json``) repeats each entry
as a term line ``屏蔽`` under the English one and ends the definition with a
line ``本书不用：遮挡、掩蔽。``; the tests below keep the two pages in step
and fail, naming chapter, cell (or string) and term, when a chapter's
Chinese text uses a form the glossary rules out. A text that is *about*
the other term (e.g. "d2l-zh calls it ...") goes into ``EXCEPTIONS`` with
its reason; inside the glossary, an entry may name its own ruled-out forms.
"""
import json
import re
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
ZH = ROOT / "course_lib" / "notebook" / "locale" / "zh"
GLOSSARY = ROOT / "book" / "glossary.md"

#: (notebook stem, cell id or English string, ruled-out form) -> why the
#: text may use it. Only for texts about the other term.
EXCEPTIONS: dict[tuple[str, str, str], str] = {}

_BLOCK = re.compile(r"```\{glossary\}\n(.*?)```", re.S)
_AVOID = re.compile(r"（不用：([^）]*)）")
_AVOID_LINE = re.compile(r"^\s+本书不用：(.+?)。\s*$")
# a number written with 百万/千万 as its unit ("9.5 百万"): write 950 万
_CALQUE = re.compile(r"\d\$?\s*[百千]万")


def entries(text: str) -> list[tuple[list[str], list[str]]]:
    """``(term lines, definition lines)`` of each entry of the page's
    glossary block, in order."""
    found = []
    for line in _BLOCK.search(text).group(1).splitlines():
        if not line.strip() or line.startswith(":"):
            continue
        if line[0].isspace():
            found[-1][1].append(line)
        elif found and not found[-1][1]:
            found[-1][0].append(line.strip())   # another name, same entry
        else:
            found.append(([line.strip()], []))
    return found


def preferred(column: str, english: str) -> tuple[str, ...]:
    """The preferred Chinese form(s) in a glossary column (see the module
    docstring)."""
    bare = re.sub(r"（[^）]*）|\s*\([^)]*\)", "", column).strip()
    parts = [p.strip() for p in bare.split(" / ")]
    return tuple(parts) if " / " in english else (parts[0],)


def english_glossary() -> dict[str, dict]:
    """English term -> {"column", "preferred", "avoid"} of book/glossary.md."""
    out = {}
    for terms, definition in entries(GLOSSARY.read_text()):
        column = definition[0].strip().split(". ", 1)[0] if definition else ""
        avoid = [a for m in _AVOID.findall(column) for a in m.split("、")]
        out[terms[0]] = {"column": column, "avoid": tuple(avoid),
                         "preferred": preferred(column, terms[0])}
    return out


def chinese_page() -> str:
    return json.loads((ZH / "glossary.json").read_text())["cells"]["page"][
        "zh"]


def chapter_texts():
    """``(notebook stem, where, Chinese text)`` of every translated cell and
    reader string of the chapters and the intro."""
    for path in sorted(ZH.glob("*.json")):
        if path.stem in ("ui", "glossary"):
            continue
        data = json.loads(path.read_text())
        for cid, entry in data["cells"].items():
            if entry.get("zh"):
                yield path.stem, f"cell {cid}", entry["zh"]
        for en, zh in data.get("strings", {}).items():
            if zh:
                yield path.stem, f"string {en[:40]!r}", zh


def ruled_out(texts, glossary, allowed=()) -> list[str]:
    """One line per use of a ruled-out form in ``texts`` (except the forms
    in ``allowed`` and :data:`EXCEPTIONS`)."""
    bad = []
    for stem, where, text in texts:
        for term, entry in glossary.items():
            for form in entry["avoid"]:
                key = where.split(" ", 1)[1]
                if form in text and form not in allowed \
                        and (stem, key, form) not in EXCEPTIONS:
                    bad.append(f"{stem} {where}: {form} (glossary "
                               f"'{term}': use {' / '.join(entry['preferred'])})")
    return bad


GLOSSARY_TERMS = english_glossary()


def test_every_glossary_entry_has_a_preferred_chinese_form():
    assert len(GLOSSARY_TERMS) > 150
    empty = [t for t, e in GLOSSARY_TERMS.items() if not all(e["preferred"])]
    assert empty == []
    # a ruled-out form must not hide inside a preferred one
    clash = [(t, a) for t, e in GLOSSARY_TERMS.items() for a in e["avoid"]
             for u in GLOSSARY_TERMS.values() for p in u["preferred"]
             if a in p]
    assert clash == []
    assert GLOSSARY_TERMS["masked"]["avoid"] == ("遮挡", "掩蔽")
    assert GLOSSARY_TERMS["post-norm / pre-norm"]["preferred"] == (
        "后归一化", "前归一化")


def test_chinese_glossary_page_follows_the_english_one():
    zh = {terms[0]: (terms, definition)
          for terms, definition in entries(chinese_page())}
    assert sorted(zh) == sorted(GLOSSARY_TERMS)
    wrong = []
    for term, entry in GLOSSARY_TERMS.items():
        terms, definition = zh[term]
        got = preferred(terms[-1], term)
        avoid = tuple(a for line in definition
                      for m in [_AVOID_LINE.match(line)] if m
                      for a in m.group(1).split("、"))
        if got != entry["preferred"] or avoid != entry["avoid"]:
            wrong.append((term, got, avoid, entry["preferred"],
                          entry["avoid"]))
    assert wrong == []


def test_chapters_use_the_glossary_forms():
    assert ruled_out(chapter_texts(), GLOSSARY_TERMS) == []


def test_glossary_page_uses_the_glossary_forms():
    # each entry may name its own ruled-out forms (and say why)
    bad = []
    for terms, definition in entries(chinese_page()):
        own = GLOSSARY_TERMS.get(terms[0], {"avoid": ()})["avoid"]
        text = "\n".join(terms[1:] + definition)
        bad += ruled_out([("glossary", f"entry {terms[0]}", text)],
                         GLOSSARY_TERMS, allowed=own)
    assert bad == []


def test_no_million_calque():
    bad = [f"{stem} {where}: {m.group()!r}"
           for stem, where, text in chapter_texts()
           for m in _CALQUE.finditer(text)]
    assert bad == []


def test_the_check_finds_a_ruled_out_form():
    texts = [("ch04_masking", "cell x", "被遮挡的键"),
             ("ch04_masking", "cell y", "被屏蔽的键"),
             ("ch08_sampling", "string 'z'", "对数几率不是对数概率")]
    assert ruled_out(texts, GLOSSARY_TERMS) == [
        "ch04_masking cell x: 遮挡 (glossary 'masked': use 屏蔽)",
        "ch08_sampling string 'z': 对数几率 (glossary 'logits': use logits)"]
    assert _CALQUE.search("约 9.5 百万个") and _CALQUE.search("9.5$ 百万")
    assert not _CALQUE.search("数百万个词元") and not _CALQUE.search("950 万")
