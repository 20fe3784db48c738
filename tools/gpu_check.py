"""
The Triton core of causal TSSA (tost_triton.py) on one CUDA GPU, in one run (20 to 40 s on an H100):
docs/speed.md's section "The Triton core" comes from it. From the repo root:

    python -m tools.gpu_check --json=docs/gpu-check.json

1. equality: one layer (width 768, 12 heads) under bf16 autocast, and in float32, against the same layer in
   float64 on the GPU: y and every gradient, the Triton core against the readable lines;
2. one layer's forward+backward ms and peak MB, bf16 autocast: the readable lines, the Triton core and causal
   SDPA (flash attention) at 1x1024, 16x1024, 4x4096, 1x16384 and 1x65536 tokens;
3. a training step (forward, backward, AdamW, bf16 autocast): ToST-Base on the Triton core and on its readable
   lines against GPT-2 small (the same model with softmax attention), tokens/s at 16x1024 and 4x4096;
4. the core's speed targets (docs/speed.md), met or not, and the torch profiler's top kernels of one layer at
   16x1024.
It prints the card, torch and triton versions, and writes everything to --json. --smoke runs it at tiny
sizes, on a CPU under Triton's interpreter (for the tests; its numbers mean nothing).
"""
import os
import sys

# Also run by its path (python tools/gpu_check.py): the repository's modules come from its root.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import options  # first: its handler ends a Ctrl-C while torch imports (exit 130, no traceback)
import importlib.util
import json
import time
from types import SimpleNamespace

import torch

from options import UsageError, parse
from train_common import pick_device

SIZES = {
    'full': dict(width=768, heads=12, equality=[(2, 1024), (1, 4096)],
                 layer=[(1, 1024), (16, 1024), (4, 4096), (1, 16384), (1, 65536)],
                 training=[(16, 1024), (4, 4096)]),
    'smoke': dict(width=32, heads=4, equality=[(1, 48)], layer=[(2, 32)], training=[(2, 32)]),
}
# The core's speed targets: (what, measured value's key, at least)
TARGETS = [('layer fwd+bwd at 16x1024: readable lines / Triton core', 'layer_speedup_16x1024', 10.0),
           ('layer fwd+bwd at 16x1024: causal SDPA / Triton core', 'vs_sdpa_16x1024', 1.0),
           ('layer fwd+bwd at 4x4096: causal SDPA / Triton core', 'vs_sdpa_4x4096', 1.0),
           ('layer fwd+bwd at 1x16384: causal SDPA / Triton core', 'vs_sdpa_1x16384', 1.0),
           ('layer fwd+bwd at 1x65536: causal SDPA / Triton core', 'vs_sdpa_1x65536', 1.0),
           ('training tokens/s at 16x1024: ToST-Base (Triton core) / GPT-2 small', 'training_16x1024', 1.1),
           ('training tokens/s at 4x4096: ToST-Base (Triton core) / GPT-2 small', 'training_4x4096', 1.3)]


# The Triton core passes if its distance from float64 is at most this many times the readable lines': on a CPU
# the tests hold it to 1.1x under bf16; the GPU's TF32 and reduction orders get some room.
EQUAL = 1.5


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def equality(bench, device, sizes):
    """Relative distance of y and every gradient from float64 (on the same device), bf16 autocast and float32,
    for the Triton core and for the readable lines."""
    from tost import CausalTSSA
    rows = []
    for B, n in sizes['equality']:
        torch.manual_seed(0)
        layer = CausalTSSA(sizes['width'], sizes['heads'], block_size=n).to(device)
        with torch.no_grad():
            layer.temp.uniform_(0.5, 1.5)
            layer.pos_bias.normal_(0, 0.02)
        x = torch.randn(B, n, sizes['width'], device=device)
        g = torch.randn(B, n, sizes['width'], device=device)
        names = ['y', 'x'] + [name for name, _ in layer.named_parameters()]

        def grads(dtype, **path):
            layer.zero_grad()
            xx = x.detach().clone().requires_grad_()
            with bench.causal_path(device, **path), bench.autocast(device, dtype):
                y = layer(xx)
            with bench.causal_path(device, **path):
                (y.float() * g).sum().backward()
            return [y.detach(), xx.grad] + [p.grad.clone() for p in layer.parameters()]
        layer.double()
        x, g = x.double(), g.double()
        ref = grads('float32', readable=True)
        layer.float()
        x, g = x.float(), g.float()
        for dtype in ('bfloat16', 'float32'):
            core = grads(dtype, triton=True)
            readable = grads(dtype, readable=True)
            for name, c, r, want in zip(names, core, readable, ref):
                rows.append(dict(batch=B, n=n, dtype=dtype, tensor=name, triton=_rel(c, want),
                                 readable=_rel(r, want)))
    return rows


