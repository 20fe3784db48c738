"""
Tests of train_vit.py on a tiny synthetic CIFAR-format dataset (no download): it learns, it resumes
exactly, two gloo processes agree with one, the pictures are drawn, and mistakes end in one line that
names the option or the path.
"""
import ast
import contextlib
import json
import math
import os
import shlex
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import plot
import tost
import train_common
import train_vit
from test_train_gpt import (Died, count_syncs, rank_pid, read_log, resume_command, same_state, start,
                            wait_for, weights)
from options import UsageError
from train_common import load_checkpoint
from test_tost import randomize
from conftest import POSIX_ONLY, counted, in_little_memory, one_line, run_with_slow_steps

CLASSES = 3
# The trained run's settings and the resume test's: a warmup longer than the run, so that the learning rate
# does not depend on the run's length (a run of 1 epoch and its resume must land on the state of a 2-epoch
# run); for the resume to reproduce, drop-path (randomness besides the augmentation) and LPI (BatchNorm's
# running statistics).
RESUMABLE = ('--warmup_epochs=10', '--drop_path=0.1', '--label_smoothing=0.1', '--lpi=true')


def make_dataset(data_dir, name='synth', size=16, n_train=4, n_test=4, classes=CLASSES, channels=3,
                 **edit):
    """CIFAR-format files as prepare_data.py writes them, with meta.json's fields changed by `edit`. Class c
    has a bright colour channel c, on noise: learnable in a few steps, not from a single pixel."""
    rng = np.random.default_rng(0)
    folder = os.path.join(data_dir, name)
    os.makedirs(folder, exist_ok=True)
    for split, n in (('train', n_train), ('test', n_test)):
        y = rng.integers(0, classes, n)
        x = rng.integers(0, 160, (n, channels, size, size))
        x[np.arange(n), y % channels] += 90
        np.save(os.path.join(folder, f'{split}_images.npy'), x.astype(np.uint8))
        np.save(os.path.join(folder, f'{split}_labels.npy'), y)
    meta = dict(kind='images', num_classes=classes, classes=[f'class{i}' for i in range(classes)],
                image_size=size, channels=channels, mean=[0.45] * channels, std=[0.28] * channels)
    meta.update(edit)
    with open(os.path.join(folder, 'meta.json'), 'w') as f:
        json.dump(meta, f)
    return folder


def base_args(data_dir, out_dir, *extra):
    return [f'--data_dir={data_dir}', '--dataset=synth', f'--out_dir={out_dir}', '--model=tost-cifar-tiny',
            '--batch_size=16', '--warmup_epochs=0', '--device=cpu', '--log_interval=2',
            '--compression_images=16', '--viz_images=2', '--dtype=float32', *extra]


def untimed(rows):
    """The rows' numbers, without the times."""
    return [{k: v for k, v in r.items() if k not in ('img_per_s', 'ms_per_step')} for r in rows]


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('data'))
    # 33 test images: three ranks split them 11 + 11 + 11
    make_dataset(root, n_train=64, n_test=33)
    make_dataset(root, 'synth30', size=30)
    make_dataset(root, 'synth5', classes=5)
    # Damaged: of another kind, a zero std, a label past the classes, a meta.json that is not JSON, a split of
    # no images (the test set's was a ZeroDivisionError, the training set's 'nothing to do'). The reader
    # refuses each kind of damage (test_prepare_data.py's IMAGE_EDITS and ARRAYS); train_vit meets one of
    # each.
    make_dataset(root, 'text', kind='text')
    make_dataset(root, 'nostd', std=[0.28, 0, 0.28])
    np.save(os.path.join(make_dataset(root, 'labels9'), 'train_labels.npy'), np.full(4, 9))
    np.save(os.path.join(make_dataset(root, 'labels3'), 'train_labels.npy'), np.arange(4))   # 3: one past
    Path(make_dataset(root, 'c1'), 'meta.json').write_text('{bad')
    make_dataset(root, 'notest', n_test=0)
    make_dataset(root, 'notrain', n_train=0)
    return root


@pytest.fixture(scope='module')
def trained(data, tmp_path_factory):
    """Two epochs of 4 steps (RESUMABLE), a row every 4: the unbroken run the resume test ends as."""
    out = str(tmp_path_factory.mktemp('run'))
    train_vit.main(base_args(data, out, '--epochs=2', *RESUMABLE, '--log_interval=4'))
    return out


def test_a_few_steps_lower_the_loss(data, tmp_path, capsys, monkeypatch):
    out = str(tmp_path)
    # each training step's loss (the evaluation's sums take reduction='sum')
    losses = []
    real = train_vit.F.cross_entropy

    def cross_entropy(*args, **kwargs):
        loss = real(*args, **kwargs)
        if 'label_smoothing' in kwargs:
            losses.append(loss.item())
        return loss
    monkeypatch.setattr(train_vit.F, 'cross_entropy', cross_entropy)
    # no maps: test_the_run_draws_attention_and_memberships looks at them
    train_vit.main(base_args(data, out, '--epochs=3', '--steps_per_epoch=3', '--viz_images=0'))
    steps = read_log(out, kind='train')
    rows = read_log(out, kind='eval')
    assert [(r['epoch'], r['step']) for r in rows] == [(1, 3), (2, 6), (3, 9)]
    assert [r['step'] for r in steps] == [2, 3, 4, 6, 8, 9]         # every 2 steps and at each epoch's end
    assert steps[-1]['train_loss'] < steps[0]['train_loss']
    # a fresh model predicts ~uniformly: test loss ~ ln 3 = 1.10; after 9 steps it must be well below
    assert rows[-1]['test_loss'] < 0.7 * math.log(CLASSES)
    assert rows[-1]['test_acc'] > 0.8
    # the white-box view: R^var_c of every TSSA layer, at every eval
    comp = [r['compression'] for r in rows]
    assert all(len(c) == 4 for c in comp)                      # one value per TSSA layer
    assert all(math.isfinite(v) and v > 0 for c in comp for v in c)
    # and printed as a bar per layer: the longest is the largest value's, the others in proportion
    lines = capsys.readouterr().out.splitlines()
    # each row's numbers are the ones its progress line shows
    for r in steps:
        assert any(f"{r['step']}/" in line and f"{r['train_loss']:.4f}" in line for line in lines), r
    for r in rows:
        shown = [f"{r['epoch']}/", f"{r['test_loss']:.4f}", f"{r['test_acc']:.4f}"]
        assert any(all(n in line for n in shown) for line in lines), r
    bars = [line.count('█') for line in lines if '█' in line]
    assert bars == [round(32 * v / max(c)) for c in comp for v in c]
    # each row is the mean of the steps since the previous one (rows at 3 and 9 hold one step)
    assert len(losses) == 9
    before = [0] + [r['step'] for r in steps]
    for a, r in zip(before, steps):
        assert r['train_loss'] == pytest.approx(sum(losses[a:r['step']]) / (r['step'] - a), abs=1e-6)
    # the epoch capped at 3 of its 4 steps is said, with the option; the data it read is named; its last line
    # is a command that evaluates the best checkpoint
    assert any('3 steps' in line and '4' in line and '--steps_per_epoch' in line for line in lines)
    assert any(line.startswith(f"data: {os.path.join(data, 'synth')}, 64 train + 33 test images of 3 classes")
               for line in lines)
    evaluate = shlex.split(lines[-1].split(': ', 1)[1])
    assert evaluate[:2] == ['python', 'train_vit.py']
    assert train_vit.main([*evaluate[2:], '--viz_images=0']) == max(r['test_acc'] for r in rows)


def interrupt_in_step(monkeypatch, n):
    """SIGINT to this process as step n draws its augmentation."""
    real = train_vit.random_crop_flip
    calls = []

    def crop(x, pad=4):
        calls.append(1)
        if len(calls) == n:
            signal.raise_signal(signal.SIGINT)
        return real(x, pad)

    monkeypatch.setattr(train_vit, 'random_crop_flip', crop)


@pytest.mark.parametrize('stop_at', [None, 7])
def test_a_resume_ends_bit_for_bit_where_the_unbroken_run_does(data, trained, tmp_path, monkeypatch, ends,
                                                               stop_at):
    """A run of 1 epoch, resumed for a second; or SIGINT to this process during step 7 (the third of epoch 2):
    ckpt.pt at step 7, three steps after a row (one every 4 steps), exit 130 with the command that resumes,
    which (nothing else: the settings come from the checkpoint) goes on. Either ends where the unbroken run
    did: the same state bit for bit, each row once with the same losses and evaluations; the row that spans
    the stop is timed over the steps after it. These runs draw no maps (the unbroken run draws them, for
    test_the_run_draws_attention_and_memberships): drawing is most of a tiny run's time, and no part of its
    state."""
    out = str(tmp_path / 'out')
    resumable = (*RESUMABLE, '--log_interval=4', '--viz_images=0')
    if stop_at:
        interrupt_in_step(monkeypatch, stop_at)
        code, err = ends(train_vit.main, base_args(data, out, '--epochs=2', *resumable))
        command = resume_command(err)
        assert code == 130 and command[:2] == ['python', 'train_vit.py']
        assert (weights(out)['step'], weights(out)['epoch']) == (7, 1.75)
        assert [r['epoch'] for r in read_log(out, kind='eval')] == [1]
        monkeypatch.undo()
        # the step after the stop takes 0.1 s at least, and the row that spans the stop times it alone
        run_with_slow_steps(train_vit, command[2:], monkeypatch)
        assert read_log(out, kind='train')[-1]['ms_per_step'] >= 100
    else:
        train_vit.main(base_args(data, out, '--epochs=1', *resumable))
        assert weights(out)['step'] == 4
        train_vit.main(base_args(data, out, '--epochs=2', '--init_from=resume', *resumable))
    a = weights(trained)
    b = weights(out)
    assert (b['step'], b['epoch'], b['kind']) == (8, 2, 'vit')
    same_state(a, b)
    # every loss of the unbroken run: the row at 8 is the mean of steps 5 to 8, either side of the stop
    assert untimed(read_log(out)) == untimed(read_log(trained))
    assert os.path.isfile(os.path.join(out, 'best.pt'))


