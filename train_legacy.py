"""What train_vit.py, eval_gpt.py, sample.py and tools/study.py used before issue 38 moved the trainer's parts into
its loop: the Run class, launch() and the checks that options.parse now makes from a RANGES table. train_gpt.py
does not use it. Delete this file when the last of them stops importing it."""
import contextlib
import gc
import json
import os
import signal
import sys
import threading
import time

import torch

import train_common
from options import UsageError, fail
from train_common import atomic_save, setup_distributed

_locks = []     # the out_dir lock rank 0 holds while its run writes there; launch() lets it go


def make_out_dir(out_dir, checkpoints, overwrite, fresh, master):
    """train_common.make_out_dir, its lock kept until launch() ends."""
    try:
        lock = train_common.make_out_dir(out_dir, checkpoints, overwrite, fresh, master)
        if lock is not None:
            _locks.append(lock)
    except OSError as e:
        raise UsageError(f"cannot create --out_dir={out_dir} or write in it ({e.strerror}); choose a folder you "
                         f"can write to") from None


def check_out_dir(out_dir):
    """Where the value enters: --out_dir is not empty and not a file."""
    if not out_dir.strip():
        raise UsageError("--out_dir is empty; name a folder for the checkpoints, e.g. --out_dir=out")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"--out_dir={out_dir} is a file, not a folder; --out_dir names the folder of ckpt.pt")


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
            fail(e)
        sys.exit(2)
    finally:                        # leave the group: a gloo thread left to the exit can abort a finished run
        if dist.ddp and torch.distributed.is_initialized():
            if sys.exc_info()[0] is None:       # after the other ranks, unless an exception is on its way out
                torch.distributed.barrier()
            gc.collect()                                # DDP's cycles would keep the group
            torch.distributed.destroy_process_group()
        while _locks:
            _locks.pop().close()


class Run:
    """A training run's files and how it stops. `saved`: the step of out_dir/ckpt.pt (None: none yet), noted by
    every rank while rank 0 writes. log.jsonl, a JSON row a line, and loss.png, by rank 0; a resume keeps the rows
    up to its checkpoint. Inside `with`, Ctrl-C and SIGTERM set a flag the loop asks once a step (all-reduced: all
    ranks stop at the same step); a second signal a second later raises KeyboardInterrupt (out now, no save), two
    within a second are one (a torchrun worker gets the terminal's SIGINT and torchrun's forward of it)."""

    def __init__(self, out_dir, saved, unit, dist, resume, logged=None):
        self.path, self.log = os.path.join(out_dir, "ckpt.pt"), os.path.join(out_dir, "log.jsonl")
        self.saved, self.unit, self.dist, self.resume, self.drawn = saved, unit, dist, resume, True
        self.resume = "\n" + resume if resume else ""     # on a line of its own
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
