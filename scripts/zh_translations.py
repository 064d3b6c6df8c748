"""Chinese (zh-CN) translations of the chapters' markdown cells.

English is the source. ``course_lib/notebook/locale/zh/<notebook stem>.json``
holds, for each markdown cell of ``book/<notebook stem>.ipynb`` (by cell
id), the English text it translates, a hash of that text and the Chinese
text; and the other reader-facing strings, keyed by the English string:
figure captions and alt texts (code cell metadata, replaced by
``build_zh.py``) and the strings of the chapter's exercises and explorers
(prompts, options, explanations, hints, solutions, mistake messages,
titles, control labels, labels of control values, the comments of
starter code), which ``course_lib`` looks up at run time when the
language is Chinese:

    {"notebook": "book/ch03_scaled_dot_product_attention.ipynb",
     "cells": {"<cell id>": {"en_sha": "...", "en": "...", "zh": "..."}},
     "strings": {"<English string>": "<Chinese string>"}}

``zh`` (and a string's value) is null until translated. A translation is *stale*
when the English cell changed after it was written (``en_sha`` is no
longer the hash of the cell): ``tests/test_zh_translations.py`` fails,
and ``stale`` prints what changed in the English text, so the
translator updates exactly that and runs ``accept``.

Commands (run from the repository root):

    python scripts/zh_translations.py export ch03   # add missing cells
                                                    # (or intro, glossary)
    python scripts/zh_translations.py status        # per chapter counts
    python scripts/zh_translations.py stale [ch03]  # diffs to retranslate
    python scripts/zh_translations.py check [ch03]  # the test's checks
    python scripts/zh_translations.py accept ch03 CELL_ID  # after fixing
    python scripts/zh_translations.py template ch03 > ch03.txt
    python scripts/zh_translations.py import ch03 ch03.zh.txt

``template`` prints every English cell and string of a chapter under a
header line (``=== cell ID`` or ``=== string N``, N counting the
chapter's strings from 0); a translator writes a file with the same
headers and the Chinese text under each, and ``import`` stores it (only
the sections present; it refuses unknown ids and out-of-range numbers).

A string is stale when no exercise or explorer uses it any more (its
English text changed): translate the new one (``export`` adds it) and
delete the old entry.

``check`` also compares what must not change in translation: the math
(every ``$...$`` and ``$$...$$``, as a multiset; the words in a
formula's ``\\text{...}`` may be translated, its symbols and numbers not),
the MyST labels
``(name)=``, the targets of ``{ref}``, ``{numref}``, ``{doc}``,
``{cite:p}``, ``{cite:t}`` and ``{term}`` roles, the inline code spans, and
the names of the glued numbers (``<!--glue:name-->``; the number between
the markers is written by the run, so it may differ until ``make zh``).
A code span naming the Chinese notebooks, ``zh/book/...``, counts as the
English ``book/...`` (the intro sends a Chinese reader to ``zh/book/``).
"""
from __future__ import annotations

import collections
import difflib
import hashlib
import json
import re
import sys
from pathlib import Path

from course_lib.notebook.code_comments import comment_texts
from course_lib.notebook.glue import MARKER as GLUE_MARKER

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figure_strings import figure_strings, in_code  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
ZH = ROOT / "course_lib" / "notebook" / "locale" / "zh"


def without_glued_values(text: str) -> str:
    """``text`` with every glued number left out (its markers kept): a
    run that changes a glued number changes no translation."""
    return GLUE_MARKER.sub(r"<!--glue:\1--><!--/glue-->", text)


def sha(text: str) -> str:
    """Hash of an English cell's text, glued numbers left out (16 hex
    digits of SHA-256)."""
    return hashlib.sha256(
        without_glued_values(text).encode()).hexdigest()[:16]


# Markdown pages of the book: one "cell" each, the whole page (``stale``
# shows which lines of it changed).
PAGES = ("intro", "glossary")


def sources() -> list[Path]:
    """Every English source the Chinese edition translates."""
    return sorted(BOOK.glob("ch*.ipynb")) + [BOOK / f"{p}.md" for p in PAGES]


