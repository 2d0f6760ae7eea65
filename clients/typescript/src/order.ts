/**
 * The per-conversation ordering buffer: pure logic, no I/O, so it is unit-tested alone.
 *
 * It holds `cursor`, the highest seq such that every message at or below it has been
 * released (emitted, or known to be this device's own send, or known not to exist). Seqs
 * may have gaps (a crashed node skips the rest of its leased seqs), so a missing seq is only
 * skipped once the server says so: a `sync` reply's `complete_through_seq`.
 */

/** Anything with a seq; the client uses its message type. */
export interface Sequenced {
  readonly seq: bigint;
}

/** One step forward of the cursor: a message to emit, or (without one) a skipped seq. */
export interface Release<M extends Sequenced> {
  readonly seq: bigint;
  readonly message?: M;
}

export class ConversationOrder<M extends Sequenced> {
  /** Everything at or below it is released; undefined until the baseline is known. */
  cursor: bigint | undefined;
  /** The highest seq known to exist (a later message, a hint, a `latest_seq`). */
  target = 0n;
  private readonly held = new Map<bigint, M>();
  /** Seqs of this device's own sends above the cursor: present, but not emitted. */
  private readonly own = new Set<bigint>();

  /**
   * @param cursor the stored position, if any.
   * @param baselineFromFirst without a cursor, take the first message offered as the start
   *   (direct and group conversations: the server pushes from its cursor of this device);
   *   rooms wait for `setBaseline` from `subscribed` instead.
   */
  constructor(
    cursor: bigint | undefined,
    private readonly baselineFromFirst: boolean,
  ) {
    this.cursor = cursor;
    if (cursor !== undefined) this.target = cursor;
  }

  /** Something is known to exist above the cursor that has not been released yet. */
  get lacking(): boolean {
    return this.cursor !== undefined && (this.held.size > 0 || this.own.size > 0 || this.target > this.cursor);
  }

  /** Messages waiting for an earlier seq. */
  get heldCount(): number {
    return this.held.size;
  }

  /**
   * Offers a message (`own`: sent by this very device, which is released without being
   * emitted). Returns what can be released now, in seq order, or `undefined` when the message
   * is a duplicate (at or below the cursor, or already held).
   */
  offer(message: M, own = false): Release<M>[] | undefined {
    const seq = message.seq;
    if (this.cursor === undefined && this.baselineFromFirst) this.cursor = seq > 0n ? seq - 1n : 0n;
    if ((this.cursor !== undefined && seq <= this.cursor) || this.held.has(seq) || this.own.has(seq)) {
      return undefined;
    }
    if (own) this.own.add(seq);
    else this.held.set(seq, message);
    if (seq > this.target) this.target = seq;
    return this.drain();
  }

  /** This device's own send was stored at `seq`. Ignored while there is no baseline. */
  markOwn(seq: bigint): Release<M>[] {
    if (this.cursor === undefined || seq <= this.cursor || this.held.has(seq)) return [];
    this.own.add(seq);
    if (seq > this.target) this.target = seq;
    return this.drain();
  }

  /** Sets the starting point where none is known (a room's `latest_seq`, a sync reply). */
  setBaseline(seq: bigint): Release<M>[] {
    if (this.cursor !== undefined) return [];
    // A message pushed before the baseline arrived is kept, not dropped: start below it.
    let lowest = seq;
    for (const held of this.held.keys()) if (held - 1n < lowest) lowest = held - 1n;
    this.cursor = lowest < 0n ? 0n : lowest;
    if (seq > this.target) this.target = seq;
    return this.drain();
  }

  /** The highest seq is at least `seq` (a `sync_hint`, a `latest_seq`). */
  raiseTarget(seq: bigint): void {
    if (seq > this.target) this.target = seq;
  }

  /**
   * The server says every message with a seq up to `through` has been returned (and
   * offered) or does not exist: release what is held up to it, skip the rest.
   */
  completeThrough(through: bigint): Release<M>[] {
    if (this.cursor === undefined) return this.setBaseline(through);
    const out: Release<M>[] = [];
    if (through > this.cursor) {
      const seqs = [...this.held.keys(), ...this.own].filter((seq) => seq <= through).sort(compare);
      for (const seq of seqs) {
        const message = this.held.get(seq);
        out.push(message === undefined ? { seq } : { seq, message });
        this.held.delete(seq);
        this.own.delete(seq);
      }
      if (seqs.length === 0 || seqs[seqs.length - 1]! < through) out.push({ seq: through });
      this.cursor = through;
    }
    return out.concat(this.drain());
  }

  /** Gives up on what is missing (the conversation cannot be read): releases all it holds. */
  releaseAll(): Release<M>[] {
    const top = [this.target, ...this.held.keys(), ...this.own].reduce((a, b) => (a > b ? a : b), 0n);
    return this.completeThrough(top);
  }

  private drain(): Release<M>[] {
    const out: Release<M>[] = [];
    if (this.cursor === undefined) return out;
    for (;;) {
      const next: bigint = this.cursor + 1n;
      const message = this.held.get(next);
      if (message !== undefined) {
        this.held.delete(next);
        out.push({ seq: next, message });
      } else if (this.own.delete(next)) {
        out.push({ seq: next });
      } else {
        return out;
      }
      this.cursor = next;
    }
  }
}

function compare(a: bigint, b: bigint): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
