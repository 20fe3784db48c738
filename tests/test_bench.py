"""tools/bench.py stays runnable: its smallest mode runs every section (timings are not asserted: the
benchmark prints ratios, tests don't time things), the memory probe runs in its own process, and each case
runs what its column says."""
import contextlib
import errno
import json
import math
import os
import re
import subprocess
import sys

import matplotlib.image
import pytest
import torch
from torch._dynamo.utils import counters
from types import SimpleNamespace

import options
import tost
import tost_fast
from tools import bench
from conftest import POSIX_ONLY, REPO, counted



def test_smoke_mode_runs_the_sections_without_compiling(tmp_path, capsys):
    """Every section but the limit (which compiles), in this process, with the figures beside the JSON, in a
    folder whose path reads as rich's markup (a closing tag)."""
    tmp_path = tmp_path / 'a [' / 'x]'
    tmp_path.mkdir(parents=True)
    out = tmp_path / 'bench.json'
    res = bench.main(['--smoke', '--no_memory', '--sections=operator,model,generation,training',
                      f'--json={out}'])
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    assert {'operator', 'operator_exponent', 'model', 'generation', 'training'} <= set(res)
    ops = {(row['n'], row['op']) for row in res['operator']}
    assert (256, 'causal_tssa') in ops and (256, 'sdpa') not in ops     # the TSSA-only size
    assert all(row['fwd_s'] > 0 and row['fwdbwd_s'] > 0 for row in res['operator'])
    for row in res['generation']:
        assert all(row[k] > 0 for k in ('recurrent', 'rerun', 'shift_recurrent', 'softmax_kv', 'hybrid'))
    said = capsys.readouterr().out
    for name, shape in (('speed.png', (400, 1000)), ('generation.png', (400, 650))):   # drawn beside the JSON
        assert matplotlib.image.imread(tmp_path / name).shape[:2] == shape
        assert f"wrote {tmp_path / name}\n" in said


@POSIX_ONLY
def test_the_results_go_where_a_link_points_and_the_link_stays(monkeypatch, tmp_path):
    """--json through a link: the numbers go where it points, and the link stays."""
    out = tmp_path / 'bench.json'
    link = tmp_path / 'link.json'
    link.symlink_to(out)
    sections = dict(operator=lambda args, results: results.update(a=1))
    monkeypatch.setattr(bench, 'SECTIONS', {**bench.SECTIONS, **sections})
    bench.main(['--smoke', '--no_memory', '--sections=operator', f'--json={link}'])
    assert json.loads(out.read_text())['a'] == 1 and link.is_symlink()


