/**
 * NVIDIA Dynamo 1.6 KV-router block hashes (docs/cache-keys.md §4): XXH3-64 local block hashes
 * under a seed mixed from 1337, the adapter name and the cache namespace, chained into
 * sequence hashes.
 */

import { InvalidArgument, Unsupported } from './errors.js';
import { concat, readU64be, u32leTokens, u64be, u64le, utf8 } from './bytes.js';
import { xxh3_64With } from './hashes.js';
import { overlapping } from './context.js';

const BASE_SEED = 1337n;
// §4: exactly 64 ASCII hex digits, either case, read as a vLLM processor hash.
const PROCESSOR_HASH = /^[0-9a-fA-F]{64}$/;

/**
 * @param {number[]} tokens
 * @param {import('./spec.js').Spec} spec
 * @param {import('./context.js').KeyContext} ctx
 */
export async function dynamoUnitKeys(tokens, spec, ctx) {
  const id = spec.profile.id;
  if (ctx.prompt_embeds_digests) throw new Unsupported(`${id}: prompt embeddings are not supported`);
  if (ctx.parent && ctx.parent.length !== 8) {
    throw new InvalidArgument(
      `context.parent: expected the 8-byte big-endian sequence hash, got ${ctx.parent.length} bytes`,
    );
  }
  const seed0 = await xxh3_64With(0n);
  let seed = BASE_SEED;
  // Empty names and salts are refused by the context checks (§1.1), so "given" is enough here.
  if (ctx.adapter) seed += seed0(utf8(ctx.adapter.name));
  if (ctx.cache_salt !== undefined) {
    seed += (await xxh3_64With(1n))(utf8(ctx.cache_salt));
  }
  seed = BigInt.asUintN(64, seed);
  const local = await xxh3_64With(seed);
  const chain = await xxh3_64With(BASE_SEED);
  const mm = (identifier) =>
    PROCESSOR_HASH.test(identifier) ? BigInt(`0x${identifier.slice(0, 16)}`) : seed0(utf8(identifier));

  const U = spec.hashUnit;
  const n = Math.floor(tokens.length / U);
  const items = ctx.mm_items ?? [];
  const body = u32leTokens(tokens);
  const out = new Array(n);
  let prev = ctx.parent ? readU64be(ctx.parent) : null;
  for (let i = 0; i < n; i++) {
    const start = i * U;
    const tokenBytes = body.subarray(start * 4, (start + U) * 4);
    // Ascending as unsigned 64-bit integers, repeats kept (§4).
    const hashes = overlapping(items, start, start + U)
      .map((m) => mm(m.identifier))
      .sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    const data = hashes.length ? concat([tokenBytes, ...hashes.map(u64le)]) : tokenBytes;
    const h = local(data);
    const seq = prev === null ? h : chain(concat([u64le(prev), u64le(h)]));
    out[i] = { digest: u64be(seq), eventKey: seq };
    prev = seq;
  }
  return out;
}
