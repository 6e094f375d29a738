import contextlib
import functools
import http.server
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import tarfile
import threading

import numpy as np
import pytest
from _claims import pytest_collection_modifyitems, pytest_runtest_protocol  # noqa: F401 (the hooks, _claims.py)

DATA = pathlib.Path(__file__).parent / "data"
OFFICIAL = DATA / "official"
CASES = json.loads((OFFICIAL / "cases.json").read_text())["cases"]

TINY = dict(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, classes=10)
TINY_WIDTHS = {k: TINY[k] for k in ("hidden_size", "mlp_dim", "num_heads", "num_layers")}  # tiny_variant's


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


def pytest_collection_finish(session):
    """What is alive once every test module is imported (the backends, keras, the test modules: about
    600k objects) lives to the end: freeze it out of the cyclic collector, whose every full pass (Python's
    own, and the gc.collect() that Keras runs in quantize) would walk it again, ~0.25 s a pass."""
    import gc

    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _clean_keras_session():
    import keras

    # Keras' global state (layer names, the TF graph, dynamo's cache) reset before each test, without the
    # full gc.collect() of free_memory (a pass over the whole session's heap per test; Python's own
    # collector still frees cycles)
    keras.utils.clear_session(free_memory=False)
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
def small_disk(tmp_path):
    """A real 8 MiB filesystem (a tmpfs: root, as CI runs; skipped where it cannot be mounted)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)],
                                           capture_output=True).returncode:
        pytest.skip("a tmpfs cannot be mounted here (not root)")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def fill(disk, leave):
    """Fills the filesystem of the folder `disk` with a file `disk`/filler, leaving about `leave` bytes free."""
    stat = os.statvfs(disk)
    (disk / "filler").write_bytes(b"\0" * max(stat.f_bavail * stat.f_frsize - leave, 0))


def photos(size, n=3):
    """scikit-image's photographs (astronaut, coffee, chelsea) as uint8 (n, h, w, 3) at `size` (int or (h, w))."""
    pytest.importorskip("skimage")
    from skimage import data, transform

    h, w = (size, size) if isinstance(size, int) else size
    images = [data.astronaut(), data.coffee(), data.chelsea()][:n]
    return np.stack([(transform.resize(im, (h, w), anti_aliasing=True) * 255).round().astype("uint8") for im in images])


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@contextlib.contextmanager
def shapes_only():
    """Models built inside have their variables' shapes and no values (Keras' deferred initialization, as
    inside a stateless scope), for facts about shapes alone (parameter counts, key layouts): drawing ViT-H/14's
    632M initial values is most of a build on this machine. The variables never get values: they are dropped
    from Keras' list of variables waiting for one, which the next scope would otherwise fill."""
    import keras
    from keras.src.backend.common import global_state

    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
    finally:
        global_state.set_global_attribute("uninitialized_variables", [])


def tiny_variant(monkeypatch, name="ViT_Ti16"):
    """The factory `name` builds TINY's depth and widths for the rest of the test (a factory reads the variant
    table when called): for runs that check a command's plumbing by a released model's name, not its 12 layers."""
    import dataclasses

    from keras_vit.configs import VARIANTS

    monkeypatch.setitem(VARIANTS, name, dataclasses.replace(VARIANTS[name], **TINY_WIDTHS))


def backend():
    return os.environ.get("KERAS_BACKEND", "tensorflow")


def assert_resumed_equals_whole(whole, cut, resumed):
    """The run resumed in `cut` (its report `resumed`) ends as the uninterrupted run in `whole` did: the
    weights of model.keras and every metric of the history, within 1e-6."""
    import json

    import keras

    uninterrupted, resumed_model = (keras.saving.load_model(d / "model.keras") for d in (whole, cut))
    for a, b in zip(uninterrupted.weights, resumed_model.weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(b), keras.ops.convert_to_numpy(a), atol=1e-6)
    history = json.loads((whole / "report.json").read_text())["history"]
    assert set(resumed["history"]) == set(history)
    for key, values in history.items():
        np.testing.assert_allclose(resumed["history"][key], values, atol=1e-6)


def tensorflows_file(format, **kwargs):
    """Whether this lane's backend hands `format` (with `writer`'s options: any_size, naflex, batch_size) to
    TensorFlow, which writes it in a fresh process: the one rule behind every export test that leaves such
    a file's full checks to the tensorflow lane."""
    from keras_vit.export import writer

    return backend() != "tensorflow" and writer(backend(), format, **kwargs) == "tensorflow"


def mpiexec(options, argv, env, timeout=400):
    """Runs `argv` (after python) on 2 processes under Open MPI's `mpiexec` (the venv's, the `test` extra's) with
    its `options` and the environment `env`; returns (exit status, output)."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    command = [str(pathlib.Path(sys.executable).parent / "mpiexec"), *root, "--oversubscribe", *options, "-n", "2",
               sys.executable, *map(str, argv)]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    return done.returncode, done.stdout


def outputs_of(model, x):
    """`model` on `x` as numpy, the cheaper way on this backend: on JAX one compiled call a shape
    (`predict_on_batch`: an eager call compiles each op at each new shape), elsewhere the eager call
    (TensorFlow's `predict` would trace a step again for each model and shape)."""
    import keras

    if keras.backend.backend() == "jax":
        return model.predict_on_batch(x)
    return keras.tree.map_structure(keras.ops.convert_to_numpy, model(x))


def once_on_tensorflow(why):
    """The mark of a test that runs once, on the tensorflow lane of `make test` (the torch runs carry the
    backend_independent and one_backend tests): `why` the other lanes need not run it."""
    return pytest.mark.skipif(backend() != "tensorflow", reason=f"once, on the tensorflow lane: {why}")


CIFAR10_ARCHIVE = "cifar-10-binary.tar.gz"
CIFAR10_NAMES = [f"class_{i}" for i in range(10)]


def _cifar10_records(images, labels):
    """The CIFAR binary format: per image one label byte, then the R, G and B planes (32 x 32 each)."""
    return b"".join(bytes([label]) + np.transpose(image, (2, 0, 1)).tobytes() for image, label in zip(images, labels))


def _write_cifar10_archive(path, splits):
    with tarfile.open(path, "w:gz") as archive:
        def add(name, payload):
            info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))

        add("batches.meta.txt", "\n".join(CIFAR10_NAMES).encode() + b"\n")
        for name, (images, labels) in splits.items():
            add(name, _cifar10_records(images, labels))


