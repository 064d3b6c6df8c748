"""Which words of a Chinese page are English a reader should not meet.

Shared by the scan of the Chinese notebooks' saved widgets
(``tests/test_zh_widget_text.py``) and the walk of every built Chinese
page (``tests/browser/test_zh_pages.py``). Left out, because a learner
types or reads them as they are: code (``<code>``, ``<pre>``), maths
(``\\(...\\)``, ``$...$``), message fields (``{value}``), the English
gloss of a term in full-width parentheses ("输出投影（output
projection）", the book's convention at a term's first use), a name in
Chinese quotation marks (“naive”) and a string in ASCII quotes, code shown
as it is ('expression1: raise AssertionError'). What remains must be
Chinese but for:

- code-shaped words: with an underscore or a digit (``d_k``, ``top_p``,
  ``fp16``, ``L1``, ``SmolLM2``), two capitals or more (``MHA``, ``RoPE``,
  ``GiB``), one letter (a variable), an exercise's key (``ch03-scaling``);
- the words of :data:`ALLOWED`: names, units, a few function names and
  the terms the glossary keeps in English (each entry is needed by some
  page);
- in a text that has Chinese in it, an identifier of the chapter's code
  (a name in its code cells or in an exercise's code, or a one-word
  string the code uses as a name, ``kind="cnn"``): "头维度 d_k",
  "底数 base", the identifier beside its Chinese name; a capitalised
  word, which Chinese prose only borrows for a name ("Elman 递推式",
  "Adam 优化器", "Orca 系统"); a Latin phrase of at most five words inside
  full-width parentheses, the English gloss of a term even with Chinese
  beside it ("（attention sink，第 13 章会测量它）"); a title in book-title
  marks (《Turning Down the Heat》); a word touching a maths sign, a name
  in a formula written as plain text ("PE(pos, 2i)", "table[p]"). A
  text with no Chinese in it (a
  slider value, a label left untranslated) gets none of these
  allowances, so "causal" or "period 5" alone fails.
"""
import html
import io
import keyword
import re
import tokenize

# Latin words a Chinese page may show, by kind (case-sensitive).
ALLOWED = {
    # products and tools, people and theorems
    "Python", "Jupyter", "Colab", "Transformer", "Llama", "Mistral",
    "Mixtral", "Falcon", "Lite", "Kimi", "Hugging", "Face", "llama", "cpp",
    "Frobenius", "Eckart", "Young", "Saxena",
    # functions and names as code and maths spell them, outside the
    # chapter's code ("logistic sigmoid", "ceil(1023 / 2)", "词元 id",
    # the shape letter in "(..., Lq, 1)")
    "tanh", "logistic", "ceil", "id", "Lq",
    # maths in starter-code comments, which cannot use $...$ ("-inf",
    # "位置 mod W")
    "inf", "mod",
    # terms the glossary (zh/book/glossary.md) keeps in English
    "logits", "logit", "top-k", "top-p", "min-p", "rank", "all-reduce",
    "all-gather", "reduce-scatter", "n-gram", "gram", "top-1",
    # maths functions as plain text writes them ("ln 2", "max(0, x)",
    # "softmax 之前", "log-sum-exp")
    "softmax", "argmax", "log", "ln", "exp", "sum", "min", "max", "sin",
    "cos", "sqrt", "diag",
    # names as their code or checkpoints spell them: PyTorch's meta
    # device and flash kernel, YaRN's mscale, a SwiGLU FFN's gate, up and
    # down projections, a model's size in its name ("GPT-2 small")
    "meta", "flash", "mscale", "gate", "up", "down", "small",
    # words Chinese technical writing uses as they are, and tools named in
    # lower case (PyTorch's autograd, its gloo backend)
    "bug", "notebook", "autograd", "gloo",
    # units
    "byte", "kB",
    # the book's chrome: the language switch names the other language in
    # it, a keyboard shortcut names its key as the key is labelled
    "English", "Ctrl",
}

# The attributes whose text a reader or a screen reader meets.
READER_ATTRIBUTES = ("aria-label", "aria-valuetext", "alt", "placeholder",
                     "title")

