import { describe, expect, it } from 'vitest';
import { parseCgroup2Mount, parseOwnCgroup, parsePopulated, parseProcs } from '../../../supervisor/cgroup.js';

// Lines as /proc/self/mountinfo shows them on this hybrid host and on a stock cgroup2 host.
const HYBRID = `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`;
const PURE_V2 = `22 28 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 22 0:24 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
27 22 0:25 / /sys/fs/pstore rw,nosuid,nodev,noexec,relatime shared:10 - pstore pstore rw
`;

describe('cgroup2 discovery', () => {
  it('finds cgroup2 at /sys/fs/cgroup/unified on a hybrid host', () => {
    expect(parseCgroup2Mount(HYBRID)).toEqual({ mountPoint: '/sys/fs/cgroup/unified', root: '/' });
  });
  it('finds cgroup2 at /sys/fs/cgroup on a pure cgroup2 host (optional fields present)', () => {
    expect(parseCgroup2Mount(PURE_V2)).toEqual({ mountPoint: '/sys/fs/cgroup', root: '/' });
  });
  it('returns null without cgroup2, and unescapes octal escapes', () => {
    expect(parseCgroup2Mount('32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n')).toBeNull();
    expect(parseCgroup2Mount('41 31 0:38 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n')?.mountPoint).toBe('/mnt/cg two');
  });
  it('takes only the 0:: line of /proc/self/cgroup', () => {
    expect(parseOwnCgroup('9:name=systemd:/\n4:memory:/process_api/e18f\n0::/\n')).toBe('/');
    expect(parseOwnCgroup('0::/system.slice/sandbox-supervisor.service\n')).toBe('/system.slice/sandbox-supervisor.service');
    expect(parseOwnCgroup('4:memory:/x\n')).toBeNull();
  });
  it('parses cgroup.procs and cgroup.events', () => {
    expect(parseProcs('12\n345\n')).toEqual([12, 345]);
    expect(parseProcs('')).toEqual([]);
    expect(parsePopulated('populated 1\nfrozen 0\n')).toBe(true);
    expect(parsePopulated('populated 0\nfrozen 0\n')).toBe(false);
  });
});
