#!/usr/bin/env bash
# pytest cases that need a CPU this machine is not, run under qemu-x86_64-static with an
# emulated CPU without AVX2 (Nehalem): there the AVX2 kernels are compiled but unsupported,
# which the "unsupported kernel" tests need (on an AVX2 host they skip, saying so). Children
# these tests start run under the same emulator (FASTCOPY_TEST_EMULATOR). Fails when any of
# the selected tests is skipped, so the cases really run somewhere.
#
# Uses the `python` on PATH (CI: the venv with fastcopy installed). x86_64 hosts only.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ $(uname -m) != x86_64 ]]; then echo "emulated_cpu_pytest.sh: x86_64 hosts only, nothing to do"; exit 0; fi
command -v qemu-x86_64-static >/dev/null 2>&1 || apt_install_missing qemu-user-static
EMU="qemu-x86_64-static -cpu Nehalem"
# numpy's OpenBLAS picks its kernels at load time; under this emulator on a Zen 5 host it
# picked its Haswell (AVX2) kernels and `import numpy` died with SIGILL. Its Nehalem kernels
# keep it within the emulated CPU (children inherit the variable).
export OPENBLAS_CORETYPE=NEHALEM
PY=$(python -c 'import sys; print(sys.executable)')
# The tests marked `emulated_cpu`, collected natively (collecting every file under the emulator
# would take minutes), then run by node id under it.
mapfile -t SELECT < <(python -m pytest -p no:cacheprovider -q --collect-only -m emulated_cpu tests 2>/dev/null | grep '::')
(( ${#SELECT[@]} > 0 )) || { echo "emulated_cpu_pytest.sh: no test is marked emulated_cpu"; exit 1; }
log=$(mktemp)
set +e
FASTCOPY_TEST_EMULATOR="$EMU" $EMU "$PY" -m pytest -p no:cacheprovider -q -rs "${SELECT[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
[[ $rc == 0 ]] || { echo "emulated_cpu_pytest.sh: pytest failed (exit $rc)"; exit 1; }
if grep -qi "skipped" "$log" || ! grep -q "${#SELECT[@]} passed" "$log"; then
    echo "emulated_cpu_pytest.sh: expected ${#SELECT[@]} tests to pass, none skipped"
    exit 1
fi
echo "emulated_cpu_pytest.sh: ${#SELECT[@]} tests ran on an emulated Nehalem (no AVX2)"
