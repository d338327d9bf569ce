/**
 * Key inputs (docs/cache-keys.md §1.1): token ids and the optional key context, validated and
 * normalized. Accepts the JSON form the vector files use (bytes as hex) and native values
 * (Uint8Array for bytes).
 */

import { InvalidArgument } from './errors.js';
import { fromHex } from './bytes.js';

const TWO32 = 2 ** 32;

/**
 * Token ids: integers in [0, 2^32).
 * @param {ArrayLike<number | bigint>} tokens
 * @returns {number[]}
 */
export function checkTokens(tokens) {
  if (tokens === null || typeof tokens !== 'object' || typeof tokens.length !== 'number') {
    throw new InvalidArgument('tokens: expected an array of token ids');
  }
  const out = new Array(tokens.length);
  for (let i = 0; i < tokens.length; i++) {
    let t = tokens[i];
    if (typeof t === 'bigint' && t >= 0n && t < 2n ** 32n) t = Number(t);
    if (!Number.isInteger(t) || t < 0 || t >= TWO32) {
      throw new InvalidArgument(
        `tokens[${i}] = ${String(t)}: token ids must be integers in [0, 2^32)`,
      );
    }
    out[i] = t;
  }
  return out;
}

function bytesOf(value, what) {
  if (value instanceof Uint8Array) return value;
  if (typeof value === 'string') return fromHex(value, what);
  throw new InvalidArgument(`${what}: expected hex or a Uint8Array, got ${typeof value}`);
}

function wellFormed(value, what) {
  if (typeof value !== 'string') {
    throw new InvalidArgument(`${what}: expected a string, got ${JSON.stringify(value)}`);
  }
  if (!value.isWellFormed()) {
    throw new InvalidArgument(`${what}: contains a lone surrogate (not encodable as UTF-8)`);
  }
  return value;
}

function nonEmpty(value, what) {
  wellFormed(value, what);
  if (value === '') throw new InvalidArgument(`${what}: must not be empty; omit the field instead`);
  return value;
}

/**
 * Cache salt as vLLM 0.33 `validate_cache_salt` accepts it (§1.1): non-empty, at most 128
 * code points, none of '@', '/', '\\', NUL.
 * @param {string} salt
 */
export function checkCacheSalt(salt) {
  wellFormed(salt, 'cache_salt');
  const points = [...salt].length;
  if (points === 0 || points > 128) {
    throw new InvalidArgument(
      `cache_salt: must be 1 to 128 characters, got ${points}; omit the field for no salt`,
    );
  }
  const bad = /[@/\\\0]/.exec(salt);
  if (bad) {
    throw new InvalidArgument(
      `cache_salt: contains ${JSON.stringify(bad[0])}; '@', '/', '\\\\' and NUL are not allowed`,
    );
  }
  return salt;
}

const FIELDS = new Set([
  'model',
  'adapter',
  'cache_salt',
  'mm_items',
  'prompt_embeds_digests',
  'group',
  'parent',
]);

/**
 * Validate a key context. Absent fields (undefined or null) are left out.
 * @param {Record<string, any> | undefined | null} context
 * @returns {KeyContext}
 */
