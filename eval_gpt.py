"""
Zero-shot loss and LAMBADA accuracy of a train_gpt.py checkpoint, as the paper's Table 4 (left):
docs/evaluation.md.

    python prepare_data.py lambada && python prepare_data.py wikitext2 && python prepare_data.py ptb
    python eval_gpt.py --out_dir=out-owt-base              # the paper's four sets: a table, and log.jsonl
    python eval_gpt.py --datasets=python_stdlib            # any prepared text dataset's val split
    torchrun --standalone --nproc_per_node=8 eval_gpt.py --out_dir=out-owt-base   # the same numbers, faster
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
from train_common import autocast, log_row, resolve_dtype, setup_distributed, sum_dtype, teardown

DEFAULTS = dict(
    out_dir='out',               # the checkpoint is out_dir/ckpt.pt; results are appended to its log.jsonl
    datasets='openwebtext,lambada,wikitext2,ptb',  # prepared datasets under data_dir, comma-separated
    data_dir='data',             # where prepare_data.py puts datasets
    block_size=0,                # window length T; 0: the model's own (1024 for the paper's models)
    batch_size=8,                # windows (or LAMBADA passages) per forward pass
    device='auto',               # auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps
    dtype='auto',                # auto: bfloat16 where the device computes in it, else float16 (GPU), float32
)
RANGES = dict(positive=('batch_size',), nonnegative=('block_size',), nonempty=('out_dir', 'data_dir'))

# The paper's Table 4 (left) and the release's README: zero-shot loss, nats per GPT-2 token
PAPER = {'openwebtext': (3.20, 2.84), 'lambada': (4.98, 4.32), 'wikitext2': (4.77, 4.13), 'ptb': (6.39, 5.75)}

# -----------------------------------------------------------------------------
# the two measurements


def windows(n_tokens, T):
    """(start, length) of each window: it reads tokens start .. start+length-1 and predicts start+1 ..
    start+length. Together they predict tokens 1 .. n_tokens-1, each once."""
    return [(s, min(T, n_tokens - 1 - s)) for s in range(0, n_tokens - 1, T)]


def _batches(n_items, B, dist, cut=0):
    """Batches of item indices, in order, B at a time (and a new batch at `cut`), and this process's share."""
    edges = sorted({*range(0, n_items, B), cut} - {n_items})
    return [range(a, b) for a, b in zip(edges, edges[1:] + [n_items])][dist.rank::dist.world_size]


