/**
 * Frames on the wire, through the code generated from proto/herald/v1/frames.proto (never
 * hand-written codecs). The protobuf codec is here; the JSON one is in json.ts, so that a
 * browser bundle using protobuf does not carry the JSON code.
 */
import { create, fromBinary, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { FrameSchema, type Frame, type Message as WireMessage } from "./gen/herald/v1/frames_pb.js";
import { ProtocolError } from "./errors.js";
import type { HeraldMessage } from "./types.js";

export type { Frame };

/** What a frame carries: `{ case: "send", value: {...} }` and so on. */
export type FrameBody = NonNullable<MessageInitShape<typeof FrameSchema>["body"]>;

/** One of the two encodings of PROTOCOL.md: its subprotocol, and how frames are written and read. */
export interface FrameCodec {
  /** `herald.v1.proto` or `herald.v1.json`. */
  readonly subprotocol: string;
  encode(rid: number, body: FrameBody): Uint8Array | string;
  decode(data: unknown): Frame;
}

/** `herald.v1.proto`, the default: one binary message per frame. */
export const protoCodec: FrameCodec = {
  subprotocol: "herald.v1.proto",
  encode: (rid, body) => toBinary(FrameSchema, create(FrameSchema, { rid, body })),
  decode(data) {
    const bytes = binary(data);
    if (!bytes) throw new ProtocolError(`a ${typeof data} message on the protobuf subprotocol`);
    return decodeBinary(bytes);
  },
};

/** The bytes of a binary WebSocket message (an ArrayBuffer, or a view such as Node's Buffer). */
export function binary(data: unknown): Uint8Array | undefined {
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  return undefined;
}

export function decodeBinary(bytes: Uint8Array): Frame {
  try {
    return fromBinary(FrameSchema, bytes);
  } catch (error) {
    throw new ProtocolError(`undecodable frame: ${String(error)}`, { cause: error });
  }
}

/** The library's view of a stored message. */
export function fromWire(message: WireMessage): HeraldMessage {
  return {
    id: message.id,
    conversation: message.conversation,
    seq: message.seq,
    sender: message.sender,
    senderDevice: message.senderDevice,
    kind: message.kind,
    body: message.body,
    sentAtMs: Number(message.sentAtMs),
  };
}
