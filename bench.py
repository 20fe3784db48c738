"""
ToST against softmax attention, side by side, on whatever machine this runs on.

    python bench.py                      # everything (about 15 minutes on 2 CPU cores)
    python bench.py --quick              # small sizes, about a minute on 2 CPU cores
    python bench.py --device=cuda --dtype=bfloat16 --json=bench.json    # on a GPU: 1k to 64k tokens
    python bench.py --device=cuda --dtype=bfloat16 --compile --sections=operator,model
    python bench.py --sections=operator,limit

Sections:
  operator    forward and forward+backward time and peak memory of CausalTSSA, TSSA and SDPA
              (causal and not) for n = 256 .. 16384 (TSSA also 65536), width 768, 12 heads, batch 1;
              the ratio softmax/TSSA at each n and the exponent of time vs n fitted on 1024 .. 16384.
  limit       the TSSA layer against its own two projections alone (the matmuls it cannot avoid);
              the core's overhead as a fraction of the projections, for the fast cores and the
              readable autograd forms; long sequences and a CIFAR-sized batch.
  model       ToST-Base vs the same GPT with softmax attention at 4k and 8k tokens: forward time and
              peak memory ratios, next to the paper's.
  generation  tokens/s of decoding at context 16, 1024, 4096: recurrent state, re-running the prefix
              for every token (what the released code does), the recurrent state with token_shift,
              softmax attention with a KV cache, and the hybrid (last block softmax, with the shift).
  training    tokens/s of a training step (forward, backward, AdamW), ToST vs softmax, block 1024 and 4096.

With --json=PATH the numbers go to PATH, and beside it speed.png (operator: time and memory against
tokens, log-log, with each fitted exponent) and generation.png (tokens/s against the context).

Timing: the cases compared in a row run interleaved (a, b, a, b, ...) and each reports its median, so
a ratio is measured under the same machine load. When the repeats of a case differ by more than 20%,
a warning under the table says so: on a busy machine a ratio is only as good as that spread. Memory: on CUDA the peak of
torch.cuda.max_memory_allocated above what was allocated before the call; on CPU each case runs in a
fresh subprocess and reports its peak resident memory (VmHWM) above the resident memory just before
the call. On CPU the model, generation and training sections use smaller models than ToST-Base
(printed in each table) so the full run ends in minutes.
"""

import json
import math
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import torch
from rich.console import Console
from rich.table import Table

import plot
import tost
from options import UsageError, parse, run_main
from tost import GPT, GPTConfig, TSSA, CausalTSSA, SoftmaxAttention
from train_common import autocast, run_sections, setup_cuda

console = Console() if sys.stdout.isatty() else Console(width=130)   # no truncated columns in logs
PAPER = {4096: (0.60, 0.41), 8192: (0.46, 0.24)}     # ToST-Base / GPT2-Base: time, memory


def sync(device):
    if device.startswith('cuda'):       # CUDA only; main() made args.device the current GPU
        torch.cuda.synchronize()


NOISE = 0.2      # repeated timings of one case further apart than this (max/min - 1): the machine is busy
NOISY = []       # such cases, reported under the table they belong to


def interleaved(cases, reps, device, warmup=1, label=''):
    """Median seconds of each callable in `cases` (a dict), run in interleaved rounds."""
    for f in cases.values():
        for _ in range(warmup):
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
            NOISY.append(f"{label}{k} {fmt_ms(min(v))}..{fmt_ms(max(v))} ms")
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def warn_if_noisy(results):
    """Say so when repeated timings disagreed: a ratio taken on a busy machine can be off by that much."""
    if NOISY:
        results.setdefault('noisy', []).extend(NOISY)
        console.print(f"warning: repeated timings differed by more than {NOISE:.0%} in {len(NOISY)} case(s) "
                      f"({'; '.join(NOISY[:3])}{'; ...' if len(NOISY) > 3 else ''}): the machine is busy, so "
                      "these numbers are rough; rerun on an idle machine", style="yellow")
        NOISY.clear()


