"""Tests for options.py: the one way every script reads its command line, and its --help.
Offline, a few seconds: python -m pytest -q tests/test_options.py"""
import ast
import errno
import glob
import importlib
import os
import re
import shlex
import signal
import subprocess
import sys
import types

import numpy as np
import pytest

import options
import prepare_data
from conftest import ENV, NEEDS_DEV_FULL, POSIX_ONLY, REPO, ended, one_line, python
from options import UsageError


DEFAULTS = dict(out_dir="out", max_iters=5000, lr=6e-4, compile=True, init_from=None,
                lr_decay_iters=5000, batch_size=12, start="\n")
PRESETS = {"shakespeare": dict(out_dir="out-shakespeare", max_iters=2000, batch_size=64),
           "tiny": dict(max_iters=10)}


def parse(*argv, presets=PRESETS):
    return options.parse(list(argv), DEFAULTS, presets=presets)


def test_no_args_gives_a_copy_of_the_defaults_and_a_bare_bool_is_true():
    config, set_keys = parse()
    assert config == DEFAULTS and config is not DEFAULTS and set_keys == set()
    config, set_keys = options.parse(["--compile", "--max_iters=3"], dict(DEFAULTS, compile=False))
    assert config["compile"] is True and config["max_iters"] == 3 and set_keys == {"compile", "max_iters"}
    assert DEFAULTS["compile"] is True and DEFAULTS["max_iters"] == 5000


BOOLS = [(raw, "compile", raw in ("True", "true", "1", "yes")) for raw in ("True", "False", "true", "false",
                                                                       "1", "0", "yes", "no")]
STRS = [(raw, "out_dir", raw) for raw in ("x/y", "3", "True", "None", "[1, 2]", "")]


@pytest.mark.parametrize("raw, key, want", BOOLS + STRS + [("300", "max_iters", 300), ("3", "lr", 3.0),
                                                          ("2.5e-5", "lr", 2.5e-5), ("-1e-3", "lr", -1e-3)])
def test_a_value_takes_the_type_of_its_default(raw, key, want):
    config, set_keys = parse(f"--{key}={raw}")
    assert config[key] == want and type(config[key]) is type(want) and set_keys == {key}


# each mistake: a UsageError (one line, exit 2, at the top level) naming what was wrong and what is right
# (a valid key, a preset), not its wording
MISTAKES = [(["--max-iters=9"], ["--max-iters", "--max_iters"]),
            (["--max_iters", "9"], ["--max_iters=9"]),
            (["--compile", "false"], ["--compile=false"]),
            (["--compile", "1"], ["--compile=1"]),
            (["--max_iters=3.5"], ["--max_iters", "'3.5'"]),
            (["--compile=maybe"], ["--compile", "'maybe'"]),
            (["--max_iter=3"], ["--max_iter", "batch_size", "--max_iters"]),
            # nanoGPT's config file, and its options that take another name here
            (["config/train.py"], ["'config/train.py'", "--config=NAME"]),
            (["--min_lr=6e-5"], ["--min_lr", "--min_lr_ratio"]),
            (["--decay_lr=false"], ["--decay_lr", "--min_lr_ratio=1"]),
            (["--eval_only"], ["--eval_only", "eval_gpt.py"]),
            (["--wandb_log=true"], ["log.jsonl", "plot.py"]),
            (["--backend=gloo"], ["--backend", "nccl"]),
            (["--max_iters"], ["--max_iters=5000"]),
            (["--start"], ["--start='\\n'"]),
            (["--config=shakespear"], ["'shakespear'", "tiny", "shakespeare?"]),
            (["--config"], ["--config=shakespeare"])]


@pytest.mark.parametrize("argv, names", MISTAKES)
def test_a_mistake_names_the_option_and_the_way_out(argv, names):
    with pytest.raises(UsageError) as e:
        parse(*argv)
    assert all(name in str(e.value) for name in names), str(e.value)


def test_nanogpts_options_where_a_script_lacks_them_point_to_what_takes_their_place():
    """(sample.py's --init_from: its --out_dir) A ratio takes 0 and 1, nothing outside."""
    with pytest.raises(UsageError) as e:
        options.parse(["--init_from=resume"], {"out_dir": "out"})
    assert "--out_dir" in str(e.value) and "ckpt.pt" in str(e.value)
    for value in (0.0, 1.0):
        assert options.parse([f"--r={value}"], {"r": 0.5}, ranges=dict(ratio=("r",)))[0]["r"] == value
    for value in (-0.1, 1.01):
        with pytest.raises(UsageError, match="--r"):
            options.parse([f"--r={value}"], {"r": 0.5}, ranges=dict(ratio=("r",)))


def test_a_typo_is_pointed_to_its_name_and_another_name_is_not():
    """A near miss of an option or a choice names it; a name that only looks alike (another meaning:
    --lr_decay is not --lr_decay_iters) is not suggested."""
    for argv, meant in ((["--max_itres=3"], "--max_iters?"), (["--lr_decay=3"], None)):
        with pytest.raises(UsageError) as e:
            parse(*argv)
        assert (meant in str(e.value)) if meant else "did you mean" not in str(e.value), str(e.value)
    # a short word one letter off a name is its typo; two letters of four are not (bs is no --bias)
    for typed, meant in (("--bs", None), ("--seeb", "--seed?")):
        with pytest.raises(UsageError) as e:
            options.parse([f"{typed}=8"], {"bias": False, "seed": 1})
        assert (meant in str(e.value)) if meant else "did you mean" not in str(e.value), str(e.value)
    for typed in ("sofmax", "SOFTMAX"):
        with pytest.raises(UsageError, match="softmax[?]"):
            options.parse([f"--attn={typed}"], {"attn": "tssa"}, choices={"attn": ("tssa", "softmax")})


def test_preset_applied_first_wherever_it_is_and_overridable():
    config, set_keys = parse("--max_iters=50", "--config=shakespeare")
    # the user's value beats the preset even though it came first
    assert config["max_iters"] == 50
    assert config["out_dir"] == "out-shakespeare" and config["batch_size"] == 64
    assert config["lr"] == DEFAULTS["lr"]
    # preset keys count as set
    assert set_keys == {"max_iters", "out_dir", "batch_size"}
    # its name is kept where `config` is a key
    config, _ = options.parse(["--config=tiny"], dict(DEFAULTS, config=""), presets=PRESETS)
    assert config["max_iters"] == 10 and config["config"] == "tiny"


