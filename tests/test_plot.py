"""Tests for plot.py: every figure the project draws, drawn from tiny inputs and read back (size, and not
blank); the command on several runs, on a run with no evaluation yet, and each input it cannot draw ending in
one line. Offline, seconds: python -m pytest -q tests/test_plot.py"""
import errno
import json
import math
import os
import shutil

import matplotlib.figure
import matplotlib.image
from matplotlib.backends.backend_agg import FigureCanvasAgg
import numpy as np
import pytest

import plot
from conftest import REPO


def read_png(path, shape):
    """The figure, checked to have (height, width) = shape to 1% (a tight box follows the text, whose width
    differs a pixel or two between matplotlib's versions) and more than a few colours."""
    img = matplotlib.image.imread(path)
    assert np.allclose(img.shape[:2], shape, rtol=0.01), img.shape
    # the colours as one integer each (PNG's 8 bits a channel): a 1-d unique, not a slow row-wise one
    rgb = np.round(img[..., :3].reshape(-1, 3) * 255).astype(np.int64) @ np.array([1 << 16, 1 << 8, 1])
    assert len(np.unique(rgb)) > 20                                    # lines, text and markers: not blank


def write_run(folder, cfg, losses, evals=True):
    """A log.jsonl as train_gpt.py writes it: a config row, a train row per iteration, an eval row every 2."""
    os.makedirs(folder, exist_ok=True)
    rows = [dict(kind='config', **cfg)]
    for it, loss in enumerate(losses, 1):
        rows.append(dict(iter=it, kind='train', train_loss=loss, tokens=128 * it, elapsed_s=0.1 * it))
        if evals and it % 2 == 0:
            rows.append(dict(rows[-1], kind='eval', val_loss=loss + 0.1))
    with open(os.path.join(folder, 'log.jsonl'), 'w') as f:
        f.writelines(json.dumps(r) + '\n' for r in rows)


def test_several_runs_of_different_models_on_one_figure(tmp_path, monkeypatch):
    """Each labelled from its own log, each curve from the rows of its kind; a run with no eval yet, a log
    cut short while a row was written, a damaged one (what is whole is drawn), a log file given for its
    folder."""
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / 'out', dict(attn='tssa', token_shift=False), [5.0, 4.0, 3.2, 2.9])
    write_run(tmp_path / 'out-soft', dict(attn='softmax', token_shift=True), [5.0, 3.5, 2.8, 2.5])
    # a folder's name with a $ in it, shown as typed
    write_run(tmp_path / '$new^$', dict(attn='tssa', softmax_layers=[-1]), [5.1, 4.5], evals=False)
    with open(tmp_path / 'out-soft' / 'log.jsonl', 'ab') as f:
        # a point no axis can hold (its row is read, the point left out), and bytes that are not UTF-8 (a
        # damaged file: the line left out)
        f.write(b'{"iter": 5, "kind": "eval", "val_loss": Infinity, "tokens": 640}\n\xff\xfe\n')
    with open(tmp_path / 'out' / 'log.jsonl', 'a') as f:
        f.write('{"iter": 5, "kind": "train", "train_lo')                 # killed while writing a row
    runs = [plot.read_run(f) for f in ('out', 'out-soft', '$new^$')]
    assert [label for label, _, _ in runs] == ['out: ToST', 'out-soft: softmax + shift', '$new^$: hybrid']
    assert len(runs[0][2]) == 6 and len(runs[1][2]) == 7
    assert plot.points(runs[1][2], 'eval', 'tokens', 'val_loss').tolist() == [[256, 512], [3.6, 2.6]]
    # the train curve is the train rows: an eval row's train_loss is not one of its points
    train = plot.points(runs[0][2], 'train', 'tokens', 'train_loss')
    assert train.tolist() == [[128, 256, 384, 512], [5.0, 4.0, 3.2, 2.9]]
    plot.main(['out', 'out-soft', '$new^$', '--x=seconds'])
    read_png(tmp_path / 'runs.png', (420, 700))
    # into a folder not made yet; a title with a $, as typed
    plot.main(['out/log.jsonl', '--out=new/folder/runs.png', '--title=$\\frac$'])
    read_png(tmp_path / 'new' / 'folder' / 'runs.png', (420, 700))


