"""
The commands the README, the pages under docs/ and the scripts' --help texts show, run as written, so that
they cannot drift away from the code. Offline, in a temp folder, in seconds. Commands that would train
for minutes get tiny sizes appended (a later --key=value wins; the command's own keys still parse and act).
Commands that need the network, a GPU, several processes or hours are in SKIP with the reason. A command
added to the docs fails test_every_documented_command_is_known until it is put in RUN or SKIP.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.error
from pathlib import Path

import pytest

import eval_gpt
import plot
import prepare_data
import readers
import sample
import train_common
import train_gpt
import train_vit
from test_prepare_data import make_cifar
from test_train_gpt import read_log
from conftest import REPO
from tools import bench, gpu_check, study


TINY_GPT = ('--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=4',
            '--max_iters=20', '--eval_interval=500', '--eval_iters=2', '--device=cpu')
# 2000 tiny iterations take a minute; the cosine cannot end before the demo's warmup of 50 does
LONGER = ('--max_iters=40', '--lr_decay_iters=40', '--warmup_iters=4')
SHORT = ('--max_new_tokens=30',)
TINY_VIT = ('--model=tost-cifar-tiny', '--epochs=1', '--steps_per_epoch=2', '--batch_size=8', '--device=cpu',
            '--viz_images=1', '--compression_images=8')

# (command as documented, what is appended), run in this order in one folder
RUN = [
    ('python prepare_data.py python_stdlib', ('--max_mb=2',)),      # eval_gpt.py reads all of val.bin
    ('python train_gpt.py', TINY_GPT),
    ('python train_gpt.py --init_from=resume --max_iters=2000 --lr_decay_iters=2000', LONGER),
    ('python train_gpt.py --init_from=resume', ()),                   # done: nothing to do, says so
    ('python plot.py out docs/demo-log.jsonl', ()),
    ('python plot.py out docs/demo-log.jsonl --out=compare.png', ()),
    ('python train_gpt.py --attn=softmax --out_dir=out-softmax', TINY_GPT),
    ('python train_gpt.py --token_shift=true --out_dir=out-shift', TINY_GPT),
    ('python train_gpt.py --softmax_layers=-1 --token_shift=true --out_dir=out-hybrid', TINY_GPT),
    ('python plot.py out out-shift out-hybrid', ()),
    ('python plot.py out out-shift out-softmax', ()),
    ('python plot.py out docs/demo-log.jsonl --x=seconds', ()),
    ('python plot.py out-study/study.json', ()),
    ('python plot.py docs/bench.json --out_dir=docs', ()),
    ('python plot.py docs/tasks.json --out_dir=docs', ()),
    ('python sample.py --out_dir=out-shift --start="def " --seed=1 --temperature=0.8', SHORT),
    ('python sample.py --out_dir=out-hybrid --start="def " --seed=1 --temperature=0.8', SHORT),
    ('python eval_gpt.py --datasets=python_stdlib', ('--batch_size=256',)),  # all of val.bin: big batches
    ('python sample.py', SHORT),
    ('python sample.py --start="def fibonacci(n):" --num_samples=1 --max_new_tokens=2000',
     ('--max_new_tokens=100',)),                                    # still past block_size (32)
    ('python sample.py --start=FILE:prompt.txt --temperature=0.7 --top_k=50 --seed=7', SHORT),
    ('python sample.py --start=FILE:prompt.txt --top_k=50', SHORT),
    ('python sample.py --out_dir=out-softmax --device=cpu', SHORT),
    ('python sample.py --start="def main(" --num_samples=3 --max_new_tokens=300 --temperature=0.8 --seed=1',
     SHORT),
    ('python sample.py --start="def " --seed=1 --temperature=0.8', SHORT),
    ('python prepare_data.py shakespeare --input=input.txt --tokenizer=bytes', ()),
    ('python train_gpt.py --config=shakespeare', TINY_GPT),
    ('python prepare_data.py shakespeare --input=input.txt --tokenizer=bytes --name=shakespeare_bytes', ()),
    ('python prepare_data.py text --input=notes/ --name=notes', ()),
    ('python train_gpt.py --dataset=notes --out_dir=out-notes', TINY_GPT),
    ('python train_gpt.py --init_from=out/ckpt.pt --dataset=notes --out_dir=out-tuned', TINY_GPT),
    ('python prepare_data.py --help', ()),
]
RUN_VISION = [   # the same, for the ViT, in a folder of its own
    ('python prepare_data.py cifar10 --archive=cifar-10-python.tar.gz', ()),    # the offline form
    ('python prepare_data.py cifar100 --archive=cifar-100-python.tar.gz', ()),
    ('python train_vit.py --dataset=cifar10', TINY_VIT),
    ('python train_vit.py --dataset=cifar10 --attn=softmax --out_dir=out-vit-softmax', TINY_VIT),
    ('python train_vit.py --dataset=cifar10 --lpi=true', TINY_VIT + ('--out_dir=out-vit-lpi',)),
    ('python train_vit.py --init_from=resume', ('--epochs=2',)),
    ('python train_vit.py --init_from=best --eval_only', ('--viz_images=1',)),
    ('python train_vit.py --dataset=cifar10 --model=tost-cifar-tiny --epochs=3 --warmup_epochs=1 '
     '--device=cpu --out_dir=out-vit-tiny',
     ('--epochs=1', '--steps_per_epoch=1', '--viz_images=0', '--compression_images=0')),
]
# {why no test runs them here: the commands}
SKIP_WHY = {
    'the set-up and this test suite: .ci/run runs them': (
        'python3 -m venv .venv', '. .venv/bin/activate', 'pip install torch==2.13.0 -r requirements.txt',
        'python -m pytest -q', 'python -m pytest -q -m slow'),
    'downloads: test_prepare_data.py builds each set offline; their --archive and --input forms are run': (
        'python prepare_data.py shakespeare', 'python prepare_data.py openwebtext',
        'python prepare_data.py cifar10', 'python prepare_data.py cifar100',
        'python prepare_data.py wikitext2', 'python prepare_data.py ptb', 'python prepare_data.py lambada',
        'python prepare_data.py openwebtext --input=owt/',
        'python prepare_data.py lambada --input=lambada_test.jsonl'),
    'GPUs, nodes or days: test_train_*.py and test_eval_gpt.py run torchrun with 2 and 3 CPU processes': (
        'python eval_gpt.py --out_dir=out-owt-base',
        'torchrun --standalone --nproc_per_node=8 eval_gpt.py --out_dir=out-owt-base',
        'torchrun --standalone --nproc_per_node=8 train_gpt.py --config=owt-base',
        *(f'torchrun --nnodes=2 --node_rank={node} --nproc_per_node=8 --master_addr=10.0.0.1 '
          '--master_port=29500 train_gpt.py --config=owt-base --batch_size=6 --gradient_accumulation_steps=80'
          for node in (0, 1)),
        'torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=10.0.0.1 --master_port=29500 '
        'train_vit.py --dataset=cifar100 --model=tost-s',
        'torchrun --nnodes=2 --node_rank=1 --nproc_per_node=8 --master_addr=10.0.0.1 --master_port=29500 '
        'train_vit.py --dataset=cifar100 --model=tost-s',
        'torchrun --standalone --nproc_per_node=4 train_vit.py --dataset=cifar100 --model=tost-s',
        'torchrun train_gpt.py --compile=true', 'torchrun --standalone --nproc_per_node=1 train_gpt.py',
        'torchrun --standalone --nproc_per_node=8 train_gpt.py --config=owt-base --attn=softmax '
        '--out_dir=out-owt-softmax',
        'python sample.py --out_dir=out-owt-base --start="The meaning of life" --num_samples=3 '
        '--max_new_tokens=200',
        'python -m tools.bench --device=cuda --dtype=bfloat16 --json=bench.json',
        'python -m tools.bench --device=cuda --dtype=bfloat16 --compile --sections=operator,model',
        'python -m tools.bench --device=cuda --dtype=bfloat16 --sections=limit',
        'python -m tools.gpu_check --json=docs/gpu-check.json',
        'python train_gpt.py --n_layer=12 --n_head=12 --n_embd=768 --block_size=1024 --batch_size=16 '
        '--learning_rate=6e-4 --warmup_iters=10 --max_iters=60 --lr_decay_iters=60 --eval_interval=60 '
        '--eval_iters=5 --attn=tssa --compile=true'),
    'minutes to hours: test_bench.py, test_study.py and test_triton.py run their smoke modes': (
        'python -m tools.bench', 'python -m tools.bench --json=docs/bench.json',
        'python -m tools.bench --quick',
        'python -m tools.bench --sections=operator,limit', 'python -m tools.bench --sections=limit',
        'python -m tools.study language', 'python -m tools.study language --json=docs/language.json',
        'python -m tools.study vision', 'python -m tools.study vision --json=docs/vision.json',
        'python -m tools.study tasks', 'python -m tools.study tasks --json=docs/tasks.json',
        'python -m tools.study tasks --quick', 'python -m tools.study language,tasks --json=study.json',
        'python -m tools.study language,vision,tasks', 'python -m lecture.recall',
        'python -m tools.mutate_lecture'),
    'test_tost.py and tests/test_lecture.py run them, into temp folders (here they would rewrite docs/)': (
        'python derivation.py', 'python derivation.py --figures=docs', 'python derivation.py --figures=DIR',
        'python tools/lecture_page.py', 'python -m lecture.exercises'),
    'a template (<run>: a row of the language study, which runs it for each row)': (
        'python sample.py --out_dir=out-study/language-<run> --start="def " --seed=1 --temperature=0.8 '
        '--max_new_tokens=160 --num_samples=1',),
}
SKIP = {command: why for why, commands in SKIP_WHY.items() for command in commands}
SCRIPTS = {'train_gpt.py': train_gpt.main, 'train_vit.py': train_vit.main, 'sample.py': sample.main,
           'prepare_data.py': prepare_data.main, 'eval_gpt.py': eval_gpt.main, 'plot.py': plot.main}
# their docstrings are their --help
HELP = (train_gpt, train_vit, sample, prepare_data, eval_gpt, plot, bench, study, gpu_check)
PAGES = sorted(os.listdir(os.path.join(REPO, 'docs')))
DOCS = ['README.md'] + [f'docs/{f}' for f in PAGES if f.endswith('.md')]


def commands_in(line):
    """The commands of one line: the comment dropped, `a && b` split."""
    line = re.sub(r'\s+#.*$', '', line).strip()
    return [c.strip() for c in line.split('&&') if c.strip()]


def documented():
    """{command: where} for every command the help texts, the README and the docs pages show."""
    found = {}
    for module in HELP:
        for line in module.__doc__.replace('\\\n', ' ').splitlines():    # join `\` continuations
            if line.strip().startswith(('python ', 'torchrun ')):
                where = f'{os.path.relpath(module.__file__, REPO)} --help'
                found.update({re.sub(r'\s+', ' ', c): where for c in commands_in(line)})
    for page in DOCS:
        with open(os.path.join(REPO, page), encoding='utf-8') as f:
            text = f.read()
        # code blocks: commands, or what they print
        for block in re.findall(r'```\n(.*?)```', text, re.S):
            for line in block.replace('\\\n', ' ').splitlines():
                line = re.sub(r'^([A-Z_]+=\S* )+', '', line)          # TOST_TRITON=0 python ...: the command
                if line.startswith(('python', 'torchrun ', 'pip ', '. ')):
                    found.update({re.sub(r'\s+', ' ', c): page for c in commands_in(line)})
        # inline commands in the prose (TOST_TRITON=0 or OMP_NUM_THREADS=1 before some; torchrun's naming a
        # script)
        for span in re.findall(r'`(?:[A-Z_]+=\S* )*(python [^`]+|torchrun [^`]*\.py[^`]*)`', text):
            found[re.sub(r'\s+', ' ', span)] = page
    return found


def test_every_documented_command_is_known():
    docs, run = documented(), {c for c, _ in RUN + RUN_VISION}
    unknown = {c: where for c, where in docs.items() if c not in run and c not in SKIP}
    assert not unknown, f"commands in the docs that no test runs (add them to RUN or SKIP): {unknown}"
    stale = set(SKIP) - set(docs)
    assert not stale, f"SKIP names commands the docs no longer show: {stale}"
    assert 'python train_gpt.py --init_from=resume --max_iters=2000 --lr_decay_iters=2000' in docs


def run(cmd, extra=()):
    argv = shlex.split(cmd)
    assert argv[0] == 'python' and argv[1] in SCRIPTS, cmd
    try:
        SCRIPTS[argv[1]](argv[2:] + list(extra))
    except SystemExit as e:                                        # prepare_data.main exits on errors
        assert e.code in (0, None), f"{cmd}: exit {e.code}"


def offline(monkeypatch):
    """No network, whatever the machine: tiktoken's vocabulary and downloads fail as they do here."""
    def no_vocab():
        raise train_common.UsageError("could not load the GPT-2 vocab (offline in this test)")

    def no_download(*a, **k):
        raise urllib.error.URLError('offline in this test')
    monkeypatch.setattr(readers, 'gpt2_encoding', no_vocab)
    monkeypatch.setattr(prepare_data.urllib.request, 'urlopen', no_download)


