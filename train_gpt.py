"""
Train a ToST language model: nanoGPT's train.py with causal TSSA in place of softmax attention.

The first command needs nothing but this repo: it prepares the offline corpus (this Python's standard
library source, 12 MB of bytes) if missing, trains a 0.7M-parameter model on 4M tokens (4.5 minutes on a
2-core CPU; val loss 2.16 nats per byte, where predicting byte frequencies alone gives 3.26), saves
out/ckpt.pt and prints the val loss and the command to sample from it.

    python train_gpt.py                                   # the demo (same as --config=demo)
    python sample.py                                      # then read what it writes
    python train_gpt.py --attn=softmax --out_dir=out-softmax   # the GPT-2 baseline, everything else equal
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

Every key below can be set as --key=value; --config=NAME applies a preset first. Progress goes to the
terminal (a live table) and, one JSON object per log or eval step, to <out_dir>/log.jsonl.

Batches and processes. batch_size is sequences per micro-step per process; gradient_accumulation_steps
is micro-steps per optimizer step in total, over all processes. One iteration is therefore
gradient_accumulation_steps x batch_size x block_size tokens, however many processes share it. Its
batch is drawn from a generator seeded by (seed, iteration) and cut into micro-batches; process r runs
its consecutive share of them, and dropout is seeded per micro-step, so N processes compute what one
process does (up to float rounding) and a resumed run sees the batches an unbroken one would. When the
count does not divide among the processes, it is rounded up to the next multiple, and the run says so
with the tokens per iteration: the demo's 1 becomes 2 on 2 processes and 3 on 3, owt-base's 40 becomes
42 on 3. A rounded-up run takes bigger steps at the same learning rate. Resuming with another process
count goes on from the same iteration and data order; the steps are the same if both counts divide
gradient_accumulation_steps, else the new count's rounded-up batch is used from then on.
"""
import contextlib
import math
import os
import sys
import time

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import prepare_data
import tost
from train_common import (GracefulStop, Stop, UsageError, RunLog, atomic_save, autocast, check_out_dir,
                          cleanup_distributed, cosine_lr, human_time, load_checkpoint, make_grad_scaler,
                          parse_overrides, print_help_if_asked, resolve_dtype, resume_command,
                          run_main, seed_everything, setup_distributed, strip_compile_prefix, sum_dtype)

# -----------------------------------------------------------------------------
# default config: the CPU demo. Sized for ~4.5 minutes on 2 idle CPU cores.

