"""
Train and evaluate ToST vision models on CIFAR-10/100, and look at what they learned.

    python prepare_data.py cifar10                     # once (163 MB download, or --archive=PATH offline)
    python train_vit.py --dataset=cifar10              # tost-cifar from scratch, test top-1 after every epoch
    python train_vit.py --dataset=cifar10 --attn=softmax --out_dir=out-vit-softmax    # the baseline, all else equal
    python train_vit.py --init_from=resume                 # go on from out-vit/ckpt.pt, e.g. after Ctrl-C
    python train_vit.py --dataset=cifar10 --init_from=best --eval_only                # accuracy of out-vit/best.pt
    python train_vit.py --dataset=cifar10 --model=tost-cifar-tiny --epochs=3 --device=cpu --out_dir=out-vit-tiny

A new run refuses an out_dir that holds ckpt.pt or best.pt: add --init_from=resume to go on (the run's
settings come from its checkpoint; keys given on the command line win), or pass another --out_dir, or
--overwrite=true. Ctrl-C (or SIGTERM) saves ckpt.pt at the current step, also inside an epoch, and prints
the command that resumes it; a second Ctrl-C, a second later, stops at once without saving.

One node, 4 GPUs (batch_size is per process: 4 x 128 images a step):

    torchrun --standalone --nproc_per_node=4 train_vit.py --dataset=cifar100 --model=tost-s

Two nodes of 8 GPUs, the first at 10.0.0.1:

    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=10.0.0.1 --master_port=29500 \
        train_vit.py --dataset=cifar100 --model=tost-s
    torchrun --nnodes=2 --node_rank=1 --nproc_per_node=8 --master_addr=10.0.0.1 --master_port=29500 \
        train_vit.py --dataset=cifar100 --model=tost-s

Models (tost.py presets): tost-cifar (default, 6 TSSA layers, 192 wide, 8x8 tokens of 4x4 pixels),
tost-cifar-tiny, and the paper's shapes tost-t / tost-s / tost-m. Those three are 224px models with
16x16 patches; on images of 64px or less this script cuts 4x4 patches instead (8x8 tokens on CIFAR),
everything else is the paper's shape. num_classes comes from the dataset. Note the paper's CIFAR
numbers (95.5-97.5% on CIFAR-10) are fine-tuned from ImageNet; here the models train from scratch.

What you get in out_dir: ckpt.pt (the latest epoch, or the step Ctrl-C stopped at) and best.pt (the best
test accuracy so far); log.jsonl, a line per epoch (train and test loss, test accuracy, and `compression`:
R^var_c, tost.py's objective, of each TSSA layer's output on the first compression_images test images,
which the paper reports falling with depth; the terminal shows it as a bar per layer); loss.png (test
accuracy by epoch); viz/, a figure per test image: the image and the CLS token's class attention per
head, then the head that claims each patch (argmax of Pi) and Pi per head of TSSA layer viz_layer.

Data stays on the device as uint8; augmentation (pad-4 random crop, horizontal flip, optional
mixup/cutmix) runs there in torch, so the CPU does not feed the GPU.
"""
import math
import os
import sys
import time
from dataclasses import asdict

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import tost
from options import UsageError, parse, run_main
from prepare_data import load_meta
from train_common import (GracefulStop, RunLog, Stop, atomic_save, autocast, check_out_dir, cosine_lr, human_time,
                          launch, load_checkpoint, make_grad_scaler, resolve_dtype, resume_command, seed_everything,
                          strip_compile_prefix, sum_dtype, train_step)