def test_a_study_figure_is_drawn_from_the_runs_its_rows_measured(tmp_path, monkeypatch):
    """The runs of a study's rows, each its own curve; a folder that holds another run since (its last
    val_loss is not the row's), or none, is one line naming it, and nothing is drawn. The title says a
    smoke study's budget is not the full one."""
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / 'a', dict(attn='tssa'), [5.0, 4.0, 3.2, 2.9])
    write_run(tmp_path / 'b', dict(attn='softmax'), [5.0, 3.5, 2.8, 2.5])
    rows = [dict(variant='ToST', val_loss=3.0, out_dir='a'),
            dict(variant='softmax', val_loss=2.6, out_dir='b')]
    (tmp_path / 'study.json').write_text(json.dumps(dict(mode='smoke', language=dict(rows=rows))))
    titles = []
    curves = plot.learning_curves
    monkeypatch.setattr(plot, 'learning_curves',
                        lambda *args, title: titles.append(title) or curves(*args, title=title))
    assert plot.draw_results('study.json', '.') == ['./language.png']
    read_png(tmp_path / 'language.png', (420, 700))
    assert 'smoke' in titles[0]
    os.remove('language.png')
    for later in ({'variant': 'softmax', 'val_loss': 2.7, 'out_dir': 'b'}, dict(rows[1], out_dir='c')):
        (tmp_path / 'study.json').write_text(json.dumps(dict(language=dict(rows=[rows[0], later]))))
        with pytest.raises(plot.UsageError, match=later['out_dir']):
            plot.draw_results('study.json', '.')
        assert not os.path.exists('language.png')


def test_results_files_are_drawn_again_into_the_current_folder(tmp_path, monkeypatch):
    """python plot.py docs/bench.json docs/tasks.json: each section's figure, from the numbers alone, in the
    current folder (the figures beside the file, tracked ones in docs/, are rewritten only with --out_dir;
    test_commands.py runs --out_dir=docs)."""
    (tmp_path / 'docs').mkdir()
    for f in ('bench.json', 'tasks.json'):
        shutil.copy(os.path.join(REPO, 'docs', f), tmp_path / 'docs')
    (tmp_path / 'docs' / 'speed.png').write_bytes(b'tracked')
    # one saved again by an editor, with a byte-order mark
    tasks = tmp_path / 'docs' / 'tasks.json'
    tasks.write_bytes(b'\xef\xbb\xbf' + tasks.read_bytes())
    monkeypatch.chdir(tmp_path)
    plot.main(['docs/bench.json', 'docs/tasks.json'])
    read_png(tmp_path / 'speed.png', (400, 1000))
    read_png(tmp_path / 'generation.png', (400, 650))
    read_png(tmp_path / 'tasks.png', (664, 970))                  # five model columns, twelve rows
    assert sorted(os.listdir(tmp_path / 'docs')) == ['bench.json', 'speed.png', 'tasks.json']
    assert (tmp_path / 'docs' / 'speed.png').read_bytes() == b'tracked'
    plot.main(['docs/bench.json', '--out_dir=figures'])               # a folder not made yet
    read_png(tmp_path / 'figures' / 'speed.png', (400, 1000))


def test_a_figure_is_not_drawn_over_another_the_same_command_drew(tmp_path, monkeypatch, fails):
    """Two results of one section into one folder would both be tasks.png (two bench runs: speed.png), as
    would runs given --out=tasks.png: the second is refused, naming what to change, and the first stays."""
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / 'out', dict(attn='tssa'), [5.0, 4.0])
    cell = dict(task='copy', knob='length', value=8, model='tssa', accuracy=0.5, chance=0.03)
    for name in ('a.json', 'b.json'):
        (tmp_path / name).write_text(json.dumps({'tasks': [cell]}))
    fails(plot.main, ['a.json', 'b.json'], 'tasks.png', 'b.json', '--out_dir')
    first = (tmp_path / 'tasks.png').read_bytes()
    fails(plot.main, ['a.json', 'out', '--out=tasks.png'], '--out')
    assert (tmp_path / 'tasks.png').read_bytes() == first


