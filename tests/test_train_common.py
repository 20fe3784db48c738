"""Tests for train_common.py: safe checkpoints, stopping, the lr schedule, devices, the run log.
Offline, CPU only, a few seconds: python -m pytest -q tests/test_train_common.py"""
import contextlib
import errno
import gc
import json
import math
import os
import signal
import shlex
import subprocess
import sys
import time
import types
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import options
import sample
import tost
import tost_fast
import train_common as tc
from conftest import POSIX_ONLY, REPO, ended, in_thread, one_line, python
from train_common import UsageError



# -----------------------------------------------------------------------------
# checkpoints


def test_load_missing_checkpoint(tmp_path):
    # a vision run's folder: the line names the trainer that makes one, and a command that trains into it
    with pytest.raises(UsageError, match=f"{tmp_path}/ckpt.pt.*train_vit.py"):
        tc.load_checkpoint(str(tmp_path / "ckpt.pt"), kind="vit")
    spaced = tmp_path / "my runs"
    spaced.mkdir()
    with pytest.raises(UsageError) as e:
        tc.load_checkpoint(str(spaced / "ckpt.pt"), kind="gpt")
    assert f"--out_dir={spaced}" in shlex.split(str(e.value).split("; ")[1].split(", with")[0])
    # a run has begun there (it may be under way, holding the folder): no advice to train into it
    (tmp_path / "log.jsonl").write_text("")
    with pytest.raises(UsageError, match=f"{tmp_path}/ckpt.pt") as e:
        tc.load_checkpoint(str(tmp_path / "ckpt.pt"), kind="vit")
    assert "train_vit.py" not in str(e.value)
    # a best.pt missing where no ckpt.pt is either: the ckpt.pt is not named
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError) as e:
        tc.load_checkpoint(str(empty / "best.pt"), kind="vit")
    assert "ckpt.pt" not in str(e.value)
    # options' handler names the path: no hint to train
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        tc.load_checkpoint(str(tmp_path / "file" / "ckpt.pt"), kind="gpt")


# unpickling this calls a function: the code execution weights_only exists to refuse
class Evil:
    def __reduce__(self):
        return (print, ("this ran while loading a checkpoint",))


class Plain:
    pass


# every key asked for is there, but its model_args are no trainer's
NO_KIND = dict(model={}, optimizer={}, iter_num=3, config={}, meta={}, model_args={"x": 1})
GPT = dict(NO_KIND, model_args={"vocab_size": 8})
# a GPT checkpoint no later check refuses
WHOLE = dict(GPT, model_args=dict(vocab_size=8, block_size=4, n_layer=1, n_head=1, n_embd=4))
# a list of shared references, a few hundred bytes in the file, a hundred billion characters unfolded
LAUGHS = "ha" * 50
for _ in range(30):
    LAUGHS = [LAUGHS, LAUGHS]


@pytest.mark.parametrize("thing, name", [({"model": {}, "extra": Plain()}, "Plain"),
                                         ({"model": {}, "extra": Evil()}, "print"),
                                         ([1, 2], "list"), (NO_KIND, "model_args"),
                                         # what a loader reads by key is a dict
                                         (dict(NO_KIND, model_args=5), "model_args"),
                                         (dict(NO_KIND, model=[1, 2], model_args={"vocab_size": 8}), "model"),
                                         (dict(NO_KIND, meta="x"), "meta"),
                                         # a key the trainer reads missing
                                         ({k: v for k, v in NO_KIND.items() if k != "optimizer"}
                                          | dict(model_args={"vocab_size": 8}), "optimizer"),
                                         # nanoGPT's: no meta, its best_val_loss a tensor
                                         ({k: v for k, v in GPT.items() if k != "meta"}
                                          | dict(best_val_loss=torch.tensor(1.5)), "no meta"),
                                         # a checkpoint cut short: torch.load's RuntimeError, its OSError
                                         (20, ""), (20000, ""),
                                         # a tensor on the meta device (of any size, no numbers held),
                                         # shared references unfolding beyond memory, in any key
                                         (dict(GPT, model={"w": torch.empty(10**12, device="meta")}), ""),
                                         (dict(WHOLE, model={"w": torch.empty(10**12, device="meta")}), ""),
                                         (dict(GPT, iter_num=LAUGHS), ""),
                                         (dict(GPT, meta={"tokenizer": LAUGHS}), ""),
                                         # counts and measures that are not
                                         (dict(GPT, iter_num="7"), "iter_num"),
                                         (dict(GPT, iter_num=-5), "iter_num"),
                                         (dict(GPT, tokens=1.5), "tokens"),
                                         (dict(GPT, epoch=math.nan), "epoch"),
                                         (dict(GPT, best_acc="0.5"), "best_acc"),
                                         (dict(WHOLE, since_row=-1), "since_row"),
                                         (dict(WHOLE, since_row="3"), "since_row"),
                                         (dict(WHOLE, elapsed_s=math.inf), "elapsed_s"),
                                         (dict(WHOLE, elapsed_s="1.0"), "elapsed_s"),
                                         # the optimizer's state is read by key
                                         (dict(WHOLE, optimizer=[1, 2]), "optimizer"),
                                         # a model_args its shape is not read from
                                         (GPT, "block_size")])
def test_load_refuses_what_is_not_a_checkpoint_naming_it(tmp_path, thing, name):
    path = str(tmp_path / "ckpt.pt")
    cut = isinstance(thing, int)
    torch.save({"w": torch.randn(100, 100)} if cut else thing, path)
    if cut:
        os.truncate(path, thing)
    with pytest.raises(UsageError) as e:
        tc.load_checkpoint(path, "cpu", "gpt", needs=("model", "optimizer", "iter_num", "config", "meta"))
    assert path in str(e.value) and name in str(e.value)


def test_init_from_hints_name_what_is_there(tmp_path):
    """nanoGPT's names for GPT-2 are told there are no GPT-2 weights, a run's folder named after it is not;
    for train_gpt a folder's best.pt (train_vit's) is no checkpoint to name."""
    names = {"scratch": None, "resume": None}
    for path, gpt2 in (("gpt2", True), ("gpt2-xl", True), ("gpt2-run/ckpt.pt", False)):
        with pytest.raises(UsageError) as e:
            tc.init_path(path, names, [])
        assert ("GPT-2" in str(e.value)) == gpt2
    (tmp_path / "best.pt").write_bytes(b"")
    with pytest.raises(UsageError) as e:
        tc.init_path(str(tmp_path), names, [])
    assert "best.pt" not in str(e.value)


def test_load_gpt_names_a_checkpoint_whose_weights_or_args_do_not_fit(tmp_path):
    """Weights of another width, a weight missing, an argument no GPTConfig has: each named, with the path."""
    args = dict(block_size=8, vocab_size=32, n_layer=1, n_head=2, n_embd=16)
    path = str(tmp_path / "ckpt.pt")
    narrow = tost.GPT(tost.GPTConfig(**dict(args, n_embd=8))).state_dict()
    weights = tost.GPT(tost.GPTConfig(**args)).state_dict()
    del weights["lm_head.weight"]
    # the weights are taken out of the checkpoint: no second copy while they load
    ckpt = dict(model=tost.GPT(tost.GPTConfig(**args)).state_dict())
    tc.load_weights(tost.GPT(tost.GPTConfig(**args)), ckpt, path)
    assert "model" not in ckpt
    for model, model_args, named in ((narrow, args, "transformer.wte.weight"),
                                     (weights, args, "lm_head.weight"),
                                     (weights, dict(args, n_layers=2), "n_layers")):
        torch.save(dict(model=model, model_args=model_args, meta={}), path)
        with pytest.raises(UsageError, match=f"{path}.*{named}"):
            sample.load_gpt(path, "cpu")


