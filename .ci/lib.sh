# Shared helpers for the CI scripts (sourced, not run).

# apt_install_missing PACKAGE...: installs the Debian packages given, in one apt-get call,
# as root or through sudo; nothing when the list is empty. Callers pass only what is missing.
apt_install_missing() {
    (($#)) || return 0
    echo "installing: $*"
    local sudo=()
    [[ $(id -u) == 0 ]] || sudo=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -q >/dev/null
    "${sudo[@]}" apt-get install -y -q -o DPkg::Lock::Timeout=600 --no-install-recommends "$@" >/dev/null
}
