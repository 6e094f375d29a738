"""The output folder of a training run, one rule for `keras-vit finetune DIR` (--out) and the examples'
recipe (--output-dir).

A folder that is absent or empty starts a run. A folder holding a run of ours (its marker file, the
run's flags) is replaced with --overwrite, refused once finished (its `finished` file is there), and
otherwise resumed when its flags agree: on request (`finetune --resume`, where a flag left out continues
as the run had it) or by repeating the command (the examples). Anything else (a file, a folder of
other files) is refused and left as it is. `decide` reads only; `start` writes, once every other check
of the run has passed.
"""

import json
import os
import shutil

from keras_vit.fileio import write_json


def _ours(out, marker):
    """The flags recorded in `out`'s marker, or None when `out` holds no run of ours."""
    path = os.path.join(out, marker)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def decide(out, flags, *, option, marker, finished, overwrite, resume=None, defaults=None):
    """Whether the run resumes in `out` (True) or starts there (False); raises when it may do neither.

    Args:
        out: the output folder.
        flags: the run's flags (a dict); with `defaults`, a flag at its default takes the interrupted
            run's value, in `flags` (and the caller's arguments, which the caller updates from it).
        option: the flag that named `out`, for the messages ("--out", "--output-dir").
        marker, finished: the file names of a run's flags and of a finished run's last output.
        overwrite: replace a run of ours (`start` removes it).
        resume: True: a run must be there to resume; False: refuse one; None: resume one whose flags
            agree (the examples' rule: the same command again continues).
        defaults: the flags' defaults (for `resume=True`).

    Raises:
        ValueError: `out` is a file; a run to resume is missing, finished, or had other flags.
        FileExistsError: `out` holds files of something else, or a run and neither resume nor overwrite.
    """
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"{option} {out!r} exists and is not a folder")
    if not os.path.isdir(out) or not os.listdir(out):
        if resume:
            raise ValueError(f"--resume: {out!r} holds no run to resume")
        return False
    previous = _ours(out, marker)
    if previous is None:
        raise FileExistsError(f"{option} {out!r} exists and is not empty and holds no run of ours ({marker}); not "
                              "deleting it: choose another folder (nothing was written)")
    if overwrite:
        return False
    if resume is False:
        raise FileExistsError(f"{option} {out!r} holds a run; pass --resume to continue it, --overwrite to replace "
                              "it, or choose another folder (nothing was written)")
    if os.path.exists(os.path.join(out, finished)):
        raise ValueError(f"{option} {out!r} holds a finished run ({finished} is there); --overwrite replaces it, or "
                         "choose another folder")
    defaults = defaults or {}
    for key, value in list(flags.items()) if resume else ():  # a flag left out continues as the run had it
        if key in defaults and value == defaults[key] and key in previous:
            flags[key] = previous[key]
    # a flag added since the run began reads as its default (what the run ran as), None without one
    changed = {k: (previous.get(k, defaults.get(k)), v) for k, v in flags.items()
               if previous.get(k, defaults.get(k)) != v}
    if changed:
        raise ValueError(f"{option} {out!r} holds an interrupted run with other flags (was -> now: {changed}); "
                         "repeat its flags (or leave them out with --resume) to resume it, or pass --overwrite to "
                         "start over")
    return True


def start(out, flags, resuming, *, marker, overwrite):
    """Makes `out` ready for the run `decide` allowed: the old run removed with `overwrite` (unless
    resuming), the folder made, a new run's flags written to `marker`."""
    if overwrite and not resuming and os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)
    if not resuming:
        write_json(os.path.join(out, marker), flags)


__all__ = ["decide", "start"]
