// Protobuf messages over a transport::Connection: one Request or Reply per
// frame (type 1 and 2), and the reply's error, for both sides.
#pragma once

#include "call_record.h"
#include "ring_call.h"
#include "transport/connection.h"
#include "zerod_v1.pb.h"

#include <zerod/zerod.h>

#include <span>
#include <vector>

namespace zerod::wire {

enum FrameType : uint16_t { kRequest = 1, kReply = 2 };

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

// A step's figures in a protobuf reply (the socket form of a call, without
// the ring) and back: one function each way. The ring's reply carries the
// same StepFigures record as it is (ring_call.h).
void to_proto(const StepFigures& f, v1::StepFigures* s);
StepFigures from_proto(const v1::StepFigures& s);

// A view of a _begin call in a protobuf reply and back: the socket form of
// the ring's view record, so that both carriers hand the client one record.
void to_proto(const RingView& v, v1::View* out);
RingView from_proto(const v1::View& v);

}  // namespace zerod::wire
