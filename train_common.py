"""
What the scripts that train or load models share, so that none carries a copy.

What is here, top to bottom:
- checkpoints: atomic_save() (a crash mid-save never eats the last good checkpoint), load_checkpoint()
  (torch.load with weights_only=True, and one readable line when the file is missing or broken),
  load_gpt() (the model in a train_gpt.py checkpoint, for sample.py and eval_gpt.py),
  strip_compile_prefix() (drops the `_orig_mod.` / `module.` prefixes torch.compile and DDP add),
  check_out_dir() (a run from scratch never silently replaces another run's checkpoints);
- the training step: train_step(), micro-steps with gradient accumulation, clipping and the GradScaler;
- stopping: Stop, GracefulStop (Ctrl-C and SIGTERM end the run at a step boundary, the same one on every
  rank, so the trainer can save there), resume_command() (the line that tells the user how to go on),
  launch() (a trainer's main: process group in, Stop out as an exit code);
- schedule: cosine_lr(), linear warmup then cosine decay, as in nanoGPT;
- hardware: pick_device(), resolve_dtype(), autocast(), make_grad_scaler() (torch.amp, not the
  deprecated torch.cuda.amp), setup_cuda() (the GPU asked for, TF32), setup_distributed() /
  cleanup_distributed() for torchrun, seed_everything();
- logging: RunLog, a JSON-lines file you can read while the run goes (`tail -f out/log.jsonl`) plus a
  live table on a terminal, or plain one-line prints when stdout is a file; human_time().

Everything runs on a CPU-only machine; the CUDA-only lines are few and marked.
"""
import contextlib
import gc
import json
import math
import os
import random
import re
import shlex
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import NoReturn

import numpy as np
import torch
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

import tost
from options import UsageError, fail

# -----------------------------------------------------------------------------
# checkpoints