def test_a_model_built_for_its_shapes_runs_no_initialisation(monkeypatch):
    """check_fits' model on the meta device: every parameter and buffer a real model has, and no random fill
    run (there it fills nothing, and the meta kernels of normal_ and trunc_normal_ import torch._dynamo, which
    sample.py and eval_gpt.py need for nothing else)."""
    gpt = tost.GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32, token_shift=True,
                         softmax_layers=-1)
    vit = tost.ViTConfig(img_size=8, patch_size=4, n_embd=16, n_layer=1, n_head=2, num_classes=3)
    want = {make: [(k, t.shape) for k, t in make(c).state_dict().items()] for make, c in ((tost.GPT, gpt),
                                                                                      (tost.ViT, vit))}

    def filled(*args, **kwargs):
        raise AssertionError("a random fill ran on the meta device")
    for name in ("normal_", "uniform_"):
        monkeypatch.setattr(torch.Tensor, name, filled)
    for make, config in ((tost.GPT, gpt), (tost.ViT, vit)):
        model = tc.on_meta(make, config)
        assert [(k, t.shape) for k, t in model.state_dict().items()] == want[make]
        assert all(t.is_meta for t in (*model.parameters(), *model.buffers()))


def test_layers_claimed_by_one_tensor_under_many_names_are_refused_before_any_is_built(monkeypatch):
    """Each layer holds tensors of its own: a file naming one tensor under a key for each of 20000 layers
    would have them built on the meta device first (a minute, a gigabyte)."""
    config = tost.GPTConfig(n_layer=20000, n_head=2, n_embd=16, block_size=8, vocab_size=32)
    one = torch.zeros(1)
    monkeypatch.setattr(tc, "on_meta", lambda *args: pytest.fail("the model was built"))
    with pytest.raises(UsageError, match="ckpt.pt"):
        tc.check_fits(tost.GPT, config, {"model": {f"w{i}": one for i in range(20000)}}, "ckpt.pt")
    # a ViT's class-attention layers count too
    vit = tost.ViTConfig(img_size=8, patch_size=4, in_chans=1, num_classes=2, n_layer=1, n_head=1, n_embd=4,
                         n_cls_layer=20000)
    with pytest.raises(UsageError, match="ckpt.pt"):
        tc.check_fits(tost.ViT, vit, {"model": {f"w{i}": torch.zeros(1) for i in range(20)}}, "ckpt.pt")


def test_an_optimizer_state_grouped_otherwise_is_one_line():
    """A checkpoint whose AdamW groups its parameters otherwise (a version that decays others)."""
    model = tost.GPT(tost.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    cfg = dict(beta1=0.9, beta2=0.95, weight_decay=0.1, learning_rate=1e-3)
    state = tc.optimizer_for(model, cfg, "float32", None)[0].state_dict()
    state["param_groups"][1]["params"].append(state["param_groups"][0]["params"].pop())
    with pytest.raises(UsageError, match="optimizer state"):
        tc.optimizer_for(model, cfg, "float32", {"optimizer": state})
    # moments (or a step count) of another shape than their parameter's: AdamW's step ran past their ends
    for name, t in (("exp_avg", torch.zeros(1)), ("exp_avg_sq", torch.zeros(3, 3)), ("step", torch.zeros(2))):
        optimizer = tc.optimizer_for(model, cfg, "float32", None)[0]
        model(torch.zeros(1, 8, dtype=torch.long))[0].sum().backward()
        optimizer.step()
        state = optimizer.state_dict()
        state["state"][0] = {**state["state"][0], name: t}
        with pytest.raises(UsageError, match="optimizer state"):
            tc.optimizer_for(model, cfg, "float32", {"optimizer": state})
    tc.optimizer_for(model, cfg, "float32", {"optimizer": optimizer.state_dict()})


def test_one_run_at_a_time_in_an_out_dir(tmp_path):
    """Rank 0 holds out_dir/.lock while its run writes there: a second run into the same folder is refused,
    from another process or another thread of this one."""
    out = str(tmp_path / "out")
    lock = in_thread(lambda: tc.make_out_dir(out, [], overwrite=False, fresh=True, master=True))
    # the run's other ranks
    assert tc.make_out_dir(out, [], overwrite=False, fresh=False, master=False) is None
    # another process
    code = f"import train_common\ntrain_common.make_out_dir({out!r}, [], False, False, True)"
    held = ended(python("-c", code), 2, f"--out_dir={out}")
    # The held folder now has a checkpoint: a fresh run is still refused as one into a held folder, not
    # pointed to --init_from=resume or --overwrite=true, which the lock would refuse too.
    ckpt = os.path.join(out, "ckpt.pt")
    Path(ckpt).write_bytes(b"weights")
    for overwrite in (False, True):
        with pytest.raises(UsageError) as e:
            tc.make_out_dir(out, [ckpt], overwrite=overwrite, fresh=True, master=True)
        assert str(e.value) in held
    assert os.path.exists(ckpt)
    # the run lets go
    lock.close()
    tc.make_out_dir(out, [], overwrite=False, fresh=False, master=True).close()
    # A run of this thread that ended in an exception still holds its lock (a notebook keeps its traceback):
    # the thread's next run takes the folder again; another thread's is refused.
    kept = tc.make_out_dir(out, [], overwrite=False, fresh=False, master=True)
    with pytest.raises(UsageError):
        in_thread(lambda: tc.make_out_dir(out, [], overwrite=False, fresh=False, master=True))
    assert not kept.closed
    tc.make_out_dir(out, [], overwrite=False, fresh=False, master=True).close()
    assert kept.closed
    # a lock no run keeps any more (its traceback let go) is let go
    tc.make_out_dir(out, [], overwrite=False, fresh=False, master=True)
    gc.collect()
    in_thread(lambda: tc.make_out_dir(out, [], overwrite=False, fresh=False, master=True)).close()


@POSIX_ONLY
def test_a_link_in_the_locks_place_is_refused_not_followed(tmp_path):
    """A link in the lock's place is refused, not followed: opening it would empty the file it leads to."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "mine").write_text("mine")
    os.symlink(tmp_path / "mine", out / ".lock")
    with pytest.raises(OSError):
        tc.make_out_dir(str(out), [], overwrite=False, fresh=True, master=True)
    assert (tmp_path / "mine").read_text() == "mine"


@POSIX_ONLY
def test_a_log_row_is_not_appended_through_a_link(tmp_path):
    """A run's folder from elsewhere could link log.jsonl to ~/.bashrc: the row is refused, the file kept."""
    (tmp_path / "mine").write_text("mine")
    os.symlink(tmp_path / "mine", tmp_path / "log.jsonl")
    with pytest.raises(OSError):
        tc.log_row(str(tmp_path), {"iter": 1})
    assert (tmp_path / "mine").read_text() == "mine"


def test_make_out_dir_refuses_or_deletes(tmp_path, capsys):
    out = tmp_path / "out"
    ckpt, best = str(out / "ckpt.pt"), str(out / "best.pt")

    # one run after another: each lets go
    def make(**how):
        lock = tc.make_out_dir(str(out), [ckpt, best], **how)
        if lock:
            lock.close()

    # nothing there: made
    make(overwrite=False, fresh=True, master=True)
    assert out.is_dir()
    # a save killed with -9: not the other ranks' to remove, removed by the next run
    (out / "ckpt.pt.tmp-99999").write_bytes(b"half a save")
    make(overwrite=False, fresh=False, master=False)
    assert "ckpt.pt.tmp-99999" in os.listdir(out)
    make(overwrite=False, fresh=False, master=True)
    assert "ckpt.pt.tmp-99999" not in os.listdir(out)
    # the name a save's temporary file has is one the next run removes
    names = []
    options.write_whole(ckpt, lambda f: names.append(f.name) or f.write(b"w"), "wb")
    Path(names[0]).write_bytes(b"half a save")
    make(overwrite=False, fresh=False, master=True)
    assert not os.path.exists(names[0])
    Path(ckpt).write_bytes(b"weights")
    Path(best).write_bytes(b"weights")
    # a resume: fine
    make(overwrite=False, fresh=False, master=True)
    # a fresh run: refused, naming the checkpoint and both ways forward; with best.pt alone, not the resume
    with pytest.raises(UsageError) as e:
        make(overwrite=False, fresh=True, master=True)
    assert all(name in str(e.value) for name in (ckpt, "--init_from=resume", "--overwrite=true"))
    os.remove(ckpt)
    with pytest.raises(UsageError) as e:
        make(overwrite=False, fresh=True, master=True)
    assert best in str(e.value) and "--overwrite=true" in str(e.value) and "resume" not in str(e.value)
    # only the master deletes, every checkpoint there
    Path(ckpt).write_bytes(b"weights")
    make(overwrite=True, fresh=True, master=False)
    assert os.path.exists(best)
    make(overwrite=True, fresh=True, master=True)
    assert not os.path.exists(best) and not os.path.exists(ckpt) and best in capsys.readouterr().out
    # a folder where a checkpoint goes: refused before any work, for a resume too
    os.mkdir(best)
    for fresh in (True, False):
        with pytest.raises(UsageError, match=best):
            make(overwrite=False, fresh=fresh, master=True)


# -----------------------------------------------------------------------------
# stopping


# one process: (ddp, rank, local_rank, world_size, master, device)
SINGLE = tc.Dist(False, 0, 0, 1, True, "cpu")


def test_ctrl_c_and_sigterm_are_a_request_inside_stop_signals(monkeypatch, capsys):
    before = signal.getsignal(signal.SIGTERM)
    with tc.stop_signals("iter", master=True) as signals:
        assert not tc.any_rank(bool(signals), SINGLE)
        # would end the process without the handler
        signal.raise_signal(signal.SIGTERM)
        assert tc.any_rank(bool(signals), SINGLE) and signals == ["SIGTERM"]
        # a copy within a second: the same stop
        signal.raise_signal(signal.SIGINT)
        assert signals == ["SIGTERM"]
        clock = time.monotonic() + 1.5
        monkeypatch.setattr(tc.time, "monotonic", lambda: clock)
        # a second one, later: out now
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) == before
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # the note, once
    one_line(capsys.readouterr().err)


