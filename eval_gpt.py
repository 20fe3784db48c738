"""
Zero-shot loss and LAMBADA accuracy of a train_gpt.py checkpoint, as the paper's Table 4 (left):
docs/evaluation.md.

    python prepare_data.py lambada && python prepare_data.py wikitext2 && python prepare_data.py ptb
    python eval_gpt.py --out_dir=out-owt-base              # the paper's four sets: a table, and log.jsonl
    python eval_gpt.py --datasets=python_stdlib            # any prepared text dataset's val split
    torchrun --standalone --nproc_per_node=8 eval_gpt.py --out_dir=out-owt-base   # the same numbers, faster

With no --datasets, a model is scored on the dataset it was trained on (the demo's: python_stdlib) and, for
GPT-2 tokens, on lambada, wikitext2 and ptb as well.
"""
import options  # first: its handler ends a Ctrl-C while torch imports (exit 130, no traceback)
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import readers
from options import UsageError, parse
from sample import load_gpt
from train_common import (DTYPES, autocast, log_row, open_own, resolve_dtype, setup_distributed, sum_dtype,
                          teardown)

DEFAULTS = dict(
    out_dir='out',               # the checkpoint is out_dir/ckpt.pt; results are appended to its log.jsonl
    datasets='auto',             # comma-separated; auto: the model's own (gpt2: and the paper's test sets)
    data_dir='data',             # where prepare_data.py puts datasets; not given: the checkpoint's run's
    block_size=0,                # window length T; 0: the model's own (1024 for the paper's models)
    batch_size=8,                # windows (or LAMBADA passages) per forward pass
    device='auto',               # auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps
    dtype='auto',                # auto: bfloat16 where the device computes in it, else float16 (GPU), float32
)
RANGES = dict(positive=('batch_size',), nonnegative=('block_size',), nonempty=('out_dir', 'data_dir'))

# The paper's Table 4 (left) and the release's README: zero-shot loss, nats per GPT-2 token
PAPER = {'openwebtext': (3.20, 2.84), 'lambada': (4.98, 4.32), 'wikitext2': (4.77, 4.13), 'ptb': (6.39, 5.75)}

# -----------------------------------------------------------------------------
# the two measurements: batch j of B windows (or passages) runs on process j mod N, so that any process count
# computes the same numbers


