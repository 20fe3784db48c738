"""tools/study.py's tasks section: each generator asks what it says (every label follows from the input before
it, labels sit exactly at the answer positions), train and test sequences are disjoint, and the section runs
end to end at its smoke size. No accuracy is asserted: the table reports what training gives."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import matplotlib.image
import numpy as np
import pytest
import torch

import plot
from conftest import POSIX_ONLY
from tools import study


TASK = study.TASKS


def sample(name, value, n=200, seed=0):
    x, y = TASK[name].gen(np.random.default_rng(seed), n, value)
    assert x.shape == y.shape and x.dtype == y.dtype == np.int64
    assert 0 <= x.min() and x.max() < TASK[name].vocab and y.max() < TASK[name].vocab
    return x, y


def check_labels(x, y, answer):
    """answer(prefix) -> the label at the prefix's last position, or None where nothing is asked. It sees
    only x[:t+1], so a label that agrees with it is determined by the input up to its position."""
    for xs, ys in zip(x.tolist(), y.tolist()):
        want = [answer(xs[:t + 1]) for t in range(len(xs))]
        assert ys == [-1 if a is None else a for a in want]


@pytest.mark.parametrize('pairs', [1, 2, 5, 8])
def test_recall_labels_are_the_values_of_the_queried_keys(pairs):
    x, y = sample('recall', pairs)
    n_q = (pairs + 1) // 2
    assert x.shape[1] == 2 * pairs + 2 * n_q - 1
    keys = x[:, 0:2 * pairs:2]
    values = x[:, 1:2 * pairs:2]
    assert (keys < 32).all() and (values >= 32).all()                 # disjoint vocabulary ranges
    # the keys, the values and the queries, each distinct within a sequence
    assert all(len(set(r)) == len(r) for part in (keys, values, x[:, 2 * pairs::2]) for r in part.tolist())

    def answer(prefix):
        t = len(prefix) - 1
        if t < 2 * pairs or (t - 2 * pairs) % 2:
            return None                                                # a pair, or a value after its query
        ctx = prefix[:2 * pairs]
        return ctx[ctx[0::2].index(prefix[t]) * 2 + 1]                 # the value that followed the key
    check_labels(x, y, answer)
    # which pairs are asked differs from sequence to sequence
    asked = {tuple(list(r[:2 * pairs:2]).index(q) for q in r[2 * pairs::2]) for r in x.tolist()}
    assert len(asked) > 1 or pairs == 1
    # each query followed by its value
    assert (x[:, 2 * pairs + 1::2] == y[:, 2 * pairs::2][:, :n_q - 1]).all()


def test_mode_chance_is_the_current_tokens_accuracy():
    """A model that mixes nothing still sees the current token, which is the mode more often than 1/A."""
    rng = np.random.default_rng(7)
    for symbols in (4, 16):
        x, y = study.gen_mode(rng, 2048, symbols)
        assert abs((x == y)[y >= 0].mean() - study.mode_chance(symbols)) < 0.02
        assert study.mode_chance(symbols) > 2 / symbols


def test_recall_chance_is_a_guess_among_the_values_not_yet_answered():
    """The chance level is what a model gets that knows the values of the pairs and which ones were answered
    already, but not which key each belongs to: simulate that guesser."""
    rng = np.random.default_rng(1)
    for pairs in (2, 4, 8):
        x, y = sample('recall', pairs, n=4000, seed=pairs)
        right = total = 0
        for xs, ys in zip(x, y):
            left = list(xs[1:2 * pairs:2])
            for t in np.flatnonzero(ys >= 0):
                guess = left[rng.integers(len(left))]
                right += guess == ys[t]
                total += 1
                left.remove(ys[t])
        assert abs(right / total - study.recall_chance(pairs)) < 0.02
    assert study.recall_chance(2) == 0.5
    assert study.recall_chance(4) == pytest.approx((1 / 4 + 1 / 3) / 2)


@pytest.mark.parametrize('length', [1, 4, 9])
def test_copy_labels_are_the_segment_again(length):
    x, y = sample('copy', length)
    assert x.shape[1] == 2 * length and (x[:, length] == 32).all()     # the separator
    assert (x[:, :length] < 32).all() and (x[:, length + 1:] == x[:, :length - 1]).all()
    # every symbol of the repeat is asked, at the token before it
    check_labels(x, y, lambda p: p[len(p) - 1 - length] if len(p) > length else None)


@pytest.mark.parametrize('period', [1, 2, 3, 4])
def test_periodic_labels_are_the_next_token(period):
    x, y = sample('periodic', period)
    assert (x[:, period:] == x[:, :-period]).all()
    # the next token (x is periodic) is the one P - 1 places back, asked wherever that token exists
    check_labels(x, y, lambda p: p[len(p) - period] if len(p) >= period else None)


@pytest.mark.parametrize('symbols', [2, 4, 16])
def test_mode_labels_are_the_unique_most_frequent_symbol_so_far(symbols):
    x, y = sample('mode', symbols)
    assert set(np.unique(x).tolist()) == set(range(symbols))

    def answer(prefix):
        if len(prefix) < 8:                                            # the warm-up
            return None
        counts = np.bincount(prefix, minlength=symbols)
        top = np.flatnonzero(counts == counts.max())
        return int(top[0]) if len(top) == 1 else None                  # a tie is not asked
    check_labels(x, y, answer)
    assert (y >= 0).mean() > 0.5                                       # most positions are asked


def test_train_and_test_sequences_are_disjoint():
    """period 2 has 32 x 32 distinct sequences, so an unfiltered stream hits the test set often; the
    training stream never does, and it is the same stream for every model."""
    task = TASK['periodic']
    x_test, _ = task.gen(np.random.default_rng([study.TASK_SEED, 0]), 512, 2)      # as task_run draws it
    test = {tuple(r) for r in x_test.tolist()}
    x_raw, _ = task.gen(np.random.default_rng(5), 4000, 2)
    assert sum(tuple(r) in test for r in x_raw.tolist()) > 1000       # without the filter they would overlap

    streams = [list(study.task_train_batches(task, 2, 40, 100, x_test)) for _ in range(2)]
    assert len(streams[0]) == 100 and all(x.shape == (40, 32) for x, _ in streams[0])
    x, y = (torch.cat(part) for part in zip(*streams[0]))
    train = {tuple(r) for r in x.tolist()}
    assert not test & train and len(train) > 200                       # not one sequence repeated
    assert torch.equal(x, torch.cat([b for b, _ in streams[1]]))
    assert torch.equal(y[:, 1:-1], x[:, 2:]) and (y[:, 0] == -1).all()   # labels still match their inputs


def test_the_loss_is_taken_at_the_labelled_positions_only():
    """GPT.forward with the task's y: outputs at unlabelled positions have no effect on the loss."""
    task = TASK['recall']
    x, y = (torch.from_numpy(a) for a in task.gen(np.random.default_rng(0), 16, 4))
    torch.manual_seed(0)
    cfg = study.tost.GPTConfig(block_size=x.shape[1], vocab_size=task.vocab, **study.TASK_MODEL)
    logits, loss = study.tost.GPT(cfg)(x, y)
    m = y >= 0
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(logits[m], y[m]))
    assert m.sum() == 16 * 2                                          # the two queries of each sequence


