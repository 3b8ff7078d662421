//  error_code.cpp (sample): the system and generic categories.

#include <boost/system/error_code.hpp>

#include <cstring>
#include <string>
#include <system_error>

namespace boost {
namespace system {

error_category::~error_category() {}

namespace {

class system_error_category : public error_category {
public:
    const char* name() const noexcept override { return "system"; }
    std::string message(int ev) const override { return std::system_category().message(ev); }
};

class generic_error_category : public error_category {
public:
    const char* name() const noexcept override { return "generic"; }
    std::string message(int ev) const override { return std::generic_category().message(ev); }
};

} // namespace

const error_category& system_category() noexcept {
    static const system_error_category instance;
    return instance;
}

const error_category& generic_category() noexcept {
    static const generic_error_category instance;
    return instance;
}

const char* library_version() noexcept { return BOOST_LIB_VERSION; }

} // namespace system
} // namespace boost
