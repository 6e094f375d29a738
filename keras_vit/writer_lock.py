"""One writer per output folder, as git's `index.lock` keeps one writer per repository: `hold(folder)` takes
the lock file `FOLDER.lock` beside the folder (so it can be taken before the folder exists) for as long as
a run, an export or a download writes there, and a second writer is refused at once, by the name of the
process that holds it (its host, pid, start time and command).

The lock is written whole beside its place, then hard-linked there, which fails when a lock is there: of
two writers started in the same instant exactly one gets it, and no reader sees a lock half-written. It is removed when the writer ends, also on an error or Ctrl-C. A lock whose writer cannot have
removed it is stale and taken over, said in one line: its process, on this host, is gone (killed, power
loss); or it is another host's (whose processes cannot be seen from here) and older than `STALE_AFTER`;
or it is unreadable (a writer killed while writing it) and older than a minute.
"""

import contextlib
import datetime
import json
import os
import sys
import time

from keras_vit.fileio import process_alive, host_name, temporary_folder

SUFFIX = ".lock"
STALE_AFTER = 24 * 3600  # seconds: another host's lock older than this is taken over
_UNREADABLE_AFTER = 60  # seconds: an unreadable lock older than this is a writer killed while writing it
_POLL = 0.2  # seconds between looks at a lock waited for


class FolderLockedError(FileExistsError):
    """The folder is being written by another process, named in the message."""


def lock_path(folder):
    """The lock file of `folder`: beside it, FOLDER.lock."""
    return os.path.abspath(os.fspath(folder)).rstrip(os.sep) + SUFFIX


def _read(path):
    """The lock's holder (a dict), {} when unreadable, None when the lock is gone."""
    try:
        with open(path) as f:
            holder = json.load(f)
        return holder if isinstance(holder, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}


def _describe(holder):
    if not holder:
        return "a process that has not said which"
    started = datetime.datetime.fromtimestamp(holder.get("started", 0)).strftime("%Y-%m-%d %H:%M:%S")
    return f"process {holder.get('pid')} on {holder.get('host')}, started {started} ({holder.get('command', '?')})"


def _stale(path, holder):
    """Why the lock at `path` held by `holder` is stale, or None while its writer may be alive."""
    if not holder:
        try:
            age = time.time() - os.path.getmtime(path)
        except OSError:
            return None
        return f"unreadable and {age:.0f} s old" if age > _UNREADABLE_AFTER else None
    if holder.get("host") == host_name():
        return None if process_alive(int(holder.get("pid", 0))) else f"its process {holder.get('pid')} is gone"
    age = time.time() - float(holder.get("started", 0))
    return f"another host's, {age / 3600:.0f} h old" if age > STALE_AFTER else None


def _create(path):
    """Creates the lock file at `path`, whole: written beside it, then hard-linked into place, which fails
    (FileExistsError) when the lock exists, so no reader sees it empty."""
    with temporary_folder(path) as tmp:
        mine = os.path.join(tmp, "lock")
        with open(mine, "w") as f:
            json.dump({"pid": os.getpid(), "host": host_name(), "started": time.time(), "command": " ".join(sys.argv)}, f)
        os.link(mine, path)


def _take(path, wait):
    """Creates the lock at `path` for this process; with `wait`, waits (saying so once) while its holder
    lives, else raises FolderLockedError naming it."""
    said, tries = False, 0
    while tries < 2:
        try:
            _create(path)
        except FileExistsError:
            holder = _read(path)
            why = None if holder is None else _stale(path, holder)
            if holder is not None and why is None and wait:
                if not said:
                    print(f"waiting for {_describe(holder)}, which writes {path[:-len(SUFFIX)]}", file=sys.stderr)
                    said = True
                time.sleep(_POLL)
                continue
            tries += not (wait and holder is None)  # a waiter keeps trying while others take and release it
            if holder is not None and why is None:
                raise FolderLockedError(
                    f"{path[:-len(SUFFIX)]!r} is being written by {_describe(holder)}; wait for it to end or "
                    f"choose another folder (its lock: {path})") from None
            if why is not None:
                print(f"note: taking over the stale lock {path} ({why})", file=sys.stderr)
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
            continue
        return
    raise FolderLockedError(f"{path[:-len(SUFFIX)]!r}: another process took its lock {path} at the same time")


@contextlib.contextmanager
def hold(folder, wait=False):
    """Holds `folder`'s lock (`lock_path`) while the block runs; its parent folder is made when missing.
    `wait`: wait for a live holder to end instead of refusing (a download another process has begun).

    Raises:
        FolderLockedError: another live writer holds it (named in the message).
        OSError: the lock cannot be created (a read-only or full filesystem, a missing permission).
    """
    path = lock_path(folder)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _take(path, wait)
    try:
        yield path
    finally:
        holder = _read(path)
        if holder and holder.get("pid") == os.getpid() and holder.get("host") == host_name():
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


__all__ = ["STALE_AFTER", "FolderLockedError", "hold", "lock_path"]
