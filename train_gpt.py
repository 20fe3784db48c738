"""
Train a ToST language model: nanoGPT's train.py with causal TSSA in place of softmax attention.

The first command needs nothing but this repo: it prepares the offline corpus (this Python's standard
library source, 12 MB of bytes) if it is missing, trains a 0.7M-parameter model on 4M bytes, saves
out/ckpt.pt and prints the val loss and the command to sample from it (see the README for how long it
takes and what loss to expect).

    python train_gpt.py                                   # the demo (same as --config=demo)
    python sample.py                                      # then read what it writes
    python train_gpt.py --attn=softmax --out_dir=out-softmax   # the GPT-2 baseline, everything else equal
    python train_gpt.py --softmax_layers=-1 --token_shift=true --out_dir=out-hybrid   # last block softmax
    python train_gpt.py --init_from=resume --max_iters=2000 --lr_decay_iters=2000   # train the run in out/ longer
    python train_gpt.py --config=shakespeare              # tiny shakespeare, gpt2 BPE (for a GPU; needs network once)

A run from scratch refuses an out_dir that holds a checkpoint: add --init_from=resume to go on, or pass
another --out_dir, or --overwrite=true. Ctrl-C (or SIGTERM) saves a checkpoint at the current step and
prints the command that resumes it; a second Ctrl-C, a second later, stops at once without saving.

The paper's runs (OpenWebText, prepare it first with `python prepare_data.py openwebtext`), one node:

    torchrun --standalone --nproc_per_node=8 train_gpt.py --config=owt-base

Two nodes of 8 GPUs: the same command on both, node_rank 0 on the master (whose address both use):

    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=10.0.0.1 --master_port=29500 \\
        train_gpt.py --config=owt-base
    torchrun --nnodes=2 --node_rank=1 --nproc_per_node=8 --master_addr=10.0.0.1 --master_port=29500 \\
        train_gpt.py --config=owt-base
    (without InfiniBand, prefix both with NCCL_IB_DISABLE=1)

Progress goes to the terminal (a live table) and, one JSON object per log or eval step, to
<out_dir>/log.jsonl; <out_dir>/loss.png is redrawn at each evaluation.

Batches and processes: batch_size is sequences per micro-step per process; gradient_accumulation_steps is
micro-steps per optimizer step over all processes, rounded up to a multiple of their number (the run says
so). N processes compute what one does: the batch of an iteration is drawn from (seed, iteration), and
dropout is seeded per micro-step, so a resumed run also sees what an unbroken one would. docs/training.md
has the details.
"""
import math
import os
import re
import sys
import time

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import prepare_data
import tost
from options import UsageError, parse, run_main
from prepare_data import load_meta
from train_common import (GracefulStop, RunLog, Stop, atomic_save, autocast, check_out_dir, cosine_lr,
                          human_time, launch, load_checkpoint, make_grad_scaler, resolve_dtype, resume_command,
                          seed_everything, strip_compile_prefix, sum_dtype, train_step)

DEFAULTS = dict(
    config='demo',               # the preset this run started from (--config=NAME picks one)
    # data
    dataset='python_stdlib',     # a folder under data_dir written by prepare_data.py
    data_dir='data',             # where prepare_data.py puts datasets
    block_size=256,              # context length in tokens
    batch_size=16,               # sequences per micro-step, per process
    gradient_accumulation_steps=1,  # micro-steps per optimizer step over all processes (see above)
    # model (tost.GPT); the vocabulary comes from the data: 256 for bytes, 50304 for gpt2
    n_layer=4,                   # blocks
    n_head=4,                    # heads (TSSA's groups K)
    n_embd=128,                  # width d
    dropout=0.0,                 # for pretraining 0 is good; for finetuning try 0.1+
    bias=False,                  # biases in Linear and LayerNorm
    attn='tssa',                 # tssa (ToST) or softmax (GPT-2's attention), all else equal
    token_shift=False,           # not in the paper: mix each token with the previous one before attention
    softmax_layers='',           # not in the paper: blocks given softmax attention, e.g. -1 (the last) or 0,3
    # AdamW, linear warmup then cosine decay
    learning_rate=6e-3,          # peak learning rate (high, for a small model and a short run)
    max_iters=1000,              # optimizer steps in total
    min_lr=6e-4,                 # floor of the cosine; learning_rate / 10 unless set
    warmup_iters=50,             # linear warmup; max_iters / 20 unless set
    lr_decay_iters=1000,         # the cosine reaches min_lr here; max_iters unless set
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
    dtype='auto',                # auto (bfloat16 on GPUs that have it, else float16; float32 on cpu), or a name
    compile='auto',              # torch.compile the model: auto is on for cuda only, or true/false
    seed=1337,                   # model init, the batches and the eval set follow from it
)


