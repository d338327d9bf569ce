/**
 * Cache-key specs (docs/cache-keys.md §7): parse and check a spec's JSON form against the
 * profile it names, recompute its fingerprint, and build a spec from deployment parameters.
 */

import { FailedPrecondition, InvalidArgument, Unsupported } from './errors.js';
import { fromHex, toHex, utf8 } from './bytes.js';
import { canonical } from './json.js';
import { sha256, fnv1a64, xxh64Seed0 } from './hashes.js';
import { getComputableProfile, getProfile } from './profiles.js';
import { vllmSeedRoot } from './vllm.js';

/** SHA-256 hex of the canonical JSON of a value (§7). @param {unknown} value */
export function canonicalDigest(value) {
  return toHex(sha256(utf8(canonical(value))));
}

/** The fingerprint a spec's JSON form should carry (§7). @param {Record<string, any>} json */
export function specFingerprint(json) {
  const body = {};
  for (const [k, v] of Object.entries(json)) {
    if (k !== 'vectors' && k !== 'fingerprint') body[k] = v;
  }
  return canonicalDigest(body);
}

function requireField(json, name) {
  if (!(name in json)) throw new InvalidArgument(`spec: missing field ${JSON.stringify(name)}`);
  return json[name];
}

function positiveInt(value, what) {
  if (!Number.isSafeInteger(value) || value < 1) {
    throw new InvalidArgument(`${what}: expected a positive integer, got ${JSON.stringify(value)}`);
  }
  return value;
}

/** Root of a spec, checked against its derivation where it can be recomputed. */
async function resolveRoot(profile, json) {
  const derivation = requireField(json, 'root_derivation');
  const rootHex = requireField(json, 'root_hex');
  if (typeof derivation !== 'string') {
    throw new InvalidArgument(`spec: root_derivation must be a string, got ${JSON.stringify(derivation)}`);
  }
  if (profile.family === 'sglang' || profile.family === 'dynamo') {
    if (derivation !== 'none' || rootHex !== '') {
      throw new FailedPrecondition(
        `spec: ${profile.id} has no root; expected root_derivation "none" and root_hex "", ` +
          `got ${JSON.stringify(derivation)} / ${JSON.stringify(rootHex)}`,
      );
    }
    return { root: null, seed: null };
  }
  const root = fromHex(rootHex, 'spec root_hex');
  if (profile.family === 'llmd') {
    // root_hex holds llm-d's initHash (§5): 8 big-endian bytes.
    // §5, §7: llm-d roots are always "seed:<s>", root_hex = initHash(s) as 8 bytes.
    if (!derivation.startsWith('seed:')) {
      throw new FailedPrecondition(
        `spec: root_derivation ${JSON.stringify(derivation)} is not "seed:<s>", the only llm-d derivation`,
      );
    }
    const seed = derivation.slice(5);
    const expect = await llmdInitHash(profile, seed);
    if (toHex(expect) !== toHex(root)) {
      throw new FailedPrecondition(
        `spec: root_hex ${rootHex} is not the initHash of seed ${JSON.stringify(seed)} (${toHex(expect)})`,
      );
    }
    return { root, seed };
  }
  // vLLM (§2.2)
  if (root.length < 1 || root.length > 64) {
    throw new FailedPrecondition(`spec: root_hex must be 1-64 bytes, got ${root.length}`);
  }
  let seed;
  if (derivation === 'default_seed') {
    if (profile.digest !== 'sha256') {
      throw new FailedPrecondition(
        `spec: ${profile.id} has no default root (vLLM seeds xxhash randomly); give root_seed or root_hex`,
      );
    }
    seed = 'vllm-none-hash';
  } else if (derivation.startsWith('seed:')) {
    seed = derivation.slice(5);
  } else if (derivation === 'explicit') {
    return { root, seed: null };
  } else {
    throw new FailedPrecondition(
      `spec: root_derivation ${JSON.stringify(derivation)} is not one of "default_seed", "seed:<s>", "explicit"`,
    );
  }
  const expect = await vllmSeedRoot(profile, seed);
  if (toHex(expect) !== toHex(root)) {
    throw new FailedPrecondition(
      `spec: root_hex ${rootHex} is not H(${JSON.stringify(seed)}) = ${toHex(expect)} for ${profile.id}`,
    );
  }
  return { root, seed };
}

