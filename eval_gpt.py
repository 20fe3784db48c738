"""
Zero-shot evaluation of a train_gpt.py checkpoint, as in the paper's Table 4 (left): the loss in nats per
token on the test sets of OpenWebText, LAMBADA, WikiText-2 and PTB, and LAMBADA's last-word accuracy.

    python prepare_data.py lambada && python prepare_data.py wikitext2 && python prepare_data.py ptb
    python eval_gpt.py --out_dir=out-owt-base              # the paper's four sets: a table, and log.jsonl
    python eval_gpt.py --datasets=python_stdlib            # any prepared text dataset's val split
    torchrun --standalone --nproc_per_node=8 eval_gpt.py --out_dir=out-owt-base   # the same numbers, faster

The loss. A split's n tokens x_0 .. x_{n-1} (its val.bin) are cut into windows of block_size + 1 tokens
that overlap by one: window k reads x[kT : kT+T] and predicts x[kT+1 : kT+T+1], T = block_size (the
last window is shorter). Every token but the first is predicted exactly once, n - 1 in all, from the
1 to T tokens before it in its window, and the loss is the mean of those n - 1 negative log-likelihoods
(nats, softmax over the model's whole output layer, as in training). nanoGPT's val loss, and the paper's,
estimate this number from random windows; here every token counts once.
It does not depend on the number of processes: windows go into batches of batch_size in order, batch j
runs on process j mod N, each window's loss is summed in float64 (float32 on MPS), and every process adds
the windows' sums in window order (math.fsum). 1 process and N processes give the same number, bit for
bit, for the same batch_size, device and dtype (tested on CPU with gloo, one thread per process).

LAMBADA's accuracy. A passage counts as correct when greedy decoding from its context produces its last
word exactly: at each token of the word (with the space before it, see prepare_data.EVAL_SETS) the argmax
of the model's output, given the context and the word's earlier tokens, is that token. Nothing after the
word is checked (a model that would go on from 'stone' to 'stones' is right), and there is no stop-word
filter: the rule of EleutherAI's lm-evaluation-harness for lambada_openai. A passage longer than
block_size keeps its last block_size tokens.

Every result is printed as a table and appended to <out_dir>/log.jsonl as one JSON line per dataset
(kind "zero_shot"), after the training log's lines.
"""
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from options import UsageError, parse, run_main
from prepare_data import load_meta
from train_common import RunLog, autocast, launch, load_gpt, resolve_dtype, sum_dtype

DEFAULTS = dict(
    out_dir='out',               # the checkpoint is out_dir/ckpt.pt; results are appended to out_dir/log.jsonl
    datasets='openwebtext,lambada,wikitext2,ptb',  # prepared datasets under data_dir, comma-separated
    data_dir='data',             # where prepare_data.py puts datasets
    block_size=0,                # window length T; 0: the model's own (1024 for the paper's models)
    batch_size=8,                # windows (or LAMBADA passages) per forward pass
    device='auto',               # auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps
    dtype='auto',                # auto (bfloat16 on GPUs that have it, else float16; float32 on cpu), or a name
)

# The paper's Table 4 (left) and the release's README: zero-shot loss, nats per GPT-2 token
PAPER = {'openwebtext': (3.20, 2.84), 'lambada': (4.98, 4.32), 'wikitext2': (4.77, 4.13), 'ptb': (6.39, 5.75)}
PAPER_MODELS = ('ToST-Base', 'GPT-2 Base')

# -----------------------------------------------------------------------------
# the checkpoint and the data


def open_split(data_dir, name, ckpt_meta, model_vocab, ckpt_path):
    """A prepared text dataset's val split: (its meta, its tokens as a uint16 memmap, LAMBADA targets or None).
    Its tokenizer must be the checkpoint's."""
    path = os.path.join(data_dir, name)
    meta = load_meta(path)
    if meta.get('kind') != 'text':
        raise UsageError(f"{path} holds {meta.get('kind')} data, not text")
    want = ckpt_meta.get('tokenizer'), ckpt_meta.get('vocab_size')
    got = meta.get('tokenizer'), meta.get('vocab_size')
    if got != want:
        raise UsageError(f"{path} uses tokenizer {got[0]} ({got[1]} ids), the checkpoint {ckpt_path} was trained with "
                         f"{want[0]} ({want[1]} ids); prepare it with --tokenizer={want[0]} --name=OTHER")
    if meta['vocab_size'] > model_vocab:
        raise UsageError(f"{path} has {meta['vocab_size']} token ids, the model's output layer only {model_vocab}")
    f = os.path.join(path, 'val.bin')
    n = os.path.getsize(f) // 2 if os.path.isfile(f) else 0
    if not os.path.isfile(f) or n != meta.get('val_tokens') or n < 2:
        what = ('is missing' if not os.path.isfile(f) else f"has {n} tokens, not the {meta.get('val_tokens')} its "
                f"meta.json says" if n != meta.get('val_tokens') else f"has {n} tokens, too few to score")
        raise UsageError(f"{f} {what}; rebuild it: python prepare_data.py {meta.get('dataset', name)} --force")
    tokens = np.memmap(f, dtype=np.uint16, mode='r')
    spans = None
    if meta.get('targets'):  # LAMBADA: (passage start, word start, word end) per passage
        try:
            spans = np.load(os.path.join(path, meta['targets']))
        except (OSError, ValueError) as e:
            raise UsageError(f"{path}/{meta['targets']} is unreadable ({e}); rebuild with --force") from None
        if spans.ndim != 2 or spans.shape[1] != 3 or not len(spans) or spans.min() < 0 or spans.max() > n or \
                not (spans[:, 0] < spans[:, 1]).all() or not (spans[:, 1] < spans[:, 2]).all():
            raise UsageError(f"{path}/{meta['targets']} does not describe passages of val.bin; rebuild with --force")
    return meta, tokens, spans