def test_the_loss_axis_shows_the_part_after_the_first_drop_in_the_runs_unit(tmp_path, monkeypatch):
    """The demo's log: its y axis spans the losses after the first evaluation (the first rows' 5.2 is above
    it), in nats per byte (a vocabulary of 256); a run with a larger vocabulary says nats per token."""
    axes = []
    monkeypatch.setattr(plot, 'save', lambda fig, path: axes.append(fig.axes[0]))
    demo = plot.read_run(os.path.join(REPO, 'docs', 'demo-log.jsonl'))
    plot.learning_curves([demo], 'x.png')
    lo, hi = axes[-1].get_ylim()
    vals = [r['val_loss'] for r in demo[2] if r.get('val_loss') is not None]
    assert vals[0] > 5 and hi < vals[0] and max(vals[1:]) < hi < max(vals[1:]) + 0.1
    train = min(r['train_loss'] for r in demo[2])
    assert train - 0.1 < lo < train
    assert 'per byte' in axes[-1].get_ylabel()
    plot.learning_curves([(demo[0], dict(demo[1], vocab_size=50304), demo[2])], 'x.png')
    assert 'per token' in axes[-1].get_ylabel()
    # one evaluation after the first (the demo's loss.png for a quarter of its run): the axis holds the train
    # losses of the run's later half too
    write_run(tmp_path / 'a', dict(attn='tssa'), [5.0, 4.0, 3.2, 2.9])
    plot.learning_curves([plot.read_run(str(tmp_path / 'a'))], 'x.png')
    lo, hi = axes[-1].get_ylim()
    assert lo < 2.9 and 4.0 < hi < 4.2
    # only the first evaluation (a run stopped before its second): it stays on the axis, with the whole curve
    rows = [dict(kind='eval', tokens=0, val_loss=5.6)]
    rows += [dict(kind='train', tokens=128 * i, train_loss=loss) for i, loss in enumerate((4.0, 3.0, 2.5), 1)]
    plot.learning_curves([('b', dict(attn='tssa'), rows)], 'x.png')
    lo, hi = axes[-1].get_ylim()
    assert lo < 2.5 and hi > 5.6


def test_what_cannot_be_drawn_is_one_line(tmp_path, fails, monkeypatch):
    """No run, or what is not one; a bad --out (a file for its folder, a folder, a format other than .png,
    .pdf, .svg), a language run with a vision run, a .json that holds no results or names runs that are not
    here, an option that applies to none of the figures drawn: each one line, exit 2, no file."""
    monkeypatch.chdir(tmp_path)                                      # where a figure would go unless told
    write_run(tmp_path / 'out', dict(attn='tssa'), [5.0, 4.0])
    (tmp_path / 'vit').mkdir()
    (tmp_path / 'vit' / 'log.jsonl').write_text(json.dumps(dict(kind='eval', step=4, epoch=1, test_acc=0.3)))
    (tmp_path / 'other.json').write_text('{"loss": 1}')
    (tmp_path / 'cut.json').write_text('{"operator": [{"n": 1024}]}')          # rows without their numbers
    gone = {'variant': 'ToST', 'val_loss': 2.0, 'out_dir': 'gone'}
    (tmp_path / 'study.json').write_text(json.dumps({'language': {'rows': [gone]}}))
    # a row whose out_dir is a number: 1 is also standard output's descriptor, which os.path.exists finds
    (tmp_path / 'num.json').write_text(json.dumps({'language': {'rows': [dict(gone, out_dir=1)]}}))
    cell = dict(task='copy', knob='length', value=8, model='tssa', accuracy=0.5, chance=0.03)
    (tmp_path / 'tasks.json').write_text(json.dumps({'tasks': [cell]}))
    (tmp_path / 'notes.md').write_text('# not a log')
    for name, text in (('empty', ''), ('cut', '{"bad json')):
        (tmp_path / name).mkdir()
        (tmp_path / name / 'log.jsonl').write_text(text)
    # each case: the command line, and what its one line names (the option or the path at fault)
    for argv, *names in (([], ''),                                   # no run at all
                         ([str(tmp_path)], str(tmp_path)),           # a folder that is not a run
                         (['notes.md'], 'notes.md'),
                         # a log without a row: no empty figure
                         (['empty'], 'empty/log.jsonl'),
                         (['cut', 'out'], 'cut/log.jsonl', 'line 1'),
                         # a file where --out's folder would be made
                         (['out', '--out=notes.md/x.png'], 'notes.md'),
                         (['out', f'--out={tmp_path}'], '--out'),
                         # matplotlib knows .pgf, but writes it only with xelatex: not a format --out lists
                         (['out', '--out=x.pgf'], 'x.pgf'),
                         (['out', '--x=epochs'], '--x'),
                         (['out', 'vit'], 'vit'),
                         (['other.json'], 'other.json'),
                         (['cut.json'], 'cut.json'),
                         (['study.json'], 'gone', 'tools.study language'),
                         (['num.json'], 'num.json'),
                         (['tasks.json', '--out_dir=notes.md'], '--out_dir=notes.md'),
                         # an option for a figure that is not drawn: refused, not ignored
                         (['tasks.json', '--out=x.png'], '--out'),
                         (['vit', '--x=seconds'], '--x'),
                         (['out', '--out_dir=figs'], '--out_dir')):
        fails(plot.main, argv, *names)
    assert sorted(os.listdir(tmp_path)) == ['cut', 'cut.json', 'empty', 'notes.md', 'num.json', 'other.json',
                                            'out', 'study.json', 'tasks.json', 'vit']
    plot.main(['out', '--out=x.svg'])                                # the suffix picks the format
    assert (tmp_path / 'x.svg').read_text().lstrip().startswith('<?xml')
    plot.main(['out', '--out=x.PNG'])                                # in any case
    read_png(tmp_path / 'x.PNG', (420, 700))


