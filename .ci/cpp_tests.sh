#!/usr/bin/env bash
# C++ kernel tests, from a fresh checkout:
#   1. native Release build, ctest (full matrix)
#   2. the same under ASan + UBSan (halt on the first error)
#   3. x86 fallbacks under qemu-x86_64-static user mode (static binary): Nehalem, Haswell,-erms,
#      max,-avx2,-erms, EPYC-Milan (Zen 3 policy)
#   4. cross-compiled aarch64 binary under qemu-aarch64-static: NEON-only CPUs, SVE at every
#      vector length, A64FX, and one prctl sweep of all SVE lengths
# Each emulated run asserts the supported kernels and the SVE vector length (kernel_tests
# --expect-*), and runs policy_tests: the dispatcher's cases (cpp/tests/policy_cases/*.txt, the
# only place expected choices are written) plus the built-in profile the emulated CPU gets
# (--expect-profile) with its invariants (never rep movsb in the near class, usable kernels only). Installs g++-aarch64-linux-gnu and
# qemu-user-static with apt-get only when missing. Exit status non-zero on any failure.
#
# Environment: FASTCOPY_CI_BUILD (build root, default build/ci), FASTCOPY_CI_CLEAN=1 (wipe it
# first), FASTCOPY_CI_SKIP="asan qemu-x86 arm64" (skip sections), JOBS (default nproc).
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${FASTCOPY_CI_BUILD:-$ROOT/build/ci}
JOBS=${JOBS:-$(nproc)}
SKIP=" ${FASTCOPY_CI_SKIP:-} "
T0=$(date +%s)

section() { printf '\n======== %s  [%ss]\n' "$*" "$(( $(date +%s) - T0 ))"; }
die() { echo "cpp_tests.sh: FAILED: $*" >&2; exit 1; }
skipped() { [[ "$SKIP" == *" $1 "* ]] && { echo "(skipped: FASTCOPY_CI_SKIP)"; return 0; }; return 1; }

[[ "${FASTCOPY_CI_CLEAN:-0}" == 1 ]] && rm -rf "$B"
mkdir -p "$B"
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)

configure_build() {  # dir, cmake args...
    local dir=$1; shift
    cmake -S "$ROOT" -B "$dir" "${GEN[@]}" -DFASTCOPY_BUILD_TESTS=ON "$@" >"$dir.configure.log" 2>&1 ||
        { cat "$dir.configure.log"; die "configure $dir"; }
    cmake --build "$dir" -j "$JOBS" >"$dir.build.log" 2>&1 ||
        { tail -50 "$dir.build.log"; die "build $dir"; }
    grep -i "warning" "$dir.build.log" || true
}

# ---------------------------------------------------------------------------------------
section "Tools"
need=()
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || need+=(g++-aarch64-linux-gnu)
{ command -v qemu-aarch64-static >/dev/null 2>&1 && command -v qemu-x86_64-static >/dev/null 2>&1; } ||
    need+=(qemu-user-static)
apt_install_missing "${need[@]}"
cmake --version | head -1
g++ --version | head -1
aarch64-linux-gnu-g++ --version | head -1
qemu-aarch64-static --version | head -1
echo "host: $(uname -m), Linux $(uname -r), $(nproc) CPUs"

# ---------------------------------------------------------------------------------------
section "1. Native Release build + ctest (full matrix)"
# The benchmarks are built too (nothing else compiles them), and each runs one short round so
# a benchmark that no longer builds or runs fails here, not on the next machine that needs it.
configure_build "$B/native" -DCMAKE_BUILD_TYPE=Release -DFASTCOPY_BUILD_BENCH=ON
(cd "$B/native" && ctest --output-on-failure --timeout 600) || die "native ctest"
"$B/native/cpp/bench/kernel_bench" --sizes 4K --offsets 0,16 --rounds 1 --min-ms 0.2 >/dev/null ||
    die "kernel_bench smoke run"
"$B/native/cpp/bench/bandwidth" --quick --sizes=1 --rounds=1 --no-sweep >/dev/null || die "bandwidth smoke run"
"$B/native/cpp/bench/mixed_workload" --rounds 1 --copies 2 --scalar-us 10 >/dev/null || die "mixed_workload smoke run"
# Kernels this CPU cannot run (e.g. AVX-512 on Zen 3): say so, they were not tested natively.
grep -h "not tested natively" "$B/native/Testing/Temporary/LastTest.log" || true

# ---------------------------------------------------------------------------------------
section "2. ASan + UBSan"
if ! skipped asan; then
    configure_build "$B/asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFASTCOPY_SANITIZE=address,undefined \
        -DCMAKE_CXX_FLAGS=-fno-sanitize-recover=all
    (cd "$B/asan" &&
        ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1 \
        UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        ctest --output-on-failure --timeout 900) || die "sanitizer ctest"
fi

