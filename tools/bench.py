"""
ToST against softmax attention, side by side, on this machine (docs/speed.md says what each section measures,
and how). From the repo root:

    python -m tools.bench                  # every section: operator, limit, model, generation, training
    python -m tools.bench --quick          # small sizes
    python -m tools.bench --device=cuda --dtype=bfloat16 --json=bench.json    # on a GPU: 1k to 64k tokens
    python -m tools.bench --device=cuda --dtype=bfloat16 --compile --sections=operator,model
    python -m tools.bench --sections=operator,limit

--json=PATH writes the numbers, and beside them speed.png and generation.png (the file is written whole: one
that holds results of sections this run does not measure is refused). On a GPU causal TSSA runs on the
Triton core, as it does in training (TOST_TRITON=0: on its readable lines, as docs/speed.md's H200 tables).
"""
import os
import sys

# Also run by its path (python tools/bench.py): the repository's modules come from its root.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import options  # first: its handler ends a Ctrl-C while torch imports (exit 130, no traceback)
import contextlib
import functools
import json
import platform
import statistics
import subprocess
import time
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import torch
from rich.console import Console
from rich.table import Column, Table

import plot
import tost
import tost_fast
from options import UsageError, near, parse
from tost import GPT, GPTConfig, TSSA, CausalTSSA, SoftmaxAttention
from train_common import autocast, check_compile, compiles_causal, pick_device, setup_cuda

# A log gets the full width of every table: no truncated columns.
console = Console() if sys.stdout.isatty() else Console(width=130)


def closed_pipe():
    """A reader that left (`| head`) ends the script as options.py ends every other: quietly, exit 141 (rich's
    own exit code is 1)."""
    options.quiet_stdout()
    raise SystemExit(141)


console.on_broken_pipe = closed_pipe
# The repo root, where tools/ is.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The paper's ToST-Base / GPT2-Base ratios at these numbers of tokens: time, memory.
PAPER = {4096: (0.60, 0.41), 8192: (0.46, 0.24)}
# Repeated timings of one case further apart than this (max/min - 1) say the machine is busy. Such cases are
# kept in NOISY and reported under the table they belong to.
NOISE = 0.2
NOISY = []
# Sizes per mode: full, quick (small), smoke (tiny: checks that every section runs).
SIZES = {
    'full':  dict(width=768, heads=12, op_n=[256, 1024, 4096, 8192, 16384], op_tssa_only=[65536],
                  limit_n=[256, 1024, 4096, 16384], model_n=[4096, 8192], gen_ctx=[16, 1024, 4096],
                  gen_new=32, train_n=[1024, 4096]),
    'quick': dict(width=768, heads=12, op_n=[256, 1024, 4096], op_tssa_only=[], limit_n=[1024, 4096],
                  model_n=[1024, 2048], gen_ctx=[16, 1024], gen_new=16, train_n=[256, 1024]),
    'smoke': dict(width=64, heads=4, op_n=[64, 128], op_tssa_only=[256], limit_n=[128],
                  model_n=[64, 128], gen_ctx=[8, 64], gen_new=4, train_n=[64]),
}
# The operator's width and heads, set from SIZES in main().
WIDTH = 768
HEADS = 12
# --compile: torch.compile the layers and models measured (see compiled()).
COMPILE = False


def ms(seconds):
    """Milliseconds, or '-' for a case not measured (NaN, the one number not equal to itself)."""
    return f"{seconds * 1e3:,.1f}" if seconds == seconds else "-"


def mb(megabytes):
    return f"{megabytes:,.0f}" if megabytes == megabytes else "-"


def ratio(a, b, digits=2):
    """a / b, or '-' where either was not measured (NaN)."""
    return f"{a / b:.{digits}f}x" if b > 0 and a == a else "-"


def sync(device):
    """Wait for the GPU (on CUDA the one main() made current) to finish what it was given, so a timer sees it
    all."""
    if device.startswith('cuda'):
        torch.cuda.synchronize()
    elif device == 'mps':
        torch.mps.synchronize()


