"""
Tests for sample.py: a tiny random byte-level GPT saved as train_gpt.py saves it, sampled in process and as a
command. What a mistake prints is checked by behaviour: exit 2, one line, the option or path it names.
    python -m pytest -q tests/test_sample.py
"""
import io
import math
import os
import signal
import subprocess
import sys
import types
import unicodedata

import pytest
import torch

import options
import readers
import sample
import tost
from conftest import NEEDS_DEV_FULL, REPO, ENV, in_little_memory, one_line
from test_prepare_data import encoding


@pytest.fixture(scope='module')
def out(tmp_path_factory):
    """A folder holding ckpt.pt: a random 1-layer GPT over bytes, block size 32."""
    torch.manual_seed(0)
    args = dict(block_size=32, vocab_size=256, n_layer=1, n_head=2, n_embd=32)
    model = tost.GPT(tost.GPTConfig(**args))
    out = tmp_path_factory.mktemp('out')
    weights = dict(model=model.state_dict(), model_args=args, meta={'tokenizer': 'bytes'})
    torch.save(weights, str(out / 'ckpt.pt'))
    return str(out)


def save_sharp(folder, vocab=256, tokenizer='bytes'):
    """A random GPT whose embedding is scaled up: its next-token distributions are far from uniform, so that
    the temperature and top_k change what is drawn (a random init's are nearly flat)."""
    torch.manual_seed(0)
    args = dict(block_size=32, vocab_size=vocab, n_layer=1, n_head=2, n_embd=32)
    model = tost.GPT(tost.GPTConfig(**args))
    with torch.no_grad():
        model.transformer.wte.weight.mul_(5)
    torch.save(dict(model=model.state_dict(), model_args=args, meta={'tokenizer': tokenizer}),
               os.path.join(folder, 'ckpt.pt'))
    return model.eval()


def ended(*args, stdout=subprocess.PIPE, interrupt=False, **how):
    """(exit code, stderr) of sample.py as a command, in a process group of its own as a terminal starts a
    job. interrupt: once it is generating, Ctrl-C to the group, and its stdout closed, as the same Ctrl-C
    ends the tee it is piped into."""
    p = subprocess.Popen([sys.executable, os.path.join(REPO, 'sample.py'), *args], stdout=stdout,
                         stderr=subprocess.PIPE, env=ENV, start_new_session=True, **how)
    if interrupt:
        p.stdout.read(200)
        os.killpg(p.pid, signal.SIGINT)
        p.stdout.close()
    err = p.communicate(timeout=120)[1]
    return p.returncode, err.decode(errors='replace')


def test_stream_decoder_holds_back_half_characters(monkeypatch):
    text = 'déjà vu ✓ 😀 end'
    tok = readers.get_tokenizer('bytes')
    # a piece per token, then the rest
    pieces = list(sample.decode_stream(tok, tok.encode(text)))
    assert ''.join(pieces) == text and not any('\ufffd' in p for p in pieces)
    # 'é' is two bytes: nothing after the first, all after the second
    assert pieces[1] == '' and pieces[2] == 'é'
    # BPE: a token may also split a character; here 'j' and the first byte of 'à'
    monkeypatch.setattr(readers, 'gpt2_encoding', lambda: encoding((b'j\xc3',)))
    bpe = readers.get_tokenizer('gpt2')
    ids = bpe.encode(text)
    assert 256 in ids
    pieces = list(sample.decode_stream(bpe, ids))
    assert ''.join(pieces) == text and not any('\ufffd' in p for p in pieces)