# -----------------------------------------------------------------------------
# default cfg values: tost-cifar on CIFAR-10, from scratch. Override with --key=value.
DEFAULTS = dict(
    # data and I/O
    dataset='cifar10',          # a folder under data_dir made by prepare_data.py (cifar10, cifar100)
    data_dir='data',            # where prepare_data.py puts datasets
    out_dir='out-vit',          # ckpt.pt, best.pt, log.jsonl, viz/
    init_from='scratch',        # scratch, resume (out_dir/ckpt.pt), best (out_dir/best.pt: --eval_only) or a .pt
    overwrite=False,            # a new run into an out_dir that holds ckpt.pt/best.pt: delete them (else refuse)
    eval_only=False,            # evaluate the init_from checkpoint, write the pictures, exit
    # model
    model='tost-cifar',         # a vision preset of tost.py: tost-cifar, tost-cifar-tiny, tost-t, tost-s, tost-m
    attn='tssa',                # tssa (ToST) or softmax (the baseline, everything else equal)
    lpi=False,                  # not in the paper: XCiT's local patch interaction (3x3 depthwise convs) per block
    drop_path=0.0,              # stochastic depth; if not set, the preset's (tost-s 0.05, tost-m 0.15)
    # optimisation: AdamW, linear warmup then cosine, per step
    epochs=100,                 # passes over the training images
    batch_size=128,             # images per step per process
    learning_rate=1e-3,         # peak
    min_lr=1e-5,                # at the end of the cosine
    weight_decay=0.05,          # matrices only (tost.param_groups)
    beta1=0.9,                  # AdamW's first-moment decay
    beta2=0.999,                # AdamW's second-moment decay
    grad_clip=1.0,              # max gradient norm; 0 disables
    warmup_epochs=5.0,          # linear warmup, then the cosine
    label_smoothing=0.1,        # of the cross-entropy targets
    mixup=0.0,                  # Beta(alpha, alpha) of mixup; 0 disables (the paper's ImageNet recipe: 0.8)
    cutmix=0.0,                 # the same for cutmix (paper: 1.0); with both on, each step picks one
    max_steps=0,                # cap on steps per epoch, for smoke tests; 0: the whole epoch
    # evaluation and logging
    eval_interval=1,            # epochs between test-set evaluations (the last epoch is always evaluated)
    log_interval=20,            # steps between progress updates
    compression_images=128,     # first N test images on which R^var_c of every TSSA layer is measured; 0: skip
    viz_images=4,               # test images drawn to out_dir/viz/ at each evaluation; 0: none
    viz_layer=-1,               # the TSSA layer whose memberships Pi are drawn
    # system
    device='auto',              # auto, cpu, cuda, cuda:N, mps
    dtype='auto',               # auto (bfloat16 on GPU, float32 on CPU), bfloat16, float16, float32
    compile=False,              # torch.compile the model
    seed=1337,                  # model init, augmentation and the data order follow from it
)
PAPER_SHAPES = ('tost-t', 'tost-s', 'tost-m')  # 224px / patch 16 in the paper
MACHINE_KEYS = ('device', 'dtype', 'compile', 'out_dir', 'init_from', 'eval_only', 'overwrite')  # not resumed

# -----------------------------------------------------------------------------
# data: uint8 tensors on the device, augmented there


def load_images(data_dir, name, device):
    """(meta, train x, train y, test x, test y): images (N, C, H, W) uint8 and labels (N,) int64, on device."""
    folder = os.path.join(data_dir, name)
    meta = load_meta(folder)
    if meta.get('kind') != 'images':
        raise UsageError(f"{folder} holds a {meta.get('kind')} dataset, not images; train it with train_gpt.py")
    arrays = []
    for split in ('train', 'test'):
        paths = [os.path.join(folder, f'{split}_{what}.npy') for what in ('images', 'labels')]
        try:
            x, y = np.load(paths[0]), np.load(paths[1])
        except (OSError, ValueError) as e:
            raise UsageError(f"{folder} is incomplete or damaged ({e}); rebuild it: "
                             f"python prepare_data.py {name} --data_dir={data_dir} --force") from None
        if x.dtype != np.uint8 or x.ndim != 4 or y.shape != (len(x),) or not len(x):
            raise UsageError(f"{paths[0]} should be (N, C, H, W) uint8 with N labels, got {x.dtype} {x.shape} "
                             f"and {y.shape} labels")
        if y.min() < 0 or y.max() >= meta['num_classes']:
            raise UsageError(f"{paths[1]} has labels outside 0..{meta['num_classes'] - 1}")
        arrays += [torch.from_numpy(x).to(device), torch.from_numpy(y.astype(np.int64)).to(device)]
    if arrays[0].shape[1:] != arrays[2].shape[1:]:
        raise UsageError(f"{folder}: train images are {tuple(arrays[0].shape[1:])}, test {tuple(arrays[2].shape[1:])}")
    return (meta, *arrays)


def normalizer(meta, device):
    """uint8 images -> float, standardised per channel with the dataset's mean and std (from meta.json)."""
    mean = torch.tensor(meta['mean'], device=device).view(1, -1, 1, 1)
    std = torch.tensor(meta['std'], device=device).view(1, -1, 1, 1)
    return lambda x: (x.float() / 255 - mean) / std


def random_crop_flip(x, pad=4):
    """x (B, C, H, W) uint8 -> the same shape: zero-pad by `pad`, cut an H x W window at a random offset per
    image, mirror half of them. One gather, no loop over images: the window's rows and columns are index
    vectors per image, and the flip just reads the columns right to left."""
    B, C, H, W = x.shape
    dev = x.device
    xp = F.pad(x, (pad, pad, pad, pad))                                      # (B, C, H+2p, W+2p), black border
    oy, ox = torch.randint(0, 2 * pad + 1, (2, B, 1), device=dev)           # (B, 1) offsets
    rows = oy + torch.arange(H, device=dev)                                  # (B, H)
    cols = ox + torch.arange(W, device=dev)                                  # (B, W)
    flip = torch.rand(B, 1, device=dev) < 0.5
    cols = torch.where(flip, cols.flip(1), cols)                             # horizontal flip
    b = torch.arange(B, device=dev).view(B, 1, 1, 1)
    c = torch.arange(C, device=dev).view(1, C, 1, 1)
    return xp[b, c, rows.view(B, 1, H, 1), cols.view(B, 1, 1, W)]            # (B, C, H, W)