def _shape(name):
    """n_layer, n_head, n_embd of one of tost.py's language presets."""
    c = tost.preset(name)
    return dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd)


# The paper's recipe: 480 x 1024 tokens per step = 12 x 1024 x 40 micro-steps
# (which divides among 1, 2, 4, 5 or 8 GPUs); lr 6e-4 -> 6e-5, 2000 warmup, cosine to 600k, bf16.
_OWT = dict(dataset='openwebtext', block_size=1024, batch_size=12, gradient_accumulation_steps=40,
            learning_rate=6e-4, min_lr=6e-5, warmup_iters=2000, max_iters=600_000, lr_decay_iters=600_000,
            weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=1.0, eval_interval=2000, eval_iters=200,
            log_interval=10, always_save_checkpoint=True)

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
MACHINE_KEYS = ('device', 'dtype', 'compile', 'out_dir', 'init_from', 'overwrite')  # on resume: this command line's

# -----------------------------------------------------------------------------
# config


def check_config(cfg, set_keys):
    """Fill in the keys that follow others unless set, and check values a type check cannot."""
    if 'min_lr' not in set_keys:
        cfg['min_lr'] = cfg['learning_rate'] / 10
    if 'warmup_iters' not in set_keys:
        cfg['warmup_iters'] = max(1, cfg['max_iters'] // 20)
    if 'lr_decay_iters' not in set_keys:
        cfg['lr_decay_iters'] = cfg['max_iters']
    compile_ = str(cfg['compile']).strip().lower()
    cfg['compile'] = {'1': 'true', 'yes': 'true', '0': 'false', 'no': 'false'}.get(compile_, compile_)
    if cfg['compile'] not in ('auto', 'true', 'false'):
        raise UsageError(f"--compile expects auto, true or false, got {compile_!r}")
    for key in ('block_size', 'batch_size', 'gradient_accumulation_steps', 'n_layer', 'n_head', 'n_embd',
                'eval_interval', 'eval_iters', 'log_interval'):
        if cfg[key] <= 0:
            raise UsageError(f"--{key} must be positive, got {cfg[key]}")
    for key in ('max_iters', 'warmup_iters', 'lr_decay_iters', 'seed', 'weight_decay', 'grad_clip', 'min_lr'):
        if cfg[key] < 0:
            raise UsageError(f"--{key} must be >= 0, got {cfg[key]}")
    if not cfg['learning_rate'] > 0:
        raise UsageError(f"--learning_rate must be positive, got {cfg['learning_rate']}")
    if not 0 <= cfg['dropout'] < 1:
        raise UsageError(f"--dropout must be in [0, 1), got {cfg['dropout']}")
    if cfg['init_from'] not in ('scratch', 'resume'):
        raise UsageError(f"--init_from expects scratch or resume, got {cfg['init_from']!r}")
    if cfg['attn'] not in tost.ATTN_KINDS:
        raise UsageError(f"--attn expects {' or '.join(tost.ATTN_KINDS)}, got {cfg['attn']!r}")
    if cfg['n_embd'] % cfg['n_head']:
        raise UsageError(f"--n_embd ({cfg['n_embd']}) must be a multiple of --n_head ({cfg['n_head']})")
    if cfg['softmax_layers'] and cfg['attn'] != 'tssa':
        raise UsageError("--softmax_layers makes chosen blocks of a ToST model softmax; with --attn=softmax "
                         "every block is already")
    if cfg['init_from'] == 'scratch':                         # on resume the checkpoint says how many blocks
        softmax_layers(cfg['softmax_layers'], cfg['n_layer'])
    return cfg


def softmax_layers(text, n):
    """--softmax_layers as the sorted indices of the blocks it names in a model of n blocks ('-1' of 4 is [3])."""
    try:
        layers = [int(i) for i in str(text).split(',') if i.strip()]
    except ValueError:
        raise UsageError(f"--softmax_layers expects block indices separated by commas (-1 or 0,3), got {text!r}") \
            from None
    if any(not -n <= i < n for i in layers):
        raise UsageError(f"--softmax_layers={text}: a model of {n} blocks numbers them {-n} to {n - 1}")
    return sorted({i % n for i in layers})


def resume_config(cfg, set_keys, ckpt, path):
    """On resume the run goes on as it was: the checkpoint's config, then what this command line set.
    The model's shape cannot change; device, dtype, compile and out_dir are this machine's business."""
    if ckpt.get('kind') == 'vit':
        raise UsageError(f"{path} is a vision checkpoint (train_vit.py), not a language model")
    missing = {'model', 'optimizer', 'model_args', 'iter_num', 'config', 'meta'} - set(ckpt)
    if missing:
        raise UsageError(f"{path} is not a train_gpt.py checkpoint (no {', '.join(sorted(missing))})")
    old, n = ckpt['config'], ckpt['model_args']['n_layer']
    for key in MODEL_KEYS:
        had = old.get(key, DEFAULTS[key])                     # older checkpoints lack newer keys
        same = cfg[key] == had if key != 'softmax_layers' else \
            softmax_layers(cfg[key], n) == softmax_layers(had, n)   # -1 and 3 name one block of 4
        if key in set_keys and not same:
            raise UsageError(f"--{key}={cfg[key]} does not match the checkpoint's model ({key}={had}); "
                             f"the model's shape is fixed on resume")
    merged = {k: (cfg[k] if k in set_keys or k in MACHINE_KEYS or k not in old else old[k]) for k in cfg}
    merged['config'] = old.get('config', cfg['config'])
    if merged['block_size'] > ckpt['model_args']['block_size']:
        raise UsageError(f"--block_size={merged['block_size']} is larger than the checkpoint's model allows "
                         f"({ckpt['model_args']['block_size']}: its position embedding has that many rows)")
    return merged, set_keys | set(ckpt.get('set_keys', ()))

# -----------------------------------------------------------------------------
# data: random windows of the token files, drawn from generators seeded by (seed, stream, index)


def open_dataset(cfg, dist):
    """The dataset folder, its meta.json and its split sizes in tokens; prepared here first if that is cheap.
    Every process calls the same collectives: the others wait while local rank 0 prepares."""
    path = os.path.join(cfg['data_dir'], cfg['dataset'])
    if cfg['dataset'] in PREPARE_ON_THE_FLY:
        if dist.local_rank == 0 and not os.path.exists(os.path.join(path, 'meta.json')):
            try:
                prepare_data.prepare(cfg['dataset'], data_dir=cfg['data_dir'])
            except UsageError as e:
                raise UsageError(f"preparing {path} (python prepare_data.py {cfg['dataset']}) failed: {e}") from None
        if dist.ddp:
            torch.distributed.barrier()
    meta = load_meta(path)
    if meta.get('kind') != 'text':
        raise UsageError(f"{path} holds {meta.get('kind')} data, not text; train_gpt.py needs a text dataset")
    sizes = {}
    for split in ('train', 'val'):
        f = os.path.join(path, f'{split}.bin')
        n = os.path.getsize(f) if os.path.isfile(f) else -1
        if n != 2 * meta.get(f'{split}_tokens', -1):
            got = 'is missing' if n < 0 else f"has {n} bytes, not the 2 x {meta.get(f'{split}_tokens')} its meta.json says"
            raise UsageError(f"{f} {got}; rebuild with: python prepare_data.py {meta.get('dataset', cfg['dataset'])} "
                             f"--data_dir={cfg['data_dir']} --force")
        if n // 2 <= cfg['block_size']:
            raise UsageError(f"block_size {cfg['block_size']} is larger than the data: {path} has {n // 2} {split} "
                             f"tokens (need at least block_size + 1); use a smaller --block_size or more data")
        sizes[split] = n // 2
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
    """(micro-steps per process, in total): gradient_accumulation_steps rounded up to a multiple of the
    process count, so that every process runs the same number."""
    per_process = -(-steps // world_size)
    return per_process, per_process * world_size


def micro_seed(seed, it, micro):
    """Dropout's seed for global micro-step `micro` of iteration `it`: the same whichever process runs it."""
    return int(np.random.SeedSequence([seed, it, micro]).generate_state(1)[0])

# -----------------------------------------------------------------------------
# MFU: the GPU's peak FLOP/s for this run's dtype, by the whole name torch.cuda.get_device_name() gives


def _tensor_core(half):
    """Ampere and newer: bfloat16 and float16 at the same dense rate, float32 as TF32 at half of it."""
    return dict(bfloat16=half, float16=half, float32=half / 2)


# Dense (no sparsity) tensor-core figures from NVIDIA's datasheets, matched against the whole device name: a
# substring would give the L40 the L4's figure and an H100 PCIe the SXM's. A GPU not listed gets no MFU rather
# than a guess: among them the A10G (NVIDIA publishes no figure for it), the H800 and the Blackwell GPUs.
PEAK_FLOPS = [
    (r'NVIDIA H100 \d+GB HBM3', _tensor_core(989e12)),           # SXM5
    (r'NVIDIA H100 PCIe', _tensor_core(756e12)),
    (r'NVIDIA H100 NVL', _tensor_core(835e12)),
    (r'NVIDIA H200', _tensor_core(989e12)),                      # SXM
    (r'NVIDIA H200 NVL', _tensor_core(835e12)),
    (r'NVIDIA GH200 \d+GB', _tensor_core(989e12)),
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
    name = torch.cuda.get_device_name(device)
    peaks = next((p for pattern, p in PEAK_FLOPS if re.fullmatch(pattern, name.strip())), {})
    return peaks.get(dtype)

# -----------------------------------------------------------------------------
# the run: set-up, one training step, evaluation and checkpoint, interrupt, summary


class Trainer:
    def __init__(self, cfg, set_keys, dist):
        """Set-up: the checkpoint to resume, the data, the model and optimizer, the log."""
        self.ckpt_path = os.path.join(cfg['out_dir'], 'ckpt.pt')
        ckpt = None
        if cfg['init_from'] == 'resume':
            if not os.path.isfile(self.ckpt_path):
                raise UsageError(f"no checkpoint at {self.ckpt_path} to resume from; start one with: "
                                 f"python train_gpt.py --out_dir={cfg['out_dir']}")
            ckpt = load_checkpoint(self.ckpt_path, map_location=dist.device)
            cfg, set_keys = resume_config(cfg, set_keys, ckpt, self.ckpt_path)
        else:
            check_out_dir([self.ckpt_path], cfg['overwrite'], dist.master)
        self.cfg, self.set_keys, self.dist, self.device = cfg, set_keys, dist, dist.device
        self.dtype = resolve_dtype(cfg['dtype'], self.device)
        self.accum, self.accum_total = split_accumulation(cfg['gradient_accumulation_steps'], dist.world_size)
        self.B, self.T = cfg['batch_size'], cfg['block_size']
        self.tokens_per_iter = self.accum_total * self.B * self.T
        self.data_path, self.meta, self.sizes = open_dataset(cfg, dist)
        if ckpt is not None and (ckpt['meta'].get('tokenizer'), ckpt['meta'].get('vocab_size')) != \
                (self.meta.get('tokenizer'), self.meta.get('vocab_size')):
            raise UsageError(f"{self.data_path} uses tokenizer {self.meta.get('tokenizer')} ({self.meta.get('vocab_size')} "
                             f"ids), the checkpoint was trained with {ckpt['meta'].get('tokenizer')} "
                             f"({ckpt['meta'].get('vocab_size')} ids)")
        self._build_model(ckpt)
        self.log = RunLog(cfg['out_dir'], enabled=dist.master, total=cfg['max_iters'], fresh=ckpt is None,
                          resume_from=self.iter_num)   # on resume, rows past the checkpoint go: they are redone
        self.start_iter, self.last_saved_iter, self.last_val, self.last_eval_iter = self.iter_num, None, None, None
        self.ckpt_iter = None if ckpt is None else self.iter_num   # the iteration of the checkpoint on disk
        # The step never waits for the device: the loss stays a tensor, summed here, and is read (a sync) only
        # for a log row, as in nanoGPT. The time between rows, evaluation left out, gives tokens/s and MFU.
        self.loss_acc = torch.zeros((), device=self.device)
        self.t_log, self.iters_since_log, self.tok_per_s = time.time(), 0, None
        self.timed = []                                # (iters, seconds) of each row: the first holds the warm-up
        self.t_start, self.peak = time.time(), peak_flops(self.device, self.dtype)

    def _build_model(self, ckpt):
        cfg, device = self.cfg, self.device
        seed_everything(cfg['seed'])  # the same on every process: they start from the same weights
        if ckpt is None:
            vocab = 64 * math.ceil(self.meta['vocab_size'] / 64)  # bytes 256; gpt2's 50257 -> 50304, faster matmuls
            self.model_args = dict(block_size=self.T, vocab_size=vocab, dropout=cfg['dropout'],
                                   **{k: cfg[k] for k in MODEL_KEYS})
            self.model_args['softmax_layers'] = softmax_layers(cfg['softmax_layers'], cfg['n_layer'])
            self.iter_num, self.best_val_loss, self.elapsed, self.tokens = 0, float('inf'), 0.0, 0
        else:
            self.model_args = dict(ckpt['model_args'], dropout=cfg['dropout'])
            self.iter_num, self.best_val_loss = int(ckpt['iter_num']), float(ckpt.get('best_val_loss', float('inf')))
            self.elapsed = float(ckpt.get('elapsed_s', 0.0))
            self.tokens = int(ckpt.get('tokens', self.iter_num * self.tokens_per_iter))   # tokens seen so far
        try:
            self.raw_model = tost.GPT(tost.GPTConfig(**self.model_args))
            if ckpt is not None:
                self.raw_model.load_state_dict(strip_compile_prefix(ckpt['model']))
        except (ValueError, TypeError, RuntimeError) as e:
            raise UsageError(f"bad model config or checkpoint: {str(e).splitlines()[0]}") from None
        self.raw_model.to(device)
        self.scaler = make_grad_scaler(device, self.dtype)
        self.optimizer = self.raw_model.configure_optimizers(cfg['weight_decay'], cfg['learning_rate'],
                                                             (cfg['beta1'], cfg['beta2']), device.split(':')[0])
        if ckpt is not None:
            self.optimizer.load_state_dict(ckpt['optimizer'])
            if ckpt.get('scaler'):
                self.scaler.load_state_dict(ckpt['scaler'])
        self.compiled = cfg['compile'] == 'true' or (cfg['compile'] == 'auto' and device.startswith('cuda'))
        # DDP inside, the compiler outside (the order PyTorch documents): the compiled backward then starts each
        # bucket's all-reduce as soon as its gradients are ready, instead of all of them after the whole backward
        model = DDP(self.raw_model, device_ids=[self.dist.local_rank] if device.startswith('cuda') else None) \
            if self.dist.ddp else self.raw_model
        self.model = torch.compile(model) if self.compiled else model
        self.ctx = autocast(device, self.dtype)

    def describe(self):
        """What is about to run, in a few lines above the live table."""
        cfg, log, m = self.cfg, self.log, self.model_args
        hybrid = f" (softmax in block {', '.join(map(str, m['softmax_layers']))})" if m.get('softmax_layers') else ''
        log.print(f"model: {self.raw_model.get_num_params() / 1e6:.2f}M params, attn={m['attn']}{hybrid}"
                  f"{' + token shift' if m.get('token_shift') else ''}, {m['n_layer']} layers x {m['n_head']} heads "
                  f"x {m['n_embd']}, vocab {m['vocab_size']}, context {self.T}")
        log.print(f"data: {self.data_path}, {self.sizes['train']:,} train + {self.sizes['val']:,} val tokens "
                  f"({self.meta.get('tokenizer')})")
        if self.accum_total != cfg['gradient_accumulation_steps']:
            log.print(f"note: gradient_accumulation_steps={cfg['gradient_accumulation_steps']} rounded up to "
                      f"{self.accum_total}, a multiple of the {self.dist.world_size} processes: "
                      f"{self.tokens_per_iter:,} tokens per iter")
        log.print(f"tokens per iter: {self.tokens_per_iter:,} = {self.dist.world_size} process(es) x {self.accum} "
                  f"micro-steps x {self.B} x {self.T}; device {self.device}, {self.dtype}, compile {self.compiled}")
        log.record({'kind': 'config', **cfg, **self.model_args, 'tokens_per_iter': self.tokens_per_iter,
                    'params': self.raw_model.get_num_params()})   # for plot.py: what this run is
        if self.ckpt_iter is not None:
            log.print(f"resuming from {self.ckpt_path} at iter {self.iter_num} (best val loss {self.best_val_loss:.4f})")
            if cfg['max_iters'] > cfg['lr_decay_iters']:
                log.print(f"note: the schedule decays to min_lr at iter {cfg['lr_decay_iters']} and stays there; "
                          f"set --lr_decay_iters to stretch it")

    def lr(self, it):
        c = self.cfg
        return cosine_lr(it, c['learning_rate'], c['min_lr'], c['warmup_iters'], c['lr_decay_iters'])

    # --- one training step ------------------------------------------------------------------------------

    def step(self):
        """One optimizer step: accum micro-steps on each process, gradients averaged by DDP on the last."""
        lr = self.lr(self.iter_num)
        for group in self.optimizer.param_groups:
            group['lr'] = lr
        B, seed, rank = self.B, self.cfg['seed'], self.dist.rank
        starts = window_starts(seed, 0, self.iter_num, self.accum_total * B, self.sizes['train'], self.T)

        def micro_batch(micro):
            m = rank * self.accum + micro    # the global micro-step: rows m*B .. m*B+B-1 of the batch
            torch.manual_seed(micro_seed(seed, self.iter_num, m))   # dropout: the same on any process count
            return read_batch(self.data_path, 'train', starts[m * B:m * B + B], self.T, self.device)

        self.loss_acc += train_step(self.model, [lambda i=i: micro_batch(i) for i in range(self.accum)],
                                    lambda model, x, y: model(x, y)[1], self.optimizer, self.scaler,
                                    self.cfg['grad_clip'], self.ctx, self.dist.ddp)
        self.iter_num += 1
        self.iters_since_log += 1
        self.tokens += self.tokens_per_iter
        if self.iter_num % self.cfg['log_interval'] == 0 or self.iter_num == self.cfg['max_iters']:
            self.log_row(lr)

    def mean_loss(self):
        """The loss of the iterations since the last row, averaged over them and over the processes."""
        if self.dist.ddp:
            torch.distributed.all_reduce(self.loss_acc)
        value = self.loss_acc.item() / (self.iters_since_log * self.dist.world_size)
        self.loss_acc.zero_()
        return value

    def log_row(self, lr):
        train_loss = self.mean_loss()  # waits for the device: the time below covers the work done
        if not math.isfinite(train_loss):  # the weights in memory are lost; those on disk are fine
            raise Stop(f"the training loss is {train_loss} at iter {self.iter_num}: training diverged; stopped "
                       f"without saving, {self.last_good()}; try a lower --learning_rate or --grad_clip", 3)
        now = time.time()
        per_iter = (now - self.t_log) / self.iters_since_log
        self.timed.append((self.iters_since_log, now - self.t_log))
        self.t_log, self.iters_since_log = now, 0
        self.tok_per_s = self.tokens_per_iter / per_iter
        row = dict(iter=self.iter_num, loss=train_loss, lr=lr, tok_per_s=self.tok_per_s, ms_per_iter=1000 * per_iter)
        if self.peak is not None:
            row['mfu'] = self.raw_model.estimate_mfu(self.B * self.accum, per_iter, T=self.T, peak_flops=self.peak)
        self.log.show(row)
        self.log.record(dict(iter=self.iter_num, kind='train', train_loss=train_loss, lr=lr,
                             tokens_per_sec=self.tok_per_s, ms_per_iter=1000 * per_iter, mfu=row.get('mfu'),
                             tokens=self.tokens, elapsed_s=self.elapsed_s()))

    def elapsed_s(self):
        """Seconds of this run so far, the runs it resumed included."""
        return round(self.elapsed + time.time() - self.t_start, 2)

    # --- evaluation and checkpoint ----------------------------------------------------------------------

    @torch.no_grad()
    def estimate_loss(self):
        """Mean loss over a fixed set of eval_iters batches per split, shared out among the processes."""
        out, dist, cfg = {}, self.dist, self.cfg
        self.model.eval()
        for split, stream in (('train', 1), ('val', 2)):
            total = torch.zeros((), device=self.device, dtype=sum_dtype(self.device))
            for k in range(dist.rank, cfg['eval_iters'], dist.world_size):
                starts = window_starts(cfg['seed'], stream, k, self.B, self.sizes[split], self.T)
                X, Y = read_batch(self.data_path, split, starts, self.T, self.device)
                with self.ctx:
                    loss = self.model(X, Y)[1]
                total += loss.to(total.dtype)
            if dist.ddp:
                torch.distributed.all_reduce(total)
            out[split] = total.item() / cfg['eval_iters']
        self.model.train()
        return out

    def evaluate(self):
        """Estimate the losses, save a checkpoint if due, log a row and redraw loss.png."""
        t_eval, cfg = time.time(), self.cfg
        losses = self.estimate_loss()
        self.last_val, self.last_eval_iter = losses['val'], self.iter_num
        if not (math.isfinite(losses['val']) and math.isfinite(losses['train'])):
            raise Stop(f"the eval loss is {losses['val']} at iter {self.iter_num}: training diverged; stopped "
                       f"without saving, {self.last_good()}; try a lower --learning_rate", 3)
        saved, elapsed = False, self.elapsed_s()  # read before the save: a resume goes on from the checkpoint's, later
        if losses['val'] < self.best_val_loss or cfg['always_save_checkpoint']:
            self.best_val_loss = min(self.best_val_loss, losses['val'])
            if self.iter_num > 0:
                self.save(losses['val'])
                saved = True
        self.log.record(dict(iter=self.iter_num, kind='eval', train_loss=losses['train'], val_loss=losses['val'],
                             lr=self.lr(self.iter_num), tokens_per_sec=self.tok_per_s, saved=saved,
                             tokens=self.tokens, elapsed_s=elapsed))
        self.log.show(dict(iter=self.iter_num, train_loss=losses['train'], val_loss=losses['val']))
        self.log.draw()
        self.t_log += time.time() - t_eval  # evaluation (and drawing) time is not training time

    def save(self, val_loss):
        """ckpt.pt, written by rank 0 atomically; every rank notes the iteration (they branch on it alike)."""
        if self.dist.master:
            state = dict(model=strip_compile_prefix(self.raw_model.state_dict()),
                         optimizer=self.optimizer.state_dict(), scaler=self.scaler.state_dict(),
                         model_args=self.model_args, iter_num=self.iter_num, best_val_loss=self.best_val_loss,
                         val_loss=val_loss, config=dict(self.cfg), set_keys=sorted(self.set_keys), meta=self.meta,
                         elapsed_s=self.elapsed_s(), tokens=self.tokens)
            try:
                atomic_save(state, self.ckpt_path)
            except OSError as e:
                old = f"; the previous {self.ckpt_path} is intact" if os.path.isfile(self.ckpt_path) else ""
                raise Stop(f"could not save {self.ckpt_path} ({e.strerror or e}){old}", 1) from None
        self.last_saved_iter = self.ckpt_iter = self.iter_num

    def last_good(self):
        if self.ckpt_iter is None:
            return "no checkpoint was saved before it"
        return f"the last good checkpoint is {self.ckpt_path} (iter {self.ckpt_iter})"

    # --- interrupt --------------------------------------------------------------------------------------

    def resume_hint(self):
        return resume_command('train_gpt.py', self.cfg, self.set_keys, DEFAULTS)

    def interrupted(self, signal_name):
        """Ctrl-C or SIGTERM at a step boundary: save here (rank 0), then a Stop that says how to go on."""
        how, resume = f"interrupted ({signal_name}) at iter {self.iter_num}", f"\n{self.resume_hint()}"
        if self.iter_num == self.ckpt_iter:
            msg = f"{how}; {self.ckpt_path} is at this iter already{resume}"
        elif self.iter_num == self.start_iter:
            msg = f"{how}, before the first step: nothing to save"
        elif not self.cfg['always_save_checkpoint'] and self.ckpt_iter is not None:
            msg = (f"{how}; not saved: always_save_checkpoint=False keeps {self.ckpt_path} as the best model so "
                   f"far (iter {self.ckpt_iter}), and a resume goes on from there{resume}")
        elif self.iters_since_log and not math.isfinite(self.mean_loss()):  # all ranks: a collective
            msg = f"{how}; not saved: the training loss is not finite (diverged); {self.last_good()}"
        else:
            self.save(self.last_val if self.last_eval_iter == self.iter_num else None)
            msg = f"{how}: saved {self.ckpt_path}{resume}"
        if self.dist.ddp:
            torch.distributed.barrier()  # the other ranks wait while rank 0 writes
        return Stop(msg, 130)

    def stopped_now(self):
        """A second Ctrl-C: out at once, without saving."""
        hint = f"\n{self.resume_hint()}" if self.ckpt_iter is not None else ""
        return Stop(f"interrupted at iter {self.iter_num}, not saved; {self.last_good()}{hint}", 130)

    # --- the loop and the summary -----------------------------------------------------------------------

    def train(self):
        cfg = self.cfg
        try:
            with GracefulStop(self.dist) as stop:
                while True:
                    # eval and checkpoint at every eval_interval and at the end (not again right after a resume)
                    if (self.iter_num % cfg['eval_interval'] == 0 or self.iter_num == cfg['max_iters']) \
                            and self.iter_num != self.ckpt_iter:
                        self.evaluate()
                    if self.iter_num >= cfg['max_iters']:
                        break
                    if stop.requested():  # Ctrl-C or SIGTERM on any rank: all stop here, at the same step
                        raise self.interrupted(stop.signal or 'on another rank')
                    self.step()
        except KeyboardInterrupt:  # a second Ctrl-C
            raise self.stopped_now() from None
        except Exception as e:
            if isinstance(e, torch.OutOfMemoryError) or isinstance(e, RuntimeError) and 'out of memory' in str(e):
                B, accum = self.B, self.accum_total
                raise Stop(f"out of memory at iter {self.iter_num} with batch_size={B}, block_size={self.T} on "
                           f"{self.device}; try --batch_size={max(1, B // 2)} --gradient_accumulation_steps="
                           f"{2 * accum} (same tokens per step, half the memory)", 2) from None
            raise
        finally:
            self.log.close()

    def summary(self):
        """The end: what the user wants to know, in two lines."""
        rows = self.timed[1:] or self.timed        # leave out the first row's warm-up (and compilation)
        n, secs = sum(r[0] for r in rows), sum(r[1] for r in rows)
        rate = f" ({n * self.tokens_per_iter / secs:,.0f} tokens/s training)" if secs > 0 else ''
        path, trained = self.ckpt_path, self.iter_num - self.start_iter
        where = (f"saved {path} (iter {self.last_saved_iter})" if self.last_saved_iter is not None else
                 f"{path} not updated (val loss did not improve on {self.best_val_loss:.4f})"
                 if os.path.isfile(path) else "no checkpoint saved")
        val = f"val loss {self.last_val:.4f}" if self.last_val is not None else "no new eval"
        print(f"done: {trained} iters in {human_time(time.time() - self.t_start)}{rate}, at iter {self.iter_num}; "
              f"{val}; {where}", flush=True)
        if os.path.isfile(path):
            flag = '' if self.cfg['out_dir'] == 'out' else f" --out_dir={self.cfg['out_dir']}"
            print(f"sample from it: python sample.py{flag}", flush=True)


def train(cfg, set_keys, dist):
    run = Trainer(cfg, set_keys, dist)
    if run.iter_num >= run.cfg['max_iters']:
        if dist.master:
            print(f"nothing to do: {run.ckpt_path} is at iter {run.iter_num} and --max_iters is "
                  f"{run.cfg['max_iters']}; pass a larger --max_iters to train on", flush=True)
        run.log.close()
        return dict(iter_num=run.iter_num, val_loss=None, best_val_loss=run.best_val_loss)
    run.describe()
    run.train()
    if dist.master:
        run.summary()
    return dict(iter_num=run.iter_num, val_loss=run.last_val, best_val_loss=run.best_val_loss)


def main(argv=None):
    cfg, set_keys = parse(sys.argv[1:] if argv is None else argv, DEFAULTS, __doc__, __file__, PRESETS)
    return launch(train, check_config(cfg, set_keys), set_keys)


if __name__ == '__main__':
    run_main(main)
