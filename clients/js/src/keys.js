/**
 * Block keys for a spec and context: validates inputs, computes the chain at the hash unit with
 * the profile's engine family, and picks a group's keys (docs/cache-keys.md §1.2, §2.5).
 */

import { InvalidArgument, Unsupported } from './errors.js';
import { toHex } from './bytes.js';
import { checkContext, checkTokens } from './context.js';
import { parseSpec } from './spec.js';
import { vllmUnitKeys } from './vllm.js';
import { sglangUnitKeys } from './sglang.js';
import { dynamoUnitKeys } from './dynamo.js';
import { llmdUnitKeys } from './llmd.js';

const FAMILIES = {
  vllm: vllmUnitKeys,
  sglang: sglangUnitKeys,
  dynamo: dynamoUnitKeys,
  llmd: llmdUnitKeys,
};

/**
 * Keys of the full blocks of `tokens`, chained from the spec's root or from `parent`.
 *
 * @param {ArrayLike<number | bigint>} tokens  token ids in [0, 2^32)
 * @param {Record<string, any>} spec  a spec's JSON form, or the result of parseSpec/buildSpec
 * @param {Record<string, any>} [context]  §1.1 fields (model, adapter, cache_salt, mm_items,
 *   prompt_embeds_digests, group, parent); bytes as hex strings or Uint8Array
 * @param {string | Uint8Array} [parent]  digest of the block before tokens[0]; same as
 *   context.parent
 * @returns {Promise<Array<{digest: Uint8Array, hex: string, eventKey: bigint}>>}
 */
export async function blockKeys(tokens, spec, context = undefined, parent = undefined) {
  const s = await parseSpec(spec);
  const ids = checkTokens(tokens);
  let raw = context ?? {};
  if (parent !== undefined && parent !== null) {
    if (raw.parent != null && raw.parent !== parent) {
      throw new InvalidArgument('parent given twice (argument and context.parent) with different values');
    }
    raw = { ...raw, parent };
  }
  const ctx = checkContext(raw);
  const family = FAMILIES[s.profile.family];
  if (family === undefined) throw new Unsupported(`no implementation for ${s.profile.id}`);
  // The family refuses what it cannot key (Unsupported) before the group index is checked
  // (InvalidArgument): §1.4 steps 2 and 3.
  const units = await family(ids, s, ctx);
  const groupIndex = ctx.group ?? s.groups[0].index;
  const group = s.groups.find((g) => g.index === groupIndex);
  if (group === undefined) {
    throw new InvalidArgument(
      `context.group ${groupIndex} is not a group of the spec (groups: ${s.groups.map((g) => g.index).join(', ')})`,
    );
  }
  const k = group.blockSize / s.hashUnit;
  const picked = k === 1 ? units : [];
  if (k > 1) {
    // A group block's key is the hash-unit key at its last unit (§2.5).
    for (let j = 0; (j + 1) * k <= units.length; j++) picked.push(units[(j + 1) * k - 1]);
  }
  return picked.map((u) => ({ digest: u.digest, hex: toHex(u.digest), eventKey: u.eventKey }));
}
