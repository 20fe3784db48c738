"""
Train a ToST language model: nanoGPT's train.py with causal TSSA in place of softmax attention. The demo needs
nothing but this repo: it prepares the offline corpus (this Python's standard library source) if it is missing,
trains a 0.7M-parameter model on 4M bytes, saves out/ckpt.pt and says how to sample from it.

    python train_gpt.py                                   # the demo (same as --config=demo)
    python train_gpt.py --attn=softmax --out_dir=out-softmax   # the GPT-2 baseline, everything else equal
    python train_gpt.py --softmax_layers=-1 --token_shift=true --out_dir=out-hybrid   # last block softmax
    python train_gpt.py --init_from=resume --max_iters=2000 --lr_decay_iters=2000   # train the run in out/ longer
    python train_gpt.py --config=shakespeare              # tiny shakespeare, gpt2 BPE (for a GPU; needs network once)
    torchrun --standalone --nproc_per_node=8 train_gpt.py --config=owt-base   # the paper's run (docs/training.md)

A new run refuses an out_dir that holds a checkpoint (--init_from=resume, another --out_dir, or --overwrite=true).
Ctrl-C or SIGTERM saves at the current step and prints the resume command; a second Ctrl-C stops without saving.
"""
import options  # first: its handler ends a Ctrl-C while torch imports (exit 130, no traceback)
import contextlib
import math
import os
import re
import sys
import time

import numpy as np
import torch

import readers
import tost
from options import UsageError, parse
from train_common import (autocast, check_compile, cosine_lr, human, load_checkpoint, load_weights, mean_loss,
                          optimizer_for, resolve_dtype, resume_command, seed_of, sum_dtype, wrap)
from train_legacy import Run, check_lr, launch, make_out_dir

DEFAULTS = dict(
    config='demo',               # the preset this run started from (--config=NAME picks one)
    # data
    dataset='python_stdlib',     # a folder under data_dir written by prepare_data.py
    data_dir='data',             # where prepare_data.py puts datasets
    block_size=256,              # context length in tokens
    batch_size=16,               # sequences per micro-step, per process
    gradient_accumulation_steps=1,  # micro-steps per optimizer step over all processes (rounded up to a multiple)
    # model (tost.GPT); the vocabulary comes from the data: 256 for bytes, 50304 for gpt2
    n_layer=4,                   # blocks
    n_head=4,                    # heads (TSSA's groups K)
    n_embd=128,                  # width d
    dropout=0.0,                 # for pretraining 0 is good; for finetuning try 0.1+
    bias=False,                  # biases in Linear and LayerNorm
    attn='tssa',                 # tssa (ToST) or softmax (GPT-2's attention), all else equal
    token_shift=False,           # not in the paper: mix each token with the previous one before attention
    softmax_layers='',           # not in the paper: blocks given softmax attention, e.g. -1 (the last) or 0,3
    # AdamW, linear warmup then cosine decay; the schedule does not follow max_iters: set them together
    learning_rate=6e-3,          # peak learning rate (high, for a small model and a short run)
    max_iters=1000,              # optimizer steps in total
    min_lr=6e-3 / 10,            # floor of the cosine (the default learning_rate / 10, as nanoGPT)
    warmup_iters=50,             # linear warmup
    lr_decay_iters=1000,         # the cosine reaches min_lr here (nanoGPT: = max_iters)
    weight_decay=0.1,            # on matrices only (tost.param_groups)
    beta1=0.9,                   # AdamW's first-moment decay
    beta2=0.95,                  # AdamW's second-moment decay
    grad_clip=1.0,               # clip the global gradient norm at this; 0 turns it off
    # evaluation, logging, checkpoints
    out_dir='out',               # ckpt.pt, log.jsonl and loss.png go here
    eval_interval=250,           # estimate train and val loss every this many iterations (and at the end)
    eval_iters=20,               # batches per estimate (a fixed set, so estimates are comparable)
    log_interval=10,             # print and log the training loss every this many iterations
    always_save_checkpoint=True,  # save after every eval; false: only when val loss improves
    init_from='scratch',         # scratch, or resume from out_dir/ckpt.pt
    overwrite=False,             # from scratch into an out_dir that holds ckpt.pt: delete it (else refuse)
    # system
    device='auto',               # auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps
    dtype='auto',                # auto (bfloat16 where the GPU or CPU computes in it, else float16 on a GPU, float32)
    compile=False,               # torch.compile the model (the owt presets do)
    seed=1337,                   # model init, the batches and the eval set follow from it
)

