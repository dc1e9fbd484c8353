// The ranks of one process whose devices the host cannot address (a
// daemon's GPUs) run their collectives between their device pools
// themselves, without bouncing through host memory: each rank reads its
// peers' buffers with the device's own peer copies and reduction kernels
// (device_comm.cpp). This board is where they meet: a rank posts where its
// buffers are and the point of its device's work after which they hold
// the data (Device::mark), and gets everyone's posts once all have
// arrived at the same collective, as the local comm plugin's rendezvous
// does on host memory. Every rank meets in its program order, so its k-th
// meeting is everyone's k-th.
//
// A meeting fails on every rank (and the job with it) when the ranks
// disagree (another tag or count: they are in different collectives), after
// the job's comm timeout naming who had not arrived, or when the board is
// aborted (a rank lost).
//
// Thread-safety: meet() from each rank's collectives thread; abort() and
// reset() from any thread (reset() only while no rank is inside the model).
#pragma once

#include <zerod/zerod.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace zerod {

class Device;

class PeerBoard {
 public:
  struct Post {
    Device* device = nullptr;
    const void* send = nullptr;
    void* recv = nullptr;
    uint64_t count = 0;
    uint64_t tag = 0;   // the collective's (equal on every rank)
    uint64_t mark = 0;  // device->mark() after the work that wrote send
  };

  // timeout_s: the job's comm timeout (0: none).
  PeerBoard(int world, double timeout_s) : world_(world), timeout_s_(timeout_s), next_(static_cast<size_t>(world), 0) {}
  PeerBoard(const PeerBoard&) = delete;
  PeerBoard& operator=(const PeerBoard&) = delete;

  int world() const { return world_; }
  // Posts mine and returns every rank's post of this meeting, in rank order.
  // `what` names the collective in messages.
  std::vector<Post> meet(int rank, const Post& mine, const std::string& what);
  // Every waiting and later meeting fails with this.
  void abort(zd_status code, const std::string& why);
  // After a restart: meetings count from the start, no failure.
  void reset();

 private:
  struct Meeting {
    std::vector<Post> posts;
    std::vector<char> arrived;
    std::vector<std::string> whats;
    int count = 0;  // ranks arrived
    int taken = 0;  // ranks that took the posts
  };

  const int world_;
  const double timeout_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> next_;  // each rank's next meeting number
  std::map<uint64_t, Meeting> meetings_;
  zd_status failed_ = ZD_OK;
  std::string why_;
};

}  // namespace zerod
