"""
Sample from a model trained by train_gpt.py, printing each token as it comes.

    python sample.py                                        # 3 samples of 500 tokens from out/ckpt.pt
    python sample.py --start="def fibonacci(n):" --num_samples=1 --max_new_tokens=2000
    python sample.py --start=FILE:prompt.txt --temperature=0.7 --top_k=50 --seed=7
    python sample.py --out_dir=out-softmax --device=cpu      # any checkpoint, on any device

Generation uses the recurrent form of causal TSSA (a few numbers per head and layer, no KV cache), so
every step costs the same and --max_new_tokens may exceed the block size (a full window restarts from its
last half, in one parallel pass). The same --seed gives the same text on the same device. At the end, on
stderr: tokens/s over all samples, reading each one's prompt included. On a CPU it uses one thread unless
OMP_NUM_THREADS is set, or in a notebook: a second adds only about 5% to a batch of one (docs/speed.md). In a
terminal or a notebook, control characters other than newline and tab are shown as symbols (ESC as ␛), not
obeyed.
"""
import options  # first: its handler ends a Ctrl-C while torch imports (exit 130, no traceback)
import codecs
import os
import sys
import time

import torch

import tost
from options import UsageError, first_line, out_of_memory, parse
from readers import get_tokenizer
from train_common import (DTYPES, autocast, check_fits, load_checkpoint, load_weights, pick_device,
                          resolve_dtype, setup_cuda)

DEFAULTS = dict(
    out_dir='out',          # the folder train_gpt.py saved ckpt.pt in
    start='\n',             # the prompt: text, or FILE:path to read it from; '': end-of-text (bytes: newline)
    num_samples=3,          # samples, one after the other
    max_new_tokens=500,     # tokens to generate per sample (may exceed block_size)
    temperature=0.8,        # < 1 sharper, > 1 more random, 0 greedy (always the likeliest token)
    top_k=200,              # sample among the k likeliest tokens only; 0 means all
    seed=1337,              # the same seed, the same text
    device='auto',          # auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps
    dtype='auto',           # auto: bfloat16 on GPUs that compute in it, else float16; float32 elsewhere
)
# No `compile` key: GPT.step keeps the position as a Python int, so torch.compile would recompile every token.
RANGES = dict(positive=('num_samples', 'max_new_tokens'), nonnegative=('top_k', 'temperature'),
              nonempty=('out_dir',), seed=('seed',))

# A byte-level model can emit any byte. In a terminal a control character would act (an escape sequence moves
# the cursor, recolours or retitles the window) instead of showing, so there each one but newline and tab is
# shown as its Unicode control picture (ESC as ␛), DEL and the C1 controls as the replacement character.
# Piped into a file or a program, the text is written as generated.
CONTROL_PICTURES = {c: 0x2400 + c for c in range(32) if chr(c) not in '\t\n'}
CONTROL_PICTURES.update(dict.fromkeys(range(0x7f, 0xa0), 0xfffd))    # DEL and the C1 controls


def load_gpt(path, device):
    """The GPT of a train_gpt.py checkpoint in eval mode on `device`, and the checkpoint less its weights."""
    ckpt = load_checkpoint(path, 'cpu', 'gpt', needs=('model', 'model_args', 'meta'))
    try:
        config = tost.GPTConfig(**ckpt['model_args'])
        check_fits(tost.GPT, config, ckpt, path)
        model = tost.GPT(config)
    except (TypeError, ValueError, RuntimeError) as e:
        # A model too large for this machine's memory is the handler's to say (options.report).
        if out_of_memory(e):
            raise
        raise UsageError(f'{path} does not hold a model this tost.py can load ({first_line(e)})') from None
    load_weights(model, ckpt, path)
    # (A run that diverged saves none such: a damaged file's would sample from NaN probabilities.)
    if not all(p.isfinite().all() for p in model.parameters()):
        raise UsageError(f"{path} does not hold a model this tost.py can load (weights that are not finite)")
    # sample.py decodes with the tokenizer the meta names, eval_gpt.py checks each dataset's against it: each
    # of its ids has a row in the model (a damaged checkpoint's may not: an id past them is an IndexError).
    tokenizer = ckpt['meta'].get('tokenizer')
    ids = ckpt['meta'].get('vocab_size', 0)
    if tokenizer is None or not isinstance(ids, int) or ids > config.vocab_size:
        raise UsageError(f"{path} does not hold a model this tost.py can load (its meta names tokenizer "
                         f"{tokenizer!r} of {ids!r} ids; the model has {config.vocab_size})")
    ckpt.pop('optimizer', None)
    return model.eval().to(device), ckpt


