import functools
import http.server
import json
import os
import pathlib
import threading

import numpy as np
import pytest

DATA = pathlib.Path(__file__).parent / "data"
OFFICIAL = DATA / "official"
CASES = json.loads((OFFICIAL / "cases.json").read_text())["cases"]

TINY = dict(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, classes=10)


def _in_ci():
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _missing_dependency_fails_in_ci(report):
    """With CI=true, a skip for a module that cannot be imported (pytest.importorskip) is a failure:
    CI installs every extra, so a missing one is a broken install, not an optional feature."""
    if _in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if "could not import" in reason:
            report.outcome = "failed"
            report.longrepr = f"CI=true and an optional dependency is missing (a skip elsewhere): {reason}"
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    return _missing_dependency_fails_in_ci((yield))


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    return _missing_dependency_fails_in_ci((yield))


def case_config(name, resized=False):
    """Builder kwargs of an official test case (the keys of cases.json)."""
    config = {k: v for k, v in CASES[name].items() if k not in ("resized_image_size", "note")}
    if resized:
        config["image_size"] = CASES[name]["resized_image_size"]
    return config


@pytest.fixture(autouse=True, scope="session")
def _exact_float32():
    """The official outputs are full float32: no TF32 on GPUs (a no-op on CPUs)."""
    import keras_vit

    keras_vit.exact_float32()


@pytest.fixture(autouse=True)
def _clean_keras_session():
    import keras

    keras.utils.clear_session()
    yield
    if keras.backend.backend() == "jax":  # a test that ran data/model parallel leaves no distribution set
        keras.distribution.set_distribution(None)


@pytest.fixture
def user_home(tmp_path, monkeypatch):
    """A new user's machine: HOME is an empty folder and KERAS_HOME is not set, so downloads take
    Keras' default cache (`~/.keras`) as they do for users."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KERAS_HOME", raising=False)
    return home


class LoopbackServer:
    """An HTTP server on 127.0.0.1 over a folder, recording the path of every request."""

    def __init__(self, root):
        self.requests = []
        outer = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                outer.requests.append(self.path)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def backend():
    return os.environ.get("KERAS_BACKEND", "tensorflow")