def test_documented_commands_run_offline(tmp_path, monkeypatch, capsys):
    offline(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'input.txt').write_text('First Citizen:\nBefore we proceed any further, hear me.\n\n' * 300)
    (tmp_path / 'notes').mkdir()
    (tmp_path / 'notes' / 'a.txt').write_text('Some notes of mine.\n' * 200)
    (tmp_path / 'prompt.txt').write_text('def main():\n')
    (tmp_path / 'docs').mkdir()
    for f in ('demo-log.jsonl', 'bench.json', 'tasks.json'):            # what the docs' plot.py commands read
        shutil.copy(os.path.join(REPO, 'docs', f), tmp_path / 'docs')
    (tmp_path / 'out-study').mkdir()
    shutil.copy(os.path.join(REPO, 'docs', 'tasks.json'), tmp_path / 'out-study' / 'study.json')
    for cmd, extra in RUN:
        run(cmd, extra)
    out = capsys.readouterr()
    # what the commands promised: the resume trained on with the stretched schedule, sampling said its speed
    ckpt = train_common.load_checkpoint('out/ckpt.pt')
    assert ckpt['iter_num'] == 40 and ckpt['config']['lr_decay_iters'] == 40
    # of 1 block
    assert train_common.load_checkpoint('out-hybrid/ckpt.pt')['model_args']['softmax_layers'] == [0]
    assert out.err.count('tokens/s') == sum(c.startswith('python sample.py') for c, _ in RUN)


