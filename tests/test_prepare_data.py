"""
Tests for prepare_data.py and the readers it writes for. Offline and small: CIFAR tarballs are built here with
the real pickle layout, gpt2 is a 257-token tiktoken Encoding, downloads are served from memory.
    python -m pytest -q tests/test_prepare_data.py
"""
import hashlib
import io
import json
import math
import ntpath
import os
import pickle
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
import tracemalloc
import urllib.error
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tiktoken

import prepare_data as prep
import readers
from options import UsageError
from prepare_data import prepare
from readers import get_tokenizer, load_meta, read_images, read_tokens
from conftest import NEEDS_DEV_FULL, POSIX_ONLY, REPO, as_from_a_terminal, ended, one_line, python, run_main

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


@pytest.fixture(autouse=True)
def in_a_folder_of_its_own(tmp_path, monkeypatch):
    """Each test runs in a fresh folder, with relative paths as a user types them."""
    monkeypatch.chdir(tmp_path)


def ids(folder, split):
    """A split's token ids, read as the trainers read them: checked against meta.json's count."""
    return read_tokens(folder, load_meta(folder), split).tolist()


def tail_split(seq):
    """The last tenth of a document, rounded down, is val."""
    cut = len(seq) - len(seq) // 10
    return seq[:cut], seq[cut:]


def main_exits(capsys, *argv):
    """prepare_data.main as the command runs it: (exit code, the lines on stderr)."""
    try:
        run_main(lambda: prep.main(list(argv)))
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err.strip().splitlines()


def rebuilds(capsys, error):
    """Runs the command `error` names, as printed: it succeeds, with nothing on stderr."""
    command = re.search('python prepare_data.py (.*)', str(error))[1]
    assert main_exits(capsys, *shlex.split(command)) == (0, [])


def one_error(capsys, *argv):
    """The one line a refused command prints (exit 2)."""
    code, err = main_exits(capsys, *argv)
    assert code == 2 and len(err) == 1 and err[0].startswith('error:'), err
    return err[0]


def write(path, content):
    """bytes or str into a file, a folder for None, or content(path) for a callable."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if content is None:
        path.mkdir()
    elif callable(content):
        content(path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding='utf-8')

# -----------------------------------------------------------------------------
# readers: tokenizers, a dataset not prepared or damaged


@pytest.mark.parametrize('name', ['bytes', 'gpt2'])
def test_tokenizers(tiny, name):
    tok = get_tokenizer(name)
    assert (tok.vocab_size, tok.eot) == ((256, None) if name == 'bytes' else (257, 256))
    # Special tokens in text stay text.
    s = "it's 42 <|endoftext|> déjà vu ✓\n"
    want = list(s.encode()) if name == 'bytes' else tiny.encode_ordinary(s)
    assert tok.encode(s) == prep.encode_arrays(tok, [s])[0].tolist() == want
    assert tok.decode(tok.encode(s)) == s
    assert b''.join(tok.token_bytes(t) for t in tok.encode('é')) == 'é'.encode()
    # An id of a padded head decodes to nothing, in a text and streamed; a cut-off character is replaced.
    assert tok.decode([104, 105, tok.vocab_size]) == 'hi' and tok.token_bytes(300) == b''
    assert tok.decode(np.array([0xE2, 0x9C, 65])) == '\ufffdA'


def no_vocab(name):
    raise ConnectionError('Name or service not known')


def test_a_tokenizer_that_cannot_be_had_is_a_usage_error(monkeypatch):
    """GPT-2's vocab offline; an unknown name (a damaged checkpoint's), with GPT-2's vocab at hand (not
    taken for it)."""
    monkeypatch.setattr(tiktoken, 'get_encoding', no_vocab)
    with pytest.raises(UsageError):
        get_tokenizer('gpt2')
    monkeypatch.setattr(readers, 'gpt2_encoding', encoding)
    with pytest.raises(UsageError, match='sentencepiece'):
        get_tokenizer('sentencepiece')


def test_token_files_of_nanogpts_read_with_the_meta_json_the_docs_give(tmp_path):
    """nanoGPT's prepare.py writes train.bin and val.bin alone: the line points to docs/training.md, and the
    meta.json it gives, N and M put in, reads them."""
    folder = tmp_path / 'openwebtext'
    folder.mkdir()
    np.arange(1000, dtype=np.uint16).tofile(folder / 'train.bin')
    np.arange(100, dtype=np.uint16).tofile(folder / 'val.bin')
    with pytest.raises(UsageError, match='docs/training.md'):
        load_meta(str(folder), 'text')
    # beside a typo's hint
    typo = tmp_path / 'shakespear'
    shutil.copytree(folder, typo)
    with pytest.raises(UsageError, match='shakespeare[?].*docs/training.md'):
        load_meta(str(typo), 'text')
    doc = (Path(REPO) / 'docs' / 'training.md').read_text(encoding='utf-8')
    given = re.search(r'\{"kind":.*?\}', doc, re.S)[0].replace('N', '1000').replace('M', '100')
    (folder / 'meta.json').write_text(given)
    meta = load_meta(str(folder), 'text')
    assert read_tokens(str(folder), meta, 'val').tolist() == list(range(100))
    # a count in bytes, not tokens: the line points to the page, not to a build from text it does not have
    with pytest.raises(UsageError, match='docs/training.md') as e:
        read_tokens(str(folder), dict(meta, train_tokens=2000), 'train')
    assert 'prepare_data.py' not in str(e.value)
    # but a model of another tokenizer needs them in its own: the build that makes them
    with pytest.raises(UsageError, match='--tokenizer=bytes'):
        load_meta(str(folder), 'text', {'tokenizer': 'bytes', 'vocab_size': 256})


def test_a_dataset_not_prepared_names_a_command_that_makes_it(capsys):
    """readers names the command for the folder's name, in a model's tokenizer; run as printed, it makes a
    built-in dataset, and for any other name it is the text command, which works with a file for PATH. A
    name that is not an image set's, asked for images, names those there are."""
    assert set(readers.IMAGES + readers.TEXTS) == set(prep.DATASETS) - {'text'}
    made = 'python prepare_data.py shakespeare --data_dir=data --tokenizer=bytes$'
    with pytest.raises(UsageError, match=made):
        load_meta('data/shakespeare', 'text', {'tokenizer': 'bytes'})
    with pytest.raises(UsageError) as e:
        load_meta('data/notes')
    command = re.search('python prepare_data.py (.*)', str(e.value))[1].replace('PATH', 'notes.txt')
    write('notes.txt', 'my own notes. ' * 20)
    assert main_exits(capsys, *command.split()) == (0, [])
    notes = load_meta('data/notes')
    assert notes['kind'] == 'text'
    # a model of the same tokenizer and another vocabulary is told so
    with pytest.raises(UsageError, match='rebuild'):
        load_meta('data/notes', 'text', dict(notes, vocab_size=notes['vocab_size'] + 1))
    # the command for an image set, typed as printed; a text model given one is told what it is
    with pytest.raises(UsageError) as e:
        load_meta('data/mnist', 'images')
    assert 'python prepare_data.py cifar10 --data_dir=data (or cifar100)' in str(e.value)
    with pytest.raises(UsageError, match='train_vit.py'):
        load_meta('data/cifar10', 'text')
    # a rebuild keeps the dataset's tokenizer; a folder with a space is one word of the command
    meta = {'dataset': 'text', 'tokenizer': 'gpt2'}
    words = shlex.split(readers.recipe('my data/my notes', meta, force=True))
    assert {'--data_dir=my data', '--tokenizer=gpt2', '--name=my notes', '--force'} <= set(words)
    # A near miss of a built-in name suggests it.
    assert one_error(capsys, 'cifar1O').count('cifar10') > one_error(capsys, 'zzzzzz').count('cifar10')


def test_a_damaged_dataset_names_the_command_that_rebuilds_it(capsys):
    """A train.bin cut by one byte, a missing val.bin, a damaged image set: each names a command; run as
    printed, it rebuilds the dataset, text of one's own from the --input it was built from."""
    write('my text/in.txt', 'hello there. ' * 20)
    out = prepare('text', 'data', input='my text/in.txt', name='mine')
    meta = load_meta(out)
    with open(os.path.join(out, 'train.bin'), 'ab') as f:
        f.write(b'x')
    os.remove(os.path.join(out, 'val.bin'))
    for split in ('train', 'val'):
        with pytest.raises(UsageError) as e:
            read_tokens(out, meta, split)
    rebuilds(capsys, e.value)
    # Rebuilt as it was: the old meta.json's counts hold.
    for split in ('train', 'val'):
        read_tokens(out, meta, split)
    write('data/images', None)
    command = 'python prepare_data.py cifar10 --name=images --data_dir=data --force'
    with pytest.raises(UsageError, match=command):
        read_images('data/images', {'kind': 'images', 'dataset': 'cifar10'})

def test_token_files_are_read_as_unsigned_16_bit_and_read_only():
    """gpt2's ids reach 50256: a signed read would make those of 32768 and up negative."""
    np.array([0, 40000, 65535], np.uint16).tofile('val.bin')
    got = read_tokens('.', dict(val_tokens=3), 'val')
    assert got.tolist() == [0, 40000, 65535]
    with pytest.raises(ValueError):
        got[0] = 1


def test_a_jsonl_not_in_utf8_is_said_once_and_its_bytes_replaced(capsys):
    line = json.dumps({'text': 'café au lait'}, ensure_ascii=False).encode('latin-1') + b'\n'
    write('owt/a.jsonl', line + b'{"text": "fine"}\n' + line)
    out = prepare('openwebtext', 'data', input='owt', tokenizer='bytes', val_every=2)
    warned = capsys.readouterr().err.splitlines()
    assert len([line for line in warned if 'warning' in line]) == 1 and 'owt/a.jsonl:1' in warned[0]
    assert bytes(ids(out, 'train')) == 2 * 'caf\ufffd au lait'.encode()


