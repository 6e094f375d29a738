"""What a scan learned of each file of a folder, kept so that the next start reads no file again: `load`
and `save` a table of (relative path, size, modification time, height, width, decoder or reason) per file,
in `<keras home>/keras_vit/scans/` (one `.npz` per folder, written atomically, read without pickle).

A cached row is used only when the file's size and modification time (nanoseconds) are the ones it was
made from, so a changed, added or removed file is read again; as git does for its index, a row whose file
was modified less than `RACY_SECONDS` before the scan is not trusted (a file rewritten at the same size
within the file system's clock tick would keep its modification time); a cache that cannot be read, or that was
made for another folder, another `max_pixels` or a weaker check, is rebuilt (said once, as a warning).
Each row costs about 60 bytes in memory beside its path, so a million files take about 100 MB.
"""

import hashlib
import os
import warnings
import zipfile

import numpy as np

from keras_vit.fileio import atomic_write
from keras_vit.weights.download import keras_home

VERSION = 1

# a file modified this close before its scan may change again within the same clock tick: read it again
RACY_SECONDS = 2



def scans_dir():
    """`<keras home>/keras_vit/scans`, by default `~/.keras/keras_vit/scans`."""
    return os.path.join(keras_home(), "keras_vit", "scans")


def _identity(root, max_pixels, verify):
    return f"{os.path.realpath(root)}\0{int(max_pixels)}\0{verify}\0{VERSION}"


def cache_path(root, max_pixels, verify):
    """The cache file of folder `root` scanned with `max_pixels` at level `verify`."""
    digest = hashlib.sha256(_identity(root, max_pixels, verify).encode("utf-8", "surrogateescape")).hexdigest()
    return os.path.join(scans_dir(), digest[:24] + ".npz")


def _pack(strings):
    """(bytes blob, end offsets) of a list of strings."""
    raw = [s.encode("utf-8", "surrogateescape") for s in strings]
    return np.frombuffer(b"".join(raw), np.uint8), np.cumsum([len(r) for r in raw], dtype=np.int64)


def _unpack(blob, ends):
    data = blob.tobytes()
    starts = np.concatenate([[0], ends[:-1]]).tolist()
    return [data[a:b].decode("utf-8", "surrogateescape") for a, b in zip(starts, ends.tolist())]


def load(root, max_pixels, verify):
    """{relative path: ((size, mtime_ns), facts, reason)} of the cached scan of `root` (see `save`), or {}
    when there is none; a cache that cannot be read or belongs to another folder is said and ignored."""
    path = cache_path(root, max_pixels, verify)
    if not os.path.exists(path):
        return {}
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["identity"]) != _identity(root, max_pixels, verify):
                raise ValueError("it was made for another folder or check")
            paths, reasons = _unpack(z["paths"], z["path_ends"]), _unpack(z["reasons"], z["reason_ends"])
            stats, facts = z["stats"].tolist(), z["facts"].tolist()
            trusted_before = int(z["scanned_ns"]) - RACY_SECONDS * 10**9
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        warnings.warn(f"the scan cache {path} cannot be used ({err}); the folder is read again and the cache "
                      "rebuilt", stacklevel=2)
        return {}
    return {p: (tuple(s), tuple(f) if f[2] >= 0 else None, r or None)
            for p, s, f, r in zip(paths, stats, facts, reasons) if s[1] < trusted_before}


def save(root, max_pixels, verify, entries, scanned_ns):
    """Writes `entries`, {relative path: ((size, mtime_ns), (height, width, decoder) or None, reason or
    None)}, as the cache of `root`, whose files were looked at from time `scanned_ns` (`time.time_ns()`)
    on; a cache that cannot be written (a read-only home) is said, not raised."""
    path = cache_path(root, max_pixels, verify)
    names = sorted(entries)
    paths, path_ends = _pack(names)
    reasons, reason_ends = _pack([entries[n][2] or "" for n in names])
    stats = np.array([entries[n][0] for n in names], np.int64).reshape(-1, 2)
    facts = np.array([entries[n][1] or (0, 0, -1) for n in names], np.int64).reshape(-1, 3)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with atomic_write(path) as tmp:
            np.savez(tmp, identity=np.array(_identity(root, max_pixels, verify)), paths=paths,
                     path_ends=path_ends, reasons=reasons, reason_ends=reason_ends, stats=stats, facts=facts,
                     scanned_ns=np.int64(scanned_ns))
    except OSError as err:
        warnings.warn(f"the scan of {root} is not cached ({path}: {err}); the next start reads it again",
                      stacklevel=2)


def file_stat(path):
    """(size, mtime_ns) of the file at `path`: what a cached row is checked against."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns
