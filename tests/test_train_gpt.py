"""
Tests for train_gpt.py and sample.py: tiny end-to-end runs on CPU (a 1-layer, 32-wide model on a byte corpus),
offline. Ctrl-C and SIGTERM are real signals, to this process, a subprocess, one torchrun worker or torchrun's
group; several processes run under torchrun (gloo); the GPU paths (compile, bf16, fp16 with the GradScaler,
fused AdamW, MFU) run on CPU; bad input ends in one line, a non-zero exit and no traceback.
"""
import contextlib
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import types
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

import options
import plot
import prepare_data
import readers
import sample
import tost
import tost_fast
import train_common
import train_gpt
from conftest import (POSIX_ONLY, REPO, ENV, as_from_a_terminal, in_little_memory, in_thread, one_line,
                      run_with_slow_steps)


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    """A byte-level text dataset 'tiny' made by prepare_data from tost.py (~40 KB: ~36k train, ~4k val
    tokens)."""
    d = tmp_path_factory.mktemp('data')
    # a fixed, learnable corpus of ~40 KB (not a repo file: editing that would change every number here)
    corpus = d / 'corpus.py'
    lines = [f"def scale_{i}(x):\n    return x * {i % 97} + {i % 13}\n\n" for i in range(900)]
    corpus.write_text(''.join(lines))
    prepare_data.prepare('text', data_dir=str(d), input=str(corpus), name='tiny')
    return str(d)


def tiny(data_dir, out_dir, *extra):
    return ['--dataset=tiny', f'--data_dir={data_dir}', f'--out_dir={out_dir}', '--n_layer=1', '--n_head=2',
            '--n_embd=32', '--block_size=32', '--batch_size=4', '--eval_iters=2', '--log_interval=1',
            '--device=cpu', '--dtype=float32', '--learning_rate=3e-3', '--warmup_iters=1', *extra]


@pytest.fixture(scope='module')
def train(data_dir):
    """train(out_dir, *extra): train_gpt.main on the tiny data and model, into out_dir."""
    def train(out_dir, *extra):
        return train_gpt.main(tiny(data_dir, out_dir, *extra))
    return train


def read_log(out_dir, name='log.jsonl', kind=None):
    """The log's rows but the config rows (what each start of the run was; plot.py reads them), or those of
    `kind`."""
    with open(os.path.join(out_dir, name)) as f:
        return [r for r in map(json.loads, f) if r.get('kind') != 'config' and kind in (None, r.get('kind'))]


def resume(out_dir, *extra):
    """The run in out_dir goes on, as `python train_gpt.py --init_from=resume --out_dir=...` and `extra`."""
    return train_gpt.main(['--init_from=resume', f'--out_dir={out_dir}', *extra])


def weights(out_dir):
    return train_common.load_checkpoint(os.path.join(out_dir, 'ckpt.pt'))


def test_compile_that_would_fail_on_a_gpu_is_refused_before_the_data(monkeypatch, tmp_path):
    """torch before 2.13 on a GPU: --compile of a ToST model stops before the data is prepared (hours for
    OpenWebText) or any folder is made; the softmax baseline, which has no prefix sums, goes on, and so does
    ToST where the Triton core runs (it compiled with torch 2.11 on a GPU), unless dropout or a GPU below
    Triton's floor keeps the readable lines."""
    monkeypatch.setattr(torch, '__version__', '2.12.1+cu128')
    monkeypatch.setattr(tost_fast, 'TRITON', ())
    args = ['--compile=true', f'--data_dir={tmp_path}/data', f'--out_dir={tmp_path}/out']
    gpu = train_common.Dist(False, 0, 0, 1, True, 'cuda')
    monkeypatch.setattr(train_gpt, 'setup_distributed', lambda device: gpu)
    with pytest.raises(options.UsageError, match='--compile'):
        train_gpt.main(args)
    assert not os.listdir(tmp_path)

    def past_the_check(*args):
        raise RuntimeError('past the check')
    monkeypatch.setattr(train_gpt, 'resolve_dtype', past_the_check)
    with pytest.raises(RuntimeError, match='past the check'):
        train_gpt.main(args + ['--attn=softmax'])
    monkeypatch.setattr(tost_fast, 'TRITON', ('cuda',))
    monkeypatch.setattr(tost_fast, '_triton_runs_on', lambda gpu: True)
    with pytest.raises(RuntimeError, match='past the check'):
        train_gpt.main(args)
    with pytest.raises(options.UsageError, match='--compile.*--dropout'):
        train_gpt.main(args + ['--dropout=0.1'])
    # a GPU below Triton's floor trains on the readable lines too
    monkeypatch.setattr(tost_fast, '_triton_runs_on', lambda gpu: False)
    with pytest.raises(options.UsageError, match='--compile'):
        train_gpt.main(args)
    monkeypatch.setattr(tost_fast, 'TRITON', ())
    monkeypatch.setattr(torch, '__version__', '2.13.0')           # whose inductor builds the readable lines
    with pytest.raises(RuntimeError, match='past the check'):
        train_gpt.main(args + ['--dropout=0.1'])


