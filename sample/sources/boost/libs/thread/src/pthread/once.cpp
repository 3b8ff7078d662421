//  once.cpp (sample): boost::call_once.

#include <boost/thread/once.hpp>

#include <mutex>

namespace boost {

namespace {
std::mutex once_lock;
} // namespace

void call_once(once_flag& flag, void (*fn)()) {
    std::lock_guard<std::mutex> guard(once_lock);
    if (!flag.done) {
        fn();
        flag.done = 1;
    }
}

} // namespace boost
