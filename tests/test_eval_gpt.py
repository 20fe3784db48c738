"""
Tests for eval_gpt.py: tiny checkpoints and tiny test sets in the published formats, offline, seconds.
    python -m pytest -q tests/test_eval_gpt.py
What they prove: docs/evaluation.md, "Tested". A mistake is checked by behaviour: exit 2, one line, what it
names.
"""
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import eval_gpt
import prepare_data as prep
import readers
import tost
import train_common
from test_prepare_data import encoding, jsonl
from test_train_gpt import read_log
from conftest import NEEDS_DEV_FULL, POSIX_ONLY, REPO, ENV, counted, one_line, run_main


WIKI = ''.join(f' = Article {i} = \n \n The {i}th article is about the number {i} , and not much @-@ else .'
               f'\n \n' for i in range(30))
# a byte-level set of wikitext2's text, named longer than the table's first column
BYTES = 'bytes_of_a_name_longer_than_the_column'
PASSAGES = [f'Passage {i} tells of {"many " * (i % 7)}things, and ends with the word word{i % 3}'
            for i in range(11)]


def prepare(d, name, file, text, enc):
    """`text` written to d/file, prepared as the set `name` under d with the tiktoken encoding `enc` as
    'gpt2'."""
    (d / file).write_text(text)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(readers, 'gpt2_encoding', lambda: enc)
        prep.prepare(name, d, input=str(d / file))


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    """wikitext2 (~1.8k tokens) and lambada (11 passages) prepared with the tiny encoding as 'gpt2', and
    BYTES: wikitext2 in bytes."""
    d = tmp_path_factory.mktemp('data')
    prepare(d, 'wikitext2', 'wiki.test.raw', WIKI, encoding())
    prepare(d, 'lambada', 'lambada_test.jsonl', jsonl(PASSAGES), encoding())
    prep.prepare('wikitext2', d, input=str(d / 'wiki.test.raw'), tokenizer='bytes', name=BYTES)
    return d


