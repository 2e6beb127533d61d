#!/usr/bin/env bash
# The Python test suite on emulated aarch64: cross-builds the extension with the project's
# CMakeLists (cmake/aarch64-linux-gnu.cmake, -DFASTCOPY_BUILD_MODULE=ON) against an arm64
# Debian root filesystem (mmdebstrap, no package scripts run), then runs pytest with the
# rootfs's Python under qemu-aarch64-static for each CPU in FASTCOPY_ARM_CPUS (default:
# NEON only, and SVE with 64-byte vectors). Tests that start processes are skipped there
# (FASTCOPY_NO_SUBPROCESS=1): without binfmt_misc an emulated Python cannot exec aarch64
# children.
#
# Environment: FASTCOPY_CI_BUILD (default build/ci), FASTCOPY_ARM_ROOTFS (default
# $FASTCOPY_CI_BUILD/rootfs-arm64; reused when present), FASTCOPY_ARM_CPUS, PYTEST_ARGS,
# FASTCOPY_ARM_KERNEL_TESTS (the test files run on every CPU after the first).
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${FASTCOPY_CI_BUILD:-$ROOT/build/ci}
R=${FASTCOPY_ARM_ROOTFS:-$B/rootfs-arm64}
CPUS=${FASTCOPY_ARM_CPUS:-"max,sve=off max,sve-default-vector-length=64"}
T0=$(date +%s)
section() { printf '\n======== %s  [%ss]\n' "$*" "$(( $(date +%s) - T0 ))"; }
die() { echo "arm_pytest.sh: FAILED: $*" >&2; exit 1; }
mkdir -p "$B"

section "Tools"
need=()
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64-static >/dev/null 2>&1 || need+=(qemu-user-static)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
apt_install_missing "${need[@]}"
HOSTPY=${PYTHON:-python3}
PYBIND11_DIR=$("$HOSTPY" -c 'import pybind11; print(pybind11.get_cmake_dir())' 2>/dev/null) ||
    die "host Python needs pybind11>=3 (pip install 'pybind11>=3'): only its CMake files and headers are used"
echo "pybind11: $PYBIND11_DIR"

section "arm64 root filesystem ($R)"
if [[ ! -f "$R/.fastcopy-rootfs-ok" ]]; then
    rm -rf "$R"
    mmdebstrap --quiet --mode=root --variant=extract --architectures=arm64 \
        --include=python3,python3-numpy,python3-pytest,python3-hypothesis,python3-cpuinfo,libpython3.11-dev,libstdc++6 \
        bookworm "$R"
    # The extract variant runs no package scripts: numpy needs these alternatives links.
    ln -sf blas/libblas.so.3 "$R/usr/lib/aarch64-linux-gnu/libblas.so.3"
    ln -sf lapack/liblapack.so.3 "$R/usr/lib/aarch64-linux-gnu/liblapack.so.3"
    touch "$R/.fastcopy-rootfs-ok"
else
    echo "reusing existing rootfs"
fi
# qemu-user's -L looks a path up under the root filesystem first: its empty dev/shm would hide
# the host's segments from a directory listing (os.listdir) while opening a segment by name
# still reaches the host's. Without it every lookup reaches the host's /dev/shm.
rm -rf "$R/dev/shm"
PYVER=$(cd "$R/usr/include" && ls -d python3.* | head -1)
[[ -n "$PYVER" ]] || die "no Python headers in $R/usr/include"

