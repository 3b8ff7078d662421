//  boost/chrono/chrono.hpp (sample): clocks with Boost's names over <chrono>.

#ifndef BOOST_CHRONO_CHRONO_HPP
#define BOOST_CHRONO_CHRONO_HPP

#include <boost/config.hpp>

#include <chrono>
#include <string>

#if defined(BOOST_CHRONO_SOURCE)
#  define BOOST_CHRONO_DECL BOOST_SYMBOL_EXPORT
#else
#  define BOOST_CHRONO_DECL BOOST_SYMBOL_IMPORT
#endif

namespace boost {
namespace chrono {

using std::chrono::duration;
using std::chrono::duration_cast;
using std::chrono::nanoseconds;
using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;

class BOOST_SYMBOL_VISIBLE steady_clock {
public:
    typedef nanoseconds duration;
    typedef std::chrono::time_point<steady_clock, duration> time_point;
    static constexpr bool is_steady = true;
    BOOST_CHRONO_DECL static time_point now() noexcept;
};

class BOOST_SYMBOL_VISIBLE system_clock {
public:
    typedef nanoseconds duration;
    typedef std::chrono::time_point<system_clock, duration> time_point;
    static constexpr bool is_steady = false;
    BOOST_CHRONO_DECL static time_point now() noexcept;
};

// "1.5 s", "250 ms", ... for logs.
BOOST_CHRONO_DECL std::string to_string(nanoseconds d);

} // namespace chrono
} // namespace boost

#endif // BOOST_CHRONO_CHRONO_HPP
