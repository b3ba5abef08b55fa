#!/usr/bin/env bash
# On the lent GPU machine, after `device_check.sh build`: per-SASS-instruction counts and stall
# samples of the quantize kernel for NCU_CASES="recipe/direction ..." on [65536, 7168], as CSV
# (src_<case>.csv) and .ncu-rep under $OUT.
set -u
B=build-dev
export PATH=/usr/local/cuda/bin:$PATH
for c in ${NCU_CASES}; do
  n=${c%/*}_${c#*/}
  timeout 200 ncu --clock-control none -k regex:quantize_tile_kernel --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section InstructionStats -o $OUT/src_$n \
    ./$B/groupmm bench quantize --recipe "${c%/*}" --direction "${c#*/}" --shape 65536x7168 --iters 1 > $OUT/src_$n.log 2>&1
  ncu -i $OUT/src_$n.ncu-rep --page source --print-source sass --csv > $OUT/src_$n.csv 2>&1
  echo "$n: $(wc -l < $OUT/src_$n.csv) lines"
done