@pytest.mark.parametrize('during', ['evaluate', 'look_inside'])
def test_a_stop_during_the_evaluation_saves_there_and_takes_no_other_step(data, tmp_path, monkeypatch, ends,
                                                                           during):
    """SIGINT while the end of epoch 1 (step 2) is evaluated or looked inside: ckpt.pt at step 2, no third
    step. (No maps: the signal comes as look_inside is entered, and its handler runs before anything is
    drawn.)"""
    real = getattr(train_vit, during)
    monkeypatch.setattr(train_vit, during, lambda *a: signal.raise_signal(signal.SIGINT) or real(*a))
    steps = counted(monkeypatch, train_vit, 'optimizer_step')
    args = base_args(data, str(tmp_path), '--epochs=2', '--steps_per_epoch=2', '--viz_images=0')
    code, _ = ends(train_vit.main, args)
    assert (code, len(steps), weights(str(tmp_path))['step']) == (130, 2, 2)


def test_a_new_run_refuses_an_out_dir_with_checkpoints(data, trained, tmp_path, capsys):
    before = Path(trained, 'best.pt').read_bytes()
    # from scratch: refused before the run says anything (a header would read as a run that started; a warmup
    # as long as the run is not noted either); from the best.pt there, also with --overwrite=true (which would
    # delete the weights it starts from): refused, naming the option that says where else
    for extra, names in (([], ['ckpt.pt']), (['--init_from=best'], ['best.pt', '--out_dir']),
                         (['--init_from=best', '--overwrite=true'], ['best.pt', '--out_dir'])):
        capsys.readouterr()
        with pytest.raises(UsageError) as e:
            train_vit.main(base_args(data, trained, '--epochs=1', '--warmup_epochs=1', *extra))
        assert all(name in str(e.value) for name in names)
        assert capsys.readouterr().out == ''
    assert Path(trained, 'best.pt').read_bytes() == before
    # best.pt alone: refused too, and not with advice to resume it (there is no ckpt.pt to go on from)
    alone = tmp_path / 'alone'
    alone.mkdir()
    shutil.copy(Path(trained, 'best.pt'), alone)
    with pytest.raises(UsageError, match=re.escape(f'{alone}/best.pt')) as e:
        train_vit.main(base_args(data, str(alone), '--epochs=1'))
    assert 'resume' not in str(e.value)
    # --overwrite=true: the old checkpoints go first, and the log starts anew (no maps: drawing over the old
    # ones is the trained run's second evaluation)
    out = tmp_path / 'out'
    shutil.copytree(trained, out)
    train_vit.main(base_args(data, str(out), '--epochs=1', '--steps_per_epoch=1', '--overwrite=true',
                             '--viz_images=0'))
    assert weights(out)['epoch'] == 1
    assert [r['epoch'] for r in read_log(out, kind='eval')] == [1]


def test_a_language_model_s_run_is_neither_resumed_nor_deleted(data, tmp_path, fails):
    """--out_dir=out, train_gpt's demo: a new run, even with --overwrite=true, is one line naming train_gpt.py
    and its checkpoint, which stays; a checkpoint torch cannot read is still this run's to replace."""
    ckpt = tmp_path / 'ckpt.pt'
    torch.save(dict(model={}, model_args=dict(vocab_size=256)), ckpt)
    before = ckpt.read_bytes()
    for extra in ([], ['--overwrite=true']):
        fails(train_vit.main, base_args(data, str(tmp_path), '--epochs=1', *extra), 'train_gpt.py', str(ckpt))
    assert ckpt.read_bytes() == before
    ckpt.write_bytes(b'PK junk')
    train_vit.main(base_args(data, str(tmp_path), '--epochs=1', '--steps_per_epoch=1', '--overwrite=true',
                             '--viz_images=0'))
    assert weights(tmp_path)['epoch'] == 1


def test_the_test_accuracy_and_loss_are_the_standardized_test_sets(data, trained):
    """best.pt scored by hand: every test image standardized with meta.json's mean and std, the accuracy and
    the mean cross-entropy (no label smoothing) over all of them, as its evaluation row has them."""
    ckpt = load_checkpoint(f'{trained}/best.pt')
    model = tost.ViT(tost.ViTConfig(**ckpt['model_args']))
    model.load_state_dict(ckpt['model'])
    folder = Path(data, 'synth')
    meta = json.loads((folder / 'meta.json').read_text())
    mean, std = (torch.tensor(meta[k])[:, None, None] for k in ('mean', 'std'))
    x = (torch.tensor(np.load(folder / 'test_images.npy')).float() / 255 - mean) / std
    y = torch.tensor(np.load(folder / 'test_labels.npy'))
    with torch.no_grad():
        logits = model.eval()(x)
    row, = [r for r in read_log(trained, kind='eval') if r['step'] == ckpt['step']]
    assert row['test_acc'] == (logits.argmax(-1) == y).double().mean().item()
    assert row['test_loss'] == pytest.approx(torch.nn.functional.cross_entropy(logits, y).item(), rel=1e-5)
    # R^var_c of each layer, the mean over the first --compression_images=16 test images (eval mode)
    compression, _, _ = train_vit.inspect(model, x[:16], -1)
    assert row['compression'] == pytest.approx([c.mean().item() for c in compression], rel=1e-5)
    # and the run drew loss.png
    assert os.path.isfile(os.path.join(trained, 'loss.png'))


def test_checkpoint_format(trained):
    ck = weights(trained)
    assert {'model', 'optimizer', 'model_args', 'kind', 'step', 'epoch', 'best_acc', 'config'} <= set(ck)
    # --lpi=true (RESUMABLE): a key of the model, whose blocks have its weights
    assert ck['format'] == 2 and ck['model_args']['lpi'] is True and any('.lpi.' in k for k in ck['model'])
    assert ck['model_args']['num_classes'] == CLASSES and ck['meta']['num_classes'] == CLASSES
    model = tost.ViT(tost.ViTConfig(**ck['model_args']))
    model.load_state_dict(ck['model'])                            # no compile/DDP prefixes
    best = load_checkpoint(os.path.join(trained, 'best.pt'))
    assert best['best_acc'] == max(r['test_acc'] for r in read_log(trained, kind='eval'))


def test_eval_only_gives_the_accuracy_of_the_checkpoint_on_its_own_data(data, trained, capsys, tmp_path,
                                                                          monkeypatch):
    """Neither an evaluation nor a resume past the run's epochs (which says which option trains on) writes a
    row or a checkpoint."""
    before = [Path(trained, f).read_bytes() for f in ('log.jsonl', 'ckpt.pt')]
    capsys.readouterr()
    # no maps here: those of --eval_only are drawn below, and the ones in `trained` stay the run's own, which
    # test_the_run_draws_attention_and_memberships looks at
    acc = train_vit.main(base_args(data, trained, '--init_from=resume', '--eval_only', '--viz_images=0'))
    assert acc == read_log(trained)[-1]['test_acc']                 # the same weights, the same test set
    # the line shows that accuracy, its count of the 33 test images, the checkpoint's epoch
    line = capsys.readouterr().out.splitlines()[0]
    assert f"{acc:.4f} ({round(acc * 33)}/33)" in line and 'epoch 2)' in line
    # no --dataset, --data_dir or --dtype: the checkpoint's (measured as the run measured it: float32 here,
    # where auto could be bfloat16)
    resolve = train_vit.resolve_dtype
    asked = []
    monkeypatch.setattr(train_vit, 'resolve_dtype',
                        lambda dtype, *a: asked.append(dtype) or resolve(dtype, *a))
    best = train_vit.main([f'--out_dir={trained}', '--init_from=best', '--eval_only', '--device=cpu',
                           '--viz_images=0'])
    assert best == load_checkpoint(os.path.join(trained, 'best.pt'))['best_acc'] and asked == ['float32']
    capsys.readouterr()
    train_vit.main(['--init_from=resume', f'--out_dir={trained}', '--device=cpu'])
    assert '--epochs' in capsys.readouterr().out
    assert [Path(trained, f).read_bytes() for f in ('log.jsonl', 'ckpt.pt')] == before
    # --eval_only draws the maps it is asked for, in its own out_dir
    ev = tmp_path / 'ev'
    train_vit.main([f'--out_dir={ev}', f'--init_from={trained}/best.pt', '--eval_only', '--device=cpu',
                    '--viz_images=1', '--compression_images=0'])
    assert os.listdir(ev / 'viz') == ['test0000.png']
    # with no --out_dir, next to its checkpoint (not in the default out-vit, which may be another run's)
    away = tmp_path / 'away'
    away.mkdir()
    shutil.copy(Path(trained, 'best.pt'), away)
    monkeypatch.chdir(tmp_path)
    train_vit.main([f'--init_from={away}/best.pt', '--eval_only', '--device=cpu', '--viz_images=1',
                    f'--data_dir={data}', '--compression_images=0'])
    assert os.listdir(away / 'viz') == ['test0000.png'] and not os.path.exists('out-vit')
    # from the checkpoint's own folder
    shutil.rmtree(away / 'viz')
    monkeypatch.chdir(away)
    train_vit.main(['--init_from=best.pt', '--eval_only', '--device=cpu', '--viz_images=1',
                    f'--data_dir={data}', '--compression_images=0'])
    assert os.listdir(away / 'viz') == ['test0000.png']
    # a checkpoint whose config lacks a key it would take (an older one's): the default
    ckpt = load_checkpoint(os.path.join(trained, 'best.pt'))
    del ckpt['config']['viz_images']
    torch.save(ckpt, tmp_path / 'older.pt')
    train_vit.main([f'--out_dir={tmp_path / "ev2"}', f'--init_from={tmp_path}/older.pt', '--eval_only',
                    '--device=cpu', '--compression_images=0'])


