/**
 * Pacing of what the client writes, so that it stays within the server's limits by itself
 * (pure logic, unit-tested alone).
 */

/**
 * Frames per second the client allows itself: a token bucket holding one second of frames.
 * The server closes a connection sending more than `gateway.frames_per_second` (2,000 by
 * default, a burst of 4,000 on top) with 4029, resends and all; staying under it is cheaper.
 */
export class FrameBudget {
  private tokens: number;
  private at: number;

  /** @param rate frames per second; 0 or less: no limit. */
  constructor(
    private readonly rate: number,
    private readonly now: () => number = Date.now,
  ) {
    this.tokens = Math.max(rate, 0);
    this.at = now();
  }

  /** Milliseconds until a frame may go (0: now). */
  wait(): number {
    if (this.rate <= 0) return 0;
    this.refill();
    return this.tokens >= 1 ? 0 : Math.ceil(((1 - this.tokens) * 1000) / this.rate);
  }

  /** Counts a frame written. Frames that cannot wait (acks, pongs) may take it below zero. */
  spend(): void {
    if (this.rate <= 0) return;
    this.refill();
    this.tokens -= 1;
  }

  private refill(): void {
    const now = this.now();
    this.tokens = Math.min(this.rate, this.tokens + ((now - this.at) * this.rate) / 1000);
    this.at = now;
  }
}

/**
 * How many sends may await their `send_ack` at once, as TCP sizes its window: halved after a
 * RETRY (at most once per round: a RETRY of a send written before the last cut does not cut
 * again), then grown back by one per stored send up to where the last cut came from, and
 * more slowly after that (one per window's worth). A server that turns sends back is sent
 * fewer, not the same again.
 */
export class SendWindow {
  private window: number;
  private threshold: number;
  private cutAt = -Infinity;

  constructor(private readonly max: number) {
    this.window = this.threshold = Math.max(1, max);
  }

  /** Sends allowed on the wire now. */
  get size(): number {
    return Math.floor(this.window);
  }

  stored(): void {
    const step = this.window < this.threshold ? 1 : 1 / this.window;
    this.window = Math.min(this.max, this.window + step);
  }

  /** A send written at `sentAt` was answered RETRY at `now`. */
  retried(sentAt: number, now: number): void {
    if (sentAt < this.cutAt) return;
    this.window = this.threshold = Math.max(1, Math.floor(this.window / 2));
    this.cutAt = now;
  }
}
