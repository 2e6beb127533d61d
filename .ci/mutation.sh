#!/usr/bin/env bash
# The mutation check (tools/mutation_check.py): plants each bug of tools/mutants/ in a
# scratch copy, rebuilds incrementally and runs the tests named for it; fails unless every
# mutant is killed and every patch still applies (a STALE entry means the code moved on:
# refresh it). Uses the `python` on PATH (CI: the venv with the test extra installed); the
# scratch build needs pybind11's CMake files, installed here if missing.
#
# Runtime: a C++ mutant's rebuild (the module's pybind11 translation units take 3-9 s each at
# -O1) is most of it. One worker per CPU, at most 4 (--jobs: whole files dealt to each, its own
# scratch copy; evidence: testing-mutation-runtime): three workers on two vCPUs took longer
# than two. Each mutant was killed by the same test with one worker and with two but one
# (topic-no-seqlock-recheck, a race: caught by its pytest instead of its ctest).
#
# `bash .ci/mutation.sh --build-only` only builds the scratch copies (.ci/run does so while its
# pytest runs, on the CPU that the emulated aarch64 run leaves free); the check then finds
# them built.
#
# Environment: FASTCOPY_CI_BUILD (default build/ci): the scratch copy and its build go to
# $FASTCOPY_CI_BUILD/mutation and are reused by the next run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
B=${FASTCOPY_CI_BUILD:-$PWD/build/ci}
python -c 'import pybind11' 2>/dev/null || python -m pip install -q "pybind11>=3"
python -c 'import pytest, hypothesis, numpy' || { echo "mutation.sh: needs pytest, hypothesis and numpy"; exit 1; }
# ccache (tools/mutation_check.py uses it when installed): after a mutant the file is written
# back, and the next build compiles the original text again; from the cache that compile
# costs a lookup (evidence: testing-ci-overlap-and-ccache). The base directory makes the
# workers' paths relative, so their trees share the cache.
export CCACHE_DIR=${CCACHE_DIR:-$B/ccache} CCACHE_BASEDIR=$B/mutation
start=$(date +%s)
# --no-baseline: the unmutated run of the named tests (about 70 s) repeats what the README's
# pytest and cpp_tests.sh ran on this same tree minutes before; a test that fails there
# stops CI before this step, so it cannot make a mutant look killed here.
jobs=$(nproc)
if (( jobs > 4 )); then jobs=4; fi
python tools/mutation_check.py --scratch "$B/mutation" --no-baseline --jobs "$jobs" "$@"
echo "mutation.sh: $(( $(date +%s) - start )) s"