@pytest.mark.slow
@POSIX_ONLY
def test_three_gloo_processes_cover_the_test_set_and_agree_with_one(data, tmp_path, capsys):
    """torchrun with 3 processes, the defaults but for the tiny sizes: batch_size is per process, so nothing
    has to divide; 64 images / 3 ranks = 22 each (two repeated), 2 steps of 16."""
    out = str(tmp_path)
    p = start('train_vit.py', base_args(data, out, '--epochs=1'), out, torchrun=3)
    stdout, stderr = p.communicate(timeout=240)
    assert p.returncode == 0, stdout[-2000:] + stderr[-3000:]
    assert weights(out)['step'] == 2                                 # 22 images a rank, batches of 16
    assert stdout.count('test loss') == 1                           # rank 0 alone talks
    row = read_log(out)[-1]
    # one process on the saved weights gets the same accuracy and loss: 11 + 11 + 11 test images, each once,
    # with rank 0's batch-norm statistics
    capsys.readouterr()
    assert train_vit.main(base_args(data, out, '--init_from=resume', '--eval_only')) == row['test_acc']
    assert f"test loss {row['test_loss']:.4f}" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir('/proc'), reason='finds the worker through /proc')
def test_sigterm_to_one_of_two_processes_stops_both_at_the_same_step(data, tmp_path):
    """A scheduler's SIGTERM to rank 1 alone: both ranks stop at the same step, the checkpoint's."""
    out = str(tmp_path)
    args = base_args(data, out, '--epochs=1000', '--viz_images=0', '--compression_images=0',
                     '--eval_interval=1000')
    p = start('train_vit.py', args, out, torchrun=2)
    wait_for(p, lambda: os.path.exists(os.path.join(out, 'ckpt.pt')), 'epoch 1', timeout=240)
    os.kill(rank_pid(p.pid, 1), signal.SIGTERM)
    _, stderr = p.communicate(timeout=240)
    ck = weights(out)
    # the step rank 0 saved is the one it names; the command resumes both processes
    assert f"step {ck['step']} " in stderr, stderr[-3000:]
    assert resume_command(stderr)[:3] == ['torchrun', '--standalone', '--nproc_per_node=2']


@pytest.mark.slow
def test_compiled_run_has_static_graphs_made_in_the_first_epoch_saves_plain_weights_and_resumes(
        data, tmp_path, monkeypatch):
    """--compile=true (inductor on CPU). 64 images in batches of 24 (the last has 16) and 33 test images
    (24 + 9): a graph per batch size, for training and for evaluation, each compiled in the first epoch and
    reused in the second, none of them a graph for every size (which the compiler would make at the first
    smaller batch, and then use for the full batches too). The checkpoint holds plain weights, and a
    compiled resume for a third epoch lands close to the same three epochs uncompiled. One model, of one TSSA
    block, is compiled once."""
    from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics
    monkeypatch.setitem(tost.PRESETS['tost-cifar-tiny'], 'n_layer', 1)     # a smaller graph compiles sooner
    torch._dynamo.reset()
    clear_compilation_metrics()
    # the graphs dynamo made from the model's frames (on a cold cache the compiler also logs entries of its
    # own, with no frame and no shapes)
    def frames():
        return [m for m in get_compilation_metrics() if m.co_name is not None]
    made = []
    real = train_vit.evaluate
    monkeypatch.setattr(train_vit, 'evaluate', lambda *a: made.append(len(frames())) or real(*a))
    runs = {}
    for name, extra in (('compiled', ['--compile=true']), ('eager', [])):
        out = str(tmp_path / name)
        train_vit.main(base_args(data, out, '--epochs=2', '--batch_size=24', '--viz_images=0',
                                 '--compression_images=0', *extra))
        if name == 'compiled':
            graphs = [ast.literal_eval(m.graph_node_shapes) for m in frames()]
            # epoch 1: training's two, then evaluation's two; then none
            assert made == [2, 4] and len(graphs) == 4
            # no symbolic size
            assert all(isinstance(n, int) for g in graphs for shape in g.values() for n in shape)
            assert sorted(g['l_x_'][0] for g in graphs) == [9, 16, 24, 24]
            torch._dynamo.reset()                       # the resume starts afresh, as in a new process
        assert not any('_orig_mod' in k for k in weights(out)['model'])
        train_vit.main(['--init_from=resume', f'--out_dir={out}', '--epochs=3', '--dtype=float32', *extra])
        runs[name] = read_log(out)
    assert [r['epoch'] for r in runs['compiled'] if r['kind'] == 'eval'] == [1, 2, 3]
    for a, b in zip(runs['compiled'], runs['eager'], strict=True):
        loss = 'train_loss' if a['kind'] == 'train' else 'test_loss'
        assert (a['kind'], a['step']) == (b['kind'], b['step']) and abs(a[loss] - b[loss]) < 1e-3


@pytest.mark.parametrize('dtype, computed', [('bfloat16', 'bfloat16'), ('float16', 'float16'),
                                             ('auto', 'float32')])
def test_mixed_precision_runs_on_cpu(data, tmp_path, monkeypatch, dtype, computed):
    """bf16 autocast, and fp16 with the GradScaler (saved in the checkpoint), as on a GPU; auto, on a CPU
    without bfloat16, float32. The log says what was computed in; the checkpoint keeps what was asked for."""
    monkeypatch.setattr(torch.cpu, '_is_avx512_bf16_supported', lambda: False)
    forward = tost.ViT.forward
    trained_in = set()

    def recorded(self, x):
        logits = forward(self, x)
        if torch.is_grad_enabled():
            trained_in.add(str(logits.dtype))
        return logits
    monkeypatch.setattr(tost.ViT, 'forward', recorded)
    out = str(tmp_path)
    args = base_args(data, out, '--epochs=2', '--steps_per_epoch=2', '--viz_images=0', f'--dtype={dtype}')
    train_vit.main(args)
    assert trained_in == {f'torch.{computed}'}
    ck = weights(out)
    assert ('scale' in ck['scaler']) == (dtype == 'float16') and ck['config']['dtype'] == dtype
    with open(tmp_path / 'log.jsonl') as f:
        assert json.loads(f.readline())['dtype'] == computed
    # (a training loss that is not finite ends the run: test_a_nan_loss_stops...)
    assert all(math.isfinite(r['test_loss']) for r in read_log(out, kind='eval'))


def test_the_training_step_does_not_wait_for_the_device(data, tmp_path, monkeypatch):
    """The loss is read only for a progress line: 4 more steps with one more line, one more read."""
    calls = count_syncs(monkeypatch, {'train_vit.py', 'tost.py', 'train_common.py'})
    counts = []
    for steps in (4, 8):
        calls.clear()
        train_vit.main(base_args(data, str(tmp_path / str(steps)), '--epochs=1', f'--steps_per_epoch={steps}',
                                 '--batch_size=8', '--log_interval=4', '--viz_images=0',
                                 '--compression_images=0'))
        counts.append(len(calls))
    assert counts[1] - counts[0] == 1, counts


def test_shards_cover_the_epoch():
    """(The test set's shards, each image once: test_three_gloo_processes_cover_the_test_set...)"""
    for n, world in ((64, 2), (33, 2), (10, 4), (3, 4)):
        shards = [train_vit.train_shard(n, 7, 3, r, world) for r in range(world)]
        assert len({len(s) for s in shards}) == 1                  # equal steps on every rank
        assert set(torch.cat(shards).tolist()) == set(range(n))
        assert len(torch.cat(shards)) - n < world                  # padding only to even out the ranks
    # the same order for the same seed and epoch, another in another epoch
    shard = train_vit.train_shard(64, 7, 1, 0, 2)
    assert torch.equal(shard, train_vit.train_shard(64, 7, 1, 0, 2))
    assert not torch.equal(shard, train_vit.train_shard(64, 7, 0, 0, 2))