# What options.parse lets through, beside a finite number of the default's type.
RANGES = dict(positive=('block_size', 'batch_size', 'gradient_accumulation_steps', 'n_layer', 'n_head', 'n_embd',
                        'eval_interval', 'eval_iters', 'log_interval', 'learning_rate', 'max_iters'),
              nonnegative=('warmup_iters', 'lr_decay_iters', 'seed', 'weight_decay', 'grad_clip', 'min_lr'),
              fraction=('dropout', 'beta1', 'beta2'), nonempty=('out_dir', 'dataset', 'data_dir'))


_shape = lambda name: {k: getattr(tost.preset(name), k) for k in ('n_layer', 'n_head', 'n_embd')}   # a tost preset's

# The paper's recipe: 480 x 1024 tokens per step = 12 x 1024 x 40 micro-steps
# (which divides among 1, 2, 4, 5 or 8 GPUs); lr 6e-4 -> 6e-5, 2000 warmup, cosine to 600k, bf16.
_OWT = dict(dataset='openwebtext', block_size=1024, batch_size=12, gradient_accumulation_steps=40,
            learning_rate=6e-4, min_lr=6e-5, warmup_iters=2000, max_iters=600_000, lr_decay_iters=600_000,
            weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=1.0, eval_interval=2000, eval_iters=200,
            log_interval=10, always_save_checkpoint=True, compile=True)

PRESETS = {
    'demo': {},  # the defaults above
    # tiny shakespeare with GPT-2 BPE (~300k tokens): a few minutes on one GPU; it overfits, watch val loss
    'shakespeare': dict(dataset='shakespeare', out_dir='out-shakespeare', block_size=256, batch_size=32,
                        n_layer=6, n_head=6, n_embd=384, dropout=0.2, learning_rate=1e-3, min_lr=1e-4,
                        max_iters=3000, lr_decay_iters=3000, warmup_iters=100, beta2=0.99, eval_interval=250,
                        eval_iters=100, log_interval=10, always_save_checkpoint=False),
    'owt-base': dict(_OWT, out_dir='out-owt-base', weight_decay=0.01, **_shape('tost-base')),   # 110M
    'owt-medium': dict(_OWT, out_dir='out-owt-medium', **_shape('tost-medium')),                # 304M
    # 655M: half the micro-batch, twice the micro-steps (80 divides among 1, 2, 4, 5, 8, 16 GPUs)
    'owt-large': dict(_OWT, out_dir='out-owt-large', batch_size=6, gradient_accumulation_steps=80,
                      **_shape('tost-large')),
}

# datasets cheap enough to prepare on the fly; the others are a separate step (openwebtext takes hours)
PREPARE_ON_THE_FLY = ('python_stdlib', 'shakespeare')
MODEL_KEYS = ('n_layer', 'n_head', 'n_embd', 'bias', 'attn', 'token_shift', 'softmax_layers')  # fixed on resume
MACHINE_KEYS = ('device', 'compile', 'out_dir', 'init_from', 'overwrite')  # on resume: this command line's

# -----------------------------------------------------------------------------
# the model's config, and the run's on resume