def test_bare_words_set_the_positional_key():
    defaults = dict(runs=[], x="tokens", name="")
    config = options.parse(["a", "--x=seconds", "b"], defaults, positional="runs")[0]
    assert config == dict(runs=["a", "b"], x="seconds", name="")
    assert options.parse(["a"], defaults, positional="name")[0]["name"] == "a"
    with pytest.raises(UsageError, match="'b'"):
        options.parse(["a", "b"], defaults, positional="name")
    # bare words and the key itself: neither silently wins
    with pytest.raises(UsageError, match="--runs"):
        options.parse(["a", "--runs=b"], defaults, positional="runs")

# how a script ends, as the user sees it: the handler options installs when imported


# (the script after `import options, os, signal`, with TMP a temp folder holding a file `file`; its exit code;
# what its one line names): fail(), a UsageError, an OSError about a path under an option's and under none (a
# folder made where a file or a link to nothing is, or below a file, names it as such, not in the OS's words),
# and a Ctrl-C before `import torch` is done
TOP_LEVEL = [("options.fail('max_iters must be positive')", 2, ["max_iters must be positive"]),
             ("options.parse(['--lr=fast'], {'lr': 0.1})", 2, ["--lr", "fast"]),
             ("options.parse(['--out_dir=TMP/file'], {'out_dir': 'out'})\nos.makedirs('TMP/file/sub')", 2,
              ["TMP/file/sub", "--out_dir=TMP/file"]),
             ("options.parse(['--out_dir=TMP/file'], {'out_dir': 'out'})\n"
              "os.makedirs('TMP/file', exist_ok=True)", 2, ["TMP/file", "--out_dir=TMP/file"]),
             pytest.param("os.symlink('TMP/none', 'TMP/link')\n"
                          "options.parse(['--out_dir=TMP/link'], {'out_dir': 'out'})\n"
                          "os.makedirs('TMP/link', exist_ok=True)", 2,
                          ["TMP/link", "TMP/none", "--out_dir=TMP/link"], marks=POSIX_ONLY),
             ("open('TMP/file/meta.json')", 2, ["TMP/file/meta.json"]),
             # a device where a folder should be
             pytest.param("options.parse(['--out_dir=/dev/null'], {'out_dir': 'out'})\n"
                          "os.makedirs('/dev/null', exist_ok=True)", 2, ["/dev/null", "--out_dir=/dev/null"],
                          marks=POSIX_ONLY),
             ("open('TMP/none/x')", 2, ["TMP/none/x"]),
             # a bare word, under a folder option '.' that is above every relative path: the deepest names it
             ("options.parse(['nosuch'], {'output_folder': '.', 'runs': []}, positional='runs')\n"
              "open('nosuch/x')", 2, ["nosuch/x", "--runs=nosuch"]),
             # a write to a full disk says no path: the file open for writing where it failed is named
             ("def write(f):\n    raise OSError(28, 'No space left on device')\n"
              "write(open('TMP/log', 'a'))", 2, ["TMP/log"]),
             ("signal.raise_signal(signal.SIGINT)\nimport torch", 130, [])]


@pytest.mark.parametrize("code, exit_code, names", TOP_LEVEL)
def test_an_error_at_the_top_level_is_one_line_and_its_exit_code(tmp_path, code, exit_code, names):
    (tmp_path / "file").write_text("x")
    r = python("-c", "import options, os, signal\n" + code.replace("TMP", str(tmp_path)))
    ended(r, exit_code, *[name.replace("TMP", str(tmp_path)) for name in names])
    assert os.strerror(errno.EEXIST) not in r.stderr and os.strerror(errno.ENOTDIR) not in r.stderr


def test_a_program_of_the_users_own_keeps_pythons_ways_at_its_end(tmp_path):
    """A script outside the repository that imports one of ours (sample.load_gpt, readers): its exception is
    Python's traceback and exit 1, and what it wrote to a file it left open is flushed at exit."""
    mine = tmp_path / "mine.py"
    mine.write_text(f"import sys\nsys.path.insert(0, {REPO!r})\nimport readers\n"
                    f"f = open('results.csv', 'w')\nf.write('0,0')\nopen('none/x')\n")
    r = python(str(mine), cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" in r.stderr and "FileNotFoundError" in r.stderr
    assert (tmp_path / "results.csv").read_text() == "0,0"
    # a script read from stdin (`python -`), as `python -c`, is not one of the user's files: one line
    ended(python("-", input="import options\nraise options.UsageError('--x is wrong')\n"), 2, "--x")


@POSIX_ONLY
def test_a_script_of_ours_through_a_link_to_the_repository_ends_in_one_line(tmp_path):
    """A home folder that is a link (as on many clusters): train_gpt.py by the link's path is still ours."""
    (tmp_path / "repo").symlink_to(REPO)
    ended(python(str(tmp_path / "repo" / "train_gpt.py"), "--nope", cwd=tmp_path), 2, "--nope")


def test_out_of_memory_advises_a_smaller_batch_only_where_a_batch_was_computed(monkeypatch, capsys):
    """Computing a batch (eval_gpt's loss, outside any module): half the batch; building the model (a Linear's
    __init__), or at a batch of 1: none."""
    monkeypatch.setattr(options, "parsed", dict(batch_size=8, gradient_accumulation_steps=1))

    def split_loss():
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    def __init__():
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    for where, advised in ((split_loss, True), (__init__, False)):
        with pytest.raises(RuntimeError) as e:
            where()
        assert options.report(e.value) == 2
        err = capsys.readouterr().err
        one_line(err)
        assert ("--batch_size=4" in err and "--gradient_accumulation_steps=2" in err) == advised
    monkeypatch.setattr(options, "parsed", dict(batch_size=1, gradient_accumulation_steps=1))
    with pytest.raises(RuntimeError) as e:
        split_loss()
    options.report(e.value)
    assert "--batch_size" not in one_line(capsys.readouterr().err)
    # numpy's: an array of a count past the memory (a billion micro-steps' window starts), no batch advice
    monkeypatch.setattr(options, "parsed", dict(batch_size=8, gradient_accumulation_steps=2 ** 30))
    with pytest.raises(MemoryError) as e:
        np.random.default_rng(0).integers(0, 10, size=2 ** 50)
    assert options.report(e.value) == 2
    assert "--batch_size" not in one_line(capsys.readouterr().err)


# gloo's words where the process at the other end of a collective has ended
PEER_GONE = "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:27802: Connection reset by peer."


@POSIX_ONLY
def test_a_collective_cut_off_by_another_process_is_one_line_and_waits_to_be_stopped():
    """Under torchrun: rank 0 says it in one line, then waits for torchrun's SIGTERM, so that torchrun names
    the process that ended first as the failure (it dies of the signal, which Windows does not say)."""
    code = f"import options\nraise RuntimeError({PEER_GONE!r})"
    with subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, RANK="0", LOCAL_RANK="0")) as p:
        line = p.stderr.readline()
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=1)
        p.terminate()
        assert p.wait(timeout=60) == -signal.SIGTERM and p.stderr.read() == ""
    one_line(line)


