"""What the trainers, sample.py and eval_gpt.py share, as plain functions that keep no state: checkpoints
(atomic, loaded with weights_only), the out_dir and its lock, the learning-rate schedule, the device and
dtype, processes under torchrun, Ctrl-C and SIGTERM as a request to stop, and the run log (log.jsonl and
loss.png)."""
import contextlib
import datetime
import errno
import gc
import glob
import importlib
import json
import math
import os
import re
import signal
import sys
import textwrap
import threading
import time
import weakref
import zipfile
from collections import namedtuple

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import tost_fast
from options import (UsageError, first_line, kernel, naming, near, out_of_memory, peer_gone, say,
                     shell_join, stop_signals_here, write_whole)

# Windows has no fcntl: there the lock is msvcrt's, on the lock file's first byte.
try:
    import fcntl
except ImportError:
    fcntl = None
    import msvcrt

# -----------------------------------------------------------------------------
# checkpoints and the output folder

# kind: (the script that writes it, what it models, the model_args its shape is read from)
TRAINERS = {"gpt": ("train_gpt.py", "language-model", ("vocab_size", "block_size", "n_layer", "n_head",
                                                       "n_embd")),
            "vit": ("train_vit.py", "vision", ("img_size", "patch_size", "in_chans", "num_classes", "n_layer",
                                               "n_head", "n_embd"))}
# What a run saves besides tensors: counts (whole numbers, 0 or more) and measures (finite numbers).
COUNTS = ("iter_num", "tokens", "step", "since_row", "format")
MEASURES = ("best_val_loss", "epoch", "best_acc", "loss_sum", "elapsed_s")


def init_path(init_from, names, written):
    """The checkpoint --init_from names: `names` maps a name to its path (or None), anything else is the
    path of a file. One line for a path to no file, or for a checkpoint this run writes (`written`) as its
    source."""
    path = names.get(init_from, init_from)
    # A name mistyped (resum) is a path to no file; a run's folder holds its checkpoint.
    if path == init_from and not os.path.isfile(path):
        hint = near(path, names)
        # nanoGPT's --init_from=gpt2 (or gpt2-xl...)
        if re.fullmatch(r"gpt2(-medium|-large|-xl)?", path):
            hint = "; ToST has no GPT-2 weights to start from"
        if os.path.isdir(path):
            hint = "; the folder holds no checkpoint"
        # A run's folder: its ckpt.pt (train_vit's best.pt where that alone is there).
        for name in ("best.pt", "ckpt.pt") if "best" in names else ("ckpt.pt",):
            if os.path.isfile(os.path.join(path, name)):
                hint = f"; the checkpoint in it: --init_from={os.path.join(path, name)}"
        raise UsageError(f"--init_from={path}: no such file; it takes {', '.join(names)} or the path of a "
                         f"checkpoint{hint}")
    # A new run would delete (--overwrite) or replace the file it starts from.
    if path and os.path.isfile(path) and any(os.path.isfile(p) and os.path.samefile(path, p)
                                             for p in written):
        raise UsageError(f"--init_from={init_from}: a new run from {path} would write over it; start it "
                         f"elsewhere: --init_from={path} --out_dir=OTHER")
    return path


def trainer_of(ckpt):
    """'gpt' or 'vit': the trainer that saved the checkpoint `ckpt`, by what it holds (None: neither)."""
    if ckpt.get("kind") == "vit":
        return "vit"
    return "gpt" if "vocab_size" in ckpt.get("model_args", {}) else None


