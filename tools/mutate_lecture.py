"""
Does the lecture notice a wrong line? Edit one line of model math at a time, in a copy of the repository, and
run derivation.py there: an edit it does not fail on is a line the lecture does not check.

    python -m tools.mutate_lecture --list           # the lines it edits, and how
    python -m tools.mutate_lecture                  # every edit, one run of the lecture each
    python -m tools.mutate_lecture tost.py:283      # the edits of one line

The lines: every one-line statement in the bodies of the functions named in TARGETS (the objective, TSSA,
CausalTSSA's memberships, forward, step and state, the MLP, the block, the GPT's forward, logits, prefill and
step, prefix_sum, and the fused core's forward and backward), less the bookkeeping that SKIP names (shapes,
lists, dtypes, slices, the options beyond the paper). The edits: the statement's value times 1.01, and, where
the line has one, a sign or an axis changed (EDITS). docs/tests.md reports the last run.
"""
import os
import sys

# Also run by its path (python tools/mutate_lecture.py): the repository's modules come from its root.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import options  # first: a mistake or Ctrl-C ends in one line
import ast
import re
import shutil
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = {
    'tost.py': ('variational_compression', 'compression_of_projections', 'TSSA.split_heads',
                'TSSA.merge_heads', 'TSSA.U', 'TSSA.memberships', 'TSSA.forward',
                'CausalTSSA.prefix_memberships', 'CausalTSSA.forward', 'CausalTSSA.step', 'MLP.forward',
                'Block.forward', 'Block.prefill', 'Block.step', 'GPT._embed', 'GPT.forward', 'GPT.logits',
                'GPT._hidden', 'GPT.prefill', 'GPT.step', 'prefix_sum'),
    'tost_fast.py': ('causal_tssa', 'CausalCore.forward', 'CausalCore.backward', '_suffix_sum'),
}
# Lines that compute no model math: shapes, dtypes, lists, slices, empty and zero buffers, checks, the
# options' branches; and the hand-off to the Triton core, which runs on a GPU only (the lecture runs on the
# CPU; tests/test_triton.py checks that core against the readable lines).
SKIP = ('.shape', '= []', '.append(', 'check_state', 'ctx.', 'slice(', 'keep', 'L = T',
        'p = self.head_dim', '_stat_dtype(w)', '.dtype', 'forward_with_options', '_checked', 'shift',
        'ShiftState', 'torch.empty_like', 'new_empty', 'new_zeros', 'tost_triton.')
# A sign or an axis changed: the first of these found in the line's code is replaced, once.
EDITS = (('dim=2', 'dim=1'), ('dim=1', 'dim=2'), ('dim=-1', 'dim=-2'), ('(-1)', '(-2)'),
         ('.sum(-1', '.sum(-2'), ('sum(2', 'sum(1'), ('cumsum(w2, 1', 'cumsum(w2, 2'), (', -1)', ', -2)'),
         ('.transpose(1, 2)', '.transpose(2, 1).flip(1)'), ('= -(', '= +('), ('.neg_()', ''),
         ('.sub_(h)', '.add_(h)'), ('-Pi', 'Pi'), ('-de', 'de'), ('flip(x, [1])', 'flip(x, [2])'))


def target_lines(lines, names):
    """[(function, line number)] of the one-line statements in the named functions' bodies (of a file's
    `lines`), less SKIP."""
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, child.name + '.')
            elif isinstance(child, ast.FunctionDef) and prefix + child.name in names:
                body = child.body[1:] if ast.get_docstring(child) else child.body
                for statement in ast.walk(ast.Module(body=body, type_ignores=[])):
                    simple = isinstance(statement, (ast.Assign, ast.AugAssign, ast.Return, ast.Expr))
                    if simple and statement.lineno == statement.end_lineno:
                        line = lines[statement.lineno - 1]
                        if not any(k in line for k in SKIP):
                            found.append((prefix + child.name, statement.lineno))

    visit(ast.parse(''.join(lines)), '')
    return sorted(set(found), key=lambda pair: pair[1])


