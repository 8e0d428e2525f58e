// A progress line on stderr for long work (checkpoint, close, restore, verify with a store): objects and
// bytes done of the total, the rate, or what it waits for and for how long. Only when stderr is a terminal:
// one line rewritten in place (`\r`, then ESC[K, erase to the end of the line: ECMA-48 EL), cleared when the
// work ends, so the result lines that follow stand alone; not a terminal, it writes nothing at all (a
// harness's stderr stays as before).
import { escapeControls, truncateToWidth } from './escape.js';
import { mib } from './explain.js';

/** How often a counting line is redrawn at most, and a waiting line's elapsed time ticks, in ms. */
const REDRAW_MS = 100;
const TICK_MS = 1000;

export interface ProgressCounts {
  objects: number;
  totalObjects: number;
  /** Bytes done and in all (of the objects). */
  bytes: number;
  totalBytes: number;
}

/** The line on the terminal now, if any (cleared by clearProgress before an error line). */
let current: Progress | null = null;

/** Clears a progress line left drawn (sbx's fail() calls it before its message). */
export function clearProgress(): void {
  current?.done();
}

/** One progress line for one piece of work, labelled ("restore", "checkpoint /ws"). */
export class Progress {
  private readonly startedAt = performance.now();
  private readonly active: boolean;
  private lastDrawAt = -Infinity;
  private timer: NodeJS.Timeout | null = null;
  private drawn = false;

  constructor(
    private readonly label: string,
    private readonly out: NodeJS.WriteStream = process.stderr,
  ) {
    this.active = Boolean(out.isTTY);
  }

  /** Says what the work waits for (shown at once, then with its elapsed seconds every second). */
  waiting(what: string): void {
    if (!this.active) return;
    const draw = () => this.draw(`waiting for ${what} (${Math.floor((performance.now() - this.startedAt) / 1000)} s)`);
    draw();
    if (this.timer) clearInterval(this.timer);
    this.timer = setInterval(draw, TICK_MS);
    this.timer.unref();
  }

  /** Objects and bytes done (the first call and the last, all done, are always drawn). */
  counts(c: ProgressCounts): void {
    if (!this.active) return;
    const now = performance.now();
    const last = c.objects >= c.totalObjects;
    if (!last && this.drawn && now - this.lastDrawAt < REDRAW_MS) return;
    const seconds = (now - this.startedAt) / 1000;
    const rate = seconds > 0 ? `${mib(c.bytes / seconds)}/s` : '-';
    const percent = c.totalBytes > 0 ? ` (${Math.floor((100 * c.bytes) / c.totalBytes)}%)` : '';
    this.draw(`${c.objects}/${c.totalObjects} objects, ${mib(c.bytes)} of ${mib(c.totalBytes)}${percent}, ${rate}`);
  }

  /** Clears the line: the work is over. */
  done(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    if (this.active && this.drawn) this.out.write('\r\x1b[K');
    this.drawn = false;
    if (current === this) current = null;
  }

  private draw(text: string): void {
    current = this;
    this.lastDrawAt = performance.now();
    this.drawn = true;
    // stderr's columns now (a resize between draws is followed); 80 when the terminal does not say. Cut to
    // the width less one column: ESC[K erases one row, so a line that wrapped would leave its first rows
    // behind at every redraw.
    const columns = this.out.columns || 80;
    this.out.write(`\r\x1b[K${truncateToWidth(escapeControls(`sbx: ${this.label}: ${text}`), Math.max(1, columns - 1))}`);
  }
}