# Chinese characters and full-width punctuation ("weight：(R, C)")
_CJK = re.compile("[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef]")
_MATH = re.compile(r"\\\(.*?\\\)|\\\[.*?\\\]|\$\$.*?\$\$|\$[^$]*\$", re.S)
_FIELD = re.compile(r"\{\w+(?::[^{}]*)?\}")
_GLOSS = re.compile(r"（[^（）\u3400-\u9fff]*）|“[^“”\u3400-\u9fff]*”"
                    r"|'[^'\u3400-\u9fff]{2,}'")
_WORD = re.compile(r"[A-Za-z0-9_]+(?:-[A-Za-z0-9_]+)*")
_KEY = re.compile(r"ch\d\d-[a-z0-9-]+")
_PARENS = re.compile(r"（[^（）]*）")
_ONE_WORD_STRING = re.compile(r"[rbuRBU]?(['\"])([A-Za-z_]\w*)\1")
_MATH_SIGN = re.compile(r"[()\[\]^_·/|=+−<>√Σ]")
_TITLE = re.compile(r"《[^《》]*》")
_LATIN_RUN = re.compile(r"[A-Za-z][\w.'-]*(?:[ \t]+[A-Za-z][\w.'-]*)*")


def comments(source: str) -> list[str]:
    """The comments of Python code, without their ``#``."""
    try:
        return [t.string.lstrip("#").strip() for t in tokenize.generate_tokens(
            io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return re.findall(r"#(.*)", source)


def identifiers(source: str) -> set[str]:
    """The names of Python code: its identifiers (not its keywords) and
    the one-word strings it uses as names (``kind="cnn"``,
    ``row["idle"]``), not its other strings or its comments."""
    found = set()
    try:
        for t in tokenize.generate_tokens(io.StringIO(source).readline):
            if t.type == tokenize.NAME:
                found.add(t.string)
            elif t.type == tokenize.STRING:
                word = _ONE_WORD_STRING.fullmatch(t.string)
                if word:
                    found.add(word.group(2))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        bare = re.sub(r"#[^\n]*|'[^'\n]*'|\"[^\"\n]*\"", " ", source)
        found |= set(re.findall(r"[A-Za-z_]\w*", bare))
    return {name for name in found if not keyword.iskeyword(name)}


def _without_glosses(parens: re.Match) -> str:
    """A full-width parenthesis without its Latin phrases of at most five
    words (the glosses of terms)."""
    return _LATIN_RUN.sub(
        lambda m: " " if len(m.group(0).split()) <= 5 else m.group(0),
        parens.group(0))


def _in_formula(text: str, word: re.Match) -> bool:
    """Whether ``word`` touches a maths sign, as a name in a formula
    written in plain text does ("PE(pos, 2i)", "table[p]", "(1 − ε)·one-hot")."""
    before = text[word.start() - 1:word.start()]
    after = text[word.end():word.end() + 1]
    return bool(_MATH_SIGN.fullmatch(before) or _MATH_SIGN.fullmatch(after))


def english_words(text: str, names: set[str],
                  has_chinese: bool | None = None) -> list[str]:
    """The words of ``text`` a Chinese page should not show; whether the
    text has Chinese in it is read from ``text`` unless given (a piece of
    a paragraph takes the paragraph's)."""
    if has_chinese is None:
        has_chinese = bool(_CJK.search(text))
    text = _GLOSS.sub(" ", _FIELD.sub(" ", _MATH.sub(" ", html.unescape(
        text))))
    if has_chinese:
        text = _TITLE.sub(" ", _PARENS.sub(_without_glosses, text))
    bad = []
    for found in _WORD.finditer(text):
        word = found.group(0)
        if (word in ALLOWED or word[:1].lower() + word[1:] in ALLOWED
                or _KEY.fullmatch(word)):
            continue
        if has_chinese and (word in names             # the identifier
                            or word[0].isupper()      # a name
                            or _in_formula(text, found)):
            continue
        parts = [p for p in word.split("-") if re.search("[A-Za-z]", p)]
        if all(p in ALLOWED or len(p) == 1 or re.search(r"[_\d]", p)
               or len(re.findall("[A-Z]", p)) >= 2
               or (has_chinese and p in names) for p in parts):
            continue
        bad.append(word)
    return bad


def raw_tex(text: str) -> list[str]:
    """TeX commands shown as typed, outside maths delimiters (a section
    title with maths, printed as the text of a link to it)."""
    return re.findall(r"\\[A-Za-z]+", _MATH.sub(" ", html.unescape(text)))
