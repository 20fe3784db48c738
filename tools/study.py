"""
Quality and capability, side by side: training runs of minutes each (docs/quality.md, docs/capabilities.md).
From the repo root:

    python -m tools.study language          # the demo budget: ToST, softmax, hybrids, +- token shift; heads
    python -m tools.study vision            # ToST +- XCiT's local patch interaction, on synthetic images
    python -m tools.study tasks             # what ToST can and cannot do: ToST vs softmax vs hybrid
    python -m tools.study tasks --quick     # the same map at two knob values per task
    python -m tools.study language,tasks --json=study.json

Every model in a table gets the same budget, printed with the table. --json=PATH writes the results, and
beside them a figure per section: language.png, vision.png (learning curves), tasks.png (the capability map).
The file is written whole: one that holds results of sections this run does not measure is refused. The runs
go to out_dir/SECTION-RUN; a --quick or --smoke study's to SECTION-RUN-quick or -smoke, apart from a full
one's.
"""
import os
import sys

# Also run by its path (python tools/study.py): the repository's modules come from its root.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import options  # first: its handler ends a Ctrl-C while torch imports (exit 130, no traceback)
import collections
import json
import multiprocessing
import signal
import subprocess
import time
from types import SimpleNamespace

import numpy as np
import torch

import plot
import tost
from options import UsageError, parse
from tools.bench import REPO, console, machine, run_sections, table
from train_common import cosine_lr, optimizer_step


def flags(keys):
    """Options `keys` (a dict) as a command line gives them."""
    return [f'--{k}={v}' for k, v in keys.items()]


def run_script(script, keys):
    """Run one of the repo's scripts with options `keys` in a subprocess, its output captured. Its failure is
    one line: the command, then the child's own last line (its `error:` line, or the last line of a
    traceback)."""
    args = [script, *flags(keys)]
    # The child writes UTF-8 and it is read as such, whatever the code page (Windows' is not UTF-8).
    out = subprocess.run([sys.executable, *args], capture_output=True, cwd=REPO, encoding='utf-8',
                         errors='replace', env=dict(os.environ, PYTHONIOENCODING='utf-8'))
    if out.returncode != 0:
        said = (out.stderr or out.stdout).strip().splitlines() or [f'exit {out.returncode}']
        raise UsageError(f"{options.shell_join(args)} failed: {said[-1].removeprefix('error: ')}")
    return out


# --smoke trains only these runs: in each section the paper's model and one with each option (the token
# shift, a hybrid; lpi), enough to see that every path runs
SMOKE = ('tost', 'tost-shift', 'hybrid-last-shift', 'tost-lpi')


def tag(mode):
    """What a smoke or quick study adds to the names of its runs and data (language-tost-smoke): they never
    replace a full study's."""
    return '' if mode == 'full' else f'-{mode}'


def train(args, section, script, variants, keys):
    """Train each of `variants` ((run name, label, overrides); in the smoke test only those of SMOKE) with
    `script`, `keys` and its overrides, in float32 (as measured), into out_dir/section-run. Yields (the row of
    the table: its label, overrides, out_dir and seconds; the run's folder; its log's rows)."""
    # Made here: a folder that cannot be is one line naming --out_dir (the handler's), not a failed run.
    os.makedirs(args.out_dir, exist_ok=True)
    for run, name, extra in variants:
        if args.mode == 'smoke' and run not in SMOKE:
            continue
        out_dir = os.path.join(args.out_dir, f'{section}-{run}{tag(args.mode)}')
        t0 = time.time()
        run_script(script, {'dtype': 'float32', **keys, **extra, 'out_dir': out_dir, 'overwrite': True})
        seconds = round(time.time() - t0, 1)
        # Relative to here, as the docs show it; on Windows a folder on another drive has no such path.
        try:
            shown = os.path.relpath(out_dir)
        except ValueError:
            shown = out_dir
        row = dict(variant=name, **extra, seconds=seconds, out_dir=shown)
        yield row, out_dir, plot.read_run(out_dir)[2]


# -----------------------------------------------------------------------------
# language: the demo's model and budget (train_gpt.py on python_stdlib bytes) with ToST, softmax, hybrids of
# the two, each with and without the token shift, and more heads; each run's val loss, speed and a sample

