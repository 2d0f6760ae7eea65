/**
 * `herald.v1.json`: one text message per frame, in the proto3 JSON mapping (64-bit integers
 * as strings, bytes as base64). Pass `codec: jsonCodec` to use it.
 */
import { create, fromJsonString, toJsonString } from "@bufbuild/protobuf";
import { binary, decodeBinary, type FrameCodec } from "./codec.js";
import { ProtocolError } from "./errors.js";
import { FrameSchema } from "./gen/herald/v1/frames_pb.js";

export const jsonCodec: FrameCodec = {
  subprotocol: "herald.v1.json",
  encode: (rid, body) => toJsonString(FrameSchema, create(FrameSchema, { rid, body })),
  decode(data) {
    // The server writes only the negotiated encoding, but reads either; so do we.
    if (typeof data !== "string") {
      const bytes = binary(data);
      if (!bytes) throw new ProtocolError("unexpected WebSocket message type");
      return decodeBinary(bytes);
    }
    try {
      // Unknown fields are ignored: the contract lets the server add optional ones.
      return fromJsonString(FrameSchema, data, { ignoreUnknownFields: true });
    } catch (error) {
      throw new ProtocolError(`undecodable frame: ${String(error)}`, { cause: error });
    }
  },
};
