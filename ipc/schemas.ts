// The one source of every request's params: a zod schema per method (ParamsSchemas), from which the param
// types are derived (protocol.ts, methods.ts) and against which the server validates each request (validate).
// Types, ranges, sizes, no NUL in argv or env; a bad field becomes INVALID_ARGUMENT naming it. Clients import
// only types from here (no zod at run time: sbx starts faster, docs/design/facts.md 17).
import { z } from 'zod';
import { SupervisorError } from './errors.js';
import { MAX_DURATION_MS } from './duration.js';

const noNul = (what: string) => z.string().refine((s) => !s.includes('\0'), `${what} must not contain NUL bytes`);
// Cursors are non-negative safe integers; durations are bounded to 30 days (MAX_DURATION_MS).
const cursor = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);
const durationMs = z.number().int().min(0).max(MAX_DURATION_MS);
const envMap = z
  .record(
    z
      .string()
      .min(1)
      .max(4096)
      .regex(/^[^=\0]+$/, 'env names must not contain = or NUL'),
    noNul('env values').pipe(z.string().max(128 * 1024)),
  )
  .refine((e) => Object.keys(e).length <= 4096, 'at most 4096 env entries');
const key = z.string().min(1).max(1024);
/**
 * The session limits of a launch (SessionLimits, docs/guide/limits.md): bytes of memory.max, tasks
 * of pids.max (at most 4194304, the kernel's PID_MAX_LIMIT), CPUs of cpu.max, at least 0.01 (a
 * quota of 1000 µs per 100000 µs period, the least the kernel takes: cgroup-v2.rst "cpu.max").
 */
export const limitParams = {
  memory_max_bytes: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER).optional(),
  pids_max: z.number().int().min(1).max(4_194_304).optional(),
  cpus: z.number().min(0.01, 'at least 0.01 (cpu.max takes a quota of at least 1000 µs per 100000 µs period)').max(1_000_000).optional(),
};

const absPath = noNul('path').pipe(
  z
    .string()
    .min(1)
    .max(4096)
    .refine((p) => p.startsWith('/'), 'an absolute path'),
);
/** The path of one file (write_file, read_file): absolute, and not ending in "/" (a trailing slash names a directory). */
const filePath = absPath.pipe(z.string().refine((p) => !p.endsWith('/'), 'a file path (no trailing "/")'));
const userName = z
  .string()
  .min(1)
  .max(256)
  .regex(/^[A-Za-z0-9_.][A-Za-z0-9_.-]*\$?$/, 'a user name or a numeric uid');
/** What every file method takes besides its path (docs/guide/files.md): the invocation key, task, user and deadline (timeout_ms, 0: none) of its session. */
const fileSession = { key: key.optional(), task: key.optional(), user: userName.optional(), timeout_ms: durationMs.optional() };

const selector = {
  session_id: z.string().min(1).max(128).optional(),
  invocation_key: key.optional(),
};
const requireOne = (s: { session_id?: string; invocation_key?: string }) => Boolean(s.session_id) !== Boolean(s.invocation_key);
const SELECTOR_MESSAGE = 'give exactly one of session_id or invocation_key';

const selectorSchema = z.object(selector).strict().refine(requireOne, SELECTOR_MESSAGE);
const empty = z.object({}).strict();

