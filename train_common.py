"""What the trainers, sample.py and eval_gpt.py share: checkpoints (atomic, loaded with weights_only), the
learning-rate schedule, the device and dtype, processes under torchrun, Ctrl-C, and the run log."""
import contextlib
import datetime
import fcntl
import gc
import glob
import importlib
import json
import math
import os
import re
import shlex
import signal
import sys
import tempfile
import threading
import time
from collections import namedtuple

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import tost
from options import UsageError, fail

# -----------------------------------------------------------------------------
# checkpoints and the output folder
TRAINERS = {"gpt": ("train_gpt.py", "out", "language-model"), "vit": ("train_vit.py", "out-vit", "vision")}


def atomic_save(obj, path):
    """torch.save to a temp file, fsync, rename over `path`: a failure (full disk, Ctrl-C) leaves the old file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:                                   # KeyboardInterrupt included
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
    with contextlib.suppress(OSError):                      # make the rename durable (not possible everywhere)
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def load_checkpoint(path, map_location="cpu", kind=None, needs=()):
    """torch.load with weights_only=True (loading cannot run code). One line naming the path if the file is
    missing or unreadable, or, given `kind` ('gpt' or 'vit'), is another trainer's or lacks the keys `needs`."""
    script, out, name = TRAINERS.get(kind, (None, None, None))
    if not os.path.isfile(path):
        folder = os.path.dirname(path) or "."
        presets = getattr(importlib.import_module(script[:-3]), "PRESETS", {}) if kind else {}
        where = next((f" --config={n}" for n, p in presets.items() if p.get("out_dir") == folder), "" if folder == out
                     else f" --out_dir={folder}")            # out-owt-base is --config=owt-base's folder
        hint = f"; train one with: python {script}{where}" if kind and os.path.basename(path) == "ckpt.pt" else ""
        raise UsageError(f"no checkpoint at {path}{hint}")
    with open(path, "rb") as f:
        head = f.read(4)
    if head and not head.startswith(b"PK"):
        raise UsageError(f"{path} is not a checkpoint: torch.save writes a zip archive, this file starts with {head!r}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        m, text = re.search(r"GLOBAL ([\w.]+)", str(e)), (str(e).strip().splitlines() or [""])[0][:100]
        reason = f"holds {m.group(1)}, which weights_only loading refuses" if m else "empty or truncated file" if \
            isinstance(e, EOFError) else f"{type(e).__name__}: {text}"
        raise UsageError(f"checkpoint {path} is corrupt or unreadable ({reason})") from None
    if not isinstance(ckpt, dict):
        raise UsageError(f"checkpoint {path} is corrupt or unreadable ({type(ckpt).__name__}, not a dict)")
    args = ckpt.get("model_args")
    found = None if not isinstance(args, dict) else "vit" if ckpt.get("kind") == "vit" else \
        "gpt" if "vocab_size" in args else None
    if kind and found and found != kind:
        raise UsageError(f"{path} is a {TRAINERS[found][2]} checkpoint ({TRAINERS[found][0]}), not a {name} one")
    missing = sorted(set(needs) - set(ckpt)) or ([] if found else ["usable model_args"])
    if kind and missing:
        raise UsageError(f"{path} is not a {script} checkpoint (no {', '.join(missing)})")
    return ckpt


def load_weights(model, ckpt, path):
    """ckpt's weights into model, or one line."""
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise UsageError(f"{path} does not fit its own model_args ({str(e).splitlines()[0]})") from None
    return model


def load_gpt(path, device):
    """The GPT of a train_gpt.py checkpoint in eval mode on `device`, and the checkpoint less its weights."""
    ckpt = load_checkpoint(path, "cpu", "gpt", needs=("model", "model_args", "meta"))
    try:
        model = load_weights(tost.GPT(tost.GPTConfig(**ckpt["model_args"])), ckpt, path)
    except (TypeError, ValueError) as e:
        raise UsageError(f"{path} does not hold a model this tost.py can load ({str(e).splitlines()[0]})") from None
    del ckpt["model"]
    ckpt.pop("optimizer", None)
    return model.eval().to(device), ckpt


def check_out_dir(out_dir):
    """Where the value enters: --out_dir is not empty and not a file."""
    if not out_dir.strip():
        raise UsageError("--out_dir is empty; name a folder for the checkpoints, e.g. --out_dir=out")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"--out_dir={out_dir} is a file, not a folder; --out_dir names the folder of ckpt.pt")


_locks = []     # the out_dir lock rank 0 holds while its run writes there; launch() lets it go


