/**
 * Reconnect delays: exponential backoff with full jitter (a uniformly random wait between 0
 * and the capped exponential), so that clients dropped together do not return together.
 */
export interface BackoffOptions {
  /** The cap of the first wait, in ms (default 500). */
  readonly initialDelayMs?: number;
  /** The largest cap, in ms (default 30000). */
  readonly maxDelayMs?: number;
}

export class Backoff {
  private attempt = 0;
  private readonly initial: number;
  private readonly max: number;

  constructor(
    options: BackoffOptions = {},
    private readonly random: () => number = Math.random,
  ) {
    this.initial = Math.max(1, options.initialDelayMs ?? 500);
    this.max = Math.max(this.initial, options.maxDelayMs ?? 30_000);
  }

  /** The cap of the next wait: initial × 2^attempt, at most max. */
  get cap(): number {
    // 2^attempt overflows to Infinity long after it passed max; min() keeps it finite.
    return Math.min(this.max, this.initial * 2 ** this.attempt);
  }

  /** The wait before the next attempt; each call doubles the cap for the one after. */
  next(): number {
    const delay = Math.floor(this.random() * this.cap);
    this.attempt += 1;
    return delay;
  }

  /** A connection held: start again from the initial cap. */
  reset(): void {
    this.attempt = 0;
  }
}
