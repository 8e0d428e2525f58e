// Death evidence decided from observations (supervisor/session/evidence.ts), without processes.
import { describe, expect, it } from 'vitest';
import {
  bootChanged,
  cgroupEmpty,
  liveDeath,
  missingShimReport,
  operatorAttested,
  recoveredCourse,
  subreaperReaped,
} from '../../../../supervisor/session/evidence.js';

const at = new Date('2026-12-01T10:00:00.000Z');

describe('evidence', () => {
  it('names each kind with when it was observed', () => {
    expect(cgroupEmpty('/sys/fs/cgroup/unified/sbx/sessions/s-1-aa', '/sys/fs/cgroup/unified', at)).toEqual({
      evidence: 'cgroup_empty',
      observedAt: at,
      cgroup: '/sbx/sessions/s-1-aa',
    });
    expect(subreaperReaped(3, at)).toEqual({ evidence: 'subreaper_reaped', observedAt: at, reaped: 3 });
    expect(bootChanged(at)).toEqual({ evidence: 'boot_changed', observedAt: at });
    expect(operatorAttested(at)).toEqual({ evidence: 'operator_attested', observedAt: at });
  });

  it('a live end proves cgroup_empty with a leaf, subreaper_reaped when the shim reported, else nothing', () => {
    expect(liveDeath({ leafPath: '/m/l', mountPoint: '/m', shimReport: null }, at)).toEqual({ evidence: 'cgroup_empty', observedAt: at, cgroup: '/l' });
    expect(liveDeath({ leafPath: null, mountPoint: null, shimReport: { reaped: 2 } }, at)).toEqual({ evidence: 'subreaper_reaped', observedAt: at, reaped: 2 });
    expect(liveDeath({ leafPath: null, mountPoint: null, shimReport: null }, at)).toBeNull();
  });

  it('a shim that died without its report leaves no proof where the report was needed, and only there', () => {
    const reason = "the exec shim (the session's subreaper) died before reporting all descendants reaped";
    expect(missingShimReport({ reportNeeded: true, shimReport: null })).toBe(reason);
    expect(missingShimReport({ reportNeeded: true, shimReport: { reaped: 0 } })).toBeNull();
    expect(missingShimReport({ reportNeeded: false, shimReport: null })).toBeNull();
  });

  it('a recovered session: another boot is evidence; else only a leaf under our mount; else none', () => {
    expect(recoveredCourse({ admittedBootId: 'a', bootId: 'b', leafPath: null, mountPoint: null })).toEqual({ kind: 'boot_changed' });
    expect(recoveredCourse({ admittedBootId: 'a', bootId: 'a', leafPath: '/m/x/s-1', mountPoint: '/m' })).toEqual({ kind: 'cgroup', leafPath: '/m/x/s-1' });
    expect(recoveredCourse({ admittedBootId: 'a', bootId: 'a', leafPath: '/other/s-1', mountPoint: '/m' })).toMatchObject({ kind: 'no_evidence' });
    expect(recoveredCourse({ admittedBootId: 'a', bootId: 'a', leafPath: null, mountPoint: '/m' })).toEqual({
      kind: 'no_evidence',
      reason: expect.stringContaining('subreaper mode'),
    });
  });
});