def test_random_crop_flip_cuts_padded_windows():
    torch.manual_seed(0)
    x = torch.randint(1, 256, (400, 1, 6, 6), dtype=torch.uint8)   # no zeros: zeros can only be padding
    out = train_vit.random_crop_flip(x, pad=2)
    assert out.shape == x.shape and out.dtype == torch.uint8
    xp = torch.nn.functional.pad(x, (2, 2, 2, 2))
    seen = []
    for i in range(len(x)):
        # the image's window, mirrored or not
        found = [(oy, ox, flip) for oy in range(5) for ox in range(5) for flip in (0, 1)
                 if torch.equal(out[i].flip(-1) if flip else out[i], xp[i, :, oy:oy + 6, ox:ox + 6])]
        assert len(found) == 1, i
        seen += found
    # every offset of the padding, and images mirrored at even odds
    assert len({(oy, ox) for oy, ox, _ in seen}) == 25
    assert 0.4 < sum(flip for *_, flip in seen) / len(seen) < 0.6


def read_png(path):
    """The picture as an (H, W, 4) float array, read back by matplotlib."""
    import matplotlib.image
    return matplotlib.image.imread(path)


def panels(img):
    """The number of non-white areas side by side at least 40 pixels wide: how many maps were drawn (not
    a colour bar or its labels)."""
    ink = (img[..., :3] < 0.9).any(-1)
    cols = np.flatnonzero(ink.any(0))
    return sum(len(run) >= 40 for run in np.split(cols, np.flatnonzero(np.diff(cols) > 1) + 1))


def test_the_run_draws_attention_and_memberships(trained):
    for i in range(2):
        img = read_png(os.path.join(trained, 'viz', f'test{i:04d}.png'))
        # 2 rows (CLS attention, Pi) of 1 + 4 panels (the image or the owner map, then one map per head) and
        # the row's colour bar
        assert img.shape[:2] == (350, 810), img.shape
        assert panels(img[:175]) == panels(img[175:]) == 5
        # each row's bar: colour right of the last map
        right = img[:, -60:, :3]
        assert all((right[rows].std(-1) > 0.1).any() for rows in (slice(0, 175), slice(175, 350)))
        assert len(np.unique(img[..., :3].reshape(-1, 3), axis=0)) > 50          # maps, not flat tiles
    assert not os.path.exists(os.path.join(trained, 'viz', 'test0002.png'))


@pytest.mark.parametrize('channels', [2, 4])
def test_an_image_of_other_than_3_channels_is_drawn_grey(tmp_path, channels):
    """A model trained on such a set draws its image panel grey (matplotlib refuses 2 channels and would take
    4 for RGBA colour), from its values: not one flat grey."""
    make_dataset(str(tmp_path), n_test=1, channels=channels)
    train_vit.main(base_args(str(tmp_path), str(tmp_path / 'out'), '--epochs=1', '--compression_images=0'))
    # the top left panel: the title, the frame and the image
    panel = read_png(tmp_path / 'out' / 'viz' / 'test0000.png')[:175, :150, :3]
    assert (panel == panel[..., :1]).all() and len(np.unique(panel)) > 20


def test_softmax_baseline_everything_else_equal(data, tmp_path):
    out = str(tmp_path)
    train_vit.main(base_args(data, out, '--attn=softmax', '--epochs=1', '--steps_per_epoch=2'))
    ck = weights(out)
    assert ck['model_args']['attn'] == 'softmax'
    state = ck['model']
    tssa = tost.ViT(tost.ViTConfig(**dict(ck['model_args'], attn='tssa'))).state_dict()
    # the attention of each of the 4 blocks differs, and nothing else
    assert {k.split('.attn.')[0] for k in set(state) ^ set(tssa)} == {f'blocks.{i}' for i in range(4)}
    shapes = [{k: v.shape for k, v in model.items() if '.attn.' not in k} for model in (state, tssa)]
    assert shapes[0] == shapes[1]
    assert 'compression' not in read_log(out, kind='eval')[-1]
    img = read_png(os.path.join(out, 'viz', 'test0000.png'))
    assert img.shape[:2] == (190, 810) and panels(img) == 5        # no Pi row: only the CLS attention


def test_paper_shapes_get_cifar_patches_and_the_dataset_classes():
    meta = {'num_classes': 100, 'image_size': 32, 'channels': 3}
    for name in ('tost-t', 'tost-s', 'tost-m'):
        config = dict(train_vit.DEFAULTS, model=name, dataset='cifar100')
        # the preset, its drop_path too (--drop_path is not set), at 32px in 4px patches, of 100 classes
        want = tost.preset(name, img_size=32, patch_size=4, num_classes=100)
        assert train_vit.vit_config(config, {'model'}, meta) == want
    # the counts docs/models.md gives, in millions, on CIFAR-10 and CIFAR-100; tost-cifar's softmax baseline
    docs = {('tost-t', 10): 5.53, ('tost-t', 100): 5.55, ('tost-s', 10): 22.01, ('tost-s', 100): 22.04,
            ('tost-m', 10): 70.61, ('tost-m', 100): 70.66, ('tost-cifar', 10): 3.75}
    for name, classes in docs:
        attn = 'softmax' if name == 'tost-cifar' else 'tssa'
        config = dict(train_vit.DEFAULTS, model=name, attn=attn)
        with torch.device('meta'):
            model = tost.ViT(train_vit.vit_config(config, set(), dict(meta, num_classes=classes)))
        assert round(model.get_num_params() / 1e6, 2) == docs[name, classes]
    config = dict(train_vit.DEFAULTS, model='tost-s', drop_path=0.2)
    c = train_vit.vit_config(config, {'drop_path'}, meta)
    assert c.drop_path == 0.2


# -----------------------------------------------------------------------------
# mistakes: one line on stderr, exit 2, no traceback

# Mistakes of the data (the dataset, what the one line names): CIFAR-10 not prepared (no download is
# suggested), 30px images that no patch size divides, the damaged sets of `data`.
BAD_DATA = {'cifar10': 'prepare_data.py cifar10', 'synth30': 'synth30', 'text': 'text',
            'c1': 'cifar10 --name=c1', 'nostd': ('nostd/meta.json', 'std'),
            'labels9': 'labels9/train_labels.npy', 'labels3': 'labels3/train_labels.npy',
            'notest': 'notest/test_images.npy',
            'notrain': 'notrain/train_images.npy'}
# Options refused before the data is read (CIFAR-10, not prepared here): the line names the option.
BAD_OPTIONS = ['--batchsize=3', '--epochs=two', '--eval_only', '--model=nosuch', '--model=tost-demo',
               '--attn=no-such-attn', '--batch_size=0', '--drop_path=1', '--beta1=-0.1',
               '--learning_rate=inf', '--weight_decay=1e30', '--init_from=', '--dtype=bf16']
# (the trained checkpoint put in out_dir with these keys changed, None: taken out (the first, a train_gpt.py
# one); the arguments; what the line names)
MISTAKES = [({'kind': None, 'model_args': {'vocab_size': 256}}, ['--init_from=resume'], 'train_gpt.py'),
            ({}, ['--init_from=resume', '--dataset=synth5'], 'synth5'),
            ({}, ['--init_from=resume', '--attn=softmax'], '--attn'),
            ({}, ['--init_from=resume', '--overwrite=true'], ('--init_from=resume', '--overwrite')),
            ({'epoch': None}, ['--init_from=resume', '--eval_only'], 'ckpt.pt'),
            ({'best_acc': None}, ['--init_from=resume'], 'ckpt.pt'),
            # earlier checkpoints ran CaiT's class blocks, which would compute otherwise with these weights
            ({'format': None}, ['--init_from=resume'], 'ckpt.pt'),
            ({'format': 1}, ['--init_from=resume', '--eval_only'], 'ckpt.pt'),
            (None, ['--viz_layer=9'], '--viz_layer'),
            (None, ['--viz_layer=4'], '--viz_layer'),
            (None, ['--viz_layer=-5'], '--viz_layer'),
            # stopped before the first evaluation: no best.pt yet, and the ckpt.pt there is named
            ({}, ['--init_from=best', '--eval_only'], ('best.pt', 'ckpt.pt')),
            ({}, ['--init_from=best'], ('best.pt', 'ckpt.pt')),
            # a name mistyped: what --init_from takes is said, and the name meant; nanoGPT's GPT-2 weights
            (None, ['--init_from=resum'], ('--init_from=resum', 'scratch', 'best', 'resume?')),
            (None, ['--init_from=gpt2'], ('--init_from=gpt2', 'GPT-2'))]
MISTAKES += [(None, [f'--dataset={name}'], named) for name, named in BAD_DATA.items()]
MISTAKES += [(None, [arg, '--dataset=cifar10'], arg.split('=')[0]) for arg in BAD_OPTIONS]