@pytest.mark.slow
def test_smoke_mode_runs_every_section(tmp_path):
    """The command as documented, from the repo root: every section, the limit's compiled columns included."""
    out = tmp_path / 'bench.json'
    r = subprocess.run([sys.executable, '-m', 'tools.bench', '--smoke', '--no_memory', f'--json={out}'],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert {'operator', 'operator_exponent', 'limit', 'model', 'generation', 'training'} <= set(res)
    assert len(res['limit']) == 4                                # two shapes, forward and forward+backward
    for row in res['limit']:
        assert all(row[k] > 0 for k in bench.LIMIT if k != 'causal_triton_s') and 'causal_triton_s' not in row


@pytest.mark.slow
def test_without_a_cxx_compiler_the_limit_leaves_out_its_compiled_columns(tmp_path):
    """On a CPU, torch.compile needs a C++ compiler (Windows and macOS ship none): the limit section still
    runs, without the compiled columns, and says so."""
    out = tmp_path / 'bench.json'
    env = dict(os.environ, CXX=str(tmp_path / 'no-cxx'), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / 'cache'))
    r = subprocess.run([sys.executable, '-m', 'tools.bench', '--smoke', '--no_memory', '--sections=limit',
                        f'--json={out}'], cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    assert len([line for line in r.stdout.splitlines() if 'compile' in line and 'C++' in line]) == 1
    rows = json.loads(out.read_text())['limit']
    assert rows and all('tssa_compiled_s' not in row and 'causal_compiled_s' not in row for row in rows)
    assert all(row['tssa_s'] > 0 and row['causal_readable_s'] > 0 for row in rows)


def test_off_linux_a_cpus_memory_is_not_measured_and_said_once(monkeypatch, tmp_path, capsys):
    """macOS and Windows have no /proc: the header says memory is not measured, and no case tries."""
    monkeypatch.setattr(bench, 'PROC', str(tmp_path / 'no-proc'))
    res = bench.main(['--smoke', '--sections=operator'])
    assert all(math.isnan(row['fwdbwd_peak_mb']) for row in res['operator'])
    out = capsys.readouterr().out
    assert out.count('/proc') == 1 and 'memory of' not in out


@pytest.mark.slow
def test_cpu_memory_probe_sees_activations():
    """Each case in a fresh process (python -c 'from tools import bench', run from the repo root)."""
    spec = dict(kind='causal_tssa', dtype='float32', width=64, heads=4)
    # large enough that a few MB of allocator noise do not matter (4096 tokens gave ratios from 6 to 21)
    small = bench.measure_memory(dict(spec, n=32768), 'cpu')
    large = bench.measure_memory(dict(spec, n=131072), 'cpu')
    assert small > 0 and not math.isnan(large)
    assert 3 < large / small < 6           # 4x tokens: roughly 4x memory, not 16x


@pytest.mark.slow
def test_cpu_memory_probe_counts_the_measured_run_not_the_warm_up_leftovers():
    """What the warm-up run freed and the allocator kept is not counted as already held: the same case in two
    fresh processes agrees, and twice the tokens take about twice the memory."""
    spec = dict(kind='tssa', dtype='float32', width=768, heads=12)
    a, b = (bench.measure_memory(dict(spec, n=4096), 'cpu') for _ in range(2))
    c = bench.measure_memory(dict(spec, n=8192), 'cpu')
    assert abs(a / b - 1) < 0.1 and 1.7 < c / a < 2.3


def causal_op(n=8, backward=False, **how):
    """bench's case of a causal TSSA layer of width 16 in 2 heads, n tokens, float32 on the CPU."""
    return bench.make_op('causal_tssa', n, 'cpu', 'float32', backward, width=16, heads=2, **how)


def test_the_readable_column_runs_the_readable_lines(monkeypatch):
    """The limit's causal columns: with fused=True the fused core at any size (tost_fast.MIN_ELEMENTS 0 while
    the case runs), with readable=True the lines of tost.py (CausalTSSA.fast off while the case runs, on again
    after, also when it fails)."""
    entered = counted(monkeypatch, tost_fast, 'causal_tssa')
    for backward in (False, True):
        causal_op(backward=backward, readable=True)()
    assert entered == [] and tost.CausalTSSA.fast is True
    causal_op()()   # tiny: the default path
    assert entered == []                                                                 # is the readable one
    causal_op(fused=True)()
    assert entered == [1] and tost_fast.MIN_ELEMENTS == 2 ** 19
    run = causal_op(readable=True)
    monkeypatch.setattr(tost.CausalTSSA, 'forward', lambda self, x: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        run()
    assert tost.CausalTSSA.fast is True


def test_the_triton_column_runs_the_triton_core_and_says_where_it_cannot(monkeypatch, capsys):
    """triton=True: CausalTSSA.forward's dispatch line sends this device to the Triton core while the case
    runs (tost_fast.TRITON), and puts it back after; a CPU's limit table says the column is not available."""
    entered = []

    def core(layer, x):                     # stands in for the core: tost_triton is tested in test_triton.py
        entered.append(tost_fast.TRITON)
        return layer.c_proj(x)
    monkeypatch.setattr(tost_fast, 'causal_tssa', core)
    causal_op()()
    assert entered == [] and tost_fast.TRITON == ()
    causal_op(triton=True)()
    assert entered == [('cpu',)] and tost_fast.TRITON == ()
    monkeypatch.setattr(bench, 'make_op', lambda kind, *a, **how: lambda: None)
    monkeypatch.setattr(bench, 'NOISY', [])
    monkeypatch.setattr(bench, 'compiles_here', lambda device: True)       # the slow tests compile
    bench.section_limit(argparse_like(device='cpu', mode='smoke'), {})
    said = [line for line in capsys.readouterr().out.splitlines() if 'Triton core' in line and 'CUDA' in line]
    assert len(said) == 1


@pytest.mark.parametrize('version, compiled, capable', [('2.13.0', True, True),
                                                       ('2.12.1+cu128', False, False)])
def test_the_limit_has_no_fused_column_off_a_cpu(monkeypatch, capsys, version, compiled, capable):
    """The fused core runs on CPUs only: on a GPU its column would time the readable lines under its name;
    so would the Triton core's below compute capability 7.0. Nor are causal TSSA's readable lines compiled for
    a GPU by a torch that fails at it (before 2.13), where --compile without the Triton core is one line."""
    monkeypatch.setattr(torch, '__version__', version)
    monkeypatch.setattr(tost_fast, 'TRITON', ('cuda',))
    monkeypatch.setattr(tost_fast, '_triton_runs_on', lambda gpu: capable)
    made = []
    monkeypatch.setattr(bench, 'make_op', lambda kind, *a, **how: made.append(how) or (lambda: None))
    monkeypatch.setattr(torch.cuda, 'synchronize', lambda: None)
    monkeypatch.setattr(bench, 'NOISY', [])             # empty cases time as noise: not for other tests
    monkeypatch.setattr(bench, 'compiles_here', lambda device: True)
    results = {}
    bench.section_limit(argparse_like(device='cuda', mode='smoke'), results)
    assert results['limit']
    assert all('causal_fast_s' not in r and 'causal_readable_s' in r for r in results['limit'])
    assert not any(how.get('fused') for how in made)
    assert all(('causal_triton_s' in r) == capable for r in results['limit'])
    assert all(('causal_compiled_s' in r) == compiled for r in results['limit'])
    assert ' - │' in capsys.readouterr().out                    # the column says it was not measured
    if not compiled:
        monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
        monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)
        with pytest.raises(options.UsageError, match=r'^--compile: torch 2\.12\.1\+cu128'):
            bench.main(['--device=cuda', '--compile', '--smoke'])


def argparse_like(**kw):
    return SimpleNamespace(dtype='float32', no_memory=True, **kw)


@pytest.mark.slow
def test_every_compiled_case_runs_compiled(monkeypatch):
    """--compile: each case compiles afresh. Otherwise the sizes of one layer add up against dynamo's
    recompile limit (8; 1 here, to see it with two sizes), past which dynamo runs the layer eagerly: a causal
    layer then takes its fused core, and the row says compiled. Here no fused core is entered, and each size
    made its own graph."""
    monkeypatch.setattr(bench, 'COMPILE', True)
    entered = []
    real = tost_fast.causal_tssa
    monkeypatch.setattr(tost_fast, 'causal_tssa', lambda *a: entered.append(1) or real(*a))
    before = counters['stats']['unique_graphs']
    with torch._dynamo.config.patch(recompile_limit=1):
        for n in (8, 16):
            causal_op(n)()
    assert entered == [] and counters['stats']['unique_graphs'] - before == 2
    causal_op(compile=False, fused=True)()
    assert entered == [1]                           # the eager case of the limit's fused column takes it


def test_the_device_asked_for_is_the_one_measured(monkeypatch, two_gpus):
    """--device=cuda:1: synchronize() and the memory counters ask the current GPU, so main makes cuda:1 the
    current one, once, as the trainers do (train_common.setup_cuda). Mocked: no GPU here."""
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None: 'a GPU')
    monkeypatch.setattr(bench, 'run_sections', lambda args, sections, results: results)
    results = bench.main(['--device=cuda:1', '--smoke', '--sections=operator'])
    assert results['gpu'] == 'a GPU' and results['cpu'] and results['load'] >= 0
    assert two_gpus == ['cuda:1', 'high']
    # what causal TSSA runs on, in the header and the JSON
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda gpu: {1: (8, 0)}[gpu])
    monkeypatch.setattr(tost_fast, '_triton_runs_on', tost_fast._triton_runs_on.__wrapped__)
    for triton, core in (((), 'the readable lines'), (('cuda',), 'the Triton core')):
        monkeypatch.setattr(tost_fast, 'TRITON', triton)
        assert bench.main(['--device=cuda:1', '--smoke', '--sections=operator'])['causal_on_gpu'] == core


