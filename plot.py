"""
Figures, drawn with matplotlib into files (never a window, so also over ssh and in CI).

    python plot.py out out-shift out-softmax              # several runs' loss curves on one figure: runs.png
    python plot.py out docs/demo-log.jsonl --x=seconds    # your demo beside the reference run, in seconds
    python plot.py out-study/study.json                   # the figures of a bench or study --json, again

A run is a folder train_gpt.py or train_vit.py wrote, or its log.jsonl: language runs are drawn as train and
val loss against tokens seen (or seconds), vision runs as test accuracy against epochs, each labelled with its
folder and its model. Their figure goes to --out: runs.png in the current folder unless told (its suffix picks
the format: .png, .pdf, .svg). A .json is the results of tools.bench or tools.study, which draw its figures
beside it: here they (speed.png, generation.png, language.png, vision.png, tasks.png) go to --out_dir, the
current folder unless told; language.png and vision.png are drawn from the run folders the .json names.
An option for a figure that is not drawn (--out with only a .json, --x for vision runs) is refused.
The same model has the same colour and line style in every figure (the styles survive a grey-scale print).
"""
import options  # first: its handler ends a Ctrl-C while torch imports (exit 130, no traceback)
import json
import os
import sys

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from options import UsageError, parse

# model -> (colour, line style, marker); colours from the colour-blind-safe tab10, styles for grey-scale
STYLES = {
    'ToST': ('#1f77b4', '-', 'o'),
    'ToST + shift': ('#2ca02c', '--', 's'),
    'softmax': ('#d62728', ':', '^'),
    'softmax + shift': ('#ff7f0e', '-.', 'v'),
    'hybrid': ('#9467bd', (0, (5, 1, 1, 1)), 'D'),
    'hybrid + shift': ('#8c564b', (0, (3, 1, 1, 1, 1, 1)), 'P'),
}
OTHER = [('#7f7f7f', '-', 'x'), ('#e377c2', '--', '*'), ('#17becf', ':', 'h'), ('#bcbd22', '-.', '+')]


def model_name(cfg):
    """'ToST', 'ToST + shift', 'softmax', 'hybrid + shift', ... from a run's config (or a study row)."""
    attn = cfg.get('attn') or 'tssa'                # a study row holds None where the key is the default
    name = 'hybrid' if cfg.get('softmax_layers') else 'ToST' if attn == 'tssa' else attn
    return name + ' + shift' * bool(cfg.get('token_shift')) + ' + lpi' * bool(cfg.get('lpi'))


def check_suffix(key, path, suffixes):
    """A UsageError naming --key=path unless path's suffix, in any case, is one of `suffixes`."""
    if os.path.splitext(path)[1].lower() not in suffixes:
        raise UsageError(f"--{key}={path} needs a file name ending in one of {', '.join(suffixes)}")


def save(fig, path):
    """fig, laid out, as a file (its folder made if need be); its suffix picks the format (main checks
    --out's)."""
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    # (a figure with colour bars lays itself out: constrained)
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    fmt = os.path.splitext(path)[1][1:].lower()
    options.write_whole(path, lambda f: fig.savefig(f, dpi=100, format=fmt), 'wb')


def finish(ax, x, y, title, xticks=()):
    """Axis labels, title, grid and legend. Given xticks (the measured sizes), the axes are log-log with x
    ticks at those sizes, written as 256, 1.5k, 64k."""
    if xticks:
        ax.set(xscale='log', yscale='log')
        xticks = sorted(set(xticks))
        ax.set_xticks(xticks, [f"{v / 1024:g}k" if v >= 1024 else str(v) for v in xticks])
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set(xlabel=x, ylabel=y)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which='both')
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)

# -----------------------------------------------------------------------------
# learning curves


