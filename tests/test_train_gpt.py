"""
Tests for train_gpt.py and sample.py: tiny end-to-end runs on CPU (a 1-layer, 32-wide model on a byte corpus),
offline. Ctrl-C and SIGTERM are real signals, to this process, a subprocess, one torchrun worker or torchrun's
group; several processes run under torchrun (gloo); the GPU paths (compile, bf16, fp16 with the GradScaler,
fused AdamW, MFU) run on CPU; bad input ends in one line, a non-zero exit and no traceback.
"""
import gc
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import options
import plot
import prepare_data
import readers
import sample
import tost
import train_common
import train_gpt

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=REPO)


pytestmark = pytest.mark.usefixtures('one_thread')    # conftest.py


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    """A byte-level text dataset 'tiny' made by prepare_data from tost.py (~40 KB: ~36k train, ~4k val tokens)."""
    d = tmp_path_factory.mktemp('data')
    # a fixed, learnable corpus of ~40 KB (not a repo file: editing that would change every number here)
    corpus = d / 'corpus.py'
    corpus.write_text(''.join(f"def scale_{i}(x):\n    return x * {i % 97} + {i % 13}\n\n" for i in range(900)))
    prepare_data.prepare('text', data_dir=str(d), input=str(corpus), name='tiny')
    return str(d)


def tiny(data_dir, out_dir, *extra):
    return ['--dataset=tiny', f'--data_dir={data_dir}', f'--out_dir={out_dir}', '--n_layer=1', '--n_head=2',
            '--n_embd=32', '--block_size=32', '--batch_size=4', '--eval_iters=2', '--log_interval=1',
            '--device=cpu', '--dtype=float32', '--learning_rate=3e-3', '--warmup_iters=1', *extra]


def read_log(out_dir, name='log.jsonl', kind=None):
    """The log's rows but the config rows (what each start of the run was; plot.py reads them), or those of `kind`."""
    with open(os.path.join(out_dir, name)) as f:
        return [r for r in map(json.loads, f) if r.get('kind') != 'config' and kind in (None, r.get('kind'))]


def weights(out_dir):
    return train_common.load_checkpoint(os.path.join(out_dir, 'ckpt.pt'))


def run_cli(script, *args):
    return subprocess.run([sys.executable, os.path.join(REPO, script), *args], capture_output=True, text=True,
                          env=ENV, cwd=REPO, timeout=120)


def exits(fn, *args):
    """fn(*args) ended as options' handler ends the script: the exit code (stderr is in capsys). A run that an
    exception ended lets its out_dir's lock go with its frames, as its process would by ending."""
    with pytest.raises(SystemExit) as e:
        options.run_main(lambda: fn(*args))
    code = e.value.code
    del e
    gc.collect()
    return code


def in_process(capsys, main, *args):
    """main(args) ended by run_main, as its script ends it: the exit code and what went to stderr."""
    capsys.readouterr()
    return SimpleNamespace(code=exits(main, list(args)), err=capsys.readouterr().err)


def test_compile_that_would_fail_on_a_gpu_is_refused_before_the_data(monkeypatch, tmp_path):
    """torch before 2.13 on a GPU: --compile of a ToST model stops before the data is prepared (hours for
    OpenWebText) or any folder is made; the softmax baseline, which has no prefix sums, goes on."""
    monkeypatch.setattr(torch, '__version__', '2.12.1+cu128')
    args = ['--compile=true', f'--data_dir={tmp_path}/data', f'--out_dir={tmp_path}/out']
    monkeypatch.setattr(train_gpt, 'setup_distributed', lambda device: train_common.Dist(False, 0, 0, 1, True, 'cuda'))
    with pytest.raises(options.UsageError, match=r'^--compile: torch 2\.12\.1\+cu128 cannot compile causal TSSA'):
        train_gpt.main(args)
    assert not os.listdir(tmp_path)
    def past_the_check(*args):
        raise RuntimeError('past the check')
    monkeypatch.setattr(train_gpt, 'resolve_dtype', past_the_check)
    with pytest.raises(RuntimeError, match='past the check'):
        train_gpt.main(args + ['--attn=softmax'])


def one_line_error(stderr, *words):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), stderr
    assert 'Traceback' not in stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope='module')
def trained(data_dir, tmp_path_factory):
    """A finished 12-iteration run, shared by the checkpoint and sampling tests."""
    out = str(tmp_path_factory.mktemp('trained'))
    result = train_gpt.main(tiny(data_dir, out, '--max_iters=12', '--eval_interval=6'))
    return out, result

# -----------------------------------------------------------------------------
# config