@pytest.mark.parametrize('argv, names', [
    (['--sections=operator,speed'], 'speed'),
    (['--sections=operatr'], 'operator?'),
    (['--json=no/such/folder/bench.json'], 'no/such/folder/bench.json'),
    (['--json=README.md'], 'README.md'),
    # a folder, a device
    (['--json=folder.json'], 'folder.json'),
    pytest.param(['--json=null.json'], 'null.json', marks=POSIX_ONLY),     # a link to it
    # a results file that holds another section, which the run would drop
    (['--sections=operator', '--json=limit.json'], 'limit.json'),
    (['--sections=operator', '--json=bom.json'], 'bom.json'),           # saved by an editor with a mark
    (['--dtype=fp8'], 'fp8'),
    (['--device=foo'], 'foo'),
])
def test_bad_input_is_one_line_before_any_work(monkeypatch, fails, tmp_path, argv, names):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'folder.json').mkdir()
    if argv == ['--json=null.json']:
        (tmp_path / 'null.json').symlink_to(os.devnull)
    (tmp_path / 'limit.json').write_text('{"limit": [], "operator": []}')
    (tmp_path / 'bom.json').write_text('\ufeff{"limit": []}', encoding='utf-8')
    monkeypatch.setattr(bench, 'SECTIONS', {**bench.SECTIONS, 'operator': lambda args, results: 1 / 0})
    fails(bench.main, ['--smoke', *argv], names)


