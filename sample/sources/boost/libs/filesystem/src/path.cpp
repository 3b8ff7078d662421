//  path.cpp (sample): lexical path operations and two queries.

#include <boost/filesystem/path.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <vector>

namespace boost {
namespace filesystem {

std::vector<std::string> path::components() const {
    std::vector<std::string> parts;
    std::string current;
    for (char c : s_) {
        if (c == '/') {
            if (!current.empty()) parts.push_back(current);
            current.clear();
        } else {
            current += c;
        }
    }
    if (!current.empty()) parts.push_back(current);
    return parts;
}

path path::filename() const {
    const std::vector<std::string> parts = components();
    return parts.empty() ? path() : path(parts.back());
}

path path::parent_path() const {
    const std::string::size_type slash = s_.find_last_of('/');
    if (slash == std::string::npos) return path();
    return slash == 0 ? path("/") : path(s_.substr(0, slash));
}

path path::extension() const {
    const std::string name = filename().string();
    const std::string::size_type dot = name.find_last_of('.');
    if (dot == std::string::npos || dot == 0 || name == "..") return path();
    return path(name.substr(dot));
}

path path::lexically_normal() const {
    std::vector<std::string> out;
    for (const std::string& part : components()) {
        if (part == ".") continue;
        if (part == ".." && !out.empty() && out.back() != "..") {
            out.pop_back();
            continue;
        }
        if (part == ".." && is_absolute()) continue;
        out.push_back(part);
    }
    std::string joined = is_absolute() ? "/" : "";
    for (std::size_t i = 0; i < out.size(); ++i) joined += (i ? "/" : "") + out[i];
    return path(joined.empty() ? "." : joined);
}

path& path::operator/=(const path& p) {
    if (p.is_absolute() || s_.empty()) {
        s_ = p.s_;
    } else if (!p.empty()) {
        if (s_.back() != '/') s_ += '/';
        s_ += p.s_;
    }
    return *this;
}

bool exists(const path& p) {
    struct stat st;
    return ::stat(p.string().c_str(), &st) == 0;
}

bool is_directory(const path& p) {
    struct stat st;
    return ::stat(p.string().c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

} // namespace filesystem
} // namespace boost