@pytest.mark.parametrize("torchrun, kernel", [(False, False), (True, False), (True, True)])
def test_a_torchrun_process_that_exits_from_inside_ignores_sigterm(monkeypatch, torchrun, kernel):
    """A process that ends with its own code (exit 130 after a stop, 3 after a divergence) or its own error
    (its line yet to be said): under torchrun, which sends SIGTERM to the others once one has ended, SIGTERM
    is then ignored (each ends with its own code, none dies of it), Ctrl-C is Python's again; elsewhere, and
    in a notebook's kernel, which goes on, the handlers are put back as they were."""
    if torchrun:
        monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(tc, "kernel", kernel)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    ignored = {**before, signal.SIGTERM: signal.SIG_IGN}
    for ending in (SystemExit(130), ValueError("a bug"), KeyboardInterrupt()):
        try:
            with pytest.raises(type(ending)):
                with tc.stop_signals("iter", master=True):
                    raise ending
            after = {sig: signal.getsignal(sig) for sig in before}
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)
        assert after == (ignored if torchrun and not kernel else before)


@POSIX_ONLY
def test_windows_ctrl_break_is_a_request_too(monkeypatch):
    """Windows' Ctrl-Break is SIGBREAK, which this system lacks: SIGUSR1 stands in for it."""
    monkeypatch.setattr(signal, "SIGBREAK", signal.SIGUSR1, raising=False)
    # Not handled, SIGUSR1 would end pytest itself (a handler, not SIG_IGN: an ignored signal stays ignored).
    before = signal.signal(signal.SIGUSR1, lambda *args: None)
    try:
        with tc.stop_signals("iter", master=False) as signals:
            os.kill(os.getpid(), signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert signals == ["SIGUSR1"]


@POSIX_ONLY
def test_a_signal_the_run_started_with_ignored_stays_ignored():
    """A closed terminal's SIGHUP is a request to stop (as SIGTERM, test_train_gpt.py's subprocess); nohup
    starts a run with SIGHUP ignored, so that it outlives the terminal: it goes on through one."""
    before = signal.getsignal(signal.SIGHUP)
    try:
        for start, said in ((lambda *args: None, ["SIGHUP"]), (signal.SIG_IGN, [])):
            signal.signal(signal.SIGHUP, start)
            with tc.stop_signals("iter", master=False) as signals:
                os.kill(os.getpid(), signal.SIGHUP)
            assert signals == said
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_run_in_another_thread_sets_no_signal_handlers():
    """(which Python allows in its main thread only: a ValueError after the run's whole set-up), nor does a
    script there that ends on a stop signal as on Ctrl-C (prepare_data's main)"""
    def run():
        with tc.stop_signals("iter", master=True) as signals:
            return signals
    assert in_thread(run) == []
    in_thread(options.stop_as_ctrl_c)


def test_an_error_inside_stop_signals_after_a_signal_is_the_interrupt(capsys, monkeypatch):
    """The compiler's g++ gets the terminal's Ctrl-C too and fails: that error, once a signal came, ends as
    an interrupt (test_ctrl_c_that_breaks_a_step_ends_as_an_interrupt); before one, it is itself; a save that
    fails (an OSError), a mistake or out of memory after one is itself too (its own line), and so is, under
    torchrun, a collective that another process's end cut off (whose end had torchrun send the SIGTERM)."""
    with pytest.raises(ValueError):
        with tc.stop_signals("iter", master=True):
            raise ValueError("a bug")
    monkeypatch.setenv("LOCAL_RANK", "0")
    before = signal.getsignal(signal.SIGTERM)
    for own in (OSError(28, "No space left on device", "ckpt.pt"), options.UsageError("a mistake"),
                RuntimeError("DefaultCPUAllocator: not enough memory"),
                RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:36775")):
        # (each ends a torchrun worker, which ignores SIGTERM from then on: handled again for the next)
        try:
            with pytest.raises(type(own)):
                with tc.stop_signals("iter", master=True):
                    signal.raise_signal(signal.SIGTERM)
                    raise own
        finally:
            signal.signal(signal.SIGTERM, before)


def test_a_failed_save_is_an_os_error_naming_the_checkpoint_and_keeps_the_previous_one(tmp_path):
    path = tmp_path / "ckpt.pt"
    tc.save_checkpoint({"step": 1}, [str(path)], SINGLE)
    # the rename fails: ckpt.pt is a folder
    (tmp_path / "ckpt.pt.tmp-1").mkdir()
    os.rename(path, tmp_path / "kept.pt")
    path.mkdir()
    (path / "x").write_text("x")
    # another rank writes nothing (rank 0 writes the checkpoint)
    tc.save_checkpoint({"step": 2}, [str(tmp_path / "other.pt")], tc.Dist(False, 1, 1, 2, False, "cpu"))
    with pytest.raises(OSError) as e:
        tc.save_checkpoint({"step": 2}, [str(path), str(tmp_path / "after.pt")], SINGLE)
    # no temp file left: the folder and the earlier one as they were, and no path after the one that failed
    assert e.value.filename == str(path) and os.listdir(path) == ["x"]
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "ckpt.pt.tmp-1", "kept.pt"]


@pytest.mark.parametrize("rank, local_rank, alone, says",
                         [("2", "0", False, True), ("3", "1", False, False), ("3", "1", True, True)])
def test_an_error_only_another_node_finds_is_said_there(monkeypatch, capsys, rank, local_rank, alone, says):
    """Rank 0 says what every rank finds; each other node's first process says its own (its terminal would
    otherwise show nothing); the others exit quietly, but for what a process finds alone (its own batch)."""
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert options.report(UsageError("no dataset at data/x", alone=alone)) == 2
    err = capsys.readouterr().err
    if says:
        one_line(err, "no dataset at data/x", f"rank {rank}")
    else:
        assert err == ""

def another_rank(monkeypatch, value):
    """torch.distributed.all_reduce as if a second process's tensor held `value`."""
    ops = {torch.distributed.ReduceOp.SUM: torch.add, torch.distributed.ReduceOp.MAX: torch.maximum}

    def all_reduce(t, op=torch.distributed.ReduceOp.SUM, group=None):
        t.copy_(ops[op](t, torch.full_like(t, value)))
    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)


