#!/usr/bin/env bash
# Soft-RoCE testbed: boot Debian's 6.1 kernel in QEMU with virtme-ng and run a command inside,
# with this checkout and its .venv (the guest sees the host's files over 9p).
#
#   scripts/rdma-vm.sh [options] [--] CMD...
#
#   --vms 1|2        one guest with one rxe device (loopback QPs between processes; default), or
#                    two guests ("a" and "b", one vCPU each) joined by QEMU socket netdevs: one
#                    control NIC plus --nics rail NICs, one rxe device per rail NIC
#   --nics N         rail NICs per guest with --vms 2 (default 2)
#   --rates LIST     tc rate per rail NIC, inside both guests (e.g. 20mbit,10mbit; default none)
#   --memory SIZE    guest memory (default 2G; 1G each with --vms 2)
#   --cpus N         vCPUs (default 2; 1 each with --vms 2)
#   --timeout S      bound for the whole run, boot included (default 900)
#   --out DIR        a host folder the guests may write (default: a fresh one under /tmp);
#                    results, guest logs and rc.<role> land there
#   --install-only   install what the testbed needs, then exit
#   --no-install     never install (fail with the reason instead)
#
# CMD runs in every guest (bash -c), in the checkout's root, after the rxe devices are up, with:
#   TENT_VM_ROLE     single | a | b           TENT_VM_OUT   the writable folder
#   TENT_RDMA_DEVS   rxe0[,rxe1..]            TENT_VM_NICS  the rail netdevs (eth1,eth2..)
#   TENT_VM_IP       this guest's control IP  TENT_VM_PEER_IP  the other guest's (two guests)
# CMD's standard output (guest "a"'s with two guests) is also this script's, once the guests end.
# Exit status: CMD's (guest "a"'s with two guests, or the first failure); 3 = the testbed could
# not be set up (the reason is the last line on stderr and in OUT/testbed.json).
#
# Installs (Debian, root): qemu-system-x86 kmod iproute2 iputils-ping rdma-core ibverbs-providers
# ibverbs-utils perftest python3-pyverbs squashfs-tools, the kernel image package (downloaded and extracted, not installed) and
# virtme-ng (in its own venv). Everything is cached under $TENT_RDMA_VM_CACHE
# (default ~/.cache/tent-rdma-vm), so later runs start in seconds. KVM is tried once per host
# kernel with a short timeout (nested KVM hangs on some machines); TCG is the fallback.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${TENT_RDMA_VM_CACHE:-$HOME/.cache/tent-rdma-vm}
VNG_VERSION=1.42
VMS=1 NICS=2 RATES="" MEMORY="" CPUS="" TIMEOUT=900 OUT="" INSTALL=1 INSTALL_ONLY=0
KVM_PROBE_S=25

die() { echo "rdma-vm: $*" >&2; exit 3; }
setup_fail() {
  echo "rdma-vm: testbed unavailable: $*" >&2
  if [ -n "$OUT" ]; then
    /usr/bin/python3 -c 'import json,sys; print(json.dumps({"ok": False, "reason": sys.argv[1]}))' "$*" >"$OUT/testbed.json" || true
  fi
  exit 3
}

while [ $# -gt 0 ]; do
  case "$1" in
    --vms) VMS=$2; shift 2 ;;
    --nics) NICS=$2; shift 2 ;;
    --rates) RATES=$2; shift 2 ;;
    --memory) MEMORY=$2; shift 2 ;;
    --cpus) CPUS=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --install-only) INSTALL_ONLY=1; shift ;;
    --no-install) INSTALL=0; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) break ;;
  esac