@pytest.mark.parametrize('checkpoint, extra, named', MISTAKES)
def test_mistakes_end_in_one_line_before_anything_is_written(data, trained, tmp_path, fails, checkpoint,
                                                             extra, named):
    out = tmp_path / 'out'
    out.mkdir()
    if checkpoint is not None:
        ckpt = {**torch.load(os.path.join(trained, 'ckpt.pt'), weights_only=True), **checkpoint}
        torch.save({k: v for k, v in ckpt.items() if v is not None}, out / 'ckpt.pt')
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    names = named if isinstance(named, tuple) else (named,)
    fails(train_vit.main, base_args(data, str(out), '--epochs=1', *extra), *names)
    # the checkpoint untouched, nothing else written but a resume's lock
    assert {f: (out / f).read_bytes() for f in os.listdir(out) if f != '.lock'} == before


def test_a_data_dir_that_is_a_dataset_names_the_data_dir_meant(data, tmp_path, fails):
    args = base_args(os.path.join(data, 'synth'), str(tmp_path), '--epochs=1')
    fails(train_vit.main, args, f'--data_dir={data} ')


def test_init_from_a_folder_names_the_checkpoint_in_it(tmp_path, fails):
    """A run's folder for --init_from: the line names the checkpoint in it (best.pt where there is no
    ckpt.pt), or none in an empty folder, before anything is written."""
    args = base_args(str(tmp_path), str(tmp_path / 'out'), f'--init_from={tmp_path}')
    assert 'ckpt.pt' not in fails(train_vit.main, args, f'--init_from={tmp_path}')
    for name in ('best.pt', 'ckpt.pt'):
        (tmp_path / name).write_bytes(b'')
        fails(train_vit.main, args, f'--init_from={tmp_path / name}')
    assert sorted(os.listdir(tmp_path)) == ['best.pt', 'ckpt.pt']


@pytest.mark.parametrize('edit, named', [(dict(future=1), 'future'), (dict(num_classes=None), 'num_classes')])
def test_model_args_that_are_no_models_are_one_line(data, trained, tmp_path, fails, edit, named):
    """A field ViTConfig lacks, a field of the shape missing."""
    ckpt = torch.load(os.path.join(trained, 'ckpt.pt'), weights_only=True)
    args = {k: v for k, v in {**ckpt['model_args'], **edit}.items() if v is not None}
    torch.save(dict(ckpt, model_args=args), tmp_path / 'ckpt.pt')
    fails(train_vit.main, base_args(data, str(tmp_path), '--init_from=resume', '--epochs=1'), named)


