#!/bin/sh
# sbx's launcher, the `sbx` bin (copied to dist/cli/sbx by scripts/build/sbx-snapshot.mjs).
# It starts the CLI from its V8 startup snapshot, dist/cli/sbx.blob, in which sbx and its
# modules are already loaded (node --snapshot-blob: Node 20's "Startup snapshot API"), so a
# command does not pay for loading them again: `sbx --version` starts in about the time of
# `node -e 0`. The snapshot is made by the build with the node named in sbx.blob.node, and
# only that node may read it: a missing blob, another node, or a node newer than the blob
# (upgraded in place) start the CLI from sbx.js instead, as does a command whose modules the
# snapshot leaves out (verify, restore, checkpoints: a snapshot's main cannot import()).
self=$0
if [ -L "$self" ]; then self=$(readlink -f -- "$self"); fi
case $self in */*) here=${self%/*} ;; *) here=. ;; esac
node=
if [ -r "$here/sbx.blob.node" ]; then read -r node < "$here/sbx.blob.node"; fi
if [ -n "$node" ] && [ -x "$node" ] && [ -r "$here/sbx.blob" ] && [ ! "$node" -nt "$here/sbx.blob" ]; then
  # The command: the first word that is not a global option (--socket takes a value).
  cmd=
  skip=
  for a in "$@"; do
    if [ -n "$skip" ]; then skip=; continue; fi
    case $a in
      --socket) skip=1 ;;
      -*) ;;
      *) cmd=$a; break ;;
    esac
  done
  case $cmd in
    verify | restore | checkpoints) ;;
    # node takes the first `--` as the end of its own options; the rest is sbx's.
    *) exec "$node" --snapshot-blob "$here/sbx.blob" -- "$@" ;;
  esac
fi
if [ -z "$node" ] || [ ! -x "$node" ]; then node=node; fi
exec "$node" "$here/sbx.js" "$@"