def test_what_one_rank_finds_reaches_every_rank(monkeypatch, tmp_path):
    """A stop asked on one rank stops them all; the loss logged is the mean over every process's steps; a save
    that fails on rank 0 stops the others (which write nothing) at the same point."""
    two = tc.Dist(True, 1, 1, 2, False, "cpu")
    another_rank(monkeypatch, 1)
    assert tc.any_rank(False, two) and not tc.any_rank(False, SINGLE)
    with pytest.raises(SystemExit) as e:
        tc.save_checkpoint({"iter_num": 1}, [str(tmp_path / "ckpt.pt")], two)
    assert os.listdir(tmp_path) == [] and e.value.code == 1
    another_rank(monkeypatch, 2.0)
    # 4 and 2 summed over 3 steps on each of 2 processes
    assert tc.mean_loss(torch.tensor(4.0), 3, two) == 1.0


@pytest.mark.parametrize("rank, local_rank", [(2, 0), (3, 1)])
def test_a_process_on_the_second_node_takes_its_local_gpu_and_does_not_write(monkeypatch, two_gpus, rank,
                                                                            local_rank):
    """Two nodes of two GPUs, each full: a process of the second one takes the GPU of its local rank, and only
    rank 0 of the whole run writes (the out_dir may be shared)."""
    env = dict(RANK=rank, LOCAL_RANK=local_rank, WORLD_SIZE=4, LOCAL_WORLD_SIZE=2, MASTER_ADDR="node0",
               MASTER_PORT=29500)
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda **kw: None)
    monkeypatch.setattr(torch.distributed, "new_group", lambda **kw: None)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    dist = tc.setup_distributed("cuda")
    assert (dist.device, dist.rank, dist.master) == (f"cuda:{local_rank}", rank, False)
    assert two_gpus[0] == f"cuda:{local_rank}"


def test_a_process_group_keeps_the_one_line_handler(monkeypatch):
    """torch's init_process_group wraps sys.excepthook (each line of a traceback would begin [rank0]:): a real
    group of one process, and the handler options installed is still the one."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in dict(RANK=0, LOCAL_RANK=0, WORLD_SIZE=1, LOCAL_WORLD_SIZE=1, MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=port).items():
        monkeypatch.setenv(key, str(value))
    hook = sys.excepthook
    dist = tc.setup_distributed("cpu")
    try:
        assert sys.excepthook is hook
    finally:
        sys.excepthook = hook
        tc.teardown(dist)


def test_a_float16_resume_goes_on_at_the_loss_scale_it_saved():
    model = tost.GPT(tost.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    cfg = dict(beta1=0.9, beta2=0.95, weight_decay=0.1, learning_rate=1e-3)
    optimizer, scaler = tc.optimizer_for(model, cfg, "float16", None)
    ckpt = dict(optimizer=optimizer.state_dict(), scaler=dict(scaler.state_dict(), scale=1024.0))
    assert tc.optimizer_for(model, cfg, "float16", ckpt)[1].get_scale() == 1024.0

# -----------------------------------------------------------------------------
# schedule


def lr_at(it):
    return tc.cosine_lr(it, 6e-4, 6e-5, 10, 110)


def test_cosine_lr_shape():
    # the first step at lr/warmup, not 0; the warmup ends at the peak, and the cosine starts from it
    assert [lr_at(it) for it in (0, 4, 9, 10)] == pytest.approx([6e-5, 3e-4, 6e-4, 6e-4])
    # the cosine's midpoint, its floor, and after it
    assert [lr_at(it) for it in (60, 110, 111, 1100)] == pytest.approx([3.3e-4, 6e-5, 6e-5, 6e-5])
    assert lr_at(111) == lr_at(1100) == 6e-5
    values = [lr_at(it) for it in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    # fractional iterations (clamped at the peak, not 5.5/5), and no warmup
    fractional = [tc.cosine_lr(it, 1.0, 0.0, 5, 25) for it in (2.5, 4.5, 15.0)]
    assert fractional == pytest.approx([3.5 / 5, 1.0, 0.5])
    assert tc.cosine_lr(0, 1.0, 0.1, 0, 10) == 1.0
    # a cosine that ends where the warmup does (no cosine): the floor from there, no division by its length 0
    assert [tc.cosine_lr(it, 1.0, 0.1, 5, 5) for it in (4, 5, 6)] == [1.0, 0.1, 0.1]


def test_a_time_left_is_said_however_long():
    """The eta of --max_iters=1e17 is a million days, not timedelta's OverflowError."""
    assert tc.human(190) == '0:03:10'
    assert tc.human(1e17) == tc.human(1e300) == '1000000 days, 0:00:00'