@pytest.mark.slow
def test_tasks_section_runs_end_to_end(tmp_path):
    out = tmp_path / 'study.json'
    study.main(['tasks', '--smoke', f'--json={out}'])
    res = json.loads(out.read_text())
    rows = res['tasks']
    want = [(t.name, m) for t in study.TASKS.values() for m in study.TASK_MODELS]
    assert [(r['task'], r['model']) for r in rows] == want
    for r in rows:
        assert 0 <= r['accuracy'] <= 1 and 0 < r['chance'] <= 1 and r['steps'] == 2
        assert r['knob'] == TASK[r['task']].knob and r['value'] == TASK[r['task']].quick[0]
    assert matplotlib.image.imread(tmp_path / 'tasks.png').shape[1] > 600       # the grid, beside the JSON
    assert res['tasks_budget']['steps'] == dict.fromkeys(TASK, 2)


def test_the_task_maps_hybrid_is_one_softmax_block_of_two_the_first_with_the_shift():
    cfg = study.tost.GPTConfig(**study.TASK_MODEL, **study.TASK_MODELS['hybrid-first+shift'])
    blocks = study.tost.GPT(cfg).transformer.h
    assert [type(b.attn).__name__ for b in blocks] == ['SoftmaxAttention', 'CausalTSSA']
    assert plot.model_name(vars(cfg)) == 'hybrid + shift'


