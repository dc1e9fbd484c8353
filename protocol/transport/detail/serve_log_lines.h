// The lines `zerod serve` writes as it starts and as it stops on its own
// (every rank gone). libzerod reads an on-demand daemon's log back to tell
// a clean end from a killed daemon (libzerod/src/node_daemon.cpp), so both
// sides spell them from here: a reworded line would otherwise make every
// log look unclean, silently.
#pragma once

namespace zerod::serve_log {

inline constexpr char kListening[] = "zerod serve: listening on ";
inline constexpr char kRanksConnect[] = "  ranks connect with ";
inline constexpr char kStopping[] = "zerod serve: every rank has left; stopping";

}  // namespace zerod::serve_log
