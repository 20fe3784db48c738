"""Tests for options.py: the one way every script reads its command line, and its --help.
Offline, a few seconds: python -m pytest -q tests/test_options.py"""
import os
import re
import subprocess
import sys

import pytest

import options
from options import UsageError

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEFAULTS = dict(out_dir="out", max_iters=5000, lr=6e-4, compile=True, init_from=None,
                lr_decay_iters=5000, batch_size=12)
PRESETS = {"shakespeare": dict(out_dir="out-shakespeare", max_iters=2000, batch_size=64),
           "tiny": dict(max_iters=10)}


def parse(*argv, presets=PRESETS):
    return options.parse(list(argv), DEFAULTS, presets=presets)

# -----------------------------------------------------------------------------


def test_no_args_gives_a_copy_of_the_defaults():
    config, set_keys = parse()
    assert config == DEFAULTS and config is not DEFAULTS
    assert set_keys == set()


def test_each_type_is_converted():
    config, set_keys = parse("--out_dir=x/y", "--max_iters=300", "--lr=1e-3", "--compile=False",
                             "--batch_size=7")
    assert config["out_dir"] == "x/y"
    assert config["max_iters"] == 300 and type(config["max_iters"]) is int
    assert config["lr"] == 1e-3
    assert config["compile"] is False
    assert config["batch_size"] == 7
    assert set_keys == {"out_dir", "max_iters", "lr", "compile", "batch_size"}
    assert DEFAULTS["max_iters"] == 5000  # the defaults are not touched


@pytest.mark.parametrize("raw, want", [("True", True), ("False", False), ("true", True), ("false", False),
                                       ("1", True), ("0", False), ("yes", True), ("no", False)])
def test_bool_spellings(raw, want):
    assert parse(f"--compile={raw}")[0]["compile"] is want


def test_bare_bool_flag_means_true():
    defaults = dict(DEFAULTS, compile=False)
    config, _ = options.parse(["--compile", "--max_iters=3"], defaults)
    assert config["compile"] is True and config["max_iters"] == 3


def test_float_accepts_ints_and_exponents():
    assert parse("--lr=3")[0]["lr"] == 3.0 and isinstance(parse("--lr=3")[0]["lr"], float)
    assert parse("--lr=2.5e-5")[0]["lr"] == 2.5e-5
    assert parse("--lr=-1e-3")[0]["lr"] == -1e-3


@pytest.mark.parametrize("raw", ["3", "0.5", "True", "None", "resume", "'gpt2'", "[1, 2]", ""])
def test_str_default_takes_any_string(raw):
    got = parse(f"--out_dir={raw}")[0]["out_dir"]
    assert got == raw and type(got) is str


def test_dashes_are_not_underscores_but_the_hint_says_so():
    with pytest.raises(UsageError, match="unknown option --max-iters; .*did you mean --max_iters"):
        parse("--max-iters=9")


def test_the_space_form_is_refused():
    with pytest.raises(UsageError, match="unexpected argument '9'; options look like --key=value"):
        parse("--max_iters", "9")


@pytest.mark.parametrize("arg, key, expected", [("--max_iters=3.5", "max_iters", "int"),
                                                ("--max_iters=abc", "max_iters", "int"),
                                                ("--lr=fast", "lr", "float"),
                                                ("--compile=maybe", "compile", "bool")])
def test_wrong_type_names_key_type_and_value(arg, key, expected):
    with pytest.raises(UsageError) as e:
        parse(arg)
    msg = str(e.value)
    assert f"--{key}" in msg and expected in msg and repr(arg.split("=")[1]) in msg
    assert "\n" not in msg


def test_unknown_key_lists_valid_keys():
    with pytest.raises(UsageError) as e:
        parse("--max_iter=3")
    msg = str(e.value)
    assert msg.startswith("unknown option --max_iter; valid keys: out_dir, max_iters, lr, compile")
    assert "did you mean --max_iters?" in msg


def test_positional_argument_is_refused():
    with pytest.raises(UsageError, match="unexpected argument 'config/train.py'"):
        parse("config/train.py")


def test_option_without_value_is_refused():
    with pytest.raises(UsageError, match=r"--start needs a value, e.g. --start='\\n'$"):
        options.parse(["--start"], {"start": "\n"})
    with pytest.raises(UsageError, match="--max_iters needs a value, e.g. --max_iters=5000"):
        parse("--max_iters")


def test_preset_applied_first_wherever_it_is_and_overridable():
    config, set_keys = parse("--max_iters=50", "--config=shakespeare")
    assert config["max_iters"] == 50  # the user's value beats the preset even though it came first
    assert config["out_dir"] == "out-shakespeare" and config["batch_size"] == 64
    assert config["lr"] == DEFAULTS["lr"]
    assert set_keys == {"max_iters", "out_dir", "batch_size"}  # preset keys count as set
    assert "lr_decay_iters" not in set_keys  # so a trainer may derive it from max_iters


