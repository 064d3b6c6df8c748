"""Write the Chinese edition's figure font, a subset of Noto Sans CJK SC.

Colab has no CJK font, and matplotlib ships none, so the course carries
its own: the simplified-Chinese face of Noto Sans CJK (SIL Open Font
License 1.1), cut down to
- the 3,755 characters of GB2312 level 1 (the common hanzi),
- every other Han character of the course's Chinese text
  (``course_lib/notebook/locale/zh/*.json``),
- CJK punctuation and full-width forms (U+3000-303F, U+FF00-FFEF),
- printable ASCII, the minus sign and the times sign: mathtext draws
  a label's text outside ``$...$``, and tick labels such as
  ``6×10⁻¹``, with the first font of ``font.family`` only.
Everything else (Greek, arrows, the middle dot, maths) falls back to
DejaVu Sans glyph by glyph. The OFL makes a subset a modified version
that may not keep the reserved name, so the font is renamed "Course CJK
SC". ``tests/test_figure_text.py`` fails when the Chinese text uses a
character the font lacks: rerun this script (it needs Debian's
``fonts-noto-cjk``; the result is committed, the build does not run it).

    python scripts/make_cjk_font.py
"""
from __future__ import annotations

import re
from pathlib import Path

from fontTools import subset
from fontTools.ttLib import TTCollection

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")
FACE = "Noto Sans CJK SC"
OUT = ROOT / "course_lib" / "notebook" / "fonts" / "CourseCJKSC-Regular.otf"
FAMILY = "Course CJK SC"
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


def gb2312_level1() -> set[str]:
    """The 3,755 hanzi of GB2312 level 1 (rows 16-55)."""
    chars = set()
    for row in range(0xB0, 0xD8):
        for cell in range(0xA1, 0xFF):
            try:
                chars.add(bytes([row, cell]).decode("gb2312"))
            except UnicodeDecodeError:
                pass                     # row 55 ends at cell 0xF9
    return chars


def course_han() -> set[str]:
    """Every Han character of the Chinese translations."""
    chars = set()
    for path in (ROOT / "course_lib/notebook/locale/zh").glob("*.json"):
        chars |= set(_HAN.findall(path.read_text(encoding="utf-8")))
    return chars


def main() -> None:
    collection = TTCollection(str(SOURCE))
    face = next(f for f in collection.fonts
                if f["name"].getDebugName(1) == FACE)
    text = (gb2312_level1() | course_han()
            | {chr(c) for c in range(0x3000, 0x3040)}
            | {chr(c) for c in range(0xFF00, 0xFFF0)}
            | {chr(c) for c in range(0x20, 0x7F)}
            | {"\u2212", "\u00d7"})   # tick labels' minus and times
    options = subset.Options()
    options.layout_features = ["*"]
    options.hinting = False
    options.name_IDs = ["*"]
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=[ord(c) for c in text])
    subsetter.subset(face)
    names = face["name"]
    for record in names.names:
        if record.nameID in (1, 16):
            record.string = FAMILY
        elif record.nameID == 4:
            record.string = f"{FAMILY} Regular"
        elif record.nameID == 6:
            record.string = "CourseCJKSC-Regular"
        elif record.nameID == 3:
            record.string = "CourseCJKSC-Regular;subset of Noto Sans CJK SC"
    if "CFF " in face:                   # the PostScript name inside CFF
        face["CFF "].cff.fontNames = ["CourseCJKSC-Regular"]
    face.save(str(OUT))
    print(f"{OUT.relative_to(ROOT)}: {len(text)} characters, "
          f"{OUT.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