@pytest.mark.slow
def test_language_and_vision_sections_run_end_to_end(tmp_path):
    """The smoke sizes, through the real scripts (train_gpt.py, sample.py, train_vit.py): each variant's key
    reaches its checkpoint, and the table's numbers come from the runs' logs."""
    out = tmp_path / 'study.json'
    res = study.main(['language,vision', '--smoke', f'--out_dir={tmp_path / "runs"}', f'--json={out}'])
    lang = res['language']['rows']
    assert [plot.model_name(r) for r in lang] == ['ToST', 'ToST + shift', 'hybrid + shift']
    for r in lang:
        ckpt = torch.load(f"{r['out_dir']}/ckpt.pt", weights_only=True)
        assert ckpt['model_args']['token_shift'] is bool(r.get('token_shift'))
        # smoke: 1 block
        assert ckpt['model_args']['softmax_layers'] == ([0] if r.get('softmax_layers') else [])
        assert r['val_loss'] > 0 and r['tokens_per_sec'] > 0 and r['sample'].startswith('def ')
    vis = res['vision']['rows']
    assert [(r['variant'], r.get('lpi')) for r in vis] == [('ToST (paper)', None), ('ToST + lpi', True)]
    assert all(0 <= r['test_acc'] <= 1 for r in vis)
    # each section's runs on one figure, drawn from the json's rows
    for name in ('language.png', 'vision.png'):
        assert matplotlib.image.imread(tmp_path / name).shape[:2] == (420, 700)


def test_the_sample_commands_and_samples_are_printed_whole_on_one_line(capsys, monkeypatch):
    """Longer than the console (130 columns when stdout is not a terminal), a command was wrapped, and its
    first line pasted ran another command."""
    out_dir = 'out-study/language-' + 'x' * 150
    log = [dict(kind='eval', val_loss=2.0), dict(kind='train', tokens_per_sec=100.0)]
    row = dict(variant='ToST (paper)', seconds=1.0, out_dir=out_dir)
    monkeypatch.setattr(study, 'train', lambda *args: iter([(row, out_dir, log)]))
    long_line = 'def f(): return ' + ' + '.join(['1'] * 100)
    said = SimpleNamespace(stdout=f'{long_line}\n---------------\n')
    monkeypatch.setattr(study, 'run_script', lambda *args: said)
    study.section_language(SimpleNamespace(mode='smoke'), {})
    lines = capsys.readouterr().out.splitlines()
    command = shlex.join(['python', 'sample.py', f'--out_dir={out_dir}',
                          *(f'--{k}={v}' for k, v in study.SAMPLE.items())])
    assert any(line.endswith(command) for line in lines) and long_line in lines, lines


@pytest.mark.parametrize('option', ['--json=README.md', '--json=results/', '--out_dir=',
                                    '--out_dir=README.md', '--quick'])
