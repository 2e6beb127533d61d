#!/usr/bin/env bash
# The mutation check (tools/mutation_check.py): plants each bug of tools/mutants/ in a
# scratch copy, rebuilds incrementally and runs the tests named for it; fails unless every
# mutant is killed and every patch still applies (a STALE entry means the code moved on:
# refresh it). Uses the `python` on PATH (CI: the venv with the test extra installed); the
# scratch build needs pybind11's CMake files, installed here if missing.
#
# Runtime: 302 mutants in 987 s with two workers in CI on the 2-vCPU Zen 4 VM, without ccache
# (34 minutes for the whole run); a C++ mutant's rebuild (the module's pybind11 translation units take 3-9 s
# each at -O1) is most of it. With one worker, 152 mutants took 930 s on the 2-vCPU Zen 3 VM;
# with two workers (--jobs 2, whole files dealt to each, its own scratch copy) the same 152
# took 621 s there, the two first builds included, and each
# mutant was killed by the same test but one (topic-no-seqlock-recheck, a race: caught by its
# pytest instead of its ctest). One worker per CPU, at most 4: three workers on the same two
# vCPUs took 763 s (their three first builds 113 s).
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
# costs a lookup. 26 mutants in four files (two of them headers) took 124 s with it and 150 s
# without on the 2-vCPU Zen 4 VM, one worker. The base directory makes the workers' paths
# relative, so their trees share the cache.
export CCACHE_DIR=${CCACHE_DIR:-$B/ccache} CCACHE_BASEDIR=$B/mutation
start=$(date +%s)
# --no-baseline: the unmutated run of the named tests (about 70 s) repeats what the README's
# pytest and cpp_tests.sh ran on this same tree minutes before; a test that fails there
# stops CI before this step, so it cannot make a mutant look killed here.
jobs=$(nproc)
if (( jobs > 4 )); then jobs=4; fi
python tools/mutation_check.py --scratch "$B/mutation" --no-baseline --jobs "$jobs"
echo "mutation.sh: $(( $(date +%s) - start )) s"