def interleaved(cases, reps, device, warmup=1, label=''):
    """Median seconds of each callable in `cases` (a dict), run in interleaved rounds (of two, the slower)."""
    for f in list(cases.values()) * warmup:
        f()
    times = {k: [] for k in cases}
    for _ in range(reps):
        for k, f in cases.items():
            sync(device)
            t0 = time.perf_counter()
            f()
            sync(device)
            times[k].append(time.perf_counter() - t0)
    for k, v in times.items():
        if max(v) / min(v) - 1 > NOISE:
            NOISY.append(f"{label}{k} {ms(min(v))}..{ms(max(v))} ms")
    return {k: statistics.median_high(v) for k, v in times.items()}


def table(results, title, columns, rows):
    """Print a section's table, then whether its repeated timings disagreed (its ratios are rough then)."""
    t = Table(*(Column(c, justify='right') for c in columns), title=title)
    for r in rows:
        t.add_row(*map(str, r))
    console.print(t)
    if NOISY:
        results.setdefault('noisy', []).extend(NOISY)
        console.print(f"warning: repeated timings differed by more than {NOISE:.0%} in {len(NOISY)} case(s) "
                      f"({'; '.join(NOISY[:3])}{'; ...' if len(NOISY) > 3 else ''}): the machine is busy, so "
                      "these numbers are rough; rerun on an idle machine", style="yellow")
        NOISY.clear()

# -----------------------------------------------------------------------------
# the cases: each builds its inputs once and returns a callable


def compiled(module):
    """torch.compile from a clean slate: otherwise every size of a layer counts against one recompile
    limit, past which dynamo runs it eagerly while the row says compiled. The warm-up run compiles, so
    timings do not."""
    torch._dynamo.reset()
    # fullgraph: a graph break is an error.
    return torch.compile(module, fullgraph=True)


@contextlib.contextmanager
def causal_path(device, readable=False, fused=False, triton=False):
    """While a case runs, CausalTSSA takes the path it names: readable, its readable lines (CausalTSSA.fast
    off); fused, the CPU core at any size (tost_fast.MIN_ELEMENTS 0); triton, the Triton core on this device
    (as on CUDA by default). Each setting is put back after, also when the case fails."""
    fast = CausalTSSA.fast
    min_elements = tost_fast.MIN_ELEMENTS
    triton_devices = tost_fast.TRITON
    CausalTSSA.fast = fast and not readable
    if fused:
        tost_fast.MIN_ELEMENTS = 0
    if triton:
        tost_fast.TRITON = (torch.device(device).type,)
    try:
        yield
    finally:
        CausalTSSA.fast = fast
        tost_fast.MIN_ELEMENTS = min_elements
        tost_fast.TRITON = triton_devices


def make_op(kind, n, device, dtype, backward, batch=1, width=None, heads=None, compile=None, readable=False,
            fused=False, triton=False):
    """One layer's forward (and backward) on random tokens. compile: None follows --compile; readable, fused
    and triton: the causal layer's path (causal_path)."""
    torch.manual_seed(0)
    d = width or WIDTH
    h = heads or HEADS
    if kind == 'causal_tssa':
        layer = CausalTSSA(d, h, block_size=n)
    elif kind == 'tssa':
        layer = TSSA(d, h)
    elif kind == 'proj':
        # A TSSA layer's two d x d matmuls alone.
        layer = torch.nn.Sequential(torch.nn.Linear(d, d, bias=False), torch.nn.Linear(d, d, bias=False))
    else:
        layer = SoftmaxAttention(d, h, causal=kind == 'sdpa_causal')
    layer = layer.to(device)
    if compile is None:
        compile = COMPILE
    if compile:
        layer = compiled(layer)
    x = torch.randn(batch, n, d, device=device, requires_grad=backward)

    def run():
        with causal_path(device, readable, fused, triton), autocast(device, dtype):
            y = layer(x)
        if backward:
            with causal_path(device, readable, fused, triton):
                y.float().sum().backward()
    return run if backward else torch.no_grad()(run)


