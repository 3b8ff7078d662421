//  boost/filesystem/path.hpp (sample): POSIX paths as strings.

#ifndef BOOST_FILESYSTEM_PATH_HPP
#define BOOST_FILESYSTEM_PATH_HPP

#include <boost/config.hpp>

#include <string>
#include <vector>

#if defined(BOOST_FILESYSTEM_SOURCE)
#  define BOOST_FILESYSTEM_DECL BOOST_SYMBOL_EXPORT
#else
#  define BOOST_FILESYSTEM_DECL BOOST_SYMBOL_IMPORT
#endif

namespace boost {
namespace filesystem {

class BOOST_SYMBOL_VISIBLE path {
public:
    path() {}
    path(const std::string& s) : s_(s) {}
    path(const char* s) : s_(s) {}
    const std::string& string() const { return s_; }
    bool empty() const { return s_.empty(); }
    bool is_absolute() const { return !s_.empty() && s_[0] == '/'; }
    BOOST_FILESYSTEM_DECL path filename() const;
    BOOST_FILESYSTEM_DECL path parent_path() const;
    BOOST_FILESYSTEM_DECL path extension() const;
    BOOST_FILESYSTEM_DECL path lexically_normal() const;
    BOOST_FILESYSTEM_DECL std::vector<std::string> components() const;
    BOOST_FILESYSTEM_DECL path& operator/=(const path& p);

private:
    std::string s_;
};

inline path operator/(path lhs, const path& rhs) { return lhs /= rhs; }
inline bool operator==(const path& a, const path& b) { return a.string() == b.string(); }

BOOST_FILESYSTEM_DECL bool exists(const path& p);
BOOST_FILESYSTEM_DECL bool is_directory(const path& p);

} // namespace filesystem
} // namespace boost

#endif // BOOST_FILESYSTEM_PATH_HPP
