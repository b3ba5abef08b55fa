#!/usr/bin/env bash
# The CUDA compiler launcher: runs one compile (its arguments: [ccache] nvcc ...) and fails it when
# ptxas reports that a kernel's wgmma pipeline is serialized or broken up (its C75xx notes on
# wgmma / warpgroup: a wait after every wgmma, or one injected before an accumulator read). Such a
# kernel is correct but runs its MMAs one at a time, and the note is the only sign of it in a build
# log (docs/decisions.md, "Kernel layer: accumulators leave through the hardware conversion").
err=$(mktemp "${TMPDIR:-/tmp}/groupmm-ptxas.XXXXXX") || exit 1
"$@" 2>"$err"
rc=$?
cat "$err" >&2
if [ "$rc" -eq 0 ] && grep -E 'ptxas.*\(C75[0-9][0-9]\)' "$err" | grep -qiE 'wgmma|warpgroup'; then
  echo "ptxas_guard: a kernel's wgmma pipeline is serialized (the ptxas note above); an epilogue" \
    "must read accumulators through float operations and hardware conversions only" >&2
  rc=1
fi
rm -f "$err"
exit "$rc"
