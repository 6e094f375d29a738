"""Files in and out: every write is atomic (a temporary file beside the target, then a rename), so
an interrupted or failed write never leaves a half-written file where a good one is expected.

A temporary is named `.NAME.HOST-PID.XXXXXXXX.tmp...`: hidden, beside the target NAME, with the host and
process that writes it. A write that fails removes its temporary; one killed outright (SIGKILL, power loss)
cannot, so the next write of the same target removes the temporaries of it that a process of this host
wrote and that is gone (another host's are left alone: its processes cannot be seen from here)."""

import contextlib
import errno
import json
import os
import pathlib
import re
import shutil
import socket
import tempfile

import numpy as np

from keras_vit.configs import pair


def host_name():
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"


def _temporaries(path):
    """The prefix of this process' temporaries of `path`, and a pattern of any process' (host, pid, tempfile's
    8 random characters)."""
    base = f".{os.path.basename(path)}."
    pattern = re.compile(re.escape(base) + r"(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)\.[a-z0-9_]{8}\.tmp")
    return f"{base}{host_name()}-{os.getpid()}.", pattern


def process_alive(pid):
    if os.name == "nt":  # os.kill(pid, 0) would end the process there: no cleaning on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's live process
        return True
    return True


def remove_stale_temporaries(path):
    """Removes the temporaries of `path` (files or folders) whose writer, a process of this host, is gone.
    Returns the names removed."""
    folder = os.path.dirname(os.path.abspath(path))
    _, pattern = _temporaries(path)
    removed = []
    if not os.path.isdir(folder):
        return removed
    host = host_name()
    for name in os.listdir(folder):
        match = pattern.match(name)
        if not match or match.group("host") != host or process_alive(int(match.group("pid"))):
            continue
        stale = os.path.join(folder, name)
        try:
            shutil.rmtree(stale) if os.path.isdir(stale) and not os.path.islink(stale) else os.remove(stale)
            removed.append(name)
        except OSError:
            pass  # gone meanwhile
    return removed


def _error(kind, code, message):
    """An exception `kind` (OSError or a subclass) with errno `code` that reads as `message` alone (no
    "[Errno N]" before it: the CLI prints it as its one line)."""
    err = kind(message)
    err.errno = code
    return err


def check_writable(path, what=None, folder=False):
    """`path` made absolute, once it is known that it can be written: refused by name, before anything is
    trained, converted or exported, when it cannot be.

    The nearest folder above `path` that exists must be a folder (not a file) that this process may write
    in (not on a read-only filesystem, not without write permission); so must `path` itself when it is an
    existing folder to write into; and `path`, if it exists, must be of the kind expected.

    Args:
        path: the file or folder to be written (it and the folders above it need not exist yet).
        what: how the messages name it, e.g. "--out" (default "the file" or "the folder").
        folder: True for a folder, False for a file, None for either.

    Raises:
        IsADirectoryError: a file is expected and `path` is a folder.
        NotADirectoryError: a folder is expected and `path` is a file, or a folder above it is a file.
        PermissionError: no permission to write where `path` goes (errno EACCES).
        OSError: that place is on a read-only filesystem (errno EROFS).
    """
    path = os.path.abspath(os.fspath(path))
    what = what or ("the folder" if folder else "the file")
    if folder is False and os.path.isdir(path):
        raise IsADirectoryError(f"cannot write {what} {path}: it is a folder (expected a file path)")
    if folder is True and os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(f"cannot write {what} {path}: it is a file (expected a folder path)")
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise NotADirectoryError(f"cannot write {what} {path}: {parent} is a file, not a folder")
    for place in ([path] if folder is not False and os.path.isdir(path) else []) + [parent]:
        if os.access(place, os.W_OK | os.X_OK):
            continue
        if hasattr(os, "statvfs") and os.statvfs(place).f_flag & os.ST_RDONLY:
            raise _error(OSError, errno.EROFS, f"cannot write {what} {path}: {place} is on a read-only filesystem "
                                               f"(mounted at {_filesystem(place)})")
        raise _error(PermissionError, errno.EACCES, f"cannot write {what} {path}: no permission to write in the "
                                                    f"folder {place}")
    return path


def _check_destination(path, folder):
    """`path` made absolute and checked (`check_writable`), its folder made, the stale temporaries of it
    removed."""
    path = check_writable(path, folder=folder)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    remove_stale_temporaries(path)
    return path


@contextlib.contextmanager
def atomic_write(path, suffix=None):
    """Yields a temporary path in `path`'s folder; moves it onto `path` when the block succeeds and
    removes it when the block fails (see the module docstring for a writer that is killed).

    The temporary name keeps `path`'s extensions (or `suffix`), for writers that check them
    (Keras' `.weights.h5`, numpy's `.npz`). The file gets the usual permissions (0666 less umask).
    """
    path = _check_destination(path, folder=False)
    suffix = "".join(pathlib.Path(path).suffixes) if suffix is None else suffix
    prefix, _ = _temporaries(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=prefix, suffix=".tmp" + suffix)
    os.close(fd)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


