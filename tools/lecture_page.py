"""
Write the lecture as a page: derivation.py run cell by cell, each cell's text, code, output and figures.

    python tools/lecture_page.py                 # writes docs/lecture.md and docs/lecture-*.png
    python tools/lecture_page.py --out=DIR       # into another folder

The page is what a student without the project reads on GitHub; it is drawn by the lecture's own code, never
by hand, so after changing derivation.py, or what tost.py computes, run this again and commit both (a test
compares the page with the lecture's output). It prints each cell's seconds.
"""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import options  # noqa: E402  first of the repository: a mistake or Ctrl-C ends in one line
import contextlib  # noqa: E402
import io  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

LECTURE = ROOT / 'derivation.py'
DEFAULTS = dict(
    out='docs',              # the folder for lecture.md and the lecture's figures (made if missing): docs/
                             # of the repository, wherever the command runs
)


def cells(source):
    """The lecture split at its `# %%` lines: [(title line, comment lines, code, the number of the code's
    first line in the source)], the preamble first."""
    parts = re.split(r'^(?=# %%)', source, flags=re.M)
    out = [('', [], parts[0], 1)]
    before = parts[0].count('\n')
    for part in parts[1:]:
        lines = part.splitlines()
        comments = []
        for line in lines:
            if not line.startswith('#'):
                break
            comments.append(line)
        comments[0] = comments[0][len('# %%'):]
        body = '\n'.join(lines[len(comments):])
        code = body.strip()
        blank = body[:len(body) - len(body.lstrip())].count('\n')
        first = before + len(comments) + blank + 1
        out.append((comments[0].strip(), [c[1:] for c in comments[1:]], code, first))
        before += part.count('\n')
    return out


def prose(first, rest):
    """Markdown from a cell's comments: lines indented by 4 or more spaces are formulas, set as code."""
    blocks, formula = [], False
    for line in [' ' + first] + rest:
        is_formula = line.startswith('     ')
        if is_formula != formula:
            blocks.append('```' if is_formula else '```\n')
            formula = is_formula
        blocks.append(line[1:] if not is_formula else line[5:])
    if formula:
        blocks.append('```')
    return '\n'.join(blocks).replace('\n\n\n', '\n\n')


def main():
    cfg, set_keys = options.parse(sys.argv[1:], DEFAULTS, __doc__, __file__, ranges=dict(nonempty=('out',)))
    # Unless told, the repository's docs/, wherever the command runs.
    out = pathlib.Path(cfg['out']) if 'out' in set_keys else ROOT / 'docs'
    out.mkdir(parents=True, exist_ok=True)
    source = LECTURE.read_text(encoding='utf-8')
    sys.argv = [str(LECTURE), f'--figures={out}']
    namespace = {'__name__': '__main__', '__file__': str(LECTURE)}
    page = ['<!-- Written by tools/lecture_page.py from derivation.py: edit those, not this page. -->']
    for title, comments, code, line in cells(source):
        buffer = io.StringIO()
        start = time.perf_counter()
        # Compiled at its own lines: a claim that fails is named by its line in derivation.py, after what the
        # cell printed.
        try:
            with contextlib.redirect_stdout(buffer):
                exec(compile('\n' * (line - 1) + code, str(LECTURE), 'exec'), namespace)
        except BaseException:
            sys.stderr.write(buffer.getvalue())
            raise
        print(f'{title[:40] or "preamble":40s} {time.perf_counter() - start:5.1f} s', file=sys.stderr)
        if not title:
            page.append('# ' + namespace['__doc__'].strip())
            continue
        number, _, first = title.partition('. ')
        heading, _, rest = first.partition('. ')
        page.append(f'\n## {number}. {heading}\n')
        page.append(prose(rest, comments))
        if code:
            page.append(f'\n<details><summary>code</summary>\n\n```python\n{code}\n```\n</details>\n')
        text = buffer.getvalue()
        figures = re.findall(r'^\s*figure: (.+)$', text, flags=re.M)
        text = re.sub(r'^\s*figure: .+\n?', '', text, flags=re.M).rstrip()
        if text:
            page.append(f'```text\n{text}\n```')
        for path in figures:
            name = pathlib.Path(path).name
            page.append(f'\n![{name}]({name})')
    text = re.sub(r'\n{3,}', '\n\n', '\n'.join(page))              # one blank line between blocks
    (out / 'lecture.md').write_text(text.strip() + '\n', encoding='utf-8')
    print(f'wrote {out / "lecture.md"}', file=sys.stderr)


if __name__ == '__main__':
    main()
