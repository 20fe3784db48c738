"""
Quality and capability, measured side by side: training runs of minutes each (bench.py measures speed).

    python study.py language          # the demo budget: ToST, ToST + token shift, softmax, softmax + shift, heads
    python study.py vision            # ToST with and without XCiT's local patch interaction, synthetic images
    python study.py tasks             # what ToST can and cannot do: synthetic tasks, ToST vs softmax
    python study.py tasks --quick     # the same map at two knob values per task, under 10 minutes on 2 cores
    python study.py language,tasks --json=study.json

Every model in a table gets the same budget (data, width, depth, optimizer, steps, schedule, seed); the
budget is printed with each table. One seed per cell: differences of a few hundredths are noise.
"""

import argparse
import json
import multiprocessing
import os
import sys
import time
from typing import NamedTuple

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

import tost
from train_common import cosine_lr

console = Console() if sys.stdout.isatty() else Console(width=130)   # no truncated columns in logs


# -----------------------------------------------------------------------------
# sections


SECTIONS = {}


# -----------------------------------------------------------------------------
# tasks: what ToST can and cannot do, on synthetic tasks (issue 15)
#
# A generator makes n sequences at one knob value: x, y, int64 arrays (n, T). y[b, t] is the label the model
# must output at position t (GPT.forward's targets), -1 where nothing is asked; loss and accuracy are taken
# where y >= 0 only. Every label is a function of x[b, :t+1] (tested).


