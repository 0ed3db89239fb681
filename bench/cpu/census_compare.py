#!/usr/bin/env python3
"""A program's output file against a native reference, for bench/cpu/census.sh:
words equal, numbers within a relative 1e-3 (or 1e-4 absolute), since the CPU
device's floating point may round differently from the GPU's (fused multiply-adds).

    census_compare.py PRODUCED REFERENCE
Prints a one-line verdict; exits 0 when they match, 1 when they do not.
"""

import sys

REL, ABS = 1e-3, 1e-4


def number(word):
    try:
        return float(word)
    except ValueError:
        return None


def main(produced_path, reference_path):
    try:
        with open(produced_path, errors="replace") as f:
            produced = f.read().split()
    except OSError as e:
        print(f"no output to compare: {e.strerror} ({produced_path})")
        return 1
    with open(reference_path, errors="replace") as f:
        reference = f.read().split()
    if len(produced) != len(reference):
        print(f"differs from native: {len(produced)} words, native {len(reference)}")
        return 1
    differ, first = 0, None
    for i, (a, b) in enumerate(zip(produced, reference)):
        x, y = number(a), number(b)
        same = (
            a == b
            if x is None or y is None
            else abs(x - y) <= max(ABS, REL * max(abs(x), abs(y)))
        )
        if not same:
            differ += 1
            first = first if first is not None else (i, a, b)
    if differ:
        i, a, b = first
        print(f"differs from native: {differ} of {len(reference)} words (word {i}: {a} vs {b})")
        return 1
    print(f"matches native ({len(reference)} words)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
