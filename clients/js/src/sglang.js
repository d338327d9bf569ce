/**
 * SGLang 0.5.23 page hashes (docs/cache-keys.md §3): SHA-256 chained over little-endian u32
 * token ids, an optional cache-salt prior, event keys from the first 8 bytes as int64.
 */

import { InvalidArgument, Unsupported } from './errors.js';
import { concat, firstI64be, u32leTokens, utf8 } from './bytes.js';
import { sha256Parts } from './hashes.js';

const SALT_PREFIX = concat([utf8('sglang-cache-salt-v1'), new Uint8Array([0])]);

/**
 * @param {number[]} tokens
 * @param {import('./spec.js').Spec} spec
 * @param {import('./context.js').KeyContext} ctx
 */
export async function sglangUnitKeys(tokens, spec, ctx) {
  const id = spec.profile.id;
  if (ctx.adapter) {
    throw new Unsupported(`${id}: SGLang keys LoRA adapters by a per-load uuid no client can know`);
  }
  if (ctx.mm_items?.length) {
    throw new Unsupported(`${id}: SGLang carries multimodal items as pad token ids; pass them as tokens`);
  }
  if (ctx.prompt_embeds_digests) throw new Unsupported(`${id}: prompt embeddings are not supported`);
  if (ctx.parent && ctx.parent.length !== 32) {
    throw new InvalidArgument(`context.parent: expected a 32-byte page digest, got ${ctx.parent.length} bytes`);
  }
  const U = spec.hashUnit;
  const n = Math.floor(tokens.length / U);
  let prior;
  if (ctx.parent) prior = ctx.parent;
  else if (ctx.cache_salt !== undefined) prior = sha256Parts([SALT_PREFIX, utf8(ctx.cache_salt)]);
  else prior = new Uint8Array(0);
  const body = u32leTokens(tokens);
  const out = new Array(n);
  for (let i = 0; i < n; i++) {
    const digest = sha256Parts([prior, body.subarray(i * U * 4, (i + 1) * U * 4)]);
    out[i] = { digest, eventKey: firstI64be(digest) };
    prior = digest;
  }
  return out;
}
