/**
 * JSON with exact integers, and the canonical JSON the spec digests use.
 *
 * Event keys are 64-bit integers, beyond what JSON.parse keeps exact (2^53), so `parse` reads
 * every integer literal outside the safe range as a bigint. `canonical` writes the form of
 * docs/cache-keys.md §7: keys sorted, no whitespace, UTF-8.
 */

import { InvalidArgument } from './errors.js';

/**
 * Parse JSON text; integers beyond Number.MAX_SAFE_INTEGER become bigints.
 * @param {string} text
 */
export function parse(text) {
  let i = 0;
  const fail = (what) => {
    throw new InvalidArgument(`JSON: ${what} at offset ${i}`);
  };
  const ws = () => {
    while (i < text.length) {
      const c = text.charCodeAt(i);
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) i++;
      else break;
    }
  };
  const value = () => {
    ws();
    const c = text[i];
    if (c === '{') {
      i++;
      const obj = {};
      ws();
      if (text[i] === '}') {
        i++;
        return obj;
      }
      for (;;) {
        ws();
        if (text[i] !== '"') fail('expected a string key');
        const k = string();
        ws();
        if (text[i++] !== ':') fail("expected ':'");
        Object.defineProperty(obj, k, {
          value: value(),
          enumerable: true,
          writable: true,
          configurable: true,
        });
        ws();
        if (text[i] === ',') i++;
        else if (text[i] === '}') {
          i++;
          return obj;
        } else fail("expected ',' or '}'");
      }
    }
    if (c === '[') {
      i++;
      const arr = [];
      ws();
      if (text[i] === ']') {
        i++;
        return arr;
      }
      for (;;) {
        arr.push(value());
        ws();
        if (text[i] === ',') i++;
        else if (text[i] === ']') {
          i++;
          return arr;
        } else fail("expected ',' or ']'");
      }
    }
    if (c === '"') return string();
    if (text.startsWith('true', i)) {
      i += 4;
      return true;
    }
    if (text.startsWith('false', i)) {
      i += 5;
      return false;
    }
    if (text.startsWith('null', i)) {
      i += 4;
      return null;
    }
    const m = /^-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/.exec(text.slice(i, i + 400));
    if (!m) fail('unexpected character');
    i += m[0].length;
    if (m[1] === undefined && m[2] === undefined) {
      const n = Number(m[0]);
      return Number.isSafeInteger(n) ? n : BigInt(m[0]);
    }
    return Number(m[0]);
  };
  const string = () => {
    const start = i;
    i++;
    for (;;) {
      const c = text[i];
      if (c === undefined) fail('unterminated string');
      if (c === '\\') i += 2;
      else if (c === '"') break;
      else i++;
    }
    i++;
    return JSON.parse(text.slice(start, i));
  };
  const result = value();
  ws();
  if (i !== text.length) fail('trailing characters');
  return result;
}

/**
 * Canonical JSON: object keys sorted by code point, separators "," and ":", strings with
 * non-ASCII characters written as UTF-8 (not escaped). Only integers are allowed as numbers,
 * since float formatting differs between languages.
 * @param {unknown} value
 * @returns {string}
 */
export function canonical(value) {
  if (value === null) return 'null';
  if (value === true) return 'true';
  if (value === false) return 'false';
  if (typeof value === 'bigint') return value.toString();
  if (typeof value === 'number') {
    if (!Number.isInteger(value)) {
      throw new InvalidArgument(`canonical JSON: non-integer number ${value} is not supported`);
    }
    return String(value);
  }
  if (typeof value === 'string') return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  if (typeof value === 'object') {
    const keys = Object.keys(value).sort(byCodePoint);
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(',')}}`;
  }
  throw new InvalidArgument(`canonical JSON: cannot write a ${typeof value}`);
}

function byCodePoint(a, b) {
  const x = [...a];
  const y = [...b];
  for (let k = 0; k < Math.min(x.length, y.length); k++) {
    const d = x[k].codePointAt(0) - y[k].codePointAt(0);
    if (d !== 0) return d;
  }
  return x.length - y.length;
}
