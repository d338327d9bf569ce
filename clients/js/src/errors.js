/**
 * Error classes of the key client. `code` names the category the vector files use
 * ("InvalidArgument", "Unsupported") plus "NotFound" for unknown profile ids and
 * "FailedPrecondition" for specs that contradict their profile.
 */

export class KeyError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = this.constructor.name;
    /** @type {string} */
    this.code = this.constructor.name;
  }
}

/** The caller sent a value that is malformed or outside what the profile allows. */
export class InvalidArgument extends KeyError {}

/** The input is well formed but the profile (or this client) cannot key it. */
export class Unsupported extends KeyError {}

/** A well-formed spec contradicts its profile, or its digests do not recompute (§1.4, §7). */
export class FailedPrecondition extends KeyError {}

/** The profile id or version is not known to this client. */
export class NotFound extends KeyError {}