def read_run(path):
    """A run's log: (label, config, rows). path is a run folder or a .jsonl log; where neither, opening it
    raises the OSError options.py's handler names the path with; a log without a row, a UsageError."""
    log = path if path.endswith('.jsonl') else os.path.join(path, 'log.jsonl')
    rows = []
    damaged = []
    # Bytes that are not UTF-8 (a damaged file) spoil their line only; an editor's byte-order mark, none.
    with open(log, encoding='utf-8-sig', errors='replace') as f:
        for number, line in enumerate(f, 1):
            # A line cut short (being written, or by a crash), one that is not a row, or one nested deeper
            # than Python recurses, is left out.
            try:
                rows.append(dict(json.loads(line)))
            except (ValueError, TypeError, RecursionError):
                damaged.append(number)
    # Nothing to draw is a mistake, not an empty figure.
    if not rows:
        where = f" (line {damaged[0]} is damaged)" if damaged else ""
        raise UsageError(f"{log} holds no rows{where}")
    cfg = next((r for r in reversed(rows) if r.get('kind') == 'config'), {})
    # 'out' for out/log.jsonl, 'demo-log' for docs/demo-log.jsonl
    name = os.path.basename(os.path.abspath(log).removesuffix(os.sep + 'log.jsonl')).removesuffix('.jsonl')
    return f"{name}: {model_name(cfg)}" if cfg else name, cfg, [r for r in rows if r.get('kind') != 'config']


def points(rows, kind, x, y):
    """(xs, ys) of the rows of `kind` whose x and y are finite numbers (y None: none): no axis holds a NaN
    loss, nor a "4.8" typed into a log; the row's other values are drawn."""
    xy = [(r.get(x), r.get(y)) for r in rows if r.get('kind') == kind]
    return np.reshape([(a, b) for a, b in xy if number(a) and number(b)], (-1, 2)).T


def number(value):
    # A whole number past a float's range (1 and 400 zeros, in a damaged log) is no point either.
    return type(value) in (int, float) and abs(value) <= sys.float_info.max


# what --x (or a vision run's 'epoch') draws: (the key of a row, the axis label)
X_AXES = {'tokens': ('tokens', 'tokens seen'), 'seconds': ('elapsed_s', 'seconds of training'),
          'epoch': ('epoch', 'epoch')}


def learning_curves(runs, path, x='tokens', title=None):
    """Language runs: train loss (thin) and val loss (points) against tokens seen or seconds, the y axis on
    the val losses after the first evaluation and the train losses of the later half of each run that has
    them; vision runs: test accuracy against epochs. runs: [(label, cfg, rows)], as read_run gives them.
    Language and vision runs in one call: a UsageError."""
    vision = {any('epoch' in r for r in rows) for _, _, rows in runs}
    if len(vision) > 1:
        labels = ', '.join(label for label, _, _ in runs)
        raise UsageError(f"{labels}: language and vision runs together; draw them in separate calls")
    vision = vision.pop()
    key, xlabel = X_AXES['epoch' if vision else x]
    ax = Figure(figsize=(7, 4.2)).subplots()
    # each model's style once: a second run of it takes another
    styles = dict(STYLES)
    later = []
    for i, (label, cfg, rows) in enumerate(runs):
        color, line, marker = styles.pop(model_name(cfg), None) or OTHER[i % len(OTHER)]
        # a vision run has no train line; its points are its test accuracy
        train = points(rows, 'train', key, None if vision else 'train_loss')
        val = points(rows, 'eval', key, 'test_acc' if vision else 'val_loss')
        later.extend(val[1][1:])
        # and, once the run has evaluated after its first, the train losses of its later half: one evaluation
        # after the first is no range (with the first alone, nothing: the axis holds it and the whole curve)
        if val.shape[1] > 1:
            later.extend(train[1][train[0] >= train[0].max(initial=0) / 2])
        if not val.size:
            label += ' (no eval yet)'
        elif not vision:
            label += ', val'
        ax.plot(*train, color=color, linestyle=line, linewidth=0.8, alpha=0.45)
        # A $ in a folder's name (or in a title) is shown as typed, not read as the start of a formula.
        label = label.replace('$', r'\$')
        ax.plot(*val, color=color, linestyle=line, marker=marker, markersize=4, label=label)
    if later and not vision:
        # the part after the first drop, with a margin
        lo = ax.dataLim.y0
        hi = max(later)
        ax.set_ylim(lo - 0.1 * (hi - lo) - 0.01, hi + 0.15 * (hi - lo) + 0.01)
    unit = 'byte' if all(cfg.get('vocab_size') == 256 for _, cfg, _ in runs) else 'token'
    finish(ax, xlabel, 'test accuracy' if vision else f'loss (nats per {unit}); thin: train',
           (title or ('test accuracy' if vision else 'learning curves')).replace('$', r'\$'))
    save(ax.figure, path)

