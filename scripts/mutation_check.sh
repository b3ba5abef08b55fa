#!/usr/bin/env bash
# Mutation check of the CPU tests: plants each listed bug (34 of them: the five of issue 24 plus
# conversions, every recipe's scale rule, block boundaries at expert edges, layouts, offsets, dbias
# order, GEMM accumulation, SwiGLU) one at a time into a scratch copy of the tree, rebuilds only
# groupmm_tests_cpu, runs it, and prints caught / SURVIVED per bug. Exit 0 when every bug is caught.
# The worktree is never modified. Needs scripts/setup.sh done. The list and the details are in
# scripts/mutation_check.py.
#   bash scripts/mutation_check.sh                 # all mutations (a first run on 2 cores: ~1 h)
#   bash scripts/mutation_check.sh --list
#   bash scripts/mutation_check.sh 'gemm_*' --report out/mutations.md
# Env: MUTATION_DIR (scratch tree and build), MUTATION_JOBS, MUTATION_FULL_LIB=1 (build the CUDA
# sources too instead of a CPU-only library).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/mutation_check.py "$@"