def test_a_collective_cut_off_or_a_mistake_is_said_by_rank_0_alone(monkeypatch, capsys):
    """The other ranks say nothing. Another RuntimeError, or this one outside torchrun, is a bug. A rank that
    keeps quiet about a mistake waits for rank 0 to say it."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert options.report(RuntimeError(PEER_GONE)) == 1 and capsys.readouterr().err == ""
    # A mistake every rank finds: one that keeps quiet waits too, so that rank 0 is the one named, its line
    # shown (before the ranks meet, any may end first).
    slept = []
    monkeypatch.setattr(options, "exit_code", [])
    monkeypatch.setattr(options.time, "sleep", slept.append)
    options.excepthook(UsageError, UsageError("--n_head=3 does not divide --n_embd=32"), None)
    assert slept == [5] and capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    options.excepthook(UsageError, UsageError("--n_head=3 does not divide --n_embd=32"), None)
    assert slept == [5] and options.exit_code == [2, 2]
    one_line(capsys.readouterr().err, "--n_head=3")
    monkeypatch.setenv("RANK", "1")
    assert options.report(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
    monkeypatch.delenv("LOCAL_RANK")
    assert options.report(RuntimeError(PEER_GONE)) is None


def test_a_rank_left_in_the_environment_outside_torchrun_silences_nothing(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert options.report(UsageError("--batchsize is not an option")) == 2
    assert "rank" not in one_line(capsys.readouterr().err, "--batchsize")
    assert options.report(RuntimeError(PEER_GONE)) is None


def test_a_whole_write_names_its_file_but_not_another_one(tmp_path):
    """write_whole: a full disk names the target and keeps the earlier file; an error about another file
    (a program matplotlib runs for a .pgf) stays that file's. No temp file is left either way."""
    path = str(tmp_path / "x")
    options.write_whole(path, lambda f: f.write("earlier"))

    def full(f):
        raise OSError(28, "No space left on device")

    def needs_a_program(f):
        raise FileNotFoundError(2, "No such file or directory", "xelatex")

    for write, named in ((full, path), (needs_a_program, "xelatex")):
        with pytest.raises(OSError) as e:
            options.write_whole(path, write)
        assert e.value.filename == named
        assert os.listdir(tmp_path) == ["x"] and open(path).read() == "earlier"


@POSIX_ONLY
def test_a_whole_write_never_writes_through_a_link_at_its_temp_files_name(tmp_path):
    """A run's folder from elsewhere could hold a link by the temp file's name (it has the pid in it): the
    link goes, and what it leads to is kept."""
    mine = tmp_path / "mine"
    mine.write_text("mine")
    path = str(tmp_path / "x")
    os.symlink(mine, f"{path}.tmp-{os.getpid()}")
    options.write_whole(path, lambda f: f.write("new"))
    assert mine.read_text() == "mine" and open(path).read() == "new"
    assert sorted(os.listdir(tmp_path)) == ["mine", "x"]


def test_a_whole_write_reaches_the_disk_before_and_after_its_rename(tmp_path, monkeypatch):
    """The file's bytes are synced before it replaces the earlier one, and the folder after: a crash (power
    lost) leaves one of the two files whole, never a renamed empty one."""
    path = str(tmp_path / "x")
    calls = []
    sizes = []
    fsync = os.fsync
    replace = os.replace

    def synced(fd):
        calls.append(("fsync", os.fstat(fd).st_ino))
        sizes.append(os.fstat(fd).st_size)
        fsync(fd)
    monkeypatch.setattr(os, "fsync", synced)
    monkeypatch.setattr(os, "replace", lambda a, b: calls.append(("replace", b)) or replace(a, b))
    options.write_whole(path, lambda f: f.write("whole"))
    assert calls == [("fsync", os.stat(path).st_ino), ("replace", path), ("fsync", os.stat(tmp_path).st_ino)]
    # What Python buffers is flushed before the sync: the bytes synced are the whole file's.
    assert sizes[0] == len("whole")


def test_a_command_to_copy_is_quoted_for_the_shell_of_its_system(monkeypatch):
    """A folder with a space and a backslash: POSIX shells take single quotes, Windows' cmd.exe double."""
    args = ["python", "sample.py", "--out_dir=runs\\my demo"]
    assert shlex.split(options.shell_join(args)) == args
    monkeypatch.setattr(options, "os", types.SimpleNamespace(name="nt"))
    assert options.shell_join(args) == 'python sample.py "--out_dir=runs\\my demo"'


def test_a_whole_write_waits_for_a_file_another_process_holds(tmp_path, monkeypatch):
    """Windows refuses to replace a file another process has open (a sample.py reading the checkpoint): there
    the rename is tried again, and only a file held for good ends in an error that names it."""
    path = str(tmp_path / "x")
    replace = os.replace
    refusals = []

    def held(src, dst, times):
        if len(refusals) < times:
            refusals.append(dst)
            raise PermissionError(13, "Permission denied", dst)
        replace(src, dst)
    monkeypatch.setattr(options.time, "sleep", lambda s: None)
    monkeypatch.setattr(options.os, "replace", lambda src, dst: held(src, dst, 3))
    # Elsewhere the refusal is for good (a file another user owns under the sticky bit): no wait.
    with pytest.raises(PermissionError):
        options.write_whole(path, lambda f: f.write("new"))
    assert len(refusals) == 1
    refusals.clear()
    monkeypatch.setattr(options.os, "name", "nt")
    options.write_whole(path, lambda f: f.write("new"))
    assert open(path, encoding="utf-8").read() == "new" and len(refusals) == 3
    refusals.clear()
    monkeypatch.setattr(options.os, "replace", lambda src, dst: held(src, dst, 100))
    with pytest.raises(PermissionError) as e:
        options.write_whole(path, lambda f: f.write("newer"))
    assert e.value.filename == path and os.listdir(tmp_path) == ["x"]


