"""
Tests for eval_gpt.py: tiny checkpoints and tiny test sets in the published formats, offline, seconds.
    python -m pytest -q tests/test_eval_gpt.py
What they prove: docs/evaluation.md, "Tested".
"""
import contextlib
import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import eval_gpt
import prepare_data as prep
import readers
import tost
import train_common
from test_prepare_data import encoding
from conftest import one_line, run_main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=REPO)

pytestmark = pytest.mark.usefixtures('one_thread')    # conftest.py

WIKI = ''.join(f' = Article {i} = \n \n The {i}th article is about the number {i} , and not much @-@ else .'
               f'\n \n' for i in range(30))
PASSAGES = [f'Passage {i} tells of {"many " * (i % 7)}things, and ends with the word word{i % 3}'
            for i in range(11)]


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    """wikitext2 (~1.8k tokens) and lambada (11 passages) prepared with the tiny encoding as 'gpt2'."""
    d = tmp_path_factory.mktemp('data')
    (d / 'wiki.test.raw').write_text(WIKI)
    (d / 'lambada_test.jsonl').write_text(''.join(json.dumps({'text': p}) + '\n' for p in PASSAGES))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(readers, 'gpt2_encoding', lambda: encoding())
        prep.prepare('wikitext2', d, input=str(d / 'wiki.test.raw'))
        prep.prepare('lambada', d, input=str(d / 'lambada_test.jsonl'))
    return d