def test_a_figure_that_cannot_be_written_keeps_the_earlier_one(tmp_path, monkeypatch, fails):
    """A full disk: one line naming --out's file, exit 2, the earlier figure whole and no temp file."""
    write_run(tmp_path / 'out', dict(attn='tssa'), [5.0, 4.0])
    out = tmp_path / 'x.png'
    out.write_bytes(b'an earlier figure')

    def full(fig, f, **kwargs):
        # As a full disk fails: part of it written, then ENOSPC with no file name.
        f.write(b'part')
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(matplotlib.figure.Figure, 'savefig', full)
    fails(plot.main, [str(tmp_path / 'out'), f'--out={out}'], str(out), '--out')
    assert sorted(os.listdir(tmp_path)) == ['out', 'x.png'] and out.read_bytes() == b'an earlier figure'


@pytest.fixture
def drawn(monkeypatch):
    """The figures plot draws, kept instead of saved, to read what each line, cell and image holds."""
    figs = []
    monkeypatch.setattr(plot, 'save', lambda fig, path: figs.append(fig))
    return figs


def test_curves_are_the_rows_of_their_kind_against_the_chosen_x(tmp_path, drawn):
    """Each run's train line is its train rows, its val line its eval rows, against --x; three runs of one
    model (the language study's ToST variants) are told apart by their style."""
    write_run(tmp_path / 'a', dict(attn='tssa', n_head=4), [5.0, 4.0, 3.2, 2.9])
    write_run(tmp_path / 'b', dict(attn='tssa', n_head=8), [5.0, 3.5, 2.8, 2.5])
    write_run(tmp_path / 'c', dict(attn='tssa', n_head=16, vocab_size=256), [5.0, 3.6, 2.7, 2.4])
    runs = [plot.read_run(str(tmp_path / f)) for f in 'abc']
    plot.learning_curves(runs, 'x.png', x='seconds')
    ax = drawn[-1].axes[0]
    assert ax.get_xlabel() == 'seconds of training'
    lines = ax.get_lines()
    assert len(lines) == 6 and 'per token' in ax.get_ylabel()      # one run of bytes, two of tokens
    for (_, _, rows), train, val in zip(runs, lines[0::2], lines[1::2]):
        t = [r for r in rows if r['kind'] == 'train']
        e = [r for r in rows if r['kind'] == 'eval']
        assert train.get_xdata().tolist() == [r['elapsed_s'] for r in t]
        assert train.get_ydata().tolist() == [r['train_loss'] for r in t]
        assert val.get_xdata().tolist() == [r['elapsed_s'] for r in e]
        assert val.get_ydata().tolist() == [r['val_loss'] for r in e]
    # three runs of one model: told apart by their style
    assert len({(l.get_color(), str(l.get_linestyle())) for l in lines[1::2]}) == 3