LANGUAGE = [   # (run name, label, train_gpt.py overrides); the first is the paper's model, the demo's default
    ('tost', 'ToST (paper)', {}),
    ('tost-shift', 'ToST + token shift', {'token_shift': True}),
    ('softmax', 'softmax', {'attn': 'softmax'}),
    ('softmax-shift', 'softmax + token shift', {'attn': 'softmax', 'token_shift': True}),
    # hybrids (tost.py, GPTConfig.softmax_layers): one of the four blocks softmax, the others TSSA
    ('hybrid-last-shift', 'hybrid: last block softmax + shift', dict(softmax_layers='-1', token_shift=True)),
    ('hybrid-last', 'hybrid: last block softmax', {'softmax_layers': '-1'}),
    ('hybrid-first-shift', 'hybrid: first block softmax + shift', dict(softmax_layers='0', token_shift=True)),
    ('tost-8-heads', 'ToST, 8 heads', {'n_head': 8}),
    ('tost-16-heads', 'ToST, 16 heads', {'n_head': 16}),
]
# overrides of train_gpt.py's defaults (the demo)
LANGUAGE_BUDGET = {
    'full': {},
    # the demo's schedule and its four evaluations in a fifth of the steps (cut short, it would end before its
    # cosine decays)
    'quick': dict(max_iters=200, lr_decay_iters=200, warmup_iters=10, eval_interval=50),
    'smoke': dict(max_iters=4, eval_iters=1, eval_interval=4, batch_size=2, block_size=32, n_layer=1),
}
SAMPLE = dict(start='def ', seed=1, temperature=0.8, max_new_tokens=160, num_samples=1)


def section_language(args, results):
    """Train each of LANGUAGE, sample from it, and print the table and the samples."""
    budget = LANGUAGE_BUDGET[args.mode]
    rows = []
    for row, out_dir, log in train(args, 'language', 'train_gpt.py', LANGUAGE, budget):
        val = [r['val_loss'] for r in log if r.get('kind') == 'eval'][-1]
        # every training row has one (the last step always writes a row)
        speeds = [r['tokens_per_sec'] for r in log if r.get('kind') == 'train']
        # the first row includes the warm-up
        speeds = speeds[1:] or speeds
        sample = run_script('sample.py', dict(out_dir=out_dir, **SAMPLE)).stdout
        row.update(val_loss=val, tokens_per_sec=sum(speeds) / len(speeds), sample=sample.strip())
        rows.append(row)
        console.print(f"  {row['variant']}: val loss {val:.3f}", style="dim")
    results['language'] = dict(rows=rows, budget=dict(
        budget, note='train_gpt.py defaults (the demo) with these overrides, seed 1337, one run each'))
    table(results, f"Language, the demo budget{' with ' + str(budget) if budget else ''}: python_stdlib "
                   f"bytes, val loss in nats per byte (one seed)",
          ['model', 'val loss', 'vs ToST (paper)', 'train tokens/s'],
          [(r['variant'], f"{r['val_loss']:.3f}", f"{r['val_loss'] - rows[0]['val_loss']:+.3f}",
            f"{r['tokens_per_sec']:,.0f}") for r in rows])
    # Each command and sample line whole, however wide the console (a log's is 130 columns): a command wrapped
    # across lines runs another when its first line is pasted.
    for r in rows:
        line = options.shell_join(['python', 'sample.py', *flags(dict(out_dir=r['out_dir'], **SAMPLE))])
        sample = r['sample'].split('\n---------------')[0]
        console.print(f"{r['variant']}: {line}\n{sample}", markup=False, highlight=False, soft_wrap=True)


# -----------------------------------------------------------------------------
# vision: local patch interaction, on synthetic images where local structure decides the class