def test_a_run_cut_short_keeps_the_sections_it_finished(monkeypatch, tmp_path):
    out = tmp_path / 'b.json'
    sections = dict(operator=lambda args, results: results.update(a=results.get('a', 0) + 1),
                    limit=lambda args, results: 1 / 0)
    monkeypatch.setattr(bench, 'SECTIONS', {**bench.SECTIONS, **sections})
    # (a section named twice runs once)
    with pytest.raises(ZeroDivisionError):
        bench.main(['--smoke', '--sections=operator,operator,limit', f'--json={out}'])
    assert json.loads(out.read_text())['a'] == 1


def test_a_full_disk_names_the_json_and_keeps_the_earlier_one(fails, monkeypatch, tmp_path):
    out = tmp_path / 'b.json'
    out.write_text('{"earlier": 1}')
    monkeypatch.setattr(bench, 'SECTIONS', {**bench.SECTIONS, 'operator': lambda args, results: None})

    def full(obj, f, **kwargs):
        # As a full disk fails: part of it written, then ENOSPC with no file name.
        f.write('{"part')
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(json, 'dump', full)
    fails(bench.main, ['--smoke', '--sections=operator', f'--json={out}'], str(out), '--json')
    assert os.listdir(tmp_path) == ['b.json'] and out.read_text() == '{"earlier": 1}'


def test_cases_are_timed_in_turn_each_between_two_syncs(monkeypatch):
    """Warm-up rounds first, then rounds of a, b, each timed between waits for the GPU (cuda:N and a Mac's
    too); each case's median_high, and a case whose rounds differ past NOISE is named."""
    log = []
    monkeypatch.setattr(torch.cuda, 'synchronize', lambda: log.append('sync'))
    monkeypatch.setattr(torch.mps, 'synchronize', lambda: log.append('sync'))
    monkeypatch.setattr(bench, 'NOISY', [])
    for device in ('cuda:1', 'mps'):
        log.clear()
        # the clock each case reads before and after: a takes 1 s then 3 s, b 5 s twice
        clock = iter([0, 1, 0, 5, 0, 3, 0, 5])
        monkeypatch.setattr(bench.time, 'perf_counter', lambda: next(clock))
        cases = dict(a=lambda: log.append('a'), b=lambda: log.append('b'))
        assert bench.interleaved(cases, 2, device, warmup=2, label='x ') == dict(a=3, b=5)
        assert log == ['a', 'b'] * 2 + ['sync', 'a', 'sync', 'sync', 'b', 'sync'] * 2
    assert [line.split()[:2] for line in bench.NOISY] == [['x', 'a']] * 2


