// Entry names are bytes (a Linux name is any bytes but '/' and NUL); text is for people and
// for the close digest's line format. Owns the one lossless mapping between them: UTF-8, with
// each byte that is not part of a valid UTF-8 sequence carried as the lone surrogate
// U+DC80..U+DCFF (Python's "surrogateescape", PEP 383), so no two names ever collide.
// Does not own any I/O. See utf-8(7), and Unicode 15 section 3.9 (well-formed UTF-8, table 3-7).
import { isUtf8 } from 'node:buffer';

/** Bytes -> string: valid UTF-8 as is, every other byte b as U+DC00+b. Inverse of fsEncode. */
export function fsDecode(bytes: Buffer): string {
  if (isUtf8(bytes)) return bytes.toString('utf8');
  let out = '';
  let start = 0; // start of the pending run of valid UTF-8
  let i = 0;
  while (i < bytes.length) {
    const n = validSequenceLength(bytes, i);
    if (n > 0) {
      i += n;
      continue;
    }
    out += bytes.toString('utf8', start, i) + String.fromCharCode(0xdc00 + bytes[i]);
    i += 1;
    start = i;
  }
  return out + bytes.toString('utf8', start, i);
}

/** Bytes of a sequence starting at i if it is one well-formed UTF-8 character, else 0. */
function validSequenceLength(b: Buffer, i: number): number {
  const c = b[i];
  if (c < 0x80) return 1;
  const cont = (k: number, lo = 0x80, hi = 0xbf) => i + k < b.length && b[i + k] >= lo && b[i + k] <= hi;
  if (c >= 0xc2 && c <= 0xdf) return cont(1) ? 2 : 0;
  if (c === 0xe0) return cont(1, 0xa0) && cont(2) ? 3 : 0;
  if (c === 0xed) return cont(1, 0x80, 0x9f) && cont(2) ? 3 : 0; // no encoded surrogates
  if (c >= 0xe1 && c <= 0xef) return cont(1) && cont(2) ? 3 : 0;
  if (c === 0xf0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (c >= 0xf1 && c <= 0xf3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (c === 0xf4) return cont(1, 0x80, 0x8f) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

const LONE_ESCAPE = /(?<![\uD800-\uDBFF])[\uDC80-\uDCFF]/;

/** String (from fsDecode) -> the original bytes: UTF-8, each lone U+DC80..U+DCFF back to its byte. */
export function fsEncode(text: string): Buffer {
  if (!LONE_ESCAPE.test(text)) return Buffer.from(text, 'utf8');
  const parts: Buffer[] = [];
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff) {
      const d = text.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) i++; // a pair: one character, copied as UTF-8
      continue;
    }
    if (c >= 0xdc80 && c <= 0xdcff) {
      parts.push(Buffer.from(text.slice(start, i), 'utf8'), Buffer.of(c - 0xdc00));
      start = i + 1;
    }
  }
  parts.push(Buffer.from(text.slice(start), 'utf8'));
  return Buffer.concat(parts);
}

/**
 * A decoded name (fsDecode) as well-formed Unicode text, for a receipt (RFC 8785 refuses a lone
 * surrogate) or a msgpack frame (which would make it U+FFFD): each escaped byte as \xNN.
 * Returns the text unchanged when the name was UTF-8; fsEncode(text) gives the bytes otherwise.
 */
export function nameText(text: string): string {
  return LONE_ESCAPE.test(text) ? text.replace(/(?<![\uD800-\uDBFF])[\uDC80-\uDCFF]/g, (s) => `\\x${(s.charCodeAt(0) - 0xdc00).toString(16)}`) : text;
}

/** A relative path for an error message: decoded, escapes shown as \xNN, at most maxChars (its tail). */
export function showPath(bytes: Buffer, maxChars = 200): string {
  const text = fsDecode(bytes).replace(/(?<![\uD800-\uDBFF])[\uDC80-\uDCFF]/g, (s) => `\\x${(s.charCodeAt(0) - 0xdc00).toString(16)}`);
  return text.length <= maxChars ? text : `...${text.slice(text.length - maxChars)}`;
}
