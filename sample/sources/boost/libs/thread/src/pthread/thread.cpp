//  thread.cpp (sample): boost::thread and boost::mutex over the standard library.

#include <boost/thread/mutex.hpp>
#include <boost/thread/thread.hpp>

#include <mutex>
#include <system_error>
#include <thread>

namespace boost {

thread::thread() noexcept : impl_(nullptr) {}

thread::~thread() {
    // Like boost::thread before C++11 semantics: an unjoined thread is detached.
    if (joinable()) detach();
}

void thread::start(std::function<void()> fn) { impl_ = new std::thread(std::move(fn)); }

void thread::join() {
    std::thread* t = static_cast<std::thread*>(impl_);
    if (t == nullptr || !t->joinable()) throw std::system_error(std::make_error_code(std::errc::invalid_argument));
    t->join();
    delete t;
    impl_ = nullptr;
}

void thread::detach() {
    std::thread* t = static_cast<std::thread*>(impl_);
    if (t != nullptr && t->joinable()) t->detach();
    delete t;
    impl_ = nullptr;
}

bool thread::joinable() const noexcept {
    const std::thread* t = static_cast<const std::thread*>(impl_);
    return t != nullptr && t->joinable();
}

unsigned thread::hardware_concurrency() noexcept { return std::thread::hardware_concurrency(); }

namespace this_thread {
void yield() noexcept { std::this_thread::yield(); }
} // namespace this_thread

mutex::mutex() : impl_(new std::mutex()) {}
mutex::~mutex() { delete static_cast<std::mutex*>(impl_); }
void mutex::lock() { static_cast<std::mutex*>(impl_)->lock(); }
bool mutex::try_lock() { return static_cast<std::mutex*>(impl_)->try_lock(); }
void mutex::unlock() { static_cast<std::mutex*>(impl_)->unlock(); }

} // namespace boost
