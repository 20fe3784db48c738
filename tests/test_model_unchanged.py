"""What tost.py and tost_fast.py compute is the same, bit for bit, as at the commit where the lecture's edits
to their docstrings, comments and names began: outputs and every gradient of each operator and
model, through the readable lines, the recurrent steps and the fused core with several chunks.

The reference is that commit's files, read with git and loaded under other names. A change meant to alter
what the model computes moves BASE forward to the commit that made it."""

import subprocess
import sys
import types

import pytest
import torch

import tost
import tost_fast
from conftest import REPO
from test_tost import randomize

BASE = 'd6973ec'


def load_base(name, extra=None):
    """The module `name` as it was at BASE, as a fresh module (its own `import tost_fast` given `extra`)."""
    r = subprocess.run(['git', 'show', f'{BASE}:{name}.py'], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, f'git show {BASE}:{name}.py failed (a checkout without history?): {r.stderr}'
    module = types.ModuleType(f'{name}_at_{BASE}')
    saved = sys.modules.get('tost_fast')
    if extra is not None:
        sys.modules['tost_fast'] = extra
    try:
        exec(compile(r.stdout, f'{name}.py@{BASE}', 'exec'), module.__dict__)
    finally:
        sys.modules['tost_fast'] = saved
    return module


@pytest.fixture(scope='module')
def base():
    old_fast = load_base('tost_fast')
    return load_base('tost', old_fast), old_fast


def twins(make_new, make_old, seed=0):
    """The same module built from the current and the BASE file, with the same random parameters."""
    new = randomize(make_new(), seed=seed)
    old = make_old()
    old.load_state_dict(new.state_dict())
    return new, old


def outputs_and_grads(module, inputs, run):
    """What `run(module, *inputs)` returns and the gradients of a fixed weighting of it."""
    inputs = [x.clone().requires_grad_() if x.is_floating_point() else x for x in inputs]
    module.zero_grad()
    out = run(module, *inputs)
    weights = torch.Generator().manual_seed(1)
    total = sum((o * torch.randn(o.shape, generator=weights, dtype=o.dtype)).sum() for o in out)
    total.backward()
    grads = [x.grad for x in inputs if x.is_floating_point()]
    return list(out) + grads + [p.grad for p in module.parameters() if p.grad is not None]


def forward(module, x):
    return [module(x)]


def assert_identical(new, old, inputs, run=forward):
    """run(new, *inputs) and run(old, *inputs) and their gradients: equal, bit for bit."""
    a = outputs_and_grads(new, inputs, run)
    b = outputs_and_grads(old, inputs, run)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y), (x - y).abs().max()


def test_objective_and_operators_compute_what_they_did(base, monkeypatch):
    old, old_fast = base
    torch.manual_seed(0)
    Z = torch.randn(2, 9, 12, dtype=torch.float64)
    Pi = torch.softmax(torch.randn(2, 3, 9, dtype=torch.float64), 1)
    U = torch.randn(3, 12, 4, dtype=torch.float64)
    for alpha in (1.0, 3.0):
        value = tost.variational_compression(Z, Pi, U, alpha)
        assert torch.equal(value, old.variational_compression(Z, Pi, U, alpha))
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    for kwargs in (dict(bias=True), dict(whitebox=True, alpha=2.0, tau=0.5)):
        new, ref = twins(lambda: tost.TSSA(12, 3, **kwargs).double(),
                         lambda: old.TSSA(12, 3, **kwargs).double())
        assert_identical(new, ref, [x])
    # the causal layer: readable lines, the state carried over a split, the recurrent steps, and the fused
    # core with several chunks (so the carries between chunks run)
    monkeypatch.setattr(tost_fast, 'MIN_ELEMENTS', 0)
    monkeypatch.setattr(old_fast, 'MIN_ELEMENTS', 0)
    monkeypatch.setattr(tost_fast, 'CHUNK', 2 * 30 * 12)
    monkeypatch.setattr(old_fast, 'CHUNK', 2 * 30 * 12)
    x = torch.randn(2, 100, 12, dtype=torch.float64)
    new, ref = twins(lambda: tost.CausalTSSA(12, 3, 100).double(),
                     lambda: old.CausalTSSA(12, 3, 100).double())

    def split(m, x):
        a, st = m(x[:, :40], m.empty_state(2, dtype=x.dtype))
        b, st = m(x[:, 40:], st)
        return [a, b, st.Q, st.A, st.P]

    def steps(m, x):
        st, ys = m.empty_state(2, dtype=x.dtype), []
        for t in range(12):
            y, st = m.step(x[:, t], st)
            ys.append(y)
        return ys + [st.Q, st.A, st.P]

    for fast in (False, True):
        monkeypatch.setattr(tost.CausalTSSA, 'fast', fast)
        monkeypatch.setattr(old.CausalTSSA, 'fast', fast)
        assert_identical(new, ref, [x])
    assert_identical(new, ref, [x], split)
    assert_identical(new, ref, [x], steps)


def test_models_compute_what_they_did(base, monkeypatch):
    old, old_fast = base
    monkeypatch.setattr(tost_fast, 'MIN_ELEMENTS', 0)
    monkeypatch.setattr(old_fast, 'MIN_ELEMENTS', 0)
    torch.manual_seed(0)
    for fields in (dict(), dict(softmax_layers=(-1,), token_shift=True)):
        cfg = dict(block_size=24, vocab_size=30, n_layer=2, n_head=2, n_embd=8, **fields)
        new, ref = twins(lambda: tost.GPT(tost.GPTConfig(**cfg)), lambda: old.GPT(old.GPTConfig(**cfg)))
        idx = torch.randint(0, 30, (2, 24))
        targets = torch.randint(0, 30, (2, 24))

        def run(m, idx, targets):
            logits, loss = m(idx, targets)
            last, _ = m(idx)
            first, states = m.prefill(idx[:, :10])
            stepped, _ = m.step(idx[:, 10], states)
            return [logits, loss, last, first, stepped]

        assert_identical(new, ref, [idx, targets], run)
    # the paper's vision model, and the options beyond it (a softmax baseline, XCiT's LPI)
    for fields in (dict(n_cls_layer=1), dict(attn='softmax', lpi=True, n_cls_layer=2)):
        cfg = dict(img_size=16, patch_size=4, num_classes=5, n_layer=2, n_head=2, n_embd=16, **fields)
        new, ref = twins(lambda: tost.ViT(tost.ViTConfig(**cfg)), lambda: old.ViT(old.ViTConfig(**cfg)))
        new.eval()
        ref.eval()
        images = torch.randn(2, 3, 16, 16)
        assert_identical(new, ref, [images])
