"""
Plumbing shared by train_gpt.py (language) and train_vit.py (vision), so neither carries a copy.

What is here, top to bottom:
- errors: UsageError for user mistakes, fail() to print one line and exit, run_main() to wire them up;
- config: parse_overrides(), nanoGPT's `--key=value` overrides, checked against the defaults' keys
  and types, with named presets (`--config=NAME`);
- checkpoints: atomic_save() (a crash mid-save never eats the last good checkpoint), load_checkpoint()
  (torch.load with weights_only=True, and a readable error when the file is missing or broken),
  strip_compile_prefix() (drops the `_orig_mod.` / `module.` prefixes torch.compile and DDP add),
  check_out_dir() (a run from scratch never silently replaces another run's checkpoints);
- stopping: GracefulStop, Ctrl-C and SIGTERM end the run at a step boundary, the same one on every rank,
  so the trainer can save there; resume_command(), the line that tells the user how to go on;
- schedule: cosine_lr(), linear warmup then cosine decay, as in nanoGPT;
- hardware: pick_device(), resolve_dtype(), autocast(), make_grad_scaler() (torch.amp, not the
  deprecated torch.cuda.amp), setup_distributed() / cleanup_distributed() for torchrun, seed_everything();
- logging: RunLog, a JSON-lines file you can read while the run goes (`tail -f out/log.jsonl`) plus a
  live table on a terminal, or plain one-line prints when stdout is a file; human_time().

Nothing here knows about models. Everything runs on a CPU-only machine; the cuda branches are small.
"""
import ast
import contextlib
import difflib
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
from typing import Callable, NoReturn

import numpy as np
import torch
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

# -----------------------------------------------------------------------------
# errors


class UsageError(Exception):
    """A user mistake; the message is one line, shown without traceback."""


def fail(msg: str, code: int = 2) -> NoReturn:
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


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


def run_main(main: Callable[[], object]) -> None:
    """Call main(); a UsageError becomes `error: ...` and exit 2, Ctrl-C becomes exit 130, no traceback."""
    try:
        main()
    except UsageError as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail("interrupted", code=130)

# -----------------------------------------------------------------------------
# config: --key=value overrides


_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def _coerce(key: str, raw: str, default):
    """Turn the string `raw` into a value of the default's type, or raise UsageError."""
    kind = type(default)
    try:
        if default is None:  # no type to check against: a Python literal if it is one, else the string
            with contextlib.suppress(Exception):
                val = ast.literal_eval(raw)
                if isinstance(val, (bool, int, float, str, type(None))):
                    return val
            return raw
        if kind is bool:  # before int: bool is a subclass of int
            low = raw.strip().lower()
            if low in _TRUE or low in _FALSE:
                return low in _TRUE
            raise ValueError
        if kind is int:
            return int(raw)  # int("3.5") raises, as it should
        if kind is float:
            return float(raw)
        if kind is str:
            return raw
        val = ast.literal_eval(raw)  # tuples, lists: must parse to the same type
        if isinstance(val, kind):
            return val
        raise ValueError
    except (ValueError, SyntaxError, TypeError):
        expected = "bool (true/false)" if kind is bool else kind.__name__
        raise UsageError(f"--{key} expects {expected}, got {raw!r}") from None


def print_help_if_asked(argv: list[str], doc: str, defaults: dict, presets: dict | None = None) -> bool:
    """For -h/--help: print the script's docstring, its presets and every key with its default; True if printed."""
    if not {"-h", "--help"} & set(argv):
        return False
    text = doc.strip() + "\n\n"
    if presets:
        text += f"presets (--config=NAME): {', '.join(presets)}\n"
    print(text + "keys and defaults:\n" + "\n".join(f"  --{k}={v!r}" for k, v in defaults.items()))
    return True


def parse_overrides(argv: list[str], defaults: dict,
                    presets: dict[str, dict] | None = None) -> tuple[dict, set[str]]:
    """
    Apply command-line overrides to a copy of `defaults`. Returns (config, set_keys).

    Accepts `--key=value`, `--key value`, a bare `--flag` for a bool (means True), and dashes for
    underscores (`--max-iters`). `--config=NAME` applies presets[NAME] first, wherever it sits on the
    line, so `--key=value` still wins. set_keys holds the keys a preset or the user set, so a trainer
    can derive e.g. lr_decay_iters from max_iters "unless set". `config` is reserved for presets; if it
    is also a key of the defaults, the preset's name is stored there (handy in the checkpoint).
    """
    presets = presets or {}
    pairs, i = [], 0  # (key, raw string or None), in order
    while i < len(argv):
        arg, i = argv[i], i + 1
        if not arg.startswith("--") or arg == "--":
            raise UsageError(f"unexpected argument {arg!r}; options look like --key=value")
        key, eq, raw = arg[2:].partition("=")
        if not eq:  # `--key value`, or a bare `--flag`
            raw = argv[i] if i < len(argv) and not argv[i].startswith("--") else None
            i += raw is not None
        pairs.append((key.replace("-", "_"), raw))

    config, set_keys = dict(defaults), set()
    for name in [raw for key, raw in pairs if key == "config"]:  # presets first, in the order given
        if name not in presets:
            raise UsageError(f"unknown config {name!r}; presets: {', '.join(presets) or '(none)'}")
        extra = set(presets[name]) - set(defaults)
        if extra:  # a bug in the script, not the user's mistake
            raise ValueError(f"preset {name!r} sets keys not in the defaults: {sorted(extra)}")
        config.update(presets[name])
        set_keys.update(presets[name])
        if "config" in defaults:
            config["config"] = name
    for key, raw in pairs:
        if key == "config":
            continue
        if key not in defaults:
            close = difflib.get_close_matches(key, list(defaults), n=1)
            hint = f"; did you mean --{close[0]}?" if close else ""
            raise UsageError(f"unknown option --{key}; valid keys: {', '.join(defaults)}{hint}")
        if raw is None:
            if not isinstance(defaults[key], bool):
                raise UsageError(f"--{key} needs a value, e.g. --{key}={defaults[key]!r}")
            raw = "true"
        config[key] = _coerce(key, raw, defaults[key])
        set_keys.add(key)
    return config, set_keys

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
            return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        return "float32"
    if dtype not in ("bfloat16", "float16", "float32"):
        raise UsageError(f"unknown dtype {dtype!r}; use auto, bfloat16, float16 or float32")
    if dtype == "bfloat16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageError("this GPU has no bfloat16; use float16 or float32")
    return dtype


