#include "endpoint.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace zerod::bench {
namespace {

struct Interface {
  std::string name;
  in_addr_t address;  // network order
  bool loopback;
};

std::vector<Interface> ipv4_interfaces() {
  std::vector<Interface> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || (a->ifa_flags & IFF_UP) == 0) continue;
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    out.push_back({a->ifa_name, in->sin_addr.s_addr, (a->ifa_flags & IFF_LOOPBACK) != 0});
  }
  freeifaddrs(list);
  return out;
}

std::string dotted(in_addr_t address) {
  char text[INET_ADDRSTRLEN] = "";
  in_addr a{};
  a.s_addr = address;
  inet_ntop(AF_INET, &a, text, sizeof text);
  return text;
}

// `entry` is an interface name, or a subnet "a.b.c.d/n" as Open MPI's
// if_include takes them.
bool matches(const Interface& i, const std::string& entry) {
  const size_t slash = entry.find('/');
  if (slash == std::string::npos) return i.name == entry;
  in_addr net{};
  const int bits = std::atoi(entry.c_str() + slash + 1);
  if (inet_pton(AF_INET, entry.substr(0, slash).c_str(), &net) != 1 || bits < 0 || bits > 32) return false;
  const uint32_t mask = bits == 0 ? 0 : ~uint32_t{0} << (32 - bits);
  return (ntohl(i.address) & mask) == (ntohl(net.s_addr) & mask);
}

Endpoint from_list(const char* variable, const std::string& list, const std::vector<Interface>& interfaces) {
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string entry = list.substr(at, comma - at);
    for (const Interface& i : interfaces) {
      if (!entry.empty() && matches(i, entry)) return {i.name, dotted(i.address), ""};
    }
    at = comma + 1;
  }
  return {"", "", std::string("no up interface with an IPv4 address matches ") + variable + "=" + list};
}

Endpoint from_hostname(const std::vector<Interface>& interfaces) {
  char host[256] = "";
  if (gethostname(host, sizeof host - 1) != 0) return {"", "", "gethostname failed"};
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host, nullptr, &hints, &found); rc != 0) {
    return {"", "", std::string("host name ") + host + " does not resolve (" + gai_strerror(rc) +
                        "); set GLOO_SOCKET_IFNAME or --mca btl_tcp_if_include"};
  }
  Endpoint e{"", "", std::string("no interface holds the address host name ") + host + " resolves to"};
  for (const addrinfo* a = found; a != nullptr && !e.why.empty(); a = a->ai_next) {
    const in_addr_t address = reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr.s_addr;
    const bool loopback = (ntohl(address) >> 24) == 127;  // 127.0.1.1 (Debian's) is no interface's own
    for (const Interface& i : interfaces) {
      if (i.address == address || (loopback && i.loopback)) {
        e = {i.name, dotted(i.address), ""};
        break;
      }
    }
  }
  freeaddrinfo(found);
  return e;
}

}  // namespace

Endpoint local_endpoint() {
  const std::vector<Interface> interfaces = ipv4_interfaces();
  for (const char* variable : {"GLOO_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include"}) {
    const char* list = std::getenv(variable);
    if (list != nullptr && list[0] != '\0') return from_list(variable, list, interfaces);
  }
  return from_hostname(interfaces);
}

int free_port(const std::string& address) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (inet_pton(AF_INET, address.c_str(), &a.sin_addr) != 1) return 0;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  socklen_t size = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &size) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace zerod::bench
