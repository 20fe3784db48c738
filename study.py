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
import os
import shlex
import subprocess
import sys
import time

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

import tost

console = Console() if sys.stdout.isatty() else Console(width=130)   # no truncated columns in logs


HERE = os.path.dirname(os.path.abspath(__file__))


def run_script(args, what):
    """Run one of this repo's scripts (a list of arguments) in a subprocess; its output goes to a file."""
    out = subprocess.run([sys.executable, *args], cwd=HERE, capture_output=True, text=True)
    if out.returncode != 0:
        tail = '\n'.join((out.stderr or out.stdout).strip().splitlines()[-5:])
        sys.exit(f"error: {what} failed ({' '.join(args)}):\n{tail}")
    return out


def read_log(out_dir):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [json.loads(line) for line in f if line.strip()]


# -----------------------------------------------------------------------------
# language: the demo budget, ToST against softmax, with and without the token shift

LANGUAGE = [   # (run name, label, train_gpt.py overrides); the first is the paper's model, the demo's default
    ('tost', 'ToST (paper)', {}),
    ('tost-shift', 'ToST + token shift', {'token_shift': True}),
    ('softmax', 'softmax', {'attn': 'softmax'}),
    ('softmax-shift', 'softmax + token shift', {'attn': 'softmax', 'token_shift': True}),
    ('tost-8-heads', 'ToST, 8 heads', {'n_head': 8}),
    ('tost-16-heads', 'ToST, 16 heads', {'n_head': 16}),
]
LANGUAGE_BUDGET = {   # overrides of train_gpt.py's defaults (the demo: 1000 steps of 16 x 256 bytes)
    'full': {},
    'quick': {'max_iters': 200},
    'smoke': {'max_iters': 4, 'eval_iters': 1, 'eval_interval': 4, 'batch_size': 2, 'block_size': 32,
              'n_layer': 1},
}
SAMPLE = ['--start=def ', '--seed=1', '--temperature=0.8', '--max_new_tokens=160', '--num_samples=1']


def section_language(args, results):
    budget = LANGUAGE_BUDGET[args.mode]
    variants = LANGUAGE[:2] if args.mode == 'smoke' else LANGUAGE
    rows = []
    for run, name, extra in variants:
        out_dir = os.path.join(args.out_dir, 'language-' + run)
        keys = {**budget, **extra, 'out_dir': out_dir, 'overwrite': True}
        run_script(['train_gpt.py', *(f'--{k}={v}' for k, v in keys.items())], f'training {name}')
        log = read_log(out_dir)
        val = [r['val_loss'] for r in log if r.get('kind') == 'eval'][-1]
        speeds = [r['tokens_per_sec'] for r in log if r.get('kind') == 'train' and r.get('tokens_per_sec')]
        sample = run_script(['sample.py', f'--out_dir={out_dir}', *SAMPLE], f'sampling {name}').stdout
        rows.append(dict(variant=name, **{k: extra.get(k) for k in ('attn', 'token_shift', 'n_head')},
                         val_loss=val, tokens_per_sec=sum(speeds[1:] or speeds) / max(1, len(speeds[1:] or speeds)),
                         sample=sample.strip(), out_dir=out_dir))
        console.print(f"  {name}: val loss {val:.3f}", style="dim")
    results['language'] = dict(budget=dict(budget, note='train_gpt.py defaults (the demo) with these overrides, '
                                                         'seed 1337, one run each'), rows=rows)
    t = Table(title=f"Language, the demo budget{'' if not budget else ' with ' + str(budget)}: "
                    "python_stdlib bytes, val loss in nats per byte (one seed)")
    for c in ['model', 'val loss', 'vs ToST (paper)', 'train tokens/s']:
        t.add_column(c, justify='right')
    for r in rows:
        t.add_row(r['variant'], f"{r['val_loss']:.3f}", f"{r['val_loss'] - rows[0]['val_loss']:+.3f}",
                  f"{r['tokens_per_sec']:,.0f}")
    console.print(t)
    for r in rows:
        console.print(f"{r['variant']}: {shlex.join(['python', 'sample.py', '--out_dir=' + r['out_dir'], *SAMPLE])}",
                      style="bold", markup=False, highlight=False)
        console.print(r['sample'].split('\n---------------')[0], markup=False, highlight=False)


# -----------------------------------------------------------------------------
# vision: local patch interaction, on synthetic images where local structure decides the class

