r"""
Train and evaluate ToST vision models on CIFAR-10/100, and look at what they learned (docs/training.md).

    python prepare_data.py cifar10                     # once (163 MB download, or --archive=PATH offline)
    python train_vit.py --dataset=cifar10              # tost-cifar from scratch, test top-1 after every epoch
    python train_vit.py --dataset=cifar10 --attn=softmax --out_dir=out-vit-softmax    # the baseline, all else equal
    python train_vit.py --init_from=resume                 # go on from out-vit/ckpt.pt, e.g. after Ctrl-C
    python train_vit.py --init_from=best --eval_only       # accuracy of out-vit/best.pt on its test set
    python train_vit.py --dataset=cifar10 --model=tost-cifar-tiny --epochs=3 --warmup_epochs=1 --device=cpu \
        --out_dir=out-vit-tiny

Ctrl-C or SIGTERM saves ckpt.pt at the current step and prints the resume command. batch_size is per process.
One node of 4 GPUs, then two nodes of 8, the first at 10.0.0.1:

    torchrun --standalone --nproc_per_node=4 train_vit.py --dataset=cifar100 --model=tost-s
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=10.0.0.1 --master_port=29500 \
        train_vit.py --dataset=cifar100 --model=tost-s
    torchrun --nnodes=2 --node_rank=1 --nproc_per_node=8 --master_addr=10.0.0.1 --master_port=29500 \
        train_vit.py --dataset=cifar100 --model=tost-s
"""
import options  # first: its handler ends a Ctrl-C while torch imports (exit 130, no traceback)
import json
import math
import os
import sys
import time
from dataclasses import asdict

import torch
import torch.nn.functional as F

import prepare_data
import tost
from options import UsageError, parse
from train_common import (autocast, cosine_lr, human, load_checkpoint, load_weights, mean_loss, optimizer_for,
                          resolve_dtype, resume_command, seed_of, sum_dtype, wrap)
from train_legacy import Run, check_lr, check_ranges, launch, make_out_dir

DEFAULTS = dict(
    # data and I/O
    dataset='cifar10',          # a folder under data_dir made by prepare_data.py (cifar10, cifar100)
    data_dir='data',            # where prepare_data.py puts datasets
    out_dir='out-vit',          # ckpt.pt, best.pt (best test accuracy), log.jsonl, loss.png, viz/ (figures)
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
    max_steps=0,                # cap on steps per epoch, for smoke tests; 0: the whole epoch
    # evaluation and logging
    eval_interval=1,            # epochs between test-set evaluations (the last epoch is always evaluated)
    log_interval=20,            # steps between progress lines (and one at each epoch's end)
    compression_images=128,     # first N test images on which R^var_c of every TSSA layer is measured; 0: skip
    viz_images=4,               # test images drawn to out_dir/viz/ at each evaluation; 0: none
    viz_layer=-1,               # the TSSA layer whose memberships Pi are drawn
    # system
    device='auto',              # auto, cpu, cuda, cuda:N, mps
    dtype='auto',               # auto (bfloat16 where the GPU or CPU computes in it, else float16 on a GPU, float32)
    compile=False,              # torch.compile the model
    seed=1337,                  # model init, augmentation and the data order follow from it
)
MACHINE_KEYS = ('device', 'compile', 'out_dir', 'init_from', 'eval_only', 'overwrite')  # not resumed

# -----------------------------------------------------------------------------
# data: uint8 tensors on the device, augmented there


def random_crop_flip(x, pad=4):
    """x (B, C, H, W) uint8 -> the same shape: zero-pad by `pad`, cut an H x W window at a random offset per
    image, mirror half of them. One gather: rows and columns are index vectors per image; a flip reads them reversed."""
    (B, C, H, W), dev = x.shape, x.device
    oy, ox = torch.randint(0, 2 * pad + 1, (2, B, 1), device=dev)           # (B, 1) offsets
    rows = oy + torch.arange(H, device=dev)                                  # (B, H)
    cols = ox + torch.arange(W, device=dev)                                  # (B, W)
    cols = torch.where(torch.rand(B, 1, device=dev) < 0.5, cols.flip(1), cols)   # a horizontal flip for half
    b, c = torch.arange(B, device=dev).view(B, 1, 1, 1), torch.arange(C, device=dev).view(1, C, 1, 1)
    return F.pad(x, (pad,) * 4)[b, c, rows.view(B, 1, H, 1), cols.view(B, 1, 1, W)]   # black border, (B, C, H, W)