def test_the_command_draws_against_the_x_and_under_the_title_asked(tmp_path, drawn, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / 'a', dict(attn='tssa'), [5.0, 4.0])
    plot.main(['a', '--x=seconds', '--title=mine'])
    ax = drawn[-1].axes[0]
    assert ax.get_xlabel() == 'seconds of training' and ax.get_title() == 'mine'


def test_the_grid_puts_each_cell_under_its_model_and_beside_its_row(drawn):
    """docs/tasks.json's figure: each accuracy in its model's column and its task's row, the chance in the
    row's label, a ~ where it is at chance."""
    with open(os.path.join(REPO, 'docs', 'tasks.json')) as f:
        res = json.load(f)
    plot.capability_grid(res, 'x.png')
    ax = drawn[-1].axes[0]
    models = list(dict.fromkeys(r['model'] for r in res['tasks']))
    xt = dict(zip(ax.get_xticks(), [t.get_text() for t in ax.get_xticklabels()]))
    yt = dict(zip(ax.get_yticks(), [t.get_text() for t in ax.get_yticklabels()]))
    texts = {(round(t.get_position()[0]), round(t.get_position()[1])): t.get_text() for t in ax.texts}
    assert len(texts) == len(res['tasks'])
    for r in res['tasks']:
        (j, i), = [(j, i) for (j, i) in texts if models[j] == r['model']
                   and yt[i].startswith(f"{r['task']}, {r['knob']} {r['value']} ")]
        assert texts[j, i].split()[0] == f"{r['accuracy']:.2f}"
        assert f"(chance {r['chance']:.2f})" in yt[i]
        assert texts[j, i].endswith('~') == (r['accuracy'] <= r['chance'] + 0.02)
        assert xt[j].replace(' ', '') == r['model'].replace('tssa', 'ToST')
    # colour: 0 at chance, 1 perfect
    above = ax.images[0].get_array()
    r = res['tasks'][0]
    assert above[0, 0] == pytest.approx(max(0, (r['accuracy'] - r['chance']) / (1 - r['chance'])))
    # a quick study's map says its budget is not the full one
    assert 'budget' not in ax.get_title()
    plot.capability_grid(dict(res, mode='quick'), 'x.png')
    assert '(quick budget)' in drawn[-1].axes[0].get_title()


def test_speed_and_generation_lines_are_their_columns(drawn):
    with open(os.path.join(REPO, 'docs', 'bench.json')) as f:
        res = json.load(f)
    plot.speed(res, 'x.png')
    left, right = drawn[-1].axes[:2]
    for line in left.get_lines():
        op = next(op for op, (label, _, _) in plot.OPS.items() if line.get_label().startswith(label + ','))
        rows = sorted((r for r in res['operator'] if r['op'] == op), key=lambda r: r['n'])
        assert line.get_xdata().tolist() == [r['n'] for r in rows]
        assert np.allclose(line.get_ydata(), [1e3 * r['fwdbwd_s'] for r in rows])
        assert f"k = {res['operator_exponent'][op]:.2f}" in line.get_label()
    for line in right.get_lines():
        op = next(op for op, (label, _, _) in plot.OPS.items() if line.get_label() == label)
        rows = sorted((r for r in res['operator'] if r['op'] == op), key=lambda r: r['n'])
        assert np.allclose(line.get_ydata(), [r['fwdbwd_peak_mb'] for r in rows])
    sizes = sorted({r['n'] for r in res['operator']})
    ticks = [t.get_text() for t in left.get_xticklabels()]
    assert ticks == [f"{n // 1024}k" if n >= 1024 else str(n) for n in sizes]
    # The log axis's powers of ten are drawn as such (a 10 with a small raised power), not as their source.
    renderer = FigureCanvasAgg(drawn[-1]).get_renderer()
    powers = [t for t in left.get_yticklabels() if '10^' in t.get_text()]
    assert powers and all(t.get_window_extent(renderer).width < 40 for t in powers)
    plot.finish(left, 'tokens', 'ms', '', [1536, 256])
    assert [t.get_text() for t in left.get_xticklabels()] == ['256', '1.5k']
    plot.generation(res, 'x.png')
    ax = drawn[-1].axes[0]
    by_label = {label: key for key, (label, _) in plot.GENERATION.items()}
    for line in ax.get_lines():
        assert line.get_ydata().tolist() == [r[by_label[line.get_label()]] for r in res['generation']]


