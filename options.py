"""Command-line options, as nanoGPT's configurator but checked: a script's `DEFAULTS = dict(...)`, a key a line with
a comment, set as `--key=value` (a bool's `--key` alone: true) in the default's type; `--config=NAME` applies a
preset first. `--help` prints the docstring and the DEFAULTS block as written. A mistake: `error: ...`, exit 2."""
import difflib
import os
import re
import sys


class UsageError(Exception):
    """A mistake the user can fix (a bad option, a missing file, a dataset not prepared): one line."""


def fail(msg, code=2):
    print(f"error: {' '.join(str(msg).split())}", file=sys.stderr, flush=True)
    sys.exit(code)


def run_main(main):
    """main(): a UsageError is `error: ...`, exit 2; Ctrl-C exit 130; a closed pipe (`| head`) a quiet exit; a
    character stdout's encoding lacks (a sample in an ASCII terminal) is printed as '?'."""
    sys.stdout.reconfigure(errors="replace")
    try:
        main()
    except UsageError as e:
        fail(str(e))
    except KeyboardInterrupt:
        print(flush=True)                           # off the line of text it cut (sample.py's)
        fail("interrupted", code=130)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit
        sys.exit(141)


def _value(key, raw, default):
    try:
        if isinstance(default, bool):               # before int: bool is a subclass of int
            return {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}[raw.lower()]
        return [raw] if isinstance(default, list) else type(default)(raw)
    except (KeyError, ValueError):
        kind = "bool (true/false)" if isinstance(default, bool) else type(default).__name__
        raise UsageError(f"--{key} expects {kind}, got {raw!r}") from None


def parse(argv, defaults, doc="", source=None, presets=None, positional=None):
    """(config, set_keys): argv applied to a copy of `defaults`, and the keys it or a preset set. `doc`, `source`
    (__doc__, __file__) make --help; `positional` is the key bare words set (all, if its default is a list)."""
    if {"-h", "--help"} & set(argv):
        print(help_text(doc, defaults, source, presets, positional), flush=True)
        sys.exit(0)
    presets, pairs, many = presets or {}, [], positional and isinstance(defaults[positional], list)
    bare = [a for a in argv if positional and not a.startswith("--")]
    for arg in [a for a in argv if a not in bare] + ([] if many else bare[1:]):    # one word for a plain key
        if not arg.startswith("--") or arg == "--":
            raise UsageError(f"unexpected argument {arg!r}; options look like --key=value")
        key, eq, raw = arg[2:].partition("=")
        pairs.append((key, raw if eq else None))
    config, set_keys = dict(defaults), set()
    for name in [raw for key, raw in pairs if key == "config" and presets]:       # presets first
        if name not in presets:
            raise UsageError(f"unknown config {name!r}; presets: {', '.join(presets)}")
        config.update(presets[name], **({"config": name} if "config" in defaults else {}))
        set_keys.update(presets[name])
    for key, raw in ([(positional, bare if many else bare[0])] if bare else []) + pairs:
        if key == "config" and presets:
            continue
        if key not in defaults:
            close = difflib.get_close_matches(key, list(defaults), n=1)
            raise UsageError(f"unknown option --{key}; valid keys: {', '.join(defaults)}"
                             f"{f'; did you mean --{close[0]}?' if close else ''}")
        if raw is None and not isinstance(defaults[key], bool):
            example = str(defaults[key]) if str(defaults[key]).isprintable() else repr(defaults[key])
            raise UsageError(f"--{key} needs a value, e.g. --{key}={example}")
        config[key] = True if raw is None else raw if isinstance(raw, list) else _value(key, raw, defaults[key])
        set_keys.add(key)
    return config, set_keys


def help_text(doc, defaults, source, presets=None, positional=None):
    """The docstring, then the DEFAULTS block as written in `source`."""
    with open(source, encoding="utf-8") as f:
        table = re.search(r"^DEFAULTS = dict\(\n(.*?)^\)", f.read(), re.M | re.S).group(1)
    head = "options, as --key=value (defaults shown)" + (f"; --config=NAME applies a preset first: "
                                                         f"{', '.join(presets)}" if presets else "")
    return f"{doc.strip()}\n\n{head}{f'; bare words set {positional}' if positional else ''}:\n{table.rstrip()}"