def autocast(device: str, dtype: str):
    """The forward-pass context: mixed precision for bfloat16/float16, nothing at all for float32."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=getattr(torch, dtype))


def make_grad_scaler(device: str, dtype: str):
    """Loss scaling is needed only for float16 (bfloat16 has float32's range); disabled it is a no-op."""
    return torch.amp.GradScaler(device.split(":")[0], enabled=(dtype == "float16"))


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
    otherwise one process on pick_device(device_pref). Turns on TF32 matmuls on cuda."""
    if "RANK" in os.environ:
        try:
            rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
            world_size = int(os.environ["WORLD_SIZE"])
        except (KeyError, ValueError) as e:
            raise UsageError(f"RANK is set but the torchrun environment is incomplete ({e}); use torchrun")
        if pick_device(device_pref).startswith("cuda"):  # GPU only, with the TF32 lines below: not in the tests
            device = f"cuda:{local_rank}"
            torch.cuda.set_device(device)
            torch.distributed.init_process_group(backend="nccl", device_id=torch.device(device))
        else:  # gloo: cpu only (no DDP on mps)
            device = "cpu"
            torch.distributed.init_process_group(backend="gloo")
        dist = Dist(True, rank, local_rank, world_size, rank == 0, device)
    else:
        dist = Dist(False, 0, 0, 1, True, pick_device(device_pref))
    if dist.device.startswith("cuda"):  # TF32: ~same accuracy for training, much faster matmuls on Ampere+
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
            torch.backends.cuda.matmul.fp32_precision = "tf32"
            torch.backends.cudnn.conv.fp32_precision = "tf32"
        else:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
    return dist


def cleanup_distributed(dist: Dist) -> None:
    """Leave the process group. Called from a `finally`: on a normal end every rank first waits for the others
    (rank 0 may still be writing files; a rank that tears gloo down early can abort the run). While an exception
    is on its way out there is no barrier, since the other ranks may be stuck in a collective and never come."""
    if dist.ddp and torch.distributed.is_initialized():
        if sys.exc_info()[0] is None:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()


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


def resume_command(script: str, args: dict) -> str:
    """The command that resumes this run, for the user to copy: python or torchrun (one node), `script`
    as it was started, then --key=value for `args` (init_from=resume, out_dir, and the keys the checkpoint
    does not restore)."""
    prog = sys.argv[0] if os.path.basename(sys.argv[0]) == script else script
    ws, local = os.environ.get("WORLD_SIZE"), os.environ.get("LOCAL_WORLD_SIZE")
    if ws is None:
        launcher = "python"
    elif ws == local:
        launcher = f"torchrun --standalone --nproc_per_node={ws}"
    else:
        launcher = "torchrun (your options, on every node)"
    return " ".join([launcher, shlex.quote(prog)] + [shlex.quote(f"--{k}={v}") for k, v in args.items()])


def seed_everything(seed: int, rank: int = 0) -> int:
    """Seed python, numpy and torch (all devices) with seed + rank, so ranks draw different batches."""
    seed = seed + rank
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return seed

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
        top = Table.grid(padding=(0, 2))
        bar = [ProgressBar(total=self.total, completed=count, width=40)] if self.total and head else []
        top.add_row(head + (f"/{self.total}" if self.total and head else ""), *bar, f"eta {eta or '?'}")
        table = Table(box=None, padding=(0, 2))
        for label in self._last:
            table.add_column(label, justify="right")
        table.add_row(*self._last.values())
        if self._live is None:  # no refresh thread: redraw on show() only
            self._live = Live(console=self._console, auto_refresh=False)
            self._live.start()
        self._live.update(Group(top, table), refresh=True)

    def print(self, msg: str) -> None:
        """A line of text above the live display (or plain, without a terminal)."""
        if not self.enabled:
            return
        if self._console is not None:
            self._console.print(msg, markup=False, highlight=False)  # Live owns this console when active
        else:
            print(msg, flush=True)

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