# -----------------------------------------------------------------------------
# the two measurements


def windows(n_tokens, T):
    """(start, length) of each window: it reads tokens start .. start+length-1 and predicts start+1 ..
    start+length. Together they predict tokens 1 .. n_tokens-1, each once."""
    return [(s, min(T, n_tokens - 1 - s)) for s in range(0, n_tokens - 1, T)]


def _batches(n_items, B, dist, cut=None):
    """Batches of item indices, in order, B at a time (and a new batch at `cut`), and this process's share."""
    edges = sorted({*range(0, n_items, B), *([cut] if cut is not None and cut < n_items else [])})
    groups = [range(a, b) for a, b in zip(edges, edges[1:] + [n_items])]
    return [g for j, g in enumerate(groups) if j % dist.world_size == dist.rank]


def _gather(x, dist):
    """x holds this process's entries and zeros elsewhere; afterwards every process holds all entries."""
    if dist.ddp:
        torch.distributed.all_reduce(x)  # each entry is set on one process: a sum with zeros, exact
    return x.tolist()


def _rows(tokens, starts, length):
    return torch.from_numpy(np.stack([tokens[s:s + length] for s in starts]).astype(np.int64))


@torch.no_grad()
def split_loss(model, tokens, T, B, device, ctx, dist):
    """Mean loss in nats over tokens 1 .. n-1 of `tokens`, as the module docstring says. Returns
    (loss, number of tokens scored, number of windows)."""
    wins = windows(len(tokens), T)
    sums = torch.zeros(len(wins), dtype=sum_dtype(device), device=device)
    full = sum(1 for _, length in wins if length == T)  # only the last window can be shorter
    for group in _batches(len(wins), B, dist, cut=full):
        starts, length = [wins[i][0] for i in group], wins[group[0]][1]
        x = _rows(tokens, starts, length).to(device)
        y = _rows(tokens, [s + 1 for s in starts], length).to(device)
        with ctx:
            logits = model.logits(x)  # every position's, and no mean loss: each token is scored here, once
        nll = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction='none')
        sums[group.start:group.stop] = nll.view(len(group), length).to(sums.dtype).sum(1)
    return math.fsum(_gather(sums, dist)) / (len(tokens) - 1), len(tokens) - 1, len(wins)


@torch.no_grad()
def last_word_accuracy(model, tokens, spans, T, B, device, ctx, dist):
    """Which passages greedy decoding gets right, as the module docstring says. Returns (correct flags as a
    list of bools, number of passages cut to their last T tokens)."""
    correct = torch.zeros(len(spans), dtype=sum_dtype(device), device=device)
    for group in _batches(len(spans), B, dist):
        rows = [(max(int(p), int(e) - 1 - T), int(s), int(e)) for p, s, e in spans[group.start:group.stop]]
        L = max(e - 1 - a for a, _, e in rows)
        x = torch.zeros(len(rows), L, dtype=torch.long)        # the passages, right-padded
        want = torch.full((len(rows), L), -1, dtype=torch.long)  # at position t: token t+1 if it is in the word
        for i, (a, s, e) in enumerate(rows):
            x[i, :e - 1 - a] = torch.from_numpy(tokens[a:e - 1].astype(np.int64))
            want[i, s - 1 - a:e - 1 - a] = torch.from_numpy(tokens[s:e].astype(np.int64))
        x, want = x.to(device), want.to(device)
        with ctx:
            logits = model.logits(x)  # causal: the padding after a passage does not change its outputs
        hit = (logits.argmax(-1) == want) | (want < 0)          # compared on the device: no wait per passage
        correct[group.start:group.stop] = hit.all(1).to(correct.dtype)
    cut = int(sum(e - 1 - T > p for p, _, e in spans))
    return [c == 1.0 for c in _gather(correct, dist)], cut

