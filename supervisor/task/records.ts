// Where a task's state reaches disk (docs/reference/state-dir.md "tasks/"): <state>/tasks/<sha256(task)>/
// holds the task's seal, its close, the close attempt under way and the task receipt (TaskFiles). Every file
// is written durably (core/fs/durable.ts: temp, fsync, rename or link, dir fsync) and read with its schema;
// the task id is never a path. Not what is decided from them (join.ts) or when (close.ts).
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import type { TaskReceipt } from '../../ipc/protocol.js';
import { readRecord, type TaskAttemptRecord, type TaskCloseRecord, type TaskSealRecord } from '../../core/state/records.js';
import { isTempFileName, STATE, TASK_FILES, taskDirName } from '../../core/state/names.js';
import { createFileDurable, writeFileDurable } from '../../core/fs/durable.js';
import { errnoCode } from '../../ipc/errno.js';

export type { TaskAttemptRecord, TaskCloseRecord, TaskSealRecord } from '../../core/state/records.js';

/** The files of one task. Reads throw with the reason when a file is torn or foreign; absent is null. */
export class TaskFiles {
  readonly dir: string;

  constructor(
    stateDir: string,
    readonly task: string,
  ) {
    this.dir = join(stateDir, STATE.tasksDir, taskDirName(task));
  }

  private path(name: keyof typeof TASK_FILES): string {
    return join(this.dir, TASK_FILES[name]);
  }

  /** Whether the task dir exists; throws when a file or a symlink is in its place (never followed: its files would land elsewhere). */
  private dirExists(): boolean {
    let st;
    try {
      st = lstatSync(this.dir);
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') return false;
      throw err;
    }
    if (!st.isDirectory()) throw new Error(`${this.dir} is not a directory (a file or a symlink where a task dir should be; never followed)`);
    return true;
  }

  private ensureDir(): void {
    if (!this.dirExists()) mkdirSync(this.dir, { recursive: true, mode: 0o700 });
  }

  private read<K extends 'taskSeal' | 'taskClose' | 'taskAttempt' | 'taskReceipt'>(kind: K, name: keyof typeof TASK_FILES) {
    const p = this.path(name);
    if (!this.dirExists() || !existsSync(p)) return null;
    let record;
    try {
      record = readRecord(kind, p);
    } catch (err) {
      throw new Error(`${p} cannot be read: ${(err as Error).message}`);
    }
    if ((record as { task: string }).task !== this.task)
      throw new Error(`${p} names task ${JSON.stringify((record as { task: string }).task)}, not ${JSON.stringify(this.task)}`);
    return record;
  }

  readSeal(): TaskSealRecord | null {
    return this.read('taskSeal', 'seal');
  }

  /** Writes the seal once (EEXIST if sealed already): a restart does not unseal. */
  writeSeal(record: TaskSealRecord): void {
    this.ensureDir();
    createFileDurable(this.path('seal'), JSON.stringify(record) + '\n');
  }

  /** The close record: the workspaces the first close named. */
  readClose(): TaskCloseRecord | null {
    return this.read('taskClose', 'close');
  }

  /** Writes the close record once (EEXIST if a close was asked for already). */
  writeClose(record: TaskCloseRecord): void {
    this.ensureDir();
    createFileDurable(this.path('close'), JSON.stringify(record) + '\n');
  }

  /** Replaces the close record (the workspaces a close added to the set it named; a named set in place of a defaulted one). */
  replaceClose(record: TaskCloseRecord): void {
    this.ensureDir();
    writeFileDurable(this.path('close'), JSON.stringify(record) + '\n');
  }

  readAttempt(): TaskAttemptRecord | null {
    return this.read('taskAttempt', 'attempt');
  }

  /** The close attempt under way, rewritten as each step lands: what the settle did, each workspace's published checkpoint or why there is none. */
  writeAttempt(record: TaskAttemptRecord): void {
    this.ensureDir();
    writeFileDurable(this.path('attempt'), JSON.stringify(record) + '\n');
  }

  /** The task receipt as written (checked with its schema, returned with its fields in their written order: unchanged). */
  readReceipt(): TaskReceipt | null {
    if (!this.read('taskReceipt', 'receipt')) return null;
    return JSON.parse(readFileSync(this.path('receipt'), 'utf8')) as TaskReceipt;
  }

