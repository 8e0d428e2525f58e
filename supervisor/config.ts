// The daemon's configuration: embedded defaults, an optional JSON file (--config FILE, else
// /etc/sandbox-supervisor/config.json if present) and the env overrides SBX_SOCKET and
// SBX_STATE_DIR. Validated with zod; an unknown key or a bad value stops start-up with a
// message naming it. Later features add keys here rather than flags.
import { existsSync, readFileSync } from 'node:fs';
import { z } from 'zod';
import { defaultSocketPath, defaultStateDir } from '../ipc/paths.js';
import { DEFAULT_MAX_FRAME_BYTES } from '../ipc/framing.js';
import { MAX_DURATION_MS } from '../ipc/duration.js';
import { isLoopback, parseMetricsAddress } from './metrics/address.js';

export const DEFAULT_CONFIG_PATH = '/etc/sandbox-supervisor/config.json';

const MiB = 1024 * 1024;
const durationMs = z.number().int().min(0).max(MAX_DURATION_MS);

/**
 * The configuration file's schema. Each key's `.meta()` holds its meaning (`description`),
 * the environment variable or `serve` flag that overrides it (`env`, `flag`), and for a key
 * whose default is computed, that default in words (`defaultText`): the source of
 * docs/reference/config.md (`npm run docs`), so say it here, not there.
 */