def test_openwebtext_holds_every_2000th_document_out_by_default(tiny):
    """About 4M of its 9B tokens: as the paper's runs validate on. As many documents as --val_every: the last
    is val."""
    write('owt/a.jsonl', ''.join(json.dumps({'text': 'x'}) + '\n' for _ in range(4000)))
    meta = load_meta(prepare('openwebtext', 'data', input='owt', tokenizer='bytes'))
    # one byte a document (bytes has no end-of-text)
    assert (meta['val_every'], meta['val_tokens'], meta['train_tokens']) == (2000, 2, 3998)
    write('three/a.jsonl', ''.join(json.dumps({'text': 'x'}) + '\n' for _ in range(3)))
    meta = load_meta(prepare('openwebtext', 'data', input='three', tokenizer='bytes', val_every=3, name='3'))
    assert (meta['val_tokens'], meta['train_tokens']) == (1, 2)


@pytest.mark.parametrize('edit', [dict(vocab_size=10), dict(vocab_size=256.0),
                                  dict(vocab_size=70000, tokenizer='gpt2'), dict(tokenizer='foo'),
                                  dict(kind=None), dict(kind=['text'])])
def test_a_text_meta_json_no_dataset_can_have_names_the_field_and_the_command_that_rebuilds_it(capsys, tiny,
                                                                                                edit):
    """bytes has 256 ids, a vocab fits uint16 token files, a count is a number, a tokenizer is one
    get_tokenizer knows: else the trainers would fail inside torch. The command, run as printed, rebuilds
    the dataset (a tokenizer no one knows is not suggested; a kind no one knows, or none, is the one asked
    for). None: the field is missing."""
    write('notes.txt', 'my own notes. ' * 20)
    out = prepare('text', 'data', input='notes.txt', name='notes')
    meta = {**load_meta(out), **edit}
    write(f'{out}/meta.json', json.dumps({k: v for k, v in meta.items() if v is not None}))
    with pytest.raises(UsageError) as e:
        load_meta(out, 'text')
    assert f'{out}/meta.json' in str(e.value) and list(edit)[0] in str(e.value)
    rebuilds(capsys, e.value)
    assert load_meta(out, 'text')['tokenizer'] in ('bytes', edit.get('tokenizer'))


# (a damaged field or two of a CIFAR-10 meta.json, the CIFAR that rebuilds it); None: the field is missing
# (test_train_vit tries a mean not a list, a std of a zero or of the wrong length.)
IMAGE_EDITS = [(dict(num_classes=0), 'cifar10'), (dict(channels='3'), 'cifar10'),
               (dict(image_size=None, num_classes=100), 'cifar100'), (dict(kind='pictures'), 'cifar10'),
               (dict(mean=[0.5, None, 0.5]), 'cifar10'), (dict(std=[0.2, float('nan'), 0.2]), 'cifar10'),
               (dict(mean=[0.5, 127.0, 0.5]), 'cifar10'),
               (dict(classes=list(range(10))), 'cifar10'),
               (dict(classes='abcdefghij'), 'cifar10'),
               (dict(classes=['a'] * 10, num_classes=100), 'cifar100')]


@pytest.mark.parametrize('edit, made', IMAGE_EDITS)
def test_an_image_meta_json_no_dataset_can_have_names_the_field_and_an_image_set_that_rebuilds_it(
        capsys, monkeypatch, edit, made):
    """The CIFAR of its classes, cifar10 if neither's (or its kind is missing or unknown: asked for images).
    Run as printed, the command rebuilds it. train_vit standardizes the images with a mean and a std (above 0)
    of each channel and names a class by its name: a list of the wrong length, a value not a number, a zero
    std or a missing one would fail inside torch or later, at the first picture."""
    meta = dict(kind='images', num_classes=10, channels=3, image_size=32, mean=[0.5] * 3, std=[0.25] * 3,
                classes=[f'class_{i}' for i in range(10)])
    write('data/pics/meta.json', json.dumps({k: v for k, v in {**meta, **edit}.items() if v is not None}))
    with pytest.raises(UsageError) as e:
        load_meta('data/pics', 'images')
    rebuild = f'python prepare_data.py {made} --name=pics --data_dir=data --force'
    assert all(name in str(e.value) for name in ('data/pics/meta.json', list(edit)[0], rebuild))
    make_cifar('c.tar.gz', made)
    blob = Path('c.tar.gz').read_bytes()
    monkeypatch.setattr(prep.urllib.request, 'urlopen', served(blob, []))
    monkeypatch.setitem(prep.CIFAR[made], 'checksum', ('md5', hashlib.md5(blob).hexdigest()))
    rebuilds(capsys, e.value)
    assert load_meta('data/pics', 'images')['dataset'] == made


# (the file, what it holds instead of what meta.json says: 2 of each split's 3 channels of 4 x 4 pixels,
# labels 0 and 1 of 2 classes; test_train_vit tries labels past the classes and a split of none)
class Touches:
    """Unpickled, it makes the file 'pwned': what a damaged or planted file could do if pickles were read."""
    def __reduce__(self):
        return (Path.touch, (Path('pwned'),))


# (an empty file: a copy cut short; a pickle that would run code)
ARRAYS = [('test_labels', np.array([-1, 0])), ('train_labels', np.array([0.0, 1.0])),
          ('test_labels', np.array([0, 1, 1])), ('test_images', np.zeros((2, 3, 4, 4))),
          ('train_images', np.zeros((2, 3, 8, 8), np.uint8)), ('test_images', b''),
          ('train_labels', np.array([Touches(), Touches()], dtype=object))]


@pytest.mark.parametrize('name, array', ARRAYS)
def test_image_files_not_as_meta_json_says_name_their_file_and_the_rebuild(name, array):
    """train_vit would fail inside torch on a label past the classes, a float label, counts of images and
    labels that differ, images of other channels, and would train on images of another size as if they were
    its size."""
    os.makedirs('data/pics')
    for s in ('train', 'test'):
        np.save(f'data/pics/{s}_images.npy', np.zeros((2, 3, 4, 4), np.uint8))
        np.save(f'data/pics/{s}_labels.npy', np.array([0, 1]))
    meta = dict(kind='images', dataset='cifar10', num_classes=2, channels=3, image_size=4)
    assert [a.tolist() for a in read_images('data/pics', meta)[1::2]] == [[0, 1], [0, 1]]
    if isinstance(array, bytes):
        write(f'data/pics/{name}.npy', array)
    else:
        np.save(f'data/pics/{name}.npy', array)
    with pytest.raises(UsageError) as e:
        read_images('data/pics', meta)
    assert not os.path.exists('pwned')
    names = (f'data/pics/{name}.npy', 'python prepare_data.py cifar10 --name=pics --data_dir=data --force')
    assert all(name in str(e.value) for name in names)
    assert not any(other in str(e.value) for other, _ in ARRAYS if other != name)


def test_ids_past_the_vocab_name_the_file_and_its_meta_json(tiny):
    """gpt2's vocab is not checked against tiktoken's (that would need it): a meta.json's vocab_size may be
    the damaged one. Under torchrun the process whose batch holds the id says it, whatever its rank."""
    write('notes.txt', 'my own notes. ' * 20)
    out = prepare('text', 'data', input='notes.txt', tokenizer='gpt2')
    write(f'{out}/meta.json', json.dumps(dict(load_meta(out), vocab_size=10)))
    meta = load_meta(out, 'text')
    with pytest.raises(UsageError) as e:
        readers.check_ids(out, 'train', read_tokens(out, meta, 'train'), meta)
    assert all(name in str(e.value) for name in (f'{out}/train.bin', f'{out}/meta.json', '--force'))
    assert e.value.alone


# -----------------------------------------------------------------------------
# text


def test_text_folder_sorted_recursive(tiny):
    docs = {'b.txt': 'bee bee', 'a/z.txt': 'zed zed zed', 'a/m/q.txt': 'queue', 'a-c.md': 'see',
            '.hidden': 'no', '.git/config': 'no'}
    for rel, s in docs.items():
        write(f'notes/{rel}', s * 5)
    # A byte-order mark, as some Windows editors write, is not text.
    write('notes/b.txt', '\ufeff' + docs['b.txt'] * 5)
    out = prepare('text', 'data', input='notes', name='mynotes', tokenizer='gpt2')
    train = []
    val = []
    # Sorted by path components, hidden names skipped, end-of-text after each document's part in both streams.
    for rel in ['a/m/q.txt', 'a/z.txt', 'a-c.md', 'b.txt']:
        head, tail = tail_split(tiny.encode_ordinary(docs[rel] * 5))
        train += head + [256]
        val += tail + [256] if tail else []
    assert (ids(out, 'train'), ids(out, 'val')) == (train, val)
    # a model in the same tokenizer's name but of another vocabulary is refused, naming both counts
    with pytest.raises(UsageError, match='257 ids.*50257 ids'):
        load_meta(out, 'text', {'tokenizer': 'gpt2', 'vocab_size': 50257})
    meta = Path(out, 'meta.json')
    meta.write_text('\ufeff' + meta.read_text(encoding='utf-8'), encoding='utf-8')
    assert load_meta(out, 'text')['name'] == 'mynotes'


def test_many_short_files_warn_and_val_every_takes_whole_files(tiny, capsys):
    """Files of a few tokens: their last tenths are a token or two each, so the build warns and names
    --val_every; with it, every Nth file is val, whole, end-of-text after each (gpt2)."""
    docs = [f'note {i} says hello to the world' for i in range(40)]
    for i, d in enumerate(docs):
        write(f'notes/{i:02}.txt', d)
    prepare('text', 'data', input='notes')
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith('warning:') and '--val_every' in err[0], err
    out = prepare('text', 'data', input='notes', name='every4', val_every=4, tokenizer='gpt2')
    assert not capsys.readouterr().err
    val = [i for d in docs[3::4] for i in tiny.encode_ordinary(d) + [256]]
    assert ids(out, 'val') == val
    # the command that rebuilds it keeps the split
    assert '--val_every=4' in shlex.split(readers.recipe(out, load_meta(out), force=True))