def test_presets_and_schedule_defaults():
    parse = lambda *a: options.parse(list(a), train_gpt.DEFAULTS, presets=train_gpt.PRESETS)[0]
    assert parse() == parse('--config=demo')
    assert {'demo', 'shakespeare', 'owt-base', 'owt-medium', 'owt-large'} <= set(train_gpt.PRESETS)
    for name in ('owt-base', 'owt-medium', 'owt-large'):  # the paper's recipe: 480 x 1024 tokens per step
        c = parse(f'--config={name}')
        assert c['batch_size'] * c['gradient_accumulation_steps'] * c['block_size'] == 480 * 1024
        assert (c['learning_rate'], c['min_lr_ratio'], c['warmup_iters'], c['lr_decay_iters'], c['max_iters'],
                c['grad_clip'], c['beta2']) == (6e-4, 0.1, 2000, 600_000, 600_000, 1.0, 0.95)
        shape = tost.preset(name.replace('owt', 'tost'))
        assert (c['n_layer'], c['n_head'], c['n_embd']) == (shape.n_layer, shape.n_head, shape.n_embd)
    assert parse('--config=owt-base')['weight_decay'] == 0.01 and parse('--config=owt-large')['weight_decay'] == 0.1
    d = train_gpt.DEFAULTS   # the demo's schedule, in DEFAULTS: nanoGPT's rules of thumb, exactly as they compute
    assert (d['lr_decay_iters'], d['warmup_iters'], d['learning_rate'] * d['min_lr_ratio']) == \
        (d['max_iters'], d['max_iters'] // 20, d['learning_rate'] / 10)
    c = parse('--max_iters=2000')                           # and it stays what it is: set it with max_iters
    assert (c['lr_decay_iters'], c['warmup_iters']) == (1000, 50)
    c = parse('--max_iters=1000', '--lr_decay_iters=700', '--warmup_iters=7', '--min_lr_ratio=0')
    assert (c['lr_decay_iters'], c['warmup_iters'], c['min_lr_ratio']) == (700, 7, 0.0)
    d = tost.preset('tost-demo')  # the default model is the tost-demo shape
    assert (train_gpt.DEFAULTS['n_layer'], train_gpt.DEFAULTS['n_head'], train_gpt.DEFAULTS['n_embd'],
            train_gpt.DEFAULTS['block_size']) == (d.n_layer, d.n_head, d.n_embd, d.block_size)

# -----------------------------------------------------------------------------
# a run, its log and its checkpoint


def test_run_log_and_checkpoint_roundtrip(trained, data_dir):
    out, result = trained
    log = read_log(out)
    evals = [r for r in log if r['kind'] == 'eval']
    steps = [r for r in log if r['kind'] == 'train']
    assert [r['iter'] for r in evals] == [0, 6, 12] and [r['iter'] for r in steps] == list(range(1, 13))
    for r in log:
        assert {'iter', 'train_loss', 'lr', 'tokens_per_sec'} <= set(r)
    assert all('val_loss' in r for r in evals) and all(r['mfu'] is None for r in steps)  # no MFU on a CPU
    assert evals[-1]['val_loss'] < evals[0]['val_loss'] - 0.5  # it learns (from ~5.5 = ln 256)
    assert result['val_loss'] == evals[-1]['val_loss']

    ckpt = weights(out)  # weights_only=True
    assert {'model', 'optimizer', 'model_args', 'iter_num', 'best_val_loss', 'config', 'meta'} <= set(ckpt)
    assert ckpt['iter_num'] == 12 and ckpt['meta']['tokenizer'] == 'bytes'
    assert ckpt['model_args'] == dict(block_size=32, vocab_size=256, n_layer=1, n_head=2, n_embd=32, dropout=0.0,
                                      bias=False, attn='tssa', token_shift=False, softmax_layers=[])
    assert ckpt['config']['max_iters'] == 12 and ckpt['config']['dataset'] == 'tiny'
    assert not any('_orig_mod' in k or k.startswith('module.') for k in ckpt['model'])

    # the weights give back the val loss the run measured, on the same fixed eval batches
    model = tost.GPT(tost.GPTConfig(**ckpt['model_args']))
    model.load_state_dict(ckpt['model'])
    model.eval()
    path = os.path.join(data_dir, 'tiny')
    n_val = os.path.getsize(os.path.join(path, 'val.bin')) // 2
    losses = []
    with torch.no_grad():
        for k in range(2):
            starts = train_gpt.window_starts(1337, 2, k, 4, n_val, 32)
            X, Y = train_gpt.read_batch(path, 'val', starts, 32, 'cpu')
            losses.append(model(X, Y)[1].item())
    assert abs(sum(losses) / 2 - ckpt['val_loss']) < 1e-5
    assert ckpt['val_loss'] == evals[-1]['val_loss']


def at_iter(monkeypatch, it, act):
    """act() as iteration `it` draws its batch (train_gpt.window_starts, stream 0)."""
    real = train_gpt.window_starts

    def starts(seed, stream, index, *rest):
        if stream == 0 and index == it:
            act()
        return real(seed, stream, index, *rest)
    monkeypatch.setattr(train_gpt, 'window_starts', starts)


def sigint():
    os.kill(os.getpid(), signal.SIGINT)


def same_state(a, b, atol=0.0):
    assert a['model'].keys() == b['model'].keys()
    for k in a['model']:
        torch.testing.assert_close(b['model'][k], a['model'][k], rtol=0, atol=atol, msg=k)
    sa, sb = a['optimizer']['state'], b['optimizer']['state']
    assert sa.keys() == sb.keys()
    for p in sa:
        for k in ('exp_avg', 'exp_avg_sq', 'step'):
            torch.testing.assert_close(sb[p][k], sa[p][k], rtol=0, atol=atol)


def test_interrupt_then_resume_equals_unbroken_run(data_dir, tmp_path, monkeypatch, capsys):
    args = ('--max_iters=8', '--eval_interval=4', '--dropout=0.1')  # dropout: the RNG must resume too
    full, broken = str(tmp_path / 'full'), str(tmp_path / 'broken')
    train_gpt.main(tiny(data_dir, full, *args))
    at_iter(monkeypatch, 6, lambda: signal.default_int_handler(signal.SIGINT, None))   # raises KeyboardInterrupt
    capsys.readouterr()
    assert exits(train_gpt.main, tiny(data_dir, broken, *args)) == 130
    assert 'Traceback' not in capsys.readouterr().err
    assert weights(broken)['iter_num'] == 4  # the last eval saved at 4; iters 4 and 5 are lost
    monkeypatch.undo()

    # resume with nothing but the out_dir: the schedule, the data order, the RNG and the dtype (float32, where
    # auto may be bfloat16) come from the checkpoint; the device is this machine's
    train_gpt.main(['--init_from=resume', f'--out_dir={broken}', f'--data_dir={data_dir}', '--device=cpu'])
    a, b = weights(full), weights(broken)
    assert b['iter_num'] == a['iter_num'] == 8
    same_state(a, b, atol=1e-6)
    log = read_log(broken)
    assert [(r['iter'], r['kind']) for r in log] == [(r['iter'], r['kind']) for r in read_log(full)]  # no duplicates
    resumed = [r for r in log if r['kind'] == 'train' and r['iter'] > 4]  # the log goes on after the resume
    assert [r['iter'] for r in resumed] == [5, 6, 7, 8]
    lrs_full = {r['iter']: r['lr'] for r in read_log(full, kind='train')}
    assert all(abs(r['lr'] - lrs_full[r['iter']]) < 1e-12 for r in resumed)  # the same LR schedule


def test_a_real_sigint_saves_at_the_step_and_resume_is_exact(data_dir, tmp_path, monkeypatch, capsys):
    """SIGINT sent to this very process in the middle of iteration 6: the loop finishes the step, saves at
    iter 7 (no eval there), exits 130 saying so; the resumed run ends bit-identical to an unbroken one."""
    args = ('--max_iters=10', '--eval_interval=5', '--dropout=0.1')
    full, broken = str(tmp_path / 'full'), str(tmp_path / 'broken')
    train_gpt.main(tiny(data_dir, full, *args))
    at_iter(monkeypatch, 6, sigint)
    capsys.readouterr()
    assert exits(train_gpt.main, tiny(data_dir, broken, *args)) == 130
    err = capsys.readouterr().err.splitlines()
    assert err == ['SIGINT: stopping after this iter; another one stops at once, without saving',
                   f'interrupted (SIGINT) at iter 7: saved {broken}/ckpt.pt',
                   f'resume with: python train_gpt.py --init_from=resume --out_dir={broken} --device=cpu']
    assert weights(broken)['iter_num'] == 7 and weights(broken)['val_loss'] is None  # no eval at iter 7
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler         # the handler is given back
    monkeypatch.undo()
    train_gpt.main(shlex.split(err[2].split(': ', 1)[1])[2:])  # the printed command, as printed
    same_state(weights(full), weights(broken))
    assert [(r['iter'], r['kind']) for r in read_log(broken)] == [(r['iter'], r['kind']) for r in read_log(full)]


def same_run(ckpt_a, ckpt_b):
    """How far apart two runs' weights are, as a share of how far training moved them from the initial
    weights. Not elementwise: where a gradient is ~0, Adam's m / (sqrt(v) + eps) turns the last bit of a
    rounding difference (a fused kernel, inductor) into a whole step for that element."""
    torch.manual_seed(ckpt_a['config']['seed'])                     # the trainer's initial weights
    init = tost.GPT(tost.GPTConfig(**ckpt_a['model_args'])).state_dict()
    flat = lambda sd: torch.cat([sd[k].flatten().double() for k in sorted(sd)])
    a, b = flat(ckpt_a['model']), flat(ckpt_b['model'])
    return ((a - b).norm() / (a - flat(init)).norm()).item()


@pytest.mark.parametrize('earlier_best', [True, False])
def test_ctrl_c_keeps_the_best_model_when_only_the_best_is_saved(data_dir, tmp_path, monkeypatch, capsys, earlier_best):
    """always_save_checkpoint=False (the shakespeare preset): ckpt.pt is the best model so far, and Ctrl-C
    keeps it; with no checkpoint yet, Ctrl-C saves as usual."""
    out = str(tmp_path / 'out')
    at_iter(monkeypatch, 3, sigint)
    interval = '--eval_interval=3' if earlier_best else '--eval_interval=100'
    assert exits(train_gpt.main, tiny(data_dir, out, '--max_iters=10', interval,
                                      '--always_save_checkpoint=false')) == 130
    err = capsys.readouterr().err
    assert 'resume with: ' in err
    assert weights(out)['iter_num'] == (3 if earlier_best else 4)


def start(script, args, cwd, torchrun=0):
    """A training run in its own session (so a signal to its group reaches torchrun and its workers only)."""
    launch = [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={torchrun}'] \
        if torchrun else [sys.executable]
    return subprocess.Popen(launch + [os.path.join(REPO, script), *args], cwd=cwd, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def wait_for(proc, cond, what, timeout=120):
    t = time.time()
    while not cond():
        assert proc.poll() is None, f"exited {proc.returncode} before {what}: " + proc.communicate()[1][-2000:]
        assert time.time() - t < timeout, f"no {what} after {timeout}s"
        time.sleep(0.02)


def logged_iter(out_dir):
    try:
        return max((r['iter'] for r in read_log(out_dir, kind='train')), default=0)
    except (OSError, ValueError):
        return 0


def test_sigterm_to_a_subprocess_saves_and_the_printed_command_resumes(data_dir, tmp_path, capsys):
    out = str(tmp_path / 'out')
    p = start('train_gpt.py', tiny(data_dir, out, '--max_iters=100', '--eval_interval=1000'), str(tmp_path))
    wait_for(p, lambda: logged_iter(out) >= 3, 'iter 3')
    p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 130, stderr
    it = weights(out)['iter_num']
    assert stderr.splitlines()[:2] == ['SIGTERM: stopping after this iter; another one stops at once, without saving',
                                       f'interrupted (SIGTERM) at iter {it}: saved {out}/ckpt.pt'] and 3 <= it < 100
    cmd = stderr.split('resume with: ')[1].splitlines()[0]
    assert cmd.startswith('python ') and 'Traceback' not in stderr
    assert [f for f in os.listdir(out) if '.tmp' in f] == []
    assert shlex.split(cmd)[1] == os.path.join(REPO, 'train_gpt.py')   # the script as it was started
    capsys.readouterr()
    train_gpt.main(shlex.split(cmd)[2:])                         # the printed command (here, in this process)
    assert f'resuming from {out}/ckpt.pt at iter {it}' in capsys.readouterr().out
    assert weights(out)['iter_num'] == 100
    iters = [r['iter'] for r in read_log(out, kind='train')]
    assert iters == list(range(1, 101))                          # each iteration once


def test_ctrl_c_saves_after_the_stdout_reader_is_gone(data_dir, tmp_path):
    """`python train_gpt.py | tee log`, then Ctrl-C: tee dies of the same Ctrl-C, and a row printed after it must
    not cost the save (a row every iteration here)."""
    out = str(tmp_path / 'out')
    p = start('train_gpt.py', tiny(data_dir, out, '--max_iters=400', '--eval_interval=1000'), str(tmp_path))
    wait_for(p, lambda: logged_iter(out) >= 3, 'iter 3')
    p.stdout.close()                                              # the reader is gone
    p.send_signal(signal.SIGINT)
    stderr = p.communicate(timeout=120)[1]
    it = weights(out)['iter_num']
    assert p.returncode == 130 and 3 <= it < 400 and 'resume with: ' in stderr, stderr


def test_a_resume_into_a_folder_another_run_holds_is_refused_as_such(data_dir, tmp_path, capsys):
    """The other run has not saved yet: the folder is busy, not empty of checkpoints."""
    out = tmp_path / 'out'
    out.mkdir()
    held = train_common.lock_out_dir(str(out))
    assert exits(train_gpt.main, tiny(data_dir, str(out), '--init_from=resume')) == 2
    one_line_error(capsys.readouterr().err, f'--out_dir={out}')
    held.close()


def test_a_weight_decay_that_would_erase_the_weights_is_refused(data_dir, tmp_path, capsys):
    assert exits(train_gpt.main, tiny(data_dir, str(tmp_path / 'out'), '--weight_decay=1e30')) == 2
    one_line_error(capsys.readouterr().err, '--weight_decay=1e+30')
    assert not os.path.exists(tmp_path / 'out')


def test_second_ctrl_c_during_the_save_keeps_the_previous_checkpoint(data_dir, tmp_path, monkeypatch, capsys):
    """Ctrl-C in iteration 5 (with the copy torchrun forwards at once: one Ctrl-C) saves at iter 6; a second
    Ctrl-C a second later, while torch.save has written part of the file, stops at once: the checkpoint of iter
    4 stays intact, and no temp file is left. Real signals to this process; the clock is moved on by hand."""
    out, real_save, clock = str(tmp_path / 'out'), torch.save, [0.0]
    monkeypatch.setattr(train_common.time, 'monotonic', lambda: clock[0])

    def slow_save(obj, f, *a, **k):
        if obj['iter_num'] > 4:
            f.write(b'half a checkpoint')
            clock[0] += 1.2
            sigint()                                              # the second Ctrl-C, a second later
        return real_save(obj, f, *a, **k)

    def two_sigints():                                            # the terminal's and torchrun's copy: one Ctrl-C
        sigint()
        sigint()
    at_iter(monkeypatch, 5, two_sigints)
    monkeypatch.setattr(torch, 'save', slow_save)
    capsys.readouterr()
    assert exits(train_gpt.main, tiny(data_dir, out, '--max_iters=1000', '--eval_interval=4')) == 130
    monkeypatch.undo()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith('SIGINT') and lines[1].startswith('error: '), lines
    assert weights(out)['iter_num'] == 4                         # the previous checkpoint, intact
    assert sorted(os.listdir(out)) == ['.lock', 'ckpt.pt', 'log.jsonl', 'loss.png']   # no temp file left


def test_failed_save_keeps_the_previous_checkpoint(data_dir, tmp_path, monkeypatch, capsys):
    out = str(tmp_path / 'out')
    real_save, calls = torch.save, []

    def disk_full_on_second_save(obj, f, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            f.write(b'half a checkpoint')
            raise OSError(28, 'No space left on device')
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, 'save', disk_full_on_second_save)
    code = exits(train_gpt.main, tiny(data_dir, out, '--max_iters=4', '--eval_interval=2'))
    err = capsys.readouterr().err
    assert code == 2
    one_line_error(err, f'{out}/ckpt.pt', f'--out_dir={out}', 'No space left on device')
    assert weights(out)['iter_num'] == 2  # still loads, and is the one from iter 2
    assert sorted(os.listdir(out)) == ['.lock', 'ckpt.pt', 'log.jsonl', 'loss.png']  # no temp file left behind

# -----------------------------------------------------------------------------
# several processes


@pytest.mark.slow
def test_torchrun_two_processes_on_the_defaults_match_one(data_dir, tmp_path):
    """2 processes with the default gradient_accumulation_steps=1 (no flag added) round it up to 2, say so,
    and compute what 1 process with 2 does, dropout included (it is seeded per micro-step), up to rounding."""
    one, two = str(tmp_path / 'one'), str(tmp_path / 'two')
    args = ('--max_iters=4', '--eval_interval=2', '--dropout=0.1')
    p = start('train_gpt.py', tiny(data_dir, two, *args), str(tmp_path), torchrun=2)
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, stdout[-2000:] + stderr[-2000:]
    assert stdout.count('done: 4 iters') == 1  # only rank 0 talks
    assert 'note: gradient_accumulation_steps=1 rounded up to 2, a multiple of the 2 processes: 256 tokens per iter' \
        in stdout
    train_gpt.main(tiny(data_dir, one, *args, '--gradient_accumulation_steps=2'))
    log1, log2 = read_log(one), read_log(two)
    assert [(r['iter'], r['kind']) for r in log1] == [(r['iter'], r['kind']) for r in log2]
    for a, b in zip(log1, log2):
        assert abs(a['train_loss'] - b['train_loss']) < 1e-5, (a, b)
        if a['kind'] == 'eval':
            assert abs(a['val_loss'] - b['val_loss']) < 1e-5, (a, b)
    w1, w2 = weights(one)['model'], weights(two)['model']
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=0, atol=1e-5, msg=k)


# a worker that runs a script's main(), then counts the threads its process still has that Python did not start
# (Python's own, such as inductor's compile pool on a cold cache, are joined at exit); one write, so that the
# lines of two processes on one pipe do not interleave
THREADS_AFTER = """import importlib, os, sys, threading
importlib.import_module(sys.argv[1]).main(sys.argv[2:])
native = len(os.listdir('/proc/self/task')) - len(threading.enumerate())
os.write(1, f'native threads left: {native}\\n'.encode())
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir('/proc'), reason='reads the threads from /proc')
def test_torchrun_two_processes_compiled_train_save_plain_weights_and_match_one(data_dir, tmp_path):
    """--compile=true under torchrun: torch.compile(DDP(model)), evaluation through it too. Two processes train,
    save weights without compile's or DDP's prefixes, and land where one uncompiled process does with the same
    global batch (up to inductor's rounding). And they leave no gloo thread running into the interpreter's exit,
    where such threads can abort a finished run (see train_common.launch)."""
    one, two, worker = str(tmp_path / 'one'), str(tmp_path / 'two'), tmp_path / 'worker.py'
    worker.write_text(THREADS_AFTER)
    args = ('--max_iters=4', '--eval_interval=2', '--gradient_accumulation_steps=4')   # 2 micro-steps each
    p = start(str(worker), ['train_gpt', *tiny(data_dir, two, *args, '--compile=true')], str(tmp_path), torchrun=2)
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, stdout[-2000:] + stderr[-2000:]
    assert 'compile True' in stdout and stdout.count('done: 4 iters') == 1
    assert stdout.count('native threads left: 0\n') == 2, stdout[-1000:]   # gloo's workers and loop are gone
    train_gpt.main(tiny(data_dir, one, *args))
    ck = weights(two)
    assert set(ck['model']) == set(weights(one)['model'])           # plain keys, loadable by sample.py
    tost.GPT(tost.GPTConfig(**ck['model_args'])).load_state_dict(ck['model'])
    for a, b in zip(read_log(one), read_log(two)):
        assert (a['iter'], a['kind']) == (b['iter'], b['kind']) and abs(a['train_loss'] - b['train_loss']) < 1e-4
    assert same_run(weights(one), ck) < 0.01


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
def test_torchrun_three_processes_sigterm_to_one_rank_stops_all_at_the_same_step(data_dir, tmp_path):
    """3 processes on the defaults (1 micro-step rounded up to 3); SIGTERM to rank 1 alone, as a scheduler might
    send it: the flag is all-reduced, every rank stops at the same step, rank 0 saves there and says how to go
    on. Then one process resumes it (another process count), and the log has each iteration once."""
    out = str(tmp_path / 'out')
    p = start('train_gpt.py', tiny(data_dir, out, '--max_iters=400', '--eval_interval=1000'), str(tmp_path),
              torchrun=3)
    wait_for(p, lambda: logged_iter(out) >= 3, 'iter 3', timeout=240)
    os.kill(rank_pid(p.pid, 1), signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=240)
    assert '3 process(es) x 1 micro-steps x 4 x 32' in stdout and 'rounded up to 3' in stdout
    it = weights(out)['iter_num']
    assert f'interrupted (on another rank) at iter {it}: saved {out}/ckpt.pt' in stderr, stderr[-3000:]
    assert 'resume with: torchrun --standalone --nproc_per_node=3 ' in stderr
    assert 3 <= it < 400 and logged_iter(out) == it and p.returncode == 1     # torchrun's code for it
    train_gpt.main(['--init_from=resume', f'--out_dir={out}', '--device=cpu', '--max_iters=' + str(it + 5)])
    iters = [r['iter'] for r in read_log(out, kind='train')]
    assert iters == list(range(1, it + 6))


@pytest.mark.slow
def test_torchrun_a_save_that_fails_on_rank_0_stops_every_rank_with_one_line(data_dir, tmp_path):
    out = tmp_path / 'out'
    (out / 'ckpt.pt' / 'x').mkdir(parents=True)                  # rank 0 cannot rename its file onto a folder
    p = start('train_gpt.py', tiny(data_dir, str(out), '--max_iters=4', '--eval_interval=2'), str(tmp_path),
              torchrun=2)
    stdout, stderr = p.communicate(timeout=240)
    assert p.returncode == 1 and stderr.count('error: ') == 1, stderr[-3000:]
    assert f'error: {out}/ckpt.pt (--out_dir={out}): ' in stderr and '[rank' not in stderr, stderr[-3000:]


@pytest.mark.slow
def test_torchrun_ctrl_c_reaches_every_process_twice_and_counts_once(data_dir, tmp_path):
    """Ctrl-C in a terminal signals torchrun and its workers, and torchrun forwards it to them again: each
    worker sees two SIGINTs within milliseconds. That is one Ctrl-C: the save happens, not an abort."""
    out = str(tmp_path / 'out')
    p = start('train_gpt.py', tiny(data_dir, out, '--max_iters=400', '--eval_interval=1000'), str(tmp_path),
              torchrun=2)
    wait_for(p, lambda: logged_iter(out) >= 3, 'iter 3', timeout=240)
    os.killpg(p.pid, signal.SIGINT)                               # what the terminal does
    stdout, stderr = p.communicate(timeout=240)
    it = weights(out)['iter_num']
    assert f'interrupted (SIGINT) at iter {it}: saved {out}/ckpt.pt' in stderr, stderr[-3000:]
    assert stderr.count('interrupted (') == 1 and 3 <= it < 400
    assert p.returncode == 1                                    # the workers exit 130; torchrun reports it as 1


def test_no_gradient_sync_before_the_last_micro_step(data_dir, tmp_path, monkeypatch):
    """Syncing every micro-step gives the same numbers, only slower, so count: a 1-process gloo group
    through the DDP path, 3 micro-steps per iteration, must skip the all-reduce on 2 of them."""
    torch.distributed.init_process_group('gloo', init_method=f'file://{tmp_path}/pg', rank=0, world_size=1)
    ddp = train_common.Dist(ddp=True, rank=0, local_rank=0, world_size=1, master=True, device='cpu')
    monkeypatch.setattr(train_gpt, 'setup_distributed', lambda device: ddp)
    real, entered = train_common.DDP.no_sync, []

    def counting_no_sync(self):
        entered.append(1)
        return real(self)

    monkeypatch.setattr(train_common.DDP, 'no_sync', counting_no_sync)
    train_gpt.main(tiny(data_dir, str(tmp_path / 'out'), '--max_iters=2', '--gradient_accumulation_steps=3'))
    assert len(entered) == 2 * 2
    assert not torch.distributed.is_initialized()  # main() left the process group


@pytest.mark.slow
def test_a_compiled_ddp_model_all_reduces_on_the_last_micro_step_only(data_dir, tmp_path, monkeypatch):
    """torch.compile(DDP(model)), as the trainer builds it: no_sync() reaches DDP through the compiled wrapper, so
    3 micro-steps all-reduce the gradients once an iteration (counted by a DDP comm hook, which DDP calls for each
    bucket it all-reduces; a tiny model fills one), and the run lands where the one without DDP does."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    torch.distributed.init_process_group('gloo', init_method=f'file://{tmp_path}/pg', rank=0, world_size=1)
    monkeypatch.setattr(train_gpt, 'setup_distributed', lambda device: train_common.Dist(True, 0, 0, 1, True, 'cpu'))
    reduced = []

    class CountingDDP(train_common.DDP):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.register_comm_hook(None, lambda state, bucket: reduced.append(1) or allreduce_hook(state, bucket))
    monkeypatch.setattr(train_common, 'DDP', CountingDDP)
    args = ('--max_iters=2', '--eval_interval=100', '--gradient_accumulation_steps=3')
    train_gpt.main(tiny(data_dir, str(tmp_path / 'ddp'), *args, '--compile=true'))
    assert len(reduced) == 2 and not torch.distributed.is_initialized()
    monkeypatch.undo()
    train_gpt.main(tiny(data_dir, str(tmp_path / 'plain'), *args))
    assert same_run(weights(str(tmp_path / 'plain')), weights(str(tmp_path / 'ddp'))) < 0.01


def test_every_rank_waits_at_the_same_barrier_whoever_prepares_the_data(tmp_path, monkeypatch):
    """A dataset prepared on the fly: local rank 0 prepares it while the others wait at a barrier. Every rank must
    call the same collectives, whether meta.json was there when it looked or not (a rank that skipped the barrier
    would pair its next collective with the others' barrier): here rank 0 finds nothing and prepares, rank 1 of
    the same node and rank 2 (local rank 0 of another node, which shares the folder) find it written."""
    corpus = tmp_path / 'in.txt'
    corpus.write_text('some text to prepare, ' * 200)
    real = prepare_data.prepare
    monkeypatch.setattr(prepare_data, 'prepare', lambda name, data_dir: real('text', data_dir=data_dir,
                                                                             input=str(corpus), name=name))
    calls = []
    for name in ('barrier', 'all_reduce', 'broadcast', 'all_gather', 'all_gather_object', 'broadcast_object_list'):
        monkeypatch.setattr(torch.distributed, name, lambda *a, name=name, **k: calls[-1].append(name))
    cfg = dict(train_gpt.DEFAULTS, dataset='python_stdlib', data_dir=str(tmp_path / 'data'), block_size=8)
    for rank, local_rank in ((0, 0), (1, 1), (2, 0)):
        calls.append([])
        dist = train_common.Dist(True, rank, local_rank, 3, rank == 0, 'cpu')
        assert train_gpt.open_dataset(cfg, dist)[2]['train'] > 8
    assert os.path.isfile(tmp_path / 'data' / 'python_stdlib' / 'meta.json')
    assert calls[0] == calls[1] == calls[2] == ['barrier']


def test_the_training_step_lets_the_logits_go_before_the_backward(data_dir, tmp_path, monkeypatch):
    """The logits (batch x block x vocab: 1.2 GB in bf16 at owt-base) are not needed by the backward; the loss's
    log-softmax keeps what it needs. Nothing may hold them then: no name in the step, no tensor autograd saved
    (a saved tensor, or a view of it, keeps it alive). A weak reference to them is dead when the backward starts."""
    real, alive = tost.GPT.forward, []

    def forward(self, idx, targets=None):
        logits, loss = real(self, idx, targets)
        if loss is not None and loss.requires_grad:          # a training step, not an evaluation
            ref = weakref.ref(logits)
            loss.register_hook(lambda grad: alive.append(ref() is not None))   # runs as the backward starts
        return logits, loss
    monkeypatch.setattr(tost.GPT, 'forward', forward)
    for dtype in ('float32', 'bfloat16'):
        train_gpt.main(tiny(data_dir, str(tmp_path / dtype), '--max_iters=2', '--eval_interval=100',
                            '--gradient_accumulation_steps=2', f'--dtype={dtype}'))
    assert alive == [False] * 8


def test_accumulation_rounds_up_on_every_preset_for_1_to_4_processes():
    for name in [None, *train_gpt.PRESETS]:
        argv = [] if name is None else [f'--config={name}']
        cfg = options.parse(argv, train_gpt.DEFAULTS, presets=train_gpt.PRESETS)[0]
        steps = cfg['gradient_accumulation_steps']
        for n in (1, 2, 3, 4):
            per, total = train_gpt.split_accumulation(steps, n)
            assert per * n == total and steps <= total < steps + n, (name, n)
            assert (total == steps) == (steps % n == 0)
    assert train_gpt.split_accumulation(40, 3) == (14, 42) and train_gpt.split_accumulation(1, 2) == (1, 2)


# -----------------------------------------------------------------------------
# the GPU paths, run on CPU at tiny size


@pytest.mark.slow
def test_compiled_run_saves_plain_weights_and_resumes_compiled(data_dir, tmp_path):
    """--compile=true (inductor, on CPU here): a short run, its checkpoint, a compiled resume from it, all
    within float rounding of the same run without compile. The first compile takes about a minute."""
    out, eager = str(tmp_path / 'compiled'), str(tmp_path / 'eager')  # no dropout: inductor draws its own masks
    train_gpt.main(tiny(data_dir, out, '--max_iters=4', '--eval_interval=2', '--compile=true'))
    assert not any('_orig_mod' in k for k in weights(out)['model'])
    train_gpt.main(['--init_from=resume', f'--out_dir={out}', '--compile=true', '--max_iters=6', '--dtype=float32'])
    train_gpt.main(tiny(data_dir, eager, '--max_iters=4', '--eval_interval=2'))
    train_gpt.main(['--init_from=resume', f'--out_dir={eager}', '--max_iters=6', '--dtype=float32'])
    assert weights(out)['iter_num'] == 6
    for a, b in zip(read_log(out), read_log(eager)):
        assert (a['iter'], a['kind']) == (b['iter'], b['kind']) and abs(a['train_loss'] - b['train_loss']) < 1e-4
    assert same_run(weights(eager), weights(out)) < 0.01


@pytest.mark.parametrize('dtype', ['bfloat16', 'float16'])
def test_mixed_precision_runs_on_cpu(data_dir, tmp_path, dtype):
    """bf16 autocast, and fp16 with the GradScaler (its state is saved and resumed), as on a GPU."""
    out, ref = str(tmp_path / dtype), str(tmp_path / 'float32')
    train_gpt.main(tiny(data_dir, out, '--max_iters=4', '--eval_interval=2', f'--dtype={dtype}'))
    train_gpt.main(tiny(data_dir, ref, '--max_iters=4', '--eval_interval=2'))
    scaler = weights(out)['scaler']
    assert ('scale' in scaler) == (dtype == 'float16')            # fp16: loss scaling on; bf16 needs none
    if dtype == 'float16':
        assert 0 < scaler['scale'] <= 2.0 ** 16
    for a, b in zip(read_log(out), read_log(ref)):                # mixed precision, same run: close losses
        assert abs(a['train_loss'] - b['train_loss']) < 0.05, (a, b)
    train_gpt.main(['--init_from=resume', f'--out_dir={out}', '--max_iters=6', f'--dtype={dtype}'])  # dtype: this
    assert weights(out)['iter_num'] == 6 and weights(out)['config']['dtype'] == dtype          # machine's choice


def test_fused_adamw_trains_like_foreach(data_dir, tmp_path, monkeypatch):
    """tost's optimizer is torch's fused AdamW on cuda and cpu; the same run with the multi-tensor (foreach)
    AdamW, what other devices get, must land where the fused one does."""
    fused, ref = str(tmp_path / 'fused'), str(tmp_path / 'foreach')
    train_gpt.main(tiny(data_dir, fused, '--max_iters=4', '--eval_interval=2'))
    real = tost.GPT.configure_optimizers
    monkeypatch.setattr(tost.GPT, 'configure_optimizers', lambda self, wd, lr, betas, device_type:
                        real(self, wd, lr, betas, 'mps'))
    train_gpt.main(tiny(data_dir, ref, '--max_iters=4', '--eval_interval=2'))
    assert all(g['fused'] for g in weights(fused)['optimizer']['param_groups'])
    assert not any(g['fused'] for g in weights(ref)['optimizer']['param_groups'])
    assert same_run(weights(ref), weights(fused)) < 0.01
    for x, y in zip(read_log(ref), read_log(fused)):
        assert abs(x['train_loss'] - y['train_loss']) < 1e-5


def test_mfu_is_shown_and_agrees_with_tokens_per_second(data_dir, tmp_path, monkeypatch, capsys):
    """No MFU on a CPU (no known peak); given a peak, the row shows it, and it is the model's FLOPs per token
    times the measured tokens/s over the peak."""
    monkeypatch.setattr(train_gpt, 'peak_flops', lambda device, dtype: 1e9)
    out = str(tmp_path / 'out')
    train_gpt.main(tiny(data_dir, out, '--max_iters=4', '--eval_interval=100'))
    assert 'mfu ' in capsys.readouterr().out
    model = tost.GPT(tost.GPTConfig(**weights(out)['model_args']))
    rows = read_log(out, kind='train')
    assert len(rows) == 4
    for r in rows:
        assert r['mfu'] == pytest.approx(model.flops_per_token(32) * r['tokens_per_sec'] / 1e9, rel=1e-9)
        assert r['tokens_per_sec'] == pytest.approx(4 * 32 / (r['ms_per_iter'] / 1000), rel=1e-9)


# what torch.cuda.get_device_name() returns on each, and the dense bfloat16 peak (None: no MFU)
GPU_NAMES = [('NVIDIA H100 80GB HBM3', 989e12), ('NVIDIA H100 PCIe', 756e12), ('NVIDIA H100 NVL', 835e12),
             ('NVIDIA H200', 989e12), ('NVIDIA GH200 480GB', 989e12), ('NVIDIA GH200 144G HBM3e', 989e12),
             ('NVIDIA A100-SXM4-80GB', 312e12), ('NVIDIA A100-SXM4-40GB', 312e12),
             ('NVIDIA A100 80GB PCIe', 312e12), ('NVIDIA A100-PCIE-40GB', 312e12), ('NVIDIA L40S', 362e12),
             ('NVIDIA L40', 181e12), ('NVIDIA L4', 121e12), ('NVIDIA A10', 125e12), ('NVIDIA A10G', None),
             ('NVIDIA GeForce RTX 4090', 165e12), ('Tesla T4', None), ('Tesla V100-SXM2-16GB', None),
             ('NVIDIA GeForce RTX 3090', None), ('Some Future GPU', None)]


@pytest.mark.parametrize('name, bf16', GPU_NAMES)
def test_peak_flops_by_the_whole_gpu_name(monkeypatch, name, bf16):
    """The whole name decides: 'NVIDIA L40' is not an L4, nor 'H100 PCIe' an SXM. float32 runs as TF32 at
    half the 16-bit rate from Ampere on; the T4 and V100 have float16 tensor cores only (bfloat16 is emulated)."""
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None: name)
    assert train_gpt.peak_flops('cuda:0', 'bfloat16') == bf16
    if bf16:
        assert train_gpt.peak_flops('cuda', 'float16') == bf16 and train_gpt.peak_flops('cuda', 'float32') == bf16 / 2
    assert train_gpt.peak_flops('cpu', 'float32') is None


def test_peak_flops_before_ampere_is_for_float16():
    names = dict(GPU_NAMES)
    assert names['Tesla T4'] is None and names['Tesla V100-SXM2-16GB'] is None      # no bfloat16 figure
    with pytest.MonkeyPatch.context() as mp:
        for name, fp16, fp32 in (('Tesla T4', 65e12, 8.1e12), ('Tesla V100-SXM2-16GB', 125e12, 15.7e12),
                                 ('Tesla V100-PCIE-32GB', 112e12, 14e12)):
            mp.setattr(torch.cuda, 'get_device_name', lambda device=None, name=name: name)
            assert (train_gpt.peak_flops('cuda', 'float16'), train_gpt.peak_flops('cuda', 'float32')) == (fp16, fp32)


def test_a_row_holds_the_mean_loss_since_the_last_row_and_the_time_without_eval(data_dir, tmp_path, monkeypatch):
    every, pairs = str(tmp_path / 'every'), str(tmp_path / 'pairs')
    train_gpt.main(tiny(data_dir, every, '--max_iters=4', '--eval_interval=100'))
    real = train_gpt.window_starts

    def slow_eval(seed, stream, *rest):
        if stream > 0:  # an eval batch: 4 of them at iter 2, 0.8 s in all
            time.sleep(0.2)
        return real(seed, stream, *rest)

    monkeypatch.setattr(train_gpt, 'window_starts', slow_eval)
    train_gpt.main(tiny(data_dir, pairs, '--max_iters=4', '--eval_interval=2', '--log_interval=2'))
    one = {r['iter']: r['train_loss'] for r in read_log(every, kind='train')}
    rows = read_log(pairs, kind='train')
    assert [r['iter'] for r in rows] == [2, 4]
    for r in rows:
        assert r['train_loss'] == pytest.approx((one[r['iter'] - 1] + one[r['iter']]) / 2, abs=1e-6)
    assert rows[1]['ms_per_iter'] < 150, rows[1]  # iters 3-4 around the 0.8 s eval at 2: the eval is not counted


SYNCS = ('item', 'tolist', '__float__', '__int__', '__bool__')


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


def test_the_training_step_does_not_wait_for_the_device(data_dir, tmp_path, monkeypatch):
    """As nanoGPT: the loss is read only for a log row. 10 more iterations with one more row: one more read."""
    calls = count_syncs(monkeypatch, {'train_gpt.py', 'tost.py', 'train_common.py'})
    counts = []
    for n in (10, 20):
        calls.clear()
        train_gpt.main(tiny(data_dir, str(tmp_path / str(n)), f'--max_iters={n}', '--eval_interval=1000',
                            '--log_interval=10'))
        counts.append(len(calls))
    assert counts[1] - counts[0] == 1, counts


# -----------------------------------------------------------------------------
# bad input: one line, non-zero exit, no traceback


def test_cli_bad_input(data_dir, tmp_path, trained, capsys):
    """The first as a user runs it, the others in this process, as run_main ends them."""
    out = str(tmp_path / 'out')
    r = run_cli('train_gpt.py', f'--data_dir={tmp_path}', '--dataset=openwebtext',  # hours: not made on the fly
                f'--out_dir={out}-owt')     # not the default out/, where the README's demo leaves its checkpoint
    assert r.returncode == 2
    one_line_error(r.stderr, 'not a prepared dataset', f'python prepare_data.py openwebtext --data_dir={tmp_path}')

    r = in_process(capsys, train_gpt.main, '--learning_rat=1')
    one_line_error(r.err, 'unknown option --learning_rat', 'valid keys', 'did you mean --learning_rate')
    assert r.code == 2
    r = in_process(capsys, train_gpt.main, '--max_iters=ten')
    one_line_error(r.err, '--max_iters expects int')
    r = in_process(capsys, train_gpt.main, '--attn=linear')
    one_line_error(r.err, "unknown attn 'linear'", 'tssa, softmax')

    r = in_process(capsys, train_gpt.main, *tiny(data_dir, out, '--init_from=resume'))
    one_line_error(r.err, f'no checkpoint at {out}', 'python train_gpt.py')
    os.makedirs(out)
    with open(os.path.join(out, 'ckpt.pt'), 'wb') as f:
        f.write(b'not a checkpoint at all')
    r = in_process(capsys, train_gpt.main, *tiny(data_dir, out, '--init_from=resume'))
    one_line_error(r.err, 'is not a checkpoint', 'zip archive')
    assert r.code == 2

    r = in_process(capsys, train_gpt.main, *tiny(data_dir, out + '2', '--block_size=5000'))  # val: ~4k tokens
    one_line_error(r.err, 'block_size 5000 is larger than the data', 'val tokens')

    open(out + '-file', 'w').close()                                  # an out_dir that is a file
    r = in_process(capsys, train_gpt.main, *tiny(data_dir, out + '-file'))
    one_line_error(r.err, f'{out}-file', f'--out_dir={out}-file')

    bad = os.path.join(str(tmp_path), 'cut')                           # a train.bin cut short after it was written
    shutil.copytree(os.path.join(data_dir, 'tiny'), os.path.join(bad, 'tiny'))
    with open(os.path.join(bad, 'tiny', 'train.bin'), 'r+b') as f:
        f.truncate(1000)
    r = in_process(capsys, train_gpt.main, *tiny(bad, out + '-cut'))
    one_line_error(r.err, 'train.bin has 500 tokens, not the', 'its meta.json says', '--force')
    assert not os.path.exists(out + '-cut')                            # nothing written: no empty log

    src, _ = trained  # resume: the model's position embedding has 32 rows, its shape is fixed
    resume = ('--init_from=resume', f'--out_dir={src}', f'--data_dir={data_dir}')
    r = in_process(capsys, train_gpt.main, *resume, '--block_size=64')
    one_line_error(r.err, 'block_size=64 is larger than the checkpoint', '32')
    r = in_process(capsys, train_gpt.main, *resume, '--n_layer=2')
    one_line_error(r.err, "--n_layer=2 does not match the checkpoint's model")


def test_rough_edges_end_in_one_line(data_dir, tmp_path, capsys):
    """Each before any work: nothing is prepared or written."""
    readme = os.path.join(REPO, 'README.md')
    for args, words in ((['--out_dir='], ['--out_dir']),
                        (['--learning_rate=-1'], ['--learning_rate', '-1']),
                        (['--learning_rate=nan'], ['--learning_rate', 'nan']),
                        (['--learning_rate=inf'], ['--learning_rate', 'inf']),
                        (['--dropout=1'], ['--dropout', '1']),
                        (['--beta2=1'], ['--beta2', '1']),   # AdamW's rule
                        ([f'--data_dir={readme}', f'--out_dir={tmp_path}/o'], [readme, '--data_dir']),
                        (tiny(data_dir, str(tmp_path / 'README.md' / 'out')), ['cannot', '--out_dir='])):
        if 'cannot' in words:
            (tmp_path / 'README.md').write_text('a file')
            words = [f'{tmp_path}/README.md', '--out_dir=']
        assert exits(train_gpt.main, args) == 2, args
        one_line_error(capsys.readouterr().err, *words)
    assert sorted(os.listdir(tmp_path)) == ['README.md']


@pytest.mark.parametrize('native', [True, False])
def test_auto_dtype_on_a_cpu_and_the_header_says_why(data_dir, tmp_path, monkeypatch, capsys, native):
    monkeypatch.setattr(torch.cpu, '_is_avx512_bf16_supported', lambda: native)
    train_gpt.main(tiny(data_dir, str(tmp_path), '--max_iters=1', '--dtype=auto'))
    want = 'bfloat16 (auto: this CPU has bfloat16 instructions)' if native else 'float32 (auto)'
    assert f'device cpu, {want}, compile False' in capsys.readouterr().out
    assert weights(str(tmp_path))['config']['dtype'] == 'auto'                  # chosen again on a resume
    with open(tmp_path / 'log.jsonl') as f:
        assert json.loads(f.readline())['dtype'] == ('bfloat16' if native else 'float32')   # the log says which


# A GPU's out of memory, and a CPU's: its allocator raises a RuntimeError.
@pytest.mark.parametrize('error', [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
                                   RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
                                                "can't allocate memory: you tried to allocate 80000000000 bytes")])
def test_out_of_memory_on_first_step(data_dir, tmp_path, monkeypatch, capsys, error):
    def oom(self, idx, targets=None):
        if self.training:
            raise error
        return real(self, idx, targets)

    real = tost.GPT.forward
    monkeypatch.setattr(tost.GPT, 'forward', oom)
    assert exits(train_gpt.main, tiny(data_dir, str(tmp_path), '--max_iters=3')) == 2
    one_line_error(capsys.readouterr().err, 'out of memory', '--batch_size=2',
                   '--gradient_accumulation_steps=2')


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(data_dir, tmp_path, monkeypatch, capsys):
    out, steps = str(tmp_path / 'out'), []
    real = tost.GPT.forward

    def nan_from_iter_3(self, idx, targets=None):
        logits, loss = real(self, idx, targets)
        if self.training:
            steps.append(1)
            if len(steps) > 3:
                loss = loss * float('nan')
        return logits, loss

    monkeypatch.setattr(tost.GPT, 'forward', nan_from_iter_3)
    assert exits(train_gpt.main, tiny(data_dir, out, '--max_iters=6', '--eval_interval=2')) == 3
    line = one_line_error(capsys.readouterr().err, 'nan at iter 4', '--learning_rate', '--weight_decay')
    assert f'{out}/ckpt.pt (iter 2)' in line
    ckpt = weights(out)
    assert ckpt['iter_num'] == 2 and all(torch.isfinite(v).all() for v in ckpt['model'].values())


def test_a_nan_eval_loss_stops_before_anything_is_saved(data_dir, tmp_path, monkeypatch, capsys):
    real = tost.GPT.forward

    def nan_in_eval(self, idx, targets=None):
        logits, loss = real(self, idx, targets)
        return logits, loss if self.training else loss * float('nan')

    monkeypatch.setattr(tost.GPT, 'forward', nan_in_eval)
    assert exits(train_gpt.main, tiny(data_dir, str(tmp_path), '--max_iters=4', '--eval_interval=2')) == 3
    one_line_error(capsys.readouterr().err, 'nan at iter 0')
    assert not os.path.exists(tmp_path / 'ckpt.pt')


def test_a_schedule_shorter_than_the_run_is_noted(data_dir, tmp_path, capsys):
    train_gpt.main(tiny(data_dir, str(tmp_path), '--max_iters=3', '--lr_decay_iters=2', '--eval_interval=3'))
    assert 'note: the schedule decays to min_lr at iter 2 and stays there' in capsys.readouterr().out
    assert [r['lr'] for r in read_log(str(tmp_path), kind='train')][-1] == 3e-3 * train_gpt.DEFAULTS['min_lr_ratio']
    train_gpt.main(tiny(data_dir, str(tmp_path / 'warm'), '--max_iters=2', '--warmup_iters=5', '--eval_interval=2'))
    assert 'note: the warmup (5 iters) is as long as the run: the learning rate never reaches' in capsys.readouterr().out


def test_a_resume_onto_data_of_another_tokenizer_is_one_line(data_dir, trained, tmp_path, capsys):
    """The checkpoint's token ids mean nothing under another tokenizer: refused before any work, with the fix."""
    other = tmp_path / 'data'
    shutil.copytree(os.path.join(data_dir, 'tiny'), other / 'tiny')
    meta = json.loads((other / 'tiny' / 'meta.json').read_text())
    (other / 'tiny' / 'meta.json').write_text(json.dumps(dict(meta, tokenizer='gpt2', vocab_size=257)))
    out = tmp_path / 'out'
    shutil.copytree(trained[0], out)
    assert exits(train_gpt.main, tiny(str(other), str(out), '--init_from=resume', '--max_iters=20')) == 2
    one_line_error(capsys.readouterr().err, 'uses tokenizer gpt2 (257 ids)', 'trained with bytes (256 ids)',
                   '--tokenizer=bytes')
    assert torch.load(out / 'ckpt.pt', weights_only=True)['iter_num'] == 12

def test_a_vision_checkpoint_is_named_as_such(data_dir, tmp_path):
    out = tmp_path / 'vit'
    out.mkdir()
    model = tost.ViT(tost.preset('tost-cifar-tiny'))
    train_common.atomic_save({'kind': 'vit', 'model': model.state_dict(), 'model_args': {'img_size': 32},
                              'epoch': 1, 'meta': {'kind': 'images'}}, str(out / 'ckpt.pt'))
    r = run_cli('sample.py', f'--out_dir={out}')
    assert r.returncode == 2
    one_line_error(r.stderr, 'is a vision checkpoint', 'train_vit.py')
    r = run_cli('train_gpt.py', *tiny(data_dir, str(out), '--init_from=resume'))
    assert r.returncode == 2
    one_line_error(r.stderr, 'is a vision checkpoint', 'not a language-model one')


def test_token_shift_is_a_key_recorded_in_the_checkpoint_and_kept_on_resume(data_dir, tmp_path):
    out = str(tmp_path / 'shift')
    train_gpt.main(tiny(data_dir, out, '--max_iters=4', '--eval_interval=2', '--token_shift=true'))
    ckpt = weights(out)
    assert ckpt['model_args']['token_shift'] is True
    assert any(k.endswith('shift.mu') for k in ckpt['model'])
    train_gpt.main(['--init_from=resume', f'--out_dir={out}', '--max_iters=6'])
    assert weights(out)['iter_num'] == 6 and weights(out)['model_args']['token_shift'] is True
    with pytest.raises(train_common.UsageError, match='token_shift'):     # the model's shape is fixed on resume
        train_gpt.main(['--init_from=resume', f'--out_dir={out}', '--max_iters=8', '--token_shift=false'])
    sample.main([f'--out_dir={out}', '--start=def', '--num_samples=1', '--max_new_tokens=5', '--device=cpu'])


def test_a_resume_keeps_no_second_copy_of_the_weights(data_dir, tmp_path, monkeypatch):
    """The checkpoint is loaded onto the device: its weights, once in the model, are let go (on a GPU they
    would hold the model's memory twice for the whole run)."""
    out, loaded = str(tmp_path), []
    train_gpt.main(tiny(data_dir, out, '--max_iters=2'))
    monkeypatch.setattr(train_gpt, 'load_checkpoint', lambda *a, **k: loaded.append(train_common.load_checkpoint(
        *a, **k)) or loaded[-1])
    train_gpt.main(['--init_from=resume', f'--out_dir={out}', '--max_iters=4'])
    assert len(loaded) == 1 and 'optimizer' in loaded[0] and 'model' not in loaded[0]


def test_softmax_layers_is_a_key_recorded_in_the_checkpoint_and_kept_on_resume(data_dir, tmp_path, capsys):
    out = str(tmp_path / 'hybrid')
    train_gpt.main(tiny(data_dir, out, '--max_iters=4', '--eval_interval=2', '--n_layer=2', '--softmax_layers=-1',
                        '--token_shift=true'))
    assert 'attn=tssa (softmax in block 1) + token shift, 2 layers' in capsys.readouterr().out
    ckpt = weights(out)                                              # weights_only=True reads the list
    assert ckpt['model_args']['softmax_layers'] == [1] and ckpt['config']['softmax_layers'] == '-1'
    assert ckpt['model']['transformer.h.1.attn.c_attn.weight'].shape == (96, 32)     # q, k, v: softmax
    assert 'transformer.h.0.attn.temp' in ckpt['model'] and 'transformer.h.1.attn.temp' not in ckpt['model']
    with open(os.path.join(out, 'log.jsonl')) as f:
        config = json.loads(f.readline())
    assert config['kind'] == 'config' and config['softmax_layers'] == [1]
    assert plot.model_name(config) == 'hybrid + shift'
    train_gpt.main(['--init_from=resume', f'--out_dir={out}', '--max_iters=6', '--softmax_layers=1'])  # = -1
    assert weights(out)['iter_num'] == 6 and weights(out)['model_args']['softmax_layers'] == [1]
    with pytest.raises(train_common.UsageError, match="--softmax_layers=0 does not match the checkpoint's model"):
        train_gpt.main(['--init_from=resume', f'--out_dir={out}', '--max_iters=8', '--softmax_layers=0'])
    sample.main([f'--out_dir={out}', '--start=def', '--num_samples=1', '--max_new_tokens=5', '--device=cpu'])


def test_a_resume_checks_its_options_against_the_checkpoint_not_the_defaults(data_dir, tmp_path, capsys):
    """Block 4 of 5 is no block of the default 4: a resume that names it again is fine."""
    out = str(tmp_path)
    train_gpt.main(tiny(data_dir, out, '--max_iters=2', '--eval_interval=2', '--n_layer=5', '--softmax_layers=4'))
    train_gpt.main(['--init_from=resume', f'--out_dir={out}', '--max_iters=3', '--softmax_layers=4'])
    assert weights(out)['iter_num'] == 3 and weights(out)['model_args']['softmax_layers'] == [4]
    assert exits(train_gpt.main, tiny(data_dir, str(tmp_path / 'none'), '--max_iters=0')) == 2
    one_line_error(capsys.readouterr().err, '--max_iters must be positive, got 0')
    # the cosine's floor follows the learning rate: any positive one goes
    train_gpt.main(['--init_from=resume', f'--out_dir={out}', '--max_iters=4', '--learning_rate=1e-5'])
    assert 0 < read_log(out, kind='train')[-1]['lr'] <= 1e-5


def test_softmax_layers_mistakes():
    """Said before any work (no data prepared, no folder made), by tost.GPTConfig's own checks."""
    args = dict(train_gpt.DEFAULTS, vocab_size=256)
    args = {k: args[k] for k in ('block_size', 'vocab_size', *train_gpt.MODEL_KEYS)}
    assert train_gpt.gpt_config(dict(args, softmax_layers='0,-1')).softmax_layers == (0, 3)
    assert train_gpt.gpt_config(args).softmax_layers == ()
    for bad, words in [('4', 'must be block indices from -4 to 3'), ('-5', 'from -4 to 3'),
                       ('last', "--softmax_layers expects block indices separated by commas"),
                       ('0 --attn=softmax', "with attn='softmax' every block is already")]:
        with pytest.raises(train_common.UsageError, match=words):
            train_gpt.main(['--data_dir=/nonexistent', f'--softmax_layers={bad.split()[0]}', *bad.split()[1:]])
    r = run_cli('train_gpt.py', '--softmax_layers=0,7', '--data_dir=/nonexistent')
    one_line_error(r.stderr, 'softmax_layers [0, 7] must be block indices from -4 to 3')
    assert r.returncode == 2


def test_resume_with_nothing_to_do_says_so_and_time_carries_on(data_dir, tmp_path, capsys):
    out = str(tmp_path / 'out')
    train_gpt.main(tiny(data_dir, out, '--max_iters=4', '--eval_interval=2'))
    before = Path(out, 'log.jsonl').read_text()
    capsys.readouterr()
    train_gpt.main(['--init_from=resume', f'--out_dir={out}', '--max_iters=3', '--device=cpu'])  # not resumed
    printed = capsys.readouterr().out
    assert printed.strip() == (f'nothing to do: {out}/ckpt.pt is at iter 4 and --max_iters is 3; pass a larger '
                               f'--max_iters to train on')
    assert Path(out, 'log.jsonl').read_text() == before and weights(out)['iter_num'] == 4
    time.sleep(0.5)                                                  # a gap the resumed clock must not count
    train_gpt.main(['--init_from=resume', f'--out_dir={out}', '--max_iters=6', '--device=cpu'])
    rows = read_log(out)
    elapsed = [r['elapsed_s'] for r in rows]
    assert [r['iter'] for r in rows if r['kind'] == 'train'] == [1, 2, 3, 4, 5, 6]
    assert elapsed == sorted(elapsed) and elapsed[-1] < elapsed[3] + 0.5 + 5   # goes on from the checkpoint's
    assert rows[-1]['tokens'] == 6 * 4 * 32 and weights(out)['tokens'] == 6 * 4 * 32
