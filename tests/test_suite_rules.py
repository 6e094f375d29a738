"""The suite's own rules: with CI=true a missing optional dependency fails, and every test has a time limit."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.backend_independent


def test_missing_optional_dependency_skips_locally_and_fails_in_ci(tmp_path):
    suite = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py")
    (tmp_path / "conftest.py").write_text(
        f"import importlib.util, sys\nsys.path.insert(0, {os.path.dirname(suite)!r})\n"  # its _claims.py beside it
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {suite!r})\n"
        "suite = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(suite)\n"
        "pytest_runtest_makereport = suite.pytest_runtest_makereport\n"
        "pytest_make_collect_report = suite.pytest_make_collect_report\n")
    (tmp_path / "test_needs_a_module.py").write_text(
        "import pytest\n\n\ndef test_inside():\n    pytest.importorskip('keras_vit_no_such_module')\n")
    (tmp_path / "test_module_level.py").write_text(
        "import pytest\n\npytest.importorskip('keras_vit_no_such_module')\n\n\ndef test_never():\n    pass\n")
    (tmp_path / "test_plain_skip.py").write_text(
        "import pytest\n\n\ndef test_skipped():\n    pytest.skip('not for this backend')\n")

    def run(ci):
        env = {**os.environ, "CI": ci}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:timeout",
                               "--continue-on-collection-errors", str(tmp_path)],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        return proc.stdout.strip().splitlines()[-1]

    assert "3 skipped" in run("false")
    summary = run("true")
    assert "1 failed" in summary and "1 error" in summary and "1 skipped" in summary, summary  # the plain skip stays one


def test_every_test_has_a_time_limit(request):
    assert float(request.config.getini("timeout")) == 300  # pytest-timeout reads it; an unknown key would raise
