"""
The limitation, seen: associative recall, a tiny ToST against one softmax layer, trained on a CPU in class.

    python -m lecture.recall                  # the full run: 4000 steps per model
    python -m lecture.recall --steps=300      # shorter (too short to show the gap)
    python -m lecture.recall --seconds=30     # at most 30 seconds of training per model

The task. A sequence holds 8 key-value pairs, then one of its keys as a query; the model must name the value
stored with that key. Keys and values are drawn without repeats from 16 each. Each pair is one token (its
key and its value), so a lookup is a single step: the query must find the token whose key matches it and
read the value off that token. One softmax layer can do exactly that, since it keeps every earlier token and
weighs each by how well it matches the query. A causal TSSA layer keeps of the past only, per head, the sums
Q, A and P of squared projections (tost.TSSAState), 2p + 1 numbers: in effect which keys and which values
occurred. A square of a pair token's projection can hold a little of which value went with which key (a
product of the key's and the value's features), but summed into p numbers per head, and read at the query
only through its memberships and the gains on its own projection, 8 such bindings among 256 possible pairs
have little room. (With key and value as separate tokens even softmax attention needs two layers, one to
copy each key onto its value; docs/capabilities.md measures that.)

Chance is 1/8: a model that knows which 8 values occurred but not which key owns which (a blind guess among
the 16 values, where a short run starts, is 1/16). Accuracy is taken on
1024 held-out sequences, as the argmax over the 16 value tokens at the query. Seeded and deterministic for a
given --steps (--seconds stops by the clock, so its step counts vary). The table prints the seconds each
model trained, on the machine at hand.
"""

import os
import sys

# Also run by its path (python lecture/recall.py): the repository's modules come from its root.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import options  # first: a mistake, a closed pipe (`| head`) or Ctrl-C ends in one line
import time

import torch
import torch.nn.functional as F

import tost

KEYS = 16
VALUES = 16
PAIRS = 8
# The vocabulary: pair tokens (key, value) first, then one query token per key, then one answer per value.
QUERY0 = KEYS * VALUES
ANSWER0 = QUERY0 + KEYS
VOCAB = ANSWER0 + VALUES
# The models: (label, attention, layers). Every other setting is shared (see make_model).
MODELS = (('ToST (TSSA)', 'tssa', 1), ('ToST (TSSA)', 'tssa', 2), ('softmax', 'softmax', 1))


def batch(size, generator):
    """size sequences of PAIRS pair tokens and a query: (size, PAIRS + 1) tokens, (size,) answer tokens."""
    keys = torch.rand(size, KEYS, generator=generator).argsort(-1)[:, :PAIRS]       # distinct keys
    values = torch.rand(size, VALUES, generator=generator).argsort(-1)[:, :PAIRS]   # distinct values
    asked = torch.randint(0, PAIRS, (size, 1), generator=generator)                   # which pair is queried
    query = QUERY0 + keys.gather(1, asked)
    answer = ANSWER0 + values.gather(1, asked)[:, 0]
    return torch.cat([keys * VALUES + values, query], 1), answer


def make_model(attn, layers, seed):
    """A GPT from tost.py: width 64, 4 heads, layer-scale 1.0 (the default 1e-5 slows tiny models down)."""
    torch.manual_seed(seed)
    config = tost.GPTConfig(block_size=PAIRS + 1, vocab_size=VOCAB, n_layer=layers, n_head=4, n_embd=64,
                            attn=attn, layerscale_init=1.0)
    return tost.GPT(config)


def answer_logits(model, idx):
    """The logits of the value tokens at the query position: (B, VALUES)."""
    logits, _ = model(idx)                                   # without targets: the last position only
    return logits[:, -1, ANSWER0:]


def accuracy(model, test):
    idx, answer = test
    with torch.no_grad():
        guess = answer_logits(model, idx).argmax(-1)
    return (guess == answer - ANSWER0).double().mean().item()


def train(model, steps, seconds, batch_size, seed):
    """AdamW on fresh sequences every step, loss at the query only. Returns (steps taken, seconds)."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    start = time.perf_counter()
    step = 0
    while step < steps and (not seconds or time.perf_counter() - start < seconds):
        idx, answer = batch(batch_size, generator)
        loss = F.cross_entropy(answer_logits(model, idx), answer - ANSWER0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
    return step, time.perf_counter() - start


DEFAULTS = dict(
    steps=4000,         # training steps per model
    seconds=0.0,        # stop each model after this many seconds of training; 0: no limit
    batch=64,           # sequences per step, at most 4096 (about 100 kB each)
    seed=0,             # seeds the models, the data and the test set
)
RANGES = dict(positive=('steps', 'batch'), nonnegative=('seconds',), seed=('seed',))


def main(argv=None):
    cfg, _ = options.parse(argv, DEFAULTS, __doc__, __file__, ranges=RANGES)
    # At most half a GB: a batch past what the machine holds is no MemoryError but the OOM killer, unsaid.
    if cfg['batch'] > 4096:
        raise options.UsageError(f"--batch must be at most 4096, got {cfg['batch']}")
    # Tiny models: one thread is steadier than two on a shared machine, and the result does not change (not in
    # a notebook's kernel, whose later cells would keep it).
    if not options.kernel:
        torch.set_num_threads(1)
    test = batch(1024, torch.Generator().manual_seed(10_000 + cfg['seed']))
    print(f'associative recall: {PAIRS} pairs of {KEYS} keys and {VALUES} values, one pair a token; '
          f'chance {1 / PAIRS:.3f} (a blind guess: {1 / VALUES:.4f})')
    print(f'{"model":12s} {"layers":>6s} {"params":>8s} {"steps":>6s} {"seconds":>8s} {"accuracy":>9s} '
          f'{"chance":>7s}')
    for label, attn, layers in MODELS:
        model = make_model(attn, layers, cfg['seed'])
        params = sum(p.numel() for p in model.parameters())
        steps, seconds = train(model, cfg['steps'], cfg['seconds'], cfg['batch'], cfg['seed'])
        print(f'{label:12s} {layers:6d} {params:8,d} {steps:6d} {seconds:8.1f} {accuracy(model, test):9.3f} '
              f'{1 / PAIRS:7.3f}', flush=True)
    # A class reads the table: one too short to show the gap says so.
    if cfg['steps'] < DEFAULTS['steps'] or cfg['seconds']:
        print(f"note: a run shorter than the default {DEFAULTS['steps']} steps may leave every model near "
              f"chance, or below it: too short to show the gap")


if __name__ == '__main__':
    main()