def save_model(out_dir, data_dir, dataset='lambada', config=None, edit=None, **args):
    """A random (or `edit`ed) GPT with `args` saved as train_gpt.py saves it, with the tokenizer of `dataset`
    in its meta and `config`, the run's options."""
    torch.manual_seed(0)
    meta = readers.load_meta(os.path.join(data_dir, dataset))
    # The vocabulary rounded up to a multiple of 64, as train_gpt.py does: the loss is over every output.
    vocab = 64 * -(-meta['vocab_size'] // 64)
    args = dict(block_size=32, vocab_size=vocab, n_layer=2, n_head=2, n_embd=32) | args
    model = tost.GPT(tost.GPTConfig(**args))
    if edit:
        edit(model)
    os.makedirs(out_dir, exist_ok=True)
    torch.save(dict(model=model.state_dict(), model_args=args, meta=meta, iter_num=7, config=config or {}),
               os.path.join(out_dir, 'ckpt.pt'))
    return model.eval()


def tokens_of(data_dir, name):
    return np.fromfile(os.path.join(data_dir, name, 'val.bin'), dtype=np.uint16).astype(np.int64)


# -----------------------------------------------------------------------------
# the loss


@pytest.mark.parametrize('attn', ['tssa', 'softmax'])
def test_loss_is_every_token_once_as_a_plain_loop(data_dir, tmp_path, capsys, monkeypatch, attn):
    """Each token is scored once: the model is asked for its logits, not for its mean loss beside them (a
    second cross-entropy over batch x block x vocab, 3 GB at batch 8 on GPT-2's vocabulary), and LAMBADA's
    accuracy needs none. A model trained with dropout is scored without it; windows of --block_size, shorter
    than the model's, are logged as such."""
    out = tmp_path / 'out'
    model = save_model(out, data_dir, attn=attn, dropout=0.2, block_size=64)
    # a training log is there already
    trained = {'iter': 7, 'kind': 'eval', 'val_loss': 5.0}
    (out / 'log.jsonl').write_text(json.dumps(trained) + '\n')
    ce = counted(monkeypatch, torch.nn.functional, 'cross_entropy')
    # blanks, an empty name and a repeated one are typing
    eval_gpt.main([f'--out_dir={out}', f'--data_dir={data_dir}', '--datasets=wikitext2, lambada,,wikitext2',
                   '--device=cpu', '--dtype=float32', '--batch_size=3', '--block_size=32'])
    log = read_log(out)
    # appended, not truncated
    assert log[0] == trained and [r['dataset'] for r in log[1:]] == ['wikitext2', 'lambada']
    # one cross-entropy per batch of 3 windows
    assert len(ce) == sum(-(-r['windows'] // 3) for r in log[1:])
    for r in log[1:]:
        x = torch.from_numpy(tokens_of(data_dir, r['dataset']))
        # the reference: window by window (33 tokens: 32 read, 32 predicted), its mean loss times its length
        with torch.no_grad():
            parts = [(model(w[None, :-1], w[None, 1:])[1].item(), len(w) - 1)
                     for w in (x[s:s + 33] for s in range(0, len(x) - 1, 32))]
        count = sum(n for _, n in parts)
        assert r['tokens'] == count == len(x) - 1 and r['windows'] == len(parts) and r['elapsed_s'] >= 0
        assert abs(r['loss'] - sum(loss * n for loss, n in parts) / count) < 1e-5
        assert abs(r['ppl'] - np.exp(r['loss'])) < 1e-6 * r['ppl']
        run = (r['kind'], r['attn'], r['iter'], r['block_size'], r['batch_size'], r['processes'], r['device'],
               r['dtype'], r['tokenizer'])
        assert run == ('zero_shot', attn, 7, 32, 3, 1, 'cpu', 'float32', 'gpt2')
    assert 'last_word_acc' in log[2] and 'last_word_acc' not in log[1]
    # the table's row: our loss, and the paper's beside it
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith('wikitext2'))
    assert f"{log[1]['loss']:.4f}" in row and row.split()[-2:] == ['4.77', '4.13']


def test_tokens_that_fill_their_windows_exactly_take_no_more():
    """17 tokens, 16 targets: two windows of 8."""
    model = tost.GPT(tost.GPTConfig(block_size=8, vocab_size=64, n_layer=1, n_head=2, n_embd=16)).eval()
    one = train_common.Dist(False, 0, 0, 1, True, 'cpu')
    loss, scored, windows = eval_gpt.split_loss(model, np.arange(17), 8, 4, contextlib.nullcontext(), one)
    assert (scored, windows) == (16, 2)


def test_the_windows_are_shared_out_among_processes_and_summed_in_float64(data_dir, tmp_path, monkeypatch):
    """Rank 0 and rank 1 of 2 score windows that together are the whole (the all-reduce, once, of float64
    sums, adds them up); each window's loss is summed in float64, to within 1e-12 of a reference."""
    model = save_model(tmp_path / 'out', data_dir)
    x = torch.from_numpy(tokens_of(data_dir, 'wikitext2'))
    one = train_common.Dist(False, 0, 0, 1, True, 'cpu')
    whole = eval_gpt.split_loss(model, x.numpy(), 32, 3, contextlib.nullcontext(), one)[0]
    with torch.no_grad():
        sums = [F.cross_entropy(model.logits(w[None, :-1])[0], w[1:], reduction='none').double().sum().item()
                for w in (x[s:s + 33] for s in range(0, len(x) - 1, 32))]
    assert abs(whole - math.fsum(sums) / (len(x) - 1)) < 1e-12
    gathered = []
    monkeypatch.setattr(torch.distributed, 'all_reduce', gathered.append)
    shares = [eval_gpt.split_loss(model, x.numpy(), 32, 3, contextlib.nullcontext(),
                                  one._replace(ddp=True, rank=r, world_size=2))[0] for r in (0, 1)]
    assert min(shares) > 0 and abs(sum(shares) - whole) < 1e-9
    assert [t.dtype for t in gathered] == [torch.float64] * 2


def test_the_table_shows_the_logged_numbers_and_a_loss_too_large_for_exp_is_an_infinite_perplexity(
        data_dir, tmp_path, capsys, monkeypatch):
    """Each row's tokens, loss, perplexity and accuracy (1 of 4 passages: 25.00%) are the logged ones; a
    loss past 700 nats (exp overflows near 709.78) has perplexity inf."""
    out = tmp_path / 'out'
    save_model(out, data_dir, edit=lambda m: m.transformer.ln_f.weight.data.mul_(1e5))
    monkeypatch.setattr(eval_gpt, 'last_word_accuracy', lambda *a: ([True, False, False, False], 0))
    eval_gpt.main([f'--out_dir={out}', f'--data_dir={data_dir}', '--datasets=wikitext2,lambada',
                   '--device=cpu'])
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.strip()}
    for r in read_log(out):
        # wider than its column: the columns must still stand apart
        assert r['loss'] > 1e4 and r['ppl'] == math.inf
        want = [f"{r['tokens']:,}", f"{r['loss']:.4f}", f"{r['ppl']:.2f}"]
        if 'last_word_acc' in r:
            want.append('25.00%')
        assert rows[r['dataset']][1:1 + len(want)] == want


def test_a_bfloat16_loss_is_the_cross_entropy_of_its_logits_in_float32(data_dir, tmp_path):
    """--dtype=auto is bfloat16 on CPUs that have it: the logits are, the loss over them is not."""
    model = save_model(tmp_path / 'out', data_dir)
    tokens = tokens_of(data_dir, 'wikitext2')
    ctx = train_common.autocast('cpu', 'bfloat16')
    # no graph is built for the backward that never comes
    grads = []
    model.lm_head.register_forward_hook(lambda m, i, o: grads.append(torch.is_grad_enabled()))
    loss = eval_gpt.split_loss(model, tokens, 32, 4, ctx, train_common.Dist(False, 0, 0, 1, True, 'cpu'))[0]
    assert grads and not any(grads)
    x = torch.from_numpy(tokens)
    total = 0.0
    with torch.no_grad(), ctx:
        for s in range(0, len(x) - 1, 32):
            w = x[s:s + 33]
            logits = model.logits(w[None, :-1])[0]
            total += torch.nn.functional.cross_entropy(logits.double(), w[1:], reduction='sum').item()
    assert abs(loss - total / (len(x) - 1)) < 1e-5
    # the command's --dtype reaches the model
    eval_gpt.main([f'--out_dir={tmp_path / "out"}', f'--data_dir={data_dir}', '--datasets=wikitext2',
                   '--device=cpu', '--dtype=bfloat16'])
    r = read_log(tmp_path / 'out')[-1]
    assert r['dtype'] == 'bfloat16' and r['loss'] == pytest.approx(loss, abs=1e-9)


def test_a_set_under_a_name_of_ones_own_is_shown_beside_the_papers_numbers_for_its_dataset(data_dir, tmp_path,
                                                                                          capsys):
    d = tmp_path / 'data'
    shutil.copytree(data_dir / 'wikitext2', d / 'my_wiki')
    shutil.copytree(data_dir / 'lambada', d / 'lambada')
    out = tmp_path / 'out'
    save_model(out, d)
    eval_gpt.main([f'--out_dir={out}', f'--data_dir={d}', '--datasets=my_wiki', '--device=cpu'])
    assert capsys.readouterr().out.split()[-2:] == ['4.77', '4.13']
    assert read_log(out)[-1]['dataset_kind'] == 'wikitext2'


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
    # the 1-process run's two rows, then the 2-process run's
    log = read_log(out)
    n = len(tokens_of(data_dir, 'wikitext2')) - 1
    windows = -(-n // 16)
    # a short last window, an odd number of batches of 3
    assert n % 16 and -(-windows // 3) % 2
    for ra, rb in zip(log[:2], log[2:]):
        assert (ra['processes'], rb['processes']) == (1, 2)
        for key in ('loss', 'tokens', 'windows', 'last_word_acc', 'last_word_correct'):
            # ==, not approximately
            assert ra.get(key) == rb.get(key), key
    assert log[1]['passages'] == len(PASSAGES)

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
        # tied: also the output layer
        model.transformer.wte.weight.copy_(torch.eye(V, d) - 1 / d)


def test_lambada_accuracy_where_the_answer_is_known(tmp_path, fails, monkeypatch):
    # passage: whether greedy decoding gets its last word, for a model that repeats its input
    passages = {
        'one zz zz': True,     # context ends with ' zz', target ' zz'
        'one zz yy': False,
        'one yy yy': True,
        'zz zz': False,        # the context 'zz' is 'z', 'z' (no space): it predicts 'z'
        'one zz zzz': False,   # target ' zz', 'z': the first token is right, the second is not
        'a long passage, longer than the window of sixteen tokens, yy yy': True,   # cut to its last 16 tokens
        'fits the window yy yy': True,   # 15 + 1 tokens read: the window's 16, not cut
        'then a line\nyy': False,  # the word after a newline: target 'y', 'y' after '\n'
    }
    d = tmp_path
    # ' zz' and ' yy' are one token each
    prepare(d, 'lambada', 'lambada_test.jsonl', jsonl(passages), encoding((b' z', b' zz', b' y', b' yy')))
    out = str(tmp_path / 'out')
    model = save_model(out, d, block_size=16, n_embd=320, n_head=4, edit=repeat_model)
    spans = np.load(d / 'lambada' / 'val_targets.npy')
    # the guesses are compared on the device: one read at the end (the gather), not one per passage
    reads = counted(monkeypatch, torch.Tensor, 'item', 'tolist', 'cpu', 'numpy', '__bool__', '__float__',
                    '__int__')
    one = train_common.Dist(False, 0, 0, 1, True, 'cpu')
    flags, cut = eval_gpt.last_word_accuracy(model, tokens_of(d, 'lambada'), spans, 16, 3,
                                             contextlib.nullcontext(), one)
    # cut: the long passage
    assert flags == list(passages.values()) and cut == 1 and len(reads) == 1
    monkeypatch.undo()
    # two processes score the passages between them, each once (the gather adds the two); no graph is built
    grads = []
    model.lm_head.register_forward_hook(lambda m, i, o: grads.append(torch.is_grad_enabled()))
    shares = [eval_gpt.last_word_accuracy(model, tokens_of(d, 'lambada'), spans, 16, 3,
                                          contextlib.nullcontext(), one._replace(rank=r, world_size=2))[0]
              for r in (0, 1)]
    assert [a + b for a, b in zip(*shares)] == list(passages.values())
    assert grads and not any(grads)

    eval_gpt.main([f'--out_dir={out}', f'--data_dir={d}', '--datasets=lambada', '--device=cpu'])
    r = read_log(out)[-1]
    # the model's own window by default
    assert (r['last_word_correct'], r['passages'], r['passages_cut'], r['block_size']) == (4, 8, 1, 16)
    assert r['last_word_acc'] == 4 / 8
    # ' zz', 'z' does not fit a window of 1; it fits one of 2
    fails(eval_gpt.main, [f'--out_dir={out}', f'--data_dir={d}', '--datasets=lambada', '--block_size=1'],
          '--block_size')
    eval_gpt.main([f'--out_dir={out}', f'--data_dir={d}', '--datasets=lambada', '--block_size=2'])
    assert read_log(out)[-1]['block_size'] == 2

# -----------------------------------------------------------------------------
# which sets, and mistakes


def test_bad_input_is_one_line_naming_what_is_wrong(data_dir, tmp_path, fails):
    """eval_gpt's own checks, all before any work (reading a checkpoint is train_common's, tested there)."""
    out = str(tmp_path / 'out')
    base = [f'--out_dir={out}', f'--data_dir={data_dir}', '--device=cpu']
    save_model(out, data_dir)
    # a val.bin cut short after it was prepared; one whose last id is past the vocab (65535): not an
    # IndexError inside the model
    size = (data_dir / 'wikitext2' / 'val.bin').stat().st_size
    for name, data in (('short', b'\0' * 100), ('noise', b'\0' * (size - 2) + b'\xff\xff')):
        shutil.copytree(data_dir / 'wikitext2', data_dir / name)
        (data_dir / name / 'val.bin').write_bytes(data)
    # a val split of one token, as meta.json says: nothing to score (without the check, torch's unfold fails)
    shutil.copytree(data_dir / 'wikitext2', data_dir / 'one')
    (data_dir / 'one' / 'val.bin').write_bytes(b'\0\0')
    meta = json.loads((data_dir / 'one' / 'meta.json').read_text())
    (data_dir / 'one' / 'meta.json').write_text(json.dumps(dict(meta, val_tokens=1)))
    # and one of none: no maximum to check its ids against
    shutil.copytree(data_dir / 'wikitext2', data_dir / 'none')
    (data_dir / 'none' / 'val.bin').write_bytes(b'')
    (data_dir / 'none' / 'meta.json').write_text(json.dumps(dict(meta, val_tokens=0)))
    # lambada's target spans cut short or empty, of another shape or width, of no rows, a word without context
    # or empty, before its tokens, past them, or one token past
    spans = np.load(data_dir / 'lambada' / 'val_targets.npy')
    past_one = spans.copy()
    past_one[-1, 2] = len(tokens_of(data_dir, 'lambada')) + 1
    before = spans.copy()
    before[0, 0] = -1
    damaged = {'cut': 20, 'empty': 0, 'flat': spans.ravel(), 'norows': spans[:0],
               'wide': np.c_[spans, spans[:, 2]], 'narrow': spans[:, :2],
               'nocontext': np.c_[spans[:, 1], spans[:, 1:]], 'noword': np.c_[spans[:, :2], spans[:, 1]],
               'before': before, 'past': spans + size, 'pastone': past_one}
    for name, array in damaged.items():
        shutil.copytree(data_dir / 'lambada', data_dir / name)
        target = data_dir / name / 'val_targets.npy'
        if isinstance(array, int):
            target.write_bytes(target.read_bytes()[:array])
        else:
            np.save(target, array)
    # the default sets (ptb is not prepared here), a window longer than the model's, no set, a set in another
    # tokenizer (the command that rebuilds it in the model's), damaged sets
    for extra, *names in (([], 'prepare_data.py ptb'),
                          (['--batch_size=0'], '--batch_size'), (['--block_size=-1'], '--block_size'),
                          (['--dtype=fp8'], '--dtype', 'bfloat16'),
                          (['--datasets=wikitext2', '--block_size=33'], '--block_size'),
                          (['--datasets= ,'], '--datasets=wikitext2'),
                          ([f'--datasets=wikitext2,{BYTES}'], BYTES, '--force', '--tokenizer='),
                          (['--datasets=short'], f'{data_dir}/short/val.bin'),
                          (['--datasets=one'], f'{data_dir}/one/val.bin'),
                          ([f"--data_dir={data_dir / 'one'}", '--datasets=one'], f'--data_dir={data_dir} '),
                          (['--datasets=none'], f'{data_dir}/none/val.bin'),
                          (['--datasets=wikitext2,noise'], f'{data_dir}/noise/val.bin'),
                          *((['--datasets=' + name], f'{data_dir}/{name}/val_targets.npy', '--force')
                            for name in damaged)):
        fails(eval_gpt.main, base + extra, *names)
    # an empty list typed is not auto's: the checkpoint is not blamed
    assert 'ckpt.pt' not in fails(eval_gpt.main, base + ['--datasets=,'], '--datasets')
    assert not os.path.exists(os.path.join(out, 'log.jsonl'))


def test_by_default_a_model_is_scored_on_its_own_dataset_and_a_gpt2_one_also_on_the_papers_test_sets(
        data_dir, tmp_path, capsys, fails):
    """The demo's model (bytes, python_stdlib) is scored on the set it learned from: no OpenWebText in bytes
    (17 GB) to prepare. A GPT-2 model trained on OpenWebText gets the paper's four; a set not prepared is
    named with its own command (a test set's, with the model's own set alone as the other way), and
    OpenWebText's only for a model trained on it."""
    out = str(tmp_path / 'demo')
    argv = [f'--out_dir={out}', f'--data_dir={data_dir}', '--device=cpu', '--dtype=float32']
    save_model(out, data_dir, dataset=BYTES, config={'dataset': BYTES})
    eval_gpt.main(argv)
    assert [r['dataset'] for r in read_log(out)] == [BYTES]
    # the table stays aligned: the loss ends under its heading
    loss = f"{read_log(out)[0]['loss']:.4f}"
    header, row = capsys.readouterr().out.splitlines()[-2:]
    assert row.index(loss) + len(loss) == header.index('loss') + len('loss')
    # the paper's wikitext2 numbers are per GPT-2 token: none beside a loss per byte, nor their heading
    assert len(row.split()) == 4 and '(paper)' not in header and row == row.rstrip()
    # without --data_dir, the one the model was trained from
    save_model(out, data_dir, dataset=BYTES, config={'dataset': BYTES, 'data_dir': str(data_dir)})
    eval_gpt.main([a for a in argv if not a.startswith('--data_dir')])
    assert [r['dataset'] for r in read_log(out)] == [BYTES, BYTES]
    # auto in a list, blanks around it, stands for its sets (here the one the list names again: scored once)
    eval_gpt.main(argv + [f'--datasets= auto ,{BYTES}'])
    assert [r['dataset'] for r in read_log(out)] == [BYTES] * 3
    # given, --data_dir is where the sets are looked for, not the run's
    save_model(out, data_dir, dataset=BYTES, config={'dataset': 'python_stdlib', 'data_dir': str(tmp_path)})
    line = fails(eval_gpt.main, argv, f'prepare_data.py python_stdlib --data_dir={data_dir}')
    assert 'openwebtext' not in line
    # a checkpoint that names no dataset: a set of its tokenizer is suggested, not GPT-2's
    save_model(out, data_dir, dataset=BYTES, config={})
    fails(eval_gpt.main, argv, f'{out}/ckpt.pt', '--datasets=python_stdlib')
    # a GPT-2 model trained on a set of its own (here a copy of wikitext2), then on OpenWebText (another copy)
    d = tmp_path / 'gpt2'
    shutil.copytree(data_dir / 'lambada', d / 'lambada')
    for name in ('own', 'wikitext2'):
        shutil.copytree(data_dir / 'wikitext2', d / name)
    argv = [f'--out_dir={out}', f'--data_dir={d}', '--device=cpu', '--dtype=float32']
    save_model(out, d, config={'dataset': 'own'})
    # (or the model's own set alone)
    line = fails(eval_gpt.main, argv, 'prepare_data.py ptb', '--tokenizer=gpt2', '--datasets=own')
    assert 'openwebtext' not in line
    # (a model whose own set is not here, or names none, has no such way; nor one whose own set fails)
    for config in ({}, {'dataset': 'gone'}):
        save_model(out, d, config=config)
        assert '--datasets' not in fails(eval_gpt.main, argv + ['--datasets=ptb'], 'prepare_data.py ptb')
    shutil.copytree(data_dir / BYTES, d / BYTES)
    save_model(out, d, config={'dataset': BYTES})
    assert '--datasets' not in fails(eval_gpt.main, argv + [f'--datasets={BYTES}'], BYTES)
    shutil.copytree(data_dir / 'wikitext2', d / 'ptb')
    save_model(out, d, config={'dataset': 'openwebtext'})
    fails(eval_gpt.main, argv, 'prepare_data.py openwebtext')
    shutil.copytree(data_dir / 'wikitext2', d / 'openwebtext')
    os.remove(os.path.join(out, 'log.jsonl'))
    eval_gpt.main(argv)
    assert [r['dataset'] for r in read_log(out)] == list(eval_gpt.PAPER)

# -----------------------------------------------------------------------------
# where the results go


def test_a_log_that_cannot_be_written_is_refused_before_the_work_and_no_result_is_lost(
        data_dir, tmp_path, capsys, monkeypatch, fails):
    """A folder in the log's place, then a full disk, then Ctrl-C (a link there: the next test)."""
    out = tmp_path / 'out'
    argv = [f'--out_dir={out}', f'--data_dir={data_dir}', '--datasets=wikitext2', '--device=cpu']
    save_model(out, data_dir)
    # a folder in the log's place: refused before any dataset is scored
    (out / 'log.jsonl').mkdir()
    scored = counted(monkeypatch, eval_gpt, 'split_loss')
    fails(eval_gpt.main, argv, f'{out}/log.jsonl')
    assert scored == []
    (out / 'log.jsonl').rmdir()
    eval_gpt.main(argv)
    table = capsys.readouterr().out

    def full(out_dir, row):
        raise OSError(28, 'No space left on device', os.path.join(out_dir, 'log.jsonl'))

    # the disk fills as a result is written: the table is on stdout already
    monkeypatch.setattr(eval_gpt, 'log_row', full)
    with pytest.raises(SystemExit) as e:
        run_main(lambda: eval_gpt.main(argv))
    printed = capsys.readouterr()
    assert printed.out == table and e.value.code == 2
    one_line(printed.err, f'{out}/log.jsonl')
    monkeypatch.undo()

    def interrupted(*args):
        raise KeyboardInterrupt

    # Ctrl-C while lambada is scored (its last-word accuracy, after its loss): wikitext2's row is in the log
    monkeypatch.setattr(eval_gpt, 'last_word_accuracy', interrupted)
    os.remove(out / 'log.jsonl')
    with pytest.raises(KeyboardInterrupt):
        eval_gpt.main(argv + ['--datasets=wikitext2,lambada'])
    assert [r['dataset'] for r in read_log(out)] == ['wikitext2']


@POSIX_ONLY
def test_a_link_in_the_logs_place_is_refused_before_the_work_not_followed(data_dir, tmp_path, monkeypatch,
                                                                           fails):
    """A run's folder from elsewhere could point its log at ~/.bashrc."""
    out = tmp_path / 'out'
    argv = [f'--out_dir={out}', f'--data_dir={data_dir}', '--datasets=wikitext2', '--device=cpu']
    save_model(out, data_dir)
    target = tmp_path / 'rc'
    target.write_text('mine\n')
    (out / 'log.jsonl').symlink_to(target)
    scored = counted(monkeypatch, eval_gpt, 'split_loss')
    assert 'rc' in fails(eval_gpt.main, argv, f'{out}/log.jsonl')
    assert target.read_text() == 'mine\n' and scored == []


@NEEDS_DEV_FULL
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


def test_a_path_from_a_checkpoint_or_a_meta_json_is_checked_before_it_is_opened(data_dir, tmp_path, fails):
    """A checkpoint's data_dir that is no text is not taken; a meta.json whose LAMBADA targets are not a file
    in its folder (another type, a path elsewhere) is damaged."""
    out = str(tmp_path / 'out')
    save_model(out, data_dir, config=dict(data_dir=5))
    fails(eval_gpt.main, [f'--out_dir={out}', '--device=cpu', '--datasets=nosuch'], 'nosuch')
    for name, targets in (('t5', 5), ('tabs', str(data_dir / 'lambada' / 'val_targets.npy')),
                          ('tup', '../lambada/val_targets.npy')):
        shutil.copytree(data_dir / 'lambada', tmp_path / name)
        meta = json.loads((tmp_path / name / 'meta.json').read_text())
        (tmp_path / name / 'meta.json').write_text(json.dumps(dict(meta, targets=targets)))
        args = [f'--out_dir={out}', '--device=cpu', f'--data_dir={tmp_path}', f'--datasets={name}']
        fails(eval_gpt.main, args, f'{tmp_path}/{name}/meta.json')
