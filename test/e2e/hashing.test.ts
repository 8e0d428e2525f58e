// The stream digest is computed off the event loop, always: a hashing thread that dies is
// replaced and the stream hashed again from its chunk files (SBX_FAULT_POINT terminates one
// in the middle of a digest), so the receipt's digest is still that of the stored bytes.
import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { verifyStoredOutput } from '../../core/receipts/verify.js';
import { TestDaemon, until } from '../helpers/daemon.js';

/** The bytes of `seq 1 n`, made here. */
const seq = (n: number) => Buffer.from(Array.from({ length: n }, (_, i) => `${i + 1}\n`).join(''));
const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

describe('a hashing thread that fails', () => {
  let daemon: TestDaemon;
  beforeAll(async () => {
    daemon = await new TestDaemon({ config: { drain: { chunkBytes: 65536 } }, env: { SBX_FAULT_POINT: 'hasher:terminate-worker' } }).start();
  });
  afterAll(async () => {
    expect(await daemon.stop()).toEqual({ code: 0, signal: null });
  });

  it('is replaced; the digest is of the stored bytes, and later sessions hash as well', async () => {
    const client = await daemon.client();
    for (const n of [300_000, 1000]) {
      const { session_id } = await client.launch({ argv: ['seq', '1', String(n)], cwd: '/' });
      const r = await client.wait({ session_id });
      expect(r.outcome).toBe('exited');
      expect(r.output.stdout).toMatchObject({ final_cursor: seq(n).length, sha256: sha(seq(n)), complete: true });
      expect(r.output.stderr).toMatchObject({ final_cursor: 0, sha256: sha(Buffer.alloc(0)) });
      expect(verifyStoredOutput(r, daemon.stateDir)).toEqual([]);
    }
    // Exactly one thread was terminated (the fault point acts once) and replaced. (The log is
    // written asynchronously: the line may follow the receipt.)
    await until(() => /a hashing thread failed; replaced/.test(daemon.log()), 'the replacement in the log');
    expect(daemon.log().match(/a hashing thread failed; replaced/g)).toHaveLength(1);
  });
});
