"""Reading a prepared dataset (prepare_data.py writes them): its meta.json, the tokenizer it names, its token
files and its image files. The trainers, sample.py and eval_gpt.py import this, not prepare_data.py.

A dataset folder holds train.bin and val.bin (raw uint16 token ids) or {train,test}_{images,labels}.npy, and
meta.json, written last: if it is there, the dataset is complete. get_tokenizer(meta['tokenizer']) decodes.
"""
import json
import os
import reprlib
from dataclasses import dataclass

import numpy as np

from options import UsageError, near, shell_join


@dataclass
class Tokenizer:
    """'bytes' (UTF-8's 256 byte values, no download; eot None) or 'gpt2' (tiktoken's GPT-2 BPE, 50257
    ids)."""
    name: str
    vocab_size: int
    eot: int = None
    enc: object = None

    def encode(self, s):
        """A literal '<|endoftext|>' in a document is just text."""
        return list(s.encode("utf-8")) if self.enc is None else self.enc.encode_ordinary(s)

    def decode(self, ids):
        """Tensors and arrays welcome; ids past the vocab (a padded model head) are dropped, half a UTF-8
        character is replaced."""
        return b"".join(map(self.token_bytes, ids)).decode("utf-8", errors="replace")

    def token_bytes(self, t):
        """One token's raw bytes, which may end inside a UTF-8 character (streamed output); b'' past the
        vocab."""
        if not 0 <= int(t) < self.vocab_size:
            return b""
        return bytes([int(t)]) if self.enc is None else self.enc.decode_single_token_bytes(int(t))


def gpt2_encoding():
    """tiktoken's GPT-2 BPE. Tests monkeypatch this to stay offline."""
    try:
        import tiktoken
    except ImportError:
        raise UsageError("the gpt2 tokenizer needs tiktoken: pip install tiktoken") from None
    # It downloads the vocab once, then reads its cache.
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:
        raise UsageError(f"could not load the GPT-2 vocab: tiktoken downloads it on first use and that "
                         f"failed ({type(e).__name__}, no network?); on a machine with the network, "
                         f"python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\" with "
                         f"TIKTOKEN_CACHE_DIR set to a folder fills it: copy that folder here and set "
                         f"TIKTOKEN_CACHE_DIR to it") from None


def get_tokenizer(name):
    """'bytes' or 'gpt2'."""
    if name == "bytes":
        return Tokenizer("bytes", 256)
    if name != "gpt2":
        raise UsageError(f"unknown tokenizer {name!r} (known: {', '.join(TOKENIZERS)})")
    enc = gpt2_encoding()
    return Tokenizer("gpt2", enc.n_vocab, eot=enc.eot_token, enc=enc)


TOKENIZERS = ("bytes", "gpt2")
# prepare_data.py's datasets of images; any other name is text, its own if none of these
IMAGES = ("cifar10", "cifar100")
TEXTS = ("python_stdlib", "shakespeare", "openwebtext", "wikitext2", "ptb", "lambada")


def recipe(folder, meta=None, force=False, tokenizer=None):
    """The command that prepares (with force: rebuilds) the dataset in `folder` as its `meta` says, in
    `tokenizer` if given (a model's), from the --input it was built from if meta.json says one. A name none of
    prepare_data.py's datasets has is text of one's own (from PATH if meta.json names no input: an older
    set), or with meta's kind 'images', an image set made from the CIFAR of its classes (from the archive
    meta.json names, if any)."""
    root, name = os.path.split(os.path.normpath(folder))
    meta = meta or {}
    # A meta.json written by hand beside token files of one's own (nanoGPT's; it names no dataset) has no
    # build to run again, but in another tokenizer.
    if force and not tokenizer and "tokenizer" in meta and "dataset" not in meta:
        return "correct its meta.json, written by hand (docs/training.md, From nanoGPT)"
    built = meta.get("dataset", name)
    if built not in IMAGES + TEXTS:
        built = "text"
        cifar = f"cifar{meta.get('num_classes')}"
        if meta.get("kind") == "images":
            built = cifar if cifar in IMAGES else IMAGES[0]
    args = ["python", "prepare_data.py", built]
    if built == "text" or "input" in meta:
        args.append(f"--input={meta.get('input', 'PATH')}")
    if "archive" in meta:
        args.append(f"--archive={meta['archive']}")
    if built != name:
        args.append(f"--name={name}")
    args.append(f"--data_dir={root or '.'}")
    # A split of every Nth document (None: the dataset's own) and python_stdlib's size.
    for key in ("val_every", "max_mb"):
        if meta.get(key):
            args.append(f"--{key}={meta[key]}")
    tokenizer = tokenizer or meta.get("tokenizer")
    if tokenizer in TOKENIZERS:
        args.append(f"--tokenizer={tokenizer}")
    if force:
        args.append("--force")
    return shell_join(args)