def train_shard(n, seed, epoch, rank, world_size):
    """This rank's indices for one epoch: every world_size-th entry of a permutation seeded by (seed, epoch), padded
    with its own start to a multiple of world_size: equal counts (DDP needs equal steps) that cover every image."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100003 + epoch))
    perm = torch.cat([perm, perm[:(-n) % world_size]])                      # up to a multiple of world_size
    return perm[rank::world_size]                                            # (ceil(n / world_size),)

# -----------------------------------------------------------------------------
# the model's config, from the preset or the checkpoint


def vit_config(cfg, set_keys, meta, ckpt=None, path=None):
    """The ViTConfig: the preset with the dataset's classes and image size, or the checkpoint's own."""
    if ckpt is not None:
        args = dict(ckpt['model_args'])
        for key, had in (('model', ckpt.get('config', {}).get('model')), ('attn', args.get('attn')),
                         ('lpi', args.get('lpi', False))):
            if key in set_keys and had is not None and cfg[key] != had:
                raise UsageError(f"--{key}={cfg[key]} but {path} holds a model with {key}={had}; drop --{key}")
        if (args.get('num_classes'), args.get('in_chans')) != (meta['num_classes'], meta['channels']):
            raise UsageError(f"{path} was trained on {args.get('num_classes')} classes of {args.get('in_chans')}"
                             f"-channel images, {cfg['dataset']} has {meta['num_classes']} of {meta['channels']}"
                             f"-channel ones; use a checkpoint trained on {cfg['dataset']}")
        if 'drop_path' in set_keys:                             # a regulariser, not the shape: it may change
            args['drop_path'] = cfg['drop_path']
    else:
        if tost.PRESETS.get(cfg['model'], {}).get('kind') != 'vit':
            names = [k for k, v in tost.PRESETS.items() if v['kind'] == 'vit']
            raise UsageError(f"--model={cfg['model']} is not a vision preset; choose one of {', '.join(names)}")
        args = asdict(tost.preset(cfg['model']))
        if cfg['model'] in ('tost-t', 'tost-s', 'tost-m') and meta['image_size'] <= 64:   # the paper's, for 224px
            args['patch_size'] = 4                              # 32px: an 8x8 grid (224px / 16 is 14x14)
        args.update(num_classes=meta['num_classes'], in_chans=meta['channels'], attn=cfg['attn'], lpi=cfg['lpi'],
                    drop_path=cfg['drop_path'] if 'drop_path' in set_keys else args['drop_path'])
    try:
        return tost.ViTConfig(**dict(args, img_size=meta['image_size']))
    except (TypeError, ValueError) as e:
        raise UsageError(f"{cfg['dataset']}'s {meta['image_size']}px images and {path or '--model=' + cfg['model']}: "
                         f"{e}") from None

# -----------------------------------------------------------------------------
# evaluation: test accuracy (all ranks), per-layer compression and pictures (rank 0)


@torch.no_grad()
def evaluate(model, x, y, norm, batch_size, device, dtype, dist):
    """(accuracy, mean loss, images) over the whole test set, sharded over the ranks and all-reduced."""
    model.eval()
    if dist.ddp:  # BatchNorm running stats drift apart on each rank's last batches: use rank 0's, which it saves
        for buf in model.buffers():
            torch.distributed.broadcast(buf, 0)
    idx = torch.arange(len(x), device=x.device).tensor_split(dist.world_size)[dist.rank]   # each image once
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
    model.train()
    correct, loss, count = stats.tolist()
    return correct / count, loss / count, int(count)


def compression_chart(values, n_images, width=32):
    """A bar per TSSA layer, as lines of text: the paper's per-layer R^var_c figure in a terminal."""
    top = max(values) or 1.0
    lines = [f"R^var_c of each TSSA layer's output, mean over {n_images} test images (the paper's falls with depth):"]
    for i, v in enumerate(values):
        eighths = max(0, round(8 * width * v / top))                 # the bar's length in eighths of a character
        bar = ('█' * (eighths // 8) + ' ▏▎▍▌▋▊▉'[eighths % 8]).rstrip()
        lines.append(f"  layer {i:2d}  {bar:<{width}}  {v:.4g}")
    if len(values) > 1 and values[0]:
        lines.append(f"  first -> last: {values[0]:.4g} -> {values[-1]:.4g} ({values[-1] / values[0] - 1:+.1%})")
    return lines


@torch.no_grad()
def inspect(model, x, layer=-1):
    """What a ViT does on images x, for the figures and the compression chart: 'pi' (B, K, Hp, Wp), the memberships
    Pi of TSSA block `layer`; 'cls_attn' (B, H, Hp, Wp), the last class-attention block's CLS attention over the
    patches; 'compression', R^var_c (B,) per TSSA block of the block's output tokens (after its TSSA, LPI if any,
    and MLP) seen through its own LayerNorm and projections, with the memberships it computed from its input."""
    x, (Hp, Wp) = model._tokens(x)
    B, pis, comp = x.shape[0], [], []
    for block in model.blocks:
        a = block.attn
        if isinstance(a, tost.TSSA):
            w = a.split_heads(a.c_attn(block.ln_1(x)))
            pis.append(a.memberships(w.to(tost._stat_dtype(w))))     # (B, K, n)
        x = block(x, grid=(Hp, Wp))
        if isinstance(a, tost.TSSA):                          # the block's output, through its own LN and
            w = a.split_heads(a.c_attn(block.ln_1(x)))        # projections (bias included, as the layer applies)
            comp.append(tost.compression_of_projections(w, pis[-1].to(w.dtype)))     # alpha = 1
    cls, att = model.cls_token.expand(B, -1, -1), None
    for block in model.cls_blocks:
        cls, x, att = block(cls, x)
    return {'compression': comp, 'cls_attn': None if att is None else att[:, :, 1:].reshape(B, -1, Hp, Wp),
            'pi': pis[layer].reshape(B, -1, Hp, Wp) if pis else None}


@torch.no_grad()
def look_inside(model, x, y, norm, cfg, meta, n_tssa):
    """Per-layer compression of the first test images, and the PNGs; on rank 0, in float32. Returns (the log
    row's 'compression': R^var_c per TSSA layer, if measured; lines to print)."""
    m, v = cfg['compression_images'], min(cfg['viz_images'], len(x))     # images measured, images drawn
    if m == v == 0:
        return {}, []
    model.eval()                                # called in training mode: it goes back to it
    out = inspect(model, norm(x[:max(m, v)]), layer=cfg['viz_layer'])
    pred = model(norm(x[:v])).argmax(-1).tolist() if v else []
    model.train()
    comp = [c[:m].float().mean().item() for c in out['compression']] if m else []
    row, lines = ({'compression': comp}, compression_chart(comp, min(m, len(x)))) if comp else ({}, [])
    if v:
        folder = os.path.join(cfg['out_dir'], 'viz')
        classes = meta.get('classes') or [str(i) for i in range(meta['num_classes'])]
        names = [f"{i}: {classes[t]}" + ("" if p == t else f" (predicted {classes[p]})")
                 for i, (t, p) in enumerate(zip(y[:v].tolist(), pred))]
        try:
            import plot
            os.makedirs(folder, exist_ok=True)
            for i in range(v):
                plot.vision_maps(os.path.join(folder, f'test{i:04d}.png'), x[i].cpu(), out['cls_attn'][i].cpu(),
                                 None if out['pi'] is None else out['pi'][i].cpu(), names[i])
        except Exception as e:                                 # a picture never stops training
            return row, lines + [f"could not draw the maps ({type(e).__name__}: {e}); training goes on"]
        layer = f", Pi of TSSA layer {cfg['viz_layer'] % n_tssa}" if n_tssa else ""
        lines.append(f"wrote {v} PNG{'s' * (v > 1)} to {folder} (CLS attention{layer}): " + ", ".join(names))
    return row, lines

# -----------------------------------------------------------------------------
# the run


def train(cfg, set_keys, dist):
    say = (lambda *a: print(*a, flush=True)) if dist.master else (lambda *a: None)   # rank 0 talks for all
    device, resumed = dist.device, cfg['init_from'] == 'resume'   # else a new run (from scratch or from weights)
    ckpt_path, best_path = os.path.join(cfg['out_dir'], 'ckpt.pt'), os.path.join(cfg['out_dir'], 'best.pt')
    path = {'scratch': None, 'resume': ckpt_path, 'best': best_path}.get(cfg['init_from'], cfg['init_from'])
    needs = ('model', 'optimizer', 'step') if resumed else ('model',)
    ckpt = path and load_checkpoint(path, device, 'vit', needs=needs)              # None from scratch
    if ckpt and ckpt.get('format') != 2:            # format 2: the released vision model (XCiT's class blocks)
        raise UsageError(f"{path} is from an earlier train_vit.py, whose model computed otherwise (CaiT's "
                         f"class-attention blocks, LayerNorm eps 1e-5); train a new one")
    if resumed or cfg['eval_only']:    # a resume goes on as it was; an evaluation tests on the data it learned from
        old = {k: v for k, v in ckpt.get('config', {}).items() if resumed or k in ('dataset', 'data_dir')}
        cfg = {k: v if k in set_keys or k in MACHINE_KEYS or k not in old else old[k] for k, v in cfg.items()}
    elif path and os.path.abspath(os.path.dirname(path)) == os.path.abspath(cfg['out_dir']):
        raise UsageError(f"training from {path} would overwrite the checkpoints beside it; train into another "
                         f"--out_dir with --init_from={path} (or go on with --init_from=resume)")
    check_lr(cfg)
    folder = os.path.join(cfg['data_dir'], cfg['dataset'])
    meta = prepare_data.load_meta(folder, 'images')
    config = vit_config(cfg, set_keys, meta, ckpt, path)
    cfg.update(attn=config.attn, lpi=config.lpi, drop_path=config.drop_path)   # what the model is, as saved
    if ckpt is not None:                                            # a checkpoint's model, whatever the default
        cfg['model'] = ckpt.get('config', {}).get('model', cfg['model'])
    n_tssa = config.n_layer if config.attn == 'tssa' else 0
    if n_tssa and not -n_tssa <= cfg['viz_layer'] < n_tssa:
        raise UsageError(f"--viz_layer={cfg['viz_layer']}: the model has {n_tssa} TSSA layers (0..{n_tssa - 1}, "
                         f"or -1 for the last)")
    x_train, y_train, x_test, y_test = (torch.from_numpy(a).to(device) for a in prepare_data.read_images(folder, meta))
    bs, per_rank = cfg['batch_size'], -(-len(x_train) // dist.world_size)
    if bs > per_rank and not cfg['eval_only']:
        say(f"note: --batch_size={bs} is more than the {per_rank} training images of each of the "
            f"{dist.world_size} process(es): batches of {per_rank}")
        bs = per_rank
    dtype, why = resolve_dtype(cfg['dtype'], device, dist.master)
    make_out_dir(cfg['out_dir'], [ckpt_path, best_path], cfg['overwrite'], not resumed and not cfg['eval_only'],
                 dist.master)
    mean, std = (torch.tensor(meta[k], device=device).view(1, -1, 1, 1) for k in ('mean', 'std'))
    norm = lambda x: (x.float() / 255 - mean) / std                 # uint8 -> standardised per channel

    torch.manual_seed(cfg['seed'])                                  # every process starts from the same weights
    raw_model = tost.ViT(config).to(device)
    if ckpt:
        load_weights(raw_model, ckpt, path)
        del ckpt['model']                                          # the model holds them: no second copy kept
    # evaluation without DDP: its forward would broadcast the BatchNorm buffers (a collective), and the ranks run
    # different numbers of test batches
    eval_model = torch.compile(raw_model, dynamic=False) if cfg['compile'] else raw_model
    if cfg['eval_only']:
        acc, loss, count = evaluate(eval_model, x_test, y_test, norm, bs, device, dtype, dist)
        if dist.master:
            compression, lines = look_inside(raw_model, x_test, y_test, norm, cfg, meta, n_tssa)
            say('\n'.join([f"{path} (epoch {ckpt.get('epoch', 0):g}): test accuracy {acc:.4f} ({round(acc * count)}/"
                           f"{count}), test loss {loss:.4f}", *lines]))
            with open(os.path.join(cfg['out_dir'], 'eval.jsonl'), 'a') as f:
                f.write(json.dumps({'checkpoint': path, 'epoch': ckpt.get('epoch'), 'test_acc': acc, 'test_loss': loss,
                                    'test_images': count, **compression}) + '\n')
        return acc

    optimizer, scaler, params = optimizer_for(raw_model, cfg, dtype, ckpt if resumed else None)
    spe = min(-(-per_rank // bs), cfg['max_steps'] or math.inf)     # steps per epoch
    step, best_acc, elapsed = 0, -1.0, 0.0                          # best_acc -1: no test yet
    if resumed:     # the epochs done, in this run's steps (another process count or batch size: another step)
        done = ckpt['epoch']
        step, best_acc, elapsed = round(done * spe), ckpt.get('best_acc', -1.0), ckpt.get('elapsed_s', 0.0)
    total = cfg['epochs'] * spe
    model, ctx = wrap(raw_model, dist, cfg['compile']), autocast(device, dtype)

    say(f"{cfg['model']} ({config.attn}{' + lpi' if config.lpi else ''}, {config.n_layer} layers, {config.n_embd} "
        f"wide, {(config.img_size // config.patch_size) ** 2} tokens): {raw_model.get_num_params() / 1e6:.2f}M params "
        f"| {cfg['dataset']}: {len(x_train)} train / {len(x_test)} test images, {meta['num_classes']} classes | "
        f"{dist.world_size} x {device} {dtype} ({why}) | {spe} steps of {dist.world_size} x {bs} per epoch")
    if step >= total:
        return say(f"nothing to do: the checkpoint is at step {step} (epoch {step / spe:g}) of --epochs="
                   f"{cfg['epochs']}; raise --epochs")
    if resumed:
        best = f"best test accuracy {best_acc:.4f}" if best_acc >= 0 else "no test yet"
        say(f"resuming {path} at step {step} (epoch {step / spe:g}, {best})")
    if cfg['warmup_epochs'] >= cfg['epochs']:
        say(f"note: the warmup ({cfg['warmup_epochs']:g} epochs) is as long as the run ({cfg['epochs']}): the learning "
            f"rate never reaches --learning_rate; set --warmup_epochs lower")

    run = Run(cfg['out_dir'], step if resumed else None, 'step', dist,     # the log's rows up to the epochs done
              resume_command('train_vit.py', cfg, set_keys, DEFAULTS), logged=('epoch', done) if resumed else None)
    t_start, shard = time.time(), None
    elapsed_s = lambda: round(elapsed + time.time() - t_start, 2)   # the runs it resumed included
    state = lambda: dict(model=raw_model.state_dict(), optimizer=optimizer.state_dict(), scaler=scaler.state_dict(),
                         model_args=asdict(config), kind='vit', format=2, step=step, epoch=step / spe,
                         best_acc=best_acc, config=cfg, meta=meta, elapsed_s=elapsed_s())
    loss_sum, since_row, seen, t_row = torch.zeros((), device=device), 0, 0, time.time()
    run.record({'kind': 'config', **cfg, 'dtype': dtype, 'params': raw_model.get_num_params()})   # auto resolved
    try:
        with run:
            while True:
                epoch, i = divmod(step, spe)
                # at an epoch's end: the test set (every eval_interval epochs and the last), pictures, checkpoints
                if i == 0 and step > 0 and step != run.saved:
                    improved = False
                    if epoch % cfg['eval_interval'] == 0 or step == total:
                        acc, test_loss, count = evaluate(eval_model, x_test, y_test, norm, bs, device, dtype, dist)
                        improved, best_acc = acc > best_acc, max(best_acc, acc)
                        if dist.master:                     # compression per TSSA layer (none for softmax), pictures
                            compression, lines = look_inside(raw_model, x_test, y_test, norm, cfg, meta, n_tssa)
                            say('\n'.join([f"epoch {epoch}/{cfg['epochs']}: test loss {test_loss:.4f}, test acc "
                                           f"{acc:.4f} (best {best_acc:.4f})", *lines]))
                            run.record(dict(kind='eval', step=step, epoch=epoch, test_loss=test_loss, test_acc=acc,
                                            best_acc=best_acc, test_images=count, **compression,
                                            elapsed_s=elapsed_s()))
                        run.draw()
                    run.save(state(), step, also=[best_path] * improved)
                    t_row = time.time()                     # evaluation is not training time
                if step >= total:
                    break
                if run.requested():              # Ctrl-C or SIGTERM on any rank: all stop here, at the same step
                    raise run.interrupted(step, f"step {step} (epoch {step / spe:.2f})", state,
                                          math.isfinite(loss_sum.item()))
                # one optimizer step on this rank's next batch_size images, augmented on the device
                if shard is None or i == 0:
                    shard = train_shard(len(x_train), cfg['seed'], epoch, dist.rank, dist.world_size).to(device)
                torch.manual_seed(seed_of(cfg['seed'], epoch, i, dist.rank))   # augmentation, drop-path: resumable
                lr = cosine_lr(step, cfg['learning_rate'], cfg['min_lr'], cfg['warmup_epochs'] * spe, total)
                for group in optimizer.param_groups:
                    group['lr'] = lr
                idx = shard[i * bs:(i + 1) * bs]
                x, y = norm(random_crop_flip(x_train[idx])), y_train[idx]
                optimizer.zero_grad(set_to_none=True)
                with ctx:
                    loss = F.cross_entropy(model(x).float(), y, label_smoothing=cfg['label_smoothing'])
                scaler.scale(loss).backward()
                if cfg['grad_clip'] > 0:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(params, cfg['grad_clip'])
                scaler.step(optimizer)
                scaler.update()
                step, since_row, seen, loss_sum = step + 1, since_row + 1, seen + len(idx), loss_sum + loss.detach()
                # a log row every log_interval steps and at each epoch's end: the mean loss since the last one
                if step % cfg['log_interval'] == 0 or step % spe == 0:
                    if not math.isfinite(train_loss := mean_loss(loss_sum, since_row, dist)):
                        raise run.diverged('training loss', train_loss, step)   # the one on disk is fine
                    secs = time.time() - t_row
                    dt, img_s = secs / since_row, seen * dist.world_size / secs   # per step; the row's images
                    run.record(dict(kind='train', step=step, epoch=step / spe, train_loss=train_loss, lr=lr,
                                    img_per_s=img_s, ms_per_step=1000 * dt, elapsed_s=elapsed_s()),
                               f"step {step}/{total} (epoch {step / spe:.2f}): loss {train_loss:.4f}, lr {lr:.1e}, "
                               f"{img_s:,.0f} img/s, {1000 * dt:.1f} ms/step, eta {human((total - step) * dt)}")
                    loss_sum, since_row, seen, t_row = torch.zeros((), device=device), 0, 0, time.time()
    except (KeyboardInterrupt, RuntimeError) as e:  # a second Ctrl-C: out at once, without saving; out of memory
        raise run.stopped(e, step, f"with batch_size={bs} on {device}; try --batch_size={bs // 2}") from None
    say(f"done: best test accuracy {best_acc:.4f} in {human(time.time() - t_start)}; checkpoints in {cfg['out_dir']}")
    return best_acc


def main(argv=None):
    cfg, set_keys = parse(sys.argv[1:] if argv is None else argv, DEFAULTS, __doc__, __file__)
    check_ranges(cfg, positive=('epochs', 'batch_size', 'learning_rate', 'eval_interval', 'log_interval'),
                 nonnegative=('min_lr', 'weight_decay', 'grad_clip', 'warmup_epochs', 'max_steps', 'compression_images',
                              'viz_images'), fraction=('label_smoothing', 'drop_path', 'beta1', 'beta2'))
    if cfg['init_from'] not in ('scratch', 'resume', 'best') and not cfg['init_from'].endswith('.pt'):
        raise UsageError(f"--init_from={cfg['init_from']}: use scratch, resume, best or a path to a .pt file")
    if cfg['eval_only'] and cfg['init_from'] == 'scratch':
        raise UsageError("--eval_only needs a checkpoint: --init_from=resume, best or a path to a .pt file")
    return launch(train, cfg, set_keys)


if __name__ == '__main__':
    main()
