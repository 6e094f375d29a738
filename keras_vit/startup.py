"""Quiet starts: Keras and its backend imported with TensorFlow's start-up notes held back.

TensorFlow prints a few lines when it is imported (oneDNN is on, no CUDA driver, the CPU's instructions; twice,
once per library it loads) through absl before absl's logging is set up, so TF_CPP_MIN_LOG_LEVEL, which every
later line obeys, does not hold them back. `import keras_vit` imports Keras (and so its backend) first, through
`import_backend`: what is written to file descriptor 2 meanwhile is kept, and passed on once Keras is imported,
less absl's lines below the level TF_CPP_MIN_LOG_LEVEL names (`start_log_level`, default 1: the INFO notes held
back, warnings, errors and every other line passed on). So each entry point, `keras-vit`, `python -m
keras_vit.launch`, `python -m keras_vit.export` and the examples, starts as quietly on TensorFlow as on JAX;
`TF_CPP_MIN_LOG_LEVEL=0` shows the notes as TensorFlow prints them. On the other backends TensorFlow is
imported later, for tf.data, where `import_quietly("tensorflow")` holds its notes back the same way.

How an entry point ends on Ctrl-C lives here too, beside how it starts: `interrupted` says in one line what was
kept and how to continue, and gives the exit status a shell gives (130); `run_main` runs a script's `main` (the
examples, the benchmarks) with that handling, as `keras-vit` (`keras_vit.cli.main`) has it. Both watch for
Ctrl-C (`watching_ctrl_c`): Python raises the KeyboardInterrupt wherever the main thread is, and where that is a
garbage-collection callback or a `__del__` it prints "Exception ignored in ..." and goes on, so a long
`fit` would run on; the press is kept (`CTRL_C`), the drop not printed, and raised again at the next step of
the training loops (`keras_vit.recipes.StopOnCtrlC`). C code can drop it too, putting back the error it was
handling when the signal arrived (numpy does, falling back from an `__array__` without `copy`, as torch's tensors
have, when Ctrl-C lands in its str() of the TypeError): an error raised after a press is the press's
(`by_ctrl_c`), and ends the block as a KeyboardInterrupt.

Standard library only: it is the first thing `keras_vit/__init__.py` runs, before anything imports Keras.
"""

import contextlib
import importlib
import os
import re
import signal
import sys
import tempfile
import threading

__all__ = ["DEFAULT_LEVEL", "INTERRUPTED", "INTERRUPTED_STATUS", "by_ctrl_c", "filter_start_lines", "import_backend",
           "import_quietly", "interrupted", "run_main", "start_log_level", "watching_ctrl_c"]

# Ctrl-C: the exit status (128 + SIGINT, as a shell's), and what is said where nothing more particular was kept
INTERRUPTED_STATUS = 130
INTERRUPTED = "no file was left half-written (each is written whole, then moved into place): run the same command again"
# set by Ctrl-C while `watching_ctrl_c`, even where the KeyboardInterrupt it raised was ignored
CTRL_C = threading.Event()

# absl's severities, in TF_CPP_MIN_LOG_LEVEL's order (0: INFO and above ... 3: FATAL only)
SEVERITIES = b"IWEF"
# the level when TF_CPP_MIN_LOG_LEVEL is not set: INFO held back
DEFAULT_LEVEL = 1
# one absl line: severity, date (MMDD), time, thread, file:line]
_ABSL_LINE = re.compile(rb"^([IWEF])\d{4} [\d:.]+ +\d+ [^ \]]+:\d+\] ")
# absl's own note on the lines above, printed before the first of them (an INFO note of its own)
_ABSL_BANNER = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# a Python warning ("path.py:12: UserWarning: ..."): never part of an absl line before it
_PYTHON_WARNING = re.compile(rb"^\S.*:\d+: \w+: ")


def start_log_level(environ=None):
    """The absl severity below which `import_quietly` holds the start-up lines back: TF_CPP_MIN_LOG_LEVEL
    (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL) of `environ` (default os.environ), else DEFAULT_LEVEL.

    Args:
        environ: the environment to read (a mapping), or None for os.environ.
    """
    value = (os.environ if environ is None else environ).get("TF_CPP_MIN_LOG_LEVEL", "")
    try:
        return min(max(int(value), 0), 3)
    except ValueError:
        return DEFAULT_LEVEL


def filter_start_lines(data, level):
    """`data` (bytes written to stderr) less absl's lines of a severity below `level` and their continuation
    lines (and absl's banner when `level` > 0); every other line is kept, in order.

    Args:
        data: the bytes written to file descriptor 2.
        level: the lowest severity kept, 0 (INFO) to 3 (FATAL), as TF_CPP_MIN_LOG_LEVEL counts.
    """
    kept, keep = [], True
    for line in data.splitlines(keepends=True):
        if line.rstrip(b"\r\n") == _ABSL_BANNER:
            kept += [line] * (level == 0)
            keep = True  # what follows the banner decides for itself
            continue
        header = _ABSL_LINE.match(line)
        if header:
            keep = SEVERITIES.index(header.group(1)) >= level
        elif _PYTHON_WARNING.match(line):
            keep = True
        # any other line continues the one before it (an absl message of several lines)
        if keep:
            kept.append(line)
    return b"".join(kept)


