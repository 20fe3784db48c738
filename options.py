"""
Command-line options, the one convention of every script here (nanoGPT's configurator, checked).

A script keeps its options in `DEFAULTS = dict(...)`, one key a line with a comment. On the command line
each is `--key=value`, or `--flag` alone for a bool that should be true; the value must parse as the
default's type (bool: true/false/yes/no/1/0). `--config=NAME` applies a preset first, wherever it sits,
so the keys given beside it win. `--help` prints the docstring and the DEFAULTS block as written.
A mistake is a UsageError: one line, `error: ...`, exit code 2, no traceback (see run_main).
"""
import difflib
import os
import re
import sys


class UsageError(Exception):
    """A mistake the user can fix (a bad option, a missing file, a dataset not prepared): said in one line."""


def fail(msg, code=2):
    print(f"error: {' '.join(str(msg).split())}", file=sys.stderr, flush=True)
    sys.exit(code)


def run_main(main):
    """Call main(); a UsageError becomes `error: ...` and exit 2, Ctrl-C exit 130, a closed pipe
    (`--help | head`) a quiet exit."""
    try:
        main()
    except UsageError as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail("interrupted", code=130)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit
        sys.exit(141)


BOOLS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def _value(key, raw, default):
    try:
        if isinstance(default, bool):               # before int: bool is a subclass of int
            return BOOLS[raw.lower()]
        return [raw] if isinstance(default, list) else type(default)(raw)
    except (KeyError, ValueError):
        kind = "bool (true/false)" if isinstance(default, bool) else type(default).__name__
        raise UsageError(f"--{key} expects {kind}, got {raw!r}") from None


def parse(argv, defaults, doc="", source=None, presets=None, positional=None):
    """argv applied to a copy of `defaults`: returns (config, set_keys), the keys the user or a preset set.
    `doc` and `source` (the script's __doc__ and __file__) make --help. `presets`: the names --config takes.
    `positional`: the key that bare words set (all of them if its default is a list, else the first)."""
    if {"-h", "--help"} & set(argv):
        print(help_text(doc, defaults, source, presets, positional), flush=True)
        sys.exit(0)
    presets, pairs, bare = presets or {}, [], []
    for arg in argv:
        if positional and not arg.startswith("--"):
            bare.append(arg)
            continue
        if not arg.startswith("--") or len(arg) == 2:
            raise UsageError(f"unexpected argument {arg!r}; options look like --key=value")
        key, eq, raw = arg[2:].partition("=")
        pairs.append((key, raw if eq else None))
    if bare:
        many = isinstance(defaults[positional], list)
        if len(bare) > 1 and not many:
            raise UsageError(f"unexpected argument {bare[1]!r}; options look like --key=value")
        pairs.insert(0, (positional, bare if many else bare[0]))
    config, set_keys = dict(defaults), set()
    for name in [raw for key, raw in pairs if key == "config" and presets]:       # presets first
        if name not in presets:
            raise UsageError(f"unknown config {name!r}; presets: {', '.join(presets)}")
        config.update(presets[name], **({"config": name} if "config" in defaults else {}))
        set_keys.update(presets[name])
    for key, raw in pairs:
        if key == "config" and presets:
            continue
        if key not in defaults:
            close = difflib.get_close_matches(key, list(defaults), n=1)
            hint = f"; did you mean --{close[0]}?" if close else ""
            raise UsageError(f"unknown option --{key}; valid keys: {', '.join(defaults)}{hint}")
        if raw is None and not isinstance(defaults[key], bool):
            raise UsageError(f"--{key} needs a value, e.g. --{key}={defaults[key]}")
        config[key] = True if raw is None else raw if isinstance(raw, list) else _value(key, raw, defaults[key])
        set_keys.add(key)
    return config, set_keys


def help_text(doc, defaults, source=None, presets=None, positional=None):
    """The docstring, then the script's DEFAULTS block as written in its source (each key, its default and
    its comment), or the keys alone without a source."""
    text = open(source, encoding="utf-8").read() if source else ""
    block = re.search(r"^DEFAULTS = dict\(\n(.*?)^\)", text, re.M | re.S)
    table = block.group(1).rstrip() if block else "\n".join(f"    {k}={v!r}," for k, v in defaults.items())
    head = "options, as --key=value (defaults shown)"
    if presets:
        head += f"; --config=NAME applies a preset first: {', '.join(presets)}"
    if positional:
        head += f"; bare words set {positional}"
    return f"{doc.strip()}\n\n{head}:\n{table}"
