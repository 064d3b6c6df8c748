"""Write the Chinese edition's sources from the English book.

For every chapter, ``zh/book/<name>.ipynb`` is the English notebook with
- each markdown cell replaced by its Chinese translation
  (``course_lib/notebook/locale/zh/<name>.json``, see ``zh_translations.py``);
- one cell added after the Colab setup cell, ``set_language("zh")``,
  which makes the exercises and explorers speak Chinese (tagged
  ``zh-language`` and, like the setup cell, ``remove-cell``);
- the "Open in Colab" badge pointed at the Chinese notebook;
- the figure captions and alt texts of code cells (cell metadata) in
  Chinese;
- every code cell, with its outputs, unchanged, except the Colab form
  title of the exercise cells (``# @title ...``, which Colab shows in
  place of the hidden code), in Chinese. ``--execute`` then runs
  the notebooks (``run_notebooks.py``), so that the exercises' and
  explorers' outputs are the Chinese ones; every other output stays what
  the English run printed (``tests/test_zh_edition.py`` checks it).

``zh/book/intro.md`` and ``zh/book/glossary.md`` are the translated pages.
A chapter or page with any cell still untranslated is not written.
``zh/_config.yml`` and ``zh/_toc.yml`` are the English ones with the
Chinese title, author, part captions, the book chrome's words that the
themes' catalogues leave in English (``togglebutton_hint``, and
``ti_messages`` for ``book/_ext/theme_messages.py``), language
(``zh_CN``: Sphinx's Chinese search, which segments words with
``jieba``), and the repository path
``zh`` (the launch buttons open ``zh/book/*.ipynb``). ``zh/book/images``,
``_ext`` and ``references.bib`` are links to the English book's.

Chinese text is stored as the translators wrote it; here, a line break
between two Chinese characters is removed (HTML would show it as a space).

    python scripts/build_zh.py            # write zh/book/ (the notebooks
                                          # hold the English outputs until
                                          # they are run)
    python scripts/build_zh.py --execute ch08 glossary   # just these
    python scripts/build_zh.py --execute  # and run the notebooks (~7 min)
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import zh_translations as zt  # noqa: E402
from hide_exercise_cells import TITLE as EXERCISE_TITLE  # noqa: E402
from sync_setup_cells import BADGE_ALT  # noqa: E402
from course_lib.notebook.glue import fill_glue  # noqa: E402

OUT = ROOT / "zh" / "book"
LANGUAGE_CELL = ("# 中文版：练习和交互式图表使用中文。\n"
                 "from course_lib.notebook.i18n import set_language\n\n"
                 "set_language(\"zh\")")
# CJK characters and full-width punctuation on both sides of a newline
_CJK = "\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef"
_CJK_BREAK = re.compile(f"(?<=[{_CJK}])\\n(?=[{_CJK}])")
_FENCE = re.compile(r"(^```.*?^```[^\n]*$|\$\$.*?\$\$)", re.M | re.S)


#: Colab's title of a hidden exercise cell (hide_exercise_cells.TITLE)
ZH_EXERCISE_TITLE = "# @title 练习（答案在代码里：运行它，先别读）"


def zh_code(source):
    """A code cell's source (a string or a list of lines) with the
    exercise cells' Colab title in Chinese; the code itself unchanged."""
    text = source if isinstance(source, str) else "".join(source)
    if text.startswith(EXERCISE_TITLE + "\n"):
        text = ZH_EXERCISE_TITLE + text[len(EXERCISE_TITLE):]
    return text if isinstance(source, str) else text.splitlines(True)


def join_cjk_lines(text: str) -> str:
    """Remove line breaks between two Chinese characters, except inside
    fenced code and display maths."""
    parts = _FENCE.split(text)
    return "".join(p if i % 2 else _CJK_BREAK.sub("", p)
                   for i, p in enumerate(parts))


def zh_badge(text: str) -> str:
    """Point the Colab badge (and any Colab link) at the Chinese notebook,
    the badge's alt text in Chinese."""
    text = text.replace(f"[![{BADGE_ALT['en']}](",
                        f"[![{BADGE_ALT['zh']}](")
    return re.sub(r"(colab\.research\.google\.com/github/[^)\s\"]*?/blob/"
                  r"[^/)\s\"]+/)book/", r"\1zh/book/", text)


def chinese(entry: dict) -> str:
    return zh_badge(join_cjk_lines(entry["zh"]))