@pytest.fixture
def cifar10_mirror(tmp_path, monkeypatch):
    """Serves a small CIFAR-10 archive in the official format (a tarball of
    `cifar-10-batches-bin/*.bin` records) and points tensorflow-datasets' builder at it; yields
    (server, test images, test labels)."""
    from tensorflow_datasets.image_classification import cifar

    rng = np.random.default_rng(0)
    splits = {f"data_batch_{i}.bin": (rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8), [i, i + 1])
              for i in range(1, 6)}
    test_images = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    splits["test_batch.bin"] = (test_images, [7, 8, 9])
    root = tmp_path / "served-cifar10"
    root.mkdir()
    _write_cifar10_archive(root / CIFAR10_ARCHIVE, splits)
    server = LoopbackServer(root)
    info = cifar.Cifar10._cifar_info.fget
    monkeypatch.setattr(cifar.Cifar10, "_cifar_info",
                        property(lambda self: info(self)._replace(url=f"{server.url}/{CIFAR10_ARCHIVE}")))
    yield server, test_images, [7, 8, 9]
    server.close()


def python_without(tmp, hidden):
    """An interpreter seeing this environment's packages but those whose names match the regular
    expression `hidden` (as a machine without them has it; the package under test is not installed
    there either: run it with the repository as the working folder or on PYTHONPATH)."""
    site = sysconfig.get_paths()["purelib"]
    farm = tmp / "packages"
    farm.mkdir()
    for name in os.listdir(site):
        if not re.match(hidden, name) and not name.endswith(".pth"):
            os.symlink(os.path.join(site, name), farm / name)
    venv = tmp / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(purelib, "packages.pth"), "w") as f:
        f.write(f"{farm}\n")
    return str(python)


def photo_folder(root, per_class=4, size=(120, 160), formats=("jpg", "png")):
    """Writes an image folder of scikit-image's photographs: classes "astronaut", "cat" (chelsea) and
    "coffee", `per_class` random crops of each resized to `size` (h, w), saved in turn as `formats`,
    the last of each class in a nested folder. Returns `root`."""
    pytest.importorskip("skimage")
    from PIL import Image
    from skimage import data

    rng = np.random.default_rng(0)
    for name, image in (("astronaut", data.astronaut()), ("cat", data.chelsea()), ("coffee", data.coffee())):
        for i in range(per_class):
            h, w = image.shape[:2]
            side = int(min(h, w) * rng.uniform(0.5, 0.9))
            top, left = rng.integers(0, h - side + 1), rng.integers(0, w - side + 1)
            crop = Image.fromarray(image[top:top + side, left:left + side]).resize(size[::-1], Image.BICUBIC)
            folder = root / name / ("more" if i == per_class - 1 else "")
            folder.mkdir(parents=True, exist_ok=True)
            crop.save(folder / f"{name}_{i}.{formats[i % len(formats)]}")
    return root


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """A small ViT taking uint8 images, every weight random, saved as .keras: what `keras-vit finetune
    --weights` continues from (10 classes: the folder's head replaces it)."""
    import keras

    import keras_vit

    keras.utils.set_random_seed(1)
    model = keras_vit.VisionTransformer(**TINY, input_dtype="uint8")
    for i, v in enumerate(model.weights):
        v.assign(np.random.default_rng(i).normal(0, 0.2, v.shape).astype("float32"))
    path = tmp_path_factory.mktemp("start") / "start.keras"
    model.save(path)
    return str(path)



@contextlib.contextmanager
def from_a_terminal(argv, **kwargs):
    """`argv` started as a terminal starts it, stdout and stderr piped (text), killed when the block ends: with
    Python's SIGINT handler, which a background job of a non-interactive shell (CI's lanes) would otherwise
    inherit ignored. SIGINT is handled in this process while the child starts (an exec resets a handled signal
    to its default; not a `preexec_fn`, which runs Python in a fork of this multithreaded process), and the
    child dumps its threads' tracebacks on SIGABRT (`ctrl_c`)."""
    import signal

    env = dict(kwargs.pop("env", None) or os.environ, PYTHONFAULTHANDLER="1")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        child = subprocess.Popen(argv, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, **kwargs)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        yield child
    finally:
        child.kill()
        child.communicate()


def ctrl_c(child, timeout=120):
    """Sends `child` SIGINT, as Ctrl-C in its terminal does; returns its stderr once it has ended. A child
    still running after `timeout` seconds fails the test with its threads' tracebacks."""
    import signal

    child.send_signal(signal.SIGINT)
    try:
        return child.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGABRT)  # faulthandler (from_a_terminal) prints every thread's traceback
        err = child.communicate()[1]
        pytest.fail(f"still running {timeout} s after SIGINT; its stderr, tracebacks last:\n{err[-20000:]}")
