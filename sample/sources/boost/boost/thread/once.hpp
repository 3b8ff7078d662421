//  boost/thread/once.hpp (sample)

#ifndef BOOST_THREAD_ONCE_HPP
#define BOOST_THREAD_ONCE_HPP

#include <boost/config.hpp>

namespace boost {

struct once_flag {
    once_flag() noexcept : done(0) {}
    volatile int done;
};

#define BOOST_ONCE_INIT boost::once_flag()

BOOST_THREAD_DECL void call_once(once_flag& flag, void (*fn)());

} // namespace boost

#endif // BOOST_THREAD_ONCE_HPP