DEFAULTS = dict(
    config='demo',               # the preset this run started from (--config=NAME picks one)
    # data
    dataset='python_stdlib',     # a folder under data_dir written by prepare_data.py
    data_dir='data',             # where prepare_data.py puts datasets
    block_size=256,              # context length in tokens
    batch_size=16,               # sequences per micro-step, per process
    gradient_accumulation_steps=1,  # micro-steps per optimizer step over all processes (see the docstring)
    # model (tost.GPT); the vocabulary comes from the data: 256 for bytes, 50304 for gpt2
    n_layer=4,                   # blocks
    n_head=4,                    # heads (TSSA's groups K)
    n_embd=128,                  # width d
    dropout=0.0,                 # for pretraining 0 is good; for finetuning try 0.1+
    bias=False,                  # biases in Linear and LayerNorm
    attn='tssa',                 # 'tssa' (ToST) or 'softmax' (GPT-2's attention), all else equal
    token_shift=False,           # not in the paper: mix each token with the previous one before attention
    # AdamW, linear warmup then cosine decay
    learning_rate=6e-3,          # peak learning rate (high, for a small model and a short run)
    max_iters=1000,              # optimizer steps in total
    min_lr=6e-4,                 # floor of the cosine; learning_rate / 10 unless set
    warmup_iters=50,             # linear warmup; max_iters / 20 unless set
    lr_decay_iters=1000,         # the cosine reaches min_lr here; max_iters unless set
    weight_decay=0.1,            # on matrices only (tost.param_groups)
    beta1=0.9,
    beta2=0.95,
    grad_clip=1.0,               # clip the global gradient norm at this; 0 turns it off
    # evaluation, logging, checkpoints
    out_dir='out',               # ckpt.pt and log.jsonl go here
    eval_interval=250,           # estimate train and val loss every this many iterations (and at the end)
    eval_iters=20,               # batches per estimate (a fixed set, so estimates are comparable)
    log_interval=10,             # print and log the training loss every this many iterations
    always_save_checkpoint=True,  # save after every eval; False: only when val loss improves
    init_from='scratch',         # 'scratch', or 'resume' from out_dir/ckpt.pt
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
MODEL_KEYS = ('n_layer', 'n_head', 'n_embd', 'bias', 'attn', 'token_shift')  # fixed by a checkpoint
MACHINE_KEYS = ('device', 'dtype', 'compile', 'out_dir', 'init_from', 'overwrite')  # on resume: this command line's
CKPT_NAME = 'ckpt.pt'

# -----------------------------------------------------------------------------
# helpers: config, data, peak FLOPs


def resolve_config(cfg, set_keys):
    """Fill in the keys that follow others unless set, and check values a type check cannot."""
    if 'min_lr' not in set_keys:
        cfg['min_lr'] = cfg['learning_rate'] / 10
    if 'warmup_iters' not in set_keys:
        cfg['warmup_iters'] = max(1, cfg['max_iters'] // 20)
    if 'lr_decay_iters' not in set_keys:
        cfg['lr_decay_iters'] = cfg['max_iters']
    compile_ = str(cfg['compile']).strip().lower()
    if compile_ not in ('auto', 'true', 'false', '1', '0', 'yes', 'no'):
        raise UsageError(f"--compile expects auto, true or false, got {cfg['compile']!r}")
    cfg['compile'] = {'1': 'true', 'yes': 'true', '0': 'false', 'no': 'false'}.get(compile_, compile_)
    positive = ('block_size', 'batch_size', 'gradient_accumulation_steps', 'n_layer', 'n_head', 'n_embd',
                'eval_interval', 'eval_iters', 'log_interval')
    for key in positive:
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
    return cfg


def resume_config(cfg, set_keys, ckpt):
    """On resume the run goes on as it was: the checkpoint's config, then what this command line set.
    The model's shape cannot change; device, dtype, compile and out_dir are this machine's business."""
    old = ckpt['config']
    for key in MODEL_KEYS:
        had = old.get(key, DEFAULTS[key])                     # older checkpoints lack newer keys
        if key in set_keys and cfg[key] != had:
            raise UsageError(f"--{key}={cfg[key]} does not match the checkpoint's model ({key}={had}); "
                             f"the model's shape is fixed on resume")
    merged = {k: (cfg[k] if k in set_keys or k in MACHINE_KEYS or k not in old else old[k]) for k in cfg}
    merged['config'] = old.get('config', cfg['config'])
    if merged['block_size'] > ckpt['model_args']['block_size']:
        raise UsageError(f"--block_size={merged['block_size']} is larger than the checkpoint's model allows "
                         f"({ckpt['model_args']['block_size']}: its position embedding has that many rows)")
    return merged


def open_dataset(cfg, dist):
    """The dataset folder and its meta.json, prepared here first if it is cheap to."""
    path = os.path.join(cfg['data_dir'], cfg['dataset'])
    if not os.path.exists(os.path.join(path, 'meta.json')) and cfg['dataset'] in PREPARE_ON_THE_FLY:
        if dist.local_rank == 0:  # one process per node builds it, the others wait
            try:
                prepare_data.prepare(cfg['dataset'], data_dir=cfg['data_dir'])
            except prepare_data.DataError as e:
                raise UsageError(f"preparing {path} (python prepare_data.py {cfg['dataset']}) failed: "
                                 + ' '.join(str(e).split())) from None
        if dist.ddp:
            torch.distributed.barrier()
    try:
        meta = prepare_data.load_meta(path)
    except prepare_data.DataError as e:
        raise UsageError(' '.join(str(e).split())) from None
    if meta.get('kind') != 'text':
        raise UsageError(f"{path} holds {meta.get('kind')} data, not text; train_gpt.py needs a text dataset")
    sizes = {}
    for split in ('train', 'val'):
        f = os.path.join(path, f'{split}.bin')
        if not os.path.isfile(f):
            raise UsageError(f"{f} is missing; rebuild with: python prepare_data.py {cfg['dataset']} --force")
        sizes[split] = os.path.getsize(f) // 2
    return path, meta, sizes


def check_block_size(block_size, sizes, path):
    for split, n in sizes.items():
        if n <= block_size:
            raise UsageError(f"block_size {block_size} is larger than the data: {path} has {n} {split} tokens "
                             f"(need at least block_size + 1); use a smaller --block_size or more data")


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
    if device.startswith('cuda'):  # GPU only (no test runs it): pinned memory, the copy runs while the GPU works
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


# dense bf16 peak FLOP/s by GPU name, for MFU; float32 runs as TF32, half of it
PEAK_FLOPS = {'H200': 989e12, 'H100': 989e12, 'A100': 312e12, 'L40S': 362e12, 'A10G': 70e12, 'L4': 121e12}


def peak_flops(device, dtype):
    """The GPU's peak, or None (no MFU on a CPU, on MPS, or on a GPU not in the table)."""
    if not device.startswith('cuda'):
        return None
    name = torch.cuda.get_device_name(device)
    peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None)
    return None if peak is None else peak / (2 if dtype == 'float32' else 1)


def split_accumulation(steps, world_size):
    """(micro-steps per process, in total): gradient_accumulation_steps rounded up to a multiple of the
    process count, so that every process runs the same number."""
    per_process = -(-steps // world_size)
    return per_process, per_process * world_size


def micro_seed(seed, it, micro):
    """Dropout's seed for global micro-step `micro` of iteration `it`: the same whichever process runs it."""
    return int(np.random.SeedSequence([seed, it, micro]).generate_state(1)[0])


def is_oom(e):
    return isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and 'out of memory' in str(e))

# -----------------------------------------------------------------------------


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if print_help_if_asked(argv, __doc__, DEFAULTS, PRESETS):
        return None
    cfg, set_keys = parse_overrides(argv, DEFAULTS, PRESETS)
    cfg = resolve_config(cfg, set_keys)
    dist = setup_distributed(cfg['device'])  # torchrun: join the process group; else one process
    ckpt_path = os.path.join(cfg['out_dir'], CKPT_NAME)
    try:
        return train(cfg, set_keys, dist, ckpt_path)
    except Stop as e:
        e.exit(dist.master)
    except KeyboardInterrupt:  # before the training loop: nothing of this run to save
        if dist.master:
            print(f"interrupted before training began; {ckpt_path} is as it was" if os.path.isfile(ckpt_path)
                  else "interrupted before training began", file=sys.stderr, flush=True)
        sys.exit(130)
    finally:
        cleanup_distributed(dist)


def resume_hint(cfg, set_keys):
    """'resume with: python train_gpt.py --init_from=resume ...': the checkpoint restores all but these keys."""
    keys = [k for k in ('out_dir', 'device', 'dtype', 'compile') if k in set_keys and cfg[k] != DEFAULTS[k]]
    return "resume with: " + resume_command('train_gpt.py', {'init_from': 'resume', **{k: cfg[k] for k in keys}})


def train(cfg, set_keys, dist, ckpt_path):
    ckpt = None
    if cfg['init_from'] == 'scratch':
        check_out_dir([ckpt_path], cfg['overwrite'], dist.master)
    if cfg['init_from'] == 'resume':
        if not os.path.isfile(ckpt_path):
            raise UsageError(f"no checkpoint at {ckpt_path} to resume from; start one with: "
                             f"python train_gpt.py --out_dir={cfg['out_dir']}")
        ckpt = load_checkpoint(ckpt_path, map_location=dist.device)
        if ckpt.get('kind') == 'vit':
            raise UsageError(f"{ckpt_path} is a vision checkpoint (train_vit.py), not a language model")
        missing = {'model', 'optimizer', 'model_args', 'iter_num', 'config', 'meta'} - set(ckpt)
        if missing:
            raise UsageError(f"{ckpt_path} is not a train_gpt.py checkpoint (no {', '.join(sorted(missing))})")
        cfg = resume_config(cfg, set_keys, ckpt)
        set_keys = set_keys | set(ckpt.get('set_keys', ()))

    master, device = dist.master, dist.device
    device_type = device.split(':')[0]
    dtype = resolve_dtype(cfg['dtype'], device)
    use_compile = cfg['compile'] == 'true' or (cfg['compile'] == 'auto' and device_type == 'cuda')
    accum, accum_total = split_accumulation(cfg['gradient_accumulation_steps'], dist.world_size)
    B, T = cfg['batch_size'], cfg['block_size']
    tokens_per_iter = accum_total * B * T

    # data
    data_path, meta, sizes = open_dataset(cfg, dist)
    check_block_size(T, sizes, data_path)
    if ckpt is not None and (ckpt['meta'].get('tokenizer'), ckpt['meta'].get('vocab_size')) != \
            (meta.get('tokenizer'), meta.get('vocab_size')):
        raise UsageError(f"{data_path} uses tokenizer {meta.get('tokenizer')} ({meta.get('vocab_size')} ids), the "
                         f"checkpoint was trained with {ckpt['meta'].get('tokenizer')} "
                         f"({ckpt['meta'].get('vocab_size')} ids)")

    # model
    seed_everything(cfg['seed'])  # the same on every process: they start from the same weights
    if ckpt is None:
        vocab = 64 * math.ceil(meta['vocab_size'] / 64)  # 256 for bytes; gpt2's 50257 -> 50304, faster matmuls
        model_args = dict(block_size=T, vocab_size=vocab, n_layer=cfg['n_layer'], n_head=cfg['n_head'],
                          n_embd=cfg['n_embd'], dropout=cfg['dropout'], bias=cfg['bias'], attn=cfg['attn'],
                          token_shift=cfg['token_shift'])
        iter_num, best_val_loss = 0, float('inf')
    else:
        model_args = dict(ckpt['model_args'], dropout=cfg['dropout'])
        iter_num, best_val_loss = int(ckpt['iter_num']), float(ckpt.get('best_val_loss', float('inf')))
    try:
        model = tost.GPT(tost.GPTConfig(**model_args))
    except (ValueError, TypeError) as e:
        raise UsageError(f"bad model config: {e}") from None
    if ckpt is not None:
        try:
            model.load_state_dict(strip_compile_prefix(ckpt['model']))
        except RuntimeError as e:
            raise UsageError(f"{ckpt_path} does not fit the model it describes ({str(e).splitlines()[0]})") from None
    model.to(device)
    scaler = make_grad_scaler(device, dtype)
    optimizer = model.configure_optimizers(cfg['weight_decay'], cfg['learning_rate'],
                                           (cfg['beta1'], cfg['beta2']), device_type)
    if ckpt is not None:
        optimizer.load_state_dict(ckpt['optimizer'])
        if ckpt.get('scaler'):
            scaler.load_state_dict(ckpt['scaler'])
    ckpt = None  # free the memory
    raw_model = model
    if use_compile:
        model = torch.compile(model)
    train_model = DDP(model, device_ids=[dist.local_rank] if device_type == 'cuda' else None) if dist.ddp else model
    # The tests run compile, DDP (over gloo), autocast with the GradScaler and fused AdamW (forced) on CPU.
    # GPU only, so untested: the device pick in train_common.setup_distributed, read_batch's pinned copy,
    # and the GPU's name in peak_flops (tested with a fake name).
    ctx = autocast(device, dtype)
    peak = peak_flops(device, dtype)

    log = RunLog(cfg['out_dir'], enabled=master, total=cfg['max_iters'], fresh=cfg['init_from'] == 'scratch',
                 resume_from=iter_num)  # on resume, rows past the checkpoint go: they are about to be redone
    log.print(f"model: {raw_model.get_num_params() / 1e6:.2f}M params, attn={cfg['attn']}"
              f"{' + token shift' if model_args.get('token_shift') else ''}, "
              f"{cfg['n_layer']} layers x {cfg['n_head']} heads x {cfg['n_embd']}, vocab {model_args['vocab_size']}, "
              f"context {T}")
    log.print(f"data: {data_path}, {sizes['train']:,} train + {sizes['val']:,} val tokens ({meta.get('tokenizer')})")
    if accum_total != cfg['gradient_accumulation_steps']:
        log.print(f"note: gradient_accumulation_steps={cfg['gradient_accumulation_steps']} rounded up to {accum_total}, "
                  f"a multiple of the {dist.world_size} processes: {tokens_per_iter:,} tokens per iter")
    log.print(f"tokens per iter: {tokens_per_iter:,} = {dist.world_size} process(es) x {accum} micro-steps x "
              f"{B} x {T}; device {device}, {dtype}, compile {use_compile}")
    if cfg['init_from'] == 'resume':
        log.print(f"resuming from {ckpt_path} at iter {iter_num} (best val loss {best_val_loss:.4f})")
        if iter_num >= cfg['max_iters']:
            log.print(f"note: the checkpoint is at iter {iter_num} and max_iters is {cfg['max_iters']}: nothing to "
                      f"do; pass a larger --max_iters to train on")
        if cfg['max_iters'] > cfg['lr_decay_iters']:
            log.print(f"note: the schedule decays to min_lr at iter {cfg['lr_decay_iters']} and stays there; "
                      f"set --lr_decay_iters to stretch it")

    def lr_at(it):
        return cosine_lr(it, cfg['learning_rate'], cfg['min_lr'], cfg['warmup_iters'], cfg['lr_decay_iters'])

    @torch.no_grad()
    def estimate_loss():
        """Mean loss over a fixed set of eval_iters batches per split, shared out among the processes."""
        out = {}
        model.eval()
        for split, stream in (('train', 1), ('val', 2)):
            total = torch.zeros((), device=device, dtype=sum_dtype(device))
            for k in range(dist.rank, cfg['eval_iters'], dist.world_size):
                starts = window_starts(cfg['seed'], stream, k, B, sizes[split], T)
                X, Y = read_batch(data_path, split, starts, T, device)
                with ctx:
                    _, loss = model(X, Y)
                total += loss.to(total.dtype)
            if dist.ddp:
                torch.distributed.all_reduce(total)
            out[split] = total.item() / cfg['eval_iters']
        model.train()
        return out

    def save(val_loss):
        state = dict(model=strip_compile_prefix(raw_model.state_dict()), optimizer=optimizer.state_dict(),
                     scaler=scaler.state_dict(), model_args=model_args, iter_num=iter_num,
                     best_val_loss=best_val_loss, val_loss=val_loss, config=dict(cfg),
                     set_keys=sorted(set_keys), meta=meta)
        try:
            atomic_save(state, ckpt_path)
        except OSError as e:
            old = f"; the previous {ckpt_path} is intact" if os.path.isfile(ckpt_path) else ""
            raise Stop(f"could not save {ckpt_path} ({e.strerror or e}){old}", 1) from None

    def last_good():
        if ckpt_iter is None:
            return "no checkpoint was saved before it"
        return f"the last good checkpoint is {ckpt_path} (iter {ckpt_iter})"

    def interrupted(signal_name):
        """Ctrl-C or SIGTERM at a step boundary: save here (master), then a Stop that says how to go on."""
        how, resume = f"interrupted ({signal_name}) at iter {iter_num}", f"\n{resume_hint(cfg, set_keys)}"
        if iter_num == ckpt_iter:
            msg = f"{how}; {ckpt_path} is at this iter already{resume}"
        elif iter_num == start_iter:
            msg = f"{how}, before the first step: nothing to save"
        elif not cfg['always_save_checkpoint'] and ckpt_iter is not None:
            msg = (f"{how}; not saved: always_save_checkpoint=False keeps {ckpt_path} as the best model so far "
                   f"(iter {ckpt_iter}), and a resume goes on from there{resume}")
        elif iters_since_log and not math.isfinite(mean_loss()):  # all ranks: a collective
            msg = f"{how}; not saved: the training loss is not finite (diverged); {last_good()}"
        else:
            if master:
                save(last_val if last_eval_iter == iter_num else None)
            msg = f"{how}: saved {ckpt_path}{resume}"
        if dist.ddp:
            torch.distributed.barrier()  # the other ranks wait while rank 0 writes
        return Stop(msg, 130)

    start_iter, last_saved_iter, last_val, last_eval_iter = iter_num, None, None, None
    ckpt_iter = start_iter if cfg['init_from'] == 'resume' else None  # the iter of the checkpoint on disk
    # The step never waits for the device: the loss stays a tensor, summed here, and is read (.item(), a sync)
    # only for a log row, as in nanoGPT. Time between rows, eval excluded, gives tokens/s and MFU.
    loss_acc = torch.zeros((), device=device)  # this process's loss summed over the iterations since the last row
    t_log, iters_since_log, tok_per_s = time.time(), 0, None
    timed = [[0, 0.0], [0, 0.0]]  # (iters, seconds) of the first row (compilation, warm-up), of the others
    t_start = time.time()

    def mean_loss():
        """The loss of the iterations since the last row, averaged over them and over the processes."""
        if dist.ddp:
            torch.distributed.all_reduce(loss_acc)
        value = loss_acc.item() / (iters_since_log * dist.world_size)
        loss_acc.zero_()
        return value

    try:
        with GracefulStop(dist) as stop:
            while True:
                # eval and checkpoint at every eval_interval and at the end (not again right after a resume)
                if (iter_num % cfg['eval_interval'] == 0 or iter_num == cfg['max_iters']) and \
                        not (cfg['init_from'] == 'resume' and iter_num == start_iter):
                    t_eval = time.time()
                    losses = estimate_loss()
                    last_val, last_eval_iter = losses['val'], iter_num
                    if not (math.isfinite(losses['val']) and math.isfinite(losses['train'])):
                        raise Stop(f"the eval loss is {losses['val']} at iter {iter_num}: training diverged; "
                                   f"stopped without saving, {last_good()}; try a lower --learning_rate", 3)
                    saved = False
                    if losses['val'] < best_val_loss or cfg['always_save_checkpoint']:
                        best_val_loss = min(best_val_loss, losses['val'])
                        if iter_num > 0:
                            if master:
                                save(losses['val'])
                            last_saved_iter = ckpt_iter = iter_num  # on every rank: they branch on it alike
                            saved = True
                    log.record(dict(iter=iter_num, kind='eval', train_loss=losses['train'], val_loss=losses['val'],
                                    lr=lr_at(iter_num), tokens_per_sec=tok_per_s, saved=saved,
                                    elapsed_s=round(time.time() - t_start, 2)))
                    log.show(dict(iter=iter_num, train_loss=losses['train'], val_loss=losses['val']))
                    t_log += time.time() - t_eval  # eval time is not training time
                if iter_num >= cfg['max_iters']:
                    break
                if stop.requested():  # Ctrl-C or SIGTERM on any rank: all stop here, at the same step
                    raise interrupted(stop.signal or 'on another rank')

                # one optimizer step: accum micro-steps on each process, gradients averaged by DDP on the last
                lr = lr_at(iter_num)
                for group in optimizer.param_groups:
                    group['lr'] = lr
                starts = window_starts(cfg['seed'], 0, iter_num, accum_total * B, sizes['train'], T)
                for micro in range(accum):
                    m = dist.rank * accum + micro  # the global micro-step: rows m*B .. m*B+B-1 of the batch
                    X, Y = read_batch(data_path, 'train', starts[m * B:m * B + B], T, device)
                    torch.manual_seed(micro_seed(cfg['seed'], iter_num, m))  # dropout: the same on any process count
                    sync = not dist.ddp or micro == accum - 1
                    with contextlib.nullcontext() if sync else train_model.no_sync():  # no all-reduce until the last
                        with ctx:
                            _, loss = train_model(X, Y)
                            loss = loss / accum
                        scaler.scale(loss).backward()
                    loss_acc += loss.detach()
                if cfg['grad_clip'] > 0:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg['grad_clip'])
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                iter_num += 1
                iters_since_log += 1

                if iter_num % cfg['log_interval'] == 0 or iter_num == cfg['max_iters']:
                    train_loss = mean_loss()  # waits for the device: the time below covers the work done
                    if not math.isfinite(train_loss):  # the weights in memory are lost; those on disk are fine
                        raise Stop(f"the training loss is {train_loss} at iter {iter_num}: training diverged; "
                                   f"stopped without saving, {last_good()}; try a lower --learning_rate or "
                                   f"--grad_clip", 3)
                    now = time.time()
                    per_iter = (now - t_log) / iters_since_log
                    slot = timed[1] if timed[0][0] else timed[0]
                    slot[0], slot[1] = slot[0] + iters_since_log, slot[1] + now - t_log
                    t_log, iters_since_log = now, 0
                    tok_per_s = tokens_per_iter / per_iter
                    row = dict(iter=iter_num, loss=train_loss, lr=lr, tok_per_s=tok_per_s, ms_per_iter=1000 * per_iter)
                    if peak is not None:
                        row['mfu'] = raw_model.estimate_mfu(B * accum, per_iter, T=T, peak_flops=peak)
                    log.show(row)
                    log.record(dict(iter=iter_num, kind='train', train_loss=train_loss, lr=lr, tokens_per_sec=tok_per_s,
                                    ms_per_iter=1000 * per_iter, mfu=row.get('mfu'),
                                    elapsed_s=round(time.time() - t_start, 2)))
    except KeyboardInterrupt:  # a second Ctrl-C: out now, without saving
        raise Stop(f"interrupted at iter {iter_num}, not saved; {last_good()}"
                   + (f"\n{resume_hint(cfg, set_keys)}" if ckpt_iter is not None else ""), 130) from None
    except Exception as e:
        if is_oom(e):
            raise Stop(f"out of memory at iter {iter_num} with batch_size={B}, block_size={T} on {device}; try "
                       f"--batch_size={max(1, B // 2)} --gradient_accumulation_steps={2 * accum_total} "
                       f"(same tokens per step, half the memory)", 2) from None
        raise
    finally:
        log.close()

    # the end: what the user wants to know, in two lines
    if master:
        n, secs = timed[1] if timed[1][0] else timed[0]  # leave out the first row's compilation if there is more
        rate = f" ({n * tokens_per_iter / secs:,.0f} tokens/s training)" if secs > 0 else ''
        where = (f"saved {ckpt_path} (iter {last_saved_iter})" if last_saved_iter is not None else
                 f"{ckpt_path} not updated (val loss did not improve on {best_val_loss:.4f})"
                 if os.path.isfile(ckpt_path) else "no checkpoint saved")
        val = f"val loss {last_val:.4f}" if last_val is not None else "no new eval"
        print(f"done: {iter_num} iters in {human_time(time.time() - t_start)}{rate}; {val}; {where}", flush=True)
        if os.path.isfile(ckpt_path):
            flag = '' if cfg['out_dir'] == 'out' else f" --out_dir={cfg['out_dir']}"
            print(f"sample from it: python sample.py{flag}", flush=True)
    return dict(iter_num=iter_num, val_loss=last_val, best_val_loss=best_val_loss)


if __name__ == '__main__':
    run_main(main)
