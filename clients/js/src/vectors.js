/**
 * Run a `testvectors/*.json` file (docs/cache-keys.md §7) against this client: check the spec's
 * fingerprint and vectors digest, the vLLM seed roots, and every vector's keys, event keys or
 * expected refusal.
 */

import { readFile } from 'node:fs/promises';
import { KeyError } from './errors.js';
import { toHex } from './bytes.js';
import { parse } from './json.js';
import { canonicalDigest, parseSpec } from './spec.js';
import { blockKeys } from './keys.js';
import { vllmSeedRoot } from './vllm.js';

/**
 * Load a vector file with exact 64-bit integers.
 * @param {string} path
 */
export async function loadVectorFile(path) {
  return parse(await readFile(path, 'utf8'));
}

function sameList(a, b) {
  return a.length === b.length && a.every((x, i) => String(x) === String(b[i]));
}

/**
 * Verify a vector file (a path or its parsed JSON).
 *
 * The report says whether this client may compute keys for the spec (`ok`: profile known and
 * client-computable, fingerprint and vectors digest recompute, every check passes) and lists
 * each check. A spec this client refuses (unknown or not client-computable profile) gives
 * `ok: false` with `refused` set to the error.
 *
 * @param {string | Record<string, any>} vectorFile
 * @returns {Promise<{profile: string, ok: boolean, refused: null | {code: string, message: string},
 *   passed: number, failed: number, checks: Array<{name: string, ok: boolean, detail?: string}>}>}
 */
export async function verifyVectors(vectorFile) {
  const file = typeof vectorFile === 'string' ? await loadVectorFile(vectorFile) : vectorFile;
  const profileId = file.spec?.profile_id ?? file.profile?.id;
  const report = { profile: profileId, ok: false, refused: null, passed: 0, failed: 0, checks: [] };
  const check = (name, ok, detail) => {
    report.checks.push(detail === undefined ? { name, ok } : { name, ok, detail });
    if (ok) report.passed++;
    else report.failed++;
  };

  let spec;
  try {
    spec = await parseSpec(file.spec);
  } catch (err) {
    if (!(err instanceof KeyError)) throw err;
    report.refused = { code: err.code, message: err.message };
    return report;
  }
  const digest = canonicalDigest(file.vectors);
  check('vectors_digest', digest === file.spec.vectors_digest, `${digest} vs ${file.spec.vectors_digest}`);

  if (spec.profile.family === 'vllm') {
    for (const r of file.roots ?? []) {
      const got = toHex(await vllmSeedRoot(spec.profile, r.seed));
      check(`root:${r.seed}`, got === r.root_hex, got === r.root_hex ? undefined : `got ${got}, expected ${r.root_hex}`);
    }
  }

  for (const v of file.vectors) {
    try {
      const keys = await blockKeys(v.tokens, spec, v.context);
      if (v.error !== undefined) {
        check(v.name, false, `expected ${v.error}, got ${keys.length} keys`);
        continue;
      }
      const hex = keys.map((k) => k.hex);
      const events = keys.map((k) => k.eventKey);
      if (!sameList(hex, v.keys)) check(v.name, false, `keys differ: got ${hex.join(',')}`);
      else if (!sameList(events, v.event_keys)) check(v.name, false, `event keys differ: got ${events.join(',')}`);
      else check(v.name, true);
    } catch (err) {
      if (!(err instanceof KeyError)) throw err;
      if (v.error === err.code) check(v.name, true);
      else check(v.name, false, `${err.code}: ${err.message}` + (v.error ? ` (expected ${v.error})` : ''));
    }
  }
  report.ok = report.failed === 0;
  return report;
}