@torch.no_grad()
def split_loss(model, tokens, T, B, ctx, dist):
    """(mean loss in nats over tokens 1 .. n-1 of `tokens`, each once; tokens scored; windows):
    docs/evaluation.md. The same on any process count: batch j runs on process j mod N, and the windows' sums
    are added in order."""
    wins = windows(len(tokens), T)
    sums = torch.zeros(len(wins), dtype=sum_dtype(dist.device), device=dist.device)
    # the full windows, then a shorter one
    for group in _batches(len(wins), B, dist, cut=(len(tokens) - 1) // T):
        length = wins[group[0]][1]
        xy = np.stack([tokens[wins[i][0]:wins[i][0] + length + 1] for i in group])
        xy = torch.from_numpy(xy.astype(np.int64)).to(dist.device)
        # every position's logits, and no mean loss: each token is scored here, once
        with ctx:
            logits = model.logits(xy[:, :-1])
        nll = F.cross_entropy(logits.float().flatten(0, 1), xy[:, 1:].flatten(), reduction='none')
        sums[group.start:group.stop] = nll.view(len(group), length).to(sums.dtype).sum(1)
    if dist.ddp:
        torch.distributed.all_reduce(sums)  # each entry is set on one process: a sum with zeros, exact
    return math.fsum(sums.tolist()) / (len(tokens) - 1), len(tokens) - 1, len(wins)


@torch.no_grad()
def last_word_accuracy(model, tokens, spans, T, B, ctx, dist):
    """(a bool per passage: the argmax at each token of its last word is that token, lm-evaluation-harness's
    rule; the number of passages cut to their last T tokens). docs/evaluation.md."""
    correct = torch.zeros(len(spans), dtype=sum_dtype(dist.device), device=dist.device)
    for group in _batches(len(spans), B, dist):
        rows = [(max(int(p), int(e) - 1 - T), int(s), int(e)) for p, s, e in spans[group.start:group.stop]]
        L = max(e - 1 - a for a, _, e in rows)
        x = np.zeros((len(rows), L), np.int64)            # the passages, right-padded
        want = np.full((len(rows), L), -1, np.int64)      # at position t: token t+1 if it is in the word
        for i, (a, s, e) in enumerate(rows):
            x[i, :e - 1 - a] = tokens[a:e - 1]
            want[i, s - 1 - a:e - 1 - a] = tokens[s:e]
        want = torch.from_numpy(want).to(dist.device)
        # causal: the padding after a passage does not change its outputs
        with ctx:
            logits = model.logits(torch.from_numpy(x).to(dist.device))
        hit = (logits.argmax(-1) == want) | (want < 0)          # compared on the device: no wait per passage
        correct[group.start:group.stop] = hit.all(1).to(correct.dtype)
    if dist.ddp:
        torch.distributed.all_reduce(correct)  # as in split_loss
    return [c == 1.0 for c in correct.tolist()], int(sum(e - 1 - T > p for p, _, e in spans))


def table(results, model_name):
    """The results in the paper's layout: one row per dataset, loss in nats per token, beside the paper's.
    The first column is as wide as the longest dataset name, so a long name keeps the columns aligned."""
    w = max(12, *(len(r['dataset']) for r in results)) + 2
    lines = [f"zero-shot loss of {model_name}, nats per token",
             f"{'dataset':<{w}}{'tokens':>12}{'loss':>9}{'ppl':>10}{'LAMBADA acc':>14}   "
             f"{'ToST-Base':>12}{'GPT-2 Base':>12}  (paper)"]
    for r in results:
        acc = f"{100 * r['last_word_acc']:.2f}%" if 'last_word_acc' in r else ''
        paper = PAPER.get(r['dataset_kind'], ()) if r['tokenizer'] == 'gpt2' else ()
        lines.append(f"{r['dataset']:<{w}}{r['tokens']:>12,}{r['loss']:>9.4f}{r['ppl']:>10.2f}{acc:>14}   "
                     + ''.join(f"{v:>12.2f}" for v in paper))
    return '\n'.join(lines)


def main(argv=None):
    cfg, _ = parse(sys.argv[1:] if argv is None else argv, DEFAULTS, __doc__, __file__, ranges=RANGES)
    # once each, in order
    names = list(dict.fromkeys(n.strip() for n in cfg['datasets'].split(',') if n.strip()))
    if not names:
        raise UsageError("--datasets is empty; name datasets under --data_dir, e.g. --datasets=wikitext2,ptb")
    dist = setup_distributed(cfg['device'])
    device = dist.device
    dtype, _ = resolve_dtype(cfg['dtype'], device, dist.master)
    ckpt_path = os.path.join(cfg['out_dir'], 'ckpt.pt')
    model, info = load_gpt(ckpt_path, device)
    T = cfg['block_size'] or model.config.block_size
    B = cfg['batch_size']
    if T > model.config.block_size:
        raise UsageError(f"--block_size={T} is larger than the model's context ({model.config.block_size})")
    # every dataset read and checked before any is scored, in the checkpoint's tokenizer
    sets = []
    for name in names:
        path = os.path.join(cfg['data_dir'], name)
        meta = readers.load_meta(path, 'text', info['meta'])
        tokens = readers.read_tokens(path, meta, 'val')
        if len(tokens) < 2:
            raise UsageError(f"{path}/val.bin has {len(tokens)} tokens, too few to score (at least 2)")
        # LAMBADA's passages
        spans = np.load(os.path.join(path, meta['targets'])) if meta.get('targets') else None
        longest = 0 if spans is None else int((spans[:, 2] - spans[:, 1]).max(initial=0))
        if longest > T:
            raise UsageError(f"{path} has a target word of {longest} tokens, longer than --block_size={T}; "
                             f"use a larger --block_size")
        sets.append((name, meta, tokens, spans))
    # A log that cannot be written is said before the work, not after it.
    if dist.master:
        open(os.path.join(cfg['out_dir'], 'log.jsonl'), 'a').close()
    ctx = autocast(device, dtype)
    args = info['model_args']
    attn = args.get('attn', 'tssa')
    hybrid = f", softmax blocks {args['softmax_layers']}" if args.get('softmax_layers') else ''
    model_name = (f"{ckpt_path} (iter {info.get('iter_num')}, attn={attn}{hybrid}, "
                  f"{model.get_num_params() / 1e6:.2f}M params)")
    # rank 0 talks for all
    if dist.master:
        print(f"{model_name}: windows of {T} tokens, batch {B}, {dtype} on {device}, {dist.world_size} "
              f"process(es)", flush=True)
    results = []
    for name, meta, tokens, spans in sets:
        t0 = time.time()
        loss, scored, n_win = split_loss(model, tokens, T, B, ctx, dist)
        ppl = math.exp(loss) if loss < 700 else math.inf
        r = dict(kind='zero_shot', dataset=name, dataset_kind=meta.get('dataset', name), loss=loss, ppl=ppl,
                 tokens=scored, windows=n_win, block_size=T, batch_size=B, tokenizer=meta['tokenizer'],
                 ckpt=ckpt_path, iter=info.get('iter_num'), attn=attn,
                 softmax_layers=list(args.get('softmax_layers', ())), dtype=dtype, device=device,
                 processes=dist.world_size)
        acc = ''
        if spans is not None:
            correct, cut = last_word_accuracy(model, tokens, spans, T, B, ctx, dist)
            r.update(last_word_acc=sum(correct) / len(correct), last_word_correct=sum(correct),
                     passages=len(correct), passages_cut=cut)
            acc = f", last-word accuracy {100 * r['last_word_acc']:.2f}%"
        r['elapsed_s'] = round(time.time() - t0, 2)
        results.append(r)
        # Each result is kept as it comes (appended: the training log stays), so a Ctrl-C loses none.
        if dist.master:
            print(f"{name}: loss {loss:.4f} (ppl {ppl:.2f}) over {scored:,} tokens{acc}, {r['elapsed_s']}s",
                  flush=True)
            log_row(cfg['out_dir'], r)
    if dist.master:
        print(table(results, model_name), flush=True)
    teardown(dist)


if __name__ == '__main__':
    main()
