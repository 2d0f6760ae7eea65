/**
 * When a reconnect is complete (SPEC.md, `resumed`): once every room is joined again and
 * the catch-up probe answered, the client is current again.
 */
import type { ResumedInfo } from "./types.js";

export class Resumption {
  private pending: { info: ResumedInfo; rooms: Set<string>; probe: boolean } | undefined;

  constructor(private readonly resumed: (info: ResumedInfo) => void) {}

  /** A reconnect: waits for `rooms` and, when `probe`, the probe's answer. */
  begin(offlineMs: number, resentSends: number, rooms: string[], probe: boolean): void {
    this.pending = { info: { offlineMs, resentSends, rooms: rooms.length }, rooms: new Set(rooms), probe };
  }

  /** The room was joined again (or refused: it will not be). */
  roomDone(room: string): void {
    this.pending?.rooms.delete(room);
    this.check();
  }

  probeDone(): void {
    if (this.pending) this.pending.probe = false;
    this.check();
  }

  /** The connection dropped before the reconnect was complete. */
  cancel(): void {
    this.pending = undefined;
  }

  check(): void {
    const pending = this.pending;
    if (!pending || pending.rooms.size > 0 || pending.probe) return;
    this.pending = undefined;
    this.resumed(pending.info);
  }
}