@NEEDS_DEV_FULL
def test_a_build_whose_stdout_is_gone_still_ends_well():
    """stdout into a full disk (or a `| tee` that died): the build, and a second run that finds it prepared,
    end with exit 0 and the dataset whole, as `prepare_data.py ... > log && python train_gpt.py` needs."""
    write('notes.txt', b'Some notes of mine.\n' * 200)
    command = [sys.executable, os.path.join(REPO, 'prepare_data.py'), 'text', '--input=notes.txt',
               '--data_dir=data']
    for _ in range(2):
        with open('/dev/full', 'w', encoding='utf-8') as full:
            run = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert load_meta('data/notes')['documents'] == 1


def one_document_and_a_warning_for_each(*names):
    """`prepare_data.py text --input=in`, in a process of its own (a hang is a timeout): it ends well, with
    one warning naming each of `names`, and keeps one document."""
    run = python(os.path.join(REPO, 'prepare_data.py'), 'text', '--data_dir=data', '--input=in', cwd='.')
    warned = run.stderr.splitlines()
    assert run.returncode == 0 and len(warned) == len(names), run.stderr
    assert all(any(name in line for line in warned) for name in names)
    assert load_meta('data/in')['documents'] == 1


def test_a_folder_of_text_skips_what_is_not_text():
    """A binary file in a folder is skipped, bytes that are not UTF-8 replaced, each with a warning naming its
    file (a named pipe and a link: the next test)."""
    write('in/a.txt', 'café au lait, '.encode('latin-1') * 10)
    write('in/blob.so', bytes(range(256)) * 4)
    one_document_and_a_warning_for_each('in/a.txt', 'in/blob.so')
    assert 'caf\ufffd au lait'.encode() in bytes(ids('data/in', 'train'))
    # a binary file, given or in a folder of documents: refused by name where no warning can skip it
    run = python(os.path.join(REPO, 'prepare_data.py'), 'shakespeare', '--input=in/blob.so',
                 '--tokenizer=bytes', cwd='.')
    ended(run, 2, 'blob.so')
    write('owt/a.txt', 'some text ' * 10)
    write('owt/b.txt', bytes(range(256)))
    # (before any document is read)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(prep, '_read_text', lambda path: pytest.fail(f'{path} was read'))
        with pytest.raises(UsageError, match='owt/b.txt'):
            prep.prepare('openwebtext', 'data', input='owt', tokenizer='bytes')
    assert not os.path.exists('data/shakespeare') and not os.path.exists('data/openwebtext')


@POSIX_ONLY
def test_a_folder_of_text_skips_a_named_pipe_and_a_link_and_a_pipe_given_is_refused():
    """A named pipe (whose first read would wait for a writer forever) and a link to a folder (not followed:
    it could lead back up) in a folder are skipped, each with a warning naming it; a pipe given as --input is
    one line naming it. In a process of its own: a hang is a timeout."""
    write('in/a.txt', 'some text ' * 10)
    os.mkfifo('in/p.txt')
    os.mkfifo('pipe')
    write('elsewhere/b.txt', 'more text ' * 10)
    os.symlink(os.path.abspath('elsewhere'), 'in/linked')
    one_document_and_a_warning_for_each('in/p.txt', 'in/linked')
    command = [os.path.join(REPO, 'prepare_data.py'), 'text', '--data_dir=data']
    run = python(*command, '--input=pipe', cwd='.')
    ended(run, 2, 'pipe')
    # refused as what it is, not as a folder of no files; the same for a dataset read from one file
    assert 'too little' not in run.stderr
    run = python(command[0], 'shakespeare', '--input=pipe', '--tokenizer=bytes', cwd='.', timeout=60)
    ended(run, 2, 'pipe')


def test_a_folder_that_cannot_be_read_is_said(monkeypatch, capsys):
    """os.walk leaves out a folder it cannot list (no permission) without a word: the build says it."""
    write('in/a.txt', 'some text ' * 10)
    write('in/locked/b.txt', 'more text ' * 10)
    scandir = os.scandir

    def refused(path):
        if os.path.basename(path) == 'locked':
            raise PermissionError(13, 'Permission denied', path)
        return scandir(path)
    monkeypatch.setattr(os, 'scandir', refused)
    assert prep._files_under('in', '.txt') == [os.path.join('in', 'a.txt')]
    assert os.path.join('in', 'locked') in capsys.readouterr().err
    # a folder that is not there at all (a stdlib in a zip file) is the handler's to name, as missing
    with pytest.raises(FileNotFoundError):
        prep._files_under('nowhere', '.py')


def test_a_rebuild_over_a_file_in_use_names_it(monkeypatch, fails):
    """Windows refuses to replace a file another process has open (eval_gpt.py reading val.bin): the line
    names the dataset's file, not the staging copy, which is gone by then."""
    write('in.txt', 'hello there. ' * 20)
    prepare('text', 'data', input='in.txt')
    real = os.replace

    def in_use(src, dst):
        if dst.endswith('val.bin'):
            raise PermissionError(13, 'The process cannot access the file', src)
        real(src, dst)
    monkeypatch.setattr(os, 'replace', in_use)
    argv = ['text', '--input=in.txt', '--data_dir=data', '--force']
    fails(prep.main, argv, os.path.join('data', 'in', 'val.bin'))


def test_shakespeare_gpt2_from_local_copy(tiny, capsys, monkeypatch):
    text = 'ROMEO:\nBut, soft! what light through yonder window breaks?\n' * 4
    write('input.txt', text)
    out = prepare('shakespeare', 'data', input='input.txt')
    # gpt2 is shakespeare's default, and the meta is enough to decode.
    tok = get_tokenizer(load_meta(out)['tokenizer'])
    assert tok.vocab_size == 257
    # One document: no end-of-text, train then val is the whole text.
    assert tok.decode(ids(out, 'train') + ids(out, 'val')) == text
    # The rebuild command, run as printed, reads the same local copy: no download.
    urls = []
    monkeypatch.setattr(prep.urllib.request, 'urlopen', served(b'', urls))
    rebuilds(capsys, readers.recipe(out, load_meta(out), force=True))
    assert urls == [] and tok.decode(ids(out, 'train') + ids(out, 'val')) == text


# Letters, digits, punctuation, contractions, whitespace runs, non-ASCII; U+001C is whitespace to Python but
# not to GPT-2's regex, U+3000, U+00A0 and U+0085 are to both.
FRAGMENTS = ['a', 'Zé', '✓', '42', '.', '!', "'s", "'t", "n't", "'re", ' ', '  ', '   ', '\n', '\n\n',
             '\r\n', '\t', ' \n', '\xa0', '\u3000', '\x1c', '\x85']


def random_text(seed, n):
    return ''.join(random.Random(seed).choices(FRAGMENTS, k=n))


def merging():
    """A BPE that merges every pair of the FRAGMENTS' characters within a pre-token: a pre-token cut in two
    encodes otherwise."""
    chars = [c.encode() for c in dict.fromkeys(''.join(FRAGMENTS))]
    prefixes = [c[:k] for c in chars for k in range(2, len(c) + 1)]
    return encoding(list(dict.fromkeys(prefixes + [a + b for a in chars for b in chars])))


@pytest.mark.parametrize('name', ['bytes', 'gpt2'])
def test_a_long_document_is_tokenized_in_pieces_as_whole(monkeypatch, name):
    """No pre-token of GPT-2's regex holds whitespace after non-whitespace, and the regex has no lookbehind:
    one file cut at every such point (pieces of at least 0 characters; U+001C is no such point), 4 pieces a
    call, encodes as whole, and how far it is is said after each call."""
    enc = merging()
    monkeypatch.setattr(readers, 'gpt2_encoding', lambda: enc)
    text = random_text(0, 6000)
    write('long.txt', text)
    monkeypatch.setattr(prep, '_PIECE', 0)
    monkeypatch.setattr(prep, '_CHUNK', 4)
    said = []

    def progress(shown, line):
        said.append(line)
        return shown
    monkeypatch.setattr(prep, '_progress', progress)
    out = prepare('text', 'data', input='long.txt', tokenizer=name)
    whole = enc.encode_ordinary(text) if name == 'gpt2' else list(text.encode())
    assert (ids(out, 'train'), ids(out, 'val')) == tail_split(whole)
    cuts = sum(not a.isspace() and b in ' \t\n\r\v\f' for a, b in zip(text, text[1:]))
    assert len(said) == math.ceil((cuts + 1) / 4)
    # the same pieces however the text comes (a file is read a block at a time)
    assert list(prep._pieces(text[i:i + 7] for i in range(0, len(text), 7))) == list(prep._pieces([text]))


@pytest.mark.parametrize('name', ['bytes', 'gpt2'])
@pytest.mark.parametrize('read', [1, 2, 3, 7, 1 << 23])
def test_a_file_read_in_pieces_is_tokenized_as_whole(monkeypatch, capsys, name, read):
    """Reads of 1 to 7 bytes split the byte-order mark, CRLF, a character's bytes, words and an undecodable
    byte from the rest: train.bin and val.bin are the whole text's, the last tenth of its tokens val, with one
    warning naming the file. A folder's files, one only a byte-order mark, are a document each, every second
    one val."""
    enc = merging()
    monkeypatch.setattr(readers, 'gpt2_encoding', lambda: enc)
    monkeypatch.setattr(prep, '_READ', read)
    monkeypatch.setattr(prep, '_PIECE', 5)
    body = random_text(1, 3000).encode()
    raw = b'\xef\xbb\xbf' + body[:999] + b'\xff' + body[999:] + b'\xe2\x82'
    write('long.txt', raw)
    text = raw[3:].decode('utf-8', 'replace')
    whole = enc.encode_ordinary(text) if name == 'gpt2' else list(text.encode())
    out = prepare('text', 'data', input='long.txt', tokenizer=name)
    assert (ids(out, 'train'), ids(out, 'val')) == tail_split(whole)
    warned = capsys.readouterr().err.splitlines()
    assert len(warned) == 1 and 'long.txt' in warned[0]
    texts = [random_text(seed, 500) for seed in range(4)]
    texts[1] = ''
    for i, t in enumerate(texts):
        write(f'notes/{i}.txt', '\ufeff' + t)
    out = prepare('text', 'data', input='notes', tokenizer=name, val_every=2)
    docs = [enc.encode_ordinary(t) + [enc.eot_token] if name == 'gpt2' else list(t.encode()) for t in texts]
    assert (ids(out, 'train'), ids(out, 'val')) == (docs[0] + docs[2], docs[3])