def decode_stream(tok, ids):
    """The text of tokens `ids`, piece by piece: a token may end inside a UTF-8 character (half of an 'é'),
    whose bytes the incremental decoder holds back, so the pieces join to the text of all tokens decoded at
    once."""
    utf8 = codecs.getincrementaldecoder('utf-8')(errors='replace')
    for t in ids:
        yield utf8.decode(tok.token_bytes(t))
    yield utf8.decode(b'', final=True)


def main(argv=None):
    cfg, _ = parse(argv, DEFAULTS, __doc__, __file__, ranges=RANGES, choices=dict(dtype=DTYPES),
                   text=('start',))
    device = pick_device(cfg['device'])
    # CUDA only: cuda:N becomes the current GPU, the one resolve_dtype asks
    if device.startswith('cuda'):
        setup_cuda(device)
    # auto on a CPU is float32: bf16 autocast casts the weights for every token of a batch of one (slower)
    dtype, _ = resolve_dtype('float32' if cfg['dtype'] == 'auto' and device == 'cpu' else cfg['dtype'],
                             device)
    # batch 1: a second thread would not help (see the docstring); a notebook's kernel would keep one after
    if device == 'cpu' and 'OMP_NUM_THREADS' not in os.environ and not options.kernel:
        torch.set_num_threads(1)
    model, ckpt = load_gpt(os.path.join(cfg['out_dir'], 'ckpt.pt'), device)
    tok = get_tokenizer(ckpt['meta']['tokenizer'])
    # (stdout closed, >&-: None; a notebook's output acts on \r, \b and escapes as a terminal does)
    shown = CONTROL_PICTURES if sys.stdout and sys.stdout.isatty() or options.kernel else {}

    # the prompt: --start itself, or the UTF-8 file FILE:path names
    prompt = cfg['start']
    if prompt.startswith('FILE:'):
        path = os.path.expanduser(prompt.removeprefix('FILE:'))
        if not path:
            raise UsageError("--start=FILE: needs the prompt file's path after FILE:")
        # a file that cannot be read is the handler's to name (options.py)
        try:
            # newline='': its bytes as they are (\r\n too), as prepare_data reads text, less a byte-order mark
            # (utf-8-sig). At most 16M characters (a model sees a few thousand tokens): /dev/zero, or a wrong
            # file, would be read forever.
            with open(path, encoding='utf-8-sig', newline='') as f:
                prompt = f.read(2**24)
                if f.read(1):
                    raise UsageError(f"--start: the prompt file {path} holds more than 16M characters")
        except UnicodeDecodeError as e:
            raise UsageError(f"--start: the prompt file {path} is not UTF-8 text (byte {e.start})") from None
    # nothing to condition on: the end-of-text token if there is one, else a newline
    if prompt == '':
        ids = [tok.eot] if tok.eot is not None else tok.encode('\n')
    else:
        try:
            ids = tok.encode(prompt)
        except Exception as e:  # a lone surrogate (undecodable bytes on the command line), ...
            raise UsageError(f"--start: the {tok.name} tokenizer cannot encode the prompt "
                             f"({type(e).__name__}: {first_line(e)})") from None
    # generate_stream gives the model only the last block_size ids: said on stderr
    block_size = model.config.block_size
    if len(ids) > block_size:
        kept = tok.decode(ids[-block_size:])
        print(f"note: the prompt is {len(ids)} tokens and the model sees at most {block_size}: kept the last "
              f"{block_size}, from {kept[:40]!r}", file=sys.stderr)
    idx = torch.tensor([ids], device=device)
    generator = torch.Generator(device=device).manual_seed(cfg['seed'])
    t0 = time.perf_counter()
    # generate_stream is no_grad itself
    with autocast(device, dtype):
        for _ in range(cfg['num_samples']):
            print(prompt.translate(shown), end='')
            new = model.generate_stream(idx, cfg['max_new_tokens'], cfg['temperature'], cfg['top_k'],
                                        generator)
            for piece in decode_stream(tok, (int(t[0]) for t in new)):
                print(piece.translate(shown), end='', flush=True)
            print('\n---------------', flush=True)
    dt = time.perf_counter() - t0
    # generate_stream yields all max_new_tokens of each sample
    n_tokens = cfg['num_samples'] * cfg['max_new_tokens']
    threads = (f", {torch.get_num_threads()} thread{'s' * (torch.get_num_threads() > 1)}"
               if device == 'cpu' else '')
    # Each sample reads the prompt first: a long one takes a part of the time.
    print(f"{n_tokens} tokens in {dt:.1f}s: {n_tokens / dt:.1f} tokens/s ({device}{threads}), reading a "
          f"{min(len(ids), block_size)}-token prompt {cfg['num_samples']}x included", file=sys.stderr)


if __name__ == '__main__':
    main()