def _fsync_dir(dirname: str) -> None:
    """Make a rename durable. Not possible everywhere (Windows cannot open a directory); then skip."""
    with contextlib.suppress(OSError):
        fd = os.open(dirname, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_save(obj, path: str) -> None:
    """torch.save to a temp file next to `path`, fsync, then rename over `path`.
    If anything fails (a full disk, Ctrl-C) the old file at `path` is untouched and the temp file is gone."""
    path = os.fspath(path)
    dirname = os.path.dirname(os.path.abspath(path))
    os.makedirs(dirname, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"  # same dir, so os.replace is a rename on one filesystem
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # KeyboardInterrupt included
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
    _fsync_dir(dirname)


def _short_reason(e: BaseException) -> str:
    text = str(e)
    if "Weights only load failed" in text:  # say what was refused, not torch's paragraph of advice
        m = re.search(r"GLOBAL ([\w.]+)", text)
        return f"holds {m.group(1) if m else 'an object'}, which weights_only loading refuses"
    first = text.strip().split("\n")[0].split(". ")[0].strip()
    reason = f"{type(e).__name__}: {first}" if first else type(e).__name__
    if isinstance(e, EOFError):
        reason = "empty or truncated file"
    return reason if len(reason) <= 120 else reason[:117] + "..."


def load_checkpoint(path: str, map_location="cpu") -> dict:
    """torch.load with weights_only=True: tensors, dicts, lists, str, int, float, bool, None only,
    so loading a checkpoint cannot run code. Every failure is a one-line UsageError naming the path."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise UsageError(f"no checkpoint at {path}")
    with open(path, 'rb') as f:
        head = f.read(4)
    if head and not head.startswith(b"PK"):  # torch.save writes a zip archive
        raise UsageError(f"{path} is not a checkpoint: torch.save writes a zip archive, this file starts with {head!r}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise UsageError(f"checkpoint {path} is corrupt or unreadable ({_short_reason(e)})") from None
    if not isinstance(ckpt, dict):
        raise UsageError(f"checkpoint {path} is corrupt or unreadable ({type(ckpt).__name__}, not a dict)")
    return ckpt


def strip_compile_prefix(state_dict) -> dict:
    """Keys saved from torch.compile(model) read `_orig_mod.x`, from DDP `module.x`; give back plain `x`.
    `_orig_mod` is dropped anywhere (a compiled submodule); `module.` only in front (a layer may be named so)."""
    out = {}
    for key, val in state_dict.items():
        new = ".".join(p for p in key.split(".") if p != "_orig_mod")
        while new.startswith("module."):
            new = new[len("module."):]
        if new in out:
            raise ValueError(f"state dict keys collide after stripping prefixes: {key!r} -> {new!r}")
        out[new] = val
    return out


def load_gpt(path: str, device: str, script: str):
    """The GPT in a train_gpt.py checkpoint, in eval mode on `device`, and the checkpoint itself (without the
    weights and optimizer). `script` names who asks, for the error when it is a vision checkpoint."""
    if not os.path.isfile(path):
        raise UsageError(f"no checkpoint at {path}; train one with: python train_gpt.py"
                         + ("" if os.path.dirname(path) == "out" else f" --out_dir={os.path.dirname(path) or '.'}"))
    ckpt = load_checkpoint(path)
    if ckpt.get("kind") == "vit":
        raise UsageError(f"{path} is a vision checkpoint (train_vit.py); {script} works with train_gpt.py checkpoints")
    if not {"model", "model_args", "meta"} <= set(ckpt):
        raise UsageError(f"{path} is not a train_gpt.py checkpoint (it needs model, model_args and meta)")
    try:
        model = tost.GPT(tost.GPTConfig(**ckpt["model_args"]))
        model.load_state_dict(strip_compile_prefix(ckpt.pop("model")))
    except (TypeError, ValueError, RuntimeError) as e:
        raise UsageError(f"{path} does not hold a model this tost.py can load ({str(e).splitlines()[0]})") from None
    ckpt.pop("optimizer", None)
    return model.eval().to(device), ckpt


def check_out_dir(paths: list[str], overwrite: bool, master: bool) -> None:
    """A run from scratch must not replace checkpoints another run made. If any of `paths` exists: refuse
    in one line naming both ways forward, or, with overwrite, delete them (master only) and say so."""
    found = [p for p in paths if os.path.isfile(p)]
    if not found:
        return
    if not overwrite:
        raise UsageError(f"{found[0]} holds an earlier run; go on with it: add --init_from=resume, or start "
                         f"afresh: another --out_dir, or --overwrite=true (deletes {' and '.join(found)})")
    if master:
        for p in found:
            os.remove(p)
        print(f"overwrite: deleted {' and '.join(found)}", flush=True)

# -----------------------------------------------------------------------------
# learning-rate schedule


def cosine_lr(it: float, lr: float, min_lr: float, warmup_iters: float, decay_iters: float) -> float:
    """Linear warmup to lr over warmup_iters (lr/warmup at it=0, lr at it=warmup-1), cosine from lr down
    to min_lr at decay_iters, min_lr after. `it` may be fractional (e.g. epochs)."""
    if it < warmup_iters:
        return lr * min(1.0, (it + 1) / warmup_iters)  # clamp: a fractional it in (w-1, w) would overshoot
    if it >= decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (decay_iters - warmup_iters)  # 0 -> 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))  # 1 -> 0
    return min_lr + coeff * (lr - min_lr)

# -----------------------------------------------------------------------------
# device, precision, processes


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps and mps.is_available())


def sum_dtype(device) -> torch.dtype:
    """The dtype for sums of many losses: float64, except on MPS, which has none."""
    return torch.float32 if str(device).startswith("mps") else torch.float64


def pick_device(pref: str = "auto") -> str:
    """'auto' -> cuda, else mps, else cpu. An explicit choice is kept, but must exist on this machine."""
    if pref == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if _mps_available() else "cpu"
    if pref == "mps" and not _mps_available():
        raise UsageError("device 'mps' requested but MPS is not available here")
    if pref in ("cpu", "mps"):
        return pref
    if not re.fullmatch(r"cuda(:\d+)?", pref):
        raise UsageError(f"unknown device {pref!r}; use auto, cpu, cuda, cuda:N or mps")
    if not torch.cuda.is_available():
        raise UsageError(f"device {pref!r} requested but CUDA is not available here")
    return pref


def resolve_dtype(dtype: str, device: str) -> str:
    """'auto' -> bfloat16 on a GPU that has it, float16 on an older GPU, float32 on cpu and mps. bfloat16 and
    float16 (with the GradScaler) also run on a CPU, which is how the tests try the GPU paths, but slowly:
    about 3x and 5x float32's time for the demo model. Returns the name, e.g. 'bfloat16'."""
    kind = device.split(":")[0]
    if dtype == "auto":
        if kind == "cuda":
            return "bfloat16" if _gpu_has_bf16() else "float16"
        return "float32"
    if dtype not in ("bfloat16", "float16", "float32"):
        raise UsageError(f"unknown dtype {dtype!r}; use auto, bfloat16, float16 or float32")
    if dtype == "bfloat16" and kind == "cuda" and not _gpu_has_bf16():
        raise UsageError("this GPU has no bfloat16; use float16 or float32")
    return dtype


def _gpu_has_bf16() -> bool:
    """CUDA only. Does the current GPU compute in bfloat16 (Ampere and newer)? Asked without emulation:
    torch's default answer is also yes on a T4 or V100, which can hold bf16 tensors but compute them without
    tensor cores, several times slower than float16."""
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # a torch without the argument: it asks the hardware only
        return torch.cuda.is_bf16_supported()


def autocast(device: str, dtype: str):
    """The forward-pass context: mixed precision for bfloat16/float16, nothing at all for float32."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=getattr(torch, dtype))


def make_grad_scaler(device: str, dtype: str):
    """Loss scaling is needed only for float16 (bfloat16 has float32's range); disabled it is a no-op."""
    return torch.amp.GradScaler(device.split(":")[0], enabled=(dtype == "float16"))


def train_step(model, batches: list, loss_of, optimizer, scaler, grad_clip: float, ctx, ddp: bool):
    """One optimizer step. batches: one callable per micro-step, giving its inputs; loss_of(model, *inputs) is
    its loss. Gradients add up over the micro-steps (each loss divided by their number); under DDP they are
    all-reduced on the last one only. Then unscale (fp16), clip the global norm (grad_clip > 0), step, zero.
    Returns the mean loss as a tensor: reading it would wait for the device, so the caller reads it rarely."""
    total = 0.0
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        with contextlib.nullcontext() if last or not ddp else model.no_sync():   # no all-reduce until the last
            with ctx:
                loss = loss_of(model, *batch()) / len(batches)    # nothing else of the forward is kept
            scaler.scale(loss).backward()
        total = total + loss.detach()
    if grad_clip > 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total


@dataclass
class Dist:
    ddp: bool  # launched by torchrun
    rank: int
    local_rank: int  # rank within this node, picks the GPU
    world_size: int
    master: bool  # rank 0: the one that logs and saves
    device: str


def setup_distributed(device_pref: str) -> Dist:
    """Under torchrun (RANK in the environment) join the process group, one GPU per process;
    otherwise one process on pick_device(device_pref). On a GPU, setup_cuda() first."""
    if "RANK" in os.environ:
        try:
            rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
            world_size = int(os.environ["WORLD_SIZE"])
        except (KeyError, ValueError) as e:
            raise UsageError(f"RANK is set but the torchrun environment is incomplete ({e}); use torchrun")
        cuda = pick_device(device_pref).startswith("cuda")
        dist = Dist(True, rank, local_rank, world_size, rank == 0, f"cuda:{local_rank}" if cuda else "cpu")
    else:
        dist = Dist(False, 0, 0, 1, True, pick_device(device_pref))
    if dist.ddp:
        import torch.distributed.nn  # noqa: F401  before the group exists: see cleanup_distributed
    if dist.device.startswith("cuda"):  # CUDA only
        setup_cuda(dist.device)
        if dist.ddp:
            torch.distributed.init_process_group(backend="nccl", device_id=torch.device(dist.device))
    elif dist.ddp:  # gloo: cpu only (no DDP on mps)
        torch.distributed.init_process_group(backend="gloo")
    return dist


def setup_cuda(device: str) -> None:
    """CUDA only, once per process. Make `device` the current GPU: synchronize(), the memory counters and
    is_bf16_supported() ask the current one, so with --device=cuda:1 they would otherwise ask GPU 0 ('cuda'
    alone means the current one). And let float32 matmuls use TF32: about the same accuracy for training, much
    faster on Ampere and newer. TF32 is set by set_float32_matmul_precision, which every torch this project
    admits reads, and which leaves both the legacy allow_tf32 flags and the newer fp32_precision readable
    (setting fp32_precision makes a later read of the legacy flags raise, and some compilers read them).
    cuDNN's convolutions use TF32 by default."""
    if torch.device(device).index is not None:
        torch.cuda.set_device(device)
    torch.set_float32_matmul_precision("high")


def cleanup_distributed(dist: Dist) -> None:
    """Leave the process group. Called from a `finally`: on a normal end every rank first waits for the others
    (rank 0 may still be writing files; a rank that tears gloo down early can abort the run). While an exception
    is on its way out there is no barrier, since the other ranks may be stuck in a collective and never come.

    Then the group itself goes, its threads joined, while Python still runs. Left running, a gloo worker may
    still be freeing the barrier's work, and with it an earlier all-reduce's tensors, when the interpreter exits;
    freeing a tensor Python knows needs Python's lock, which then ends the thread and aborts the finished run
    ('terminate called without an active exception'). Two things kept the group after destroy_process_group:
    the trainer's DDP module, in reference cycles that only the collector frees (hence gc.collect), and
    torch.distributed.nn, whose functions bind group.WORLD as a default argument when imported (DDP imports
    it); setup_distributed imports it while there is no group yet."""
    if dist.ddp and torch.distributed.is_initialized():
        if sys.exc_info()[0] is None:
            torch.distributed.barrier()
        gc.collect()
        torch.distributed.destroy_process_group()


class Stop(Exception):
    """Training cannot go on (code 1-3: one line, `error: ...`) or the user stopped it (130: the lines say
    where the run was saved and how to resume). The checkpoint on disk is kept either way."""

    def __init__(self, msg: str, code: int):
        super().__init__(msg)
        self.code = code

    def exit(self, master: bool = True) -> NoReturn:
        if master and self.code == 130:
            print(self, file=sys.stderr, flush=True)
        elif master:
            fail(str(self), self.code)
        sys.exit(self.code)


def launch(train, cfg: dict, set_keys: set):
    """A trainer's main: join the process group (under torchrun), train(cfg, set_keys, dist), leave the group.
    A Stop becomes its exit code; a mistake found by every process is said once, by rank 0."""
    if os.path.exists(cfg["out_dir"]) and not os.path.isdir(cfg["out_dir"]):
        raise UsageError(f"--out_dir={cfg['out_dir']} is a file, not a folder")
    dist = setup_distributed(cfg["device"])
    try:
        return train(cfg, set_keys, dist)
    except Stop as e:
        e.exit(dist.master)
    except UsageError:
        if dist.master:
            raise
        sys.exit(2)
    except KeyboardInterrupt:  # outside a training loop (which saves first): nothing of this run to save
        if dist.master:
            print("interrupted", file=sys.stderr, flush=True)
        sys.exit(130)
    finally:
        cleanup_distributed(dist)


class GracefulStop:
    """
    Ctrl-C (SIGINT) and SIGTERM (what a scheduler sends before it kills a job) end a run at a step boundary,
    so that the trainer can save there. Inside `with GracefulStop(dist) as stop:` a signal only sets a flag,
    and the loop asks stop.requested() once per step. Under torchrun the flag is all-reduced (a CPU tensor
    over gloo, so no GPU sync), so every rank stops at the same step even if only one got the signal.
    A second signal a second or more after the first raises KeyboardInterrupt at once: stop now, no save
    (a save under way is abandoned by atomic_save, and the previous checkpoint stays). Two copies within a
    second count as one: on Ctrl-C a torchrun worker gets the terminal's SIGINT and torchrun's forward of it.
    """

    def __init__(self, dist: Dist):
        self.dist, self.signal, self._first, self._old, self._group = dist, None, None, {}, None

    def _handler(self, signum, frame):
        if self._first is None:
            self._first, self.signal = time.monotonic(), signal.Signals(signum).name
        elif time.monotonic() - self._first >= 1.0:
            raise KeyboardInterrupt

    def __enter__(self):
        if self.dist.ddp and torch.distributed.get_backend() != "gloo":  # nccl (GPU only): a gloo group for the flag
            self._group = torch.distributed.new_group(backend="gloo")
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def requested(self) -> bool:
        """Did any rank get a signal? Call it on every rank at the same point of the loop."""
        flag = self._first is not None
        if self.dist.ddp:
            t = torch.tensor([int(flag)])
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=self._group)
            flag = bool(t.item())  # a CPU tensor: no device sync
        return flag


def resume_command(script: str, cfg: dict, set_keys: set, defaults: dict) -> str:
    """'resume with: python train_gpt.py --init_from=resume ...', for the user to copy: python or torchrun
    (one node), the script as it was started, and the keys a checkpoint does not restore that this run set."""
    prog = sys.argv[0] if os.path.basename(sys.argv[0]) == script else script
    ws, local = os.environ.get("WORLD_SIZE"), os.environ.get("LOCAL_WORLD_SIZE")
    if ws is None:
        launcher = "python"
    elif ws == local:
        launcher = f"torchrun --standalone --nproc_per_node={ws}"
    else:
        launcher = "torchrun (your options, on every node)"
    keys = [k for k in ("out_dir", "device", "dtype", "compile") if k in set_keys and cfg[k] != defaults[k]]
    args = [f"--{k}={v}" for k, v in {"init_from": "resume", **{k: cfg[k] for k in keys}}.items()]
    return "resume with: " + " ".join([launcher, shlex.quote(prog)] + [shlex.quote(a) for a in args])


def seed_everything(seed: int, rank: int = 0) -> int:
    """Seed python, numpy and torch (all devices) with seed + rank, so ranks draw different batches."""
    seed = seed + rank
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return seed

def run_sections(args, sections: dict, results: dict, console, figures: dict) -> dict:
    """bench.py's and study.py's main: run the sections named in args.sections (comma-separated) in order,
    each adding its numbers to `results`, then write them to args.json (if given) through a temp file, and
    beside it the figures of the sections that ran: figures = {section: (file name, draw(results, path))}."""
    names = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in names if s not in sections]
    if unknown or not names:
        raise UsageError(f"unknown section(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(sections)}")
    t0 = time.time()
    for name in names:
        sections[name](args, results)
    results["seconds"] = round(time.time() - t0, 1)
    console.print(f"done in {results['seconds']:.0f} s")
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
        for name in names:
            if name in figures:
                path = os.path.join(os.path.dirname(os.path.abspath(args.json)), figures[name][0])
                try:
                    figures[name][1](results, path)
                    console.print(f"wrote {path}")
                except Exception as e:                   # the numbers are saved: a figure is not worth an error
                    console.print(f"note: could not draw {path} ({type(e).__name__}: {e})", style="yellow")
    return results

# -----------------------------------------------------------------------------
# logging


def human_time(seconds) -> str:
    """45 -> '45s', 190 -> '3m10s', 3725 -> '1h02m'; '?' when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    h, m = divmod(s // 60, 60)
    return f"{h}h{m:02d}m"


def _fmt(key: str, v) -> tuple[str, str, bool]:
    """(label, value text, unit_after): 'tok_per_s' -> ('tok/s', '1234', True) reads '1234 tok/s'."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return key, str(v), False
    if key.endswith("_per_s"):
        return key[:-len("_per_s")] + "/s", f"{v:.0f}", True
    if key.startswith("ms_per_"):
        return "ms/" + key[len("ms_per_"):], f"{v:.1f}", True
    if key == "mfu":  # a fraction of peak FLOPs, as nanoGPT's estimate_mfu returns
        return key, f"{100 * v:.1f}%", False
    if isinstance(v, int):
        return key, str(v), False
    if key == "lr" or key.endswith("_lr"):
        return key, f"{v:.1e}", False
    if "loss" in key:
        return key, f"{v:.4f}", False
    return key, f"{v:.4g}", False


def _keep_row(line: str, unit: str, last: float) -> bool:
    """Keep a log line on resume: its `unit` is at most `last` (or it has none). A torn line goes."""
    try:
        v = json.loads(line).get(unit)
    except (ValueError, AttributeError):
        return False
    return not isinstance(v, (int, float)) or v <= last


class RunLog:
    """
    What a run is doing, for people and for scripts. record() appends one JSON line to
    <out_dir>/<filename> (flushed, so `tail -f` works); show() prints progress: a live table with a
    progress bar and ETA on a terminal, or a line like
        iter 100: loss 2.3412, lr 6.0e-04, 1234 tok/s, 52.1 ms/iter, mfu 1.2%, eta 3m10s
    when stdout is a file. Keys: `unit` ('iter') is the counter; `*_per_s` are rates, `ms_per_*` times,
    `mfu` a fraction. On non-master ranks (enabled=False) every method does nothing.
    fresh=False appends (a resumed run); resume_from=N then first drops the rows whose `unit` is past N,
    which the resumed run is about to write again.
    """

    def __init__(self, out_dir: str, enabled: bool = True, total: float | None = None, unit: str = "iter",
                 filename: str = "log.jsonl", fresh: bool = True, tty: bool | None = None,
                 resume_from: float | None = None):
        self.enabled, self.total, self.unit = enabled, total, unit
        self._file = self._live = self._console = None
        self._start = None  # (time, counter) at the first show(), for the ETA
        self._last = {}  # the live table keeps every column it has seen (val loss stays visible)
        self._drawn = True  # False once a figure could not be drawn: it is said once, then left
        if not enabled:
            return
        os.makedirs(out_dir, exist_ok=True)
        self.path = os.path.join(out_dir, filename)
        if not fresh and resume_from is not None and os.path.isfile(self.path):
            with open(self.path) as f:
                rows = f.readlines()
            keep = [r for r in rows if _keep_row(r, unit, resume_from)]
            if len(keep) < len(rows):  # temp file, then rename: a crash here keeps the old log
                with open(self.path + ".tmp", "w") as f:
                    f.writelines(keep)
                os.replace(self.path + ".tmp", self.path)
        self._file = open(self.path, "w" if fresh else "a")  # resume: append to the old log
        if (sys.stdout.isatty() if tty is None else tty):
            self._console = Console()

    def record(self, row: dict) -> None:
        if not self.enabled:
            return
        plain = (int, float, str, bool, type(None))
        for k, v in row.items():
            if not (isinstance(v, plain) or isinstance(v, list) and all(isinstance(e, plain) for e in v)):
                raise TypeError(f"RunLog.record: {k} is a {type(v).__name__}; pass plain numbers (.item()) "
                                "or lists of them")
        # NaN/inf are not JSON: write null, so strict readers (jq, a browser) still parse a diverged run
        finite = lambda v: None if isinstance(v, float) and not math.isfinite(v) else v
        row = {k: [finite(e) for e in v] if isinstance(v, list) else finite(v) for k, v in row.items()}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def _eta(self, count) -> str | None:
        if self.total is None or count is None:
            return None
        now = time.time()
        if self._start is None:
            self._start = (now, count)
        t0, c0 = self._start
        return human_time((self.total - count) * (now - t0) / (count - c0)) if count > c0 else None

    def show(self, row: dict) -> None:
        if not self.enabled:
            return
        count, eta = row.get(self.unit), self._eta(row.get(self.unit))
        items = [_fmt(k, v) for k, v in row.items() if k != self.unit]
        head = "" if count is None else f"{self.unit} {_fmt(self.unit, count)[1]}"
        if self._console is None:  # not a terminal: one plain line, easy to grep
            parts = [f"{t} {label}" if after else f"{label} {t}" for label, t, after in items]
            line = ", ".join(parts + ([f"eta {eta}"] if eta else []))
            print(f"{head}: {line}" if head else line, flush=True)
            return
        self._last.update({label: t for label, t, _ in items})
        if self._live is None:  # no refresh thread: redraw on show() only
            self._live = Live(console=self._console, auto_refresh=False)
            self._live.start()
        self._live.update(self._frame(head, count, eta), refresh=True)

    def _frame(self, head, count, eta):
        """The live display: a progress bar, then every column seen so far; within 80 columns."""
        top = Table.grid(padding=(0, 2))
        bar = [ProgressBar(total=self.total, completed=count, width=30)] if self.total and head else []
        top.add_row(head + (f"/{self.total}" if self.total and head else ""), *bar, f"eta {eta or '?'}")
        table = Table(box=None, padding=(0, 1), pad_edge=False)
        for label in self._last:
            table.add_column(label, justify="right")
        table.add_row(*self._last.values())
        return Group(top, table)

    def print(self, msg: str) -> None:
        """A line of text above the live display (or plain, without a terminal)."""
        if not self.enabled:
            return
        if self._console is not None:
            self._console.print(msg, markup=False, highlight=False)  # Live owns this console when active
        else:
            print(msg, flush=True)

    def draw(self, filename: str = "loss.png") -> None:
        """Redraw <out_dir>/loss.png from this log (plot.learning_curves). A figure never stops a run: if it
        cannot be drawn (matplotlib missing, a full disk), that is said once and the run goes on."""
        if not self.enabled or not self._drawn:
            return
        try:
            import plot
            plot.learning_curves([plot.read_run(self.path)], os.path.join(os.path.dirname(self.path), filename),
                                 title=f"{os.path.dirname(self.path)}: learning curves")
        except Exception as e:
            self._drawn = False
            self.print(f"note: could not draw {filename} ({type(e).__name__}: {e}); the run goes on without it")

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