# sizes per mode: full (the issue's), quick (a minute on 2 CPU cores), smoke (seconds; for the test suite)
SIZES = {
    'full':  dict(width=768, heads=12, op_n=[256, 1024, 4096, 8192, 16384], op_tssa_only=[65536], limit_n=[1024, 4096, 16384],
                  model_n=[4096, 8192], gen_ctx=[16, 1024, 4096], gen_new=32, train_n=[1024, 4096]),
    'quick': dict(width=768, heads=12, op_n=[256, 1024, 4096], op_tssa_only=[], limit_n=[1024, 4096],
                  model_n=[1024, 2048], gen_ctx=[16, 1024], gen_new=16, train_n=[256, 1024]),
    'smoke': dict(width=64, heads=4, op_n=[64, 128], op_tssa_only=[256], limit_n=[128],
                  model_n=[64, 128], gen_ctx=[8, 64], gen_new=4, train_n=[64]),
}
# on a GPU the full run goes further: 1k to 64k tokens for every operator (flash attention holds 64k)
SIZES['cuda'] = dict(SIZES['full'], op_n=[1024, 2048, 4096, 8192, 16384, 32768, 65536], op_tssa_only=[],
                     limit_n=[1024, 4096, 16384, 65536])
WIDTH, HEADS = 768, 12      # set from SIZES in main()
COMPILE = False             # --compile: torch.compile the layers and models measured (see compiled())


# -----------------------------------------------------------------------------
# the cases: each builds its inputs once and returns a callable


def compiled(module):
    """torch.compile for one case, from a clean slate. Dynamo's caches are cleared first: otherwise every size
    of a layer counts against one recompile limit, past which dynamo runs the layer eagerly (and a TSSA layer
    takes its fast core) while the row says compiled. fullgraph: a graph break is an error, not a silently
    eager piece. The case's warm-up run compiles it, so the timed runs do not include compiling."""
    torch._dynamo.reset()
    return torch.compile(module, fullgraph=True)


def make_op(kind, n, device, dtype, backward, batch=1, width=None, heads=None, compile=None):
    """compile: None follows --compile."""
    torch.manual_seed(0)
    d, h = width or WIDTH, heads or HEADS
    layer = {'causal_tssa': lambda: CausalTSSA(d, h, block_size=n),
             'tssa': lambda: TSSA(d, h),
             'sdpa_causal': lambda: SoftmaxAttention(d, h, causal=True),
             'sdpa': lambda: SoftmaxAttention(d, h, causal=False),
             'proj': lambda: Projections(d)}[kind]().to(device)
    layer = compiled(layer) if (COMPILE if compile is None else compile) else layer
    x = torch.randn(batch, n, d, device=device, requires_grad=backward)

    def run():
        with autocast(device, dtype):
            y = layer(x)
        if backward:
            y.float().sum().backward()
    return run if backward else torch.no_grad()(run)


class Projections(torch.nn.Module):
    """Only the two d x d matmuls of a TSSA layer: the floor its core adds to."""

    def __init__(self, d):
        super().__init__()
        self.c_attn = torch.nn.Linear(d, d, bias=False)
        self.c_proj = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        return self.c_proj(self.c_attn(x))


def model_config(device, block_size, attn, mode):
    """ToST-Base on a GPU; on a CPU fewer layers (and in quick/smoke modes a narrower model)."""
    if device.startswith('cuda') and mode == 'full':
        return tost.preset('tost-base', block_size=block_size, attn=attn)
    shape = {'full': (4, 12, 768), 'quick': (2, 4, 256), 'smoke': (1, 2, 32)}[mode]
    vocab = 512 if mode == 'smoke' else 50304
    return GPTConfig(n_layer=shape[0], n_head=shape[1], n_embd=shape[2], block_size=block_size,
                     vocab_size=vocab, attn=attn)


def make_model_forward(attn, n, device, dtype, mode):
    torch.manual_seed(0)
    model = GPT(model_config(device, n, attn, mode)).to(device).eval()
    idx = torch.randint(0, model.config.vocab_size, (1, n), device=device)
    forward = compiled(model) if COMPILE else model

    @torch.no_grad()
    def run():
        with autocast(device, dtype):
            forward(idx)
    return run


