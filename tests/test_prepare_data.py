"""
Tests for prepare_data.py. Offline and small: CIFAR tarballs are built here with the real pickle
layout, the gpt2 path uses a 257-token tiktoken Encoding, openwebtext reads a folder of jsonl/txt.
    python -m pytest -q tests/test_prepare_data.py
"""
import contextlib, hashlib, io, json, os, pickle, signal, socket, subprocess, sys, sysconfig, tarfile, time
import urllib.error, zipfile
from pathlib import Path
import numpy as np
import pytest
import tiktoken

import options
import prepare_data as prep
import readers
from options import UsageError
from prepare_data import get_tokenizer, load_meta, prepare, read_images, read_tokens

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def encoding(merges=()):
    """A tiny offline stand-in for GPT-2's BPE: the 256 bytes, the given merges, then <|endoftext|>."""
    ranks = {bytes([i]): i for i in range(256)} | {m: 256 + i for i, m in enumerate(merges)}
    return tiktoken.Encoding(name='tiny', pat_str=PAT, mergeable_ranks=ranks,
                             special_tokens={'<|endoftext|>': len(ranks)})


@pytest.fixture
def tiny(monkeypatch):
    """gpt2 means the tiny encoding for the length of a test: no download."""
    enc = encoding()
    monkeypatch.setattr(readers, 'gpt2_encoding', lambda: enc)
    return enc


def read_bin(path):
    return np.fromfile(path, dtype=np.uint16)


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, os.path.join(REPO, 'prepare_data.py'), *args],
                          capture_output=True, text=True, cwd=cwd, timeout=60)


def main_exits(capsys, *argv):
    """prepare_data.main as the command runs it: (exit code, the lines on stderr)."""
    try:
        options.run_main(lambda: prep.main(list(argv)))
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err.strip().splitlines()


def assert_clean_error(r, *words):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith('error:'), r.stderr
    assert 'Traceback' not in r.stderr + r.stdout
    for w in words:
        assert w in lines[0], lines[0]

# -----------------------------------------------------------------------------
# tokenizers


def test_bytes_tokenizer():
    tok = get_tokenizer('bytes')
    s = 'déjà vu ✓\n'
    assert (tok.name, tok.vocab_size, tok.eot) == ('bytes', 256, None)
    assert tok.encode(s) == list(s.encode('utf-8'))
    assert tok.decode(tok.encode(s)) == s
    assert tok.decode(np.array([0xE2, 0x9C, 65])) == '\ufffdA'  # a cut-off character is replaced, not raised
    assert len(tok.decode(range(256))) > 0
    assert [tok.token_bytes(t) for t in tok.encode('é')] == [b'\xc3', b'\xa9']
    assert tok.token_bytes(300) == b''  # an id from a padded head (bytes pad 256 to 256: none, but said once)
    with pytest.raises(UsageError, match='unknown tokenizer'):
        get_tokenizer('sentencepiece')


def test_gpt2_tokenizer_injected(tiny):
    for tok in (get_tokenizer('gpt2'), get_tokenizer('gpt2', encoding=encoding())):
        assert (tok.name, tok.vocab_size, tok.eot) == ('gpt2', 257, 256)
        s = "it's 42 <|endoftext|> é"
        assert tok.encode(s) == tiny.encode_ordinary(s)  # special tokens in text stay text
        assert tok.decode(tok.encode(s)) == s
        tok.decode(list(range(257)))  # every id decodes
        assert tok.decode([104, 105, 50300]) == 'hi'  # an id from a padded head does not crash sampling
        assert b''.join(tok.token_bytes(t) for t in tok.encode('é')) == 'é'.encode()
        assert tok.token_bytes(300) == b''  # streamed sampling of a padded head's id: nothing, not a KeyError


def test_gpt2_without_network_says_so(monkeypatch):
    def offline(name):
        raise ConnectionError('Name or service not known')
    monkeypatch.setattr(tiktoken, 'get_encoding', offline)
    with pytest.raises(UsageError, match='TIKTOKEN_CACHE_DIR'):
        get_tokenizer('gpt2')


def test_vocab_must_fit_uint16():
    class Big:
        n_vocab, eot_token = 70000, 0
    with pytest.raises(UsageError, match='uint16'):
        get_tokenizer('gpt2', encoding=Big())


def test_a_dataset_not_prepared_names_a_command_that_makes_it(tmp_path, capsys):
    """readers names the command for the folder's name; run as printed, prepare_data.py makes a built-in dataset,
    and for any other name answers with the text command (run here as printed, with a file for PATH)."""
    with pytest.raises(UsageError, match=f'run: python prepare_data.py shakespeare --data_dir={tmp_path}$'):
        load_meta(tmp_path / 'shakespeare')
    with pytest.raises(UsageError) as e:
        load_meta(tmp_path / 'notes')
    code, err = main_exits(capsys, *str(e.value).split('run: ')[1].split()[2:])
    assert code == 2 and len(err) == 1
    command = err[0].split('; ')[-1].split(' (')[0].replace('PATH', str(tmp_path / 'notes.txt'))
    (tmp_path / 'notes.txt').write_text('my own notes. ' * 20)
    assert main_exits(capsys, *command.split()[2:]) == (0, [])
    assert load_meta(tmp_path / 'notes')['kind'] == 'text'
    with pytest.raises(UsageError, match='notes holds text, not images'):
        load_meta(tmp_path / 'notes', 'images')


def test_a_data_dir_that_takes_no_files_is_one_line(capsys):
    """/proc refuses a new folder even to root: one line naming --data_dir, before any work."""
    code, err = main_exits(capsys, 'python_stdlib', '--data_dir=/proc')
    assert code == 2 and err == ['error: cannot write in --data_dir=/proc (No such file or directory); choose a '
                                 'folder you can write to']


def test_a_data_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    """--data_dir=README.md: one line naming it, nothing prepared into it, whether reading or preparing."""
    (tmp_path / 'README.md').write_text('a file')
    code, err = main_exits(capsys, 'python_stdlib', f'--data_dir={tmp_path / "README.md"}')
    assert code == 2 and len(err) == 1 and f'{tmp_path}/README.md' in err[0]
    for data_dir in (tmp_path / 'README.md', tmp_path / 'README.md' / 'sub'):
        with pytest.raises(SystemExit, match='2'):
            options.run_main(lambda: load_meta(data_dir / 'python_stdlib'))
        assert f'{tmp_path}/README.md' in capsys.readouterr().err
        with pytest.raises(UsageError, match=f'{tmp_path}/README.md is a file, not a folder; give --data_dir a folder'):
            prepare('python_stdlib', data_dir, max_mb=0.01)
    (tmp_path / 'data').mkdir()
    (tmp_path / 'data' / 'notes').write_text('a file where the dataset folder would go')
    with pytest.raises(UsageError, match='notes is a file, not a folder'):
        prepare('text', tmp_path / 'data', input=str(tmp_path / 'README.md'), name='notes')
    assert sorted(os.listdir(tmp_path)) == ['README.md', 'data'] and os.listdir(tmp_path / 'data') == ['notes']