def model_config(device, block_size, attn, mode):
    """ToST-Base on a GPU; on a CPU fewer layers (and in quick/smoke modes a narrower model)."""
    if device.startswith('cuda') and mode == 'full':
        return tost.preset('tost-base', block_size=block_size, attn=attn)
    layers, heads, width = {'full': (4, 12, 768), 'quick': (2, 4, 256), 'smoke': (1, 2, 32)}[mode]
    return GPTConfig(n_layer=layers, n_head=heads, n_embd=width, block_size=block_size,
                     vocab_size=512 if mode == 'smoke' else 50304, attn=attn)


def make_model(attn, n, device, dtype, mode, train=False, batch=1, triton=False):
    """A GPT's forward on `batch` sequences of n random tokens, or (train) a training step: forward, backward,
    AdamW. triton: causal TSSA on the Triton core (causal_path)."""
    torch.manual_seed(0)
    model = GPT(model_config(device, n, attn, mode)).to(device).train(train)
    opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device.split(':')[0]) if train else None
    idx = torch.randint(0, model.config.vocab_size, (batch, n + train), device=device)
    forward = compiled(model) if COMPILE else model

    def run():
        with causal_path(device, triton=triton), torch.set_grad_enabled(train), autocast(device, dtype):
            loss = forward(idx[:, :-1], idx[:, 1:])[1] if train else forward(idx)
        if train:
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return run


# A CPU's memory is read from Linux's files of this process.
PROC = '/proc/self'


def kilobytes(field):
    """A field of /proc/self/status, in kB: VmRSS (resident now) or VmHWM (its high-water mark)."""
    with open(f'{PROC}/status', encoding='utf-8') as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def measure_memory(spec, device, child=False):
    """Peak MB above what was held before, of one run of make_model(**spec) if spec has attn, else
    make_op(**spec) forward and backward: on CUDA the allocator's peak; on a CPU the peak RSS of a fresh
    process (child: this one)."""
    # On CUDA, main() made args.device the current GPU.
    cuda = device.startswith('cuda')
    if not cuda and not child:
        # The child measures what this process times: compiled under --compile.
        code = (f"from tools import bench; bench.COMPILE = {COMPILE}; "
                f"print(bench.measure_memory({spec!r}, {device!r}, child=True))")
        # glibc raises its mmap threshold as large blocks are freed, then keeps what the warm-up run freed
        # as heap: the measured run reuses part of it, unseen. A fixed threshold returns each block at once.
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_='131072')
        out = subprocess.run([sys.executable, '-c', code], capture_output=True, cwd=REPO, encoding='utf-8',
                             errors='replace', env=env)
        if out.returncode == 0:
            return float(out.stdout.split()[-1])
        # A case the child could not run (killed for memory, an error) is said, not shown as not measured.
        last = (out.stderr.strip().splitlines() or [f'exit {out.returncode}'])[-1]
        # markup=False: the child's last line is its own text (torch's "[enforce fail at ...]" is no style).
        console.print(f"warning: memory of {spec} not measured: {last}", style="yellow", soft_wrap=True,
                      markup=False)
        return float('nan')
    if 'attn' in spec:
        run = make_model(device=device, **spec)
    else:
        run = make_op(device=device, backward=True, **spec)
    # The first run allocates what every run needs (gradients, allocator caches); the second is measured.
    run()
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    base = kilobytes('VmRSS:')
    # Writing 5 resets the high-water mark to the current RSS.
    with open(f'{PROC}/clear_refs', 'w', encoding='utf-8') as f:
        f.write('5')
    run()
    return (kilobytes('VmHWM:') - base) / 1024