def load_checkpoint(path, map_location="cpu", kind=None, needs=()):
    """torch.load with weights_only=True (loading cannot run code). One line naming the path if the file is
    missing or not a checkpoint, holds what no trainer saves (a tensor on the meta device, references that
    unfold past a million items, a count or measure that is not one), or, given `kind` ('gpt' or 'vit'), is
    another trainer's, lacks the keys `needs` or a model_args field its shape is read from."""
    folder = os.path.dirname(path) or "."
    # A folder that is a file is the OSError handler's to name.
    if not os.path.exists(path) and not os.path.isfile(folder):
        # The trainer writes ckpt.pt (and best.pt) in its --out_dir: a path by another name has no such
        # folder, and a folder whose run has begun its log (and may be under way) has its own trainer.
        ours = kind and os.path.basename(path) in ("ckpt.pt", "best.pt")
        ours = ours and not os.path.exists(os.path.join(folder, "log.jsonl"))
        # Which run is meant (a preset's, the demo's) is the user's to say.
        hint = (f"; {command(TRAINERS[kind][0], [f'--out_dir={folder}'])}, with the options of the run you "
                f"want, writes one there") if ours else ""
        # A run stopped before its first evaluation has its ckpt.pt and no best.pt yet.
        ckpt = os.path.join(folder, "ckpt.pt")
        if os.path.basename(path) == "best.pt" and os.path.isfile(ckpt):
            hint = f"; the first evaluation writes it, and {ckpt} is there (--init_from=resume)"
        raise UsageError(f"no checkpoint at {path}{hint}")
    with open(path, "rb") as f:
        head = f.read(4)
    if not head.startswith(b"PK"):
        raise UsageError(f"{path} is not a checkpoint: torch.save writes a zip archive, this file starts "
                         f"with {head!r}")
    # torch.save stores its records as they are; torch.load would also inflate compressed ones, a thousand
    # times their size in memory at most, before anything here could look at them.
    with contextlib.suppress(zipfile.BadZipFile), zipfile.ZipFile(path) as z:
        if any(record.compress_type != zipfile.ZIP_STORED for record in z.infolist()):
            raise UsageError(f"{path} is not a checkpoint torch.save wrote: its records are compressed")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        unsafe = re.search(r"GLOBAL ([\w.]+)", str(e))
        reason = first_line(e)
        if unsafe:
            reason = f"holds {unsafe.group(1)}, which weights_only loading refuses"
        raise UsageError(f"checkpoint {path} is corrupt or unreadable ({reason})") from None
    if not isinstance(ckpt, dict):
        raise UsageError(f"checkpoint {path} is corrupt or unreadable ({type(ckpt).__name__}, not a dict)")
    # A crafted file may hold anything. Shared references unfold, walked or printed, into more items than
    # memory holds (a few hundred bytes into terabytes); a tensor on the meta device claims a size it lacks.
    todo = [ckpt]
    for _ in range(10**6):
        if not todo:
            break
        value = todo.pop()
        if isinstance(value, dict):
            todo += [*value.keys(), *value.values()]
        elif isinstance(value, (list, tuple)):
            todo += value
        elif isinstance(value, torch.Tensor) and value.is_meta:
            raise UsageError(f"checkpoint {path} is corrupt or unreadable (a tensor that holds no numbers)")
    if todo:
        raise UsageError(f"checkpoint {path} is corrupt or unreadable (more than a million items, unfolded)")
    # The scripts read these by key: a hand-edited or foreign checkpoint may hold anything there.
    for key in ("model", "model_args", "meta", "config", "optimizer"):
        if not isinstance(ckpt.get(key, {}), dict):
            raise UsageError(f"checkpoint {path} is corrupt or unreadable ({key}: "
                             f"{type(ckpt[key]).__name__}, not a dict)")
    found = trainer_of(ckpt)
    if kind and found and found != kind:
        raise UsageError(f"{path} is a {TRAINERS[found][1]} checkpoint ({TRAINERS[found][0]}), not a "
                         f"{TRAINERS[kind][1]} one")
    missing = sorted(set(needs) - set(ckpt))
    if kind and (missing or not found):
        raise UsageError(f"{path} is not a {TRAINERS[kind][0]} checkpoint (no "
                         f"{', '.join(missing or ['model_args'])})")
    # Another program's checkpoint (nanoGPT's keeps its best_val_loss as a tensor) is said to be that first.
    for key in COUNTS + MEASURES:
        value = ckpt.get(key, 0)
        number = type(value) is int or type(value) is float and math.isfinite(value)
        count = type(value) is int and value >= 0
        if not (count if key in COUNTS else number):
            raise UsageError(f"checkpoint {path} is corrupt or unreadable ({key}: {value!r:.40})")
    for key in TRAINERS[kind][2] if kind else ():
        if key not in ckpt["model_args"]:
            raise UsageError(f"{path} is corrupt or unreadable (its model_args lack {key})")
    return ckpt


