"""
Writes the copy of this repository to hand out to students: the files of the working tree that git tracks or
would track, without the answers. Left out: lecture/solutions.py, tests/test_lecture.py (its wrong answers
are the solutions changed in one place), the history (.git, which holds solutions.py),
tests/test_model_unchanged.py (which compares with an earlier commit) and lecture/README.md's part for the
teacher. The copy runs the students' commands: `python -m lecture.exercises`, `python derivation.py`,
`python -m pytest -q`. Exercises edited and not committed, and files git does not track, go into the copy as
they are, with a note naming them.

    python -m lecture.handout --out=../tost-class     # then zip that folder, or make it a new repository
"""

import os
import sys

# Also run by its path (python lecture/handout.py): the repository's modules come from its root.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import options  # first: a mistake, a closed pipe (`| head`) or Ctrl-C ends in one line
import shutil
import subprocess

from options import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The files that hold the answers, and one that needs the history.
LEFT_OUT = ('lecture/solutions.py', 'tests/test_lecture.py', 'tests/test_model_unchanged.py')

DEFAULTS = dict(
    out='',             # the folder to write the copy into: new, or empty
)


def files(*which):
    """The working tree's files git lists with these flags (--cached: tracked, --others: not tracked and not
    ignored), without LEFT_OUT."""
    listed = subprocess.run(['git', 'ls-files', *which, '--exclude-standard', '-z'], cwd=ROOT,
                            capture_output=True)
    if listed.returncode != 0:
        raise UsageError(f'{ROOT} is not a git checkout: the hand-out is written from one')
    # Names as the file system spells them (git's bytes; on Windows UTF-8, not the console's code page).
    names = sorted(set(map(os.fsdecode, listed.stdout.split(b'\0'))) - {''} - set(LEFT_OUT))
    return [name for name in names if os.path.isfile(os.path.join(ROOT, name))]


def main(argv=None):
    cfg, _ = options.parse(argv, DEFAULTS, __doc__, __file__, ranges=dict(nonempty=('out',)))
    out = cfg['out']
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise UsageError(f'--out={out} exists and is not an empty folder')
    names = files('--cached', '--others')
    try:
        for name in names:
            os.makedirs(os.path.join(out, os.path.dirname(name)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, name), os.path.join(out, name))
        # lecture/README.md without its part for the teacher (the class plan, where the answers are, the
        # recall experiment's result)
        readme = os.path.join(out, 'lecture', 'README.md')
        with open(readme, encoding='utf-8') as f:
            text = f.read()
        with open(readme, 'w', encoding='utf-8') as f:
            f.write(text.split('\n## For the teacher\n')[0])
    except BaseException:
        # A copy cut short (a full disk, Ctrl-C) goes: the folder is left empty, for the command again.
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out, exist_ok=True)
        raise
    print(f'wrote {len(names)} files to {out}, without {", ".join(LEFT_OUT)}, .git and the teacher\'s part '
          f'of lecture/README.md')
    # A teacher's own answers, written into the exercises and not committed, would go out with them.
    edited = subprocess.run(['git', 'diff', '--quiet', 'HEAD', '--', 'lecture/exercises.py'], cwd=ROOT)
    if edited.returncode:
        print('note: lecture/exercises.py has changes not committed, copied as they are: check that they '
              'hold no answers')
    untracked = files('--others')
    if untracked:
        print(f'note: copied files git does not track, check them for answers: {", ".join(untracked)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