def test_a_damaged_split_names_the_command_that_rebuilds_it(tmp_path, capsys):
    """A train.bin cut short (or by one byte), a missing val.bin: one line each, whose command rebuilds it."""
    (tmp_path / 'in.txt').write_text('hello there. ' * 20)
    out = prepare('text', tmp_path / 'data', input=str(tmp_path / 'in.txt'), name='mine')
    meta = load_meta(out)
    with open(os.path.join(out, 'train.bin'), 'ab') as f:
        f.write(b'x')                                                      # an odd number of bytes
    with pytest.raises(UsageError, match=r'train.bin has 469 bytes \(odd\), not the 234 tokens its meta.json says; '
                                         r'rebuild it: python prepare_data.py text --name=mine'):
        read_tokens(out, meta, 'train')
    os.remove(os.path.join(out, 'val.bin'))
    with pytest.raises(UsageError, match='val.bin is missing, not the 26 tokens') as e:
        read_tokens(out, meta, 'val')
    command = str(e.value).split('rebuild it: ')[1]
    assert command.endswith('--force')
    assert main_exits(capsys, *command.split()[2:], f'--input={tmp_path / "in.txt"}') == (0, [])
    assert len(read_tokens(out, meta, 'train')) == 234 and len(read_tokens(out, meta, 'val')) == 26
    (tmp_path / 'images').mkdir()
    with pytest.raises(UsageError, match='rebuild it: python prepare_data.py cifar10 --name=images --data_dir='):
        read_images(tmp_path / 'images', {'kind': 'images', 'dataset': 'cifar10'})

# -----------------------------------------------------------------------------
# text


def test_text_file(tmp_path):
    text = 'First Citizen:\nBefore we proceed any further, hear me speak. ✓\n' * 3
    (tmp_path / 'speech.txt').write_text(text, encoding='utf-8')
    out = prepare('text', tmp_path / 'data', input=str(tmp_path / 'speech.txt'))
    assert out == os.path.join(tmp_path / 'data', 'speech')  # --name defaults to the file's stem
    raw = text.encode('utf-8')
    cut = len(raw) - len(raw) // 10
    assert bytes(read_bin(os.path.join(out, 'train.bin')).astype(np.uint8)) == raw[:cut]
    assert bytes(read_bin(os.path.join(out, 'val.bin')).astype(np.uint8)) == raw[cut:]
    meta = load_meta(out)
    assert meta['kind'] == 'text' and meta['tokenizer'] == 'bytes' and meta['vocab_size'] == 256
    assert (meta['train_tokens'], meta['val_tokens']) == (cut, len(raw) - cut)
    assert meta['name'] == 'speech' and 'speech.txt' in meta['source'] and '1/10' in meta['split']
    assert sorted(os.listdir(tmp_path / 'data')) == ['speech']  # no staging folder left behind


def test_text_folder_sorted_recursive(tmp_path, tiny):
    docs = {'b.txt': 'bee bee', 'a/z.txt': 'zed zed zed', 'a/m/q.txt': 'queue', 'a-c.md': 'see', '.hidden': 'no'}
    for rel, s in docs.items():
        (tmp_path / 'notes' / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / 'notes' / rel).write_text(s * 5)
    out = prepare('text', tmp_path / 'data', input=str(tmp_path / 'notes'), name='mynotes', tokenizer='gpt2')
    train, val = [], []
    for rel in ['a/m/q.txt', 'a/z.txt', 'a-c.md', 'b.txt']:  # sorted by path components, hidden skipped
        ids = tiny.encode_ordinary(docs[rel] * 5)
        cut = len(ids) - len(ids) // 10
        train += ids[:cut] + [256]  # eot after each document's part, in both streams
        val += ids[cut:] + [256] if ids[cut:] else []
    assert read_bin(os.path.join(out, 'train.bin')).tolist() == train
    assert read_bin(os.path.join(out, 'val.bin')).tolist() == val
    meta = load_meta(out)
    assert (meta['tokenizer'], meta['vocab_size'], meta['documents']) == ('gpt2', 257, 4)


def test_not_utf8_warns_with_file_name(tmp_path, capsys):
    (tmp_path / 'latin1.txt').write_bytes('café au lait, '.encode('latin-1') * 10)
    out = prepare('text', tmp_path / 'data', input=str(tmp_path / 'latin1.txt'))
    err = capsys.readouterr().err
    assert 'warning:' in err and 'latin1.txt' in err and 'UTF-8' in err
    data = bytes(read_bin(os.path.join(out, 'train.bin')).astype(np.uint8))
    assert 'caf\ufffd au lait'.encode('utf-8') in data


def test_text_skips_binary_files_and_refuses_a_folder_of_them(tmp_path, capsys):
    (tmp_path / 'bin').mkdir()
    for i in range(3):
        (tmp_path / 'bin' / f'blob{i}.so').write_bytes(bytes(range(256)) * 4)
    code, err = main_exits(capsys, 'text', f'--input={tmp_path / "bin"}', f'--data_dir={tmp_path / "data"}')
    assert code == 2 and len(err) == 1 and 'holds no text: its 3 file(s) are binary' in err[0], err
    assert not (tmp_path / 'data').exists()
    (tmp_path / 'bin' / 'readme.txt').write_text('words, not bytes. ' * 30)
    out = prepare('text', tmp_path / 'data', input=str(tmp_path / 'bin'))
    err = capsys.readouterr().err
    assert err.count('warning:') == 1 and 'skipped 3 binary file(s)' in err and 'blob0.so' in err
    raw = ('words, not bytes. ' * 30).encode()
    assert load_meta(out)['documents'] == 1 and load_meta(out)['train_tokens'] == len(raw) - len(raw) // 10


def test_shakespeare_gpt2_from_local_copy(tmp_path, tiny):
    text = 'ROMEO:\nBut, soft! what light through yonder window breaks?\n' * 4
    (tmp_path / 'input.txt').write_text(text)
    out = prepare('shakespeare', tmp_path / 'data', input=str(tmp_path / 'input.txt'))
    meta = load_meta(out)
    assert meta['tokenizer'] == 'gpt2' and meta['vocab_size'] == 257  # gpt2 is shakespeare's default
    tok = get_tokenizer(meta['tokenizer'])  # the meta is enough to decode
    ids = np.concatenate([read_bin(os.path.join(out, f)) for f in ('train.bin', 'val.bin')])
    assert tok.decode(ids) == text  # one document: no eot, train then val is the whole text


