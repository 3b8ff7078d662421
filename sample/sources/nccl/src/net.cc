/*************************************************************************
 * Network plugin loading, as NCCL does it: dlopen libnccl-net.so (or
 * libnccl-net-<NCCL_NET_PLUGIN>.so), look up ncclNetPlugin_v4, initialise it and
 * fall back to the internal socket transport when anything is missing.
 ************************************************************************/

#include "net.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <string>
#include <strings.h>

ncclNet_t* ncclNet = nullptr;
static std::string ncclNetSelected = "Socket";

static void* tryOpenPlugin(const std::string& name) {
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    INFO(NCCL_INIT | NCCL_NET, "NET/Plugin : Plugin load returned %d : %s.", errno, dlerror());
  }
  return handle;
}

static ncclResult_t loadPlugin() {
  const char* env = getenv("NCCL_NET_PLUGIN");
  std::string name = "libnccl-net.so";
  if (env != nullptr && *env != '\0') {
    if (strcasecmp(env, "none") == 0) return ncclSuccess;
    name = std::string("libnccl-net-") + env + ".so";
  }
  void* handle = tryOpenPlugin(name);
  if (handle == nullptr) {
    INFO(NCCL_INIT | NCCL_NET, "NET/Plugin : No plugin found (%s), using internal implementation",
         name.c_str());
    return ncclSuccess;
  }
  ncclNet_t* plugin = static_cast<ncclNet_t*>(dlsym(handle, STR(NCCL_PLUGIN_SYMBOL)));
  if (plugin == nullptr) {
    INFO(NCCL_INIT | NCCL_NET, "NET/Plugin: Failed to find " STR(NCCL_PLUGIN_SYMBOL) " symbol.");
    dlclose(handle);
    return ncclSuccess;
  }
  if (plugin->init(ncclDebugLog) != ncclSuccess) {
    INFO(NCCL_INIT | NCCL_NET, "NET/Plugin: Plugin %s failed to initialize, using internal implementation",
         plugin->name);
    return ncclSuccess;
  }
  int ndev = 0;
  if (plugin->devices(&ndev) != ncclSuccess || ndev <= 0) {
    INFO(NCCL_INIT | NCCL_NET, "NET/Plugin: Plugin %s found no devices, using internal implementation",
         plugin->name);
    return ncclSuccess;
  }
  INFO(NCCL_INIT | NCCL_NET, "NET/Plugin: Loaded net plugin %s (v4), %d device(s)", plugin->name, ndev);
  ncclNet = plugin;
  ncclNetSelected = plugin->name;
  return ncclSuccess;
}

ncclResult_t ncclNetInit() {
  const char* forced = getenv("NCCL_NET");
  if (forced == nullptr || strcasecmp(forced, "Socket") != 0) NCCLCHECK(loadPlugin());
  if (forced != nullptr && strcasecmp(forced, ncclNetSelected.c_str()) != 0) {
    WARN("Could not find network %s, only %s is available", forced, ncclNetSelected.c_str());
    return ncclInvalidUsage;
  }
  if (ncclNet == nullptr) INFO(NCCL_INIT | NCCL_NET, "NET/Socket : Using internal socket transport");
  INFO(NCCL_INIT, "Using network %s", ncclNetSelected.c_str());
  return ncclSuccess;
}

const char* ncclNetName() { return ncclNetSelected.c_str(); }