export const ConfigSchema = z
  .object({
    socketPath: z.string().min(1).optional().meta({
      description: 'the Unix socket clients connect to',
      env: 'SBX_SOCKET',
      defaultText: '/run/sandbox-supervisor/supervisor.sock as root, else $XDG_RUNTIME_DIR/sandbox-supervisor/supervisor.sock',
    }),
    stateDir: z.string().min(1).optional().meta({
      description: 'chunk files, receipts, identity (docs/reference/state-dir.md)',
      env: 'SBX_STATE_DIR',
      defaultText: '/var/lib/sandbox-supervisor as root, else $XDG_STATE_HOME/sandbox-supervisor',
    }),
    logLevel: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info').describe('pino level of the JSON log on stderr'),
    cgroup: z
      .object({
        mode: z
          .enum(['auto', 'cgroup', 'subreaper'])
          .default('auto')
          .describe('auto: cgroup v2 when a writable one exists, else subreaper; cgroup / subreaper insist'),
        parent: z
          .string()
          .regex(/^\/[^\0]*$/, 'must be an absolute cgroup path such as /sandbox-supervisor')
          .default('/sandbox-supervisor')
          .describe(
            'subtree (a path inside the cgroup2 mount) used when the supervisor sits in the root cgroup; under systemd Delegate=yes its own cgroup is used. Give each supervisor on one machine its own',
          ),
      })
      .strict()
      .describe('how sessions are contained: cgroup v2 leaves, or subreaper mode')
      .prefault({}),
    drain: z
      .object({
        chunkBytes: z
          .number()
          .int()
          .min(4096)
          .max(1024 * MiB)
          .default(64 * MiB)
          .describe('chunk files roll at this many bytes'),
        pipeBytes: z
          .number()
          .int()
          .min(4096)
          .max(64 * MiB)
          .default(MiB)
          .describe('F_SETPIPE_SZ for each output pipe; 1 MiB is the unprivileged maximum'),
        postDeathDrainMs: durationMs
          .default(2000)
          .describe(
            "after death evidence, how long a stream may wait for EOF before it is cut (complete: false, reason: drain_timeout); time paused on the supervisor's own disk writes for what the pipe held at death does not count",
          ),
        quotaBytes: z
          .number()
          .int()
          .min(0)
          .max(Number.MAX_SAFE_INTEGER)
          .default(1024 * MiB)
          .describe(
            'most bytes stored per stream of a session (0: no quota); past it the drain reads on (the producer never blocks) and counts dropped_bytes; the receipt says complete: false, reason: quota',
          ),
      })
      .strict()
      .describe("how sessions' output is read and stored")
      .prefault({}),
    /** The file methods (docs/guide/files.md). */
    files: z
      .object({
        maxBytes: z
          .number()
          .int()
          .min(0)
          .max(Number.MAX_SAFE_INTEGER)
          .optional()
          .meta({ description: 'largest write_file size_bytes (LIMIT_EXCEEDED, limit: "file_bytes", up front); 0: no limit', defaultText: 'drain.quotaBytes' }),
      })
      .strict()
      .describe('the file methods (docs/guide/files.md)')
      .prefault({}),
    session: z
      .object({
        maxSessions: z.number().int().min(1).max(1_000_000).default(4096).describe('sessions not yet ended at once; the next launch gets LIMIT_EXCEEDED'),
        defaultGraceMs: durationMs.default(10_000).describe('TERM→KILL grace of a launch that gives none'),
        defaultLinger: z
          .enum(['handoff', 'kill', 'wait'])
          .default('handoff')
          .describe(
            "what becomes of descendants left at the leader's exit, for a launch that names no linger: handoff (a service of their own; kill where the session has no cgroup leaf or has a pty), kill (TERM, grace, KILL) or wait",
          ),
        user: z
          .union([z.string().min(1), z.number().int().min(0)])
          .optional()
          .describe(
            'run sessions as this user (name or uid) unless a launch says --user; names and uids are looked up through NSS (getpwnam_r); a uid with no entry runs with gid = uid, no supplementary groups, HOME=/',
          ),
        path: z.string().default('/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin').describe('PATH of the clean base environment'),
        lang: z.string().default('C.UTF-8').describe('LANG of the clean base environment'),
        defaultLimits: z
          .object({
            memoryMaxBytes: z
              .number()
              .int()
              .min(1)
              .max(Number.MAX_SAFE_INTEGER)
              .nullable()
              .default(null)
              .describe('memory.max (bytes) of a session whose launch gives no --memory; null: none (docs/guide/limits.md)'),
            pidsMax: z
              .number()
              .int()
              .min(1)
              .max(4_194_304)
              .nullable()
              .default(null)
              .describe('pids.max (tasks) of a session whose launch gives no --pids; null: none'),
            cpus: z
              .number()
              .min(0.01)
              .max(1_000_000)
              .nullable()
              .default(null)
              .describe('cpu.max (CPUs, at least 0.01) of a session whose launch gives no --cpus; null: none'),
          })
          .strict()
          .describe(
            'limits of every session unless its launch names its own; a default this host cannot enforce (its controller not in cgroup v2 here) stops start-up: sessions never run without it',
          )
          .prefault({}),
      })
      .strict()
      .describe('what a session is started with')
      .prefault({}),
    storage: z
      .object({
        reserveBytes: z.number().int().min(0).optional().meta({
          description:
            "chunk writes stop while the state dir's file system has less than this free, so indexes and receipts can still be written (reason: disk_full)",
          defaultText: '64 MiB or 5% of the file system, the smaller',
        }),
        minFreeBytes: z.number().int().min(0).optional().meta({
          description: 'launches get ADMISSION_DENIED (retryable, retry_after_ms) while less than this is free',
          defaultText: '256 MiB or 10%, the smaller',
        }),
        keepFreeBytes: z.number().int().min(0).optional().meta({
          description: "retention removes the oldest ended sessions' output while less than this is free (journald's SystemKeepFree=)",
          defaultText: '512 MiB or 15%, the smaller',
        }),
      })
      .strict()
      .describe("free space kept on the state dir's file system")
      .prefault({}),
    retention: z
      .object({
        outputMaxAgeMs: durationMs
          .default(7 * 24 * 3600 * 1000)
          .describe('chunk files and index of sessions ended longer ago than this are removed (the receipt stays); 0: no age limit'),
        outputMaxTotalBytes: z
          .number()
          .int()
          .min(0)
          .max(Number.MAX_SAFE_INTEGER)
          .default(10 * 1024 * MiB)
          .describe("then the oldest ended sessions' output goes while all output holds more than this; 0: no limit"),
        receiptMaxAgeMs: durationMs
          .default(0)
          .describe(
            'whole sessions (receipt, admission) ended longer ago than this are removed, leaving a tombstone in retired/; 0: kept forever (signed evidence is never removed unless you set this)',
          ),
        intervalMs: durationMs.default(3600 * 1000).describe('how often the policy runs by itself; 0: only on sbx gc'),
      })
      .strict()
      .describe('what is removed of ended sessions, and when')
      .prefault({}),
    ipc: z
      .object({
        maxFrameBytes: z
          .number()
          .int()
          .min(1024)
          .max(256 * MiB)
          .default(DEFAULT_MAX_FRAME_BYTES)
          .describe('largest frame accepted; a larger one is refused from its length prefix (FRAME_TOO_LARGE)'),
        maxConnections: z
          .number()
          .int()
          .min(1)
          .max(1_000_000)
          .default(1024)
          .describe('open connections at once; the next one gets LIMIT_EXCEEDED and is closed'),
        maxInFlight: z
          .number()
          .int()
          .min(1)
          .max(1_000_000)
          .default(64)
          .describe('requests (subscriptions and waits included) one connection may have unanswered'),
        handshakeTimeoutMs: durationMs.default(10_000).describe('a connection that has not said hello by then is closed'),
        frameTimeoutMs: durationMs
          .default(30_000)
          .describe(
            'a frame not whole this long after its first byte gets LIMIT_EXCEEDED (limit: "frame_time") and its connection is closed (slowloris); idle time between frames does not count, nor time the supervisor itself stops reading a client that does not read its answers. 0: no bound',
          ),
        maxPendingFrameBytes: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER).optional().meta({
          description:
            'bytes of incomplete frames held across all connections; the connection whose frame would pass it gets LIMIT_EXCEEDED (limit: "pending_frame_bytes", retryable) and is closed, the others keep theirs. Frames already whole do not count. At least ipc.maxFrameBytes + 4 (one whole frame), or 0: no bound',
          defaultText: '256 MiB, or one whole frame (ipc.maxFrameBytes + 4) if that is more',
        }),
        allowUids: z
          .array(z.number().int().min(0))
          .default([])
          .describe("peers allowed by uid (SO_PEERCRED) besides root and the supervisor's own uid; others get UNAUTHORIZED"),
        allowGids: z.array(z.number().int().min(0)).default([]).describe('peers allowed by primary gid'),
        socketGroup: z
          .union([z.string().min(1), z.number().int().min(0)])
          .optional()
          .describe(
            'group (a name, looked up through NSS, or a gid: digits are a gid, as for chown) of the socket (0660) and of its directory (0750) when the supervisor creates it',
          ),
      })
      .strict()
      .describe("the supervisor's socket: who may connect, and the bounds of a connection")
      // Below one whole frame (prefix + maxFrameBytes), a frame of the allowed size could never arrive.
      .refine((ipc) => ipc.maxPendingFrameBytes === undefined || ipc.maxPendingFrameBytes === 0 || ipc.maxPendingFrameBytes >= ipc.maxFrameBytes + 4, {
        path: ['maxPendingFrameBytes'],
        message: 'must be 0 (no bound) or at least ipc.maxFrameBytes + 4 (one whole frame)',
      })
      .transform((ipc) => ({ ...ipc, maxPendingFrameBytes: ipc.maxPendingFrameBytes ?? Math.max(256 * MiB, ipc.maxFrameBytes + 4) }))
      .prefault({}),
    /** The workspace clock (docs/guide/workspaces.md "Workspaces"): the directories watched, and its bounds. */
    workspace: z
      .object({
        paths: z
          .array(z.string().regex(/^\/[^\0]*$/, 'must be an absolute path'))
          .default([])
          .meta({ description: 'directories to watch (absolute; each must exist at start)', flag: 'serve --workspace DIR (repeatable; adds to them)' }),
        barrierTimeoutMs: z
          .number()
          .int()
          .min(1)
          .max(600_000)
          .default(2000)
          .describe("how long a session's receipt waits for its barrier to come back; past it the entry is gap: barrier_timeout, with a scan"),
        scanDeadlineMs: z
          .number()
          .int()
          .min(1)
          .max(3_600_000)
          .default(30_000)
          .describe('the bound of the scan at death when a workspace entry has a gap (a scan past it is null, logged)'),
        changesMaxEntries: z
          .number()
          .int()
          .min(0)
          .max(10_000_000)
          .default(100_000)
          .describe("lines a session's change log keeps (sbx changes; coalesced); past it, counted as dropped"),
        maxQueuedEvents: z
          .number()
          .int()
          .min(1024)
          .max(16_777_216)
          .default(262_144)
          .describe(
            "events read from the kernel and not yet handled, at most (about 1 KiB of the supervisor's memory each); past it, events are read and dropped until half are handled, said as an overflow gap (sessions alive then get a scan) and counted (sandbox_supervisor_workspace_events_dropped_total): a flood of events never grows the supervisor without bound",
          ),
        batchMs: z
          .number()
          .int()
          .min(0)
          .max(1000)
          .default(10)
          .describe(
            "the reading thread lets a burst gather this long before a read (a barrier cuts it short); 0 reads at once: a process reaped by its own parent in the session (cp under sh, as under gcc) is attributed more often (measured, make -j2 of 301 C files: 98% of its events attributed vs 12%), at a cost (tar -x of 5,000 files 29% slower than unwatched vs 14-20%, the supervisor's CPU +40%)",
          ),
        holdExited: z
          .boolean()
          .default(true)
          .describe(
            "keep each exited process the supervisor reaps (a session's leader, an orphan) a zombie until the watcher has read the events queued before its exit, so a writer that exits at once is still attributed to its session (fanotify makes the writer's pidfd when the event is read: a reaped writer gets none); off, such a write is attributed only if the reader got to it first, else counted unattributed",
          ),
        reportModify: z
          .boolean()
          .default(false)
          .describe(
            "also mark FAN_MODIFY: every write(2) is an event, so sbx changes shows a file being written before its writer closes it. Off, a write is seen at the writer's close (FAN_CLOSE_WRITE, also at its exit), which is enough for the barrier; measured: tar -x of 5,000 files 11-17% slower than unwatched with it off, 36% with it on",
          ),
      })
      .strict()
      .describe('the workspace clock (docs/guide/workspaces.md): the directories watched, and its bounds')
      .prefault({}),
    /** Checkpoints (docs/guide/checkpoints.md "Checkpoints"): where they are kept and the bounds of one. */
    checkpoint: z
      .object({
        store: z.string().default('').meta({
          description:
            'where checkpoints are kept: an absolute directory, or s3://bucket/prefix (objects are written to <stateDir>/checkpoints first, then uploaded)',
          defaultText: '"" (<stateDir>/checkpoints)',
        }),
        s3: z
          .object({
            endpoint: z.string().url().optional().meta({ description: 'S3 endpoint URL', defaultText: "the AWS SDK's environment (AWS_ENDPOINT_URL)" }),
            region: z.string().min(1).optional().meta({ description: 'S3 region', defaultText: "the AWS SDK's environment (AWS_REGION)" }),
            forcePathStyle: z
              .boolean()
              .optional()
              .meta({ description: 'path-style bucket addressing (MinIO and other S3-compatible stores)', defaultText: "the AWS SDK's default" }),
          })
          .strict()
          .describe("for an s3:// store; credentials come from the AWS SDK's environment (AWS_ACCESS_KEY_ID, ...)")
          .prefault({}),
        maxPasses: z
          .number()
          .int()
          .min(2)
          .max(100)
          .default(4)
          .describe(
            'walks of one checkpoint at most (the first hashes, each later one checks and re-hashes what moved); past it the paths still changing are unstable',
          ),
        verifyContent: z
          .boolean()
          .default(false)
          .describe(
            'passes after the first re-read and re-hash every file instead of comparing stats (a write through a shared mmap moves no timestamp); the hashing is done twice',
          ),
        freeze: z
          .boolean()
          .default(false)
          .describe(
            "freeze the workspace's file system (FIFREEZE) around one last pass when it is its own mount (writers wait meanwhile): a consistent capture whatever they do",
          ),
        freezeMaxMs: z
          .number()
          .int()
          .min(1)
          .max(600_000)
          .default(5000)
          .describe("the frozen pass's bound: past it the file system is thawed and the passes before stand"),
        deadlineMs: z
          .number()
          .int()
          .min(1)
          .max(24 * 3600 * 1000)
          .default(600_000)
          .describe("a checkpoint's capture fails (scan_timeout) past this"),
        maxAgeMs: durationMs
          .default(0)
          .describe('manifests made longer ago than this are removed by sbx gc, and then the objects only they named; 0: kept forever'),
        maxManifestBytes: z
          .number()
          .int()
          .min(4096)
          .max(512 * 1024 * 1024)
          .default(64 * 1024 * 1024)
          .describe(
            "a checkpoint whose manifest would be bigger than this fails (CHECKPOINT_FAILED, code manifest_too_large) while it is walked, before the checkpoint thread's heap is near its cap: each entry counted at its exact JSON bytes, about 175 plus its path for a file (100,000 files of 40-byte paths: 21 MiB; 64 MiB holds about 350,000 files, or 720 levels of 255-byte names)",
          ),
        workerHeapMiB: z
          .number()
          .int()
          .min(64)
          .max(16384)
          .default(1024)
          .describe(
            "the checkpoint thread's V8 old-generation heap cap (worker_threads resourceLimits.maxOldGenerationSizeMb), MiB: a checkpoint that reaches it fails (checkpoint_failed), the supervisor goes on; keep it over 12 times checkpoint.maxManifestBytes",
          ),
        readBack: z
          .enum(['changed', 'stat', 'all'])
          .default('changed')
          .describe(
            "what the read-back looks at besides the manifest: 'stat' re-hashes every object this checkpoint wrote and every other whose file (device, inode, size, mtime, ctime) is not as this supervisor last re-hashed it, and confirms the rest by that stat (a write through a shared mapping made before, or damage below the file system, moves no stat: only 'all' and sbx verify find those); 'changed' (the default) does the same but for the objects only under directories whose trees are those of the workspace's last read-back checkpoint, which are not looked at again (the capture found each still there; so the read-back's cost grows with what changed, and an object written over in place since its last read-back is not found either: only 'stat', 'all' and sbx verify find that); 'all' re-hashes every object, every time (sbx verify always re-hashes all)",
          ),
      })
      .strict()
      .describe('checkpoints (docs/guide/checkpoints.md): where they are kept and the bounds of one')
      .prefault({}),
    /** The WebSocket listener (docs/guide/remote.md); off unless listen is set. */
    remote: z
      .object({
        listen: z
          .string()
          .superRefine((text, ctx) => {
            const problem = remoteListenProblem(text);
            if (problem) ctx.addIssue({ code: 'custom', message: problem });
          })
          .optional()
          .meta({
            description: 'HOST:PORT of the WebSocket listener (an IP literal or localhost; 0.0.0.0 written out); unset: off',
            flag: 'serve --listen ADDR',
          }),
        token: z
          .string()
          .min(16)
          .regex(/^\S+$/, 'no white space')
          .optional()
          .meta({ description: 'the bearer token itself (the environment variable wins over it)', env: 'SBX_REMOTE_TOKEN', defaultText: 'the token file' }),
        tokenFile: z
          .string()
          .regex(/^\/[^\0]*$/, 'must be an absolute path')
          .optional()
          .meta({ description: 'absolute path of the token file', defaultText: '<stateDir>/remote-token, made 0600 at first start' }),
        insecure: z.boolean().default(false).describe('no token at all: allowed only on a loopback address'),
        tlsCertFile: z
          .string()
          .regex(/^\/[^\0]*$/, 'must be an absolute path')
          .optional()
          .describe('TLS (wss://): the certificate chain, a PEM file; give remote.tlsKeyFile too'),
        tlsKeyFile: z
          .string()
          .regex(/^\/[^\0]*$/, 'must be an absolute path')
          .optional()
          .describe('TLS (wss://): the private key, a PEM file; give remote.tlsCertFile too'),
        maxConnections: z
          .number()
          .int()
          .min(1)
          .max(1_000_000)
          .optional()
          .meta({ description: "WebSocket connections open at once (counted apart from the Unix socket's)", defaultText: 'ipc.maxConnections' }),
        pingIntervalMs: z.number().int().min(10).max(3_600_000).default(10_000).describe('the server pings every peer this often'),
        pingTimeoutMs: z
          .number()
          .int()
          .min(10)
          .max(3_600_000)
          .default(10_000)
          .describe('a peer that neither answers a ping nor takes any byte within this is terminated'),
        upgradeTimeoutMs: z
          .number()
          .int()
          .min(10)
          .max(600_000)
          .default(10_000)
          .describe('a TCP connection that has not finished its HTTP upgrade within this is closed'),
      })
      .strict()
      .describe('the WebSocket listener (docs/guide/remote.md); off unless listen is set')
      .refine((r) => (r.tlsCertFile === undefined) === (r.tlsKeyFile === undefined), {
        path: ['tlsKeyFile'],
        message: 'give both remote.tlsCertFile and remote.tlsKeyFile, or neither',
      })
      .superRefine((r, ctx) => {
        const problem = r.listen === undefined ? null : remoteInsecureProblem(r.listen, r.insecure);
        if (problem) ctx.addIssue({ code: 'custom', path: ['insecure'], message: problem });
      })
      .prefault({}),
    /** The Prometheus endpoint (docs/guide/running.md "Metrics"); off unless listen is set. */
    metrics: z
      .object({
        listen: z
          .string()
          .superRefine((text, ctx) => {
            try {
              parseMetricsAddress(text);
            } catch (err) {
              ctx.addIssue({ code: 'custom', message: (err as Error).message });
            }
          })
          .optional()
          .meta({
            description:
              'the Prometheus endpoint (GET /metrics): HOST:PORT (127.0.0.1:9464; an IP literal, [::1]:9464, or localhost; 0.0.0.0:9464 for every interface, written out) or an absolute path for a Unix socket; unset: off (docs/reference/metrics.md)',
            flag: 'serve --metrics ADDR',
          }),
      })
      .strict()
      .describe('the Prometheus endpoint (docs/reference/metrics.md); off unless listen is set')
      .prefault({}),
  })
  .strict();