def test_python_stdlib_without_a_cap(tmp_path, monkeypatch):
    root = tmp_path / 'lib'
    (root / 'json').mkdir(parents=True)
    (root / 'json' / 'a.py').write_text('x = 1\n' * 20)
    (root / 'b.py').write_text('y = 2\n' * 30)
    monkeypatch.setattr(sysconfig, 'get_paths', lambda: {'stdlib': str(root)})
    meta = load_meta(prepare('python_stdlib', tmp_path / 'data', max_mb=float('inf')))
    assert meta['documents'] == 2 and meta['train_tokens'] + meta['val_tokens'] == 6 * 50


def test_python_stdlib_small(tmp_path):
    out = prepare('python_stdlib', tmp_path, max_mb=0.3)
    meta = load_meta(out)
    assert (meta['tokenizer'], meta['vocab_size']) == ('bytes', 256)
    assert 'site-packages skipped' in meta['source']
    # the rule, restated: .py files of this Python's stdlib sorted by path, prefix under 0.3 MB
    root = sysconfig.get_paths()['stdlib']
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x not in ('site-packages', 'dist-packages', 'test', 'tests', 'idle_test')]
        files += [os.path.relpath(os.path.join(d, n), root) for n in names if n.endswith('.py')]
    files.sort(key=lambda p: p.split(os.sep))
    heads, tails, total = b'', b'', 0
    for f in files:
        raw = Path(root, f).read_bytes()
        if total + len(raw) > 0.3e6:
            break
        total += len(raw)
        raw = raw.decode('utf-8').encode('utf-8')
        heads, tails = heads + raw[:len(raw) - len(raw) // 10], tails + raw[len(raw) - len(raw) // 10:]
    assert meta['documents'] > 5 and meta['train_tokens'] + meta['val_tokens'] == total
    assert bytes(read_bin(os.path.join(out, 'train.bin')).astype(np.uint8)) == heads
    assert bytes(read_bin(os.path.join(out, 'val.bin')).astype(np.uint8)) == tails

# -----------------------------------------------------------------------------
# openwebtext: local documents, worker pool, streaming writer


def owt_folder(path):
    docs = [f'document {i}: ' + 'words and more words. ' * (i % 4 + 1) for i in range(12)]
    docs[5] = 'a literal <|endoftext|> inside a document is text'
    (path / 'sub').mkdir(parents=True)
    with open(path / 'a.jsonl', 'w') as f:
        for d in docs[:5]:
            f.write(json.dumps({'text': d, 'url': 'x'}) + '\n\n')
    (path / 'b.txt').write_text(docs[5])
    with open(path / 'sub' / 'c.jsonl', 'w') as f:
        for d in docs[6:]:
            f.write(json.dumps({'text': d}) + '\n')
    (path / 'ignored.csv').write_text('not,a,document')
    return docs


@pytest.mark.parametrize('workers', [1, 2])
def test_openwebtext_local_pool_streaming(tmp_path, tiny, monkeypatch, workers):
    docs = owt_folder(tmp_path / 'owt')
    monkeypatch.setattr(prep, '_CHUNK', 2)  # many small jobs in flight and writes, a last one half full
    out = prepare('openwebtext', tmp_path / 'data', input=str(tmp_path / 'owt'), workers=workers, val_every=4)
    train, val = [], []
    for i, d in enumerate(docs):
        (val if i % 4 == 3 else train).extend(tiny.encode_ordinary(d) + [256])
    assert read_bin(os.path.join(out, 'train.bin')).tolist() == train
    assert read_bin(os.path.join(out, 'val.bin')).tolist() == val
    meta = load_meta(out)
    assert (meta['documents'], meta['tokenizer']) == (12, 'gpt2')
    assert (meta['train_tokens'], meta['val_tokens']) == (len(train), len(val))
    assert 'every 4th document' in meta['split'] and '256' in meta['eot']


_real_split_chunk = prep._split_chunk


def die_on_doc_7(job):
    if job[0] <= 7 < job[0] + len(job[1]):
        os._exit(1)  # as the OOM killer would
    return _real_split_chunk(job)


def test_dead_worker_is_an_error_not_a_hang(tmp_path, tiny, monkeypatch):
    owt_folder(tmp_path / 'owt')
    monkeypatch.setattr(prep, '_split_chunk', die_on_doc_7)
    monkeypatch.setattr(prep, '_CHUNK', 2)
    with pytest.raises(UsageError, match='process died'):
        prepare('openwebtext', tmp_path / 'data', input=str(tmp_path / 'owt'), workers=2)
    assert not (tmp_path / 'data').exists()      # the data_dir this run created is removed again


def test_openwebtext_bad_jsonl_line(tmp_path, tiny):
    (tmp_path / 'owt').mkdir()
    (tmp_path / 'owt' / 'x.jsonl').write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    with pytest.raises(UsageError, match=r'x.jsonl:2 is not a JSON object'):
        prepare('openwebtext', tmp_path / 'data', input=str(tmp_path / 'owt'), workers=1)
    assert not (tmp_path / 'data' / 'openwebtext').exists()


class _FakeParquet:
    """Stands in for pyarrow.parquet where pyarrow is not installed: a '.parquet' file here is JSON
    {"text": [...]}, read through the same calls prepare_data makes (ParquetFile, metadata.num_rows,
    iter_batches(columns=['text']) yielding batches whose column(0).to_pylist() gives the texts)."""

    class ParquetFile:
        def __init__(self, path):
            self.texts = json.loads(Path(path).read_text())['text']
            self.metadata = type('Meta', (), {'num_rows': len(self.texts)})()

        def iter_batches(self, batch_size, columns):
            assert columns == ['text']
            for i in range(0, len(self.texts), batch_size):
                chunk = self.texts[i:i + batch_size]
                col = type('Col', (), {'to_pylist': lambda self, c=chunk: list(c)})()
                yield type('Batch', (), {'column': lambda self, j, c=col: c})()


def test_openwebtext_parquet(tmp_path, tiny, monkeypatch):
    (tmp_path / 'owt').mkdir()
    docs = [f'parquet doc {i} ' * 3 for i in range(9)]
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({'text': docs[:4]}), tmp_path / 'owt' / 'train-0.parquet')
        pq.write_table(pa.table({'text': docs[4:]}), tmp_path / 'owt' / 'train-1.parquet')
    except ImportError:
        monkeypatch.setattr(prep, "_pyarrow_parquet", lambda: _FakeParquet)
        (tmp_path / 'owt' / 'train-0.parquet').write_text(json.dumps({'text': docs[:4]}))
        (tmp_path / 'owt' / 'train-1.parquet').write_text(json.dumps({'text': docs[4:]}))
    out = prepare('openwebtext', tmp_path / 'data', input=str(tmp_path / 'owt'), workers=2, val_every=3)
    expect = [t for i, d in enumerate(docs) if i % 3 != 2 for t in tiny.encode_ordinary(d) + [256]]
    assert read_bin(os.path.join(out, 'train.bin')).tolist() == expect


