"""Simulate a learner opening each chapter in a fresh Colab runtime.

A fresh virtual environment gets only what Colab preinstalls and the course
relies on: torch==2.13.0, numpy, matplotlib, tqdm, ipywidgets, ipykernel. It
does NOT get course_lib. Each chapter is copied alone into an empty folder
(Colab has no other file of the repository) and executed in a kernel of that
environment with ``COURSE_SIMULATE_COLAB=1``, so its setup cell takes the
Colab branch and pip-installs course_lib from ``COURSE_LIB_SOURCE`` (a copy
of this checkout's package, standing in for the repository URL). The chapter
must then run to the end, and torch must not have been reinstalled.

Colab shipped ipywidgets 7.7.1 for years and ships 8.x now; both run.
Slow (a few minutes): marked ``colab`` and run by ``make test-colab``.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
# The Chinese edition: each chapter once, with ipywidgets 8.
ZH_NOTEBOOKS = sorted((ROOT / "zh" / "book").glob("*.ipynb"))
CASES = [(nb, rt) for nb in NOTEBOOKS for rt in ("ipywidgets7",
                                                 "ipywidgets8")] + \
        [(nb, "ipywidgets8") for nb in ZH_NOTEBOOKS]
SIM_ROOT = ROOT / "_build" / "colab-sim"

# What each simulated runtime preinstalls. ipykernel<7 with ipywidgets 7:
# the old widget stack predates ipykernel 7's comm changes, as on old Colab.
RUNTIMES = {
    "ipywidgets7": ["torch==2.13.0", "numpy", "matplotlib", "tqdm",
                    "ipywidgets==7.7.1", "ipykernel<7"],
    "ipywidgets8": ["torch==2.13.0", "numpy", "matplotlib", "tqdm",
                    "ipywidgets>=8,<9", "ipykernel"],
}

pytestmark = pytest.mark.colab

# Appended to each chapter: press every control of every exercise and
# explorer the chapter displayed (IPython keeps them in ``Out``), with the
# runtime's own ipywidgets version.
DRIVE_WIDGETS = """
from course_lib.notebook.exercises import Exercise
from course_lib.notebook.widgets import Explorer
driven = 0
for obj in list(Out.values()):
    if isinstance(obj, Exercise):
        obj.widget()
        obj.check_button.click()          # unanswered: feedback, no error
        assert obj.feedback.value, obj
        obj.hint_button.click()
        obj.solution_button.click()
        assert obj.hint_box.value and obj.solution_box.value, obj
        driven += 1
    elif isinstance(obj, Explorer):
        obj.widget()
        for slider in obj.sliders.values():
            values = [v for _, v in slider.options]
            if len(values) > 1:
                before = obj.image.value
                slider.value = values[-1] if slider.value != values[-1] \\
                    else values[0]
                assert obj.image.value != before, obj
        driven += 1
from course_lib.notebook.i18n import get_language, tr
print("widgets driven:", driven, "language:", get_language(),
      "button:", tr("Check"))
"""


def _pip(python: Path, *args: str) -> str:
    result = subprocess.run([str(python), "-m", "pip", *args],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"pip {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout


def _runtime(name: str) -> Path:
    """A venv with the runtime's packages (built once, then reused)."""
    venv = SIM_ROOT / name
    python = venv / "bin" / "python"
    stamp = venv / ".ready"
    want = json.dumps(RUNTIMES[name])
    if not (stamp.exists() and stamp.read_text() == want):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        _pip(python, "install", "-q", "--upgrade", "pip")
        _pip(python, "install", "-q", *RUNTIMES[name])
        stamp.write_text(want)
    return python


def _package_source(tmp_path: Path) -> Path:
    """What `pip install git+URL` would see: the packaging files + library."""
    src = tmp_path / "course-repo"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "course_lib", src / "course_lib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return src


def _freeze(python: Path) -> dict:
    rows = json.loads(_pip(python, "list", "--format", "json"))
    return {r["name"].lower(): r["version"] for r in rows}


@pytest.mark.parametrize("notebook, runtime", CASES, ids=[
    f"{nb.parent.parent.name}/{nb.name}-{rt}" if nb.parent.parent.name == "zh"
    else f"{nb.name}-{rt}" for nb, rt in CASES])
def test_chapter_runs_in_fresh_colab(notebook, runtime, tmp_path):
    python = _runtime(runtime)
    # Every chapter starts from a runtime without course_lib.
    subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y",
                    "course_lib"], capture_output=True)
    before = _freeze(python)
    assert "course_lib" not in before and "course-lib" not in before

    kernels = tmp_path / "jupyter" / "kernels" / "colab-sim"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f",
                 "{connection_file}"],
        "display_name": f"Colab simulation ({runtime})",
        "language": "python",
        "env": {"COURSE_SIMULATE_COLAB": "1",
                "COURSE_LIB_SOURCE": str(_package_source(tmp_path)),
                "PYTHONPATH": ""},
    }))
    workdir = tmp_path / "content"      # Colab's empty working folder
    workdir.mkdir()
    shutil.copy(notebook, workdir / notebook.name)
    nb = nbformat.read(workdir / notebook.name, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(DRIVE_WIDGETS))

    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(tmp_path / "jupyter")
    try:
        NotebookClient(nb, kernel_name="colab-sim", timeout=600,
                       resources={"metadata": {"path": str(workdir)}},
                       store_widget_state=False).execute()
    finally:
        if old is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = old

    after = _freeze(python)
    assert after.get("course-lib") or after.get("course_lib"), \
        "the setup cell did not install course_lib"
    assert after["torch"] == before["torch"], "torch was reinstalled"
    assert after["ipywidgets"] == before["ipywidgets"]
    errors = [o for c in nb.cells for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert errors == []
    driven = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert "widgets driven:" in driven and "driven: 0" not in driven
    chinese = notebook.parent.parent.name == "zh"
    assert ("language: zh button: 检查" if chinese
            else "language: en button: Check") in driven, driven
    # Widgets were displayed as live views (the HTML copy is left out on
    # Colab so that the widget is what the learner sees).
    bundles = [o["data"] for c in nb.cells for o in c.get("outputs", [])
               if "data" in o and "application/vnd.jupyter.widget-view+json"
               in o["data"]]
    assert bundles, "no explorer or exercise widget was displayed"
    assert all("text/html" not in b for b in bundles)