def english_cells(notebook: Path) -> dict[str, str]:
    """{cell id: markdown text} of an English notebook, in order (a
    Markdown page: {"page": its text})."""
    if notebook.suffix == ".md":
        return {"page": notebook.read_text()}
    nb = json.loads(notebook.read_text())
    return {c["id"]: "".join(c["source"]) for c in nb["cells"]
            if c["cell_type"] == "markdown"}


# Keyword arguments of the exercise and explorer classes whose strings a
# reader sees (``key``, ``func_name``: code, not prose; ``starter_code``
# is code whose comments a reader sees, :data:`CODE_KWARGS`).
TEXT_KWARGS = {"prompt", "hint", "solution", "options", "explanations",
               "mistakes", "title", "labels", "value_labels"}
# Keyword arguments holding code whose comments a reader sees, in the
# reader's language: each prose comment is a string
# (:func:`course_lib.notebook.code_comments.comment_texts`).
CODE_KWARGS = {"starter_code"}
# Cell metadata a reader sees: myst-nb's figure caption and alt text.
FIGURE_FIELDS = (("figure", "caption"), ("image", "alt"))


def figure_texts(cell: dict):
    """``(mystnb, key, field, text)`` for each caption or alt text of a
    cell (``mystnb[key][field] == text``), the one place that reads them:
    the translation files, ``build_zh.py`` and its test."""
    mystnb = cell.get("metadata", {}).get("mystnb", {})
    for key, field in FIGURE_FIELDS:
        text = mystnb.get(key, {}).get(field)
        if isinstance(text, str) and text.strip():
            yield mystnb, key, field, text


def reader_strings(notebook: Path) -> list[str]:
    """The strings a reader sees that are not markdown cells: figure
    captions and alt texts (code cell metadata, :data:`FIGURE_FIELDS`),
    then the string literals of the chapter's exercises and explorers:
    every ``str`` constant under a :data:`TEXT_KWARGS` keyword of a call to
    ``...Exercise(...)`` or ``Explorer(...)`` (dict keys excluded: they
    name controls), each prose comment of the code under a
    :data:`CODE_KWARGS` keyword (the starter code's instructions), and the
    text the code draws into figures (``scripts/figure_strings.py``). In
    order, without repeats."""
    import ast
    if notebook.suffix == ".md":
        return []
    nb = json.loads(notebook.read_text())
    found: dict[str, None] = {}
    trees = []
    for c in nb["cells"]:
        if c["cell_type"] != "code":
            continue
        try:
            trees.append(ast.parse("".join(c["source"])))
        except SyntaxError:
            continue
    # NAME = [...] at the top of a cell: a keyword may pass the name
    assigned = {t.id: node.value for tree in trees for node in tree.body
                if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Name)}

    def strings_in(value):
        keys = set()
        for sub in ast.walk(value):
            if isinstance(sub, ast.Dict):
                keys |= {id(k) for k in sub.keys}
        for sub in ast.walk(value):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str) \
                    and id(sub) not in keys and sub.value.strip():
                found.setdefault(sub.value)
            elif isinstance(sub, ast.Name) and sub.id in assigned:
                strings_in(assigned.pop(sub.id))   # each name once

    # figure captions and image descriptions (alt text) of code cells'
    # outputs, in the cell metadata that myst-nb reads
    for c in nb["cells"]:
        for *_, text in figure_texts(c):
            found.setdefault(text)

    for tree in trees:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
            if not (name.endswith("Exercise") or name == "Explorer"):
                continue
            for kw in node.keywords:
                if kw.arg in TEXT_KWARGS:
                    strings_in(kw.value)
                elif kw.arg in CODE_KWARGS:
                    for text in comment_texts(_constant(kw.value, assigned)):
                        found.setdefault(text)
    # the figures' titles, labels, legends and annotations
    for text in figure_strings(notebook):
        found.setdefault(text)
    return list(found)


def _constant(value, assigned: dict) -> str:
    """The string an AST node holds: a literal, or a name assigned one
    at the top of a cell ("" for anything else)."""
    import ast
    if isinstance(value, ast.Name) and value.id in assigned:
        value = assigned[value.id]
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return value.value
    return ""