def test_parquet_without_pyarrow_gives_install_hint(tmp_path, tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, 'pyarrow', None)           # as if not installed
    monkeypatch.setitem(sys.modules, 'pyarrow.parquet', None)
    (tmp_path / 'owt').mkdir()
    (tmp_path / 'owt' / 'train-0.parquet').write_bytes(b'PAR1')
    with pytest.raises(UsageError, match='pip install pyarrow'):
        prepare('openwebtext', tmp_path / 'data', input=str(tmp_path / 'owt'))

# -----------------------------------------------------------------------------
# zero-shot test sets: tiny files in the published formats

WIKI = (' \n = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 : Unrecorded Chronicles is a tactical role @-@ '
        'playing game , released in 2011 .\n \n = = Gameplay = = \n \n The game takes 1 @,@ 000 turns .\n')
PTB = (" no it was n't black monday \n but while the new york stock exchange did n't fall apart friday as the dow "
       "jones industrial average plunged N points <unk> \n")
LAMBADA = ['In my palm is a clear stone. "Figured you might need it," said Jack',
           'He looked at the stone, then at her.\n\n"Stone," she said. Stone',  # a space before the word
           'She turned the page.\n\nSilence']                                    # a newline before the word


def write_jsonl(path, texts):
    path.write_text(''.join(json.dumps({'text': t}) + '\n' for t in texts))


def test_wikitext2_raw_file_and_zip(tmp_path, tiny, capsys):
    (tmp_path / 'wiki.test.raw').write_text(WIKI, encoding='utf-8')
    with zipfile.ZipFile(tmp_path / 'wikitext-2-raw-v1.zip', 'w') as z:
        z.writestr('wikitext-2-raw/wiki.train.raw', ' = Other = \n')
        z.writestr('wikitext-2-raw/wiki.test.raw', WIKI)
    a = prepare('wikitext2', tmp_path / 'data', input=str(tmp_path / 'wiki.test.raw'))
    b = prepare('wikitext2', tmp_path / 'data', input=str(tmp_path / 'wikitext-2-raw-v1.zip'), name='wt2_zip')
    for out in (a, b):  # the file's text exactly as it is, one document, the test split as val
        assert read_bin(os.path.join(out, 'val.bin')).tolist() == tiny.encode_ordinary(WIKI)
        assert os.path.getsize(os.path.join(out, 'train.bin')) == 0
        meta = load_meta(out)
        assert (meta['dataset'], meta['tokenizer'], meta['train_tokens']) == ('wikitext2', 'gpt2', 0)
        assert meta['val_tokens'] == len(tiny.encode_ordinary(WIKI)) and 'test split' in meta['split']
    assert load_meta(a)['official_file'] is None and load_meta(b)['official_file'] is False
    assert load_meta(b)['source'].endswith('wikitext-2-raw-v1.zip:wikitext-2-raw/wiki.test.raw')
    err = capsys.readouterr().err  # a small file is not the real test set: said, not refused
    assert 'has 8 lines; the official wikitext2 test set has 4,358' in err
    assert 'sha256 differs from the official wikitext-2-raw-v1.zip' in err


def test_test_sets_take_the_unpacked_folder(tmp_path, tiny):
    """What users have after unpacking the downloads: wikitext-2-raw/ and PTB's simple-examples/data/."""
    (tmp_path / 'wikitext-2-raw').mkdir()
    (tmp_path / 'wikitext-2-raw' / 'wiki.test.raw').write_text(WIKI, encoding='utf-8')
    (tmp_path / 'wikitext-2-raw' / 'wiki.train.raw').write_text(' = Other = \n', encoding='utf-8')
    (tmp_path / 'simple-examples' / 'data').mkdir(parents=True)
    (tmp_path / 'simple-examples' / 'data' / 'ptb.test.txt').write_text(PTB)
    out = prepare('wikitext2', tmp_path / 'data', input=str(tmp_path / 'wikitext-2-raw'))
    assert read_bin(os.path.join(out, 'val.bin')).tolist() == tiny.encode_ordinary(WIKI)
    out = prepare('ptb', tmp_path / 'data', input=str(tmp_path / 'simple-examples'))
    assert read_bin(os.path.join(out, 'val.bin')).tolist() == tiny.encode_ordinary(PTB)
    (tmp_path / 'empty').mkdir()
    with pytest.raises(UsageError, match='empty is a folder without ptb.test.txt in it'):
        prepare('ptb', tmp_path / 'data', input=str(tmp_path / 'empty'), name='ptb2')


def test_ptb_kept_as_published(tmp_path, tiny):
    (tmp_path / 'ptb.test.txt').write_text(PTB)
    out = prepare('ptb', tmp_path / 'data', input=str(tmp_path / 'ptb.test.txt'))
    ids = read_bin(os.path.join(out, 'val.bin')).tolist()
    assert ids == tiny.encode_ordinary(PTB) and get_tokenizer('gpt2').decode(ids) == PTB  # <unk>, N and spaces kept
    assert load_meta(out)['official_file'] is False  # named ptb.test.txt, but not the published bytes


@pytest.mark.parametrize('form', ['jsonl', 'plain'])
def test_lambada_passages_and_targets(tmp_path, tiny, form):
    if form == 'jsonl':
        write_jsonl(tmp_path / 'lambada_test.jsonl', LAMBADA)
        src = tmp_path / 'lambada_test.jsonl'
    else:  # the original release: one tokenized passage a line
        src = tmp_path / 'lambada_test_plain_text.txt'
        src.write_text(''.join(t.replace('\n', ' ') + ' \n\n' for t in LAMBADA))  # trailing space, blank lines
    out = prepare('lambada', tmp_path / 'data', input=str(src))
    val = read_bin(os.path.join(out, 'val.bin'))
    spans = np.load(os.path.join(out, 'val_targets.npy'))
    assert spans.dtype == np.int64 and spans.shape == (3, 3)
    tok = get_tokenizer('gpt2')
    passages = LAMBADA if form == 'jsonl' else [t.replace('\n', ' ') for t in LAMBADA]
    want, stream = [' Jack', ' Stone', 'Silence' if form == 'jsonl' else ' Silence'], []
    for (p, s, e), text, word in zip(spans, passages, want):
        assert tok.decode(val[s:e]) == word and tok.decode(val[p:s]) + word == text
        assert val[e] == 256 and p == len(stream)  # each passage ends with end-of-text
        stream += tok.encode(text[:len(text) - len(word)]) + tok.encode(word) + [256]
    assert val.tolist() == stream
    meta = load_meta(out)
    assert (meta['dataset'], meta['examples'], meta['targets']) == ('lambada', 3, 'val_targets.npy')
    assert meta['train_tokens'] == 0 and os.path.getsize(os.path.join(out, 'train.bin')) == 0