def make_glyph_images(folder, n_train, n_test):
    """A CIFAR-format dataset (as prepare_data.py writes it) where only local structure tells the classes
    apart: each 32x32 image is noise with one 5x5 glyph (one of 10 fixed random patterns, its class) at a
    random place and brightness. A glyph straddles 4x4 patches, so a patch alone rarely shows it whole."""
    rng = np.random.default_rng(0)
    glyphs = rng.random((10, 5, 5)) < 0.5
    os.makedirs(folder, exist_ok=True)
    for split, n in (('train', n_train), ('test', n_test)):
        y = rng.integers(0, 10, n)
        x = rng.integers(0, 120, (n, 3, 32, 32))
        # the glyph's top left corner: it fits in the image
        oy, ox = rng.integers(0, 32 - 5, (2, n))
        colour = rng.integers(150, 256, (n, 3))
        # every glyph pixel (its image, its row and column in the glyph) takes its image's colour
        i, r, c = np.nonzero(glyphs[y])
        x[i, :, oy[i] + r, ox[i] + c] = colour[i]
        np.save(os.path.join(folder, f'{split}_images.npy'), x.astype(np.uint8))
        np.save(os.path.join(folder, f'{split}_labels.npy'), y)
    # what train_vit.py reads of a meta.json
    meta = dict(kind='images', num_classes=10, classes=[f'glyph{i}' for i in range(10)],
                image_size=32, channels=3, mean=[0.3] * 3, std=[0.2] * 3)
    with open(os.path.join(folder, 'meta.json'), 'w', encoding='utf-8') as f:
        json.dump(meta, f)


VISION = [('tost', 'ToST (paper)', {}), ('tost-lpi', 'ToST + lpi', {'lpi': True}),
          ('softmax', 'softmax', {'attn': 'softmax'}),
          ('softmax-lpi', 'softmax + lpi', {'attn': 'softmax', 'lpi': True})]
# train_vit.py's model and warmup for every row and budget
VISION_MODEL = dict(model='tost-cifar-tiny', warmup_epochs=1)
VISION_BUDGET = {   # train images, test images, and train_vit.py overrides
    'full': (6144, 2048, dict(epochs=6, batch_size=64)),
    'quick': (2048, 1024, dict(epochs=4, batch_size=64)),
    'smoke': (64, 32, dict(epochs=1, batch_size=16)),
}


def section_vision(args, results):
    """Make the glyph images, train each of VISION on them, and print the table of test accuracies."""
    n_train, n_test, overrides = VISION_BUDGET[args.mode]
    data_dir = os.path.join(args.out_dir, 'data')
    name = f'glyphs{tag(args.mode)}'
    make_glyph_images(os.path.join(data_dir, name), n_train, n_test)
    budget = dict(VISION_MODEL, **overrides)
    keys = dict(budget, dataset=name, data_dir=data_dir, viz_images=0, compression_images=0)
    rows = []
    for row, _, log in train(args, 'vision', 'train_vit.py', VISION, keys):
        evals = [r['test_acc'] for r in log if r.get('test_acc') is not None]
        row.update(test_acc=evals[-1], best_acc=max(evals))
        rows.append(row)
        console.print(f"  {row['variant']}: test accuracy {evals[-1]:.3f}", style="dim")
    results['vision'] = dict(rows=rows, budget=dict(
        budget, train_images=n_train, test_images=n_test,
        note='train_vit.py defaults with these overrides, seed 1337, one run each'))
    table(results, f"Vision: {n_train} synthetic 32px images (10 glyph classes on noise), "
                   f"tost-cifar-tiny, {budget['epochs']} epochs of batch {budget['batch_size']}, "
                   f"one seed; chance 0.10",
          ['model', 'test accuracy (last epoch)', 'best', 'seconds'],
          [(r['variant'], f"{r['test_acc']:.3f}", f"{r['best_acc']:.3f}", f"{r['seconds']:.0f}")
           for r in rows])


# -----------------------------------------------------------------------------
# tasks: what ToST can and cannot do, on synthetic tasks (docs/capabilities.md)
#
# A generator makes n sequences at one knob value: x, y, int64 arrays (n, T); y[b, t] is the label at
# position t (GPT.forward's targets), -1 where nothing is asked. Every label follows from x[b, :t+1] (tested).