# -----------------------------------------------------------------------------
# device and precision


def test_pick_device_refuses_missing_hardware(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert tc.pick_device() == tc.pick_device("cpu") == "cpu"
    # (an index torch.device cannot parse: digits of another script, more than it holds)
    for dev in ("gpu", "cuda", "mps", "cuda:\u0663", "cuda:" + "9" * 20):
        with pytest.raises(UsageError, match=f"'{dev}'"):
            tc.pick_device(dev)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert tc.pick_device("cuda:1") == "cuda:1" and tc.pick_device("cuda") == tc.pick_device() == "cuda"
    with pytest.raises(UsageError, match="'cuda:7'.* 2 "):
        tc.pick_device("cuda:7")
    # the GPU count is CUDA's alone
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert tc.pick_device("mps") == "mps"
    # torchrun --nproc_per_node=3 on a node of 2 GPUs: found by the first process, which prints it, too
    torchrun = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="3", LOCAL_WORLD_SIZE="3", MASTER_ADDR="localhost",
                    MASTER_PORT="29500")
    for k, v in torchrun.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(UsageError, match="--nproc_per_node=3"):
        tc.setup_distributed("cuda")
    # a Mac's GPU is one process's: asked for by name under torchrun, not silently the CPU
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda **kw: None)
    with pytest.raises(UsageError, match="mps"):
        tc.setup_distributed("mps")
    # one GPU by number is not what torchrun's processes take: each takes its own
    with pytest.raises(UsageError, match="cuda:1"):
        tc.setup_distributed("cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tc.setup_distributed("auto").device == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # a launcher that sets RANK and not all the rest, or not as numbers; a RANK past the processes
    for k, v in [("LOCAL_RANK", None), ("MASTER_ADDR", None), ("RANK", "abc"), ("WORLD_SIZE", "0"),
                 ("MASTER_PORT", "\u00b2"), ("LOCAL_WORLD_SIZE", "one")]:
        monkeypatch.delenv(k) if v is None else monkeypatch.setenv(k, v)
        with pytest.raises(UsageError, match=k):
            tc.setup_distributed("cpu")
        monkeypatch.setenv(k, torchrun[k])


def test_a_cpu_process_counts_its_share_of_the_memory(monkeypatch):
    """torchrun's processes on one CPU machine: each is refused past its share of the memory, not all."""
    whole = tc.memory_bytes("cpu")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert whole and tc.memory_bytes("cpu") == whole // 4


def test_auto_picks_the_mac_gpu_where_there_is_no_cuda(monkeypatch):
    """README: on a Mac, `auto` trains on its GPU (MPS); where CUDA is there too, CUDA comes first."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert tc.pick_device("auto") == "mps"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert tc.pick_device("auto") == "cuda"


def test_loss_sums_are_float64_except_on_mps_which_has_none():
    assert tc.sum_dtype("cpu") == tc.sum_dtype("cuda:1") == torch.float64
    assert tc.sum_dtype("mps") == tc.sum_dtype(torch.device("mps")) == torch.float32


@pytest.mark.parametrize("native", [True, False])
def test_resolve_dtype_on_a_cpu(monkeypatch, capsys, native):
    """auto: bfloat16 on a CPU that computes in it (asked of torch, mocked both ways here), float32 elsewhere;
    with the reason for the run's header. float16 on a CPU runs, with a one-line warning."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    assert tc.resolve_dtype("auto", "cpu")[0] == ("bfloat16" if native else "float32")
    assert tc.resolve_dtype("auto", "mps")[0] == "float32"
    assert tc.resolve_dtype("bfloat16", "cpu")[0] == "bfloat16"
    assert tc.resolve_dtype("float32", "cpu")[0] == "float32" and capsys.readouterr().err == ""
    assert tc.resolve_dtype("float16", "cpu")[0] == "float16"
    one_line(capsys.readouterr().err, "float16")
    # said by rank 0 only
    tc.resolve_dtype("float16", "cpu", master=False)
    assert capsys.readouterr().err == ""


def fake_gpu(monkeypatch, major, minor):
    """torch.cuda answers as on a GPU of compute capability major.minor, down to the queries torch's own
    is_bf16_supported() makes; that GPU can hold bfloat16 tensors (emulated before Ampere, as on a real
    one)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(major=major,
                                                                                                 minor=minor))
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True)
    monkeypatch.setattr(torch.version, "hip", None)


@pytest.mark.parametrize("gpu, capability, want", [("T4", (7, 5), "float16"), ("A100", (8, 0), "bfloat16")])
def test_auto_dtype_is_bfloat16_only_where_the_gpu_computes_in_it(monkeypatch, gpu, capability, want):
    """Before Ampere a GPU emulates bfloat16 (no tensor cores, several times slower) and torch's default
    is_bf16_supported() says yes anyway; auto must take float16 with loss scaling there."""
    fake_gpu(monkeypatch, *capability)
    assert torch.cuda.is_bf16_supported()                     # the trap: true on every one of them
    assert tc.resolve_dtype("auto", "cuda")[0] == want
    assert tc.resolve_dtype("float16", "cuda:0")[0] == "float16"
    if want == "float16":
        with pytest.raises(UsageError, match="bfloat16"):
            tc.resolve_dtype("bfloat16", "cuda")
    else:
        assert tc.resolve_dtype("bfloat16", "cuda:1")[0] == "bfloat16"


def test_autocast_on_cpu():
    a = torch.randn(4, 4)
    for dtype in ("float32", "bfloat16", "float16"):
        with tc.autocast("cpu", dtype):
            assert (a @ a).dtype == getattr(torch, dtype)


def test_the_gpu_asked_for_is_made_the_current_one_once(monkeypatch, two_gpus):
    """--device=cuda:1: synchronize(), the memory counters and is_bf16_supported() ask the current GPU, so
    cuda:1 must become it; TF32 on for float32 matmuls. On a CPU neither is touched."""
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert tc.setup_distributed("cuda:1").device == "cuda:1"
    assert two_gpus == ["cuda:1", "high"]
    two_gpus.clear()
    tc.setup_distributed("cuda")                              # the current GPU: it stays the current one
    assert two_gpus == ["high"]
    two_gpus.clear()
    tc.setup_distributed("cpu")
    assert two_gpus == []


@pytest.mark.slow
def test_a_compiled_step_runs_after_the_gpu_set_up():
    """setup_cuda() turns TF32 on through the one API every admitted torch reads: afterwards the legacy flags
    and the newer per-backend ones can all be read (the compiler reads some of them; after fp32_precision was
    set, a read of allow_tf32 raises), and a compiled training step runs. In a fresh process: the setting is
    global."""
    code = """
import contextlib, torch, tost, train_common as tc
torch.cuda.set_device = lambda device: None                    # no GPU here: the rest of the set-up is real
tc.setup_cuda('cuda:0')
model = tost.GPT(tost.GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64))
opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
x = torch.randint(0, 64, (2, 17))
loss = torch.compile(model)(x[:, :-1], x[:, 1:])[1]
loss.backward()
opt.step()
b = torch.backends
print(torch.get_float32_matmul_precision(), b.cuda.matmul.allow_tf32, b.cuda.matmul.fp32_precision,
      b.cudnn.allow_tf32, b.cudnn.conv.fp32_precision, bool(torch.isfinite(loss)))
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["high", "True", "tf32", "True", "tf32", "True"]