def dataset_folder(data_dir, name):
    """data_dir/name. One line for a --data_dir that is itself a dataset's folder (a run would prepare its
    data inside it), or a --dataset that is a path from here to one (data/notes): the pair of options meant.
    A path data_dir holds (owt/v2), or an absolute one, is the dataset it names."""
    folder = os.path.join(data_dir, name)
    given = [data_dir]
    # A path from here (data/notes) is one only where data_dir has nothing by that name.
    if os.path.basename(name) != name and not os.path.exists(folder):
        given.append(name)
    for path in given:
        if os.path.isfile(os.path.join(path, "meta.json")):
            root, base = os.path.split(os.path.normpath(path))
            # From inside it (--data_dir=.) its name is the folder's own.
            if base in (".", ".."):
                root, base = os.path.split(os.path.abspath(path))
            raise UsageError(f"{path} is a dataset: {base} in --data_dir={root or '.'} (--data_dir is the "
                             f"folder datasets are in)")
    return folder


def load_meta(folder, kind=None, model_meta=None):
    """A dataset folder's meta.json, checked to hold `kind` ('text' or 'images') and to share the tokenizer of
    `model_meta` (a checkpoint's meta) if given. A dataset not prepared is one line with the command that
    prepares it; a --data_dir that is a file is the OSError handler's to name."""
    path = os.path.join(folder, "meta.json")
    try:
        # utf-8-sig: as utf-8, less the byte-order mark some Windows editors put first.
        # At most 1 MiB, past any meta.json (CIFAR-100's is 2 KB): a link to /dev/zero would be read until the
        # memory runs out; the text cut there is not JSON.
        with open(path, encoding="utf-8-sig") as f:
            text = f.read(2**20 + 1)
    except FileNotFoundError:
        root, name = os.path.split(os.path.normpath(folder))
        if kind == "text" and name in IMAGES:
            raise UsageError(f"{name} is a set of images, for train_vit.py; name a text dataset") from None
        command = recipe(folder, tokenizer=model_meta and model_meta.get("tokenizer"))
        if kind == "images" and name not in IMAGES:
            command = f"{recipe(os.path.join(root, IMAGES[0]))} (or {IMAGES[1]}), and --dataset={IMAGES[0]}"
        # A name a letter or two off one of prepare_data.py's datasets of this kind is likely a typo of it.
        ours = {"images": IMAGES, "text": TEXTS}.get(kind, IMAGES + TEXTS)
        typo = "" if name in ours else near(name, ours)
        # nanoGPT's prepare.py writes the token files alone.
        if os.path.isfile(os.path.join(folder, "train.bin")):
            typo += "; for token files of nanoGPT's, docs/training.md says what meta.json to write"
        raise UsageError(f"{folder} is not a prepared dataset (no meta.json); run: {command}{typo}") from None
    try:
        meta = json.loads(text)
        if not isinstance(meta, dict):
            raise ValueError(f"a {type(meta).__name__}, not an object")
    # A JSON nested deeper than Python recurses is a RecursionError.
    except (ValueError, RecursionError) as e:
        command = recipe(folder, {"kind": kind}, force=True)
        raise UsageError(f"{path} is not a JSON object ({e}); rebuild it: {command}") from None
    # The fields the readers check, each with a test of its value: a kind they know; a tokenizer get_tokenizer
    # knows, bytes' 256 ids or as many as uint16 token files hold; counts of at least 1, a name for each class
    # and, for train_vit to standardize the images, a mean in 0..1 and a std above 0 of each channel;
    # LAMBADA's targets, if any, the name of a file in the folder (eval_gpt opens it), not a path to another.
    def of(values):
        # A range takes ints only (another value it would compare with each of its numbers), the others names.
        typed = int if isinstance(values, range) else str
        return lambda value: type(value) is typed and value in values

    def each(count, ok):
        # A list of one value per class or channel: the count is a field checked before it.
        return lambda value: type(value) is list and len(value) == meta[count] and all(map(ok, value))

    vocabs = range(256, 257) if meta.get("tokenizer") == "bytes" else range(1, 2**16 + 1)
    counts = of(range(1, 2**31))

    def name(value):
        return value is None or type(value) is str and os.path.basename(value) == value not in ("", ".", "..")

    fields = dict(text=dict(tokenizer=of(TOKENIZERS), vocab_size=of(vocabs), targets=name),
                  images=dict(num_classes=counts, channels=counts, image_size=counts,
                              classes=each("num_classes", lambda name: type(name) is str),
                              mean=each("channels", lambda x: type(x) in (int, float) and 0 <= x <= 1),
                              std=each("channels", lambda x: type(x) in (int, float) and 0 < x <= 1)))
    # str(): a kind may be any JSON value, a list too.
    own = fields.get(str(meta.get("kind")), {})
    if kind is not None and own and meta["kind"] != kind:
        raise UsageError(f"{folder} holds {meta['kind']}, not {kind}; pick another dataset or --data_dir")
    # A set whose kind is damaged is rebuilt as the kind asked for; a long list is shown cut short.
    for key, ok in dict(kind=of(fields), **own).items():
        if not ok(meta.get(key)):
            raise UsageError(f"{path} is damaged: its {key} is {reprlib.repr(meta.get(key))}; rebuild it: "
                             f"{recipe(folder, dict(meta, kind=kind or meta.get('kind')), force=True)}")
    want = model_meta and (model_meta.get("tokenizer"), model_meta.get("vocab_size"))
    if want and want != (meta.get("tokenizer"), meta.get("vocab_size")):
        raise UsageError(f"{folder} uses tokenizer {meta.get('tokenizer')} ({meta.get('vocab_size')} ids), "
                         f"the checkpoint was trained with {want[0]} ({want[1]} ids); rebuild it in that "
                         f"tokenizer: {recipe(folder, meta, force=True, tokenizer=want[0])} (or under "
                         f"another --data_dir, to keep this one)")
    return meta


