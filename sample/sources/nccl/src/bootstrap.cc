/*************************************************************************
 * Bootstrap network: picks the interface NCCL would use for its out-of-band
 * connections (NCCL_SOCKET_IFNAME, else the first non-loopback IPv4 one).
 ************************************************************************/

#include "net.h"

#include <arpa/inet.h>
#include <cstdlib>
#include <cstring>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <string>
#include <vector>

namespace {

struct Interface {
  std::string name;
  std::string address;
  bool loopback;
};

std::vector<Interface> listInterfaces() {
  std::vector<Interface> found;
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return found;
  for (struct ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if ((it->ifa_flags & IFF_UP) == 0) continue;
    char text[INET_ADDRSTRLEN] = {0};
    const struct sockaddr_in* sin = reinterpret_cast<const struct sockaddr_in*>(it->ifa_addr);
    inet_ntop(AF_INET, &sin->sin_addr, text, sizeof(text));
    found.push_back({it->ifa_name, text, (it->ifa_flags & IFF_LOOPBACK) != 0});
  }
  freeifaddrs(list);
  return found;
}

// NCCL_SOCKET_IFNAME: comma-separated prefixes; "^" excludes them, "=" requires exact names.
bool matches(const std::string& name, const char* spec) {
  std::string list(spec);
  bool exclude = false, exact = false;
  if (!list.empty() && list[0] == '^') { exclude = true; list.erase(0, 1); }
  if (!list.empty() && list[0] == '=') { exact = true; list.erase(0, 1); }
  bool hit = false;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    const std::string item = list.substr(start, comma - start);
    if (!item.empty() && (exact ? name == item : name.compare(0, item.size(), item) == 0)) hit = true;
    start = comma + 1;
  }
  return exclude ? !hit : hit;
}

}  // namespace

ncclResult_t bootstrapNetInit() {
  const char* spec = getenv("NCCL_SOCKET_IFNAME");
  const std::vector<Interface> all = listInterfaces();
  const Interface* chosen = nullptr;
  for (const Interface& candidate : all) {
    if (spec != nullptr ? matches(candidate.name, spec) : !candidate.loopback) {
      chosen = &candidate;
      break;
    }
  }
  if (chosen == nullptr && spec == nullptr) {
    for (const Interface& candidate : all)
      if (candidate.loopback) { chosen = &candidate; break; }
  }
  if (chosen == nullptr) {
    WARN("Bootstrap : no socket interface found%s%s", spec ? " matching " : "", spec ? spec : "");
    return ncclInternalError;
  }
  INFO(NCCL_INIT, "Bootstrap : Using %s:%s<0>", chosen->name.c_str(), chosen->address.c_str());
  return ncclSuccess;
}
