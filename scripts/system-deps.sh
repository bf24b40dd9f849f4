#!/usr/bin/env bash
# Install the system packages the build and the tests need, only when missing.
# Debian/Ubuntu; root (or sudo) required to install. Safe to run repeatedly.
# Required: a C compiler and Python's venv/headers (the build fails without them).
# Optional: iproute2 (netns fabric tests skip without it), fio (the fio baseline skips),
# etcd-server (the etcd metadata-directory and Mooncake-compatibility tests skip without it).
set -uo pipefail
required=()
optional=()
command -v gcc >/dev/null 2>&1 || required+=(gcc libc6-dev)
command -v make >/dev/null 2>&1 || required+=(make)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || required+=(python3-venv)
python3 -c 'import sysconfig, os; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' \
    >/dev/null 2>&1 || required+=(python3-dev)
# ip and tc live in /usr/sbin, which an ordinary user's PATH often lacks: look there too
{ PATH="$PATH:/usr/sbin:/sbin" command -v ip && PATH="$PATH:/usr/sbin:/sbin" command -v tc; } >/dev/null 2>&1 ||
    optional+=(iproute2)
command -v fio >/dev/null 2>&1 || optional+=(fio)
command -v etcd >/dev/null 2>&1 || optional+=(etcd-server)
[ ${#required[@]} -eq 0 ] && [ ${#optional[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; fi
fi
install() {
  command -v apt-get >/dev/null 2>&1 || return 1
  [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ] || return 1
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@"
}
if [ ${#required[@]} -gt 0 ] || [ ${#optional[@]} -gt 0 ]; then
  echo "installing system packages: ${required[*]} ${optional[*]}"
  if command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq >/dev/null 2>&1 || true
  fi
fi
if [ ${#required[@]} -gt 0 ]; then
  install "${required[@]}" || { echo "missing required system packages: ${required[*]}" >&2; exit 1; }
fi
for pkg in "${optional[@]}"; do
  install "$pkg" || echo "optional system package $pkg not installed; the tests that need it will skip" >&2
done
exit 0
