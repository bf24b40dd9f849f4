#!/usr/bin/env bash
# First contact on a shared machine, checked for real (root required): a throw-away ordinary user
# clones this checkout, runs `make install`, `make demo` and `make test` (or the targets given),
# while files another user (root) left behind lie where earlier runs put them: the old fixed-name
# benchmark file in /var/tmp (read-only to others), root's rail load tables in /dev/shm. The user,
# its home and the leftovers are removed at the end, also on failure or Ctrl-C.
#
#   sudo scripts/check-as-user.sh [TARGET...]     (default: install demo test; logs in $LOGDIR)
set -uo pipefail
[ "$(id -u)" -eq 0 ] || { echo "run as root (creates and removes a user)" >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
USERNAME=${USERNAME:-tentcheck$$}
LOGDIR=${LOGDIR:-$(mktemp -d "${TMPDIR:-/tmp}/tent-user-check.XXXXXX")}
chmod 755 "$LOGDIR"
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(install demo test)
BENCH_FILE=/var/tmp/tent-bench-67108864.bin  # the name `tent bench --quick` used before it went private
LOAD_TABLE=/dev/shm/tent-load-default         # the rail load table's name before it went per-user
created=()

cleanup() {
  for pid in $(pgrep -u "$USERNAME"); do kill -KILL "$pid" 2>/dev/null; done  # this throw-away user's only
  userdel -r "$USERNAME" >/dev/null 2>&1
  rm -rf "/tmp/pytest-of-$USERNAME"  # pytest's own per-user folder of the throw-away user
  for f in "${created[@]}"; do rm -f "$f"; done
}
trap cleanup EXIT

useradd -m -s /bin/bash "$USERNAME" || exit 1
home=$(getent passwd "$USERNAME" | cut -d: -f6)
if [ ! -e "$BENCH_FILE" ]; then  # root's, readable and not writable by others
  head -c 67108864 /dev/zero > "$BENCH_FILE" && chmod 644 "$BENCH_FILE" && created+=("$BENCH_FILE")
fi
if [ ! -e "$LOAD_TABLE" ]; then  # root's table, a valid one (engines of older versions may use it)
  python3 -c 'import struct, sys; n = 64 + 64 * 48 + 64 * 8 + 64 * 64 * 8
open(sys.argv[1], "wb").write(struct.pack("<8sIII", b"TENTLOAD", 1, 64, 64).ljust(n, b"\0"))' "$LOAD_TABLE" &&
    chmod 600 "$LOAD_TABLE" && created+=("$LOAD_TABLE")
fi
ls -l "$BENCH_FILE" "$LOAD_TABLE" /dev/shm/tent-load-u0-* > "$LOGDIR/leftovers.txt" 2>&1
git -C "$REPO" bundle create "$LOGDIR/repo.bundle" HEAD >/dev/null 2>&1 || exit 1
chmod 644 "$LOGDIR/repo.bundle"
su - "$USERNAME" -c "git -c advice.detachedHead=false clone -q '$LOGDIR/repo.bundle' '$home/tent'" || exit 1

rc=0
for t in "${TARGETS[@]}"; do
  start=$(date +%s)
  # a login shell: the user's own PATH and python3, no root environment
  su - "$USERNAME" -c "cd ~/tent && make $t" > "$LOGDIR/$t.log" 2>&1
  status=$?
  echo "make $t as $USERNAME (uid $(id -u "$USERNAME")): exit $status in $(( $(date +%s) - start ))s, $(wc -l < "$LOGDIR/$t.log") lines -> $LOGDIR/$t.log"
  [ $status -eq 0 ] || { rc=1; tail -25 "$LOGDIR/$t.log"; break; }
done
# pytest's own per-user folder (mode 0700) keeps the last runs' tmp_path folders by design
left=$(find /tmp /var/tmp /dev/shm -maxdepth 2 -user "$USERNAME" 2>/dev/null | grep -v -e "^$LOGDIR" -e "^/tmp/pytest-of-$USERNAME")
if [ -n "$left" ]; then
  echo "files of $USERNAME left in shared folders:"; echo "$left"; rc=1
fi
exit $rc
