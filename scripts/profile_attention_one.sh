#!/usr/bin/env bash
# Nsight Compute on one attention kernel launch at one shape (a profiling aid for the ladder's
# "what limits it next"): the second launch of KERNEL_REGEX in
#   experiment_attention_profile_one fwd|bwd HEADDIM SEQLEN CAUSAL
# with the sections that say where time goes (speed of light, pipes, warp states, scheduler,
# instruction mix, per-instruction stall samples).
#   scripts/profile_attention_one.sh OUTDIR NAME KERNEL_REGEX fwd|bwd HEADDIM SEQLEN CAUSAL
# Writes OUTDIR/NAME.ncu-rep, NAME.details.txt (every section's table), NAME.raw.csv (every
# metric) and NAME.sass.csv (SASS with stall samples per instruction).
# Environment: BIN_DIR (default build/gpu/bench), NCU (default ncu).
set -euo pipefail
[[ $# -eq 7 ]] || { echo "usage: $0 OUTDIR NAME KERNEL_REGEX fwd|bwd HEADDIM SEQLEN CAUSAL" >&2; exit 2; }
out=$1 name=$2 kernel=$3
shift 3
bin=${BIN_DIR:-build/gpu/bench}/experiment_attention_profile_one
ncu=${NCU:-ncu}
mkdir -p "$out"
base="$out/$name"
"$ncu" --clock-control none -k "regex:$kernel" --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section InstructionStats --section LaunchStats --section Occupancy \
  --section SourceCounters --import-source no \
  --export "$base" --force-overwrite "$bin" "$@" >"$base.log" 2>&1 || { tail -n 30 "$base.log"; exit 1; }
"$ncu" --import "$base.ncu-rep" --page details --print-details all >"$base.details.txt" 2>&1 || true
"$ncu" --import "$base.ncu-rep" --page raw --csv >"$base.raw.csv" 2>&1 || true
"$ncu" --import "$base.ncu-rep" --page source --csv --print-source sass >"$base.sass.csv" 2>&1 || true
grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|Warp Cycles Per Issued|No Eligible" "$base.details.txt" | head -n 12 || true