def test_lambada_json_by_content_and_a_passage_a_newline(tmp_path, tiny):
    """JSON lines in a file not named .jsonl are still JSON, and a passage holding U+2028 (which JSON may carry
    raw) stays one passage."""
    texts = ['They walked to the old mill by the river bank', 'He said\u2028she left the key']
    (tmp_path / 'lambada_test.json').write_text(''.join(json.dumps({'text': t}, ensure_ascii=False) + '\n'
                                                        for t in texts))
    out = prepare('lambada', tmp_path / 'data', input=str(tmp_path / 'lambada_test.json'))
    val, spans, tok = read_bin(os.path.join(out, 'val.bin')), np.load(os.path.join(out, 'val_targets.npy')), \
        get_tokenizer('gpt2')
    assert [tok.decode(val[s:e]) for _, s, e in spans] == [' bank', ' key']


def test_a_folder_of_another_dataset_is_not_taken_for_this_one(tmp_path, tiny):
    (tmp_path / 'notes.txt').write_text('some notes of mine. ' * 40)
    prepare('text', tmp_path / 'data', input=str(tmp_path / 'notes.txt'), name='lambada')
    write_jsonl(tmp_path / 'lambada_test.jsonl', LAMBADA)
    with pytest.raises(UsageError, match='data/lambada holds text, not lambada; pass --force to rebuild it, or '
                                         '--name=OTHER to keep both'):
        prepare('lambada', tmp_path / 'data', input=str(tmp_path / 'lambada_test.jsonl'))
    owt_folder(tmp_path / 'owt')
    out = prepare('openwebtext', tmp_path / 'data', input=str(tmp_path / 'owt'), name='owt', tokenizer='bytes',
                  val_every=4, workers=1)
    assert load_meta(out)['dataset'] == 'openwebtext'                  # eval_gpt's label, whatever the folder
    os.truncate(os.path.join(out, 'val.bin'), 2)
    with pytest.raises(UsageError, match=r'rebuild it: python prepare_data.py openwebtext --name=owt --data_dir='):
        read_tokens(out, load_meta(out), 'val')


def test_lambada_bytes_separates_passages_with_newline(tmp_path):
    write_jsonl(tmp_path / 'l.jsonl', ['the cat sat', 'a dog ran'])
    out = prepare('lambada', tmp_path / 'data', input=str(tmp_path / 'l.jsonl'), tokenizer='bytes')
    assert bytes(read_bin(os.path.join(out, 'val.bin')).astype(np.uint8)) == b'the cat sat\na dog ran\n'
    assert np.load(os.path.join(out, 'val_targets.npy')).tolist() == [[0, 7, 11], [12, 17, 21]]


@pytest.mark.parametrize('name,published', [('lambada', 'jsonl'), ('wikitext2', 'zip'), ('ptb', 'txt')])
def test_eval_set_download_is_checked(tmp_path, tiny, monkeypatch, name, published):
    if published == 'zip':
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, 'w') as z:
            z.writestr('wikitext-2-raw/wiki.test.raw', WIKI)
        blob = buf.getvalue()
    else:
        blob = (json.dumps({'text': LAMBADA[0]}) + '\n' if name == 'lambada' else PTB).encode()
    urls = []

    class Response(io.BytesIO):
        headers = {'Content-Length': str(len(blob))}

    def urlopen(req, timeout=None):
        urls.append(req.full_url)
        return Response(blob)
    monkeypatch.setattr(prep.urllib.request, 'urlopen', urlopen)
    algo = prep.EVAL_SETS[name]['checksum'][0]
    with pytest.raises(UsageError, match=f'{algo.upper()} mismatch'):  # our fake is not the published file
        prepare(name, tmp_path / 'data')
    assert not (tmp_path / 'data').exists()
    monkeypatch.setitem(prep.EVAL_SETS[name], 'checksum', (algo, hashlib.new(algo, blob).hexdigest()))
    out = prepare(name, tmp_path / 'data')
    meta = load_meta(out)
    assert meta['official_file'] is True and meta['source'] == prep.EVAL_SETS[name]['url'] == urls[-1]
    assert meta['val_tokens'] > 0


@pytest.mark.parametrize('name,file,content,words', [
    ('wikitext2', 'wiki.test.raw', WIKI.encode('utf-8').replace(b'\xc5\x8d', b'\xf6'), ['not UTF-8 text (byte 39)']),
    ('wikitext2', 'wiki.test.tokens', WIKI.replace('Unrecorded', '<unk>').encode(), ['tokenized WikiText-2']),
    ('wikitext2', 'wiki.test.raw', b' a wiki article\n without its heading\n', ["no ' = Title = ' heading"]),
    ('wikitext2', 'wikitext-2-raw-v1.zip', os.urandom(300), ['not a readable zip archive']),
    ('wikitext2', 'wikitext-2-v1.zip', 'zip:wikitext-2/wiki.test.tokens', ['holds no wikitext-2-raw/wiki.test.raw']),
    ('ptb', 'ptb.test.txt', WIKI.encode(), ["the word 'Valkyria' has capitals"]),
    ('ptb', 'ptb.test.txt', b'\n\n', ['it is empty']),
    ('lambada', 'l.jsonl', b'{"text": "a fine passage"}\n{"body": "no text"}\n', ['l.jsonl:2 is not a JSON object']),
    ('lambada', 'l.jsonl', b'{"text": "a fine passage"}\n{"text": "   alone"}\n', ['l.jsonl:2 has no last word']),
    ('lambada', 'l.txt', b'\n\n', ['holds no passages']),
    ('lambada', 'missing.jsonl', None, ['no such file']),
])
def test_eval_set_bad_input_is_one_line(tmp_path, tiny, capsys, name, file, content, words):
    path = tmp_path / file
    if isinstance(content, str):  # a zip holding some other member
        with zipfile.ZipFile(path, 'w') as z:
            z.writestr(content.split(':', 1)[1], WIKI)
    elif content is not None:
        path.write_bytes(content)
    code, err = main_exits(capsys, name, f'--input={path}', f'--data_dir={tmp_path / "data"}')
    assert code == 2 and len(err) == 1 and err[0].startswith('error:'), err
    assert all(w in err[0] for w in words), err[0]
    assert not (tmp_path / 'data').exists()  # nothing half-written, not even the data_dir


