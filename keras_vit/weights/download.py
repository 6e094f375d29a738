"""Fetching released checkpoints into the Keras cache, so that no partial or corrupt file is ever
taken for a good one."""

import errno
import os
import zipfile

from keras_vit import writer_lock
from keras_vit.fileio import check_free_space, full_disk_named, temporary_folder
from keras_vit.weights.registry import BUCKET_URL as DEFAULT_BASE_URL

# A mirror of the official bucket (same folder layout), e.g. an internal server.
BASE_URL_ENV = "KERAS_VIT_BASE_URL"
CHUNK_BYTES = 1 << 20  # a download is written this much at a time
DOWNLOAD_TIMEOUT = 60  # seconds without an answer from the server before a download fails


def keras_home():
    """Keras' own rule, read at call time: `$KERAS_HOME` when set, else `~/.keras`, or `/tmp/.keras`
    when the home folder is not writable (Keras exports no accessor for it)."""
    if "KERAS_HOME" in os.environ:
        return os.path.expanduser(os.environ["KERAS_HOME"])
    base = os.path.expanduser("~")
    return os.path.join(base if os.access(base, os.W_OK) else "/tmp", ".keras")


def cache_dir():
    """`<keras home>/models/keras_vit`, by default `~/.keras/models/keras_vit`."""
    return os.path.join(keras_home(), "models", "keras_vit")


def resolve_url(url):
    base = os.environ.get(BASE_URL_ENV)
    if base and url.startswith(DEFAULT_BASE_URL):
        return base.rstrip("/") + url[len(DEFAULT_BASE_URL):]
    return url


def is_complete_zip(path):
    """True when `path` is a zip whose central directory and member CRCs are intact."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None and bool(archive.namelist())
    except (zipfile.BadZipFile, OSError, EOFError):
        return False


def fetch(url, filename, directory=None):
    """The local path of `url`, downloaded once into the cache.

    A cached file is trusted only when it is a complete zip archive; a download goes to a
    temporary file beside the cache and is moved into place only once it checks out. Processes that
    fetch the same file at once take turns (`keras_vit.writer_lock`): one downloads, the others wait and
    read its file. A full disk (before the download, from its Content-Length, or midway) raises OSError ENOSPC
    in one line naming the file and its filesystem, the temporary removed and nothing cached.

    Args:
        url: where the file is (`KERAS_VIT_BASE_URL` redirects the official bucket's URLs to a mirror).
        filename: its name in the cache.
        directory: the cache folder (default `cache_dir()`).
    """
    directory = directory or cache_dir()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, filename)
    if os.path.exists(path) and is_complete_zip(path):  # cached: no lock (the cache may be read-only)
        return path
    # one process downloads a file: another waits for it (said once), then finds the finished file
    with writer_lock.hold(path, wait=True):
        return _fetch(url, filename, path)


def _fetch(url, filename, path):
    """`fetch` holding the file's lock."""
    if os.path.exists(path):
        if is_complete_zip(path):
            return path
        os.remove(path)  # a corrupt or truncated leftover: never trusted
    url = resolve_url(url)
    with temporary_folder(path) as tmp:  # a download killed midway is removed by the next fetch of the file
        part = os.path.join(tmp, filename)
        try:
            _download(url, part, path)
        except Exception as err:
            if getattr(err, "errno", None) == errno.ENOSPC:  # said as check_free_space says it, exit 1
                raise
            raise OSError(
                f"could not download {url}: {err}\nTo use a mirror of the official bucket (same folder layout), "
                f"set {BASE_URL_ENV}=<its URL>; or download the file yourself and pass its path as weights=."
            ) from None
        if not is_complete_zip(part):
            raise ValueError(
                f"download of {url} is not a complete .npz archive ({os.path.getsize(part)} bytes; "
                "interrupted or corrupt); nothing was cached, call again to retry"
            )
        os.replace(part, path)
    return path


def _download(url, part, path):
    """Streams `url` into the file `part` (a temporary of the cache's `path`), with a progress bar. A disk
    without room for its Content-Length is refused before the first byte, and one that fills meanwhile is
    named (`check_free_space`, `full_disk_named`: OSError ENOSPC naming `path` and its filesystem)."""
    import urllib.request

    import keras

    print(f"Downloading data from {url}")
    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT) as response:
        length = response.headers.get("Content-Length", "")
        total = int(length) if length.isdigit() else None
        what = f"the download of {url} to {path}"
        if total is not None:
            check_free_space(path, total, what)
        progress = keras.utils.Progbar(total, unit_name="bytes")
        done = 0
        with full_disk_named(path, what), open(part, "wb") as f:
            for chunk in iter(lambda: response.read(CHUNK_BYTES), b""):
                f.write(chunk)
                done += len(chunk)
                progress.update(done)
