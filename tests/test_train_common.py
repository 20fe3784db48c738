"""Tests for train_common.py: safe checkpoints, stopping, the lr schedule, devices, the run log.
Offline, CPU only, a few seconds: python -m pytest -q test_train_common.py"""
import contextlib
import io
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import train_common as tc
from train_common import UsageError

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -----------------------------------------------------------------------------
# checkpoints


def _no_temp_files(d):
    return [f for f in os.listdir(d) if ".tmp-" in f] == []


def test_atomic_save_roundtrip(tmp_path):
    path = str(tmp_path / "sub" / "ckpt.pt")  # the directory is made on demand
    obj = {"model": {"w": torch.arange(6.0).view(2, 3)}, "iter_num": 7, "config": {"lr": 1e-3, "x": None}}
    tc.atomic_save(obj, path)
    got = tc.load_checkpoint(path)
    assert torch.equal(got["model"]["w"], obj["model"]["w"])
    assert got["iter_num"] == 7 and got["config"] == {"lr": 1e-3, "x": None}
    assert _no_temp_files(tmp_path / "sub")


@pytest.mark.parametrize("exc", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_atomic_save_failure_keeps_the_old_checkpoint(tmp_path, monkeypatch, exc):
    path = str(tmp_path / "ckpt.pt")
    tc.atomic_save({"iter_num": 1, "w": torch.ones(3)}, path)
    before = Path(path).read_bytes()

    def broken_save(obj, f, *a, **k):
        f.write(b"PK\x03\x04 half a checkpoint")  # some bytes reach the disk, then the failure
        raise exc

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(type(exc)):
        tc.atomic_save({"iter_num": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert Path(path).read_bytes() == before
    got = tc.load_checkpoint(path)
    assert got["iter_num"] == 1 and torch.equal(got["w"], torch.ones(3))
    assert _no_temp_files(tmp_path)


def test_load_missing_checkpoint(tmp_path):
    path = str(tmp_path / "nope.pt")
    with pytest.raises(UsageError, match=f"^no checkpoint at {path}$"):
        tc.load_checkpoint(path)


@pytest.mark.parametrize("cut", [0, 20, 0.5])
def test_load_truncated_checkpoint(tmp_path, cut):
    path = str(tmp_path / "ckpt.pt")
    tc.atomic_save({"w": torch.randn(100, 100)}, path)
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[:int(len(data) * cut) if isinstance(cut, float) else cut])
    with pytest.raises(UsageError) as e:
        tc.load_checkpoint(path)
    msg = str(e.value)
    assert msg.startswith(f"checkpoint {path} is corrupt or unreadable (") and msg.endswith(")")
    assert "\n" not in msg and len(msg) < 250


class Evil:  # unpickling this calls a function: the code execution weights_only exists to refuse
    def __reduce__(self):
        return (print, ("this ran while loading a checkpoint",))


class Plain:
    pass


@pytest.mark.parametrize("thing, name", [(Plain(), "Plain"), (Evil(), "print")])
def test_load_refuses_arbitrary_objects(tmp_path, thing, name):
    path = str(tmp_path / "ckpt.pt")
    torch.save({"model": {}, "extra": thing}, path)
    with pytest.raises(UsageError) as e:
        tc.load_checkpoint(path)
    assert path in str(e.value) and name in str(e.value) and "weights_only" in str(e.value)


def test_load_refuses_a_non_dict(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    torch.save([1, 2], path)
    with pytest.raises(UsageError, match="not a dict"):
        tc.load_checkpoint(path)


def test_strip_compile_prefix():
    sd = {"_orig_mod.wte.weight": 1, "module._orig_mod.h.0.attn.w": 2, "module.lm_head.weight": 3,
          "h.1._orig_mod.mlp.w": 4, "h.2.module.w": 5, "ln_f.weight": 6, "_orig_mod.module.wpe.weight": 7}
    assert tc.strip_compile_prefix(sd) == {"wte.weight": 1, "h.0.attn.w": 2, "lm_head.weight": 3,
                                           "h.1.mlp.w": 4, "h.2.module.w": 5, "ln_f.weight": 6, "wpe.weight": 7}


def test_strip_compile_prefix_loads_into_a_plain_model():
    model = torch.nn.Linear(3, 2)
    compiled_keys = {"_orig_mod." + k: v for k, v in model.state_dict().items()}
    fresh = torch.nn.Linear(3, 2)
    fresh.load_state_dict(tc.strip_compile_prefix(compiled_keys))  # strict: fails on any leftover prefix
    assert torch.equal(fresh.weight, model.weight)


def test_strip_compile_prefix_refuses_collisions():
    with pytest.raises(ValueError):
        tc.strip_compile_prefix({"module.w": 1, "w": 2})

def test_check_out_dir_refuses_or_deletes(tmp_path, capsys):
    ckpt, best = str(tmp_path / "ckpt.pt"), str(tmp_path / "best.pt")
    tc.check_out_dir([ckpt, best], overwrite=False, master=True)  # nothing there: fine
    Path(best).write_bytes(b"weights")
    with pytest.raises(UsageError) as e:
        tc.check_out_dir([ckpt, best], overwrite=False, master=True)
    assert str(e.value).startswith(f"{best} holds an earlier run") and "\n" not in str(e.value)
    assert "--init_from=resume" in str(e.value) and "--out_dir" in str(e.value) and "--overwrite=true" in str(e.value)
    tc.check_out_dir([ckpt, best], overwrite=True, master=False)  # only the master deletes
    assert os.path.exists(best)
    tc.check_out_dir([ckpt, best], overwrite=True, master=True)
    assert not os.path.exists(best) and capsys.readouterr().out == f"overwrite: deleted {best}\n"

# -----------------------------------------------------------------------------
# stopping


SINGLE = tc.Dist(ddp=False, rank=0, local_rank=0, world_size=1, master=True, device="cpu")


def test_graceful_stop_turns_signals_into_a_flag(monkeypatch):
    import signal
    before = signal.getsignal(signal.SIGTERM)
    with tc.GracefulStop(SINGLE) as stop:
        assert not stop.requested()
        os.kill(os.getpid(), signal.SIGTERM)  # would end the process without the handler
        assert stop.requested() and stop.signal == "SIGTERM"
        os.kill(os.getpid(), signal.SIGINT)  # a copy within a second: the same stop
        assert stop.requested()
        clock = time.monotonic() + 1.5
        monkeypatch.setattr(tc.time, "monotonic", lambda: clock)
        with pytest.raises(KeyboardInterrupt):  # a second one, later: out now
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) == before and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_resume_command(monkeypatch):
    for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(sys, "argv", ["pytest"])
    defaults = dict(out_dir="out", device="auto", dtype="auto", compile="auto", max_iters=10)
    cfg = dict(defaults, out_dir="my out", device="auto", max_iters=20)
    assert tc.resume_command("train_gpt.py", cfg, {"out_dir", "device", "max_iters"}, defaults) == \
        "resume with: python train_gpt.py --init_from=resume '--out_dir=my out'"   # the checkpoint has the rest
    monkeypatch.setattr(sys, "argv", ["../tost/train_gpt.py"])  # the script as the user started it
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert tc.resume_command("train_gpt.py", defaults, set(), defaults) == \
        "resume with: torchrun --standalone --nproc_per_node=4 ../tost/train_gpt.py --init_from=resume"

# -----------------------------------------------------------------------------
# schedule


def test_cosine_lr_shape():
    lr, min_lr, warm, decay = 6e-4, 6e-5, 10, 110
    f = lambda it: tc.cosine_lr(it, lr, min_lr, warm, decay)
    assert f(0) == pytest.approx(lr / warm)  # first step: lr/warmup, not 0
    assert f(4) == pytest.approx(lr * 5 / warm)
    assert f(warm - 1) == pytest.approx(lr)  # warmup ends at the peak...
    assert f(warm) == pytest.approx(lr)  # ...and cosine starts from it
    assert f((warm + decay) / 2) == pytest.approx((lr + min_lr) / 2)  # cosine midpoint
    assert f(decay) == pytest.approx(min_lr)
    assert f(decay + 1) == min_lr and f(10 * decay) == min_lr
    values = [f(it) for it in range(warm, decay + 1)]
    assert all(a >= b for a, b in zip(values, values[1:]))  # monotone decay


def test_cosine_lr_fractional_and_no_warmup():
    f = lambda it: tc.cosine_lr(it, 1.0, 0.0, 5, 25)
    assert f(2.5) == pytest.approx(3.5 / 5)
    assert f(4.5) == 1.0  # clamped, not 5.5/5
    assert f(15.0) == pytest.approx(0.5)
    assert tc.cosine_lr(0, 1.0, 0.1, 0, 10) == 1.0

# -----------------------------------------------------------------------------
# device and precision


def test_pick_device_on_this_machine():
    want = "cuda" if torch.cuda.is_available() else "mps" if tc._mps_available() else "cpu"
    assert tc.pick_device() == want
    assert tc.pick_device("cpu") == "cpu"
    with pytest.raises(UsageError, match="unknown device 'gpu'"):
        tc.pick_device("gpu")


def test_pick_device_refuses_missing_hardware(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(tc, "_mps_available", lambda: False)
    assert tc.pick_device("auto") == "cpu"
    for dev in ("cuda", "cuda:1", "mps"):
        with pytest.raises(UsageError, match="not available"):
            tc.pick_device(dev)


def test_loss_sums_are_float64_except_on_mps_which_has_none():
    assert tc.sum_dtype("cpu") == tc.sum_dtype("cuda:1") == torch.float64
    assert tc.sum_dtype("mps") == tc.sum_dtype(torch.device("mps")) == torch.float32


def test_resolve_dtype(monkeypatch):
    assert tc.resolve_dtype("auto", "cpu") == "float32"
    assert tc.resolve_dtype("auto", "mps") == "float32"
    assert tc.resolve_dtype("bfloat16", "cpu") == "bfloat16"
    assert tc.resolve_dtype("float32", "cpu") == "float32"
    assert tc.resolve_dtype("float16", "cpu") == "float16"  # autocast and GradScaler run on CPU (torch 2.5+)
    with pytest.raises(UsageError, match="unknown dtype 'fp8'"):
        tc.resolve_dtype("fp8", "cpu")


def fake_gpu(monkeypatch, major, minor):
    """torch.cuda answers as on a GPU of compute capability major.minor, down to the queries torch's own
    is_bf16_supported() makes; that GPU can hold bfloat16 tensors (emulated before Ampere, as on a real one)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(major=major,
                                                                                                 minor=minor))
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True)
    monkeypatch.setattr(torch.version, "hip", None)


@pytest.mark.parametrize("gpu, capability, want", [("T4", (7, 5), "float16"), ("V100", (7, 0), "float16"),
                                                   ("A100", (8, 0), "bfloat16"), ("H100", (9, 0), "bfloat16")])
def test_auto_dtype_is_bfloat16_only_where_the_gpu_computes_in_it(monkeypatch, gpu, capability, want):
    """Before Ampere a GPU emulates bfloat16 (no tensor cores, several times slower) and torch's default
    is_bf16_supported() says yes anyway; auto must take float16 with loss scaling there."""
    fake_gpu(monkeypatch, *capability)
    assert torch.cuda.is_bf16_supported()                     # the trap: true on every one of them
    assert tc.resolve_dtype("auto", "cuda") == want
    assert tc.make_grad_scaler("cuda", want).is_enabled() == (want == "float16")
    assert tc.resolve_dtype("float16", "cuda:0") == "float16"
    if want == "float16":
        with pytest.raises(UsageError, match="this GPU has no bfloat16"):
            tc.resolve_dtype("bfloat16", "cuda")
    else:
        assert tc.resolve_dtype("bfloat16", "cuda:1") == "bfloat16"


def test_autocast_and_grad_scaler_on_cpu():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with tc.autocast("cpu", "float32"):
        assert (a @ b).dtype == torch.float32
    with tc.autocast("cpu", "bfloat16"):
        assert (a @ b).dtype == torch.bfloat16
    assert isinstance(tc.make_grad_scaler("cpu", "float32"), torch.amp.GradScaler)
    assert not tc.make_grad_scaler("cpu", "bfloat16").is_enabled()
    with tc.autocast("cpu", "float16"):
        assert (a @ b).dtype == torch.float16
    assert tc.make_grad_scaler("cpu", "float16").is_enabled()


def test_setup_distributed_single_process(monkeypatch):
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    d = tc.setup_distributed("cpu")
    assert d == tc.Dist(ddp=False, rank=0, local_rank=0, world_size=1, master=True, device="cpu")
    assert not torch.distributed.is_initialized()
    tc.cleanup_distributed(d)  # a no-op, must not raise


def test_the_gpu_asked_for_is_made_the_current_one_once(monkeypatch):
    """--device=cuda:1: synchronize(), the memory counters and is_bf16_supported() ask the current GPU, so
    cuda:1 must become it; TF32 on for float32 matmuls. On a CPU neither is touched."""
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda p: calls.append(("precision", p)))
    assert tc.setup_distributed("cuda:1").device == "cuda:1"
    assert calls == [("set_device", "cuda:1"), ("precision", "high")]
    calls.clear()
    tc.setup_distributed("cuda")                              # the current GPU: it stays the current one
    assert calls == [("precision", "high")]
    calls.clear()
    tc.setup_distributed("cpu")
    assert calls == []


def test_a_compiled_step_runs_after_the_gpu_set_up():
    """setup_cuda() turns TF32 on through the one API every admitted torch reads: afterwards the legacy flags and
    the newer per-backend ones can all be read (the compiler reads some of them; after fp32_precision was set, a
    read of allow_tf32 raises), and a compiled training step runs. In a fresh process: the setting is global."""
    code = """
import contextlib, torch, tost, train_common as tc
torch.cuda.set_device = lambda device: None                    # no GPU here: the rest of the set-up is real
tc.setup_cuda('cuda:0')
model = tost.GPT(tost.GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64))
opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
x = torch.randint(0, 64, (2, 17))
loss = tc.train_step(torch.compile(model), [lambda: (x[:, :-1], x[:, 1:])], lambda m, a, b: m(a, b)[1], opt,
                     tc.make_grad_scaler('cpu', 'float32'), 1.0, contextlib.nullcontext(), False)
b = torch.backends
print(torch.get_float32_matmul_precision(), b.cuda.matmul.allow_tf32, b.cuda.matmul.fp32_precision,
      b.cudnn.allow_tf32, b.cudnn.conv.fp32_precision, bool(torch.isfinite(loss)))
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=HERE, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["high", "True", "tf32", "True", "tf32", "True"]


def test_setup_distributed_incomplete_env(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(UsageError, match="torchrun"):
        tc.setup_distributed("cpu")


def test_seed_everything_depends_on_rank():
    tc.seed_everything(1337)
    a = torch.rand(3)
    tc.seed_everything(1337)
    assert torch.equal(torch.rand(3), a)
    tc.seed_everything(1337, rank=1)
    assert not torch.equal(torch.rand(3), a)

# -----------------------------------------------------------------------------
# logging


@pytest.mark.parametrize("s, want", [(0, "0s"), (45, "45s"), (59.6, "1m00s"), (190, "3m10s"),
                                     (3725, "1h02m"), (90000, "25h00m"), (None, "?"), (math.inf, "?")])
def test_human_time(s, want):
    assert tc.human_time(s) == want


def _lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_runlog_json_lines_and_plain_lines(tmp_path, capsys, monkeypatch):
    clock = iter([1000.0, 1010.0, 1020.0])  # one reading per show(): 10 s per 100 iters
    monkeypatch.setattr(tc, "time", SimpleNamespace(time=lambda: next(clock)))
    with tc.RunLog(str(tmp_path), total=300, tty=False) as log:
        log.record({"iter": 0, "loss": 4.5, "lr": 6e-4})
        log.record({"iter": 100, "loss": float("nan")})
        log.record({"iter": 100, "per_layer": [1.5, float("inf"), 2]})
        log.show({"iter": 0, "loss": 4.5})
        log.show({"iter": 100, "loss": 2.34121, "lr": 6e-4, "tok_per_s": 1234.4, "ms_per_iter": 52.14,
                  "mfu": 0.0123})
        log.show({"iter": 200, "val_loss": 2.1})
        log.print("saving checkpoint to out")
    assert _lines(tmp_path / "log.jsonl") == [{"iter": 0, "loss": 4.5, "lr": 6e-4}, {"iter": 100, "loss": None},
                                              {"iter": 100, "per_layer": [1.5, None, 2]}]
    out = capsys.readouterr().out.splitlines()
    assert out == ["iter 0: loss 4.5000",
                   "iter 100: loss 2.3412, lr 6.0e-04, 1234 tok/s, 52.1 ms/iter, mfu 1.2%, eta 20s",
                   "iter 200: val_loss 2.1000, eta 10s",
                   "saving checkpoint to out"]


def test_runlog_refuses_tensors(tmp_path):
    with tc.RunLog(str(tmp_path), tty=False) as log:
        with pytest.raises(TypeError, match="item"):
            log.record({"loss": torch.tensor(1.0)})


def test_runlog_resume_appends_fresh_truncates(tmp_path):
    with tc.RunLog(str(tmp_path), tty=False) as log:
        log.record({"iter": 1})
    with tc.RunLog(str(tmp_path), tty=False, fresh=False) as log:
        log.record({"iter": 2})
    assert _lines(tmp_path / "log.jsonl") == [{"iter": 1}, {"iter": 2}]
    with tc.RunLog(str(tmp_path), tty=False) as log:
        log.record({"iter": 3})
    assert _lines(tmp_path / "log.jsonl") == [{"iter": 3}]


def test_runlog_resume_drops_the_rows_past_the_checkpoint(tmp_path):
    with tc.RunLog(str(tmp_path), tty=False) as log:
        for i in range(1, 7):
            log.record({"iter": i, "kind": "train"})
        log.record({"note": "no counter: kept"})
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write('{"iter": 7, "kin')  # a line torn by a crash mid-write
    with tc.RunLog(str(tmp_path), tty=False, fresh=False, resume_from=4) as log:
        log.record({"iter": 5, "kind": "train"})
    assert _lines(tmp_path / "log.jsonl") == [{"iter": i, "kind": "train"} for i in range(1, 5)] + \
        [{"note": "no counter: kept"}, {"iter": 5, "kind": "train"}]


def test_runlog_disabled_does_nothing(tmp_path, capsys):
    d = tmp_path / "rank1"
    with tc.RunLog(str(d), enabled=False, total=10, tty=False) as log:
        log.record({"iter": 1, "loss": 1.0})
        log.show({"iter": 1, "loss": 1.0})
        log.print("hello")
    assert not d.exists()
    assert capsys.readouterr().out == ""


def test_runlog_live_table_on_a_terminal(tmp_path, monkeypatch):
    from rich.console import Console
    buf = io.StringIO()
    log = tc.RunLog(str(tmp_path), total=1000, tty=True)
    log._console = Console(file=buf, force_terminal=True, width=120)
    log.show({"iter": 10, "loss": 3.25, "lr": 1e-4})
    log.print("[rank 0] evaluating")  # brackets are text, not rich markup
    log.show({"iter": 20, "val_loss": 2.75})
    log.close()
    out = buf.getvalue()
    assert "\x1b[" in out  # drawn with terminal control codes, not printed line by line
    for text in ("iter 20/1000", "3.2500", "1.0e-04", "2.7500", "val_loss", "[rank 0] evaluating", "eta"):
        assert text in out


def test_runlog_live_table_fits_80_columns(tmp_path):
    """Every column a language run shows (MFU, both eval losses, six-digit tokens/s) on one line of 80."""
    from rich.console import Console
    log = tc.RunLog(str(tmp_path), total=600_000, tty=True)
    log._console = Console(file=io.StringIO(), force_terminal=True, width=80)
    log.show(dict(iter=123_456, loss=2.3412, lr=6e-4, tok_per_s=123_456.7, ms_per_iter=1234.5, mfu=0.4321))
    log.show(dict(iter=124_000, train_loss=2.3412, val_loss=2.3456))
    log.close()
    screen = Console(file=io.StringIO(), width=80, record=True)
    screen.print(log._frame("iter 124000", 124_000, "3h02m"))
    lines = screen.export_text().splitlines()
    assert len(lines) == 3, lines                                   # bar, labels, values: nothing wrapped
    assert all(len(line) <= 80 for line in lines) and "val_loss" in lines[1] and "43.2%" in lines[2]


# -----------------------------------------------------------------------------
# the training step under DDP


def test_a_compiled_ddp_model_all_reduces_on_the_last_micro_step_only(tmp_path):
    """torch.compile(DDP(model)), as the trainers build it: train_step's no_sync() reaches DDP through the compiled
    wrapper, so 3 micro-steps all-reduce the gradients once (counted by a DDP comm hook, which DDP calls for each
    bucket it all-reduces; a tiny model fills one), and the gradients are those of the model without DDP."""
    import tost
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        cfg = tost.GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64)
        plain, model = tost.GPT(cfg), tost.GPT(cfg)
        model.load_state_dict(plain.state_dict())
        ddp, reduced = torch.nn.parallel.DistributedDataParallel(model), []
        ddp.register_comm_hook(None, lambda state, bucket: reduced.append(1) or allreduce_hook(state, bucket))
        x = torch.randint(0, 64, (3, 2, 17))
        batches = [lambda i=i: (x[i, :, :-1], x[i, :, 1:]) for i in range(3)]
        grads = []
        for m, is_ddp, params in ((torch.compile(ddp), True, model), (plain, False, plain)):
            opt = torch.optim.SGD(params.parameters(), lr=0.0)
            opt.register_step_pre_hook(lambda *_, params=params: grads.append([p.grad.clone()
                                                                               for p in params.parameters()]))
            tc.train_step(m, batches, lambda m, a, b: m(a, b)[1], opt, tc.make_grad_scaler("cpu", "float32"), 0.0,
                          contextlib.nullcontext(), is_ddp)
        assert len(reduced) == 1
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    finally:
        torch.distributed.destroy_process_group()