done
case "$VMS" in 1|2) ;; *) die "--vms must be 1 or 2" ;; esac
[[ "$NICS" =~ ^[1-8]$ ]] || die "--nics must be 1..8"
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "--timeout must be seconds"
if [ "$VMS" = 1 ]; then MEMORY=${MEMORY:-2G}; CPUS=${CPUS:-2}; else MEMORY=${MEMORY:-1G}; CPUS=${CPUS:-1}; fi
[ $# -gt 0 ] || [ "$INSTALL_ONLY" = 1 ] || die "no command given (see --help)"
if [ -z "$OUT" ]; then OUT=$(mktemp -d /tmp/tent-rdma-vm.XXXXXX); fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
START=$(date +%s)
left() { echo $(( TIMEOUT - ($(date +%s) - START) )); }

# ------------------------------------------------------------------ host dependencies
need_pkgs=()
command -v qemu-system-x86_64 >/dev/null || need_pkgs+=(qemu-system-x86)
command -v modprobe >/dev/null && command -v depmod >/dev/null || need_pkgs+=(kmod)
command -v ip >/dev/null && command -v tc >/dev/null && command -v rdma >/dev/null || need_pkgs+=(iproute2)
[ -e /usr/lib/x86_64-linux-gnu/libibverbs.so.1 ] || need_pkgs+=(libibverbs1)
[ -e /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ] || ls /usr/lib/*/libibverbs/librxe-* >/dev/null 2>&1 \
  || need_pkgs+=(ibverbs-providers)
command -v rdma >/dev/null && [ -e /usr/sbin/rdma-ndd ] || need_pkgs+=(rdma-core)
command -v ibv_devinfo >/dev/null || need_pkgs+=(ibverbs-utils)
command -v ping >/dev/null || need_pkgs+=(iputils-ping)
command -v ib_write_bw >/dev/null || need_pkgs+=(perftest)
[ -e /usr/lib/python3/dist-packages/pyverbs/__init__.py ] || need_pkgs+=(python3-pyverbs)
command -v mksquashfs >/dev/null || need_pkgs+=(squashfs-tools)
# virtme-ng builds the guest's initramfs with busybox (a fresh Debian has none)
command -v busybox >/dev/null || need_pkgs+=(busybox-static)
apt_updated=0
apt_install() {
  [ "$INSTALL" = 1 ] || return 1
  command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] || return 1
  if [ $apt_updated = 0 ]; then
    timeout 300 apt-get update -qq >/dev/null 2>&1 || true
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "rdma-vm: installing ${need_pkgs[*]}" >&2
  apt_install "${need_pkgs[@]}" || {
    # pyverbs (discovery extras) and squashfs-tools (fast imports) are optional
    rest=(); for p in "${need_pkgs[@]}"; do case "$p" in python3-pyverbs|squashfs-tools) ;; *) rest+=("$p") ;; esac; done
    if [ ${#rest[@]} -gt 0 ]; then apt_install "${rest[@]}" || setup_fail "cannot install ${rest[*]} (needs root and apt)"; fi
  }
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock -w 600 9 || setup_fail "another rdma-vm.sh holds $CACHE/.lock"

# the kernel: Debian's image package, extracted (not installed)
KROOT=$(ls -d "$CACHE"/kernel-*/kroot 2>/dev/null | sort | tail -1 || true)
if [ -z "$KROOT" ] || [ ! -e "$KROOT/.complete" ]; then
  [ "$INSTALL" = 1 ] || setup_fail "no cached kernel in $CACHE and --no-install"
  command -v apt-get >/dev/null || setup_fail "apt-get missing: cannot fetch Debian's kernel package"
  if [ $apt_updated = 0 ]; then timeout 300 apt-get update -qq >/dev/null 2>&1 || true; apt_updated=1; fi
  image=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  [ -n "$image" ] || setup_fail "apt does not know linux-image-amd64 (no Debian mirror?)"
  kver=${image#linux-image-}
  dir="$CACHE/kernel-$kver"
  rm -rf "$dir"; mkdir -p "$dir"
  (cd "$dir" && timeout 600 apt-get download "$image" >/dev/null 2>&1) || setup_fail "apt-get download $image failed (no network or no Debian mirror?)"
  dpkg -x "$dir"/linux-image-*.deb "$dir/kroot" || setup_fail "dpkg -x of $image failed"
  rm -f "$dir"/linux-image-*.deb
  touch "$dir/kroot/.complete"
  KROOT="$dir/kroot"
fi
KVER=$(ls "$KROOT/lib/modules" | head -1)
VMLINUZ="$KROOT/boot/vmlinuz-$KVER"
[ -f "$VMLINUZ" ] || setup_fail "no kernel image at $VMLINUZ"
# virtme-ng loads the guest's modules from /lib/modules/<version> on the host
if [ ! -e "/lib/modules/$KVER" ] || [ -L "/lib/modules/$KVER" ]; then
  mkdir -p /lib/modules 2>/dev/null && ln -sfn "$KROOT/lib/modules/$KVER" "/lib/modules/$KVER" 2>/dev/null \
    || setup_fail "cannot link /lib/modules/$KVER (needs root)"
fi
[ -e "/lib/modules/$KVER/modules.dep" ] || depmod "$KVER" || setup_fail "depmod $KVER failed"

# virtme-ng in its own venv
VNG="$CACHE/vng/bin/vng"
if [ ! -x "$VNG" ]; then
  [ "$INSTALL" = 1 ] || setup_fail "virtme-ng missing in $CACHE/vng and --no-install"
  rm -rf "$CACHE/vng"
  python3 -m venv "$CACHE/vng" || setup_fail "python3 -m venv failed (install python3-venv)"
  timeout 600 "$CACHE/vng/bin/pip" install -q "virtme-ng==$VNG_VERSION" >/dev/null 2>&1 \
    || timeout 600 "$CACHE/vng/bin/pip" install -q virtme-ng >/dev/null 2>&1 || setup_fail "pip install virtme-ng failed"
fi
export PATH="$CACHE/vng/bin:$PATH"

# Python over 9p under TCG is slow (thousands of stat/open round trips: `import numpy` took a
# minute). The interpreter's stdlib and the checkout's .venv go in as read-only squashfs disks,
# mounted inside the guest over their own paths; the checkout itself stays on 9p.
IMG_OPTS=() IMG_MOUNTS=""
if command -v mksquashfs >/dev/null && [ -x "$ROOT/.venv/bin/python" ]; then
  mkdir -p "$CACHE/img"
  std=$("$ROOT/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])' 2>/dev/null || true)
  venv=$(cd "$ROOT/.venv" && pwd -P)
  n=0
  for src in "$std" "$venv"; do
    [ -n "$src" ] && [ -d "$src" ] || continue
    img="$CACHE/img/$(echo "$src" | md5sum | cut -c1-16).sqfs"
    if [ ! -s "$img" ] || [ -n "$(find "$src" -newer "$img" -print -quit 2>/dev/null)" ]; then
      excl=(); [ "$src" = "$std" ] && excl=(-e test site-packages)
      rm -f "$img"
      mksquashfs "$src" "$img.tmp" -noappend -no-progress -quiet -noI -noD -noF -noX -no-xattrs "${excl[@]}" >/dev/null 2>&1 \
        && mv "$img.tmp" "$img" || { rm -f "$img.tmp"; continue; }
    fi
    dev=$(echo vda vdb vdc | cut -d" " -f$((n + 1)))
    IMG_OPTS+=("-drive file=$img,if=virtio,format=raw,readonly=on")
    IMG_MOUNTS="$IMG_MOUNTS $dev:$src"
    n=$((n + 1))
  done
fi
flock -u 9
[ "$INSTALL_ONLY" = 1 ] && { echo "rdma-vm: testbed installed ($KVER, cache $CACHE)" >&2; exit 0; }

# ------------------------------------------------------------------ VM plumbing
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.5
  for p in "${PIDS[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
  PIDS=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# KVM: tried once per host kernel and QEMU build (the answer is cached), TCG otherwise
accel_opts=(--disable-kvm)
kvm_key="$CACHE/kvm-$(uname -r)-$(qemu-system-x86_64 --version | head -1 | tr -dc 'A-Za-z0-9.')"
if [ -w /dev/kvm ] && [ "${TENT_RDMA_VM_KVM:-auto}" != 0 ]; then
  if [ ! -e "$kvm_key" ]; then
    if timeout -k 2 "$KVM_PROBE_S" "$VNG" --run "$VMLINUZ" --force-9p --memory 512M --cpus 1 \
         --exec "echo tent-kvm-ok" 2>/dev/null | grep -q tent-kvm-ok; then echo yes >"$kvm_key"; else echo no >"$kvm_key"; fi
  fi
  [ "$(cat "$kvm_key")" = yes ] && accel_opts=()
fi
ACCEL=$([ ${#accel_opts[@]} = 0 ] && echo kvm || echo tcg)

free_udp_port() {
  local p
  for _ in $(seq 200); do
    p=$(( 20000 + RANDOM % 40000 ))
    ss -Huln "sport = :$p" 2>/dev/null | grep -q . || { echo "$p"; return; }
  done
  echo $(( 20000 + RANDOM % 40000 ))
}

# the guest-side setup, run before CMD
GUEST="$OUT/guest-setup.sh"
cat >"$GUEST" <<'EOS'
#!/bin/bash
# generated by scripts/rdma-vm.sh: bring up rxe devices, then run the command
set -uo pipefail
role=$1; shift
log() { echo "[guest $role] $*" >&2; }
fail() { log "$*"; echo "{\"ok\": false, \"reason\": \"guest $role: $*\"}" >"$TENT_VM_OUT/testbed.$role.json"; echo 3 >"$TENT_VM_OUT/rc.$role"; exit 3; }
ulimit -l unlimited 2>/dev/null || true
if [ -n "${TENT_VM_MOUNTS:-}" ]; then  # read-only squashfs copies of the stdlib and .venv
  modprobe virtio_blk 2>/dev/null; modprobe squashfs 2>/dev/null
  for m in $TENT_VM_MOUNTS; do
    dev=${m%%:*} path=${m#*:}
    for _ in $(seq 50); do [ -b "/dev/$dev" ] && break; sleep 0.1; done
    mkdir -p "/run/tent-img/$dev"
    mount -t squashfs -o ro "/dev/$dev" "/run/tent-img/$dev" && mount --bind "/run/tent-img/$dev" "$path" \
      || log "cannot mount /dev/$dev over $path (imports stay on 9p)"
  done
fi
modprobe rdma_rxe || fail "modprobe rdma_rxe failed"
devs=(); nics=()
wait_active() {  # bounded: the port must come up within 20 s
  for _ in $(seq 200); do
    [ "$(cat /sys/class/infiniband/$1/ports/1/state 2>/dev/null)" = "4: ACTIVE" ] && return 0
    sleep 0.1
  done
  return 1
}
if [ "$role" = single ]; then
  ip link set lo up
  ip link add va type veth peer name vb || fail "veth"
  ip addr add 198.18.50.1/24 dev va; ip link set va up; ip link set vb up
  rdma link add rxe0 type rxe netdev va || fail "rdma link add rxe0"
  wait_active rxe0 || fail "rxe0 never became ACTIVE"
  devs=(rxe0); nics=(va); ip_self=198.18.50.1; ip_peer=""
else
  ip link set lo up
  host=$([ "$role" = a ] && echo 1 || echo 2); other=$([ "$role" = a ] && echo 2 || echo 1)
  for nic in /sys/class/net/*; do
    n=$(basename "$nic"); mac=$(cat "$nic/address")
    case "$mac" in
      52:54:00:7e:0?:00) ip addr add "198.18.0.$host/24" dev "$n"; ip link set "$n" up ;;
      52:54:00:7e:0?:??)
        i=$((16#${mac##*:} - 1))
        ip addr add "198.18.$((10 + i)).$host/24" dev "$n"; ip link set "$n" up
        rate=$(echo "${TENT_VM_RATES:-}" | cut -d, -f$((i + 1)))
        if [ -n "$rate" ]; then
          # lossless: the queue holds what every QP can have in flight (tent_rdma.testbed.tbf_args)
          tc qdisc add dev "$n" root tbf rate "$rate" burst 64kb limit 4mb || fail "tc on $n"
        fi
        rdma link add "rxe$i" type rxe netdev "$n" || fail "rdma link add rxe$i on $n"
        devs[$i]="rxe$i"; nics[$i]="$n" ;;
    esac
  done
  for d in "${devs[@]}"; do wait_active "$d" || fail "$d never became ACTIVE"; done
  ip_self=198.18.0.$host; ip_peer=198.18.0.$other
  # the rails must carry traffic before the command starts; the other guest may still be booting
  # (minutes under TCG on a busy host), so the wait is long but bounded
  for i in "${!devs[@]}"; do
    ok=0 until=$(( $(date +%s) + ${TENT_VM_PEER_WAIT_S:-900} ))
    while [ "$(date +%s)" -lt "$until" ]; do
      ping -c1 -W1 "198.18.$((10 + i)).$other" >/dev/null 2>&1 && { ok=1; break; }
      sleep 0.5
    done
    [ $ok = 1 ] || fail "rail $i: 198.18.$((10 + i)).$other does not answer"
  done
fi
export TENT_VM_ROLE=$role PYTHONUNBUFFERED=1
export TENT_RDMA_DEVS=$(IFS=,; echo "${devs[*]}")
export TENT_VM_NICS=$(IFS=,; echo "${nics[*]}")
export TENT_VM_IP=$ip_self TENT_VM_PEER_IP=$ip_peer
log "up: devices $TENT_RDMA_DEVS on $TENT_VM_NICS ($(nproc) vCPU)"
cd "$TENT_VM_ROOT"
bash "$TENT_VM_OUT/cmd.sh" | tee "$TENT_VM_OUT/stdout.$role"
rc=${PIPESTATUS[0]}
echo $rc >"$TENT_VM_OUT/rc.$role"
exit $rc
EOS
chmod +x "$GUEST"

# the guests' engines bind non-loopback addresses: they share a cluster secret (TENT_AUTH_TOKEN),
# so every control request and every QP handshake between them is authenticated; a fresh one per
# run unless the caller brings its own
TOKEN_FILE=""
if [ -z "${TENT_AUTH_TOKEN:-}" ] && [ -z "${TENT_AUTH_TOKEN_FILE:-}" ]; then
  TOKEN_FILE="$OUT/cluster.token"
  (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TOKEN_FILE")
fi
# the command and its environment travel as files (the guest's /bin/sh is dash: no bash quoting)
{
  printf 'export TENT_VM_OUT=%q TENT_VM_ROOT=%q TENT_VM_RATES=%q TENT_VM_MOUNTS=%q\n' "$OUT" "$ROOT" "$RATES" "$IMG_MOUNTS"
  [ -n "$TOKEN_FILE" ] && printf 'export TENT_AUTH_TOKEN_FILE=%q\n' "$TOKEN_FILE"
  [ -n "${TENT_AUTH_TOKEN:-}" ] && printf 'export TENT_AUTH_TOKEN=%q\n' "$TENT_AUTH_TOKEN"
  [ -n "${TENT_AUTH_TOKEN_FILE:-}" ] && printf 'export TENT_AUTH_TOKEN_FILE=%q\n' "$TENT_AUTH_TOKEN_FILE"
  # variables the caller wants inside (PYTHONPATH, TENT_*): names listed in TENT_VM_PASS
  for v in ${TENT_VM_PASS:-}; do [ -n "${!v+x}" ] && printf 'export %s=%q\n' "$v" "${!v}"; done
} >"$OUT/guest-env.sh"
printf '%q ' "$@" >"$OUT/cmd.sh"
echo >>"$OUT/cmd.sh"
run_vm() {  # role, extra qemu options...
  local role=$1; shift
  local qopts="${IMG_OPTS[*]} $*"
  setsid "$VNG" --run "$VMLINUZ" "${accel_opts[@]}" --force-9p --memory "$MEMORY" --cpus "$CPUS" \
    --rwdir "$OUT" ${qopts:+--qemu-opts="$qopts"} \
    --exec "bash -c '. $OUT/guest-env.sh; exec bash $GUEST $role'" >"$OUT/console.$role.log" 2>&1 </dev/null &
  PIDS+=($!)
}

# a reused --out folder: stale rendezvous files of an earlier run (tent_rdma.testbed) would let
# guest "a" start before "b" serves, and make job numbers skip
rm -f "$OUT"/rc.* "$OUT"/testbed*.json "$OUT"/b.ready "$OUT"/a.done "$OUT"/job-*
echo "rdma-vm: booting $VMS guest(s) ($ACCEL, $CPUS vCPU, $MEMORY, kernel $KVER), output in $OUT" >&2
if [ "$VMS" = 1 ]; then
  run_vm single
  roles=(single)
else
  qa=() qb=()
  for i in $(seq 0 "$NICS"); do
    pa=$(free_udp_port); pb=$(free_udp_port)
    while [ "$pb" = "$pa" ]; do pb=$(free_udp_port); done
    mac_i=$(printf '%02x' "$i")
    qa+=("-netdev socket,id=n$i,udp=127.0.0.1:$pb,localaddr=127.0.0.1:$pa -device virtio-net-pci,netdev=n$i,mac=52:54:00:7e:0a:$mac_i,romfile=")
    qb+=("-netdev socket,id=n$i,udp=127.0.0.1:$pa,localaddr=127.0.0.1:$pb -device virtio-net-pci,netdev=n$i,mac=52:54:00:7e:0b:$mac_i,romfile=")
  done
  run_vm b "${qb[*]}"
  run_vm a "${qa[*]}"
  roles=(a b)
fi

# wait for every guest, bounded by --timeout
rc=0
for idx in "${!PIDS[@]}"; do
  pid=${PIDS[$idx]} role=${roles[$idx]}
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$(left)" -le 0 ]; then
      echo "rdma-vm: timed out after ${TIMEOUT}s (guest $role still running); see $OUT/console.$role.log" >&2
      tail -20 "$OUT/console.$role.log" >&2 || true
      exit 124
    fi
    sleep 1
  done
  wait "$pid" 2>/dev/null || true
  if [ ! -e "$OUT/rc.$role" ]; then
    tail -30 "$OUT/console.$role.log" >&2 || true
    setup_fail "guest $role ended without running the command (boot failed?); see $OUT/console.$role.log"
  fi
  r=$(cat "$OUT/rc.$role")
  if [ "$r" = 3 ] && [ -e "$OUT/testbed.$role.json" ]; then
    setup_fail "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["reason"])' "$OUT/testbed.$role.json")"
  fi
  if [ "$r" != 0 ] && [ "$rc" = 0 ]; then rc=$r; fi
  if [ "$VMS" = 2 ] && [ "$role" = a ]; then
    # a is the initiator: once it is done, b has a bounded time to notice and finish
    for _ in $(seq 60); do kill -0 "${PIDS[1]}" 2>/dev/null || break; sleep 1; done
  fi
done
# CMD's standard output (guest a's with two guests) comes back on ours, e.g. for scripts/bench-all.sh
cat "$OUT/stdout.${roles[0]}" 2>/dev/null || true
python3 -c 'import json,sys; print(json.dumps({"ok": True, "accel": sys.argv[1], "kernel": sys.argv[2], "seconds": int(sys.argv[3])}))' \
  "$ACCEL" "$KVER" "$(( $(date +%s) - START ))" >"$OUT/testbed.json"
echo "rdma-vm: done in $(( $(date +%s) - START ))s, rc $rc" >&2
exit "$rc"
