// All 50 block hashes a real vLLM engine published (tests/data/vectors/vllm-kv-events: Qwen3-0.6B,
// PYTHONHASHSEED=42, block 16, sha256_cbor, bare-era extra keys; base and adapter "Alice"),
// reproduced from the token ids with vllm/sha256_cbor@0.29.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { blockKeys, buildSpec, parseJson } from '../src/index.js';
import { KV_EVENTS_DIR } from './paths.js';

for (const name of ['kv_event_base.json', 'kv_event_lora.json']) {
  test(`vLLM engine capture ${name}: every block hash`, async () => {
    const capture = parseJson(readFileSync(join(KV_EVENTS_DIR, name), 'utf8'));
    assert.equal(capture.hash_seed, '42');
    const spec = await buildSpec({
      profile: 'vllm/sha256_cbor@0.29',
      blockSize: capture.block_size,
      rootSeed: capture.hash_seed,
    });
    const context = capture.lora_name ? { adapter: { name: capture.lora_name } } : {};
    if (name === 'kv_event_lora.json') assert.equal(capture.lora_name, 'Alice');
    const keys = await blockKeys(capture.token_ids, spec, context);
    assert.equal(capture.block_hashes.length, 25);
    assert.deepEqual(
      keys.map((k) => k.eventKey),
      capture.block_hashes.map((h) => BigInt(h)),
    );
  });
}