def language_cell() -> dict:
    return {"cell_type": "code", "execution_count": None, "id": "zh-language",
            "metadata": {"tags": ["zh-language", "remove-cell"]},
            "outputs": [], "source": LANGUAGE_CELL.splitlines(True)}


def zh_notebook(english: dict, cells: dict, strings: dict) -> dict:
    """The Chinese notebook for an English one (``cells``: translated
    markdown cells; ``strings``: English -> Chinese, for captions)."""
    nb = copy.deepcopy(english)
    out = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            cell["source"] = chinese(cells[cell["id"]]).splitlines(True)
        else:
            cell["source"] = zh_code(cell["source"])
        for mystnb, key, field, text in zt.figure_texts(cell):
            mystnb[key][field] = join_cjk_lines(strings[text])
        out.append(cell)
        if "colab-setup" in cell.get("metadata", {}).get("tags", []):
            out.append(language_cell())
    if not any(c.get("id") == "zh-language" for c in out):
        raise SystemExit("no colab-setup cell to put the language cell after")
    nb["cells"] = out
    fill_glue(nb)                   # the English run's numbers until run
    return nb


def complete(source: Path) -> dict | None:
    """The translations of ``source`` if every cell and string is
    translated and in step with the English (None otherwise)."""
    data = zt.load(source)
    en = zt.english_cells(source)
    cells = data["cells"]
    strings = data.get("strings", {})
    if any(cells.get(c, {}).get("zh") is None for c in en) \
            or any(not strings.get(t) for t in zt.reader_strings(source)) \
            or zt.problems(source):
        return None
    return data


TITLE = "Transformer 内部原理"
CAPTIONS = {
    "Part I: Why attention": "第一部分：为什么需要注意力",
    "Part II: Attention": "第二部分：注意力",
    "Part III: The model": "第三部分：模型",
    "Part IV: Inference and scale": "第四部分：推理与规模",
    "Part V: A real model": "第五部分：一个真实的模型",
    "Part VI: Scaling out": "第六部分：横向扩展",
    "Part VII: Serving": "第七部分：推理服务",
    "Reference": "参考",
}
# The book's author line (the footer: "作者： ...").
AUTHOR = "《Transformer 内部原理》编写组"
# sphinx-togglebutton's hint on every solution dropdown ("Click to show");
# its own catalogue is named zh-cn, which Sphinx's zh_CN never finds.
TOGGLE_HINTS = {"togglebutton_hint": "点击显示",
                "togglebutton_hint_hide": "点击隐藏"}
# The themes' messages their Chinese catalogues leave in English (or, for
# 列印成 PDF, in traditional Chinese), the search box's text and the names
# the templates write in English; shown through book/_ext/theme_messages.py.
# "notebook" as in the chapters.
THEME_MESSAGES = {
    "Search this book...": "搜索本书……",
    "Launch interactive content": "启动交互式内容",
    "Launch on": "启动于",
    "Color mode": "颜色模式",
    "System Settings": "跟随系统",
    "Print to PDF": "打印为 PDF",
    "Download notebook file": "下载 notebook 文件",
    "Breadcrumb": "导航路径",
    "Home": "首页",
    # the ¶ links beside headings, figures, glossary terms ...
    "Link to this heading": "链接到本标题",
    "Link to this image": "链接到本图",
    "Link to this term": "链接到本术语",
    "Link to this definition": "链接到本定义",
    "Link to this equation": "链接到本公式",
    "Link to this table": "链接到本表",
    "Link to this code": "链接到本代码",
    # names written into the theme's templates without gettext
    "Toggle primary sidebar": "显示或隐藏章节导航",
    "Toggle secondary sidebar": "显示或隐藏本页目录",
    "Main": "章节导航",
    "Page": "本页",
    "Colab logo": "Colab 标志",
    # the name sphinx-togglebutton's script gives its buttons
    "Toggle hidden content": "显示或隐藏内容",
}
HEADER = ("# Written by scripts/build_zh.py from the English book's file of "
          "the same name:\n# edit that one and run `make zh`.\n")


