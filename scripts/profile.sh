#!/usr/bin/env bash
# Nsight Compute profile of the benchmark cases whose name contains FILTER.
#
#   scripts/profile.sh <filter> [outdir] [-- extra flashlab_bench args]
#
# Runs `ncu --clock-control none` (the GPU keeps its own clocks, as in the benchmark) on
# build/gpu/bench/flashlab_bench --filter <filter> --reps $PROFILE_REPS (case names are
# "<op>/<dtype>", e.g. "vector_add/bf16"; the start-up peak measurement, cuBLAS GEMM included,
# is profiled too and listed in the summary) with the sections
# SpeedOfLight, Occupancy, WarpStateStats and MemoryWorkloadAnalysis, and writes to outdir
# (default build/gpu/profile/):
#   <name>.ncu-rep      the full report (open it in ncu-ui, or `ncu --import`)
#   <name>.raw.csv      every collected metric, one row per kernel launch
#   <name>.summary.txt  one line per kernel: time, memory and SM throughput (% of peak),
#                       achieved occupancy, the top warp stall reasons
#   <name>.log, <name>.bench.json   ncu's output and the profiled run's own results
# where <name> is the filter with unsafe characters replaced by '_'.
#
# Environment:
#   FLASHLAB_BENCH  benchmark binary (default build/gpu/bench/flashlab_bench)
#   NCU             ncu executable (default: ncu on PATH)
#   PROFILE_REPS    repetitions per case passed to the binary (default 1)
#   NCU_ARGS        extra ncu arguments, e.g. "-k regex:vec16 --launch-count 10"
set -euo pipefail

die() { echo "profile.sh: error: $*" >&2; exit 1; }

[[ $# -ge 1 && -n "$1" && "$1" != -* ]] || die "usage: scripts/profile.sh <filter> [outdir] [-- extra bench args]"
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
filter=$1; shift
outdir=$repo/build/gpu/profile
if [[ $# -ge 1 && "$1" != "--" ]]; then outdir=$1; shift; fi
if [[ $# -ge 1 && "$1" == "--" ]]; then shift; fi
extra=("$@")

bin=${FLASHLAB_BENCH:-$repo/build/gpu/bench/flashlab_bench}
ncu=${NCU:-ncu}
reps=${PROFILE_REPS:-1}

command -v "$ncu" >/dev/null 2>&1 ||
  die "Nsight Compute ('$ncu') not found on PATH; install it or set NCU=/path/to/ncu"
[[ -x "$bin" ]] ||
  die "benchmark binary not found at $bin; build it first (cmake --preset gpu && cmake --build build/gpu) or set FLASHLAB_BENCH"
command -v python3 >/dev/null 2>&1 || die "python3 not found (needed for the summary)"

mkdir -p "$outdir"
name=$(printf '%s' "$filter" | tr -c 'A-Za-z0-9_.-' '_')
base="$outdir/$name"

echo "profile.sh: $ncu on $bin --filter '$filter' --reps $reps -> $base.*"
# shellcheck disable=SC2086  # NCU_ARGS is a list of words on purpose
if ! "$ncu" --clock-control none --target-processes all \
      --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --section MemoryWorkloadAnalysis \
      --export "$base" --force-overwrite ${NCU_ARGS:-} \
      "$bin" --filter "$filter" --reps "$reps" --out "$base.bench.json" \
      ${extra[@]+"${extra[@]}"} 2>&1 | tee "$base.log"; then
  die "ncu or the benchmark failed (log: $base.log)"
fi
[[ -s "$base.ncu-rep" ]] ||
  die "ncu wrote no report: did '--filter $filter' select any case? (log: $base.log)"

"$ncu" --import "$base.ncu-rep" --csv --page raw > "$base.raw.csv" ||
  die "ncu --import failed on $base.ncu-rep"

python3 - "$base.raw.csv" > "$base.summary.txt" <<'PY'
# raw page: a header row of metric names, a row of units, then one row per kernel launch.
import csv, re, statistics, sys
from collections import OrderedDict

rows = list(csv.reader(open(sys.argv[1], newline="")))
if len(rows) < 3:
    sys.exit("no kernel launches in the report")
head, units, data = rows[0], rows[1], rows[2:]
col = {name: i for i, name in enumerate(head)}

def num(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None

def pick(r, *names):
    for n in names:
        if n in col:
            v = num(r[col[n]])
            if v is not None:
                return v, units[col[n]]
    return None, ""

# Warp stall reasons: cycles a warp spends stalled per issued instruction, by reason.
stall_re = re.compile(r"^smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)_per_(?:warp_|issue_)active\.ratio$")
stall_cols = [(m.group(1), i) for i, n in enumerate(head) if (m := stall_re.match(n))]
stall_cols = [(s, i) for s, i in stall_cols if s != "selected"]  # selected = issuing, not a stall

groups = OrderedDict()
for r in data:
    if len(r) != len(head):
        continue
    key = (r[col["Kernel Name"]] if "Kernel Name" in col else "?",
           r[col["Grid Size"]] if "Grid Size" in col else "",
           r[col["Block Size"]] if "Block Size" in col else "")
    groups.setdefault(key, []).append(r)

def mean(vals):
    vals = [v for v in vals if v is not None]
    return statistics.fmean(vals) if vals else None

def f(v, spec, suffix=""):
    return "-" if v is None else f"{v:{spec}}{suffix}"

print(f"{'kernel':60s} {'grid':>16s} {'block':>12s} {'n':>3s} {'time':>11s} {'mem%':>6s} "
      f"{'dram%':>6s} {'sm%':>6s} {'occ%':>6s}  top stalls (cycles/issue)")
for (kernel, grid, block), rs in groups.items():
    dur = [pick(r, "gpu__time_duration.sum") for r in rs]
    dur_v, dur_u = mean([d[0] for d in dur]), dur[0][1]
    if dur_v is not None and dur_u == "nsecond":
        dur_v, dur_u = dur_v / 1e3, "usecond"
    mem = mean([pick(r, "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed")[0] for r in rs])
    dram = mean([pick(r, "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                      "dram__throughput.avg.pct_of_peak_sustained_elapsed")[0] for r in rs])
    sm = mean([pick(r, "sm__throughput.avg.pct_of_peak_sustained_elapsed")[0] for r in rs])
    occ = mean([pick(r, "sm__warps_active.avg.pct_of_peak_sustained_active")[0] for r in rs])
    stalls = [(s, mean([num(r[i]) for r in rs])) for s, i in stall_cols]
    stalls = sorted((x for x in stalls if x[1]), key=lambda x: -x[1])
    top = ", ".join(f"{s} {v:.2f}" for s, v in stalls[:4]) or "-"
    short = re.sub(r"^void |<?unnamed>::|\(anonymous namespace\)::", "", kernel)
    short = re.sub(r"^(?:\w+::)+", "", short)  # namespaces; template arguments stay
    short = short if len(short) <= 60 else short[:57] + "..."
    unit = {"usecond": "us", "msecond": "ms", "nsecond": "ns", "second": "s"}.get(dur_u, dur_u)
    print(f"{short:60s} {grid:>16s} {block:>12s} {len(rs):3d} {f(dur_v, '9.2f', unit):>11s} "
          f"{f(mem, '6.1f')} {f(dram, '6.1f')} {f(sm, '6.1f')} {f(occ, '6.1f')}  {top}")
PY
echo
cat "$base.summary.txt"
echo
echo "profile.sh: wrote $base.ncu-rep, $base.raw.csv, $base.summary.txt"