def make_train_step(attn, n, device, dtype, mode, batch_size=1):
    torch.manual_seed(0)
    model = GPT(model_config(device, n, attn, mode)).to(device)
    opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device.split(':')[0])
    idx = torch.randint(0, model.config.vocab_size, (batch_size, n + 1), device=device)
    forward = compiled(model) if COMPILE else model

    def run():
        with autocast(device, dtype):
            _, loss = forward(idx[:, :-1], idx[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return run


# -----------------------------------------------------------------------------
# memory


def measure_memory(spec, device):
    """Peak memory (MB) of one run of the case described by spec (a dict)."""
    if device.startswith('cuda'):                       # CUDA only; main() made args.device the current GPU
        run = build(spec, device)
        run()                                           # allocator warm-up
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    code = f"import bench; bench.memory_child({json.dumps(spec)!r}, {device!r})"
    out = subprocess.run([sys.executable, '-c', code], cwd=os.path.dirname(os.path.abspath(__file__)),
                         capture_output=True, text=True)
    if out.returncode != 0:
        return float('nan')
    return float(out.stdout.strip().splitlines()[-1])


def build(spec, device):
    kind, n, dtype = spec['kind'], spec['n'], spec['dtype']
    if kind.startswith('model_'):
        return make_model_forward(kind[6:], n, device, dtype, spec['mode'])
    return make_op(kind, n, device, dtype, spec['backward'])


def _rss_kb(field):
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(field)


def memory_child(spec, device):
    """In a fresh process: one case's peak resident memory above what the process held before it, in MB."""
    global WIDTH, HEADS
    spec = json.loads(spec)
    WIDTH, HEADS = SIZES[spec['mode']]['width'], SIZES[spec['mode']]['heads']
    run = build(spec, device)
    # the first run allocates what every run needs (gradients, allocator caches); measure the second
    run()
    base = _rss_kb('VmRSS:')
    with open('/proc/self/clear_refs', 'w') as f:   # reset the high-water mark to the current RSS
        f.write('5')
    run()
    print((_rss_kb('VmHWM:') - base) / 1024)


# -----------------------------------------------------------------------------
# sections


def fmt_ms(s):
    return f"{s * 1e3:,.1f}" if s == s else "-"


def fmt_mb(m):
    return f"{m:,.0f}" if m == m else "-"


def slope(ns, ts):
    """Least-squares exponent of t ~ n^k."""
    xs, ys = [math.log(n) for n in ns], [math.log(t) for t in ts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def section_operator(args, results):
    ns, extra = SIZES[args.mode]['op_n'], SIZES[args.mode]['op_tssa_only']
    rows = []
    for n in ns + extra:
        kinds = ['causal_tssa', 'tssa'] + ([] if n in extra else ['sdpa_causal', 'sdpa'])
        reps = 5 if n <= 1024 else (3 if n <= 4096 else 2)
        fwd = interleaved({k: make_op(k, n, args.device, args.dtype, False) for k in kinds}, reps, args.device,
                          label=f"n={n} fwd ")
        fb = interleaved({k: make_op(k, n, args.device, args.dtype, True) for k in kinds}, reps, args.device,
                         label=f"n={n} fwd+bwd ")
        mem = {k: measure_memory(dict(kind=k, n=n, dtype=args.dtype, backward=True, mode=args.mode), args.device)
               for k in kinds} if not args.no_memory else {}
        for k in kinds:
            rows.append(dict(n=n, op=k, fwd_s=fwd[k], fwdbwd_s=fb[k], fwdbwd_peak_mb=mem.get(k, float('nan'))))
        console.print(f"  operator n={n} done", style="dim")
    results['operator'] = rows

    t = Table(title=f"Operator: width {WIDTH}, {HEADS} heads, batch 1, {args.device}, {args.dtype} "
                    "(ms; peak MB for forward+backward)")
    for c in ['n', 'op', 'fwd ms', 'fwd+bwd ms', 'peak MB', 'softmax/TSSA fwd+bwd', 'softmax/TSSA MB']:
        t.add_column(c, justify='right')
    by = {(r['n'], r['op']): r for r in rows}
    for r in rows:
        base = {'sdpa_causal': 'causal_tssa', 'sdpa': 'tssa'}.get(r['op'])
        ratio = mratio = ''
        if base:
            b = by[(r['n'], base)]
            ratio = f"{r['fwdbwd_s'] / b['fwdbwd_s']:.1f}x"
            mratio = f"{r['fwdbwd_peak_mb'] / b['fwdbwd_peak_mb']:.1f}x" if b['fwdbwd_peak_mb'] > 0 else '-'
        t.add_row(str(r['n']), r['op'], fmt_ms(r['fwd_s']), fmt_ms(r['fwdbwd_s']), fmt_mb(r['fwdbwd_peak_mb']),
                  ratio, mratio)
    console.print(t)
    warn_if_noisy(results)
    fit_n = [n for n in ns if 1024 <= n <= 16384]
    fits = {}
    for op in ['causal_tssa', 'tssa', 'sdpa_causal', 'sdpa']:
        pts = [(r['n'], r['fwdbwd_s']) for r in rows if r['op'] == op and r['n'] in fit_n]
        if len(pts) >= 2:
            fits[op] = slope(*zip(*pts))
    results['operator_exponent'], results['operator_exponent_n'] = fits, fit_n
    if fits:
        console.print(f"time ~ n^k, forward+backward, least squares on n = {', '.join(map(str, fit_n))}: "
                      + ", ".join(f"{k} {v:.2f}" for k, v in fits.items()))
        if len(fit_n) < 3:
            console.print("  (two points: a rough slope; the full run fits 1024 .. 16384)", style="yellow")
        if min(fits.get('causal_tssa', 1), fits.get('tssa', 1)) < 0.95:
            console.print("  (an exponent below 1 is not a sub-linear layer: fixed per-call costs dominate these "
                          "sizes, or the machine was busy)", style="yellow")


def section_limit(args, results):
    # (batch, tokens, width, heads): one long sequence at the operator table's width, and a CIFAR batch
    # (tost-cifar: 128 images of 8 x 8 patches, width 192), where the projections are cheap and the core is not
    shapes = [(1, n, WIDTH, HEADS) for n in SIZES[args.mode]['limit_n']]
    shapes.append((4, 16, 64, 4) if args.mode == 'smoke' else (128, 64, 192, 4))
    rows = []
    for B, n, d, h in shapes:
        reps = 5 if B * n <= 8192 else 3
        for backward in (False, True):
            op = lambda kind, compile=False: make_op(kind, n, args.device, args.dtype, backward, B, d, h, compile)
            cases = {'proj': op('proj'), 'tssa': op('tssa'), 'causal_fast': op('causal_tssa')}   # eager: fast cores
            for kind, f in (('tssa', op('tssa', COMPILE)), ('causal', op('causal_tssa', COMPILE))):
                def readable(f=f):                          # the same layer, its readable lines (--compile: compiled)
                    TSSA.fast = False
                    try:
                        f()
                    finally:
                        TSSA.fast = True
                cases[kind + '_readable'] = readable
            tm = interleaved(cases, reps, args.device, label=f"{B}x{n} {'fwd+bwd' if backward else 'fwd'} ")
            rows.append(dict(batch=B, n=n, width=d, heads=h, backward=backward, readable_compiled=COMPILE,
                             **{k + '_s': v for k, v in tm.items()}))
    results['limit'] = rows
    readable = 'readable, compiled' if COMPILE else 'readable'
    t = Table(title="The limit: a TSSA layer vs its two projections alone (overhead = layer/projections - 1); "
                    "the fast cores vs " + ("the readable lines compiled by torch.compile (the fast cores and the "
                                            "projections run eagerly)" if COMPILE else "the readable lines"))
    for c in ['batch x tokens, width', 'pass', 'projections ms', 'TSSA (fast core)', f'TSSA ({readable})',
              'causal (fast core)', f'causal ({readable})']:
        t.add_column(c, justify='right')
    for r in rows:
        p = r['proj_s']
        cell = lambda k: f"{fmt_ms(r[k])} (+{r[k] / p - 1:.2f}x)"
        t.add_row(f"{r['batch']} x {r['n']}, {r['width']}", 'fwd+bwd' if r['backward'] else 'fwd', fmt_ms(p),
                  cell('tssa_s'), cell('tssa_readable_s'), cell('causal_fast_s'), cell('causal_readable_s'))
    console.print(t)
    warn_if_noisy(results)


def section_model(args, results):
    ns = SIZES[args.mode]['model_n']
    cfg = model_config(args.device, ns[0], 'tssa', args.mode)
    rows = []
    for n in ns:
        tm = interleaved({a: make_model_forward(a, n, args.device, args.dtype, args.mode)
                          for a in ('tssa', 'softmax')}, 2 if args.mode == 'full' else 3, args.device,
                         label=f"n={n} ")
        mem = {a: measure_memory(dict(kind='model_' + a, n=n, dtype=args.dtype, mode=args.mode), args.device)
               for a in ('tssa', 'softmax')} if not args.no_memory else {}
        rows.append(dict(n=n, tssa_s=tm['tssa'], softmax_s=tm['softmax'],
                         tssa_mb=mem.get('tssa', float('nan')), softmax_mb=mem.get('softmax', float('nan'))))
    results['model'] = dict(config=dict(n_layer=cfg.n_layer, n_embd=cfg.n_embd, n_head=cfg.n_head), rows=rows)
    t = Table(title=f"Model forward: GPT {cfg.n_layer}L/{cfg.n_embd}d/{cfg.n_head}h, TSSA vs softmax, batch 1, "
                    f"{args.device} (memory: activations above the weights)")
    for c in ['tokens', 'TSSA ms', 'softmax ms', 'time ratio', 'paper', 'TSSA MB', 'softmax MB', 'memory ratio',
              'paper']:
        t.add_column(c, justify='right')
    for r in rows:
        pt, pm = PAPER.get(r['n'], (None, None))
        t.add_row(str(r['n']), fmt_ms(r['tssa_s']), fmt_ms(r['softmax_s']), f"{r['tssa_s'] / r['softmax_s']:.2f}x",
                  f"{pt:.2f}x" if pt else '', fmt_mb(r['tssa_mb']), fmt_mb(r['softmax_mb']),
                  f"{r['tssa_mb'] / r['softmax_mb']:.2f}x" if r['softmax_mb'] > 0 else '-',
                  f"{pm:.2f}x" if pm else '')
    console.print(t)
    warn_if_noisy(results)


def section_generation(args, results):
    ctxs, new = SIZES[args.mode]['gen_ctx'], SIZES[args.mode]['gen_new']
    rows = []
    models = {}
    for name, attn, extra in (('tssa', 'tssa', {}), ('tssa_shift', 'tssa', dict(token_shift=True)),
                              ('softmax', 'softmax', {}),
                              ('hybrid', 'tssa', dict(token_shift=True, softmax_layers=(-1,)))):   # last block softmax
        torch.manual_seed(0)
        cfg = GPTConfig(**{**vars(model_config(args.device, max(ctxs) + new + 1, attn, args.mode)), **extra})
        models[name] = GPT(cfg).to(args.device).eval()
    for ctx in ctxs:
        idx = torch.randint(0, models['tssa'].config.vocab_size, (1, ctx), device=args.device)

        def decode(model, n_tokens=new):
            _, states = model.prefill(idx)
            tok = idx[:, -1]
            sync(args.device)
            t0 = time.perf_counter()
            for _ in range(n_tokens):
                logits, states = model.step(tok, states)
                tok = logits.argmax(-1)
            sync(args.device)
            return n_tokens / (time.perf_counter() - t0)

        def rerun(model, n_tokens=max(2, new // 8)):
            ctx_ids = idx
            sync(args.device)
            t0 = time.perf_counter()
            for _ in range(n_tokens):
                logits, _ = model(ctx_ids)
                ctx_ids = torch.cat([ctx_ids, logits[:, -1].argmax(-1, keepdim=True)], 1)
            sync(args.device)
            return n_tokens / (time.perf_counter() - t0)

        with torch.no_grad(), autocast(args.device, args.dtype):
            rates = {'recurrent': [], 'rerun': [], 'shift_recurrent': [], 'softmax_kv': [], 'hybrid': []}
            for _ in range(3):                                 # interleaved rounds, median
                rates['recurrent'].append(decode(models['tssa']))
                rates['rerun'].append(rerun(models['tssa']))
                rates['shift_recurrent'].append(decode(models['tssa_shift']))
                rates['softmax_kv'].append(decode(models['softmax']))
                rates['hybrid'].append(decode(models['hybrid']))
        rows.append(dict(ctx=ctx, **{k: sorted(v)[1] for k, v in rates.items()}))
    results['generation'] = rows
    cfg = models['tssa'].config
    t = Table(title=f"Generation tokens/s, batch 1, GPT {cfg.n_layer}L/{cfg.n_embd}d, {args.device}")
    for c in ['context', 'TSSA recurrent', 'TSSA re-run prefix', 'recurrent / re-run', 'TSSA + shift recurrent',
              'softmax + KV cache', 'hybrid + shift, last block softmax']:
        t.add_column(c, justify='right')
    for r in rows:
        t.add_row(str(r['ctx']), f"{r['recurrent']:.1f}", f"{r['rerun']:.2f}", f"{r['recurrent'] / r['rerun']:.0f}x",
                  f"{r['shift_recurrent']:.1f}", f"{r['softmax_kv']:.1f}", f"{r['hybrid']:.1f}")
    console.print(t)
    warn_if_noisy(results)


def section_training(args, results):
    ns = SIZES[args.mode]['train_n']
    rows = []
    for n in ns:
        tm = interleaved({a: make_train_step(a, n, args.device, args.dtype, args.mode) for a in ('tssa', 'softmax')},
                         2 if args.mode == 'full' else 3, args.device, label=f"block {n} ")
        rows.append(dict(block_size=n, tssa_tok_s=n / tm['tssa'], softmax_tok_s=n / tm['softmax']))
    results['training'] = rows
    cfg = model_config(args.device, ns[0], 'tssa', args.mode)
    t = Table(title=f"Training step tokens/s (forward, backward, AdamW), batch 1, GPT {cfg.n_layer}L/{cfg.n_embd}d, "
                    f"{args.device}")
    for c in ['block size', 'TSSA tok/s', 'softmax tok/s', 'TSSA / softmax']:
        t.add_column(c, justify='right')
    for r in rows:
        t.add_row(str(r['block_size']), f"{r['tssa_tok_s']:,.0f}", f"{r['softmax_tok_s']:,.0f}",
                  f"{r['tssa_tok_s'] / r['softmax_tok_s']:.2f}x")
    console.print(t)
    warn_if_noisy(results)


SECTIONS = {'operator': section_operator, 'limit': section_limit, 'model': section_model,
            'generation': section_generation, 'training': section_training}


DEFAULTS = dict(
    quick=False,          # small sizes, about a minute on 2 CPU cores
    smoke=False,          # tiny sizes, seconds: checks that every section runs
    device='auto',        # cpu, cuda, cuda:N; auto: cuda if there is one, else cpu
    dtype='float32',      # float32, bfloat16 or float16
    sections='operator,limit,model,generation,training',   # which sections to run, comma-separated
    json='',              # also write the results to this file
    no_memory=False,      # skip the memory measurements
    compile=False,        # torch.compile the operator, model and training cases and the limit's readable lines
)


def main(argv=None):
    global WIDTH, HEADS, COMPILE
    cfg, _ = parse(sys.argv[1:] if argv is None else argv, DEFAULTS, __doc__, __file__)
    args = SimpleNamespace(**cfg, mode='smoke' if cfg['smoke'] else 'quick' if cfg['quick'] else 'full')
    if args.device == 'auto':
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if args.dtype not in ('float32', 'bfloat16', 'float16'):
        raise UsageError(f"--dtype expects float32, bfloat16 or float16, got {args.dtype!r}")
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        raise UsageError(f"--device={args.device} but CUDA is not available here")
    if args.mode == 'full' and args.device.startswith('cuda'):
        SIZES['full'] = SIZES['cuda']
    WIDTH, HEADS, COMPILE = SIZES[args.mode]['width'], SIZES[args.mode]['heads'], args.compile
    if args.device.startswith('cuda'):
        setup_cuda(args.device)     # CUDA only, as the trainers: this GPU is the current one (sync, memory), TF32
    results = dict(device=args.device, dtype=args.dtype, mode=args.mode, torch=torch.__version__,
                   threads=torch.get_num_threads(), width=WIDTH, heads=HEADS, compile=COMPILE,
                   gpu=torch.cuda.get_device_name() if args.device.startswith('cuda') else None)
    console.print(f"bench: {args.device}, {args.dtype}, torch {torch.__version__}, {torch.get_num_threads()} threads"
                  + (f", {args.mode} mode" if args.mode != 'full' else "")
                  + ("; compiled: the operator, model and training cases and the limit section's readable columns "
                     "(the fast cores and generation run eagerly)" if COMPILE else ""))
    return run_sections(args, SECTIONS, results, console, plot.FIGURES)


if __name__ == '__main__':
    run_main(main)
