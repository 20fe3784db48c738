"""
Command-line options, the one convention of every script here (nanoGPT's configurator, checked).

A script keeps its options as a dict of plain values with a short comment each, and a comment line
above each group:

    DEFAULTS = dict(
        # data
        dataset='python_stdlib',     # a folder under data_dir written by prepare_data.py
        ...
    )

On the command line every key is `--key=value` (or `--key value`; `--flag` alone means true for a
bool; dashes read as underscores). A value must parse as the default's type: bool (true/false/yes/no/
1/0), int, float, or str (a default of None takes any string). `--config=NAME` applies a preset first,
wherever it sits, so later keys still win. A script may take bare words as well (prepare_data.py's
dataset, study.py's sections, plot.py's runs). `--help` prints the script's docstring and every key with its default
and the comment beside it in the source: the help is read from the same table the parser checks.

A mistake is a UsageError: one line, `error: ...`, exit code 2, no traceback (see run_main).
"""
import ast
import difflib
import io
import sys
import tokenize
from typing import Callable, NoReturn


class UsageError(Exception):
    """A mistake the user can fix (a bad option, a missing file, a dataset not prepared): said in one line."""


def fail(msg: str, code: int = 2) -> NoReturn:
    print(f"error: {' '.join(str(msg).split())}", file=sys.stderr, flush=True)
    sys.exit(code)


def run_main(main: Callable[[], object]) -> None:
    """Call main(); a UsageError becomes `error: ...` and exit 2, Ctrl-C becomes exit 130, no traceback."""
    try:
        main()
    except UsageError as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail("interrupted", code=130)


_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def _coerce(key: str, raw: str, default):
    """The string `raw` as a value of the default's type, or a UsageError naming key, type and value."""
    kind = type(default)
    try:
        if default is None or kind is str:
            return raw
        if kind is bool:                        # before int: bool is a subclass of int
            if raw.strip().lower() in _TRUE + _FALSE:
                return raw.strip().lower() in _TRUE
            raise ValueError
        if kind in (int, float):
            return kind(raw)                    # int("3.5") raises, as it should
        val = ast.literal_eval(raw)             # tuples, lists: must parse to the same type
        if isinstance(val, kind):
            return val
        raise ValueError
    except (ValueError, SyntaxError, TypeError):
        expected = "bool (true/false)" if kind is bool else kind.__name__
        raise UsageError(f"--{key} expects {expected}, got {raw!r}") from None


def parse(argv: list, defaults: dict, doc: str = "", source: str | None = None, presets: dict | None = None,
          positional: str | None = None) -> tuple[dict, set]:
    """argv applied to a copy of `defaults`: returns (config, set_keys), the keys the user or a preset set.

    `doc` and `source` (the script's __doc__ and __file__) make `--help`, which prints and exits 0.
    `presets` are the names `--config=NAME` takes; if `config` is also a key, the name is stored there.
    `positional` names the key that a bare word on the line sets (every bare word, if its default is a list).
    """
    if {"-h", "--help"} & set(argv):
        print(help_text(doc, defaults, source, presets, positional))
        sys.exit(0)
    presets, pairs, bare, i = presets or {}, [], [], 0
    many = positional is not None and isinstance(defaults[positional], list)
    while i < len(argv):
        arg, i = argv[i], i + 1
        if positional and not arg.startswith("--") and (many or not bare):
            bare.append(arg)
            continue
        if not arg.startswith("--") or arg == "--":
            raise UsageError(f"unexpected argument {arg!r}; options look like --key=value")
        key, eq, raw = arg[2:].partition("=")
        if not eq:                              # `--key value`, or a bare `--flag`
            raw = argv[i] if i < len(argv) and not argv[i].startswith("--") else None
            i += raw is not None
        pairs.append((key.replace("-", "_"), raw))

    if bare and many:
        pairs.append((positional, bare))
    elif bare:
        pairs.append((positional, bare[0]))
    config, set_keys = dict(defaults), set()
    for name in [raw for key, raw in pairs if key == "config" and presets]:   # presets first, in order
        if name not in presets:
            raise UsageError(f"unknown config {name!r}; presets: {', '.join(presets)}")
        if set(presets[name]) - set(defaults):                  # a bug in the script, not the user's mistake
            raise ValueError(f"preset {name!r} sets keys not in the defaults: {sorted(set(presets[name]) - set(defaults))}")
        config.update(presets[name])
        set_keys.update(presets[name])
        if "config" in defaults:
            config["config"] = name
    for key, raw in pairs:
        if key == "config" and presets:
            continue
        if key not in defaults:
            close = difflib.get_close_matches(key, list(defaults), n=1)
            hint = f"; did you mean --{close[0]}?" if close else ""
            raise UsageError(f"unknown option --{key}; valid keys: {', '.join(defaults)}{hint}")
        if raw is None:
            if not isinstance(defaults[key], bool):
                raise UsageError(f"--{key} needs a value, e.g. --{key}={_show(defaults[key])}")
            raw = "true"
        config[key] = raw if isinstance(raw, list) else _coerce(key, raw, defaults[key])
        set_keys.add(key)
    return config, set_keys


def _show(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, str) and v and v.isprintable() and " " not in v:
        return v
    return repr(v)


def comments(source: str, name: str = "DEFAULTS") -> list:
    """The comments of `name = dict(...)` in the file `source`, in order: (key, the comment on its line) for
    each key, (None, text) for a comment line of its own (a heading). [] if the source cannot be read."""
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read()
        call = next(n.value for n in ast.parse(text).body
                    if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == name)
    except (OSError, SyntaxError, StopIteration, TypeError):
        return []
    found = {t.start[0]: (t.string.lstrip("#").strip(), t.line.strip().startswith("#"))
             for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT}
    keys = {kw.value.end_lineno: kw.arg for kw in call.keywords}
    out = []
    for line in range(call.lineno, call.end_lineno + 1):
        comment, alone = found.get(line, ("", False))
        if line in keys:
            out.append((keys[line], comment))
        elif comment and alone:
            out.append((None, comment))
    return out


def help_text(doc: str, defaults: dict, source: str | None, presets: dict | None = None,
              positional: str | None = None) -> str:
    """The docstring, then every key as --key=default with its comment, under its heading."""
    rows = comments(source) if source else []
    if {k for k, _ in rows if k} != set(defaults):          # no source at hand: the keys alone
        rows = [(k, "") for k in defaults]
    head = "options, as --key=value (defaults shown)"
    if presets:
        head += f"; --config=NAME applies a preset first: {', '.join(presets)}"
    if positional:
        head += f"; bare words set --{positional}"
    lines = [doc.strip(), "", head + ":"]
    width = max(len(f"--{k}={_show(defaults[k])}") for k in defaults) + 2
    for key, text in rows:
        if key is None:
            lines.append(f"  {text}:")
        else:
            lines.append(f"    {f'--{key}={_show(defaults[key])}':<{width}}{text}".rstrip())
    return "\n".join(lines)
