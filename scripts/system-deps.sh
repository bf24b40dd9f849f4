#!/usr/bin/env bash
# Install the system packages the build and the tests need, only when missing.
# Debian/Ubuntu; root (or sudo) required to install. Safe to run repeatedly.
set -euo pipefail
need=()
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v make >/dev/null 2>&1 || need+=(make)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v tc >/dev/null 2>&1 || need+=(iproute2)
command -v fio >/dev/null 2>&1 || need+=(fio)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
python3 -c 'import sysconfig, os; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' >/dev/null 2>&1 || need+=(python3-dev)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "missing system packages: ${need[*]} (run as root or install them)" >&2; exit 1; fi
fi
echo "installing system packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || true
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
