"""
Train a ToST language model: nanoGPT's train.py with causal TSSA in place of softmax attention. The demo
needs nothing but this repo: it prepares the offline corpus (this Python's standard library source) if it is
missing, trains a 0.7M-parameter model on 4M bytes, saves out/ckpt.pt and says how to sample from it.

    python train_gpt.py                                   # the demo (same as --config=demo)
    python train_gpt.py --attn=softmax --out_dir=out-softmax   # the GPT-2 baseline, everything else equal
    python train_gpt.py --softmax_layers=-1 --token_shift=true --out_dir=out-hybrid   # last block softmax
    python train_gpt.py --init_from=resume --max_iters=2000 --lr_decay_iters=2000   # the run in out/, longer
    python train_gpt.py --init_from=out/ckpt.pt --dataset=notes --out_dir=out-tuned   # fine-tune it on notes
    python train_gpt.py --config=shakespeare              # tiny shakespeare, gpt2 BPE (a GPU; the network)
    torchrun --standalone --nproc_per_node=8 train_gpt.py --config=owt-base   # the paper's (docs/training.md)

A new run refuses an out_dir that holds a checkpoint (--init_from=resume, another --out_dir, or
--overwrite=true). Ctrl-C or SIGTERM saves the last step it completed and prints the resume command; a
second Ctrl-C stops without saving.
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
import tost_fast
from options import UsageError, check_config, fail, parse, say
from train_common import (DTYPES, any_rank, autocast, backward_bytes, check_compile, check_decay, check_fits,
                          command, cosine_lr, diverged, draw_loss, human, init_path, last_good,
                          load_checkpoint, load_weights, log_row, make_out_dir, mean_loss, memory_bytes,
                          on_meta, optimizer_for, optimizer_step, resolve_dtype, resume_command,
                          save_checkpoint, seed_of, setup_distributed, start_log, stop_signals, sum_dtype,
                          teardown, wrap)

DEFAULTS = dict(
    config='demo',               # the preset this run started from (--config=NAME picks one)
    # data
    dataset='python_stdlib',     # a folder under data_dir written by prepare_data.py
    data_dir='data',             # where prepare_data.py puts datasets
    block_size=256,              # context length in tokens
    batch_size=16,               # sequences per micro-step, per process
    gradient_accumulation_steps=1,  # micro-steps a step over all processes (rounded up to a multiple of them)
    # model (tost.GPT); the vocabulary comes from the data: 256 for bytes, 50304 for gpt2
    n_layer=4,                   # blocks
    n_head=4,                    # heads (TSSA's groups K)
    n_embd=128,                  # width d
    dropout=0.0,                 # pretraining: 0; finetuning: try 0.1+ (a GPU then skips the Triton core)
    bias=False,                  # biases in Linear and LayerNorm
    attn='tssa',                 # tssa (ToST) or softmax (GPT-2's attention), all else equal
    token_shift=False,           # not in the paper: mix each token with the previous one before attention
    softmax_layers='',           # not in the paper: blocks given softmax attention, e.g. -1 (the last) or 0,3
    # AdamW, linear warmup then cosine decay; the schedule does not follow max_iters: set them together
    learning_rate=6e-3,          # peak learning rate (high, for a small model and a short run)
    max_iters=1000,              # optimizer steps in total
    min_lr_ratio=0.1,            # the cosine ends at learning_rate x this (nanoGPT's 1/10; 1: no decay)
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
    init_from='scratch',         # scratch, resume (out_dir/ckpt.pt), or a checkpoint: a new run from it
    overwrite=False,             # from scratch where out_dir holds ckpt.pt: delete it, a new log (or refuse)
    # system
    device='auto',               # auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps
    dtype='auto',                # auto: bfloat16 where the GPU or CPU computes in it, else float16 or float32
    compile=False,               # torch.compile the model (the owt presets do)
    seed=1337,                   # model init, the batches and the eval set follow from it
)

# The range of each number beside its type (options.parse refuses what is outside, and any number not finite).
RANGES = dict(positive=('block_size', 'batch_size', 'gradient_accumulation_steps', 'n_layer', 'n_head',
                        'n_embd', 'eval_interval', 'eval_iters', 'log_interval', 'learning_rate',
                        'max_iters'),
              nonnegative=('warmup_iters', 'lr_decay_iters', 'weight_decay', 'grad_clip'),
              fraction=('dropout', 'beta1', 'beta2'),
              ratio=('min_lr_ratio',),
              nonempty=('out_dir', 'dataset', 'data_dir', 'init_from'),
              seed=('seed',))

CHOICES = dict(attn=tost.ATTN_KINDS, dtype=DTYPES)


# The paper's recipe: 480 x 1024 tokens per step = 12 x 1024 x 40 micro-steps (which divides among 1, 2, 4, 5
# or 8 GPUs); lr 6e-4 -> 6e-5 (min_lr_ratio's 1/10), 2000 warmup, cosine to 600k, bf16.
_OWT = dict(dataset='openwebtext', block_size=1024, batch_size=12, gradient_accumulation_steps=40,
            learning_rate=6e-4, warmup_iters=2000, max_iters=600_000, lr_decay_iters=600_000,
            weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=1.0, eval_interval=2000, eval_iters=200,
            compile=True)

PRESETS = {
    'demo': {},  # the defaults above
    # tiny shakespeare with GPT-2 BPE (~300k tokens): a few minutes on one GPU; it overfits, watch val loss
    'shakespeare': dict(dataset='shakespeare', out_dir='out-shakespeare', batch_size=32, n_layer=6, n_head=6,
                        n_embd=384, dropout=0.2, learning_rate=1e-3, max_iters=3000, lr_decay_iters=3000,
                        warmup_iters=100, beta2=0.99, eval_iters=100, always_save_checkpoint=False),
    # the shapes of tost.preset('tost-base'), 'tost-medium' and 'tost-large': 110M, 304M, 655M parameters
    'owt-base': dict(_OWT, out_dir='out-owt-base', weight_decay=0.01, n_layer=12, n_head=12, n_embd=768),
    'owt-medium': dict(_OWT, out_dir='out-owt-medium', n_layer=24, n_head=16, n_embd=1024),
    # 655M: half the micro-batch, twice the micro-steps (80 divides among 1, 2, 4, 5, 8, 16 GPUs)
    'owt-large': dict(_OWT, out_dir='out-owt-large', batch_size=6, gradient_accumulation_steps=80,
                      n_layer=36, n_head=20, n_embd=1280),
}

# datasets cheap enough to prepare on the fly; the others are a separate step (openwebtext takes hours)
PREPARE_ON_THE_FLY = ('python_stdlib', 'shakespeare')
# the model's shape: fixed on resume
MODEL_KEYS = ('n_layer', 'n_head', 'n_embd', 'bias', 'attn', 'token_shift', 'softmax_layers')
# on resume, this command line's, not the checkpoint's
MACHINE_KEYS = ('device', 'compile', 'out_dir', 'init_from', 'overwrite')

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
        if 'int()' in str(e):
            raise UsageError(f"--softmax_layers expects block indices separated by commas (-1 or 0,3), got "
                             f"{text!r}") from None
        raise UsageError(str(e)) from None


def resume_config(cfg, set_keys, ckpt):
    """The run goes on as it was: the checkpoint's config, then what this command line set. The model's shape
    cannot change; device, compile and out_dir are this machine's business (dtype is the run's: auto chooses
    again here)."""
    args = ckpt['model_args']
    for key in [k for k in MODEL_KEYS if k in set_keys]:
        # Older checkpoints lack the newer keys; -1 and 3 name one block of 4.
        had = args.get(key, DEFAULTS[key])
        want = cfg[key]
        if key == 'softmax_layers':
            had = list(had)
            want = list(gpt_config(dict(args, softmax_layers=want)).softmax_layers)
        if want != had:
            # A preset's key was not typed: the preset is named.
            preset = f" (of --config={cfg['config']})" if key in PRESETS.get(cfg['config'], {}) else ''
            raise UsageError(f"--{key}={cfg[key]}{preset} does not match the checkpoint's model "
                             f"({key}={had}); the model's shape is its checkpoint's")
    if cfg['block_size'] > args['block_size'] and 'block_size' in set_keys:
        raise UsageError(f"--block_size={cfg['block_size']} is larger than the checkpoint's model allows "
                         f"({args['block_size']}: its position embedding has that many rows)")
    # A key the checkpoint's config lacks (an older run's) takes this command line's value.
    old = ckpt['config']
    return {k: cfg[k] if k in set_keys or k in MACHINE_KEYS or k not in old else old[k] for k in cfg}

# -----------------------------------------------------------------------------
# data: random windows of the token files, drawn from generators seeded by (seed, stream, index)


def open_dataset(cfg, dist, model_meta=None):
    """The dataset folder, its meta.json (checked to share the tokenizer of `model_meta`, a checkpoint's) and
    its splits' sizes in tokens. A cheap dataset is prepared here first: local rank 0 prepares, and every rank
    meets at the same barrier."""
    path = readers.dataset_folder(cfg['data_dir'], cfg['dataset'])
    if cfg['dataset'] in PREPARE_ON_THE_FLY:
        if dist.local_rank == 0 and not os.path.exists(os.path.join(path, 'meta.json')):
            import prepare_data
            prepare_data.prepare(cfg['dataset'], data_dir=cfg['data_dir'])
        if dist.ddp:
            torch.distributed.barrier()
    meta = readers.load_meta(path, 'text', model_meta)
    sizes = {split: len(readers.read_tokens(path, meta, split)) for split in ('train', 'val')}
    # A window and its target need block_size + 1 tokens.
    for split, n in sizes.items():
        if n <= cfg['block_size']:
            # No tokens at all: a test set (lambada, wikitext2), which eval_gpt.py reads.
            way_out = "use a smaller --block_size or more data" if n else "it is for eval_gpt.py"
            raise UsageError(f"block_size {cfg['block_size']} is larger than the data: {path} has {n} "
                             f"{split} tokens (need at least block_size + 1); {way_out}")
    return path, meta, sizes


def window_starts(seed, stream, index, count, n_tokens, block_size):
    """`count` random window starts in a split of n_tokens, from a generator seeded by (seed, stream, index).
    Streams: 0 the training batches (index = iteration), 1 and 2 the fixed train / val eval batches."""
    return np.random.default_rng([seed, stream, index]).integers(0, n_tokens - block_size, size=count)


def read_batch(path, split, starts, block_size, device, meta):
    """Inputs x and targets y (shifted by one), (B, T) int64 each, on `device`: views of one window of T + 1
    tokens a row. A fresh memmap each time: no leak (nanoGPT)."""
    data = np.memmap(os.path.join(path, f'{split}.bin'), dtype=np.uint16, mode='r')
    rows = np.stack([data[i:i + block_size + 1] for i in starts])
    # Ids past the vocab (a damaged file) are one line here, not an IndexError inside the model.
    readers.check_ids(path, split, rows, meta)
    rows = torch.from_numpy(rows.astype(np.int64))
    # CUDA only: pinned memory, so that the copy runs while the GPU works.
    cuda = device.startswith('cuda')
    rows = (rows.pin_memory() if cuda else rows).to(device, non_blocking=cuda)
    return rows[:, :-1], rows[:, 1:]


@torch.no_grad()
def estimate_loss(model, path, meta, sizes, cfg, ctx, dist):
    """Mean loss over a fixed set of eval_iters batches per split, shared out among the processes."""
    out = {}
    model.eval()
    for split, stream in (('train', 1), ('val', 2)):
        total = torch.zeros((), device=dist.device, dtype=sum_dtype(dist.device))
        for k in range(dist.rank, cfg['eval_iters'], dist.world_size):
            starts = window_starts(cfg['seed'], stream, k, cfg['batch_size'], sizes[split], cfg['block_size'])
            X, Y = read_batch(path, split, starts, cfg['block_size'], dist.device, meta)
            with ctx:
                total += model(X, Y)[1].to(total.dtype)
        if dist.ddp:
            torch.distributed.all_reduce(total)
        out[split] = total.item() / cfg['eval_iters']
    model.train()
    return out

# -----------------------------------------------------------------------------
# MFU: the GPU's peak FLOP/s for this run's dtype, by the whole name torch.cuda.get_device_name() gives

# Dense (no sparsity) 16-bit tensor-core figures from NVIDIA's datasheets, Ampere on (float32 runs as TF32, at
# half the rate), matched against the whole device name: a substring would give the L40 the L4's figure and an
# H100 PCIe the SXM's. A GPU not listed gets no MFU rather than a guess: among them the A10G (NVIDIA publishes
# no figure for it), the H800, the Blackwell GPUs and those before Ampere.
PEAK_FLOPS = {
    r'NVIDIA H100 \d+GB HBM3': 989e12,          # SXM5
    r'NVIDIA H100 PCIe': 756e12,
    r'NVIDIA H100 NVL': 835e12,
    r'NVIDIA H200': 989e12,                     # SXM
    r'NVIDIA H200 NVL': 835e12,
    r'NVIDIA GH200 .*': 989e12,                 # 480GB, 144G HBM3e, ...: an H100's cores
    r'NVIDIA A100[- ].*': 312e12,               # SXM4 and PCIe, 40 and 80 GB
    r'NVIDIA A10': 125e12,
    r'NVIDIA L40S': 362e12,
    r'NVIDIA L40': 181e12,
    r'NVIDIA L4': 121e12,
    r'NVIDIA GeForce RTX 4090': 165e12,         # with float32 accumulation, as torch uses
}


def peak_flops(device, dtype):
    """The GPU's peak for `dtype`, or None (no MFU on a CPU, on MPS, or on a GPU not in the table)."""
    if not device.startswith('cuda'):
        return None
    name = torch.cuda.get_device_name(device).strip()
    for pattern, peak in PEAK_FLOPS.items():
        if re.fullmatch(pattern, name):
            return peak / 2 if dtype == 'float32' else peak
    return None


# -----------------------------------------------------------------------------
# the run, top to bottom


def main(argv=None):
    # options: the defaults, a preset, this command line; checked against RANGES as they are parsed
    cfg, set_keys = parse(argv, DEFAULTS, __doc__, __file__, PRESETS, torchrun=True, ranges=RANGES,
                          choices=CHOICES)
    init_from = cfg['init_from']
    fresh = init_from != 'resume'
    # A new model's shape is checked before any work (a checkpoint's is its own).
    model_args = {k: cfg[k] for k in MODEL_KEYS}
    if init_from == 'scratch':
        gpt_config(model_args)
    out_dir = cfg['out_dir']
    ckpt_path = os.path.join(out_dir, 'ckpt.pt')
    # A new run from another run's weights (fine-tuning): the checkpoint a path names.
    source = init_path(init_from, {'scratch': None, 'resume': None}, [ckpt_path])

    # processes (torchrun), the device, and on a resume the run as its checkpoint left it
    dist = setup_distributed(cfg['device'])
    master = dist.master
    device = dist.device
    ckpt = None
    lock = None
    # A resume locks the folder before it reads the checkpoint: another run may hold it, not saved yet.
    if not fresh and os.path.isdir(out_dir):
        lock = make_out_dir(out_dir, [ckpt_path], cfg['overwrite'], False, master)
    if source:
        # Its weights alone, read into the CPU's memory (not the moments of its AdamW onto the device).
        ckpt = load_checkpoint(source, 'cpu', 'gpt', needs=('model', 'config', 'meta'))
        ckpt.pop('optimizer', None)
    elif not fresh:
        ckpt = load_checkpoint(ckpt_path, device, 'gpt',
                               needs=('model', 'optimizer', 'iter_num', 'config', 'meta'))
    if ckpt:
        # A new run from the weights takes their model and context, and this command line's training; a
        # preset's shape gives way to theirs (--config=shakespeare fine-tunes a model of any shape).
        preset = set(PRESETS[cfg['config']]) if source else set()
        resumed = resume_config(cfg, set_keys - preset, ckpt)
        cfg = {**cfg, **{k: resumed[k] for k in (*MODEL_KEYS, 'block_size')}} if source else resumed
        check_config(cfg, DEFAULTS, RANGES, CHOICES, source or ckpt_path)
    if cfg['compile'] and cfg['attn'] == 'tssa':
        check_compile(device, cfg['dropout'])
    dtype, why = resolve_dtype(cfg['dtype'], device, master)
    check_decay(cfg)
    # the schedule: the cosine starts where the warmup ends, and cannot end before
    learning_rate = cfg['learning_rate']
    min_lr = learning_rate * cfg['min_lr_ratio']
    warmup_iters = cfg['warmup_iters']
    lr_decay_iters = cfg['lr_decay_iters']
    if lr_decay_iters < warmup_iters:
        raise UsageError(f"--lr_decay_iters={lr_decay_iters} ends the cosine before --warmup_iters="
                         f"{warmup_iters} ends the warmup; set --warmup_iters at most {lr_decay_iters}, or "
                         f"--lr_decay_iters at least {warmup_iters}")

    # data (a cheap dataset is prepared on the fly), then the output folder, held from here on (with
    # --overwrite, which deletes the folder's checkpoint, only once the run is known to fit in memory, below)
    data_path, meta, sizes = open_dataset(cfg, dist, ckpt and ckpt['meta'])
    if not cfg['overwrite']:
        lock = lock or make_out_dir(out_dir, [ckpt_path], False, fresh, master, 'gpt')
    B = cfg['batch_size']
    T = cfg['block_size']
    seed = cfg['seed']
    max_iters = cfg['max_iters']
    eval_interval = cfg['eval_interval']
    log_interval = cfg['log_interval']
    grad_clip = cfg['grad_clip']
    # Micro-steps a step on each process, the same on all: their total rounded up to a multiple of processes.
    accum = -(-cfg['gradient_accumulation_steps'] // dist.world_size)
    accum_total = accum * dist.world_size
    tokens_per_iter = accum_total * B * T

    # the model: fresh from the seed (the same weights on every process), or as the checkpoint left it
    torch.manual_seed(seed)
    # A fresh run starts at 0; a resumed one where its checkpoint left it (older checkpoints lack some keys).
    state = {} if fresh else ckpt
    iter_num = state.get('iter_num', 0)
    best_val_loss = state.get('best_val_loss', float('inf'))
    # A best val loss is of its val set: a resume on other data (another source, or split) has none to beat.
    if state and any(meta.get(k) != state['meta'].get(k) for k in ('source', 'val_tokens')):
        best_val_loss = float('inf')
    tokens = state.get('tokens', iter_num * tokens_per_iter)
    if ckpt:
        # Older checkpoints lack the newer keys (token_shift, softmax_layers): they had the defaults' model.
        model_args.update(ckpt['model_args'])
    else:
        # The vocabulary rounded up to a multiple of 64: bytes 256, gpt2's 50257 -> 50304, faster matmuls.
        model_args.update(block_size=T, vocab_size=64 * math.ceil(meta['vocab_size'] / 64))
    model_args['dropout'] = cfg['dropout']
    if iter_num >= max_iters:
        if master:
            say(f"nothing to do: {ckpt_path} is at iter {iter_num} and --max_iters is {max_iters}; pass a "
                f"larger --max_iters to train on")
        teardown(dist, lock)
        return None
    # The weights, their gradients and AdamW's two moments: 16 bytes a float32 parameter, counted on the meta
    # device (no memory taken) before the model is built. A model that alone needs more than the machine has
    # is refused (a CPU's operating system would kill the process without a word).
    have = memory_bytes(device)
    model_config = gpt_config(model_args)
    if ckpt:
        check_fits(tost.GPT, model_config, ckpt, source or ckpt_path)
    # A count from the config alone first, at most the model's (each block holds at least 10 d^2 weights: two
    # d x d matrices, the MLP's d x 4d pair): an absurd size is refused before hours of building it.
    n_params = 10 * model_config.n_embd ** 2 * model_config.n_layer
    if not have or 16 * n_params <= have:
        n_params = on_meta(tost.GPT, model_config).get_num_params(non_embedding=False)
    state_bytes = 16 * n_params
    if have and state_bytes > have:
        raise UsageError(f"a model of {n_params / 1e9:.3g}B parameters needs at least "
                         f"{state_bytes / 1e9:.3g} GB for its weights, gradients and AdamW's moments, more "
                         f"than the {have / 1e9:.3g} GB a process has of this {device}; try a smaller "
                         f"--n_layer or --n_embd")
    raw_model = tost.GPT(model_config)
    # '-1' of 4 blocks is [3].
    model_args['softmax_layers'] = list(raw_model.config.softmax_layers)
    if ckpt:
        load_weights(raw_model, ckpt, source or ckpt_path)

    # What a micro-step keeps for its backward, found before it is tried: with the model's state, more than
    # the machine has is refused too.
    ctx = autocast(device, dtype)
    need = backward_bytes(raw_model.to(device), B, T, ctx, fused=not cfg['compile'])
    if have and need + state_bytes > have:
        raise UsageError(f"a micro-step of {B} x {T} tokens keeps about {need / 1e9:.3g} GB for its "
                         f"backward, which with the model's {state_bytes / 1e9:.3g} GB is more than the "
                         f"{have / 1e9:.3g} GB a process has of this {device}; try a smaller --batch_size "
                         f"(more --gradient_accumulation_steps) or --block_size")
    # --overwrite's folder, now that the run fits
    lock = lock or make_out_dir(out_dir, [ckpt_path], cfg['overwrite'], fresh, master, 'gpt')

    # the optimizer (as the checkpoint left it), then DDP and the compiler around the model
    optimizer, scaler = optimizer_for(raw_model, cfg, dtype, None if fresh else ckpt)
    model = wrap(raw_model, dist, cfg['compile'])
    peak = peak_flops(device, dtype)

    # what this run is, said once by rank 0 (it talks for all)
    m = model_args
    hybrid = f" (softmax in block {str(m['softmax_layers'])[1:-1]})" if m['softmax_layers'] else ''
    shift = ' + token shift' if m['token_shift'] else ''
    # on a GPU, what causal TSSA trains on (the Triton core has no attention dropout)
    core = ''
    if device.startswith('cuda') and m['attn'] == 'tssa':
        triton = tost_fast.triton_on(torch.device(device)) and not cfg['dropout']
        core = ' on the Triton core' if triton else ' on its readable lines'
    if master:
        say(f"model: {raw_model.get_num_params() / 1e6:.2f}M params, attn={m['attn']}{core}{hybrid}{shift}, "
            f"{m['n_layer']} layers x {m['n_head']} heads x {m['n_embd']}, vocab {m['vocab_size']}, "
            f"context {T}")
        say(f"data: {data_path}, {sizes['train']:,} train + {sizes['val']:,} val tokens "
            f"({meta['tokenizer']})")
        # Rounded up to a multiple of the processes: not silently more tokens a step.
        rounded = ''
        if accum_total != cfg['gradient_accumulation_steps']:
            rounded = (f" (--gradient_accumulation_steps={cfg['gradient_accumulation_steps']} rounded up to "
                       f"{accum_total}, a multiple of the processes)")
        say(f"tokens per iter: {tokens_per_iter:,} = {dist.world_size} process(es) x {accum} micro-steps x "
            f"{B} x {T}{rounded}; device {device}, {dtype} ({why}), compile {cfg['compile']}")
        say(f"memory: about {need / 1e9:.3g} GB kept for the backward of a micro-step of {B} x {T} tokens, "
            f"{state_bytes / 1e9:.3g} GB for the weights, their gradients and AdamW's moments")
        if source:
            say(f"a new run from the weights of {source}")
        elif ckpt:
            say(f"resuming from {ckpt_path} at iter {iter_num} (best val loss {best_val_loss:.4f})")
        # The cosine does not follow --max_iters (nanoGPT's rule): said where the two differ.
        if max_iters != lr_decay_iters and cfg['min_lr_ratio'] < 1:
            say(f"note: the learning rate reaches its floor (--min_lr_ratio) at iter {lr_decay_iters} "
                f"(--lr_decay_iters), and the run ends at iter {max_iters}")

    # the log: a fresh run's is new; a resumed run's keeps its rows up to the checkpoint, the later are redone
    saved = None if fresh else iter_num
    if master:
        start_log(out_dir, 'iter', saved)
        log_row(out_dir, {'kind': 'config', **cfg, **model_args, 'dtype': dtype,
                          'tokens_per_iter': tokens_per_iter, 'params': raw_model.get_num_params()})
    drawing = True
    start_iter = iter_num
    t_start = time.time()
    # The run's start, moved back by the time its earlier processes trained: elapsed_s spans resumes.
    t_run = t_start - state.get('elapsed_s', 0.0)
    val_loss = None
    tok_per_s = None
    # The losses summed on the device since the last row: reading them waits for it, so only a row (or a save)
    # does. A resume starts from the checkpoint's, so that its first row is the unbroken run's.
    loss_sum = torch.tensor(state.get('loss_sum', 0.0), device=device)
    since_row = state.get('since_row', 0)
    # The steps timed since t_row: a row that spans a resume times only those after it.
    timed = 0
    t_row = t_start

    # `carried`: the losses since the last row, as their sum over all processes divided by their number: each
    # process of a resume, at any process count, starts from that, and the next row's all-reduce adds it up.
    def checkpoint(carried, val=None):
        return dict(model=raw_model.state_dict(), optimizer=optimizer.state_dict(),
                    scaler=scaler.state_dict(), model_args=model_args, iter_num=iter_num,
                    best_val_loss=best_val_loss, val_loss=val, since_row=since_row, loss_sum=carried,
                    config=cfg, meta=meta, tokens=tokens,
                    elapsed_s=round(time.time() - t_run, 2))

    # A loss that is not finite stops the run where every rank finds it (the losses are all-reduced); the
    # checkpoint on disk is from before, and is kept.
    def stop_if_diverged(what, loss):
        if not math.isfinite(loss):
            teardown(dist, lock)
            fail(diverged(what, loss, f'iter {iter_num}', last_good(ckpt_path, saved, 'iter'), cfg), 3)

    with stop_signals('micro-step', master) as signals:
        while True:
            lr = cosine_lr(iter_num, learning_rate, min_lr, warmup_iters, lr_decay_iters)
            # Evaluate (and save) every eval_interval iterations and at the end; not again right after a
            # resume.
            if (iter_num % eval_interval == 0 or iter_num == max_iters) and iter_num != saved:
                t_eval = time.time()
                losses = estimate_loss(model, data_path, meta, sizes, cfg, ctx, dist)
                val_loss = losses['val']
                # Losses are at least 0: the sum is finite only if both are, and else it is the nan or inf.
                stop_if_diverged('eval loss', losses['train'] + val_loss)
                # A loss since the last row that is not finite (a step float16's scaler skipped) is not saved:
                # the next row stops the run, and the checkpoint it names must resume.
                carried = mean_loss(loss_sum.clone(), 1, dist)
                finite = math.isfinite(carried)
                save = (val_loss < best_val_loss or cfg['always_save_checkpoint']) and iter_num > 0 and finite
                best_val_loss = min(best_val_loss, val_loss)
                # The row before the checkpoint: a run that dies between the two resumes from the checkpoint
                # before, which drops the row and evaluates again (the other way round, the row is lost).
                if master:
                    log_row(out_dir, dict(iter=iter_num, kind='eval', train_loss=losses['train'],
                                          val_loss=val_loss, lr=lr, tokens_per_sec=tok_per_s, saved=save,
                                          tokens=tokens, elapsed_s=round(time.time() - t_run, 2)))
                if save:
                    save_checkpoint(checkpoint(carried, val_loss), [ckpt_path], dist)
                    saved = iter_num
                if master:
                    say(f"iter {iter_num}: train loss {losses['train']:.4f}, val loss {val_loss:.4f}"
                        f"{', saved' if save else ''}")
                    drawing = drawing and draw_loss(out_dir)
                # Evaluation is not training time.
                t_row += time.time() - t_eval
            if iter_num >= max_iters:
                break

            # one optimizer step: accum micro-steps on each process, DDP averages the gradients on the last;
            # their losses join the sum once the step is taken
            starts = window_starts(seed, 0, iter_num, accum_total * B, sizes['train'], T)
            step_losses = []
            for micro in range(accum):
                # Ctrl-C or SIGTERM on any rank: every rank stops here, at the same micro-step, and drops the
                # step begun (a resume takes it again); rank 0 saves, unless the loss is not finite or the
                # checkpoint is the best model so far (always_save_checkpoint=False).
                if any_rank(bool(signals), dist):
                    carried = mean_loss(loss_sum.clone(), 1, dist)
                    finite = math.isfinite(carried)
                    keep_best = saved is not None and not cfg['always_save_checkpoint']
                    if finite and not keep_best and iter_num not in (0, saved):
                        save_checkpoint(checkpoint(carried), [ckpt_path], dist)
                        saved = iter_num
                    what = f"saved {ckpt_path}"
                    if saved != iter_num:
                        what = f"not saved; {last_good(ckpt_path, saved, 'iter')}"
                    if master:
                        print(f"interrupted ({signals[0] if signals else 'on another rank'}) at iter "
                              f"{iter_num}: {what}", file=sys.stderr)
                        if saved is not None and finite:
                            print(resume_command('train_gpt.py', cfg, set_keys, DEFAULTS), file=sys.stderr)
                    teardown(dist, lock)
                    sys.exit(130)
                # The global micro-step g takes rows g*B .. g*B+B-1 of the batch, and seeds dropout: the same
                # numbers on any process count.
                g = dist.rank * accum + micro
                torch.manual_seed(seed_of(seed, iter_num, g))
                X, Y = read_batch(data_path, 'train', starts[g * B:g * B + B], T, device, meta)
                # No all-reduce until the last micro-step.
                sync = not dist.ddp or micro == accum - 1
                with contextlib.nullcontext() if sync else model.no_sync():
                    # Nothing else of the forward is kept: the logits go before the backward.
                    with ctx:
                        loss = model(X, Y)[1] / accum
                    scaler.scale(loss).backward()
                step_losses.append(loss.detach())
            loss_sum += sum(step_losses)
            optimizer_step(optimizer, scaler, lr, grad_clip)
            iter_num += 1
            tokens += tokens_per_iter
            since_row += 1
            timed += 1

            # a log row: the mean loss since the last one, all-reduced
            if iter_num % log_interval == 0 or iter_num == max_iters:
                train_loss = mean_loss(loss_sum, since_row, dist)
                stop_if_diverged('training loss', train_loss)
                dt = (time.time() - t_row) / timed
                tok_per_s = tokens_per_iter / dt
                mfu = peak and raw_model.estimate_mfu(B * accum, dt, T=T, peak_flops=peak)
                if master:
                    log_row(out_dir, dict(iter=iter_num, kind='train', train_loss=train_loss, lr=lr,
                                          tokens_per_sec=tok_per_s, ms_per_iter=1000 * dt, mfu=mfu,
                                          tokens=tokens, elapsed_s=round(time.time() - t_run, 2)))
                    say(f"iter {iter_num}: loss {train_loss:.4f}, lr {lr:.1e}, {tok_per_s:,.0f} tok/s, "
                        f"{1000 * dt:.1f} ms/iter{f', mfu {100 * mfu:.1f}%' if mfu else ''}, "
                        f"eta {human((max_iters - iter_num) * dt)}")
                loss_sum.zero_()
                since_row = 0
                timed = 0
                t_row = time.time()

    if master:
        say(f"done: {iter_num - start_iter} iters in {human(time.time() - t_start)}, at iter {iter_num}; "
            f"val loss {val_loss:.4f}; {last_good(ckpt_path, saved, 'iter')}")
        if saved is not None:
            args = [] if out_dir == 'out' else [f'--out_dir={out_dir}']
            say("sample from it: " + command('sample.py', args))
    teardown(dist, lock)
    return dict(iter_num=iter_num, val_loss=val_loss, best_val_loss=best_val_loss)


if __name__ == '__main__':
    main()