/** Params of every method, by method name (the dispatch validates with these). */
export const ParamsSchemas = {
  hello: z.object({ versions: z.array(z.number().int()).min(1).max(64), client: z.string().max(256).optional() }),
  launch: z
    .object({
      // No count or length cap of its own: the frame (ipc.maxFrameBytes) bounds it and the kernel decides (execve(2) E2BIG, at exec).
      argv: z.array(noNul('argv')).min(1),
      cwd: noNul('cwd').pipe(z.string().min(1).max(4096)),
      env: envMap.optional(),
      inherit_env: envMap.optional(),
      invocation_key: key.optional(),
      timeout_ms: durationMs.optional(),
      grace_ms: durationMs.optional(),
      linger: z.enum(['kill', 'wait', 'handoff']).optional(),
      service: z.boolean().optional(),
      keep_after_close: z.boolean().optional(),
      ...limitParams,
      on_disconnect: z.enum(['continue', 'cancel']).optional(),
      pty: z
        .object({ cols: z.number().int().min(1).max(65535).optional(), rows: z.number().int().min(1).max(65535).optional() })
        .strict()
        .optional(),
      stdin: z.boolean().optional(),
      user: z
        .string()
        .min(1)
        .max(256)
        .regex(/^[A-Za-z0-9_.][A-Za-z0-9_.-]*\$?$/, 'a user name or a numeric uid')
        .optional(),
      task: key.optional(),
    })
    .strict(),
  subscribe: z
    .object({ ...selector, stream: z.enum(['stdout', 'stderr', 'pty']), from: cursor.optional(), follow: z.boolean().optional() })
    .strict()
    .refine(requireOne, SELECTOR_MESSAGE),
  read_index: z
    .object({
      ...selector,
      stream: z.enum(['stdout', 'stderr', 'pty']),
      from: cursor.optional(),
      limit: z.number().int().min(1).max(65536).optional(),
      follow: z.boolean().optional(),
    })
    .strict()
    .refine(requireOne, SELECTOR_MESSAGE),
  // unknown: what a wait does when the session is unknown with no receipt on its way: "wait" (the
  // default: until evidence, or an operator, ends it) or "fail" (SESSION_UNKNOWN, at once or then).
  wait: z
    .object({ ...selector, unknown: z.enum(['wait', 'fail']).optional() })
    .strict()
    .refine(requireOne, SELECTOR_MESSAGE),
  receipt: selectorSchema,
  changes: selectorSchema,
  cancel: z
    .object({ ...selector, grace_ms: durationMs.optional() })
    .strict()
    .refine(requireOne, SELECTOR_MESSAGE),
  kill: z
    .object({ ...selector, signal: z.union([z.string().regex(/^(SIG)?[A-Z0-9+-]+$/, 'a signal name such as SIGTERM'), z.number().int().min(1).max(64)]) })
    .strict()
    .refine(requireOne, SELECTOR_MESSAGE),
  ps: z.object({ all: z.boolean().optional() }).strict(),
  close: z
    .object({
      timeout_ms: durationMs.optional(),
      workspaces: z
        .array(
          noNul('workspaces').pipe(
            z
              .string()
              .min(1)
              .max(4096)
              .refine((p) => p.startsWith('/'), 'an absolute path'),
          ),
        )
        .max(64)
        .optional(),
      task: key.optional(),
    })
    .strict(),
  checkpoint: z
    .object({
      workspace: noNul('workspace').pipe(
        z
          .string()
          .min(1)
          .max(4096)
          .refine((p) => p.startsWith('/'), 'an absolute path'),
      ),
      task: key.optional(),
    })
    .strict(),
  gc: empty,
  seal: z.object({ task: key.optional() }).strict(),
  status: empty,
  /** Keepalive: answered at once with the supervisor's clock (after hello, counted in flight). */
  ping: empty,
  write: z
    .object({
      ...selector,
      data: z.custom<Uint8Array>((d) => d instanceof Uint8Array, 'bytes (msgpack bin)').refine((d) => d.length <= 8 * 1024 * 1024, 'at most 8 MiB per write'),
      offset: cursor.optional(),
      eof: z.boolean().optional(),
      writer: z.string().min(1).max(128).optional(),
    })
    .strict()
    .refine(requireOne, SELECTOR_MESSAGE),
  resize: z
    .object({ ...selector, cols: z.number().int().min(1).max(65535), rows: z.number().int().min(1).max(65535) })
    .strict()
    .refine(requireOne, SELECTOR_MESSAGE),
  resolve: z
    .object({ ...selector, as_operator: z.literal(true), reason: z.string().min(1).max(4096), force: z.boolean().optional() })
    .strict()
    .refine(requireOne, SELECTOR_MESSAGE),
  write_file: z
    .object({
      path: filePath,
      mode: z.number().int().min(0).max(0o7777).optional(),
      size_bytes: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
      ...fileSession,
    })
    .strict(),
  read_file: z.object({ path: filePath, ...fileSession }).strict(),
  upload: z.object({ dir: absPath, ...fileSession }).strict(),
  download: z.object({ dir: absPath, ...fileSession }).strict(),
};

/** Parses params with schema or throws INVALID_ARGUMENT naming the field. */
export function validate<T>(schema: z.ZodType<T>, params: unknown, method: string): T {
  const result = schema.safeParse(params ?? {});
  if (result.success) return result.data;
  const issue = result.error.issues[0];
  const field = issue.path.join('.') || (issue.code === 'unrecognized_keys' ? issue.keys.join(', ') : 'params');
  throw new SupervisorError('INVALID_ARGUMENT', `${method}: ${field}: ${issue.message}`, { field });
}