def gpt_config(args):
    """tost.GPTConfig(**args), softmax_layers given as text ('-1', '0,3') or a list; tost checks the shape."""
    text = args['softmax_layers']
    try:
        if isinstance(text, str):
            args = dict(args, softmax_layers=[int(i) for i in text.split(',') if i.strip()])
        return tost.GPTConfig(**args)
    except (TypeError, ValueError) as e:
        raise UsageError(f"--softmax_layers expects block indices separated by commas (-1 or 0,3), got {text!r}"
                         if 'int()' in str(e) else str(e)) from None


def resume_config(cfg, set_keys, ckpt):
    """The run goes on as it was: the checkpoint's config, then what this command line set. The model's
    shape cannot change; device, compile and out_dir are this machine's business (dtype is the run's: auto
    chooses again here)."""
    old, args = ckpt['config'], ckpt['model_args']
    for key in set(MODEL_KEYS) & set_keys:
        had, want = args.get(key, DEFAULTS[key]), cfg[key]            # older checkpoints lack the newer keys
        if key == 'softmax_layers':                                   # -1 and 3 name one block of 4
            had, want = list(had), list(gpt_config(dict(args, softmax_layers=want)).softmax_layers)
        if want != had:
            raise UsageError(f"--{key}={cfg[key]} does not match the checkpoint's model ({key}={had}); "
                             f"the model's shape is fixed on resume")
    if cfg['block_size'] > args['block_size'] and 'block_size' in set_keys:
        raise UsageError(f"--block_size={cfg['block_size']} is larger than the checkpoint's model allows "
                         f"({args['block_size']}: its position embedding has that many rows)")
    merged = {k: cfg[k] if k in set_keys or k in MACHINE_KEYS or k not in old else old[k] for k in cfg}
    return dict(merged, config=old.get('config', cfg['config'])), set_keys | set(ckpt.get('set_keys', ()))

# -----------------------------------------------------------------------------
# data: random windows of the token files, drawn from generators seeded by (seed, stream, index)


def open_dataset(cfg, dist, model_meta=None):
    """The dataset folder, its meta.json (checked to share the tokenizer of `model_meta`, a checkpoint's) and its
    splits' sizes in tokens. A cheap dataset is prepared here first: local rank 0 prepares, and every rank meets
    at the same barrier."""
    path = os.path.join(cfg['data_dir'], cfg['dataset'])
    if cfg['dataset'] in PREPARE_ON_THE_FLY:
        if dist.local_rank == 0 and not os.path.exists(os.path.join(path, 'meta.json')) and \
                not os.path.isfile(cfg['data_dir']):               # a file: load_meta says so below
            import prepare_data
            prepare_data.prepare(cfg['dataset'], data_dir=cfg['data_dir'])
        if dist.ddp:
            torch.distributed.barrier()
    meta = readers.load_meta(path, 'text', model_meta)
    sizes = {split: len(readers.read_tokens(path, meta, split)) for split in ('train', 'val')}
    for split, n in sizes.items():
        if n <= cfg['block_size']:
            raise UsageError(f"block_size {cfg['block_size']} is larger than the data: {path} has {n} {split} "
                             f"tokens (need at least block_size + 1); use a smaller --block_size or more data")
    return path, meta, sizes


def window_starts(seed, stream, index, count, n_tokens, block_size):
    """`count` random window starts in a split of n_tokens, from a generator seeded by (seed, stream, index).
    Streams: 0 the training batches (index = iteration), 1 and 2 the fixed train / val eval batches."""
    rng = np.random.default_rng([seed, stream, index])
    return rng.integers(0, n_tokens - block_size, size=count)   # the target window ends at start + block_size


