"""
What the trainers, sample.py and eval_gpt.py share: checkpoints (atomic, loaded with weights_only), the
learning-rate schedule, the device and dtype, processes under torchrun, Ctrl-C, and the run log.
"""
import contextlib
import datetime
import gc
import json
import math
import os
import re
import shlex
import signal
import sys
import threading
import time
from collections import namedtuple

import numpy as np
import torch

import tost
from options import UsageError, fail

# -----------------------------------------------------------------------------
# checkpoints and the output folder


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


def load_checkpoint(path, map_location="cpu"):
    """torch.load with weights_only=True (loading cannot run code); every failure one line naming the path."""
    if not os.path.isfile(path):
        raise UsageError(f"no checkpoint at {path}")
    with open(path, "rb") as f:
        head = f.read(4)
    if head and not head.startswith(b"PK"):
        raise UsageError(f"{path} is not a checkpoint: torch.save writes a zip archive, this file starts with {head!r}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        text, m = str(e), re.search(r"GLOBAL ([\w.]+)", str(e))
        reason = f"holds {m.group(1) if m else 'an object'}, which weights_only loading refuses" if \
            "Weights only load failed" in text else "empty or truncated file" if isinstance(e, EOFError) else \
            f"{type(e).__name__}: {text.strip().splitlines()[0][:100]}" if text.strip() else type(e).__name__
        raise UsageError(f"checkpoint {path} is corrupt or unreadable ({reason})") from None
    if not isinstance(ckpt, dict):
        raise UsageError(f"checkpoint {path} is corrupt or unreadable ({type(ckpt).__name__}, not a dict)")
    return ckpt


def load_gpt_checkpoint(path, map_location, script, needs=("model", "model_args", "meta")):
    """A train_gpt.py checkpoint, refused in one line if it is missing, a vision one, or lacks `needs`."""
    folder = os.path.dirname(path) or "."
    if os.path.isfile(folder):
        raise UsageError(f"--out_dir={folder} is a file, not a folder: give the folder train_gpt.py saved ckpt.pt in")
    if not os.path.isfile(path):
        raise UsageError(f"no checkpoint at {path}; train one with: python train_gpt.py"
                         + ("" if folder == "out" else f" --out_dir={folder}"))
    ckpt = load_checkpoint(path, map_location)
    if ckpt.get("kind") == "vit":
        raise UsageError(f"{path} is a vision checkpoint (train_vit.py), not a language model: {script} needs one "
                         f"of train_gpt.py")
    if set(needs) - set(ckpt):
        raise UsageError(f"{path} is not a train_gpt.py checkpoint (no {', '.join(sorted(set(needs) - set(ckpt)))})")
    return ckpt


def load_gpt(path, device, script):
    """The GPT of a train_gpt.py checkpoint in eval mode on `device`, and the checkpoint less its weights."""
    ckpt = load_gpt_checkpoint(path, "cpu", script)
    try:
        model = tost.GPT(tost.GPTConfig(**ckpt["model_args"]))
        model.load_state_dict(ckpt.pop("model"))
    except (TypeError, ValueError, RuntimeError) as e:
        raise UsageError(f"{path} does not hold a model this tost.py can load ({str(e).splitlines()[0]})") from None
    ckpt.pop("optimizer", None)
    return model.eval().to(device), ckpt


def make_out_dir(out_dir, checkpoints, overwrite, fresh, master):
    """Create --out_dir (on every rank: all stop on a mistake). A fresh run does not replace another's
    `checkpoints`: it refuses, naming both ways forward, or with --overwrite deletes them."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create --out_dir={out_dir} ({e.strerror}); choose a folder you can write to")
    found = [p for p in checkpoints if os.path.isfile(p)] if fresh else []
    if found and not overwrite:
        raise UsageError(f"{found[0]} holds an earlier run; go on with it: add --init_from=resume, or start "
                         f"afresh: another --out_dir, or --overwrite=true (deletes {' and '.join(found)})")
    if found and master:
        for p in found:
            os.remove(p)
        print(f"overwrite: deleted {' and '.join(found)}", flush=True)

# -----------------------------------------------------------------------------
# values: the ranges a type cannot check, the schedule, durations


def check_ranges(cfg, positive=(), nonnegative=()):
    """One line for the first key out of its range (NaN is out of every range)."""
    for keys, ok, what in ((positive, lambda v: v > 0, "positive"), (nonnegative, lambda v: v >= 0, ">= 0")):
        for key in (k for k in keys if not ok(cfg[k])):
            raise UsageError(f"--{key} must be {what}, got {cfg[key]}")


def cosine_lr(it, lr, min_lr, warmup_iters, decay_iters):
    """Linear warmup to lr over warmup_iters (lr/warmup at it=0, lr at warmup-1), then a cosine down to min_lr
    at decay_iters, min_lr after, as in nanoGPT."""
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
# device and precision


def pick_device(pref="auto"):
    """'auto' -> cuda, else mps, else cpu. An explicit choice is kept, but must exist on this machine."""
    if pref == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", pref):
        raise UsageError(f"unknown device {pref!r}; use auto, cpu, cuda, cuda:N or mps")
    if pref != "cpu" and not (torch.backends.mps if pref == "mps" else torch.cuda).is_available():
        raise UsageError(f"device {pref!r} requested but {'MPS' if pref == 'mps' else 'CUDA'} is not available here")
    return pref


def sum_dtype(device):
    """The dtype for sums of many losses: float64, except on MPS, which has none."""
    return torch.float32 if str(device).startswith("mps") else torch.float64


def cpu_has_bf16():
    """AVX-512 BF16 (AMX CPUs have it too). Elsewhere, ARM included, bf16 autocast is slower than float32."""
    return torch.cpu._is_avx512_bf16_supported()


def resolve_dtype(dtype, device, master=True):
    """--dtype as (name, why): 'auto' is bfloat16 where the hardware computes in it (a GPU from Ampere on: asked
    without emulation, which is slow on a T4 or V100; a CPU with bf16 instructions), float16 on older GPUs, else
    float32."""
    kind = device.split(":")[0]
    gpu_bf16 = kind == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
    if dtype == "auto":
        if kind == "cuda":
            return ("bfloat16", "auto: this GPU computes in it") if gpu_bf16 else ("float16", "auto: no bfloat16 here")
        return ("bfloat16", "auto: this CPU has bfloat16 instructions") if kind == "cpu" and cpu_has_bf16() else \
            ("float32", "auto")
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

# -----------------------------------------------------------------------------
# processes


# ddp: launched by torchrun; local_rank: the rank within the node, which picks the GPU; master: rank 0, which
# logs and saves
Dist = namedtuple("Dist", "ddp rank local_rank world_size master device")


def setup_distributed(device_pref):
    """Under torchrun (RANK is set) join the process group, a GPU per process; else one process."""
    if "RANK" not in os.environ:
        dist = Dist(False, 0, 0, 1, True, pick_device(device_pref))
    else:
        try:
            rank, local_rank, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        except (KeyError, ValueError) as e:
            raise UsageError(f"RANK is set but the torchrun environment is incomplete ({e}); use torchrun")
        cuda = pick_device(device_pref).startswith("cuda")
        dist = Dist(True, rank, local_rank, world, rank == 0, f"cuda:{local_rank}" if cuda else "cpu")
        import torch.distributed.nn  # noqa: F401  before the group exists: see cleanup_distributed
    cuda = dist.device.startswith("cuda")
    if cuda:
        setup_cuda(dist.device)
    if dist.ddp:                                            # gloo on a CPU (no DDP on MPS)
        torch.distributed.init_process_group(backend="nccl" if cuda else "gloo",
                                             device_id=torch.device(dist.device) if cuda else None)
    return dist


def setup_cuda(device):
    """CUDA only: `device` becomes the current GPU (the one is_bf16_supported() asks); TF32 matmuls."""
    if torch.device(device).index is not None:
        torch.cuda.set_device(device)
    torch.set_float32_matmul_precision("high")


def cleanup_distributed(dist):
    """Leave the process group while Python runs (a gloo thread left to the exit can abort a finished run),
    after the other ranks unless an exception is on its way out. DDP's cycles (gc) would keep the group."""
    if dist.ddp and torch.distributed.is_initialized():
        if sys.exc_info()[0] is None:
            torch.distributed.barrier()
        gc.collect()
        torch.distributed.destroy_process_group()


def mean_loss(loss_sum, steps, dist):
    """The loss summed over `steps` steps on each process, as their mean: a read that waits for the device."""
    if dist.ddp:
        torch.distributed.all_reduce(loss_sum)
    return loss_sum.item() / (steps * dist.world_size)


class Stop(Exception):
    """The run ends here: code 130 (the user stopped it: what was saved, how to resume) or 1-3 (`error: ...`)."""

    def __init__(self, msg, code):
        super().__init__(msg)
        self.code = code


def launch(run, cfg, *args):
    """A main under torchrun: check --out_dir, join the group, run(cfg, *args, dist), leave. A Stop is its exit
    code; a mistake every process finds is said once, by rank 0."""
    if not cfg["out_dir"].strip():
        raise UsageError("--out_dir is empty; name a folder for the checkpoints, e.g. --out_dir=out")
    if os.path.exists(cfg["out_dir"]) and not os.path.isdir(cfg["out_dir"]):
        raise UsageError(f"--out_dir={cfg['out_dir']} is a file, not a folder")
    dist = setup_distributed(cfg["device"])
    try:
        return run(cfg, *args, dist)
    except Stop as e:
        if dist.master and e.code == 130:
            print(e, file=sys.stderr, flush=True)
        elif dist.master:
            fail(e, e.code)
        sys.exit(e.code)
    except UsageError:
        if dist.master:
            raise
        sys.exit(2)
    finally:
        cleanup_distributed(dist)


class Checkpoint:
    """The run's ckpt.pt and its step (None: none yet), which every rank notes (they branch on it alike) while
    rank 0 writes; and what the run says when it stops."""

    def __init__(self, path, step, unit, dist, resume):
        self.path, self.step, self.unit, self.dist, self.resume = path, step, unit, dist, resume

    def save(self, state, step, also=()):
        if self.dist.master:
            try:
                for path in (self.path, *also):
                    atomic_save(state, path)
            except OSError as e:
                kept = f"; the previous {self.path} is intact" if os.path.isfile(self.path) else ""
                raise Stop(f"could not save {self.path} ({e.strerror or e}){kept}", 1) from None
        self.step = step

    def last_good(self):
        return "no checkpoint was saved before it" if self.step is None else \
            f"the last good checkpoint is {self.path} ({self.unit} {self.step})"

    def diverged(self, what, value, step):
        return Stop(f"the {what} is {value} at {self.unit} {step}: training diverged; stopped without saving, "
                    f"{self.last_good()}; try a lower --learning_rate or --grad_clip", 3)

    def interrupted(self, signal_name, step, where, state, finite, kept=None):
        """Ctrl-C or SIGTERM: save here unless `kept` says why not, and say how to go on. state() is what
        is saved; finite: is the loss since the last row."""
        how = f"interrupted ({signal_name}) at {where}"
        if step == self.step:
            msg = f"{how}; {self.path} is there already{self.resume}"
        elif step == 0:
            msg = f"{how}, before the first step: nothing to save"
        elif kept:
            msg = f"{how}; not saved: {kept}{self.resume}"
        elif not finite:
            msg = f"{how}; not saved: the training loss is not finite (diverged); {self.last_good()}"
        else:
            self.save(state(), step)
            msg = f"{how}: saved {self.path}{self.resume}"
        if self.dist.ddp:
            torch.distributed.barrier()             # the other ranks wait while rank 0 writes
        return Stop(msg, 130)

    def stopped(self, e, step, advice):
        """The loop's way out of a second Ctrl-C (at once, not saved) or out of memory (`advice`)."""
        if isinstance(e, KeyboardInterrupt):
            return Stop(f"interrupted at {self.unit} {step}, not saved; {self.last_good()}"
                        f"{self.resume if self.step is not None else ''}", 130)
        return Stop(f"out of memory at {self.unit} {step} {advice}", 2) if "out of memory" in str(e) else e


class GracefulStop:
    """Ctrl-C (SIGINT) and SIGTERM (a scheduler's) only set a flag, which the loop asks once a step: under
    torchrun all-reduced (over gloo, no GPU sync), so every rank stops at the same step. A second signal a
    second or more later raises KeyboardInterrupt: out now, no save. Two within a second are one (a torchrun
    worker gets the terminal's SIGINT and torchrun's forward of it)."""

    def __init__(self, dist):
        self.dist, self.signal, self._first, self._old, self._group = dist, None, None, {}, None

    def _handler(self, signum, frame):
        if self._first is None:
            self._first, self.signal = time.monotonic(), signal.Signals(signum).name
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

    def requested(self):
        if not self.dist.ddp:
            return self._first is not None
        flag = torch.tensor([int(self._first is not None)])
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self._group)
        return bool(flag.item())