# -----------------------------------------------------------------------------
# the run log


def _lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_the_log_of_a_fresh_run_is_new_a_resumed_one_keeps_the_rows_up_to_its_checkpoint(tmp_path):
    out = str(tmp_path)
    tc.start_log(out, "iter", None)
    for i in range(1, 7):
        tc.log_row(out, {"iter": i, "kind": "train"})
    tc.log_row(out, {"note": "no counter: kept"})
    with open(tmp_path / "log.jsonl", "ab") as f:
        # bytes that are not UTF-8, and a line torn by a crash mid-write
        f.write(b'\xff\xfe garbage\n{"iter": 7, "kin')
    tc.start_log(out, "iter", 4)
    tc.log_row(out, {"iter": 5, "kind": "train"})
    kept = [{"iter": i, "kind": "train"} for i in range(1, 5)] + [{"note": "no counter: kept"}]
    assert _lines(tmp_path / "log.jsonl") == kept + [{"iter": 5, "kind": "train"}]
    # a vision run counts steps
    tc.start_log(out, "step", 3)
    assert len(_lines(tmp_path / "log.jsonl")) == 6
    # a run from scratch: a new log
    tc.start_log(out, "iter", None)
    tc.log_row(out, {"iter": 3})
    assert _lines(tmp_path / "log.jsonl") == [{"iter": 3}]
    # one an editor saved with a byte-order mark keeps its first row (and loses the mark)
    (tmp_path / "log.jsonl").write_bytes(b'\xef\xbb\xbf{"iter": 1}\n{"iter": 2}\n')
    tc.start_log(out, "iter", 2)
    assert _lines(tmp_path / "log.jsonl") == [{"iter": 1}, {"iter": 2}]


def test_a_figure_that_cannot_be_drawn_does_not_stop_the_run(tmp_path, monkeypatch, capsys):
    import plot
    out = str(tmp_path)
    tc.start_log(out, "iter", None)
    tc.log_row(out, dict(iter=1, kind='eval', train_loss=2.0, val_loss=2.1, tokens=10))
    assert tc.draw_loss(out) and os.path.isfile(tmp_path / 'loss.png')

    # a full disk, and matplotlib's error of many lines (a name its font cannot take)
    for error in (OSError(28, 'No space left on device'), TypeError('set_text(): incompatible\n  1. (self)')):
        def broken(*a, **k):
            raise error
        monkeypatch.setattr(plot, 'learning_curves', broken)
        assert not tc.draw_loss(out)
        # said once, in one line, naming the figure and why
        one_line(capsys.readouterr().out, 'loss.png', str(error).splitlines()[0])


# -----------------------------------------------------------------------------
# what a micro-step keeps for its backward


def kept_bytes(model, B, T):
    """The bytes of the distinct storages the autograd graph of one (B, T) forward keeps."""
    storages = {}

    def keep(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.zeros(B, T, dtype=torch.long)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(x, x)
    return sum(storages.values())


@pytest.mark.parametrize("attn, dropout, width, B", [("tssa", 0.0, 32, 3), ("tssa", 0.0, 128, 8),
                                                     ("softmax", 0.0, 32, 3), ("softmax", 0.1, 32, 3)])
def test_backward_bytes_predicts_a_longer_batch(attn, dropout, width, B, monkeypatch):
    """Probes of at most 256 tokens predict what a batch of 1024-token sequences keeps, within 2%: where the
    memory is linear in the tokens and where softmax's weights are kept for dropout (quadratic); where the
    batch is large enough for the CPU's fused core (8 x 1024 x 128 numbers) and the probes are not."""
    config = tost.GPTConfig(block_size=1024, vocab_size=64, n_layer=2, n_head=2, n_embd=width, attn=attn,
                            dropout=dropout)
    model = tost.GPT(config)
    got = tc.backward_bytes(model, B, 1024, torch.autocast("cpu", enabled=False))
    want = kept_bytes(model, B, 1024)
    assert got == pytest.approx(want, rel=0.02)
    # compiled, the step runs the readable lines at any size: so do the probes
    got = tc.backward_bytes(model, B, 1024, torch.autocast("cpu", enabled=False), fused=False)
    monkeypatch.setattr(tost_fast, "MIN_ELEMENTS", math.inf)
    assert got == pytest.approx(kept_bytes(model, B, 1024), rel=0.02)


def no_space(*args):
    raise OSError(28, "No space left on device")


def test_a_full_disk_names_the_log_it_could_not_write(tmp_path, monkeypatch):
    """A write to a full disk fails without a file name: the log's OSError names it (the checkpoint's:
    test_a_save_cut_short_keeps_the_previous_checkpoint)."""
    def full(name, *args, **kwargs):
        # the file is made (open_own's, a descriptor, is already), its writes fail
        if isinstance(name, int):
            os.close(name)
        else:
            Path(name).touch()
        return contextlib.nullcontext(SimpleNamespace(write=no_space, writelines=no_space))

    # the log's appends (train_common) and its rewrite on a resume (options.write_whole)
    for module in (tc, options):
        monkeypatch.setattr(module, "open", full, raising=False)
    for write in (lambda: tc.log_row(str(tmp_path), {}), lambda: tc.start_log(str(tmp_path), "iter", None)):
        with pytest.raises(OSError) as e:
            write()
        assert (e.value.errno, e.value.filename) == (28, str(tmp_path / "log.jsonl"))
    # no temp file left behind
    assert os.listdir(tmp_path) == ["log.jsonl"]


def test_the_divergence_line_names_the_options_that_can_help():
    """A lower learning rate always; weight decay only where there is some; clipping, on where it is off."""
    off = tc.diverged("training loss", float("nan"), "iter 3", "kept", dict(weight_decay=0.0, grad_clip=0.0))
    on = tc.diverged("training loss", float("nan"), "iter 3", "kept", dict(weight_decay=0.1, grad_clip=1.0))
    assert "--learning_rate" in off and "--weight_decay" not in off and "--grad_clip=1" in off
    assert "--learning_rate" in on and "--weight_decay" in on and "--grad_clip=1" not in on


def test_batchnorm_is_synced_across_gpus_only(monkeypatch):
    """Under DDP on GPUs the ViT's patch embedding takes its BatchNorm statistics over every process's batch
    (as released); on CPUs, and in one process, it keeps its own."""
    monkeypatch.setattr(tc, "DDP", lambda model, **kwargs: model)
    config = tost.ViTConfig(img_size=8, patch_size=4, num_classes=2, n_layer=1, n_head=2, n_embd=8)

    def norms(device, ddp):
        dist = tc.Dist(ddp, 0, 0, 2, True, device)
        wrapped = tc.wrap(tost.ViT(config), dist, compile=False)
        return {type(m).__name__ for m in wrapped.modules() if "BatchNorm" in type(m).__name__}

    assert norms("cuda:0", True) == {"SyncBatchNorm"}
    assert norms("cpu", True) == norms("cuda:0", False) == {"BatchNorm2d"}


@pytest.mark.parametrize("env, launcher", [({}, "python train_gpt.py"),
                                           ({"WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3"},
                                            "torchrun --standalone --nproc_per_node=3 train_gpt.py"),
                                           # several nodes: each restarts with its own launch options
                                           ({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, "torchrun (")])
def test_the_resume_command_names_the_launcher_the_run_had(monkeypatch, env, launcher):
    for key in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "argv", ["train_gpt.py"])
    cfg = dict(out_dir="o", device="cpu", compile=False)
    defaults = dict(out_dir="out", device="auto", compile=False)
    line = tc.resume_command("train_gpt.py", cfg, {"out_dir"}, defaults)
    assert line.startswith(f"resume with: {launcher}") and line.endswith(" --init_from=resume --out_dir=o")


@pytest.mark.parametrize("grad_clip, norm", [(0.0, 5.0), (1.0, 1.0)])
@pytest.mark.parametrize("scaled", [False, True])
def test_optimizer_step_clips_the_global_norm(grad_clip, norm, scaled):
    """Gradients of norm 5 over two parameter groups: grad_clip=1 scales them as one vector to norm 1; 0 keeps
    them. float16's loss scale (1024 here) is taken out of the gradients before they are clipped."""
    a = torch.nn.Parameter(torch.zeros(2))
    b = torch.nn.Parameter(torch.zeros(1))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, enabled=scaled)
    scaler.scale(3 * a[0] + 4 * b[0]).backward()
    opt = torch.optim.SGD([{"params": [a]}, {"params": [b]}], lr=0.5)
    tc.optimizer_step(opt, scaler, 1.0, grad_clip)
    assert torch.cat([a.detach(), b.detach()]).norm().item() == pytest.approx(norm)