def test_a_ctrl_c_under_torchrun_ends_a_line_on_rank_0_only(monkeypatch, capsys):
    """A line of text Ctrl-C cut (a sample) ends first. Every process gets the terminal's Ctrl-C: the others
    print nothing, not an empty line each."""
    for rank, out in (("0", "\n"), ("1", "")):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", rank)
        assert options.report(KeyboardInterrupt()) == 130
        assert capsys.readouterr().out == out


SLEEP = "import options, sys, time\ntime.sleep(0.5)\n"


# `| head`: the reader leaves first. Printed text, flushed or not, ends quietly (exit 141); a trainer's --help
# and the bench's tables as well. `> /dev/full`: one line that names stdout, exit 2. (More than a pipe holds
# waits for the reader: no pause needed.)
@pytest.mark.parametrize("argv", [["-c", "import options\nprint('x' * 100000, flush=True)"],
                                  ["-c", SLEEP + "print('some text', flush=False)"],
                                  ["train_gpt.py", "--help"],
                                  pytest.param(["-m", "tools.bench", "--smoke", "--sections=operator"],
                                               marks=pytest.mark.slow)])
@NEEDS_DEV_FULL
def test_a_closed_stdout_ends_quietly_and_a_full_one_is_one_line(argv):
    # As a shell runs it: stdout buffered, so what is still in the buffer is written at exit.
    env = {k: v for k, v in ENV.items() if k != "PYTHONUNBUFFERED"}
    with subprocess.Popen([sys.executable, *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env) as p:
        p.stdout.close()
        assert (p.wait(timeout=120), p.stderr.read()) == (141, "")
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, *argv], cwd=REPO, stdout=full, stderr=subprocess.PIPE, text=True,
                           env=env, timeout=120)
    ended(r, 2, "stdout")


@POSIX_ONLY
def test_a_closed_stderr_keeps_its_lines_out_of_stdout():
    """`2>&-`: Python's sys.stderr is None, where print() writes to stdout; an error (or a note) goes nowhere,
    not into the samples."""
    r = python("sample.py", "--out_dir=nowhere", preexec_fn=lambda: os.close(2))
    assert (r.returncode, r.stdout) == (2, "")


def test_a_closed_pipe_on_windows_ends_quietly(monkeypatch, capsys):
    """Windows raises OSError(EINVAL), not BrokenPipeError, writing to a pipe whose reader has left; an
    invalid argument about a path (a name Windows refuses) is an error naming it."""
    # os.name is put back before anything fails: pytest's report of a failure would take this for Windows
    with monkeypatch.context() as m:
        m.setattr(options.os, "name", "nt")
        code = options.report(OSError(errno.EINVAL, "Invalid argument"))
        named = options.report(OSError(errno.EINVAL, "Invalid argument", "bad:name"))
    said = capsys.readouterr()
    assert (code, named, said.out) == (141, 2, "") and "bad:name" in one_line(said.err)


@pytest.mark.parametrize("full", [False, pytest.param(True, marks=NEEDS_DEV_FULL)], ids=["closed", "full"])
def test_say_lets_a_closed_or_full_stdout_go_and_says_so_once(full):
    """say() lets the pipe (or a full /dev/full) go and the script goes on (a run saves after its reader is
    gone), with one line on stderr naming stdout, however often it says more."""
    argv = ["-c", SLEEP + "for i in range(3): options.say('x' * 100000)\nsys.exit('done')"]
    with open("/dev/full" if full else os.devnull, "w") as device:
        with subprocess.Popen([sys.executable, *argv], cwd=REPO, stderr=subprocess.PIPE, text=True,
                              stdout=device if full else subprocess.PIPE, env=ENV) as p:
            if not full:
                p.stdout.close()
            assert p.wait(timeout=120) == 1
            lines = p.stderr.read().splitlines()
    assert len(lines) == 2 and "stdout" in lines[0] and lines[1] == "done"


def test_what_stdout_cannot_encode_is_printed_as_a_question_mark():
    r = subprocess.run([sys.executable, "-c", "import options; print('caf\\xe9')"], cwd=REPO,
                       capture_output=True, env=dict(os.environ, PYTHONIOENCODING="ascii"), timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"caf?\n", b"")


@pytest.mark.parametrize("system, told, out, err", [
    ("nt", {}, "caf\xe9 \u2603".encode(), "caf\xe9 \u2603".encode()),
    ("nt", {"PYTHONIOENCODING": "latin-1"}, b"caf\xe9 ?", b"caf\xe9 \\u2603"),
    # (LC_ALL=C: POSIX's ascii locale)
    pytest.param("posix", {}, b"caf? ?", b"caf\\xe9 \\u2603", marks=POSIX_ONLY)])