def save_model(out_dir, data_dir, attn='tssa', block_size=32, n_embd=32, n_head=2, edit=None,
               dataset='lambada', config=None):
    """A random (or `edit`ed) GPT saved as train_gpt.py saves it, with the data's tokenizer in its meta (that
    of `dataset`) and `config`, the run's options."""
    torch.manual_seed(0)
    meta = prep.load_meta(os.path.join(data_dir, dataset))
    args = dict(block_size=block_size, vocab_size=64 * -(-meta['vocab_size'] // 64), n_layer=2, n_head=n_head,
                n_embd=n_embd, dropout=0.0, bias=False, attn=attn)
    model = tost.GPT(tost.GPTConfig(**args))
    if edit:
        edit(model)
    os.makedirs(out_dir, exist_ok=True)
    train_common.atomic_save(dict(model=model.state_dict(), model_args=args, meta=meta, iter_num=7,
                                  config=config or {}), os.path.join(out_dir, 'ckpt.pt'))
    return model.eval()


def read_log(out_dir):
    """The log's rows but the config rows (what each start of the run was; plot.py reads them)."""
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [r for r in map(json.loads, f) if r.get('kind') != 'config']


def tokens_of(data_dir, name):
    return np.fromfile(os.path.join(data_dir, name, 'val.bin'), dtype=np.uint16).astype(np.int64)


def refused(capsys, argv, *names):
    """eval_gpt as the command ends it: exit 2, and one line on stderr naming each of `names` (an option, a
    path)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run_main(lambda: eval_gpt.main(argv))
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and all(name in lines[0] for name in names), lines
    return lines[0]

# -----------------------------------------------------------------------------
# the loss


@pytest.mark.parametrize('attn', ['tssa', 'softmax'])
def test_loss_is_every_token_once_as_a_plain_loop(data_dir, tmp_path, capsys, attn):
    out = str(tmp_path / 'out')
    model = save_model(out, data_dir, attn=attn)
    with open(os.path.join(out, 'log.jsonl'), 'w') as f:  # a training log is there already
        f.write(json.dumps({'iter': 7, 'kind': 'eval', 'val_loss': 5.0}) + '\n')
    # blanks, an empty name and a repeated one are typing
    eval_gpt.main([f'--out_dir={out}', f'--data_dir={data_dir}', '--datasets=wikitext2, lambada,,wikitext2',
                   '--device=cpu', '--dtype=float32', '--batch_size=3'])
    log = read_log(out)
    assert log[0] == {'iter': 7, 'kind': 'eval', 'val_loss': 5.0}  # appended, not truncated
    assert [r['dataset'] for r in log[1:]] == ['wikitext2', 'lambada']
    assert all(r['kind'] == 'zero_shot' for r in log[1:])
    for r in log[1:]:
        x = torch.from_numpy(tokens_of(data_dir, r['dataset']))
        # the reference: window by window (33 tokens: 32 read, 32 predicted), its mean loss times its length
        with torch.no_grad():
            parts = [(model(w[None, :-1], w[None, 1:])[1].item(), len(w) - 1)
                     for w in (x[s:s + 33] for s in range(0, len(x) - 1, 32))]
        count = sum(n for _, n in parts)
        assert r['tokens'] == count == len(x) - 1 and r['windows'] == len(parts)
        assert abs(r['loss'] - sum(loss * n for loss, n in parts) / count) < 1e-5
        assert abs(r['ppl'] - np.exp(r['loss'])) < 1e-6 * r['ppl']
        assert (r['attn'], r['iter'], r['block_size'], r['processes']) == (attn, 7, 32, 1)
    assert 'last_word_acc' in log[2] and 'last_word_acc' not in log[1]
    table = capsys.readouterr().out.splitlines()
    row = next(line for line in table if line.split()[0] == 'wikitext2')  # not the progress line 'wikitext2:'
    assert f"{log[1]['loss']:.4f}" in row and row.split()[-2:] == ['4.77', '4.13']  # the paper's, beside ours


def test_the_table_stays_aligned_for_a_long_dataset_name():
    r = dict(tokens=1000, loss=2.5, ppl=12.18, dataset_kind='x', tokenizer='bytes')
    names = ['a', 'a_dataset_name_longer_than_the_column_was']
    lines = eval_gpt.table([dict(r, dataset=n) for n in names], 'model').splitlines()
    ends = [lines[1].index('loss') + 4] + [line.index('2.5000') + 6 for line in lines[2:]]
    assert len(ends) == 3 and len(set(ends)) == 1


def test_each_token_is_scored_once_and_lambada_reads_the_device_once(data_dir, tmp_path, monkeypatch):
    """The model is asked for its logits, not for its mean loss beside them: that was a second cross-entropy
    over batch x block x vocab (float32: 3 GB at batch 8 on GPT-2's vocabulary). LAMBADA needs none, and
    compares the guesses on the device: one read at the end (the gather), not one per passage."""
    model = save_model(str(tmp_path / 'out'), data_dir)
    one = train_common.Dist(False, 0, 0, 1, True, 'cpu')
    ctx = train_common.autocast('cpu', 'float32')
    ce = []
    reads = []
    real_ce = torch.nn.functional.cross_entropy
    monkeypatch.setattr(torch.nn.functional, 'cross_entropy',
                        lambda *a, **k: ce.append(1) or real_ce(*a, **k))
    for name in ('item', 'tolist', 'cpu', 'numpy', '__bool__', '__float__', '__int__'):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name,
                            lambda self, *a, _real=real, **k: reads.append(1) or _real(self, *a, **k))
    tokens = tokens_of(data_dir, 'wikitext2')
    _, _, n_windows = eval_gpt.split_loss(model, tokens, 32, 3, ctx, one)
    assert n_windows == -(-(len(tokens) - 1) // 32) and len(ce) == -(-n_windows // 3)   # one per batch
    ce.clear()
    reads.clear()
    flags, _ = eval_gpt.last_word_accuracy(model, tokens_of(data_dir, 'lambada'),
                                           np.load(data_dir / 'lambada' / 'val_targets.npy'), 32, 3, ctx, one)
    assert len(flags) == len(PASSAGES) and ce == [] and len(reads) == 1


@pytest.mark.slow
def test_two_processes_give_the_same_numbers_as_one(data_dir, tmp_path):
    """Bit for bit. batch_size=3 gives an odd number of batches, so the processes do unequal shares, and
    the last window is a short one."""
    out = str(tmp_path / 'out')
    save_model(out, data_dir, block_size=16)
    args = [f'--out_dir={out}', f'--data_dir={data_dir}', '--datasets=wikitext2,lambada', '--device=cpu',
            '--batch_size=3']
    for launch in ([], ['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']):
        run = subprocess.run([sys.executable, *launch, os.path.join(REPO, 'eval_gpt.py'), *args],
                             capture_output=True, text=True, env=ENV, cwd=str(tmp_path), timeout=180)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    # only rank 0 talks: the 2-process run prints the table once
    assert run.stdout.count('zero-shot loss of') == 1
    log = read_log(out)
    # the 1-process run's two lines, then the 2-process run's
    a = log[:2]
    b = log[2:]
    n = len(tokens_of(data_dir, 'wikitext2')) - 1
    windows = -(-n // 16)
    assert n % 16 and -(-windows // 3) % 2  # a short last window, an odd number of batches of 3
    for ra, rb in zip(a, b):
        assert (ra['processes'], rb['processes']) == (1, 2)
        for key in ('loss', 'tokens', 'windows', 'last_word_acc', 'last_word_correct'):
            assert ra.get(key) == rb.get(key), key  # ==, not approximately
    assert a[1]['passages'] == len(PASSAGES)

# -----------------------------------------------------------------------------
# LAMBADA's accuracy, where the answer is known


def repeat_model(model):
    """Make the GPT predict its input token again: every block adds nothing (all its weights 0), no
    positions, and token a embeds as the centred one-hot e_a, so LN(e_a) . e_b is largest at b = a."""
    with torch.no_grad():
        for p in model.transformer.h.parameters():
            p.zero_()
        model.transformer.wpe.weight.zero_()
        V, d = model.transformer.wte.weight.shape
        model.transformer.wte.weight.copy_(torch.eye(V, d) - 1 / d)  # tied: also the output layer


def test_lambada_accuracy_where_the_answer_is_known(tmp_path, capsys):
    merges = (b' z', b' zz', b' y', b' yy')  # ' zz' and ' yy' are one token each
    enc = encoding(merges)
    passages = {  # passage: whether greedy decoding gets its last word, for a model that repeats its input
        'one zz zz': True,     # context ends with ' zz', target ' zz'
        'one zz yy': False,
        'one yy yy': True,
        'zz zz': False,        # the context 'zz' is 'z', 'z' (no space): it predicts 'z'
        'one zz zzz': False,   # target ' zz', 'z': the first token is right, the second is not
        'a long passage, longer than the window of sixteen tokens, yy yy': True,   # cut to its last 16 tokens
        'then a line\nyy': False,  # the word after a newline: target 'y', 'y' after '\n'
    }
    d = tmp_path / 'data'
    d.mkdir()
    (d / 'lambada_test.jsonl').write_text(''.join(json.dumps({'text': p}) + '\n' for p in passages))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(readers, 'gpt2_encoding', lambda: enc)
        prep.prepare('lambada', d, input=str(d / 'lambada_test.jsonl'))
    out = str(tmp_path / 'out')
    model = save_model(out, d, block_size=16, n_embd=320, n_head=4, edit=repeat_model)
    x = torch.randint(0, model.config.vocab_size, (2, 16))
    assert torch.equal(model(x, x)[0].argmax(-1), x)  # the construction works: it repeats every token

    spans = np.load(d / 'lambada' / 'val_targets.npy')
    assert spans[5, 2] - spans[5, 0] > 17  # the long passage does not fit a window
    one = train_common.Dist(False, 0, 0, 1, True, 'cpu')
    flags, cut = eval_gpt.last_word_accuracy(model, tokens_of(d, 'lambada'), spans, 16, 3,
                                             train_common.autocast('cpu', 'float32'), one)
    assert flags == list(passages.values()) and cut == 1

    eval_gpt.main([f'--out_dir={out}', f'--data_dir={d}', '--datasets=lambada', '--device=cpu'])
    r = read_log(out)[-1]
    assert (r['last_word_correct'], r['passages'], r['passages_cut']) == (3, 7, 1)
    assert r['last_word_acc'] == 3 / 7
    # ' zz', 'z' does not fit a window of 1
    refused(capsys, [f'--out_dir={out}', f'--data_dir={d}', '--datasets=lambada', '--block_size=1'],
            '--block_size')


def test_bad_input_is_one_line_naming_what_is_wrong(data_dir, tmp_path, capsys):
    """eval_gpt's own checks, all before any work (reading a checkpoint is train_common's, tested there)."""
    out = str(tmp_path / 'out')
    base = [f'--out_dir={out}', f'--data_dir={data_dir}', '--device=cpu']
    save_model(out, data_dir)
    (data_dir / 'bytes_text.txt').write_text('some bytes to evaluate on, ' * 20)
    prep.prepare('text', data_dir, input=str(data_dir / 'bytes_text.txt'))
    short = data_dir / 'short'                                   # a val.bin cut short after it was prepared
    shutil.copytree(data_dir / 'wikitext2', short)
    with open(short / 'val.bin', 'r+b') as f:
        f.truncate(100)
    # a val.bin whose ids are past the vocab (all 65535): not an IndexError inside the model
    noise = data_dir / 'noise'
    shutil.copytree(data_dir / 'wikitext2', noise)
    (noise / 'val.bin').write_bytes(b'\xff' * (noise / 'val.bin').stat().st_size)
    # the default sets (ptb is not prepared here), a window longer than the model's, no set, a set in another
    # tokenizer, damaged sets
    for extra, name in (([], 'prepare_data.py ptb'),
                        (['--datasets=wikitext2', '--block_size=64'], '--block_size'),
                        (['--datasets= ,'], '--datasets=wikitext2'),
                        (['--datasets=wikitext2,bytes_text'], 'bytes_text'),
                        (['--datasets=short'], f'{short}/val.bin'),
                        (['--datasets=wikitext2,noise'], f'{noise}/val.bin')):
        refused(capsys, base + extra, name)
    # a set in another tokenizer: the command that rebuilds it in the model's
    refused(capsys, base + ['--datasets=bytes_text'], 'bytes_text', '--force', '--tokenizer=')
    # an empty list typed is not auto's: the checkpoint is not blamed
    assert 'ckpt.pt' not in refused(capsys, base + ['--datasets=,'], '--datasets')
    assert not os.path.exists(os.path.join(out, 'log.jsonl'))


def test_by_default_a_model_is_scored_on_its_own_dataset_and_a_gpt2_one_also_on_the_papers_test_sets(
        data_dir, tmp_path, capsys):
    """The demo's model (bytes, python_stdlib) is scored on the set it learned from: no OpenWebText in bytes
    (17 GB) to prepare. A GPT-2 model trained on OpenWebText gets the paper's four; a set not prepared is
    named with its own command, and OpenWebText's only for a model trained on it."""
    d = tmp_path / 'data'
    (tmp_path / 'mine.txt').write_text('some bytes to learn from, ' * 40)
    prep.prepare('text', d, input=str(tmp_path / 'mine.txt'), name='mine', tokenizer='bytes')
    out = str(tmp_path / 'demo')
    argv = [f'--out_dir={out}', f'--data_dir={d}', '--device=cpu', '--dtype=float32']
    save_model(out, d, dataset='mine', config={'dataset': 'mine'})
    eval_gpt.main(argv)
    assert [r['dataset'] for r in read_log(out)] == ['mine']
    # without --data_dir, the one the model was trained from
    save_model(out, d, dataset='mine', config={'dataset': 'mine', 'data_dir': str(d)})
    eval_gpt.main([a for a in argv if not a.startswith('--data_dir')])
    assert [r['dataset'] for r in read_log(out)] == ['mine', 'mine']
    save_model(out, d, dataset='mine', config={'dataset': 'python_stdlib'})
    assert 'openwebtext' not in refused(capsys, argv, f'prepare_data.py python_stdlib --data_dir={d}')
    # a checkpoint that names no dataset: a set of its tokenizer is suggested, not GPT-2's
    save_model(out, d, dataset='mine', config={})
    refused(capsys, argv, f'{out}/ckpt.pt', '--datasets=python_stdlib')
    # a GPT-2 model trained on a set of its own (here a copy of wikitext2), then on OpenWebText (another copy)
    d = tmp_path / 'gpt2'
    shutil.copytree(data_dir / 'wikitext2', d / 'own')
    shutil.copytree(data_dir / 'lambada', d / 'lambada')
    shutil.copytree(data_dir / 'wikitext2', d / 'wikitext2')
    argv = [f'--out_dir={out}', f'--data_dir={d}', '--device=cpu', '--dtype=float32']
    save_model(out, d, config={'dataset': 'own'})
    assert 'openwebtext' not in refused(capsys, argv, 'prepare_data.py ptb', '--tokenizer=gpt2')
    shutil.copytree(data_dir / 'wikitext2', d / 'ptb')
    save_model(out, d, config={'dataset': 'openwebtext'})
    refused(capsys, argv, 'prepare_data.py openwebtext')
    shutil.copytree(data_dir / 'wikitext2', d / 'openwebtext')
    os.remove(os.path.join(out, 'log.jsonl'))
    eval_gpt.main(argv)
    assert [r['dataset'] for r in read_log(out)] == list(eval_gpt.PAPER)


def test_a_log_that_cannot_be_written_is_refused_before_the_work_and_a_full_disk_loses_no_result(
        data_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / 'out'
    argv = [f'--out_dir={out}', f'--data_dir={data_dir}', '--datasets=wikitext2', '--device=cpu']
    save_model(str(out), data_dir)
    # a folder in the log's place: refused before any dataset is scored
    (out / 'log.jsonl').mkdir()
    scored = []
    monkeypatch.setattr(eval_gpt, 'split_loss', lambda *args: scored.append(1))
    refused(capsys, argv, f'{out}/log.jsonl')
    assert scored == []
    monkeypatch.undo()
    (out / 'log.jsonl').rmdir()
    # the disk fills as a result is written: it is on stdout already
    eval_gpt.main(argv)
    loss = read_log(str(out))[0]['loss']

    def full(*args):
        raise OSError(28, 'No space left on device')

    def open_full(path, mode='r'):
        """The checkpoint reads as before; writes fail."""
        return open(path, mode) if mode == 'rb' else contextlib.nullcontext(SimpleNamespace(write=full))

    monkeypatch.setattr(train_common, 'open', open_full, raising=False)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run_main(lambda: eval_gpt.main(argv))
    printed = capsys.readouterr()
    row = next(line for line in printed.out.splitlines() if line.startswith('wikitext2'))
    assert f'{loss:.4f}' in row and e.value.code == 2
    one_line(printed.err, f'{out}/log.jsonl')


@pytest.mark.skipif(not os.path.exists('/dev/full'), reason='needs /dev/full')
def test_a_stdout_that_cannot_be_written_is_one_line_and_a_closed_pipe_ends_quietly(data_dir, tmp_path):
    """`> /dev/full`: the table would be lost, so exit 2 with one line, before any dataset is scored.
    `| head`: the reader left, and the evaluation ends quietly (141, as any program in a pipe)."""
    out = str(tmp_path / 'out')
    save_model(out, data_dir)
    argv = [sys.executable, os.path.join(REPO, 'eval_gpt.py'), f'--out_dir={out}', f'--data_dir={data_dir}',
            '--datasets=wikitext2', '--device=cpu']
    with open('/dev/full', 'w') as full:
        run = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, env=ENV, timeout=180)
    assert run.returncode == 2
    one_line(run.stderr)
    assert read_log(out) == []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV) as p:
        p.stdout.close()
        assert (p.wait(timeout=180), p.stderr.read()) == (141, '')