# ---------------------------------------------------------------------------------------
# Emulated runs: one job per line, "label|emulator|-cpu value|kernel_tests options",
# run two at a time; each job's output is kept and printed afterwards.
run_jobs() {  # jobfile
    local jobfile=$1 logdir
    logdir=$(mktemp -d "$B/jobs.XXXXXX")
    export logdir
    # shellcheck disable=SC2016
    tr '\n' '\0' <"$jobfile" | xargs -0 -P2 -n1 bash -c '
        IFS="|" read -r label emu cpu args <<<"$1"
        log="$logdir/$label.log"
        start=$(date +%s)
        # shellcheck disable=SC2086
        if timeout 300 "$emu" -cpu "$cpu" $args >"$log" 2>&1; then st=ok; else st="FAILED(rc=$?)"; fi
        echo "$st $(( $(date +%s) - start ))s" >"$logdir/$label.status"
        echo "  [$st] $label (-cpu $cpu, $(( $(date +%s) - start ))s)"
    ' _
    local failed=0 label
    while IFS='|' read -r label _; do
        [[ -z "$label" ]] && continue
        echo "---- $label: $(cat "$logdir/$label.status" 2>/dev/null || echo 'did not run')"
        grep -E '^  (arm|x86|os):|choose_kernel|^  (ok|FAIL)|^FAIL|this CPU:|not tested natively|FATAL|ERROR|kernel_tests:|policy_tests:' "$logdir/$label.log" || true
        grep -q '^ok ' "$logdir/$label.status" 2>/dev/null || { failed=1; tail -30 "$logdir/$label.log"; }
    done <"$jobfile"
    return $failed
}

# ---------------------------------------------------------------------------------------
section "3. x86 fallbacks under qemu-x86_64-static (static binary)"
if ! skipped qemu-x86; then
    configure_build "$B/x86-static" -DCMAKE_BUILD_TYPE=Release -DCMAKE_EXE_LINKER_FLAGS=-static
    X=$B/x86-static/cpp/tests/kernel_tests
    P=$B/x86-static/cpp/tests/policy_tests
    Q=qemu-x86_64-static
    # Which built-in profile each emulated CPU matches (cpp/policy/defaults.cpp); what each
    # profile chooses is tested by policy_tests from its case files, not restated here.
    # erms (rep movsb) runs on every x86_64, so it is listed as supported everywhere.
    # qemu cannot emulate AVX-512: the avx512 kernels must be detected as unsupported; their
    # blocks run at width 64 on two AVX2 halves wherever AVX2 is there (avx512@2xavx2).
    cat >"$B/x86.jobs" <<JOBS
nehalem|$Q|Nehalem|$X --quick --expect-unsupported avx2,avx2_nt,avx512,avx512_nt --expect-supported generic,erms
nehalem-policy|$Q|Nehalem|$P --expect-profile x86-64
haswell-noerms|$Q|Haswell,-erms|$X --quick --expect-unsupported avx512,avx512_nt --expect-supported generic,avx2,avx2_nt,erms
haswell-noerms-policy|$Q|Haswell,-erms|$P --expect-profile x86-avx2
amd-noavx2-noerms|$Q|max,-avx2,-erms|$X --quick --expect-unsupported avx2,avx2_nt,avx512,avx512_nt --expect-supported generic,erms
amd-noavx2-noerms-policy|$Q|max,-avx2,-erms|$P --expect-profile x86-64
epyc-milan|$Q|EPYC-Milan|$X --quick --expect-unsupported avx512,avx512_nt --expect-supported generic,avx2,avx2_nt,erms
epyc-milan-policy|$Q|EPYC-Milan|$P --expect-profile amd-zen3
JOBS
    run_jobs "$B/x86.jobs" || die "x86 emulated runs"
fi

# ---------------------------------------------------------------------------------------
section "4. aarch64 cross build under qemu-aarch64-static"
if ! skipped arm64; then
    configure_build "$B/arm64" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_TOOLCHAIN_FILE="$ROOT/cmake/aarch64-linux-gnu.cmake" -DFASTCOPY_STATIC_EXE=ON
    A=$B/arm64/cpp/tests/kernel_tests
    P=$B/arm64/cpp/tests/policy_tests
    file "$A" | grep -q 'statically linked' || die "aarch64 test binary is not static"
    Q=qemu-aarch64-static
    # Which built-in profile each emulated CPU matches; the choices (SVE from 2 KiB, from
    # 256 KiB on Linux 4.15..6.1, the C library without SVE) are policy_tests' case files
    # (cpp/tests/policy_cases/arm.txt), run here by the aarch64 build.
    NOSVE="--expect-supported generic,neon --expect-unsupported sve --expect-sve-bytes 0"
    sve() { echo "--expect-supported generic,neon,sve --expect-sve-bytes $1"; }
    {
        echo "cortex-a72|$Q|cortex-a72|$A --quick $NOSVE"
        echo "cortex-a72-policy|$Q|cortex-a72|$P --expect-profile aarch64-neon"
        echo "neoverse-n1|$Q|neoverse-n1|$A --quick $NOSVE"
        echo "max-sve-off|$Q|max,sve=off|$A --quick $NOSVE"
        echo "max-policy|$Q|max|$P --expect-profile aarch64-sve"
        echo "sve-sweep|$Q|max|$A --quick --only sve --sve-sweep $(sve 64)"
        echo "max-sve128|$Q|max,sve128=on|$A --quick $(sve 16)"
        for n in 32 48 64 128 256; do
            echo "max-vl$n|$Q|max,sve-default-vector-length=$n|$A --quick $(sve $n)"
        done
        echo "a64fx|$Q|a64fx|$A --quick $(sve 64)"
        echo "a64fx-policy|$Q|a64fx|$P --expect-profile aarch64-sve"
    } >"$B/arm64.jobs"
    run_jobs "$B/arm64.jobs" || die "aarch64 emulated runs"
fi

section "cpp_tests.sh: all passed"
