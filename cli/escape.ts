// Text from the supervisor (messages, names, keys, argv, task names) as sbx may print it, and its width on a
// terminal. escapeControls is the one place control characters are escaped, so no escape sequence or line
// break of someone else's reaches the terminal as itself; displayWidth counts display columns per grapheme
// cluster, not code points.
import { eastAsianWidth } from 'get-east-asian-width';

// C0, DEL and C1, the bidi controls (U+202A-U+202E, U+2066-U+2069: they reorder what follows them on the
// line) and U+2028/U+2029 (line and paragraph separators).
const CONTROLS = /[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

/** text with every control character shown as an escape: `\n`, `\r`, `\t`, `\xNN` (ESC is `\x1b`), `\uNNNN`. */
export function escapeControls(text: string): string {
  return text.replace(CONTROLS, (ch) => {
    if (ch === '\n') return '\\n';
    if (ch === '\r') return '\\r';
    if (ch === '\t') return '\\t';
    const code = ch.charCodeAt(0);
    return code < 0x100 ? `\\x${code.toString(16).padStart(2, '0')}` : `\\u${code.toString(16).padStart(4, '0')}`;
  });
}

/** A character that takes no column of its own: controls, format (ZWJ, ZWSP, bidi), marks, default-ignorables. */
const ZERO_WIDTH = /^[\p{Cc}\p{Cf}\p{Mn}\p{Me}\p{Default_Ignorable_Code_Point}]$/u;
const PICTOGRAPHIC = /\p{Extended_Pictographic}/u;

// Made on first use, not at load: a command that prints nothing wide never pays for it.
let segmenter: Intl.Segmenter | null = null;
const graphemes = (text: string) => (segmenter ??= new Intl.Segmenter()).segment(text);

/** The columns one grapheme cluster takes: its first visible code point's, 2 for an emoji shown as one. */
function clusterWidth(cluster: string): number {
  for (const ch of cluster) {
    if (ZERO_WIDTH.test(ch)) continue;
    const w = eastAsianWidth(ch.codePointAt(0)!);
    // A text-presentation pictograph (U+2764) becomes a 2-column emoji with VS16 (U+FE0F) or a ZWJ sequence.
    if (w === 1 && PICTOGRAPHIC.test(ch) && (cluster.includes('\ufe0f') || cluster.includes('\u200d'))) return 2;
    return w;
  }
  return 0;
}

/**
 * The columns text takes on a terminal (escape it first: a control character counts 0), per grapheme cluster
 * (Intl.Segmenter): East Asian Wide/Fullwidth (get-east-asian-width) and emoji 2, combining marks and
 * zero-width characters 0, else 1.
 */
export function displayWidth(text: string): number {
  // Printable ASCII only: one column each (the common case, without segmenting).
  if (/^[\x20-\x7e]*$/.test(text)) return text.length;
  let width = 0;
  for (const { segment } of graphemes(text)) width += clusterWidth(segment);
  return width;
}

/** text cut to at most width display columns, ending in `ellipsis` when cut (never splits a character or cluster). */
export function truncateToWidth(text: string, width: number, ellipsis = '…'): string {
  if (displayWidth(text) <= width) return text;
  const room = width - displayWidth(ellipsis);
  if (room < 0) return '';
  let out = '';
  let used = 0;
  for (const { segment } of graphemes(text)) {
    const w = clusterWidth(segment);
    if (used + w > room) break;
    out += segment;
    used += w;
  }
  return out + ellipsis;
}

/**
 * The end of each line sbx writes on stderr: "\r\n" while sbx holds a terminal in raw mode with
 * output processing off (sbx run -it, attach: a bare \n would not return the cursor; ssh ends its
 * own lines there so too), else "\n". Set by rawTerminal.
 */
let stderrEol = '\n';

/** sbx put its terminal in raw mode, output processing off (true), or back (false): stderr's lines end as they then must. */
export function rawTerminal(raw: boolean): void {
  stderrEol = raw && process.stderr.isTTY ? '\r\n' : '\n';
}

/** text (one line, without its newline) ended as a line on stderr must be now (rawTerminal). */
export function stderrEnded(text: string): string {
  return text + stderrEol;
}

/** One line of sbx's own on stderr (text without its newline), ended as the terminal needs (rawTerminal). */
export function stderrLine(text: string): void {
  process.stderr.write(stderrEnded(text));
}

/** One line of sbx's on stderr, `sbx: ` first, with what came from elsewhere escaped (a message is one line). */
export function warn(text: string): void {
  stderrLine(`sbx: ${escapeControls(text)}`);
}
