#!/usr/bin/env bash
# Installs the built package into a machine or an image's root filesystem, with its systemd
# units, and enables them. Idempotent. Run from a checkout after `npm ci`.
#
#   scripts/install.sh [--prefix DIR] [--root ROOTFS] [--group NAME] [--no-enable] [--uninstall]
#
# --prefix  where it goes inside the root (default /usr/local): PREFIX/lib/sandbox-supervisor,
#           wrappers PREFIX/bin/sbx and PREFIX/bin/sandbox-supervisor, man pages
#           PREFIX/share/man/man1/sbx.1 and PREFIX/share/man/man8/sandbox-supervisor.8
# --root    an image's root filesystem (default /); units go to ROOT/etc/systemd/system and are
#           enabled offline with systemctl --root
# --group   group of the socket (0660) and its directory (0750), for allowed non-root clients
set -euo pipefail

prefix=/usr/local
root=/
group=root
enable=1
uninstall=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --root) root=$2; shift 2 ;;
    --group) group=$2; shift 2 ;;
    --no-enable) enable=0; shift ;;
    --uninstall) uninstall=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

src=$(cd "$(dirname "$0")/.." && pwd)
root=${root%/}
libdir=$prefix/lib/sandbox-supervisor
dest=$root$libdir
units=$root/etc/systemd/system
mandir=$root$prefix/share/man
node_bin=$(command -v node)

systemctl_root() {
  if command -v systemctl >/dev/null 2>&1; then
    if [ -z "$root" ]; then systemctl "$@"; else systemctl --root="$root" "$@"; fi
  fi
}

if [ "$uninstall" = 1 ]; then
  systemctl_root disable sandbox-supervisor.socket sandbox-supervisor.service >/dev/null 2>&1 || true
  if [ -z "$root" ] && [ -d /run/systemd/system ]; then
    systemctl stop sandbox-supervisor.service sandbox-supervisor.socket 2>/dev/null || true
  fi
  rm -f "$units/sandbox-supervisor.service" "$units/sandbox-supervisor.socket"
  rm -f "$root$prefix/bin/sbx" "$root$prefix/bin/sandbox-supervisor"
  rm -f "$mandir/man1/sbx.1" "$mandir/man8/sandbox-supervisor.8"
  rm -rf "$dest"
  echo "uninstalled from ${root}${prefix}"
  exit 0
fi

for f in "$src/man/sbx.1" "$src/man/sandbox-supervisor.8" "$src/dist/supervisor/main.js" "$src/dist/cli/sbx.js" "$src/dist/cli/sbx" "$src/native-helpers/build/Release/sbx_native.node" "$src/native-helpers/build/Release/sbx-exec-shim"; do
  [ -e "$f" ] || { echo "install.sh: $f is missing: run npm ci first" >&2; exit 1; }
done

# The package: compiled JS, the native helper, production dependencies only.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/native-helpers/build/Release"
cp -r "$src/dist" "$src/package.json" "$src/package-lock.json" "$stage/"
cp "$src/native-helpers/build/Release/sbx_native.node" "$src/native-helpers/build/Release/sbx-exec-shim" "$stage/native-helpers/build/Release/"
# Production dependencies, copied from the checkout's node_modules (no network needed).
(cd "$src" && npm ls --omit=dev --all --parseable 2>/dev/null | tail -n +2) | while read -r pkg; do
  rel=${pkg#"$src"/}
  [ -e "$stage/$rel" ] && continue
  mkdir -p "$stage/$(dirname "$rel")"
  cp -r "$pkg" "$stage/$rel"
done
rm -rf "$dest"
mkdir -p "$(dirname "$dest")" "$root$prefix/bin" "$units"
cp -r "$stage" "$dest"
chmod 0755 "$dest"
# sbx through its launcher (its bundle, with the node that built it: cli/sbx-launcher.sh).
printf '#!/bin/sh\nexec %s/dist/cli/sbx "$@"\n' "$libdir" > "$root$prefix/bin/sbx"
printf '#!/bin/sh\nexec %s --max-semi-space-size=2 %s/dist/supervisor/main.js "$@"\n' "$node_bin" "$libdir" > "$root$prefix/bin/sandbox-supervisor"
chmod 0755 "$root$prefix/bin/sbx" "$root$prefix/bin/sandbox-supervisor"
# The man pages (generated from the commander definitions: npm run docs), for man sbx.
install -D -m 0644 "$src/man/sbx.1" "$mandir/man1/sbx.1"
install -D -m 0644 "$src/man/sandbox-supervisor.8" "$mandir/man8/sandbox-supervisor.8"
sed -e "s|@NODE@|$node_bin|g" -e "s|@LIBDIR@|$libdir|g" "$src/systemd/sandbox-supervisor.service" > "$units/sandbox-supervisor.service"
sed -e "s|@GROUP@|$group|g" "$src/systemd/sandbox-supervisor.socket" > "$units/sandbox-supervisor.socket"

if [ "$enable" = 1 ]; then
  systemctl_root enable sandbox-supervisor.socket sandbox-supervisor.service >/dev/null 2>&1 || echo "install.sh: could not enable the units (no systemctl?)" >&2
  if [ -z "$root" ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl start sandbox-supervisor.socket
  fi
fi
echo "installed into ${root}${prefix}: $libdir, $prefix/bin/sbx, $prefix/share/man/man1/sbx.1, /etc/systemd/system/sandbox-supervisor.{service,socket}"
