r"""
Train and evaluate ToST vision models on CIFAR-10/100, and look at what they learned (docs/training.md).

    python prepare_data.py cifar10                  # once (170 MB download, or --archive=PATH offline)
    python train_vit.py --dataset=cifar10           # tost-cifar from scratch, test top-1 after every epoch
    python train_vit.py --dataset=cifar10 --attn=softmax --out_dir=out-vit-softmax   # the baseline
    python train_vit.py --init_from=resume          # go on from out-vit/ckpt.pt, e.g. after Ctrl-C
    python train_vit.py --init_from=best --eval_only        # accuracy of out-vit/best.pt on its test set
    python train_vit.py --dataset=cifar10 --model=tost-cifar-tiny --epochs=3 --warmup_epochs=1 --device=cpu \
        --out_dir=out-vit-tiny

Ctrl-C or SIGTERM saves ckpt.pt at the current step and prints the resume command. batch_size is per
process. After python prepare_data.py cifar100, one node of 4 GPUs, then two nodes of 8, the first at
10.0.0.1:

    torchrun --standalone --nproc_per_node=4 train_vit.py --dataset=cifar100 --model=tost-s
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=10.0.0.1 --master_port=29500 \
        train_vit.py --dataset=cifar100 --model=tost-s
    torchrun --nnodes=2 --node_rank=1 --nproc_per_node=8 --master_addr=10.0.0.1 --master_port=29500 \
        train_vit.py --dataset=cifar100 --model=tost-s
"""
import options  # first: its handler ends a Ctrl-C while torch imports (exit 130, no traceback)
import math
import os
import sys
import time
from dataclasses import asdict

import torch
import torch.nn.functional as F

import readers
import tost
from options import UsageError, check_config, fail, parse, say
from train_common import (DTYPES, any_rank, autocast, check_decay, check_fits, command, cosine_lr, diverged,
                          draw_loss, human, init_path, last_good, load_checkpoint, load_weights, log_row,
                          make_out_dir, mean_loss, optimizer_for, optimizer_step, own_folder, resolve_dtype,
                          resume_command, save_checkpoint, seed_of, setup_distributed, start_log,
                          stop_signals, teardown, wrap)

DEFAULTS = dict(
    # data and I/O
    dataset='cifar10',          # a folder under data_dir made by prepare_data.py (cifar10, cifar100)
    data_dir='data',            # where prepare_data.py puts datasets
    out_dir='out-vit',          # ckpt.pt, best.pt (best test accuracy), log.jsonl, loss.png, viz/ (figures)
    init_from='scratch',        # scratch, resume (out_dir/ckpt.pt), best (out_dir/best.pt) or a .pt file
    overwrite=False,            # a new run where ckpt.pt/best.pt are: delete them, a new log (or refuse)
    eval_only=False,            # evaluate init_from's checkpoint, draw the pictures (viz/ beside it), exit
    # model
    model='tost-cifar',         # a vision preset: tost-cifar, tost-cifar-tiny, tost-t, tost-s, tost-m
    attn='tssa',                # tssa (ToST) or softmax (the baseline, everything else equal)
    lpi=False,                  # not in the paper: XCiT's local patch interaction (3x3 depthwise convs)
    drop_path=0.0,              # stochastic depth; if not set, the preset's (tost-s 0.05, tost-m 0.15)
    # optimisation: AdamW, linear warmup then cosine, per step
    epochs=100,                 # passes over the training images
    batch_size=128,             # images per step per process
    learning_rate=1e-3,         # peak
    min_lr_ratio=0.01,          # the cosine ends at learning_rate x this (1: no decay)
    weight_decay=0.05,          # matrices only (tost.param_groups)
    beta1=0.9,                  # AdamW's first-moment decay
    beta2=0.999,                # AdamW's second-moment decay
    grad_clip=1.0,              # max gradient norm; 0 disables
    warmup_epochs=5.0,          # linear warmup, then the cosine
    label_smoothing=0.1,        # of the cross-entropy targets
    steps_per_epoch=0,          # at most this many steps an epoch, for smoke tests; 0: the whole epoch
    # evaluation and logging
    eval_interval=1,            # epochs between test-set evaluations (the last epoch is always evaluated)
    log_interval=20,            # steps between progress lines (and one at each epoch's end)
    compression_images=128,     # first N test images on which R^var_c of each TSSA layer is measured; 0: skip
    viz_images=4,               # test images drawn to out_dir/viz/ at each evaluation; 0: none
    viz_layer=-1,               # the TSSA layer whose memberships Pi are drawn
    # system
    device='auto',              # auto, cpu, cuda, cuda:N, mps
    dtype='auto',               # auto: bfloat16 where the hardware has it, else float16 on a GPU, float32
    compile=False,              # torch.compile the model
    seed=1337,                  # model init, augmentation and the data order follow from it
)

