"""Shared by the test files: pytest finds this file by name."""

import os
import signal
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import options

# Started in the background of a non-interactive shell (`cmd &`, nohup), pytest inherits SIGINT ignored, and
# so would every process the tests start: the Ctrl-C tests need Python's usual handler, here and in them.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The tests' tensors are a CPU's, also on a GPU machine: the Triton core's default on CUDA is tested apart
# (test_triton.py), and here off, in this process and the scripts it starts.
os.environ['TOST_TRITON'] = '0'

# The repository's root, and the environment of the scripts the tests start: one thread, the repository's
# modules.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=REPO)
# a disk that is always full: Linux's /dev/full (macOS has none)
NEEDS_DEV_FULL = pytest.mark.skipif(not os.path.exists('/dev/full'), reason='needs /dev/full')
# what only a POSIX system has: a link (Windows makes one in Developer Mode only), a named pipe, a signal to a
# process group or one Windows lacks (SIGHUP, SIGUSR1), preexec_fn, a child that dies of a signal, the C
# locale, the block of SIGINT while torch imports, and what a script does off Windows only
POSIX_ONLY = pytest.mark.skipif(os.name == 'nt', reason='needs POSIX')


@pytest.fixture(scope='module', autouse=True)
def one_thread():
    """Tiny models on two cores that other jobs may share: one thread is faster and steadier than two
    (OpenMP's second thread waits for the busy core). Every test module under tests/ runs so."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def two_gpus(monkeypatch):
    """torch.cuda as on a machine of two GPUs, none here: the GPU made the current one and the float32 matmul
    precision set, in the order they are, in the list this gives."""
    calls = []
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    monkeypatch.setattr(torch.cuda, 'set_device', calls.append)
    monkeypatch.setattr(torch, 'set_float32_matmul_precision', calls.append)
    return calls


def counted(monkeypatch, owner, *names):
    """A list that grows by one at each call of any of owner's functions or methods `names`."""
    calls = []
    for name in names:
        def call(*args, _real=getattr(owner, name), **kwargs):
            calls.append(1)
            return _real(*args, **kwargs)
        monkeypatch.setattr(owner, name, call)
    return calls


def as_from_a_terminal():
    """preexec_fn of a script the tests signal: SIGINT and SIGHUP at their defaults, as a terminal starts it,
    whatever this process has (a background job's SIGINT, nohup's SIGHUP: ignored)."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def one_line(stderr, *names):
    """A mistake's end as the user sees it: one line on stderr (so no traceback), naming each of `names`."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and all(name in lines[0] for name in names), stderr[-3000:]
    return lines[0]


def python(*args, cwd=REPO, timeout=300, **how):
    """`python ARGS` run to its end in `cwd`, its stdout and stderr captured as text."""
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          **how)


def in_thread(f):
    """f() in a thread of its own (another run of this process), its result or its exception."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(f).result()


def ended(run, code, *names):
    """A finished command exited `code` with one line on stderr naming each of `names`."""
    assert run.returncode == code, run.stderr[-3000:]
    return one_line(run.stderr, *names)


def run_main(main):
    """main() ended as options' handler ends a script, in this process: a SystemExit with report()'s exit
    code. The frames the exception ended are cleared: what they held (an out_dir's lock) goes, as it would
    with the process."""
    try:
        main()
        return
    except (Exception, KeyboardInterrupt) as e:
        code = options.report(e)
        if code is None:
            raise
        traceback.clear_frames(e.__traceback__)
    raise SystemExit(code)


@pytest.fixture
def ends(capsys):
    """ends(main, args): main(args) ended as its script ends it (run_main): (exit code, stderr)."""
    def ends(main, args):
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            run_main(lambda: main(list(args)))
        return e.value.code, capsys.readouterr().err
    return ends


@pytest.fixture
def fails(ends):
    """fails(main, args, *names, code=2): main(args) exits `code` with one line naming each of `names`."""
    def fails(main, args, *names, code=2):
        got, err = ends(main, args)
        assert got == code, err[-3000:]
        return one_line(err, *names)
    return fails


def run_with_slow_steps(trainer, argv, monkeypatch):
    """trainer.main(argv) with each optimizer step taking 0.1 s at least (then every patch is undone)."""
    step = trainer.optimizer_step
    monkeypatch.setattr(trainer, 'optimizer_step', lambda *a: time.sleep(0.1) or step(*a))
    trainer.main(argv)
    monkeypatch.undo()


def in_little_memory(*args, timeout=300):
    """`python ARGS` (as python() runs it) with 2.5 GB of address space: where a script would take what a
    crafted file names, it runs out at once instead of taking the machine's memory. Linux only."""
    import resource
    limit = int(2.5 * 2**30)
    return python(*args, env=ENV, timeout=timeout,
                  preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