@pytest.mark.parametrize('first, saved, bad', [(7, 4, math.nan), (1, None, math.nan), (8, 4, math.inf)])
def test_a_nan_loss_stops_and_names_the_last_good_checkpoint(data, tmp_path, monkeypatch, fails, first,
                                                              saved, bad):
    """NaN from step 7 on: the row at step 8 stops the run, exit 3, and ckpt.pt stays at step 4 (epoch 1),
    which the line names; from step 1, before any save, the line names none and none is there. An infinite
    loss (float16's overflow) at step 8 the same."""
    out = str(tmp_path)
    real = train_vit.F.cross_entropy
    calls = []

    def bad_from(*args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return real(*args, **kwargs) * (bad if torch.is_grad_enabled() and sum(calls) >= first else 1)

    monkeypatch.setattr(train_vit.F, 'cross_entropy', bad_from)
    path = os.path.join(out, 'ckpt.pt')
    line = fails(train_vit.main, base_args(data, out, '--epochs=2', '--viz_images=0'), code=3)
    assert (path in line) == bool(saved) and os.path.exists(path) == bool(saved)
    if saved:
        assert torch.load(path, weights_only=True)['step'] == saved


def test_a_test_loss_that_is_not_finite_stops_before_saving(data, tmp_path, monkeypatch, fails):
    monkeypatch.setattr(train_vit, 'evaluate', lambda *args: (0.5, math.nan))
    fails(train_vit.main, base_args(data, str(tmp_path), '--epochs=2', '--viz_images=0'), code=3)
    assert not os.path.exists(tmp_path / 'ckpt.pt') and not os.path.exists(tmp_path / 'best.pt')


def test_out_of_memory_is_one_line_with_advice(data, tmp_path, monkeypatch, fails):
    def oom(self, x):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(tost.ViT, 'forward', oom)
    fails(train_vit.main, base_args(data, str(tmp_path), '--epochs=1'), '--batch_size=8')


def test_an_evaluation_that_draws_nothing_and_gets_nothing_right_still_saves(data, tmp_path, monkeypatch,
                                                                              capsys):
    """A picture that cannot be drawn does not stop training (it is said), and best.pt is written even when
    the accuracy is 0."""
    import plot

    def broken(*args):
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(plot, 'vision_maps', broken)
    monkeypatch.setattr(train_vit, 'evaluate', lambda *a: (0.0, 2.0))
    assert train_vit.main(base_args(data, str(tmp_path), '--epochs=1', '--steps_per_epoch=1')) == 0
    assert 'No space left on device' in capsys.readouterr().out
    assert weights(tmp_path)['step'] == 1
    assert load_checkpoint(os.path.join(tmp_path, 'best.pt'))['best_acc'] == 0.0


def test_a_resume_whose_best_pt_is_a_folder_is_refused_before_any_step(trained, tmp_path, fails):
    """Found when the resume starts, not at its first better evaluation, an epoch of work later."""
    out = tmp_path / 'run'
    shutil.copytree(trained, out)
    os.remove(out / 'best.pt')
    os.mkdir(out / 'best.pt')
    before = (out / 'ckpt.pt').read_bytes()
    fails(train_vit.main, ['--init_from=resume', f'--out_dir={out}', '--epochs=3'], f'{out}/best.pt')
    assert (out / 'ckpt.pt').read_bytes() == before


def test_a_run_killed_while_it_saves_an_improved_model_keeps_best_pt_in_step(data, tmp_path, monkeypatch):
    """Each evaluation better than the last (two files to write each time), killed after epoch 2's first
    write: the resume ends with best.pt the model its checkpoint calls the best."""
    accuracies = iter([0.25, 0.5, 0.75])
    monkeypatch.setattr(train_vit, 'evaluate', lambda *a: (next(accuracies), 2.0))
    real = train_common.write_whole
    writes = []

    def dying(path, *a):
        real(path, *a)
        writes.extend([path] if path.endswith('.pt') else [])
        if len(writes) == 3:
            raise Died
    monkeypatch.setattr(train_common, 'write_whole', dying)
    with pytest.raises(Died):
        # one step an epoch, nothing drawn: what is written at each evaluation is all this test reads
        train_vit.main(base_args(data, str(tmp_path), '--epochs=2', '--steps_per_epoch=1', '--viz_images=0',
                                 '--compression_images=0'))
    monkeypatch.setattr(train_common, 'write_whole', real)
    train_vit.main(['--init_from=resume', f'--out_dir={tmp_path}'])
    best = load_checkpoint(os.path.join(tmp_path, 'best.pt'))
    assert (best['step'], best['best_acc']) == (weights(tmp_path)['step'], weights(tmp_path)['best_acc'])


def test_maps_that_cannot_be_drawn_end_eval_only_whose_job_they_are(data, trained, tmp_path, fails,
                                                                    monkeypatch):
    """Before the test set is evaluated: a folder for them that cannot be made is said first."""
    def evaluate(*args):
        raise AssertionError('evaluated before the folder for the maps was made')

    monkeypatch.setattr(train_vit, 'evaluate', evaluate)
    shutil.copy(os.path.join(trained, 'best.pt'), tmp_path)
    # a file where the maps' folder goes, and where out_dir is
    (tmp_path / 'viz').write_text('')
    args = [f'--init_from={tmp_path}/best.pt', '--eval_only', '--device=cpu']
    fails(train_vit.main, [f'--out_dir={tmp_path}', *args], f'{tmp_path}/viz')
    fails(train_vit.main, [f'--out_dir={tmp_path}/viz', *args], f'{tmp_path}/viz', '--out_dir')
    # and not before the data is read: a mistake there leaves no folder behind
    fails(train_vit.main, [f'--out_dir={tmp_path}/fresh', *args, f'--data_dir={tmp_path}/nowhere'], 'nowhere')
    assert not os.path.exists(tmp_path / 'fresh')


def test_eval_only_fails_when_its_maps_cannot_be_written_and_makes_no_folder_for_none(data, trained,
                                                                                       tmp_path, fails,
                                                                                       monkeypatch):
    """The maps are --eval_only's job: a full disk while they are drawn is its one line and exit 2, not a
    note (training's). With --viz_images=0 there are none, and no folder for them."""
    def full(*args):
        raise OSError(28, 'No space left on device')
    args = [f'--init_from={trained}/best.pt', '--eval_only', '--device=cpu']
    with monkeypatch.context() as m:
        m.setattr(plot, 'vision_maps', full)
        fails(train_vit.main, [f'--out_dir={tmp_path}/full', *args, '--viz_images=1'],
              'No space left on device')
    train_vit.main([f'--out_dir={tmp_path}/none', *args, '--viz_images=0'])
    assert not os.path.exists(tmp_path / 'none' / 'viz')


def test_a_run_from_weights_is_that_model_and_takes_a_new_drop_path(data, trained, tmp_path):
    """From best.pt with no --model: the checkpoint names the checkpoint's model (not the default
    tost-cifar), --drop_path applies, and the run starts at step 0 with a log of its own."""
    out = str(tmp_path)
    args = base_args(data, out, f'--init_from={trained}/best.pt', '--drop_path=0.3', '--epochs=1',
                     '--steps_per_epoch=1', '--viz_images=0')
    train_vit.main([arg for arg in args if not arg.startswith('--model=')])
    ckpt = load_checkpoint(os.path.join(out, 'ckpt.pt'))
    assert ckpt['config']['model'] == 'tost-cifar-tiny' and ckpt['model_args']['drop_path'] == 0.3
    assert ckpt['config']['drop_path'] == 0.3 and ckpt['step'] == 1
    assert [r['step'] for r in read_log(out, kind='eval')] == [1]
    assert load_checkpoint(f'{trained}/best.pt')['model_args']['drop_path'] == 0.1
    train_vit.main(['--init_from=resume', f'--out_dir={out}', '--epochs=2', '--model=tost-cifar-tiny'])


def test_a_preset_s_drop_path_is_the_one_logged_and_saved(data, tmp_path, monkeypatch):
    """tost-s trains with drop-path 0.05 without --drop_path: the config row and the checkpoint say so."""
    monkeypatch.setitem(tost.PRESETS['tost-cifar-tiny'], 'drop_path', 0.2)
    out = str(tmp_path)
    train_vit.main(base_args(data, out, '--epochs=1', '--steps_per_epoch=1', '--viz_images=0'))
    ckpt = load_checkpoint(os.path.join(out, 'ckpt.pt'))
    assert ckpt['config']['drop_path'] == ckpt['model_args']['drop_path'] == 0.2
    with open(os.path.join(out, 'log.jsonl')) as f:
        assert json.loads(f.readline())['drop_path'] == 0.2                  # the config row


def test_resumes_with_other_batch_sizes_keep_the_log_in_epochs(data, tmp_path, monkeypatch):
    """A step is another length after such a resume: the log keeps what came before the checkpoint by the
    epochs done, which every row carries, not by step numbers of two different lengths. A resume keeps no
    second copy of the weights it loaded."""
    out = str(tmp_path)
    train_vit.main(base_args(data, out, '--epochs=1', '--batch_size=8', '--viz_images=0'))   # 8 steps of 8
    loaded = []
    monkeypatch.setattr(train_vit, 'load_checkpoint',
                        lambda *a, **k: loaded.append(load_checkpoint(*a, **k)) or loaded[-1])
    for epochs in (2, 3):                                                                 # then 2 steps of 32
        train_vit.main(['--init_from=resume', f'--out_dir={out}', f'--epochs={epochs}', '--batch_size=32'])
        assert (weights(out)['step'], weights(out)['epoch']) == (2 * epochs, epochs)
        assert 'optimizer' in loaded[-1] and 'model' not in loaded[-1]
    assert len(loaded) == 2
    assert [r['epoch'] for r in read_log(out, kind='train')] == [0.25, 0.5, 0.75, 1, 2, 3]
    assert [r['epoch'] for r in read_log(out, kind='eval')] == [1, 2, 3]


def test_a_resume_in_longer_steps_never_counts_an_epoch_end_as_done(data, tmp_path, monkeypatch, ends):
    """Stopped in step 7 of 8 (epoch 1.75), resumed in steps twice as long: it goes on from step 3 of 4 (1.5
    epochs), so the last epoch's end is evaluated and saved; rounded up to 4, it would count as done."""
    out = str(tmp_path)
    interrupt_in_step(monkeypatch, 7)
    code, _ = ends(train_vit.main, base_args(data, out, '--epochs=2', '--viz_images=0'))
    monkeypatch.undo()
    assert code == 130 and weights(out)['epoch'] == 1.75
    train_vit.main(['--init_from=resume', f'--out_dir={out}', '--batch_size=32'])
    assert (weights(out)['step'], weights(out)['epoch']) == (4, 2)
    assert [r['epoch'] for r in read_log(out, kind='eval')] == [1, 2]


def test_a_resume_goes_on_from_its_step_whatever_the_epochs_last_bit(data, tmp_path, monkeypatch, ends):
    """Stopped in step 15 of 22: the checkpoint's epoch, 15/22, times 22 is 14.999... in floating point; the
    resume goes on at step 16, not at 15 again (each step logged once)."""
    out = str(tmp_path)
    interrupt_in_step(monkeypatch, 15)
    args = base_args(data, out, '--epochs=1', '--batch_size=2', '--steps_per_epoch=22', '--log_interval=1',
                     '--viz_images=0', '--compression_images=0')
    assert ends(train_vit.main, args)[0] == 130 and weights(out)['step'] == 15
    monkeypatch.undo()
    train_vit.main(['--init_from=resume', f'--out_dir={out}'])
    assert [r['step'] for r in read_log(out, kind='train')] == list(range(1, 23))


def test_best_pt_keeps_the_best_model_and_its_accuracy(data, tmp_path, monkeypatch, capsys):
    """Test accuracies 0.5, 0.25, 0.5 at the ends of three epochs, the last two after a resume: best.pt
    stays the first epoch's (a tie is no better), and the run and each evaluation's row say 0.5."""
    out = str(tmp_path)
    accuracies = iter([(0.5, 1.0), (0.25, 1.0), (0.5, 2.0)])
    monkeypatch.setattr(train_vit, 'evaluate', lambda *args: next(accuracies))
    assert train_vit.main(base_args(data, out, '--epochs=1', '--steps_per_epoch=1', '--viz_images=0')) == 0.5
    resumed = base_args(data, out, '--epochs=3', '--steps_per_epoch=1', '--viz_images=0',
                        '--init_from=resume')
    assert train_vit.main(resumed) == 0.5
    best = load_checkpoint(f'{out}/best.pt')
    assert (best['step'], best['best_acc']) == (1, 0.5)
    assert [r['best_acc'] for r in read_log(out, kind='eval')] == [0.5, 0.5, 0.5]
    # each evaluation's line shows its own accuracy beside the best
    shown = capsys.readouterr().out
    assert all(f"{acc:.4f} (best 0.5000)" in shown for acc in (0.5, 0.25))


@pytest.mark.parametrize('edit', [dict(source='elsewhere'), dict(test_count=33)])
def test_a_resume_on_other_images_has_no_best_accuracy_to_beat(data, tmp_path, monkeypatch, edit):
    """A best accuracy is of its test set: resumed on the same images moved, a worse evaluation leaves
    best.pt; on other images (another source, or test count), the first evaluation's model is best.pt, worse
    though it is."""
    out = str(tmp_path / 'run')
    accuracies = iter([(0.5, 1.0), (0.25, 1.0), (0.25, 1.0)])
    monkeypatch.setattr(train_vit, 'evaluate', lambda *args: next(accuracies))
    moved = tmp_path / 'moved'
    other = tmp_path / 'other'
    shutil.copytree(os.path.join(data, 'synth'), moved / 'synth')
    shutil.copytree(os.path.join(data, 'synth'), other / 'synth')
    meta = json.loads((other / 'synth' / 'meta.json').read_text())
    (other / 'synth' / 'meta.json').write_text(json.dumps(dict(meta, **edit)))
    steps = ['--steps_per_epoch=1', '--viz_images=0']
    train_vit.main(base_args(data, out, '--epochs=1', *steps))
    train_vit.main(base_args(moved, out, '--epochs=2', '--init_from=resume', *steps))
    assert load_checkpoint(f'{out}/best.pt')['step'] == 1
    train_vit.main(base_args(other, out, '--epochs=3', '--init_from=resume', *steps))
    assert load_checkpoint(f'{out}/best.pt')['step'] == 3


def test_every_step_trains_as_asked_and_the_last_epoch_is_scored(data, tmp_path, monkeypatch):
    """Evaluations every 2 epochs of 3: at 2, and at 3, the last, whatever the interval. Every training
    step in training mode (drop-path, batch norm's batch statistics), also after an evaluation that draws
    nothing, and its loss smoothed as asked."""
    modes, smoothing, inputs, crops, seeds = [], [], [], [], []
    forward = tost.ViT.forward
    cross_entropy = train_vit.F.cross_entropy
    crop = train_vit.random_crop_flip

    def recorded_forward(self, x):
        if torch.is_grad_enabled():
            modes.append(self.training)
            inputs.append(x)
        return forward(self, x)

    def recorded_crop(x):
        seeds.append(torch.initial_seed())
        crops.append((x, crop(x)))
        return crops[-1][1]

    def recorded_cross_entropy(*args, **kwargs):
        if torch.is_grad_enabled():
            smoothing.append(kwargs.get('label_smoothing', 0.0))
        return cross_entropy(*args, **kwargs)

    monkeypatch.setattr(tost.ViT, 'forward', recorded_forward)
    monkeypatch.setattr(train_vit.F, 'cross_entropy', recorded_cross_entropy)
    monkeypatch.setattr(train_vit, 'random_crop_flip', recorded_crop)
    out = str(tmp_path)
    train_vit.main(base_args(data, out, '--epochs=3', '--eval_interval=2', '--steps_per_epoch=2',
                             '--viz_images=0', '--compression_images=0', '--label_smoothing=0.3'))
    assert [r['epoch'] for r in read_log(out, kind='eval')] == [2, 3]
    assert modes == [True] * 6 and smoothing == [0.3] * 6
    # Each step's images augmented, then standardized as the test set is (meta.json's mean and std); the
    # augmentation (and drop-path) drawn from a seed of its own; each epoch in an order of its own.
    for x, (_, augmented) in zip(inputs, crops):
        assert torch.equal(x, (augmented.float() / 255 - 0.45) / 0.28)
    assert len(set(seeds)) == 6
    assert not torch.equal(crops[0][0], crops[2][0]) and not torch.equal(crops[2][0], crops[4][0])


def test_the_learning_rate_warms_up_over_its_epochs_and_decays_over_the_run(data, tmp_path, monkeypatch):
    """2 epochs of 4 steps, 1 of warmup: the rate of each step is the schedule's at that step, in steps."""
    out = str(tmp_path)
    # a first evaluation (epoch 1's end) of 0.5 s, which the row after it does not time; the later ones take
    # no longer than they do
    real = train_vit.evaluate
    evaluations = []

    def evaluate(*a):
        if not evaluations:
            time.sleep(0.5)
        evaluations.append(1)
        return real(*a)
    monkeypatch.setattr(train_vit, 'evaluate', evaluate)
    train_vit.main(base_args(data, out, '--epochs=2', '--steps_per_epoch=4', '--warmup_epochs=1',
                             '--log_interval=1', '--viz_images=0', '--learning_rate=2e-3',
                             '--min_lr_ratio=0.1'))
    want = [train_common.cosine_lr(step, 2e-3, 2e-4, 4, 8) for step in range(8)]
    rows = read_log(out, kind='train')
    assert [r['lr'] for r in rows] == pytest.approx(want)
    # each row's rate and time are of its own step's 16 images
    assert [r['img_per_s'] * r['ms_per_step'] / 1000 for r in rows] == pytest.approx([16] * 8)
    assert rows[4]['ms_per_step'] < 500
    # a resume with a larger --epochs stretches the cosine over the longer run (back up from the floor)
    train_vit.main(['--init_from=resume', f'--out_dir={out}', '--epochs=3', '--viz_images=0'])
    later = [r['lr'] for r in read_log(out, kind='train')[8:]]
    assert later == pytest.approx([train_common.cosine_lr(step, 2e-3, 2e-4, 4, 12) for step in range(8, 12)])


@pytest.mark.parametrize('batch, steps', [(24, 3), (100000, 1)])
def test_a_row_counts_the_images_of_its_steps(data, tmp_path, capsys, batch, steps):
    """64 images in batches of 24 (24, 24, 16), or of 100000 (one step of every image, which the header says):
    the row at the epoch's end covers 64 images in its steps."""
    train_vit.main(base_args(data, str(tmp_path), '--epochs=1', f'--batch_size={batch}', '--log_interval=10',
                             '--viz_images=0'))
    row, = read_log(str(tmp_path), kind='train')
    assert row['step'] == steps and row['img_per_s'] * row['ms_per_step'] / 1000 == pytest.approx(64 / steps)
    assert f' {min(batch, 64)} images' in capsys.readouterr().out


def test_the_step_clips_at_grad_clip(data, tmp_path, monkeypatch):
    """--grad_clip reaches every optimizer step (train_common's tests check the step clips at it)."""
    clips = []
    real = train_vit.optimizer_step
    monkeypatch.setattr(train_vit, 'optimizer_step', lambda *a: clips.append(a[-1]) or real(*a))
    train_vit.main(base_args(data, str(tmp_path), '--epochs=1', '--steps_per_epoch=2', '--grad_clip=0.5',
                             '--viz_images=0'))
    assert clips == [0.5, 0.5]


def test_ranks_and_seeds_draw_their_own(data, tmp_path, monkeypatch):
    """Rank 0 and rank 1 of 2 (the group faked: a run each): the same initial weights; an epoch's
    images split between them, each once; augmentation seeds of their own; the row counts both ranks' images.
    Another --seed: other initial weights, another order, other seeds."""
    crop = train_vit.random_crop_flip
    forward = tost.ViT.forward
    runs = {}
    for rank, seed in ((0, 1337), (1, 1337), (0, 7)):
        got = runs[rank, seed] = dict(images=[], seeds=[], init=None)

        def recorded_forward(self, x, got=got):
            if got['init'] is None:
                got['init'] = torch.cat([p.detach().flatten().clone() for p in self.parameters()])
            return forward(self, x)

        def recorded_crop(x, got=got):
            got['images'] += [bytes(im.numpy()) for im in x]
            got['seeds'].append(torch.initial_seed())
            return crop(x)
        monkeypatch.setattr(train_vit, 'setup_distributed',
                            lambda device, rank=rank: train_common.Dist(False, rank, rank, 2, True, 'cpu'))
        monkeypatch.setattr(train_vit, 'random_crop_flip', recorded_crop)
        monkeypatch.setattr(tost.ViT, 'forward', recorded_forward)
        out = str(tmp_path / f'{rank}-{seed}')
        train_vit.main(base_args(data, out, '--epochs=1', f'--seed={seed}', '--viz_images=0',
                                 '--compression_images=0'))
        row, = read_log(out, kind='train')
        assert row['img_per_s'] * row['ms_per_step'] / 1000 == pytest.approx(2 * 16)
    a, b, c = runs[0, 1337], runs[1, 1337], runs[0, 7]
    train = {bytes(im) for im in np.load(os.path.join(data, 'synth', 'train_images.npy'))}
    assert len(a['images']) == len(b['images']) == 32 and set(a['images']) | set(b['images']) == train
    assert torch.equal(a['init'], b['init']) and not torch.equal(a['init'], c['init'])
    assert not set(a['seeds']) & set(b['seeds']) and not set(a['seeds']) & set(c['seeds'])
    assert a['images'] != c['images']


def test_vit_inspect_measures_what_the_layers_compute():
    """The memberships inspect gives for layer 1 are the ones that layer computes in the model's own
    forward; each layer's R^var_c is of that block's output, with the memberships of its input."""
    torch.manual_seed(0)
    model = tost.ViT(tost.preset('tost-cifar-tiny')).eval()
    x = torch.randn(2, 3, 32, 32)
    pis, outs = [], []
    for block in model.blocks:
        real = block.attn.memberships
        block.attn.memberships = lambda w, real=real: pis.append(real(w)) or pis[-1]
        block.register_forward_hook(lambda m, i, o: outs.append(o))
    model(x)
    compression, cls_attn, pi = train_vit.inspect(model, x, layer=1)
    assert pi.shape == cls_attn.shape == (2, 4, 8, 8) and len(compression) == len(model.blocks) == 4
    torch.testing.assert_close(pi.flatten(-2), pis[1])
    for k, block in enumerate(model.blocks):
        w = block.attn.split_heads(block.attn.c_attn(block.ln_1(outs[k])))
        torch.testing.assert_close(compression[k], tost.compression_of_projections(w, pis[k]))


def test_looking_inside_leaves_the_model_as_it_was(tmp_path):
    """With drop-path and LPI's batch norm: two looks agree, and the model keeps its buffers and its
    training mode."""
    torch.manual_seed(0)
    model = tost.ViT(tost.preset('tost-cifar-tiny', lpi=True, drop_path=0.5)).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(4, 3, 32, 32)
    cfg = dict(train_vit.DEFAULTS, compression_images=4, viz_images=0, out_dir=str(tmp_path))
    looks = [train_vit.look_inside(model, x, None, None, cfg, None) for _ in range(2)]
    assert looks[0] == looks[1] and model.training
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_ranks_evaluate_the_test_set_between_them():
    """Three ranks (the group faked, so no all-reduce): their accuracies and losses, each a share
    of the whole, add up to one process's."""
    torch.manual_seed(0)
    model = tost.ViT(tost.preset('tost-cifar-tiny', num_classes=3))
    x, y = torch.randn(10, 3, 32, 32), torch.randint(0, 3, (10,))
    ranks = [train_common.Dist(False, r, r, n, r == 0, 'cpu') for n in (1, 3) for r in range(n)]
    whole, *parts = [train_vit.evaluate(model, x, y, 4, contextlib.nullcontext(), d) for d in ranks]
    assert [sum(p[i] for p in parts) for i in (0, 1)] == pytest.approx(whole)


@pytest.mark.skipif(sys.platform != 'linux', reason="the address space is limited through Linux's setrlimit")
def test_model_args_that_claim_more_than_the_weights_are_refused_before_taking_memory(trained, tmp_path):
    ckpt = torch.load(os.path.join(trained, 'ckpt.pt'), weights_only=True)
    torch.save(dict(ckpt, model_args=dict(ckpt['model_args'], n_embd=2**15, n_head=2)), tmp_path / 'ckpt.pt')
    got = in_little_memory('train_vit.py', f'--init_from={tmp_path}/ckpt.pt', '--eval_only',
                           f'--out_dir={tmp_path}', '--device=cpu')
    assert got.returncode == 2
    one_line(got.stderr, f'{tmp_path}/ckpt.pt')


@POSIX_ONLY
def test_a_link_at_viz_is_refused_and_nothing_is_drawn_through_it(data, trained, tmp_path, fails, capsys):
    """A run's folder from elsewhere could point viz/ at any folder: --eval_only refuses it, naming it, and
    training goes on without the maps."""
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    (tmp_path / 'ev').mkdir()
    (tmp_path / 'ev' / 'viz').symlink_to(elsewhere)
    fails(train_vit.main, base_args(data, str(tmp_path / 'ev'), f'--init_from={trained}/best.pt',
                                    '--eval_only'), 'viz')
    (tmp_path / 'run').mkdir()
    (tmp_path / 'run' / 'viz').symlink_to(elsewhere)
    train_vit.main(base_args(data, str(tmp_path / 'run'), '--epochs=1'))
    assert os.listdir(elsewhere) == []


@pytest.mark.parametrize('edit', [dict(batch_size=0), dict(model=None)])
def test_a_resume_checks_its_checkpoints_config_as_a_command_line(trained, tmp_path, fails, edit):
    """A damaged or crafted checkpoint's config (out of its range, a key missing) is one line naming the
    checkpoint and the key, not a traceback."""
    ckpt = torch.load(os.path.join(trained, 'ckpt.pt'), weights_only=True)
    config = {k: v for k, v in dict(ckpt['config'], **edit).items() if v is not None}
    torch.save(dict(ckpt, config=config), tmp_path / 'ckpt.pt')
    fails(train_vit.main, ['--init_from=resume', f'--out_dir={tmp_path}', '--device=cpu', '--epochs=3'],
          str(tmp_path / 'ckpt.pt'), *edit)


def test_a_checkpoint_from_before_steps_per_epoch_keeps_its_cap(data, trained, tmp_path, monkeypatch):
    """A run saved when the cap was --max_steps goes on with it: 1 step an epoch, not the whole epoch."""
    ckpt = torch.load(os.path.join(trained, 'ckpt.pt'), weights_only=True)
    config = {k: v for k, v in ckpt['config'].items() if k != 'steps_per_epoch'}
    torch.save(dict(ckpt, config=dict(config, max_steps=1)), tmp_path / 'ckpt.pt')
    steps = counted(monkeypatch, train_vit, 'optimizer_step')
    train_vit.main(['--init_from=resume', f'--out_dir={tmp_path}', '--epochs=3', '--viz_images=0'])
    assert len(steps) == 1


def test_a_resume_runs_on_this_machine_not_the_checkpoints(trained, tmp_path, monkeypatch):
    """A run saved on another machine's GPU, compiled: its resume here takes the run from the checkpoint and
    the machine from this command (the defaults: auto, not compiled), and saves that."""
    def no_compile(*args, **kwargs):
        raise AssertionError('compiled')
    monkeypatch.setattr(torch, 'compile', no_compile)
    ckpt = torch.load(os.path.join(trained, 'ckpt.pt'), weights_only=True)
    torch.save(dict(ckpt, config=dict(ckpt['config'], device='cuda:7', compile=True)), tmp_path / 'ckpt.pt')
    train_vit.main(['--init_from=resume', f'--out_dir={tmp_path}', '--epochs=3', '--viz_images=0'])
    config = weights(tmp_path)['config']
    assert (weights(tmp_path)['epoch'], config['device'], config['compile']) == (3, 'auto', False)


def test_random_crop_flip_pads_by_four_and_mirrors_half_the_images():
    """The CIFAR recipe's crop pads by 4 (an image loses 0 to 4 rows to it, each count seen), and half the
    images are mirrored (200,000 two-pixel images: within 4.5 standard errors)."""
    torch.manual_seed(0)
    out = train_vit.random_crop_flip(torch.full((2000, 1, 8, 8), 7, dtype=torch.uint8))
    assert set((out[:, 0] == 0).all(-1).sum(-1).tolist()) == {0, 1, 2, 3, 4}
    x = torch.tensor([1, 2], dtype=torch.uint8).view(1, 1, 1, 2).repeat(200000, 1, 1, 1)
    mirrored = (train_vit.random_crop_flip(x, pad=0)[:, 0, 0, 0] == 2).double().mean().item()
    assert abs(mirrored - 0.5) < 0.005


def test_inspect_reads_each_layer_through_its_own_norm_and_the_class_tokens_attention():
    """On a model whose norms differ (randomized), R^var_c of block k is that of its output through its own
    ln_1 and c_attn, with its memberships; the class map is the last class block's attention of the class
    token over the patches, each in its place."""
    torch.manual_seed(0)
    model = randomize(tost.ViT(tost.preset('tost-cifar-tiny'))).eval()
    x = torch.randn(2, 3, 32, 32)
    pis, outs, atts = [], [], []
    for block in model.blocks:
        real = block.attn.memberships
        block.attn.memberships = lambda w, real=real: pis.append(real(w)) or pis[-1]
        block.register_forward_hook(lambda m, i, o: outs.append(o))
    model.cls_blocks[-1].register_forward_hook(lambda m, i, o: atts.append(o[2]))
    with torch.no_grad():
        model(x)
    compression, cls_attn, _ = train_vit.inspect(model, x, -1)
    for k, block in enumerate(model.blocks):
        w = block.attn.split_heads(block.attn.c_attn(block.ln_1(outs[k])))
        torch.testing.assert_close(compression[k], tost.compression_of_projections(w, pis[k]))
    torch.testing.assert_close(cls_attn.flatten(-2), atts[0][:, :, 1:])


def test_look_inside_measures_compression_on_the_first_compression_images_only(tmp_path, monkeypatch):
    """With more images drawn (3) than measured (2), R^var_c is the mean over the first 2."""
    monkeypatch.setattr(plot, 'vision_maps', lambda *args, **kwargs: None)
    torch.manual_seed(0)
    model = tost.ViT(tost.preset('tost-cifar-tiny')).eval()
    x = torch.randn(3, 3, 32, 32)
    cfg = dict(train_vit.DEFAULTS, compression_images=2, viz_images=3, out_dir=str(tmp_path))
    got = train_vit.look_inside(model, x, torch.zeros(3, 3, 32, 32, dtype=torch.uint8), [0, 0, 0], cfg, ['a'])
    compression, _, _ = train_vit.inspect(model.eval(), x[:2], -1)
    assert got['compression'] == [c.mean().item() for c in compression]


def test_evaluation_under_bf16_autocast_scores_the_logits_in_float32():
    """Under bf16 autocast the test loss is the float32 cross-entropy of the model's bf16 logits (a bf16 sum
    is off by about 1e-3)."""
    torch.manual_seed(0)
    model = tost.ViT(tost.preset('tost-cifar-tiny')).eval()
    x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))
    ctx = torch.autocast('cpu', dtype=torch.bfloat16)
    _, loss = train_vit.evaluate(model, x, y, 64, ctx, train_common.Dist(False, 0, 0, 1, True, 'cpu'))
    with torch.no_grad(), ctx:
        logits = model.eval()(x)
    assert loss == pytest.approx(torch.nn.functional.cross_entropy(logits.float(), y).item(), rel=1e-6)


