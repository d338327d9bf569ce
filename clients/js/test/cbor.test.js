// The canonical CBOR encoder against the byte examples of docs/cache-keys.md §1.3, §2.4, §5.1
// and RFC 8949 Appendix A.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cborEncode } from '../src/index.js';

const hex = (v) => Buffer.from(cborEncode(v)).toString('hex');

test('§1.3 example: (b"\\xab"*32, (1, 300, 70000), None)', () => {
  const parent = new Uint8Array(32).fill(0xab);
  assert.equal(hex([parent, [1, 300, 70000], null]), `835820${'ab'.repeat(32)}830119012c1a00011170f6`);
});

test('§2.4 example: tagged extra keys of block 0 with everything', () => {
  const d = new Uint8Array(32).fill(0xd7);
  const extra = [['lora', 'lo', '/p'], ['mm', 'm', 3], ['cache_salt', 's1'], ['prompt_embeds', d]];
  assert.equal(
    hex(extra),
    '84' +
      '83646c6f7261626c6f622f70' +
      '83626d6d616d03' +
      '826a63616368655f73616c74627331' +
      `826d70726f6d70745f656d62656473 5820${'d7'.repeat(32)}`.replace(' ', ''),
  );
});

test('§5.1 one-key map {"Hash": x}', () => {
  assert.equal(hex({ Hash: 'ab' }), 'a16448617368626162');
});

test('integer widths take the shortest head (RFC 8949 Appendix A)', () => {
  const cases = [
    [0, '00'],
    [23, '17'],
    [24, '1818'],
    [255, '18ff'],
    [256, '190100'],
    [65535, '19ffff'],
    [65536, '1a00010000'],
    [4294967295, '1affffffff'],
    [4294967296, '1b0000000100000000'],
    [18446744073709551615n, '1bffffffffffffffff'],
    [-1, '20'],
    [-11, '2a'],
    [-24, '37'],
    [-25, '3818'],
    [-18446744073709551616n, '3bffffffffffffffff'],
  ];
  for (const [value, want] of cases) assert.equal(hex(value), want, String(value));
});

test('strings, bytes, arrays, null', () => {
  assert.equal(hex(''), '60');
  assert.equal(hex('ü'), '62c3bc');
  assert.equal(hex('水'), '63e6b0b4');
  assert.equal(hex(new Uint8Array([1, 2, 3, 4])), '4401020304');
  assert.equal(hex([]), '80');
  assert.equal(hex([1, [2, 3], [4, 5]]), '8301820203820405');
  assert.equal(hex(null), 'f6');
  assert.equal(hex('a'.repeat(24)), `7818${'61'.repeat(24)}`);
});

test('map keys sort by encoded length, then bytewise', () => {
  assert.equal(hex({ bb: 1, a: 2, 10: 3 }), 'a36161026231300362626201');
  assert.equal(hex(new Map([['bb', 1], ['a', 2], ['c', 3]])), 'a361610261630362626201');
});

test('values outside the subset are refused', () => {
  assert.throws(() => cborEncode(1.5), { code: 'InvalidArgument' });
  assert.throws(() => cborEncode(2 ** 53), { code: 'InvalidArgument' });
  assert.throws(() => cborEncode(1n << 64n), { code: 'InvalidArgument' });
  assert.throws(() => cborEncode(undefined), { code: 'InvalidArgument' });
  assert.throws(() => cborEncode(true), { code: 'InvalidArgument' });
});
