#include "messages.h"

#include <cinttypes>
#include <cstring>

namespace zerod::comm {
namespace {

unsigned long long number(uint64_t seq) { return static_cast<unsigned long long>(seq) + 1; }

// "rank 3" or "ranks 0-2, 5": first + j for the indices j < world for which
// in(j) holds.
template <typename In>
void rank_list(Text& t, int world, int first_rank, In in) {
  int members = 0;
  for (int j = 0; j < world; ++j) members += in(j) ? 1 : 0;
  t.add(members == 1 ? "rank " : "ranks ");
  bool first = true;
  for (int j = 0; j < world;) {
    if (!in(j)) {
      ++j;
      continue;
    }
    int last = j;
    while (last + 1 < world && in(last + 1)) ++last;
    t.add("%s%d", first ? "" : ", ", first_rank + j);
    if (last > j) t.add("%s%d", last == j + 1 ? ", " : "-", first_rank + last);
    first = false;
    j = last + 1;
  }
}

}  // namespace

void say_disagreement(Text& t, uint64_t seq, int a, const Call& ca, const char* wa, int b, const Call& cb,
                      const char* wb) {
  if (b < a) {
    say_disagreement(t, seq, b, cb, wb, a, ca, wa);
    return;
  }
  // Tags are shown only when they differ: otherwise they are noise.
  const bool tags = ca.tag != cb.tag;
  t.add("ranks disagree at collective #%llu: rank %d is in ", number(seq), a);
  t.quoted(wa, kWhatMax);
  t.add(" (");
  describe(t, ca, tags);
  t.add("), rank %d is in ", b);
  t.quoted(wb, kWhatMax);
  t.add(" (");
  describe(t, cb, tags);
  t.add(")");
}

void say_timeout(Text& t, uint64_t seq, int index, int first_rank, uint64_t waited_ms, const Call* calls,
                 const Seen* seen, int world) {
  t.add("timeout at collective #%llu (", number(seq));
  describe(t, calls[index], false);
  t.add("): rank %d waited %" PRIu64 " ms; arrived: ", first_rank + index, waited_ms);
  // Ranks grouped by their `what` (they agree on the call, not on the text).
  bool first = true;
  for (int j = 0; j < world; ++j) {
    const bool here = seen[j].seq == seq;
    bool earlier = false;
    for (int i = 0; i < j && here && !earlier; ++i) {
      earlier = seen[i].seq == seq && std::strcmp(seen[i].what, seen[j].what) == 0;
    }
    if (!here || earlier) continue;
    if (!first) t.add("; ");
    first = false;
    rank_list(t, world, first_rank,
              [&](int k) { return seen[k].seq == seq && std::strcmp(seen[k].what, seen[j].what) == 0; });
    t.add(" in ");
    t.quoted(seen[j].what, kWhatMax);
  }
  t.add("; not arrived: ");
  // Missing ranks grouped by the collective they were last seen in.
  auto same_place = [&](int i, int j) {
    return seen[i].seq == seen[j].seq && std::strcmp(seen[i].what, seen[j].what) == 0;
  };
  first = true;
  for (int j = 0; j < world; ++j) {
    if (seen[j].seq == seq) continue;
    bool earlier = false;
    for (int i = 0; i < j && !earlier; ++i) earlier = seen[i].seq != seq && same_place(i, j);
    if (earlier) continue;
    if (!first) t.add(", ");
    first = false;
    rank_list(t, world, first_rank, [&](int k) { return seen[k].seq != seq && same_place(k, j); });
    if (seen[j].seq == kNoCollective) {
      t.add(" (no collective yet)");
    } else {
      t.add(" (last seen in collective #%llu, ", number(seen[j].seq));
      t.quoted(seen[j].what, kWhatMax);
      t.add(")");
    }
  }
}

void say_invalid(Text& t, uint64_t seq, int rank, const char* what, const char* why) {
  t.add("rank %d's call ", rank);
  t.quoted(what, kWhatMax);
  t.add(" at collective #%llu is invalid: %s", number(seq), why);
}

void say_gone(Text& t, uint64_t seq, int rank, const char* what, const char* failure) {
  t.add("rank %d's collective #%llu ", rank, number(seq));
  t.quoted(what, kWhatMax);
  t.add(" was not run: %s", failure);
}

}  // namespace zerod::comm