def test_sample_streams_what_generate_gives(out, capsys, monkeypatch):
    """In float32 on a CPU, also where it has bf16 instructions: bf16 autocast slows a batch of one down."""
    monkeypatch.setattr(torch.cpu, '_is_avx512_bf16_supported', lambda: True)
    dtypes = []
    real = sample.autocast
    monkeypatch.setattr(sample, 'autocast', lambda device, dtype: dtypes.append(dtype) or real(device, dtype))
    model = sample.load_gpt(os.path.join(out, 'ckpt.pt'), 'cpu')[0]
    prompt = 'def f(x):'
    # more than block_size (32): a full window restarts from its last half
    n = 80
    sample.main([f'--out_dir={out}', f'--start={prompt}', '--num_samples=1', f'--max_new_tokens={n}',
                 '--seed=7', '--device=cpu', '--top_k=50'])
    idx = torch.tensor([list(prompt.encode())])
    want = model.generate(idx, n, temperature=0.8, top_k=50, generator=torch.Generator().manual_seed(7))
    text = bytes(want[0].tolist()).decode('utf-8', errors='replace')
    assert capsys.readouterr().out == text + '\n---------------\n'

    # an empty prompt starts from a newline (bytes have no end-of-text token), and prints nothing before
    sample.main([f'--out_dir={out}', '--start=', '--num_samples=1', '--max_new_tokens=20', '--seed=7',
                 '--device=cpu', '--temperature=0'])
    want = model.generate(torch.tensor([[10]]), 20, temperature=0)
    text = bytes(want[0, 1:].tolist()).decode('utf-8', 'replace')
    assert capsys.readouterr().out == text + '\n---------------\n'
    # --dtype reaches the autocast; the speed line is the tokens over the time they took (2 s on this clock)
    clock = iter([10.0, 12.0])
    monkeypatch.setattr(sample, 'time', types.SimpleNamespace(perf_counter=lambda: next(clock)))
    sample.main([f'--out_dir={out}', '--num_samples=2', '--max_new_tokens=5', '--device=cpu',
                 '--dtype=bfloat16'])
    assert dtypes == ['float32', 'float32', 'bfloat16']
    # and says it includes reading the prompt (of 1 token), once a sample
    words = capsys.readouterr().err.split()
    assert words[:6] == ['10', 'tokens', 'in', '2.0s:', '5.0', 'tokens/s'] and {'1-token', '2x'} <= set(words)


def test_the_defaults_reach_the_model_and_each_sample_draws_on_from_the_last(tmp_path, monkeypatch):
    """Temperature 0.8, top_k 200 and seed 1337 as documented; one generator for all samples, each printed
    after its prompt, each token flushed as it comes (piped into tee too)."""
    model = save_sharp(tmp_path)
    flushes = []

    class Stdout(io.StringIO):
        def flush(self):
            flushes.append(1)
    monkeypatch.setattr(sys, 'stdout', Stdout())
    sample.main([f'--out_dir={tmp_path}', '--start=ab', '--num_samples=2', '--max_new_tokens=30',
                 '--device=cpu'])
    generator = torch.Generator().manual_seed(1337)
    want = ''
    for _ in range(2):
        new = model.generate(torch.tensor([list(b'ab')]), 30, temperature=0.8, top_k=200, generator=generator)
        want += bytes(new[0].tolist()).decode('utf-8', 'replace') + '\n---------------\n'
    assert sys.stdout.getvalue() == want and len(flushes) >= 60


def test_with_no_options_three_samples_of_500_tokens_follow_a_newline(out, capsys):
    """The docstring's defaults: --start='\\n', 3 samples of 500 new tokens."""
    sample.main([f'--out_dir={out}', '--device=cpu'])
    got = capsys.readouterr()
    assert got.out.startswith('\n') and got.out.count('\n---------------\n') == 3
    assert got.err.startswith('1500 tokens in ')


def test_out_of_memory_while_the_model_is_built_is_not_blamed_on_the_checkpoint(out, fails, monkeypatch):
    def too_large(config):
        raise RuntimeError('[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory')
    monkeypatch.setattr(tost, 'GPT', too_large)
    assert 'ckpt.pt' not in fails(sample.main, [f'--out_dir={out}', '--device=cpu'])


