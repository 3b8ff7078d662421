//  chrono.cpp (sample): the clocks and a human-readable duration.

#include <boost/chrono/chrono.hpp>

#include <cstdio>
#include <string>

namespace boost {
namespace chrono {

steady_clock::time_point steady_clock::now() noexcept {
    return time_point(duration_cast<nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()));
}

system_clock::time_point system_clock::now() noexcept {
    return time_point(duration_cast<nanoseconds>(std::chrono::system_clock::now().time_since_epoch()));
}

std::string to_string(nanoseconds d) {
    static const struct { long long scale; const char* unit; } units[] = {
        {1000000000LL, "s"}, {1000000LL, "ms"}, {1000LL, "us"}, {1LL, "ns"}};
    const long long ns = d.count();
    for (const auto& u : units) {
        if (ns >= u.scale || u.scale == 1) {
            char buf[64];
            std::snprintf(buf, sizeof(buf), "%.3g %s", static_cast<double>(ns) / u.scale, u.unit);
            return buf;
        }
    }
    return "0 ns";
}

} // namespace chrono
} // namespace boost
