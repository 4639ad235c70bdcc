#!/usr/bin/env python3
"""Reads the timelines that experiment_attention_bwd_hopper_ablation --trace FILE writes (backward
rung 3, kProbe 6: SM clock at each phase of each step, 03_hopper.cuh bwd_trace) and prints, per
shape, the median cycles of each phase of a consumer's step and where the two consumers stand
against each other.

Slots 11 cw + e, consumer cw's thread 0, step st:
  0 the stage's copies landed (step start)   1 S^T, dP^T issued (+ dS^T buffer free)
  2 S^T done                                  3 P done, dV issued
  4 dP^T done                                 5 dS^T written, published, consumer barrier
  6..9 dQ of step st (run inside step st + 1): 6 both halves of dS^T ready, 7 dQ (and dV) done,
       8 dQ tile free, 9 dQ tile staged
  10 dK done (step end)
22: producer issued step st's copies; 23 + 2 rc / 24 + 2 rc: reducing warp rc saw / finished
step st's dQ tile.
Usage: bwd_trace_report.py TRACE.csv
"""
import collections
import statistics
import sys

PHASES = [  # (name, from (slot, step offset), to (slot, step offset)), in a consumer's order
    ("issue S^T, dP^T; wait dS^T buffer", (0, 0), (1, 0)),
    ("wait S^T", (1, 0), (2, 0)),
    ("P, issue dV", (2, 0), (3, 0)),
    ("wait dP^T", (3, 0), (4, 0)),
    ("dS^T: compute, store, publish, barrier", (4, 0), (5, 0)),
    ("wait other half of previous dS^T", (5, 0), (6, -1)),
    ("issue dQ + dK, wait dQ (+dV)", (6, -1), (7, -1)),
    ("wait dQ tile free", (7, -1), (8, -1)),
    ("stage dQ tile (stores, fence, arrive)", (8, -1), (9, -1)),
    ("wait dK", (9, -1), (10, 0)),
    ("loop, wait next stage", (10, 0), (0, 1)),
]


def main(path):
    data = collections.defaultdict(dict)  # (d, s, causal, cta) -> {(step, slot): clock}
    for line in open(path):
        d, s, c, b, st, sl, v = (int(x) for x in line.strip().split(","))
        data[(d, s, c, b)][(st, sl)] = v
    shapes = sorted({k[:3] for k in data})
    for shape in shapes:
        print(f"d {shape[0]} seqlen {shape[1]} causal {shape[2]}")
        per_phase = collections.defaultdict(list)
        period, offset, lead = [], [], []
        for key, t in data.items():
            if key[:3] != shape:
                continue
            steps = sorted({st for st, _ in t})
            if len(steps) < 8:
                continue
            mid = steps[2:-2]  # steady state: not the first or last steps
            for cw in (0, 1):
                base = 11 * cw
                for name, (fs, fo), (ts, to) in PHASES:
                    for st in mid:
                        a, z = t.get((st + fo, base + fs)), t.get((st + to, base + ts))
                        if a is not None and z is not None:
                            per_phase[(cw, name)].append(z - a)
                for st in mid:
                    a, z = t.get((st, base)), t.get((st + 1, base))
                    if a is not None and z is not None:
                        period.append(z - a)
            for st in mid:
                a, z = t.get((st, 0)), t.get((st, 11))
                if a is not None and z is not None:
                    offset.append(z - a)
                p, c0 = t.get((st, 22)), t.get((st, 0))
                if p is not None and c0 is not None:
                    lead.append(c0 - p)
        if not period:
            continue
        med_period = statistics.median(period)
        print(f"  step period (median over blocks, steps, consumers): {med_period:.0f} cycles")
        print(f"  consumer 1's step start minus consumer 0's: median {statistics.median(offset):.0f} cycles")
        print(f"  step start minus the producer's issue of its copies: median {statistics.median(lead):.0f} cycles")
        print(f"  {'phase':42s} {'consumer 0':>11s} {'consumer 1':>11s}   (median cycles; share of the period)")
        for name, _, _ in PHASES:
            m = [statistics.median(per_phase[(cw, name)]) if per_phase[(cw, name)] else float("nan") for cw in (0, 1)]
            print(f"  {name:42s} {m[0]:11.0f} {m[1]:11.0f}   {100 * m[0] / med_period:5.1f}%")
        # Two steps of block 0 as a timeline, relative to consumer 0's start of the first.
        key = next(k for k in sorted(data) if k[:3] == shape)
        t = data[key]
        st0 = 40 if (40, 0) in t else sorted({st for st, _ in t})[len({st for st, _ in t}) // 2]
        t0 = t[(st0, 0)]
        print(f"  block {key[3]} steps {st0}, {st0 + 1} (cycles from consumer 0's start of step {st0}):")
        for st in (st0, st0 + 1):
            for cw in (0, 1):
                row = [f"{e}:{t[(st, 11 * cw + e)] - t0}" for e in range(11) if (st, 11 * cw + e) in t]
                print(f"    step {st} consumer {cw}: " + " ".join(row))
            row = [f"{sl}:{t[(st, sl)] - t0}" for sl in range(22, 27) if (st, sl) in t]
            print(f"    step {st} producer / reducers: " + " ".join(row))


if __name__ == "__main__":
    main(sys.argv[1])
