"""tools/mutate_lecture.py edits what docs/tests.md says it edits: the model's math lines, each edit a valid
line that changes the line. Running the edits takes a lecture run each: the tool is run by hand; here a
stand-in for the lecture judges each edit."""

import re
import warnings

import pytest

from tools import mutate_lecture


def test_the_plan_edits_every_kind_of_model_line_and_each_edit_is_valid_python():
    edits = mutate_lecture.plan()
    lines = {(name, number) for name, _, number, _, _ in edits}
    functions = {function for _, function, _, _, _ in edits}
    # as docs/tests.md and the README count them
    assert (len(edits), len(lines)) == (152, 117)
    assert {'GPT.forward', 'CausalTSSA.step', 'CausalCore.backward', 'variational_compression'} <= functions
    for name, _, number, kind, new in edits:
        with open(f'{mutate_lecture.ROOT}/{name}') as f:
            source = f.readlines()
        assert new != source[number - 1]
        source[number - 1] = new
        with warnings.catch_warnings():                     # a broken edit would 'catch' nothing real
            warnings.simplefilter('error')                  # (a float subscripted is only a SyntaxWarning)
            compile(''.join(source), name, 'exec')
    assert {kind for *_, kind, _ in edits} == {'1%', 'sign/axis'}


def test_a_scaled_line_keeps_its_comment_and_scales_the_first_value():
    line = '        Q, P = Qc[:, -1:], Pe[:, -1:].clone()   # carries\n'
    scaled = '        Q, P = (Qc[:, -1:]) * 1.01, Pe[:, -1:].clone()  # carries\n'
    assert mutate_lecture.scaled(line) == scaled
    assert mutate_lecture.scaled('        B, T, d = x.size()\n') is None
    line = '            torch.square(wc[:, :1], out=w2[:, :1])\n'
    assert mutate_lecture.scaled(line) == '            torch.square((wc[:, :1]) * 1.01, out=w2[:, :1])\n'
    flipped = mutate_lecture.sign_or_axis('    y = -(Pi * w) * D   # minus\n')
    assert flipped == '    y = +(Pi * w) * D   # minus\n'


def test_help_and_a_mistaken_option_run_no_edit(monkeypatch, capsys, fails):
    """--help printed nothing and ran every edit (minutes): it prints the help, exit 0; an option it does
    not know, or a FILE:LINE it edits nothing of (it passed, having tried nothing), is one line naming it,
    exit 2."""
    monkeypatch.setattr(mutate_lecture, 'lecture_fails', lambda root: pytest.fail('an edit ran'))
    with pytest.raises(SystemExit) as e:
        mutate_lecture.main(['--help'])
    assert e.value.code == 0 and '--list' in capsys.readouterr().out
    fails(mutate_lecture.main, ['--lst'], '--lst')
    fails(mutate_lecture.main, ['tost.py:1'], 'tost.py:1')
    fails(mutate_lecture.main, ['tost.py:1', '--list'], 'tost.py:1')
    # --list of the line the help's example names (a line the edits still reach): its edits only
    name, number = re.search(r'mutate_lecture (\S+):(\d+) ', mutate_lecture.__doc__).groups()
    mutate_lecture.main([f'{name}:{number}', '--list'])
    listed = capsys.readouterr().out.splitlines()
    assert all(line.startswith(f'{name}:{number} ') for line in listed[:-1]) and ' of 1 lines' in listed[-1]


def test_each_edit_alone_is_run_and_each_verdict_is_its_own(monkeypatch, capsys, fails):
    """An edit's lecture run sees that one line changed, nothing left of the edit before; an edit it
    catches is 'caught', one it does not 'MISSED' and named in the summary; a lecture that fails unedited
    runs no edit (exit 2)."""
    edits = mutate_lecture.plan()
    chosen = {name: f'{name}:{number}' for name, _, number, _, _ in reversed(edits)}
    seen = []

    def lecture_fails(folder):
        changed = set()
        for name in chosen:
            with open(f'{folder}/{name}') as a, open(f'{mutate_lecture.ROOT}/{name}') as b:
                changed |= {f'{name}:{i}' for i, (x, y) in enumerate(zip(a, b), 1) if x != y}
        seen.append(changed)
        return bool(changed & {chosen['tost.py']}), 'why'
    monkeypatch.setattr(mutate_lecture, 'lecture_fails', lecture_fails)
    mutate_lecture.main(list(chosen.values()))
    lines = capsys.readouterr().out.splitlines()
    runs = [e for e in edits if f'{e[0]}:{e[2]}' in chosen.values()]
    assert seen == [set()] + [{f'{name}:{number}'} for name, _, number, _, _ in runs]
    assert [line.split()[:2] for line in lines[:-1]] == [
        ['caught' if name == 'tost.py' else 'MISSED', f'{name}:{number}'] for name, _, number, _, _ in runs]
    assert lines[-1].endswith(f"missed: {chosen['tost_fast.py']}")
    monkeypatch.setattr(mutate_lecture, 'lecture_fails', lambda folder: (True, 'broken'))
    fails(mutate_lecture.main, [chosen['tost.py']], 'derivation.py')


@pytest.mark.slow
def test_the_lecture_fails_on_an_edit_of_each_layer_s_gains(capsys):
    """The lecture itself, run on the edits of one line each: the gains D of TSSA, of the causal layer's
    readable lines and of the fused core. Each edit is caught."""
    marks = ('D = self.alpha / (1 + self.alpha', 'D = self.attn_dropout(1 / (1 +', 'out=Ds[:, at])')
    chosen = set()
    for name, _, number, _, _ in mutate_lecture.plan():
        with open(f'{mutate_lecture.ROOT}/{name}') as f:
            line = f.readlines()[number - 1]
        if any(mark in line for mark in marks):
            chosen.add(f'{name}:{number}')
    assert len(chosen) == 3
    mutate_lecture.main(sorted(chosen))
    lines = capsys.readouterr().out.splitlines()[:-1]
    assert len(lines) == 4 and {line.split()[0] for line in lines} == {'caught'}
    # each names the lecture's line that caught it
    assert all(re.search(r' derivation\.py:\d+ ', line) for line in lines)