def test_documented_vision_commands_run_offline(tmp_path, monkeypatch):
    offline(monkeypatch)
    monkeypatch.chdir(tmp_path)
    make_cifar(tmp_path / 'cifar-10-python.tar.gz', 'cifar10', n=12)
    make_cifar(tmp_path / 'cifar-100-python.tar.gz', 'cifar100', n=4)
    for cmd, extra in RUN_VISION:
        run(cmd, extra)
    assert os.path.isfile('out-vit/best.pt') and os.path.isfile('out-vit-tiny/ckpt.pt')
    assert [r['epoch'] for r in read_log('out-vit', kind='eval')] == [1, 2]


def test_error_messages_name_commands_that_work(tmp_path, monkeypatch, capsys):
    """The shakespeare preset offline, and a run from scratch into a used out_dir: each error names a command;
    run it as printed."""
    offline(monkeypatch)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(train_common.UsageError) as e:
        train_gpt.main(['--config=shakespeare'])
    # offline, as printed: a download or GPT-2's vocabulary would fail it
    advice = str(e.value)[str(e.value).index('python prepare_data.py'):]
    (tmp_path / 'input.txt').write_text('Now is the winter of our discontent\n' * 500)
    run(advice)
    run('python train_gpt.py --config=shakespeare', TINY_GPT)
    printed = capsys.readouterr().out
    sample_command = printed[printed.index('python sample.py'):].splitlines()[0]
    run(sample_command, ('--num_samples=1', '--max_new_tokens=20'))

    # the same command again: refused, in one line naming both ways forward; each of them works
    before = (tmp_path / 'out-shakespeare' / 'ckpt.pt').read_bytes()
    with pytest.raises(train_common.UsageError) as e:
        train_gpt.main(['--config=shakespeare', *TINY_GPT])
    names = ('out-shakespeare/ckpt.pt', '--init_from=resume', '--out_dir', '--overwrite=true')
    assert all(name in str(e.value) for name in names)
    assert (tmp_path / 'out-shakespeare' / 'ckpt.pt').read_bytes() == before
    train_gpt.main(['--config=shakespeare', *TINY_GPT, '--init_from=resume', '--max_iters=25'])
    assert train_common.load_checkpoint('out-shakespeare/ckpt.pt')['iter_num'] == 25
    train_gpt.main(['--config=shakespeare', *TINY_GPT, '--overwrite=true', '--max_iters=5'])
    assert train_common.load_checkpoint('out-shakespeare/ckpt.pt')['iter_num'] == 5
    rows = read_log('out-shakespeare')
    # a fresh log
    assert rows[0]['iter'] == 0 and rows[-1]['iter'] == 5


