// Every vector of every testvectors/*.json file: client-computable profiles must reproduce
// each key, event key and refusal; the others (pickle) must be refused, never guessed.

import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import {
  blockKeys,
  buildSpec,
  canonicalDigest,
  getProfile,
  KeyError,
  listProfiles,
  loadVectorFile,
  parseSpec,
  specFingerprint,
  verifyVectors,
} from '../src/index.js';
import { VECTORS_DIR } from './paths.js';

const files = readdirSync(VECTORS_DIR)
  .filter((f) => f.endsWith('.json'))
  .sort();

test('the vector directory holds a file for every profile this client knows', () => {
  const ids = files.map((f) => f.replace(/\.json$/, '').replace('__', '/').replace('--', '@'));
  assert.deepEqual([...ids].sort(), listProfiles().map((p) => p.id).sort());
});

for (const name of files) {
  const file = await loadVectorFile(join(VECTORS_DIR, name));
  const id = file.spec.profile_id;

  describe(name, () => {
    test('file names its profile as §7 says', () => {
      assert.equal(name, `${id.replace('/', '__').replace('@', '--')}.json`);
      assert.equal(file.profile.id, id);
    });

    test('spec fingerprint and vectors digest recompute', () => {
      assert.equal(specFingerprint(file.spec), file.spec.fingerprint);
      assert.equal(canonicalDigest(file.vectors), file.spec.vectors_digest);
    });

    if (!getProfile(id).client_computable) {
      test('not client-computable: refused with Unsupported, naming the computable ids', async () => {
        assert.equal(file.spec.client_computable, false);
        await assert.rejects(parseSpec(file.spec), (err) => {
          assert.equal(err.code, 'Unsupported');
          assert.match(err.message, /ComputeCacheKeys/);
          assert.match(err.message, /vllm\/sha256_cbor@0\.31/);
          return true;
        });
        const report = await verifyVectors(file);
        assert.equal(report.ok, false);
        assert.equal(report.refused.code, 'Unsupported');
      });
      return;
    }

    for (const root of file.roots ?? []) {
      test(`root H(${JSON.stringify(root.seed)})`, async () => {
        const spec = await buildSpec({ profile: id, blockSize: 16, rootSeed: root.seed });
        assert.equal(spec.json.root_hex, root.root_hex);
      });
    }

    for (const v of file.vectors) {
      test(`vector ${v.name}`, async () => {
        if (v.error !== undefined) {
          await assert.rejects(blockKeys(v.tokens, file.spec, v.context), (err) => {
            assert.ok(err instanceof KeyError, String(err));
            assert.equal(err.code, v.error, err.message);
            return true;
          });
          return;
        }
        const keys = await blockKeys(v.tokens, file.spec, v.context);
        assert.deepEqual(
          keys.map((k) => k.hex),
          v.keys,
        );
        assert.deepEqual(
          keys.map((k) => k.eventKey),
          v.event_keys.map((e) => BigInt(e)),
        );
      });
    }

    test('verifyVectors reports every check passed', async () => {
      const report = await verifyVectors(join(VECTORS_DIR, name));
      assert.equal(report.refused, null);
      assert.deepEqual(report.checks.filter((c) => !c.ok), []);
      assert.equal(report.ok, true);
      assert.equal(report.passed, 1 + (file.roots?.length ?? 0) + file.vectors.length);
    });
  });
}
