// Watches a tar stream's headers as it passes (ipc/files.ts download) and refuses what the
// Python client refuses too: FIFOs and devices (typeflags 3, 4, 6), before the local tar sees
// them. Reads the ustar/GNU/PAX headers only (sizes: octal, base-256, PAX "size"; names: GNU
// long names and PAX "path"); bytes of members are skipped, never copied.
import { SupervisorError } from './errors.js';

const BLOCK = 512;
const SPECIAL: Record<string, string> = { '3': 'character device', '4': 'block device', '6': 'fifo' };

/** A tar header's numeric field: octal text, or base-256 when its first byte has the high bit. */
function num(field: Buffer): number {
  if (field[0] & 0x80) {
    let v = field[0] & 0x7f;
    for (let i = 1; i < field.length; i++) v = v * 256 + field[i];
    return v;
  }
  const text = field.toString('latin1').replace(/\0.*$/s, '').trim();
  return text ? Number.parseInt(text, 8) : 0;
}

/** PAX records ("LEN key=value\n"...) as a map. */
function paxRecords(data: Buffer): Map<string, string> {
  const out = new Map<string, string>();
  let at = 0;
  while (at < data.length) {
    const sp = data.indexOf(0x20, at);
    if (sp < 0) break;
    const len = Number.parseInt(data.toString('latin1', at, sp), 10);
    if (!(len > 0)) break;
    const rec = data.toString('utf8', sp + 1, at + len - 1);
    const eq = rec.indexOf('=');
    if (eq > 0) out.set(rec.slice(0, eq), rec.slice(eq + 1));
    at += len;
  }
  return out;
}

/** Feed it the stream's bytes in order: throws FILE_ERROR (details.member, details.type) at a FIFO or device member. */
export class TarGuard {
  private header = Buffer.alloc(0);
  private skip = 0; // bytes of the current member's data still to pass
  private meta: Buffer[] | null = null; // collecting a PAX 'x' or GNU 'L' member's data
  private metaType = '';
  private metaLeft = 0;
  private nextSize: number | null = null;
  private nextName: string | null = null;
  private done = false;

  push(data: Buffer): void {
    let at = 0;
    while (at < data.length && !this.done) {
      if (this.skip > 0) {
        const n = Math.min(this.skip, data.length - at);
        if (this.meta && this.metaLeft > 0) {
          const take = Math.min(n, this.metaLeft);
          this.meta.push(data.subarray(at, at + take));
          this.metaLeft -= take;
        }
        this.skip -= n;
        at += n;
        if (this.skip === 0 && this.meta) this.endMeta();
        continue;
      }
      const n = Math.min(BLOCK - this.header.length, data.length - at);
      this.header = Buffer.concat([this.header, data.subarray(at, at + n)]);
      at += n;
      if (this.header.length === BLOCK) {
        const h = this.header;
        this.header = Buffer.alloc(0);
        this.onHeader(h);
      }
    }
  }

  private onHeader(h: Buffer): void {
    if (h.every((b) => b === 0)) {
      this.done = true; // the end-of-archive blocks
      return;
    }
    const type = String.fromCharCode(h[156] || 0x30);
    const size = this.nextSize ?? num(h.subarray(124, 136));
    const prefix = h.subarray(345, 500).toString('utf8').replace(/\0.*$/s, '');
    const base = h.subarray(0, 100).toString('utf8').replace(/\0.*$/s, '');
    const name = this.nextName ?? (prefix ? `${prefix}/${base}` : base);
    if (type === 'x' || type === 'L' || type === 'g' || type === 'K') {
      if (type === 'x' || type === 'L') {
        this.meta = [];
        this.metaType = type;
        this.metaLeft = Math.min(size, 1024 * 1024);
      }
    } else {
      this.nextSize = null;
      this.nextName = null;
      if (SPECIAL[type])
        throw new SupervisorError('FILE_ERROR', `download: refused member ${JSON.stringify(name)}: a ${SPECIAL[type]}`, { member: name, type: SPECIAL[type] });
    }
    this.skip = Math.ceil(size / BLOCK) * BLOCK;
    if (this.skip === 0 && this.meta) this.endMeta();
  }

  private endMeta(): void {
    const data = Buffer.concat(this.meta!);
    this.meta = null;
    if (this.metaType === 'L') this.nextName = data.toString('utf8').replace(/\0.*$/s, '');
    else {
      const rec = paxRecords(data);
      if (rec.has('size')) this.nextSize = Number(rec.get('size'));
      if (rec.has('path')) this.nextName = rec.get('path')!;
    }
  }
}