def notebook_for(chapter: str) -> Path:
    """``ch03`` (or a full stem) -> ``book/ch03_....ipynb``; ``intro``,
    ``glossary`` -> ``book/intro.md``, ``book/glossary.md``."""
    if chapter in PAGES:
        return BOOK / f"{chapter}.md"
    found = sorted(BOOK.glob(f"{chapter}*.ipynb"))
    if len(found) != 1:
        raise SystemExit(f"chapter must name one notebook in book/, got "
                         f"{chapter!r} ({len(found)} matches)")
    return found[0]


def path_for(notebook: Path) -> Path:
    return ZH / f"{notebook.stem}.json"


def load(notebook: Path) -> dict:
    p = path_for(notebook)
    if p.exists():
        return json.loads(p.read_text())
    return {"notebook": f"book/{notebook.name}", "cells": {}}


def save(notebook: Path, data: dict) -> None:
    ZH.mkdir(parents=True, exist_ok=True)
    path_for(notebook).write_text(
        json.dumps(data, indent=1, ensure_ascii=False) + "\n")


# ------------------------------------------------------- what must survive
_MATH = re.compile(r"\$\$.+?\$\$|\$[^$]+?\$", re.S)   # may wrap lines
_LABEL = re.compile(r"^\(([\w:.-]+)\)=\s*$", re.M)
_ROLE = re.compile(r"\{(ref|numref|doc|cite:p|cite:t|term)\}`([^`]*)`")
_CODE = re.compile(r"(?<!`)`([^`]+)`(?!`)")              # may wrap lines


def _role_target(kind: str, body: str) -> str:
    m = re.search(r"<([^<>]+)>\s*$", body)
    target = m.group(1) if m else body
    return f"{kind}:{target.strip().lower() if kind == 'term' else target}"


# Words inside maths: the argument of a text-mode command, such as
# $M_{ij} = 0 \text{ if query } i \text{ may read key } j$. They are prose,
# so a translation may change them; the symbols around them it may not.
# \mathrm, \operatorname and \texttt are not here: they set operator and
# code names (softmax, mscale), which stay as they are.
_MATH_TEXT = re.compile(
    r"\\(text|textrm|textit|textbf|mbox)\s*\{((?:[^{}]|\{[^{}]*\})*)\}")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_CJK_CHAR = re.compile("[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff"
                       "\uff00-\uffef]")


def _math_skeleton(math: str) -> str:
    """``math`` (whitespace collapsed) with each text argument replaced by
    the numbers in it: ``\\text{2 FLOPs per token}`` -> ``\\text{2}``."""
    return _MATH_TEXT.sub(
        lambda m: "\\%s{%s}" % (m.group(1), " ".join(
            sorted(_NUMBER.findall(m.group(2))))),
        re.sub(r"\s+", " ", math).strip())


def _math_words(text: str) -> collections.Counter:
    """The text arguments in ``text``'s maths that hold no Chinese (words
    left as they were, such as the ``model`` of ``d_{\\text{model}}``)."""
    return collections.Counter(
        re.sub(r"\s+", " ", m.group(2)).strip()
        for math in _MATH.findall(text) for m in _MATH_TEXT.finditer(math)
        if not _CJK_CHAR.search(m.group(2)))


def invariants(text: str) -> dict[str, collections.Counter]:
    """The parts of a cell a translation keeps exactly: the maths (each
    formula as :func:`_math_skeleton`: the words of its text arguments
    may be translated, its symbols and the numbers in its words may not),
    the words in maths it does not translate ("math words", compared by
    :func:`_differences` as a subset of the English ones: a translation
    may turn ``\\text{otherwise}`` into Chinese, not into ``\\text{other}``),
    MyST labels, role targets, inline code and glued names."""
    no_math = _MATH.sub(" ", text)
    roles = [_role_target(k, b) for k, b in _ROLE.findall(no_math)]
    no_roles = _ROLE.sub(" ", no_math)
    return {
        "math": collections.Counter(
            _math_skeleton(m) for m in _MATH.findall(text)),
        "math words": _math_words(text),
        "labels": collections.Counter(_LABEL.findall(text)),
        "roles": collections.Counter(roles),
        "code": collections.Counter(
            re.sub(r"\s+", " ", c) for c in _CODE.findall(no_roles)),
        "glue": collections.Counter(
            m.group(1) for m in GLUE_MARKER.finditer(text)),
    }