def test_cli_eval_set_offline(tmp_path):
    """The real command, byte tokenizer (gpt2's vocab would need the network)."""
    (tmp_path / 'ptb.test.txt').write_text(PTB)
    r = cli('ptb', f'--input={tmp_path / "ptb.test.txt"}', '--tokenizer=bytes', f'--data_dir={tmp_path / "data"}')
    assert r.returncode == 0 and f'{len(PTB):,} val tokens (the test split, bytes)' in r.stdout, r.stderr
    r = cli('ptb', f'--input={tmp_path / "nope.txt"}', '--tokenizer=bytes', f'--data_dir={tmp_path / "d2"}')
    assert_clean_error(r, 'no such file', 'nope.txt')

# -----------------------------------------------------------------------------
# CIFAR, from tarballs built here with the real layout

LAYOUT = {
    'cifar10': ('cifar-10-batches-py', [f'data_batch_{i}' for i in range(1, 6)], ['test_batch'], 'batches.meta', 10),
    'cifar100': ('cifar-100-python', ['train'], ['test'], 'meta', 100),
}


def write_tar(path, members, mode='w'):
    """{name: bytes} -> a tar archive at path, in that order."""
    with tarfile.open(path, mode) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def make_cifar(path, which, n=4, skip=(), protocol=2, seed=0):
    """Writes a CIFAR-format tar.gz; returns (train x, train y, test x, test y, names) as they should come out."""
    top, train, test, meta_name, k = LAYOUT[which]
    rng = np.random.default_rng(seed)
    members, out = {}, {'train': [], 'test': []}
    for split, batches in (('train', train), ('test', test)):
        for b in batches:
            x = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
            y = rng.integers(0, k, n).tolist()
            d = {b'batch_label': b.encode(), b'data': x, b'filenames': [b'img.png'] * n}
            if which == 'cifar10':
                d[b'labels'] = y
            else:
                d[b'fine_labels'], d[b'coarse_labels'] = y, [v // 5 for v in y]
            members[b] = d
            out[split].append((x, y))
    names = [f'class_{i}'.encode() for i in range(k)]
    members[meta_name] = ({b'label_names': names, b'num_cases_per_batch': n} if which == 'cifar10'
                          else {b'fine_label_names': names, b'coarse_label_names': names[:20]})
    write_tar(path, {f'{top}/{b}': pickle.dumps(members[b], protocol=protocol)
                     for b in reversed(list(members)) if b not in skip}, 'w:gz')  # not in batch order, on purpose
    cat = lambda parts, j: np.concatenate([np.asarray(p[j]) for p in parts])
    images = lambda split: cat(out[split], 0).reshape(-1, 3, 32, 32)  # rows are R, G, B planes
    return images('train'), cat(out['train'], 1), images('test'), cat(out['test'], 1), [s.decode() for s in names]


@pytest.mark.parametrize('which,protocol', [('cifar10', 2), ('cifar100', 5)])
def test_cifar_roundtrip(tmp_path, capsys, which, protocol):
    xtr, ytr, xte, yte, names = make_cifar(tmp_path / 'c.tar.gz', which, protocol=protocol)
    out = prepare(which, tmp_path / 'data', archive=str(tmp_path / 'c.tar.gz'))
    assert 'MD5' in capsys.readouterr().err  # not the official tarball: a warning, not an error
    files = ('train_images', 'train_labels', 'test_images', 'test_labels')
    got = {f: np.load(os.path.join(out, f'{f}.npy')) for f in files}
    for f, want in zip(got, (xtr, ytr, xte, yte)):
        assert got[f].dtype == (np.uint8 if 'images' in f else np.int64)
        np.testing.assert_array_equal(got[f], want)
    meta = load_meta(out)
    n_train = len(LAYOUT[which][1]) * 4
    assert (meta['kind'], meta['num_classes'], meta['classes']) == ('images', len(names), names)
    assert (meta['train_count'], meta['test_count'], meta['image_size'], meta['channels']) == (n_train, 4, 32, 3)
    x = xtr.astype(np.float64) / 255
    np.testing.assert_allclose(meta['mean'], x.mean(axis=(0, 2, 3)), atol=1e-6)
    np.testing.assert_allclose(meta['std'], x.std(axis=(0, 2, 3)), atol=1e-6)


def test_cifar_wrong_layout(tmp_path):
    make_cifar(tmp_path / 'c.tar.gz', 'cifar10', skip=('test_batch',))
    with pytest.raises(UsageError, match='missing cifar-10-batches-py/test_batch'):
        prepare('cifar10', tmp_path / 'data', archive=str(tmp_path / 'c.tar.gz'))
    make_cifar(tmp_path / 'c100.tar.gz', 'cifar100')  # a cifar100 archive is not a cifar10 one
    with pytest.raises(UsageError, match='layout'):
        prepare('cifar10', tmp_path / 'data', archive=str(tmp_path / 'c100.tar.gz'))
    assert not (tmp_path / 'data' / 'cifar10').exists()


def test_cifar_pickle_cannot_run_code(tmp_path):
    marker = tmp_path / 'pwned'

    class Evil:
        def __reduce__(self):
            return (os.system, (f'touch {marker}',))
    top, train, test, meta_name, _ = LAYOUT['cifar10']
    write_tar(tmp_path / 'evil.tar', {f'{top}/{b}': pickle.dumps({b'data': Evil()}, protocol=2)
                                      for b in train + test + [meta_name]})
    with pytest.raises(UsageError, match='refusing'):
        prepare('cifar10', tmp_path / 'data', archive=str(tmp_path / 'evil.tar'))
    assert not marker.exists()


def _label_10(d):
    d[b'labels'][0] = 10


@pytest.mark.parametrize('member, damage, words', [
    ('data_batch_3', _label_10, r'data_batch_3 needs 4 labels in 0..9'),
    ('data_batch_3', lambda d: d.pop(b'data'), r"data_batch_3 should be a dict with keys b'data' and b'labels'"),
    ('test_batch', lambda d: d.update({b'data': d[b'data'][:, :100]}),
     r'test_batch data should be an N x 3072 uint8 array, got \(4, 100\)'),
    ('data_batch_1', lambda d: d.update({b'labels': ['cat'] * 4}), 'data_batch_1 labels are not integers'),
    ('batches.meta', lambda d: d[b'label_names'].pop(), "batches.meta should list 10 names under b'label_names'"),
])
def test_cifar_damaged_batches_are_one_line(tmp_path, member, damage, words):
    make_cifar(tmp_path / 'c.tar.gz', 'cifar10')
    with tarfile.open(tmp_path / 'c.tar.gz') as tf:  # rewrite one member, damaged
        members = {m.name: tf.extractfile(m).read() for m in tf}
    d = pickle.loads(members[f'cifar-10-batches-py/{member}'], encoding='bytes')
    damage(d)
    members[f'cifar-10-batches-py/{member}'] = pickle.dumps(d, protocol=2)
    write_tar(tmp_path / 'bad.tar', members)
    with pytest.raises(UsageError, match=words):
        prepare('cifar10', tmp_path / 'data', archive=str(tmp_path / 'bad.tar'))


def test_too_little_text_and_damaged_meta_are_one_line(tmp_path):
    (tmp_path / 'empty').mkdir()
    with pytest.raises(UsageError, match='empty corpus: no documents in'):
        prepare('text', tmp_path / 'data', input=str(tmp_path / 'empty'))
    with pytest.raises(UsageError, match='empty corpus: no .parquet, .jsonl or .txt files in'):
        prepare('openwebtext', tmp_path / 'data', input=str(tmp_path / 'empty'), tokenizer='bytes')
    (tmp_path / 'one.txt').write_text('x')
    with pytest.raises(UsageError, match=r'one.txt.*too little text for a train/val split \(1 train, 0 val'):
        prepare('text', tmp_path / 'data', input=str(tmp_path / 'one.txt'))
    (tmp_path / 'bad').mkdir()
    (tmp_path / 'bad' / 'meta.json').write_text('{"kind": "text",')
    with pytest.raises(UsageError, match=r'meta.json is not valid JSON .*; rebuild it: python prepare_data.py bad --data_dir=.* --force'):
        load_meta(str(tmp_path / 'bad'))


def test_cifar_download_checks_md5(tmp_path, monkeypatch):
    make_cifar(tmp_path / 'c.tar.gz', 'cifar10')
    blob = (tmp_path / 'c.tar.gz').read_bytes()

    class Response(io.BytesIO):
        headers = {'Content-Length': str(len(blob))}
    monkeypatch.setattr(prep.urllib.request, 'urlopen', lambda url, timeout=None: Response(blob))
    with pytest.raises(UsageError, match='MD5'):  # the real checksum does not match our fake
        prepare('cifar10', tmp_path / 'data')
    assert not (tmp_path / 'data').exists()  # no partial download left, nor the data_dir this run made
    monkeypatch.setitem(prep.CIFAR['cifar10'], 'md5', hashlib.md5(blob).hexdigest())
    out = prepare('cifar10', tmp_path / 'data')
    assert load_meta(out)['md5_matches_official'] is True
    assert os.listdir(tmp_path / 'data' / 'downloads') == ['cifar-10-python.tar.gz']


def test_no_network_says_what_to_fetch(tmp_path, monkeypatch):
    def offline(url, timeout=None):
        raise urllib.error.URLError('[Errno -2] Name or service not known')
    monkeypatch.setattr(prep.urllib.request, 'urlopen', offline)
    with pytest.raises(UsageError, match=r'cifar-100-python.tar.gz.*--archive=PATH'):
        prepare('cifar100', tmp_path / 'data')
    with pytest.raises(UsageError, match=r'input.txt.*--input=PATH'):
        prepare('shakespeare', tmp_path / 'data', tokenizer='bytes')
    assert not (tmp_path / 'data' / 'shakespeare').exists()

# -----------------------------------------------------------------------------
# reliability: interrupted runs, re-runs, --force


def interrupt_after_writing(monkeypatch):
    """Ctrl-C once the first tokens are on disk: where the progress bar would advance."""
    def advance(n):
        raise KeyboardInterrupt
    monkeypatch.setattr(prep, '_progress', lambda *a, **k: contextlib.nullcontext(advance))


def test_interrupted_new_dataset_leaves_nothing(tmp_path, monkeypatch, capsys):
    (tmp_path / 'in.txt').write_text('some text to tokenize. ' * 50)
    interrupt_after_writing(monkeypatch)
    code, err = main_exits(capsys, 'text', f'--input={tmp_path / "in.txt"}', f'--data_dir={tmp_path / "data"}')
    assert code == 130 and err == ['error: interrupted: partial files removed, the dataset folder is as it was']
    assert not (tmp_path / 'data').exists()  # no dataset, staging folder or .tmp, and the new data_dir is gone


def test_interrupted_force_keeps_old_dataset(tmp_path, monkeypatch):
    (tmp_path / 'in.txt').write_text('old text. ' * 50)
    out = prepare('text', tmp_path / 'data', input=str(tmp_path / 'in.txt'))
    before = {f: Path(out, f).read_bytes() for f in os.listdir(out)}
    (tmp_path / 'in.txt').write_text('new and different text. ' * 50)
    interrupt_after_writing(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        prepare('text', tmp_path / 'data', input=str(tmp_path / 'in.txt'), force=True)
    assert {f: Path(out, f).read_bytes() for f in os.listdir(out)} == before
    assert os.listdir(tmp_path / 'data') == ['in']


def test_two_nodes_commit_one_shared_folder_at_once(tmp_path, monkeypatch):
    """Each node's first process may prepare a shared data_dir at the same moment: their meta.json temp files
    have names of their own, so neither rename finds its file taken by the other."""
    out, stages, pid, calls = tmp_path / 'd', [tmp_path / 's0', tmp_path / 's1'], os.getpid(), []
    for s in stages:
        s.mkdir()
        (s / 'val.bin').write_bytes(b'ab')
    real_fsync = os.fsync

    def the_other_node_commits_now(fd):
        real_fsync(fd)
        if not calls:
            calls.append(1)
            monkeypatch.setattr(os, 'getpid', lambda: pid + 1)
            prep._commit(str(stages[1]), str(out), {'by': 'other'})
            monkeypatch.setattr(os, 'getpid', lambda: pid)

    monkeypatch.setattr(os, 'fsync', the_other_node_commits_now)
    prep._commit(str(stages[0]), str(out), {'by': 'this'})
    assert json.loads((out / 'meta.json').read_text()) == {'by': 'this'}
    assert sorted(os.listdir(out)) == ['meta.json', 'val.bin']


def test_failure_while_committing_leaves_no_meta(tmp_path, monkeypatch):
    (tmp_path / 'in.txt').write_text('old text. ' * 50)
    out = prepare('text', tmp_path / 'data', input=str(tmp_path / 'in.txt'))
    real = os.replace

    def replace(src, dst):
        if str(dst) == os.path.join(out, 'val.bin'):
            raise OSError('No space left on device')
        real(src, dst)
    monkeypatch.setattr(prep.os, 'replace', replace)
    with pytest.raises(OSError):
        prepare('text', tmp_path / 'data', input=str(tmp_path / 'in.txt'), force=True)
    assert not os.path.exists(os.path.join(out, 'meta.json'))  # half old, half new: not complete
    monkeypatch.setattr(prep.os, 'replace', real)
    prepare('text', tmp_path / 'data', input=str(tmp_path / 'in.txt'))  # and the next run rebuilds it
    assert load_meta(out)['train_tokens'] > 0


def test_rerun_is_noop_and_force_rebuilds(tmp_path, capsys):
    (tmp_path / 'in.txt').write_text('version one. ' * 40)
    out = prepare('text', tmp_path / 'data', input=str(tmp_path / 'in.txt'))
    stamp = os.stat(os.path.join(out, 'train.bin')).st_mtime_ns
    (tmp_path / 'in.txt').write_text('version two, longer. ' * 40)
    capsys.readouterr()
    prepare('text', tmp_path / 'data', input=str(tmp_path / 'in.txt'))
    assert 'already prepared' in capsys.readouterr().out
    assert os.stat(os.path.join(out, 'train.bin')).st_mtime_ns == stamp
    assert load_meta(out)['train_tokens'] < 40 * 12
    with pytest.raises(UsageError, match='--force'):  # asking for another tokenizer is not a silent no-op
        prepare('text', tmp_path / 'data', input=str(tmp_path / 'in.txt'), tokenizer='gpt2')
    prepare('text', tmp_path / 'data', input=str(tmp_path / 'in.txt'), force=True)
    raw = ('version two, longer. ' * 40).encode()
    assert load_meta(out)['train_tokens'] == len(raw) - len(raw) // 10
    assert bytes(read_bin(os.path.join(out, 'train.bin')).astype(np.uint8)) == raw[:len(raw) - len(raw) // 10]


def test_ctrl_c_during_pool_run(tmp_path):
    """A real SIGINT to the whole process group, as a terminal's ctrl-c sends: exit 130, one line, no debris."""
    (tmp_path / 'owt').mkdir()
    (tmp_path / 'owt' / 'a.jsonl').write_text((json.dumps({'text': 'a document ' * 5}) + '\n') * 400_000)
    (tmp_path / 'data').mkdir()
    p = subprocess.Popen([sys.executable, os.path.join(REPO, 'prepare_data.py'), 'openwebtext', '--tokenizer=bytes',
                          '--workers=2', f'--input={tmp_path / "owt"}', f'--data_dir={tmp_path / "data"}'],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 30
    while not os.listdir(tmp_path / 'data') and time.time() < deadline:
        time.sleep(0.02)  # wait for the staging folder: the build has started
    time.sleep(0.5)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, (out, err)
    assert 'Traceback' not in err and len(err.strip().splitlines()) == 1, err
    assert os.listdir(tmp_path / 'data') == []


def test_stale_staging_folder_is_removed(tmp_path):
    p = subprocess.Popen([sys.executable, '-c', 'pass'])
    p.wait()  # a pid that is gone
    stale = tmp_path / 'data' / f'.in.partial-{socket.gethostname()}-{p.pid}'
    stale.mkdir(parents=True)
    other_host = tmp_path / 'data' / f'.in.partial-elsewhere-{p.pid}'  # maybe alive on its own host: kept
    other_host.mkdir()
    (stale / 'train.bin.tmp').write_bytes(b'\0' * 10)
    (tmp_path / 'in.txt').write_text('hello there. ' * 20)
    prepare('text', tmp_path / 'data', input=str(tmp_path / 'in.txt'))
    assert sorted(os.listdir(tmp_path / 'data')) == [other_host.name, 'in']

# -----------------------------------------------------------------------------
# the command line: one line on stderr, exit 2, no traceback


def test_cli_broken_archive(tmp_path):
    (tmp_path / 'junk.tar.gz').write_bytes(os.urandom(4096))
    r = cli('cifar10', f'--archive={tmp_path / "junk.tar.gz"}', f'--data_dir={tmp_path / "data"}')
    assert_clean_error(r, 'not a readable tar archive')
    assert not (tmp_path / 'data' / 'cifar10').exists()


def test_cli_stdlib_and_noop(tmp_path):
    r = cli('python_stdlib', '--max_mb=0.05', f'--data_dir={tmp_path}')
    assert r.returncode == 0 and 'prepared' in r.stdout, r.stderr
    assert load_meta(tmp_path / 'python_stdlib')['train_tokens'] > 0
    r = cli('python_stdlib', f'--data_dir={tmp_path}')
    assert r.returncode == 0 and 'already prepared' in r.stdout


@pytest.mark.parametrize('argv,words', [
    (['mnist'], ['unknown dataset', 'cifar10', 'text --input=PATH --name=mnist']),
    (['cifar1O'], ['unknown dataset', 'did you mean the built-in cifar10?']),
    (['text', '--input', 'x.txt'], ["unexpected argument 'x.txt'", '--key=value']),     # the space form is gone
    (['text', '--input=x', '--batch_size=3'], ['unknown option --batch_size']),
    (['python_stdlib', '--max_mb=lots'], ['--max_mb expects float', 'lots']),
    (['python_stdlib', '--tokenizer=sentencepiece'], ['unknown tokenizer']),
    (['cifar10', '--tokenizer=gpt2'], ['does not take --tokenizer']),
    (['text'], ['--input=PATH']),
    ([], ['give one dataset name']),
    (['python_stdlib', '--max_mb=0'], ['--max_mb must be positive, got 0.0']),
    (['python_stdlib', '--max_mb=nan'], ['--max_mb', 'nan']),
    (['text', '--input=x', '--workers=-1'], ['--workers must be >= 0, got -1']),
    (['text', '--input=x', '--name=..'], ['--name=.. is not usable as a folder name']),
    (['text', '--input=nope.txt'], ['no such file or folder: nope.txt']),
    (['cifar10', '--archive=nowhere.tar.gz'], ['no such file: nowhere.tar.gz']),
])
def test_cli_bad_arguments(tmp_path, capsys, argv, words):
    code, err = main_exits(capsys, *argv, f'--data_dir={tmp_path}')
    assert code == 2 and len(err) == 1 and err[0].startswith('error:')
    assert all(w in err[0] for w in words), err[0]


def test_cli_parsing_forms():
    """The dataset as the first word or as --dataset, --key=value, and a bare --flag for a bool."""
    parse = lambda argv: options.parse(argv, prep.DEFAULTS, positional='dataset')
    cfg, set_keys = parse(['text', '--input=a b.txt', '--force', '--max_mb=2.5'])
    assert (cfg['dataset'], cfg['input'], cfg['force'], cfg['max_mb']) == ('text', 'a b.txt', True, 2.5)
    assert set_keys == {'dataset', 'input', 'force', 'max_mb'}
    cfg, set_keys = parse(['--data_dir=d', '--dataset=cifar10', '--force=false'])
    assert (cfg['dataset'], cfg['data_dir'], cfg['force']) == ('cifar10', 'd', False)
