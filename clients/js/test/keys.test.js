// Properties and refusals of blockKeys that the vectors do not spell out: continuation,
// partial tails, first-block-only salt, the §2.4 multimodal example, groups, input checks.

import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { createHash } from 'node:crypto';
import { blockKeys, cborEncode, listProfiles, loadVectorFile } from '../src/index.js';
import { VECTORS_DIR } from './paths.js';

/** Deterministic token ids covering every CBOR integer width. */
function tokens(n, seed = 1) {
  let x = seed >>> 0 || 1;
  const out = [];
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    out.push(x % [24, 256, 65536, 2 ** 32][i % 4]);
  }
  return out;
}

const computable = listProfiles().filter((p) => p.client_computable);
const specs = {};
for (const p of computable) {
  const name = `${p.id.replace('/', '__').replace('@', '--')}.json`;
  specs[p.id] = (await loadVectorFile(join(VECTORS_DIR, name))).spec;
}
const base = (id) => (id.startsWith('llmd/') ? { model: 'm-1' } : {});
const withAdapter = (id) =>
  id.startsWith('sglang/') ? base(id) : { ...base(id), adapter: { name: 'ad', path: '/a/d' } };

for (const { id } of computable) {
  describe(id, () => {
    const spec = specs[id];

    test('empty prompt and a prompt shorter than a block have no keys', async () => {
      assert.deepEqual(await blockKeys([], spec, base(id)), []);
      assert.deepEqual(await blockKeys(tokens(15), spec, base(id)), []);
    });

    test('the partial tail never changes or adds a key', async () => {
      const t = tokens(16 * 5 + 9, 3);
      const full = await blockKeys(t.slice(0, 80), spec, base(id));
      const tail = await blockKeys(t, spec, base(id));
      assert.equal(full.length, 5);
      assert.deepEqual(tail, full);
    });

    test('continuation: keys of tokens[16k:] from key[k-1] equal key[k:]', async () => {
      const t = tokens(16 * 6, 7);
      const ctx = withAdapter(id);
      const whole = await blockKeys(t, spec, ctx);
      for (let k = 1; k < 6; k++) {
        const rest = await blockKeys(t.slice(16 * k), spec, ctx, whole[k - 1].hex);
        assert.deepEqual(rest, whole.slice(k), `k=${k}`);
        const viaContext = await blockKeys(t.slice(16 * k), spec, { ...ctx, parent: whole[k - 1].digest });
        assert.deepEqual(viaContext, whole.slice(k));
      }
    });

    test('a parent of the wrong size is refused', async () => {
      await assert.rejects(blockKeys(tokens(16), spec, base(id), 'abcd'), { code: 'InvalidArgument' });
    });

    test('token ids outside [0, 2^32) are refused', async () => {
      for (const bad of [-1, 2 ** 32, 1.5, '7', null, 2n ** 32n]) {
        const t = tokens(16);
        t[3] = bad;
        await assert.rejects(blockKeys(t, spec, base(id)), { code: 'InvalidArgument' }, String(bad));
      }
      const top = tokens(16);
      top[0] = 2 ** 32 - 1;
      assert.equal((await blockKeys(top, spec, base(id))).length, 1);
    });

    test('cache salt validated as vLLM validate_cache_salt (§1.1)', async () => {
      for (const bad of ['', 'a@b', 'a/b', 'a\\b', 'a\0b', 'x'.repeat(129), '\ud800']) {
        await assert.rejects(blockKeys(tokens(16), spec, { ...base(id), cache_salt: bad }), {
          code: 'InvalidArgument',
        });
      }
      const ok = await blockKeys(tokens(32), spec, { ...base(id), cache_salt: '😀'.repeat(128) });
      const plain = await blockKeys(tokens(32), spec, base(id));
      assert.notEqual(ok[0].hex, plain[0].hex);
    });

    test('unknown context fields and groups are refused', async () => {
      await assert.rejects(blockKeys(tokens(16), spec, { ...base(id), lora: 'x' }), {
        code: 'InvalidArgument',
      });
      await assert.rejects(blockKeys(tokens(16), spec, { ...base(id), group: 9 }), {
        code: 'InvalidArgument',
      });
    });

    if (!id.startsWith('sglang/')) {
      test('multimodal items must be sorted and must not overlap', async () => {
        const items = [
          { identifier: 'a', offset: 4, length: 8 },
          { identifier: 'b', offset: 10, length: 2 },
        ];
        await assert.rejects(blockKeys(tokens(32), spec, { ...base(id), mm_items: items }), {
          code: 'InvalidArgument',
        });
        await assert.rejects(
          blockKeys(tokens(32), spec, { ...base(id), mm_items: [{ identifier: 'a', offset: 0, length: 0 }] }),
          { code: 'InvalidArgument' },
        );
      });

      test('an item keys exactly the blocks it overlaps', async () => {
        const t = tokens(64, 5);
        const plain = await blockKeys(t, spec, base(id));
        // Occupies [32, 48): block 2 only, so blocks 0 and 1 are unchanged.
        const item = { identifier: 'pic', offset: 32, length: 16 };
        const keyed = await blockKeys(t, spec, { ...base(id), mm_items: [item] });
        assert.deepEqual(keyed.slice(0, 2), plain.slice(0, 2));
        assert.notEqual(keyed[2].hex, plain[2].hex);
      });
    }
  });
}