def make_glyph_images(folder, n_train, n_test, classes=10, size=32, seed=0):
    """A CIFAR-format dataset (as prepare_data.py writes it) where only local structure tells the classes
    apart: each image is noise with one 5x5 glyph (one of `classes` fixed random patterns) at a random place
    and brightness. A glyph straddles 4x4 patches, so a patch alone rarely shows it whole."""
    rng = np.random.default_rng(seed)
    glyphs = rng.random((classes, 5, 5)) < 0.5
    os.makedirs(folder, exist_ok=True)
    for split, n in (('train', n_train), ('test', n_test)):
        y = rng.integers(0, classes, n)
        x = rng.integers(0, 120, (n, 3, size, size))
        oy, ox = rng.integers(0, size - 5, (2, n))
        colour = rng.integers(150, 256, (n, 3))
        for i in range(n):
            patch = x[i, :, oy[i]:oy[i] + 5, ox[i]:ox[i] + 5]
            x[i, :, oy[i]:oy[i] + 5, ox[i]:ox[i] + 5] = np.where(glyphs[y[i]], colour[i][:, None, None], patch)
        np.save(os.path.join(folder, f'{split}_images.npy'), x.astype(np.uint8))
        np.save(os.path.join(folder, f'{split}_labels.npy'), y.astype(np.int64))
    meta = dict(name=os.path.basename(folder), kind='images', num_classes=classes,
                classes=[f'glyph{i}' for i in range(classes)], image_size=size, channels=3, mean=[0.3] * 3,
                std=[0.2] * 3, train_count=n_train, test_count=n_test, source='study.py: random glyphs on noise')
    with open(os.path.join(folder, 'meta.json'), 'w') as f:
        json.dump(meta, f)


VISION = [('tost', 'ToST (paper)', {}), ('tost-lpi', 'ToST + lpi', {'lpi': True}),
          ('softmax', 'softmax', {'attn': 'softmax'}), ('softmax-lpi', 'softmax + lpi', {'attn': 'softmax', 'lpi': True})]
VISION_BUDGET = {   # images, and train_vit.py overrides
    'full': dict(n_train=8192, n_test=2048, keys=dict(epochs=10)),
    'quick': dict(n_train=2048, n_test=1024, keys=dict(epochs=4)),
    'smoke': dict(n_train=64, n_test=32, keys=dict(epochs=1, batch_size=16)),
}


def section_vision(args, results):
    b = VISION_BUDGET[args.mode]
    data_dir = os.path.join(args.out_dir, 'data')
    make_glyph_images(os.path.join(data_dir, 'glyphs'), b['n_train'], b['n_test'])
    budget = dict(model='tost-cifar-tiny', warmup_epochs=1, **b['keys'])
    rows = []
    for run, name, extra in VISION[:2] if args.mode == 'smoke' else VISION:
        out_dir = os.path.join(args.out_dir, 'vision-' + run)
        keys = {**budget, **extra, 'dataset': 'glyphs', 'data_dir': data_dir, 'out_dir': out_dir,
                'overwrite': True, 'viz_images': 0, 'compression_images': 0}
        t0 = time.time()
        run_script(['train_vit.py', *(f'--{k}={v}' for k, v in keys.items())], f'training {name}')
        evals = [r for r in read_log(out_dir) if r.get('test_acc') is not None]
        rows.append(dict(variant=name, **{k: extra.get(k) for k in ('attn', 'lpi')}, test_acc=evals[-1]['test_acc'],
                         best_acc=max(r['test_acc'] for r in evals), seconds=round(time.time() - t0, 1)))
        console.print(f"  {name}: test accuracy {rows[-1]['test_acc']:.3f}", style="dim")
    results['vision'] = dict(budget=dict(budget, train_images=b['n_train'], test_images=b['n_test'],
                                         note='train_vit.py defaults with these overrides, seed 1337, one run each'),
                             rows=rows)
    t = Table(title=f"Vision: {b['n_train']} synthetic 32px images (10 glyph classes on noise), tost-cifar-tiny, "
                    f"{budget['epochs']} epochs, one seed; chance 0.10")
    for c in ['model', 'test accuracy (last epoch)', 'best', 'seconds']:
        t.add_column(c, justify='right')
    for r in rows:
        t.add_row(r['variant'], f"{r['test_acc']:.3f}", f"{r['best_acc']:.3f}", f"{r['seconds']:.0f}")
    console.print(t)


# -----------------------------------------------------------------------------
# sections


SECTIONS = {'language': section_language, 'vision': section_vision}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0].strip(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('sections', help='comma-separated: ' + ', '.join(SECTIONS))
    ap.add_argument('--quick', action='store_true', help='a smaller budget (see each section)')
    ap.add_argument('--smoke', action='store_true', help='tiny budget, seconds; checks that a section runs')
    ap.add_argument('--json', default=None, help='also write the results here')
    ap.add_argument('--out_dir', default='out-study', help='the runs of the language and vision sections go here')
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