def peak_mb(args, **spec):
    """measure_memory(spec) in args.dtype on args.device, or NaN under --no_memory."""
    return float('nan') if args.no_memory else measure_memory(dict(dtype=args.dtype, **spec), args.device)

# -----------------------------------------------------------------------------
# sections: each adds its numbers to `results` and prints its table


# The limit section's columns: the layer each times, and how.
LIMIT = {
    'proj_s': ('proj', dict(compile=False)),
    'tssa_s': ('tssa', dict(compile=False)),
    'tssa_compiled_s': ('tssa', dict(compile=True)),
    'causal_fast_s': ('causal_tssa', dict(compile=False, fused=True)),
    'causal_readable_s': ('causal_tssa', dict(compile=False, readable=True)),
    'causal_compiled_s': ('causal_tssa', dict(compile=True, readable=True)),
    'causal_triton_s': ('causal_tssa', dict(compile=False, triton=True)),
}


def section_operator(args, results):
    ns = SIZES[args.mode]['op_n']
    extra = SIZES[args.mode]['op_tssa_only']
    rows = []
    for n in ns + extra:
        kinds = ['causal_tssa', 'tssa'] + ([] if n in extra else ['sdpa_causal', 'sdpa'])
        reps = 5 if n <= 1024 else (3 if n <= 4096 else 2)
        # Seconds by pass: forward (False), then forward and backward (True).
        seconds = {}
        for backward in (False, True):
            cases = {k: make_op(k, n, args.device, args.dtype, backward) for k in kinds}
            label = f"n={n} {'fwd+bwd' if backward else 'fwd'} "
            seconds[backward] = interleaved(cases, reps, args.device, label=label)
        for k in kinds:
            peak = peak_mb(args, kind=k, n=n, width=WIDTH, heads=HEADS)
            rows.append(dict(n=n, op=k, fwd_s=seconds[False][k], fwdbwd_s=seconds[True][k],
                             fwdbwd_peak_mb=peak))
        console.print(f"  operator n={n} done", style="dim")
    results['operator'] = rows
    by = {(r['n'], r['op']): r for r in rows}

    def ratios(r):
        """Softmax / TSSA at the same n: time, memory (blank for a TSSA row)."""
        b = by.get((r['n'], {'sdpa_causal': 'causal_tssa', 'sdpa': 'tssa'}.get(r['op'])))
        return [ratio(r[k], b[k], 1) for k in ('fwdbwd_s', 'fwdbwd_peak_mb')] if b else ['', '']
    table(results,
          f"Operator: width {WIDTH}, {HEADS} heads, batch 1, {args.device}, {args.dtype} (ms; peak MB for "
          "forward+backward)",
          ['n', 'op', 'fwd ms', 'fwd+bwd ms', 'peak MB', 'softmax/TSSA fwd+bwd', 'softmax/TSSA MB'],
          [(r['n'], r['op'], ms(r['fwd_s']), ms(r['fwdbwd_s']), mb(r['fwdbwd_peak_mb']), *ratios(r))
           for r in rows])
    # The exponent k of time ~ n^k: a least-squares line through (log n, log t).
    fit_n = [n for n in ns if 1024 <= n <= 16384]
    fits = {}
    for op in ('causal_tssa', 'tssa', 'sdpa_causal', 'sdpa'):
        points = np.log([(r['n'], r['fwdbwd_s']) for r in rows if r['op'] == op and r['n'] in fit_n])
        if len(points) >= 2:
            fits[op] = float(np.polyfit(points[:, 0], points[:, 1], 1)[0])
    results['operator_exponent'] = fits
    results['operator_exponent_n'] = fit_n
    if fits:
        console.print(f"time ~ n^k, forward+backward, least squares on n = {', '.join(map(str, fit_n))}: "
                      + ", ".join(f"{k} {v:.2f}" for k, v in fits.items()))
        if len(fit_n) < 3:
            console.print("  (two points: a rough slope; the full run fits 1024 .. 16384)", style="yellow")
        if min(fits.get('causal_tssa', 1), fits.get('tssa', 1)) < 0.95:
            console.print("  (an exponent below 1 is not a sub-linear layer: fixed per-call costs dominate "
                          "these sizes, or the machine was busy)", style="yellow")