export type FileConfig = z.infer<typeof ConfigSchema>;
export type Config = FileConfig & { socketPath: string; stateDir: string; source: string };

/** A configuration that cannot be used; the message names the key and the file. */
export class ConfigError extends Error {
  override name = 'ConfigError';
}

/** Validates a parsed config object; throws ConfigError naming each bad key. */
export function parseConfig(raw: unknown, source: string, env: NodeJS.ProcessEnv = process.env): Config {
  const result = ConfigSchema.safeParse(raw ?? {});
  if (!result.success) {
    const lines = result.error.issues.map((issue) => {
      const key = issue.path.join('.');
      if (issue.code === 'unrecognized_keys') {
        const where = key ? `${key}.` : '';
        return `unknown key ${issue.keys.map((k) => `"${where}${k}"`).join(', ')}`;
      }
      return `"${key || '(root)'}": ${issue.message}`;
    });
    throw new ConfigError(`invalid configuration in ${source}: ${lines.join('; ')}`);
  }
  const cfg = result.data;
  return {
    ...cfg,
    socketPath: env.SBX_SOCKET || cfg.socketPath || defaultSocketPath({ ...env, SBX_SOCKET: '' }),
    stateDir: env.SBX_STATE_DIR || cfg.stateDir || defaultStateDir({ ...env, SBX_STATE_DIR: '' }),
    source,
  };
}

