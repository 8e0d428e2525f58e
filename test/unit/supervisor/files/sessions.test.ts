// The file tool's copy for a checkout not readable by others (supervisor/files/sessions.ts
// publishTool): the tool and every module it imports, laid out as under dist/, run as another
// user. A copy of the tool's own three files broke once it imported core/ (ERR_MODULE_NOT_FOUND
// from a 0700 checkout such as /root/project).
import { spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT } from '../../../helpers/daemon.js';
import { publishTool, toolModules } from '../../../../supervisor/files/sessions.js';

const BUILT = join(ROOT, 'dist/supervisor/files/file-tool.js');
const NOBODY = 65534;

describe('the file tool published for a checkout not readable by others', () => {
  it('copies every module the tool imports, and the copy reads and writes as another user (nobody)', () => {
    const modules = toolModules(BUILT);
    expect(modules).toContain('supervisor/files/file-tool.js');
    expect(modules).toContain('core/fs/durable.js'); // imported by the tool since the daemon-free core
    const copy = publishTool(BUILT);
    const copyRoot = dirname(dirname(dirname(copy)));
    const work = mkdtempSync(join(tmpdir(), 'sbx-file-tool-copy-'));
    try {
      expect(copy).toBe(join(copyRoot, 'supervisor/files/file-tool.js'));
      for (const name of modules) expect({ name, mode: statSync(join(copyRoot, name)).mode & 0o777 }).toEqual({ name, mode: 0o644 });
      chmodSync(work, 0o777);
      const data = randomBytes(100_000);
      const target = join(work, 'out.bin');
      const wrote = spawnSync(process.execPath, [copy, 'write', target, '--mode', '0640', '--size', String(data.length)], {
        input: data,
        uid: NOBODY,
        gid: NOBODY,
      });
      expect({ status: wrote.status, stderr: wrote.stderr.toString() }).toEqual({ status: 0, stderr: '' });
      expect(createHash('sha256').update(readFileSync(target)).digest('hex')).toBe(createHash('sha256').update(data).digest('hex'));
      expect(statSync(target)).toMatchObject({ uid: NOBODY, mode: 0o100640 });
      const source = join(work, 'in.txt');
      writeFileSync(source, 'read back\n', { mode: 0o644 });
      const read = spawnSync(process.execPath, [copy, 'read', source], { uid: NOBODY, gid: NOBODY });
      expect({ status: read.status, stdout: read.stdout.toString(), stderr: read.stderr.toString() }).toEqual({ status: 0, stdout: 'read back\n', stderr: '' });
    } finally {
      rmSync(work, { recursive: true, force: true });
      rmSync(copyRoot, { recursive: true, force: true });
    }
    expect(existsSync(copyRoot)).toBe(false);
  });
});
