"""
Quality and capability, measured side by side: training runs of minutes each (bench.py measures speed).

    python study.py language          # the demo budget: ToST, ToST + token shift, softmax, softmax + shift, heads
    python study.py vision            # ToST with and without XCiT's local patch interaction, synthetic images
    python study.py tasks             # what ToST can and cannot do: synthetic tasks, ToST vs softmax
    python study.py tasks --quick     # the same map at two knob values per task, under 10 minutes on 2 cores
    python study.py language,tasks --json=study.json

Every model in a table gets the same budget (data, width, depth, optimizer, steps, schedule, seed); the
budget is printed with each table. One seed per cell: differences of a few hundredths are noise.
"""

import argparse
import json
import os
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

import tost

console = Console() if sys.stdout.isatty() else Console(width=130)   # no truncated columns in logs


# -----------------------------------------------------------------------------
# sections


SECTIONS = {}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0].strip(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('sections', help='comma-separated: ' + ', '.join(SECTIONS))
    ap.add_argument('--quick', action='store_true', help='a smaller budget (see each section)')
    ap.add_argument('--smoke', action='store_true', help='tiny budget, seconds; checks that a section runs')
    ap.add_argument('--json', default=None, help='also write the results here')
    args = ap.parse_args(argv)
    args.mode = 'smoke' if args.smoke else 'quick' if args.quick else 'full'
    sections = [s.strip() for s in args.sections.split(',') if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown or not sections:
        sys.exit(f"error: unknown section(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(SECTIONS)}")
    results = dict(mode=args.mode, torch=torch.__version__, threads=torch.get_num_threads())
    t0 = time.time()
    for s in sections:
        SECTIONS[s](args, results)
    results['seconds'] = round(time.time() - t0, 1)
    console.print(f"done in {results['seconds']:.0f} s")
    if args.json:
        with open(args.json + '.tmp', 'w') as f:
            json.dump(results, f, indent=1)
        os.replace(args.json + '.tmp', args.json)
    return results


if __name__ == '__main__':
    main()