def section_limit(args, results):
    # (batch, tokens, width, heads): one long sequence at the operator table's width, and a CIFAR batch
    # (tost-cifar: 128 images of 8 x 8 patches, width 192), where the projections are cheap and the core
    # is not.
    shapes = [(1, n, WIDTH, HEADS) for n in SIZES[args.mode]['limit_n']]
    shapes.append((4, 16, 64, 4) if args.mode == 'smoke' else (128, 64, 192, 4))
    # The columns this device can run: the fused core is a CPU's, the compiled causal layer needs a torch that
    # builds it, the Triton core runs where training would run it (else its column would time the readable
    # lines under its name).
    triton = tost_fast.triton_on(torch.device(args.device))
    limit = dict(LIMIT)
    if args.device != 'cpu':
        del limit['causal_fast_s']
    if not compiles_causal(args.device):
        del limit['causal_compiled_s']
    if not triton:
        del limit['causal_triton_s']
    if not compiles_here(args.device):
        del limit['tssa_compiled_s']
        limit.pop('causal_compiled_s', None)
        console.print("torch.compile builds nothing here (on a CPU it needs a C++ compiler): the compiled "
                      "columns are left out", style="yellow")
    rows = []
    for B, n, d, h in shapes:
        specs = {k: dict(kind=kind, n=n, dtype=args.dtype, batch=B, width=d, heads=h, **how)
                 for k, (kind, how) in limit.items()}
        for backward in (False, True):
            cases = {k: make_op(device=args.device, backward=backward, **spec) for k, spec in specs.items()}
            label = f"{B}x{n} {'fwd+bwd' if backward else 'fwd'} "
            row = dict(batch=B, n=n, width=d, heads=h, backward=backward)
            row.update(interleaved(cases, 5 if B * n <= 8192 else 3, args.device, label=label))
            rows.append(row)
            # Peak MB of forward+backward of the layers (not of the projections alone).
            if backward and not args.no_memory:
                for k, spec in specs.items():
                    if k != 'proj_s':
                        row[k[:-2] + '_mb'] = measure_memory(spec, args.device)
    results['limit'] = rows
    cells = []
    for r in rows:
        shape = f"{r['batch']} x {r['n']}, {r['width']}"
        row = [shape, 'fwd+bwd' if r['backward'] else 'fwd', ms(r['proj_s'])]
        # Each layer's time, its overhead over the projections, and its memory where measured.
        for k in list(LIMIT)[1:]:
            cell = '-'
            if k in r:
                cell = f"{ms(r[k])} ({r[k] / r['proj_s'] - 1:+.2f}x)"
                if k[:-2] + '_mb' in r:
                    cell += f", {mb(r[k[:-2] + '_mb'])} MB"
            row.append(cell)
        cells.append(row)
    table(results,
          "The limit: a TSSA layer vs its two projections alone (overhead = layer/projections - 1); the "
          "causal layer's fused core vs its readable lines, eager and compiled by torch.compile, "
          "and its Triton core",
          ['batch x tokens, width', 'pass', 'projections ms', 'TSSA', 'TSSA (compiled)',
           'causal (fused core)', 'causal (readable)', 'causal (readable, compiled)', 'causal (Triton core)'],
          cells)
    if not triton:
        console.print("causal (Triton core): not available here (it runs on CUDA from compute capability "
                      "7.0, with triton installed, unless TOST_TRITON=0)")


def compiles_here(device):
    """Whether torch.compile can build code for `device` on this machine (a CPU's needs a C++ compiler, which
    Windows and macOS do not ship)."""
    try:
        torch.compile(torch.sin)(torch.zeros(2, device=device))
    except Exception:
        return False
    return True