def test_a_long_file_is_never_held_whole(monkeypatch):
    """A 3 MB file, whose tokens alone are 6 MB, read 64 KB and tokenized 4 x 4k characters at a time: what
    Python and numpy hold at once stays under 1 MB."""
    monkeypatch.setattr(prep, '_READ', 1 << 16)
    monkeypatch.setattr(prep, '_PIECE', 1 << 12)
    monkeypatch.setattr(prep, '_CHUNK', 4)
    write('long.txt', random_text(3, 1_500_000))
    tracemalloc.start()
    try:
        out = prepare('text', 'data', input='long.txt', tokenizer='bytes', workers=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(ids(out, 'train') + ids(out, 'val')) > 2_900_000 and peak < 1_000_000, peak


@pytest.mark.parametrize('max_mb, files', [(1e-4, ['a.py', 'json/b.py']),
                                           (1.0, ['a.py', 'json/b.py', 'z.py'])])
def test_python_stdlib_takes_py_files_by_path_up_to_the_cap(monkeypatch, capsys, max_mb, files):
    """Sorted by path components, test folders, site-packages and caches skipped, up to max_mb (100 bytes,
    where the second file ends); another cap for the same folder is refused without --force."""
    sources = {'a.py': 'x = 1\n' * 10, 'json/b.py': 'y = 222\n' * 5, 'z.py': 'z = 3\n' * 10, 'a.txt': 'no',
               'test/t.py': 'no', 'tests/t.py': 'no', 'site-packages/s.py': 'no', '__pycache__/c.py': 'no',
               'idle_test/i.py': 'no', 'dist-packages/d.py': 'no'}
    for rel, s in sources.items():
        write(f'lib/{rel}', s)
    monkeypatch.setattr(sysconfig, 'get_paths', lambda: {'stdlib': 'lib'})
    out = prepare('python_stdlib', 'data', max_mb=max_mb)
    parts = [tail_split(list(sources[f].encode())) for f in files]
    assert (ids(out, 'train'), ids(out, 'val')) == tuple(sum(p, []) for p in zip(*parts))
    assert '--max_mb' in one_error(capsys, 'python_stdlib', '--data_dir=data', '--max_mb=0.5')
    assert main_exits(capsys, 'python_stdlib', '--data_dir=data', f'--max_mb={max_mb}') == (0, [])
    assert load_meta(prepare('python_stdlib', 'default'))['max_mb'] == 16
    assert f'--max_mb={max_mb}' in shlex.split(readers.recipe(out, load_meta(out), force=True))


# -----------------------------------------------------------------------------
# openwebtext: local documents, tokenized in threads, streamed


class FakeParquet:
    """pyarrow.parquet, which is not a requirement, as prepare_data reads it: a '.parquet' file here is
    JSON."""

    class ParquetFile:
        def __init__(self, path):
            self.texts = json.loads(Path(path).read_text())

        def iter_batches(self, batch_size, columns):
            column = SimpleNamespace(to_pylist=lambda: self.texts)
            yield SimpleNamespace(column=lambda j: column)


@pytest.mark.parametrize('workers, threads', [(1, 1), (2, 2), (0, 2), (100000, 2)])
def test_openwebtext_local_streaming(tiny, monkeypatch, workers, threads):
    """13 documents in .jsonl, .txt and .parquet files (one column 'text', where a null is an empty document),
    in input order, in pieces, in chunks, in threads: as many as --workers says, 0 for every core, at most the
    cores (2 here)."""
    monkeypatch.setattr(prep, '_pyarrow_parquet', lambda: FakeParquet)
    docs = [f'document {i}: ' + 'words and more words. ' * (i % 4 + 1) for i in range(12)] + [None]
    docs[5] = 'a literal <|endoftext|> inside a document is text'
    # .jsonl is UTF-8, not only the ASCII of its escapes.
    docs[1] = 'café ✓ déjà vu, ' * 3
    rows = [json.dumps({'text': d, 'url': 'x'}, ensure_ascii=False) for d in docs[:5]]
    write('owt/a.jsonl', '\ufeff' + ''.join(row + '\n\n' for row in rows))
    write('owt/b.txt', docs[5])
    write('owt/p.parquet', json.dumps(docs[9:]))
    write('owt/sub/c.jsonl', ''.join(json.dumps({'text': d}) + '\n' for d in docs[6:9]))
    write('owt/ignored.csv', 'not,a,document')
    docs = docs[:6] + docs[9:] + docs[6:9]
    # Many small chunks, a document's pieces in several and one chunk ending a document and starting the next.
    monkeypatch.setattr(prep, '_CHUNK', 2)
    monkeypatch.setattr(prep, '_PIECE', 8)
    monkeypatch.setattr(os, 'cpu_count', lambda: 2)
    used = set()
    encode = tiny.encode_ordinary_batch

    def counted(texts, num_threads):
        used.add(num_threads)
        return encode(texts, num_threads=num_threads)
    monkeypatch.setattr(tiny, 'encode_ordinary_batch', counted)
    out = prepare('openwebtext', 'data', input='owt', workers=workers, val_every=4, name='owt')
    assert used == {threads}
    train = []
    val = []
    for i, d in enumerate(docs):
        (val if i % 4 == 3 else train).extend(tiny.encode_ordinary(d) + [256] if d else [])
    assert (ids(out, 'train'), ids(out, 'val')) == (train, val)
    assert (load_meta(out)['dataset'], load_meta(out)['documents']) == ('openwebtext', 13)


@pytest.mark.parametrize('content', ['PAR1 damaged', '["a text", 7]'])
def test_a_parquet_file_that_is_damaged_or_holds_no_texts_is_one_line_naming_it(monkeypatch, content):
    monkeypatch.setattr(prep, '_pyarrow_parquet', lambda: FakeParquet)
    write('owt/p.parquet', content)
    with pytest.raises(UsageError, match='owt/p.parquet'):
        prepare('openwebtext', 'data', input='owt', tokenizer='bytes', name='owt')
    assert not os.path.exists('data/owt')


# -----------------------------------------------------------------------------
# zero-shot test sets: tiny files in the published formats

WIKI = (' \n = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 : Unrecorded Chronicles is a tactical '
        'role @-@ playing game , released in 2011 .\n \n = = Gameplay = = \n \n The game takes 1 @,@ 000 '
        'turns .\n')
PTB = (" no it was n't black monday \n but while the new york stock exchange did n't fall apart friday as "
       "the dow jones industrial average plunged N points <unk> \n")
# A space before the last word, a newline before it, a line separator inside a passage (JSON may carry it
# raw).
LAMBADA = ['In my palm is a clear stone. "Figured you might need it," said Jack',
           'He looked at the stone, then\u2028at her.\n\n"Stone," she said. Stone',
           'She turned the page.\n\nSilence']


def jsonl(texts):
    return ''.join(json.dumps({'text': t}, ensure_ascii=False) + '\n' for t in texts)


def zipped(members):
    def make(path):
        with zipfile.ZipFile(path, 'w') as z:
            for name, text in members.items():
                z.writestr(name, text)
    return make


@pytest.mark.parametrize('name, files', [
    ('wikitext2', {'wiki.test.raw': WIKI}),
    ('wikitext2', {'w.zip': zipped({'wikitext-2-raw/wiki.train.raw': ' = A = \n',
                                    'wikitext-2-raw/wiki.test.raw': WIKI})}),
    ('ptb', {'ptb.test.txt': PTB}),
    ('ptb', {'ptb.test.txt': '\ufeff' + PTB}),
])
def test_test_sets_are_kept_as_published(tiny, capsys, name, files):
    """The test split's text as it is, from the file or its zip, as val, a row a line each followed by
    end-of-text, as the paper's release prepares them (WikiText's rows keep their newline and a blank line
    is an empty row; PTB's rows lose it); train is empty. A file of the wrong size or checksum is used, with a
    warning naming it."""
    for given, content in files.items():
        write(given, content)
    out = prepare(name, 'data', input=given)
    rows = {'wikitext2': ['', ' = Valkyria Chronicles III = \n', '', WIKI.split('\n')[3] + '\n', '',
                          ' = = Gameplay = = \n', '', ' The game takes 1 @,@ 000 turns .\n'],
            'ptb': PTB.split('\n')[:2]}[name]
    val = [i for row in rows for i in tiny.encode_ordinary(row) + [256]]
    assert (ids(out, 'train'), ids(out, 'val')) == ([], val)
    assert load_meta(out)['official_file'] is not True
    err = capsys.readouterr().err.splitlines()
    assert err and all(line.startswith('warning:') and given in line for line in err), err


@pytest.mark.parametrize('file, tokenizer', [('lambada_test.jsonl', 'gpt2'), ('lambada_test.json', 'gpt2'),
                                             ('lambada_test_plain_text.txt', 'gpt2'), ('l.jsonl', 'bytes')])
def test_lambada_passages_and_targets(tiny, capsys, file, tokenizer):
    """A passage a line ('\n' only), as JSON (known by name or content) or plain text; the target is its last
    word with the space before it, and each passage ends with end-of-text (bytes: a newline). A file named as
    the published one and not it is said to differ from it (its numbers are not the paper's)."""
    plain = file.endswith('.txt')
    passages = [t.replace('\n', ' ') for t in LAMBADA] if plain else LAMBADA
    # The original release: trailing spaces, blank lines between passages.
    write(file, ''.join(t + ' \n\n' for t in passages) if plain else jsonl(LAMBADA))
    out = prepare('lambada', 'data', input=file, tokenizer=tokenizer)
    val = ids(out, 'val')
    spans = np.load(os.path.join(out, 'val_targets.npy')).tolist()
    tok = get_tokenizer(tokenizer)
    end = 256 if tokenizer == 'gpt2' else ord('\n')
    words = [' Jack', ' Stone', ' Silence' if plain else 'Silence']
    for (p, s, e), text, word in zip(spans, passages, words):
        assert (tok.decode(val[p:s]) + word, tok.decode(val[s:e]), val[e]) == (text, word, end)
    # Each passage starts after the end-of-text of the one before.
    assert [p for p, _, _ in spans] + [len(val)] == [0] + [e + 1 for _, _, e in spans]
    assert (ids(out, 'train'), load_meta(out)['examples']) == ([], 3)
    differs = [line for line in capsys.readouterr().err.splitlines() if 'sha256' in line]
    assert len(differs) == (file == 'lambada_test.jsonl') and all(file in line for line in differs)

# -----------------------------------------------------------------------------
# CIFAR, from tarballs built here with the real layout

LAYOUT = {
    'cifar10': ('cifar-10-batches-py', [f'data_batch_{i}' for i in range(1, 6)], ['test_batch'],
                'batches.meta', 10),
    'cifar100': ('cifar-100-python', ['train'], ['test'], 'meta', 100),
}


def make_cifar(path, which, n=4, skip=(), edit=None, prefix=''):
    """Writes a CIFAR-format tar.gz of random images (cifar10 in pickle protocol 2, as published, cifar100 in
    5), edit=(member, {key: value}) applied; returns the images and labels of its train batches, then its test
    batch, as they should come out. prefix: before each member's name (./ as a repacked archive has it)."""
    top, train, test, meta_name, k = LAYOUT[which]
    rng = np.random.default_rng(0)
    labels = b'labels' if which == 'cifar10' else b'fine_labels'
    # CIFAR-100's coarse labels must not be taken for the fine ones.
    members = {b: {b'data': rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                   labels: rng.integers(0, k, n).tolist(), b'coarse_labels': [0] * n} for b in train + test}
    names = [f'class_{i}'.encode() for i in range(k)]
    members[meta_name] = {labels.replace(b'labels', b'label_names'): names}
    # Rows are R, G, B planes.
    images = np.concatenate([members[b][b'data'] for b in train + test]).reshape(-1, 3, 32, 32)
    ids = np.concatenate([members[b][labels] for b in train + test])
    if edit:
        members[edit[0]].update(edit[1])
    with tarfile.open(path, 'w:gz') as tf:
        # Not in batch order, on purpose.
        for b in reversed([b for b in members if b not in skip]):
            data = pickle.dumps(members[b], protocol=2 if which == 'cifar10' else 5)
            info = tarfile.TarInfo(f'{prefix}{top}/{b}')
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return images, ids


@pytest.mark.parametrize('which', ['cifar10', 'cifar100'])
def test_cifar_roundtrip(capsys, monkeypatch, which):
    """Pickle protocols 2 and 5 (and members named ./cifar-100-python/..., as tar repacks them); prepared
    again, it is said to be there, and text is refused its folder."""
    images, labels = make_cifar('c.tar.gz', which, prefix='./' if which == 'cifar100' else '')
    out = prepare(which, 'data', archive='c.tar.gz')
    # Not the official tarball: a warning naming it, not an error.
    assert 'c.tar.gz' in capsys.readouterr().err
    meta = load_meta(out)
    got = read_images(out, meta)
    assert [len(a) for a in got] == [len(images) - 4] * 2 + [4] * 2
    np.testing.assert_array_equal(np.concatenate(got[::2]), images)
    np.testing.assert_array_equal(np.concatenate(got[1::2]), labels)
    assert meta['classes'][-1] == f'class_{LAYOUT[which][-1] - 1}'
    np.testing.assert_allclose(meta['mean'], (got[0] / 255).mean(axis=(0, 2, 3)), atol=1e-6)
    np.testing.assert_allclose(meta['std'], (got[0] / 255).std(axis=(0, 2, 3)), atol=1e-6)
    assert main_exits(capsys, which, '--archive=c.tar.gz') == (0, [])
    # another archive is another set; the rebuild command reads the same one (offline, a download would fail)
    write('other.tar.gz', Path('c.tar.gz').read_bytes())
    assert 'other.tar.gz' in one_error(capsys, which, '--archive=other.tar.gz')
    assert f'--archive={os.path.abspath("c.tar.gz")}' in shlex.split(readers.recipe(out, meta, force=True))
    with pytest.raises(UsageError):
        load_meta(out, 'text')
    write('in.txt', 'hello there. ' * 20)
    assert f'data/{which}' in one_error(capsys, 'text', '--input=in.txt', f'--name={which}')
    # rebuilt as text with --force: none of the images' files is left beside the text's
    assert main_exits(capsys, 'text', '--input=in.txt', f'--name={which}', '--force')[0] == 0
    assert sorted(os.listdir(out)) == ['meta.json', 'train.bin', 'val.bin']
    # Where os.path is Windows', the archive's names are read as they are written, with '/'.
    monkeypatch.setattr(prep.os, 'path', ntpath)
    assert len(prep._read_cifar('c.tar.gz', prep.CIFAR[which])[0][0]) == len(images) - 4


def test_only_cifars_members_are_read_and_each_at_most_a_cap(monkeypatch, capsys):
    """Another member (here 1 MB) is not read; a member larger than the cap is refused in one line."""
    make_cifar('c.tar.gz', 'cifar10')
    with tarfile.open('c.tar.gz') as src, tarfile.open('c.tar', 'w') as tf:
        for m in src:
            tf.addfile(m, src.extractfile(m))
        info = tarfile.TarInfo('cifar-10-batches-py/readme.html')
        info.size = 2**20
        tf.addfile(info, io.BytesIO(bytes(info.size)))
    read = []
    real = tarfile.TarFile.extractfile
    monkeypatch.setattr(tarfile.TarFile, 'extractfile', lambda tf, m: read.append(m.name) or real(tf, m))
    prep._read_cifar('c.tar', prep.CIFAR['cifar10'])
    members = LAYOUT['cifar10'][1] + ['test_batch', 'batches.meta']
    assert sorted(read) == sorted(f'cifar-10-batches-py/{b}' for b in members)
    monkeypatch.setattr(prep, '_MEMBER_BYTES', 1000)
    assert 'data_batch' in one_error(capsys, 'cifar10', '--archive=c.tar')
    # the other CIFAR's archive: named as not the one asked for
    make_cifar('c100.tar.gz', 'cifar100')
    assert 'cifar-10-python.tar.gz' in one_error(capsys, 'cifar10', '--archive=c100.tar.gz')


def test_cifar_pickled_by_python_2_as_published_is_read():
    x = np.random.default_rng(0).integers(0, 256, (4, 3072), dtype=np.uint8)
    make_cifar('c.tar.gz', 'cifar10', edit=('test_batch', {b'data': as_python2(x)}))
    test_images = prep._read_cifar('c.tar.gz', prep.CIFAR['cifar10'])[0][2]
    np.testing.assert_array_equal(test_images, x.reshape(-1, 3, 32, 32))


# -----------------------------------------------------------------------------
# downloads, served from memory


def served(blob, urls, length=None):
    """urlopen serving blob, said to be `length` bytes long, and noting the urls asked for."""
    class Response(io.BytesIO):
        headers = {'Content-Length': str(length or len(blob))}

    def urlopen(req, timeout=None):
        urls.append(req.full_url)
        return Response(blob)
    return urlopen


@pytest.mark.parametrize('name', ['lambada', 'cifar10'])
def test_a_download_is_checked(tiny, monkeypatch, name):
    """A download whose checksum differs from the published one is refused and leaves nothing; one that
    matches is kept in downloads/ and used."""
    make_cifar('c.tar.gz', 'cifar10')
    blob = Path('c.tar.gz').read_bytes() if name == 'cifar10' else jsonl(LAMBADA).encode()
    urls = []
    monkeypatch.setattr(prep.urllib.request, 'urlopen', served(blob, urls))
    with pytest.raises(UsageError):
        prepare(name, 'data')
    assert not os.path.exists('data')
    table = prep.CIFAR if name == 'cifar10' else prep.EVAL_SETS
    monkeypatch.setitem(table[name], 'checksum', ('md5', hashlib.md5(blob).hexdigest()))
    meta = load_meta(prepare(name, 'data'))
    assert meta['source'] == urls[-1] and meta['official_file'] is True
    assert os.listdir('data/downloads') == [os.path.basename(urls[-1])]
    # A damaged copy in downloads/ is fetched again, a good one is not.
    write(f'data/downloads/{os.path.basename(urls[-1])}', b'junk')
    prepare(name, 'data', force=True)
    prepare(name, 'data', force=True)
    assert len(urls) == 3


@POSIX_ONLY
@pytest.mark.parametrize('name', ['lambada', 'cifar10'])
def test_a_download_never_writes_through_a_link_at_its_temp_files_name(tiny, monkeypatch, name):
    """A link planted by the temp file's name (it has the pid in it): what it leads to is kept."""
    make_cifar('c.tar.gz', 'cifar10')
    blob = Path('c.tar.gz').read_bytes() if name == 'cifar10' else jsonl(LAMBADA).encode()
    urls = []
    monkeypatch.setattr(prep.urllib.request, 'urlopen', served(blob, urls))
    table = prep.CIFAR if name == 'cifar10' else prep.EVAL_SETS
    monkeypatch.setitem(table[name], 'checksum', ('md5', hashlib.md5(blob).hexdigest()))
    write('mine', 'mine')
    os.makedirs('data/downloads')
    part = f"data/downloads/{os.path.basename(table[name]['url'])}.part-{os.getpid()}"
    os.symlink(os.path.abspath('mine'), part)
    prepare(name, 'data')
    assert len(urls) == 1 and Path('mine').read_text() == 'mine'


def test_a_download_cut_short_is_refused(monkeypatch):
    monkeypatch.setattr(prep.urllib.request, 'urlopen', served(b'ROMEO: but soft', [], length=99))
    with pytest.raises(UsageError):
        prepare('shakespeare', 'data', tokenizer='bytes')
    assert not os.path.exists('data')


# -----------------------------------------------------------------------------
# bad input: one line, exit 2, naming what is wrong, nothing written


class Evil:
    """Unpickled, it would run a command."""

    def __reduce__(self):
        return (os.system, ('touch pwned',))


class Reduced:
    """Pickled as `call(*args)`, then `state` set on it (a BUILD) if given: numpy's names, used as a tampered
    archive could."""

    def __init__(self, call, args, state=None):
        self.call, self.args, self.state = call, args, state

    def __reduce__(self):
        return (self.call, self.args) if self.state is None else (self.call, self.args, self.state)


def as_python2(x):
    """A uint8 array pickled as the official archives were, by Python 2: its strings come back as bytes."""
    u1 = Reduced(np.dtype, (b'u1', 0, 1), (3, b'|', None, None, None, -1, -1, 0))
    reconstruct = np.ndarray.__reduce__(x)[0]
    return Reduced(reconstruct, (np.ndarray, (0,), b'b'), (1, x.shape, u1, False, x.tobytes()))


def offline(req, timeout=None):
    raise urllib.error.URLError('[Errno -2] Name or service not known')


def given(argv, file, content, names=None):
    """A row of BAD: argv ending in --input= or --archive= a file holding content; the line names the file."""
    return f'{argv}={file}', names or file, {file: content}


def cifar(names, **kw):
    """A row of BAD: a CIFAR-10 archive made with make_cifar's keywords."""
    kw = {'which': 'cifar10', **kw}
    return given('cifar10 --archive', 'c.tgz', lambda path: make_cifar(path, **kw), names)


BINARY = bytes(range(256)) * 4
BAD = [  # (dataset and options, what the line names, files to write)
    # options out of their range or choices
    ('mnist', 'mnist', {}),
    ('openwebtext --val_every=-1', '--val_every', {}),
    ('openwebtext --workers=-1', '--workers', {}),
    ('python_stdlib --max_mb=0', '--max_mb', {}),
    ('cifar10 --tokenizer=gpt2', '--tokenizer', {}),
    # an input missing, or not one the dataset can read
    ('text', '--input', {}),
    ('', 'dataset', {}),
    ('text --input=x --name=..', '--name', {}),
    # the folder of downloads
    ('text --input=in.txt --name=downloads', '--name', {'in.txt': 'some text ' * 100}),
    # no --name: the folder's name, from --input, is no name
    ('text --input=.', '--input=.', {}),
    ('text --input=nope.txt', 'nope.txt', {}),
    ('text --input=bin', 'bin', {'bin/blob.so': BINARY}),
    ('cifar10 --archive=nowhere.tar.gz', 'nowhere.tar.gz', {}),
    # Offline: the option that takes a copy fetched by hand.
    ('cifar100', '--archive', {}),
    ('shakespeare --tokenizer=bytes', '--input', {}),
    given('text --input', 'one.txt', 'x'),
    ('openwebtext --input=empty --tokenizer=bytes', 'empty', {'empty': None}),
    ('openwebtext --input=owt', 'x.jsonl:2', {'owt/x.jsonl': '{"text": "fine"}\n{"body": "no text"}\n'}),
    ('openwebtext --input=owt', 'pyarrow', {'owt/train-0.parquet': b'PAR1'}),
    ('openwebtext --tokenizer=bytes', 'pyarrow', {}),
    # fewer documents than --val_every (a .txt is one), or every one val; no file of the kinds it reads
    ('openwebtext --input=owt.txt', '--val_every', {'owt.txt': 'plain text. ' * 50}),
    ('openwebtext --input=owt --val_every=1', '--val_every', {f'owt/{i}.txt': 'text' for i in range(3)}),
    ('openwebtext --input=owt', '.jsonl', {'owt/a.md': 'a note', 'owt/b.csv': 'a,b'}),
    given('wikitext2 --input', 'wiki.test.raw', WIKI.encode().replace(b'\xc5\x8d', b'\xf6')),
    given('wikitext2 --input', 'wiki.test.tokens', WIKI.replace('III', '<unk>')),
    given('wikitext2 --input', 'wiki.test.raw', ' a wiki article\n without a heading\n'),
    given('wikitext2 --input', 'w.zip', BINARY),
    given('wikitext2 --input', 'w.zip', zipped({'wikitext-2/wiki.test.tokens': WIKI})),
    given('ptb --input', 'ptb.test.txt', WIKI),
    given('ptb --input', 'ptb.test.txt', '\n\n'),
    # a copy saved with Windows' line endings: each row would keep a CR the published numbers never count
    given('wikitext2 --input', 'wiki.test.raw', WIKI.replace('\n', '\r\n')),
    given('ptb --input', 'ptb.test.txt', PTB.replace('\n', '\r\n')),
    given('lambada --input', 'l.jsonl', '{"text": "a fine passage"}\n{"body": "no text"}\n', 'l.jsonl:2'),
    given('lambada --input', 'l.jsonl', '{"text": "a fine passage"}\n{"text": "   alone"}\n', 'l.jsonl:2'),
    given('lambada --input', 'l.txt', '\n\n'),
    given('cifar10 --archive', 'c.tgz', BINARY),
    cifar('test_batch', skip=('test_batch',)),
    cifar('data_batch_1', edit=('data_batch_1', {b'data': Evil()})),
    cifar('data_batch_3', edit=('data_batch_3', {b'labels': [10] * 4})),
    cifar('data_batch_4', edit=('data_batch_4', {b'labels': [-1] * 4})),
    cifar('data_batch_2', edit=('data_batch_2', {b'labels': ['cat'] * 4})),
    cifar('test_batch', edit=('test_batch', {b'data': np.ones((4, 100), np.uint8)})),
    cifar('batches.meta', edit=('batches.meta', {b'label_names': [b'x']})),
    # numpy made to build an array of uninitialised memory, or one of another type: never called
    cifar('data_batch_1', edit=('data_batch_1', {b'data': Reduced(np.ndarray, ((4, 3072), 'u1'))})),
    cifar('data_batch_1', edit=('data_batch_1', {b'data': np.zeros((4, 3072), np.uint16)})),
    cifar('data_batch_1', edit=('data_batch_1', {b'data': np.zeros((4, 3072), object)})),
]


def test_a_typo_of_a_dataset_is_pointed_to_one_of_the_kind_the_script_reads():
    for kind, typed, meant in (('text', 'shakespear', 'shakespeare?'), ('images', 'shakespear', None),
                               ('images', 'cifar1', 'cifar10?'), ('text', 'cifar1', None)):
        with pytest.raises(UsageError) as e:
            load_meta(f'data/{typed}', kind)
        assert 'run: python prepare_data.py' in str(e.value)
        assert (meant in str(e.value)) if meant else 'did you mean' not in str(e.value), str(e.value)


def test_a_missing_input_is_named_before_the_vocabulary_is_fetched(monkeypatch, capsys):
    """Offline, GPT-2's vocabulary cannot be fetched: a missing --input is still what the line names."""
    def offline():
        raise prep.UsageError('could not load the GPT-2 vocab')
    monkeypatch.setattr(readers, 'gpt2_encoding', offline)
    for argv in ('wikitext2 --input=wiki.test.raw', 'openwebtext --input=owt/'):
        assert argv.split()[1] in one_error(capsys, *argv.split(), '--data_dir=data')
    assert not os.path.exists('data')


def test_a_name_that_is_a_path_is_refused_on_every_system(monkeypatch, capsys):
    """--name is one folder under --data_dir: a/b is refused, and so is a\\b where os.path is Windows'."""
    write('in.txt', 'some text ' * 100)
    assert '--name' in one_error(capsys, 'text', '--input=in.txt', '--name=a/b')
    monkeypatch.setattr(prep.os, 'path', ntpath)
    assert '--name' in one_error(capsys, 'text', '--input=in.txt', '--name=a\\b')


@pytest.mark.parametrize('argv, names, files', BAD)
def test_bad_input_is_one_line_naming_it_and_writes_nothing(tiny, capsys, monkeypatch, argv, names, files):
    monkeypatch.setattr(prep.urllib.request, 'urlopen', offline)
    # As if pyarrow were not installed.
    monkeypatch.setitem(sys.modules, 'pyarrow.parquet', None)
    for rel, content in files.items():
        write(rel, content)
    assert names in one_error(capsys, *argv.split(), '--data_dir=data')
    assert not os.path.exists('data') and not os.path.exists('pwned')


def test_a_failed_build_in_a_data_dir_that_was_there_leaves_it_as_it_was(tiny, capsys):
    """An empty data folder stays, and so does the dataset's own folder where it was there, empty."""
    write('empty.txt', '')
    os.makedirs('data')
    one_error(capsys, 'text', '--input=empty.txt', '--data_dir=data')
    assert os.listdir('data') == []
    os.makedirs('data/empty')
    one_error(capsys, 'text', '--input=empty.txt', '--data_dir=data')
    assert os.listdir('data') == ['empty']


def test_a_data_dir_or_dataset_folder_that_cannot_be_written_is_one_line(capsys, monkeypatch):
    """A file given as --data_dir (or above it), a file where the dataset's folder goes, a blank folder name:
    one line naming it (or its option), nothing written, and before any text is tokenized."""
    monkeypatch.setattr(prep, 'encode_arrays', None)
    write('README.md', 'a file')
    write('data/notes', 'a file where the dataset folder would go')
    for data_dir, name, named in (('README.md', 'x', 'README.md'), ('README.md/sub', 'x', 'README.md/sub'),
                                  ('data', 'notes', '--name'),
                                  ('', 'x', '--data_dir'), (' ', 'x', '--data_dir'), ('data', ' ', '--name')):
        line = one_error(capsys, 'text', '--input=README.md', f'--name={name}', f'--data_dir={data_dir}')
        assert named in line
    assert sorted(os.listdir()) == ['README.md', 'data'] and os.listdir('data') == ['notes']
    assert Path('data/notes').read_text() == 'a file where the dataset folder would go'


def test_a_data_dir_that_is_a_dataset_is_one_line_and_nothing_goes_in_it(capsys):
    """--data_dir=data/notes, a dataset's folder where the folder of datasets is meant: one line naming it."""
    write('notes.txt', 'some notes\n' * 500)
    assert main_exits(capsys, 'text', '--input=notes.txt')[0] == 0
    made = sorted(os.listdir('data/notes'))
    line = one_error(capsys, 'text', '--input=notes.txt', '--name=more', '--data_dir=data/notes')
    assert 'data/notes' in line
    # from inside it: named by its own name
    os.chdir('data/notes')
    line = one_error(capsys, 'text', '--input=../../notes.txt', '--name=more', '--data_dir=.')
    assert f'--data_dir={os.path.dirname(os.getcwd())}' in line
    assert sorted(os.listdir()) == made


@POSIX_ONLY
def test_a_data_dir_the_system_refuses_is_one_line(capsys, monkeypatch):
    """/proc refuses a new folder even to root: one line naming it, before any text is tokenized."""
    monkeypatch.setattr(prep, 'encode_arrays', None)
    write('README.md', 'a file')
    assert '/proc' in one_error(capsys, 'text', '--input=README.md', '--name=x', '--data_dir=/proc')


def test_a_dataset_is_never_written_inside_its_input(capsys, monkeypatch):
    """Text under data/ (the dataset would go into it), or the current folder as input: refused, before any
    text is tokenized, and nothing written; another --data_dir builds it."""
    write('data/notes/a.txt', 'a note about things. ' * 50)
    with monkeypatch.context() as m:
        m.setattr(prep, 'encode_arrays', None)
        assert '--data_dir' in one_line(one_error(capsys, 'text', '--input=data/notes'), 'data/notes')
        assert '--input=.' in one_error(capsys, 'text', '--input=.', '--name=here')
    assert os.listdir('data') == ['notes'] and os.listdir('data/notes') == ['a.txt']
    assert main_exits(capsys, 'text', '--input=data/notes', '--data_dir=sets')[0] == 0


def test_half_a_surrogate_pair_in_a_jsonl_is_replaced(capsys):
    """JSON may escape half a surrogate pair, which has no UTF-8: U+FFFD; a whole pair is its character."""
    write('owt/a.jsonl', '{"text": "bad \\ud800 x"}\n{"text": "fine \\ud83d\\ude00"}\n' * 2)
    out = prepare('openwebtext', 'data', input='owt', tokenizer='bytes', val_every=2)
    assert bytes(ids(out, 'train')) == 2 * 'bad \ufffd x'.encode()
    assert bytes(ids(out, 'val')) == 2 * 'fine \U0001f600'.encode()


def test_val_every_1_is_refused_before_any_text_is_tokenized(capsys, monkeypatch):
    monkeypatch.setattr(prep, 'encode_arrays', None)
    write('owt/a.jsonl', '{"text": "fine"}\n' * 3)
    line = one_error(capsys, 'openwebtext', '--input=owt', '--val_every=1', '--tokenizer=bytes')
    assert '--val_every' in line

# -----------------------------------------------------------------------------
# reliability: re-runs, --force, interrupted runs


def interrupt(shown, line):
    """Ctrl-C once the first tokens are on disk, where progress may be said."""
    raise KeyboardInterrupt


def full_disk_at_val_bin(src, dst, real=os.replace):
    if dst.endswith('val.bin'):
        raise OSError(28, 'No space left on device')
    real(src, dst)


def test_a_dataset_is_kept_whole_until_a_rebuild_is_complete(tiny, capsys, monkeypatch):
    """A second run keeps the dataset; another tokenizer, dataset, input or split for its folder is refused
    without --force; Ctrl-C while --force rebuilds keeps the old dataset as it was; a full disk while the new
    files move in leaves no meta.json (half old, half new), and the next run rebuilds it."""
    write('in.txt', 'version one. ' * 40)
    # --name is the file's stem; no staging folder is left.
    assert main_exits(capsys, 'text', '--input=in.txt') == (0, [])
    # The input by its whole path: the rebuild command works from any folder.
    assert load_meta('data/in')['input'] == os.path.abspath('in.txt')
    before = {f: Path('data/in', f).read_bytes() for f in os.listdir('data/in')}
    assert sorted(before) == ['meta.json', 'train.bin', 'val.bin']
    write('in.txt', 'version two, longer. ' * 40)
    assert main_exits(capsys, 'text', '--input=in.txt') == (0, [])
    # Options given their default values are as if not given.
    assert main_exits(capsys, 'text', '--input=in.txt', '--tokenizer=', '--workers=0') == (0, [])
    # another tokenizer, dataset or input for the same folder (the same input by a link: the next test)
    for argv in (['text', '--input=in.txt', '--tokenizer=gpt2'], ['lambada', '--input=in.txt', '--name=in'],
                 ['text', '--input=other.txt', '--name=in'], ['text', '--input=in.txt', '--val_every=3']):
        assert 'data/in' in one_error(capsys, *argv)
    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(prep, '_progress', interrupt)
        prepare('text', 'data', input='in.txt', force=True)
    assert {f: Path('data/in', f).read_bytes() for f in os.listdir('data/in')} == before
    with monkeypatch.context() as m, pytest.raises(OSError):
        m.setattr(prep.os, 'replace', full_disk_at_val_bin)
        prepare('text', 'data', input='in.txt', force=True)
    assert os.listdir('data') == ['in'] and sorted(os.listdir('data/in')) == ['train.bin', 'val.bin']
    # A build killed (kill -9, a second Ctrl-C while one cleans up) leaves its staging folder: the next build
    # names it, and leaves it, since another build may be using it.
    os.makedirs('data/in/.partial-killed')
    code, err = main_exits(capsys, 'text', '--input=in.txt')
    assert code == 0 and one_line('\n'.join(err), 'data/in/.partial-killed')
    # And so does a run that finds the dataset prepared.
    code, err = main_exits(capsys, 'text', '--input=in.txt')
    assert code == 0 and one_line('\n'.join(err), 'data/in/.partial-killed')
    assert os.path.isdir('data/in/.partial-killed')
    # Bytes by default, the last tenth of the text val.
    assert (ids('data/in', 'train'), ids('data/in', 'val')) == tail_split(list(b'version two, longer. ' * 40))


@POSIX_ONLY
def test_the_same_input_by_a_link_is_the_same_dataset(capsys):
    write('in.txt', 'version one. ' * 40)
    assert main_exits(capsys, 'text', '--input=in.txt') == (0, [])
    os.symlink('in.txt', 'link.txt')
    assert main_exits(capsys, 'text', '--input=link.txt', '--name=in') == (0, [])


def test_two_nodes_prepare_one_shared_folder_at_once(monkeypatch):
    """Each node's first process may prepare a shared data_dir at the same moment: here another build runs
    whole while this one moves its files in. Each stages in a folder of its own and moves meta.json last."""
    write('in.txt', 'hello there. ' * 20)
    real = os.replace

    def the_other_node_prepares_now(src, dst):
        monkeypatch.setattr(os, 'replace', real)
        prepare('text', 'data', input='in.txt', force=True)
        real(src, dst)
    monkeypatch.setattr(os, 'replace', the_other_node_prepares_now)
    out = prepare('text', 'data', input='in.txt')
    assert ids(out, 'train') + ids(out, 'val') == list(b'hello there. ' * 20)
    assert os.listdir('data') == ['in']


@POSIX_ONLY
def test_a_dataset_folder_that_links_to_another_filesystem_is_staged_there(monkeypatch):
    """os.replace cannot move a file from one filesystem to another: the build stages in the folder the link
    points to, not in data_dir."""
    write('in.txt', 'hello there. ' * 20)
    os.makedirs('elsewhere/in')
    os.makedirs('data')
    os.symlink(os.path.abspath('elsewhere/in'), 'data/in')
    real = os.replace

    def same_filesystem_only(src, dst):
        # Here data/ and elsewhere/ are two filesystems.
        if ('elsewhere' in Path(src).resolve().parts) != ('elsewhere' in Path(dst).resolve().parts):
            raise OSError(18, 'Invalid cross-device link', src)
        real(src, dst)
    monkeypatch.setattr(os, 'replace', same_filesystem_only)
    prepare('text', 'data', input='in.txt')
    assert ids('data/in', 'train') + ids('data/in', 'val') == list(b'hello there. ' * 20)


@POSIX_ONLY
@pytest.mark.parametrize('sig', ['SIGINT', 'SIGTERM', 'SIGHUP'])
def test_ctrl_c_during_a_build(sig):
    """A real SIGINT to the whole process group, as a terminal's Ctrl-C sends, SIGTERM, as a scheduler
    sends, or SIGHUP, as a closed terminal sends: exit 130, one line, nothing left."""
    write('owt/a.jsonl', (json.dumps({'text': 'a document ' * 5}) + '\n') * 400_000)
    p = subprocess.Popen([sys.executable, os.path.join(REPO, 'prepare_data.py'), 'openwebtext',
                          '--tokenizer=bytes', '--workers=2', '--input=owt', '--data_dir=data'],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=as_from_a_terminal)
    deadline = time.time() + 30
    # Wait for the staging folder: the build has started.
    while not (os.path.isdir('data') and os.listdir('data')) and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)
    os.killpg(p.pid, getattr(signal, sig))
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130 and len(err.strip().splitlines()) == 1, (out, err)
    # No dataset, no staging folder, and the data_dir this run made is gone.
    assert not os.path.exists('data')


