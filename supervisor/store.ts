// The state dir's records (docs/STATE.md): admission records, the invocation-key index
// (one file per key, named by the key's SHA-256, never removed: a key runs at most once,
// ever), receipts, and what a stream durably holds on disk. Owns reading and writing them;
// torn or corrupt files are reported as errors for the caller to mark the session unknown.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { z } from 'zod';
import type { Receipt } from '../ipc/protocol.js';
import { createFileDurable } from './durable.js';

const AdmissionSchema = z.object({
  session_id: z.string().regex(/^s-[0-9a-z]+-[0-9a-f]+$/),
  invocation_key: z.string().min(1),
  command_digest: z.string(),
  argv: z.array(z.string()).min(1),
  cwd: z.string(),
  env: z.record(z.string(), z.string()),
  timeout_ms: z.number().int().min(0),
  grace_ms: z.number().int().min(0),
  linger: z.enum(['kill', 'wait']),
  chunk_bytes: z.number().int().positive(),
  user: z.string().nullable().optional(),
  pty: z.object({ cols: z.number().int(), rows: z.number().int() }).nullable().optional(),
  stdin: z.enum(['null', 'stream']).optional(),
  cgroup: z.string().nullable(),
  mode: z.enum(['cgroup', 'subreaper']),
  boot_id: z.string(),
  generation: z.number().int(),
  instance: z.string(),
  admitted_at: z.string(),
});

/** The durable admission record, written before spawn. */
export type AdmissionRecord = z.infer<typeof AdmissionSchema>;

/** Reads and validates <sessionDir>/admission.json; throws with the reason when torn or corrupt. */
export function readAdmission(sessionDir: string): AdmissionRecord {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(join(sessionDir, 'admission.json'), 'utf8'));
  } catch (err) {
    throw new Error(`admission record is unreadable: ${(err as Error).message}`);
  }
  const parsed = AdmissionSchema.safeParse(raw);
  if (!parsed.success) throw new Error(`admission record is not valid: ${parsed.error.issues[0].path.join('.')}: ${parsed.error.issues[0].message}`);
  return parsed.data;
}

export function writeAdmission(sessionDir: string, record: AdmissionRecord): void {
  createFileDurable(join(sessionDir, 'admission.json'), JSON.stringify(record) + '\n');
}

/** The receipt if one was written (atomically: it is whole or absent); throws if unparsable. */
export function readReceipt(sessionDir: string): Receipt | null {
  const path = join(sessionDir, 'receipt.json');
  if (!existsSync(path)) return null;
  return JSON.parse(readFileSync(path, 'utf8')) as Receipt;
}

export interface KeyRecord {
  invocation_key: string;
  session_id: string;
  command_digest: string;
  admitted_at: string;
}

/** The key index: <state>/keys/<sha256(key)>.json; the key itself is never a path. */
export class KeyIndex {
  readonly dir: string;

  constructor(stateDir: string) {
    this.dir = join(stateDir, 'keys');
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
  }

  private path(key: string): string {
    return join(this.dir, `${createHash('sha256').update(key).digest('hex')}.json`);
  }

  /** Durably records that key belongs to a session (before its spawn). */
  write(record: KeyRecord): void {
    createFileDurable(this.path(record.invocation_key), JSON.stringify(record) + '\n');
  }

  has(key: string): boolean {
    return existsSync(this.path(key));
  }

  /** Every readable key record; unreadable ones are returned as errors with their file. */
  load(): { records: KeyRecord[]; errors: { file: string; reason: string }[] } {
    const records: KeyRecord[] = [];
    const errors: { file: string; reason: string }[] = [];
    for (const name of readdirSync(this.dir)) {
      if (!name.endsWith('.json') || name.startsWith('.')) continue;
      try {
        const r = JSON.parse(readFileSync(join(this.dir, name), 'utf8')) as KeyRecord;
        if (typeof r.invocation_key !== 'string' || typeof r.session_id !== 'string') throw new Error('missing fields');
        records.push(r);
      } catch (err) {
        errors.push({ file: name, reason: (err as Error).message });
      }
    }
    return { records, errors };
  }
}

/** Session directory names under <state>/sessions. */
export function sessionDirs(sessionsDir: string): string[] {
  return readdirSync(sessionsDir, { withFileTypes: true })
    .filter((d) => d.isDirectory() && !d.name.startsWith('.'))
    .map((d) => d.name);
}
