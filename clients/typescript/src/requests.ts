/**
 * Requests answered by `rid` (SPEC.md, "Other requests"): the application's `history` and
 * `sync`, and the client's own pulls and probe. They wait for a connection; after a drop the
 * application's are written again (they are reads), the client's own fail (their callers
 * re-arm).
 */
import type { Frame, FrameBody } from "./codec.js";
import { ConnectionClosedError, ProtocolError, type ServerError } from "./errors.js";

interface PendingRequest {
  readonly body: FrameBody;
  readonly expect: "syncReply" | "historyReply";
  readonly resolve: (frame: Frame) => void;
  readonly reject: (error: Error) => void;
  /** The app's requests are resent after a reconnect; internal pulls are re-armed instead. */
  readonly resend: boolean;
}

/** What the requests need of the client. */
export interface RequestHost {
  /** `connected`: write now; `closed`: refuse; otherwise queue. */
  state(): "connected" | "closed" | "waiting";
  transmit(body: FrameBody, rid: number): boolean;
  rid(): number;
}

export class Requests {
  /** Written on this connection, by rid. */
  private readonly written = new Map<number, PendingRequest>();
  /** Waiting for a connection. */
  private queued: PendingRequest[] = [];

  constructor(private readonly host: RequestHost) {}

  /** Writes `body` (now or once connected); resolves with the reply of the expected kind. */
  ask(body: FrameBody, expect: PendingRequest["expect"], resend: boolean): Promise<Frame> {
    const state = this.host.state();
    if (state === "closed") return Promise.reject(new ConnectionClosedError(1000, "client closed"));
    return new Promise((resolve, reject) => {
      const request: PendingRequest = { body, expect, resolve, reject, resend };
      if (state === "connected") this.write(request);
      else this.queued.push(request);
    });
  }

  /** A new connection: what waited for it is written. */
  connected(): void {
    const queued = this.queued;
    this.queued = [];
    for (const request of queued) this.write(request);
  }

  /** The connection is gone: the application's requests wait for the next one. */
  dropped(code: number, reason: string): void {
    for (const request of this.written.values()) {
      if (request.resend) this.queued.push(request);
      else request.reject(new ConnectionClosedError(code, reason));
    }
    this.written.clear();
  }

  /** The client closed: every request fails with `cause`. */
  closed(cause: ConnectionClosedError): void {
    for (const request of this.queued) request.reject(cause);
    this.queued = [];
  }

  /** A reply frame (`syncReply`, `historyReply`) for the request with its rid. */
  reply(frame: Frame): void {
    const request = this.written.get(frame.rid);
    if (!request) return;
    this.written.delete(frame.rid);
    if (frame.body.case === request.expect) request.resolve(frame);
    else request.reject(new ProtocolError(`expected ${request.expect}, got ${frame.body.case ?? "no body"}`));
  }

  /** An `error` frame: rejects the request with `rid`; false when none waited for it. */
  failed(rid: number, error: ServerError): boolean {
    const request = this.written.get(rid);
    if (!request) return false;
    this.written.delete(rid);
    request.reject(error);
    return true;
  }

  private write(request: PendingRequest): void {
    const rid = this.host.rid();
    this.written.set(rid, request);
    this.host.transmit(request.body, rid);
  }
}