def test_preset_name_stored_when_config_is_a_key():
    defaults = dict(DEFAULTS, config="")
    config, _ = options.parse(["--config=tiny"], defaults, presets=PRESETS)
    assert config["max_iters"] == 10 and config["config"] == "tiny"


def test_unknown_preset_lists_names():
    with pytest.raises(UsageError) as e:
        parse("--config=shakespear")
    assert "unknown config 'shakespear'" in str(e.value) and "shakespeare, tiny" in str(e.value)


def test_every_preset_sets_only_keys_of_its_script():
    import train_gpt
    for name, preset in train_gpt.PRESETS.items():
        assert set(preset) <= set(train_gpt.DEFAULTS), name


def test_bare_words_set_the_positional_key():
    defaults = dict(runs=[], x="tokens", name="")
    assert options.parse(["a", "--x=seconds", "b"], defaults, positional="runs")[0] == dict(runs=["a", "b"],
                                                                                          x="seconds", name="")
    assert options.parse(["a"], defaults, positional="name")[0]["name"] == "a"
    with pytest.raises(UsageError, match="unexpected argument 'b'"):
        options.parse(["a", "b"], defaults, positional="name")

# how a script ends, as the user sees it: the handler options installs when imported


def _python(code, stdout=subprocess.PIPE):
    return subprocess.run([sys.executable, "-c", code], cwd=HERE, stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=120)


def test_fail_prints_one_line_and_exits_2():
    r = _python("import options; options.fail('max_iters must be positive')")
    assert r.returncode == 2
    assert r.stderr == "error: max_iters must be positive\n" and r.stdout == ""


def one_line(r, code, *words):
    lines = r.stderr.splitlines()
    assert r.returncode == code and len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert all(w in lines[0] for w in words), lines[0]


def test_a_usage_error_at_the_top_level_is_one_line_and_exit_2():
    one_line(_python("import options\noptions.parse(['--lr=fast'], {'lr': 0.1})"), 2, "--lr", "fast")


def test_an_os_error_names_the_path_and_the_option_that_gave_it(tmp_path):
    (tmp_path / "file").write_text("x")
    r = _python(f"import options, os\noptions.parse(['--out_dir={tmp_path}/file'], {{'out_dir': 'out'}})\n"
                f"os.makedirs('{tmp_path}/file/sub')")
    one_line(r, 2, f"{tmp_path}/file/sub", f"--out_dir={tmp_path}/file")
    one_line(_python(f"import options\nopen('{tmp_path}/none/x')"), 2, f"{tmp_path}/none/x")


def test_ctrl_c_while_torch_imports_is_exit_130():
    """A SIGINT before `import torch` is done: the handler is in place already."""
    r = _python("import options, os, signal\nos.kill(os.getpid(), signal.SIGINT)\nimport torch")
    one_line(r, 130, "interrupted")
    assert "Traceback" not in r.stderr


def test_run_main_ends_a_main_as_the_handler_ends_a_script(capsys):
    def main():
        print("a sample cut short", end="")
        raise KeyboardInterrupt
    with pytest.raises(SystemExit) as e:
        options.run_main(main)
    out, err = capsys.readouterr()
    assert e.value.code == 130 and err.startswith("error: ") and out == "a sample cut short\n"   # own line
    with pytest.raises(ZeroDivisionError):                          # a bug keeps its traceback
        options.run_main(lambda: 1 / 0)


