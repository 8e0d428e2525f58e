// sbx run's one line about leftovers (cli/explain.ts leftoversLine) as a pure function of the
// receipt: handed off, ended (how: TERM alone, TERM then KILL after the grace, KILL with no
// grace), and counts that agree when a leftover forked during the grace.
import { expect, it } from 'vitest';
import { leftoversLine } from '../../../cli/explain.js';
import type { Receipt } from '../../../ipc/protocol.js';

type Facts = Parameters<typeof leftoversLine>[0];
const at = '2026-12-06T12:00:00.000Z';
const ended = (steps: [string, number][], descendants: number, cause: Receipt['termination']['cause'] = 'linger'): Facts => ({
  handed_off: undefined,
  task: 'default',
  descendants_terminated: descendants,
  termination: { cause, steps: steps.map(([signal, pids]) => ({ signal, at, pids })) },
});

it('says how leftovers were ended, from the termination steps', () => {
  expect(leftoversLine(ended([['SIGTERM', 2]], 2))).toBe('sbx: 2 leftover processes were ended (linger kill)');
  expect(leftoversLine(ended([['SIGTERM', 1]], 1))).toBe('sbx: 1 leftover process was ended (linger kill)');
  expect(
    leftoversLine(
      ended(
        [
          ['SIGTERM', 2],
          ['SIGKILL', 1],
        ],
        2,
      ),
    ),
  ).toBe('sbx: 2 leftover processes were ended (linger kill: SIGTERM, then SIGKILL to 1 process still running after the grace)');
  // --grace 0: SIGKILL is the only step; no SIGTERM is claimed.
  expect(leftoversLine(ended([['SIGKILL', 5]], 5))).toBe('sbx: 5 leftover processes were ended (linger kill: SIGKILL, no grace)');
  // One that ignored SIGTERM forked 7 more during the grace: SIGKILL reached 8.
  expect(
    leftoversLine(
      ended(
        [
          ['SIGTERM', 1],
          ['SIGKILL', 8],
        ],
        1,
      ),
    ),
  ).toBe('sbx: 1 leftover process was ended (linger kill: SIGTERM, then SIGKILL to 8 processes still running after the grace, some forked during it)');
  // Not a linger end, or nothing left: no line.
  expect(leftoversLine(ended([['SIGTERM', 2]], 2, 'deadline'))).toBeNull();
  expect(leftoversLine(ended([], 0))).toBeNull();
  expect(leftoversLine({ ...ended([], 0), handed_off: { service_id: 's-svc', pids: 3, at } as NonNullable<Receipt['handed_off']> })).toBe(
    'sbx: 3 processes handed off to service s-svc (sbx ps, sbx logs s-svc; sbx close --task default ends it)',
  );
});