const vllmRoot = (spec) => Buffer.from(spec.root_hex, 'hex');
const sha = (obj) => new Uint8Array(createHash('sha256').update(cborEncode(obj)).digest());

test('§2.4 vLLM multimodal example: img-A@5+20, img-B@40+4, 16-token blocks', async () => {
  const t = tokens(48, 11);
  const mm = [
    { identifier: 'img-A', offset: 5, length: 20 },
    { identifier: 'img-B', offset: 40, length: 4 },
  ];
  for (const [id, form] of [
    ['vllm/sha256_cbor@0.31', (n, o) => ['mm', n, o]],
    ['vllm/sha256_cbor@0.29', (n, o) => [n, o]],
  ]) {
    const spec = specs[id];
    const keys = await blockKeys(t, spec, { mm_items: mm });
    const extras = [[form('img-A', 5)], [form('img-A', -11)], [form('img-B', 8)]];
    let parent = new Uint8Array(vllmRoot(spec));
    for (let i = 0; i < 3; i++) {
      parent = sha([parent, t.slice(16 * i, 16 * i + 16), extras[i]]);
      assert.equal(keys[i].hex, Buffer.from(parent).toString('hex'), `${id} block ${i}`);
    }
  }
});

test('vLLM: cache salt on the first block only, not after a continuation parent', async () => {
  const spec = specs['vllm/sha256_cbor@0.31'];
  const t = tokens(32, 2);
  const salted = await blockKeys(t, spec, { cache_salt: 's1' });
  const root = new Uint8Array(vllmRoot(spec));
  const k0 = sha([root, t.slice(0, 16), [['cache_salt', 's1']]]);
  const k1 = sha([k0, t.slice(16), null]);
  assert.deepEqual(salted.map((k) => k.hex), [k0, k1].map((b) => Buffer.from(b).toString('hex')));
  const cont = await blockKeys(t.slice(16), spec, { cache_salt: 's1' }, k0);
  assert.equal(cont[0].hex, salted[1].hex);
});

test('vLLM tagged era needs the adapter path; bare era keys the name only', async () => {
  await assert.rejects(
    blockKeys(tokens(16), specs['vllm/sha256_cbor@0.31'], { adapter: { name: 'x' } }),
    { code: 'InvalidArgument' },
  );
  const bare = specs['vllm/sha256_cbor@0.29'];
  const a = await blockKeys(tokens(16), bare, { adapter: { name: 'x' } });
  const b = await blockKeys(tokens(16), bare, { adapter: { name: 'x', path: '/elsewhere' } });
  assert.deepEqual(a, b);
});

test('vLLM prompt embeddings: at least one digest per full block, later ones unused (§1.1)', async () => {
  const spec = specs['vllm/xxhash_cbor@0.31'];
  const d = (i) => 'ab'.repeat(31) + String(i).padStart(2, '0');
  const t = tokens(40, 4);
  const two = await blockKeys(t, spec, { prompt_embeds_digests: [d(0), d(1)] });
  for (const n of [3, 4]) {
    const digests = Array.from({ length: n }, (_, i) => d(i));
    assert.deepEqual(await blockKeys(t, spec, { prompt_embeds_digests: digests }), two);
  }
  await assert.rejects(blockKeys(t, spec, { prompt_embeds_digests: [d(0)] }), {
    code: 'InvalidArgument',
  });
  await assert.rejects(blockKeys(t, spec, { prompt_embeds_digests: ['abcd', 'abcd'] }), {
    code: 'InvalidArgument',
  });
});