@contextlib.contextmanager
def temporary_folder(path, folder=None):
    """Yields a new empty folder beside `path` (a file or, `folder` True, a folder to write), named as
    `atomic_write`'s temporaries (so that a later write of `path` removes it if its writer is killed); it is
    removed when the block ends unless the block moved it away."""
    path = _check_destination(path, folder)
    prefix, _ = _temporaries(path)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(path), prefix=prefix, suffix=".tmp")
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _exchange(a, b):
    """Swaps the folders `a` and `b` in one step (Linux' renameat2 RENAME_EXCHANGE); False where the system
    cannot."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        return False
    at_cwd, exchange = -100, 2
    return libc.renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), exchange) == 0


@contextlib.contextmanager
def atomic_folder(path, replaceable=None):
    """Yields a new empty folder beside `path` to write into; when the block succeeds it takes `path`'s
    place in one step, and when it fails it is removed.

    A folder already at `path` is exchanged with the new one in one step where the system can (Linux),
    else moved aside first (a kill between the two renames leaves no folder at `path`, the old one in a
    hidden temporary beside it), then removed. It is replaced only when it is empty or holds nothing but
    the names in `replaceable` (a user's folder of other files is never removed): otherwise FileExistsError.
    """
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        others = sorted(set(os.listdir(path)) - set(replaceable or ()))
        if others:
            raise FileExistsError(f"{path} already holds {', '.join(others[:5])}{' ...' * (len(others) > 5)}, "
                                  "which this writer did not write: pick a new or empty folder")
    with temporary_folder(path, folder=True) as tmp:
        yield tmp
        if not os.path.isdir(path):
            os.replace(tmp, path)
            return
        if not _exchange(tmp, path):
            with temporary_folder(path) as aside:
                os.replace(path, os.path.join(aside, "old"))
                os.replace(tmp, path)
                return
    # exchanged: the old folder is at `tmp`, removed as the temporary folder it now is


# a Keras weights file of n bytes of arrays takes about n * this + H5_OVERHEAD (names, attributes, alignment)
H5_FACTOR, H5_OVERHEAD = 1.1, 256 * 1024
# an .npz archive of n bytes of arrays takes about n + NPZ_OVERHEAD (a zip entry and a .npy header each)
NPZ_OVERHEAD = 64 * 1024


def variables_bytes(variables):
    """Bytes of the arrays of `variables` (Keras variables, or anything with shape and dtype)."""
    return int(sum(int(np.prod(v.shape)) * np.dtype(str(getattr(v.dtype, "name", v.dtype))).itemsize
                   for v in variables))


def h5_file_bytes(variables):
    """About the bytes of an HDF5 weights file of `variables` (Keras variables or arrays)."""
    return int(variables_bytes(variables) * H5_FACTOR) + H5_OVERHEAD


def weights_file_bytes(model, optimizer=False):
    """About the bytes of `model`'s weights file (`save_weights`, or the weights inside a `.keras`), with its
    optimizer's state when `optimizer` (what a training backup holds)."""
    variables = list(model.weights)
    if optimizer and getattr(model, "optimizer", None) is not None:
        variables += list(model.optimizer.variables)
    return h5_file_bytes(variables)


def _filesystem(path):
    """The mount point of the filesystem that holds `path` (or would, for a path not made yet)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def _no_space(path, what, needed=None):
    """The one-line OSError(ENOSPC) of a full disk: `what` (default `path`), its filesystem, the space
    `needed` (bytes, when known) and free."""
    mount = _filesystem(path)
    free = shutil.disk_usage(mount).free
    need = "the disk filled while it was written (nothing of it was kept), " if needed is None else \
        f"it needs about {needed / 2**20:.1f} MiB, "
    return _error(OSError, errno.ENOSPC, f"no space left for {what or path}: {need}{free / 2**20:.1f} MiB are free "
                                         f"on the filesystem at {mount}")


def check_free_space(path, needed, what=None):
    """Raises OSError(ENOSPC) naming `path`, its filesystem and the space `needed` (bytes) and free, when
    the filesystem that holds (or will hold) `path` has less free: checked before a write whose size is
    known, so a full disk refuses it instead of failing inside a writer (h5py ends the process then)."""
    if shutil.disk_usage(_filesystem(path)).free < needed:
        raise _no_space(path, what, needed)


@contextlib.contextmanager
def full_disk_named(path, what=None):
    """A full disk met inside the block (a write of `path` whose size was not known before, or a disk that
    filled meanwhile) raised as `check_free_space` words it: one OSError(ENOSPC) naming `what` (default
    `path`) and its filesystem, instead of the writer's bare "[Errno 28] No space left on device"."""
    try:
        yield
    except OSError as err:
        if err.errno != errno.ENOSPC or str(err).startswith("no space left for "):
            raise
        raise _no_space(path, what) from None


def not_npz(path):
    """Why the file `path` is no `.npz` archive, or None when it is a zip archive. Checked before `np.load`,
    which takes anything else for a pickle and answers with advice to unpickle it."""
    import zipfile

    if zipfile.is_zipfile(path):
        return None
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(b"\x93NUMPY"):
        return "it holds a single .npy array, not an .npz archive of named arrays"
    return f"got {os.path.getsize(path)} bytes that are no zip archive" + (f", starting {head!r}" if head else "")


def load_image(path, image_size):
    """Reads an image file as RGB resized (bicubic) to `image_size` (int or (h, w)): float32 in [0, 255]."""
    from PIL import Image, UnidentifiedImageError

    h, w = pair(image_size, "image_size")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"image file not found: {path}")
    try:
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB").resize((w, h), Image.Resampling.BICUBIC), dtype=np.float32)
    except (UnidentifiedImageError, OSError) as err:
        raise ValueError(f"cannot read {path} as an image: {err}") from None


def write_json(path, obj):
    """Writes `obj` as indented JSON, atomically (numpy scalars as numbers)."""
    with atomic_write(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=float)
        f.write("\n")
