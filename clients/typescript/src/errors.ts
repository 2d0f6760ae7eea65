/** Errors of the Herald client. Each says what happened and what the caller may do next. */
import type { HeraldMessage } from "./types.js";

/** The base class: `instanceof HeraldError` catches every error of this library. */
export class HeraldError extends Error {
  override name = "HeraldError";
}

/**
 * The server refused a send (`send_ack` `REJECTED`): validation or policy. Resending it as
 * is will not pass, except after `retryAfterMs` when a policy plugin gave one.
 */
export class SendRejectedError extends HeraldError {
  override name = "SendRejectedError";
  constructor(
    readonly reason: string,
    readonly clientMsgId: string,
    readonly conversation: string,
    readonly retryAfterMs?: number,
  ) {
    super(`send to ${conversation} rejected: ${reason || "no reason given"}`);
  }
}

/**
 * A send whose outcome is unknown: the client was closed, or its `timeoutMs` passed, before
 * a final `send_ack`. The message may or may not be stored; sending again with the same
 * `clientMsgId` settles it without a duplicate.
 */
export class SendAbandonedError extends HeraldError {
  override name = "SendAbandonedError";
  constructor(
    message: string,
    readonly clientMsgId: string,
    readonly conversation: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** An `error` frame answering a request (`code`: `invalid`, `forbidden`, `unavailable`, …). */
export class ServerError extends HeraldError {
  override name = "ServerError";
  constructor(
    readonly code: string,
    readonly serverMessage: string,
    readonly rid: number,
  ) {
    super(`server error ${code}: ${serverMessage}`);
  }
}

/**
 * The connection ended for good: a close the client does not retry (4001 with no way to
 * get a new token, 4003 not allowed, 4009 the same device connected elsewhere), or `close()`.
 */
export class ConnectionClosedError extends HeraldError {
  override name = "ConnectionClosedError";
  constructor(
    readonly code: number,
    readonly reason: string,
  ) {
    super(`connection closed (${code}${reason ? ` ${reason}` : ""})`);
  }
}

/** The token provider threw or returned no token; the client tries again after a backoff. */
export class TokenError extends HeraldError {
  override name = "TokenError";
}

/** A frame the client could not decode, or one it did not expect. */
export class ProtocolError extends HeraldError {
  override name = "ProtocolError";
}

/** A `message` handler threw; the message counts as handled (it is acked, not redelivered). */
export class HandlerError extends HeraldError {
  override name = "HandlerError";
  constructor(
    readonly heraldMessage: HeraldMessage | undefined,
    options: ErrorOptions,
  ) {
    super(
      heraldMessage
        ? `handler failed on ${heraldMessage.conversation} seq ${heraldMessage.seq}`
        : "an event listener failed",
      options,
    );
  }
}