# -----------------------------------------------------------------------------
# speed: tools.bench's measurements

OPS = {'causal_tssa': ('CausalTSSA', 'ToST', '-'), 'tssa': ('TSSA', 'ToST', '--'),
       'sdpa_causal': ('causal SDPA', 'softmax', '-'), 'sdpa': ('SDPA', 'softmax', '--')}


def speed(results, path):
    """The operator section: forward+backward time and peak memory against tokens, log-log, each operator's
    fitted exponent (time ~ n^k) in the legend. Linear is a slope of 1, quadratic of 2."""
    rows = results['operator']
    fits = results.get('operator_exponent', {})
    left, right = Figure(figsize=(10, 4)).subplots(1, 2)
    for op, (label, model, line) in OPS.items():
        pts = sorted((r['n'], r['fwdbwd_s'], r['fwdbwd_peak_mb']) for r in rows if r['op'] == op)
        if not pts:
            continue
        n, t, mb = np.array(pts, dtype=float).T
        color, _, marker = STYLES[model]
        style = dict(color=color, linestyle=line, marker=marker)
        k = f", k = {fits[op]:.2f}" if op in fits else ""
        left.plot(n, 1e3 * t, **style, label=f"{label}{k}")
        if np.isfinite(mb).any():
            right.plot(n, mb, **style, label=label)
    sizes = [r['n'] for r in rows]
    finish(left, 'tokens', 'forward + backward (ms)', 'time ~ n^k', sizes)
    finish(right, 'tokens', 'peak memory (MB)', 'memory, forward + backward', sizes)
    left.figure.suptitle(f"one attention layer, width {results.get('width', 768)}: {describe(results)}",
                         fontsize=9)
    save(left.figure, path)


GENERATION = {
    'recurrent': ('ToST, recurrent state', 'ToST'),
    'shift_recurrent': ('ToST + shift', 'ToST + shift'),
    'hybrid': ('hybrid + shift: last block softmax', 'hybrid + shift'),
    'softmax_kv': ('softmax, KV cache', 'softmax'),
    'rerun': ('ToST, re-run the prefix', None),
}


def generation(results, path):
    """The generation section: tokens/s of decoding against the context length."""
    rows = results['generation']
    ctx = [r['ctx'] for r in rows]
    ax = Figure(figsize=(6.5, 4)).subplots()
    for i, key in enumerate(k for k in GENERATION if k in rows[0]):
        label, model = GENERATION[key]
        color, line, marker = STYLES[model] if model else OTHER[i % len(OTHER)]
        ax.plot(ctx, [r[key] for r in rows], color=color, linestyle=line, marker=marker, label=label)
    title = f"generation, batch 1: {describe(results)}"
    finish(ax, 'context (tokens before the new one)', 'tokens / s', title, ctx)
    save(ax.figure, path)


def describe(results):
    """'cpu, float32, torch 2.13' from a bench or study result."""
    return ', '.join([str(results[k]) for k in ('gpu', 'device', 'dtype') if results.get(k)]
                     + [f"torch {results.get('torch', '?')}"])

# -----------------------------------------------------------------------------
# capability map: tools.study's tasks


def budget(results):
    """What a study's figure adds to its title: a smoke or quick study's budget is not the full one."""
    mode = results.get('mode', 'full')
    return '' if mode == 'full' else f" ({mode} budget)"


