/**
 * Hash primitives: SHA-256 (node:crypto), XXH3-64 with any 64-bit seed, XXH3-128 and XXH64
 * (hash-wasm, pure WebAssembly embedded in the npm package, no native build), FNV-1a-64
 * (BigInt, here).
 *
 * hash-wasm creates hashers asynchronously; once created a hasher is synchronous, so hashers
 * are created once per seed and cached (Dynamo derives a seed per adapter/namespace).
 */

import { createHash } from 'node:crypto';
import { createXXHash3, createXXHash128, createXXHash64 } from 'hash-wasm';
import { MASK64 } from './bytes.js';

/** @param {Uint8Array} data @returns {Uint8Array} 32 bytes */
export function sha256(data) {
  return new Uint8Array(createHash('sha256').update(data).digest());
}

/** An incremental SHA-256 for callers that hash several parts. */
export function sha256Parts(parts) {
  const h = createHash('sha256');
  for (const p of parts) h.update(p);
  return new Uint8Array(h.digest());
}

const FNV_OFFSET = 0xcbf29ce484222325n;
const FNV_PRIME = 0x100000001b3n;

/** FNV-1a 64-bit. @param {Uint8Array} data @returns {bigint} */
export function fnv1a64(data) {
  let h = FNV_OFFSET;
  for (let i = 0; i < data.length; i++) {
    h = ((h ^ BigInt(data[i])) * FNV_PRIME) & MASK64;
  }
  return h;
}

const MAX_CACHED = 64;
const xxh3Cache = new Map();

function seedParts(seed) {
  const s = BigInt.asUintN(64, BigInt(seed));
  return [Number(s & 0xffffffffn), Number(s >> 32n)];
}

async function cached(cache, key, make) {
  let hasher = cache.get(key);
  if (hasher === undefined) {
    hasher = make();
    if (cache.size >= MAX_CACHED) cache.delete(cache.keys().next().value);
    cache.set(key, hasher);
  }
  return hasher;
}

/** A synchronous hash function of one fixed algorithm and seed. */
function oneShot(hasher) {
  return (data) => {
    hasher.init();
    hasher.update(data);
    return hasher.digest('binary');
  };
}

/**
 * XXH3-64 with the given 64-bit seed, as a synchronous function returning the value.
 * @param {bigint} seed
 * @returns {Promise<(data: Uint8Array) => bigint>}
 */
export async function xxh3_64With(seed) {
  const key = BigInt.asUintN(64, BigInt(seed));
  const hasher = await cached(xxh3Cache, key, () => createXXHash3(...seedParts(key)));
  const run = oneShot(await hasher);
  return (data) => {
    const d = run(data);
    // hash-wasm gives the canonical (big-endian) digest.
    return new DataView(d.buffer, d.byteOffset, 8).getBigUint64(0, false);
  };
}

let xxh128 = null;
let xxh64 = null;

/**
 * XXH3-128 without seed; canonical big-endian 16 bytes (xxhash.xxh3_128_digest).
 * @returns {Promise<(data: Uint8Array) => Uint8Array>}
 */
export async function xxh3_128() {
  xxh128 ??= createXXHash128(0, 0).then(oneShot);
  return xxh128;
}

/**
 * XXH64 with seed 0, as a synchronous function returning the value.
 * @returns {Promise<(data: Uint8Array) => bigint>}
 */
export async function xxh64Seed0() {
  xxh64 ??= createXXHash64(0, 0).then((h) => {
    const run = oneShot(h);
    return (data) => {
      const d = run(data);
      return new DataView(d.buffer, d.byteOffset, 8).getBigUint64(0, false);
    };
  });
  return xxh64;
}