def split_top_level(text):
    """text split at its commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in '([{') - (ch in ')]}')
        if ch == ',' and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def scaled(line):
    """The line with its value (the first, for a tuple) times 1.01, or None."""
    code, sep, comment = line.rstrip('\n').partition('  #')
    indent = code[:len(code) - len(code.lstrip())]
    body = code.strip()
    match = re.match(r'^(return |.+? (?:\+=|-=|\*=|/=) |[^=]+? = )(.+)$', body)
    if match:
        head, value = match.groups()
        if head.endswith(' = ') and len(split_top_level(head[:-3])) > 1 and len(split_top_level(value)) == 1:
            return None                                     # a tuple unpacked from one value
        parts = split_top_level(value)
        parts[0] = f'({parts[0].strip()}) * 1.01'
        return f'{indent}{head}{", ".join(p.strip() for p in parts)}{sep}{comment}\n'
    match = re.match(r'^(torch\.\w+)\((.*)$', body)
    if match:                                               # a call writing into out=: its first argument
        args = split_top_level(match.group(2))
        args[0] = f'({args[0].strip()}) * 1.01'
        return f'{indent}{match.group(1)}({", ".join(a.strip() for a in args)}{sep}{comment}\n'
    return None


def sign_or_axis(line):
    """The line with its first sign or axis of EDITS changed, or None."""
    code, sep, comment = line.rstrip('\n').partition('  #')
    for old, new in EDITS:
        if old in code:
            return code.replace(old, new, 1) + sep + comment + '\n'
    return None


def plan():
    """[(file, function, line number, kind, edited line)] of every edit."""
    edits = []
    for name, functions in TARGETS.items():
        path = os.path.join(ROOT, name)
        with open(path, encoding='utf-8') as f:
            lines = f.readlines()
        for function, number in target_lines(lines, set(functions)):
            for kind, edit in (('1%', scaled), ('sign/axis', sign_or_axis)):
                new = edit(lines[number - 1])
                if new is not None and new != lines[number - 1]:
                    edits.append((name, function, number, kind, new))
    return edits


def lecture_fails(folder):
    """Whether derivation.py fails in folder, and where: the line of its claim that caught the edit, and its
    last line of error."""
    r = subprocess.run([sys.executable, 'derivation.py'], cwd=folder, capture_output=True, timeout=600,
                       env=dict(os.environ, PYTHONIOENCODING='utf-8'), encoding='utf-8', errors='replace')
    last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''
    claims = re.findall(r'derivation\.py", line (\d+)', r.stderr)
    return r.returncode != 0, (f'derivation.py:{claims[-1]} ' if claims else '') + last[:100]


DEFAULTS = dict(
    lines=[],       # FILE:LINE (tost.py:283), as bare words: the edits of these lines only; none: every line
    list=False,     # print the lines it edits, and how, and stop
)


def main(argv=None):
    cfg, _ = options.parse(argv, DEFAULTS, __doc__, __file__, positional='lines')
    edits = plan()
    chosen = cfg['lines']
    unknown = sorted(set(chosen) - {f'{e[0]}:{e[2]}' for e in edits})
    if unknown:
        raise options.UsageError(f"{', '.join(unknown)}: no line it edits (--list shows them)")
    edits = [e for e in edits if not chosen or f'{e[0]}:{e[2]}' in chosen]
    if cfg['list']:
        for name, function, number, kind, new in edits:
            print(f'{name}:{number} {function} {kind}: {new.strip()}')
        print(f'{len(edits)} edits of {len({(e[0], e[2]) for e in edits})} lines')
        return
    if lecture_fails(ROOT)[0]:
        raise options.UsageError('derivation.py fails before any edit; fix that first')
    missed = []
    with tempfile.TemporaryDirectory() as scratch:
        copy = os.path.join(scratch, 'repo')
        ignore = shutil.ignore_patterns('.git', '__pycache__', 'out*', 'data', '.venv')
        shutil.copytree(ROOT, copy, ignore=ignore)
        for name, function, number, kind, new in edits:
            with open(os.path.join(ROOT, name), encoding='utf-8') as f:
                lines = f.readlines()
            lines[number - 1] = new
            with open(os.path.join(copy, name), 'w', encoding='utf-8') as f:
                f.writelines(lines)
            failed, why = lecture_fails(copy)
            shutil.copy(os.path.join(ROOT, name), os.path.join(copy, name))
            verdict = 'caught' if failed else 'MISSED'
            print(f'{verdict} {name}:{number} {function} {kind}: {why or new.strip()}', flush=True)
            if not failed:
                missed.append((name, number))
    tried = {(e[0], e[2]) for e in edits}
    caught = len(tried - set(missed))
    print(f'{len(edits)} edits of {len(tried)} lines; lines with every edit caught: {caught}; '
          f'missed: {", ".join(f"{n}:{i}" for n, i in missed) or "none"}')


if __name__ == '__main__':
    main()