def test_a_closed_stdout_ends_quietly():
    """`| head`: the reader leaves first; printed text and flushed, or left to the exit's flush."""
    for flush in ("True", "False"):
        p = subprocess.Popen([sys.executable, "-c", f"import options, time\ntime.sleep(0.5)\n"
                              f"print('x' * 100000, flush={flush})"], cwd=HERE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        p.stdout.close()
        assert (p.wait(timeout=60), p.stderr.read()) == (141, "")
        p.stderr.close()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_stdout_is_one_line():
    for flush in ("True", "False"):
        with open("/dev/full", "w") as full:
            r = _python(f"import options\nprint('some text', flush={flush})", stdout=full)
        one_line(r, 2, "No space left on device")


def test_say_survives_a_closed_stdout():
    """A run goes on (and saves) after its stdout reader is gone: say() lets the pipe go, print() would raise."""
    p = subprocess.Popen([sys.executable, "-c", "import options, sys, time\ntime.sleep(0.5)\n"
                          "for i in range(3): options.say('x' * 100000)\nprint('done', file=sys.stderr)"],
                         cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()
    assert (p.wait(timeout=60), p.stderr.read()) == (0, "done\n")
    p.stderr.close()


def test_run_main_prints_what_stdout_cannot_encode_as_a_question_mark():
    r = subprocess.run([sys.executable, "-c", "import options; print('caf\\xe9')"],
                       cwd=HERE, capture_output=True, env={**os.environ, "PYTHONIOENCODING": "ascii"}, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"caf?\n", b"")


SCRIPTS = ("train_gpt", "train_vit", "sample", "eval_gpt", "plot", "prepare_data", "tools.bench", "tools.study")


def test_every_script_imports_where_fcntl_does_not_exist():
    """Windows has no fcntl: each script imports, and the out_dir is then made without a lock."""
    r = _python("import sys\nsys.modules['fcntl'] = None\n"
                f"import {', '.join(SCRIPTS)}\n"
                "import train_common\n"
                "assert train_common.make_out_dir('out-nolock-test', [], False, True, True) is None\n"
                "import os; os.remove('out-nolock-test/.lock'); os.rmdir('out-nolock-test')")
    assert r.returncode == 0, r.stderr


def test_every_script_imports_options_before_torch():
    for name in SCRIPTS:
        path = os.path.join(HERE, *name.split(".")) + ".py"
        with open(path) as f:
            imports = [line.split()[1] for line in f if re.match(r"(import|from) \w", line)]
        assert imports[0] == "options", name

# ranges


def test_numbers_are_finite_and_in_the_range_the_table_gives():
    defaults = dict(lr=0.1, steps=10, drop=0.0, out="out")
    ranges = dict(positive=("lr", "steps"), fraction=("drop",), nonempty=("out",))
    assert options.parse(["--lr=1e-5"], defaults, ranges=ranges)[0]["lr"] == 1e-5
    for arg in ("--lr=inf", "--lr=nan", "--lr=-1", "--steps=0", "--drop=1", "--drop=-0.1", "--out= "):
        with pytest.raises(UsageError, match=f"^{arg.split('=')[0]} must be"):
            options.parse([arg], defaults, ranges=ranges)
    with pytest.raises(UsageError, match="^--x must be a finite"):            # any number, with no range given
        options.parse(["--x=-inf"], dict(x=1.0))


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
    assert lines[:4] == ["Doc.", "", "options, as --key=value (defaults shown); --config=NAME applies a preset first: "
                                     "demo, big:", "  # data"]
    assert [line.split() for line in lines[4:]] == [[f"--lr={6e-3 / 10}", "#", "the", "learning", "rate"],
                                                    ["--flag=False", "#", "a", "switch"]]


def test_a_trainers_help_into_head_ends_quietly():
    """`python train_gpt.py --help | head -3` (and train_vit.py's): the reader leaves before the script writes."""
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, f"{script}.py"), "--help"], cwd=HERE, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, OMP_NUM_THREADS="1"))
             for script in ("train_gpt", "train_vit")]
    for p in procs:
        p.stdout.close()
    ends = []
    for p in procs:
        with p:                                                      # closes its stderr after
            ends.append((p.wait(timeout=120), p.stderr.read()))
    assert ends == [(141, ""), (141, "")]


@pytest.mark.parametrize("script, command, key", [
    ("train_gpt", "python train_gpt.py --config=shakespeare", "  --learning_rate=0.006"),
    ("train_vit", "python train_vit.py --dataset=cifar10", "  --label_smoothing=0.1")])
def test_a_trainers_help_shows_its_commands_and_defaults(capsys, script, command, key):
    module = __import__(script)
    with pytest.raises(SystemExit) as e:
        module.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and command in out and key in out
    if script == "train_vit":                                        # its two-node commands take two lines each
        assert "--master_port=29500 \\\n        train_vit.py --" in out   # and stay two lines


KEY = re.compile(r"^  --(\w+)=.*?(#.*)?$")


def test_every_script_documents_every_key():
    """The help of each script shows each key with a comment: no key of any table goes unexplained."""
    import eval_gpt, plot, prepare_data, sample, train_gpt, train_vit
    from tools import bench, gpu_check, study
    for module in (eval_gpt, plot, prepare_data, sample, train_gpt, train_vit, bench, study, gpu_check):
        text = options.help_text(module.__doc__, module.DEFAULTS, module.__file__)
        rows = dict(m.groups() for m in map(KEY.match, text.split("options, as")[1].splitlines()) if m)
        assert set(rows) == set(module.DEFAULTS), module.__name__
        assert all(rows.values()), (module.__name__, [k for k, v in rows.items() if not v])