class _SkipInit(torch.overrides.TorchFunctionMode):
    """torch.nn.init's functions as no-ops: on the meta device they fill nothing, and the meta kernels of
    normal_ and trunc_normal_ import torch._dynamo, which sample.py and eval_gpt.py need for nothing else (it
    would double the time they take to start)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def on_meta(make, config):
    """make(config) on the meta device, its shapes alone: no memory taken, no initialisation run."""
    with torch.device("meta"), _SkipInit():
        return make(config)


def check_fits(make, config, ckpt, path):
    """One line unless the weights in `ckpt` can fill make(config), the model its model_args describe, checked
    before that model takes any memory: a crafted model_args would take as much as it names. Each layer holds
    tensors of its own; on the meta device, the model's numbers must be at most the bytes the file's tensors
    hold (a view of one number, stride 0, can claim any shape)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in ckpt["model"].values()
                if isinstance(t, torch.Tensor)}
    layers = config.n_layer + getattr(config, "n_cls_layer", 0)
    if layers > len(storages):
        raise UsageError(f"{path} does not fit its own model_args ({layers} layers, {len(storages)} tensors)")
    model = on_meta(make, config)
    numbers = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
    held = sum(storages.values())
    if numbers > held:
        raise UsageError(f"{path} does not fit its own model_args (a model of {numbers} numbers, weights of "
                         f"{held} bytes)")


def load_weights(model, ckpt, path):
    """ckpt's weights into model, taken out of ckpt (no second copy kept), or one line."""
    try:
        model.load_state_dict(ckpt.pop("model"))
    except RuntimeError as e:
        # torch's first line is a heading; the keys missing, unexpected or of another shape follow.
        why = textwrap.shorten(" ".join(str(e).split("\n", 1)[-1].split()), 200)
        raise UsageError(f"{path} does not fit its own model_args ({why})") from None


# The folders this process holds, each with the thread whose run took it (a weak reference: a lock no run
# keeps is let go). A thread runs one run at a time: a folder its thread still holds is an earlier run's that
# ended in an exception, whose traceback a notebook keeps (and the open lock with it); the thread's next run
# takes it again. Another thread's is refused.
HELD = {}


def lock_out_dir(out_dir):
    """Rank 0's hold on out_dir, an open file (kept by the caller while it writes there; closing lets go), so
    that two runs never write in one folder; then a save that kill -9 cut short leaves no temp file. None
    where the filesystem has no locks: the folder is then unguarded."""
    key = os.path.realpath(out_dir)
    earlier, thread = HELD.get(key, (lambda: None, None))
    if thread == threading.get_ident() and earlier():
        release(earlier())
    lock = open_own(os.path.join(out_dir, ".lock"))
    try:
        if fcntl:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            # Windows: a byte another handle holds is PermissionError (EACCES)
            msvcrt.locking(lock.fileno(), msvcrt.LK_NBLCK, 1)
    except (BlockingIOError, PermissionError):
        lock.close()
        raise UsageError(f"another run is writing in --out_dir={out_dir}; let it finish, or choose another "
                         f"--out_dir") from None
    except OSError:
        lock.close()
        return None
    for tmp in glob.glob(os.path.join(glob.escape(out_dir), "*.tmp-*")):
        os.remove(tmp)
    HELD[key] = (weakref.ref(lock), threading.get_ident())
    return lock


def release(lock):
    """Closes lock_out_dir's file: the folder is let go. Windows' lock is undone first, as its documentation
    asks (one left to the close may stay a while, and refuse the next run)."""
    if fcntl is None and not lock.closed:
        with contextlib.suppress(OSError):
            msvcrt.locking(lock.fileno(), msvcrt.LK_UNLCK, 1)
    lock.close()


def make_out_dir(out_dir, checkpoints, overwrite, fresh, master, kind=None):
    """Create out_dir on every rank and lock it on rank 0 (returned: keep it). A fresh run refuses an earlier
    run's `checkpoints`, or with `overwrite` deletes them, unless another trainer than `kind`'s saved them; a
    resume refuses `overwrite`."""
    # --overwrite would delete the checkpoint a resume goes on from: the pair is one or the other.
    if overwrite and not fresh:
        raise UsageError("--init_from=resume goes on from out_dir's checkpoint, --overwrite=true starts "
                         "again without it: pass one of them")
    os.makedirs(out_dir, exist_ok=True)
    # The lock first: a folder another run holds is refused as such, not with advice the lock would refuse.
    lock = lock_out_dir(out_dir) if master else None
    found = [p for p in checkpoints if fresh and os.path.isfile(p)]
    try:
        # A link at the log is refused before anything is deleted or read through it, as log_row refuses it
        # (start_log's rename would replace it with a file).
        if master:
            refuse_link(os.path.join(out_dir, "log.jsonl"))
        # A folder where a checkpoint goes is found now, not at the first save, hours on.
        for p in checkpoints:
            if os.path.isdir(p):
                raise UsageError(f"{p} is a folder, where the run writes its checkpoint; move it away")
        # Another trainer's run (train_gpt's demo in out/, given to train_vit) is not this one's to go on with
        # or delete. A file torch cannot read is this run's to replace, with --overwrite.
        for path in found if kind else ():
            held = None
            with contextlib.suppress(Exception):
                held = trainer_of(torch.load(path, map_location="meta", weights_only=True))
            if held not in (kind, None):
                raise UsageError(f"{path} holds a {TRAINERS[held][0]} run, which a {TRAINERS[kind][0]} run "
                                 f"neither goes on with nor deletes: choose another --out_dir")
        if found and not overwrite:
            # A resume goes on from the first of `checkpoints` (ckpt.pt): with best.pt alone there is none.
            resume = " go on with it: add --init_from=resume, or" if checkpoints[0] in found else ""
            raise UsageError(f"{found[0]} holds an earlier run;{resume} start afresh: another --out_dir, or "
                             f"--overwrite=true (deletes {' and '.join(found)}; the log starts again)")
    except (OSError, UsageError):
        # Let go of the folder at once (a caller that goes on in this process may take it again).
        if lock:
            release(lock)
        raise
    for p in found if master else ():
        os.remove(p)
        say(f"overwrite: deleted {p}")
    return lock

