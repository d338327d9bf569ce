// Spec parsing and building: unknown or non-client-computable profiles are refused, a spec
// whose fields, root or fingerprint disagree is refused, buildSpec derives roots (§2.2, §5, §7).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import {
  buildSpec,
  getProfile,
  listProfiles,
  loadVectorFile,
  parseSpec,
  specFingerprint,
} from '../src/index.js';
import { VECTORS_DIR } from './paths.js';

const file = await loadVectorFile(join(VECTORS_DIR, 'vllm__sha256_cbor--0.31.json'));
const refingerprint = (json) => ({ ...json, fingerprint: specFingerprint(json) });

test('listProfiles: every profile of the document, pickle ones not client-computable', () => {
  const rows = listProfiles();
  assert.equal(rows.length, 12);
  const computable = rows.filter((r) => r.client_computable).map((r) => r.id);
  assert.deepEqual(computable.sort(), [
    'dynamo/xxh3@1.6',
    'llmd/cbor-fnv64@0.10',
    'llmd/xxh64@c027acf',
    'sglang/sha256@0.5.23',
    'vllm/sha256_cbor@0.29',
    'vllm/sha256_cbor@0.31',
    'vllm/xxhash_cbor@0.29',
    'vllm/xxhash_cbor@0.31',
  ]);
});

test('unknown id or version: NotFound naming the known ids', async () => {
  for (const id of ['vllm/sha256_cbor@0.34', 'vllm/blake3@0.31', 'trtllm/sha256@1.0', '']) {
    assert.throws(() => getProfile(id), (err) => {
      assert.equal(err.code, 'NotFound');
      assert.match(err.message, /vllm\/sha256_cbor@0\.31/);
      assert.match(err.message, /llmd\/xxh64@c027acf/);
      return true;
    });
    await assert.rejects(parseSpec({ ...file.spec, profile_id: id }), { code: 'NotFound' });
    await assert.rejects(buildSpec({ profile: id, blockSize: 16 }), { code: 'NotFound' });
  }
});

test('pickle profiles: Unsupported, pointing at ComputeCacheKeys', async () => {
  for (const id of ['vllm/sha256@0.31', 'vllm/xxhash@0.29']) {
    await assert.rejects(buildSpec({ profile: id, blockSize: 16, rootSeed: '0' }), (err) => {
      assert.equal(err.code, 'Unsupported');
      assert.match(err.message, /not client-computable/);
      assert.match(err.message, /ComputeCacheKeys/);
      return true;
    });
  }
});

test('a spec whose fields disagree with its profile is refused', async () => {
  for (const [field, value] of [
    ['serialization', 'pickle_protocol5'],
    ['digest', 'xxh3_128'],
    ['extra_keys', 'vllm_bare'],
    ['event_encoding', 'i64_be_first8'],
    ['engine_version', '0.29'],
  ]) {
    // §1.4, §7: a well-formed spec that contradicts its profile is a failed precondition.
    await assert.rejects(parseSpec(refingerprint({ ...file.spec, [field]: value })), {
      code: 'FailedPrecondition',
    });
  }
  await assert.rejects(parseSpec(refingerprint({ ...file.spec, required_context: [] })), {
    code: 'FailedPrecondition',
  });
  await assert.rejects(parseSpec(refingerprint({ ...file.spec, partial_block: 'hashed' })), {
    code: 'Unsupported',
  });
  await assert.rejects(parseSpec(refingerprint({ ...file.spec, hash_unit: 0 })), {
    code: 'InvalidArgument',
  });
  const badGroups = [{ index: 0, block_size: 24, derivation: 'last_hash_unit' }];
  await assert.rejects(parseSpec(refingerprint({ ...file.spec, groups: badGroups })), {
    code: 'FailedPrecondition',
  });
  const outOfOrder = [{ index: 1, block_size: 16, derivation: 'last_hash_unit' }];
  await assert.rejects(parseSpec(refingerprint({ ...file.spec, groups: outOfOrder })), {
    code: 'FailedPrecondition',
  });
});

test('a tampered spec no longer matches its fingerprint', async () => {
  await assert.rejects(parseSpec({ ...file.spec, required_context: [] }), (err) => {
    assert.equal(err.code, 'FailedPrecondition');
    assert.match(err.message, /fingerprint/);
    return true;
  });
});

test('a root that is not H(seed) is refused; explicit vLLM roots are taken as given', async () => {
  const wrong = { ...file.spec, root_derivation: 'seed:42' };
  await assert.rejects(parseSpec(refingerprint(wrong)), { code: 'FailedPrecondition' });
  const explicit = { ...file.spec, root_derivation: 'explicit', root_hex: 'ab'.repeat(32) };
  const spec = await parseSpec(refingerprint(explicit));
  assert.equal(Buffer.from(spec.root).toString('hex'), 'ab'.repeat(32));
  const tooLong = { ...explicit, root_hex: 'ab'.repeat(65) };
  await assert.rejects(parseSpec(refingerprint(tooLong)), { code: 'FailedPrecondition' });
});

test('llm-d roots are "seed:<s>" only (§5, §7)', async () => {
  const llmd = (await loadVectorFile(join(VECTORS_DIR, 'llmd__cbor-fnv64--0.10.json'))).spec;
  const explicit = { ...llmd, root_derivation: 'explicit' };
  await assert.rejects(parseSpec(refingerprint(explicit)), { code: 'FailedPrecondition' });
  await assert.rejects(buildSpec({ profile: 'llmd/xxh64@c027acf', blockSize: 16, rootHex: '00'.repeat(8) }), {
    code: 'InvalidArgument',
  });
});

test('buildSpec: vLLM roots (§2.2), xxhash needs a seed, llm-d initHash (§5)', async () => {
  const def = await buildSpec({ profile: 'vllm/sha256_cbor@0.31', blockSize: 16 });
  assert.equal(def.json.root_derivation, 'default_seed');
  assert.equal(def.json.root_hex, '9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0');
  await assert.rejects(buildSpec({ profile: 'vllm/xxhash_cbor@0.31', blockSize: 16 }), {
    code: 'InvalidArgument',
  });
  const hybrid = await buildSpec({ profile: 'vllm/xxhash_cbor@0.31', groups: [32, 48], rootSeed: '0' });
  assert.equal(hybrid.hashUnit, 16);
  assert.equal(hybrid.json.root_hex, '1ebe36576dcb573f26b99533a20aaeca');
  const fnv = await buildSpec({ profile: 'llmd/cbor-fnv64@0.10', blockSize: 16 });
  assert.equal(fnv.json.root_hex, 'cbf29ce484222325');
  const xxh = await buildSpec({ profile: 'llmd/xxh64@c027acf', blockSize: 16 });
  assert.equal(xxh.json.root_hex, 'ef46db3751d8e999');
  await assert.rejects(buildSpec({ profile: 'sglang/sha256@0.5.23', blockSize: 16, rootSeed: '1' }), {
    code: 'InvalidArgument',
  });
  await assert.rejects(
    buildSpec({ profile: 'dynamo/xxh3@1.6', groups: [16, 32] }),
    { code: 'Unsupported' },
  );
});