def gen_recall(rng, n, pairs):
    """k_1 v_1 .. k_N v_N (keys 0..31, values 32..63), then the keys of ceil(N/2) random pairs, each
    followed by its value (but the last). Labelled: the value, at each query key."""
    k = rng.random((n, 32)).argsort(1)[:, :pairs]                 # (n, N) distinct keys
    v = rng.random((n, 32)).argsort(1)[:, :pairs] + 32            # (n, N) distinct values
    q = rng.random((n, pairs)).argsort(1)[:, :(pairs + 1) // 2]   # (n, Q) the pairs asked, in random order
    kv = np.stack([k, v], 2)                                      # (n, N, 2)
    asked = np.take_along_axis(kv, q[..., None], 1)               # (n, Q, 2)
    x = np.concatenate([kv, asked], 1).reshape(n, -1)
    y = np.full_like(x, -1)
    y[:, 2 * pairs::2] = asked[..., 1]
    return x[:, :-1], y[:, :-1]


def gen_copy(rng, n, length):
    """A random segment s of symbols 0..31, a separator (token 32), s again. Labelled: each symbol of the
    repeat, at the token before it."""
    s = rng.integers(0, 32, (n, length))
    x = np.concatenate([s, np.full((n, 1), 32), s[:, :-1]], 1)
    y = np.full_like(x, -1)
    y[:, length:] = s
    return x, y


def gen_periodic(rng, n, period):
    """P random symbols (of 32) repeated to 32 tokens. Labelled: the next token (the one P - 1 places back),
    from t = P - 1 on."""
    s = rng.integers(0, 32, (n, period))
    # one token more than the 32 of a sequence: the labels are the tokens after
    x = s[:, np.arange(33) % period]
    y = x[:, 1:].copy()
    y[:, :period - 1] = -1
    return x[:, :-1], y


def gen_mode(rng, n, symbols):
    """48 symbols from frequencies each sequence draws (Dirichlet(1)). Labelled: the most frequent symbol so
    far, from the 8th token (t = 7) on, where it is unique."""
    cdf = rng.dirichlet(np.ones(symbols), n).cumsum(1)                           # (n, A)
    # (n, T) by the inverse CDF
    x = np.minimum((rng.random((n, 48, 1)) > cdf[:, None]).sum(-1), symbols - 1)
    counts = np.cumsum(np.eye(symbols, dtype=np.int64)[x], 1)                    # (n, T, A) counts so far
    top2 = np.sort(counts, -1)[..., -2:]
    y = counts.argmax(-1)
    y[top2[..., 0] == top2[..., 1]] = -1                                         # a tie: no answer
    y[:, :7] = -1
    return x, y


# gen(rng, n, value) -> x, y; chance(value): the accuracy of a guess that misses what the task tests; full,
# quick: the knob values of the full run and of --quick; steps: training steps (full, quick)
Task = collections.namedtuple('Task', 'name knob gen vocab chance full quick steps')


def recall_chance(pairs):
    """A guess among the values not answered yet: query j (from 0) is right with probability 1 / (N - j)."""
    return float(np.mean([1 / (pairs - j) for j in range((pairs + 1) // 2)]))


def mode_chance(symbols):
    """The guess that sees no other token, the current one: drawn from the same frequencies, it is the mode
    far more often than 1/A. Measured on 4096 sequences of a fixed seed."""
    x, y = gen_mode(np.random.default_rng(0), 4096, symbols)
    return float((x == y)[y >= 0].mean())


# by name
TASKS = {t.name: t for t in [
    Task('recall', 'pairs', gen_recall, 64, recall_chance, (2, 4, 8), (2, 4), (3000, 1200)),
    Task('copy', 'length', gen_copy, 33, lambda v: 1 / 32, (8, 16, 32), (8, 32), (600, 200)),
    Task('periodic', 'period', gen_periodic, 32, lambda v: 1 / 32, (2, 3, 4), (2, 4), (600, 200)),
    Task('mode', 'symbols', gen_mode, 32, mode_chance, (4, 8, 16), (4, 16), (1000, 200)),
]}
TASK_MODELS = {
    'tssa': dict(attn='tssa'),
    'tssa+shift': dict(attn='tssa', token_shift=True),
    'softmax': dict(attn='softmax'),
    'softmax+shift': dict(attn='softmax', token_shift=True),
    # one softmax block of two, the first: over init seeds it learned 8-pair recall more often than the last
    'hybrid-first+shift': dict(attn='tssa', softmax_layers=(0,), token_shift=True),
}
# Shared by every model of every row. Layer-scale init 1.0: the GPT's default 1e-5 slows tiny models down.
TASK_MODEL = dict(n_layer=2, n_head=4, n_embd=64, layerscale_init=1.0)
TASK_OPT = dict(lr=1e-3, min_lr=1e-4, warmup=0.1, weight_decay=0.1, betas=(0.9, 0.98), clip=1.0,
                tokens=1280)   # tokens per step: batch = tokens // T, so a step costs about the same at any T
TASK_TEST = {'full': 1024, 'quick': 512, 'smoke': 8}   # held-out sequences per row
TASK_SEED = 1


def task_train_batches(task, value, batch, steps, test_x):
    """The training stream, the same for every model: `steps` batches (x, y) of fresh sequences, minus any
    equal to a test sequence (so train and test are disjoint)."""
    seen = {r.tobytes() for r in test_x}
    rng = np.random.default_rng([TASK_SEED, 1])
    for a in range(0, steps, 64):                      # 64 batches generated at a time
        need = min(64, steps - a) * batch
        parts = []
        while need > 0:
            x, y = task.gen(rng, need, value)
            keep = [r.tobytes() not in seen for r in x]
            parts.append((x[keep], y[keep]))
            need -= sum(keep)
        x, y = (torch.from_numpy(np.concatenate(part)) for part in zip(*parts))
        yield from zip(x.split(batch), y.split(batch))


def task_run(job):
    """One cell of the table: train a tiny GPT on a task at one knob value for `steps` steps; its accuracy on
    `tests` held-out sequences."""
    name, value, kind, steps, tests = job
    task = TASKS[name]
    o = TASK_OPT
    torch.set_num_threads(1)
    t0 = time.time()
    x_test, y_test = task.gen(np.random.default_rng([TASK_SEED, 0]), tests, value)   # held out
    seq_len = x_test.shape[1]
    # (the longest sequence, copy's 64 tokens, still makes a batch of 20)
    batch = o['tokens'] // seq_len
    torch.manual_seed(TASK_SEED)
    cfg = tost.GPTConfig(block_size=seq_len, vocab_size=task.vocab, **TASK_MODEL, **TASK_MODELS[kind])
    model = tost.GPT(cfg)
    opt = tost.make_optimizer(model, o['weight_decay'], o['lr'], o['betas'], 'cpu')
    # the trainers' step (float32: the scaler does nothing)
    scaler = torch.amp.GradScaler('cpu', enabled=False)
    for it, (x, y) in enumerate(task_train_batches(task, value, batch, steps, x_test)):
        _, loss = model(x, y)
        loss.backward()
        lr = cosine_lr(it, o['lr'], o['min_lr'], o['warmup'] * steps, steps)
        optimizer_step(opt, scaler, lr, o['clip'])
    model.eval()
    y = torch.from_numpy(y_test)
    with torch.no_grad():                       # the top token at every position of the held-out sequences
        pred = torch.cat([model.logits(x).argmax(-1) for x in torch.from_numpy(x_test).split(256)])
    right = (pred == y)[y >= 0]                 # at the labelled positions
    return dict(task=name, knob=task.knob, value=value, model=kind,
                accuracy=right.sum().item() / right.numel(), chance=task.chance(value),
                train_loss=round(loss.item(), 4), steps=steps, batch=batch, seq_len=seq_len,
                seconds=round(time.time() - t0, 1))


def section_tasks(args, results):
    """Train a tiny GPT of each of TASK_MODELS on each task at each knob value, two at a time in worker
    processes (in this file: no script), and print the map of accuracies, a row per task and value."""
    mode = args.mode
    tests = TASK_TEST[mode]
    o = TASK_OPT
    m = TASK_MODEL
    # the training steps of each task: its full or quick count, or 2 for the smoke test
    steps = {t.name: dict(full=t.steps[0], quick=t.steps[1], smoke=2)[mode] for t in TASKS.values()}
    # every model at every knob value of every task; the smoke test takes each task's first quick value
    jobs = [(t.name, v, kind, steps[t.name], tests) for t in TASKS.values()
            for v in (t.quick[:1] if mode == 'smoke' else getattr(t, mode)) for kind in TASK_MODELS]
    budget = dict(model=m, optimizer=dict(o, name='AdamW', schedule='linear warmup, cosine to min_lr'),
                  steps=steps, test_sequences=tests, seed=TASK_SEED)
    console.print(f"tasks: {len(jobs)} tiny GPTs, trained two at a time (two processes of one thread each)")
    # A process per core: a tiny model's step is too small to split over two threads (the second mostly
    # waits). spawn, not fork: a forked child of a process that already ran torch's thread pool can hang.
    # Ctrl-C is the parent's to act on: the workers are born ignoring it (an ignored signal stays so through
    # exec, and Python leaves it so), even while they import torch; one it reached would print its traceback.
    # (A mask would not do: multiprocessing's resource tracker unblocks SIGINT as it starts.)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        pool = multiprocessing.get_context('spawn').Pool(2)
    finally:
        signal.signal(signal.SIGINT, previous)
    rows = []
    # in the order of the jobs
    with pool:
        for r in pool.imap(task_run, jobs):
            rows.append(r)
            console.print(f"  {r['task']} {r['knob']} {r['value']}, {r['model']}: accuracy "
                          f"{r['accuracy']:.3f}, chance {r['chance']:.3f}, {r['seconds']:.0f} s", style="dim")
    results.update(tasks=rows, tasks_budget=budget)
    console.print(f"budget, the same for every model in a row: GPT {m['n_layer']} layers, width "
                  f"{m['n_embd']}, {m['n_head']} heads, layer-scale init {m['layerscale_init']}; AdamW lr "
                  f"{o['lr']:g} ({o['warmup']:.0%} linear warmup, cosine to {o['min_lr']:g}), weight decay "
                  f"{o['weight_decay']}, betas {o['betas']}, gradient clip {o['clip']}; {o['tokens']} tokens "
                  f"a step (batch = {o['tokens']} // sequence length), fresh sequences every step; steps: "
                  f"{', '.join(f'{k} {v}' for k, v in steps.items())}; {tests} held-out test "
                  f"sequences per row; seed {TASK_SEED}, one run per cell")
    k = len(TASK_MODELS)
    table(results, "What ToST can and cannot do: accuracy on held-out sequences, at the labelled positions",
          ['task', 'knob', 'length', 'chance', *TASK_MODELS],
          [(r['task'], f"{r['knob']} {r['value']}", r['seq_len'], f"{r['chance']:.2f}",
            *(f"{x['accuracy']:.2f}" for x in rows[i:i + k])) for i, r in enumerate(rows) if i % k == 0])


SECTIONS = {'language': section_language, 'vision': section_vision, 'tasks': section_tasks}


DEFAULTS = dict(
    sections='',              # comma-separated: language, vision, tasks (also the first bare word)
    quick=False,              # a smaller budget (see each section)
    smoke=False,              # a tiny budget: checks that a section runs
    json='',                  # also write the results to this .json file (and the figures beside it)
    out_dir='out-study',      # the runs of the language and vision sections go here
)
RANGES = dict(nonempty=('out_dir',))


def main(argv=None):
    cfg, _ = parse(argv, DEFAULTS, __doc__, __file__, positional='sections', ranges=RANGES)
    if cfg['quick'] and cfg['smoke']:
        raise UsageError("--quick and --smoke are two budgets: give one")
    # `kill`, as Ctrl-C: the run training under it, or the task workers, end with the study.
    options.stop_as_ctrl_c()
    args = SimpleNamespace(**cfg, mode='smoke' if cfg['smoke'] else 'quick' if cfg['quick'] else 'full')
    args.out_dir = os.path.abspath(args.out_dir)           # the runs start in other folders' processes too
    # A file where the runs go ends the study now, not some sections into it.
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        raise UsageError(f"--out_dir={cfg['out_dir']} is not a folder")
    results = dict(mode=args.mode, torch=torch.__version__, threads=torch.get_num_threads(), **machine())
    return run_sections(args, SECTIONS, results)


if __name__ == '__main__':
    main()