def layer_times(bench, args, sizes):
    """Forward+backward ms and peak MB of one layer, bf16 autocast: readable lines, Triton core, causal SDPA.
    Memory on CUDA only (on a CPU each case would take a process of its own)."""
    rows = []
    for B, n in sizes['layer']:
        specs = {'readable': dict(kind='causal_tssa', readable=True),
                 'triton': dict(kind='causal_tssa', triton=True),
                 'sdpa': dict(kind='sdpa_causal')}
        specs = {k: dict(n=n, dtype=args.dtype, batch=B, width=sizes['width'], heads=sizes['heads'], **s)
                 for k, s in specs.items()}
        cases = {k: bench.make_op(device=args.device, backward=True, **s) for k, s in specs.items()}
        t = bench.interleaved(cases, 5 if args.mode == 'full' else 1, args.device, label=f"{B}x{n} ")
        mb = {k: bench.measure_memory(s, args.device) if args.device.startswith('cuda') else float('nan')
              for k, s in specs.items()}
        rows.append(dict(batch=B, n=n, **{f'{k}_ms': t[k] * 1e3 for k in t},
                         **{f'{k}_mb': v for k, v in mb.items()}))
        print(f"  layer {B}x{n} done", flush=True)
    return rows


def training(bench, args, sizes):
    """Training step tokens/s: ToST-Base on the Triton core, on the readable lines, and GPT-2 small."""
    rows = []
    for B, n in sizes['training']:
        step = dict(n=n, device=args.device, dtype=args.dtype, mode=args.mode, train=True, batch=B)
        cases = {'tost_triton': bench.make_model('tssa', triton=True, **step),
                 'tost_readable': bench.make_model('tssa', **step),
                 'gpt2': bench.make_model('softmax', **step)}
        t = bench.interleaved(cases, 3 if args.mode == 'full' else 1, args.device, label=f"train {B}x{n} ")
        rows.append(dict(batch=B, n=n, **{f'{k}_tok_s': B * n / v for k, v in t.items()}))
        print(f"  training {B}x{n} done", flush=True)
    return rows


def targets(results):
    by = {(r['batch'], r['n']): r for r in results['layer']}
    measured = {}
    if (16, 1024) in by:
        measured['layer_speedup_16x1024'] = by[16, 1024]['readable_ms'] / by[16, 1024]['triton_ms']
    for (B, n), r in by.items():
        measured[f'vs_sdpa_{B}x{n}'] = r['sdpa_ms'] / r['triton_ms']
    for r in results['training']:
        measured[f"training_{r['batch']}x{r['n']}"] = r['tost_triton_tok_s'] / r['gpt2_tok_s']
    return [dict(target=what, at_least=want, measured=measured[key], met=measured[key] >= want)
            for what, key, want in TARGETS if key in measured]


def profile(bench, args, sizes):
    """The torch profiler's top ten kernels of one layer's forward+backward on the Triton core, 16x1024."""
    B, n = sizes['training'][0]
    run = bench.make_op('causal_tssa', n, args.device, args.dtype, True, batch=B, width=sizes['width'],
                        heads=sizes['heads'], triton=True)
    run()
    cuda = args.device.startswith('cuda')
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(3 if args.mode == 'full' else 1):
            run()
        if cuda:
            torch.cuda.synchronize()
    key = 'self_device_time_total' if cuda else 'self_cpu_time_total'
    table = prof.key_averages().table(sort_by=key, row_limit=10)
    print(table)
    return table


def save(results, path, t0):
    """Write what has been measured so far (after each part: a run cut short keeps its parts)."""
    results['seconds'] = round(time.time() - t0, 1)
    options.write_whole(path, lambda f: json.dump(results, f, indent=1))


DEFAULTS = dict(
    json='gpu-check.json',   # where the results go (the docs' run: docs/gpu-check.json)
    smoke=False,             # tiny sizes; on a CPU under Triton's interpreter (tests only)
    device='auto',           # cuda, cuda:N; auto: cuda
)


