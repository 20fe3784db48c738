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

What you get in out_dir:
    ckpt.pt      the latest epoch (or the step Ctrl-C stopped at), for --init_from=resume; best.pt, the best
                 test accuracy so far
    log.jsonl    a line per epoch: epoch, step, lr, train_loss, test_loss, test_acc (a fraction), best_acc,
                 test_images, time_s, and compression (a list, one value per TSSA layer): R^var_c (tost.py's objective)
                 of each TSSA layer's output on the first compression_images test images. The paper reports
                 it falling with depth: the layers compress. The terminal shows it as a bar per layer.
    viz/         a PNG per test image: top row the image and the CLS token's class-attention map per head;
                 bottom row the head that claims each patch (argmax of Pi), then Pi per head of TSSA layer
                 viz_layer. Colours: dark (viridis purple) is low, yellow high, one scale per row.

Data stays on the device as uint8; augmentation (pad-4 random crop, horizontal flip, optional
mixup/cutmix) runs there in torch, so the CPU does not feed the GPU.
"""
import math
import os
import struct
import sys
import time
import zlib
from dataclasses import asdict

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import tost
from prepare_data import DataError, load_meta
from train_common import (GracefulStop, RunLog, Stop, UsageError, atomic_save, autocast, check_out_dir,
                          cleanup_distributed, cosine_lr, human_time, load_checkpoint, make_grad_scaler,
                          parse_overrides, print_help_if_asked, resolve_dtype, resume_command, run_main,
                          seed_everything, setup_distributed, strip_compile_prefix, sum_dtype)

# -----------------------------------------------------------------------------
# default config values: tost-cifar on CIFAR-10, from scratch. Override with --key=value.
DEFAULTS = dict(
    # data and I/O
    dataset='cifar10',          # a folder under data_dir made by prepare_data.py (cifar10, cifar100)
    data_dir='data',
    out_dir='out-vit',          # ckpt.pt, best.pt, log.jsonl, viz/
    init_from='scratch',        # 'scratch', 'resume' (out_dir/ckpt.pt), 'best' (out_dir/best.pt), or a .pt path
                                # (best or a path: for --eval_only, or its weights with a fresh optimizer)
    overwrite=False,            # a new run into an out_dir that holds ckpt.pt/best.pt: delete them (else refuse)
    eval_only=False,            # evaluate the init_from checkpoint, write the pictures, exit
    # model
    model='tost-cifar',         # a vision preset of tost.py: tost-cifar, tost-cifar-tiny, tost-t, tost-s, tost-m
    attn='tssa',                # 'tssa' (ToST) or 'softmax' (the baseline, everything else equal)
    lpi=False,                  # not in the paper: XCiT's local patch interaction (3x3 depthwise convs) per block
    drop_path=0.0,              # stochastic depth; if not set, the preset's (tost-s 0.05, tost-m 0.15)
    # optimisation: AdamW, linear warmup then cosine, per step
    epochs=100,
    batch_size=128,             # images per step per process
    learning_rate=1e-3,         # peak
    min_lr=1e-5,                # at the end of the cosine
    weight_decay=0.05,          # matrices only (tost.param_groups)
    beta1=0.9,
    beta2=0.999,
    grad_clip=1.0,              # max gradient norm; 0 disables
    warmup_epochs=5.0,
    label_smoothing=0.1,
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
    seed=1337,
)
PAPER_SHAPES = ('tost-t', 'tost-s', 'tost-m')  # 224px / patch 16 in the paper
MACHINE_KEYS = ('device', 'dtype', 'compile', 'out_dir', 'init_from', 'eval_only', 'overwrite')  # not resumed

# -----------------------------------------------------------------------------
# data: uint8 tensors on the device, augmented there


def load_images(data_dir, name, device):
    """(meta, train x, train y, test x, test y): images (N, C, H, W) uint8 and labels (N,) int64, on device."""
    folder = os.path.join(data_dir, name)
    try:
        meta = load_meta(folder)
    except DataError as e:
        raise UsageError(' '.join(str(e).split())) from None
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


def checkpoint_path(config):
    init = config['init_from']
    return {'resume': os.path.join(config['out_dir'], 'ckpt.pt'),
            'best': os.path.join(config['out_dir'], 'best.pt')}.get(init, init)


def check_vit_checkpoint(ckpt, path):
    if ckpt.get('kind') == 'vit' and isinstance(ckpt.get('model_args'), dict) and 'model' in ckpt:
        return
    args = ckpt.get('model_args')
    if isinstance(args, dict) and ('vocab_size' in args or 'block_size' in args):
        raise UsageError(f"{path} is a language-model checkpoint; use sample.py / train_gpt.py")
    raise UsageError(f"{path} is not a train_vit.py checkpoint (no kind='vit' with model and model_args)")


def model_config(config, set_keys, meta, image_shape, ckpt=None, path=None):
    """The ViTConfig: the preset with the dataset's classes and image size, or the checkpoint's own."""
    C, H, W = image_shape
    if ckpt is not None:
        args = dict(ckpt['model_args'])
        for key, ck in (('model', ckpt.get('config', {}).get('model')), ('attn', args.get('attn')),
                        ('lpi', args.get('lpi', False))):
            if key in set_keys and ck is not None and config[key] != ck:
                raise UsageError(f"--{key}={config[key]} but {path} holds a {key}={ck} model")
        if args.get('num_classes') != meta['num_classes']:
            raise UsageError(f"{path} has {args.get('num_classes')} classes but {config['dataset']} has "
                             f"{meta['num_classes']}; use a checkpoint trained on {config['dataset']}")
        if args.get('in_chans') != C:
            raise UsageError(f"{path} takes {args.get('in_chans')}-channel images, {config['dataset']} has {C}")
    else:
        spec = tost.PRESETS.get(config['model'])
        if spec is None or spec['kind'] != 'vit':
            names = [k for k, v in tost.PRESETS.items() if v['kind'] == 'vit']
            raise UsageError(f"--model={config['model']} is not a vision preset; choose one of {', '.join(names)}")
        if config['attn'] not in tost.ATTN_KINDS:
            raise UsageError(f"--attn={config['attn']}: choose one of {', '.join(tost.ATTN_KINDS)}")
        args = asdict(tost.preset(config['model']))
        if config['model'] in PAPER_SHAPES and H <= 64:
            args['patch_size'] = 4                              # 32px: an 8x8 grid (224px / 16 is 14x14)
        args.update(num_classes=meta['num_classes'], in_chans=C, attn=config['attn'], lpi=config['lpi'])
        if 'drop_path' in set_keys:
            args['drop_path'] = config['drop_path']
    p = args['patch_size']
    if H % p or W % p:
        raise UsageError(f"{config['dataset']} has {H}x{W} images, which {p}x{p} patches do not tile; "
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


def write_png(path, array):
    """Write a uint8 image, (H, W) grey or (H, W, 3) RGB, as a PNG with the standard library only.
    A PNG is the 8-byte signature, then chunks of (length, type, data, CRC-32 of type + data):
    IHDR (width, height, bit depth 8, colour type 0 = grey or 2 = RGB, no interlace), IDAT (the rows,
    each led by filter byte 0 = 'none', zlib-compressed as one stream) and an empty IEND."""
    a = array.detach().cpu().numpy() if torch.is_tensor(array) else np.asarray(array)
    if a.dtype != np.uint8 or not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] == 3)) or 0 in a.shape:
        raise ValueError(f"write_png wants a non-empty (H, W) or (H, W, 3) uint8 array, got {a.dtype} {a.shape}")
    H, W = a.shape[:2]
    rows = np.concatenate([np.zeros((H, 1), np.uint8), a.reshape(H, -1)], axis=1)   # filter byte, then pixels

    def chunk(tag, data):
        return struct.pack('>I', len(data)) + tag + data + struct.pack('>I', zlib.crc32(tag + data))

    header = struct.pack('>IIBBBBB', W, H, 8, 0 if a.ndim == 2 else 2, 0, 0, 0)
    with open(path, 'wb') as f:
        f.write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', header) + chunk(b'IDAT', zlib.compress(rows.tobytes(), 6))
                + chunk(b'IEND', b''))


VIRIDIS = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], np.float64)
HEAD_COLORS = np.array([[31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40], [148, 103, 189],
                        [140, 86, 75], [227, 119, 194], [127, 127, 127], [188, 189, 34], [23, 190, 207]], np.uint8)


def colorize(maps):
    """(..., H, W) floats -> (..., H, W, 3) uint8 through a viridis-like map; one scale for all the maps
    given (a row of heads), so heads can be compared: dark is the smallest value, yellow the largest."""
    m = maps.astype(np.float64)
    t = (m - m.min()) / max(m.max() - m.min(), 1e-12) * (len(VIRIDIS) - 1)
    i = np.clip(np.floor(t).astype(int), 0, len(VIRIDIS) - 2)
    frac = (t - i)[..., None]
    return np.round(VIRIDIS[i] * (1 - frac) + VIRIDIS[i + 1] * frac).astype(np.uint8)


def picture(image, cls_attn, pi, tile=128, gap=4):
    """One grid: top row the image and the CLS attention per head; bottom row (TSSA only) the head with
    the largest membership for each patch, then Pi per head. image (C, H, W) uint8, maps (heads, Hp, Wp)."""
    C, H, W = image.shape
    s = max(1, tile // H)
    img = image.permute(1, 2, 0).numpy()
    img = np.repeat(img, 3, axis=2) if C == 1 else img[..., :3]
    up = lambda a, k: a.repeat(k, axis=0).repeat(k, axis=1)                  # nearest-neighbour upscale
    k = s * H // cls_attn.shape[1]
    rows = [[up(img, s)] + list(up(t, k) for t in colorize(cls_attn.numpy()))]
    if pi is not None:
        owner = HEAD_COLORS[pi.argmax(0).numpy() % len(HEAD_COLORS)]
        rows.append([up(owner, k)] + list(up(t, k) for t in colorize(pi.numpy())))
    th, tw = s * H, s * W
    ncol = max(len(r) for r in rows)
    canvas = np.full((len(rows) * (th + gap) + gap, ncol * (tw + gap) + gap, 3), 255, np.uint8)
    for r, row in enumerate(rows):
        for c, t in enumerate(row):
            y0, x0 = gap + r * (th + gap), gap + c * (tw + gap)
            canvas[y0:y0 + th, x0:x0 + tw] = t
    return canvas


@torch.no_grad()
def look_inside(model, x, y, norm, config, meta, n_tssa):
    """Per-layer compression of the fixed test batch, and the PNGs. Runs on the master only, in float32.
    Returns (list of R^var_c per TSSA layer, lines to print)."""
    n = max(config['compression_images'], config['viz_images'])
    if n == 0:
        return [], []
    was_training = model.training
    model.eval()
    out = model.inspect(norm(x[:n]), layer=config['viz_layer'] if n_tssa else -1)
    v = min(config['viz_images'], len(x))
    pred = model(norm(x[:v])).argmax(-1).tolist() if v else []
    model.train(was_training)
    lines, comp = [], []
    if out['compression'] and config['compression_images']:
        m = config['compression_images']
        comp = [c[:m].float().mean().item() for c in out['compression']]
        lines += compression_chart(comp, min(m, len(x)))
    if v:
        folder = os.path.join(config['out_dir'], 'viz')
        os.makedirs(folder, exist_ok=True)
        classes = meta.get('classes') or [str(i) for i in range(meta['num_classes'])]
        names = []
        for i in range(v):
            pi = None if out['pi'] is None else out['pi'][i].cpu()
            write_png(os.path.join(folder, f'test{i:04d}.png'), picture(x[i].cpu(), out['cls_attn'][i].cpu(), pi))
            names.append(f"{i}: {classes[y[i]]}" + ("" if pred[i] == y[i] else f" (predicted {classes[pred[i]]})"))
        layer = f", Pi of TSSA layer {config['viz_layer'] % n_tssa}" if n_tssa else ""
        lines.append(f"wrote {v} PNG{'s' * (v > 1)} to {folder} (CLS attention{layer}): " + ", ".join(names))
    return comp, lines

# -----------------------------------------------------------------------------


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if print_help_if_asked(argv, __doc__, DEFAULTS):
        return None
    config, set_keys = parse_overrides(argv, DEFAULTS)
    check_config(config)
    dist = setup_distributed(config['device'])
    try:
        return run(config, set_keys, dist)
    except Stop as e:
        e.exit(dist.master)
    finally:
        cleanup_distributed(dist)


def resume_hint(config, set_keys):
    """'resume with: python train_vit.py --init_from=resume ...': the checkpoint restores all but these keys."""
    keys = [k for k in ('out_dir', 'device', 'dtype', 'compile') if k in set_keys and config[k] != DEFAULTS[k]]
    return "resume with: " + resume_command('train_vit.py', {'init_from': 'resume', **{k: config[k] for k in keys}})


def step_seed(seed, epoch, step, rank):
    """Augmentation, mixup and drop-path draw from a generator seeded per step: a run stopped at any step
    resumes with the same random numbers."""
    return int(np.random.SeedSequence([seed, epoch, step, rank]).generate_state(1)[0])


def run(config, set_keys, dist):
    device, master = dist.device, dist.master
    device_type = device.split(':')[0]
    dtype = resolve_dtype(config['dtype'], device)

    # a checkpoint to start from; on resume the run goes on as it was: its config, then this command line's keys
    ckpt = path = None
    if config['init_from'] != 'scratch':
        path = checkpoint_path(config)
        ckpt = load_checkpoint(path, map_location=device)
        check_vit_checkpoint(ckpt, path)
    if config['init_from'] == 'resume' and isinstance(ckpt.get('config'), dict):
        old = ckpt['config']
        config = {k: v if k in set_keys or k in MACHINE_KEYS or k not in old else old[k] for k, v in config.items()}
    elif not config['eval_only']:  # a new run: it must not replace another run's checkpoints
        if path and os.path.abspath(os.path.dirname(path)) == os.path.abspath(config['out_dir']):
            raise UsageError(f"training from {path} would overwrite the checkpoints beside it; "
                             f"pick another --out_dir (or --init_from=resume to go on)")
        check_out_dir([os.path.join(config['out_dir'], f) for f in ('ckpt.pt', 'best.pt')], config['overwrite'],
                      master)
    seed_everything(config['seed'], dist.rank)

    # data, on the device
    meta, x_train, y_train, x_test, y_test = load_images(config['data_dir'], config['dataset'], device)
    norm = normalizer(meta, device)

    # model: fresh from a preset, or the checkpoint's shape and weights
    vit_config = model_config(config, set_keys, meta, tuple(x_train.shape[1:]), ckpt, path)
    n_tssa = vit_config.n_layer if vit_config.attn == 'tssa' else 0
    if n_tssa and not -n_tssa <= config['viz_layer'] < n_tssa:
        raise UsageError(f"--viz_layer={config['viz_layer']}: the model has {n_tssa} TSSA layers "
                         f"(0..{n_tssa - 1}, or -1 for the last)")
    raw_model = tost.ViT(vit_config).to(device)
    if ckpt is not None:
        try:
            raw_model.load_state_dict(strip_compile_prefix(ckpt['model']))
        except RuntimeError as e:
            raise UsageError(f"{path} does not fit its own model_args ({str(e).splitlines()[0]})") from None

    if config['eval_only']:
        acc, loss, count = evaluate(raw_model, x_test, y_test, norm, config['batch_size'], device, dtype, dist)
        if master:
            with RunLog(config['out_dir'], filename='eval.jsonl', fresh=False) as log:
                comp, lines = look_inside(raw_model, x_test, y_test, norm, config, meta, n_tssa)
                print(f"{path} (epoch {ckpt.get('epoch')}): test accuracy {acc:.4f} ({round(acc * count)}/{count}), "
                      f"test loss {loss:.4f}", flush=True)
                for line in lines:
                    print(line, flush=True)
                log.record({'checkpoint': path, 'epoch': ckpt.get('epoch'), 'test_acc': acc, 'test_loss': loss,
                            'test_images': count, **({'compression': comp} if comp else {})})
        return acc

    # optimizer, schedule, where to start
    optimizer = raw_model.configure_optimizers(config['weight_decay'], config['learning_rate'],
                                               (config['beta1'], config['beta2']), device_type)
    scaler = make_grad_scaler(device, dtype)
    n_train, bs, epochs = len(x_train), config['batch_size'], config['epochs']
    steps_per_epoch = -(-(-(-n_train // dist.world_size)) // bs)           # ceil(ceil(n / ranks) / batch)
    if config['max_steps']:
        steps_per_epoch = min(steps_per_epoch, config['max_steps'])
    start_epoch, start_step, best_acc, loss_carry = 0, 0, 0.0, 0.0
    if config['init_from'] == 'resume':
        missing = [k for k in ('optimizer', 'epoch', 'best_acc') if k not in ckpt]
        if missing:
            raise UsageError(f"{path} cannot be resumed: it has no {', '.join(missing)}")
        optimizer.load_state_dict(ckpt['optimizer'])
        if ckpt.get('scaler'):
            scaler.load_state_dict(ckpt['scaler'])
        start_epoch, best_acc = int(ckpt['epoch']), float(ckpt['best_acc'])
        start_step, loss_carry = int(ckpt.get('step', 0)), float(ckpt.get('epoch_loss_sum', 0.0))
    ckpt_at = (start_epoch, start_step) if config['init_from'] == 'resume' else None   # (epoch, step) on disk
    redo = start_step and (ckpt.get('steps_per_epoch'), ckpt.get('world_size')) != (steps_per_epoch, dist.world_size)
    ckpt = None                                                              # free the memory
    config['drop_path'] = vit_config.drop_path  # what the model uses, in the saved config
    model = torch.compile(raw_model) if config['compile'] else raw_model
    if dist.ddp:
        model = DDP(model, device_ids=[dist.local_rank] if device_type == 'cuda' else None)

    warmup, total = config['warmup_epochs'] * steps_per_epoch, epochs * steps_per_epoch
    C = meta['num_classes']
    mixing = config['mixup'] > 0 or config['cutmix'] > 0

    def save(epoch, step, loss_sum, improved=False):
        """ckpt.pt (and best.pt if improved) after `epoch` whole epochs and `step` steps of the next."""
        state = {'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(),
                 'scaler': scaler.state_dict(), 'model_args': asdict(vit_config), 'kind': 'vit',
                 'epoch': epoch, 'step': step, 'epoch_loss_sum': loss_sum, 'steps_per_epoch': steps_per_epoch,
                 'world_size': dist.world_size, 'best_acc': best_acc, 'config': dict(config), 'meta': meta}
        atomic_save(state, os.path.join(config['out_dir'], 'ckpt.pt'))
        if improved:
            atomic_save(state, os.path.join(config['out_dir'], 'best.pt'))

    def where(epoch, step):
        return f"epoch {epoch}" if step == 0 else f"epoch {epoch} + {step}/{steps_per_epoch} steps"

    def interrupted(signal_name, epoch, step, loss_sum):
        """Ctrl-C or SIGTERM at a step boundary: save here (master), then a Stop that says how to go on."""
        how, resume = f"interrupted ({signal_name}) at {where(epoch, step)}", f"\n{resume_hint(config, set_keys)}"
        if (epoch, step) == ckpt_at and not redo:
            msg = f"{how}; {config['out_dir']}/ckpt.pt is there already{resume}"
        elif (epoch, step) == (start_epoch, start_step):
            msg = f"{how}, before the first step: nothing to save"
        else:
            if dist.ddp:
                torch.distributed.all_reduce(loss_sum)
            if master:
                save(epoch, step, loss_sum.item())
            msg = f"{how}: saved {config['out_dir']}/ckpt.pt{resume}"
        if dist.ddp:
            torch.distributed.barrier()  # the other ranks wait while rank 0 writes
        return Stop(msg, 130)

    with RunLog(config['out_dir'], enabled=master, total=epochs, unit='epoch', resume_from=start_epoch,
                fresh=config['init_from'] != 'resume') as log:  # closed on Ctrl-C too: the terminal is left clean
        c = vit_config
        log.print(f"{config['model']} ({c.attn}{' + lpi' if c.lpi else ''}, {c.n_layer} layers, {c.n_embd} wide, "
                  f"{(c.img_size // c.patch_size) ** 2} tokens): {raw_model.get_num_params() / 1e6:.2f}M params | "
                  f"{config['dataset']}: {n_train} train / {len(x_test)} test images, {C} classes | "
                  f"{dist.world_size} x {device} {dtype} | {steps_per_epoch} steps of {dist.world_size} x {bs} "
                  f"per epoch")
        if config['init_from'] == 'resume':
            log.print(f"resuming {path} after {where(start_epoch, start_step)} (best test accuracy {best_acc:.4f})")
        if redo:
            log.print(f"note: the checkpoint stopped inside epoch {start_epoch + 1} with {ckpt_at[1]} steps of "
                      f"another size; this run redoes that epoch from its start")
            start_step, loss_carry = 0, 0.0
        if start_epoch >= epochs:
            log.print(f"nothing to do: the checkpoint has {start_epoch} of --epochs={epochs} epochs; raise --epochs")
            return best_acc

        # the loop
        t_start = time.time()
        epoch, step = start_epoch, start_step
        try:
            with GracefulStop(dist) as stop:
                for epoch in range(start_epoch, epochs):
                    shard = train_shard(n_train, config['seed'], epoch, dist.rank, dist.world_size).to(device)
                    first = start_step if epoch == start_epoch else 0
                    # this rank's share of the loss summed so far this epoch (a resumed epoch brings its sum)
                    loss_sum = torch.full((), loss_carry / dist.world_size if first else 0.0, device=device)
                    t0, seen, steps = time.time(), 0, 0
                    model.train()
                    for step in range(first, steps_per_epoch):
                        if stop.requested():           # Ctrl-C or SIGTERM on any rank: all stop at this step
                            raise interrupted(stop.signal or 'on another rank', epoch, step, loss_sum)
                        torch.manual_seed(step_seed(config['seed'], epoch, step, dist.rank))
                        it = epoch * steps_per_epoch + step
                        lr = cosine_lr(it, config['learning_rate'], config['min_lr'], warmup, total)
                        for group in optimizer.param_groups:
                            group['lr'] = lr
                        idx = shard[step * bs:(step + 1) * bs]
                        x, y = norm(random_crop_flip(x_train[idx])), y_train[idx]
                        if mixing:
                            x, y = mix(x, soft_targets(y, C, config['label_smoothing']), config['mixup'],
                                       config['cutmix'])
                        with autocast(device, dtype):
                            logits = model(x)
                        loss = F.cross_entropy(logits.float(), y,
                                               label_smoothing=0.0 if mixing else config['label_smoothing'])
                        scaler.scale(loss).backward()
                        if config['grad_clip']:
                            scaler.unscale_(optimizer)
                            torch.nn.utils.clip_grad_norm_(raw_model.parameters(), config['grad_clip'])
                        scaler.step(optimizer)
                        scaler.update()
                        optimizer.zero_grad(set_to_none=True)
                        loss_sum += loss.detach()
                        seen, steps = seen + len(idx) * dist.world_size, steps + 1
                        if (step + 1) % config['log_interval'] == 0 or step + 1 == steps_per_epoch:
                            lossf = loss.item()                                  # waits for the device
                            dt = time.time() - t0
                            log.show({'epoch': round(epoch + (step + 1) / steps_per_epoch, 3), 'loss': lossf,
                                      'lr': lr, 'img_per_s': seen / dt, 'ms_per_step': 1000 * dt / steps})
                            t0, seen, steps = time.time(), 0, 0

                    # end of epoch: mean train loss over all ranks, test accuracy, pictures, checkpoints
                    if dist.ddp:
                        torch.distributed.all_reduce(loss_sum)
                    train_loss = loss_sum.item() / (steps_per_epoch * dist.world_size)
                    last = epoch + 1 == epochs
                    row = {'epoch': epoch + 1, 'step': (epoch + 1) * steps_per_epoch, 'lr': lr,
                           'train_loss': train_loss}
                    if (epoch + 1) % config['eval_interval'] == 0 or last:
                        acc, test_loss, count = evaluate(raw_model, x_test, y_test, norm, bs, device, dtype, dist)
                        improved = acc > best_acc
                        best_acc = max(best_acc, acc)
                        row.update(test_loss=test_loss, test_acc=acc, best_acc=best_acc, test_images=count)
                        if master:
                            comp, lines = look_inside(raw_model, x_test, y_test, norm, config, meta, n_tssa)
                            if comp:                    # R^var_c per TSSA layer (none with softmax attention)
                                row['compression'] = comp
                            log.print(f"epoch {epoch + 1}/{epochs}: train loss {train_loss:.4f}, test loss "
                                      f"{test_loss:.4f}, test acc {acc:.4f} (best {best_acc:.4f}), "
                                      f"{human_time(time.time() - t_start)} so far")
                            for line in lines:
                                log.print(line)
                            if sys.stdout.isatty():  # keep test_acc in the live table (a plain log has the line above)
                                log.show({'epoch': epoch + 1, 'test_acc': acc, 'best_acc': best_acc})
                    else:
                        improved = False
                        log.print(f"epoch {epoch + 1}/{epochs}: train loss {train_loss:.4f}")
                    row['time_s'] = round(time.time() - t_start, 2)
                    log.record(row)
                    if master:
                        save(epoch + 1, 0, 0.0, improved)
                    ckpt_at = (epoch + 1, 0)
        except KeyboardInterrupt:                                            # a second Ctrl-C: out now
            saved = f"{config['out_dir']}/ckpt.pt is from {where(*ckpt_at)}" if ckpt_at else "no checkpoint yet"
            raise Stop(f"interrupted at {where(epoch, step)}, not saved; {saved}"
                       + (f"\n{resume_hint(config, set_keys)}" if ckpt_at else ""), 130) from None
        log.print(f"done: best test accuracy {best_acc:.4f} in {human_time(time.time() - t_start)}; "
                  f"checkpoints in {config['out_dir']}")
        return best_acc


if __name__ == '__main__':
    run_main(main)