@POSIX_ONLY
def test_windows_ctrl_break_ends_a_build_as_ctrl_c_does(monkeypatch):
    """Windows' Ctrl-Break is SIGBREAK, which this system lacks: SIGUSR1 stands in for it. Unhandled, it would
    kill the build and leave its staging folder behind."""
    monkeypatch.setattr(signal, 'SIGBREAK', signal.SIGUSR1, raising=False)
    write('in.txt', 'hello there. ' * 20)

    def break_mid_build(*args):
        os.kill(os.getpid(), signal.SIGUSR1)
    stops = ['SIGINT', 'SIGTERM', 'SIGHUP', 'SIGUSR1']
    before = {name: signal.getsignal(getattr(signal, name)) for name in stops}
    signal.signal(signal.SIGUSR1, lambda *args: None)
    try:
        monkeypatch.setattr(prep, '_text_dataset', break_mid_build)
        with pytest.raises(KeyboardInterrupt):
            prep.main(['text', '--input=in.txt', '--data_dir=data'])
    finally:
        for name, handler in before.items():
            signal.signal(getattr(signal, name), handler)
    assert not os.path.exists('data')


def test_a_write_that_fails_names_the_file_and_leaves_nothing():
    """A full disk, as files of at most 4 kB make it: a write past that fails without a file name (EFBIG
    where a full disk says ENOSPC). numpy's tofile to a path said neither the file nor why. (POSIX only.)"""
    resource = pytest.importorskip('resource')
    write('w.txt', ' = Title = \n' + ' some text here .\n' * 4357)
    p = python(os.path.join(REPO, 'prepare_data.py'), 'wikitext2', '--input=w.txt', '--tokenizer=bytes',
               '--data_dir=data', cwd='.',
               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)))
    ended(p, 2, 'val.bin', '--data_dir=data')
    assert os.listdir() == ['w.txt']