  /**
   * Replaces the task receipt (temp, fsync, rename, dir fsync), with the crash points the fault-injection tests name.
   * Replaced while incomplete; final once complete.
   */
  writeReceipt(receipt: TaskReceipt): void {
    this.ensureDir();
    writeFileDurable(this.path('receipt'), JSON.stringify(receipt, null, 2) + '\n', 0o600, {
      afterTemp: 'task-close:after-receipt-temp',
      afterRename: 'task-close:after-receipt-rename',
    });
  }
}

/** Removes the temp files a crash left in every task dir (a write that never landed claims nothing); how many. */
export function sweepTaskTemps(stateDir: string): number {
  const root = join(stateDir, STATE.tasksDir);
  if (!existsSync(root)) return 0;
  let n = 0;
  // Task dirs only: a file or a symlink in their place is never followed (readTaskSeals names it).
  for (const entry of readdirSync(root, { withFileTypes: true })) {
    const dir = entry.name;
    if (!entry.isDirectory() || !/^[0-9a-f]{64}$/.test(dir)) continue;
    for (const name of readdirSync(join(root, dir))) {
      if (!isTempFileName(name)) continue;
      rmSync(join(root, dir, name), { force: true });
      n++;
    }
  }
  return n;
}

/**
 * The checkpoints complete task receipts name, from every task dir, its seal readable or not
 * (gc keeps them: a final receipt stays verifiable and restorable); null when a task receipt
 * cannot be read (logged): gc then removes no checkpoint by age, as it keeps every object when
 * a manifest cannot be read.
 */
export function pinnedCheckpoints(stateDir: string, log: Logger): Set<string> | null {
  const ids = new Set<string>();
  let unreadable = false;
  const receipts = completeTaskReceipts(stateDir, (path, err) => {
    unreadable = true;
    log.error({ err, path }, 'a task receipt cannot be read; gc removes no checkpoint by age until it can');
  });
  if (unreadable) return null;
  for (const r of receipts) for (const c of r.checkpoints) if (c.checkpoint_id) ids.add(c.checkpoint_id);
  return ids;
}

/** The complete task receipts of every task dir (whether or not its seal can be read); one that cannot be read is reported and left out. */
export function completeTaskReceipts(stateDir: string, onUnreadable: (path: string, err: Error) => void): TaskReceipt[] {
  const root = join(stateDir, STATE.tasksDir);
  if (!existsSync(root)) return [];
  const receipts: TaskReceipt[] = [];
  for (const entry of readdirSync(root, { withFileTypes: true })) {
    if (!entry.isDirectory() || !/^[0-9a-f]{64}$/.test(entry.name)) continue;
    const p = join(root, entry.name, TASK_FILES.receipt);
    if (!existsSync(p)) continue;
    try {
      const record = readRecord('taskReceipt', p);
      if (taskDirName(record.task) !== entry.name) throw new Error(`it names task ${JSON.stringify(record.task)}, whose dir is not ${entry.name}`);
      if (record.complete) receipts.push(record);
    } catch (err) {
      onUnreadable(p, err as Error);
    }
  }
  return receipts;
}

/** Every task with a seal in the state dir: task id → seal (unreadable seals, and task dirs that are not directories, are reported, and their task stays unknown). */
export function readTaskSeals(stateDir: string, onUnreadable: (dir: string, err: Error) => void): Map<string, TaskSealRecord> {
  const seals = new Map<string, TaskSealRecord>();
  const root = join(stateDir, STATE.tasksDir);
  if (!existsSync(root)) return seals;
  for (const entry of readdirSync(root, { withFileTypes: true })) {
    const name = entry.name;
    if (!/^[0-9a-f]{64}$/.test(name)) continue;
    if (!entry.isDirectory()) {
      onUnreadable(join(root, name), new Error('not a directory (a file or a symlink where a task dir should be)'));
      continue;
    }
    const p = join(root, name, TASK_FILES.seal);
    if (!existsSync(p)) continue;
    try {
      const record = readRecord('taskSeal', p);
      if (taskDirName(record.task) !== name) throw new Error(`the seal names task ${JSON.stringify(record.task)}, whose dir is not ${name}`);
      seals.set(record.task, record);
    } catch (err) {
      onUnreadable(join(root, name), err as Error);
    }
  }
  return seals;
}
