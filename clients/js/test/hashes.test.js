// Hash primitives and the engine-pinned values docs/cache-keys.md cites (§2.2, §4, §5.1, §6).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fnv1a64, sha256, xxh3_64With, xxh3_128, xxh64Seed0 } from '../src/hashes.js';
import { blockKeys, buildSpec, cborEncode } from '../src/index.js';

const enc = (s) => new TextEncoder().encode(s);
const hex = (b) => Buffer.from(b).toString('hex');

test('Dynamo protocols.rs test value: xxh3_64(b"test data", 1337)', async () => {
  assert.equal((await xxh3_64With(1337n))(enc('test data')), 13226331709069118873n);
});

test('XXH3/XXH64 reference values of empty input', async () => {
  // xxHash reference: XXH3_64bits("") = 2d06800538d394c2, XXH3_128bits("") =
  // 99aa06d3014798d86001c324468d497f, XXH64("", 0) = ef46db3751d8e999.
  assert.equal((await xxh3_64With(0n))(new Uint8Array(0)), 0x2d06800538d394c2n);
  assert.equal(hex((await xxh3_128())(new Uint8Array(0))), '99aa06d3014798d86001c324468d497f');
  assert.equal((await xxh64Seed0())(new Uint8Array(0)), 0xef46db3751d8e999n);
});

test('XXH3-64 seeds above 2^32 and a cache of more seeds than it keeps', async () => {
  const data = enc('seeded');
  const seeds = Array.from({ length: 80 }, (_, i) => (BigInt(i) << 40n) | 7n);
  const first = [];
  for (const s of seeds) first.push((await xxh3_64With(s))(data));
  assert.equal(new Set(first).size, seeds.length);
  for (let i = 0; i < seeds.length; i++) assert.equal((await xxh3_64With(seeds[i]))(data), first[i]);
});

test('FNV-1a-64 reference values', () => {
  assert.equal(fnv1a64(new Uint8Array(0)), 0xcbf29ce484222325n);
  assert.equal(fnv1a64(enc('a')), 0xaf63dc4c8601ec8cn);
  assert.equal(fnv1a64(enc('foobar')), 0x85944171f73967e8n);
});

test('§2.2 vLLM default root of sha256_cbor', () => {
  assert.equal(hex(sha256(Uint8Array.from(Buffer.from('6e766c6c6d2d6e6f6e652d68617368', 'hex')))),
    '9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0');
  assert.equal(hex(cborEncode('vllm-none-hash')), '6e766c6c6d2d6e6f6e652d68617368');
});

test('§5.1 llm-d byte dumps: root and block 0 of tokens 1..16', async () => {
  const rootBytes = Buffer.from('831bcbf29ce484222325f66a746573742d6d6f64656c', 'hex');
  const root = fnv1a64(rootBytes);
  assert.equal(root, 17515353698173365712n);
  assert.equal(root.toString(16), 'f31309635ef2add0');
  const tokens = Array.from({ length: 16 }, (_, i) => i + 1);
  const block0 = Buffer.concat([
    Buffer.from('831bf31309635ef2add090', 'hex'),
    Buffer.from(tokens),
    Buffer.from('f6', 'hex'),
  ]);
  const spec = await buildSpec({ profile: 'llmd/cbor-fnv64@0.10', blockSize: 16 });
  const [key] = await blockKeys(tokens, spec, { model: 'test-model' });
  assert.equal(key.eventKey, fnv1a64(block0));
  assert.equal(key.hex, fnv1a64(block0).toString(16).padStart(16, '0'));
});
