"""
Reading what prepare_data.py writes: a dataset's meta.json, and the tokenizer it names. The scripts that
read datasets or checkpoints (train_gpt.py, sample.py, eval_gpt.py) import this, not the preparation script.

Two tokenizers: 'bytes' (the 256 byte values of UTF-8 text, no download) and 'gpt2' (tiktoken's GPT-2 BPE,
50257 ids, whose vocabulary tiktoken downloads once and caches).
"""
import json
import os

import numpy as np

from options import UsageError


class Tokenizer:
    """name, vocab_size, eot (None for bytes), encode(str) -> list[int], decode(list[int]) -> str."""

    def __init__(self, name, vocab_size, eot=None, enc=None):
        self.name, self.vocab_size, self.eot, self._enc = name, vocab_size, eot, enc

    def encode(self, s):
        if self._enc is None:
            return list(s.encode('utf-8'))
        return self._enc.encode_ordinary(s)  # a literal '<|endoftext|>' in a document is just text

    def encode_array(self, s):
        """encode() as a uint16 array; the fast path for preparing data."""
        if self._enc is None:
            return np.frombuffer(s.encode('utf-8'), dtype=np.uint8).astype(np.uint16)
        return np.array(self._enc.encode_ordinary(s), dtype=np.uint16)

    def decode(self, ids):
        # tensors and arrays welcome; ids past the vocab (a padded model head, 50304) are dropped
        ids = [int(i) for i in ids if 0 <= int(i) < self.vocab_size]
        if self._enc is None:  # a model can emit half a UTF-8 character: replace, never raise
            return bytes(ids).decode('utf-8', errors='replace')
        return self._enc.decode(ids, errors='replace')

    def token_bytes(self, t):
        """The raw bytes of one token; a token can end inside a UTF-8 character (for streamed output)."""
        return bytes([int(t)]) if self._enc is None else self._enc.decode_single_token_bytes(int(t))

    def __repr__(self):
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, eot={self.eot})"


def _gpt2_encoding():
    """tiktoken's GPT-2 BPE. Tests monkeypatch this to stay offline."""
    try:
        import tiktoken
    except ImportError:
        raise UsageError("the gpt2 tokenizer needs tiktoken: pip install tiktoken") from None
    try:
        return tiktoken.get_encoding('gpt2')
    except Exception as e:  # it downloads the vocab once, then reads its cache
        raise UsageError(f"could not load the GPT-2 vocab: tiktoken downloads it on first use and that failed "
                         f"({type(e).__name__}, no network?); set TIKTOKEN_CACHE_DIR to a folder holding a cached "
                         f"copy") from None


def get_tokenizer(name, encoding=None):
    """'bytes' or 'gpt2'; `encoding` injects a tiktoken Encoding in place of the real GPT-2 one."""
    if name == 'bytes':
        return Tokenizer('bytes', 256)
    if name != 'gpt2':
        raise UsageError(f"unknown tokenizer {name!r} (known: bytes, gpt2)")
    enc = encoding if encoding is not None else _gpt2_encoding()
    if enc.n_vocab > 2**16:  # ids go to vocab_size-1 and are stored as uint16
        raise UsageError(f"vocab of {enc.n_vocab} does not fit uint16 token files (at most 65536)")
    return Tokenizer('gpt2', enc.n_vocab, eot=enc.eot_token, enc=enc)


def load_meta(dataset_dir):
    """The dataset's meta.json as a dict; a UsageError with the command to run if it is not prepared."""
    path = os.path.join(dataset_dir, 'meta.json')
    if not os.path.exists(path):
        root, name = os.path.split(os.path.normpath(dataset_dir))
        raise UsageError(f"{dataset_dir} is not a prepared dataset (no meta.json); run: "
                         f"python prepare_data.py {name} --data_dir={root or '.'}")
    try:
        with open(path) as f:
            return json.load(f)
    except ValueError as e:
        raise UsageError(f"{path} is not valid JSON ({e}); rebuild with --force") from None