def gen_recall(rng, n, pairs, keys=32):
    """Multi-query associative recall after Zoology (Arora et al. 2023, arXiv 2312.04927): k_1 v_1 .. k_N v_N,
    then queries: the keys of a random subset of ceil(N/2) pairs, in random order, each followed by its value
    (the last one's value is what the model must say, so it is not an input). Keys are tokens 0..31, values
    32..63, distinct within a sequence. Labelled: the value, at each query key. T = 2N + 2 ceil(N/2) - 1.
    Zoology asks every key, with random filler tokens between the queries; asking half of them leaves less
    to guess by elimination (see recall_chance) and keeps the sequences short."""
    k = rng.random((n, keys)).argsort(1)[:, :pairs]               # (n, N) distinct keys
    v = rng.random((n, keys)).argsort(1)[:, :pairs] + keys        # (n, N) distinct values
    q = rng.random((n, pairs)).argsort(1)[:, :(pairs + 1) // 2]   # (n, Q) the pairs asked, in random order
    qk, qv = np.take_along_axis(k, q, 1), np.take_along_axis(v, q, 1)
    x = np.concatenate([np.stack([k, v], 2).reshape(n, -1), np.stack([qk, qv], 2).reshape(n, -1)], 1)
    y = np.full_like(x, -1)
    y[:, 2 * pairs::2] = qv
    return x[:, :-1], y[:, :-1]


def gen_copy(rng, n, length, symbols=32):
    """Copying (induction): a random segment s of `length` symbols, a separator (token 32), then s again.
    Labelled: every symbol of the repeat, at the token before it. T = 2 * length."""
    s = rng.integers(0, symbols, (n, length))
    x = np.concatenate([s, np.full((n, 1), symbols), s[:, :-1]], 1)
    y = np.full_like(x, -1)
    y[:, length:] = s
    return x, y


def gen_periodic(rng, n, period, symbols=32, T=32):
    """A local task: P random symbols repeated, x_t = x_{t mod P}. Labelled: the next token, wherever it is
    determined (t >= P - 1); it is the token P - 1 places back, so P = 2, 3 need the previous one or two."""
    s = rng.integers(0, symbols, (n, period))
    x = s[:, np.arange(T + 1) % period]
    y = x[:, 1:].copy()
    y[:, :period - 1] = -1
    return x[:, :-1], y


def gen_mode(rng, n, symbols, T=48, warmup=8):
    """A statistic: the most frequent symbol so far. Each sequence draws its own symbol frequencies
    (Dirichlet(1)), then T symbols from them. Labelled: the mode of x_0..x_t, at t >= warmup - 1 where the
    mode is unique."""
    cdf = rng.dirichlet(np.ones(symbols), n).cumsum(1)                           # (n, A)
    x = np.minimum((rng.random((n, T, 1)) > cdf[:, None]).sum(-1), symbols - 1)  # (n, T) inverse CDF
    counts = np.cumsum(np.eye(symbols, dtype=np.int64)[x], 1)                    # (n, T, A) counts so far
    top2 = np.sort(counts, -1)[..., -2:]
    y = counts.argmax(-1)
    y[top2[..., 0] == top2[..., 1]] = -1                                         # a tie: no answer
    y[:, :warmup - 1] = -1
    return x, y


class Task(NamedTuple):
    name: str
    knob: str
    gen: object           # gen(rng, n, value) -> x, y
    vocab: int
    chance: object        # chance(value): the accuracy of a guess that misses what the task tests
    full: tuple           # knob values of the full run
    quick: tuple          # and of --quick
    steps: tuple          # training steps: (full, quick)


def recall_chance(pairs):
    """A model that knows which values the pairs hold, and which ones earlier answers took, but not which
    key each belongs to: query j (from 0) is right with probability 1 / (N - j)."""
    return float(np.mean([1 / (pairs - j) for j in range((pairs + 1) // 2)]))


TASKS = [
    Task('recall', 'pairs', gen_recall, 64, recall_chance, (2, 4, 8), (2, 4), (3000, 1200)),
    Task('copy', 'length', gen_copy, 33, lambda v: 1 / 32, (8, 16, 32), (8, 32), (600, 200)),
    Task('periodic', 'period', gen_periodic, 32, lambda v: 1 / 32, (2, 3, 4), (2, 4), (600, 200)),
    Task('mode', 'symbols', gen_mode, 32, lambda v: 1 / v, (4, 8, 16), (4, 16), (1000, 200)),
]
TASK_MODELS = {'tssa': dict(attn='tssa'), 'tssa+shift': dict(attn='tssa', token_shift=True),
               'softmax': dict(attn='softmax'), 'softmax+shift': dict(attn='softmax', token_shift=True)}
# Shared by every model of every row. Layer-scale init 1.0: the GPT's default 1e-5 slows tiny models down.
TASK_MODEL = dict(n_layer=2, n_head=4, n_embd=64, layerscale_init=1.0)
TASK_OPT = dict(lr=1e-3, min_lr=1e-4, warmup=0.1, weight_decay=0.1, betas=(0.9, 0.98), clip=1.0,
                tokens=1280)   # tokens per step: batch = tokens // T, so a step costs about the same at any T
TASK_TEST = {'full': 1024, 'quick': 512, 'smoke': 8}   # held-out sequences per row
TASK_SEED = 1


def task_steps(task, mode):
    return {'full': task.steps[0], 'quick': task.steps[1], 'smoke': 2}[mode]


def row_hash(x):
    """A 64-bit hash per row: equal rows hash equal (sum_t x_t c_t mod 2^64, c_t fixed random odd numbers)."""
    c = np.random.default_rng(0).integers(1, 2 ** 62, x.shape[1], dtype=np.uint64) | np.uint64(1)
    return (x.astype(np.uint64) * c).sum(1)


def task_test_set(task, value, n, seed=TASK_SEED):
    return task.gen(np.random.default_rng([seed, 0]), n, value)


def task_train_batches(task, value, batch, steps, test_x, seed=TASK_SEED):
    """The training stream, the same for every model: fresh sequences, minus any whose hash is a test
    sequence's (so train and test are disjoint). Yields `steps` batches (x, y) as torch tensors."""
    seen, rng = row_hash(test_x), np.random.default_rng([seed, 1])
    for a in range(0, steps, 64):                      # 64 batches generated at a time
        need, xs, ys = min(64, steps - a) * batch, [], []
        while need > 0:
            x, y = task.gen(rng, need, value)
            keep = ~np.isin(row_hash(x), seen)
            xs.append(x[keep][:need]), ys.append(y[keep][:need])
            need -= len(xs[-1])
        x, y = torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))
        yield from zip(x.split(batch), y.split(batch))


def task_accuracy(model, x, y, batch=256):
    """The fraction of labelled positions (y >= 0) where the model's top token is the label."""
    model.eval()
    right = total = 0
    with torch.no_grad():
        for xb, yb in zip(torch.from_numpy(x).split(batch), torch.from_numpy(y).split(batch)):
            logits, _ = model(xb, yb)
            m = yb >= 0
            right += (logits.argmax(-1)[m] == yb[m]).sum().item()
            total += m.sum().item()
    model.train()
    return right / total


def task_run(job):
    """One cell of the table: train a tiny GPT on a task at one knob value; its accuracy on held-out sequences."""
    name, value, kind, mode = job
    task, o = next(t for t in TASKS if t.name == name), TASK_OPT
    torch.set_num_threads(1)
    t0 = time.time()
    x_test, y_test = task_test_set(task, value, TASK_TEST[mode])
    steps, batch = task_steps(task, mode), max(1, o['tokens'] // x_test.shape[1])
    torch.manual_seed(TASK_SEED)
    cfg = tost.GPTConfig(block_size=x_test.shape[1], vocab_size=task.vocab, **TASK_MODEL, **TASK_MODELS[kind])
    model = tost.GPT(cfg)
    opt = tost.make_optimizer(model, o['weight_decay'], o['lr'], o['betas'], 'cpu')
    for it, (x, y) in enumerate(task_train_batches(task, value, batch, steps, x_test)):
        for g in opt.param_groups:
            g['lr'] = cosine_lr(it, o['lr'], o['min_lr'], o['warmup'] * steps, steps)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o['clip'])
        opt.step()
    return dict(task=name, knob=task.knob, value=value, model=kind, accuracy=task_accuracy(model, x_test, y_test),
                chance=task.chance(value), train_loss=round(loss.item(), 4), steps=steps, batch=batch,
                seq_len=x_test.shape[1], seconds=round(time.time() - t0, 1))


def section_tasks(args, results):
    mode = args.mode
    values = lambda t: t.quick[:1] if mode == 'smoke' else getattr(t, mode)
    jobs = [(t.name, v, kind, mode) for t in TASKS for v in values(t) for kind in TASK_MODELS]
    o, m, steps = TASK_OPT, TASK_MODEL, {t.name: task_steps(t, mode) for t in TASKS}
    budget = dict(model=m, optimizer=dict(o, name='AdamW', schedule='linear warmup, cosine to min_lr'),
                  steps=steps, test_sequences=TASK_TEST[mode], seed=TASK_SEED)
    console.print(f"tasks: {len(jobs)} tiny GPTs, trained two at a time (two processes of one thread each)")
    # A process per core: a tiny model's step is too small to split over two threads (the second mostly waits).
    # spawn, not fork: a forked child of a process that already ran torch's thread pool can hang.
    rows = []
    with multiprocessing.get_context('spawn').Pool(2) as pool:
        for r in pool.imap_unordered(task_run, jobs):
            rows.append(r)
            console.print(f"  {r['task']} {r['knob']} {r['value']}, {r['model']}: accuracy {r['accuracy']:.3f} "
                          f"(chance {r['chance']:.3f}), {r['seconds']:.0f} s", style="dim")
    rows.sort(key=lambda r: jobs.index((r['task'], r['value'], r['model'], mode)))
    results['tasks'], results['tasks_budget'] = rows, budget
    console.print(f"budget, the same for every model in a row: GPT {m['n_layer']} layers, width {m['n_embd']}, "
                  f"{m['n_head']} heads, layer-scale init {m['layerscale_init']}; AdamW lr {o['lr']:g} "
                  f"({o['warmup']:.0%} linear warmup, cosine to {o['min_lr']:g}), weight decay {o['weight_decay']}, "
                  f"betas {o['betas']}, gradient clip {o['clip']}; {o['tokens']} tokens a step (batch = "
                  f"{o['tokens']} // sequence length), fresh sequences every step; steps: " +
                  ', '.join(f'{k} {v}' for k, v in steps.items()) +
                  f"; {TASK_TEST[mode]} held-out test sequences per row; seed {TASK_SEED}, one run per cell")
    t = Table(title="What ToST can and cannot do: accuracy on held-out sequences, at the labelled positions")
    for c in ['task', 'knob', 'length', 'chance', *TASK_MODELS]:
        t.add_column(c, justify='right')
    for i in range(0, len(rows), len(TASK_MODELS)):
        r = rows[i]
        t.add_row(r['task'], f"{r['knob']} {r['value']}", str(r['seq_len']), f"{r['chance']:.2f}",
                  *(f"{x['accuracy']:.2f}" for x in rows[i:i + len(TASK_MODELS)]))
    console.print(t)


SECTIONS['tasks'] = section_tasks


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0].strip(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('sections', help='comma-separated: ' + ', '.join(SECTIONS))
    ap.add_argument('--quick', action='store_true', help='a smaller budget (see each section)')
    ap.add_argument('--smoke', action='store_true', help='tiny budget, seconds; checks that a section runs')
    ap.add_argument('--json', default=None, help='also write the results here')
    args = ap.parse_args(argv)
    args.mode = 'smoke' if args.smoke else 'quick' if args.quick else 'full'
    sections = [s.strip() for s in args.sections.split(',') if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown or not sections:
        sys.exit(f"error: unknown section(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(SECTIONS)}")
    results = dict(mode=args.mode, torch=torch.__version__, threads=torch.get_num_threads())
    t0 = time.time()
    for s in sections:
        SECTIONS[s](args, results)
    results['seconds'] = round(time.time() - t0, 1)
    console.print(f"done in {results['seconds']:.0f} s")
    if args.json:
        with open(args.json + '.tmp', 'w') as f:
            json.dump(results, f, indent=1)
        os.replace(args.json + '.tmp', args.json)
    return results


if __name__ == '__main__':
    main()