test('vLLM groups: a group block key is the hash-unit key at its last unit (§2.5)', async () => {
  const spec = specs['vllm/sha256_cbor@0.31'];
  const t = tokens(16 * 9 + 3, 9);
  const units = await blockKeys(t, spec);
  const g1 = await blockKeys(t, spec, { group: 1 }); // 32-token blocks
  const g2 = await blockKeys(t, spec, { group: 2 }); // 64-token blocks
  assert.deepEqual(g1, [units[1], units[3], units[5], units[7]]);
  assert.deepEqual(g2, [units[3], units[7]]);
});

test('Dynamo: salt and adapter mix into every block; processor hashes in either case', async () => {
  const spec = specs['dynamo/xxh3@1.6'];
  const t = tokens(48, 6);
  const plain = await blockKeys(t, spec);
  const salted = await blockKeys(t, spec, { cache_salt: 'ns' });
  const cont = await blockKeys(t.slice(16), spec, { cache_salt: 'ns' }, salted[0].hex);
  assert.deepEqual(cont, salted.slice(1));
  const adapterOnly = await blockKeys(t, spec, { adapter: { name: 'ad' } });
  const withPath = await blockKeys(t, spec, { adapter: { name: 'ad', path: '/p' } });
  assert.deepEqual(adapterOnly, withPath);
  for (let i = 0; i < 3; i++) {
    assert.notEqual(salted[i].hex, plain[i].hex);
    assert.notEqual(adapterOnly[i].hex, plain[i].hex);
  }
  // §4: 64 ASCII hex digits in either case map to the value of their first 16.
  const upper = await blockKeys(t, spec, { mm_items: [{ identifier: 'AB'.repeat(32), offset: 0, length: 1 }] });
  const lower = await blockKeys(t, spec, { mm_items: [{ identifier: 'ab'.repeat(32), offset: 0, length: 1 }] });
  assert.deepEqual(upper, lower);
  // Sorted ascending as u64: item order does not matter, repeats count.
  const a = { identifier: 'ff'.repeat(32), offset: 1, length: 2 };
  const b = { identifier: '01'.repeat(32), offset: 4, length: 2 };
  const ab = await blockKeys(t, spec, { mm_items: [a, b] });
  const ba = await blockKeys(t, spec, { mm_items: [{ ...b, offset: 1 }, { ...a, offset: 4 }] });
  assert.deepEqual(ab, ba);
  const twice = await blockKeys(t, spec, { mm_items: [a, { ...a, offset: 4 }] });
  const once = await blockKeys(t, spec, { mm_items: [a] });
  assert.notEqual(twice[0].hex, once[0].hex);
});

test('continuation inside a multimodal item: negative offsets need a parent (§1.1, §1.2)', async () => {
  for (const id of ['vllm/sha256_cbor@0.31', 'dynamo/xxh3@1.6', 'llmd/xxh64@c027acf']) {
    const spec = specs[id];
    const t = tokens(64, 13);
    const model = id.startsWith('llmd') ? { model: 'm' } : {};
    const whole = await blockKeys(t, spec, { ...model, mm_items: [{ identifier: 'img', offset: 5, length: 30 }] });
    for (const k of [1, 2]) {
      const ctx = { ...model, mm_items: [{ identifier: 'img', offset: 5 - 16 * k, length: 30 }] };
      assert.deepEqual(await blockKeys(t.slice(16 * k), spec, ctx, whole[k - 1].hex), whole.slice(k), id);
      await assert.rejects(blockKeys(t.slice(16 * k), spec, ctx), { code: 'InvalidArgument' });
    }
  }
});

test('llm-d: the adapter name replaces the model; salt only on block 0 of a fresh chain', async () => {
  for (const id of ['llmd/cbor-fnv64@0.10', 'llmd/xxh64@c027acf']) {
    const spec = specs[id];
    const t = tokens(32, 8);
    const asModel = await blockKeys(t, spec, { model: 'ad' });
    const asAdapter = await blockKeys(t, spec, { model: 'other', adapter: { name: 'ad', path: '/p' } });
    assert.deepEqual(asAdapter, asModel);
    const salted = await blockKeys(t, spec, { model: 'm', cache_salt: 's' });
    const cont = await blockKeys(t.slice(16), spec, { model: 'm', cache_salt: 's' }, salted[0].hex);
    assert.deepEqual(cont, salted.slice(1));
    await assert.rejects(blockKeys(t, spec, {}), { code: 'InvalidArgument' });
  }
});

test('SGLang: event key is the first 8 digest bytes as a signed int64', async () => {
  const keys = await blockKeys(tokens(64, 12), specs['sglang/sha256@0.5.23']);
  for (const k of keys) {
    assert.equal(k.eventKey, Buffer.from(k.digest).readBigInt64BE(0));
  }
});
