/**
 * vLLM prefix-cache block hashes, `*_cbor` algorithms (docs/cache-keys.md §2): the chain
 * H((parent, tokens, extra_keys or None)) at the hash unit, extra keys in the tagged (0.31+)
 * or bare (0.29/0.30) form, the root from a seed, event keys from the last 8 digest bytes.
 */

import { InvalidArgument, Unsupported } from './errors.js';
import { lastU64be } from './bytes.js';
import { encode } from './cbor.js';
import { sha256, xxh3_128 } from './hashes.js';
import { overlapping } from './context.js';

/**
 * H(obj) for the profile's algorithm: canonical CBOR, then SHA-256 or XXH3-128 (§2.1).
 * @returns {Promise<(obj: unknown) => Uint8Array>}
 */
async function hasher(profile) {
  if (profile.serialization !== 'cbor_canonical') {
    throw new Unsupported(`${profile.id}: pickle serialization is not client-computable`);
  }
  if (profile.digest === 'sha256') return (obj) => sha256(encode(obj));
  const x = await xxh3_128();
  return (obj) => x(encode(obj));
}

/**
 * The root H(seed) of §2.2, seed hashed as a CBOR text string.
 * @param {Record<string, any>} profile
 * @param {string} seed
 */
export async function vllmSeedRoot(profile, seed) {
  return (await hasher(profile))(seed);
}

/**
 * Keys at the hash unit for the full blocks of `tokens`.
 * @param {number[]} tokens  validated token ids
 * @param {import('./spec.js').Spec} spec
 * @param {import('./context.js').KeyContext} ctx
 * @returns {Promise<Array<{digest: Uint8Array, eventKey: bigint}>>}
 */
export async function vllmUnitKeys(tokens, spec, ctx) {
  const { profile, hashUnit: U } = spec;
  const tagged = profile.extra_keys === 'vllm_tagged';
  const H = await hasher(profile);
  const n = Math.floor(tokens.length / U);

  if (ctx.adapter && tagged && ctx.adapter.path == null) {
    // vLLM 0.31+ keys ("lora", name, path); without the path the key cannot be known.
    throw new InvalidArgument(
      `${profile.id}: the tagged extra keys need the adapter path as the engine registered it; ` +
        'give context.adapter.path',
    );
  }
  if (ctx.parent && ctx.parent.length !== profile.digest_bytes) {
    throw new InvalidArgument(
      `context.parent: expected a ${profile.digest_bytes}-byte ${profile.digest} digest, ` +
        `got ${ctx.parent.length} bytes`,
    );
  }
  const embeds = ctx.prompt_embeds_digests;
  // §1.1: at least one digest per full block; digest i is block i's, later ones are not used.
  if (embeds && embeds.length < n) {
    throw new InvalidArgument(
      `context.prompt_embeds_digests: expected at least one digest per full hash-unit block ` +
        `(${n}), got ${embeds.length}`,
    );
  }
  const items = ctx.mm_items ?? [];
  const lora = ctx.adapter
    ? tagged
      ? ['lora', ctx.adapter.name, ctx.adapter.path]
      : ctx.adapter.name
    : undefined;

  const out = new Array(n);
  let parent = ctx.parent ?? spec.root;
  for (let i = 0; i < n; i++) {
    const start = i * U;
    const end = start + U;
    const extra = [];
    if (lora !== undefined) extra.push(lora);
    for (const m of overlapping(items, start, end)) {
      extra.push(tagged ? ['mm', m.identifier, m.offset - start] : [m.identifier, m.offset - start]);
    }
    if (ctx.cache_salt !== undefined && start === 0 && !ctx.parent) {
      extra.push(tagged ? ['cache_salt', ctx.cache_salt] : ctx.cache_salt);
    }
    if (embeds) extra.push(tagged ? ['prompt_embeds', embeds[i]] : embeds[i]);
    const digest = H([parent, tokens.slice(start, end), extra.length ? extra : null]);
    out[i] = { digest, eventKey: lastU64be(digest) };
    parent = digest;
  }
  return out;
}
