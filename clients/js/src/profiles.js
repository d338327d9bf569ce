/**
 * The profiles this client knows, as docs/cache-keys.md lists them (table at the top and
 * §§2–5). Each entry pins the spec fields a deployment's spec must carry for that profile, so
 * a spec that claims a known id with other parameters is refused instead of guessed.
 */

import { NotFound, Unsupported } from './errors.js';

const VLLM_ALGOS = {
  sha256_cbor: { digest: 'sha256', serialization: 'cbor_canonical', digestBytes: 32 },
  xxhash_cbor: { digest: 'xxh3_128', serialization: 'cbor_canonical', digestBytes: 16 },
  sha256: { digest: 'sha256', serialization: 'pickle_protocol5', digestBytes: 32 },
  xxhash: { digest: 'xxh3_128', serialization: 'pickle_protocol5', digestBytes: 16 },
};

/** @type {Array<Record<string, any>>} */
const PROFILES = [];

for (const [version, era] of [
  ['0.31', 'vllm_tagged'],
  ['0.29', 'vllm_bare'],
]) {
  for (const [algorithm, a] of Object.entries(VLLM_ALGOS)) {
    const cbor = a.serialization === 'cbor_canonical';
    PROFILES.push({
      id: `vllm/${algorithm}@${version}`,
      family: 'vllm',
      engine: 'vllm',
      algorithm,
      engine_version: version,
      digest: a.digest,
      serialization: a.serialization,
      event_encoding: 'u64_be_last8',
      extra_keys: era,
      digest_bytes: a.digestBytes,
      client_computable: cbor,
      reason: cbor ? null : 'pickle serialization depends on CPython object identity (§2.6)',
    });
  }
}

PROFILES.push(
  {
    id: 'sglang/sha256@0.5.23',
    family: 'sglang',
    engine: 'sglang',
    algorithm: 'sha256',
    engine_version: '0.5.23',
    digest: 'sha256',
    serialization: 'u32_le_tokens',
    event_encoding: 'i64_be_first8',
    extra_keys: 'sglang_salt_seed',
    digest_bytes: 32,
    client_computable: true,
  },
  {
    id: 'dynamo/xxh3@1.6',
    family: 'dynamo',
    engine: 'dynamo',
    algorithm: 'xxh3',
    engine_version: '1.6',
    digest: 'xxh3_64',
    serialization: 'u32_le_tokens+u64_le_sorted_mm',
    event_encoding: 'u64',
    extra_keys: 'dynamo_seed_mix',
    digest_bytes: 8,
    client_computable: true,
  },
  {
    id: 'llmd/cbor-fnv64@0.10',
    family: 'llmd',
    engine: 'llmd',
    algorithm: 'cbor-fnv64',
    engine_version: '0.10',
    digest: 'fnv1a64',
    serialization: 'cbor_canonical',
    event_encoding: 'u64',
    extra_keys: 'llmd_mm_ids_salt_block0',
    digest_bytes: 8,
    client_computable: true,
  },
  {
    id: 'llmd/xxh64@c027acf',
    family: 'llmd',
    engine: 'llmd',
    algorithm: 'xxh64',
    engine_version: 'c027acf',
    digest: 'xxh64',
    serialization: 'u64_le+u32_le_tokens+len_prefixed_extras',
    event_encoding: 'u64',
    extra_keys: 'llmd_mm_ids_salt_block0',
    digest_bytes: 8,
    client_computable: true,
  },
);

const BY_ID = new Map(PROFILES.map((p) => [p.id, Object.freeze(p)]));

/** Ids of every profile known to this client. */
export function knownIds() {
  return [...BY_ID.keys()];
}

/**
 * Every known profile: id, engine, algorithm, engine_version, client_computable.
 * @returns {Array<{id: string, engine: string, algorithm: string, engine_version: string,
 *   client_computable: boolean, digest_bytes: number}>}
 */
export function listProfiles() {
  return PROFILES.map((p) => ({
    id: p.id,
    engine: p.engine,
    algorithm: p.algorithm,
    engine_version: p.engine_version,
    digest_bytes: p.digest_bytes,
    client_computable: p.client_computable,
  }));
}

/**
 * The profile with this id; unknown ids are refused, naming the known ones.
 * @param {string} id
 */
export function getProfile(id) {
  const p = BY_ID.get(id);
  if (p === undefined) {
    throw new NotFound(
      `unknown cache-key profile ${JSON.stringify(id)}; this client knows ${knownIds().join(', ')}` +
        ' (an unknown id or version must be computed by the engine: ComputeCacheKeys)',
    );
  }
  return p;
}

/**
 * The profile with this id, refused unless a client may compute it.
 * @param {string} id
 */
export function getComputableProfile(id) {
  const p = getProfile(id);
  if (!p.client_computable) {
    const ok = PROFILES.filter((q) => q.client_computable).map((q) => q.id);
    throw new Unsupported(
      `profile ${id} is not client-computable: ${p.reason}; ask the engine (ComputeCacheKeys). ` +
        `Client-computable profiles: ${ok.join(', ')}`,
    );
  }
  return p;
}
