#include "node_messages.h"

#include <cinttypes>
#include <cstring>

namespace zerod::comm::mpi {
namespace {

unsigned long long number(uint64_t seq) { return static_cast<unsigned long long>(seq) + 1; }

// "ranks 0, 1, 4, 5 (nodes 0, 2)", "ranks 2-5 (nodes 1, 2)", "rank 3 (node
// 3, host d, pid 9)": the ranks of the nodes m for which in(m), written as
// messages.h writes rank lists.
template <typename In>
void node_group(Text& t, const Topology& topo, In in) {
  int members = 0;
  for (int m = 0; m < topo.nodes; ++m) members += in(m) ? 1 : 0;
  auto has = [&](int rank) { return in(topo.node_of(rank)); };
  t.add(members == 1 && topo.local == 1 ? "rank " : "ranks ");
  bool first = true;
  for (int r = 0; r < topo.world;) {
    if (!has(r)) {
      ++r;
      continue;
    }
    int last = r;
    while (last + 1 < topo.world && has(last + 1)) ++last;
    t.add("%s%d", first ? "" : ", ", r);
    if (last > r) t.add("%s%d", last == r + 1 ? ", " : "-", last);
    first = false;
    r = last + 1;
  }
  t.add(members == 1 ? " (node " : " (nodes ");
  first = true;
  for (int m = 0; m < topo.nodes; ++m) {
    if (!in(m)) continue;
    t.add("%s%d", first ? "" : ", ", m);
    if (members == 1 && m < static_cast<int>(topo.hosts.size())) {
      t.add(", host %s, pid %ld", topo.hosts[m].c_str(), topo.pids[m]);
    }
    first = false;
  }
  t.add(")");
}

}  // namespace

bool say_if_disagree(Text& t, const std::vector<Header>& hs, const Topology& topo) {
  const int n = static_cast<int>(hs.size());
  auto same = [&](int a, int b) { return hs[a].seq == hs[b].seq && same_collective(call_of(hs[a]), call_of(hs[b])); };
  bool all = true;
  bool tags = false;
  for (int m = 1; m < n; ++m) {
    all = all && same(0, m);
    tags = tags || hs[m].tag != hs[0].tag;
  }
  if (all) return false;
  t.add("ranks disagree at collective #%llu: ", number(hs[topo.node].seq));
  // Nodes grouped by the call they are in, in order of their first node.
  bool first = true;
  for (int m = 0; m < n; ++m) {
    bool earlier = false;
    for (int j = 0; j < m && !earlier; ++j) earlier = same(j, m);
    if (earlier) continue;
    if (!first) t.add(", ");
    first = false;
    int members = 0;
    for (int j = 0; j < n; ++j) members += same(j, m) ? 1 : 0;
    node_group(t, topo, [&](int j) { return same(j, m); });
    t.add(members == 1 && topo.local == 1 ? " is in " : " are in ");
    t.quoted(hs[m].what, kWhatMax);
    t.add(" (");
    describe(t, call_of(hs[m]), tags);
    if (hs[m].seq != hs[topo.node].seq) t.add(", its collective #%llu", number(hs[m].seq));
    t.add(")");
  }
  return true;
}

void say_node_timeout(Text& t, const Header& mine, uint64_t waited_ms, const std::vector<bool>& arrived,
                      const std::vector<Header>& last, const Topology& topo) {
  t.add("timeout at collective #%llu (", number(mine.seq));
  describe(t, call_of(mine), false);
  t.add("): this daemon's ranks waited %" PRIu64 " ms for the other daemons; arrived: ", waited_ms);
  node_group(t, topo, [&](int m) { return arrived[static_cast<size_t>(m)]; });
  t.add(" in ");
  t.quoted(mine.what, kWhatMax);
  t.add("; not arrived: ");
  bool first = true;
  for (int m = 0; m < topo.nodes; ++m) {
    if (arrived[static_cast<size_t>(m)]) continue;
    if (!first) t.add("; ");
    first = false;
    topo.describe_node(t, m);
    const Header& h = last[static_cast<size_t>(m)];
    if (h.seq == kNoCollective) {
      t.add(", which has not arrived at any collective");
    } else {
      t.add(", whose ranks were last all in collective #%llu ", number(h.seq));
      t.quoted(h.what, kWhatMax);
    }
  }
}

void say_stalled(Text& t, const Header& mine, uint64_t idle_ms, const std::vector<int>& nodes,
                 const Topology& topo) {
  t.add("collective #%llu (", number(mine.seq));
  describe(t, call_of(mine), false);
  t.add(") stalled: nothing came from or went to ");
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i > 0) t.add(i + 1 == nodes.size() ? " and " : ", ");
    topo.describe_node(t, nodes[i]);
  }
  t.add(" for %" PRIu64 " ms after every daemon had arrived: %s", idle_ms,
        nodes.size() == 1 ? "that daemon may have died or stopped, or the network to it is down"
                          : "those daemons may have died or stopped, or the network to them is down");
}

void say_mpi_error(Text& t, const Header& mine, const char* detail) {
  t.add("MPI failed in collective #%llu (", number(mine.seq));
  describe(t, call_of(mine), false);
  t.add("): %s", detail);
}

void say_remote_failure(Text& t, const Notice& n, const Topology& topo) {
  topo.describe_node(t, n.node);
  t.add(" failed: %s", n.message);
}

}  // namespace zerod::comm::mpi