def problems(chapter_notebook: Path) -> list[str]:
    """Every reason the chapter's translations are not in sync."""
    data = load(chapter_notebook)
    en = english_cells(chapter_notebook)
    out = []
    for cid, entry in data["cells"].items():
        where = f"{chapter_notebook.stem} cell {cid}"
        if cid not in en:
            out.append(f"{where}: no such markdown cell in English")
            continue
        if entry.get("zh") is None:
            continue
        if entry["en_sha"] != sha(en[cid]):
            out.append(f"{where}: stale (the English cell changed; run "
                       f"`stale {chapter_notebook.stem[:4]}`)")
            continue
        out += [f"{where}: {d}" for d in _differences(en[cid],
                                                       entry["zh"])]
    current = set(reader_strings(chapter_notebook))
    for text, zh in data.get("strings", {}).items():
        where = f"{chapter_notebook.stem} string {text[:50]!r}"
        if zh is None:
            continue
        # a figure text built from a variable (``label=name``) is not
        # listed, but it must still be a text the code can draw
        if text not in current and not in_code(text, chapter_notebook):
            out.append(f"{where}: stale (no exercise, explorer or figure "
                       f"uses this English string any more)")
            continue
        out += [f"{where}: {d}" for d in _differences(text, zh)]
    return out


# kinds of :func:`invariants` a translation may drop entries of (it may
# translate a word in maths), but not add to
_SUBSET_KINDS = {"math words"}
# The Chinese edition's notebooks are in zh/book/ (build_zh.py writes
# them there and points the Colab badges at them): a code span of the
# translation that names a path there stands for the English one in book/.
_ZH_BOOK = "zh/book/"


def _english_path(span: str) -> str:
    """``zh/book/x`` -> ``book/x``; any other code span unchanged."""
    return span[len("zh/"):] if span.startswith(_ZH_BOOK) else span


def _differences(english: str, chinese: str) -> list[str]:
    """What a translation changed of :func:`invariants`, one line per kind."""
    want, got = invariants(english), invariants(chinese)
    got["code"] = collections.Counter(
        _english_path(c) for c in got["code"].elements())
    found = []
    for kind in want:
        if kind in _SUBSET_KINDS:
            extra = list((got[kind] - want[kind]).elements())
            if extra:
                found.append(f"{kind} differ from the English: extra "
                             f"{extra[:3]} (translate a word in maths "
                             f"into Chinese, or keep it as it is)")
        elif want[kind] != got[kind]:
            missing = list((want[kind] - got[kind]).elements())
            extra = list((got[kind] - want[kind]).elements())
            found.append(f"{kind} differ from the English: missing "
                         f"{missing[:3]}, extra {extra[:3]}")
    return found


# ---------------------------------------------------------------- commands
def export(chapter: str) -> None:
    nb = notebook_for(chapter)
    data = load(nb)
    en = english_cells(nb)
    added = 0
    cells = {}
    for cid, text in en.items():          # keep the notebook's order
        if data["cells"].get(cid, {}).get("zh") is not None:
            cells[cid] = data["cells"][cid]
        elif cid in data["cells"]:        # untranslated: show today's text
            cells[cid] = {**data["cells"][cid], "en_sha": sha(text),
                          "en": text}
        else:
            cells[cid] = {"en_sha": sha(text), "en": text, "zh": None}
            added += 1
    for cid, entry in data["cells"].items():
        cells.setdefault(cid, entry)      # orphans stay visible to check
    data["cells"] = cells
    strings = data.get("strings", {})
    new = {t: strings.get(t) for t in reader_strings(nb)}
    added_strings = sum(t not in strings for t in new)
    new.update({t: v for t, v in strings.items() if t not in new})
    data["strings"] = new
    save(nb, data)
    where = path_for(nb)
    if where.is_relative_to(ROOT):
        where = where.relative_to(ROOT)
    print(f"{where}: {added} cells and "
          f"{added_strings} strings added; {len(cells)} cells, "
          f"{len(new)} strings in all")


def _chosen(chapters: list[str]) -> list[Path]:
    """The sources named on the command line, or all of them."""
    return [notebook_for(c) for c in chapters] or sources()