# -----------------------------------------------------------------------------
# the optimizer and the schedule


def optimizer_for(model, cfg, dtype, ckpt):
    """AdamW and the GradScaler (float16 only: bfloat16 has the range), as `ckpt` left them."""
    kind = next(model.parameters()).device.type
    betas = (cfg["beta1"], cfg["beta2"])
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"], betas, kind)
    scaler = torch.amp.GradScaler(kind, enabled=dtype == "float16")
    if ckpt:
        # Another grouping of the parameters (a version that decays others) is a ValueError inside torch.
        try:
            optimizer.load_state_dict(ckpt["optimizer"])
            # torch checks the grouping, not the moments: a step would run past the ends of smaller ones.
            for p, state in optimizer.state.items():
                for name, t in state.items():
                    shape = () if name == "step" else p.shape
                    if not torch.is_tensor(t) or t.shape != shape:
                        raise ValueError(f"its {name} of a parameter of shape {tuple(p.shape)} is not of "
                                         f"shape {tuple(shape)}")
        except ValueError as e:
            raise UsageError(f"the checkpoint's optimizer state does not fit this model's optimizer "
                             f"({first_line(e)}); start afresh in another --out_dir") from None
        # A disabled scaler saves {}.
        if ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
    return optimizer, scaler


def check_decay(cfg):
    """AdamW's decay multiplies the weights by 1 - lr x weight_decay a step: at 0 or below it erases them."""
    if cfg["learning_rate"] * cfg["weight_decay"] >= 1:
        raise UsageError(f"--weight_decay={cfg['weight_decay']:g} times --learning_rate="
                         f"{cfg['learning_rate']:g} is 1 or more: each step would erase the weights")


