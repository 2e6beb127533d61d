#!/usr/bin/env bash
# Builds the C++ tests with ThreadSanitizer in a fresh build directory and runs the pool
# tests and the core tests (ctest -R "pool|core": the read-only range table is read without a
# lock). Works on a fresh Debian 12 (gcc 12); installs what is missing with
# apt-get when run as root.
#
#   .ci/tsan.sh [build-dir]        (default: build/tsan, wiped first)
#
# TSan maps its shadow memory at fixed addresses. Kernels with more address-space
# randomisation than it expects (vm.mmap_rnd_bits > 28, e.g. Ubuntu 23.10+/6.5+ defaults of
# 32) make gcc 12's TSan die with "FATAL: ThreadSanitizer: unexpected memory mapping". If a
# run dies that way, the script reruns it without randomisation (setarch -R), and as a last
# resort, as root, lowers vm.mmap_rnd_bits to 28 for the rerun and restores it afterwards.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build/tsan}"
jobs="$(nproc 2>/dev/null || echo 2)"

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v g++ >/dev/null || need+=(g++)
command -v make >/dev/null || need+=(make)
# libtsan for the default g++ (libtsan2 on Debian 12 / gcc 12)
if command -v g++ >/dev/null; then
    if ! echo 'int main(){}' | g++ -x c++ -fsanitize=thread -o /dev/null - 2>/dev/null; then
        need+=("libtsan2")
    fi
fi
command -v setarch >/dev/null || need+=(util-linux)
if ((${#need[@]})); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "tsan.sh: installing ${need[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
    else
        echo "tsan.sh: missing ${need[*]} (install them, or run as root with apt-get)" >&2
        exit 2
    fi
fi

rm -rf "$build"
cmake -S "$root" -B "$build" -DFASTCOPY_BUILD_TESTS=ON -DFASTCOPY_BUILD_MODULE=OFF \
    -DFASTCOPY_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" --target pool_tests core_tests -j "$jobs"

# halt_on_error: the first report fails the run; die_after_fork=0: the fork test starts
# threads in a forked child (also set in the test itself).
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 die_after_fork=0 ${TSAN_OPTIONS:-}"
log="$build/pool_tests.tsan.log"

run_ctest() {  # $@: prefix command (empty, or setarch ... -R)
    set +e
    if (($#)); then
        # ctest itself is not randomisation-sensitive; wrap the test binary instead.
        (cd "$build" && "$@" ctest -R "pool|core" --output-on-failure --timeout 900) >"$log" 2>&1
    else
        (cd "$build" && ctest -R "pool|core" --output-on-failure --timeout 900) >"$log" 2>&1
    fi
    local rc=$?
    set -e
    cat "$log"
    return $rc
}

mapping_failure() { grep -qE "unexpected memory mapping|FATAL: ThreadSanitizer" "$log"; }

if run_ctest; then
    echo "tsan.sh: pool and core tests passed under ThreadSanitizer"
    exit 0
fi
if ! mapping_failure; then
    echo "tsan.sh: pool or core tests FAILED under ThreadSanitizer" >&2
    exit 1
fi

# setarch -R sets ADDR_NO_RANDOMIZE, which children (ctest -> pool_tests) inherit. Some
# container seccomp profiles refuse that personality flag: then skip to the sysctl.
if setarch "$(uname -m)" -R true 2>/dev/null; then
    echo "tsan.sh: TSan could not map its shadow memory; retrying without ASLR (setarch -R)"
    if run_ctest setarch "$(uname -m)" -R; then
        echo "tsan.sh: pool and core tests passed under ThreadSanitizer (setarch -R)"
        exit 0
    fi
    if ! mapping_failure; then
        echo "tsan.sh: pool or core tests FAILED under ThreadSanitizer" >&2
        exit 1
    fi
fi

bits_file=/proc/sys/vm/mmap_rnd_bits
if [ "$(id -u)" = 0 ] && [ -w "$bits_file" ]; then
    old="$(cat "$bits_file")"
    echo "tsan.sh: retrying with vm.mmap_rnd_bits=28 (was $old; restored afterwards)"
    trap 'echo "$old" > "$bits_file"' EXIT
    echo 28 >"$bits_file"
    if run_ctest; then
        echo "tsan.sh: pool and core tests passed under ThreadSanitizer (mmap_rnd_bits=28)"
        exit 0
    fi
fi
echo "tsan.sh: pool or core tests FAILED under ThreadSanitizer (shadow memory could not be mapped;" \
    "try: sudo sysctl vm.mmap_rnd_bits=28)" >&2
exit 1