@NEEDS_DEV_FULL
def test_an_array_that_cannot_be_written_says_so():
    """np.save into /dev/full ends without an error (numpy's buffered last bytes); an image set's arrays
    and LAMBADA's targets are written so that a full disk raises."""
    with pytest.raises(OSError):
        prep._save('/dev/full', np.zeros(100, dtype=np.uint8))


@pytest.mark.parametrize('text', ['{"kind": "text",', '[1, 2]', '"text"'])
def test_a_meta_json_that_is_not_an_object_names_the_command_that_rebuilds_it(text):
    """Text of one's own from PATH; asked for images, an image set."""
    write('data/notes/meta.json', text)
    for kind, made in (('text', 'text --input=PATH'), ('images', 'cifar10')):
        with pytest.raises(UsageError) as e:
            load_meta('data/notes', kind)
        assert 'data/notes/meta.json' in str(e.value)
        assert f'python prepare_data.py {made} --name=notes --data_dir=data --force' in str(e.value)


def test_every_row_of_a_batch_is_checked_against_the_vocab():
    ids = np.array([[1, 2], [3, 256]], np.uint16)
    with pytest.raises(UsageError, match="256"):
        readers.check_ids("data/x", "train", ids, {"vocab_size": 256, "tokenizer": "bytes"})


