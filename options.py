"""Command-line options, as nanoGPT's configurator but checked once, and how every script ends on a mistake.

A script's `DEFAULTS = dict(...)` holds a key a line with a comment. `--key=value` sets a key in its default's
type (a bool's `--key` alone: true; a text or a bare word that begins with `~` is a path in the home folder,
which bash does not expand after `=`, unless the script takes it as free text); `--config=NAME` applies a
preset first. Every number must be finite, and the script's RANGES table says which must also be positive,
non-negative, a fraction in [0, 1), a ratio in [0, 1] or a seed in [0, 2**32). `--help` prints the docstring
and each key with its default value and its comment.

Importing this module, which every script does before torch, sets how a script of this repository ends when an
exception reaches its top level (a program of the user's own that imports one of ours keeps Python's ways): a
UsageError is `error: ...` and exit 2; an OSError about a path is one line naming the path (and the option
that gave it; on a full disk, the file being written, or stdout) and exit 2; Ctrl-C is exit 130; a closed
stdout (`| head`) ends quietly with 141; under torchrun, a collective cut off by another process's end is one
line and exit 1 (that process says why). Any other exception is a bug and keeps its traceback. Ctrl-C while
torch imports can be lost, or abort the interpreter from inside torch's C++ code: a script of this repository
that imports this module before torch, and calls parse(), holds Ctrl-C until then; parse() lets it through
(the script ends there, exit 130).
"""
import os
import signal
import sys

# Ctrl-C held from here until parse() (see above), in a script of this repository that calls it; not in an
# interactive session, under pytest, or in a module run as a script that never parses options. First, before
# the imports below: a Ctrl-C while they run would end in their traceback.
script = getattr(sys.modules.get("__main__"), "__file__", None)
# (Not a file: `python -` reading its script from stdin, here '<stdin>'. Through a link to the repository the
# script's path is the link's, this module's the real one; on Windows either may be spelled in other case.)
ours = script and os.path.isfile(script) and os.path.normcase(os.path.realpath(script)).startswith(
    os.path.normcase(os.path.dirname(os.path.realpath(__file__)) + os.sep))
# (Not in a notebook's kernel either: `%run derivation.py` names the script, which parses nothing there.)
kernel = "ipykernel" in sys.modules
if ours and "torch" not in sys.modules and not kernel and hasattr(signal, "pthread_sigmask"):
    with open(script, encoding="utf-8", errors="replace") as f:
        if "parse(" in f.read():
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})

import atexit
import contextlib
import difflib
import errno
import io
import math
import pathlib
import re
import shlex
import subprocess
import textwrap
import threading
import time
import traceback
import unicodedata


class UsageError(Exception):
    """A mistake the user can fix (a bad option, a dataset not prepared): one line, exit 2. alone=True: a
    process may find it alone (in its own share of the data), so whichever does says it."""

    def __init__(self, msg, alone=False):
        super().__init__(msg)
        self.alone = alone


def error_line(msg, alone=False):
    """`error: msg` on one line of stderr. Under torchrun the first process of each node says it (rank 0 for
    all that every rank finds; another node's for what only it finds), the others keep quiet, unless the
    mistake is one a process finds `alone`."""
    where = "" if rank() == "0" else f" (rank {rank()})"
    if speaks(alone):
        print(f"error: {printable(msg)}{where}", file=sys.stderr)


def printable(msg):
    """msg on one line, each control character in it shown as its escape (\\x1b): text read from files (a
    meta.json, a checkpoint, a file's or folder's name) is printed by the terminal instead of obeyed."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in " ".join(str(msg).split()))


def rank():
    """This process's rank under torchrun (which sets LOCAL_RANK too), else '0': a RANK left in the
    environment is no rank outside torchrun."""
    return os.environ.get("RANK", "0") if "LOCAL_RANK" in os.environ else "0"


def speaks(alone):
    """Whether this process says an error (error_line): rank 0, another node's first, or one found `alone`."""
    return rank() == "0" or os.environ.get("LOCAL_RANK") == "0" or alone


