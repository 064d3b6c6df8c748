"""``make bench`` updates benchmarks/results.md section by section: the
tables it measures replace theirs, every other section stays."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "bench_run", ROOT / "benchmarks" / "run.py")
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)

FILE = """# Benchmark results

Intro.

## Book build (2026-12-01)

| old build |

## `make test` in a fresh clone (2026-12-03)

| kept |
"""


def test_a_measured_section_replaces_the_one_with_its_title():
    out = run.merge_sections(FILE, ["", "## Book build (2030-01-01)", "",
                                    "| new build |", ""])
    assert "| new build |" in out and "| old build |" not in out
    assert "| kept |" in out and out.startswith("# Benchmark results\n")
    # the replaced section keeps its place, before the kept one
    assert out.index("new build") < out.index("| kept |")


def test_a_new_section_is_appended_and_nothing_else_changes():
    out = run.merge_sections(FILE, ["", "## Chapter 99: new (x)", "", "| y |"])
    assert out.startswith(FILE.rstrip("\n"))
    assert out.rstrip().endswith("| y |")
    assert run.merge_sections(FILE, []) == FILE


def test_the_title_is_the_heading_without_its_details():
    assert run.section_key("## Chapter 3: explicit vs fused attention "
                           "(CPU, B=1, H=8)") == \
        "Chapter 3: explicit vs fused attention"
    assert run.section_key("## Book build") == "Book build"