def section_model(args, results):
    ns = SIZES[args.mode]['model_n']
    cfg = model_config(args.device, ns[0], 'tssa', args.mode)
    rows = []
    for n in ns:
        cases = {a: make_model(a, n, args.device, args.dtype, args.mode) for a in ('tssa', 'softmax')}
        tm = interleaved(cases, 2 if args.mode == 'full' else 3, args.device, label=f"n={n} ")
        row = dict(n=n, tssa_s=tm['tssa'], softmax_s=tm['softmax'])
        for a in ('tssa', 'softmax'):
            row[f'{a}_mb'] = peak_mb(args, attn=a, n=n, mode=args.mode)
        rows.append(row)
    results['model'] = dict(config=dict(n_layer=cfg.n_layer, n_embd=cfg.n_embd, n_head=cfg.n_head), rows=rows)

    def paper(n, i):
        """The paper's ratio at n tokens, where it gives one: i 0 for time, 1 for memory."""
        return f"{PAPER[n][i]:.2f}x" if n in PAPER else ''
    table(results,
          f"Model forward: GPT {cfg.n_layer}L/{cfg.n_embd}d/{cfg.n_head}h, TSSA vs softmax, batch 1, "
          f"{args.device} (memory: activations above the weights)",
          ['tokens', 'TSSA ms', 'softmax ms', 'TSSA / softmax time', 'paper', 'TSSA MB', 'softmax MB',
           'TSSA / softmax MB', 'paper'],
          [(r['n'], ms(r['tssa_s']), ms(r['softmax_s']), ratio(r['tssa_s'], r['softmax_s']), paper(r['n'], 0),
            mb(r['tssa_mb']), mb(r['softmax_mb']), ratio(r['tssa_mb'], r['softmax_mb']), paper(r['n'], 1))
           for r in rows])


