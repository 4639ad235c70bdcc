#!/usr/bin/env python3
"""Summarise `cuobjdump --dump-sass` from stdin: per kernel, counts of the instructions the
ladder pages talk about (128-bit global loads/stores, shuffles, atomics, shared memory, barriers,
tensor-core MMAs: HMMA (mma.sync / wmma), HGMMA (wgmma), LDSM (ldmatrix), LDGSTS (cp.async),
UTMALDG / UTMASTG (TMA loads / stores))."""
import re
import sys
from collections import Counter

PATTERNS = {
    "LDG.128": r"\bLDG\.E\.(?:\S*\.)?128\b",
    "LDG": r"\bLDG\b",
    "STG.128": r"\bSTG\.E\.(?:\S*\.)?128\b",
    "STG": r"\bSTG\b",
    "SHFL": r"\bSHFL\b",
    "ATOM/RED": r"\b(?:ATOMG|RED|ATOM)\b",
    "LDS/STS": r"\b(?:LDS|STS)\b",
    "BAR": r"\bBAR\b",
    "HGMMA": r"\bHGMMA\b",
    "HMMA": r"\bHMMA\b",
    "LDSM": r"\bLDSM\b",
    "LDGSTS": r"\bLDGSTS\b",
    "UTMALDG": r"\bUTMALDG\b",
    "UTMASTG": r"\bUTMASTG\b",
    "LDL/STL": r"\b(?:LDL|STL)\b",
}


def main() -> None:
    kernel, counts = None, {}
    for line in sys.stdin:
        m = re.search(r"Function : (\S+)", line)
        if m:
            kernel = m.group(1)
            counts[kernel] = Counter()
            continue
        if kernel is None:
            continue
        for name, pat in PATTERNS.items():
            if re.search(pat, line):
                counts[kernel][name] += 1
    for kernel, c in counts.items():
        demangled = kernel
        print(f"{demangled}\n    " + "  ".join(f"{k}={c[k]}" for k in PATTERNS if c[k]))


if __name__ == "__main__":
    main()