# The emulated interpreter, wrapped so CMake's FindPython can query it (SOABI, version).
QPY=$B/arm64-python3
cat >"$QPY" <<WRAP
#!/bin/sh
exec qemu-aarch64-static -cpu max,sve=off -L "$R" "$R/usr/bin/$PYVER" "\$@"
WRAP
chmod +x "$QPY"
SUFFIX=$("$QPY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
echo "target interpreter: $("$QPY" -c 'import sys, numpy; print(sys.version.split()[0], "numpy", numpy.__version__)'), suffix $SUFFIX"

section "Cross-build the extension (aarch64)"
BM=$B/arm64-module
rm -rf "$BM"  # small; a stale cache would keep old toolchain flags
cmake -S "$ROOT" -B "$BM" $(command -v ninja >/dev/null && echo -G Ninja) -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_TOOLCHAIN_FILE="$ROOT/cmake/aarch64-linux-gnu.cmake" -DFASTCOPY_ARM64_ROOT="$R" \
    -DFASTCOPY_BUILD_MODULE=ON -Dpybind11_DIR="$PYBIND11_DIR" \
    -DPython_EXECUTABLE="$QPY" -DPython_INCLUDE_DIR="$R/usr/include/$PYVER" \
    -DPython_SOABI="$("$QPY" -c 'import sysconfig; print(sysconfig.get_config_var("SOABI"))')" \
    >"$BM.configure.log" 2>&1 || { cat "$BM.configure.log"; die "configure"; }
cmake --build "$BM" -j "$(nproc)" >"$BM.build.log" 2>&1 || { tail -40 "$BM.build.log"; die "build"; }
SO=$(ls "$BM"/_core*"$SUFFIX" 2>/dev/null | head -1)
[[ -n "$SO" ]] || { ls "$BM"; die "no _core*$SUFFIX built"; }
file "$SO"
STAGE=$B/arm64-site
rm -rf "$STAGE" && mkdir -p "$STAGE/fastcopy"
# Everything the wheel ships (modules, type stubs, py.typed), minus any host-built extension.
cp "$ROOT"/src/fastcopy/*.py "$ROOT"/src/fastcopy/*.pyi "$ROOT"/src/fastcopy/py.typed "$STAGE/fastcopy/"
for init in "$ROOT"/src/fastcopy/*/__init__.py; do  # every subpackage (shm, bench, tune, net)
  pkg=$(basename "$(dirname "$init")")
  mkdir -p "$STAGE/fastcopy/$pkg" && cp "$ROOT"/src/fastcopy/$pkg/*.py "$STAGE/fastcopy/$pkg/"
done
cp "$SO" "$STAGE/fastcopy/"

# The first CPU runs the whole suite; the others (other vector lengths, SVE) only the files
# whose results depend on the kernels and the policy: the channel, CLI, tune and docs tests
# do not change with the vector unit, and a second full pass cost 2.4 of CI's 27 minutes.
# Those files carry the pytest marker `kernels`.
KERNEL_TESTS=${FASTCOPY_ARM_KERNEL_TESTS:-"-m kernels tests"}
failed=0
which_tests=tests
for cpu in $CPUS; do
    section "pytest under qemu-aarch64-static -cpu $cpu"
    # -p no:cacheprovider: the checkout may be read-only for the emulated process.
    if (cd "$ROOT" && PYTHONPATH="$STAGE" FASTCOPY_NO_SUBPROCESS=1 PYTHONDONTWRITEBYTECODE=1 \
        qemu-aarch64-static -cpu "$cpu" -L "$R" "$R/usr/bin/$PYVER" -c \
            'import fastcopy, sys; print("fastcopy from", fastcopy.__file__); print("kernels:", fastcopy.kernels())' &&
        PYTHONPATH="$STAGE" FASTCOPY_NO_SUBPROCESS=1 PYTHONDONTWRITEBYTECODE=1 \
        qemu-aarch64-static -cpu "$cpu" -L "$R" "$R/usr/bin/$PYVER" -m pytest -p no:cacheprovider -q ${PYTEST_ARGS:-} $which_tests); then
        echo "-- ok: -cpu $cpu"
    else
        echo "-- FAILED: -cpu $cpu"
        failed=1
    fi
    which_tests=$KERNEL_TESTS
done
((failed == 0)) || die "pytest failed on at least one emulated CPU"
section "arm_pytest.sh: all passed"