def test_a_gpt2_model_with_no_prompt_starts_from_end_of_text(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, 'gpt2_encoding', lambda: encoding())
    save_sharp(tmp_path, vocab=320, tokenizer='gpt2')
    given = []
    real = tost.GPT.generate_stream
    monkeypatch.setattr(tost.GPT, 'generate_stream', lambda self, idx, *a: given.append(idx.tolist()) or
                        real(self, idx, *a))
    sample.main([f'--out_dir={tmp_path}', '--start=', '--num_samples=1', '--max_new_tokens=3',
                 '--device=cpu'])
    assert given == [[[encoding().eot_token]]]


def test_same_seed_same_text_and_one_thread_unless_told(out, capsys, monkeypatch):
    args = [f'--out_dir={out}', '--num_samples=2', '--max_new_tokens=40', '--device=cpu']
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    # two threads before: sample.py itself sets one (the module runs on one)
    torch.set_num_threads(2)
    texts = []
    for seed in (3, 3, 4):
        sample.main(args + [f'--seed={seed}'])
        texts.append(capsys.readouterr())
    assert texts[0].out == texts[1].out != texts[2].out and texts[0].out.count('\n---------------\n') == 2
    assert torch.get_num_threads() == 1 and 'tokens/s (cpu, 1 thread)' in texts[0].err
    # 2 samples x 40
    assert texts[0].err.startswith('80 tokens in ')
    # told: its thread count is kept
    monkeypatch.setenv('OMP_NUM_THREADS', '2')
    torch.set_num_threads(2)
    sample.main(args)
    assert torch.get_num_threads() == 2 and '(cpu, 2 threads)' in capsys.readouterr().err
    # in a notebook's kernel too, whose later cells (a training run) would keep one thread
    monkeypatch.delenv('OMP_NUM_THREADS')
    monkeypatch.setattr(sample.options, 'kernel', True)
    sample.main(args)
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)


def test_control_characters_are_shown_not_obeyed_in_a_terminal(out, capsys, monkeypatch, tmp_path):
    """A byte-level model at a high temperature emits control bytes; the prompt here has some too, from a
    FILE: as from the command line. In a terminal none reaches it but newline and tab; piped, the text is
    written as it is."""
    start = '\x1b[2J\x07ding\t\r\n'
    # after a byte-order mark, as some Windows editors write, which is not the prompt's
    (tmp_path / 'prompt.txt').write_bytes('\ufeff'.encode() + start.encode())
    args = [f'--out_dir={out}', '--num_samples=1', '--max_new_tokens=400', '--temperature=3', '--top_k=0',
            '--device=cpu', '--seed=5']
    sample.main(args + [f'--start=FILE:{tmp_path}/prompt.txt'])
    from_file = capsys.readouterr().out
    sample.main(args + [f'--start={start}'])
    piped = capsys.readouterr().out
    assert piped.startswith(start) and from_file == piped
    # the model emitted control characters
    assert sum(unicodedata.category(c) == 'Cc' for c in piped) > 20
    monkeypatch.setattr(sys.stdout, 'isatty', lambda: True)
    sample.main(args + [f'--start={start}'])
    shown = capsys.readouterr().out
    assert shown.startswith('␛[2J␇ding\t␍\n')
    assert not [c for c in shown if unicodedata.category(c) == 'Cc' and c not in '\n\t']
    # and in a notebook's output, which acts on them too
    monkeypatch.setattr(sys.stdout, 'isatty', lambda: False)
    monkeypatch.setattr(sample.options, 'kernel', True)
    sample.main(args + [f'--start={start}'])
    assert capsys.readouterr().out == shown
    # every control character is pictured, not only those this seed drew
    assert sorted(sample.CONTROL_PICTURES) == [c for c in range(0xa0) if unicodedata.category(chr(c)) == 'Cc'
                                               and chr(c) not in '\n\t']