def test_output_redirected_on_windows_is_utf8_unless_told_otherwise(system, told, out, err):
    """Windows writes a stdout and a stderr redirected to a file in its ANSI code page (ascii stands in for it
    here): in UTF-8 instead, unless PYTHONIOENCODING names an encoding; elsewhere the locale's, as it was."""
    env = {k: v for k, v in ENV.items() if k != "PYTHONIOENCODING"}
    env.update(LC_ALL="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0", **told)
    code = (f"import os, sys\nos.name = {system!r}\nimport options\nprint('caf\\xe9 \\u2603')\n"
            f"print('caf\\xe9 \\u2603', file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, env=env, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, out + b"\n", err + b"\n")


SCRIPTS = ("train_gpt", "train_vit", "sample", "eval_gpt", "plot", "prepare_data", "tools.bench",
           "tools.study")


def test_every_script_imports_where_fcntl_does_not_exist():
    """Windows has no fcntl, and msvcrt (a stand-in here, after subprocess, which takes it for Windows) locks
    the out_dir: each script imports."""
    r = python("-c", "import subprocess, sys, types\nsys.modules['fcntl'] = None\n"
                "sys.modules['msvcrt'] = types.SimpleNamespace(LK_NBLCK=2, locking=lambda *a: None)\n"
                f"import {', '.join(SCRIPTS)}\n"
                "import train_common\n"
                "train_common.make_out_dir('out-nolock-test', [], False, True, True).close()\n"
                "import os; os.remove('out-nolock-test/.lock'); os.rmdir('out-nolock-test')")
    assert r.returncode == 0, r.stderr


def test_every_text_file_the_scripts_open_is_utf8():
    """Windows reads and writes text in its locale's code page unless told: every open() of text in the
    scripts and tools names utf-8, so a meta.json or log.jsonl reads back the same on every system, and so
    does every child's output read as text."""
    unnamed = []
    for path in glob.glob(os.path.join(REPO, "*.py")) + glob.glob(os.path.join(REPO, "*", "*.py")):
        if os.path.basename(os.path.dirname(path)) == "tests" or path.endswith("test_tost.py"):
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for call in [node for node in ast.walk(tree) if isinstance(node, ast.Call)]:
            builtin = isinstance(call.func, ast.Name)
            name = call.func.id if builtin else getattr(call.func, "attr", "")
            keys = [k.arg for k in call.keywords]
            if name == "run" and "text" in keys:
                unnamed.append(f"{os.path.relpath(path, REPO)}:{call.lineno} text=True")
            if not (name == "open" and builtin or name in TEXT_IO):
                continue
            modes = [k.value for k in call.keywords if k.arg == "mode"] + call.args[1:2] * (name == "open")
            binary = any(isinstance(m, ast.Constant) and "b" in m.value for m in modes)
            if not binary and "encoding" not in [k.arg for k in call.keywords]:
                unnamed.append(f"{os.path.relpath(path, REPO)}:{call.lineno}")
    assert not unnamed


TEXT_IO = ("read_text", "write_text")


def test_every_script_imports_options_before_torch():
    for name in SCRIPTS:
        path = os.path.join(REPO, *name.split(".")) + ".py"
        with open(path, encoding="utf-8") as f:
            imports = [line.split()[1] for line in f if re.match(r"(import|from) \w", line)]
        # os and sys first where a script puts the repository on sys.path (tools/, lecture/): built in, quick
        assert [i for i in imports if i not in ("os", "sys")][0] == "options", name

# ranges


def test_a_value_that_begins_with_a_tilde_is_under_the_home_folder(tmp_path, monkeypatch, fails):
    """bash expands no ~ after `=`: --out_dir=~/run would be a folder named ~ in the current one. Every text
    option, bare words and list options too, but free text (a prompt, a title); a ~ further on is the
    value's own."""
    monkeypatch.setenv("HOME", str(tmp_path))
    defaults = dict(out_dir="out", runs=[], title="", name="")
    argv = ["--out_dir=~/run", "~/a", "~", "--title=~/x", "--name=x~"]
    config, _ = options.parse(argv, defaults, positional="runs", text=("title",))
    assert config == dict(out_dir=f"{tmp_path}/run", runs=[f"{tmp_path}/a", str(tmp_path)], title="~/x",
                          name="x~")
    assert options.parse(["--runs=~/b"], defaults)[0]["runs"] == [f"{tmp_path}/b"]
    # a script: sample.py looks for the checkpoint there (test_sample: a prompt file); a prompt is as typed
    import sample
    fails(sample.main, ["--out_dir=~/x"], f"{tmp_path}/x/ckpt.pt")
    import plot
    # (the parse each script does, with its own free-text keys: stopped there)
    seen = []

    def parse(*args, **kwargs):
        seen.append(options.parse(*args, **kwargs)[0])
        raise options.UsageError("stop here")
    monkeypatch.setattr(sample, "parse", parse)
    monkeypatch.setattr(plot, "parse", parse)
    for main, argv in ((sample.main, ["--start=~/x"]), (plot.main, ["out", "--title=~/x"])):
        with pytest.raises(options.UsageError):
            main(argv)
    assert (seen[0]["start"], seen[1]["title"], seen[1]["runs"]) == ("~/x", "~/x", ["out"])


def test_numbers_are_finite_and_in_the_range_the_table_gives():
    """A seed: what every generator takes."""
    defaults = dict(lr=0.1, steps=10, drop=0.0, out="out", wd=0.1, seed=1)
    ranges = dict(positive=("lr", "steps"), fraction=("drop",), nonempty=("out",), nonnegative=("wd",),
                  seed=("seed",))
    config = options.parse(["--lr=1e-5", "--wd=0", "--seed=4294967295"], defaults, ranges=ranges)[0]
    assert (config["lr"], config["wd"], config["seed"]) == (1e-5, 0, 2**32 - 1)
    for arg in ("--lr=inf", "--lr=nan", "--lr=-1", "--steps=0", "--drop=1", "--drop=-0.1", "--out= ",
                "--wd=-1", "--seed=-1", "--seed=4294967296"):
        with pytest.raises(UsageError, match=arg.split("=")[0]):
            options.parse([arg], defaults, ranges=ranges)
    # any number, with no range given; a whole number as large as 2**32 is no count or size
    for arg in ("--x=-inf", "--n=4294967296", "--n=-9223372036854775808"):
        with pytest.raises(UsageError, match=arg.split("=")[0]):
            options.parse([arg], dict(x=1.0, n=1))


def test_a_value_outside_its_choices_is_refused_before_any_work(fails):
    assert options.parse(["--kind=b"], dict(kind="a"), choices=dict(kind=("a", "b")))[0]["kind"] == "b"
    with pytest.raises(UsageError, match="--kind"):
        options.parse(["--kind=c"], dict(kind="a"), choices=dict(kind=("a", "b")))
    fails(prepare_data.main, ["text", "--input=no/such/file.txt", "--tokenizer=sp"], "--tokenizer")


@pytest.mark.parametrize("script", ["train_gpt", "train_vit", "sample"])
def test_a_seed_no_generator_takes_is_refused(fails, script):
    fails(importlib.import_module(script).main, ["--seed=18446744073709551616"], "--seed")


HELPED = '''"""Doc."""
DEFAULTS = dict(
    # data
    lr=0.1,          # the learning rate
    flag=False,      # a switch
)
'''


def test_help_is_the_docstring_and_the_defaults_as_values(tmp_path, capsys):
    src = tmp_path / "script.py"
    src.write_text(HELPED)
    defaults = dict(lr=6e-3 / 10, flag=False)
    with pytest.raises(SystemExit) as e:
        options.parse(["--lr=1", "-h"], defaults, "  Doc.\n", str(src), {"demo": {}, "big": {}})
    assert e.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["Doc.", ""] and lines[2].endswith("demo, big:") and lines[3] == "  # data"
    assert [line.split() for line in lines[4:]] == [[f"--lr={6e-3 / 10}", "#", "the", "learning", "rate"],
                                                    ["--flag=False", "#", "a", "switch"]]
    # with a preset: the values it sets, after the defaults it replaces
    with pytest.raises(SystemExit):
        options.parse(["--config=big", "--help"], defaults, "  Doc.\n", str(src), {"big": {"flag": True}})
    assert capsys.readouterr().out.splitlines()[-1] == "--config=big sets --flag=True"
    # a preset of the defaults (the demo) says so, not an empty list
    with pytest.raises(SystemExit):
        options.parse(["--config=same", "--help"], defaults, "  Doc.\n", str(src), {"same": {}})
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("--config=same sets") and last.partition(" sets")[2].strip()


@pytest.mark.parametrize("script, shown", [
    ("train_gpt", ["python train_gpt.py --config=shakespeare", "  --learning_rate=0.006"]),
    ("train_vit", ["python train_vit.py --dataset=cifar10", "  --label_smoothing=0.1",
                   "--master_port=29500 \\\n        train_vit.py --"])])
def test_a_trainers_help_shows_its_commands_and_defaults(capsys, script, shown):
    """A trainer's help is its own docstring (its commands: train_vit's two-node ones stay two lines each)
    and its defaults (a help's parts in general: test_help_is_the_docstring_and_the_defaults_as_values)."""
    with pytest.raises(SystemExit) as e:
        importlib.import_module(script).main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert all(text in out for text in shown)


KEY = re.compile(r"^  --(\w+)=.*?(#.*)?$")


def test_every_script_documents_every_key():
    """The help of each script shows each key with a comment: no key of any table goes unexplained."""
    import eval_gpt, plot, prepare_data, sample, train_gpt, train_vit
    from tools import bench, gpu_check, study
    for module in (eval_gpt, plot, prepare_data, sample, train_gpt, train_vit, bench, study, gpu_check):
        text = options.help_text(module.__doc__, module.DEFAULTS, module.__file__)
        rows = dict(m.groups() for m in map(KEY.match, text.splitlines()) if m)
        assert set(rows) == set(module.DEFAULTS), module.__name__
        assert all(rows.values()), (module.__name__, [k for k, v in rows.items() if not v])


@pytest.mark.parametrize("arg", ["--json=", "--json=README.md", "--device=gpu"])
def test_gpu_check_refuses_a_bad_json_or_device_before_it_measures(arg, tmp_path, monkeypatch):
    """Not a .json file (it would be replaced), a device that is none: one line naming the option."""
    from tools import gpu_check
    monkeypatch.chdir(tmp_path)
    (tmp_path / "README.md").write_text("# the project")
    with pytest.raises(UsageError, match=arg.split("=")[0].lstrip("-")):
        gpu_check.main(["--smoke", arg])
    assert (tmp_path / "README.md").read_text() == "# the project"


def test_a_path_given_as_file_colon_path_names_its_option():
    """sample.py's --start=FILE:path: an error about that path names --start."""
    options.parse(['--start=FILE:/nowhere/prompt.txt'], {'start': '\n', 'out_dir': 'out'})
    assert options.option_of('/nowhere/prompt.txt') == ' (--start=FILE:/nowhere/prompt.txt)'
    assert options.option_of('/elsewhere/prompt.txt') == ''
    # A relative option and an absolute path below it, and the other way round.
    options.parse(['--out_dir=runs/a'], {'out_dir': 'out'})
    assert options.option_of(os.path.abspath('runs/a/ckpt.pt')) == ' (--out_dir=runs/a)'
    options.parse([f'--out_dir={os.path.abspath("runs/a")}'], {'out_dir': 'out'})
    assert options.option_of('runs/a/ckpt.pt').startswith(' (--out_dir=')
    # The working folder names what is directly in it, not every relative path below it.
    options.parse(['--out_dir=.', '--data_dir=..'], {'out_dir': 'out', 'data_dir': 'data'})
    assert options.option_of('ckpt.pt') == options.option_of('.') == ' (--out_dir=.)'
    assert options.option_of('gone/log.jsonl') == ' (--data_dir=..)'
    # A folder on the way to a file's path (plot's --out) names it; the working folder does not.
    options.parse(['--out=ro/sub/a.png'], {'out': 'runs.png'})
    assert options.option_of('ro/sub') == options.option_of('ro') == ' (--out=ro/sub/a.png)'
    assert options.option_of(os.getcwd()) == options.option_of('.') == ''
    # plot's own --out_dir=. beside it: a folder in the working one on the way to --out is --out's
    options.parse(['--out=figs/a.png'], {'out': 'runs.png', 'out_dir': '.'})
    assert options.option_of('figs') == ' (--out=figs/a.png)'
    assert options.option_of('a.png') == ' (--out_dir=.)'
    # An option the path is under comes first; a value that ends in ':' names no path.
    options.parse(['--data_dir=d', '--out_dir=d/out'], {'data_dir': 'data', 'out_dir': 'out'})
    assert options.option_of('d') == ' (--data_dir=d)'
    # Two options that are the path: the one the script lists first (prepare_data's --input, then --name)
    for typed in ('notes', 'notes/'):
        options.parse(['--name=notes', f'--input={typed}'], {'input': '', 'name': ''})
        assert options.option_of(typed) == f' (--input={typed})'
    options.parse(['--start=Question:'], {'start': '\n'})
    assert options.option_of(os.getcwd()) == ''
    # FILE:~/path, the home folder expanded
    options.parse(['--start=FILE:~/nosuch.txt'], {'start': '\n'})
    assert options.option_of(os.path.expanduser('~/nosuch.txt')) == ' (--start=FILE:~/nosuch.txt)'


@POSIX_ONLY
def test_a_ctrl_c_while_torch_imports_is_held_until_the_options_are_parsed():
    """A script of the repository that parses its options: torch imports whole, then parse() ends the script,
    exit 130, one line; so too a Ctrl-C while options itself imports. A module of it run as a script that
    parses nothing holds nothing."""
    main = "import sys; sys.modules['__main__'].__file__ = {!r}\n"
    code = (main.format(os.path.join(REPO, 'sample.py')) +
            "import options, os, signal\nos.kill(os.getpid(), signal.SIGINT)\nimport torch\n"
            "print('torch loaded', flush=True)\noptions.parse([], {})\nprint('parsed')")
    r = python("-c", code)
    ended(r, 130)
    assert r.stdout.splitlines()[0] == "torch loaded" and "parsed" not in r.stdout
    # the Ctrl-C comes as options imports difflib
    code = (main.format(os.path.join(REPO, 'sample.py')) + "import os, signal\n"
            "class Kick:\n    def find_spec(self, name, path, target=None):\n"
            "        if name == 'difflib':\n            os.kill(os.getpid(), signal.SIGINT)\n"
            "sys.meta_path.insert(0, Kick())\nimport options\nprint('imported', flush=True)\n"
            "options.parse([], {})\nprint('parsed')")
    r = python("-c", code)
    ended(r, 130)
    assert r.stdout.splitlines()[0] == "imported" and "parsed" not in r.stdout
    code = main.format(os.path.join(REPO, 'readers.py')) + "import readers, signal\n"
    r = python("-c", code + "print(signal.pthread_sigmask(signal.SIG_BLOCK, []))")
    assert r.stdout.strip() == "set()", r.stderr
    # nor a notebook's kernel, where `%run derivation.py` names the script but never parses (the kernel's
    # interrupts would be held for good)
    code = main.format(os.path.join(REPO, 'derivation.py')) + "sys.modules['ipykernel'] = sys\n"
    r = python("-c", code + "import options, signal\nprint(signal.pthread_sigmask(signal.SIG_BLOCK, []))")
    assert r.stdout.strip() == "set()", r.stderr
    # nor does a script read from stdin, in the repository's folder (its name, '<stdin>', is no file there)
    r = python("-", input="import readers, signal\nprint(signal.pthread_sigmask(signal.SIG_BLOCK, []))")
    assert r.stdout.strip() == "set()", r.stderr


# what a mutation audit found unpinned

def test_a_ctrl_c_inside_a_whole_write_leaves_the_earlier_file_and_no_temp(tmp_path):
    path = str(tmp_path / "x")
    options.write_whole(path, lambda f: f.write("earlier"))

    def interrupted(f):
        f.write("part")
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        options.write_whole(path, interrupted)
    assert os.listdir(tmp_path) == ["x"] and open(path).read() == "earlier"


def test_a_seed_of_0_is_taken():
    config = options.parse(["--seed=0"], dict(seed=1), ranges=dict(seed=("seed",)))[0]
    assert config["seed"] == 0


def test_a_whole_write_that_cannot_open_its_temp_file_names_the_file_asked(tmp_path):
    path = str(tmp_path / "no" / "x")
    with pytest.raises(OSError) as e:
        options.write_whole(path, lambda f: f.write("x"))
    assert e.value.filename == path


def test_a_whole_write_of_text_is_utf8_whatever_the_locale(tmp_path):
    path = str(tmp_path / "x")
    env = dict(os.environ, LC_ALL="C", PYTHONCOERCECLOCALE="0", PYTHONUTF8="0", PYTHONPATH=REPO)
    code = f"import options\noptions.write_whole({path!r}, lambda f: f.write('caf\\xe9'))"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert open(path, "rb").read() == "caf\xe9".encode("utf-8")


def test_a_path_beside_a_folder_option_whose_name_it_begins_with_names_no_option():
    options.parse(["--out_dir=run"], {"out_dir": "out"})
    assert options.option_of("run2/ckpt.pt") == ""
    assert options.option_of("run/ckpt.pt") == " (--out_dir=run)"


def test_an_empty_text_option_is_above_no_path():
    """plot's --title='' (its default) is no folder: an error about a path does not name it."""
    options.parse([], {"title": "", "out": "runs.png"})
    assert options.option_of("speed.png") == ""


@POSIX_ONLY
def test_an_invalid_argument_off_windows_is_an_error_not_a_closed_pipe(monkeypatch, capsys):
    monkeypatch.setattr(options, "parsed", {})
    # raised, as an OSError that ends a script is: it has a traceback
    with pytest.raises(OSError) as e:
        raise OSError(errno.EINVAL, "Invalid argument")
    assert options.report(e.value) == 2
    one_line(capsys.readouterr().err)


# A CPU's allocator, and a Mac GPU's (MPS): each a RuntimeError naming itself.
CPU_OUT = ("[enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate memory: you "
           "tried to allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)")


@pytest.mark.parametrize("batch, steps, says", [(2, 3, CPU_OUT),
                                                (9, 5, "MPS backend out of memory (MPS allocated: 17 GiB)")])
def test_out_of_memory_advice_keeps_the_tokens_a_step(monkeypatch, capsys, batch, steps, says):
    monkeypatch.setattr(options, "parsed", dict(batch_size=batch, gradient_accumulation_steps=steps))
    assert options.report(RuntimeError(says)) == 2
    err = capsys.readouterr().err
    assert f"--batch_size={batch // 2} " in err and f"--gradient_accumulation_steps={2 * steps} " in err
    # what it tried to allocate is said
    assert "68719476736 bytes" in err or "MPS" in err
    # (Windows' condition is another)
    windows = CPU_OUT.replace("err == 0.", "data.").replace("can't allocate memory", "not enough memory")
    assert options.first_line(RuntimeError(windows)).startswith("DefaultCPUAllocator")


@pytest.mark.parametrize("name", ["InductorError", "BackendCompilerFailed"])
def test_a_compile_that_fails_is_one_line_naming_compile(monkeypatch, capsys, name):
    failed = type(name, (Exception,), {})
    assert options.report(failed("C++ compile error\nlong log")) == 2
    assert "--compile=false" in capsys.readouterr().err


def test_a_path_missing_is_the_first_path_not_the_second(capsys):
    """os.rename(src, dst) with no src: src is named (the second is only named for a full disk)."""
    assert options.report(FileNotFoundError(errno.ENOENT, "No such file or directory", "src.txt", None,
                                            "dst.txt")) == 2
    err = capsys.readouterr().err
    assert "src.txt" in err and "dst.txt" not in err


def test_out_of_memory_on_another_rank_says_so_itself(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(options, "parsed", {})
    assert options.report(MemoryError()) == 2
    assert "out of memory" in capsys.readouterr().err


def test_a_ctrl_c_or_a_bug_on_a_quiet_rank_does_not_wait(monkeypatch, capsys):
    slept = []
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(options, "exit_code", [])
    monkeypatch.setattr(options.time, "sleep", slept.append)
    options.excepthook(KeyboardInterrupt, KeyboardInterrupt(), None)
    assert slept == [] and options.exit_code == [130]


def test_a_list_option_given_with_its_key_is_one_word_as_typed():
    """--runs=a,b is the one folder 'a,b' (bare words are the way to give several)."""
    assert options.parse(["--runs=a,b"], dict(runs=[]))[0]["runs"] == ["a,b"]


@pytest.mark.parametrize("launcher", ["ipykernel_launcher.py", "colab_kernel_launcher.py"])
def test_main_called_from_a_notebook_cell_takes_the_defaults(monkeypatch, launcher):
    monkeypatch.setattr(options, "kernel", True)
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))     # a kernel's: no file
    monkeypatch.setattr(sys, "argv", [f"/usr/lib/python3/site-packages/{launcher}", "-f", "k.json"])
    assert options.parse(None, dict(max_iters=5))[0] == dict(max_iters=5)
    # `%run train_gpt.py --max_iters=3` in the kernel: the script's own
    monkeypatch.setattr(sys.modules["__main__"], "__file__", "train_gpt.py", raising=False)
    monkeypatch.setattr(sys, "argv", ["train_gpt.py", "--max_iters=3"])
    assert options.parse(None, dict(max_iters=5))[0] == dict(max_iters=3)
    # `%run -i` leaves __file__ behind, with the kernel's command line back
    monkeypatch.setattr(sys, "argv", [f"/usr/lib/python3/site-packages/{launcher}", "-f", "k.json"])
    assert options.parse(None, dict(max_iters=5))[0] == dict(max_iters=5)
    # nor does a script end the kernel on a stop signal: the kernel's manager sends one (from Python's own
    # handling, whatever an earlier test left)
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        options.stop_as_ctrl_c()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_switch_then_a_bare_word_sets_both():
    for word in ("a", "1"):                        # python -m lecture.exercises --solutions 1
        config = options.parse(["--flag", word], dict(flag=False, runs=[]), positional="runs")[0]
        assert config == dict(flag=True, runs=[word])


