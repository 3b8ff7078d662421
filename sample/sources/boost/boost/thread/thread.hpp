//  boost/thread/thread.hpp (sample): a joinable thread over std::thread.

#ifndef BOOST_THREAD_THREAD_HPP
#define BOOST_THREAD_THREAD_HPP

#include <boost/config.hpp>

#include <functional>
#include <utility>

namespace boost {

class BOOST_SYMBOL_VISIBLE thread {
public:
    BOOST_THREAD_DECL thread() noexcept;
    template <class F>
    explicit thread(F f) : impl_(nullptr) { start(std::function<void()>(std::move(f))); }
    BOOST_THREAD_DECL ~thread();
    thread(const thread&) = delete;
    thread& operator=(const thread&) = delete;

    BOOST_THREAD_DECL void join();
    BOOST_THREAD_DECL void detach();
    BOOST_THREAD_DECL bool joinable() const noexcept;
    BOOST_THREAD_DECL static unsigned hardware_concurrency() noexcept;

private:
    BOOST_THREAD_DECL void start(std::function<void()> fn);
    void* impl_;
};

namespace this_thread {
BOOST_THREAD_DECL void yield() noexcept;
} // namespace this_thread

} // namespace boost

#endif // BOOST_THREAD_THREAD_HPP