# -----------------------------------------------------------------------------


def table(results, model_name):
    """The results in the paper's layout: one row per dataset, loss in nats per token, beside the paper's."""
    head = f"{'dataset':<14}{'tokens':>12}{'loss':>9}{'ppl':>10}{'LAMBADA acc':>14}   " + \
           ''.join(f"{m:>12}" for m in PAPER_MODELS) + "  (paper)"
    lines = [f"zero-shot loss of {model_name}, nats per token", head]
    for r in results:
        acc = f"{100 * r['last_word_acc']:.2f}%" if 'last_word_acc' in r else ''
        paper = PAPER.get(r['dataset_kind']) if r['tokenizer'] == 'gpt2' else None
        lines.append(f"{r['dataset']:<14}{r['tokens']:>12,}{r['loss']:>9.4f}{r['ppl']:>10.2f}{acc:>14}   "
                     + ''.join(f"{v:>12.2f}" for v in paper or ()))
    return '\n'.join(lines)


def run(cfg, set_keys, dist):
    device, master = dist.device, dist.master
    dtype = resolve_dtype(cfg['dtype'], device)
    ckpt_path = os.path.join(cfg['out_dir'], 'ckpt.pt')
    names = [n.strip() for n in cfg['datasets'].split(',') if n.strip()]
    model, info = load_gpt(ckpt_path, device, 'eval_gpt.py')
    T, B = cfg['block_size'] or model.config.block_size, cfg['batch_size']
    if T > model.config.block_size:
        raise UsageError(f"--block_size={T} is larger than the model's context ({model.config.block_size})")
    sets = [(n, *open_split(cfg['data_dir'], n, info['meta'], model.config.vocab_size, ckpt_path)) for n in names]
    ctx = autocast(device, dtype)
    args = info['model_args']
    hybrid = f", softmax blocks {args['softmax_layers']}" if args.get('softmax_layers') else ''
    model_name = (f"{ckpt_path} (iter {info.get('iter_num')}, attn={args.get('attn', 'tssa')}{hybrid}, "
                  f"{model.get_num_params() / 1e6:.2f}M params)")
    log = RunLog(cfg['out_dir'], enabled=master, fresh=False)  # append: the training log stays
    log.print(f"{model_name}: windows of {T} tokens, batch {B}, {dtype} on {device}, {dist.world_size} process(es)")
    results = []
    try:
        for name, meta, tokens, spans in sets:
            t0 = time.time()
            loss, scored, n_win = split_loss(model, tokens, T, B, device, ctx, dist)
            try:
                ppl = math.exp(loss)
            except OverflowError:
                ppl = float('inf')
            r = dict(kind='zero_shot', dataset=name, dataset_kind=meta.get('dataset', name), loss=loss, ppl=ppl,
                     tokens=scored, windows=n_win, block_size=T, batch_size=B, tokenizer=meta['tokenizer'],
                     ckpt=ckpt_path, iter=info.get('iter_num'), attn=args.get('attn', 'tssa'),
                     softmax_layers=list(args.get('softmax_layers', ())), dtype=dtype,
                     device=device, processes=dist.world_size)
            if spans is not None:
                correct, cut = last_word_accuracy(model, tokens, spans, T, B, device, ctx, dist)
                r.update(last_word_acc=sum(correct) / len(correct), last_word_correct=sum(correct),
                         passages=len(correct), passages_cut=cut)
            r['elapsed_s'] = round(time.time() - t0, 2)
            log.record(r)
            acc = f", last-word accuracy {100 * r['last_word_acc']:.2f}%" if spans is not None else ''
            log.print(f"{name}: loss {loss:.4f} (ppl {ppl:.2f}) over {scored:,} tokens{acc}, {r['elapsed_s']}s")
            results.append(r)
    finally:
        log.close()
    if master:
        print(table(results, model_name), flush=True)
    return results


def main(argv=None):
    cfg, set_keys = parse(sys.argv[1:] if argv is None else argv, DEFAULTS, __doc__, __file__)
    if not cfg['datasets'].strip(', '):
        raise UsageError("--datasets is empty; give dataset names under --data_dir, e.g. --datasets=wikitext2,ptb")
    if cfg['batch_size'] < 1 or cfg['block_size'] < 0:
        raise UsageError("--batch_size must be >= 1 and --block_size >= 0 (0: the model's)")
    return launch(run, cfg, set_keys)


if __name__ == '__main__':
    run_main(main)