def read_batch(path, split, starts, block_size, device):
    """Inputs x and targets y (shifted by one), (B, T) int64 each, on `device`."""
    data = np.memmap(os.path.join(path, f'{split}.bin'), dtype=np.uint16, mode='r')  # fresh: no leak (nanoGPT)
    x = torch.from_numpy(np.stack([data[i:i + block_size] for i in starts]).astype(np.int64))
    y = torch.from_numpy(np.stack([data[i + 1:i + 1 + block_size] for i in starts]).astype(np.int64))
    if device.startswith('cuda'):  # CUDA only: pinned memory, so the copy runs while the GPU works
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def split_accumulation(steps, world_size):
    """(per process, in total): the micro-steps rounded up to a multiple of the process count (the same on each)."""
    per_process = -(-steps // world_size)
    return per_process, per_process * world_size


@torch.no_grad()
def estimate_loss(model, path, sizes, cfg, ctx, dist):
    """Mean loss over a fixed set of eval_iters batches per split, shared out among the processes."""
    out, device = {}, dist.device
    model.eval()
    for split, stream in (('train', 1), ('val', 2)):
        total = torch.zeros((), device=device, dtype=sum_dtype(device))
        for k in range(dist.rank, cfg['eval_iters'], dist.world_size):
            starts = window_starts(cfg['seed'], stream, k, cfg['batch_size'], sizes[split], cfg['block_size'])
            X, Y = read_batch(path, split, starts, cfg['block_size'], device)
            with ctx:
                total += model(X, Y)[1].to(total.dtype)
        if dist.ddp:
            torch.distributed.all_reduce(total)
        out[split] = total.item() / cfg['eval_iters']
    model.train()
    return out

# -----------------------------------------------------------------------------
# MFU: the GPU's peak FLOP/s for this run's dtype, by the whole name torch.cuda.get_device_name() gives

_tensor_core = lambda half: dict(bfloat16=half, float16=half, float32=half / 2)   # Ampere on: TF32 at half the rate
# Dense (no sparsity) tensor-core figures from NVIDIA's datasheets, matched against the whole device name: a
# substring would give the L40 the L4's figure and an H100 PCIe the SXM's. A GPU not listed gets no MFU rather
# than a guess: among them the A10G (NVIDIA publishes no figure for it), the H800 and the Blackwell GPUs.
PEAK_FLOPS = [
    (r'NVIDIA H100 \d+GB HBM3', _tensor_core(989e12)),           # SXM5
    (r'NVIDIA H100 PCIe', _tensor_core(756e12)),
    (r'NVIDIA H100 NVL', _tensor_core(835e12)),
    (r'NVIDIA H200', _tensor_core(989e12)),                      # SXM
    (r'NVIDIA H200 NVL', _tensor_core(835e12)),
    (r'NVIDIA GH200 .*', _tensor_core(989e12)),                  # 480GB, 144G HBM3e, ...: an H100's cores
    (r'NVIDIA A100[- ].*', _tensor_core(312e12)),                 # SXM4 and PCIe, 40 and 80 GB
    (r'NVIDIA A10', _tensor_core(125e12)),
    (r'NVIDIA L40S', _tensor_core(362e12)),
    (r'NVIDIA L40', _tensor_core(181e12)),
    (r'NVIDIA L4', _tensor_core(121e12)),
    (r'NVIDIA GeForce RTX 4090', _tensor_core(165e12)),          # with float32 accumulation, as torch uses
    # before Ampere: float16 tensor cores, no bfloat16 (emulated, no figure) and no TF32
    (r'Tesla V100-SXM2-\d+GB', dict(float16=125e12, float32=15.7e12)),
    (r'Tesla V100-PCIE-\d+GB', dict(float16=112e12, float32=14e12)),
    (r'Tesla T4', dict(float16=65e12, float32=8.1e12)),
]


def peak_flops(device, dtype):
    """The GPU's peak for `dtype`, or None (no MFU on a CPU, on MPS, or on a GPU not in the table)."""
    if not device.startswith('cuda'):
        return None
    name = torch.cuda.get_device_name(device).strip()
    return next((p for pattern, p in PEAK_FLOPS if re.fullmatch(pattern, name)), {}).get(dtype)

# -----------------------------------------------------------------------------
# the run


def train(cfg, set_keys, dist):
    say = (lambda *a: print(*a, flush=True)) if dist.master else (lambda *a: None)   # rank 0 talks for all
    device, ckpt_path, ckpt = dist.device, os.path.join(cfg['out_dir'], 'ckpt.pt'), None
    if cfg['init_from'] == 'resume':
        ckpt = load_checkpoint(ckpt_path, device, 'gpt', needs=('model', 'optimizer', 'iter_num', 'config', 'meta'))
        cfg, set_keys = resume_config(cfg, set_keys, ckpt)
    check_lr(cfg)
    if cfg['compile'] and cfg['attn'] == 'tssa':
        check_compile(device)
    dtype, why = resolve_dtype(cfg['dtype'], device, dist.master)
    data_path, meta, sizes = open_dataset(cfg, dist, ckpt and ckpt['meta'])
    make_out_dir(cfg['out_dir'], [ckpt_path], cfg['overwrite'], ckpt is None, dist.master)
    accum, accum_total = split_accumulation(cfg['gradient_accumulation_steps'], dist.world_size)
    B, T, seed, max_iters = cfg['batch_size'], cfg['block_size'], cfg['seed'], cfg['max_iters']
    tokens_per_iter = accum_total * B * T

    # the model and the optimizer: fresh, or as the checkpoint left them
    torch.manual_seed(seed)                                        # every process starts from the same weights
    if ckpt is None:
        vocab = 64 * math.ceil(meta['vocab_size'] / 64)            # bytes 256; gpt2's 50257 -> 50304, faster matmuls
        model_args = dict(block_size=T, vocab_size=vocab, dropout=cfg['dropout'], **{k: cfg[k] for k in MODEL_KEYS})
        iter_num, best_val_loss, elapsed, tokens = 0, float('inf'), 0.0, 0
    else:
        model_args = dict(ckpt['model_args'], dropout=cfg['dropout'])
        iter_num, best_val_loss = ckpt['iter_num'], ckpt.get('best_val_loss', float('inf'))
        elapsed, tokens = ckpt.get('elapsed_s', 0.0), ckpt.get('tokens', ckpt['iter_num'] * tokens_per_iter)
    if iter_num >= max_iters:
        return say(f"nothing to do: {ckpt_path} is at iter {iter_num} and --max_iters is {max_iters}; pass a larger "
                   f"--max_iters to train on")
    raw_model = tost.GPT(gpt_config(model_args))
    model_args['softmax_layers'] = list(raw_model.config.softmax_layers)   # '-1' of 4 blocks is [3]
    if ckpt:
        load_weights(raw_model, ckpt, ckpt_path)
        del ckpt['model']                                          # the model holds them: no second copy kept
    optimizer, scaler, params = optimizer_for(raw_model.to(device), cfg, dtype, ckpt)
    model, ctx, peak = wrap(raw_model, dist, cfg['compile']), autocast(device, dtype), peak_flops(device, dtype)
    lr_at = lambda it: cosine_lr(it, cfg['learning_rate'], cfg['min_lr'], cfg['warmup_iters'], cfg['lr_decay_iters'])

    m = model_args
    hybrid = f" (softmax in block {', '.join(map(str, m['softmax_layers']))})" if m['softmax_layers'] else ''
    say(f"model: {raw_model.get_num_params() / 1e6:.2f}M params, attn={m['attn']}{hybrid}"
        f"{' + token shift' if m['token_shift'] else ''}, {m['n_layer']} layers x {m['n_head']} heads x {m['n_embd']}, "
        f"vocab {m['vocab_size']}, context {T}")
    say(f"data: {data_path}, {sizes['train']:,} train + {sizes['val']:,} val tokens ({meta['tokenizer']})")
    if accum_total != cfg['gradient_accumulation_steps']:
        say(f"note: gradient_accumulation_steps={cfg['gradient_accumulation_steps']} rounded up to {accum_total}, a "
            f"multiple of the {dist.world_size} processes: {tokens_per_iter:,} tokens per iter")
    say(f"tokens per iter: {tokens_per_iter:,} = {dist.world_size} process(es) x {accum} micro-steps x {B} x {T}; "
        f"device {device}, {dtype} ({why}), compile {cfg['compile']}")
    if ckpt:
        say(f"resuming from {ckpt_path} at iter {iter_num} (best val loss {best_val_loss:.4f})")
    if max_iters > cfg['lr_decay_iters']:
        say(f"note: the schedule decays to min_lr at iter {cfg['lr_decay_iters']} and stays there; set "
            f"--lr_decay_iters to stretch it")
    if cfg['warmup_iters'] >= max_iters:
        say(f"note: the warmup ({cfg['warmup_iters']} iters) is as long as the run: the learning rate never reaches "
            f"--learning_rate; set --warmup_iters lower")

    run = Run(cfg['out_dir'], None if ckpt is None else iter_num, 'iter', dist,   # the log's later rows: redone
              resume_command('train_gpt.py', cfg, set_keys, DEFAULTS))
    start_iter, t_start, val_loss, tok_per_s = iter_num, time.time(), None, None
    elapsed_s = lambda: round(elapsed + time.time() - t_start, 2)   # the runs it resumed included
    state = lambda val=None: dict(model=raw_model.state_dict(), optimizer=optimizer.state_dict(),
                                  scaler=scaler.state_dict(), model_args=model_args, iter_num=iter_num,
                                  best_val_loss=best_val_loss, val_loss=val, config=cfg, set_keys=sorted(set_keys),
                                  meta=meta, elapsed_s=elapsed_s(), tokens=tokens)
    loss_sum, since_row, t_row = torch.zeros((), device=device), 0, time.time()
    run.record({'kind': 'config', **cfg, **model_args, 'dtype': dtype, 'tokens_per_iter': tokens_per_iter,
                'params': raw_model.get_num_params()})             # what this run is: the dtype it uses, auto resolved
    try:
        with run:
            while True:
                # evaluate (and save) every eval_interval iterations and at the end, not again right after a resume
                if (iter_num % cfg['eval_interval'] == 0 or iter_num == max_iters) and iter_num != run.saved:
                    t_eval, losses = time.time(), estimate_loss(model, data_path, sizes, cfg, ctx, dist)
                    val_loss, row = losses['val'], dict(iter=iter_num, kind='eval', train_loss=losses['train'],
                                                        val_loss=losses['val'], lr=lr_at(iter_num),
                                                        tokens_per_sec=tok_per_s, saved=False, tokens=tokens,
                                                        elapsed_s=elapsed_s())
                    if not (math.isfinite(val_loss) and math.isfinite(losses['train'])):
                        raise run.diverged('eval loss', val_loss, iter_num)
                    if val_loss < best_val_loss or cfg['always_save_checkpoint']:
                        best_val_loss = min(best_val_loss, val_loss)
                        if iter_num > 0:
                            run.save(state(val_loss), iter_num)
                            row['saved'] = True
                    run.record(row, f"iter {iter_num}: train loss {losses['train']:.4f}, val loss {val_loss:.4f}"
                                    f"{', saved' if row['saved'] else ''}")
                    run.draw()
                    t_row += time.time() - t_eval                  # evaluation is not training time
                if iter_num >= max_iters:
                    break
                if run.requested():              # Ctrl-C or SIGTERM on any rank: all stop here, at the same step
                    kept = run.saved is not None and not cfg['always_save_checkpoint'] and \
                        "always_save_checkpoint=False keeps the best model so far"
                    raise run.interrupted(iter_num, f"iter {iter_num}", state, math.isfinite(loss_sum.item()), kept)
                # one optimizer step: accum micro-steps on each process, DDP averages the gradients on the last
                lr = lr_at(iter_num)
                for group in optimizer.param_groups:
                    group['lr'] = lr
                starts, step_loss = window_starts(seed, 0, iter_num, accum_total * B, sizes['train'], T), 0.0
                for micro in range(accum):
                    g = dist.rank * accum + micro          # the global micro-step: rows g*B .. g*B+B-1 of the batch
                    torch.manual_seed(seed_of(seed, iter_num, g))      # dropout: the same on any process count
                    X, Y = read_batch(data_path, 'train', starts[g * B:g * B + B], T, device)
                    sync = not dist.ddp or micro == accum - 1          # no all-reduce until the last micro-step
                    with contextlib.nullcontext() if sync else model.no_sync():
                        with ctx:
                            loss = model(X, Y)[1] / accum   # nothing else of the forward is kept (the logits go)
                        scaler.scale(loss).backward()
                    step_loss = step_loss + loss.detach()
                if cfg['grad_clip'] > 0:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(params, cfg['grad_clip'])
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                iter_num, tokens, since_row, loss_sum = iter_num + 1, tokens + tokens_per_iter, since_row + 1, \
                    loss_sum + step_loss
                # a log row: the mean loss since the last one (reading it waits for the device, so only here)
                if iter_num % cfg['log_interval'] == 0 or iter_num == max_iters:
                    if not math.isfinite(train_loss := mean_loss(loss_sum, since_row, dist)):
                        raise run.diverged('training loss', train_loss, iter_num)   # the one on disk is fine
                    dt = (time.time() - t_row) / since_row
                    tok_per_s, mfu = tokens_per_iter / dt, peak and raw_model.estimate_mfu(B * accum, dt, T=T,
                                                                                           peak_flops=peak)
                    run.record(dict(iter=iter_num, kind='train', train_loss=train_loss, lr=lr, tokens_per_sec=tok_per_s,
                                    ms_per_iter=1000 * dt, mfu=mfu, tokens=tokens, elapsed_s=elapsed_s()),
                               f"iter {iter_num}: loss {train_loss:.4f}, lr {lr:.1e}, {tok_per_s:,.0f} tok/s, "
                               f"{1000 * dt:.1f} ms/iter{f', mfu {100 * mfu:.1f}%' if mfu else ''}, "
                               f"eta {human((max_iters - iter_num) * dt)}")
                    loss_sum, since_row, t_row = torch.zeros((), device=device), 0, time.time()
    except (KeyboardInterrupt, RuntimeError) as e:  # a second Ctrl-C: out at once, without saving; out of memory
        raise run.stopped(e, iter_num, f"with batch_size={B}, block_size={T} on {device}; try --batch_size="
                                         f"{max(1, B // 2)} --gradient_accumulation_steps={2 * accum_total} (the "
                                         f"same tokens per step, half the memory)") from None
    where = 'no checkpoint saved' if run.saved is None else f"{ckpt_path} is from iter {run.saved}"
    say(f"done: {iter_num - start_iter} iters in {human(time.time() - t_start)}, at iter {iter_num}; val loss "
        f"{val_loss:.4f}; {where}")
    if run.saved is not None:
        say(f"sample from it: python sample.py{'' if cfg['out_dir'] == 'out' else ' --out_dir=' + cfg['out_dir']}")
    return dict(iter_num=iter_num, val_loss=val_loss, best_val_loss=best_val_loss)


def main(argv=None):
    cfg, set_keys = parse(sys.argv[1:] if argv is None else argv, DEFAULTS, __doc__, __file__, PRESETS, ranges=RANGES)
    if cfg['init_from'] not in ('scratch', 'resume'):
        raise UsageError(f"--init_from expects scratch or resume, got {cfg['init_from']!r}")
    if cfg['init_from'] == 'scratch':                    # the shape, before any work (a resume's: its checkpoint's)
        gpt_config(dict(block_size=cfg['block_size'], **{k: cfg[k] for k in MODEL_KEYS}))
    return launch(train, cfg, set_keys)


if __name__ == '__main__':
    main()
