// core/receipts/verify.ts jcs() against the canonicalize package (an independent RFC 8785
// implementation) on random JSON values: the same text, and the same refusals.
import canonicalize from 'canonicalize';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { jcs } from '../../../../core/receipts/verify.js';

const seed = Number(process.env.JCS_SEED ?? Date.now() % 2 ** 31);
console.log(`signature.test.ts: JCS_SEED=${seed}`);

describe('jcs', () => {
  it("gives canonicalize's text for any JSON value (unicode keys and strings, doubles, nesting)", () => {
    const value = fc.letrec((tie) => ({
      json: fc.oneof(
        { depthSize: 'small' },
        fc.constant(null),
        fc.boolean(),
        fc.integer(),
        fc.double({ noNaN: true, noDefaultInfinity: true }),
        fc.string({ unit: 'grapheme' }),
        fc.string({ unit: 'binary' }),
        fc.array(tie('json'), { maxLength: 5 }),
        fc.dictionary(fc.string({ unit: 'grapheme', maxLength: 6 }), tie('json'), { maxKeys: 6 }),
        // integer-like keys beside others (JavaScript enumerates them first: JCS does not)
        fc.dictionary(fc.oneof(fc.nat().map(String), fc.constantFrom('%', '-1', '01', 'a')), tie('json'), { maxKeys: 6 }),
      ),
    })).json;
    const outcome = (f: () => string) => {
      try {
        return f();
      } catch {
        return 'refused';
      }
    };
    fc.assert(
      fc.property(value, (v) => {
        expect(outcome(() => jcs(v))).toBe(outcome(() => canonicalize(v)!));
      }),
      { seed, numRuns: 2000 },
    );
  });

  it('drops undefined members, makes undefined array items null, and refuses what JCS refuses', () => {
    expect(jcs({ b: 1, a: undefined, c: [undefined, 2], é: 'x', e: -0 })).toBe(canonicalize({ b: 1, a: undefined, c: [undefined, 2], é: 'x', e: -0 }));
    expect(jcs({ z: 1, Z: 2, '\u{1f600}': 3, '\uff21': 4 })).toBe('{"Z":2,"z":1,"\u{1f600}":3,"\uff21":4}');
    // Integer-like keys sort as strings too (JavaScript enumerates them first, in numeric order).
    expect(jcs({ '%': 1, 10: 2, 9: 3, 0: 4, a: { 2: 0, 10: 1 } })).toBe('{"%":1,"0":4,"10":2,"9":3,"a":{"10":1,"2":0}}');
    expect(jcs({ '%': 1, 10: 2, 9: 3 })).toBe(canonicalize({ '%': 1, 10: 2, 9: 3 }));
    for (const bad of [NaN, Infinity, '\udc80', { ['\ud800']: 1 }, ['a\udfff']]) {
      expect(() => jcs(bad)).toThrow();
      expect(() => canonicalize(bad)).toThrow();
    }
    const loop: Record<string, unknown> = {};
    loop.self = loop;
    expect(() => jcs(loop)).toThrow('Circular reference detected');
  });
});