def test_a_study_figure_labels_rows_and_names_a_quick_budget(tmp_path, drawn, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / 'a', dict(attn='tssa'), [5.0, 4.0, 3.2, 2.9])
    rows = [dict(variant='ToST (paper)', val_loss=3.0, out_dir='a')]
    plot.study_curves('language', 'val_loss', 'T')(dict(mode='quick', language=dict(rows=rows)), 'x.png')
    ax = drawn[-1].axes[0]
    assert 'quick' in ax.get_title()
    assert ax.get_legend().get_texts()[0].get_text().startswith('ToST (paper)')


def test_a_vision_row_is_drawn_on_one_scale_per_row(drawn):
    """The heads of a row share one colour scale, to be compared; the argmax panel is the head of largest
    Pi."""
    cls = np.arange(2 * 2 * 2, dtype=float).reshape(2, 2, 2)
    pi = np.array([[[0.9, 0.1], [0.9, 0.1]], [[0.1, 0.9], [0.1, 0.9]]])
    plot.vision_maps('x.png', np.zeros((3, 4, 4), np.uint8), cls, pi, 't')
    axes = drawn[-1].axes
    ims = [ax.images[0] for ax in axes if ax.images]
    # image, cls head 0, cls head 1, argmax, pi head 0, pi head 1 (+ colour bars have no images)
    assert ims[1].get_clim() == ims[2].get_clim() == (0.0, 7.0)
    assert ims[4].get_clim() == ims[5].get_clim() == (0.1, 0.9)
    assert ims[3].get_array().tolist() == [[0, 1], [0, 1]]     # the head with the larger Pi
    # the image in colour; one of one channel in grey
    plot.vision_maps('x.png', np.zeros((1, 4, 4), np.uint8), cls, pi, 't')
    assert ims[0].get_array().shape == (4, 4, 3) and drawn[-1].axes[0].images[0].get_array().shape == (4, 4)


# what a mutation audit found unpinned

def test_a_class_name_with_dollar_signs_is_drawn_as_typed(tmp_path):
    cls = np.zeros((2, 2, 2))
    plot.vision_maps(str(tmp_path / 'x.png'), np.zeros((3, 4, 4), np.uint8), cls, None, '$\\undefined$')
    assert (tmp_path / 'x.png').stat().st_size > 0


def test_a_tost_runs_log_is_labelled_tost():
    """The demo's config has softmax_layers [] (no softmax block): ToST, not hybrid."""
    assert plot.read_run(os.path.join(REPO, "docs", "demo-log.jsonl"))[0] == "demo-log: ToST"
    assert plot.model_name(dict(attn=None, token_shift=True)) == "ToST + shift"


def test_a_vision_run_with_lpi_is_labelled_so():
    assert plot.model_name(dict(attn="tssa", lpi=True)) == "ToST + lpi"


def test_a_line_that_is_json_but_not_a_row_is_left_out(tmp_path):
    """Lines that are not rows are left out; of the rows, points whose x or y is not a finite number (or is
    missing), the others kept.
    An editor's byte-order mark before the first row does not hide it."""
    log = tmp_path / "log.jsonl"
    log.write_text('\ufeff{"kind": "config", "attn": "tssa"}\n5\n"text"\n'
                   '{"kind": "eval", "tokens": 128, "val_loss": 3.0}\n'
                   '{"kind": "train", "tokens": 64, "train_loss": "4.8", "lr": 1}\n'
                   '{"kind": "train", "tokens": 96, "train_loss": NaN}\n'
                   '{"kind": "train", "tokens": 112, "train_loss": true}\n'
                   '{"kind": "train", "train_loss": 4.5}\n'
                   '{"kind": "train", "tokens": "120", "train_loss": 4.4}\n'
                   '{"kind": "train", "tokens": 128, "train_loss": 4.0}\n'
                   '{"kind": "train", "tokens": 160, "train_loss": 1%s}\n' % ('0' * 400), encoding="utf-8")
    label, cfg, rows = plot.read_run(str(log))
    assert cfg == {"kind": "config", "attn": "tssa"} and label.endswith("ToST")
    assert rows[0] == {"kind": "eval", "tokens": 128, "val_loss": 3.0} and len(rows) == 8
    assert plot.points(rows, "train", "tokens", "train_loss").tolist() == [[128], [4.0]]
    assert plot.points(rows, "train", "tokens", "lr").tolist() == [[64], [1]]


