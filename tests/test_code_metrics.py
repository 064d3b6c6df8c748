"""The decoder a learner reads stays small: the import closure of
``course_lib.model.decoder_lm`` (``benchmarks/code_metrics.py``) has at
most 7 files and 1,800 lines, and argument checks are at most 12 % of its
code lines."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "code_metrics", ROOT / "benchmarks" / "code_metrics.py")
metrics = importlib.util.module_from_spec(spec)
spec.loader.exec_module(metrics)


def test_the_decoder_fits_in_seven_files_and_1800_lines():
    files = metrics.closure("model.decoder_lm")
    assert "model.decoder_lm" in files and "model.mha" in files
    lines = sum(metrics.code_and_check_lines(metrics.module_path(m))[0]
                for m in files)
    assert len(files) <= 7, files
    assert lines <= 1800, lines


def test_argument_checks_are_at_most_12_percent_of_its_code():
    code = checks = 0
    for m in metrics.closure("model.decoder_lm"):
        _, c, k = metrics.code_and_check_lines(metrics.module_path(m))
        code, checks = code + c, checks + k
    assert checks <= 0.12 * code, (checks, code)


def test_the_counter_sees_checks_and_skips_docstrings(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('"""Doc."""\n'
                   "def f(x):\n"
                   '    """Doc."""\n'
                   "    # a comment\n"
                   "    check_int('x', x, minimum=1)\n"
                   "    if x > 3:\n"
                   "        raise ValueError('x')\n"
                   "    return x\n")
    # code lines: def, check, if, raise, return; checks: check, if, raise
    assert metrics.code_and_check_lines(src) == (8, 5, 3)