def test_a_bad_json_or_out_dir_is_one_line_before_any_work(fails, tmp_path, monkeypatch, option):
    """--json=README.md wrote the results over the README (and the figures beside it); --json=results/ wrote a
    file named results; --out_dir= is no folder, nor is a file; --quick with --smoke is two budgets. Refused
    before any section runs: the README as it was, nothing else written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'README.md').write_text('# the project')
    ran = []
    monkeypatch.setitem(study.SECTIONS, 'tasks', lambda args, results: ran.append(args))
    fails(study.main, ['tasks', '--smoke', option], option.rstrip('='))
    assert ran == [] and os.listdir(tmp_path) == ['README.md']
    assert (tmp_path / 'README.md').read_text() == '# the project'


def test_the_budget_is_the_one_asked_for_and_the_results_name_the_machine(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setitem(study.SECTIONS, 'tasks', lambda args, results: ran.append((args.mode, results)))
    for flag, mode in (('--smoke', 'smoke'), ('--quick', 'quick'), ('', 'full')):
        study.main(['tasks', f'--out_dir={tmp_path}', *filter(None, [flag])])
        assert ran[-1][0] == ran[-1][1]['mode'] == mode and 'cpu' in ran[-1][1]


def test_a_failed_run_is_the_childs_one_line(fails, tmp_path, monkeypatch):
    """A script that fails under the study ends it with one line, exit 2, that names the script and what
    the script said was wrong."""
    monkeypatch.setitem(study.LANGUAGE_BUDGET, 'smoke', {'nosuch_key': 1})
    fails(study.main, ['language', '--smoke', f'--out_dir={tmp_path}'], 'train_gpt.py', '--nosuch_key')


@POSIX_ONLY
@pytest.mark.parametrize('sig', ['SIGINT', 'SIGTERM'])
def test_ctrl_c_while_the_pool_starts_is_one_line(tmp_path, sig):
    """A real SIGINT to the whole process group, as a terminal's Ctrl-C sends, or SIGTERM to the study alone,
    as `kill` sends, while the task workers import torch: the parent's one line, exit 130, and no worker's
    traceback; no process of the group runs on."""
    p = subprocess.Popen([sys.executable, '-m', 'tools.study', 'tasks', '--smoke', f'--out_dir={tmp_path}'],
                         cwd=study.REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    # The line printed just before the pool starts.
    while 'tasks:' not in p.stdout.readline():
        assert p.poll() is None, p.stderr.read()
    time.sleep(0.3)
    if sig == 'SIGINT':
        os.killpg(p.pid, signal.SIGINT)
    else:
        os.kill(p.pid, signal.SIGTERM)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        # (the group is not left running)
        os.killpg(p.pid, signal.SIGKILL)
        raise
    assert p.returncode == 130 and len(err.strip().splitlines()) == 1, err
    # Running ones only (a dead child waits for PID 1 to reap it), looked at for up to 2 s.
    deadline = time.time() + 2
    while True:
        states = subprocess.run(['ps', '-o', 'stat=', '-s', str(p.pid)], capture_output=True,
                                text=True).stdout
        if all(state.startswith('Z') for state in states.split()) or time.time() > deadline:
            break
        time.sleep(0.05)
    assert all(state.startswith('Z') for state in states.split()), states


def test_the_language_row_is_the_last_eval_and_the_mean_speed_after_warmup(monkeypatch, capsys):
    """A row's val loss is its run's last evaluation; its speed the mean of the train rows after the first
    (compiling, warming up)."""
    log = [dict(kind='train', tokens_per_sec=1.0), dict(kind='eval', val_loss=3.0),
           dict(kind='train', tokens_per_sec=10.0), dict(kind='train', tokens_per_sec=20.0),
           dict(kind='eval', val_loss=2.0)]
    rows = [dict(variant='ToST (paper)', seconds=1.0, out_dir='o'),
            dict(variant='x', seconds=1.0, out_dir='p')]
    later = [*log[:-1], dict(kind='eval', val_loss=2.5)]
    monkeypatch.setattr(study, 'train', lambda *args: iter([(rows[0], 'o', log), (rows[1], 'p', later)]))
    monkeypatch.setattr(study, 'run_script', lambda *args: SimpleNamespace(stdout='def x'))
    res = {}
    study.section_language(SimpleNamespace(mode='smoke'), res)
    got = [(r['val_loss'], r['tokens_per_sec']) for r in res['language']['rows']]
    assert got == [(2.0, 15.0), (2.5, 15.0)]
    assert '+0.500' in capsys.readouterr().out                        # vs the first row, the paper's


def test_the_vision_row_is_the_last_and_best_accuracy(tmp_path, monkeypatch):
    log = [dict(kind='eval', epoch=1, test_acc=0.2), dict(kind='eval', epoch=2, test_acc=0.5),
           dict(kind='eval', epoch=3, test_acc=0.4)]
    monkeypatch.setattr(study, 'train', lambda *args: iter([(dict(variant='v', seconds=1.0), 'o', log)]))
    res = {}
    study.section_vision(SimpleNamespace(mode='smoke', out_dir=str(tmp_path)), res)
    r, = res['vision']['rows']
    assert (r['test_acc'], r['best_acc']) == (0.4, 0.5)
    # a smoke study's images are its own: a full run's checkpoint, evaluated again, finds its own data
    assert os.listdir(tmp_path / 'data') == ['glyphs-smoke']


def test_every_run_of_a_section_gets_the_same_budget_in_float32_in_its_own_folder(tmp_path, monkeypatch):
    """Side by side: the same budget and float32 for every variant, each with its own options, each run in a
    folder of its own that its row names."""
    calls = []
    monkeypatch.setattr(study, 'run_script', lambda script, keys: calls.append(keys))
    monkeypatch.setattr(study.plot, 'read_run', lambda d: (None, {}, [d]))
    args = SimpleNamespace(mode='full', out_dir=str(tmp_path))
    got = list(study.train(args, 'language', 'train_gpt.py', study.LANGUAGE, {'max_iters': 7}))
    assert len({c['out_dir'] for c in calls}) == len(calls) == len(study.LANGUAGE)
    assert [os.path.abspath(row['out_dir']) for row, _, _ in got] == [c['out_dir'] for c in calls]
    for c, (row, out_dir, log), (_, _, extra) in zip(calls, got, study.LANGUAGE):
        assert c['dtype'] == 'float32' and c['max_iters'] == 7 and c['overwrite'] is True
        assert {k: c[k] for k in extra} == extra == {k: row[k] for k in extra} and log == [out_dir]
    # a smoke study's runs never replace the full one's
    smoke = SimpleNamespace(mode='smoke', out_dir=str(tmp_path))
    assert next(study.train(smoke, 'language', 'train_gpt.py', study.LANGUAGE, {}))[1] != got[0][1]

    # On Windows, a folder on another drive than the current one has no relative path: its row names it whole.
    def other_drive(path, start=None):
        raise ValueError("path is on mount 'D:', start on mount 'C:'")
    monkeypatch.setattr(study.os.path, 'relpath', other_drive)
    row = next(study.train(args, 'language', 'train_gpt.py', study.LANGUAGE, {}))[0]
    assert row['out_dir'] == calls[-1]['out_dir']


def oracle_logits(self, x):
    """periodic, period 2: the next token is the one before."""
    return 10 * torch.nn.functional.one_hot(torch.roll(x, 1, 1), 32).float()


def test_a_task_cell_is_the_accuracy_at_the_labelled_positions(monkeypatch):
    """A model that knows the answer scores 1: positions without a label are not counted."""
    monkeypatch.setattr(study.tost.GPT, 'logits', oracle_logits)
    r = study.task_run(('periodic', 2, 'tssa', 2, 8))
    assert r['accuracy'] == 1.0 and r['chance'] == 1 / 32


def test_a_task_cell_is_the_same_on_every_run_and_names_its_chance(monkeypatch):
    """Seeded: the same init and the same held-out sequences for every model and every run; the warmup is a
    fraction of the steps."""
    a, b = (study.task_run(('mode', 4, 'tssa', 2, 8)) for _ in range(2))
    a.pop('seconds'), b.pop('seconds')
    assert a == b and a['chance'] == study.mode_chance(4)
    lrs = []
    monkeypatch.setattr(study, 'cosine_lr', lambda *args: lrs.append(args) or 1e-3)
    study.task_run(('mode', 4, 'tssa', 10, 8))
    assert lrs[0][3] == pytest.approx(study.TASK_OPT['warmup'] * 10)


class FakePool:
    """multiprocessing's pool, run in this process: imap in order (no imap_unordered)."""

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def imap(self, fn, jobs):
        return map(fn, jobs)