def test_the_rebuild_in_the_checkpoint_s_tokenizer_names_that_tokenizer():
    """A dataset in bytes, a model in gpt2: the command rebuilds it in gpt2, not in bytes again."""
    meta = {"dataset": "shakespeare", "tokenizer": "bytes", "kind": "text"}
    line = readers.recipe(os.path.join("data", "shakespeare"), meta, force=True, tokenizer="gpt2")
    assert "--tokenizer=gpt2" in line and "--tokenizer=bytes" not in line


def test_a_dataset_in_the_current_folder_is_rebuilt_there():
    assert "--data_dir=." in readers.recipe("cifar10", {"kind": "images"}).split()


@pytest.mark.parametrize("count, ok", [(True, False), (1, True)])
def test_a_count_in_meta_json_is_a_number_not_true(tmp_path, count, ok):
    meta = dict(kind="images", num_classes=count, channels=1, image_size=8, classes=["a"], mean=[0.5],
                std=[0.25])
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    if ok:
        readers.load_meta(str(tmp_path), "images")
    else:
        with pytest.raises(UsageError, match="num_classes"):
            readers.load_meta(str(tmp_path), "images")


def test_a_vocab_as_large_as_uint16_holds_is_read(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps(dict(kind="text", tokenizer="gpt2", vocab_size=2**16)))
    assert readers.load_meta(str(tmp_path), "text")["vocab_size"] == 2**16