# What options.parse lets through, beside a finite number of the default's type.
RANGES = dict(positive=('epochs', 'batch_size', 'learning_rate', 'eval_interval', 'log_interval'),
              nonnegative=('weight_decay', 'grad_clip', 'warmup_epochs', 'steps_per_epoch',
                           'compression_images', 'viz_images'),
              fraction=('label_smoothing', 'drop_path', 'beta1', 'beta2'),
              ratio=('min_lr_ratio',),
              nonempty=('out_dir', 'dataset', 'data_dir', 'init_from'),
              seed=('seed',))

# The names a key may take, checked with the ranges: a typo in --model is said before any data is asked for.
CHOICES = dict(model=[name for name, p in tost.PRESETS.items() if p['kind'] == 'vit'], attn=tost.ATTN_KINDS,
               dtype=DTYPES)

# Keys of the machine, not of the run: a resume takes every other key from its checkpoint unless set.
MACHINE_KEYS = ('device', 'compile', 'out_dir', 'init_from', 'eval_only', 'overwrite')

# -----------------------------------------------------------------------------
# data: uint8 tensors on the device, augmented there


def random_crop_flip(x, pad=4):
    """x (B, C, H, W) uint8 -> the same shape: zero-pad by `pad`, cut an H x W window at a random offset from
    each image, mirror half of them. Every window of every image is a view; one gather picks an image's."""
    B, C, H, W = x.shape
    windows = F.pad(x, (pad,) * 4).unfold(2, H, 1).unfold(3, W, 1)           # (B, C, 2pad+1, 2pad+1, H, W)
    shift = torch.randint(2 * pad + 1, (2, B), device=x.device)
    crops = windows[torch.arange(B, device=x.device), :, shift[0], shift[1]]   # (B, C, H, W)
    flip = torch.rand(B, 1, 1, 1, device=x.device) < 0.5
    return torch.where(flip, crops.flip(-1), crops)