@pytest.mark.parametrize('mode', ['full', 'quick'])
def test_every_model_of_a_row_gets_the_same_budget_in_job_order(monkeypatch, capsys, mode):
    """The jobs the mode's budget says; each cell lands under its model, in the results and in the table."""
    jobs = []

    def fake(job):
        jobs.append(job)
        name, value, kind, steps, tests = job
        t = study.TASKS[name]
        return dict(task=name, knob=t.knob, value=value, model=kind, accuracy=len(jobs) / 100,
                    chance=value / 100, seq_len=value + 100, seconds=0.0)
    monkeypatch.setattr(study, 'task_run', fake)
    pools = SimpleNamespace(Pool=lambda n: FakePool())
    monkeypatch.setattr(study.multiprocessing, 'get_context', lambda how: pools)
    res = {}
    study.section_tasks(SimpleNamespace(mode=mode), res)
    want = [(t.name, v, k, t.steps[0 if mode == 'full' else 1], study.TASK_TEST[mode])
            for t in study.TASKS.values() for v in getattr(t, mode) for k in study.TASK_MODELS]
    assert jobs == want
    assert [(r['task'], r['value'], r['model']) for r in res['tasks']] == [j[:3] for j in want]
    assert res['tasks_budget']['test_sequences'] == study.TASK_TEST[mode]
    assert res['tasks_budget']['seed'] == study.TASK_SEED
    # the printed table: each row's cells in the order of the models, these numbers
    out = capsys.readouterr().out
    k = len(study.TASK_MODELS)
    for i in range(0, len(want), k):
        name, value = want[i][:2]
        cells = f"{study.TASKS[name].knob} {value} {value + 100} {value / 100:.2f} " + \
            ' '.join(f"{(i + j + 1) / 100:.2f}" for j in range(k))
        shown = [' '.join(line.replace('│', ' ').split()) for line in out.splitlines()]
        assert any(line.endswith(cells) for line in shown), cells