@pytest.mark.skipif(not os.path.exists('/dev/zero'), reason='no /dev/zero')
def test_a_meta_json_that_never_ends_is_damaged_not_read_until_the_memory_runs_out(tmp_path):
    (tmp_path / 'meta.json').symlink_to('/dev/zero')
    with pytest.raises(UsageError, match='meta.json'):
        load_meta(str(tmp_path))


def test_json_nested_deeper_than_python_recurses_is_a_damaged_file_or_line(tmp_path):
    deep = '[' * 100000 + ']' * 100000
    (tmp_path / 'meta.json').write_text(deep)
    with pytest.raises(UsageError, match='meta.json'):
        load_meta(str(tmp_path))
    with pytest.raises(UsageError, match='a.jsonl:1'):
        prep._json_text(deep, 'a.jsonl:1')


def test_a_warning_shows_the_control_characters_of_a_files_name(tmp_path, monkeypatch, capsys):
    """A folder's file whose name holds a terminal's escape sequence, and bytes that are not UTF-8: the
    warning names it, and holds no control character."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'notes').mkdir()
    (tmp_path / 'notes' / 'a\x1b]0;title\x07b.txt').write_bytes(b'hello world \xff more words\n' * 40)
    (tmp_path / 'notes' / 'c.txt').write_text('plain words here\n' * 40)
    prep.main(['text', '--input=notes', '--name=n', '--tokenizer=bytes', '--data_dir=d'])
    warned = [line for line in capsys.readouterr().err.splitlines() if 'UTF-8' in line]
    assert len(warned) == 1 and 'title' in warned[0] and all(c.isprintable() for c in warned[0])


# what a mutation audit found unpinned


def test_a_quick_build_prints_one_line(capsys):
    """Progress comes every 10 s, not for every group of pieces."""
    write('notes.txt', 'some notes of mine. ' * 100)
    prepare('text', 'data', input='notes.txt')
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_a_split_of_no_train_tokens_or_of_fewer_documents_than_val_every_is_refused():
    """An empty first document and --val_every=2 leave train.bin empty: refused, not marked complete; one
    document with --val_every=2: the line names --val_every."""
    write('owt/a.jsonl', '{"text": ""}\n{"text": "hello world"}\n')
    with pytest.raises(UsageError):
        prepare('openwebtext', 'data', input='owt', tokenizer='bytes', val_every=2)
    assert not os.path.exists('data/openwebtext/meta.json')
    write('one/a.txt', 'plain text. ' * 50)
    with pytest.raises(UsageError, match='--val_every'):
        prepare('openwebtext', 'data', input='one', tokenizer='bytes', val_every=2, name='one')


def test_a_nul_past_a_file_s_first_bytes_makes_it_binary_and_a_bad_byte_is_named_where_it_is(monkeypatch,
                                                                                            capsys):
    """A NUL at byte 100 still makes a file binary (skipped, said); the not-UTF-8 warning's byte counts the
    bytes the decoder still holds from the read before (a character cut between reads)."""
    write('in/a.txt', 'some notes of mine. ' * 50)
    write('in/b.dat', b'x' * 100 + b'\0' + b'y' * 100)
    assert load_meta(prepare('text', 'data', input='in'))['documents'] == 1
    assert 'b.dat' in capsys.readouterr().err
    monkeypatch.setattr(prep, '_READ', 4)
    write('cut.txt', b'abcdef\xc3\xa9\xffyz' + b' more text' * 20)
    prepare('text', 'data', input='cut.txt')
    assert '(byte 8)' in capsys.readouterr().err


@pytest.mark.parametrize('layout', [{'main': {'plain_text/train-00000-of-00001.parquet': 4,
                                              'plain_text/test-00000-of-00001.parquet': 3}},
                                    {'refs/convert/parquet': {'plain_text/train/0000.parquet': 4,
                                                              'plain_text/test/0000.parquet': 3}}])
def test_openwebtext_from_the_hub_reads_its_train_files_only(monkeypatch, layout):
    """The repo's own files, else the hub's conversion ({config}/{split}/0000.parquet): a parquet file of
    another split in the download is no part of the dataset."""
    monkeypatch.setattr(prep, '_pyarrow_parquet', lambda: FakeParquet)

    def snapshot_download(repo, repo_type, revision, allow_patterns, local_dir):
        for rel, count in layout.get(revision, {}).items():
            write(os.path.join(local_dir, rel), json.dumps(['a text'] * count))
        os.makedirs(local_dir, exist_ok=True)
        return local_dir
    monkeypatch.setitem(sys.modules, 'huggingface_hub', SimpleNamespace(snapshot_download=snapshot_download))
    assert load_meta(prepare('openwebtext', 'data', tokenizer='bytes', val_every=2))['documents'] == 4


def test_a_lambada_line_of_spaces_is_a_blank_line():
    write('l.txt', 'the cat sat on the mat\n   \nthe dog ran in the park\n')
    assert load_meta(prepare('lambada', 'data', input='l.txt', tokenizer='bytes'))['examples'] == 2


@pytest.mark.parametrize('data', [np.asfortranarray(np.zeros((4, 3072), np.uint8)),
                                  np.zeros((4, 3072), np.int8)])
def test_cifar_pixels_in_another_order_or_type_of_the_same_size_are_refused(data):
    """Fortran-ordered bytes or int8 would be read as C-ordered uint8: images scrambled unsaid. A CIFAR of
    one's own archive names it as its source."""
    make_cifar('ok.tgz', 'cifar10')
    assert load_meta(prepare('cifar10', 'data', archive='ok.tgz'))['source'] == os.path.abspath('ok.tgz')
    make_cifar('c.tgz', 'cifar10', edit=('data_batch_1', {b'data': data}))
    with pytest.raises(UsageError, match='data_batch_1'):
        prepare('cifar10', 'data', archive='c.tgz', name='other')
