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

const ConfigSchema = z
  .object({
    socketPath: z.string().min(1).optional(),
    stateDir: z.string().min(1).optional(),
    logLevel: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
    cgroup: z
      .object({
        /** auto: cgroup v2 when a writable one exists, else subreaper; the others insist. */
        mode: z.enum(['auto', 'cgroup', 'subreaper']).default('auto'),
        /** Subtree (path inside the cgroup2 mount) when the supervisor sits in the root cgroup. */
        parent: z.string().regex(/^\/[^\0]*$/, 'must be an absolute cgroup path such as /sandbox-supervisor').default('/sandbox-supervisor'),
      })
      .strict()
      .prefault({}),
    drain: z
      .object({
        /** Chunk files roll at this many bytes. */
        chunkBytes: z.number().int().min(4096).max(1024 * MiB).default(64 * MiB),
        /** F_SETPIPE_SZ for each output pipe; 1 MiB is the unprivileged maximum here. */
        pipeBytes: z.number().int().min(4096).max(64 * MiB).default(MiB),
        /** After death evidence, how long a stream may take to reach EOF before it is cut. */
        postDeathDrainMs: durationMs.default(2000),
        /** Most bytes stored per stream of a session (0: no quota); past it the drain reads on and counts dropped bytes. */
        quotaBytes: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER).default(1024 * MiB),
      })
      .strict()
      .prefault({}),
    /** The file methods (docs/guide/files.md). */
    files: z
      .object({
        /** Largest write_file size_bytes (LIMIT_EXCEEDED {limit: "file_bytes"} up front); unset: drain.quotaBytes; 0: no limit. */
        maxBytes: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER).optional(),
      })
      .strict()
      .prefault({}),
    session: z
      .object({
        /** Sessions not yet ended at once; the next launch gets LIMIT_EXCEEDED. */
        maxSessions: z.number().int().min(1).max(1_000_000).default(4096),
        defaultGraceMs: durationMs.default(10_000),
        /** Run sessions as this user (name or uid) unless the launch says --user. */
        user: z.union([z.string().min(1), z.number().int().min(0)]).optional(),
        path: z.string().default('/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'),
        lang: z.string().default('C.UTF-8'),
      })
      .strict()
      .prefault({}),
    storage: z
      .object({
        /** Chunk writes stop while the state dir's file system has less than this free (unset: 64 MiB or 5% of it, the smaller). */
        reserveBytes: z.number().int().min(0).optional(),
        /** Launches get ADMISSION_DENIED (retryable) while less than this is free (unset: 256 MiB or 10%). */
        minFreeBytes: z.number().int().min(0).optional(),
        /** Retention removes the oldest ended sessions' output while less than this is free (unset: 512 MiB or 15%). */
        keepFreeBytes: z.number().int().min(0).optional(),
      })
      .strict()
      .prefault({}),
    retention: z
      .object({
        /** Chunk files (and index) of sessions ended longer ago than this are removed; 0: no age limit. */
        outputMaxAgeMs: durationMs.default(7 * 24 * 3600 * 1000),
        /** Oldest ended sessions' chunk files go first while all of them hold more than this; 0: no limit. */
        outputMaxTotalBytes: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER).default(10 * 1024 * MiB),
        /** Receipts (and admission records) of sessions ended longer ago than this are removed; 0: kept forever. */
        receiptMaxAgeMs: durationMs.default(0),
        /** How often the policy runs by itself; 0: only on `sbx gc`. */
        intervalMs: durationMs.default(3600 * 1000),
      })
      .strict()
      .prefault({}),
    ipc: z
      .object({
        maxFrameBytes: z.number().int().min(1024).max(256 * MiB).default(DEFAULT_MAX_FRAME_BYTES),
        /** Open connections at once; the next one gets LIMIT_EXCEEDED and is closed. */
        maxConnections: z.number().int().min(1).max(1_000_000).default(1024),
        /** Requests (subscriptions and waits included) one connection may have unanswered. */
        maxInFlight: z.number().int().min(1).max(1_000_000).default(64),
        /** A connection that has not said hello by then is closed (slowloris). */
        handshakeTimeoutMs: durationMs.default(10_000),
        /** How long one frame may take to arrive, from its first byte (monotonic); past it LIMIT_EXCEEDED, closed. 0: no bound. */
        frameTimeoutMs: durationMs.default(30_000),
        /**
         * Bytes of incomplete frames held across all connections; the one that would pass it gets
         * LIMIT_EXCEEDED, closed. 0: no bound. Default 256 MiB, or one whole frame if that is more.
         */
        maxPendingFrameBytes: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER).optional(),
        /** Peers allowed by uid (SO_PEERCRED); the supervisor's own uid and root always are. */
        allowUids: z.array(z.number().int().min(0)).default([]),
        /** Peers allowed by primary gid. */
        allowGids: z.array(z.number().int().min(0)).default([]),
        /** Group (name or gid) given the socket (0660) and its directory (0750). */
        socketGroup: z.union([z.string().min(1), z.number().int().min(0)]).optional(),
      })
      .strict()
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
        /** Absolute directories; each must exist at start. `serve --workspace DIR` adds to them. */
        paths: z.array(z.string().regex(/^\/[^\0]*$/, 'must be an absolute path')).default([]),
        /** How long a session's receipt waits for its barrier to come back, ms; past it: gap barrier_timeout. */
        barrierTimeoutMs: z.number().int().min(1).max(600_000).default(2000),
        /** The bound of the scan at death (when a workspace has a gap), ms. */
        scanDeadlineMs: z.number().int().min(1).max(3_600_000).default(30_000),
        /** Lines a session's change log keeps (coalesced); past it, counted. */
        changesMaxEntries: z.number().int().min(0).max(10_000_000).default(100_000),
        /** The reading thread lets a burst gather this long before a read, ms (a barrier cuts it short). */
        batchMs: z.number().int().min(0).max(1000).default(10),
        /** FAN_MODIFY too: every write(2) is an event, not only the writer's close (measured: tar -x 30% slower instead of 15%). */
        reportModify: z.boolean().default(false),
      })
      .strict()
      .prefault({}),
    /** Checkpoints (docs/guide/checkpoints.md "Checkpoints"): where they are kept and the bounds of one. */
    checkpoint: z
      .object({
        /** '' (default): <stateDir>/checkpoints; an absolute directory; or s3://bucket/prefix (objects are written locally first, then to S3). */
        store: z.string().default(''),
        /** For an s3:// store; endpoint and credentials otherwise come from the AWS SDK's environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...). */
        s3: z
          .object({ endpoint: z.string().url().optional(), region: z.string().min(1).optional(), forcePathStyle: z.boolean().optional() })
          .strict()
          .prefault({}),
        /** Walks of one checkpoint at most: the first hashes, each later one checks and re-hashes what moved; past it the paths still moving are `unstable`. */
        maxPasses: z.number().int().min(2).max(100).default(4),
        /** Passes after the first re-read and re-hash every file, not only compare its stat: a write through a shared mmap moves no timestamp (the hashing is then twice). */
        verifyContent: z.boolean().default(false),
        /** Freeze the workspace's file system (FIFREEZE) around one last pass when it is its own mount (writers wait meanwhile): a consistent capture whatever they do. */
        freeze: z.boolean().default(false),
        /** The frozen pass's bound, ms: past it the file system is thawed and the passes before stand. */
        freezeMaxMs: z.number().int().min(1).max(600_000).default(5000),
        /** A checkpoint's scan fails (scan_timeout) past this, ms. */
        deadlineMs: z.number().int().min(1).max(24 * 3600 * 1000).default(600_000),
        /** Manifests made longer ago than this are removed by gc (with what only they reference); 0: kept forever. */
        maxAgeMs: durationMs.default(0),
      })
      .strict()
      .prefault({}),
    /** The WebSocket listener (docs/guide/remote.md); off unless listen is set. */
    remote: z
      .object({
        /** HOST:PORT (an IP literal or localhost; 0.0.0.0 written out); `serve --listen ADDR` overrides it. */
        listen: z
          .string()
          .superRefine((text, ctx) => {
            const problem = remoteListenProblem(text);
            if (problem) ctx.addIssue({ code: 'custom', message: problem });
          })
          .optional(),
        /** The bearer token itself (env SBX_REMOTE_TOKEN wins over it); unset: the token file. */
        token: z.string().min(16).regex(/^\S+$/, 'no white space').optional(),
        /** Absolute path of the token file (default <stateDir>/remote-token, made 0600 at first start). */
        tokenFile: z.string().regex(/^\/[^\0]*$/, 'must be an absolute path').optional(),
        /** No token at all: allowed only on a loopback address. */
        insecure: z.boolean().default(false),
        /** TLS (wss://): certificate chain and key, PEM files; both or neither. */
        tlsCertFile: z.string().regex(/^\/[^\0]*$/, 'must be an absolute path').optional(),
        tlsKeyFile: z.string().regex(/^\/[^\0]*$/, 'must be an absolute path').optional(),
        /** WebSocket connections open at once (counted apart from the Unix socket's); unset: ipc.maxConnections. */
        maxConnections: z.number().int().min(1).max(1_000_000).optional(),
        /** The server pings every peer this often, ms. */
        pingIntervalMs: z.number().int().min(10).max(3_600_000).default(10_000),
        /** A peer that neither answers a ping nor takes any byte within this is terminated, ms. */
        pingTimeoutMs: z.number().int().min(10).max(3_600_000).default(10_000),
        /** A TCP connection that has not finished its HTTP upgrade within this is closed, ms. */
        upgradeTimeoutMs: z.number().int().min(10).max(600_000).default(10_000),
      })
      .strict()
      .refine((r) => (r.tlsCertFile === undefined) === (r.tlsKeyFile === undefined), { path: ['tlsKeyFile'], message: 'give both remote.tlsCertFile and remote.tlsKeyFile, or neither' })
      .superRefine((r, ctx) => {
        const problem = r.listen === undefined ? null : remoteInsecureProblem(r.listen, r.insecure);
        if (problem) ctx.addIssue({ code: 'custom', path: ['insecure'], message: problem });
      })
      .prefault({}),
    /** The Prometheus endpoint (docs/guide/running.md "Metrics"); off unless listen is set. */
    metrics: z
      .object({
        /** HOST:PORT (an IP literal or localhost; 0.0.0.0 for every interface, written out) or an absolute Unix socket path; `serve --metrics ADDR` overrides it. */
        listen: z
          .string()
          .superRefine((text, ctx) => {
            try {
              parseMetricsAddress(text);
            } catch (err) {
              ctx.addIssue({ code: 'custom', message: (err as Error).message });
            }
          })
          .optional(),
      })
      .strict()
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
  if (text.startsWith('/')) return `${JSON.stringify(text)} is a path: the WebSocket listener takes HOST:PORT (such as 127.0.0.1:7443); the Unix socket is socketPath`;
  try {
    parseMetricsAddress(text);
    return null;
  } catch (err) {
    return (err as Error).message.replace(/127\.0\.0\.1:9464|\[::1\]:9464|0\.0\.0\.0:9464/g, (m) => m.replace('9464', '7443')).replace(', or an absolute path for a Unix socket', '');
  }
}

/** Why insecure (no token) may not be used on this address (a non-loopback one), or null. */
export function remoteInsecureProblem(listen: string, insecure: boolean): string | null {
  if (!insecure || remoteListenProblem(listen) !== null) return null;
  const addr = parseMetricsAddress(listen);
  if (addr.kind === 'tcp' && isLoopback(addr.host)) return null;
  return `remote.insecure (no token) is allowed only on a loopback address, not ${listen}: remove it and use the token (remote.tokenFile, remote.token or SBX_REMOTE_TOKEN)`;
}