def main(argv=None):
    cfg, _ = parse(argv, DEFAULTS, __doc__, __file__, ranges=dict(nonempty=['json']))
    args = SimpleNamespace(**cfg, mode='smoke' if cfg['smoke'] else 'full', dtype='bfloat16')
    if args.device == 'auto':
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    cuda = pick_device(args.device).startswith('cuda')
    if not cuda and not args.smoke:
        raise UsageError("tools.gpu_check measures the Triton core on a CUDA GPU, and there is none here "
                         "(--smoke runs it tiny on a CPU, under Triton's interpreter)")
    # (bench imports no triton: the interpreter below is still to be chosen)
    from tools import bench
    path = bench.json_path(args.json)
    if importlib.util.find_spec('triton') is None:
        raise UsageError("tools.gpu_check needs triton (pip install triton)")
    if not cuda:
        if 'triton' in sys.modules and os.environ.get('TRITON_INTERPRET') != '1':
            raise UsageError("--smoke on a CPU needs Triton's interpreter, set before triton is imported: "
                             "run it as python -m tools.gpu_check --smoke")
        os.environ['TRITON_INTERPRET'] = '1'
    import triton
    import tost_fast
    tost_fast.TRITON = ()                     # the Triton core only where a case asks for it
    sizes = SIZES[args.mode]
    if cuda:
        bench.setup_cuda(args.device)
        # Below Triton's floor the core never runs: every column would time the readable lines.
        if not tost_fast._triton_runs_on(torch.device(args.device).index):
            capability = '.'.join(map(str, torch.cuda.get_device_capability()))
            raise UsageError(f"tools.gpu_check measures the Triton core, which needs compute capability 7.0 "
                             f"or more; {torch.cuda.get_device_name()} has {capability}")
    results = dict(device=args.device, gpu=torch.cuda.get_device_name() if cuda else None,
                   torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
                   mode=args.mode, dtype=args.dtype,
                   width=sizes['width'], heads=sizes['heads'])
    print(f"gpu_check: {results['gpu'] or args.device}, torch {torch.__version__}, "
          f"triton {triton.__version__}, CUDA {torch.version.cuda}, {args.mode}", flush=True)
    t0 = time.time()
    results['equality'] = equality(bench, args.device, sizes)
    worst = max((r['triton'] / max(r['readable'], 1e-30), r['tensor'], r['dtype'])
                for r in results['equality'])
    results['equality_ok'] = worst[0] <= EQUAL
    save(results, path, t0)
    what = (f"the Triton core's distance from float64 is {worst[0]:.2f}x the readable lines' "
            f"({worst[1]}, {worst[2]})")
    # A core that computes something else is not timed: exit 1, its rows in the JSON.
    if not results['equality_ok']:
        raise SystemExit(f"error: not equal: {what}, above {EQUAL}x; the rows are under equality in "
                         f"{args.json}")
    print(f"equality: ok, {what}", flush=True)
    results['layer'] = layer_times(bench, args, sizes)
    save(results, path, t0)
    bench.table(results, f"One layer, forward+backward, {args.dtype} autocast, width {sizes['width']}, "
                         f"{sizes['heads']} heads (ms; peak MB)",
                ['batch x tokens', 'readable', 'Triton core', 'causal SDPA', 'readable / Triton',
                 'SDPA / Triton'],
                [(f"{r['batch']} x {r['n']}", *(f"{r[k + '_ms']:.2f} / {bench.mb(r[k + '_mb'])}"
                                                 for k in ('readable', 'triton', 'sdpa')),
                  bench.ratio(r['readable_ms'], r['triton_ms']), bench.ratio(r['sdpa_ms'], r['triton_ms']))
                 for r in results['layer']])
    results['training'] = training(bench, args, sizes)
    save(results, path, t0)
    bench.table(results, "Training step tokens/s (forward, backward, AdamW), ToST-Base against GPT-2 small",
                ['batch x block', 'ToST, Triton core', 'ToST, readable', 'GPT-2', 'Triton / GPT-2'],
                [(f"{r['batch']} x {r['n']}",
                  *(f"{r[k + '_tok_s']:,.0f}" for k in ('tost_triton', 'tost_readable', 'gpt2')),
                  bench.ratio(r['tost_triton_tok_s'], r['gpt2_tok_s']))
                 for r in results['training']])
    results['targets'] = targets(results)
    for t in results['targets']:
        print(f"target {t['target']}: {t['measured']:.2f}x, at least {t['at_least']}x: "
              f"{'met' if t['met'] else 'missed'}")
    results['profile'] = profile(bench, args, sizes)
    save(results, path, t0)
    print(f"done in {results['seconds']:.0f} s; wrote {args.json}")
    return results


if __name__ == '__main__':
    main()