def test_sample_on_another_gpu_asks_that_gpu_for_the_dtype(monkeypatch, two_gpus):
    """--device=cuda:1: resolve_dtype asks the current GPU whether it has bfloat16, so cuda:1 is made the
    current one first (mocked: no GPU here; the run stops at the question)."""
    def asked(dtype, device):
        two_gpus.append('resolve_dtype')
        raise options.UsageError('stop here')
    monkeypatch.setattr(sample, 'resolve_dtype', asked)
    with pytest.raises(options.UsageError, match='stop here'):
        sample.main(['--device=cuda:1'])
    assert two_gpus == ['cuda:1', 'high', 'resolve_dtype']


def test_a_prompt_longer_than_the_block_is_cut_with_a_note(out, capsys):
    # 33 bytes: one more than the model takes
    long = 'x = 1\n' * 4 + 'THE END.\n'
    sample.main([f'--out_dir={out}', f'--start={long}', '--num_samples=1', '--max_new_tokens=5',
                 '--device=cpu'])
    printed = capsys.readouterr()
    note, speed = printed.err.strip().splitlines()
    # the note shows the start of what is kept (the last 32 bytes)
    assert '33' in note and '32' in note and repr(long[1:]) in note and printed.out.startswith(long)
    assert speed.startswith('5 tokens in ') and '32-token' in speed.split()
    # 32 bytes fit: no note; a prompt that only looks like a path (~, FILES) is text, as typed
    for start in (long[1:], '~/notes.txt', 'FILES'):
        sample.main([f'--out_dir={out}', f'--start={start}', '--num_samples=1', '--max_new_tokens=5',
                     '--device=cpu'])
        printed = capsys.readouterr()
        assert printed.out.startswith(start) and len(printed.err.strip().splitlines()) == 1


def test_bad_input_is_one_line_naming_what_is_wrong(out, tmp_path, fails, monkeypatch):
    """sample.py's own options (reading a checkpoint is train_common's, tested there)."""
    fails(sample.main, [f'--out_dir={tmp_path}'], f'{tmp_path}/ckpt.pt')
    (tmp_path / 'latin1.txt').write_bytes('caf\xe9'.encode('latin-1'))
    # one character past the 16M a prompt file may hold (as sparse as the filesystem keeps it)
    with open(tmp_path / 'long.txt', 'wb') as f:
        f.truncate(2**24 + 1)
    # a prompt file under ~ is looked for in the home folder
    monkeypatch.setenv('HOME', str(tmp_path))
    # nothing to generate (--max_new_tokens=0) is refused, not timed
    for arg, *names in (('--temperature=-1', '--temperature'),
                        ('--temperature=inf', '--temperature'),
                        ('--max_new_tokens=0', '--max_new_tokens'),
                        ('--num_samples=0', '--num_samples'), ('--top_k=-1', '--top_k'),
                        ('--dtype=fp8', '--dtype', 'bfloat16'),
                        ('--seed=-1', '--seed'),
                        (f'--start=FILE:{tmp_path}/missing.txt', 'missing.txt', '--start'),
                        ('--start=FILE:~/missing.txt', f'{tmp_path}/missing.txt'),
                        ('--start=FILE:', '--start'),
                        (f'--start=FILE:{tmp_path}/latin1.txt', 'latin1.txt'),
                        (f'--start=FILE:{tmp_path}/long.txt', 'long.txt', '--start')):
        fails(sample.main, [f'--out_dir={out}', arg], *names)
    # a byte that is not UTF-8 on the command line arrives as a lone surrogate, which cannot be encoded
    code, err = ended(f'--out_dir={out}'.encode(), b'--start=caf\xe9')
    assert code == 2
    one_line(err, '--start')