export function checkContext(context) {
  const ctx = context ?? {};
  if (typeof ctx !== 'object' || Array.isArray(ctx)) {
    throw new InvalidArgument('context: expected an object');
  }
  for (const k of Object.keys(ctx)) {
    if (!FIELDS.has(k)) {
      throw new InvalidArgument(
        `context: unknown field ${JSON.stringify(k)}; known fields: ${[...FIELDS].join(', ')}`,
      );
    }
  }
  const out = {};
  // §1.1: a field given as an empty string is refused, never read as absent.
  if (ctx.model != null) out.model = nonEmpty(ctx.model, 'context.model');
  if (ctx.adapter != null) {
    const a = ctx.adapter;
    if (typeof a !== 'object') throw new InvalidArgument('context.adapter: expected {name, path?}');
    const name = nonEmpty(a.name, 'context.adapter.name');
    out.adapter = { name, path: a.path == null ? null : nonEmpty(a.path, 'context.adapter.path') };
  }
  if (ctx.cache_salt != null) out.cache_salt = checkCacheSalt(ctx.cache_salt);
  if (ctx.mm_items != null) {
    if (!Array.isArray(ctx.mm_items)) throw new InvalidArgument('context.mm_items: expected a list');
    out.mm_items = ctx.mm_items.map((item, i) => {
      const what = `context.mm_items[${i}]`;
      const identifier = nonEmpty(item?.identifier, `${what}.identifier`);
      const { offset, length } = item;
      if (!Number.isSafeInteger(offset)) {
        throw new InvalidArgument(`${what}.offset: expected an integer, got ${JSON.stringify(offset)}`);
      }
      if (!Number.isSafeInteger(length) || length < 1) {
        throw new InvalidArgument(`${what}.length: expected an integer >= 1, got ${JSON.stringify(length)}`);
      }
      return { identifier, offset, length };
    });
    // §1.1: a negative offset is an item that began before a continuation's first token, so
    // it needs a parent.
    const negative = out.mm_items.findIndex((m) => m.offset < 0);
    if (negative >= 0 && ctx.parent == null) {
      throw new InvalidArgument(
        `context.mm_items[${negative}].offset: ${out.mm_items[negative].offset} is negative, ` +
          'which is allowed only with a parent (an item that began before the first given token)',
      );
    }
    for (let i = 1; i < out.mm_items.length; i++) {
      const prev = out.mm_items[i - 1];
      if (out.mm_items[i].offset < prev.offset + prev.length) {
        throw new InvalidArgument(
          `context.mm_items[${i}] starts at ${out.mm_items[i].offset}, inside or before item ${i - 1} ` +
            `(${prev.offset}+${prev.length}); items must be sorted by offset and must not overlap`,
        );
      }
    }
  }
  if (ctx.prompt_embeds_digests != null) {
    if (!Array.isArray(ctx.prompt_embeds_digests)) {
      throw new InvalidArgument('context.prompt_embeds_digests: expected a list');
    }
    out.prompt_embeds_digests = ctx.prompt_embeds_digests.map((d, i) => {
      const b = bytesOf(d, `context.prompt_embeds_digests[${i}]`);
      if (b.length !== 32) {
        throw new InvalidArgument(
          `context.prompt_embeds_digests[${i}]: expected a 32-byte SHA-256 digest, got ${b.length} bytes`,
        );
      }
      return b;
    });
  }
  // An empty list means none (§1.1).
  if (out.mm_items?.length === 0) delete out.mm_items;
  if (out.prompt_embeds_digests?.length === 0) delete out.prompt_embeds_digests;
  if (ctx.group != null) {
    if (!Number.isSafeInteger(ctx.group) || ctx.group < 0) {
      throw new InvalidArgument(`context.group: expected a group index, got ${JSON.stringify(ctx.group)}`);
    }
    out.group = ctx.group;
  }
  if (ctx.parent != null) {
    out.parent = bytesOf(ctx.parent, 'context.parent');
    if (out.parent.length === 0) throw new InvalidArgument('context.parent: must not be empty');
  }
  return out;
}

/**
 * Items overlapping the block [start, end) (§1.2 overlap rule), in item order.
 * @param {Array<{identifier: string, offset: number, length: number}>} items
 */
export function overlapping(items, start, end) {
  return items.filter((m) => m.offset < end && m.offset + m.length > start);
}

/**
 * @typedef {{model?: string, adapter?: {name: string, path: string | null}, cache_salt?: string,
 *   mm_items?: Array<{identifier: string, offset: number, length: number}>,
 *   prompt_embeds_digests?: Uint8Array[], group?: number, parent?: Uint8Array}} KeyContext
 */