def resume_command(script, cfg, set_keys, defaults):
    """'\nresume with: python train_gpt.py --init_from=resume ...', to copy: python or torchrun (one node), the
    script as it was started, and the keys a checkpoint does not restore that this run set."""
    prog = sys.argv[0] if os.path.basename(sys.argv[0]) == script else script
    ws, local = os.environ.get("WORLD_SIZE"), os.environ.get("LOCAL_WORLD_SIZE")
    launcher = "python" if ws is None else f"torchrun --standalone --nproc_per_node={ws}" if ws == local else \
        "torchrun (your options, on every node)"
    keys = [k for k in ("out_dir", "device", "dtype", "compile") if k in set_keys and cfg[k] != defaults[k]]
    args = ["--init_from=resume"] + [f"--{k}={str(cfg[k]).lower() if k == 'compile' else cfg[k]}" for k in keys]
    return "\nresume with: " + " ".join([launcher, shlex.quote(prog)] + [shlex.quote(a) for a in args])

# -----------------------------------------------------------------------------
# the run log


class RunLog:
    """<out_dir>/log.jsonl, a JSON row a line (`tail -f` it), and loss.png drawn from it; rank 0 only. A
    resumed run keeps the rows up to its checkpoint (`key` <= keep_until; the later ones come again)."""

    def __init__(self, out_dir, enabled=True, keep_until=None, key="iter"):
        self.path, self.file, self.drawn = os.path.join(out_dir, "log.jsonl"), None, True
        if enabled and keep_until is not None and os.path.isfile(self.path):
            with open(self.path) as f:
                lines = f.readlines()
            keep = [line for line in lines if _upto(line, key, keep_until)]
            if keep != lines:                                # temp file, then rename: a crash keeps the old log
                with open(self.path + ".tmp", "w") as f:
                    f.writelines(keep)
                os.replace(self.path + ".tmp", self.path)
        if enabled:
            self.file = open(self.path, "w" if keep_until is None else "a")

    def record(self, row, line=None):
        """Write a row, and print `line` if given."""
        if self.file:
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()
            if line:
                print(line, flush=True)

    def draw(self):
        """Redraw loss.png (plot.learning_curves). A figure never stops a run: a failure is said once."""
        if not (self.file and self.drawn):
            return
        try:
            import plot
            out = os.path.dirname(self.path)
            plot.learning_curves([plot.read_run(self.path)], os.path.join(out, "loss.png"),
                                 title=f"{out}: learning curves")
        except Exception as e:
            self.drawn = False
            print(f"note: could not draw loss.png ({type(e).__name__}: {e}); the run goes on without it", flush=True)

    def close(self):
        if self.file:
            self.file.close()
            self.file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _upto(line, key, last):
    """Does a log line stay on resume? Its `key` is at most `last`, or it has none; a torn line goes."""
    try:
        v = json.loads(line).get(key)
    except (ValueError, AttributeError):
        return False
    return not isinstance(v, (int, float)) or v <= last