def test_the_default_label_smoothing_is_the_papers(capsys):
    """0.1, read whole from --help (the help test's text '--label_smoothing=0.1' is also in 0.11)."""
    with pytest.raises(SystemExit):
        train_vit.main(['--help'])
    value, = re.findall(r'^  --label_smoothing=(\S+)', capsys.readouterr().out, re.M)
    assert float(value) == 0.1


def test_a_run_s_value_files_and_steps(data, tmp_path, monkeypatch):
    """A larger --steps_per_epoch than the epoch holds is the epoch (64 images of 16 a step: 4 steps); the
    run's value is its best accuracy, not its last; loss.png is drawn; a resume at the end does nothing and
    writes nothing."""
    accuracies = iter([(0.5, 1.0), (0.25, 1.0)])
    monkeypatch.setattr(train_vit, 'evaluate', lambda *args: next(accuracies))
    out = str(tmp_path)
    args = base_args(data, out, '--epochs=2', '--steps_per_epoch=100', '--viz_images=0')
    assert train_vit.main(args) == 0.5
    assert load_checkpoint(f'{out}/ckpt.pt')['step'] == 8 and os.path.isfile(f'{out}/loss.png')
    log = Path(out, 'log.jsonl').read_text()
    train_vit.main(args + ['--init_from=resume'])
    assert Path(out, 'log.jsonl').read_text() == log


def test_maps_without_compression_are_still_drawn(data, trained, tmp_path):
    """--compression_images=0 skips R^var_c only, not the maps --viz_images asks for."""
    train_vit.main(base_args(data, str(tmp_path), f'--init_from={trained}/ckpt.pt', '--eval_only=true',
                             '--compression_images=0', '--viz_images=1'))
    assert os.listdir(tmp_path / 'viz') == ['test0000.png']