def test_a_full_disk_in_a_copy_names_the_file_written(capsys):
    """shutil's copy says the source first: the file written (the second) is named."""
    assert options.report(OSError(errno.ENOSPC, "No space left on device", "src.txt", None, "dst.txt")) == 2
    err = capsys.readouterr().err
    assert "dst.txt" in err and "src.txt" not in err


def test_an_error_line_shows_the_control_characters_of_what_it_quotes(capsys):
    """A name read from a file, with a terminal's escape sequences (retitle the window, clear the screen) and
    a C1 control, is one line that still names it, and holds no control character."""
    assert options.report(options.UsageError("meta.json names \x1b]0;title\x07 \x1b[2Jx\x9b1m")) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "title" in err
    assert all(c.isprintable() for c in err.rstrip("\n")), repr(err)


def test_a_config_read_from_a_file_takes_no_bool_for_a_number_nor_a_control_character():
    with pytest.raises(UsageError, match="ckpt.pt"):
        options.check_config({"max_iters": True}, {"max_iters": 100}, {}, {}, "ckpt.pt")
    with pytest.raises(UsageError, match="ckpt.pt"):
        options.check_config({"data_dir": "my\x1b[2Jdata"}, {"data_dir": "data"}, {}, {}, "ckpt.pt")
    # a no-break space (a macOS screenshot's name has one) is no control character
    options.check_config({"data_dir": "my\u00a0data\u202f"}, {"data_dir": "data"}, {}, {}, "ckpt.pt")


