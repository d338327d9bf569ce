/**
 * llm-d router request keys (docs/cache-keys.md §5): `cbor-fnv64` (FNV-1a-64 over canonical
 * CBOR) and `xxh64`, chained from a root derived from initHash and the model (or adapter)
 * name; multimodal identifiers and the block-0 cache salt as extra features.
 */

import { InvalidArgument, Unsupported } from './errors.js';
import { concat, readU64be, u32leTokens, u64be, u64le, utf8 } from './bytes.js';
import { encode } from './cbor.js';
import { fnv1a64, xxh64Seed0 } from './hashes.js';
import { overlapping } from './context.js';

/** XXH64 of u64le(p) || u32le tokens || (u64le(len) || utf8 s)... (§5.2). */
function xxhFrame(xxh, p, tokenBytes, strs) {
  const parts = [u64le(p), tokenBytes];
  for (const s of strs) {
    const b = utf8(s);
    parts.push(u64le(BigInt(b.length)), b);
  }
  return xxh(concat(parts));
}

/**
 * @param {number[]} tokens
 * @param {import('./spec.js').Spec} spec
 * @param {import('./context.js').KeyContext} ctx
 */
export async function llmdUnitKeys(tokens, spec, ctx) {
  const { profile } = spec;
  if (ctx.prompt_embeds_digests) throw new Unsupported(`${profile.id}: prompt embeddings are not supported`);
  if (ctx.model === undefined && spec.requiredContext.includes('model')) {
    throw new InvalidArgument(
      `${profile.id}: context.model is required (llm-d hashes the request's model name into the root)`,
    );
  }
  if (ctx.parent && ctx.parent.length !== 8) {
    throw new InvalidArgument(`context.parent: expected the 8-byte big-endian key, got ${ctx.parent.length} bytes`);
  }
  // llm-d puts the LoRA name where the model name goes.
  const model = ctx.adapter ? ctx.adapter.name : ctx.model;
  const initHash = readU64be(spec.root);
  const isXxh = profile.algorithm === 'xxh64';
  const xxh = isXxh ? await xxh64Seed0() : null;

  let prev;
  if (ctx.parent) prev = readU64be(ctx.parent);
  else if (isXxh) prev = xxhFrame(xxh, initHash, new Uint8Array(0), [model]);
  else prev = fnv1a64(encode([initHash, null, model]));

  const U = spec.hashUnit;
  const n = Math.floor(tokens.length / U);
  const items = ctx.mm_items ?? [];
  const body = isXxh ? u32leTokens(tokens) : null;
  const out = new Array(n);
  for (let i = 0; i < n; i++) {
    const start = i * U;
    const extras = overlapping(items, start, start + U).map((m) => m.identifier);
    if (i === 0 && !ctx.parent && ctx.cache_salt !== undefined) extras.push(ctx.cache_salt);
    let key;
    if (isXxh) {
      key = xxhFrame(xxh, prev, body.subarray(start * 4, (start + U) * 4), extras);
    } else {
      const e = extras.length ? extras.map((x) => ({ Hash: x })) : null;
      key = fnv1a64(encode([prev, tokens.slice(start, start + U), e]));
    }
    out[i] = { digest: u64be(key), eventKey: key };
    prev = key;
  }
  return out;
}