def config_texts() -> dict[str, str]:
    """The text of zh/_config.yml and zh/_toc.yml, from the English ones."""
    import yaml
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["title"] = TITLE
    config["author"] = AUTHOR
    config["exclude_patterns"] = [p for p in config["exclude_patterns"]
                                  if p != "zh"]
    config["repository"]["path_to_book"] = "zh"
    sphinx = config["sphinx"]["config"]
    sphinx["language"] = "zh_CN"
    sphinx["ti_language"] = "zh"
    # Chinese search: jieba cuts words, with the glossary's terms as its
    # user dictionary (a path from the repository root, where make runs)
    sphinx["html_search_options"] = {
        "dict": SEARCH_TERMS.relative_to(ROOT).as_posix()}
    # myst-nb's toggles of hidden code ("Show code cell source")
    sphinx["nb_code_prompt_show"] = "显示代码"
    sphinx["nb_code_prompt_hide"] = "隐藏代码"
    sphinx.update(TOGGLE_HINTS)
    sphinx["ti_messages"] = dict(THEME_MESSAGES)
    config["sphinx"]["local_extensions"]["theme_messages"] = "book/_ext"
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    for part in toc["parts"]:
        if part["caption"] not in CAPTIONS:
            raise SystemExit(f"no Chinese caption for {part['caption']!r}: "
                             f"add it to CAPTIONS in {Path(__file__).name}")
        part["caption"] = CAPTIONS[part["caption"]]
    return {name: HEADER + yaml.safe_dump(data, allow_unicode=True,
                                          sort_keys=False)
            for name, data in (("_config.yml", config), ("_toc.yml", toc))}


SEARCH_TERMS = OUT.parent / "search_terms.txt"


def search_terms() -> str:
    """The Chinese terms of the translated glossary, one per line: a
    user dictionary for jieba, so that the search index holds 键值缓存 as
    one word (by itself, jieba cuts it into 键值 and 缓存, and a reader's
    query for the term finds nothing). Alternatives written "A / B" or
    "A（B）" give one line each."""
    data = zt.load(ROOT / "book" / "glossary.md")
    text = (data["cells"].get("page") or {}).get("zh") or ""
    terms: dict[str, None] = {}
    block = re.search(r"```\{glossary\}(.*?)```", text, re.S)
    for line in (block.group(1) if block else "").splitlines():
        if not line or line[0].isspace() or line.startswith(":"):
            continue                                # definitions, options
        for part in re.split(r"\s*[/／、，]\s*|[（）()]", line):
            part = part.strip()
            if re.search(f"[{_CJK}]", part) and len(part) > 1 \
                    and " " not in part:
                terms.setdefault(part)
    return "".join(f"{t}\n" for t in terms)


def write_config() -> None:
    """zh/_config.yml, zh/_toc.yml and the links into the English book."""
    for name, text in config_texts().items():
        (OUT.parent / name).write_text(text, encoding="utf-8")
    SEARCH_TERMS.write_text(search_terms(), encoding="utf-8")
    for link in ("images", "_ext", "references.bib"):
        path = OUT / link
        if not path.is_symlink():
            path.symlink_to(Path("..") / ".." / "book" / link)


def write(execute: bool = False, only: list[str] | None = None
          ) -> list[Path]:
    """Write the Chinese sources; with ``only`` (name prefixes such as
    ``ch08`` or ``glossary``) just those, so that a small change does not
    rewrite (and, with ``execute``, re-run) the whole edition."""
    OUT.mkdir(parents=True, exist_ok=True)
    write_config()
    written, skipped = [], []
    for source in zt.sources():
        if only and not any(source.name.startswith(o) for o in only):
            continue
        data = complete(source)
        if data is None:
            skipped.append(source.name)
            continue
        target = OUT / source.name
        if source.suffix == ".md":
            target.write_text(chinese(data["cells"]["page"]),
                              encoding="utf-8")
        else:
            nb = zh_notebook(json.loads(source.read_text()), data["cells"],
                             data["strings"])
            target.write_text(json.dumps(nb, indent=1, ensure_ascii=False)
                              + "\n", encoding="utf-8")
        written.append(target)
    print(f"wrote {len(written)} files to {OUT.relative_to(ROOT)}"
          + (f"; not translated yet: {', '.join(skipped)}" if skipped else ""))
    if execute:
        from run_notebooks import run
        for path in written:
            if path.suffix == ".ipynb":
                print(f"{path.relative_to(ROOT)}: {run(path):.1f} s",
                      flush=True)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execute", action="store_true",
                        help="run the Chinese notebooks after writing them")
    parser.add_argument("only", nargs="*",
                        help="name prefixes (ch08, glossary): write only "
                             "these; default every chapter and page")
    args = parser.parse_args(argv)
    unknown = [o for o in args.only
               if not any(s.name.startswith(o) for s in zt.sources())]
    if unknown:
        parser.error(f"no chapter or page starts with {unknown}")
    write(execute=args.execute, only=args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
