// missingNodeFlags (supervisor/node-flags.ts): which of the supervisor's node flags a start lacks,
// looked for in node's arguments and NODE_OPTIONS, either spelling of a V8 flag's name.
import { describe, expect, it } from 'vitest';
import { missingNodeFlags, nodeOptionsArgs, SUPERVISOR_NODE_FLAGS } from '../../../supervisor/node-flags.js';

describe('missingNodeFlags', () => {
  it('finds the flags in node’s arguments or in NODE_OPTIONS, spelled with - or _', () => {
    expect(missingNodeFlags(['--max-semi-space-size=2'], '')).toEqual([]);
    expect(missingNodeFlags(['--max_semi_space_size=2'], '')).toEqual([]);
    expect(missingNodeFlags([], '--max-semi-space-size=2')).toEqual([]);
    expect(missingNodeFlags([], '  --inspect  --max_semi_space_size=2 ')).toEqual([]);
  });

  it('reads NODE_OPTIONS as node does: double quotes joined and dropped, a backslash in them escapes, only a space separates', () => {
    // Each of these starts node with the cap (its new space 4 MiB, checked with v8.getHeapSpaceStatistics).
    expect(missingNodeFlags([], '"--max-semi-space-size=2"')).toEqual([]);
    expect(missingNodeFlags([], '"--max-semi-space-size"=2')).toEqual([]);
    expect(missingNodeFlags([], '--max-semi-space-size="2"')).toEqual([]);
    expect(nodeOptionsArgs('--title="a b" "x\\"y" --z')).toEqual(['--title=a b', 'x"y', '--z']);
    // node refuses a tab inside a flag's value: it is not a separator.
    expect(nodeOptionsArgs('--max-semi-space-size=2\t--inspect')).toEqual(['--max-semi-space-size=2\t--inspect']);
    expect(missingNodeFlags([], '--max-semi-space-size=2\t--inspect')).toEqual([...SUPERVISOR_NODE_FLAGS]);
  });

  it('takes the last value given (NODE_OPTIONS, then the arguments, as node reads them); a tighter cap is in force', () => {
    expect(missingNodeFlags(['--max-semi-space-size=1'], '')).toEqual([]);
    expect(missingNodeFlags(['--max-semi-space-size=2'], '--max-semi-space-size=16')).toEqual([]);
    expect(missingNodeFlags(['--max-semi-space-size=2', '--max-semi-space-size=16'], '')).toEqual([...SUPERVISOR_NODE_FLAGS]);
    expect(missingNodeFlags([], '--max-semi-space-size=2 --max_semi_space_size=16')).toEqual([...SUPERVISOR_NODE_FLAGS]);
  });

  it('names what is missing, a larger value or 0 (V8’s "unset") included', () => {
    expect(missingNodeFlags([], '')).toEqual([...SUPERVISOR_NODE_FLAGS]);
    expect(missingNodeFlags(['--max-semi-space-size=0'], '')).toEqual([...SUPERVISOR_NODE_FLAGS]);
    expect(missingNodeFlags([], '--max-semi-space-size=0')).toEqual([...SUPERVISOR_NODE_FLAGS]);
    expect(missingNodeFlags(['--max-semi-space-size=4'], '')).toEqual([...SUPERVISOR_NODE_FLAGS]);
    expect(missingNodeFlags(['--max-semi-space-size'], '2')).toEqual([...SUPERVISOR_NODE_FLAGS]);
    expect(missingNodeFlags(['--max-semi-space-size=two'], '')).toEqual([...SUPERVISOR_NODE_FLAGS]);
  });
});