# What a hand-edited or foreign checkpoint holds in place of a key: the weights, the model's arguments (not a
# dict, a negative size, a key of a later version) or the meta (not a dict, no tokenizer, a tokenizer of more
# ids than the model has rows for, none: None deletes the key); a vision checkpoint (train_vit.py's)
DAMAGE = [('model_args', 5), ('model', [1, 2]), ('meta', 'x'), ('meta', {}), ('kind', 'vit'),
          ('meta', dict(tokenizer='gpt2', vocab_size=50257)),
          ('meta', dict(tokenizer='bytes', vocab_size=257)),
          ('meta', dict(tokenizer='bytes', vocab_size='256')),
          # a weight that is not finite (a run that diverged saves none such)
          ('model', lambda weights: {**weights, 'lm_head.weight': weights['lm_head.weight'] * math.nan}),
          ('model_args', dict(block_size=-5, vocab_size=256, n_layer=1, n_head=2, n_embd=32)),
          ('model_args', dict(block_size=32, vocab_size=256, n_layer=1, n_head=2, n_embd=32, future=1)),
          ('meta', None)]


@pytest.mark.parametrize('key, value', DAMAGE)
def test_a_damaged_checkpoint_is_one_line_naming_it(out, tmp_path, fails, key, value):
    ckpt = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)
    ckpt[key] = value(ckpt[key]) if callable(value) else value
    if value is None:
        del ckpt[key]
    torch.save(ckpt, tmp_path / 'ckpt.pt')
    fails(sample.main, [f'--out_dir={tmp_path}'], f'{tmp_path}/ckpt.pt')


def claiming(folder, case):
    """A checkpoint whose model_args claim far more than its weights: 4.5G numbers (a tiny model's weights,
    or views of one number in the claimed shapes), or a million layers of a tiny model's weights."""
    small = dict(block_size=32, vocab_size=256, n_layer=1, n_head=2, n_embd=32)
    weights = tost.GPT(tost.GPTConfig(**small)).state_dict()
    args = dict(small, vocab_size=2**20, n_embd=2**12)
    if case == 'layers':
        args = dict(small, n_layer=10**6)
    if case == 'views':
        with torch.device('meta'):
            shapes = {k: v.shape for k, v in tost.GPT(tost.GPTConfig(**args)).state_dict().items()}
        weights = {k: torch.zeros(1).expand(shape) for k, shape in shapes.items()}
    ckpt = dict(model=weights, model_args=args, meta={'tokenizer': 'bytes'})
    torch.save(ckpt, os.path.join(folder, 'ckpt.pt'))


@pytest.mark.skipif(sys.platform != 'linux', reason="the address space is limited through Linux's setrlimit")
@pytest.mark.parametrize('case', ['shapes', 'views', 'layers'])
def test_model_args_that_claim_more_than_the_weights_are_refused_before_taking_memory(tmp_path, case):
    claiming(tmp_path, case)
    got = in_little_memory('sample.py', f'--out_dir={tmp_path}', '--device=cpu')
    assert got.returncode == 2
    one_line(got.stderr, f'{tmp_path}/ckpt.pt')


@NEEDS_DEV_FULL
def test_ctrl_c_into_a_pipe_whose_reader_it_killed_and_a_full_disk_are_one_line(out):
    """`python sample.py | tee log`, then Ctrl-C: the terminal sends SIGINT to both, so tee is gone when the
    interrupt's handler writes. `python sample.py > /dev/full`: stdout cannot be written at all. `>&-`: there
    is no stdout, and the samples go nowhere."""
    code, err = ended(f'--out_dir={out}', '--max_new_tokens=100000', interrupt=True)
    assert code == 130
    one_line(err)
    with open('/dev/full', 'w') as full:
        code, err = ended(f'--out_dir={out}', '--num_samples=1', '--max_new_tokens=5', stdout=full)
    assert code == 2
    one_line(err)
    code, err = ended(f'--out_dir={out}', '--num_samples=1', '--max_new_tokens=5',
                      preexec_fn=lambda: os.close(1))
    assert code == 0, err