/** llm-d initHash of a seed string (§5.1, §5.2), 8 big-endian bytes. */
export async function llmdInitHash(profile, seed) {
  const value =
    profile.algorithm === 'xxh64' ? (await xxh64Seed0())(utf8(seed)) : fnv1a64(utf8(seed));
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, value, false);
  return out;
}

const CHECKED_FIELDS = [
  'engine',
  'algorithm',
  'engine_version',
  'digest',
  'serialization',
  'event_encoding',
  'extra_keys',
];

/**
 * Parse a spec's JSON form (as `testvectors/*.json` carry it under "spec", or as
 * GetCacheKeySpec serves it) into the form the key functions use.
 *
 * Refuses unknown profiles (NotFound), non-client-computable ones (Unsupported), malformed
 * specs (InvalidArgument), and specs whose fields disagree with the profile or whose
 * fingerprint or vectors digest does not recompute (FailedPrecondition), as §1.4 and §7 say.
 *
 * @param {Record<string, any>} json
 * @returns {Promise<Spec>}
 */
export async function parseSpec(json) {
  if (json === null || typeof json !== 'object' || Array.isArray(json)) {
    throw new InvalidArgument('spec: expected a JSON object');
  }
  if (json.__parsed_spec === true) return json;
  const id = requireField(json, 'profile_id');
  getProfile(id); // NotFound first, naming the known ids
  const profile = getComputableProfile(id);
  if (json.client_computable === false) {
    throw new Unsupported(`spec for ${id} says it is not client-computable; ask the engine`);
  }
  for (const f of CHECKED_FIELDS) {
    if (f in json && json[f] !== profile[f]) {
      throw new FailedPrecondition(
        `spec: ${f} is ${JSON.stringify(json[f])} but profile ${id} has ${JSON.stringify(profile[f])}`,
      );
    }
  }
  if ('partial_block' in json && json.partial_block !== 'never_hashed') {
    throw new Unsupported(
      `spec: partial_block ${JSON.stringify(json.partial_block)} is not supported (only "never_hashed")`,
    );
  }
  const hashUnit = positiveInt(requireField(json, 'hash_unit'), 'spec hash_unit');
  const groupsJson = json.groups ?? [{ index: 0, block_size: hashUnit }];
  if (!Array.isArray(groupsJson) || groupsJson.length === 0) {
    throw new InvalidArgument('spec: groups must be a non-empty list');
  }
  const groups = groupsJson.map((g, n) => {
    const blockSize = positiveInt(g.block_size, `spec groups[${n}].block_size`);
    if (blockSize % hashUnit !== 0) {
      throw new FailedPrecondition(
        `spec: group ${g.index} block_size ${blockSize} is not a multiple of hash_unit ${hashUnit}`,
      );
    }
    if (g.derivation !== undefined && g.derivation !== 'last_hash_unit') {
      throw new Unsupported(
        `spec: group derivation ${JSON.stringify(g.derivation)} is not supported (only "last_hash_unit")`,
      );
    }
    if (g.index !== undefined && g.index !== n) {
      throw new FailedPrecondition(`spec: groups[${n}] has index ${g.index}; indexes run 0, 1, ... in order`);
    }
    return { index: n, blockSize, kind: g.kind };
  });
  if (profile.family !== 'vllm' && (groups.length !== 1 || groups[0].blockSize !== hashUnit)) {
    throw new Unsupported(
      `spec: ${id} keys one group at the hash unit; got groups ${JSON.stringify(groupsJson)}`,
    );
  }
  const { root, seed } = await resolveRoot(profile, json);
  if (json.vectors !== undefined && json.vectors_digest !== undefined) {
    const got = canonicalDigest(json.vectors);
    if (got !== json.vectors_digest) {
      throw new FailedPrecondition(
        `spec: vectors_digest ${json.vectors_digest} does not match its vectors (${got})`,
      );
    }
  }
  if (json.fingerprint !== undefined) {
    const got = specFingerprint(json);
    if (got !== json.fingerprint) {
      throw new FailedPrecondition(`spec: fingerprint ${json.fingerprint} does not recompute (${got})`);
    }
  }
  const requiredContext = json.required_context ?? [];
  // §7: the required context each profile family declares.
  const wantContext =
    profile.family === 'llmd' ? ['model'] : profile.extra_keys === 'vllm_tagged' ? ['adapter.path'] : [];
  if (!Array.isArray(requiredContext) || canonical(requiredContext) !== canonical(wantContext)) {
    throw new FailedPrecondition(
      `spec: required_context ${JSON.stringify(requiredContext)} is not ${JSON.stringify(wantContext)} for ${id}`,
    );
  }
  return Object.freeze({
    __parsed_spec: true,
    profile,
    hashUnit,
    groups: Object.freeze(groups),
    root,
    seed,
    requiredContext: Object.freeze([...requiredContext]),
    json,
  });
}