/** Loads --config FILE (must exist), else the default path if present, else embedded defaults. */
export function loadConfig(path: string | undefined, env: NodeJS.ProcessEnv = process.env): Config {
  const file = path ?? (existsSync(DEFAULT_CONFIG_PATH) ? DEFAULT_CONFIG_PATH : undefined);
  if (!file) return parseConfig({}, 'embedded defaults', env);
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new ConfigError(`cannot read configuration ${file}: ${(err as Error).message}`);
  }
  return parseConfig(raw, file, env);
}

/** What is wrong with a remote.listen / --listen address (HOST:PORT only: no Unix path), or null. */
export function remoteListenProblem(text: string): string | null {
  if (text.startsWith('/'))
    return `${JSON.stringify(text)} is a path: the WebSocket listener takes HOST:PORT (such as 127.0.0.1:7443); the Unix socket is socketPath`;
  try {
    parseMetricsAddress(text);
    return null;
  } catch (err) {
    return (err as Error).message
      .replace(/127\.0\.0\.1:9464|\[::1\]:9464|0\.0\.0\.0:9464/g, (m) => m.replace('9464', '7443'))
      .replace(', or an absolute path for a Unix socket', '');
  }
}

/** Why insecure (no token) may not be used on this address (a non-loopback one), or null. */
export function remoteInsecureProblem(listen: string, insecure: boolean): string | null {
  if (!insecure || remoteListenProblem(listen) !== null) return null;
  const addr = parseMetricsAddress(listen);
  if (addr.kind === 'tcp' && isLoopback(addr.host)) return null;
  return `remote.insecure (no token) is allowed only on a loopback address, not ${listen}: remove it and use the token (remote.tokenFile, remote.token or SBX_REMOTE_TOKEN)`;
}
