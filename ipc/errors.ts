// Stable error codes of the wire protocol (docs/reference/contract.md "Error codes"): extend, never rename or reuse.
// Owns the closed code table and the one error class both sides use; not the transport.
// Modelled on undici lib/core/errors.js: a string `code`, and whether a retry may succeed.

/** code → retryable, exactly the table of docs/reference/contract.md "Error codes". */
export const ERROR_CODES = {
  INVALID_ARGUMENT: false,
  UNSUPPORTED_VERSION: false,
  FRAME_TOO_LARGE: false,
  UNAUTHORIZED: false,
  SESSION_NOT_FOUND: false,
  KEY_CONFLICT: false,
  CURSOR_OUT_OF_RANGE: false,
  /**
   * Reserved (docs/reference/contract.md "Error codes"; a code is never reused): a spawn that fails is a fact of the session,
   * which was admitted and whose key is taken, so it is reported in its receipt (outcome
   * spawn_failed, spawn_error with the stage and errno), never as a refused launch.
   */
  SPAWN_FAILED: false,
  ADMISSION_SEALED: false,
  ADMISSION_DENIED: true,
  LIMIT_EXCEEDED: true,
  SHUTTING_DOWN: true,
  INTERNAL: false,
  /** Extension: the session's output was removed by the retention policy (its receipt stays). */
  OUTPUT_REMOVED: false,
  /**
   * Extension: a checkpoint was not published (details.stage: scan, store, read_back; details
   * names the object or path). Nothing was claimed; a retry takes a new checkpoint (a corrupt
   * local object it found is set aside first, so the retry stores it again).
   */
  CHECKPOINT_FAILED: true,
  /**
   * Extension: a task's close named other workspaces than the close already under way or done
   * for that task (details: task, workspaces). The first close's workspaces stand; its task
   * receipt is never answered for a question it did not answer.
   */
  TASK_CONFLICT: false,
  /**
   * Extension (files, docs/guide/files.md): the file tool refused a path with a symbolic link in it
   * (a parent directory or the final name); nothing was written or read.
   */
  SYMLINK_REFUSED: false,
  /** Extension (files): a path component does not exist. */
  NOT_FOUND: false,
  /** Extension (files): a parent path component is not a directory. */
  NOT_A_DIRECTORY: false,
  /** Extension (files): the final name is a directory where a regular file was asked for. */
  IS_A_DIRECTORY: false,
  /** Extension (files): the name is a FIFO, a device, a socket or another non-regular file (never opened: a FIFO would block); nothing was read or written. */
  NOT_A_REGULAR_FILE: false,
  /** Extension (files): write_file's stdin ended with another count of bytes than size_bytes (details: expected, received); no file was made. */
  SIZE_MISMATCH: false,
  /** Extension (files): the session's user may not open or create the path (EACCES, EPERM, EROFS). */
  PERMISSION_DENIED: false,
  /** Extension (files): another failure of the file tool or of tar (details: errno or exit; the message has its stderr). */
  FILE_ERROR: false,
  /**
   * Extension (files): read_file or download produced more bytes than the session's stream
   * quota (drain.quotaBytes) keeps (details: total_bytes, stored_bytes, dropped_bytes); never a
   * silent tail.
   */
  OUTPUT_QUOTA_EXCEEDED: false,
} as const;

export type ErrorCode = keyof typeof ERROR_CODES;

/** The error shape on the wire: `{ code, message, retryable, details? }`. */
export interface WireError {
  code: ErrorCode;
  message: string;
  retryable: boolean;
  details?: Record<string, unknown>;
}

/** One error class for the daemon and its clients; `code` comes from ERROR_CODES. */
export class SupervisorError extends Error {
  readonly code: ErrorCode;
  readonly retryable: boolean;
  readonly details?: Record<string, unknown>;

  constructor(code: ErrorCode, message: string, details?: Record<string, unknown>) {
    super(message);
    this.name = 'SupervisorError';
    this.code = code;
    this.retryable = ERROR_CODES[code];
    this.details = details;
  }

  toWire(): WireError {
    const wire: WireError = { code: this.code, message: this.message, retryable: this.retryable };
    if (this.details) wire.details = this.details;
    return wire;
  }

  /** Rebuilds the error a peer sent; an unknown code becomes INTERNAL with the original named. */
  static fromWire(wire: WireError): SupervisorError {
    const code = (wire.code in ERROR_CODES ? wire.code : 'INTERNAL') as ErrorCode;
    const message = code === wire.code ? wire.message : `${String(wire.code)}: ${wire.message}`;
    return new SupervisorError(code, message, wire.details);
  }
}

/** True for a SupervisorError with the given code. */
export function isSupervisorError(err: unknown, code?: ErrorCode): err is SupervisorError {
  return err instanceof SupervisorError && (code === undefined || err.code === code);
}