def capability_grid(results, path):
    """tools.study's tasks: a row per task and knob value, a column per model, as the study writes them (every
    model at every value, in order). The number is the accuracy; the colour is how far above chance it is (0
    at chance, 1 perfect): every row's chance reads the same."""
    rows = results['tasks']
    models = list(dict.fromkeys(r['model'] for r in rows))
    # the first model's cell of each row
    first = rows[::len(models)]
    acc = np.reshape([r['accuracy'] for r in rows], (len(first), len(models)))
    chance = np.array([[r['chance']] for r in first])
    above = np.clip((acc - chance) / (1 - chance), 0, 1)
    ax = Figure(figsize=(1.3 * len(models) + 3.2, 0.42 * len(first) + 1.6)).subplots()
    for (i, j), a in np.ndenumerate(acc):
        ax.text(j, i, f"{a:.2f}" + ("" if a > chance[i, 0] + 0.02 else " ~"), ha='center', va='center',
                fontsize=9, color='black' if above[i, j] > 0.5 else 'white')
    im = ax.imshow(above, cmap='viridis', vmin=0, vmax=1, aspect='auto')
    ax.set_xticks(range(len(models)), [m.replace('tssa', 'ToST').replace('+', ' + ') for m in models],
                  fontsize=9)
    labels = [f"{r['task']}, {r['knob']} {r['value']} (chance {r['chance']:.2f})" for r in first]
    ax.set_yticks(range(len(first)), labels, fontsize=8)
    ax.xaxis.tick_top()
    ax.figure.colorbar(im, ax=ax, fraction=0.04, pad=0.02).set_label('above chance', fontsize=8)
    ax.set_title(f"What each model learns: accuracy on held-out sequences{budget(results)}\n"
                 "colour: 0 at chance, 1 perfect; ~: at chance or below", fontsize=9)
    save(ax.figure, path)

# -----------------------------------------------------------------------------
# vision: what the model looks at


def vision_maps(path, image, cls_attn, pi, title):
    """One test image: top row the image and the CLS token's class attention per head; bottom row (TSSA
    models) the head with the largest membership at each patch, then the memberships Pi per head. One
    colour scale per row (viridis: dark low, yellow high), shown by its bar, so heads can be compared.
    image (C, H, W) uint8, drawn in colour if C is 3, else its first channel in grey; cls_attn, pi (heads, Hp,
    Wp) floats, pi may be None."""
    rows = [cls_attn] if pi is None else [cls_attn, pi]
    heads = len(cls_attn)
    axes = Figure(figsize=(1.5 * (1 + heads) + 0.6, 1.6 * len(rows) + 0.3), layout='constrained').subplots(
        len(rows), 1 + heads, squeeze=False, subplot_kw=dict(xticks=[], yticks=[]))
    # (H, W, 3) in colour, else (H, W) in grey (matplotlib would take 4 channels for RGBA, and refuses 2); the
    # colour map applies only to a grey one
    image = np.asarray(image)
    axes[0, 0].imshow(image.transpose(1, 2, 0) if len(image) == 3 else image[0], cmap='gray')
    # (a class name read from a dataset's meta.json: a $ in it is shown, not read as a formula)
    axes[0, 0].set_title(title.replace('$', r'\$'), fontsize=8)
    for r, maps in enumerate(rows):
        maps = np.asarray(maps, dtype=np.float64)
        for k in range(heads):
            shown = axes[r, 1 + k].imshow(maps[k], cmap='viridis', vmin=maps.min(), vmax=maps.max())
            # Pi's heads in the colours of the map at the left
            axes[r, 1 + k].set_title(f"{['CLS attention', 'Pi'][r]}, head {k}", fontsize=7,
                                     color=colormaps['tab10'](k % 10) if r else 'black')
        axes[0, 0].figure.colorbar(shown, ax=axes[r, 1:], fraction=0.05, pad=0.02)
    if pi is not None:
        axes[1, 0].imshow(np.asarray(pi).argmax(0), cmap='tab10', vmin=0, vmax=9)
        axes[1, 0].set_title('head with the\nlargest Pi', fontsize=7)
    save(axes[0, 0].figure, path)

# -----------------------------------------------------------------------------


