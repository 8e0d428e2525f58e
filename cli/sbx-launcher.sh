#!/bin/sh
# sbx's launcher, the `sbx` bin (copied to dist/cli/sbx by scripts/build/sbx-bundle.mjs). It
# starts the CLI from its bundle, dist/cli/sbx.bundle.cjs (sbx and what it loads at start in one
# script: one read and one compile instead of ~100 module loads), else from sbx.js when the
# build made no bundle; with the node that built it (dist/cli/sbx.node), else the PATH's.
# Measured here (Node 20.20, 25 runs each, interleaved; docs/design/performance.md): `sbx run --
# true` 182 ms from the bundle, 224 ms from sbx.js, and 202 ms from the V8 startup snapshot of
# the bundle that earlier builds used (deserializing even an empty snapshot costs ~30 ms more
# than node's own start).
# --max-semi-space-size=2 (MiB), as the supervisor runs: V8's young generation stays small (its
# default grows to 16 MiB a half), so what a walk of a big checkpoint makes and drops is collected
# young. sbx verify of 1,000,000 entries (before its one digest table) peaked at 273 MB
# without it and 226 MB with it; sbx run's CPU is the same. A --max-semi-space-size in NODE_OPTIONS is the
# user's choice: then the launcher gives none (node's command line would override it).
self=$0
if [ -L "$self" ]; then self=$(readlink -f -- "$self"); fi
case $self in */*) here=${self%/*} ;; *) here=. ;; esac
node=
if [ -r "$here/sbx.node" ]; then read -r node < "$here/sbx.node"; fi
if [ -z "$node" ] || [ ! -x "$node" ]; then node=node; fi
semi=--max-semi-space-size=2
case " ${NODE_OPTIONS-} " in *[\ \"]--max-semi-space-size[=\ ]*) semi= ;; esac
if [ -r "$here/sbx.bundle.cjs" ]; then exec "$node" ${semi:+"$semi"} "$here/sbx.bundle.cjs" "$@"; fi
exec "$node" ${semi:+"$semi"} "$here/sbx.js" "$@"
