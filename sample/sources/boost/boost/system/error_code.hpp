//  boost/system/error_code.hpp (sample): error codes with categories.

#ifndef BOOST_SYSTEM_ERROR_CODE_HPP
#define BOOST_SYSTEM_ERROR_CODE_HPP

#include <boost/config.hpp>

#include <ostream>
#include <string>

namespace boost {
namespace system {

class BOOST_SYMBOL_VISIBLE error_category {
public:
    virtual ~error_category();
    virtual const char* name() const noexcept = 0;
    virtual std::string message(int ev) const = 0;
    bool operator==(const error_category& rhs) const noexcept { return this == &rhs; }
    bool operator!=(const error_category& rhs) const noexcept { return this != &rhs; }
};

BOOST_SYSTEM_DECL const error_category& system_category() noexcept;
BOOST_SYSTEM_DECL const error_category& generic_category() noexcept;

class error_code {
public:
    error_code() noexcept : val_(0), cat_(&system_category()) {}
    error_code(int val, const error_category& cat) noexcept : val_(val), cat_(&cat) {}
    void assign(int val, const error_category& cat) noexcept { val_ = val; cat_ = &cat; }
    void clear() noexcept { val_ = 0; cat_ = &system_category(); }
    int value() const noexcept { return val_; }
    const error_category& category() const noexcept { return *cat_; }
    std::string message() const { return cat_->message(val_); }
    explicit operator bool() const noexcept { return val_ != 0; }

private:
    int val_;
    const error_category* cat_;
};

inline bool operator==(const error_code& a, const error_code& b) noexcept {
    return a.value() == b.value() && a.category() == b.category();
}
inline bool operator!=(const error_code& a, const error_code& b) noexcept { return !(a == b); }

inline std::ostream& operator<<(std::ostream& os, const error_code& ec) {
    return os << ec.category().name() << ':' << ec.value();
}

// The Boost version this library was compiled as, e.g. "1_73".
BOOST_SYSTEM_DECL const char* library_version() noexcept;

} // namespace system
} // namespace boost

#endif // BOOST_SYSTEM_ERROR_CODE_HPP