def test_each_number_is_filed_under_its_own_name(monkeypatch):
    """Each section's rows and table carry each case's own seconds (stand-in timings: a weight per case,
    times n^1.5, times 10 for a backward pass): no value under another's name, ratios softmax over TSSA at
    the same n, the fitted exponent 1.5, rates of the tokens each case made; the limit's columns time what
    their names say."""
    weight = dict(causal_tssa=2, tssa=3, sdpa_causal=5, sdpa=7, softmax=11, recurrent=13, rerun=17,
                  shift_recurrent=19, softmax_kv=23, hybrid=29, proj_s=2, tssa_s=5)

    def seconds(key, label):
        n = int(re.findall(r'\d+', label)[-1])
        return weight.get(key, 1) * n ** 1.5 * (10 if 'bwd' in label else 1)
    timed = {}

    def interleaved(cases, reps, device, warmup=1, label=''):
        timed[label] = cases
        return {k: seconds(k, label) for k in cases}
    tables = {}

    def table(results, title, columns, rows):
        assert all(len(r) == len(columns) for r in rows)
        tables[title.split()[0]] = [dict(zip(columns, r)) for r in rows]

    def make_op(kind, n, device, dtype, backward, **how):
        return SimpleNamespace(**dict(dict(fused=False, triton=False, readable=False, kind=kind), **how))
    trained = []

    def make_model(attn, n, device, dtype, mode, train=False):
        trained.append(train)
    monkeypatch.setattr(bench, 'make_model', make_model)
    monkeypatch.setattr(bench, 'make_op', make_op)
    monkeypatch.setattr(bench, 'interleaved', interleaved)
    monkeypatch.setattr(bench, 'table', table)
    monkeypatch.setattr(bench, 'compiles_here', lambda device: True)
    monkeypatch.setitem(bench.SIZES, 'smoke', dict(bench.SIZES['smoke'], op_n=[1024, 2048, 4096]))
    args = argparse_like(device='cpu', mode='smoke')
    res = {}
    for section in ('operator', 'model', 'generation', 'training', 'limit'):
        bench.SECTIONS[section](args, res)
    for r, cells in zip(res['operator'], tables['Operator:']):
        n = f"{r['n']}"
        assert (r['fwd_s'], r['fwdbwd_s']) == (seconds(r['op'], n), seconds(r['op'], n + ' bwd'))
        pair = dict(sdpa_causal='causal_tssa', sdpa='tssa').get(r['op'])
        assert cells['softmax/TSSA fwd+bwd'] == (f"{weight[r['op']] / weight[pair]:.1f}x" if pair else '')
    fitted = dict.fromkeys(['causal_tssa', 'tssa', 'sdpa_causal', 'sdpa'], 1.5)
    assert res['operator_exponent'] == pytest.approx(fitted)
    for r, cells in zip(res['model']['rows'], tables['Model']):
        n = f"{r['n']}"
        assert (r['tssa_s'], r['softmax_s']) == (seconds('tssa', n), seconds('softmax', n))
        assert cells['TSSA / softmax time'] == f"{3 / 11:.2f}x"
    assert bench.ratio(1, 2) == '0.50x'
    assert bench.ratio(1, float('nan')) == bench.ratio(float('nan'), 1) == '-'
    new = bench.SIZES['smoke']['gen_new']
    for r in res['generation']:
        ctx = f"{r['ctx']}"
        assert r['rerun'] == max(2, new // 8) / seconds('rerun', ctx)
        for k in ('recurrent', 'shift_recurrent', 'softmax_kv', 'hybrid'):
            assert r[k] == new / seconds(k, ctx)
    shown = f"{new / 13 / (max(2, new // 8) / 17):.1f}x"
    assert all(c['recurrent / re-run'] == shown for c in tables['Generation'])
    r, = res['training']
    assert r['tssa_tok_s'] == 64 / seconds('tssa', '64')
    assert r['softmax_tok_s'] == 64 / seconds('softmax', '64')
    assert tables['Training'][0]['TSSA / softmax'] == f"{11 / 3:.2f}x"
    # the limit's overhead: a layer's time over the projections', less 1
    assert all(c['TSSA'].endswith('(+1.50x)') for c in tables['The'])
    assert trained == [False] * 4 + [True] * 2          # the model's forwards, then training steps
    # The limit: every column runs the layer its name says, compiled where it says, the causal ones on the
    # fused core, the Triton core or else the readable lines.
    limits = [cases for label, cases in timed.items() if re.match(r'\d+x', label)]
    assert limits and all(cases.keys() == bench.LIMIT.keys() - {'causal_triton_s'} for cases in limits)
    for k, op in limits[0].items():
        causal = k.startswith('causal')
        assert op.kind == ('proj' if k == 'proj_s' else 'causal_tssa' if causal else 'tssa')
        assert op.compile == ('compiled' in k)
        assert (op.fused, op.triton) == ('fast' in k, 'triton' in k)
        assert op.readable == (causal and not op.fused and not op.triton)


def test_a_cpu_memory_child_measures_the_case_as_timed(monkeypatch):
    """On a CPU each case's memory is measured in a fresh process: compiled under --compile, as timed."""
    measured = []

    def child(cmd, **kwargs):
        # A fresh process: bench as imported, then the command's code.
        monkeypatch.setattr(bench, 'COMPILE', False)
        monkeypatch.setattr(bench, 'measure_memory', lambda *a, **kw: measured.append(bench.COMPILE) or 1.0)
        exec(cmd[-1], {})
        return SimpleNamespace(returncode=0, stdout='1.0\n')
    measure = bench.measure_memory
    monkeypatch.setattr(bench.subprocess, 'run', child)
    for compile in (True, False):
        monkeypatch.setattr(bench, 'COMPILE', compile)
        assert measure(dict(kind='tssa', n=8), 'cpu') == 1.0
    assert measured == [True, False]


def test_a_memory_child_that_fails_is_said(monkeypatch, capsys):
    """A CPU case whose child process fails (killed for memory, an error) is one line naming the case, not a
    silent '-' that reads as not measured."""
    failed = SimpleNamespace(returncode=-9, stdout='', stderr='')
    monkeypatch.setattr(bench.subprocess, 'run', lambda cmd, **kwargs: failed)
    assert math.isnan(bench.measure_memory(dict(kind='tssa', n=8), 'cpu'))
    said = [line for line in capsys.readouterr().out.splitlines() if 'tssa' in line]
    assert len(said) == 1 and '-9' in said[0]
    # the child's own words as they are: torch's out-of-memory line, a bracket rich would read as a tag
    oom = '[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory [/x]'
    failed.returncode, failed.stderr = 1, f'Traceback\nRuntimeError: {oom}\n'
    assert math.isnan(bench.measure_memory(dict(kind='tssa', n=8), 'cpu'))
    assert oom in capsys.readouterr().out


def test_gpu_check_times_each_column_on_the_path_its_name_says():
    """tools.gpu_check's layer and training columns: the Triton core only where the name says, the readable
    lines else, causal SDPA and GPT-2 softmax, training steps; ms, and tokens/s of the whole batch."""
    from tools import gpu_check
    timed = []

    def interleaved(cases, reps, device, label=''):
        timed.append(cases)
        return dict.fromkeys(cases, 0.002)
    fake = SimpleNamespace(make_op=lambda **spec: spec, make_model=lambda attn, **spec: dict(spec, attn=attn),
                           interleaved=interleaved, measure_memory=lambda spec, device: 1.0)
    args = SimpleNamespace(device='cuda', dtype='bfloat16', mode='smoke')
    sizes = dict(width=32, heads=4, layer=[(2, 32)], training=[(3, 16)])
    row, = gpu_check.layer_times(fake, args, sizes)
    assert row == dict(batch=2, n=32, readable_ms=2.0, triton_ms=2.0, sdpa_ms=2.0, readable_mb=1.0,
                       triton_mb=1.0, sdpa_mb=1.0)
    row, = gpu_check.training(fake, args, sizes)
    assert row == dict(batch=3, n=16, tost_triton_tok_s=24e3, tost_readable_tok_s=24e3, gpt2_tok_s=24e3)
    layer, step = timed
    assert all((s['batch'], s['n'], s['backward']) == (2, 32, True) for s in layer.values())
    assert all((s['batch'], s['n'], s['train']) == (3, 16, True) for s in step.values())
    assert [s['kind'] for s in layer.values()] == ['causal_tssa', 'causal_tssa', 'sdpa_causal']
    assert [s['attn'] for s in step.values()] == ['tssa', 'tssa', 'softmax']
    for cases in timed:
        assert [s.get('triton', False) for s in cases.values()] == ['triton' in k for k in cases]
    assert layer['readable']['readable'] is True
    # equality: the float64 reference on the readable lines, then in each precision the core, then the lines
    paths = []
    fake.autocast = bench.autocast
    fake.causal_path = lambda device, **path: paths.append(path) or contextlib.nullcontext()
    rows = gpu_check.equality(fake, 'cpu', dict(sizes, equality=[(1, 8)]))
    assert paths[::2] == paths[1::2] == [dict(readable=True)] + [dict(triton=True), dict(readable=True)] * 2
    half = len(rows) // 2
    assert [r['dtype'] for r in rows] == ['bfloat16'] * half + ['float32'] * half
    assert [r['tensor'] for r in rows[:2]] == ['y', 'x'] and len({r['tensor'] for r in rows}) == half