@torch.no_grad()
def split_loss(model, tokens, T, B, ctx, dist):
    """(mean loss in nats over tokens 1 .. n-1 of `tokens`, each once; tokens scored; windows):
    docs/evaluation.md. Window k reads tokens kT .. kT+T-1 and predicts kT+1 .. kT+T; the last one is padded
    with targets -1, which cross_entropy ignores (causal: the padding does not change what comes before it).
    The windows' sums are added in order: the same on any process count."""
    n = len(tokens) - 1
    count = -(-n // T)
    padded = np.full(count * T + 1, -1, np.int64)
    padded[:len(tokens)] = tokens
    # (count, T + 1): window k and its targets, tokens kT .. kT+T (a view: each shares a token with the next)
    windows = torch.from_numpy(padded).unfold(0, T + 1, T)
    sums = torch.zeros(count, dtype=sum_dtype(dist.device), device=dist.device)
    for a in range(dist.rank * B, count, dist.world_size * B):
        xy = windows[a:a + B].to(dist.device)
        # every position's logits, and no mean loss: each token is scored here, once
        with ctx:
            logits = model.logits(xy[:, :-1].clamp(min=0))
        # Rows of logits: several times faster than cross_entropy over the (B, V, T) transpose.
        nll = F.cross_entropy(logits.float().flatten(0, 1), xy[:, 1:].flatten(), reduction='none',
                              ignore_index=-1)
        sums[a:a + B] = nll.view(len(xy), T).to(sums.dtype).sum(1)
    if dist.ddp:
        # each entry is set on one process: a sum with zeros, exact
        torch.distributed.all_reduce(sums)
    return math.fsum(sums.tolist()) / n, n, count


@torch.no_grad()
def last_word_accuracy(model, tokens, spans, T, B, ctx, dist):
    """(a bool per passage: the argmax at each token of its last word is that token, lm-evaluation-harness's
    rule; the number of passages cut to their last T tokens). docs/evaluation.md."""
    # A passage is tokens p .. e-1, its last word s .. e-1; the model reads from a (the last T before e-1).
    rows = [(p, max(p, e - 1 - T), s, e) for p, s, e in spans.tolist()]
    correct = torch.zeros(len(rows), dtype=sum_dtype(dist.device), device=dist.device)
    for j in range(dist.rank * B, len(rows), dist.world_size * B):
        batch = rows[j:j + B]
        L = max(e - 1 - a for _, a, _, e in batch)
        # the passages, right-padded (causal: the padding does not change their outputs)
        x = np.zeros((len(batch), L), np.int64)
        # at position t: token t+1 if it is in the word, else -1
        want = np.full((len(batch), L), -1, np.int64)
        for i, (_, a, s, e) in enumerate(batch):
            x[i, :e - 1 - a] = tokens[a:e - 1]
            want[i, s - 1 - a:e - 1 - a] = tokens[s:e]
        want = torch.from_numpy(want).to(dist.device)
        with ctx:
            logits = model.logits(torch.from_numpy(x).to(dist.device))
        # compared on the device: no wait per passage
        hit = (logits.argmax(-1) == want) | (want < 0)
        correct[j:j + B] = hit.all(1).to(correct.dtype)
    if dist.ddp:
        torch.distributed.all_reduce(correct)
    return [c == 1.0 for c in correct.tolist()], sum(a > p for p, a, _, _ in rows)


def main(argv=None):
    cfg, set_keys = parse(argv, DEFAULTS, __doc__, __file__, ranges=RANGES, choices=dict(dtype=DTYPES),
                          torchrun=True)
    dist = setup_distributed(cfg['device'])
    device = dist.device
    # rank 0 talks for all
    if not dist.master:
        sys.stdout = open(os.devnull, 'w', encoding='utf-8')
    dtype, _ = resolve_dtype(cfg['dtype'], device, dist.master)
    ckpt_path = os.path.join(cfg['out_dir'], 'ckpt.pt')
    model, info = load_gpt(ckpt_path, device)
    config = model.config
    tokenizer = info['meta']['tokenizer']
    T = cfg['block_size'] or config.block_size
    B = cfg['batch_size']
    if T > config.block_size:
        raise UsageError(f"--block_size={T} is larger than the model's context ({config.block_size})")
    # Every dataset is read and checked before any is scored, under the data_dir the model was trained from
    # unless told.
    trained = info.get('config', {})
    data_dir = cfg['data_dir']
    # (A checkpoint's config may be damaged: a data_dir that is no text is not taken.)
    if 'data_dir' not in set_keys and isinstance(trained.get('data_dir'), str):
        data_dir = trained['data_dir']
    # auto: the val split of the set the model learned from (the demo's: prepared, offline), and for GPT-2
    # tokens the paper's three test sets (a few MB each): the paper's four for a model trained on OpenWebText,
    # which no other model is sent to prepare (hours).
    auto = [str(trained.get('dataset', ''))]
    if tokenizer == 'gpt2':
        auto += ['lambada', 'wikitext2', 'ptb']
    names = []
    for name in cfg['datasets'].split(','):
        names += auto if name.strip() == 'auto' else [name]
    # Blanks around a name and an empty or repeated name are typing, not datasets.
    names = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    if not names:
        # The example: the model's own set, else one of its tokenizer.
        example = trained.get('dataset') or ('wikitext2,ptb' if tokenizer == 'gpt2' else 'python_stdlib')
        where = f" ({ckpt_path} names none it was trained on)" if cfg['datasets'] == 'auto' else ''
        raise UsageError(f"--datasets={cfg['datasets']} names no dataset{where}; name those under "
                         f"--data_dir, e.g. --datasets={example}")
    sets = []
    for name in names:
        path = readers.dataset_folder(data_dir, name)
        try:
            meta = readers.load_meta(path, 'text', info['meta'])
        # Another set (the paper's need the network once) is not needed where the model's own is at hand.
        except UsageError as e:
            if name != auto[0] and os.path.isfile(os.path.join(data_dir, auto[0], 'meta.json')):
                raise UsageError(f"{e}; or score its own alone: --datasets={auto[0]}") from None
            raise
        tokens = readers.read_tokens(path, meta, 'val')
        readers.check_ids(path, 'val', tokens, meta)
        if len(tokens) < 2:
            val = os.path.join(path, 'val.bin')
            raise UsageError(f"{val} has {len(tokens)} tokens, too few to score (at least 2)")
        # LAMBADA's passages: (start, last word's start, end) each
        spans = None
        if meta.get('targets'):
            file = os.path.join(path, meta['targets'])
            # A damaged file (cut short, another shape, no rows, a word without context or empty, spans past
            # the tokens) would be a traceback below.
            try:
                spans = np.load(file)
            except (ValueError, EOFError):
                spans = np.zeros(0)
            ok = spans.dtype.kind in 'iu' and spans.ndim == 2 and spans.shape[1] == 3 and len(spans) > 0
            # Each row rises (a context, then its last word) and stays inside the tokens.
            if not (ok and (np.diff(spans.astype(np.int64)) > 0).all() and 0 <= spans.min()
                    and spans.max() <= len(tokens)):
                raise UsageError(f"{file} is damaged; rebuild it: {readers.recipe(path, meta, force=True)}")
            if (spans[:, 2] - spans[:, 1] > T).any():
                raise UsageError(f"{path} has a target word longer than --block_size={T}: use a larger one")
        sets.append((name, meta, tokens, spans))
    # A log that cannot be written is said before the work, not after it.
    if dist.master:
        open_own(os.path.join(cfg['out_dir'], 'log.jsonl')).close()
    ctx = autocast(device, dtype)
    # What every row shares: the model, and how its numbers were computed.
    run = dict(kind='zero_shot', ckpt=ckpt_path, iter=info.get('iter_num'), attn=config.attn,
               softmax_layers=list(config.softmax_layers), block_size=T, batch_size=B, dtype=dtype,
               device=device, processes=dist.world_size, tokenizer=tokenizer)
    # The paper's layout, a row as each set is scored (a Ctrl-C loses none), the first column as wide as the
    # longest name.
    w = max(12, *map(len, names)) + 2
    print(f"zero-shot loss of {ckpt_path} (iter {run['iter']}, attn={config.attn}, "
          f"{model.get_num_params():,} params), nats per token\nwindows of {T} tokens, batch {B}, {dtype} on "
          f"{device}, {dist.world_size} process(es)")
    # A space between the columns: a diverged model's loss or perplexity, wider than its column, stays apart.
    # The paper's numbers are per GPT-2 token: a column of theirs only beside GPT-2's.
    paper_head = f"   {'ToST-Base':>12}{'GPT-2 Base':>12}  (paper)" if tokenizer == 'gpt2' else ''
    head = f"{'dataset':<{w}}{'tokens':>12} {'loss':>8} {'ppl':>9} {'LAMBADA acc':>13}"
    print(head + paper_head, flush=True)
    for name, meta, tokens, spans in sets:
        t0 = time.time()
        loss, scored, windows = split_loss(model, tokens, T, B, ctx, dist)
        ppl = math.inf if loss > 700 else math.exp(loss)
        r = dict(run, dataset=name, dataset_kind=meta.get('dataset', name), loss=loss, ppl=ppl, tokens=scored,
                 windows=windows)
        acc = ''
        if spans is not None:
            correct, cut = last_word_accuracy(model, tokens, spans, T, B, ctx, dist)
            r.update(last_word_acc=sum(correct) / len(correct), last_word_correct=sum(correct),
                     passages=len(correct), passages_cut=cut)
            acc = f"{100 * r['last_word_acc']:.2f}%"
        r['elapsed_s'] = round(time.time() - t0, 2)
        paper = PAPER.get(r['dataset_kind'], ()) if tokenizer == 'gpt2' else ()
        row = f"{name:<{w}}{scored:>12,} {loss:>8.4f} {ppl:>9.2f} {acc:>13}   "
        print((row + ''.join(f"{v:>12.2f}" for v in paper)).rstrip(), flush=True)
        # Each result is kept as it comes (appended: the training log stays).
        if dist.master:
            log_row(cfg['out_dir'], r)
    teardown(dist)


if __name__ == '__main__':
    main()
