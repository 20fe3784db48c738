"""bench.py stays runnable: its smallest mode runs every section (timings are not asserted: the
benchmark prints ratios, tests don't time things)."""

import json
import math
import subprocess
import sys

import matplotlib.image

import bench


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