def mix(x, y, mixup, cutmix):
    """Mixup or cutmix of the batch with itself reversed. x (B, C, H, W) float, y (B, classes) probabilities.
    Mixup blends whole images with weight lam ~ Beta(a, a); cutmix pastes a box of area ~(1 - lam) and sets
    lam to the area actually kept. The targets mix with the same lam."""
    use_cutmix = cutmix > 0 and (mixup <= 0 or torch.rand(()).item() < 0.5)
    alpha = cutmix if use_cutmix else mixup
    lam = torch.distributions.Beta(alpha, alpha).sample().item()
    x2, y2 = x.flip(0), y.flip(0)
    if use_cutmix:
        H, W = x.shape[-2:]
        h, w = int(H * math.sqrt(1 - lam)), int(W * math.sqrt(1 - lam))
        cy, cx = torch.randint(0, H, ()).item(), torch.randint(0, W, ()).item()
        y0, y1 = max(cy - h // 2, 0), min(cy + h - h // 2, H)
        x0, x1 = max(cx - w // 2, 0), min(cx + w - w // 2, W)
        x = x.clone()
        x[:, :, y0:y1, x0:x1] = x2[:, :, y0:y1, x0:x1]
        lam = 1 - (y1 - y0) * (x1 - x0) / (H * W)
    else:
        x = lam * x + (1 - lam) * x2
    return x, lam * y + (1 - lam) * y2


def soft_targets(y, num_classes, smoothing):
    """Labels (B,) -> probabilities (B, classes), smoothed as F.cross_entropy(label_smoothing=) does."""
    return F.one_hot(y, num_classes).float() * (1 - smoothing) + smoothing / num_classes


def train_shard(n, seed, epoch, rank, world_size):
    """This rank's indices for one epoch. All ranks draw the same permutation (seeded by seed and epoch)
    and take every world_size-th entry from their rank on; the permutation is padded with its own start
    to a multiple of world_size, so the ranks hold the same count (DDP needs equal steps) and together
    cover every image."""
    g = torch.Generator().manual_seed(seed * 100003 + epoch)
    perm = torch.randperm(n, generator=g)
    per_rank = -(-n // world_size)
    perm = torch.cat([perm, perm[:per_rank * world_size - n]])
    return perm[rank::world_size]                                            # (per_rank,)


def eval_shard(n, rank, world_size):
    """Contiguous slices of the test set, sizes differing by at most one: each image counted exactly once."""
    return torch.arange(n).tensor_split(world_size)[rank]

# -----------------------------------------------------------------------------
# model and checkpoints


def checkpoint_path(cfg):
    init = cfg['init_from']
    return {'resume': os.path.join(cfg['out_dir'], 'ckpt.pt'),
            'best': os.path.join(cfg['out_dir'], 'best.pt')}.get(init, init)


def check_vit_checkpoint(ckpt, path):
    if ckpt.get('kind') == 'vit' and isinstance(ckpt.get('model_args'), dict) and 'model' in ckpt:
        return
    args = ckpt.get('model_args')
    if isinstance(args, dict) and ('vocab_size' in args or 'block_size' in args):
        raise UsageError(f"{path} is a language-model checkpoint; use sample.py / train_gpt.py")
    raise UsageError(f"{path} is not a train_vit.py checkpoint (no kind='vit' with model and model_args)")


def model_config(cfg, set_keys, meta, image_shape, ckpt=None, path=None):
    """The ViTConfig: the preset with the dataset's classes and image size, or the checkpoint's own."""
    C, H, W = image_shape
    if ckpt is not None:
        args = dict(ckpt['model_args'])
        for key, ck in (('model', ckpt.get('config', {}).get('model')), ('attn', args.get('attn')),
                        ('lpi', args.get('lpi', False))):
            if key in set_keys and ck is not None and cfg[key] != ck:
                raise UsageError(f"--{key}={cfg[key]} but {path} holds a {key}={ck} model")
        if args.get('num_classes') != meta['num_classes']:
            raise UsageError(f"{path} has {args.get('num_classes')} classes but {cfg['dataset']} has "
                             f"{meta['num_classes']}; use a checkpoint trained on {cfg['dataset']}")
        if args.get('in_chans') != C:
            raise UsageError(f"{path} takes {args.get('in_chans')}-channel images, {cfg['dataset']} has {C}")
    else:
        spec = tost.PRESETS.get(cfg['model'])
        if spec is None or spec['kind'] != 'vit':
            names = [k for k, v in tost.PRESETS.items() if v['kind'] == 'vit']
            raise UsageError(f"--model={cfg['model']} is not a vision preset; choose one of {', '.join(names)}")
        if cfg['attn'] not in tost.ATTN_KINDS:
            raise UsageError(f"--attn={cfg['attn']}: choose one of {', '.join(tost.ATTN_KINDS)}")
        args = asdict(tost.preset(cfg['model']))
        if cfg['model'] in PAPER_SHAPES and H <= 64:
            args['patch_size'] = 4                              # 32px: an 8x8 grid (224px / 16 is 14x14)
        args.update(num_classes=meta['num_classes'], in_chans=C, attn=cfg['attn'], lpi=cfg['lpi'])
        if 'drop_path' in set_keys:
            args['drop_path'] = cfg['drop_path']
    p = args['patch_size']
    if H % p or W % p:
        raise UsageError(f"{cfg['dataset']} has {H}x{W} images, which {p}x{p} patches do not tile; "
                         f"this model needs image sides that are multiples of {p}")
    args['img_size'] = H
    try:
        return tost.ViTConfig(**args)
    except (TypeError, ValueError) as e:
        raise UsageError(f"cannot build the model: {e}") from None


def check_config(c):
    positive = ('epochs', 'batch_size', 'learning_rate', 'eval_interval', 'log_interval')
    for key in positive:
        if c[key] <= 0:
            raise UsageError(f"--{key} must be positive, got {c[key]}")
    for key in ('min_lr', 'weight_decay', 'grad_clip', 'warmup_epochs', 'mixup', 'cutmix', 'max_steps',
                'compression_images', 'viz_images', 'drop_path'):
        if c[key] < 0:
            raise UsageError(f"--{key} must be >= 0, got {c[key]}")
    if not 0 <= c['label_smoothing'] < 1:
        raise UsageError(f"--label_smoothing must be in [0, 1), got {c['label_smoothing']}")
    if c['init_from'] not in ('scratch', 'resume', 'best') and not c['init_from'].endswith('.pt'):
        raise UsageError(f"--init_from={c['init_from']}: use scratch, resume, best or a path to a .pt file")
    if c['eval_only'] and c['init_from'] == 'scratch':
        raise UsageError("--eval_only needs a checkpoint: --init_from=resume, best or a path to a .pt file")

# -----------------------------------------------------------------------------
# evaluation: test accuracy (all ranks), per-layer compression and pictures (master)


@torch.no_grad()
def evaluate(model, x, y, norm, batch_size, device, dtype, dist):
    """(accuracy, mean loss, images) over the whole test set, sharded over the ranks and all-reduced."""
    was_training = model.training
    model.eval()
    if dist.ddp:  # BatchNorm running stats drift apart on each rank's last batches: use rank 0's, which it saves
        for buf in model.buffers():
            torch.distributed.broadcast(buf, 0)
    idx = eval_shard(len(x), dist.rank, dist.world_size).to(x.device)
    stats = torch.zeros(3, dtype=sum_dtype(device), device=device)    # correct, loss sum, count
    for i in range(0, len(idx), batch_size):
        b = idx[i:i + batch_size]
        with autocast(device, dtype):
            logits = model(norm(x[b]))
        stats[0] += (logits.argmax(-1) == y[b]).sum()
        stats[1] += F.cross_entropy(logits.float(), y[b], reduction='sum')
        stats[2] += len(b)
    if dist.ddp:
        torch.distributed.all_reduce(stats)
    model.train(was_training)
    correct, loss, count = stats.tolist()
    return correct / count, loss / count, int(count)


def compression_chart(values, n_images, width=32):
    """A bar per TSSA layer, as lines of text: the paper's per-layer R^var_c figure in a terminal."""
    blocks = ' ▏▎▍▌▋▊▉'
    top = max(values) or 1.0
    lines = [f"R^var_c of each TSSA layer's output, mean over {n_images} test images (the paper's falls with depth):"]
    for i, v in enumerate(values):
        eighths = max(0, round(8 * width * v / top))
        bar = '█' * (eighths // 8) + (blocks[eighths % 8] if eighths % 8 else '')
        lines.append(f"  layer {i:2d}  {bar:<{width}}  {v:.4g}")
    if len(values) > 1 and values[0]:
        change = 100 * (values[-1] / values[0] - 1)
        lines.append(f"  first -> last: {values[0]:.4g} -> {values[-1]:.4g} ({change:+.1f}%)")
    return lines


@torch.no_grad()
def look_inside(model, x, y, norm, cfg, meta, n_tssa):
    """Per-layer compression of the fixed test batch, and the PNGs. Runs on the master only, in float32.
    Returns (list of R^var_c per TSSA layer, lines to print)."""
    n = max(cfg['compression_images'], cfg['viz_images'])
    if n == 0:
        return [], []
    was_training = model.training
    model.eval()
    out = model.inspect(norm(x[:n]), layer=cfg['viz_layer'] if n_tssa else -1)
    v = min(cfg['viz_images'], len(x))
    pred = model(norm(x[:v])).argmax(-1).tolist() if v else []
    model.train(was_training)
    lines, comp = [], []
    if out['compression'] and cfg['compression_images']:
        m = cfg['compression_images']
        comp = [c[:m].float().mean().item() for c in out['compression']]
        lines += compression_chart(comp, min(m, len(x)))
    if v:
        folder = os.path.join(cfg['out_dir'], 'viz')
        classes = meta.get('classes') or [str(i) for i in range(meta['num_classes'])]
        names = [f"{i}: {classes[y[i]]}" + ("" if pred[i] == y[i] else f" (predicted {classes[pred[i]]})")
                 for i in range(v)]
        try:
            import plot                                        # matplotlib: an old environment may lack it
            os.makedirs(folder, exist_ok=True)
            for i in range(v):
                plot.vision_maps(os.path.join(folder, f'test{i:04d}.png'), x[i].cpu(), out['cls_attn'][i].cpu(),
                                 None if out['pi'] is None else out['pi'][i].cpu(), names[i])
        except Exception as e:                                 # a picture never stops training
            lines.append(f"could not draw the maps ({type(e).__name__}: {e}); training goes on")
            return comp, lines
        layer = f", Pi of TSSA layer {cfg['viz_layer'] % n_tssa}" if n_tssa else ""
        lines.append(f"wrote {v} PNG{'s' * (v > 1)} to {folder} (CLS attention{layer}): " + ", ".join(names))
    return comp, lines

# -----------------------------------------------------------------------------
# the run: set-up, one training step, evaluation and checkpoint, interrupt, summary


def compile_model(model, compile):
    """torch.compile (or the model itself). Static shapes: the last batch of an epoch or of the test set is
    smaller, and gets its own graph, compiled once and reused in every epoch; the full batches keep theirs.
    (By default the compiler would recompile at that batch into one graph for every batch size, which then
    also serves the full batches, with kernels that do not know their size.)"""
    return torch.compile(model, dynamic=False) if compile else model


def step_seed(seed, epoch, step, rank):
    """Augmentation, mixup and drop-path draw from a generator seeded per step: a run stopped at any step
    resumes with the same random numbers."""
    return int(np.random.SeedSequence([seed, epoch, step, rank]).generate_state(1)[0])


class Trainer:
    def __init__(self, cfg, set_keys, dist):
        """Set-up: the checkpoint to start from, the data on the device, the model and optimizer."""
        self.dist, self.device = dist, dist.device
        self.dtype = resolve_dtype(cfg['dtype'], self.device)
        ckpt = path = None
        if cfg['init_from'] != 'scratch':
            path = checkpoint_path(cfg)
            ckpt = load_checkpoint(path, map_location=self.device)
            check_vit_checkpoint(ckpt, path)
        if cfg['init_from'] == 'resume' and isinstance(ckpt.get('config'), dict):   # it goes on as it was
            old = ckpt['config']
            cfg = {k: v if k in set_keys or k in MACHINE_KEYS or k not in old else old[k] for k, v in cfg.items()}
        elif not cfg['eval_only']:  # a new run: it must not replace another run's checkpoints
            if path and os.path.abspath(os.path.dirname(path)) == os.path.abspath(cfg['out_dir']):
                raise UsageError(f"training from {path} would overwrite the checkpoints beside it; "
                                 f"pick another --out_dir (or --init_from=resume to go on)")
            check_out_dir([os.path.join(cfg['out_dir'], f) for f in ('ckpt.pt', 'best.pt')], cfg['overwrite'],
                          dist.master)
        self.cfg, self.set_keys, self.path, self.ckpt_epoch = cfg, set_keys, path, ckpt and ckpt.get('epoch')
        seed_everything(cfg['seed'], dist.rank)
        self.meta, self.x_train, self.y_train, self.x_test, self.y_test = load_images(cfg['data_dir'], cfg['dataset'],
                                                                                      self.device)
        self.norm = normalizer(self.meta, self.device)
        self.vit_config = model_config(cfg, set_keys, self.meta, tuple(self.x_train.shape[1:]), ckpt, path)
        self.n_tssa = self.vit_config.n_layer if self.vit_config.attn == 'tssa' else 0
        if self.n_tssa and not -self.n_tssa <= cfg['viz_layer'] < self.n_tssa:
            raise UsageError(f"--viz_layer={cfg['viz_layer']}: the model has {self.n_tssa} TSSA layers "
                             f"(0..{self.n_tssa - 1}, or -1 for the last)")
        self.raw_model = tost.ViT(self.vit_config).to(self.device)
        if ckpt is not None:
            try:
                self.raw_model.load_state_dict(strip_compile_prefix(ckpt['model']))
            except RuntimeError as e:
                raise UsageError(f"{path} does not fit its own model_args ({str(e).splitlines()[0]})") from None
        # evaluation without DDP: after a training step its forward broadcasts the BatchNorm buffers, a collective,
        # and the ranks run different numbers of test batches (evaluate() broadcasts them once, on every rank)
        self.eval_model = compile_model(self.raw_model, cfg['compile'])
        if not cfg['eval_only']:
            self._build_optimizer(ckpt)

    def _build_optimizer(self, ckpt):
        cfg, dist = self.cfg, self.dist
        self.optimizer = self.raw_model.configure_optimizers(cfg['weight_decay'], cfg['learning_rate'],
                                                             (cfg['beta1'], cfg['beta2']), self.device.split(':')[0])
        self.scaler = make_grad_scaler(self.device, self.dtype)
        n_train, bs = len(self.x_train), cfg['batch_size']
        self.steps_per_epoch = -(-(-(-n_train // dist.world_size)) // bs)   # ceil(ceil(n / ranks) / batch)
        if cfg['max_steps']:
            self.steps_per_epoch = min(self.steps_per_epoch, cfg['max_steps'])
        self.start_epoch, self.start_step, self.best_acc, self.loss_carry, self.elapsed = 0, 0, 0.0, 0.0, 0.0
        self.ckpt_at = None                                          # (epoch, step) of the checkpoint on disk
        if cfg['init_from'] == 'resume':
            missing = [k for k in ('optimizer', 'epoch', 'best_acc') if k not in ckpt]
            if missing:
                raise UsageError(f"{self.path} cannot be resumed: it has no {', '.join(missing)}")
            self.optimizer.load_state_dict(ckpt['optimizer'])
            if ckpt.get('scaler'):
                self.scaler.load_state_dict(ckpt['scaler'])
            self.start_epoch, self.best_acc = int(ckpt['epoch']), float(ckpt['best_acc'])
            self.start_step, self.loss_carry = int(ckpt.get('step', 0)), float(ckpt.get('epoch_loss_sum', 0.0))
            self.elapsed, self.ckpt_at = float(ckpt.get('elapsed_s', 0.0)), (self.start_epoch, self.start_step)
        # a checkpoint inside an epoch of another size (other batch or process count): redo that epoch
        self.redo = self.start_step and (ckpt.get('steps_per_epoch'), ckpt.get('world_size')) != \
            (self.steps_per_epoch, dist.world_size)
        cfg['drop_path'] = self.vit_config.drop_path  # what the model uses, in the saved config
        # DDP inside, the compiler outside (the order PyTorch documents): the compiled backward then starts each
        # bucket's all-reduce as soon as its gradients are ready, instead of all of them after the whole backward
        model = DDP(self.raw_model, device_ids=[dist.local_rank] if self.device.startswith('cuda') else None) \
            if dist.ddp else self.raw_model
        self.model = compile_model(model, cfg['compile'])
        self.epoch, self.step_in_epoch = self.start_epoch, self.start_step

    def describe(self, log):
        c, cfg, dist = self.vit_config, self.cfg, self.dist
        log.print(f"{cfg['model']} ({c.attn}{' + lpi' if c.lpi else ''}, {c.n_layer} layers, {c.n_embd} wide, "
                  f"{(c.img_size // c.patch_size) ** 2} tokens): {self.raw_model.get_num_params() / 1e6:.2f}M params | "
                  f"{cfg['dataset']}: {len(self.x_train)} train / {len(self.x_test)} test images, "
                  f"{self.meta['num_classes']} classes | {dist.world_size} x {self.device} {self.dtype} | "
                  f"{self.steps_per_epoch} steps of {dist.world_size} x {cfg['batch_size']} per epoch")
        log.record({'kind': 'config', **cfg, 'attn': c.attn, 'lpi': c.lpi, 'params': self.raw_model.get_num_params()})
        if cfg['init_from'] == 'resume':
            log.print(f"resuming {self.path} after {self.where(self.start_epoch, self.start_step)} (best test "
                      f"accuracy {self.best_acc:.4f})")
        if self.redo:
            log.print(f"note: the checkpoint stopped inside epoch {self.start_epoch + 1} with {self.start_step} "
                      f"steps of another size; this run redoes that epoch from its start")
            self.start_step = self.step_in_epoch = 0
            self.loss_carry = 0.0

    def where(self, epoch, step):
        return f"epoch {epoch}" if step == 0 else f"epoch {epoch} + {step}/{self.steps_per_epoch} steps"

    # --- one training step ------------------------------------------------------------------------------

    def step(self, epoch, step, shard):
        """One optimizer step on this rank's next batch_size images, augmented on the device."""
        cfg, C = self.cfg, self.meta['num_classes']
        torch.manual_seed(step_seed(cfg['seed'], epoch, step, self.dist.rank))
        spe = self.steps_per_epoch
        lr = cosine_lr(epoch * spe + step, cfg['learning_rate'], cfg['min_lr'], cfg['warmup_epochs'] * spe,
                       cfg['epochs'] * spe)
        for group in self.optimizer.param_groups:
            group['lr'] = lr
        idx = shard[step * cfg['batch_size']:(step + 1) * cfg['batch_size']]
        x, y = self.norm(random_crop_flip(self.x_train[idx])), self.y_train[idx]
        smoothing = cfg['label_smoothing']
        if cfg['mixup'] > 0 or cfg['cutmix'] > 0:      # soft targets: the smoothing is in them
            x, y = mix(x, soft_targets(y, C, smoothing), cfg['mixup'], cfg['cutmix'])
            smoothing = 0.0
        loss = train_step(self.model, [lambda: (x, y)],
                          lambda model, x, y: F.cross_entropy(model(x).float(), y, label_smoothing=smoothing),
                          self.optimizer, self.scaler, cfg['grad_clip'], autocast(self.device, self.dtype),
                          self.dist.ddp)
        return loss, lr, len(idx)

    # --- evaluation and checkpoint ----------------------------------------------------------------------

    def end_of_epoch(self, log, epoch, loss_sum, lr):
        """Mean train loss over all ranks, test accuracy, pictures, the log row and the checkpoints."""
        cfg, dist = self.cfg, self.dist
        last = epoch + 1 == cfg['epochs']
        if dist.ddp:
            torch.distributed.all_reduce(loss_sum)
        train_loss = loss_sum.item() / (self.steps_per_epoch * dist.world_size)
        row = {'epoch': epoch + 1, 'step': (epoch + 1) * self.steps_per_epoch, 'lr': lr, 'train_loss': train_loss}
        improved = False
        if (epoch + 1) % cfg['eval_interval'] == 0 or last:
            acc, test_loss, count = evaluate(self.eval_model, self.x_test, self.y_test, self.norm, cfg['batch_size'],
                                             self.device, self.dtype, dist)
            improved, self.best_acc = acc > self.best_acc, max(self.best_acc, acc)
            row.update(test_loss=test_loss, test_acc=acc, best_acc=self.best_acc, test_images=count)
            if dist.master:
                comp, lines = look_inside(self.raw_model, self.x_test, self.y_test, self.norm, cfg, self.meta,
                                          self.n_tssa)
                if comp:                    # R^var_c per TSSA layer (none with softmax attention)
                    row['compression'] = comp
                log.print(f"epoch {epoch + 1}/{cfg['epochs']}: train loss {train_loss:.4f}, test loss "
                          f"{test_loss:.4f}, test acc {acc:.4f} (best {self.best_acc:.4f}), "
                          f"{human_time(time.time() - self.t_start)} so far")
                for line in lines:
                    log.print(line)
                if sys.stdout.isatty():  # keep test_acc in the live table (a plain log has the line above)
                    log.show({'epoch': epoch + 1, 'test_acc': acc, 'best_acc': self.best_acc})
        else:
            log.print(f"epoch {epoch + 1}/{cfg['epochs']}: train loss {train_loss:.4f}")
        row['time_s'] = self.elapsed_s()
        log.record(row)
        if 'test_acc' in row:
            log.draw()
        self.save(epoch + 1, 0, 0.0, improved)

    def elapsed_s(self):
        """Seconds of this run so far, the runs it resumed included."""
        return round(self.elapsed + time.time() - self.t_start, 2)

    def save(self, epoch, step, loss_sum, improved=False):
        """ckpt.pt (and best.pt if improved) after `epoch` whole epochs and `step` steps of the next (rank 0)."""
        if self.dist.master:
            state = {'model': self.raw_model.state_dict(), 'optimizer': self.optimizer.state_dict(),
                     'scaler': self.scaler.state_dict(), 'model_args': asdict(self.vit_config), 'kind': 'vit',
                     'epoch': epoch, 'step': step, 'epoch_loss_sum': loss_sum, 'steps_per_epoch': self.steps_per_epoch,
                     'world_size': self.dist.world_size, 'best_acc': self.best_acc, 'config': dict(self.cfg),
                     'meta': self.meta, 'elapsed_s': self.elapsed_s()}
            atomic_save(state, os.path.join(self.cfg['out_dir'], 'ckpt.pt'))
            if improved:
                atomic_save(state, os.path.join(self.cfg['out_dir'], 'best.pt'))
        self.ckpt_at = (epoch, step)

    # --- interrupt --------------------------------------------------------------------------------------

    def resume_hint(self):
        return resume_command('train_vit.py', self.cfg, self.set_keys, DEFAULTS)

    def interrupted(self, signal_name, epoch, step, loss_sum):
        """Ctrl-C or SIGTERM at a step boundary: save here (rank 0), then a Stop that says how to go on."""
        how, resume = f"interrupted ({signal_name}) at {self.where(epoch, step)}", f"\n{self.resume_hint()}"
        if (epoch, step) == self.ckpt_at and not self.redo:
            msg = f"{how}; {self.cfg['out_dir']}/ckpt.pt is there already{resume}"
        elif (epoch, step) == (self.start_epoch, self.start_step):
            msg = f"{how}, before the first step: nothing to save"
        else:
            if self.dist.ddp:
                torch.distributed.all_reduce(loss_sum)
            self.save(epoch, step, loss_sum.item())
            msg = f"{how}: saved {self.cfg['out_dir']}/ckpt.pt{resume}"
        if self.dist.ddp:
            torch.distributed.barrier()  # the other ranks wait while rank 0 writes
        return Stop(msg, 130)

    def stopped_now(self):
        """A second Ctrl-C: out at once, without saving."""
        saved = f"{self.cfg['out_dir']}/ckpt.pt is from {self.where(*self.ckpt_at)}" if self.ckpt_at else \
            "no checkpoint yet"
        hint = f"\n{self.resume_hint()}" if self.ckpt_at else ""
        return Stop(f"interrupted at {self.where(self.epoch, self.step_in_epoch)}, not saved; {saved}{hint}", 130)

    # --- the loop and the summary -----------------------------------------------------------------------

    def train(self, log):
        cfg, dist = self.cfg, self.dist
        self.t_start = time.time()
        try:
            with GracefulStop(dist) as stop:
                for self.epoch in range(self.start_epoch, cfg['epochs']):
                    shard = train_shard(len(self.x_train), cfg['seed'], self.epoch, dist.rank, dist.world_size)
                    shard = shard.to(self.device)
                    first = self.start_step if self.epoch == self.start_epoch else 0
                    # this rank's share of the loss summed so far this epoch (a resumed epoch brings its sum)
                    loss_sum = torch.full((), self.loss_carry / dist.world_size if first else 0.0, device=self.device)
                    t0, seen, steps = time.time(), 0, 0
                    self.model.train()
                    for self.step_in_epoch in range(first, self.steps_per_epoch):
                        if stop.requested():           # Ctrl-C or SIGTERM on any rank: all stop at this step
                            raise self.interrupted(stop.signal or 'on another rank', self.epoch, self.step_in_epoch,
                                                   loss_sum)
                        loss, lr, n = self.step(self.epoch, self.step_in_epoch, shard)
                        loss_sum += loss
                        seen, steps = seen + n * dist.world_size, steps + 1
                        if (self.step_in_epoch + 1) % cfg['log_interval'] == 0 or \
                                self.step_in_epoch + 1 == self.steps_per_epoch:
                            dt = time.time() - t0                        # loss.item() below waits for the device
                            log.show({'epoch': round(self.epoch + (self.step_in_epoch + 1) / self.steps_per_epoch, 3),
                                      'loss': loss.item(), 'lr': lr, 'img_per_s': seen / dt,
                                      'ms_per_step': 1000 * dt / steps})
                            t0, seen, steps = time.time(), 0, 0
                    self.end_of_epoch(log, self.epoch, loss_sum, lr)
        except KeyboardInterrupt:                                            # a second Ctrl-C: out now
            raise self.stopped_now() from None

    def evaluate_only(self):
        """--eval_only: the checkpoint's test accuracy, its per-layer compression and its pictures."""
        cfg, dist = self.cfg, self.dist
        acc, loss, count = evaluate(self.eval_model, self.x_test, self.y_test, self.norm, cfg['batch_size'],
                                    self.device, self.dtype, dist)
        if dist.master:
            with RunLog(cfg['out_dir'], filename='eval.jsonl', fresh=False) as log:
                comp, lines = look_inside(self.raw_model, self.x_test, self.y_test, self.norm, cfg, self.meta,
                                          self.n_tssa)
                print(f"{self.path} (epoch {self.ckpt_epoch}): test accuracy {acc:.4f} ({round(acc * count)}/{count}), "
                      f"test loss {loss:.4f}", flush=True)
                for line in lines:
                    print(line, flush=True)
                log.record({'checkpoint': self.path, 'epoch': self.ckpt_epoch, 'test_acc': acc, 'test_loss': loss,
                            'test_images': count, **({'compression': comp} if comp else {})})
        return acc


def train(cfg, set_keys, dist):
    run = Trainer(cfg, set_keys, dist)
    if run.cfg['eval_only']:
        return run.evaluate_only()
    cfg = run.cfg
    with RunLog(cfg['out_dir'], enabled=dist.master, total=cfg['epochs'], unit='epoch', resume_from=run.start_epoch,
                fresh=cfg['init_from'] != 'resume') as log:  # closed on Ctrl-C too: the terminal is left clean
        run.describe(log)
        if run.start_epoch >= cfg['epochs']:
            log.print(f"nothing to do: the checkpoint has {run.start_epoch} of --epochs={cfg['epochs']} epochs; "
                      f"raise --epochs")
            return run.best_acc
        run.train(log)
        log.print(f"done: best test accuracy {run.best_acc:.4f} in {human_time(time.time() - run.t_start)}; "
                  f"checkpoints in {cfg['out_dir']}")
    return run.best_acc


def main(argv=None):
    cfg, set_keys = parse(sys.argv[1:] if argv is None else argv, DEFAULTS, __doc__, __file__)
    check_config(cfg)
    return launch(train, cfg, set_keys)


if __name__ == '__main__':
    run_main(main)