@pytest.mark.parametrize("script", ["sample", "prepare_data", "plot", "train_gpt", "train_vit", "eval_gpt"])
def test_torchrun_starts_only_the_scripts_made_for_several_processes(monkeypatch, capsys, script):
    """torchrun with 2 processes: a script of one process would run twice (every sample printed twice, the
    same files written at once), so it ends at once, exit 2, in one line naming it; the trainers and eval_gpt
    go on past their options to a check of their own. --help prints its page once, on rank 0."""
    module = importlib.import_module(script)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit):
        module.main(["--help"])
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UsageError) as e:
        module.main(["--data_dir=nowhere", "--out_dir=nowhere"] if script not in ("plot", "prepare_data")
                    else ["nowhere"])
    one_process = script in ("sample", "prepare_data", "plot")
    assert (e.traceback[-1].name == "parse") == one_process
    assert (f"{script}.py" in str(e.value)) == one_process
    # torchrun of one process runs it once: its options are read
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert options.parse(["--x=2"], {"x": 1})[0] == {"x": 2}


# Each number of the trainers, with its range written out here, not read from their RANGES: a key dropped
# from a table is still tried (a 0 or a -1 was a ZeroDivisionError or numpy's error, or trained nothing).
TRAINER_RANGES = {
    "train_gpt": dict(positive="block_size batch_size gradient_accumulation_steps n_layer n_head n_embd "
                               "eval_interval eval_iters log_interval learning_rate max_iters",
                      nonnegative="warmup_iters lr_decay_iters weight_decay grad_clip",
                      fraction="dropout beta1 beta2", ratio="min_lr_ratio", seed="seed"),
    "train_vit": dict(positive="epochs batch_size learning_rate eval_interval log_interval",
                      nonnegative="weight_decay grad_clip warmup_epochs steps_per_epoch compression_images "
                                  "viz_images",
                      fraction="label_smoothing drop_path beta1 beta2", ratio="min_lr_ratio", seed="seed")}
OUTSIDE = dict(positive="0", nonnegative="-1", fraction="1", ratio="1.5", seed="-1")


@pytest.mark.parametrize("script, kind, key", [(script, kind, key) for script, table in TRAINER_RANGES.items()
                                               for kind, keys in table.items() for key in keys.split()])
def test_every_number_of_the_trainers_outside_its_range_is_one_line_before_any_work(script, kind, key,
                                                                                     tmp_path, monkeypatch,
                                                                                     fails):
    monkeypatch.chdir(tmp_path)
    fails(importlib.import_module(script).main, [f"--{key}={OUTSIDE[kind]}"], f"--{key}")
    assert os.listdir(tmp_path) == []