def fail(msg, code=2):
    """`error: msg` on one line, then exit."""
    error_line(msg)
    sys.exit(code)


def quiet_stdout():
    """Send what is still to come on stdout to nowhere, so that a closed pipe raises no second error."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def say(*args, quiet=False):
    """print, flushed, that survives a closed stdout: `python train_gpt.py | tee log` loses tee on the same
    Ctrl-C that asks the run to save, and the save must not depend on it. From then on stdout goes nowhere, as
    one line on stderr says (`> /dev/full`, `| head -2`: the run is not silently unseen), unless `quiet` (a
    script that is ending)."""
    try:
        print(*args, flush=True)
    except OSError as e:
        quiet_stdout()
        # A closed stderr too stops nothing.
        if not quiet:
            with contextlib.suppress(OSError, ValueError):
                print(f"note: stdout: {e.strerror or e}; nothing more is printed there", file=sys.stderr)


@contextlib.contextmanager
def naming(path):
    """An OSError inside without a file name, or about a temp file beside `path`, names `path`: a write to a
    full disk fails without one, and torch.save reports it as a RuntimeError whose context is the OSError."""
    try:
        yield
    except Exception as e:
        error = e if isinstance(e, OSError) else e.__context__
        # An OSError about another file (a program matplotlib runs, say) is not this one's.
        if not isinstance(error, OSError) or not str(error.filename or path).startswith(str(path)):
            raise
        raise OSError(error.errno, error.strerror, path) from None


def shell_join(args):
    """A command line to copy and run: on Windows an argument with a space in double quotes (cmd.exe's & | < >
    ^ % in a path are left as they are), else quoted for a POSIX shell."""
    return subprocess.list2cmdline(args) if os.name == "nt" else shlex.join(args)


def open_new(path, mode):
    """path opened in `mode` (its "w" made "x") as a new file: one by that name, or a link planted there, goes
    first, so nothing is written through it."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
    return open(path, mode.replace("w", "x"), encoding=None if "b" in mode else "utf-8")


def replace(src, dst):
    """os.replace(src, dst), whose refusal names dst. Windows refuses to replace a file another process has
    open (sample.py reading the checkpoint, eval_gpt.py the data, a virus scanner): there it is tried again
    for about 25 s."""
    for attempt in range(9):
        try:
            return os.replace(src, dst)
        except PermissionError as e:
            if os.name != "nt" or attempt == 8:
                raise PermissionError(e.errno, e.strerror, dst) from None
            time.sleep(0.1 * 2 ** attempt)