def train_shard(n, seed, epoch, rank, world_size):
    """This rank's indices for one epoch: every world_size-th entry of a permutation seeded by (seed, epoch),
    padded with its own start to a multiple of world_size: equal counts (DDP needs equal steps) that cover
    every image."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100003 + epoch))
    perm = torch.cat([perm, perm[:(-n) % world_size]])
    return perm[rank::world_size]                                       # (ceil(n / world_size),)

# -----------------------------------------------------------------------------
# the model's shape: the preset's, fitted to the dataset, or the checkpoint's own


def vit_config(cfg, set_keys, meta, ckpt=None):
    """The ViTConfig of a new model (the preset, with the dataset's classes) or of a checkpoint's. A
    --drop_path set applies to either: a regulariser, not the shape."""
    if ckpt:
        args = dict(ckpt['model_args'])
    else:
        args = asdict(tost.preset(cfg['model'], attn=cfg['attn'], lpi=cfg['lpi'],
                                  num_classes=meta['num_classes'], in_chans=meta['channels']))
        # The paper's ToST-T/S/M cut 224px images into 16px patches (14 x 14); 32px ones get 4px (8 x 8).
        if meta['image_size'] <= 64:
            args['patch_size'] = min(args['patch_size'], 4)
    if 'drop_path' in set_keys:
        args['drop_path'] = cfg['drop_path']
    if (args['num_classes'], args['in_chans']) != (meta['num_classes'], meta['channels']):
        raise UsageError(f"the checkpoint was trained on {args['num_classes']} classes of {args['in_chans']}"
                         f"-channel images, {cfg['dataset']} has {meta['num_classes']} of {meta['channels']}")
    try:
        return tost.ViTConfig(**dict(args, img_size=meta['image_size']))
    # (a checkpoint's model_args may name a field ViTConfig lacks: a TypeError)
    except (TypeError, ValueError) as e:
        raise UsageError(f"{cfg['model']} on {meta['image_size']}px images ({cfg['dataset']}): {e}") from None

# -----------------------------------------------------------------------------
# evaluation: the test accuracy (every rank), what the layers do (rank 0)


@torch.no_grad()
def evaluate(model, x, y, batch_size, ctx, dist):
    """(accuracy, mean loss) on the standardized test images x, each once, shared out over the ranks."""
    model.eval()
    # BatchNorm's running statistics drift apart on each rank's batches: all take rank 0's, which it saves.
    for buf in model.buffers() if dist.ddp else ():
        torch.distributed.broadcast(buf, 0)
    # Each image once: rank r takes the r-th of world_size nearly equal slices.
    mine = torch.arange(len(x), device=x.device).tensor_split(dist.world_size)[dist.rank]
    # correct, loss sum
    sums = torch.zeros(2, device=x.device)
    for b in mine.split(batch_size):
        with ctx:
            logits = model(x[b]).float()
        sums[0] += (logits.argmax(-1) == y[b]).sum()
        sums[1] += F.cross_entropy(logits, y[b], reduction='sum')
    if dist.ddp:
        torch.distributed.all_reduce(sums)
    model.train()
    # Divided in Python, in float64 (MPS has none): the number correct is exact.
    return [total / len(x) for total in sums.tolist()]


@torch.no_grad()
def inspect(model, x, layer):
    """What a ViT does on images x: R^var_c (B,) per TSSA block of the block's output tokens (after its TSSA,
    LPI if any, and MLP) seen through its own LayerNorm and projections, with the memberships it computed from
    its input; the last class-attention block's CLS attention over the patches (B, H, Hp, Wp); the memberships
    Pi (B, K, Hp, Wp) of TSSA block `layer` (None in a model without TSSA)."""
    x, grid = model._tokens(x)
    pis = []
    compression = []
    for block in model.blocks:
        attn = block.attn
        before = x
        x = block(x, grid=grid)
        if isinstance(attn, tost.TSSA):
            pi = attn.memberships(attn.split_heads(attn.c_attn(block.ln_1(before))))          # (B, K, n)
            pis.append(pi)
            # The output, through the block's own LayerNorm and projections (bias included, as the layer
            # applies).
            w = attn.split_heads(attn.c_attn(block.ln_1(x)))
            compression.append(tost.compression_of_projections(w, pi))
    cls = model.cls_token.expand(len(x), -1, -1)
    for block in model.cls_blocks:
        cls, x, att = block(cls, x)
    pi = pis[layer].unflatten(-1, grid) if pis else None
    return compression, att[:, :, 1:].unflatten(-1, grid), pi


def look_inside(model, x, images, labels, cfg, classes):
    """On rank 0, in float32: R^var_c of each TSSA layer on the first compression_images test images, printed
    as a bar chart (the paper's per-layer figure in a terminal) and returned for the log row; the maps of the
    first viz_images in out_dir/viz/. A picture that cannot be drawn does not stop training; it ends
    --eval_only, whose job it is."""
    m = min(cfg['compression_images'], len(x))
    v = min(cfg['viz_images'], len(x))
    if m + v == 0:
        return {}
    model.eval()
    compression, cls_attn, pi = inspect(model, x[:max(m, v)], cfg['viz_layer'])
    model.train()
    values = [c[:m].mean().item() for c in compression] if m else []
    if values:
        say(f"R^var_c of each TSSA layer's output on {m} test images (the paper's falls with depth):")
    for i, value in enumerate(values):
        bar = '█' * round(32 * value / max(values))
        say(f"  layer {i:2d}  {bar:<32}  {value:.4f}")
    pis = [None] * v if pi is None else pi.cpu()
    folder = os.path.join(cfg['out_dir'], 'viz')
    try:
        import plot
        for i in range(v):
            own_folder(folder)
            plot.vision_maps(os.path.join(folder, f'test{i:04d}.png'), images[i].cpu(),
                             cls_attn[i].cpu(), pis[i], f"{i}: {classes[labels[i]]}")
        if v and cfg['eval_only']:
            drawn = "class attention" if pi is None else "class attention and memberships"
            say(f"the {drawn} of {v} test images: {folder}")
    except Exception as e:
        if cfg['eval_only']:
            raise
        say(f"could not draw the maps ({type(e).__name__}: {e}); training goes on")
    return {'compression': values} if values else {}

# -----------------------------------------------------------------------------


def main(argv=None):
    # -------------------------------------------------------------------------
    # options: types, ranges and names from the tables above, checked before anything else
    cfg, set_keys = parse(argv, DEFAULTS, __doc__, __file__, ranges=RANGES, choices=CHOICES, torchrun=True)
    eval_only = cfg['eval_only']
    resume = cfg['init_from'] == 'resume' and not eval_only
    out_dir = cfg['out_dir']
    ckpt_path = os.path.join(out_dir, 'ckpt.pt')
    best_path = os.path.join(out_dir, 'best.pt')
    # A resume and an evaluation write no checkpoint over the one they read.
    written = [] if resume or eval_only else [ckpt_path, best_path]
    path = init_path(cfg['init_from'], {'scratch': None, 'resume': ckpt_path, 'best': best_path}, written)
    if eval_only and not path:
        raise UsageError("--eval_only needs a checkpoint: --init_from=resume, best or a path to a .pt file")
    # An evaluation draws its maps next to its checkpoint, unless --out_dir says where.
    if eval_only and 'out_dir' not in set_keys:
        out_dir = os.path.dirname(path) or '.'
        cfg['out_dir'] = out_dir

    # -------------------------------------------------------------------------
    # processes and the device: rank 0 talks for all
    dist = setup_distributed(cfg['device'])
    device = dist.device
    master = dist.master
    if not master:
        sys.stdout = open(os.devnull, 'w', encoding='utf-8')

    # -------------------------------------------------------------------------
    # a checkpoint: a resume goes on as it was, an evaluation tests on the data the model learned from
    # A resume holds its folder before it reads the checkpoint there: another run's folder is refused as such.
    lock = None
    if resume and os.path.isdir(out_dir):
        lock = make_out_dir(out_dir, [ckpt_path, best_path], cfg['overwrite'], False, master)
    ckpt = None
    if path:
        ckpt = load_checkpoint(path, device, 'vit',
                               needs=('model', 'model_args', 'optimizer', 'config', 'epoch', 'best_acc'))
        # Format 2 is the released vision model (XCiT's class blocks); earlier checkpoints computed otherwise.
        if ckpt.get('format') != 2:
            raise UsageError(f"{path} is from an earlier train_vit.py, whose model computed otherwise")
        old = ckpt['config']
        # --steps_per_epoch was --max_steps: a run saved before the rename goes on with its cap.
        if 'max_steps' in old and 'steps_per_epoch' not in old:
            old = dict(old, steps_per_epoch=old['max_steps'])
        # --eval_only measures as the run did: its data, dtype and R^var_c and map sizes, unless set.
        measured = ('dataset', 'data_dir', 'dtype', 'compression_images', 'viz_images')
        inherit = old if resume else measured if eval_only else ()
        for key in inherit:
            if key in cfg and key in old and key not in set_keys and key not in MACHINE_KEYS:
                cfg[key] = old[key]
        # A checkpoint's model is what it is: a --model, --attn or --lpi that says otherwise is a mistake.
        for key in ('model', 'attn', 'lpi'):
            if key in set_keys and cfg[key] != old.get(key):
                raise UsageError(f"--{key}={cfg[key]}, but {path} holds a model with {key}={old.get(key)}")
            cfg[key] = old.get(key)
        check_config(cfg, DEFAULTS, RANGES, CHOICES, path)
    # The dtype is the run's: a resume's is its checkpoint's, unless set.
    dtype, why = resolve_dtype(cfg['dtype'], device, master)
    ctx = autocast(device, dtype)
    learning_rate = cfg['learning_rate']
    check_decay(cfg)

    # -------------------------------------------------------------------------
    # data: every image on the device as uint8; the test images also standardized, once
    folder = readers.dataset_folder(cfg['data_dir'], cfg['dataset'])
    meta = readers.load_meta(folder, 'images')
    arrays = readers.read_images(folder, meta)
    x_train, y_train, test_images, y_test = [torch.from_numpy(a).to(device) for a in arrays]
    # (1, C, 1, 1) each
    mean, std = torch.tensor([meta['mean'], meta['std']], device=device).view(2, 1, -1, 1, 1)
    x_test = (test_images.float() / 255 - mean) / std

    # -------------------------------------------------------------------------
    # the model: fresh, from a checkpoint's weights, or resumed; the same on every process
    config = vit_config(cfg, set_keys, meta, ckpt)
    cfg['drop_path'] = config.drop_path
    if config.attn == 'tssa' and not -config.n_layer <= cfg['viz_layer'] < config.n_layer:
        raise UsageError(f"--viz_layer={cfg['viz_layer']}: the model has {config.n_layer} TSSA layers "
                         f"(from -{config.n_layer} to {config.n_layer - 1})")
    seed = cfg['seed']
    torch.manual_seed(seed)
    if ckpt:
        check_fits(tost.ViT, config, ckpt, path)
    raw_model = tost.ViT(config).to(device)
    if ckpt:
        load_weights(raw_model, ckpt, path)
    # Evaluation runs without DDP: its forward would broadcast the BatchNorm buffers (a collective), and the
    # ranks run different numbers of test batches.
    eval_model = torch.compile(raw_model, dynamic=False) if cfg['compile'] else raw_model
    batch_size = cfg['batch_size']

    if eval_only:
        # Its maps go to out_dir/viz: a folder that cannot be made is said before the work.
        if cfg['viz_images'] and master:
            own_folder(os.path.join(out_dir, 'viz'))
        acc, test_loss = evaluate(eval_model, x_test, y_test, batch_size, ctx, dist)
        say(f"{path} (epoch {ckpt['epoch']:g}): test accuracy {acc:.4f} ({round(acc * len(x_test))}/"
            f"{len(x_test)}), test loss {test_loss:.4f}")
        if master:
            look_inside(raw_model, x_test, test_images, y_test, cfg, meta['classes'])
        teardown(dist)
        return acc

    # -------------------------------------------------------------------------
    # the optimizer, the schedule in steps, compile and DDP
    # What a resume goes on from: its checkpoint; a new run from weights starts afresh.
    state = ckpt if resume else {}
    optimizer, scaler = optimizer_for(raw_model, cfg, dtype, state)
    epochs = cfg['epochs']
    per_rank = -(-len(x_train) // dist.world_size)
    whole = -(-per_rank // batch_size)
    steps_per_epoch = min(whole, cfg['steps_per_epoch'] or math.inf)
    total = epochs * steps_per_epoch
    warmup = cfg['warmup_epochs'] * steps_per_epoch
    # A resume goes on from the epochs done, in this run's steps (another batch size or process count changes
    # their length), rounded down: rounded up, an epoch's end not reached would count as done. The 1e-9 only
    # forgives the float's last bit in epoch = step / steps_per_epoch.
    step = math.floor(state.get('epoch', 0) * steps_per_epoch + 1e-9)
    best_acc = state.get('best_acc', -1.0)
    # A best accuracy is of its test set: a resume on other images (another source, or count) has none.
    if state and any(meta.get(k) != state.get('meta', meta).get(k) for k in ('source', 'test_count')):
        best_acc = -1.0
    model = wrap(raw_model, dist, cfg['compile'])
    min_lr = learning_rate * cfg['min_lr_ratio']

    # A new run holds its folder from here on (weights it starts from were read, from another folder); a used
    # one is refused before the run says anything of itself.
    lock = lock or make_out_dir(out_dir, [ckpt_path, best_path], cfg['overwrite'], not resume, master, 'vit')
    capped = f" (of {whole}: --steps_per_epoch)" if steps_per_epoch < whole else ''
    n_params = raw_model.get_num_params()
    say(f"{cfg['model']}, {config.attn}{' + lpi' * config.lpi}: {n_params / 1e6:.2f}M parameters | "
        f"{dist.world_size} x {device}, {dtype} ({why}) | {steps_per_epoch} steps of {dist.world_size} x "
        f"{min(batch_size, per_rank)} images an epoch{capped}")
    say(f"data: {folder}, {len(x_train):,} train + {len(x_test):,} test images of {meta['num_classes']} "
        f"classes, {meta['image_size']}px; compile {cfg['compile']}")
    if resume:
        say(f"resuming {path} at step {step} (epoch {step / steps_per_epoch:.2f} of {epochs})")
    if step >= total:
        say(f"nothing to do: {path} is at the end of its last epoch ({epochs}); a larger --epochs trains on")
        teardown(dist, lock)
        return best_acc
    if warmup >= total:
        say(f"note: the warmup ({cfg['warmup_epochs']:g} epochs) is as long as the run ({epochs}): the "
            f"learning rate never reaches --learning_rate")
    # The log keeps the rows up to the epochs done.
    if master:
        start_log(out_dir, 'epoch', state.get('epoch'))
        log_row(out_dir, {'kind': 'config', **cfg, 'dtype': dtype, 'params': n_params})

    # -------------------------------------------------------------------------
    # the loop: at each epoch's end the test set and the checkpoints, then a step, then a log row
    # The step on disk (a fresh run has none to save at step 0).
    saved = step

    # A loss that is not finite stops the run where every rank finds it (the losses are all-reduced); the
    # checkpoint on disk is from before, and is kept.
    def stop_if_diverged(what, loss):
        if not math.isfinite(loss):
            teardown(dist, lock)
            fail(diverged(what, loss, f'step {step}', last_good(ckpt_path, saved, 'step'), cfg), 3)

    stop = False
    shard = None
    drawing = True
    # The losses since the last row; a resume starts from its checkpoint's, so that its first row is the
    # unbroken run's.
    loss_sum = torch.tensor(state.get('loss_sum', 0.0), device=device)
    since_row = state.get('since_row', 0)
    # The steps and images timed since t_row: a row that spans a resume times only those after it.
    timed = 0
    seen = 0
    t_start = time.time()
    t_row = t_start
    with stop_signals('step', master) as signals:
        while True:
            epoch, i = divmod(step, steps_per_epoch)
            improved = False
            if i == 0 and step != saved and (epoch % cfg['eval_interval'] == 0 or step == total):
                acc, test_loss = evaluate(eval_model, x_test, y_test, batch_size, ctx, dist)
                stop_if_diverged('test loss', test_loss)
                improved = acc > best_acc
                best_acc = max(best_acc, acc)
                say(f"epoch {epoch}/{epochs}: test loss {test_loss:.4f}, acc {acc:.4f} (best {best_acc:.4f})")
                # R^var_c of each TSSA layer (none for softmax), the pictures, the log row: rank 0's.
                if master:
                    inside = look_inside(raw_model, x_test, test_images, y_test, cfg, meta['classes'])
                    log_row(out_dir, dict(kind='eval', step=step, epoch=epoch, test_loss=test_loss,
                                          test_acc=acc, best_acc=best_acc, **inside))
                drawing = master and drawing and draw_loss(out_dir)
                # A stop asked for during the evaluation: every rank saves at this step, and takes no other.
                stop = any_rank(bool(signals), dist)
            # Saved at each epoch's end, and where a stop was asked. The losses since the last row (none at an
            # epoch's end) go with it as the sum over all processes divided by their number, the stop's mean
            # times its steps: each process of a resume, at any process count, starts from that.
            if (i == 0 or stop) and step != saved:
                checkpoint = dict(model=raw_model.state_dict(), optimizer=optimizer.state_dict(),
                                  scaler=scaler.state_dict(), model_args=asdict(config), kind='vit',
                                  format=2, step=step, epoch=step / steps_per_epoch,
                                  best_acc=best_acc, config=cfg, meta=meta, since_row=since_row,
                                  loss_sum=train_loss * since_row)
                # best.pt first: a run killed between the two resumes from the checkpoint before, which
                # evaluates again and writes best.pt again (the other way round, best.pt is left behind).
                save_checkpoint(checkpoint, [best_path] * improved + [ckpt_path], dist)
                saved = step
                # Evaluating and saving is not training time.
                t_row = time.time()
            if step >= total:
                break
            if stop:
                if master:
                    print(f"interrupted ({signals[0] if signals else 'on another rank'}) at step {step} "
                          f"(epoch {step / steps_per_epoch:.2f}): saved {ckpt_path}", file=sys.stderr)
                    print(resume_command('train_vit.py', cfg, set_keys, DEFAULTS), file=sys.stderr)
                teardown(dist, lock)
                sys.exit(130)

            # One optimizer step on this rank's next batch of images, augmented on the device.
            if shard is None or i == 0:
                shard = train_shard(len(x_train), seed, epoch, dist.rank, dist.world_size).to(device)
            # The augmentation and drop-path draw from a seed of the step: a resume draws them again.
            torch.manual_seed(seed_of(seed, epoch, i, dist.rank))
            lr = cosine_lr(step, learning_rate, min_lr, warmup, total)
            idx = shard[i * batch_size:(i + 1) * batch_size]
            x = (random_crop_flip(x_train[idx]).float() / 255 - mean) / std
            with ctx:
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y_train[idx], label_smoothing=cfg['label_smoothing'])
            scaler.scale(loss).backward()
            optimizer_step(optimizer, scaler, lr, cfg['grad_clip'])
            step += 1
            since_row += 1
            timed += 1
            seen += len(idx)
            loss_sum += loss.detach()

            # Ctrl-C or SIGTERM on any rank: every rank stops at the next turn, at the same step.
            stop = any_rank(bool(signals), dist)
            row_due = step % cfg['log_interval'] == 0 or step % steps_per_epoch == 0
            # The mean loss since the last row; a stop reads it too, not to save a model that diverged.
            if row_due or stop:
                train_loss = mean_loss(loss_sum, since_row, dist)
                stop_if_diverged('training loss', train_loss)
            if row_due:
                elapsed = time.time() - t_row
                dt = elapsed / timed
                row = dict(kind='train', step=step, epoch=step / steps_per_epoch, train_loss=train_loss,
                           lr=lr, img_per_s=seen * dist.world_size / elapsed, ms_per_step=1000 * dt)
                say(f"step {step}/{total} (epoch {row['epoch']:.2f}): loss {train_loss:.4f}, lr {lr:.1e}, "
                    f"{row['img_per_s']:,.0f} img/s, {1000 * dt:.1f} ms/step, "
                    f"eta {human((total - step) * dt)}")
                if master:
                    log_row(out_dir, row)
                loss_sum.zero_()
                since_row = 0
                timed = 0
                seen = 0
                t_row = time.time()
    say(f"done: best test accuracy {best_acc:.4f} in {human(time.time() - t_start)}; checkpoints: {out_dir}")
    args = [] if out_dir == DEFAULTS['out_dir'] else [f'--out_dir={out_dir}']
    say("evaluate the best: " + command('train_vit.py', ['--init_from=best', '--eval_only', *args]))
    teardown(dist, lock)
    return best_acc


if __name__ == '__main__':
    main()