def make_out_dir(out_dir, checkpoints, overwrite, fresh, master):
    """Create --out_dir on every rank; rank 0 locks it (one run at a time). A fresh run refuses an earlier run's
    `checkpoints` (or deletes them)."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):           # it exists; can this process write in it?
            pass
    except OSError as e:
        raise UsageError(f"cannot create --out_dir={out_dir} or write in it ({e.strerror}); choose a folder you "
                         f"can write to")
    if master:
        _locks.append(open(os.path.join(out_dir, ".lock"), "w"))
        try:
            fcntl.flock(_locks[-1], fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"another run is writing in --out_dir={out_dir}; let it finish, or choose another "
                             f"--out_dir") from None
        except OSError:                                     # a filesystem without locks: unguarded, as before
            pass
        else:                                               # the folder is this run's: a save cut short by kill -9
            for tmp in glob.glob(os.path.join(glob.escape(out_dir), "*.tmp-*")):    # left its temp file
                os.remove(tmp)
    found = [p for p in checkpoints if os.path.isfile(p)] if fresh else []
    if found and not overwrite:
        raise UsageError(f"{found[0]} holds an earlier run; go on with it: add --init_from=resume, or start "
                         f"afresh: another --out_dir, or --overwrite=true (deletes {' and '.join(found)})")
    if found and master:
        for p in found:
            os.remove(p)
        print(f"overwrite: deleted {' and '.join(found)}", flush=True)

# -----------------------------------------------------------------------------
# values, the optimizer, the schedule


def check_ranges(cfg, positive=(), nonnegative=(), fraction=()):
    """One line for the first key out of its range (NaN is out of every range)."""
    for keys, ok, what in ((positive, lambda v: v > 0, "positive"), (nonnegative, lambda v: v >= 0, ">= 0"),
                           (fraction, lambda v: 0 <= v < 1, "in [0, 1)")):
        for key in (k for k in keys if not ok(cfg[k])):
            raise UsageError(f"--{key} must be {what}, got {cfg[key]}")


def check_lr(cfg):
    """A min_lr above learning_rate would make the cosine climb. Checked on the run's values (a resume's merged)."""
    if cfg["min_lr"] > cfg["learning_rate"]:
        raise UsageError(f"--min_lr={cfg['min_lr']:g} is above --learning_rate={cfg['learning_rate']:g}: the cosine "
                         f"would climb; set --min_lr lower, e.g. --min_lr={cfg['learning_rate'] / 10:g}")


def optimizer_for(model, cfg, dtype, ckpt=None):
    """AdamW, the GradScaler (float16 only: bfloat16 has the range), the parameters; as `ckpt` left them."""
    kind = next(model.parameters()).device.type
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]),
                                           kind)
    scaler = torch.amp.GradScaler(kind, enabled=dtype == "float16")
    if ckpt:
        optimizer.load_state_dict(ckpt["optimizer"])
        if ckpt.get("scaler"):                              # a disabled scaler saves {}
            scaler.load_state_dict(ckpt["scaler"])
    return optimizer, scaler, [p for g in optimizer.param_groups for p in g["params"]]


def compiles_causal(device):
    """Whether torch.compile can build causal TSSA for `device`: before torch 2.13, inductor fails on a GPU at
    code generation for its prefix sums (a split scan)."""
    return not device.startswith("cuda") or tuple(int(v) for v in re.findall(r"\d+", torch.__version__)[:2]) >= (2, 13)


def check_compile(device):
    """--compile of causal TSSA: one line where it would fail, before any data is read or model built."""
    if not compiles_causal(device):
        raise UsageError(f"--compile: torch {torch.__version__} cannot compile causal TSSA for a GPU (an inductor bug, "
                         "fixed in torch 2.13); upgrade torch or set --compile=false")


def wrap(model, dist, compile):
    """DDP inside, the compiler outside (its backward starts each bucket's all-reduce when ready); static shapes.
    On GPUs, BatchNorm (the ViT's patch embedding) takes its statistics over every process's batch, as released."""
    if dist.ddp and dist.device.startswith("cuda"):            # SyncBatchNorm runs on GPUs only
        model = DDP(torch.nn.SyncBatchNorm.convert_sync_batchnorm(model), device_ids=[dist.local_rank])
    elif dist.ddp:
        model = DDP(model)
    return torch.compile(model, dynamic=False) if compile else model


def cosine_lr(it, lr, min_lr, warmup_iters, decay_iters):
    """Linear warmup to lr over warmup_iters (lr/warmup at it=0), then a cosine down to min_lr at decay_iters."""
    if it < warmup_iters:
        return lr * min(1.0, (it + 1) / warmup_iters)
    if it >= decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def seed_of(*numbers):
    """A seed drawn from a tuple of numbers (a run's seed, a step...): the same on any process, after any resume."""
    return int(np.random.SeedSequence(numbers).generate_state(1)[0])


def human(seconds):
    return str(datetime.timedelta(seconds=round(seconds)))          # 190 -> '0:03:10'

# -----------------------------------------------------------------------------
# device, precision and processes


def pick_device(pref="auto"):
    """'auto' -> cuda, else mps, else cpu. An explicit choice is kept, but must exist on this machine."""
    if pref == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", pref):
        raise UsageError(f"unknown device {pref!r}; use auto, cpu, cuda, cuda:N or mps")
    if pref != "cpu" and not (torch.backends.mps if pref == "mps" else torch.cuda).is_available():
        raise UsageError(f"device {pref!r} requested but {'MPS' if pref == 'mps' else 'CUDA'} is not available here")
    if pref.startswith("cuda") and (torch.device(pref).index or 0) >= torch.cuda.device_count():
        raise UsageError(f"device {pref!r} requested but this machine has {torch.cuda.device_count()} GPU(s), "
                         f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return pref


def sum_dtype(device):
    """The dtype for sums of many losses: float64, except on MPS, which has none."""
    return torch.float32 if str(device).startswith("mps") else torch.float64


def resolve_dtype(dtype, device, master=True):
    """--dtype as (name, why): 'auto' is bfloat16 where the hardware computes in it (Ampere on, not emulated; a CPU
    with AVX-512 BF16: elsewhere, ARM included, bf16 autocast is slower), float16 on older GPUs, else float32."""
    kind = device.split(":")[0]
    gpu_bf16 = kind == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
    if dtype == "auto" and kind == "cuda":
        return ("bfloat16", "auto: this GPU computes in it") if gpu_bf16 else ("float16", "auto: no bfloat16 here")
    if dtype == "auto":
        return ("bfloat16", "auto: this CPU has bfloat16 instructions") if kind == "cpu" and \
            torch.cpu._is_avx512_bf16_supported() else ("float32", "auto")
    if dtype not in ("bfloat16", "float16", "float32"):
        raise UsageError(f"unknown dtype {dtype!r}; use auto, bfloat16, float16 or float32")
    if dtype == "bfloat16" and kind == "cuda" and not gpu_bf16:
        raise UsageError("this GPU has no bfloat16; use --dtype=float16 or float32")
    if dtype == "float16" and kind == "cpu" and master:
        print("warning: float16 on a CPU is emulated, about 20x slower than float32; bfloat16 or float32 run "
              "faster", file=sys.stderr, flush=True)
    return dtype, "as asked"


def autocast(device, dtype):
    """The forward pass's context: mixed precision for bfloat16/float16, nothing at all for float32."""
    return contextlib.nullcontext() if dtype == "float32" else \
        torch.autocast(device_type=device.split(":")[0], dtype=getattr(torch, dtype))


# local_rank: the rank within the node, which picks the GPU; master: rank 0, which logs and saves
Dist = namedtuple("Dist", "ddp rank local_rank world_size master device")


def setup_distributed(device_pref):
    """Under torchrun (RANK is set) join the process group (nccl, or gloo on CPUs), a GPU per process."""
    device, ddp = pick_device(device_pref), "RANK" in os.environ
    try:
        rank, local_rank, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")) if ddp else \
            (0, 0, 1)
    except (KeyError, ValueError) as e:
        raise UsageError(f"RANK is set but the torchrun environment is incomplete ({e}); use torchrun")
    cuda = device.startswith("cuda")
    if ddp and cuda and local_rank >= torch.cuda.device_count():
        raise UsageError(f"process {local_rank} of this node has no GPU of its own: the node has "
                         f"{torch.cuda.device_count()}; start at most that many (--nproc_per_node)")
    dist = Dist(ddp, rank, local_rank, world, rank == 0, device if not ddp else f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        setup_cuda(dist.device)
    if ddp:
        importlib.import_module("torch.distributed.nn")   # before the group: it binds group.WORLD as a default
        torch.distributed.init_process_group(backend="nccl" if cuda else "gloo",
                                             device_id=torch.device(dist.device) if cuda else None)
    return dist


def setup_cuda(device):
    """CUDA only: `device` becomes the current GPU (the one is_bf16_supported() asks); TF32 matmuls."""
    if torch.device(device).index is not None:
        torch.cuda.set_device(device)
    torch.set_float32_matmul_precision("high")


def mean_loss(loss_sum, steps, dist):
    """The mean of the losses summed over `steps` steps on each process: a read that waits for the device."""
    if dist.ddp:
        torch.distributed.all_reduce(loss_sum)
    return loss_sum.item() / (steps * dist.world_size)


class Stop(Exception):
    """The run ends here: code 130 (stopped by the user: what was saved, how to resume) or 1-3 (`error: ...`)."""

    def __init__(self, msg, code):
        super().__init__(msg)
        self.code = code


def launch(run, cfg, *args):
    """run(cfg, *args, dist) in the process group. A Stop is its exit code; what every rank finds, rank 0 says."""
    check_out_dir(cfg["out_dir"])
    dist = setup_distributed(cfg["device"])
    try:
        return run(cfg, *args, dist)
    except Stop as e:
        if dist.master and e.code == 130:                  # stopped by the user: not an error
            print(e, file=sys.stderr, flush=True)
        elif dist.master:
            fail(e, e.code)
        sys.exit(e.code)
    except UsageError as e:
        if dist.master:
            raise
        if dist.local_rank == 0:    # each node's first process says it: an error only another node finds shows there
            fail(f"{e} (rank {dist.rank})")
        sys.exit(2)
    finally:                        # leave the group: a gloo thread left to the exit can abort a finished run
        if dist.ddp and torch.distributed.is_initialized():
            if sys.exc_info()[0] is None:       # after the other ranks, unless an exception is on its way out
                torch.distributed.barrier()
            gc.collect()                                # DDP's cycles would keep the group
            torch.distributed.destroy_process_group()
        while _locks:
            _locks.pop().close()

# -----------------------------------------------------------------------------
# the run: its checkpoint, Ctrl-C and SIGTERM, the command that resumes it, its log


class Run:
    """A training run's files and how it stops. `saved`: the step of out_dir/ckpt.pt (None: none yet), noted by
    every rank while rank 0 writes. log.jsonl, a JSON row a line, and loss.png, by rank 0; a resume keeps the rows
    up to its checkpoint. Inside `with`, Ctrl-C and SIGTERM set a flag the loop asks once a step (all-reduced: all
    ranks stop at the same step); a second signal a second later raises KeyboardInterrupt (out now, no save), two
    within a second are one (a torchrun worker gets the terminal's SIGINT and torchrun's forward of it)."""

    def __init__(self, out_dir, saved, unit, dist, resume, logged=None):
        self.path, self.log = os.path.join(out_dir, "ckpt.pt"), os.path.join(out_dir, "log.jsonl")
        self.saved, self.unit, self.dist, self.resume, self.drawn = saved, unit, dist, resume, True
        self.signal, self._first, self._old, self._group = None, None, {}, None
        key, last = logged or (unit, saved)             # the log keeps its rows with key <= last
        if dist.master:
            keep = []
            if last is not None and os.path.isfile(self.log):
                with open(self.log) as f:
                    keep = [line for line in f if _upto(line, key, last)]
            with open(self.log + ".tmp", "w") as f:         # temp file, then rename: a crash keeps the old log
                f.writelines(keep)
            os.replace(self.log + ".tmp", self.log)

    def record(self, row, line=None):
        if self.dist.master:
            with open(self.log, "a") as f:
                f.write(json.dumps(row) + "\n")
            if line:
                print(line, flush=True)

    def draw(self):
        """Redraw loss.png (plot.learning_curves). A figure never stops a run: a failure is said once."""
        if self.dist.master and self.drawn:
            try:
                import plot
                out = os.path.dirname(self.log)
                plot.learning_curves([plot.read_run(self.log)], os.path.join(out, "loss.png"),
                                     title=f"{out}: learning curves")
            except Exception as e:
                self.drawn = False
                print(f"note: could not draw loss.png ({type(e).__name__}: {e}); the run goes on without it",
                      flush=True)

    def _handler(self, signum, frame):
        if self._first is None:
            self._first, self.signal = time.monotonic(), signal.Signals(signum).name
            if self.dist.master:
                with contextlib.suppress(RuntimeError):     # a write the signal cut into: skip the note
                    print(f"{self.signal}: stopping after this {self.unit}; another one stops at once, without "
                          f"saving", file=sys.stderr, flush=True)
        elif time.monotonic() - self._first >= 1.0:
            raise KeyboardInterrupt

    def __enter__(self):
        if self.dist.ddp and torch.distributed.get_backend() != "gloo":    # nccl: a gloo group for the flag
            self._group = torch.distributed.new_group(backend="gloo")
        if threading.current_thread() is threading.main_thread():          # signal handlers live there
            self._old = {sig: signal.signal(sig, self._handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def anywhere(self, flag):
        """Is `flag` true on any rank? Every rank asks at the same point of the loop."""
        if not self.dist.ddp:
            return flag
        t = torch.tensor([int(flag)])
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=self._group)
        return bool(t.item())

    def requested(self):
        return self.anywhere(self._first is not None)

    def save(self, state, step, also=()):
        """Rank 0 writes while the others wait; if it cannot, every rank stops here (rank 0 says why)."""
        failed = None
        if self.dist.master:
            try:
                for path in (self.path, *also):
                    atomic_save(state, path)
            except OSError as e:
                kept = f"; the previous {self.path} is intact" if os.path.isfile(self.path) else ""
                failed = f"could not save {self.path} ({e.strerror or e}){kept}"
        if self.anywhere(failed is not None):
            raise Stop(failed or "rank 0 could not save the checkpoint", 1)
        self.saved = step

    def last_good(self):
        return "no checkpoint was saved before it" if self.saved is None else \
            f"the last good checkpoint is {self.path} ({self.unit} {self.saved})"

    def diverged(self, what, value, step):
        return Stop(f"the {what} is {value} at {self.unit} {step}: training diverged; stopped without saving, "
                    f"{self.last_good()}; try a lower --learning_rate or --grad_clip", 3)

    def interrupted(self, step, where, state, finite, kept=None):
        """Ctrl-C or SIGTERM: save here (unless saved, at step 0, kept, or not finite), say how to go on."""
        finite = not self.anywhere(not finite)      # every rank decides alike whether to save
        why = kept or (None if finite else "the training loss is not finite (diverged)")
        if step in (0, self.saved) or why:
            msg = f"; {f'not saved: {why}; ' if why and step != self.saved else ''}{self.last_good()}"
        else:
            self.save(state(), step)
            msg = f": saved {self.path}"
        resume = self.resume if self.saved is not None and finite else ""
        return Stop(f"interrupted ({self.signal or 'on another rank'}) at {where}{msg}{resume}", 130)

    def stopped(self, e, step, advice):
        """The loop's way out of a second Ctrl-C (at once, not saved) or out of memory (`advice`)."""
        if isinstance(e, KeyboardInterrupt):
            return Stop(f"interrupted at {self.unit} {step}, not saved; {self.last_good()}"
                        f"{self.resume if self.saved is not None else ''}", 130)
        return Stop(f"out of memory at {self.unit} {step} {advice}", 2) if "out of memory" in str(e) else e


def _upto(line, key, last):
    """Does a log line stay on resume? Its `key` is at most `last`, or it has none; a torn line goes."""
    try:
        v = json.loads(line).get(key)
    except (ValueError, AttributeError):
        return False
    return not isinstance(v, (int, float)) or v <= last


def resume_command(script, cfg, set_keys, defaults):
    """'\nresume with: python train_gpt.py --init_from=resume ...': the launcher, the script as it was started, and
    the keys this run set that a checkpoint does not restore."""
    prog = sys.argv[0] if os.path.basename(sys.argv[0]) == script else script
    env, nodes = os.environ, ""
    if "WORLD_SIZE" not in env:
        launcher = "python"
    elif env["WORLD_SIZE"] == env.get("LOCAL_WORLD_SIZE"):
        launcher = f"torchrun --standalone --nproc_per_node={env['WORLD_SIZE']}"
    elif "GROUP_WORLD_SIZE" not in env or "LOCAL_WORLD_SIZE" not in env:      # not torchrun: its own launcher
        launcher = "torchrun (your options, on every node)"
    else:                           # several nodes, started as docs/training.md does: this is node 0's command
        launcher = (f"torchrun --nnodes={env['GROUP_WORLD_SIZE']} --node_rank=0 --nproc_per_node="
                    f"{env['LOCAL_WORLD_SIZE']} --master_addr={env.get('MASTER_ADDR')} --master_port="
                    f"{env.get('MASTER_PORT')}")
        nodes = "\n(on node N, --node_rank=N)"
    keys = [k for k in ("out_dir", "device", "compile") if k in set_keys and cfg[k] != defaults[k]]
    args = ["--init_from=resume"] + [f"--{k}={str(cfg[k]).lower() if k == 'compile' else cfg[k]}" for k in keys]
    return "\nresume with: " + " ".join([launcher, shlex.quote(prog)] + [shlex.quote(a) for a in args]) + nodes
