#!/bin/sh
# sbx's launcher, the `sbx` bin (copied to dist/cli/sbx by scripts/build/sbx-snapshot.mjs).
# It starts the CLI from its V8 startup snapshot, dist/cli/sbx.blob, in which sbx and its
# modules are already loaded (node --snapshot-blob: Node 20's "Startup snapshot API"), so a
# command does not pay for loading them again: `sbx --version` starts in about the time of
# `node -e 0`. The snapshot is made by the build with the node named in sbx.blob.node, and
# only that very node binary, with V8's configuration untouched, may read it (else node exits
# 14: "Failed to load the startup snapshot"). So the CLI starts from sbx.js instead when there
# is no blob, when the node is not the same file as at build time (device, inode, size and
# mtime: an upgrade replaces it), when NODE_OPTIONS is set (V8 flags such as
# --max-old-space-size change the configuration), and for the commands whose modules the
# snapshot leaves out (verify, restore, checkpoints, diff: a snapshot's main cannot import()).
self=$0
if [ -L "$self" ]; then self=$(readlink -f -- "$self"); fi
case $self in */*) here=${self%/*} ;; *) here=. ;; esac
node= version= identity=
if [ -r "$here/sbx.blob.node" ]; then { read -r node; read -r version; read -r identity; } < "$here/sbx.blob.node"; fi
if [ -z "${NODE_OPTIONS:-}" ] && [ -n "$identity" ] && [ -x "$node" ] && [ -r "$here/sbx.blob" ] &&
  [ "$(stat -L -c '%d:%i:%s:%Y' -- "$node" 2>/dev/null)" = "$identity" ]; then
  # The command: the first word that is not a global option (--socket, --url and --token-file take a value).
  cmd=
  skip=
  for a in "$@"; do
    if [ -n "$skip" ]; then skip=; continue; fi
    case $a in
      --socket | --url | --token-file) skip=1 ;;
      -*) ;;
      *) cmd=$a; break ;;
    esac
  done
  case $cmd in
    verify | restore | checkpoints | diff) ;;
    # node takes the first `--` as the end of its own options; the rest is sbx's.
    *) exec "$node" --snapshot-blob "$here/sbx.blob" -- "$@" ;;
  esac
fi
if [ -z "$node" ] || [ ! -x "$node" ]; then node=node; fi
exec "$node" "$here/sbx.js" "$@"