@pytest.mark.parametrize("grad_clip", [0.0, 1.0])
def test_a_float16_step_whose_gradient_overflowed_is_skipped(grad_clip):
    """float16's GradScaler: a step whose gradient is not finite leaves the weights as they were and halves
    the loss scale, clipped or not."""
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale((p * torch.tensor([float("inf"), 1.0])).sum()).backward()
    tc.optimizer_step(opt, scaler, 0.1, grad_clip)
    assert p.detach().tolist() == [1.0, 1.0] and scaler.get_scale() == 512.0


def test_the_optimizer_is_built_for_the_device_the_model_is_on():
    """configure_optimizers is told where the weights are (fused AdamW is for some devices only)."""
    asked = []

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(2, device="meta"))

        def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
            asked.append(device_type)
            return torch.optim.SGD(self.parameters(), lr=learning_rate)

    cfg = dict(beta1=0.9, beta2=0.95, weight_decay=0.1, learning_rate=1e-3)
    tc.optimizer_for(Model(), cfg, "float32", None)
    assert asked == ["meta"]


def test_a_gpu_has_all_its_memory_not_what_is_free_now(monkeypatch):
    """memory_bytes is the GPU's own: what another process holds at the start is not taken off."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10**9, 80 * 10**9))
    assert tc.memory_bytes("cuda:0") == 80 * 10**9


def test_float32_runs_without_autocast():
    """float32 is no autocast at all (torch's CPU autocast refuses float32 with a warning)."""
    assert isinstance(tc.autocast("cpu", "float32"), contextlib.nullcontext)


def test_the_resume_command_keeps_compile_in_the_form_the_options_read(monkeypatch):
    """A run that set --compile away from its default resumes with it, spelt as the options parse it."""
    for key in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(sys, "argv", ["train_gpt.py"])
    defaults = dict(out_dir="out", device="auto", compile=True)
    cfg = dict(defaults, compile=False)
    line = tc.resume_command("train_gpt.py", cfg, {"compile"}, defaults)
    assert line.endswith(" --init_from=resume --compile=false")
    assert options.BOOLS[line.rsplit("=", 1)[1]] is False
    # a key set to its default adds nothing
    line = tc.resume_command("train_gpt.py", defaults, {"compile", "out_dir"}, defaults)
    assert line.endswith(" --init_from=resume")


def test_the_resume_command_names_the_trainer_where_it_was_started_from(monkeypatch):
    for key in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(sys, "argv", [os.path.join("..", "tost", "train_vit.py")])
    line = tc.resume_command("train_vit.py", {}, set(), {})
    assert line == f"resume with: python {os.path.join('..', 'tost', 'train_vit.py')} --init_from=resume"


def test_a_resume_at_step_0_keeps_the_log_it_had(tmp_path):
    """A run stopped in its first epoch resumes at epoch 0: its rows of epoch 0 and its config row stay."""
    out = str(tmp_path)
    tc.start_log(out, "epoch", None)
    rows = [{"kind": "config"}, {"epoch": 0, "step": 1}, {"epoch": 1, "step": 9}]
    for row in rows:
        tc.log_row(out, row)
    tc.start_log(out, "epoch", 0)
    assert _lines(tmp_path / "log.jsonl") == rows[:2]


def test_a_log_line_that_is_json_but_no_object_goes_at_a_resume(tmp_path):
    out = str(tmp_path)
    (tmp_path / "log.jsonl").write_text('{"iter": 1}\n[1, 2]\n3\n{"iter": 2}\n')
    tc.start_log(out, "iter", 1)
    assert _lines(tmp_path / "log.jsonl") == [{"iter": 1}]
    # a row whose key is no number (a log edited by hand) stays, as the row of no key does
    (tmp_path / "log.jsonl").write_text('{"iter": 1}\n{"iter": "x"}\n{"iter": 9}\n')
    tc.start_log(out, "iter", 4)
    assert _lines(tmp_path / "log.jsonl") == [{"iter": 1}, {"iter": "x"}]


def test_a_torchrun_worker_stopping_lets_a_later_sigterm_pass_and_a_second_ctrl_c_still_ends_it(monkeypatch):
    """Under torchrun, once one process has ended torchrun sends SIGTERM to the rest, which are stopping too
    (their teardown under way): that is no second stop, which would break the teardown; a second Ctrl-C
    still is. Outside torchrun a second SIGTERM is."""
    before = signal.getsignal(signal.SIGTERM)
    for torchrun in (True, False):
        if torchrun:
            monkeypatch.setenv("LOCAL_RANK", "1")
        else:
            monkeypatch.delenv("LOCAL_RANK")
        clock = [0.0]
        monkeypatch.setattr(tc.time, "monotonic", lambda: clock[0])
        # what the run saw after the second SIGTERM, if it went on
        went_on = []
        # (a torchrun worker that ends ignores SIGTERM from then on: handled again for the next)
        try:
            with pytest.raises(KeyboardInterrupt):
                with tc.stop_signals("iter", master=False) as signals:
                    signal.raise_signal(signal.SIGTERM)
                    clock[0] = 5.0
                    signal.raise_signal(signal.SIGTERM)
                    went_on.append(list(signals))
                    signal.raise_signal(signal.SIGINT)
        finally:
            signal.signal(signal.SIGTERM, before)
        assert went_on == ([["SIGTERM"]] if torchrun else [])


def test_only_rank_0_says_the_stop_was_heard(capsys):
    """Every process of a torchrun gets the terminal's Ctrl-C: one note, not one a process."""
    with tc.stop_signals("iter", master=False) as signals:
        signal.raise_signal(signal.SIGTERM)
        assert signals == ["SIGTERM"]
    assert capsys.readouterr().err == ""


def test_ddp_on_the_second_node_uses_the_local_gpu_and_compiles_static_shapes(monkeypatch):
    """Rank 3, on a second node of two GPUs, has cuda:1; the compiler is asked for static shapes."""
    got = {}
    monkeypatch.setattr(tc, "DDP", lambda model, **kwargs: got.update(kwargs) or model)
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: got.update(compile=kwargs) or model)
    dist = tc.Dist(True, 3, 1, 4, False, "cuda:1")
    tc.wrap(torch.nn.Linear(2, 2), dist, compile=True)
    assert got == {"device_ids": [1], "compile": {"dynamic": False}}