def test_every_test_docs_tests_md_names_exists():
    """docs/tests.md names the test that checks each claim: a test renamed or deleted leaves it unchecked."""
    page = Path(REPO, 'docs', 'tests.md').read_text(encoding='utf-8')
    files = [Path(REPO, 'test_tost.py'), *Path(REPO, 'tests').glob('test_*.py')]
    source = ''.join(f.read_text(encoding='utf-8') for f in files)
    tests = set(re.findall(r'def (test_\w+)\(', source))
    # file::name is name; a name cut short (test_a_..., test_softmax_layers_*) stands for the tests it begins
    named = {n.split('::')[-1] for n in re.findall(r'`(test_[\w*:.]+)`', page) if not n.endswith('.py')}
    cut = {n for n in named if n.endswith(('...', '*'))}
    missing = {n for n in named - cut if n not in tests}
    missing |= {n for n in cut if not any(t.startswith(n.rstrip('.*')) for t in tests)}
    assert missing == set()


@pytest.mark.slow
def test_every_tool_runs_by_its_path_as_well(tmp_path):
    """`python tools/bench.py` as well as `python -m tools.bench`, from any folder: each script under tools/
    and lecture/ finds the repository's modules."""
    found = [*Path(REPO, 'tools').glob('*.py'), *Path(REPO, 'lecture').glob('*.py')]
    scripts = [p for p in found if "__name__ == '__main__'" in p.read_text(encoding='utf-8')]
    assert len(scripts) >= 9
    runs = [subprocess.Popen([sys.executable, str(p), '--help'], cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True) for p in scripts]
    for p, run in zip(scripts, runs):
        assert run.wait(timeout=300) == 0, (p, run.stderr.read()[-2000:])