def study_curves(section, metric, title):
    """A study section's runs on one figure, each labelled with its row of the table, from the run folders the
    study trained (they are not committed beside docs/*.json: the study makes them). Where one is not here,
    or holds another run than its row measured (its last `metric` differs: a study run since), one line
    names it and the command that makes it."""
    def draw(results, path):
        runs = []
        for r in results[section]['rows']:
            _, cfg, log = read_run(r['out_dir']) if os.path.exists(r['out_dir']) else (None, None, [])
            if [x[metric] for x in log if metric in x][-1:] != [r[metric]]:
                raise UsageError(f"{r['out_dir']} is not here, or not the run its row measured: this figure "
                                 f"is drawn from the run folders the study trains; run python -m tools.study "
                                 f"{section}")
            runs.append((r['variant'], cfg, log))
        learning_curves(runs, path, title=title + budget(results))
    return draw


# the figure of each section of tools.bench and tools.study, drawn from their results (a .json)
FIGURES = {
    'operator': ('speed.png', speed),
    'generation': ('generation.png', generation),
    'language': ('language.png',
                 study_curves('language', 'val_loss', 'the demo budget: python_stdlib bytes, one seed')),
    'vision': ('vision.png',
               study_curves('vision', 'test_acc', 'synthetic glyph images, tost-cifar-tiny, one seed')),
    'tasks': ('tasks.png', capability_grid),
}


def draw_results(path, folder, taken=()):
    """The figures of a bench or study results file, drawn into `folder`, none over a path in `taken` (the
    absolute paths of another file's figures, drawn by the same command). Returns their paths."""
    try:
        with open(path, encoding='utf-8-sig') as f:
            results = json.load(f)
        out = []
        for section, (name, draw) in FIGURES.items():
            if section in results:
                out.append(os.path.join(folder, name))
                if os.path.abspath(out[-1]) in taken:
                    raise UsageError(f"{out[-1]} is drawn already, from another results file: draw {path} "
                                     f"with another --out_dir")
                draw(results, out[-1])
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as e:
        raise UsageError(f"cannot draw the figures of {path} ({type(e).__name__}: {e})") from None
    if not out:
        raise UsageError(f"{path} holds no results of tools.bench or tools.study (none of the sections "
                         f"{', '.join(FIGURES)}); a run is a folder or its log.jsonl")
    return out


DEFAULTS = dict(
    runs=[],                     # bare words: run folders or log.jsonl files, or bench/study results (.json)
    x='tokens',                  # the x axis of language runs: tokens (seen) or seconds (of training)
    out='runs.png',              # where the runs' figure goes (.png, .pdf, .svg): ./runs.png unless told
    out_dir='.',                 # where a .json's figures go (speed.png, ...): the current folder unless told
    title='',                    # the figure's title; default: learning curves
)


def main(argv=None):
    cfg, set_keys = parse(argv, DEFAULTS, __doc__, __file__, positional='runs',
                          choices=dict(x=('tokens', 'seconds')), text=('title',))
    if not cfg['runs']:
        raise UsageError("give one or more run folders (or log.jsonl files): python plot.py out out-softmax")
    # Checked before any drawing: matplotlib refuses a suffix only when it saves, and some of those it knows
    # (.pgf, .ps) need programs that may not be here.
    check_suffix('out', cfg['out'], ('.png', '.pdf', '.svg'))
    jsons = [f for f in cfg['runs'] if f.endswith('.json')]
    runs = [read_run(f) for f in cfg['runs'] if f not in jsons]
    vision = any('epoch' in r for _, _, rows in runs for r in rows)
    # An option given for a figure that is not drawn is refused, not ignored.
    drawn = {'out': runs, 'title': runs, 'x': runs and not vision, 'out_dir': jsons}
    for key in sorted(set_keys):
        if not drawn.get(key, True):
            raise UsageError(f"--{key} does not apply to {' '.join(cfg['runs'])}: --out, --title and --x are "
                             f"for runs (--x for language runs; vision runs are drawn against epochs), "
                             f"--out_dir for the figures of a .json")
    written = []
    for f in jsons:
        for figure in draw_results(f, cfg['out_dir'], written):
            print(f"wrote {figure}")
            written.append(os.path.abspath(figure))
    if runs:
        if os.path.abspath(cfg['out']) in written:
            raise UsageError(f"--out={cfg['out']} is drawn already, from a results file: choose another "
                             f"--out")
        learning_curves(runs, cfg['out'], cfg['x'], cfg['title'])
        print(f"wrote {cfg['out']}")


if __name__ == '__main__':
    main()