def test_each_result_is_kept_as_it_comes(data_dir, tmp_path, monkeypatch):
    """Ctrl-C while the second dataset is scored: the first one's row is in the log."""
    out = str(tmp_path / 'out')
    save_model(out, data_dir)

    def interrupted(*args):
        raise KeyboardInterrupt

    # lambada's last-word accuracy, after wikitext2's loss
    monkeypatch.setattr(eval_gpt, 'last_word_accuracy', interrupted)
    with pytest.raises(KeyboardInterrupt):
        eval_gpt.main([f'--out_dir={out}', f'--data_dir={data_dir}', '--datasets=wikitext2,lambada',
                       '--device=cpu'])
    assert [r['dataset'] for r in read_log(out)] == ['wikitext2']


@pytest.mark.parametrize('args', [5, dict(block_size=-5, vocab_size=64, n_layer=2, n_head=2, n_embd=32)])
def test_a_hand_edited_checkpoint_is_one_line_naming_it(data_dir, tmp_path, capsys, args):
    save_model(str(tmp_path), data_dir)
    ckpt = torch.load(tmp_path / 'ckpt.pt', weights_only=True)
    torch.save(dict(ckpt, model_args=args), tmp_path / 'ckpt.pt')
    argv = [f'--out_dir={tmp_path}', f'--data_dir={data_dir}', '--datasets=wikitext2', '--device=cpu']
    refused(capsys, argv, f'{tmp_path}/ckpt.pt')