def _flush():
    if sys.stderr is not None:
        sys.stderr.flush()


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


def import_quietly(name):
    """Imports and returns the module `name` with the lines written to file descriptor 2 meanwhile passed on
    through `filter_start_lines` at `start_log_level()` once it is imported (all of them, unfiltered, when the
    import fails): TensorFlow's start-up notes held back wherever it is first imported. A plain import when the
    module is imported already, the level is 0, or there is no descriptor 2.

    Args:
        name: the module's name, e.g. "keras" or "tensorflow".
    """
    level = start_log_level()
    if level == 0 or name in sys.modules:
        return importlib.import_module(name)
    try:
        terminal = os.dup(2)
    except OSError:  # no stderr at all (a daemon): nothing to filter
        return importlib.import_module(name)
    module = None
    with tempfile.TemporaryFile() as kept:
        _flush()
        os.dup2(kept.fileno(), 2)
        try:
            module = importlib.import_module(name)
        finally:
            _flush()
            os.dup2(terminal, 2)
            os.close(terminal)
            kept.seek(0)
            data = kept.read()
            _write_all(2, data if module is None else filter_start_lines(data, level))
    return module


def import_backend():
    """Imports Keras, and so its backend, through `import_quietly`: what `keras_vit/__init__.py` runs first."""
    import_quietly("keras")


def interrupted(program, kept=None):
    """Says on stderr, in one line, that `program` was interrupted (Ctrl-C) and what was kept; returns
    INTERRUPTED_STATUS, the status to exit with.

    Args:
        program: the name the line starts with, e.g. "keras-vit finetune" or "lora.py".
        kept: what was kept and how to continue (default INTERRUPTED).
    """
    _flush()
    print(f"{program}: interrupted: {kept or INTERRUPTED}", file=sys.stderr, flush=True)
    return INTERRUPTED_STATUS


def _on_ctrl_c(signum, frame):
    CTRL_C.set()
    raise KeyboardInterrupt


def by_ctrl_c(err):
    """Whether the error `err` ends the run because of Ctrl-C: a KeyboardInterrupt, or any error raised after a
    press while `watching_ctrl_c` (C code that checks for signals can put back the error it was handling in the
    KeyboardInterrupt's place).

    Args:
        err: the exception caught.
    """
    return isinstance(err, KeyboardInterrupt) or CTRL_C.is_set()


@contextlib.contextmanager
def watching_ctrl_c():
    """Within the block, Ctrl-C (SIGINT) raises KeyboardInterrupt as Python's own handler does and sets CTRL_C
    too, and a KeyboardInterrupt that Python drops after it (in a garbage-collection callback or a `__del__`)
    is not printed ("Exception ignored in ..."): the training loops raise it again (`StopOnCtrlC`), and the
    one line that says what was kept stays the only one. Another error raised after a press ends the block as
    a KeyboardInterrupt (`by_ctrl_c`), the error its cause. The handler and `sys.unraisablehook` before it, and
    CTRL_C cleared, after. Nothing changes where SIGINT is not Python's default handler (ignored, as in a
    background job, or the program's own) or off the main thread."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    previous_hook = sys.unraisablehook

    def unless_ctrl_c(unraisable):
        if not (CTRL_C.is_set() and isinstance(unraisable.exc_value, KeyboardInterrupt)):
            previous_hook(unraisable)

    CTRL_C.clear()
    sys.unraisablehook = unless_ctrl_c
    signal.signal(signal.SIGINT, _on_ctrl_c)
    try:
        yield
    except Exception as err:
        if not by_ctrl_c(err):
            raise
        raise KeyboardInterrupt from err
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = previous_hook
        CTRL_C.clear()


def run_main(main, *args, kept=None):
    """Runs a script's entry point `main(*args)` (an example, a benchmark) and returns what it returns; on Ctrl-C
    the script ends as `keras-vit` does: `interrupted`'s one line (the KeyboardInterrupt's own message when it has
    one, else `kept`), exit status 130, no traceback.

    Args:
        main: the entry point, e.g. a script's `main`.
        *args: its arguments.
        kept: what an interrupted run keeps and how to continue (default INTERRUPTED).
    """
    try:
        with watching_ctrl_c():
            return main(*args)
    except KeyboardInterrupt as err:
        raise SystemExit(interrupted(os.path.basename(sys.argv[0]) or "python", str(err) or kept)) from None