def committed(name):
    with open(os.path.join(study.REPO, 'docs', f'{name}.json'), encoding='utf-8') as f:
        return json.load(f)


def options_of(row, measured):
    """A study row's options: its keys but what it measured, less those at their default (None)."""
    return {k: v for k, v in row.items() if k not in measured and v is not None}


def test_the_studies_in_docs_are_the_rows_and_budgets_the_code_runs():
    """docs/language.json, vision.json and tasks.json hold the numbers of docs/quality.md and
    docs/capabilities.md: each row's options and each budget are the ones the study gives now."""
    lang = committed('language')['language']
    assert {k: v for k, v in lang['budget'].items() if k != 'note'} == study.LANGUAGE_BUDGET['full']
    measured = ('variant', 'seconds', 'out_dir', 'val_loss', 'tokens_per_sec', 'sample')
    assert [(r['variant'], options_of(r, measured)) for r in lang['rows']] == \
        [(name, extra) for _, name, extra in study.LANGUAGE]
    vis = committed('vision')['vision']
    n_train, n_test, overrides = study.VISION_BUDGET['full']
    assert vis['budget'] == dict(study.VISION_MODEL, **overrides, train_images=n_train, test_images=n_test,
                                 note=vis['budget']['note'])
    measured = ('variant', 'seconds', 'out_dir', 'test_acc', 'best_acc')
    assert [(r['variant'], options_of(r, measured)) for r in vis['rows']] == \
        [(name, extra) for _, name, extra in study.VISION]
    tasks = committed('tasks')
    budget = dict(model=study.TASK_MODEL, steps={t.name: t.steps[0] for t in TASK.values()},
                  test_sequences=study.TASK_TEST['full'], seed=study.TASK_SEED)
    assert {k: tasks['tasks_budget'][k] for k in budget} == json.loads(json.dumps(budget))
    assert {k: tasks['tasks_budget']['optimizer'][k] for k in study.TASK_OPT} == \
        json.loads(json.dumps(study.TASK_OPT))
    want = [(t.name, v, k, t.steps[0], pytest.approx(t.chance(v)))
            for t in TASK.values() for v in t.full for k in study.TASK_MODELS]
    assert [(r['task'], r['value'], r['model'], r['steps'], r['chance']) for r in tasks['tasks']] == want