def section_generation(args, results):
    def decode(model, tok, states, n_tokens):
        """From the prompt's state, one step per new token."""
        for _ in range(n_tokens):
            logits, states = model.step(tok, states)
            tok = logits.argmax(-1)

    def rerun(model, ids, n_tokens):
        """The whole prefix again for each new token."""
        for _ in range(n_tokens):
            ids = torch.cat([ids, model(ids)[0][:, -1].argmax(-1, keepdim=True)], 1)

    ctxs = SIZES[args.mode]['gen_ctx']
    new = SIZES[args.mode]['gen_new']
    base = model_config(args.device, max(ctxs) + new + 1, 'tssa', args.mode)
    variants = {'recurrent': {}, 'shift_recurrent': dict(token_shift=True),
                'softmax_kv': dict(attn='softmax'), 'hybrid': dict(token_shift=True, softmax_layers=(-1,))}
    models = {}
    for key, extra in variants.items():
        torch.manual_seed(0)
        models[key] = GPT(replace(base, **extra)).to(args.device).eval()
    tssa = models['recurrent']
    # The prefix is re-run for fewer tokens: each costs a forward over the whole context.
    n_rerun = max(2, new // 8)
    rows = []
    for ctx in ctxs:
        idx = torch.randint(0, tssa.config.vocab_size, (1, ctx), device=args.device)
        with torch.no_grad(), autocast(args.device, args.dtype):
            cases = {}
            for key, model in models.items():
                cases[key] = functools.partial(decode, model, idx[:, -1], model.prefill(idx)[1], new)
                # In the table's order: re-running the prefix second, beside the recurrent steps.
                if key == 'recurrent':
                    cases['rerun'] = functools.partial(rerun, tssa, idx, n_rerun)
            # No warm-up: 3 rounds, the median.
            tm = interleaved(cases, 3, args.device, warmup=0, label=f"context {ctx} ")
        row = dict(ctx=ctx)
        for key, seconds in tm.items():
            row[key] = (n_rerun if key == 'rerun' else new) / seconds
        rows.append(row)
    results['generation'] = rows
    table(results,
          f"Generation tokens/s, batch 1, GPT {tssa.config.n_layer}L/{tssa.config.n_embd}d, {args.device}",
          ['context', 'TSSA recurrent', 'TSSA re-run prefix', 'recurrent / re-run', 'TSSA + shift recurrent',
           'softmax + KV cache', 'hybrid + shift, last block softmax'],
          [(r['ctx'], f"{r['recurrent']:.1f}", f"{r['rerun']:.2f}", ratio(r['recurrent'], r['rerun'], 1),
            f"{r['shift_recurrent']:.1f}", f"{r['softmax_kv']:.1f}", f"{r['hybrid']:.1f}") for r in rows])


def section_training(args, results):
    ns = SIZES[args.mode]['train_n']
    rows = []
    for n in ns:
        cases = {a: make_model(a, n, args.device, args.dtype, args.mode, True) for a in ('tssa', 'softmax')}
        tm = interleaved(cases, 2 if args.mode == 'full' else 3, args.device, label=f"block {n} ")
        rows.append(dict(block_size=n, tssa_tok_s=n / tm['tssa'], softmax_tok_s=n / tm['softmax']))
    results['training'] = rows
    cfg = model_config(args.device, ns[0], 'tssa', args.mode)
    table(results,
          f"Training step tokens/s (forward, backward, AdamW), batch 1, GPT {cfg.n_layer}L/{cfg.n_embd}d, "
          f"{args.device}",
          ['block size', 'TSSA tok/s', 'softmax tok/s', 'TSSA / softmax'],
          [(r['block_size'], f"{r['tssa_tok_s']:,.0f}", f"{r['softmax_tok_s']:,.0f}",
            ratio(r['tssa_tok_s'], r['softmax_tok_s'])) for r in rows])


SECTIONS = {'operator': section_operator, 'limit': section_limit, 'model': section_model,
            'generation': section_generation, 'training': section_training}


def machine():
    """The CPU's name (on Linux, /proc/cpuinfo's) and the load average as the run starts (None where the
    system keeps none): a ratio measured beside other work can be off by several times."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open('/proc/cpuinfo', encoding='utf-8') as f:
            cpu = next((line.split(':', 1)[1].strip() for line in f if line.startswith('model name')), cpu)
    load = round(os.getloadavg()[0], 2) if hasattr(os, 'getloadavg') else None
    return dict(cpu=cpu, load=load)


def json_path(given):
    """Where --json=given writes, checked before any measurement: a .json file (--json=README.md would
    replace the README), where a link points (a rename would replace the link), never over a folder or a
    device."""
    plot.check_suffix('json', given, ('.json',))
    path = os.path.realpath(given)
    folder = os.path.dirname(path)
    special = os.path.exists(path) and not os.path.isfile(path)
    if special or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise UsageError(f"--json={given}: cannot write a file there; give a file name (not a folder or a "
                         f"device) in a folder that exists and is writable")
    return path


def run_sections(args, sections, results):
    """Run args.sections (comma-separated) in order into `results` (returned), and write them to args.json (if
    given) after each section (a run cut short keeps the sections it finished), then the figures of the
    sections that ran beside it."""
    names = list(dict.fromkeys(s.strip() for s in args.sections.split(',') if s.strip()))
    unknown = [s for s in names if s not in sections]
    if unknown or not names:
        typos = ''.join(near(name, sections) for name in unknown)
        raise UsageError(f"unknown section(s) {', '.join(unknown) or '(none)'}{typos}; choose from "
                         f"{', '.join(sections)}")
    path = json_path(args.json) if args.json else None
    # The file is written whole: the results of sections this run does not measure again are not dropped.
    kept = []
    if path and os.path.isfile(path):
        # (One that is not a results file, or not JSON, is replaced.)
        with contextlib.suppress(OSError, ValueError, TypeError), open(path, encoding='utf-8-sig') as f:
            kept = [s for s in json.load(f) if s in sections and s not in names]
    if kept:
        raise UsageError(f"--json={args.json} holds the results of {', '.join(kept)}, which this run does "
                         f"not measure: run them too, or give another --json")
    t0 = time.time()
    for name in names:
        sections[name](args, results)
        results['seconds'] = round(time.time() - t0, 1)
        if path:
            options.write_whole(path, lambda f: json.dump(results, f, indent=1))
    console.print(f"done in {results['seconds']:.0f} s")
    if path:
        try:
            if set(names) & set(plot.FIGURES):
                wrote = plot.draw_results(path, os.path.dirname(path))
                console.print('\n'.join(f"wrote {p}" for p in wrote), markup=False, soft_wrap=True)
        except Exception as e:
            # The numbers are saved: a figure is not worth an error.
            console.print(f"note: could not draw the figures ({type(e).__name__}: {e})", style="yellow",
                          markup=False, soft_wrap=True)
    return results


DEFAULTS = dict(
    quick=False,          # small sizes
    smoke=False,          # tiny sizes: checks that every section runs
    device='auto',        # cpu, cuda, cuda:N; auto: cuda if there is one, else cpu
    dtype='float32',      # float32, bfloat16 or float16
    sections='operator,limit,model,generation,training',   # which sections to run, comma-separated
    json='',              # also write the results to this file, and the figures beside it
    no_memory=False,      # skip the memory measurements
    compile=False,        # torch.compile the operator, model and training cases (the limit compiles its own)
)


def main(argv=None):
    global WIDTH, HEADS, COMPILE
    cfg, _ = parse(argv, DEFAULTS, __doc__, __file__, choices=dict(dtype=('float32', 'bfloat16', 'float16')))
    args = SimpleNamespace(**cfg, mode='smoke' if cfg['smoke'] else 'quick' if cfg['quick'] else 'full')
    if args.device == 'auto':
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    # one line for a name that is no device, or a device this machine lacks
    args.device = pick_device(args.device)
    cuda = args.device.startswith('cuda')
    # On a GPU, 1k to 64k tokens for every operator (flash attention holds 64k).
    if args.mode == 'full' and cuda:
        SIZES['full'].update(op_n=[1024, 2048, 4096, 8192, 16384, 32768, 65536], op_tssa_only=[],
                             limit_n=[1024, 4096, 16384, 65536])
    WIDTH = SIZES[args.mode]['width']
    HEADS = SIZES[args.mode]['heads']
    COMPILE = args.compile
    if COMPILE:
        check_compile(args.device)
    if cuda:
        # As the trainers do: this GPU becomes the current one (for sync and memory), with TF32.
        setup_cuda(args.device)
    # on a GPU, what the CausalTSSA cases run (the limit table names each column's)
    core = None
    if cuda:
        core = 'the Triton core' if tost_fast.triton_on(torch.device(args.device)) else 'the readable lines'
    results = dict(device=args.device, dtype=args.dtype, mode=args.mode, torch=torch.__version__,
                   threads=torch.get_num_threads(), width=WIDTH, heads=HEADS, compile=COMPILE,
                   gpu=torch.cuda.get_device_name() if cuda else None, causal_on_gpu=core, **machine())
    line = f"bench: {args.device}, {args.dtype}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    line += f", {results['cpu']}, load average {results['load']}"
    if args.mode != 'full':
        line += f", {args.mode} mode"
    if core:
        line += f"; causal TSSA on {core}"
    if COMPILE:
        line += "; compiled: the operator, model and training cases"
    # Elsewhere (macOS, Windows) a CPU's memory is not measured: said once, not once a case.
    if not cuda and not args.no_memory and not os.path.isdir(PROC):
        args.no_memory = True
        line += "; memory not measured (a CPU's is read from Linux's /proc)"
    console.print(line)
    return run_sections(args, SECTIONS, results)


if __name__ == '__main__':
    main()