@pytest.mark.slow
def test_a_compiler_that_cannot_build_is_one_line_that_names_compile(data_dir, tmp_path):
    """No C++ compiler (Windows and macOS ship none): torch.compile fails at the first call; one line, exit 2,
    naming --compile."""
    run = subprocess.run([sys.executable, os.path.join(REPO, 'train_gpt.py'), '--compile=true',
                          *tiny(data_dir, tmp_path / 'out')], env=dict(ENV, CXX=str(tmp_path / 'no-cxx')),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    one_line(run.stderr, '--compile')


@pytest.fixture(scope='module')
def trained(train, tmp_path_factory):
    """A finished 12-iteration run, shared by the checkpoint and sampling tests."""
    out = tmp_path_factory.mktemp('trained')
    result = train(out, '--max_iters=12', '--eval_interval=6')
    return out, result

@pytest.fixture(scope='module')
def four(train, tmp_path_factory):
    """A 4-iteration run in float32 with the fused AdamW, evaluated every 2: what others are compared with."""
    out = tmp_path_factory.mktemp('four')
    train(out, '--max_iters=4', '--eval_interval=2')
    return out


@pytest.fixture(scope='module')
def unbroken(train, tmp_path_factory):
    """unbroken(*extra): the out_dir of a run with those options that nothing stopped, trained once for all
    the tests that compare a stopped and resumed run with it (they only read it)."""
    runs = {}

    def unbroken(*extra):
        if extra not in runs:
            runs[extra] = tmp_path_factory.mktemp('unbroken')
            train(runs[extra], *extra)
        return runs[extra]
    return unbroken

# -----------------------------------------------------------------------------
# config


def parse(*argv):
    return options.parse(list(argv), train_gpt.DEFAULTS, presets=train_gpt.PRESETS)[0]


def shape(config, *keys):
    return [config[k] for k in ('n_layer', 'n_head', 'n_embd', *keys)]


def test_presets_and_schedule_defaults():
    """The owt presets are the paper's recipe (480 x 1024 tokens a step) on tost's shapes; the demo (the
    defaults) is tost-demo with nanoGPT's rules of thumb for its schedule, which does not follow max_iters."""
    assert parse() == parse('--config=demo')
    for name in ('owt-base', 'owt-medium', 'owt-large'):
        c = parse(f'--config={name}')
        assert c['batch_size'] * c['gradient_accumulation_steps'] * c['block_size'] == 480 * 1024
        assert (c['learning_rate'], c['min_lr_ratio'], c['warmup_iters'], c['lr_decay_iters'], c['max_iters'],
                c['grad_clip'], c['beta1'], c['beta2']) == (6e-4, 0.1, 2000, 600_000, 600_000, 1.0, 0.9, 0.95)
        # docs/models.md's micro-batches, evaluation and compile
        micro = (6, 80) if name == 'owt-large' else (12, 40)
        assert (c['batch_size'], c['gradient_accumulation_steps']) == micro
        run = (c['dataset'], c['eval_interval'], c['eval_iters'], c['compile'])
        assert run == ('openwebtext', 2000, 200, True)
        assert shape(c) == shape(vars(tost.preset(name.replace('owt', 'tost'))))
        assert c['weight_decay'] == (0.01 if name == 'owt-base' else 0.1)
    c = parse('--config=shakespeare')
    assert (c['dropout'], c['always_save_checkpoint']) == (0.2, False)
    d = train_gpt.DEFAULTS
    assert shape(d, 'block_size') == shape(vars(tost.preset('tost-demo')), 'block_size')
    assert d['lr_decay_iters'] == d['max_iters'] and d['warmup_iters'] == d['max_iters'] // 20
    assert d['learning_rate'] * d['min_lr_ratio'] == d['learning_rate'] / 10
    assert parse('--max_iters=2000')['lr_decay_iters'] == 1000
    # a preset's keys are the script's (presets are applied unchecked)
    assert all(set(preset) <= set(d) for preset in train_gpt.PRESETS.values())


def test_every_model_option_reaches_the_model():
    """An option that is a GPTConfig field is in MODEL_KEYS, the only way into the model and its checkpoint
    (but block_size and dropout, which the run sets): a new one left out would train the default model."""
    fields = {f.name for f in dataclasses.fields(tost.GPTConfig)}
    assert set(train_gpt.MODEL_KEYS) == fields & set(train_gpt.DEFAULTS) - {'block_size', 'dropout'}

# -----------------------------------------------------------------------------
# a run, its log and its checkpoint


def test_run_log_and_checkpoint_roundtrip(trained, data_dir):
    out, result = trained
    evals = read_log(out, kind='eval')
    steps = read_log(out, kind='train')
    assert [r['iter'] for r in evals] == [0, 6, 12] and [r['iter'] for r in steps] == list(range(1, 13))
    assert all({'iter', 'train_loss', 'lr', 'tokens_per_sec'} <= set(r) for r in evals + steps)
    # no MFU on a CPU
    assert all(r['mfu'] is None for r in steps)
    assert evals[-1]['val_loss'] < evals[0]['val_loss'] - 0.5  # it learns (from ~5.5 = ln 256)
    assert result['val_loss'] == evals[-1]['val_loss']

    ckpt = weights(out)  # weights_only=True
    assert {'model', 'optimizer', 'model_args', 'iter_num', 'best_val_loss', 'config', 'meta'} <= set(ckpt)
    assert ckpt['iter_num'] == 12 and ckpt['meta']['tokenizer'] == 'bytes'
    assert ckpt['model_args'] == dict(block_size=32, vocab_size=256, n_layer=1, n_head=2, n_embd=32,
                                      dropout=0.0, bias=False, attn='tssa', token_shift=False,
                                      softmax_layers=[])
    assert ckpt['config']['max_iters'] == 12 and ckpt['config']['dataset'] == 'tiny'
    assert [g['weight_decay'] for g in ckpt['optimizer']['param_groups']] == [0.1, 0.0]
    assert [tuple(g['betas']) for g in ckpt['optimizer']['param_groups']] == [(0.9, 0.95)] * 2
    assert [r['tokens'] for r in steps] == [i * 4 * 32 for i in range(1, 13)]
    # the learning curves, drawn from the log
    assert os.path.getsize(os.path.join(out, 'loss.png')) > 0

    # the weights, as sample.py loads them, give back the val loss the run measured on the same eval batches
    model = sample.load_gpt(os.path.join(out, 'ckpt.pt'), 'cpu')[0]
    path = os.path.join(data_dir, 'tiny')
    n_val = os.path.getsize(os.path.join(path, 'val.bin')) // 2
    losses = []
    with torch.no_grad():
        for k in range(2):
            starts = train_gpt.window_starts(1337, 2, k, 4, n_val, 32)
            X, Y = train_gpt.read_batch(path, 'val', starts, 32, 'cpu', ckpt['meta'])
            losses.append(model(X, Y)[1].item())
    assert abs(sum(losses) / 2 - ckpt['val_loss']) < 1e-5
    assert ckpt['val_loss'] == evals[-1]['val_loss']
    # --seed draws the windows too: another seed, other batches
    assert starts.tolist() != train_gpt.window_starts(1338, 2, 1, 4, n_val, 32).tolist()


def at_iter(monkeypatch, it, act):
    """act() as iteration `it` draws its batch (train_gpt.window_starts, stream 0)."""
    real = train_gpt.window_starts

    def starts(seed, stream, index, *rest):
        if stream == 0 and index == it:
            act()
        return real(seed, stream, index, *rest)
    monkeypatch.setattr(train_gpt, 'window_starts', starts)


def at_micro_step(monkeypatch, it, g, act):
    """act() as the micro-step g of iteration `it` seeds its dropout (train_gpt.seed_of)."""
    real = train_gpt.seed_of

    def seed_of(seed, index, micro):
        if (index, micro) == (it, g):
            act()
        return real(seed, index, micro)
    monkeypatch.setattr(train_gpt, 'seed_of', seed_of)


def sigint():
    signal.raise_signal(signal.SIGINT)


def same_state(a, b, atol=0.0):
    assert a['model'].keys() == b['model'].keys()
    for k in a['model']:
        torch.testing.assert_close(b['model'][k], a['model'][k], rtol=0, atol=atol, msg=k)
    sa, sb = a['optimizer']['state'], b['optimizer']['state']
    assert sa.keys() == sb.keys()
    for p in sa:
        for k in ('exp_avg', 'exp_avg_sq', 'step'):
            torch.testing.assert_close(sb[p][k], sa[p][k], rtol=0, atol=atol)


def same_losses(a, b, tol):
    """Two runs' logs, row by row: the same iterations, the losses (train, and val where evaluated) within
    tol."""
    for x, y in zip(read_log(a), read_log(b), strict=True):
        assert (x['iter'], x['kind']) == (y['iter'], y['kind'])
        assert abs(x['train_loss'] - y['train_loss']) < tol, (x, y)
        assert abs(x.get('val_loss', 0) - y.get('val_loss', 0)) < tol, (x, y)


def numbers(rows):
    """What a log's rows measured, without the times."""
    return [(r['iter'], r['kind'], r.get('lr'), r['train_loss'], r.get('val_loss')) for r in rows]


def resume_command(stderr):
    """The command the interrupted run printed to go on from its checkpoint, as a list of words."""
    lines = [line for line in stderr.splitlines() if '--init_from=resume' in line]
    assert len(lines) == 1, stderr[-3000:]
    words = shlex.split(lines[0])
    return words[min(i for i, w in enumerate(words) if w in ('python', 'torchrun')):]


def interrupt():
    """A KeyboardInterrupt no handler turned into a request: a second Ctrl-C, or one before the loop."""
    raise KeyboardInterrupt


def test_ctrl_c_that_breaks_a_step_ends_as_an_interrupt(data_dir, tmp_path, monkeypatch, ends):
    """Ctrl-C in the first compile reaches inductor's g++ too, which fails: the run ends as interrupted (exit
    130), not with torch's traceback."""
    def broken_by_the_signal():
        sigint()
        raise RuntimeError('CppCompileError: g++ got SIGINT')
    at_iter(monkeypatch, 1, broken_by_the_signal)
    code, err = ends(train_gpt.main, tiny(data_dir, tmp_path / 'out', '--max_iters=3'))
    assert code == 130 and 'Traceback' not in err and err.strip().splitlines()[-1] == 'error: interrupted'


def test_ctrl_c_before_anything_is_saved_prints_no_resume_command(data_dir, tmp_path, monkeypatch, ends):
    """SIGINT during the first evaluation (iter 0): nothing is saved, so no command to go on from (it would be
    refused)."""
    real = train_gpt.estimate_loss

    def first_eval(*args):
        sigint()
        return real(*args)
    monkeypatch.setattr(train_gpt, 'estimate_loss', first_eval)
    code, err = ends(train_gpt.main, tiny(data_dir, tmp_path / 'out', '--max_iters=3'))
    assert code == 130 and '--init_from=resume' not in err
    assert not os.path.exists(tmp_path / 'out' / 'ckpt.pt')


@pytest.mark.parametrize('act, micro, saved', [(sigint, 0, 6), (sigint, 2, 7), (interrupt, 1, 4)])
def test_ctrl_c_saves_or_keeps_a_checkpoint_and_the_resume_is_exact(data_dir, unbroken, tmp_path, monkeypatch,
                                                                   ends, act, micro, saved):
    """SIGINT to this very process in the first of iteration 6's 3 micro-steps: the loop drops the step begun
    before its next micro-step, saves at iter 6 (no eval there), exits 130 and prints the command that goes
    on; in the last, it saves at iter 7. A KeyboardInterrupt in the second (no save) exits 130 and keeps the
    checkpoint of the eval at iter 4. The resume, with nothing but the out_dir (the schedule, the data order,
    the dropout RNG and the dtype come from the checkpoint), ends bit for bit where an unbroken run does, each
    row of the log once, with the same learning rates and losses: the checkpoints fall between two rows (one
    every 5 iterations), whose mean loss carries over, without the dropped step's. The row that spans the
    resume times only the steps after it."""
    args = ('--max_iters=10', '--eval_interval=4', '--dropout=0.1', '--log_interval=5',
            '--gradient_accumulation_steps=3')
    full = unbroken(*args)
    broken = tmp_path / 'broken'
    at_micro_step(monkeypatch, 6, micro, act)
    code, err = ends(train_gpt.main, tiny(data_dir, broken, *args))
    assert code == 130 and weights(broken)['iter_num'] == saved
    # the handler is given back
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    monkeypatch.undo()
    if act is sigint:
        assert weights(broken)['val_loss'] is None
        command = resume_command(err)
        assert command[:2] == ['python', 'train_gpt.py']
        # each step of the resume takes 0.1 s at least
        run_with_slow_steps(train_gpt, command[2:], monkeypatch)
        assert read_log(broken, kind='train')[-1]['ms_per_iter'] >= 100
    else:
        resume(broken, '--device=cpu')
    same_state(weights(full), weights(broken))
    assert numbers(read_log(broken)) == numbers(read_log(full))


class Died(BaseException):
    """The process killed (kill -9, out of memory): no handler of the run's sees it."""


@pytest.mark.parametrize('last', ['log_row', 'save_checkpoint'])
def test_a_run_killed_between_its_eval_row_and_its_checkpoint_loses_no_row(train, unbroken, tmp_path,
                                                                            monkeypatch, last):
    """Killed at iter 8's evaluation right after its row is written, or right after its checkpoint: the
    resume's log is the unbroken run's, each row once (rows come at 5 and 10: iter 8's is the eval's)."""
    args = ('--max_iters=10', '--eval_interval=4', '--log_interval=5')
    full = unbroken(*args)
    broken = tmp_path / 'broken'
    real = getattr(train_gpt, last)

    def dying(*a):
        real(*a)
        row_or_state = a[1] if last == 'log_row' else a[0]
        if row_or_state.get('iter', row_or_state.get('iter_num')) == 8:
            raise Died
    monkeypatch.setattr(train_gpt, last, dying)
    with pytest.raises(Died):
        train(broken, *args)
    monkeypatch.undo()
    resume(broken)
    assert numbers(read_log(broken)) == numbers(read_log(full))


def flat(state):
    return torch.cat([state[k].flatten().double() for k in sorted(state)])


def same_run(ckpt_a, ckpt_b):
    """How far apart two runs' weights are, as a share of how far training moved them from the initial
    weights. Not elementwise: where a gradient is ~0, Adam's m / (sqrt(v) + eps) turns the last bit of a
    rounding difference (a fused kernel, inductor) into a whole step for that element."""
    torch.manual_seed(ckpt_a['config']['seed'])                     # the trainer's initial weights
    init = tost.GPT(tost.GPTConfig(**ckpt_a['model_args'])).state_dict()
    a = flat(ckpt_a['model'])
    b = flat(ckpt_b['model'])
    return ((a - b).norm() / (a - flat(init)).norm()).item()


@pytest.mark.parametrize('interval, saved', [(3, 3), (100, 4)])
def test_ctrl_c_keeps_the_best_model_when_only_the_best_is_saved(data_dir, tmp_path, monkeypatch, ends,
                                                                interval, saved):
    """always_save_checkpoint=False (the shakespeare preset): ckpt.pt is the best model so far, and Ctrl-C
    keeps it; with no checkpoint yet, Ctrl-C saves as usual."""
    out = tmp_path / 'out'
    at_iter(monkeypatch, 4, sigint)
    args = tiny(data_dir, out, '--max_iters=10', f'--eval_interval={interval}',
                '--always_save_checkpoint=false')
    code, err = ends(train_gpt.main, args)
    assert code == 130 and resume_command(err) and weights(out)['iter_num'] == saved
    assert (f'(iter {saved})' in err) == (saved == 3), err


def start(script, args, cwd, torchrun=0):
    """A training run in its own session (so a signal to its group reaches torchrun and its workers only),
    as from a terminal. POSIX only (preexec_fn): the tests that start one are marked so."""
    launch = [sys.executable]
    if torchrun:
        launch += ['-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={torchrun}']
    return subprocess.Popen(launch + [os.path.join(REPO, script), *args], cwd=cwd, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=as_from_a_terminal)


def wait_for(proc, cond, what, timeout=120):
    t = time.time()
    while not cond():
        assert proc.poll() is None, f"exited {proc.returncode} before {what}: {proc.communicate()[1][-2000:]}"
        assert time.time() - t < timeout, f"no {what} after {timeout}s"
        time.sleep(0.02)


def logged_iter(out_dir):
    try:
        return max((r['iter'] for r in read_log(out_dir, kind='train')), default=0)
    except (OSError, ValueError):
        return 0


# SIGTERM takes the path SIGINT does (test_train_common checks the handler takes both): slow.
@POSIX_ONLY
@pytest.mark.parametrize('name, reader_gone', [pytest.param('SIGTERM', False, marks=pytest.mark.slow),
                                               ('SIGINT', True)])
def test_a_signal_to_a_subprocess_saves_and_the_printed_command_resumes(data_dir, tmp_path, name,
                                                                        reader_gone):
    """SIGTERM, as a scheduler sends it; and `python train_gpt.py | tee log`, then Ctrl-C: tee dies of the
    same Ctrl-C, and a row printed after it (a row every iteration here) must not cost the save. The run saves
    at the step it stops after and exits 130; the command it prints (the script as it was started) goes on
    from there, each iteration logged once."""
    out = tmp_path / 'out'
    p = start('train_gpt.py', tiny(data_dir, out, '--max_iters=400', '--eval_interval=1000'), tmp_path)
    wait_for(p, lambda: logged_iter(out) >= 3, 'iter 3')
    if reader_gone:
        p.stdout.close()
    p.send_signal(getattr(signal, name))
    stderr = p.communicate(timeout=120)[1]
    it = weights(out)['iter_num']
    assert p.returncode == 130 and 3 <= it < 400 and logged_iter(out) == it, stderr[-3000:]
    assert [f for f in os.listdir(out) if '.tmp' in f] == []
    command = resume_command(stderr)
    assert command[1] == os.path.join(REPO, 'train_gpt.py')
    train_gpt.main(command[2:] + [f'--max_iters={it + 3}'])
    assert [r['iter'] for r in read_log(out, kind='train')] == list(range(1, it + 4))


@pytest.mark.parametrize('compiled', [False, True])
def test_the_memory_probe_takes_the_path_the_step_takes(data_dir, tmp_path, monkeypatch, compiled):
    """Compiled, a CPU's step runs the readable lines (the fused core is eager only): so do the probes."""
    asked = []

    def probe(*args, fused):
        asked.append(fused)
        raise StopIteration
    monkeypatch.setattr(train_gpt, 'backward_bytes', probe)
    with pytest.raises(StopIteration):
        train_gpt.main(tiny(data_dir, tmp_path / 'out', f'--compile={compiled}'))
    assert asked == [not compiled]


def test_a_resume_into_a_folder_another_run_holds_is_refused_as_such(data_dir, tmp_path, fails):
    """The other run has not saved yet: the folder is busy, not empty of checkpoints."""
    out = tmp_path / 'out'
    out.mkdir()
    held = in_thread(lambda: train_common.lock_out_dir(str(out)))
    line = fails(train_gpt.main, tiny(data_dir, out, '--init_from=resume'), f'--out_dir={out}')
    held.close()
    # the lock's line, not the one of a folder without a checkpoint (which names --out_dir too)
    assert 'ckpt.pt' not in line


def test_a_run_that_ended_in_an_exception_lets_the_next_run_here_take_its_folder(data_dir, tmp_path):
    """A notebook keeps the traceback of a cell's exception, and with it the failed run's open lock."""
    out = tmp_path / 'out'
    out.mkdir()
    (out / 'ckpt.pt').write_bytes(b'not a checkpoint')
    with pytest.raises(options.UsageError) as kept:
        train_gpt.main(tiny(data_dir, out, '--init_from=resume'))
    train_gpt.main(tiny(data_dir, out, '--overwrite=true', '--max_iters=1'))
    assert kept.tb is not None and torch.load(out / 'ckpt.pt', weights_only=True)['iter_num'] == 1


@pytest.mark.parametrize('failure', ['disk full', 'second Ctrl-C'])
def test_a_save_cut_short_keeps_the_previous_checkpoint(data_dir, tmp_path, monkeypatch, ends, failure):
    """torch.save has written part of the file when the disk is full (exit 2, one line naming the checkpoint
    and its option), or when a second Ctrl-C comes a second after the first (which torchrun's copy of it
    makes two SIGINTs at once: one Ctrl-C) and stops at once. Either way the checkpoint of iter 2 stays intact
    and no temp file is left. Real signals to this process; the clock is moved on by hand."""
    out = tmp_path / 'out'
    real_save = torch.save
    clock = [0.0]
    monkeypatch.setattr(train_common.time, 'monotonic', lambda: clock[0])

    def cut_short(obj, f, *a, **k):
        if obj['iter_num'] > 2:
            f.write(b'half a checkpoint')
            if failure == 'disk full':
                # as torch.save says it: a RuntimeError whose context is the OSError, which has no file name
                try:
                    raise OSError(28, 'No space left on device')
                except OSError:
                    raise RuntimeError('unexpected pos')
            clock[0] += 1.2
            sigint()
        return real_save(obj, f, *a, **k)

    def two_sigints():
        sigint()
        sigint()
    if failure == 'second Ctrl-C':
        at_iter(monkeypatch, 3, two_sigints)
    monkeypatch.setattr(torch, 'save', cut_short)
    code, err = ends(train_gpt.main, tiny(data_dir, out, '--max_iters=6', '--eval_interval=2'))
    monkeypatch.undo()
    if failure == 'disk full':
        assert code == 2
        one_line(err, f'{out}/ckpt.pt', f'--out_dir={out}', 'No space left on device')
    else:
        # the note that the first asks to stop, and the line that the second ends the run: no traceback
        assert code == 130 and len(err.splitlines()) == 2, err
    assert weights(out)['iter_num'] == 2
    assert set(os.listdir(out)) <= {'.lock', 'ckpt.pt', 'log.jsonl', 'loss.png'}

# -----------------------------------------------------------------------------
# several processes


# a worker that runs train_gpt.py and sends SIGINT to rank 1 as iteration 3 draws its batch
STOP_RANK_1_AT_3 = """import os, signal, sys
import train_gpt
real = train_gpt.window_starts
def starts(seed, stream, index, *rest):
    if (stream, index, os.environ['RANK']) == (0, 3, '1'):
        os.kill(os.getpid(), signal.SIGINT)
    return real(seed, stream, index, *rest)
train_gpt.window_starts = starts
train_gpt.main(sys.argv[1:])
"""


@pytest.mark.slow
@POSIX_ONLY
def test_torchrun_two_processes_on_the_defaults_match_one(data_dir, train, tmp_path):
    """2 processes with the default gradient_accumulation_steps=1 (no flag added) round it up to 2 and compute
    what 1 process with 2 does, dropout included (it is seeded per micro-step), up to rounding. Stopped at
    iter 3, before the first row (one every 4), and resumed by 1 process, they end where it does, the row
    after the stop included (the losses since the last row are saved as one sum for any process count)."""
    one = tmp_path / 'one'
    two = tmp_path / 'two'
    worker = tmp_path / 'worker.py'
    worker.write_text(STOP_RANK_1_AT_3)
    args = ('--max_iters=4', '--eval_interval=2', '--dropout=0.1', '--log_interval=4')
    p = start(worker, tiny(data_dir, two, *args), tmp_path, torchrun=2)
    stdout, stderr = p.communicate(timeout=300)
    # torchrun's exit code for its workers' 130
    assert p.returncode == 1 and weights(two)['iter_num'] == 3, stdout[-2000:] + stderr[-2000:]
    # only rank 0 talks: one line says how to go on
    resume_command(stderr)
    resume(two, '--device=cpu', '--gradient_accumulation_steps=2')
    train(one, *args, '--gradient_accumulation_steps=2')
    same_losses(one, two, 1e-5)
    same_state(weights(one), weights(two), atol=1e-5)


# a worker that runs a script's main(), then counts the threads its process still has that Python did not
# start
# (Python's own, such as inductor's compile pool on a cold cache, are joined at exit); one write, so that the
# lines of two processes on one pipe do not interleave
THREADS_AFTER = """import importlib, os, sys, threading
importlib.import_module(sys.argv[1]).main(sys.argv[2:])
native = len(os.listdir('/proc/self/task')) - len(threading.enumerate())
os.write(1, f'native threads left: {native}\\n'.encode())
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir('/proc'), reason='reads the threads from /proc')
def test_torchrun_two_processes_compiled_train_save_plain_weights_and_match_one(data_dir, train, tmp_path):
    """--compile=true under torchrun: torch.compile(DDP(model)), evaluation through it too. Two processes
    train and save weights without compile's or DDP's prefixes; a compiled resume in one process goes on from
    them; both land where one uncompiled process does with the same global batch, and its resume (up to
    inductor's rounding). And the two leave no gloo thread running into the interpreter's exit, where such
    threads can abort a finished run. The first compile takes about a minute."""
    one = tmp_path / 'one'
    two = tmp_path / 'two'
    worker = tmp_path / 'worker.py'
    worker.write_text(THREADS_AFTER)
    # 2 micro-steps each
    args = ('--max_iters=4', '--eval_interval=2', '--gradient_accumulation_steps=4')
    p = start(worker, ['train_gpt', *tiny(data_dir, two, *args, '--compile=true')], tmp_path,
              torchrun=2)
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, stdout[-2000:] + stderr[-2000:]
    # gloo's workers and loop are gone
    assert stdout.count('native threads left: 0\n') == 2, stdout[-1000:]
    train(one, *args)
    # plain keys, as the uncompiled run's (the resume loads them into the plain model)
    assert set(weights(two)['model']) == set(weights(one)['model'])
    resume(two, '--compile=true', '--max_iters=6')
    resume(one, '--max_iters=6')
    assert weights(two)['iter_num'] == 6
    same_losses(one, two, 1e-4)
    assert same_run(weights(one), weights(two)) < 0.01


def rank_pid(torchrun, rank):
    """The pid of a torchrun worker, read from its environment."""
    for pid in os.listdir('/proc'):
        try:
            if not pid.isdigit():
                continue
            with open(f'/proc/{pid}/stat') as f:
                if int(f.read().split(') ')[1].split()[1]) != torchrun:
                    continue
            with open(f'/proc/{pid}/environ', 'rb') as f:
                env = f.read().split(b'\0')
        except OSError:
            continue
        if f'RANK={rank}'.encode() in env:
            return int(pid)
    return None


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir('/proc'), reason='finds the worker through /proc')
@pytest.mark.parametrize('nproc, to_one_rank', [(3, True), (2, False)])
def test_torchrun_a_signal_stops_every_rank_at_the_same_step(data_dir, tmp_path, nproc, to_one_rank):
    """3 processes on the defaults (1 micro-step rounded up to 3), SIGTERM to rank 1 alone, as a scheduler
    might send it: the flag is all-reduced. 2 processes and Ctrl-C in a terminal, which signals torchrun and
    its workers, and torchrun forwards it again: two SIGINTs within milliseconds, one Ctrl-C, a save, not an
    abort. Every rank stops at the same step, rank 0 saves there once and prints the torchrun command that
    goes on. Then one process resumes it (another process count), and the log has each iteration once."""
    out = tmp_path / 'out'
    p = start('train_gpt.py', tiny(data_dir, out, '--max_iters=400', '--eval_interval=1000'), tmp_path,
              torchrun=nproc)
    wait_for(p, lambda: logged_iter(out) >= 3, 'iter 3', timeout=240)
    if to_one_rank:
        os.kill(rank_pid(p.pid, 1), signal.SIGTERM)
    else:
        os.killpg(p.pid, signal.SIGINT)
    stderr = p.communicate(timeout=240)[1]
    it = weights(out)['iter_num']
    # torchrun's exit code for its workers' 130
    assert 3 <= it < 400 and logged_iter(out) == it and p.returncode == 1, stderr[-3000:]
    assert stderr.count(f'{out}/ckpt.pt') == 1
    # every rank ended as rank 0 did, at that step: exit 130, none cut off by another's end
    if to_one_rank:
        assert set(re.findall(r'exitcode\s*: (-?\d+)', stderr)) == {'130'}, stderr[-3000:]
    assert resume_command(stderr)[:3] == ['torchrun', '--standalone', f'--nproc_per_node={nproc}']
    resume(out, '--device=cpu', f'--max_iters={it + 5}')
    assert [r['iter'] for r in read_log(out, kind='train')] == list(range(1, it + 6))


@pytest.mark.slow
@POSIX_ONLY
def test_torchrun_a_save_that_fails_on_rank_0_stops_every_rank_with_one_line(data_dir, tmp_path):
    out = tmp_path / 'out'
    p = start('train_gpt.py', tiny(data_dir, out, '--max_iters=40', '--eval_interval=20'), tmp_path,
              torchrun=2)
    # Once it trains (a folder there at the start is refused before any work): rank 0 cannot rename its file
    # onto a folder.
    wait_for(p, lambda: logged_iter(out) >= 1, 'a log row')
    (out / 'ckpt.pt' / 'x').mkdir(parents=True)
    stdout, stderr = p.communicate(timeout=240)
    # said once, by rank 0, with the option that gave the path; no rank's traceback
    assert p.returncode == 1 and stderr.count(f'{out}/ckpt.pt') == 1, stderr[-3000:]
    assert f'--out_dir={out}' in stderr
    assert '[rank' not in stderr


# a worker that runs train_gpt.py, where rank 1 alone fails: in its batch of iteration 2, as a damaged token
# file only it reads would (DDP's backward waits for it) or as its GPU alone runs out of memory, or with a bug
# in its share of the eval at iteration 0 (an all-reduce waits for it)
RANK_1_FAILS = """import importlib.util, os, sys
# the stand-in for train_gpt.py is taken for it: a script of the repository, which options ends in one line
sys.modules['__main__'].__file__ = importlib.util.find_spec('train_gpt').origin
import options, torch, train_gpt
real = train_gpt.window_starts
def starts(seed, stream, index, *rest):
    if (stream, index, os.environ['RANK']) == (0, 2, '1') and '--eval_interval=50' in sys.argv:
        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')
    if (stream, index, os.environ['RANK']) == (0, 2, '1'):
        raise options.UsageError('data/tiny/train.bin holds id 300', alone=True)
    if (stream, index, os.environ['RANK']) == (2, 1, '1') and '--eval_interval=1' in sys.argv:
        raise ValueError('a bug')
    return real(seed, stream, index, *rest)
train_gpt.window_starts = starts
train_gpt.main(sys.argv[1:])
"""


@pytest.mark.slow
@POSIX_ONLY
@pytest.mark.parametrize('eval_interval, said', [(100, 'error: data/tiny/train.bin'),
                                                  (50, 'error: out of memory'), (1, 'ValueError: a bug')])
def test_torchrun_a_process_that_fails_alone_is_the_one_that_says_why(data_dir, tmp_path, eval_interval,
                                                                      said):
    """Rank 0, whose collective the other's end cuts off, says so in one line and no traceback, and waits
    for torchrun to stop it: torchrun's report names rank 1 as the first failure."""
    worker = tmp_path / 'worker.py'
    worker.write_text(RANK_1_FAILS)
    args = tiny(data_dir, tmp_path / 'out', '--max_iters=4', f'--eval_interval={eval_interval}')
    p = start(worker, args, tmp_path, torchrun=2)
    stderr = p.communicate(timeout=240)[1]
    assert p.returncode == 1 and stderr.count(said) == 1, stderr[-3000:]
    assert stderr.count('another process of this run ended') == 1 and 'RuntimeError' not in stderr
    assert re.search(r'Root Cause.*?rank\s*: (\d)', stderr, re.S)[1] == '1', stderr[-3000:]


def test_no_gradient_sync_before_the_last_micro_step(train, tmp_path, monkeypatch):
    """Syncing every micro-step gives the same numbers, only slower, so count: a 1-process gloo group
    through the DDP path, 3 micro-steps per iteration, must skip the all-reduce on 2 of them."""
    torch.distributed.init_process_group('gloo', init_method=f'file://{tmp_path}/pg', rank=0, world_size=1)
    ddp = train_common.Dist(True, 0, 0, 1, True, 'cpu')
    monkeypatch.setattr(train_gpt, 'setup_distributed', lambda device: ddp)
    syncs = []
    real = train_common.DDP.forward

    def forward(self, *args, **kwargs):
        if self.training:
            syncs.append(self.require_backward_grad_sync)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(train_common.DDP, 'forward', forward)
    train(tmp_path / 'out', '--max_iters=2', '--gradient_accumulation_steps=3')
    assert syncs == [False, False, True] * 2
    assert not torch.distributed.is_initialized()  # main() left the process group


@pytest.mark.slow
def test_a_compiled_ddp_model_all_reduces_on_the_last_micro_step_only(train, tmp_path, monkeypatch):
    """torch.compile(DDP(model)), as the trainer builds it: no_sync() reaches DDP through the compiled
    wrapper, so 3 micro-steps all-reduce the gradients once an iteration (counted by a DDP comm hook, which
    DDP calls for each bucket it all-reduces; a tiny model fills one), and the run lands where the one without
    DDP does."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    torch.distributed.init_process_group('gloo', init_method=f'file://{tmp_path}/pg', rank=0, world_size=1)
    ddp = train_common.Dist(True, 0, 0, 1, True, 'cpu')
    monkeypatch.setattr(train_gpt, 'setup_distributed', lambda device: ddp)
    reduced = []

    class CountingDDP(train_common.DDP):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.register_comm_hook(None, self.counting_hook)

        def counting_hook(self, state, bucket):
            reduced.append(1)
            return allreduce_hook(state, bucket)
    monkeypatch.setattr(train_common, 'DDP', CountingDDP)
    args = ('--max_iters=2', '--eval_interval=100', '--gradient_accumulation_steps=3')
    train(tmp_path / 'ddp', *args, '--compile=true')
    assert len(reduced) == 2 and not torch.distributed.is_initialized()
    monkeypatch.undo()
    train(tmp_path / 'plain', *args)
    assert same_run(weights(tmp_path / 'plain'), weights(tmp_path / 'ddp')) < 0.01


def test_accumulation_rounded_up_to_the_processes_is_said(train, tmp_path, monkeypatch, capsys):
    """Rank 0 of 2 processes: --gradient_accumulation_steps=3 runs 4 micro-steps (2 each), and the 'tokens
    per iter' line says so; 4 is not rounded, and not said. So too a schedule that ends elsewhere than the
    run (the default lr_decay_iters, 1000)."""
    two = train_common.Dist(False, 0, 0, 2, True, 'cpu')
    monkeypatch.setattr(train_gpt, 'setup_distributed', lambda device: two)
    norms = []
    step = train_gpt.optimizer_step

    def norm_then_step(optimizer, *args):
        grads = [p.grad.flatten() for g in optimizer.param_groups for p in g['params'] if p.grad is not None]
        norms.append(torch.cat(grads).norm())
        return step(optimizer, *args)
    monkeypatch.setattr(train_gpt, 'optimizer_step', norm_then_step)
    monkeypatch.setattr(train_gpt, 'peak_flops', lambda device, dtype: 1e9)
    for steps, said, decay in ((3, True, 1000), (4, False, 1)):
        out = tmp_path / str(steps)
        train(out, '--max_iters=1', f'--gradient_accumulation_steps={steps}', f'--lr_decay_iters={decay}')
        printed = capsys.readouterr().out.splitlines()
        line = [s for s in printed if s.startswith('tokens per iter')][0]
        assert ('--gradient_accumulation_steps=3' in line) == said, line
        assert any('--lr_decay_iters' in s for s in printed) == said
        # one step of 4 micro-steps of 4 x 32 tokens
        assert weights(out)['tokens'] == 4 * 4 * 32
        row = read_log(out, kind='train')[0]
        flops = tost.GPT(tost.GPTConfig(**weights(out)['model_args'])).flops_per_token(32)
        assert row['mfu'] == pytest.approx(flops * row['tokens_per_sec'] / 2 / 1e9, rel=1e-9)
    # Rank 0's 2 micro-steps of the rounded 4 read rows 0-7 of the step's 16: its gradient is their mean's, as
    # one process's batch of those 8 rows (the same first draws) gives.
    one = train_common.Dist(False, 0, 0, 1, True, 'cpu')
    monkeypatch.setattr(train_gpt, 'setup_distributed', lambda device: one)
    train(tmp_path / 'one', '--max_iters=1', '--batch_size=8')
    assert norms[-1].item() == pytest.approx(norms[0].item(), rel=1e-5)


def test_the_second_process_trains_on_the_rows_after_the_firsts(train, tmp_path, monkeypatch):
    """Rank 1 of 2, 4 micro-steps of 4 rows a step: it reads rows 8-15 of the 16 the step draws, and seeds
    the dropout of global micro-steps 2 and 3, not rank 0's."""
    second = train_common.Dist(False, 1, 1, 2, False, 'cpu')
    monkeypatch.setattr(train_gpt, 'setup_distributed', lambda device: second)
    seeds = []
    seed = torch.manual_seed
    monkeypatch.setattr(torch, 'manual_seed', lambda s: seeds.append(s) or seed(s))
    drawn = []
    starts = train_gpt.window_starts

    def window_starts(seed, stream, *args):
        assert seed == 5
        drawn.append((stream, starts(seed, stream, *args)))
        return drawn[-1][1]
    monkeypatch.setattr(train_gpt, 'window_starts', window_starts)
    reads = []
    read = train_gpt.read_batch
    monkeypatch.setattr(train_gpt, 'read_batch', lambda path, split, rows, *a: reads.append(list(rows)) or
                        read(path, split, rows, *a))
    train(tmp_path / 'out', '--max_iters=1', '--gradient_accumulation_steps=4', '--eval_interval=100',
          '--seed=5')
    step = [rows for stream, rows in drawn if stream == 0][0].tolist()
    # rank 1 writes nothing: the log, the checkpoint and the figure are rank 0's
    assert os.listdir(tmp_path / 'out') == []
    assert [rows for rows in reads if rows in (step[:4], step[4:8], step[8:12], step[12:])] == [step[8:12],
                                                                                               step[12:]]
    assert seeds == [5, train_common.seed_of(5, 0, 2), train_common.seed_of(5, 0, 3)]


def test_each_process_evaluates_its_own_share_of_the_eval_batches(tmp_path, monkeypatch):
    """Rank 1 of 2, eval_iters 5: it draws estimates 1 and 3 of each split, in eval mode, and the mean is over
    all 5 (the other process's sum comes from the all-reduce); the model is back in training mode after."""
    for split in ('train', 'val'):
        np.arange(300, dtype=np.uint16).tofile(tmp_path / f'{split}.bin')
    drawn = []
    real = train_gpt.window_starts

    def window_starts(seed, stream, k, *rest):
        drawn.append((stream, k))
        return real(seed, stream, k, *rest)
    monkeypatch.setattr(train_gpt, 'window_starts', window_starts)
    # the other process's sum of its losses: 10
    monkeypatch.setattr(torch.distributed, 'all_reduce', lambda t: t.add_(10.0))
    modes = []

    class Model(torch.nn.Module):
        def forward(self, X, Y):
            modes.append(self.training)
            return None, torch.tensor(1.0)
    model = Model()
    cfg = dict(seed=0, eval_iters=5, batch_size=2, block_size=8)
    rank1 = train_common.Dist(True, 1, 1, 2, False, 'cpu')
    out = train_gpt.estimate_loss(model, str(tmp_path), dict(vocab_size=300), dict(train=300, val=300), cfg,
                                  contextlib.nullcontext(), rank1)
    assert drawn == [(1, 1), (1, 3), (2, 1), (2, 3)]
    assert out == dict(train=12 / 5, val=12 / 5)
    assert modes == [False] * 4 and model.training


def test_every_window_of_a_split_can_be_drawn_and_none_runs_past_its_end():
    """A window is block_size tokens and its targets one more: 33 tokens hold one window of 32, 35 three."""
    assert set(train_gpt.window_starts(0, 0, 0, 200, 33, 32).tolist()) == {0}
    assert set(train_gpt.window_starts(0, 0, 0, 200, 35, 32).tolist()) == {0, 1, 2}


def test_a_save_between_two_rows_leaves_the_next_rows_mean_as_it_was(train, tmp_path, monkeypatch):
    """The losses since the last row are saved all-reduced from a copy: in place, the next row would count
    those before the save twice. Two processes with equal losses, faked in one: each train row is what one
    process gives."""
    def all_reduce(t, op=torch.distributed.ReduceOp.SUM, group=None):
        if op == torch.distributed.ReduceOp.SUM:
            t.mul_(2)
    args = ('--max_iters=4', '--eval_interval=1', '--log_interval=2')
    alone = train_common.Dist(False, 0, 0, 1, True, 'cpu')
    monkeypatch.setattr(train_gpt, 'setup_distributed', lambda device: alone)
    train(tmp_path / 'alone', *args)
    # rank 0 of 2: the same rows and dropout seeds as one process, its losses summed with the other's
    monkeypatch.setattr(train_gpt, 'setup_distributed', lambda device: alone._replace(ddp=True, world_size=2))
    monkeypatch.setattr(train_gpt, 'wrap', lambda model, dist, compile: model)
    monkeypatch.setattr(torch.distributed, 'all_reduce', all_reduce)
    train(tmp_path / 'two', *args, '--gradient_accumulation_steps=2')
    rows = [[r['train_loss'] for r in read_log(tmp_path / run, kind='train')] for run in ('alone', 'two')]
    assert rows[1] == pytest.approx(rows[0], rel=1e-6)


def test_the_vocabulary_is_rounded_up_to_a_multiple_of_64(train, tmp_path, monkeypatch):
    """GPT-2's 50257 ids are 50304 rows of the embedding; a byte set's 256 are already a multiple."""
    real = train_gpt.readers.load_meta
    monkeypatch.setattr(train_gpt.readers, 'load_meta', lambda *a: dict(real(*a), vocab_size=257))
    train(tmp_path, '--max_iters=1')
    assert weights(tmp_path)['model_args']['vocab_size'] == 320


def test_a_resume_may_train_on_shorter_windows(train, tmp_path):
    """Only a context longer than the position table is refused on resume: the model keeps its 32."""
    train(tmp_path, '--max_iters=2', '--eval_interval=2')
    resume(tmp_path, '--max_iters=3', '--block_size=16')
    ckpt = weights(tmp_path)
    assert ckpt['iter_num'] == 3 and ckpt['model_args']['block_size'] == 32
    assert ckpt['config']['block_size'] == 16


def test_every_rank_waits_at_the_same_barrier_whoever_prepares_the_data(tmp_path, monkeypatch):
    """A dataset prepared on the fly: local rank 0 prepares it while the others wait at a barrier. Every rank
    must call the same collectives, whether meta.json was there when it looked or not (a rank that skipped the
    barrier would pair its next collective with the others' barrier): here rank 0 finds nothing and prepares,
    rank 1 of the same node finds it written, and rank 2 (local rank 0 of another node, with a folder of its
    own) prepares its own."""
    corpus = tmp_path / 'in.txt'
    corpus.write_text('some text to prepare, ' * 200)
    real = prepare_data.prepare
    monkeypatch.setattr(prepare_data, 'prepare', lambda name, data_dir: real('text', data_dir=data_dir,
                                                                             input=str(corpus), name=name))
    calls = []
    for name in ('barrier', 'all_reduce', 'broadcast', 'all_gather', 'all_gather_object',
                 'broadcast_object_list'):
        monkeypatch.setattr(torch.distributed, name, lambda *a, name=name, **k: calls[-1].append(name))
    cfg = dict(train_gpt.DEFAULTS, dataset='python_stdlib', block_size=8)
    for rank, local_rank, node in ((0, 0, 'data'), (1, 1, 'data'), (2, 0, 'node2')):
        calls.append([])
        dist = train_common.Dist(True, rank, local_rank, 3, rank == 0, 'cpu')
        assert train_gpt.open_dataset(dict(cfg, data_dir=str(tmp_path / node)), dist)[2]['train'] > 8
    for node in ('data', 'node2'):
        assert os.path.isfile(tmp_path / node / 'python_stdlib' / 'meta.json')
    assert calls[0] == calls[1] == calls[2] == ['barrier']


def test_the_training_step_lets_the_logits_go_before_the_backward(train, tmp_path, monkeypatch):
    """The logits (batch x block x vocab: 1.2 GB in bf16 at owt-base) are not needed by the backward; the
    loss's log-softmax keeps what it needs. Nothing may hold them then: no name in the step, no tensor
    autograd saved (a saved tensor, or a view of it, keeps it alive). A weak reference to them is dead when
    the backward starts."""
    real, alive = tost.GPT.forward, []

    def forward(self, idx, targets=None):
        logits, loss = real(self, idx, targets)
        if loss is not None and loss.requires_grad:          # a training step, not an evaluation
            ref = weakref.ref(logits)
            loss.register_hook(lambda grad: alive.append(ref() is not None))   # runs as the backward starts
        return logits, loss
    monkeypatch.setattr(tost.GPT, 'forward', forward)
    for dtype in ('float32', 'bfloat16'):
        train(tmp_path / dtype, '--max_iters=2', '--eval_interval=100', '--gradient_accumulation_steps=2',
              f'--dtype={dtype}')
    assert alive == [False] * 8


# -----------------------------------------------------------------------------
# the GPU paths, run on CPU at tiny size


@pytest.mark.parametrize('dtype', ['bfloat16', 'float16'])
def test_mixed_precision_runs_on_cpu(train, four, tmp_path, dtype, monkeypatch):
    """bf16 autocast, and fp16 with the GradScaler (its state is saved and resumed), as on a GPU."""
    out = tmp_path / dtype
    # every forward's logits, training's and evaluation's, come out in the dtype asked for: autocast is on
    computed = []
    real = tost.GPT.forward

    def forward(self, *args):
        logits, loss = real(self, *args)
        computed.append(logits.dtype)
        return logits, loss
    monkeypatch.setattr(tost.GPT, 'forward', forward)
    train(out, '--max_iters=4', '--eval_interval=2', f'--dtype={dtype}')
    assert set(computed) == {getattr(torch, dtype)}
    scaler = weights(out)['scaler']
    # fp16: loss scaling on; bf16 needs none
    assert ('scale' in scaler) == (dtype == 'float16')
    if dtype == 'float16':
        assert 0 < scaler['scale'] <= 2.0 ** 16
    # mixed precision, the same run: close losses
    same_losses(out, four, 0.05)
    # the dtype is this machine's choice
    resume(out, '--max_iters=6', '--dtype=float32')
    assert weights(out)['iter_num'] == 6 and weights(out)['config']['dtype'] == 'float32'


def test_fused_adamw_trains_like_foreach(train, four, tmp_path, monkeypatch):
    """tost's optimizer is torch's fused AdamW on cuda and cpu; the same run with the multi-tensor (foreach)
    AdamW, what other devices get, must land where the fused one does."""
    ref = tmp_path / 'foreach'
    real = tost.GPT.configure_optimizers

    def as_on_mps(self, wd, lr, betas, device_type):
        return real(self, wd, lr, betas, 'mps')
    monkeypatch.setattr(tost.GPT, 'configure_optimizers', as_on_mps)
    train(ref, '--max_iters=4', '--eval_interval=2')
    assert all(g['fused'] for g in weights(four)['optimizer']['param_groups'])
    assert not any(g['fused'] for g in weights(ref)['optimizer']['param_groups'])
    assert same_run(weights(ref), weights(four)) < 0.01
    same_losses(ref, four, 1e-5)


def test_mfu_is_shown_and_agrees_with_tokens_per_second(train, tmp_path, monkeypatch, capsys):
    """No MFU on a CPU (no known peak); given a peak, the row shows it, and it is the model's FLOPs per token
    times the measured tokens/s over the peak."""
    monkeypatch.setattr(train_gpt, 'peak_flops', lambda device, dtype: 1e9 if dtype == 'float32' else None)
    # a clock that a step moves on by 0.1 s, and nothing else: each row's time is exact
    clock = [0.0]
    monkeypatch.setattr(train_gpt, 'time', types.SimpleNamespace(time=lambda: clock[0]))
    real = train_gpt.optimizer_step
    monkeypatch.setattr(train_gpt, 'optimizer_step', lambda *a: clock.append(clock.pop() + 0.1) or real(*a))
    out = tmp_path / 'out'
    train(out, '--max_iters=4', '--eval_interval=100', '--gradient_accumulation_steps=2', '--log_interval=2')
    assert 'mfu ' in capsys.readouterr().out
    model = tost.GPT(tost.GPTConfig(**weights(out)['model_args']))
    rows = read_log(out, kind='train')
    assert [r['ms_per_iter'] for r in rows] == pytest.approx([100, 100])
    for r in rows:
        assert r['mfu'] == pytest.approx(model.flops_per_token(32) * r['tokens_per_sec'] / 1e9, rel=1e-9)
        assert r['tokens_per_sec'] == pytest.approx(2 * 4 * 32 / (r['ms_per_iter'] / 1000), rel=1e-9)


# what torch.cuda.get_device_name() returns on each, and the dense bfloat16 peak (None: no MFU)
GPU_NAMES = [('NVIDIA H100 80GB HBM3', 989e12), ('NVIDIA H100 PCIe', 756e12), ('NVIDIA H100 NVL', 835e12),
             ('NVIDIA H200', 989e12), ('NVIDIA GH200 480GB', 989e12), ('NVIDIA A100-SXM4-80GB', 312e12),
             ('NVIDIA A100 80GB PCIe', 312e12), ('NVIDIA L40S', 362e12), ('NVIDIA L40', 181e12),
             ('NVIDIA L4', 121e12), ('NVIDIA A10', 125e12), ('NVIDIA A10G', None),
             ('NVIDIA GeForce RTX 4090', 165e12), ('NVIDIA GeForce RTX 3090', None), ('Tesla T4', None)]


@pytest.mark.parametrize('name, bf16', GPU_NAMES)
def test_peak_flops_by_the_whole_gpu_name(monkeypatch, name, bf16):
    """The whole name decides: 'NVIDIA L40' is not an L4, nor 'H100 PCIe' an SXM. float32 runs as TF32 at
    half the 16-bit rate from Ampere on."""
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None: name)
    peaks = [train_gpt.peak_flops('cuda:0', dtype) for dtype in ('bfloat16', 'float16', 'float32')]
    assert peaks == [bf16, bf16, bf16 and bf16 / 2]
    assert train_gpt.peak_flops('cpu', 'float32') is None


def test_a_row_holds_the_mean_loss_since_the_last_row_and_the_time_without_eval(train, four, tmp_path,
                                                                                monkeypatch):
    pairs = tmp_path / 'pairs'
    real = train_gpt.window_starts

    # an eval batch: 4 of them at iter 2, 0.4 s in all
    def slow_eval(seed, stream, *rest):
        if stream > 0:
            time.sleep(0.1)
        return real(seed, stream, *rest)

    monkeypatch.setattr(train_gpt, 'window_starts', slow_eval)
    train(pairs, '--max_iters=3', '--eval_interval=2', '--log_interval=2')
    one = {r['iter']: r['train_loss'] for r in read_log(four, kind='train')}
    rows = read_log(pairs, kind='train')
    assert [r['iter'] for r in rows] == [2, 3]
    assert rows[0]['train_loss'] == pytest.approx((one[1] + one[2]) / 2, abs=1e-6)
    assert rows[1]['train_loss'] == pytest.approx(one[3], abs=1e-6)
    # iter 3, after the 0.4 s eval at 2: the eval is not counted
    assert rows[1]['ms_per_iter'] < 150, rows[1]


SYNCS = ('item', 'tolist', '__float__', '__int__', '__bool__', 'cpu', 'numpy')


def count_syncs(monkeypatch, files):
    """Count the tensor reads (a host-device sync on a GPU) made by code in `files`."""
    calls = []
    for name in SYNCS:
        real = getattr(torch.Tensor, name)

        def wrapper(self, *a, _real=real, **k):
            if os.path.basename(sys._getframe(1).f_code.co_filename) in files:
                calls.append(1)
            return _real(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, wrapper)
    return calls


def test_the_training_step_does_not_wait_for_the_device(train, tmp_path, monkeypatch):
    """As nanoGPT: the loss is read only for a log row. 10 more iterations with one more row: one more
    read."""
    calls = count_syncs(monkeypatch, {'train_gpt.py', 'tost.py', 'train_common.py'})
    counts = []
    for n in (10, 20):
        calls.clear()
        train(tmp_path / str(n), f'--max_iters={n}', '--eval_interval=1000', '--log_interval=10')
        counts.append(len(calls))
    assert counts[1] - counts[0] == 1, counts


# -----------------------------------------------------------------------------
# bad input: one line, exit 2, before any work, nothing lost


@pytest.fixture(scope='module')
def broken(data_dir, tmp_path_factory):
    """What a user may point a run at: an out_dir whose ckpt.pt is not a checkpoint, one with a vision
    checkpoint, a file, data whose train.bin was cut short after it was written, data of another tokenizer,
    data whose ids are all 256 (the vocab's size: one past its last id), a test set (no train tokens). (A
    meta.json no dataset can have is the reader's to refuse, whoever reads it: test_prepare_data.)"""
    d = tmp_path_factory.mktemp('broken')
    (d / 'garbage').mkdir()
    (d / 'garbage' / 'ckpt.pt').write_bytes(b'not a checkpoint at all')
    (d / 'vit').mkdir()
    vit = {'kind': 'vit', 'model': {}, 'model_args': {'img_size': 32}, 'meta': {'kind': 'images'}}
    torch.save(vit, str(d / 'vit' / 'ckpt.pt'))
    (d / 'file').write_text('a file')
    for name in ('cut', 'other', 'noise', 'testset'):
        shutil.copytree(os.path.join(data_dir, 'tiny'), d / name / 'tiny')
    os.truncate(d / 'cut' / 'tiny' / 'train.bin', 1000)
    meta = json.loads((d / 'other' / 'tiny' / 'meta.json').read_text())
    for name, edit in (('other', dict(tokenizer='gpt2', vocab_size=257)), ('testset', dict(train_tokens=0))):
        (d / name / 'tiny' / 'meta.json').write_text(json.dumps(dict(meta, **edit)))
    (d / 'testset' / 'tiny' / 'train.bin').write_bytes(b'')
    for split in ('train', 'val'):
        path = d / 'noise' / 'tiny' / f'{split}.bin'
        path.write_bytes(b'\x00\x01' * (path.stat().st_size // 2))
    return str(d)


# (the arguments, what the one line names); {data}, {out}, {broken}, {trained} stand for the tiny data, a
# folder that does not exist yet, the fixture above and the trained run, which a resume must leave as it was;
# {val} for the tiny data's val tokens
TINY = tiny('{data}', '{out}')
RESUME = ['--init_from=resume', '--out_dir={trained}', '--data_dir={data}']
MISTAKES = [
    (['--max_iters=0'], ['--max_iters', '0']),
    (['--attn=no-such-attn'], ['no-such-attn', 'tssa', 'softmax']),
    (['--dtype=bf16'], ['--dtype', 'bf16', 'bfloat16']),
    (['--out_dir='], ['--out_dir']),
    (['--out_dir= '], ['--out_dir', "' '"]),                          # blanks shown as typed
    (['--learning_rate=-1'], ['--learning_rate', '-1']),
    (['--dropout=1'], ['--dropout', '1']),
    # a floor above the peak (1 is a constant rate)
    (['--min_lr_ratio=1.01'], ['--min_lr_ratio', '1.01']),
    # AdamW's rule
    (['--beta2=1'], ['--beta2', '1']),
    # a decay that would erase the weights in a step (0.5 x 2: exactly)
    (TINY + ['--learning_rate=0.5', '--weight_decay=2'], ['--weight_decay']),
    # a cosine that would end before the warmup does, by one iteration
    (['--warmup_iters=10', '--lr_decay_iters=9', '--max_iters=12'],
     ['--lr_decay_iters=9', '--warmup_iters=10']),
    # tost.GPTConfig's own checks (test_softmax_layers_mistakes), before any work; a list, and not a number
    (['--softmax_layers=0,7'], ['softmax_layers', '7']),
    (['--softmax_layers=last'], ['--softmax_layers', 'last']),
    (TINY + ['--init_from=resume'], ['{out}/ckpt.pt']),
    # a window and its target need block_size + 1 tokens
    (TINY + ['--block_size={val}'], ['--block_size', '{val}']),
    # a file for --data_dir: the dataset made here (the default) and one prepared before
    (['--data_dir={repo}/README.md', '--out_dir={out}'], ['{repo}/README.md', '--data_dir']),
    (tiny('{repo}/README.md', '{out}'), ['{repo}/README.md', '--data_dir']),
    (tiny('{data}', '{broken}/file'), ['{broken}/file', '--out_dir={broken}/file']),
    (tiny('{data}', '{broken}/garbage', '--init_from=resume'), ['{broken}/garbage/ckpt.pt']),
    (tiny('{data}', '{broken}/vit', '--init_from=resume'), ['{broken}/vit/ckpt.pt', 'train_vit.py']),
    (tiny('{broken}/cut', '{out}'), ['{broken}/cut/tiny/train.bin', '--force']),
    # a test set (eval_gpt.py's) has nothing to train on
    (tiny('{broken}/testset', '{out}'), ['{broken}/testset/tiny', 'eval_gpt.py']),
    # a typo of a dataset's name or a preset's, one letter off a short one
    (['--dataset=shakespear', '--out_dir={out}'], ['data/shakespear', 'shakespeare?']),
    (['--config=demp'], ['demo?']),
    # a dataset that takes hours to prepare: its command
    (['--dataset=openwebtext', '--out_dir={out}'], ['python prepare_data.py openwebtext --data_dir=data']),
    # a resume: the model's shape and its tokenizer are the checkpoint's
    (RESUME + ['--block_size=33'], ['block_size=33', '32']),
    (RESUME + ['--n_layer=2'], ['--n_layer=2']),
    # a preset's shape, which the command did not type key by key
    (RESUME + ['--config=shakespeare'], ['--n_layer=6', '--config=shakespeare']),
    (RESUME + ['--softmax_layers=0'], ['--softmax_layers=0']),
    # not silently one of them
    (RESUME + ['--overwrite=true'], ['--init_from=resume', '--overwrite']),
    # a new run from a checkpoint's weights: a name mistyped, its own folder, another shape
    (['--init_from=resum'], ['--init_from=resum', 'resume?']),
    (['--init_from='], ['--init_from']),
    (['--init_from=gpt2-xl'], ['--init_from=gpt2-xl', 'GPT-2']),
    # its tokenizer, as a resume's
    (tiny('{broken}/other', '{out}', '--init_from={trained}/ckpt.pt'),
     ['gpt2', 'bytes', '--tokenizer=bytes']),
    (tiny('{data}', '{out}', '--init_from={trained}'), ['--init_from={trained}/ckpt.pt']),
    (tiny('{data}', '{trained}', '--init_from={trained}/ckpt.pt', '--overwrite=true'),
     ['--init_from={trained}/ckpt.pt', '--out_dir']),
    (tiny('{data}', '{out}', '--init_from={trained}/ckpt.pt', '--n_embd=64'), ['--n_embd=64', '32']),
    (tiny('{broken}/other', '{trained}', '--init_from=resume', '--max_iters=20'),
     ['gpt2', 'bytes', '--tokenizer=bytes'])]


@pytest.mark.parametrize('args, names', MISTAKES)
def test_a_mistake_is_one_line_naming_it_before_any_work(data_dir, trained, broken, tmp_path, monkeypatch,
                                                         fails, args, names):
    # where the default data/ and out/ would go
    monkeypatch.chdir(tmp_path)
    val = json.loads(Path(data_dir, 'tiny', 'meta.json').read_text())['val_tokens']
    paths = dict(data=data_dir, out=tmp_path / 'out', broken=broken, trained=trained[0], repo=REPO, val=val)
    before = [Path(trained[0], f).read_bytes() for f in ('ckpt.pt', 'log.jsonl')]
    fails(train_gpt.main, [a.format(**paths) for a in args], *[n.format(**paths) for n in names])
    assert os.listdir(tmp_path) == []
    assert [Path(trained[0], f).read_bytes() for f in ('ckpt.pt', 'log.jsonl')] == before


def test_ids_past_the_vocab_are_one_line_and_what_is_left_needs_no_overwrite(train, broken, tmp_path, fails):
    """Token files of ids past the vocab: the first batch read names the file (not an IndexError from inside
    the model; a scan of the whole file at each start would take minutes on OpenWebText). The out_dir the run
    leaves (a log, no checkpoint) does not stand in the way of the next run."""
    out = tmp_path / 'out'
    fails(train_gpt.main, tiny(f'{broken}/noise', out, '--max_iters=1'), f'{broken}/noise/tiny/train.bin',
          '--force')
    assert 'ckpt.pt' not in os.listdir(out)
    train(out, '--max_iters=1')


def test_out_of_memory_on_first_step(data_dir, tmp_path, monkeypatch, fails):
    """A GPU's; a CPU's (its allocator's RuntimeError): test_out_of_memory_advises_a_smaller_batch_...."""
    def oom(self, idx, targets=None):
        if self.training:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real(self, idx, targets)

    real = tost.GPT.forward
    monkeypatch.setattr(tost.GPT, 'forward', oom)
    # half the micro-batch, twice the micro-steps: the same step
    fails(train_gpt.main, tiny(data_dir, tmp_path, '--max_iters=3'), '--batch_size=2',
          '--gradient_accumulation_steps=2')


def test_a_run_that_saved_nothing_does_not_say_how_to_sample_from_it(train, tmp_path, monkeypatch, capsys):
    """Only the best model is saved (the shakespeare preset), and no evaluation beat iter 0's: no checkpoint,
    and no command to sample from one."""
    monkeypatch.setattr(train_gpt, 'estimate_loss', lambda *a: {'train': 2.0, 'val': 2.0})
    train(tmp_path, '--max_iters=4', '--eval_interval=2', '--always_save_checkpoint=false')
    assert not os.path.exists(tmp_path / 'ckpt.pt')
    assert 'sample.py' not in capsys.readouterr().out


@pytest.mark.parametrize('in_training, saved, bad',
                         [(True, 2, 'nan'), (False, None, 'nan'), (True, 2, 'inf')])
def test_a_nan_loss_stops_and_keeps_the_last_good_checkpoint(data_dir, tmp_path, monkeypatch, fails,
                                                             in_training, saved, bad):
    """A NaN training loss from iter 4 on: exit 3, the checkpoint of iter 2 kept and named. A NaN eval loss
    stops at iter 0, before anything is saved. An infinite loss with finite gradients (a step float16's
    scaler skips) at iter 4, between rows: the eval there saves nothing, so the checkpoint named resumes."""
    out = tmp_path / 'out'
    real = tost.GPT.forward
    steps = []

    def nan(self, idx, targets=None):
        logits, loss = real(self, idx, targets)
        # The memory estimate's probes are two and three sequences: not steps.
        if self.training and len(idx) > 3:
            steps.append(1)
        if self.training == in_training and (len(steps) > 3 or not in_training):
            loss = loss * float('nan') if bad == 'nan' else loss + (float('inf') - loss).detach()
        return logits, loss

    monkeypatch.setattr(tost.GPT, 'forward', nan)
    names = [f'{out}/ckpt.pt (iter {saved})', '--learning_rate'] if saved else []
    args = tiny(data_dir, out, '--max_iters=6', '--eval_interval=2', '--log_interval=3')
    fails(train_gpt.main, args, *names, code=3)
    if saved:
        ckpt = weights(out)
        assert ckpt['iter_num'] == saved and all(torch.isfinite(v).all() for v in ckpt['model'].values())
    else:
        assert not os.path.exists(os.path.join(out, 'ckpt.pt'))


def test_a_stop_once_the_loss_is_infinite_saves_nothing(data_dir, tmp_path, monkeypatch, capsys):
    """An infinite loss from iter 3 on (finite gradients: a step float16's scaler skips), no row to see it, a
    Ctrl-C at iter 5: exit 130, and the checkpoint of iter 2 is not replaced by the diverged model."""
    real = tost.GPT.forward
    steps = []

    def forward(self, idx, targets=None):
        logits, loss = real(self, idx, targets)
        # The memory estimate's probes are two and three sequences: not steps.
        steps.extend([1] if self.training and len(idx) > 3 else [])
        if self.training and len(steps) > 3:
            loss = loss + (float('inf') - loss).detach()
        return logits, loss
    monkeypatch.setattr(tost.GPT, 'forward', forward)
    at_iter(monkeypatch, 5, sigint)
    out = tmp_path / 'out'
    with pytest.raises(SystemExit) as e:
        train_gpt.main(tiny(data_dir, out, '--max_iters=8', '--eval_interval=2', '--log_interval=10'))
    assert e.value.code == 130 and weights(out)['iter_num'] == 2
    assert '--init_from=resume' not in capsys.readouterr().err


def test_a_train_loss_estimate_that_is_not_finite_stops_the_run(data_dir, tmp_path, monkeypatch, fails):
    """Only the train split's estimate is NaN: exit 3, in one line that says nan."""
    monkeypatch.setattr(train_gpt, 'estimate_loss', lambda *a: {'train': float('nan'), 'val': 1.0})
    assert 'nan' in fails(train_gpt.main, tiny(data_dir, tmp_path, '--max_iters=2'), code=3)


def test_the_hybrid_is_kept_and_a_resume_is_checked_against_the_checkpoint(train, tmp_path, monkeypatch):
    """softmax_layers and token_shift are keys of the checkpoint (weights_only reads the list). Block 4 of 5,
    the last, is no block of the default 4: a resume that names it again is fine. A resume lets go of the
    checkpoint's weights once they are in the model (on a GPU they would hold its memory twice), and the
    cosine's floor follows its learning rate: any positive one goes."""
    out = tmp_path
    train(out, '--max_iters=2', '--eval_interval=2', '--n_layer=5', '--softmax_layers=-1',
          '--token_shift=true')
    # The weights are those of model_args' model (sample.py loads them at the end; what such a model holds:
    # test_tost).
    ckpt = weights(out)
    assert ckpt['model_args']['softmax_layers'] == [4] and ckpt['config']['softmax_layers'] == '-1'
    assert ckpt['model_args']['token_shift'] is True
    with open(os.path.join(out, 'log.jsonl')) as f:
        config = json.loads(f.readline())
    assert config['kind'] == 'config' and config['softmax_layers'] == [4]
    assert plot.model_name(config) == 'hybrid + shift'
    loaded = []

    def load(*a, **k):
        loaded.append(train_common.load_checkpoint(*a, **k))
        return loaded[-1]
    monkeypatch.setattr(train_gpt, 'load_checkpoint', load)
    resume(out, '--max_iters=3', '--softmax_layers=4')
    assert len(loaded) == 1 and 'optimizer' in loaded[0] and 'model' not in loaded[0]
    ckpt = weights(out)
    assert ckpt['iter_num'] == 3 and ckpt['model_args']['softmax_layers'] == [4]
    assert ckpt['model_args']['token_shift'] is True
    # --dropout is the run's to change (fine-tuning), not the shape's
    resume(out, '--max_iters=4', '--learning_rate=1e-5', '--dropout=0.1')
    assert 0 < read_log(out, kind='train')[-1]['lr'] <= 1e-5 and weights(out)['model_args']['dropout'] == 0.1
    sample.main([f'--out_dir={out}', '--start=def', '--num_samples=1', '--max_new_tokens=5', '--device=cpu'])


def test_a_resume_takes_the_run_from_its_checkpoint_and_the_machine_from_this_command():
    """A run moved to another machine: its schedule and batch as saved, what this command sets as set, and
    device, compile and out_dir this machine's (defaults, unless given), not the checkpoint's."""
    old = dict(train_gpt.DEFAULTS, device='cuda:1', compile=True, out_dir='there', max_iters=50, batch_size=3,
               overwrite=True)
    # an older run's: no min_lr_ratio in its config, no token_shift in its model
    del old['min_lr_ratio']
    ckpt = dict(model_args=dict(block_size=256, vocab_size=256), config=old)
    cfg = dict(train_gpt.DEFAULTS, init_from='resume', out_dir='here', batch_size=5, min_lr_ratio=0.2)
    got = train_gpt.resume_config(cfg, {'init_from', 'out_dir', 'batch_size', 'token_shift'}, ckpt)
    assert [got[k] for k in ('device', 'compile', 'out_dir', 'max_iters', 'batch_size')] == [
        train_gpt.DEFAULTS['device'], train_gpt.DEFAULTS['compile'], 'here', 50, 5]
    assert (got['min_lr_ratio'], got['overwrite']) == (0.2, False)


def test_resume_with_nothing_to_do_says_so_and_time_carries_on(train, tmp_path, capsys):
    out = tmp_path / 'out'
    train(out, '--max_iters=4', '--eval_interval=2')
    before = Path(out, 'log.jsonl').read_text()
    capsys.readouterr()
    # the checkpoint's own iter: nothing left
    resume(out, '--max_iters=4', '--device=cpu')
    # one line, naming the checkpoint and the option that would train on
    printed = capsys.readouterr().out.strip()
    assert '\n' not in printed and f'{out}/ckpt.pt' in printed and '--max_iters' in printed
    assert Path(out, 'log.jsonl').read_text() == before and weights(out)['iter_num'] == 4
    # a gap the resumed clock must not count
    time.sleep(0.5)
    saved = weights(out)['elapsed_s']
    # the checkpoint's clock is the run's, past the rows written before it
    assert saved >= max(r['elapsed_s'] for r in read_log(out))
    t0 = time.time()
    resume(out, '--max_iters=6', '--device=cpu', '--batch_size=2')
    wall = time.time() - t0
    rows = read_log(out)
    assert [r['iter'] for r in rows if r['kind'] == 'train'] == [1, 2, 3, 4, 5, 6]
    # it goes on from the checkpoint's, by no more than the resumed call took
    later = [r['elapsed_s'] for r in rows if r['iter'] > 4]
    assert saved <= min(later) and max(later) <= saved + wall + 0.01
    # 4 iterations of 4 x 32 tokens, then 2 of 2 x 32
    assert rows[-1]['tokens'] == weights(out)['tokens'] == (4 * 4 + 2 * 2) * 32


@pytest.mark.slow
def test_the_demo_starts_as_the_reference_run_did(tmp_path):
    """The demo's first 30 iterations give docs/demo-log.jsonl's losses: to 0.005 on a corpus of the
    reference's size (this Python's standard library), to 0.1 on another Python's library."""
    out_dir = tmp_path / 'out'
    train_gpt.main([f'--data_dir={tmp_path}', f'--out_dir={out_dir}', '--max_iters=30'])
    with open(os.path.join(REPO, 'docs', 'demo-log.jsonl')) as f:
        reference = {(r['kind'], r['iter']): r for r in map(json.loads, f) if r.get('iter', 99) <= 30}
    got = {(r['kind'], r['iter']): r for r in read_log(out_dir)}
    with open(tmp_path / 'python_stdlib' / 'meta.json') as f:
        tolerance = 0.005 if json.load(f)['train_tokens'] == 10_907_115 else 0.1
    keys = [('eval', 0, 'val_loss'), ('eval', 0, 'train_loss')]
    for kind, it, loss in keys + [('train', i, 'train_loss') for i in (10, 20, 30)]:
        assert abs(got[kind, it][loss] - reference[kind, it][loss]) < tolerance, (kind, it, loss)


def test_a_micro_step_larger_than_the_memory_is_refused(data_dir, train, tmp_path, monkeypatch, capsys,
                                                        fails):
    """Before the first step: on a machine said to hold less than the model's weights, gradients and AdamW's
    moments (40B parameters, 640 GB, on 100 GB), one line names the options that shrink the model, at once
    (building it would take 160 GB); than those and the backward's estimate together, the options that shrink
    a micro-step; the folder's checkpoint is kept (with --overwrite too); on one that holds more, the run goes
    on."""
    out = tmp_path / 'out'
    train(out, '--max_iters=1')
    before = (out / 'ckpt.pt').read_bytes()
    monkeypatch.setattr(train_gpt, 'memory_bytes', lambda device: 10**11)
    # Refused before --overwrite deletes anything.
    args = tiny(data_dir, out, '--max_iters=2', '--overwrite=true')

    # Counted on the meta device, never built: a check that let it through would fail here, not take 160 GB.
    class Counted(tost.GPT):
        def __init__(self, config):
            assert torch.empty(0).is_meta, 'the 40B model was built'
            super().__init__(config)
    with monkeypatch.context() as m:
        m.setattr(tost, 'GPT', Counted)
        fails(train_gpt.main, args + ['--n_layer=200', '--n_embd=4096', '--n_head=32'], '--n_layer',
              '--n_embd')
    # from the config alone, before the model is built (10^8 blocks would take days to build)
    with monkeypatch.context() as m:
        m.setattr(train_gpt, 'on_meta', None)
        fails(train_gpt.main, args + ['--n_layer=100000000'], '--n_layer', '--n_embd')
    # The config's count leaves the embeddings out: where it fits and the model does not, the model's count
    # decides (its refusal, not the micro-step's).
    with monkeypatch.context() as m:
        m.setattr(train_gpt, 'memory_bytes', lambda device: 16 * 10 * 32 ** 2 + 1)
        fails(train_gpt.main, args, '--n_layer', '--n_embd')
    # The backward leaves 8 bytes a parameter of 1 GB: more than the weights' 4, fewer than the model's 16.
    monkeypatch.setattr(train_gpt, 'memory_bytes', lambda device: 10**9)
    monkeypatch.setattr(train_gpt, 'backward_bytes',
                        lambda model, B, T, ctx, fused: 10**9 - 8 * model.get_num_params(non_embedding=False))
    fails(train_gpt.main, args, '--batch_size', '--block_size')
    assert (out / 'ckpt.pt').read_bytes() == before
    # Without --overwrite, a folder that holds a checkpoint is refused before the model is probed.
    monkeypatch.setattr(train_gpt, 'backward_bytes', None)
    fails(train_gpt.main, tiny(data_dir, out, '--max_iters=2'), f'{out}/ckpt.pt', '--overwrite=true')
    monkeypatch.setattr(train_gpt, 'memory_bytes', lambda device: 10**12)
    probed = []
    monkeypatch.setattr(train_gpt, 'backward_bytes',
                        lambda model, B, T, ctx, fused: probed.append((B, T)) or 2e9)
    train(tmp_path / 'roomy', '--max_iters=1')
    assert probed == [(4, 32)]
    printed = capsys.readouterr().out
    assert '--block_size' not in printed and 'about 2 GB' in printed


def test_a_run_says_its_dtype_its_schedule_and_how_to_sample_from_where_it_started(train, tmp_path,
                                                                                 monkeypatch, capsys):
    """--dtype=auto: bfloat16 on a CPU that has it (the choice itself: test_resolve_dtype_on_a_cpu), which the
    log says; the checkpoint keeps auto, for a resume to choose again. A schedule shorter than the run is
    noted, and the run ends at min_lr. Started from another folder, into an out_dir with a space: the sample
    command it prints names sample.py beside train_gpt.py, the out_dir one argument."""
    monkeypatch.setattr(torch.cpu, '_is_avx512_bf16_supported', lambda: True)
    monkeypatch.setattr(sys, 'argv', [os.path.join('..', 'tost', 'train_gpt.py')])
    out = tmp_path / 'out dir'
    train(out, '--max_iters=3', '--lr_decay_iters=2', '--eval_interval=3', '--dtype=auto')
    printed = capsys.readouterr().out
    assert weights(out)['config']['dtype'] == 'auto'
    with open(out / 'log.jsonl') as f:
        assert json.loads(f.readline())['dtype'] == 'bfloat16'
    assert 'min_lr' in printed
    assert read_log(out, kind='train')[-1]['lr'] == 3e-3 * train_gpt.DEFAULTS['min_lr_ratio']
    line = [s for s in printed.splitlines() if s.startswith('sample from it: ')]
    sample = os.path.join('..', 'tost', 'sample.py')
    assert shlex.split(line[0][16:]) == ['python', sample, f'--out_dir={out}']


def test_a_new_run_from_a_checkpoints_weights_is_its_model_trained_afresh(data_dir, trained, tmp_path,
                                                                          monkeypatch, capsys):
    """--init_from=PATH (fine-tuning): the checkpoint's model and context, which the command line need not
    repeat, trained from iter 0 by this command line's options and a new AdamW: its first evaluation is the
    source's last (the same weights, the same windows). The source's AdamW moments are not kept, and the
    source is left as it was."""
    loaded = []
    load = train_gpt.load_checkpoint
    monkeypatch.setattr(train_gpt, 'load_checkpoint', lambda *a, **k: loaded.append(load(*a, **k)) or
                        loaded[-1])
    source = trained[0] / 'ckpt.pt'
    before = source.read_bytes()
    out = tmp_path / 'ft'
    train_gpt.main(['--dataset=tiny', f'--data_dir={data_dir}', f'--out_dir={out}', f'--init_from={source}',
                    '--eval_iters=2', '--batch_size=4', '--device=cpu', '--dtype=float32', '--max_iters=2',
                    '--eval_interval=2', '--learning_rate=1e-3', '--dropout=0.1'])
    printed = capsys.readouterr().out
    assert str(source) in printed and 'resuming' not in printed
    evals = read_log(out, kind='eval')
    assert [r['iter'] for r in evals] == [0, 2]
    assert evals[0]['val_loss'] == read_log(trained[0], kind='eval')[-1]['val_loss']
    ckpt = weights(out)
    config = ckpt['config']
    assert (ckpt['model_args']['n_embd'], config['n_embd'], config['block_size']) == (32, 32, 32)
    assert ckpt['model_args']['dropout'] == config['dropout'] == 0.1
    # the source's warmup was 1: this run's is the default
    assert (ckpt['iter_num'], config['learning_rate'], config['warmup_iters']) == (2, 1e-3, 50)
    assert ckpt['optimizer']['state'][0]['step'] == 2
    assert 'optimizer' not in loaded[0]
    assert source.read_bytes() == before
    # a preset's shape and context give way to the checkpoint's, its training stays
    out = tmp_path / 'preset'
    train_gpt.main(['--config=shakespeare', '--dataset=tiny', f'--data_dir={data_dir}', f'--out_dir={out}',
                    f'--init_from={source}', '--eval_iters=2', '--batch_size=4', '--device=cpu',
                    '--max_iters=1'])
    config = weights(out)['config']
    assert (config['n_layer'], config['n_embd'], config['dropout']) == (1, 32, 0.2)


@pytest.mark.parametrize('damage', ['no meta', 'config', 'junk', 'more layers'])
def test_a_damaged_checkpoint_to_fine_tune_from_is_one_line_naming_it(data_dir, trained, tmp_path, fails,
                                                                       damage):
    """--init_from=PATH read as a resume's checkpoint is: without its meta, a config value out of range, a
    weight of no layer, a model_args of more layers than its weights fill: one line naming PATH."""
    ckpt = torch.load(os.path.join(trained[0], 'ckpt.pt'), weights_only=True)
    if damage == 'no meta':
        del ckpt['meta']
    if damage == 'config':
        ckpt['config'] = dict(ckpt['config'], n_head=0)
    if damage == 'junk':
        ckpt['model'] = dict(ckpt['model'], junk='x')
    if damage == 'more layers':
        ckpt['model_args'] = dict(ckpt['model_args'], n_layer=40)
    source = tmp_path / 'source.pt'
    torch.save(ckpt, source)
    fails(train_gpt.main, ['--dataset=tiny', f'--data_dir={data_dir}', f"--out_dir={tmp_path / 'out'}",
                           f'--init_from={source}', '--device=cpu'], str(source))


def test_a_data_dir_or_dataset_that_is_a_dataset_s_folder_is_one_line(data_dir, tmp_path, fails, monkeypatch):
    """--data_dir=data/tiny, the dataset where the folder of datasets is meant, would prepare the default
    dataset inside it and train on that; --dataset=data/tiny, a path from here, names no dataset under the
    default --data_dir. Each: one line naming the path and the --data_dir meant, nothing written in the
    dataset. An absolute path, or one under --data_dir, is the dataset it names."""
    folder = os.path.join(data_dir, 'tiny')
    made = sorted(os.listdir(folder))
    small = ['--max_iters=1', '--n_layer=1', '--n_embd=16', '--block_size=8', '--device=cpu']
    # each names the --data_dir meant
    fails(train_gpt.main, [f'--data_dir={folder}', f"--out_dir={tmp_path / 'a'}", *small], folder,
          f'--data_dir={data_dir}')
    monkeypatch.chdir(os.path.dirname(data_dir))
    typed = os.path.join(os.path.basename(data_dir), 'tiny')
    fails(train_gpt.main, [f'--dataset={typed}', f"--out_dir={tmp_path / 'b'}", *small], typed,
          f'--data_dir={os.path.basename(data_dir)} ')
    assert sorted(os.listdir(folder)) == made
    assert readers.dataset_folder('data', os.path.abspath(typed)) == os.path.abspath(typed)
    assert readers.dataset_folder('.', typed) == os.path.join('.', typed)


def test_a_vision_run_is_neither_resumed_nor_deleted(data_dir, tmp_path, fails):
    """An --out_dir where train_vit saved: a new run, even with --overwrite=true, is one line naming
    train_vit.py and its checkpoint, which stays."""
    ckpt = tmp_path / 'ckpt.pt'
    torch.save(dict(kind='vit', model={}), ckpt)
    for extra in ([], ['--overwrite=true']):
        fails(train_gpt.main, tiny(data_dir, tmp_path, '--max_iters=1', *extra), 'train_vit.py', str(ckpt))
    assert torch.load(ckpt, weights_only=True)['kind'] == 'vit'


def test_a_resume_on_other_data_has_no_best_val_loss_to_beat(train, data_dir, tmp_path, monkeypatch):
    """always_save_checkpoint=False: resumed on the same data in another folder, a worse evaluation is not
    saved; on other data (another val set: a part of the same, or another text), its first evaluation is,
    worse though it is."""
    vals = iter([3.0, 2.0, 2.5, 2.6, 2.7])
    monkeypatch.setattr(train_gpt, 'estimate_loss', lambda *a: {'train': 1.0, 'val': next(vals)})
    moved = tmp_path / 'moved'
    shutil.copytree(Path(data_dir, 'tiny'), moved / 'tiny')
    # the same source, half its val split
    cut = tmp_path / 'cut' / 'tiny'
    shutil.copytree(Path(data_dir, 'tiny'), cut)
    meta = json.loads((cut / 'meta.json').read_text())
    meta['val_tokens'] //= 2
    os.truncate(cut / 'val.bin', 2 * meta['val_tokens'])
    (cut / 'meta.json').write_text(json.dumps(meta))
    text = tmp_path / 'other.py'
    text.write_text(''.join(f"def shift_{i}(y):\n    return y - {i}\n\n" for i in range(900)))
    prepare_data.prepare('text', data_dir=str(tmp_path / 'other'), input=str(text), name='tiny')
    out = tmp_path / 'out'
    train(out, '--max_iters=2', '--eval_interval=2', '--always_save_checkpoint=false')
    resume(out, '--max_iters=4', '--eval_interval=2', f'--data_dir={moved}')
    assert [r['saved'] for r in read_log(out, kind='eval')] == [False, True, False]
    resume(out, '--max_iters=4', '--eval_interval=2', f"--data_dir={tmp_path / 'cut'}")
    assert [r['saved'] for r in read_log(out, kind='eval')] == [False, True, True]
    resume(out, '--max_iters=6', '--eval_interval=2', f"--data_dir={tmp_path / 'other'}")
    assert [r['saved'] for r in read_log(out, kind='eval')] == [False, True, True, True]


def test_a_batch_is_windows_of_its_split_and_targets_shifted_by_one_each_step_and_stream_drawing_its_own(
        tmp_path):
    """Training (stream 0), the train and the val estimates (1, 2) draw apart, and each step anew."""
    drawn = {(stream, index): tuple(train_gpt.window_starts(1337, stream, index, 4, 36_000, 32))
             for stream in (0, 1, 2) for index in (0, 1)}
    assert len(set(drawn.values())) == 6
    np.arange(300, dtype=np.uint16).tofile(tmp_path / 'train.bin')
    x, y = train_gpt.read_batch(str(tmp_path), 'train', [5, 100], 32, 'cpu', dict(vocab_size=300))
    assert x[1].tolist() == list(range(100, 132)) and y[1].tolist() == list(range(101, 133))


def test_only_an_improvement_is_saved_when_only_the_best_is(train, tmp_path, monkeypatch, capsys):
    """always_save_checkpoint=False: val losses 3, 2, 2, 2.2 at iters 0, 2, 4, 6; only the improvement is
    saved (a tie is none; 2.2 beats nothing). A resume remembers the best: 2.5 and 2.4 after it are not
    saved either."""
    vals = iter([3.0, 2.0, 2.0, 2.2, 2.5, 2.4])
    monkeypatch.setattr(train_gpt, 'estimate_loss', lambda *a: {'train': 1.0, 'val': next(vals)})
    out = tmp_path / 'out'
    train(out, '--max_iters=6', '--eval_interval=2', '--always_save_checkpoint=false')
    assert [r['saved'] for r in read_log(out, kind='eval')] == [False, True, False, False]
    assert weights(out)['iter_num'] == 2
    resume(out, '--max_iters=6', '--device=cpu')
    assert [r['saved'] for r in read_log(out, kind='eval')] == [False, True, False, False]
    assert weights(out)['iter_num'] == 2
    done = [s for s in capsys.readouterr().out.splitlines() if s.startswith('done: ')]
    assert len(done) == 2 and all(s.endswith('(iter 2)') for s in done), done


def test_each_step_clips_at_grad_clip_at_its_learning_rate_and_draws_its_own_dropout(train, tmp_path,
                                                                                     monkeypatch):
    """--grad_clip and the schedule's learning rate (its floor --min_lr_ratio of it) reach every optimizer
    step, as logged (train_common's tests check the step clips at it); each micro-step seeds its dropout
    anew."""
    steps = []
    real = train_gpt.optimizer_step
    monkeypatch.setattr(train_gpt, 'optimizer_step', lambda *a: steps.append(a[2:]) or real(*a))
    seeds = []
    seed = torch.manual_seed
    monkeypatch.setattr(torch, 'manual_seed', lambda s: seeds.append(s) or seed(s))
    out = tmp_path / 'out'
    train(out, '--max_iters=5', '--grad_clip=0.5', '--warmup_iters=2', '--lr_decay_iters=4',
          '--min_lr_ratio=0.5', '--gradient_accumulation_steps=2', '--seed=7')
    lrs = [train_common.cosine_lr(i, 3e-3, 1.5e-3, 2, 4) for i in range(5)]
    assert steps == [(lr, 0.5) for lr in lrs] and [r['lr'] for r in read_log(out, kind='train')] == lrs
    # the first seeds the model's weights; then each micro-step of each step its own, from --seed
    assert seeds == [7] + [train_common.seed_of(7, i, g) for i in range(5) for g in range(2)]
    assert len(set(seeds)) == 11


def test_a_min_lr_ratio_of_1_holds_the_learning_rate_after_the_warmup(train, tmp_path, capsys):
    """nanoGPT's decay_lr=False: the floor at the peak, and no note of a floor reached before the end."""
    out = tmp_path / 'out'
    train(out, '--max_iters=4', '--warmup_iters=2', '--lr_decay_iters=3', '--min_lr_ratio=1')
    assert [r['lr'] for r in read_log(out, kind='train')] == [1.5e-3, 3e-3, 3e-3, 3e-3]
    assert 'note:' not in capsys.readouterr().out


def test_accumulated_gradients_are_those_of_the_whole_batch(train, tmp_path, monkeypatch):
    """2 micro-steps of 4 sequences step on the gradient of the mean over all 8, as one batch of 8 does."""
    norms = []
    real = train_gpt.optimizer_step

    def step(optimizer, scaler, lr, grad_clip):
        grads = [p.grad for g in optimizer.param_groups for p in g['params'] if p.grad is not None]
        norms.append(torch.cat([g.flatten() for g in grads]).norm().item())
        return real(optimizer, scaler, lr, grad_clip)
    monkeypatch.setattr(train_gpt, 'optimizer_step', step)
    train(tmp_path / 'a', '--max_iters=1', '--batch_size=8')
    train(tmp_path / 'b', '--max_iters=1', '--gradient_accumulation_steps=2')
    assert norms[1] == pytest.approx(norms[0], rel=1e-5)
    # the loss logged is the whole batch's too
    losses = [read_log(tmp_path / run, kind='train')[0]['train_loss'] for run in 'ab']
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)


@pytest.mark.skipif(sys.platform != 'linux', reason="the address space is limited through Linux's setrlimit")
def test_a_resume_refuses_model_args_of_more_layers_than_the_weights_before_building_them(trained, tmp_path):
    ckpt = torch.load(os.path.join(trained[0], 'ckpt.pt'), weights_only=True)
    torch.save(dict(ckpt, model_args=dict(ckpt['model_args'], n_layer=10**6)), tmp_path / 'ckpt.pt')
    got = in_little_memory('train_gpt.py', '--init_from=resume', f'--out_dir={tmp_path}', '--device=cpu',
                           '--max_iters=13')
    assert got.returncode == 2
    one_line(got.stderr, f'{tmp_path}/ckpt.pt')


def test_a_checkpoint_from_before_token_shift_and_softmax_layers_resumes(trained, tmp_path):
    """A checkpoint older than the options beyond the paper lacks their keys: its model is the defaults'."""
    ckpt = torch.load(os.path.join(trained[0], 'ckpt.pt'), weights_only=True)
    newer = ('token_shift', 'softmax_layers')
    for key in ('model_args', 'config'):
        ckpt[key] = {k: v for k, v in ckpt[key].items() if k not in newer}
    torch.save(ckpt, tmp_path / 'ckpt.pt')
    result = train_gpt.main(['--init_from=resume', f'--out_dir={tmp_path}', '--device=cpu', '--max_iters=13'])
    assert result['iter_num'] == 13


@pytest.mark.parametrize('edit', [dict(batch_size='x'), dict(log_interval=0), dict(dataset=['a']),
                                  dict(dtype='bf16'), dict(dataset='\x1b]0;title\x07')])
def test_a_resume_checks_its_checkpoints_config_as_a_command_line(trained, tmp_path, fails, edit):
    """A damaged or crafted checkpoint's config (another type, out of its range) is one line naming the
    checkpoint and the key, not a traceback steps later."""
    ckpt = torch.load(os.path.join(trained[0], 'ckpt.pt'), weights_only=True)
    torch.save(dict(ckpt, config=dict(ckpt['config'], **edit)), tmp_path / 'ckpt.pt')
    argv = ['--init_from=resume', f'--out_dir={tmp_path}', '--device=cpu']
    fails(train_gpt.main, argv, f'{tmp_path}/ckpt.pt', *edit)
    # the key typed replaces the refused value: the resume goes on (to nothing left to do)
    (key, _), = edit.items()
    assert train_gpt.main(argv + [f"--{key}={ckpt['config'][key]}"]) is None


def test_a_resume_with_the_default_out_dir_keeps_this_command_s_out_dir():
    """A run saved in out-there, moved to out/ and resumed there with the default --out_dir: the folder is
    this command's (its resume command, its divergence line, its saved config), not the checkpoint's."""
    saved = dict(train_gpt.DEFAULTS, out_dir='there')
    ckpt = dict(model_args=dict(block_size=256, vocab_size=256), config=saved)
    cfg = train_gpt.resume_config(dict(train_gpt.DEFAULTS, init_from='resume'), {'init_from'}, ckpt)
    assert cfg['out_dir'] == train_gpt.DEFAULTS['out_dir']


def test_the_shakespeare_preset_is_nanogpt_s_recipe():
    c = parse('--config=shakespeare')
    assert (c['learning_rate'], c['beta2'], c['warmup_iters'], c['max_iters'], c['lr_decay_iters'],
            c['batch_size'], c['eval_iters']) == (1e-3, 0.99, 100, 3000, 3000, 32, 100)


def test_tokens_count_every_micro_step_and_the_run_returns_its_last_and_best_val_loss(train, tmp_path,
                                                                                      monkeypatch):
    """2 micro-steps of 4 x 32 tokens a step: 256 tokens a step, in the rows. The run's value: the last
    evaluation's val loss beside the lowest. A cosine that ends where the warmup does runs (then the
    floor)."""
    losses = iter([3.0, 1.0, 2.0])
    monkeypatch.setattr(train_gpt, 'estimate_loss', lambda *a: dict(train=1.0, val=next(losses)))
    out = tmp_path / 'o'
    got = train(out, '--max_iters=2', '--eval_interval=1', '--gradient_accumulation_steps=2',
                '--warmup_iters=1', '--lr_decay_iters=1')
    assert [r['tokens'] for r in read_log(out, kind='train')] == [256, 512]
    assert (got['iter_num'], got['val_loss'], got['best_val_loss']) == (2, 2.0, 1.0)
