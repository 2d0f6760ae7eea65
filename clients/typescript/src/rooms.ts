/**
 * Rooms (SPEC.md, "Rooms"): joined for the life of the client, and joined again on every
 * connection from the last seq seen (`since_seq`), so what was posted meanwhile arrives.
 */
import type { FrameBody } from "./codec.js";
import { HeraldError } from "./errors.js";

interface Waiter {
  resolve: (value: { room: string; latestSeq: bigint }) => void;
  reject: (error: Error) => void;
}

/** What the rooms need of the client. */
export interface RoomHost {
  connected(): boolean;
  transmit(body: FrameBody, rid?: number): boolean;
  rid(): number;
  /** The last seq seen in `room`, if any (this session or the store). */
  cursor(room: string): bigint | undefined;
}

/** `room:<name>` for `<name>` or `room:<name>`. */
export function roomName(room: string): string {
  return room.startsWith("room:") ? room : `room:${room}`;
}

export class Rooms {
  /** The rooms joined, with the `subscribe` calls waiting for `subscribed`. */
  private readonly joined = new Map<string, Waiter[]>();
  /** `subscribe` frames written on this connection, by rid. */
  private readonly rids = new Map<number, string>();

  constructor(private readonly host: RoomHost) {}

  /** The rooms joined. */
  names(): string[] {
    return [...this.joined.keys()];
  }

  join(name: string): Promise<{ room: string; latestSeq: bigint }> {
    let waiters = this.joined.get(name);
    if (!waiters) this.joined.set(name, (waiters = []));
    const list = waiters;
    return new Promise((resolve, reject) => {
      list.push({ resolve, reject });
      if (this.host.connected()) this.write(name);
    });
  }

  leave(name: string): void {
    const waiters = this.joined.get(name);
    if (!waiters) return;
    this.joined.delete(name);
    for (const waiter of waiters) waiter.reject(new HeraldError(`unsubscribed from ${name}`));
    this.host.transmit({ case: "unsubscribe", value: { room: name } });
  }

  /** A new connection: every room is joined again, from its cursor. */
  rejoinAll(): void {
    for (const room of this.joined.keys()) this.write(room);
  }

  /** `subscribed` came: the `subscribe` calls resolve. */
  subscribed(rid: number, room: string, latestSeq: bigint): void {
    this.rids.delete(rid);
    const waiters = this.joined.get(room);
    if (!waiters) return;
    for (const waiter of waiters) waiter.resolve({ room, latestSeq });
    waiters.length = 0;
  }

  /** An `error` for a `subscribe`: the room is forgotten. Returns it, if the rid was one. */
  refused(rid: number, error: Error): string | undefined {
    const room = this.rids.get(rid);
    if (room === undefined) return undefined;
    this.rids.delete(rid);
    for (const waiter of this.joined.get(room) ?? []) waiter.reject(error);
    this.joined.delete(room);
    return room;
  }

  dropped(): void {
    this.rids.clear();
  }

  /** The client closed: the `subscribe` calls still waiting fail. */
  closed(cause: Error): void {
    for (const waiters of this.joined.values()) {
      for (const waiter of waiters) waiter.reject(cause);
      waiters.length = 0;
    }
  }

  private write(room: string): void {
    const since = this.host.cursor(room);
    const rid = this.host.rid();
    this.rids.set(rid, room);
    this.host.transmit({ case: "subscribe", value: since === undefined ? { room } : { room, sinceSeq: since } }, rid);
  }
}