def test_a_local_rank_past_the_gpus_is_one_line_without_local_world_size(monkeypatch, two_gpus):
    """A launcher that does not set LOCAL_WORLD_SIZE: LOCAL_RANK=2 on a node of two GPUs is refused."""
    env = dict(RANK=2, LOCAL_RANK=2, WORLD_SIZE=3, MASTER_ADDR="node0", MASTER_PORT=29500)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda **kw: None)
    monkeypatch.setattr(torch.distributed, "new_group", lambda **kw: None)
    with pytest.raises(UsageError, match="nproc_per_node=3"):
        tc.setup_distributed("cuda")


def test_a_checkpoint_with_compressed_records_is_refused_before_it_is_inflated(tmp_path):
    """torch.save stores its records; a compressed one inflates up to a thousand times in torch.load."""
    torch.save({"model": {"w": torch.zeros(1000)}}, tmp_path / "stored.pt")
    stored = zipfile.ZipFile(tmp_path / "stored.pt")
    with stored, zipfile.ZipFile(tmp_path / "ckpt.pt", "w", zipfile.ZIP_DEFLATED) as out:
        for record in stored.infolist():
            out.writestr(record.filename, stored.read(record))
    assert tc.load_checkpoint(str(tmp_path / "stored.pt"))["model"]["w"].shape == (1000,)
    with pytest.raises(UsageError, match="ckpt.pt"):
        tc.load_checkpoint(str(tmp_path / "ckpt.pt"))
    # the weights' record alone, the one that inflates
    with zipfile.ZipFile(tmp_path / "stored.pt") as stored, zipfile.ZipFile(tmp_path / "one.pt", "w") as out:
        for record in stored.infolist():
            kind = zipfile.ZIP_DEFLATED if "/data/0" in record.filename else zipfile.ZIP_STORED
            out.writestr(record.filename, stored.read(record), compress_type=kind)
    with pytest.raises(UsageError, match="one.pt"):
        tc.load_checkpoint(str(tmp_path / "one.pt"))


def test_a_resumed_log_drops_a_line_nested_deeper_than_python_recurses(tmp_path):
    (tmp_path / "log.jsonl").write_text('{"iter": 1}\n' + "[" * 100000 + "]" * 100000 + "\n")
    tc.start_log(str(tmp_path), "iter", 4)
    assert _lines(tmp_path / "log.jsonl") == [{"iter": 1}]


@POSIX_ONLY
@pytest.mark.parametrize("fresh", [True, False])
def test_a_link_at_the_log_is_refused_before_a_checkpoint_is_deleted(tmp_path, fresh):
    target = tmp_path / "elsewhere.jsonl"
    target.write_text('{"iter": 1}\n')
    out = tmp_path / "out"
    out.mkdir()
    (out / "ckpt.pt").write_bytes(b"weights")
    (out / "log.jsonl").symlink_to(target)
    with pytest.raises(OSError) as e:
        tc.make_out_dir(str(out), [str(out / "ckpt.pt")], fresh, fresh, True)
    assert e.value.errno == errno.ELOOP and options.report(e.value) == 2
    assert (out / "ckpt.pt").read_bytes() == b"weights" and os.path.islink(out / "log.jsonl")
    # the folder is let go: another run may take it
    in_thread(lambda: tc.lock_out_dir(str(out))).close()


def test_on_windows_msvcrt_locks_the_folder(tmp_path, monkeypatch):
    """Windows has no fcntl: msvcrt locks the lock file's first byte, which another handle cannot take
    (EACCES), and a run's end undoes the lock before it closes the file: here, as Windows' documentation
    allows, a close alone lets go of nothing. A temp file that a killed save left goes once the folder is
    held."""
    held = set()

    def locking(fd, mode, nbytes):
        file = (os.fstat(fd).st_dev, os.fstat(fd).st_ino, nbytes)
        if mode == 0:
            held.remove(file)
        elif file in held:
            raise PermissionError(errno.EACCES, "Permission denied")
        else:
            held.add(file)
    monkeypatch.setattr(tc, "fcntl", None)
    monkeypatch.setattr(tc, "msvcrt", types.SimpleNamespace(LK_UNLCK=0, LK_NBLCK=2, locking=locking),
                        raising=False)
    out = tmp_path / "out"
    out.mkdir()
    (out / "ckpt.pt.tmp-99").write_bytes(b"half a checkpoint")
    lock = tc.make_out_dir(str(out), [], overwrite=False, fresh=True, master=True)
    assert not (out / "ckpt.pt.tmp-99").exists()
    with pytest.raises(UsageError):
        in_thread(lambda: tc.lock_out_dir(str(out)))
    tc.teardown(SINGLE, lock)
    # another run takes it, and a run of that thread after a failure (a notebook's) takes it again
    in_thread(lambda: (tc.lock_out_dir(str(out)), tc.lock_out_dir(str(out)))[1].close())


def test_a_filesystem_without_locks_leaves_the_folder_unguarded(tmp_path, monkeypatch):
    def flock(*args):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(tc.fcntl, "flock", flock)
    assert tc.make_out_dir(str(tmp_path / "out"), [], overwrite=False, fresh=True, master=True) is None


def test_a_model_needs_a_byte_of_weights_for_each_number():
    config = tost.GPTConfig(block_size=8, vocab_size=256, n_layer=1, n_head=2, n_embd=16)
    model = tost.GPT(config)
    numbers = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
    tc.check_fits(tost.GPT, config, {"model": {"w": torch.zeros(numbers, dtype=torch.uint8)}}, "ckpt.pt")
    with pytest.raises(UsageError):
        tc.check_fits(tost.GPT, config, {"model": {"w": torch.zeros(numbers - 1, dtype=torch.uint8)}}, "p.pt")


def test_each_step_starts_from_no_gradient_and_only_float16_scales_the_loss():
    model = tost.GPT(tost.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    cfg = dict(beta1=0.9, beta2=0.95, weight_decay=0.1, learning_rate=1e-3)
    scaled = [tc.optimizer_for(model, cfg, dtype, None)[1].is_enabled() for dtype in ("float16", "bfloat16")]
    assert scaled == [True, False]
    optimizer, scaler = tc.optimizer_for(model, cfg, "float32", None)
    model(torch.zeros(1, 8, dtype=torch.long))[0].sum().backward()
    tc.optimizer_step(optimizer, scaler, 1e-3, 0.0)
    assert all(p.grad is None for p in model.parameters())
