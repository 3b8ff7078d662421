//  boost/thread/mutex.hpp (sample)

#ifndef BOOST_THREAD_MUTEX_HPP
#define BOOST_THREAD_MUTEX_HPP

#include <boost/config.hpp>

namespace boost {

class BOOST_SYMBOL_VISIBLE mutex {
public:
    BOOST_THREAD_DECL mutex();
    BOOST_THREAD_DECL ~mutex();
    mutex(const mutex&) = delete;
    mutex& operator=(const mutex&) = delete;
    BOOST_THREAD_DECL void lock();
    BOOST_THREAD_DECL bool try_lock();
    BOOST_THREAD_DECL void unlock();

private:
    void* impl_;
};

template <class Mutex>
class lock_guard {
public:
    explicit lock_guard(Mutex& m) : m_(m) { m_.lock(); }
    ~lock_guard() { m_.unlock(); }
    lock_guard(const lock_guard&) = delete;
    lock_guard& operator=(const lock_guard&) = delete;

private:
    Mutex& m_;
};

} // namespace boost

#endif // BOOST_THREAD_MUTEX_HPP
