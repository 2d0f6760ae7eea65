/**
 * The client's sends (SPEC.md, "Sending"): each waits until the server stored it, and is
 * written again with its `client_msg_id` after a RETRY's wait or on the next connection, so
 * one call stores one message. Sends go out in call order, within the send window and the
 * frame budget.
 */
import type { FrameBody } from "./codec.js";
import { type ConnectionClosedError, SendAbandonedError, SendRejectedError } from "./errors.js";
import { SendAck_Status } from "./gen/herald/v1/frames_pb.js";
import type { FrameBudget, SendWindow } from "./pacing.js";
import type { ClientEvents, SendResult } from "./types.js";

type Timer = ReturnType<typeof setTimeout>;

interface PendingSend {
  readonly clientMsgId: string;
  readonly conversation: string;
  readonly kind: number;
  readonly body: Uint8Array;
  readonly resolve: (result: SendResult) => void;
  readonly reject: (error: Error) => void;
  /** Written on the current connection and awaiting its `send_ack`. */
  onWire: boolean;
  /** When it was last written (the send window's RETRY rule). */
  sentAt: number;
  /** After a RETRY: not written again before this time. */
  notBefore: number;
  deadline?: Timer | undefined;
}

/** A final or RETRY answer to a send, as the server writes it. */
export interface SendAckFrame {
  clientMsgId: string;
  status: SendAck_Status;
  messageId: bigint;
  seq: bigint;
  conversation: string;
  reason: string;
  retryAfterMs: number;
}

/** What the sends need of the client. */
export interface SendHost {
  /** Frames may be written now. */
  connected(): boolean;
  /** Writes a frame on the current connection. */
  transmit(body: FrameBody, rid: number): boolean;
  /** A fresh request id. */
  rid(): number;
  notify<K extends keyof ClientEvents>(event: K, value: ClientEvents[K]): void;
  /** A send was stored at `seq`: the conversation's order takes it as this device's own. */
  stored(conversation: string, seq: bigint): void;
}

export class SendQueue {
  /** In call order (a Map keeps insertion order). */
  private readonly sends = new Map<string, PendingSend>();
  private sendsOnWire = 0;
  private pumpTimer: Timer | undefined;

  constructor(
    private readonly host: SendHost,
    private readonly window: SendWindow,
    private readonly budget: FrameBudget,
  ) {}

  /** Sends not yet settled. */
  get size(): number {
    return this.sends.size;
  }

  has(clientMsgId: string): boolean {
    return this.sends.has(clientMsgId);
  }

  /** Queues a send; resolves once stored, rejects when refused or abandoned. */
  add(clientMsgId: string, conversation: string, kind: number, body: Uint8Array, timeoutMs?: number): Promise<SendResult> {
    return new Promise<SendResult>((resolve, reject) => {
      const pending: PendingSend = {
        clientMsgId,
        conversation,
        kind,
        body,
        resolve,
        reject,
        onWire: false,
        sentAt: 0,
        notBefore: 0,
      };
      if (timeoutMs !== undefined) {
        pending.deadline = setTimeout(() => {
          this.settle(pending);
          reject(new SendAbandonedError(`no answer within ${timeoutMs} ms`, clientMsgId, conversation));
          this.pump();
        }, timeoutMs);
      }
      this.sends.set(clientMsgId, pending);
      this.pump();
    });
  }

  /**
   * Writes waiting sends in call order, within the send window and the frame budget. A send
   * waiting out a RETRY holds back those behind it: the server is busy for them too.
   */
  pump(): void {
    clearTimeout(this.pumpTimer);
    this.pumpTimer = undefined;
    if (!this.host.connected()) return;
    for (const pending of this.sends.values()) {
      if (pending.onWire) continue;
      if (this.sendsOnWire >= this.window.size) return; // the next send_ack pumps again
      const wait = Math.max(pending.notBefore - Date.now(), this.budget.wait());
      if (wait > 0) {
        this.pumpTimer = setTimeout(() => this.pump(), wait);
        return;
      }
      pending.onWire = true;
      pending.sentAt = Date.now();
      this.sendsOnWire += 1;
      const { clientMsgId, conversation, kind, body } = pending;
      this.host.transmit({ case: "send", value: { clientMsgId, conversation, kind, body } }, this.host.rid());
    }
  }

  onSendAck(ack: SendAckFrame): void {
    const pending = this.sends.get(ack.clientMsgId);
    if (!pending || !pending.onWire) return;
    const conversation = ack.conversation || pending.conversation;
    switch (ack.status) {
      case SendAck_Status.OK:
      case SendAck_Status.DUPLICATE: {
        this.settle(pending);
        this.window.stored();
        pending.resolve({
          messageId: ack.messageId,
          seq: ack.seq,
          conversation,
          clientMsgId: ack.clientMsgId,
          duplicate: ack.status === SendAck_Status.DUPLICATE,
        });
        // Our own message takes its seq in the conversation; the server does not push it to us.
        this.host.stored(conversation, ack.seq);
        break;
      }
      case SendAck_Status.RETRY: {
        // Written again, same client_msg_id, once the wait is over; meanwhile fewer in flight.
        pending.onWire = false;
        this.sendsOnWire -= 1;
        pending.notBefore = Date.now() + ack.retryAfterMs;
        this.window.retried(pending.sentAt, Date.now());
        this.host.notify("retry", {
          clientMsgId: ack.clientMsgId,
          conversation,
          reason: ack.reason,
          retryAfterMs: ack.retryAfterMs,
        });
        break;
      }
      default: {
        this.settle(pending);
        const retryAfter = ack.retryAfterMs > 0 ? ack.retryAfterMs : undefined;
        const reason = ack.status === SendAck_Status.REJECTED ? ack.reason : `unknown status ${ack.status}: ${ack.reason}`;
        pending.reject(new SendRejectedError(reason, ack.clientMsgId, conversation, retryAfter));
      }
    }
    this.pump();
  }

  /** The connection is gone: every send is off the wire, to be written on the next one. */
  dropped(): void {
    for (const pending of this.sends.values()) {
      pending.onWire = false;
      pending.notBefore = 0;
    }
    this.sendsOnWire = 0;
    clearTimeout(this.pumpTimer);
    this.pumpTimer = undefined;
  }

  /** The client closed: every send waiting is rejected as abandoned (outcome unknown). */
  abandonAll(cause: ConnectionClosedError): void {
    clearTimeout(this.pumpTimer);
    this.pumpTimer = undefined;
    for (const pending of [...this.sends.values()]) {
      this.settle(pending);
      pending.reject(
        new SendAbandonedError(`send abandoned: ${cause.message}`, pending.clientMsgId, pending.conversation, { cause }),
      );
    }
  }

  private settle(pending: PendingSend): void {
    if (this.sends.get(pending.clientMsgId) !== pending) return;
    this.sends.delete(pending.clientMsgId);
    if (pending.onWire) this.sendsOnWire -= 1;
    pending.onWire = false;
    clearTimeout(pending.deadline);
  }
}