def optimizer_step(optimizer, scaler, lr, grad_clip):
    """One AdamW step at `lr` on the gradients accumulated, their global norm clipped at grad_clip (0: not
    clipped)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    if grad_clip > 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def diverged(what, value, when, kept, cfg):
    """The line that ends a run whose loss is not finite (every rank finds it at the same step: the losses are
    all-reduced). What is on disk, from before, is `kept`; the advice names the options that can help."""
    advice = "a lower --learning_rate"
    if cfg["weight_decay"] > 0:
        advice += " or --weight_decay"
    advice += ", or a lower --grad_clip" if cfg["grad_clip"] > 0 else ", or --grad_clip=1"
    return f"the {what} is {value} at {when}: training diverged; stopped without saving, {kept}; try {advice}"


def last_good(path, saved, unit):
    """What is on disk: the checkpoint a run saved at `saved` (its iter or step), or none."""
    if not saved:
        return "no checkpoint was saved"
    return f"the last good checkpoint is {path} ({unit} {saved})"


def cosine_lr(it, lr, min_lr, warmup_iters, decay_iters):
    """Linear warmup to lr over warmup_iters (lr/warmup at it=0), then a cosine down to min_lr at
    decay_iters."""
    if it < warmup_iters:
        return lr * min(1.0, (it + 1) / warmup_iters)
    if it >= decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def seed_of(*numbers):
    """A seed drawn from a tuple of numbers (a run's seed, a step...): the same on any process, after any
    resume."""
    return int(np.random.SeedSequence(numbers).generate_state(1)[0])


def backward_bytes(model, B, T, ctx, fused=True):
    """The bytes the autograd graph of a GPT keeps for the backward of B sequences of T tokens, from probes of
    two and three sequences of n = min(T, 256) tokens: what is fixed (the weights' copies under autocast) and
    a sequence's share. Past n, the share a t + b t^2 of t tokens is fitted to t = n and n / 2: b is 0
    where the memory is linear in the tokens (TSSA, softmax attention's fused kernels), more where softmax's
    weights are kept for dropout."""
    def kept(batch, n):
        storages = {}

        def keep(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        x = torch.zeros(batch, n, dtype=torch.long, device=next(model.parameters()).device)
        with ctx, torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            model(x, x)
        return sum(storages.values())

    # A token's share at t tokens, a + b t, from batches of two and three (a batch of one keeps some views as
    # copies of their own); what a batch keeps once (the positions) is not a sequence's. The probes take the
    # path the micro-step takes: on a CPU, past MIN_ELEMENTS numbers, the fused core, which keeps less (not
    # `fused` under --compile: the compiled step runs the readable lines).
    fused = fused and B * T * model.config.n_embd >= tost_fast.MIN_ELEMENTS
    before = tost_fast.MIN_ELEMENTS
    tost_fast.MIN_ELEMENTS = 0 if fused else math.inf
    try:
        n = min(T, 256)
        two = kept(2, n)
        s = (kept(3, n) - two) / n
        fixed = two - 2 * n * s
        b = 0
        if T > n:
            h = n // 2
            b = max((s - (kept(3, h) - kept(2, h)) / h) / (n - h), 0)
    finally:
        tost_fast.MIN_ELEMENTS = before
    return fixed + B * T * (s + b * (T - n))


def memory_bytes(device):
    """The memory a process has: a GPU's own, or its share of the machine's with the other processes torchrun
    started on it; None where it cannot be told."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(device)[1]
    with contextlib.suppress(AttributeError, ValueError, OSError):
        processes = max(int(os.environ.get("LOCAL_WORLD_SIZE", 1)), 1)
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // processes
    return None


def human(seconds):
    """190 -> '0:03:10' (at most a million days: beyond, timedelta overflows)."""
    return str(datetime.timedelta(seconds=round(min(seconds, 8.64e10))))

# -----------------------------------------------------------------------------
# device, precision and processes


def compiles_causal(device):
    """Whether torch.compile can build causal TSSA for `device`: before torch 2.13, inductor fails on a GPU at
    code generation for the readable lines' prefix sums (a split scan)."""
    version = tuple(int(v) for v in re.findall(r"\d+", torch.__version__)[:2])
    return not device.startswith("cuda") or version >= (2, 13)


def check_compile(device, dropout=0.0):
    """--compile of causal TSSA: one line where it would fail, before any data is read or model built. The
    Triton core compiles (it did with torch 2.11 on a GPU); training runs on it where it is on, if no
    dropout."""
    triton = tost_fast.triton_on(torch.device(device))
    if not compiles_causal(device) and (not triton or dropout > 0):
        why = "--dropout is above 0" if triton else "no triton, ROCm, TOST_TRITON=0, or a GPU below 7.0"
        raise UsageError(f"--compile: torch {torch.__version__} cannot compile causal TSSA's readable lines "
                         f"for a GPU (fixed in torch 2.13), and they train here ({why}, not the Triton "
                         f"core); upgrade torch or set --compile=false")


def pick_device(pref="auto"):
    """'auto' -> cuda, else mps, else cpu. An explicit choice is kept, but must exist on this machine."""
    if pref == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    # An index of digits 0-9 only, and few: torch.device cannot parse '٣' or 20 digits.
    if not re.fullmatch(r"cpu|mps|cuda(:[0-9]{1,4})?", pref):
        raise UsageError(f"unknown device {pref!r}; use auto, cpu, cuda, cuda:N or mps")
    if pref == "mps" and not torch.backends.mps.is_available():
        raise UsageError("device 'mps' requested but MPS is not available here")
    # CUDA not available (no driver, a broken one) is 0 GPUs.
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if pref.startswith("cuda") and (torch.device(pref).index or 0) >= count:
        raise UsageError(f"device {pref!r} requested but this machine has {count} GPU(s)")
    return pref


def sum_dtype(device):
    """The dtype for sums of many losses: float64, except on MPS, which has none."""
    return torch.float32 if str(device).startswith("mps") else torch.float64


# --dtype's names, checked where it is parsed (and in a checkpoint's config)
DTYPES = ("auto", "bfloat16", "float16", "float32")


def resolve_dtype(dtype, device, master=True):
    """--dtype as (name, why): 'auto' is bfloat16 where the hardware computes in it (Ampere on, not emulated;
    a CPU with AVX-512 BF16: elsewhere, ARM included, bf16 autocast is slower), float16 on older GPUs, else
    float32."""
    kind = device.split(":")[0]
    gpu_bf16 = kind == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
    if dtype == "auto":
        if gpu_bf16:
            return "bfloat16", "auto: this GPU computes in it"
        if kind == "cuda":
            return "float16", "auto: no bfloat16"
        if kind == "cpu" and torch.cpu._is_avx512_bf16_supported():
            return "bfloat16", "auto: this CPU has bfloat16 instructions"
        return "float32", f"auto: no bfloat16 {'instructions on this CPU' if kind == 'cpu' else 'on ' + kind}"
    if dtype == "bfloat16" and kind == "cuda" and not gpu_bf16:
        raise UsageError("this GPU has no bfloat16; use --dtype=float16 or float32")
    if dtype == "float16" and kind == "cpu" and master:
        print("warning: float16 on a CPU is emulated, about 20x slower than float32; bfloat16 or float32 run "
              "faster", file=sys.stderr)
    return dtype, "as asked"


def autocast(device, dtype):
    """The forward pass's context: mixed precision for bfloat16/float16, nothing at all for float32."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=getattr(torch, dtype))


def setup_cuda(device):
    """CUDA only: `device` becomes the current GPU (the one is_bf16_supported() asks); TF32 matmuls."""
    if torch.device(device).index is not None:
        torch.cuda.set_device(device)
    torch.set_float32_matmul_precision("high")


# local_rank: the rank within the node, which picks the GPU; master: rank 0, which logs and saves;
# flags: the gloo group that carries the stop flag without waiting for the GPU (None: the default group).
Dist = namedtuple("Dist", "ddp rank local_rank world_size master device flags", defaults=(None,))


def setup_distributed(device_pref):
    """Under torchrun (RANK is set) join the process group, a GPU per process: nccl; gloo on CPUs, and on a
    CUDA without NCCL (Windows)."""
    device = pick_device(device_pref)
    cuda = device.startswith("cuda")
    if "RANK" not in os.environ:
        if cuda:
            setup_cuda(device)
        return Dist(False, 0, 0, 1, True, device)
    # torchrun sets them all, as numbers; a launcher that sets some, or a RANK left in the shell, is one line.
    env = {k: os.environ.get(k, "") for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    env["LOCAL_WORLD_SIZE"] = os.environ.get("LOCAL_WORLD_SIZE", "1")
    bad = [k for k, v in env.items() if not v.isdecimal()]
    if not os.environ.get("MASTER_ADDR"):
        bad.append("MASTER_ADDR")
    if not bad and int(env["RANK"]) >= int(env["WORLD_SIZE"]):
        bad = ["WORLD_SIZE"]
    if bad:
        raise UsageError(f"RANK is set, and {' and '.join(bad)} not as torchrun sets it: start several "
                         f"processes with torchrun")
    rank = int(env["RANK"])
    local_rank = int(env["LOCAL_RANK"])
    world_size = int(env["WORLD_SIZE"])
    if device_pref == "mps":
        raise UsageError("--device=mps takes one process: torchrun's processes train on CPUs or CUDA GPUs")
    if device_pref.startswith("cuda:"):
        raise UsageError(f"--device={device_pref} under torchrun: each process takes the GPU of its "
                         f"LOCAL_RANK (--device=cuda); choose the GPUs with CUDA_VISIBLE_DEVICES")
    # Found by every process of the node, so that its first one, which prints, finds it too.
    procs = max(int(env["LOCAL_WORLD_SIZE"]), local_rank + 1)
    if cuda and procs > torch.cuda.device_count():
        raise UsageError(f"--nproc_per_node={procs} on a node of {torch.cuda.device_count()} GPU(s): each "
                         f"process needs a GPU of its own; start at most that many")
    device = f"cuda:{local_rank}" if cuda else "cpu"
    if cuda:
        setup_cuda(device)
    # Before the group: torch.distributed.nn binds group.WORLD as a default.
    importlib.import_module("torch.distributed.nn")
    # The group wraps sys.excepthook to prefix its lines with [rankN]: options' one line stays as it is.
    hook = sys.excepthook
    # Windows' torch has no NCCL: gloo all-reduces CUDA tensors too, through the host.
    nccl = cuda and torch.distributed.is_nccl_available()
    torch.distributed.init_process_group(backend="nccl" if nccl else "gloo",
                                         device_id=torch.device(device) if nccl else None)
    sys.excepthook = hook
    flags = torch.distributed.new_group(backend="gloo") if cuda else None
    return Dist(True, rank, local_rank, world_size, rank == 0, device, flags)


def teardown(dist, lock=None):
    """Let go of the out_dir's `lock`, and leave the process group after the other ranks: a gloo thread left
    to the interpreter's exit can abort a finished run. Every rank calls it at the same point."""
    if lock:
        release(lock)
    if dist.ddp and torch.distributed.is_initialized():
        torch.distributed.barrier()
        # DDP's reference cycles would keep the group.
        gc.collect()
        torch.distributed.destroy_process_group()


def any_rank(flag, dist):
    """Is `flag` true on any rank? Every rank asks at the same point of its loop."""
    if not dist.ddp:
        return flag
    t = torch.tensor([int(flag)])
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=dist.flags)
    return bool(t.item())


def mean_loss(loss_sum, steps, dist):
    """The mean of the losses summed over `steps` steps on each process: a read that waits for the device."""
    if dist.ddp:
        torch.distributed.all_reduce(loss_sum)
    return loss_sum.item() / (steps * dist.world_size)


def wrap(model, dist, compile):
    """DDP inside, the compiler outside (its backward starts each bucket's all-reduce when ready); static
    shapes. On GPUs, BatchNorm (the ViT's patch embedding) takes its statistics over every process's batch, as
    released."""
    if dist.ddp and dist.device.startswith("cuda"):
        model = DDP(torch.nn.SyncBatchNorm.convert_sync_batchnorm(model), device_ids=[dist.local_rank])
    elif dist.ddp:
        model = DDP(model)
    return torch.compile(model, dynamic=False) if compile else model


def save_checkpoint(state, paths, dist):
    """Rank 0 writes `state` to each of `paths` in turn (torch.save by options.write_whole: a failure leaves
    the old file, and the later paths are not written) while the others wait. If it cannot, every rank stops
    here: rank 0 with its OSError (one line naming the path), the others quietly."""
    error = None
    for path in paths if dist.master else ():
        try:
            write_whole(path, lambda f: torch.save(state, f), "wb")
        except OSError as e:
            error = e
            break
    if any_rank(error is not None, dist):
        raise error or SystemExit(1)

# -----------------------------------------------------------------------------
# Ctrl-C and SIGTERM, and the command that resumes a run


@contextlib.contextmanager
def stop_signals(unit, master):
    """Inside: Ctrl-C, SIGTERM and SIGHUP append their name to the yielded list, which the loop reads before
    each step (train_gpt: each micro-step) and after an evaluation, through any_rank: every rank stops at the
    same one. A second signal a second later raises KeyboardInterrupt (out now, no save), but for a torchrun
    worker's SIGTERM; two within a second are one (a torchrun worker gets the terminal's SIGINT and torchrun's
    copy). An error inside, once a signal came, is a KeyboardInterrupt, unless options' handler names it (an
    OSError, a UsageError, out of memory)."""
    signals = []
    first = []

    def handler(signum, frame):
        # Under torchrun a SIGTERM after the first stop is torchrun's, sent to the other processes once one
        # has ended: this one is ending too, and goes on to its own end.
        if first and signum == signal.SIGTERM and "LOCAL_RANK" in os.environ:
            return
        if first and time.monotonic() - first[0] >= 1.0:
            raise KeyboardInterrupt
        if first:
            return
        first.append(time.monotonic())
        signals.append(signal.Signals(signum).name)
        # A write that the signal cut into raises RuntimeError: the note is skipped then.
        with contextlib.suppress(RuntimeError, OSError):
            if master:
                print(f"{signals[0]}: stopping after this {unit}; another one, a second or more later, stops "
                      f"at once, without saving", file=sys.stderr)

    stops = stop_signals_here()
    old = {sig: signal.signal(sig, handler) for sig in stops}
    try:
        yield signals
    except BaseException as e:
        # Under torchrun the first process to end has torchrun stop the others with SIGTERM: one that ends
        # with its own code (the stop, the divergence all ranks found) or its own line (an error, another
        # process gone) ignores it from here, not to die of it first. A notebook's kernel goes on, as it was.
        if "LOCAL_RANK" in os.environ and not kernel and signal.SIGTERM in old:
            old[signal.SIGTERM] = signal.SIG_IGN
        # An error while a stop is asked is the signal's doing (the compiler's g++ got the terminal's Ctrl-C
        # too): it ends as the interrupt it is (exit 130), not as a traceback from inside torch. Not one the
        # handler names in a line of its own (a save that failed, a mistake, out of memory, another process
        # gone, whose end had torchrun send that SIGTERM).
        named = isinstance(e, (OSError, UsageError)) or out_of_memory(e) or peer_gone(e)
        if signals and isinstance(e, Exception) and not named:
            raise KeyboardInterrupt from e
        raise
    finally:
        for sig, handler_before in old.items():
            signal.signal(sig, handler_before)


def command(script, args, launcher="python"):
    """`launcher script args` quoted for a shell, the script named as it would be from where this one was
    started: beside the trainer running (python ../tost/train_gpt.py), or as it is (python -c, a test)."""
    ours = os.path.basename(sys.argv[0]) in ("train_gpt.py", "train_vit.py")
    prog = os.path.join(os.path.dirname(sys.argv[0]) if ours else "", script)
    return launcher + " " + shell_join([prog, *args])


def resume_command(script, cfg, set_keys, defaults):
    """'resume with: python train_gpt.py --init_from=resume ...': the launcher, the script as it was started,
    and the keys this run set that a checkpoint does not restore."""
    env = os.environ
    launcher = "python"
    if "WORLD_SIZE" in env and env["WORLD_SIZE"] == env.get("LOCAL_WORLD_SIZE"):
        launcher = f"torchrun --standalone --nproc_per_node={env['WORLD_SIZE']}"
    elif "WORLD_SIZE" in env:
        # Several nodes: each restarts with its own launch options.
        launcher = "torchrun (your launch options, on every node)"
    args = ["--init_from=resume"]
    for key in ("out_dir", "device", "compile"):
        if key in set_keys and cfg[key] != defaults[key]:
            args.append(f"--{key}={str(cfg[key]).lower() if key == 'compile' else cfg[key]}")
    return "resume with: " + command(script, args, launcher)

# -----------------------------------------------------------------------------
# the run log: log.jsonl, a JSON row a line, and loss.png


def start_log(out_dir, key, last):
    """Begin out_dir/log.jsonl: a fresh run's is empty (`last` None), a resumed run keeps the rows whose `key`
    is at most `last` (its checkpoint's step) and the rows without one; a torn line goes."""
    path = os.path.join(out_dir, "log.jsonl")
    keep = []
    if last is not None and os.path.isfile(path):
        # Bytes that are not UTF-8 (a damaged line) are replaced: such a line no longer parses and goes, and
        # inside a string of one that does they stay as U+FFFD. An editor's byte-order mark is not a row's.
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            for line in f:
                # (A line nested deeper than Python recurses is a RecursionError.)
                with contextlib.suppress(ValueError, AttributeError, RecursionError):
                    value = json.loads(line).get(key)
                    if not isinstance(value, (int, float)) or value <= last:
                        keep.append(line)
    # A crash or a full disk keeps the old log.
    write_whole(path, lambda f: f.writelines(keep))


def open_own(path):
    """path opened to append, as itself, never through a link: a run's folder from elsewhere could point its
    log.jsonl or .lock at ~/.bashrc. (Windows has no O_NOFOLLOW; without O_BINARY its C library would turn
    each line's CR LF into CR CR LF.)"""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    return open(os.open(path, flags, 0o644), "a", encoding="utf-8")


def refuse_link(path):
    """An OSError (ELOOP, which options.report names) where `path` is a link: a run's folder from elsewhere
    could point its log.jsonl or viz/ at any file or folder."""
    if os.path.islink(path):
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)


def own_folder(path):
    """os.makedirs(path) for a folder a run writes files of its own in, never a link to one."""
    refuse_link(path)
    os.makedirs(path, exist_ok=True)


def log_row(out_dir, row):
    path = os.path.join(out_dir, "log.jsonl")
    with naming(path), open_own(path) as f:
        f.write(json.dumps(row) + "\n")


def draw_loss(out_dir):
    """Redraw out_dir/loss.png from its log. A figure never stops a run: False, said once, if it cannot be
    drawn."""
    try:
        import plot
        run = plot.read_run(os.path.join(out_dir, "log.jsonl"))
        plot.learning_curves([run], os.path.join(out_dir, "loss.png"), title=f"{out_dir}: learning curves")
        return True
    except Exception as e:
        say(f"note: could not draw loss.png ({type(e).__name__}: {first_line(e)}); the run goes on without "
            f"it")
        return False