def test_a_vision_run_is_test_accuracy_against_epochs(tmp_path, monkeypatch):
    figs = []
    monkeypatch.setattr(plot, "save", lambda fig, path: figs.append(fig))
    rows = [dict(kind="config", attn="tssa", model="tost-cifar-tiny")]
    for epoch in (1, 2, 3):
        rows.append(dict(kind="train", step=10 * epoch, epoch=epoch - 0.5, train_loss=2.0 / epoch))
        # a loss that overflowed (float16) leaves its accuracy on the figure
        rows.append(dict(kind="eval", step=10 * epoch, epoch=epoch, test_loss=math.nan, test_acc=0.2 * epoch))
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot.learning_curves([plot.read_run(str(tmp_path))], "x.png")
    lines = [line for line in figs[-1].axes[0].get_lines() if len(line.get_xdata())]
    assert len(lines) == 1
    assert lines[0].get_xdata().tolist() == [1, 2, 3]
    assert lines[0].get_ydata().tolist() == pytest.approx([0.2, 0.4, 0.6])


@pytest.mark.parametrize("text", ["{not json", '{"tasks": 5}', '{"operator": [1]}', '{"generation": []}'])
def test_a_damaged_results_file_is_one_line_naming_it(tmp_path, monkeypatch, fails, text):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.json").write_text(text)
    fails(plot.main, ["r.json"], "r.json")
    assert os.listdir(tmp_path) == ["r.json"]


def test_the_speed_lines_run_left_to_right_and_memory_only_where_measured(monkeypatch):
    figs = []
    monkeypatch.setattr(plot, "save", lambda fig, path: figs.append(fig))
    nan = float("nan")
    rows = [dict(op="tssa", n=n, fwdbwd_s=n * 1e-6, fwdbwd_peak_mb=float(n)) for n in (4096, 256, 1024)]
    rows += [dict(op="sdpa", n=n, fwdbwd_s=n * 1e-5, fwdbwd_peak_mb=nan) for n in (256, 1024)]
    # one size's peak not measured: the others are drawn
    rows += [dict(op="causal_tssa", n=n, fwdbwd_s=n * 1e-6, fwdbwd_peak_mb=mb)
             for n, mb in ((256, 1.0), (512, nan))]
    plot.speed(dict(operator=rows), "x.png")
    left, right = figs[-1].axes[:2]
    xs = [line.get_xdata().tolist() for line in left.get_lines()]
    assert xs == [[256, 512], [256, 1024, 4096], [256, 1024]]
    assert [line.get_label() for line in right.get_lines()] == ["CausalTSSA", "TSSA"]


def test_a_title_for_a_results_file_alone_is_refused(tmp_path, monkeypatch, fails):
    monkeypatch.chdir(tmp_path)
    cell = dict(task="copy", knob="length", value=8, model="tssa", accuracy=0.5, chance=0.03)
    (tmp_path / "tasks.json").write_text(json.dumps({"tasks": [cell]}))
    fails(plot.main, ["tasks.json", "--title=mine"], "--title")
    assert os.listdir(tmp_path) == ["tasks.json"]


def test_json_nested_deeper_than_python_recurses_is_a_damaged_line_or_file(tmp_path):
    deep = "[" * 100000 + "]" * 100000
    log = tmp_path / "log.jsonl"
    log.write_text(deep + '\n{"kind": "eval", "tokens": 128, "val_loss": 3.0}\n')
    assert plot.read_run(str(log))[2] == [{"kind": "eval", "tokens": 128, "val_loss": 3.0}]
    (tmp_path / "bench.json").write_text(deep)
    with pytest.raises(plot.UsageError, match="bench.json"):
        plot.draw_results(str(tmp_path / "bench.json"), str(tmp_path))