/**
 * Build a spec from deployment parameters, like `tokenkeys keys --profile ID --block-size N
 * [--root-seed S | --root-hex H]`.
 *
 * @param {{profile: string, blockSize: number, groups?: number[], hashUnit?: number,
 *   rootSeed?: string, rootHex?: string}} params  `groups` lists group block sizes (vLLM only);
 *   `hashUnit` defaults to their gcd (or `blockSize`).
 * @returns {Promise<Spec>}
 */
export async function buildSpec(params) {
  const profile = getComputableProfile(params.profile);
  const sizes = params.groups ?? [params.blockSize];
  const hashUnit = params.hashUnit ?? sizes.reduce((a, b) => gcd(a, b));
  if (params.rootSeed !== undefined && params.rootHex !== undefined) {
    throw new InvalidArgument('give rootSeed or rootHex, not both');
  }
  const json = {
    profile_id: profile.id,
    engine: profile.engine,
    algorithm: profile.algorithm,
    engine_version: profile.engine_version,
    hash_unit: hashUnit,
    groups: sizes.map((b, index) => ({ index, block_size: b, derivation: 'last_hash_unit' })),
    digest: profile.digest,
    serialization: profile.serialization,
    event_encoding: profile.event_encoding,
    extra_keys: profile.extra_keys,
    partial_block: 'never_hashed',
    client_computable: true,
  };
  if (profile.family === 'vllm') {
    if (params.rootHex !== undefined) {
      json.root_derivation = 'explicit';
      json.root_hex = params.rootHex;
    } else if (params.rootSeed !== undefined) {
      json.root_derivation = `seed:${params.rootSeed}`;
      json.root_hex = toHex(await vllmSeedRoot(profile, params.rootSeed));
    } else if (profile.digest === 'sha256') {
      json.root_derivation = 'default_seed';
      json.root_hex = toHex(await vllmSeedRoot(profile, 'vllm-none-hash'));
    } else {
      throw new InvalidArgument(
        `${profile.id} has no default root (vLLM seeds xxhash randomly): give rootSeed or rootHex`,
      );
    }
    json.required_context = profile.extra_keys === 'vllm_tagged' ? ['adapter.path'] : [];
  } else if (profile.family === 'llmd') {
    if (params.rootHex !== undefined) {
      throw new InvalidArgument(`${profile.id} derives its root from hashSeed: give rootSeed, not rootHex`);
    }
    const seed = params.rootSeed ?? '';
    json.root_derivation = `seed:${seed}`;
    json.root_hex = toHex(await llmdInitHash(profile, seed));
    json.required_context = ['model'];
  } else {
    if (params.rootSeed !== undefined || params.rootHex !== undefined) {
      throw new InvalidArgument(`${profile.id} has no root; do not give rootSeed or rootHex`);
    }
    json.root_derivation = 'none';
    json.root_hex = '';
    json.required_context = [];
  }
  return parseSpec(json);
}

function gcd(a, b) {
  positiveInt(a, 'group block size');
  positiveInt(b, 'group block size');
  while (b) [a, b] = [b, a % b];
  return a;
}

/**
 * @typedef {{profile: Record<string, any>, hashUnit: number,
 *   groups: ReadonlyArray<{index: number, blockSize: number}>, root: Uint8Array | null,
 *   seed: string | null, requiredContext: ReadonlyArray<string>, json: Record<string, any>}} Spec
 */