def write_whole(path, write, mode="w"):
    """write(f) to a temp file (open_new), fsync, rename over `path`: a failure (a full disk, Ctrl-C) leaves
    the earlier file whole and no temp file, and its OSError names `path`."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with naming(path):
            with open_new(tmp, mode) as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    # Make the rename durable (not possible everywhere).
    with contextlib.suppress(OSError):
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


# The last options parsed: an OSError about a path under one of them names that option.
parsed = {}


def option_of(path):
    """' (--key=value)' of the parsed option that gave `path`: the one whose value (or one of its values) is
    the path, relative or absolute, or ends in ':path' (sample.py's --start=FILE:path); else one whose value
    is below it (a folder on the way to plot's --out=PATH, other than the working folder and those above it);
    else the deepest whose value is a folder above it; or ''."""
    full = os.path.abspath(str(path))
    folder = full.rstrip(os.sep) + os.sep
    # The working folder, or one above it, is on the way to every path: it names no option that way.
    everyones = (os.getcwd() + os.sep).startswith(folder)
    found = (False, -1, 0, "")
    for i, (key, values) in enumerate(parsed.items()):
        for value in values if isinstance(values, list) else [values]:
            if not isinstance(value, str) or not value.strip():
                continue
            above = os.path.abspath(value)
            # The working folder (plot's --out_dir=.) names only what is directly in it: it is above every
            # relative path.
            if os.path.normpath(value) == os.curdir and os.path.dirname(full) != above and full != above:
                continue
            tail = value.partition(":")[2]
            after_colon = bool(tail) and os.path.abspath(os.path.expanduser(tail)) == full
            under = (full + os.sep).startswith(above.rstrip(os.sep) + os.sep) or after_colon
            on_the_way = (above + os.sep).startswith(folder) and not everyones
            # The option that is the path comes first, then the longest (one whose path it is on the way to is
            # below it, longer than any it is under), then the one the script lists first (prepare_data's
            # --input=notes before its --name=notes).
            if under or on_the_way:
                found = max(found, (full == above or after_colon, len(above), -i, f" (--{key}={value})"))
    return found[-1]


def file_written(tb):
    """The name of a file open for writing in the innermost frame of traceback `tb` (the write that failed is
    there), or None."""
    frame = list(traceback.walk_tb(tb))[-1][0]
    for value in frame.f_locals.values():
        mode = getattr(value, "mode", "")
        # (a GzipFile's mode is a number)
        if isinstance(value, io.IOBase) and isinstance(mode, str) and set("wax+") & set(mode):
            name = getattr(value, "name", None)
            if isinstance(name, str):
                return name
    return None


def first_line(exc):
    """The first line of what `exc` says, cut to 100 characters (its class's name when it says nothing),
    without the source line torch's C++ checks begin with (a CPU that is out of memory: `[enforce fail at
    alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: ...`, whose bytes come last)."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return textwrap.shorten(re.sub(r"^\[enforce fail at [^]]*\] ([^.]*\. )?", "", line), 100)


def out_of_memory(exc):
    """Whether `exc` is out of memory: Python's and numpy's MemoryError, or torch's, told without importing
    torch (on a CPU and on a Mac's GPU its allocator raises a RuntimeError naming itself)."""
    return (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
            or "DefaultCPUAllocator" in str(exc) or "MPS backend out of memory" in str(exc))


def peer_gone(exc):
    """gloo's words if `exc` is a collective that failed because another process of the run ended (under
    torchrun), else None: a RuntimeError naming the connection the peer closed, whichever collective it was in
    (DDP's backward, an all-reduce, a barrier)."""
    gone = re.search(r"Connection (reset|closed) by peer", str(exc))
    if isinstance(exc, RuntimeError) and "LOCAL_RANK" in os.environ and gone:
        return gone[0]
    return None


def closed_pipe(exc):
    return isinstance(exc, OSError) and exc.errno == errno.EINVAL and exc.filename is None


def report(exc):
    """Say in one line why `exc` ends the script, and return its exit code; None for a bug (a traceback)."""
    # A mistake to fix is exit 2, unless a kind below says otherwise.
    code = 2
    if isinstance(exc, UsageError):
        line = str(exc)
    elif isinstance(exc, KeyboardInterrupt):
        # A line of text it cut (a sample) ends first; under torchrun every process gets the Ctrl-C, and only
        # rank 0 prints.
        if rank() == "0":
            say(quiet=True)
        line = "interrupted"
        code = 130
    # Windows says a pipe whose reader left is an invalid argument, with no file named.
    elif isinstance(exc, BrokenPipeError) or os.name == "nt" and closed_pipe(exc):
        return 141
    elif out_of_memory(exc):
        line = f"out of memory ({first_line(exc)})"
        # Half the micro-batch, twice the micro-steps: the same step. Not while something is being built (the
        # model, under an __init__): that needs no smaller batch; nor at a batch of 1, which has no half.
        frames = {frame.f_code.co_name for frame, _ in traceback.walk_tb(exc.__traceback__)}
        # Nor for numpy's arrays: their sizes follow counts, not the micro-batch.
        if "__init__" not in frames and parsed.get("batch_size", 1) > 1 and not isinstance(exc, MemoryError):
            line += f"; try --batch_size={parsed['batch_size'] // 2}"
            if "gradient_accumulation_steps" in parsed:
                line += (f" --gradient_accumulation_steps={2 * parsed['gradient_accumulation_steps']} (the "
                         f"same tokens a step)")
    elif type(exc).__name__ in ("InductorError", "BackendCompilerFailed"):
        # torch.compile could not build the model on this machine (no C++ compiler, say; Windows and macOS
        # ship none): the first step had not run.
        line = f"torch.compile failed ({first_line(exc)}); try --compile=false"
    elif peer_gone(exc):
        # The process that ended has said why (or torchrun says how it ended); this one only follows it.
        line = f"another process of this run ended, and this one with it (gloo: {peer_gone(exc)})"
        code = 1
    elif isinstance(exc, OSError):
        # A path is named with the option that gave it. A write to a full disk carries no path: the file is
        # the one open for writing in the innermost frame that holds one; none there: print's, stdout (into
        # `/dev/full`).
        # (A copy that filled the disk names its source first: the file written is the second.)
        path = exc.errno == errno.ENOSPC and exc.filename2 or exc.filename or file_written(exc.__traceback__)
        line = f"{exc.strerror or exc}"
        # A folder made (or read) where there is a file (or a device: /dev/null), or a link to nothing, says
        # 'File exists' (or 'Not a directory', below a file): what is in the way is named.
        if isinstance(exc, (FileExistsError, NotADirectoryError)) and isinstance(path, str):
            for p in (path, *pathlib.PurePath(path).parents):
                if os.path.exists(p) and not os.path.isdir(p):
                    line = f"{p} is not a folder"
                    break
                if os.path.islink(p) and not os.path.exists(p):
                    line = f"{p} is a link to {os.readlink(p)}, which does not exist"
                    break
        # A link where a run writes a file of its own (train_common.open_own) is refused, not followed.
        if exc.errno == errno.ELOOP and isinstance(path, str) and os.path.islink(path):
            line = f"a link to {os.readlink(path)}, where a run writes a file of its own; remove it"
        if path is not None:
            line = f"{path}{option_of(path)}: {line}"
        elif exc.errno == errno.ENOSPC:
            line = f"stdout: {line}"
    else:
        return None
    # Each process has its own memory: one that ran out alone says so itself.
    error_line(line, getattr(exc, "alone", False) or out_of_memory(exc))
    return code


# The exit code report() chose for the exception that ended the script.
exit_code = []


def excepthook(kind, exc, tb):
    code = report(exc)
    if code is None:
        sys.__excepthook__(kind, exc, tb)
    else:
        exit_code.append(code)
    # torchrun names as the first failure the process it sees end first, and shows its lines: one that only
    # follows another, or keeps quiet about a mistake every process finds (before they meet, they are not in
    # step), waits 5 s (or for torchrun's SIGTERM, where a trainer's loop did not set it aside), so that the
    # one that says it is.
    quiet = code == 2 and not speaks(getattr(exc, "alone", False) or out_of_memory(exc))
    if peer_gone(exc) or quiet:
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(5)


def stop_signals_here():
    """The signals that ask a run to stop, those this system has: Ctrl-C, a scheduler's SIGTERM, a closed
    terminal's SIGHUP, Windows' Ctrl-Break (SIGBREAK); less any the process started with ignored, which stays
    so (nohup's SIGHUP, a background job's SIGINT)."""
    names = ("SIGINT", "SIGTERM", "SIGHUP", "SIGBREAK")
    # Python takes signals in its main thread only: a run in another thread has none to handle.
    if threading.current_thread() is not threading.main_thread():
        return []
    found = [getattr(signal, name) for name in names if hasattr(signal, name)]
    return [sig for sig in found if signal.getsignal(sig) is not signal.SIG_IGN]


def stop_as_ctrl_c():
    """A script without a step to finish first ends on any stop signal as on Ctrl-C: a KeyboardInterrupt,
    which cleans up on its way out (a staging folder, a child process) and exits 130."""
    # (Not in a notebook's kernel, which would keep them: its manager stops it with SIGTERM.)
    for sig in stop_signals_here() if not kernel else ():
        signal.signal(sig, signal.default_int_handler)


def exit_with_code():
    """Registered first, so run last at exit: what stdout still holds is written here, where a failure
    (`| head`, `> /dev/full`) ends as any other (the interpreter's own flush comes after this, and would say
    'Exception ignored' and exit 120); then the code excepthook chose (Python's own would be 1)."""
    try:
        if sys.stdout:
            sys.stdout.flush()
    except OSError as e:
        quiet_stdout()
        if not exit_code:
            exit_code.append(report(e))
    if exit_code:
        os._exit(exit_code[0])


# For our scripts (and `python -c`), not for a program of the user's own that imports a module of ours
# (sample.load_gpt): that one keeps Python's tracebacks, exit codes and output, and its files are flushed at
# exit (exit_with_code's os._exit would skip that).
theirs = bool(script) and os.path.isfile(script) and not ours
if not theirs:
    sys.excepthook = excepthook
    atexit.register(exit_with_code)
    # A closed stderr (`2>&-`) is None here, and print(file=None) writes to stdout: into a sample or a table.
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")
    # A character the terminal's encoding lacks (a sample in an ASCII terminal) is printed as '?'. Windows
    # writes output redirected to a file or a pipe in its ANSI code page, which lacks most characters (its
    # console is UTF-8 already): UTF-8 there, stdout's and stderr's (`> log 2>&1`), as Python 3.15 does,
    # unless PYTHONIOENCODING says otherwise.
    windows = os.name == "nt" and "PYTHONIOENCODING" not in os.environ
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(encoding="utf-8" if windows else None, errors="replace")
    if windows and hasattr(sys.stderr, "reconfigure"):
        sys.stderr.reconfigure(encoding="utf-8", errors="backslashreplace")


BOOLS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}

# nanoGPT's options that a script here lacks, and what takes their place (docs/training.md, from nanoGPT).
NANOGPT = {"min_lr": "the trainers' --min_lr_ratio, the floor as a fraction of --learning_rate",
           "decay_lr": "the trainers' --min_lr_ratio=1 --warmup_iters=0 for a constant rate",
           "eval_only": "eval_gpt.py evaluates a checkpoint",
           "wandb_log": "the trainers log to out_dir/log.jsonl, which plot.py draws",
           "backend": "the device's own, nccl on CUDA and gloo elsewhere",
           "init_from": "sample.py and eval_gpt.py read --out_dir's ckpt.pt"}


def near(word, names, prefix=""):
    """'; did you mean NAME?' for the one of `names` a typed `word` is close to (a typo), or ''. Close: 0.8
    of difflib's ratio, so that --min_lr does not point to --min_lr_ratio, another meaning; 0.75 for a word
    of four letters or fewer, one letter off (demp: demo, not bs: bias); in any case (CIFAR10: cifar10)."""
    lowered = {str(n).lower(): n for n in names}
    word = str(word).lower()
    close = difflib.get_close_matches(word, lowered, n=1, cutoff=0.75 if len(word) <= 4 else 0.8)
    return f"; did you mean {prefix}{lowered[close[0]]}?" if close else ""


def _value(key, raw, default):
    """`raw` in the type of `default`: None is the key alone (a bool's true), a list the bare words."""
    if raw is None and not isinstance(default, bool):
        raise UsageError(f"--{key} needs a value, e.g. --{key}={shown(default)}")
    try:
        if isinstance(default, bool):
            return raw is None or BOOLS[raw.lower()]
        if isinstance(default, list):
            return raw if isinstance(raw, list) else [raw]
        return type(default)(raw)
    except (KeyError, ValueError):
        kind = "bool (true/false)" if isinstance(default, bool) else type(default).__name__
        raise UsageError(f"--{key} expects {kind}, got {raw!r}") from None


# What each range of a RANGES table lets through.
RANGE_TESTS = {"positive": (lambda v: v > 0, "positive"),
               "nonnegative": (lambda v: v >= 0, ">= 0"),
               "fraction": (lambda v: 0 <= v < 1, "in [0, 1)"),
               "ratio": (lambda v: 0 <= v <= 1, "in [0, 1]"),
               "nonempty": (lambda v: str(v).strip() != "", "given (not empty)"),
               "seed": (lambda v: 0 <= v < 2**32, "in [0, 2**32)")}


def check_values(config, ranges, choices):
    """Every number finite and every whole number within 2**32 of 0 (no count or size comes near; past it
    torch and numpy overflow deep inside), each key of `ranges` ({range: keys}) in its range, each of
    `choices` ({key: the values it may take}) one of its values."""
    for key, value in config.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"--{key} must be a finite number, got {value}")
        if isinstance(value, int) and abs(value) >= 2**32:
            raise UsageError(f"--{key} must be between -2**32 and 2**32, got {shown(value)}")
    for name, keys in ranges.items():
        test, what = RANGE_TESTS[name]
        for key in keys:
            if not test(config[key]):
                raise UsageError(f"--{key} must be {what}, got {shown(config[key])}")
    for key, names in choices.items():
        if config[key] not in names:
            raise UsageError(f"--{key}={shown(config[key])} is not one of {', '.join(map(shown, names))}"
                             f"{near(config[key], names)}")


def check_config(config, defaults, ranges, choices, source):
    """A config read from a file (a checkpoint's, on resume) checked as parse() checks a command line: each
    value of its default's type, each number in its range, each choice one of its names; else one line that
    names `source`."""
    try:
        for key, value in config.items():
            if type(value) is not type(defaults[key]):
                raise UsageError(f"--{key} expects {type(defaults[key]).__name__}, got {value!r}")
            # A control character in a name would be obeyed by the terminal it is printed to.
            if isinstance(value, str) and any(unicodedata.category(c) == "Cc" for c in value):
                raise UsageError(f"--{key} holds a control character: {value!r}")
        check_values(config, ranges, choices)
    except UsageError as e:
        # (damaged, or from a version with other rules): a value typed on the command line replaces it, but
        # for a key of the model it holds (train_vit's --model, --attn, --lpi)
        raise UsageError(f"{source} holds a config value refused here ({e}); unless it is the model's, give "
                         f"that option on the command line to replace it") from None


def parse(argv, defaults, doc="", source=None, presets=None, positional=None, ranges=None, choices=None,
          text=(), torchrun=False):
    """(config, set_keys): argv (None: the command line's) applied to a copy of `defaults`, checked against
    `ranges` and `choices` ({key: the values it may take}), and the keys it or a preset set. `doc`, `source`
    (__doc__, __file__) make --help; `positional` is the key bare words set (all of them, if its default is a
    list); `text` the keys of free text (a prompt, a title), taken as typed; `torchrun` whether the script
    runs as several processes (else torchrun's are refused)."""
    # A Ctrl-C held while torch imported is raised here.
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    # main() called from a notebook's cell: the kernel's own command line (`-f kernel.json`, whatever launched
    # it: Jupyter's, Colab's) is not its; `%run script.py --key=value` gives the script's, and a __file__
    # (which `%run -i` leaves behind, with the kernel's command line back).
    if argv is None:
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        ran = main_file is not None and os.path.abspath(main_file) == os.path.abspath(sys.argv[0])
        argv = sys.argv[1:] if ran or not kernel else []
    if {"-h", "--help"} & set(argv):
        page = help_text(doc, defaults, source, presets, positional)
        # The values a preset given with --help puts in place of those above.
        for name in (a.partition("=")[2] for a in argv if a.startswith("--config=")):
            if name in (presets or {}):
                sets = " ".join(f"--{k}={shown(v)}" for k, v in presets[name].items())
                page += "\n" + textwrap.fill(f"--config={name} sets {sets or 'nothing: the defaults'}", 110,
                                             subsequent_indent="  ")
        # once, under torchrun
        if rank() == "0":
            print(page, flush=True)
        sys.exit(0)
    # A script of one process that torchrun started would run once in each: every sample twice, the same
    # files written at once.
    if not torchrun and "LOCAL_RANK" in os.environ and os.environ.get("WORLD_SIZE", "1") != "1":
        raise UsageError(f"{os.path.basename(source or sys.argv[0])} runs as one process: start it with "
                         f"python, not torchrun")
    # --key value, a space for the '=': the value would be read as a bare word (the key as a bool's true). A
    # switch's is a word (--compile false): a number after it is a bare word of its own (an exercise's).
    for arg, value in zip(argv, argv[1:]):
        key = arg[2:]
        flag = isinstance(defaults.get(key), bool)
        if arg.startswith("--") and key in defaults and not value.startswith("--") and (
                not flag or value.lower() in BOOLS and not (positional and value.isdigit())):
            raise UsageError(f"{arg} {value}: the value goes after '=', {arg}={value}")
    many = positional and isinstance(defaults[positional], list)
    bare = [a for a in argv if positional and not a.startswith("--")]
    flags = [a for a in argv if a not in bare]
    # A plain positional key takes one word: a second is an unexpected argument.
    if not many:
        flags += bare[1:]
    # {key: its text, None for the key alone}; a key given twice is its last value
    given = {}
    for arg in flags:
        if not arg.startswith("--") or arg == "--":
            # nanoGPT's `train.py config/x.py`
            py = " (a config file is not read: --config=NAME picks a preset)" if arg.endswith(".py") else ""
            raise UsageError(f"unexpected argument {arg!r}; options look like --key=value{py}")
        key, eq, raw = arg[2:].partition("=")
        given[key] = raw if eq else None
    config = dict(defaults)
    set_keys = set()
    # The preset first, wherever it is on the line: the other options override it.
    if presets and "config" in given:
        # --config alone is a mistake like any key without its value.
        name = _value("config", given.pop("config"), next(iter(presets)))
        if name not in presets:
            raise UsageError(f"unknown config {name!r}{near(name, presets)}; presets: {', '.join(presets)}")
        config.update(presets[name])
        set_keys.update(presets[name])
        if "config" in defaults:
            config["config"] = name
    if bare and positional in given:
        raise UsageError(f"--{positional} is given twice: as bare words and as --{positional}=")
    if bare:
        given[positional] = bare if many else bare[0]
    for key, raw in given.items():
        if key not in defaults:
            instead = f" (nanoGPT's; here: {NANOGPT[key]})" if key in NANOGPT else near(key, defaults, '--')
            raise UsageError(f"unknown option --{key}{instead}; valid keys: {', '.join(defaults)}")
        config[key] = _value(key, raw, defaults[key])
        set_keys.add(key)
        # A path that begins with ~ is in the home folder: bash expands no ~ after `=` (--out_dir=~/run would
        # be a folder named ~ here).
        if key in text:
            continue
        if isinstance(config[key], list):
            config[key] = [os.path.expanduser(word) for word in config[key]]
        elif isinstance(config[key], str):
            config[key] = os.path.expanduser(config[key])
    check_values(config, ranges or {}, choices or {})
    parsed.clear()
    parsed.update(config)
    return config, set_keys


def shown(value):
    """A value as one types it after --key= ('' for an empty text, ' ' for blanks, '\\n' for a newline)."""
    return repr(value) if not str(value).strip() or not str(value).isprintable() else str(value)


def help_text(doc, defaults, source, presets=None, positional=None):
    """The docstring, then the DEFAULTS block in `source` line by line: each key as --key=value with its
    comment, the block's comment lines (its sections) as they are."""
    with open(source, encoding="utf-8") as f:
        block = re.search(r"^DEFAULTS = dict\(\n(.*?)^\)", f.read(), re.M | re.S).group(1)
    head = "options, as --key=value (defaults shown)"
    if presets:
        head += f"; --config=NAME applies a preset first: {', '.join(presets)}"
    if positional:
        head += f"; bare words set {positional}"
    rows = [f"{doc.strip()}\n\n{head}:"]
    width = 1 + max(len(f"--{key}={shown(value)}") for key, value in defaults.items())
    for line in block.splitlines():
        key = re.match(r"\s*(\w+)=.*?(\s#.*)?$", line)
        if key:
            line = f"--{key[1]}={shown(defaults[key[1]])}".ljust(width) + (key[2] or "")
        rows.append(f"  {line.strip()}")
    return "\n".join(rows)
