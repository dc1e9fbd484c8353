// What travels on a transport::Connection, for both sides: protobuf set-up
// messages, one Request or Reply per frame (type 1 and 2), with the reply's
// error; and model calls as the call ring's records (ring_call.h) in frames
// of their own (type 3 and 4) when there is no ring.
#pragma once

#include "call_record.h"
#include "ring_call.h"
#include "transport/connection.h"
#include "zerod_v1.pb.h"

#include <zerod/zerod.h>

#include <cstddef>
#include <span>
#include <vector>

namespace zerod::wire {

enum FrameType : uint16_t {
  kRequest = 1,  // a v1::Request
  kReply = 2,    // a v1::Reply (also a call's arena announcement)
  kCall = 3,     // a RingRequest of kind call, byte for byte: a model call without the ring
  kCallReply = 4,  // its answer: the bytes the ring's reply slot would hold (RingReply, views, text)
};

// The largest body either side accepts. Bodies hold no tensor bytes, so
// this is generous.
inline constexpr uint32_t kMaxBody = 4u << 20;

void send(transport::Connection& c, FrameType type, uint32_t request_id,
          const google::protobuf::MessageLite& msg, std::span<const int> fds = {},
          int timeout_ms = transport::kWaitForever);

// Parses a frame's body; throws ZD_ERR_INVALID_ARGUMENT naming what was
// malformed.
void parse(const transport::Frame& f, google::protobuf::MessageLite* msg, const char* what);

// Fills a reply's error from a status and message.
void set_error(v1::Reply* reply, zd_status status, const std::string& message);

// A step's figures and a view in a protobuf CallReply: what the daemon
// answers a libzerod that still sends calls as protobuf messages
// (zerod_v1.proto's ModelCall; daemon/server/session_v1_calls.cpp).
void to_proto(const StepFigures& f, v1::StepFigures* s);
void to_proto(const RingView& v, v1::View* out);

// A call record's new arenas (all.new_arenas(), their fds in that order)
// as kReply frames of request_id, each a v1::Reply with ok and the next
// transport::kMaxFdsPerFrame arenas at most: one sendmsg cannot pass more
// fds, and a pool that grew by more in one call (a GPU's 256 MiB chunks
// past 63 GiB, a kept model's whole pool on its re-attach) would otherwise
// not reach its client at all. arena_frames says how many frames that is,
// for the reply record's arenas_follow.
uint32_t arena_frames(size_t arenas);
void send_arenas(transport::Connection& c, uint32_t request_id, const v1::Reply& all, std::span<const int> fds,
                 int timeout_ms = transport::kWaitForever);

// Sends a call record's bytes (kCall, kCallReply) as one frame.
void send_bytes(transport::Connection& c, FrameType type, uint32_t request_id, std::span<const std::byte> body,
                std::span<const int> fds = {}, int timeout_ms = transport::kWaitForever);

}  // namespace zerod::wire