def status(chapters: list[str]) -> None:
    nbs = _chosen(chapters)
    print(f"{'notebook':<42}{'cells':>6}{'done':>6}{'stale':>6}{'to do':>7}"
          f"{'strings':>9}{'done':>6}")
    for nb in nbs:
        en = english_cells(nb)
        full = load(nb)
        data = full["cells"]
        done = [c for c in en if data.get(c, {}).get("zh") is not None]
        stale = [c for c in done if data[c]["en_sha"] != sha(en[c])]
        wanted = reader_strings(nb)
        have = full.get("strings", {})
        s_done = sum(have.get(t) is not None for t in wanted)
        print(f"{nb.stem:<42}{len(en):>6}{len(done):>6}{len(stale):>6}"
              f"{len(en) - len(done):>7}{len(wanted):>9}{s_done:>6}")


def stale(chapters: list[str]) -> None:
    nbs = _chosen(chapters)
    for nb in nbs:
        en = english_cells(nb)
        for cid, entry in load(nb)["cells"].items():
            if entry.get("zh") is None or cid not in en:
                continue
            if entry["en_sha"] != sha(en[cid]):
                print(f"=== {nb.stem} cell {cid}: the English changed")
                sys.stdout.writelines(difflib.unified_diff(
                    entry["en"].splitlines(True),
                    en[cid].splitlines(True), "translated", "now"))
                print()


def accept(chapter: str, cid: str) -> None:
    nb = notebook_for(chapter)
    data = load(nb)
    en = english_cells(nb)
    if cid not in data["cells"] or cid not in en:
        raise SystemExit(f"no cell {cid!r} in {nb.stem}")
    data["cells"][cid].update(en_sha=sha(en[cid]), en=en[cid])
    save(nb, data)
    print(f"{nb.stem} cell {cid}: the translation now matches the English")


def template(chapter: str) -> None:
    nb = notebook_for(chapter)
    data = load(nb)
    for cid, entry in data["cells"].items():
        print(f"=== cell {cid}\n{entry['en'].rstrip()}\n")
    for i, text in enumerate(data.get("strings", {})):
        print(f"=== string {i}\n{text.rstrip()}\n")


def import_file(chapter: str, path: str) -> None:
    nb = notebook_for(chapter)
    data = load(nb)
    strings = list(data.get("strings", {}))
    sections = re.split(r"^=== (cell \S+|string \d+)[ \t]*\n", Path(
        path).read_text(), flags=re.M)
    if sections[0].strip():
        raise SystemExit(f"{path}: text before the first '=== ' header")
    n_cells = n_strings = 0
    for head, body in zip(sections[1::2], sections[2::2]):
        kind, ref = head.split()
        body = body.strip("\n")
        if kind == "cell":
            if ref not in data["cells"]:
                raise SystemExit(f"{path}: no cell {ref} in {nb.stem}")
            # keep the English cell's trailing newline convention
            end = "\n" if data["cells"][ref]["en"].endswith("\n") else ""
            data["cells"][ref]["zh"] = body.rstrip() + end
            n_cells += 1
        else:
            i = int(ref)
            if not 0 <= i < len(strings):
                raise SystemExit(f"{path}: string {i} out of range "
                                 f"(0..{len(strings) - 1})")
            en = strings[i]
            trail = en[len(en.rstrip()):]          # e.g. a final space
            data["strings"][en] = body.strip() + trail
            n_strings += 1
    save(nb, data)
    print(f"{nb.stem}: stored {n_cells} cells and {n_strings} strings")


def check(chapters: list[str]) -> int:
    nbs = _chosen(chapters)
    found = [p for nb in nbs for p in problems(nb)]
    print("\n".join(found) or "ok")
    return 1 if found else 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("export", "status", "stale", "check",
                                   "accept", "template", "import"):
        print(__doc__)
        return 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "export":
        for c in rest:
            export(c)
    elif cmd == "status":
        status(rest)
    elif cmd == "stale":
        stale(rest)
    elif cmd == "accept":
        accept(*rest)
    elif cmd == "template":
        template(*rest)
    elif cmd == "import":
        import_file(*rest)
    else:
        return check(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
