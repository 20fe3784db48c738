"""bench.py stays runnable: its smallest mode runs every section (timings are not asserted: the
benchmark prints ratios, tests don't time things)."""

import json
import math
import subprocess
import sys

import matplotlib.image
import torch
from torch._dynamo.utils import counters

import bench
import tost_fast


def test_smoke_mode_runs_every_section(tmp_path):
    out = tmp_path / 'bench.json'
    r = subprocess.run([sys.executable, 'bench.py', '--smoke', '--no_memory', f'--json={out}'],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert {'operator', 'operator_exponent', 'limit', 'model', 'generation', 'training'} <= set(res)
    ops = {(row['n'], row['op']) for row in res['operator']}
    assert (256, 'causal_tssa') in ops and (256, 'sdpa') not in ops     # the TSSA-only size
    for row in res['operator']:
        assert row['fwd_s'] > 0 and row['fwdbwd_s'] > 0
    for row in res['generation']:
        assert row['recurrent'] > 0 and row['rerun'] > 0 and row['shift_recurrent'] > 0 and row['softmax_kv'] > 0
        assert row['hybrid'] > 0
    for name, shape in (('speed.png', (400, 1000)), ('generation.png', (400, 650))):   # drawn beside the JSON
        assert matplotlib.image.imread(tmp_path / name).shape[:2] == shape


def test_cpu_memory_probe_sees_activations():
    bench.WIDTH, bench.HEADS = 64, 4
    spec = lambda n: dict(kind='causal_tssa', n=n, dtype='float32', backward=True, mode='smoke')
    # large enough that a few MB of allocator noise do not matter (4096 tokens gave ratios from 6 to 21)
    small, large = bench.measure_memory(spec(32768), 'cpu'), bench.measure_memory(spec(131072), 'cpu')
    assert small > 0 and not math.isnan(large)
    assert 3 < large / small < 6           # 4x tokens: roughly 4x memory, not 16x


def test_every_compiled_case_runs_compiled(monkeypatch):
    """--compile: each case compiles afresh. Otherwise the sizes of one layer add up against dynamo's recompile
    limit (8; 1 here, to see it with two sizes), past which dynamo runs the layer eagerly: a TSSA layer then takes
    its fast core, and the row says compiled. Here no fast core is entered, and each size made its own graph."""
    monkeypatch.setattr(bench, 'COMPILE', True)
    entered, real = [], tost_fast.causal_tssa
    monkeypatch.setattr(tost_fast, 'causal_tssa', lambda *a: entered.append(1) or real(*a))
    before = counters['stats']['unique_graphs']
    with torch._dynamo.config.patch(recompile_limit=1):
        for n in (8, 16):
            bench.make_op('causal_tssa', n, 'cpu', 'float32', False, width=16, heads=2)()
    assert entered == [] and counters['stats']['unique_graphs'] - before == 2
    bench.make_op('causal_tssa', 8, 'cpu', 'float32', False, width=16, heads=2, compile=False)()
    assert entered == [1]                                   # the eager case (the limit's fast column) takes it


def test_the_device_asked_for_is_the_one_measured(monkeypatch):
    """--device=cuda:1: synchronize() and the memory counters ask the current GPU, so main makes cuda:1 the
    current one, once, as the trainers do (train_common.setup_cuda). Mocked: no GPU here."""
    calls = []
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'set_device', lambda device: calls.append(device))
    monkeypatch.setattr(torch, 'set_float32_matmul_precision', lambda p: calls.append(p))
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None: 'a GPU')
    monkeypatch.setattr(bench, 'run_sections', lambda args, sections, results, console, figures: results)
    assert bench.main(['--device=cuda:1', '--smoke', '--sections=operator'])['gpu'] == 'a GPU'
    assert calls == ['cuda:1', 'high']