def test_the_task_maps_columns_are_the_models_they_name():
    """A column is headed by its key; the hybrid's says which block is softmax."""
    assert [plot.model_name(c) for c in study.TASK_MODELS.values()] == \
        [k.replace('tssa', 'ToST').replace('-first', '').replace('+', ' + ') for k in study.TASK_MODELS]
    assert study.TASK_MODELS['hybrid-first+shift']['softmax_layers'] == (0,)


def test_the_glyph_images_show_their_class(tmp_path):
    """Each image's bright pixels (the glyph, of one colour; the noise is darker) make the same pattern
    wherever its class appears, in train and test alike, and the classes' patterns differ."""
    study.make_glyph_images(tmp_path, 48, 32)
    meta = json.loads((tmp_path / 'meta.json').read_text())
    assert meta['num_classes'] == len(meta['classes']) == 10
    patterns = {}
    for split, n in (('train', 48), ('test', 32)):
        x = np.load(tmp_path / f'{split}_images.npy')
        y = np.load(tmp_path / f'{split}_labels.npy')
        assert x.shape == (n, 3, 32, 32) and x.dtype == np.uint8 and y.shape == (n,) and y.max() < 10
        for image, label in zip(x, y.tolist()):
            bright = (image >= 150).any(0)
            rows, cols = np.nonzero(bright)
            crop = bright[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
            assert crop.shape <= (5, 5) and (image[:, ~bright] < 120).all()
            assert (image[:, bright] == image[:, bright][:, :1]).all()
            key = crop.tobytes() + bytes(crop.shape)
            assert patterns.setdefault(label, key) == key
    assert len(set(patterns.values())) == len(patterns) > 5


def test_a_task_cell_trains_its_model_from_the_shared_seed_and_budget(monkeypatch):
    """Every column of a row: its own model (TASK_MODELS), built from the same seed, trained with TASK_OPT's
    batch, weight decay, schedule and clip."""
    seen = []
    real = (study.tost.GPT, study.tost.make_optimizer, study.task_train_batches, study.optimizer_step)

    class Spy(real[0]):
        def __init__(self, cfg):
            seen.append(('init', cfg.attn, cfg.token_shift, tuple(cfg.softmax_layers), torch.get_rng_state()))
            super().__init__(cfg)
    monkeypatch.setattr(study.tost, 'GPT', Spy)
    monkeypatch.setattr(study.tost, 'make_optimizer',
                        lambda model, wd, *a: seen.append(('decay', wd)) or real[1](model, wd, *a))
    monkeypatch.setattr(study, 'task_train_batches',
                        lambda task, v, batch, *a: seen.append(('batch', batch))
                        or real[2](task, v, batch, *a))
    monkeypatch.setattr(study, 'optimizer_step',
                        lambda opt, scaler, lr, clip: seen.append(('clip', clip))
                        or real[3](opt, scaler, lr, clip))
    monkeypatch.setattr(study, 'cosine_lr', lambda *args: seen.append(('lr', args[1:])) or 1e-3)
    o = study.TASK_OPT
    for kind, cfg in study.TASK_MODELS.items():
        seen.clear()
        study.task_run(('periodic', 2, kind, 1, 8))
        (_, attn, shift, layers, state), *rest = seen
        want = (cfg['attn'], cfg.get('token_shift', False), cfg.get('softmax_layers', ()))
        assert (attn, shift, layers) == want
        assert torch.equal(state, torch.manual_seed(study.TASK_SEED).get_state())
        assert rest == [('decay', o['weight_decay']), ('batch', o['tokens'] // 32),
                        ('lr', (o['lr'], o['min_lr'], o['warmup'], 1)), ('clip', o['clip'])]