def read_tokens(folder, meta, split):
    """A text dataset's split ('train' or 'val') as a read-only uint16 memmap, checked against meta.json."""
    path = os.path.join(folder, f"{split}.bin")
    size = os.path.getsize(path) if os.path.isfile(path) else 0
    want = meta.get(f"{split}_tokens")
    # Two bytes a token (a missing file holds none); a count that is not a number is never equal.
    if size / 2 != want:
        got = f"has {size} bytes" if os.path.isfile(path) else "is missing"
        raise UsageError(f"{path} {got}, not 2 for each of the {want} tokens its meta.json says; "
                         f"rebuild it: {recipe(folder, meta, force=True)}")
    # np.memmap refuses an empty file (a test set's train.bin).
    if size == 0:
        return np.zeros(0, np.uint16)
    return np.memmap(path, dtype=np.uint16, mode="r")


def check_ids(folder, split, ids, meta):
    """Token ids read from a split (a batch's rows, on the CPU), checked to be below the vocab of the
    dataset's meta: a damaged file's would index past the model's embedding. Checked where they enter the
    model, not the whole file at each start (OpenWebText's is 18 GB); under torchrun, by the process whose
    batch holds them, which says so whatever its rank."""
    top = int(ids.max(initial=0))
    if top >= meta["vocab_size"]:
        raise UsageError(f"{os.path.join(folder, split + '.bin')} holds id {top}, past the vocab of "
                         f"{meta['vocab_size']} ({meta['tokenizer']}) in {os.path.join(folder, 'meta.json')}"
                         f": one of the two is damaged; rebuild it: {recipe(folder, meta, force=True)}",
                         alone=True)


def read_images(folder, meta):
    """An image dataset: train images, train labels, test images, test labels ((N, C, H, W) uint8, (N,)
    int64), checked against meta.json: its channels, image size and classes."""
    command = recipe(folder, meta, force=True)
    arrays = []
    for split in ("train", "test"):
        for what in ("images", "labels"):
            path = os.path.join(folder, f"{split}_{what}.npy")
            # An empty file (a copy cut short) is an EOFError; a pickle (objects, which could run code) is
            # refused with a ValueError.
            try:
                arrays.append(np.load(path))
            except (OSError, ValueError, EOFError) as e:
                raise UsageError(f"{path} is missing or damaged ({e}); rebuild it: {command}") from None
    # The model takes them as they are: another type or shape fails inside torch, or trains on other images.
    top = meta["num_classes"] - 1
    for split, images, labels in zip(("train", "test"), arrays[::2], arrays[1::2]):
        rows = images.shape[:1]
        shape = (*rows, meta["channels"], meta["image_size"], meta["image_size"])
        wrong = None
        if (images.dtype, images.shape) != (np.uint8, shape):
            wrong = f"{split}_images.npy holds {images.dtype} of shape {images.shape}, not uint8 of {shape}"
        elif (labels.dtype, labels.shape) != (np.int64, rows):
            wrong = f"{split}_labels.npy holds {labels.dtype} of shape {labels.shape}, not int64 of {rows}"
        # A split of no images trains on nothing, or has no accuracy.
        elif not labels.size:
            wrong = f"{split}_images.npy holds no images"
        elif not 0 <= labels.min() <= labels.max() <= top:
            wrong = f"{split}_labels.npy holds {labels.min()} to {labels.max()}, not classes 0 to {top}"
        if wrong:
            raise UsageError(f"{os.path.join(folder, wrong)}: it or its meta.json is damaged; rebuild it: "
                             f"{command}")
    return arrays
